//! Rendering one view file on the CPU: decode, the view's ops with torchvision's semantics, and
//! the .npy bytes, fused where it pays (crop + resize in one pass; flip, normalize and layout in
//! one write of the output).
//!
//! JPEGs decode with libjpeg-turbo (`jpeg`), and a render that keeps no pixels decodes only the
//! part its first step reads, at 1/2, 1/4 or 1/8 scale when that step shrinks by as much
//! (`plan::Draws::first_read`); everything else (PNG, and any JPEG libjpeg-turbo refuses)
//! decodes whole with the image crate, whose refusal is the render's error.
//!
//! Owns the pixel work and the random draws of one render (all from one seed, so a render is a
//! pure function of (spec, encoded bytes, seed)), applying the pixel limits (`limits`) to every
//! image a render holds: the decoded image or part (checked from its header, before its pixels
//! are decoded) and the output of every op after it (checked by `plan::draw` before any pixel is
//! touched), so no allocation follows a size the image reports. Must never panic on any input
//! bytes, and never return a partial image: an error is the only alternative to a complete file.

use std::borrow::Cow;
use std::io::Cursor;
use std::time::{Duration, Instant};

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::ImageDecoder;

use super::jpeg::{self, Jpeg};
use super::limits::{MAX_DECODE_BYTES, MAX_SIDE, RenderError, too_large, within_limits};
use super::npy::{self, Dtype};
use super::plan::{self, Area, Draws, Plan, Step};
use super::spec::{Output, ViewSpec};

/// A decoded RGB8 image, rows of `width * 3` bytes.
#[derive(Clone)]
pub struct Rgb {
    width: u32,
    height: u32,
    data: Vec<u8>,
}

/// Bytes after the pixels in `Rgb::into_bytes`: width and height, little-endian u32s.
const TRAILER: usize = 8;

impl Rgb {
    /// Width and height in pixels.
    pub fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    /// Bytes of `to_bytes`.
    pub fn byte_len(&self) -> usize {
        self.data.len() + TRAILER
    }

    /// Bytes of `to_bytes` for an image of `size` (width, height), before decoding it.
    pub fn cached_len((width, height): (u32, u32)) -> u64 {
        u64::from(width) * u64::from(height) * 3 + TRAILER as u64
    }

    /// An image of `width` x `height` from RGB rows; an error if the length does not match or
    /// the dimensions are out of bounds (the same limits as a decode).
    pub fn from_raw(width: u32, height: u32, data: Vec<u8>) -> Result<Rgb, RenderError> {
        check_size(width, height)?;
        if width as usize * height as usize * 3 != data.len() {
            return Err(RenderError::Corrupt("pixels of a wrong length".into()));
        }
        Ok(Rgb {
            width,
            height,
            data,
        })
    }

    /// The pixels: `height` rows of `row_len` bytes.
    pub fn pixels(&self) -> &[u8] {
        &self.data
    }

    /// Bytes of one row of pixels.
    pub fn row_len(&self) -> usize {
        self.width as usize * 3
    }

    /// The image as one buffer for the cache: the pixels, then width and height.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.byte_len());
        bytes.extend_from_slice(&self.data);
        bytes.extend_from_slice(&self.width.to_le_bytes());
        bytes.extend_from_slice(&self.height.to_le_bytes());
        bytes
    }

    /// The (width, height) of the image `to_bytes` made, read from its trailer (no copy); an
    /// error where `from_bytes` would refuse it.
    pub fn size_of_bytes(bytes: &[u8]) -> Result<(u32, u32), RenderError> {
        let corrupt = || RenderError::Corrupt("decoded image of a wrong length".into());
        let pixels = bytes.len().checked_sub(TRAILER).ok_or_else(corrupt)?;
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let (width, height) = (word(pixels), word(pixels + 4));
        check_size(width, height)?;
        if width as usize * height as usize * 3 != pixels {
            return Err(corrupt());
        }
        Ok((width, height))
    }

    /// The image `to_bytes` made; an error if the length does not match the dimensions or
    /// they are out of bounds (the same limits as a decode).
    pub fn from_bytes(bytes: &[u8]) -> Result<Rgb, RenderError> {
        let (width, height) = Rgb::size_of_bytes(bytes)?;
        Ok(Rgb {
            width,
            height,
            data: bytes[..bytes.len() - TRAILER].to_vec(),
        })
    }
}

/// Reads only the header: (width, height), with the same limits as a full decode. A JPEG's is
/// read by libjpeg-turbo (a few microseconds, where the image crate's reader builds Huffman
/// tables), unless it refuses the file.
pub fn dimensions(encoded: &[u8]) -> Result<(u32, u32), RenderError> {
    if let Some((w, h)) = is_jpeg(encoded).then(|| jpeg::size(encoded).ok()).flatten() {
        check_size(w, h)?;
        return Ok((w, h));
    }
    let reader = reader(encoded)?;
    let (w, h) = reader
        .into_dimensions()
        .map_err(|e| RenderError::Corrupt(e.to_string()))?;
    check_size(w, h)?;
    Ok((w, h))
}

fn reader(encoded: &[u8]) -> Result<image::ImageReader<Cursor<&[u8]>>, RenderError> {
    let mut reader = image::ImageReader::new(Cursor::new(encoded))
        .with_guessed_format()
        .map_err(|e| RenderError::NotAnImage(e.to_string()))?;
    if reader.format().is_none() {
        return Err(RenderError::NotAnImage("unknown format".into()));
    }
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    Ok(reader)
}

/// Checks an image of `width` x `height` pixels: not empty, within the pixel limits.
fn check_size(width: u32, height: u32) -> Result<(), RenderError> {
    if width == 0 || height == 0 {
        return Err(RenderError::Corrupt(format!(
            "an empty image of {width}x{height} pixels"
        )));
    }
    if !within_limits(width, height) {
        return Err(too_large("an image of", width, height));
    }
    Ok(())
}

/// Whether a JPEG's last scan is complete: a decoder may fill a truncated scan with grey instead
/// of failing (and libjpeg-turbo never reads past the rows a part needs), so a file cut short
/// must be caught here. Inside entropy-coded data 0xFF is always stuffed, so an end-of-image
/// marker (FF D9) after the last start-of-scan (FF DA) can only be the real end (an EXIF
/// thumbnail's markers come before the main scan). Searched from both ends (the last EOI, a SOS
/// before it, none after it), so a whole file costs its headers and trailer, not its scans.
fn jpeg_is_complete(encoded: &[u8]) -> bool {
    let marker = |bytes: &[u8], m: u8| bytes.windows(2).position(|w| w == [0xFF, m]);
    let Some(eoi) = encoded.windows(2).rposition(|w| w == [0xFF, 0xD9]) else {
        return false;
    };
    marker(&encoded[..eoi], 0xDA).is_some() && marker(&encoded[eoi..], 0xDA).is_none()
}

/// Whether `encoded` is a JPEG (by its magic) whose last scan is complete: what a GPU decoder
/// may be given; anything else is left to `decode`, which explains the refusal.
pub fn is_complete_jpeg(encoded: &[u8]) -> bool {
    is_jpeg(encoded) && jpeg_is_complete(encoded)
}

/// Decodes `encoded` (JPEG, PNG) to RGB, within the pixel limits (checked on the header, before
/// any pixel is decoded); a truncated JPEG is an error. JPEGs decode with libjpeg-turbo, and
/// with the image crate when it refuses them.
pub fn decode(encoded: &[u8]) -> Result<Rgb, RenderError> {
    match decode_as_parts_do(encoded)? {
        Some(image) => Ok(image),
        None => decode_whole_of_size(encoded, dimensions(encoded)?),
    }
}

/// `decode`, when its pixels are the ones every part of the image that a render decodes would
/// have (what a cache of pixels may keep and renders start from): `None` for a JPEG that
/// libjpeg-turbo opened but warned on while decoding it whole (data damaged, or extraneous
/// bytes before its end). A part that stops above the damage decodes with libjpeg-turbo, so the
/// image crate's pixels of the whole would render other bytes for the same open.
pub fn decode_as_parts_do(encoded: &[u8]) -> Result<Option<Rgb>, RenderError> {
    if !is_jpeg(encoded) {
        return decode_whole(encoded).map(Some);
    }
    let (width, height) = dimensions(encoded)?;
    let whole = plan::Read {
        region: (0, 0, width, height),
        shrink: 1,
    };
    match decode_jpeg_part(encoded, (width, height), whole)? {
        Libjpeg::Decoded(image, _) => Ok(Some(image)),
        Libjpeg::Refused => decode_whole_of_size(encoded, (width, height)).map(Some),
        Libjpeg::Warned => Ok(None),
    }
}

/// `decode_whole` of a JPEG whose header libjpeg-turbo read as `size` (it refused the rest):
/// an error when the image crate decodes another size, which the view already announced.
fn decode_whole_of_size(encoded: &[u8], size: (u32, u32)) -> Result<Rgb, RenderError> {
    let image = decode_whole(encoded)?;
    same_size(&image, size)?;
    Ok(image)
}

/// Bytes a whole decode of `encoded`, a `size` (width, height) image, holds beyond its RGB8
/// pixels, from its headers alone: the image crate's native image when it is not RGB8 (16-bit
/// samples, alpha, grey and palettes decode into it before the conversion to RGB; 8 bytes a
/// pixel for 16-bit RGBA), a progressive JPEG's coefficients (2 bytes a sample, at most 3
/// samples a pixel, held whole until the last scan), and the decoders' row buffers. What the
/// memory budget charges a render before it decodes, so no decode outgrows its charge.
pub fn decode_overhead(encoded: &[u8], (width, height): (u32, u32)) -> u64 {
    let pixels = u64::from(width) * u64::from(height);
    // Row buffers (a few rows of the widest samples) and the decoders' small state.
    let rows = 4 * u64::from(width) * 8 + (1 << 20);
    if is_jpeg(encoded) {
        return if jpeg_is_progressive(encoded) {
            6 * pixels + rows
        } else {
            rows
        };
    }
    let native = reader(encoded)
        .and_then(|r| {
            r.into_decoder()
                .map_err(|e| RenderError::Corrupt(e.to_string()))
        })
        .map(|d| {
            if d.color_type() == image::ColorType::Rgb8 {
                0
            } else {
                d.total_bytes()
            }
        });
    // A header the crate cannot read fails the decode before any pixel: nothing beyond it.
    native.unwrap_or(0) + rows
}

/// Whether a JPEG's frame is progressive (SOF2, or SOF6/SOF10/SOF14 of other codings): its
/// coefficients are held whole while its scans refine them.
fn jpeg_is_progressive(encoded: &[u8]) -> bool {
    let mut at = 2;
    while at + 4 <= encoded.len() {
        if encoded[at] != 0xFF {
            return false;
        }
        let marker = encoded[at + 1];
        match marker {
            0xC2 | 0xC6 | 0xCA | 0xCE => return true,
            0xC0 | 0xC1 | 0xC3 | 0xC5 | 0xC7 | 0xC9 | 0xCB | 0xCD | 0xCF | 0xDA => return false,
            // Fill bytes before a marker.
            0xFF => at += 1,
            _ => {
                let len = usize::from(u16::from_be_bytes([encoded[at + 2], encoded[at + 3]]));
                at += 2 + len;
            }
        }
    }
    false
}

/// Whether `encoded` starts as a JPEG does (SOI, then a marker).
fn is_jpeg(encoded: &[u8]) -> bool {
    encoded.starts_with(&[0xFF, 0xD8, 0xFF])
}

/// What libjpeg-turbo made of a part of a JPEG.
enum Libjpeg {
    /// The pixels of a part holding the region, and the region's area in them.
    Decoded(Rgb, Area),
    /// It refuses the file, or reads another size from it: every part alike.
    Refused,
    /// It opened the file and warned while decoding this part: another part may decode.
    Warned,
}

/// `read` of the JPEG `encoded`, whose header (as `dimensions` reads it) gives `size`, decoded
/// by libjpeg-turbo at 1/`read.shrink`. Anything but `Decoded` leaves the caller to decode it
/// another way; `TooLarge` when the part is over the pixel limits, before it is allocated.
fn decode_jpeg_part(
    encoded: &[u8],
    size: (u32, u32),
    read: plan::Read,
) -> Result<Libjpeg, RenderError> {
    if !jpeg_is_complete(encoded) {
        return Ok(Libjpeg::Refused);
    }
    let Ok(mut jpeg) = Jpeg::open(encoded) else {
        return Ok(Libjpeg::Refused);
    };
    if jpeg.size() != size {
        return Ok(Libjpeg::Refused);
    }
    let part = jpeg.part(read.region, read.shrink);
    let (width, height) = part.size;
    check_size(width, height)?;
    let Ok(pixels) = jpeg.decode(&part) else {
        return Ok(Libjpeg::Warned);
    };
    let area = plan::rebase(read.region, part.origin, part.scale);
    Ok(Libjpeg::Decoded(
        Rgb::from_raw(width, height, pixels)?,
        area,
    ))
}

/// The plan of a render of `spec` with `seed` over the encoded image, from its header.
pub fn plan_for(spec: &ViewSpec, encoded: &[u8], seed: u64) -> Result<Plan, RenderError> {
    Plan::new(spec, dimensions(encoded)?, seed)
}

/// Decodes the whole of `encoded` (JPEG, PNG) with the image crate, within the pixel limits
/// (checked on the header, before any pixel is decoded, for the decoder's buffer and for the RGB
/// image); a truncated JPEG is an error.
fn decode_whole(encoded: &[u8]) -> Result<Rgb, RenderError> {
    let reader = reader(encoded)?;
    if reader.format() == Some(image::ImageFormat::Jpeg) && !jpeg_is_complete(encoded) {
        return Err(RenderError::Corrupt(
            "JPEG data ends before its end-of-image marker (truncated)".into(),
        ));
    }
    let refused = |e: image::ImageError| match e {
        image::ImageError::Limits(l) => RenderError::TooLarge(l.to_string()),
        image::ImageError::Unsupported(u) => RenderError::NotAnImage(u.to_string()),
        other => RenderError::Corrupt(other.to_string()),
    };
    let decoder = reader.into_decoder().map_err(refused)?;
    let (width, height) = decoder.dimensions();
    check_size(width, height)?;
    if decoder.total_bytes() > MAX_DECODE_BYTES {
        return Err(RenderError::TooLarge(format!(
            "decoding {width}x{height} pixels needs {} bytes (limit {MAX_DECODE_BYTES})",
            decoder.total_bytes()
        )));
    }
    let image = image::DynamicImage::from_decoder(decoder).map_err(refused)?;
    let rgb = image.into_rgb8();
    Ok(Rgb {
        width: rgb.width(),
        height: rgb.height(),
        data: rgb.into_raw(),
    })
}

/// One render's output and where its time went.
#[derive(Debug)]
pub struct Rendered {
    /// The complete .npy file.
    pub npy: Vec<u8>,
    /// Time spent decoding the image.
    pub decode: Duration,
    /// Time spent on the ops and writing the output (crop, resize, flip, normalize, layout).
    pub transform: Duration,
    /// The random draws made: crop boxes as (top, left, height, width), and whether the output
    /// is mirrored. Logged at debug level, so a sample can be reproduced elsewhere.
    pub crops: Vec<[u32; 4]>,
    /// Whether the output is mirrored.
    pub flipped: bool,
}

/// The complete .npy file of `spec` applied to `encoded`, with random draws from `seed`
/// (`render_planned` with the plan of its header).
pub fn render(spec: &ViewSpec, encoded: &[u8], seed: u64) -> Result<Rendered, RenderError> {
    render_planned(spec, encoded, &plan_for(spec, encoded, seed)?)
}

/// The complete .npy file of `spec` applied to `encoded` as `plan` (drawn over its header's
/// size) says. A JPEG decodes only the part the render's first step reads (at a smaller scale
/// when that step shrinks by 2, 4 or 8), so keep `decode` for pixels that outlive the render.
pub fn render_planned(
    spec: &ViewSpec,
    encoded: &[u8],
    plan: &Plan,
) -> Result<Rendered, RenderError> {
    let started = Instant::now();
    if !is_jpeg(encoded) {
        let image = decode(encoded)?;
        let decoded = started.elapsed();
        let mut rendered = transform_planned(spec, &image, plan)?;
        rendered.decode = decoded;
        return Ok(rendered);
    }
    let (image, first) = match decode_jpeg_part(encoded, plan.size, plan.first_read())? {
        Libjpeg::Decoded(part, area) => (part, Some(area)),
        Libjpeg::Refused | Libjpeg::Warned => (decode_whole_of_size(encoded, plan.size)?, None),
    };
    let decoded = started.elapsed();
    let npy = apply(spec.output, &plan.draws, &image, first)?;
    Ok(Rendered {
        npy,
        decode: decoded,
        transform: started.elapsed() - decoded,
        crops: plan.draws.crops.clone(),
        flipped: plan.draws.flip,
    })
}

/// The complete .npy file of `spec` applied to the decoded `image`, with random draws from
/// `seed` (`transform_planned` with the plan of its size). A step whose output would pass the
/// pixel limits is refused (`TooLarge`) before any pixel is allocated.
pub fn transform(spec: &ViewSpec, decoded: &Rgb, seed: u64) -> Result<Rendered, RenderError> {
    transform_planned(spec, decoded, &Plan::new(spec, decoded.size(), seed)?)
}

/// The complete .npy file of `spec` applied to the decoded `image` as `plan` says: everything
/// after the decode (`decode` is left zero). `Corrupt` when the image is not the size the plan is
/// for (a decoder that disagrees with the header).
pub fn transform_planned(
    spec: &ViewSpec,
    decoded: &Rgb,
    plan: &Plan,
) -> Result<Rendered, RenderError> {
    let started = Instant::now();
    check_planned(decoded, plan)?;
    let npy = apply(spec.output, &plan.draws, decoded, None)?;
    Ok(Rendered {
        npy,
        decode: Duration::ZERO,
        transform: started.elapsed(),
        crops: plan.draws.crops.clone(),
        flipped: plan.draws.flip,
    })
}

/// `Corrupt` unless `image` is the size `plan` was drawn over (read from the image's header).
pub fn check_planned(image: &Rgb, plan: &Plan) -> Result<(), RenderError> {
    same_size(image, plan.size)
}

/// `Corrupt` unless the decoded `image` is `size`, the size its header gave.
fn same_size(image: &Rgb, size: (u32, u32)) -> Result<(), RenderError> {
    if image.size() == size {
        return Ok(());
    }
    Err(RenderError::Corrupt(format!(
        "decoders disagree on the size: {size:?} in the header, {:?} decoded",
        image.size()
    )))
}

/// Bytes of scratch a render thread's resizer keeps between renders: what resizing an
/// ImageNet-sized crop needs, so ordinary renders reuse it and a huge one does not keep its own.
const RESIZER_KEPT: usize = 4 << 20;

/// The .npy bytes of `draws` run over `image` as `output`; `first`, when given, is the area of
/// `image` the first step reads in place of its region (`image` is then a decoded part).
fn apply(
    output: Output,
    draws: &Draws,
    image: &Rgb,
    first: Option<Area>,
) -> Result<Vec<u8>, RenderError> {
    let mut image = Cow::Borrowed(image);
    // A resizer keeps its scratch buffers: one per render thread, reused by the next render
    // (not allocated and faulted in again), but dropped past `RESIZER_KEPT` so that memory
    // outside a render's budget stays small.
    thread_local! {
        static RESIZER: std::cell::RefCell<Resizer> = std::cell::RefCell::new(Resizer::new());
    }
    for (n, step) in draws.steps.iter().enumerate() {
        image = Cow::Owned(match *step {
            Step::Resize {
                region,
                width,
                height,
            } => {
                let area = first.filter(|_| n == 0).unwrap_or(Area::of(region));
                RESIZER.with_borrow_mut(|resizer| {
                    let resized = resize(resizer, &image, area, width, height);
                    if resizer.size_of_internal_buffers() > RESIZER_KEPT {
                        resizer.reset_internal_buffers();
                    }
                    resized
                })?
            }
            Step::CenterCrop { width, height } => center_crop(&image, width, height),
        });
    }
    Ok(encode(output, &image, draws.flip, draws.norm))
}

/// Resizes `area` of `image` to `width` x `height` with Pillow's antialiased bilinear filter, as
/// torchvision's PIL path does: the whole pixels the area covers are cut out first, so the filter
/// never reads pixels outside them (torchvision crops, then resizes); a fractional area (a crop
/// box in a DCT-scaled part) is then the resizer's crop box within them.
fn resize(
    resizer: &mut Resizer,
    image: &Rgb,
    area: Area,
    width: u32,
    height: u32,
) -> Result<Rgb, RenderError> {
    let failed = |e: &dyn std::fmt::Display| RenderError::Resize(e.to_string());
    let src = ImageRef::new(image.width, image.height, &image.data, PixelType::U8x3)
        .map_err(|e| failed(&e))?;
    let (left, top) = (area.left.floor().max(0.0), area.top.floor().max(0.0));
    let right = (area.left + area.width).ceil().min(f64::from(image.width));
    let bottom = (area.top + area.height).ceil().min(f64::from(image.height));
    let (x, y) = (left as u32, top as u32);
    let (w, h) = (
        (right - left).max(1.0) as u32,
        (bottom - top).max(1.0) as u32,
    );
    let src = CroppedImage::new(&src, x, y, w, h).map_err(|e| failed(&e))?;
    let mut options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    if area != Area::of((x, y, w, h)) {
        options = options.crop(area.left - left, area.top - top, area.width, area.height);
    }
    let mut dst = Image::new(width, height, PixelType::U8x3);
    resizer
        .resize(&src, &mut dst, &options)
        .map_err(|e| failed(&e))?;
    Ok(Rgb {
        width,
        height,
        data: dst.into_vec(),
    })
}

/// torchvision's `CenterCrop`: the central region, zero-padded where the image is smaller.
fn center_crop(image: &Rgb, width: u32, height: u32) -> Rgb {
    let mut out = vec![0u8; width as usize * height as usize * 3];
    let (top, left) = (
        plan::center_offset(image.height, height),
        plan::center_offset(image.width, width),
    );
    for y in 0..i64::from(height) {
        let sy = y + top;
        if sy < 0 || sy >= i64::from(image.height) {
            continue;
        }
        let x0 = left.max(0);
        let x1 = (left + i64::from(width)).min(i64::from(image.width));
        if x0 >= x1 {
            continue;
        }
        let src = (sy as usize * image.width as usize + x0 as usize) * 3;
        let dst = (y as usize * width as usize + (x0 - left) as usize) * 3;
        let len = (x1 - x0) as usize * 3;
        out[dst..dst + len].copy_from_slice(&image.data[src..src + len]);
    }
    Rgb {
        width,
        height,
        data: out,
    }
}

/// The .npy bytes: header, then pixels in the output layout, flipped and normalized. Compiled
/// twice: for AVX2 where the CPU has it (x86-64, checked at run time; libjpeg-turbo and
/// fast_image_resize pick their SIMD the same way) and for the baseline. The loops are plain
/// per-pixel ones, which the compiler vectorizes with AVX2's byte shuffles: a 224x224 uint8 CHW
/// tensor in 20 µs against 105 µs for the baseline build, a float32 one in 17 µs against 165 µs
/// for the table lookups before (measured; same bytes).
fn encode(output: Output, image: &Rgb, flip: bool, norm: Option<([f32; 3], [f32; 3])>) -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above), all `encode_avx2` requires.
        return unsafe { encode_avx2(output, image, flip, norm) };
    }
    encode_any(output, image, flip, norm)
}

/// `encode_any` compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn encode_avx2(
    output: Output,
    image: &Rgb,
    flip: bool,
    norm: Option<([f32; 3], [f32; 3])>,
) -> Vec<u8> {
    encode_any(output, image, flip, norm)
}

/// `encode` for whatever the CPU it is compiled for has. Each output row is written through a
/// slice of its final length, so the loops compile to straight-line stores (no per-element
/// capacity checks).
#[inline(always)]
fn encode_any(
    output: Output,
    image: &Rgb,
    flip: bool,
    norm: Option<([f32; 3], [f32; 3])>,
) -> Vec<u8> {
    let (w, h) = (image.width as usize, image.height as usize);
    let (dtype, shape) = match output {
        Output::Float32Chw => (Dtype::F32, [3, h, w]),
        Output::Uint8Chw => (Dtype::U8, [3, h, w]),
        Output::Uint8Hwc => (Dtype::U8, [h, w, 3]),
    };
    let header = npy::header(dtype, &shape);
    let mut out = vec![0u8; npy::file_size(dtype, &shape) as usize];
    out[..header.len()].copy_from_slice(&header);
    let body = &mut out[header.len()..];
    let src_row = |y: usize| &image.data[y * w * 3..(y + 1) * w * 3];
    match output {
        Output::Float32Chw => {
            let (scale, offset) = affine(norm);
            let plane = w * h * 4;
            let (red, rest) = body.split_at_mut(plane);
            let (green, blue) = rest.split_at_mut(plane);
            // Each row split into its channels first, then each channel converted in a run.
            let mut row = vec![0u8; 3 * w];
            for y in 0..h {
                let (r, rest) = row.split_at_mut(w);
                let (g, b) = rest.split_at_mut(w);
                split_row(src_row(y), [&mut *r, &mut *g, &mut *b], flip);
                let planes = [&mut *red, &mut *green, &mut *blue];
                for (c, (plane, channel)) in planes.into_iter().zip([&*r, &*g, &*b]).enumerate() {
                    let dst = &mut plane[y * w * 4..(y + 1) * w * 4];
                    for (d, &v) in dst.chunks_exact_mut(4).zip(channel) {
                        d.copy_from_slice(&(f32::from(v) * scale[c] + offset[c]).to_le_bytes());
                    }
                }
            }
        }
        Output::Uint8Chw => {
            let (red, rest) = body.split_at_mut(w * h);
            let (green, blue) = rest.split_at_mut(w * h);
            for y in 0..h {
                let row = y * w..(y + 1) * w;
                let planes = [
                    &mut red[row.clone()],
                    &mut green[row.clone()],
                    &mut blue[row],
                ];
                split_row(src_row(y), planes, flip);
            }
        }
        Output::Uint8Hwc if !flip => body.copy_from_slice(&image.data[..w * h * 3]),
        Output::Uint8Hwc => {
            for y in 0..h {
                let dst = body[y * w * 3..(y + 1) * w * 3].chunks_exact_mut(3).rev();
                dst.zip(src_row(y).chunks_exact(3))
                    .for_each(|(d, px)| d.copy_from_slice(px));
            }
        }
    }
    out
}

/// The float32 output of a u8 value `v` in channel `c` is `v * scale[c] + offset[c]`, rounded
/// once per operation: `(v / 255 - mean) / std` for `normalize(mean, std)`, `v / 255` without.
/// The CPU path and the fused kernel both take their constants from here, so their floats agree.
pub(crate) fn affine(norm: Option<([f32; 3], [f32; 3])>) -> ([f32; 3], [f32; 3]) {
    let (mean, std) = norm.unwrap_or(([0.0; 3], [1.0; 3]));
    (
        std::array::from_fn(|c| 1.0 / (255.0 * std[c])),
        std::array::from_fn(|c| -mean[c] / std[c]),
    )
}

/// Writes the RGB pixels of `src` to the rows of its three channels (`planes`, each as many
/// bytes as `src` has pixels), mirrored when `flip`.
#[inline(always)]
fn split_row(src: &[u8], [red, green, blue]: [&mut [u8]; 3], flip: bool) {
    let pixels = src.chunks_exact(3);
    if flip {
        let planes = red.iter_mut().rev().zip(green.iter_mut().rev());
        for (((r, g), b), px) in planes.zip(blue.iter_mut().rev()).zip(pixels) {
            (*r, *g, *b) = (px[0], px[1], px[2]);
        }
    } else {
        let planes = red.iter_mut().zip(green.iter_mut());
        for (((r, g), b), px) in planes.zip(blue.iter_mut()).zip(pixels) {
            (*r, *g, *b) = (px[0], px[1], px[2]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a render of `spec` with `seed` over a `size` image reads it at a reduced scale.
    fn reads_scaled(spec: &ViewSpec, size: (u32, u32), seed: u64) -> bool {
        Plan::new(spec, size, seed).is_ok_and(|plan| plan.reads_scaled())
    }

    fn spec(text: &str) -> ViewSpec {
        ViewSpec::parse(text).expect("valid spec")
    }

    #[test]
    fn renders_have_the_promised_size_and_are_pure_functions_of_the_seed() {
        let jpeg = crate::synthetic::photo(3).expect("jpeg");
        let train = spec("t=decode,random_resized_crop(224),hflip,normalize(imagenet)");
        let a = render(&train, &jpeg, 1).expect("renders").npy;
        assert_eq!(a.len() as u64, npy::file_size(Dtype::F32, &[3, 224, 224]));
        assert_eq!(
            a,
            render(&train, &jpeg, 1).expect("renders").npy,
            "same seed, same bytes"
        );
        assert_ne!(
            a,
            render(&train, &jpeg, 2).expect("renders").npy,
            "another seed, another crop"
        );
        let (w, h) = dimensions(&jpeg).expect("header");
        let val = spec("v=decode,resize(100),uint8(hwc)");
        let (oh, ow) = val.output_size(w, h);
        let b = render(&val, &jpeg, 0).expect("renders").npy;
        assert_eq!(
            b.len() as u64,
            npy::file_size(Dtype::U8, &[oh as usize, ow as usize, 3])
        );
    }

    #[test]
    fn decoded_images_round_trip_through_cache_bytes_and_bad_lengths_are_refused() {
        let jpeg = crate::synthetic::photo(4).expect("jpeg");
        // This draw does not shrink by 2, so it reads the JPEG at full scale.
        let s = spec("t=decode,random_resized_crop(224),hflip,normalize(imagenet)");
        assert!(!reads_scaled(&s, dimensions(&jpeg).expect("header"), 7));
        let bytes = decode(&jpeg).expect("decodes").to_bytes();
        let again = Rgb::from_bytes(&bytes).expect("round trips");
        assert_eq!(again.size(), dimensions(&jpeg).expect("header"));
        assert_eq!(
            transform(&s, &again, 7).expect("renders").npy,
            render(&s, &jpeg, 7).expect("renders").npy,
            "from cached pixels, the same file as from the JPEG"
        );
        for cut in [0, 7, 8, bytes.len() - 9, bytes.len() - 1] {
            assert!(Rgb::from_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = vec![0u8; 3];
        huge.extend_from_slice(&1u32.to_le_bytes());
        huge.extend_from_slice(&(MAX_SIDE + 1).to_le_bytes());
        assert!(Rgb::from_bytes(&huge).is_err());
    }

    /// The largest level difference, and the largest per-render mean, that reading a JPEG at
    /// 1/2, 1/4 and 1/8 scale makes against a render over the whole decode, by scale: measured
    /// on the 3 x 5 x 12 renders of the test below as 10 / 1.08, 14 / 1.40 and 20 / 2.80 (1/8
    /// keeps one value per 8x8 block, a box filter), with ~1.2-1.4x of margin. Not to be
    /// loosened: a part at a wrong offset or scale misses by tens of levels on average.
    const SCALED_BOUNDS: [(u32, u8, f64); 3] = [(2, 14, 1.5), (4, 18, 1.8), (8, 26, 3.5)];

    #[test]
    fn a_damaged_jpegs_whole_pixels_are_not_offered_when_its_parts_decode_otherwise() {
        // ImageNet's "extraneous bytes before marker 0xd9": junk between the last scan and EOI.
        // libjpeg-turbo warns only once it reads past the last row, so a part above the
        // bottom decodes with it while a whole decode falls back to the image crate.
        let clean = crate::view::jpeg::tests::encoded(640, 480, turbojpeg::Subsamp::Sub2x2, false);
        let eoi = clean.len() - 2;
        assert_eq!(&clean[eoi..], [0xFF, 0xD9]);
        let mut damaged = clean[..eoi].to_vec();
        damaged.extend_from_slice(&[0x12; 7]);
        damaged.extend_from_slice(&clean[eoi..]);
        let pixels = decode_as_parts_do(&clean)
            .expect("decodes")
            .expect("libjpeg's");
        assert_eq!(
            decode(&clean).expect("decodes").to_bytes(),
            pixels.to_bytes()
        );
        assert!(
            decode_as_parts_do(&damaged).expect("no error").is_none(),
            "whole pixels of the damaged file are the image crate's"
        );
        let fallback = decode(&damaged).expect("the image crate decodes it");
        assert_ne!(
            fallback.to_bytes(),
            pixels.to_bytes(),
            "the image crate's pixels differ from libjpeg-turbo's"
        );
        // A crop above the damage renders from libjpeg-turbo's pixels, as the clean file does.
        let s = spec("c=decode,random_resized_crop(64, scale=(0.05, 0.1)),uint8(hwc)");
        let above = (0..64)
            .find(|&seed| {
                let read = plan::draw(&s, 640, 480, seed)
                    .expect("draws")
                    .first_read(640, 480);
                read.shrink == 1 && read.region.1 + read.region.3 + 16 < 480
            })
            .expect("a crop above the last rows");
        let part = render(&s, &damaged, above).expect("renders").npy;
        assert_eq!(part, render(&s, &clean, above).expect("renders").npy);
        assert_eq!(part, transform(&s, &pixels, above).expect("renders").npy);
    }

    #[test]
    fn renders_from_the_jpeg_equal_renders_from_its_pixels_unless_they_read_it_scaled() {
        use turbojpeg::Subsamp;
        let specs = [
            "t=decode,random_resized_crop(224),hflip,uint8(hwc)",
            "s=decode,random_resized_crop(64, scale=(0.2, 1)),uint8(hwc)",
            "v=decode,resize(256),center_crop(224),uint8(hwc)",
            "r=decode,resize(90),uint8(hwc)",
            "p=decode,center_crop(300),resize(64),uint8(hwc)",
        ]
        .map(spec);
        let mut exact = 0;
        let mut scaled = [0; 3];
        for subsampling in [Subsamp::Sub2x2, Subsamp::None, Subsamp::Gray] {
            let jpeg = crate::view::jpeg::tests::encoded(1000, 700, subsampling, false);
            let pixels = decode(&jpeg).expect("decodes");
            let (w, h) = pixels.size();
            for s in &specs {
                for seed in 0..12 {
                    let part = render(s, &jpeg, seed).expect("renders").npy;
                    let whole = transform(s, &pixels, seed).expect("renders").npy;
                    let shrink = plan::draw(s, w, h, seed)
                        .expect("draws")
                        .first_read(w, h)
                        .shrink;
                    assert_eq!(reads_scaled(s, (w, h), seed), shrink > 1);
                    let at = |n: &str| format!("{subsampling:?} {n} seed {seed} 1/{shrink}");
                    if shrink == 1 {
                        assert!(part == whole, "{}: not byte for byte", at(&s.name));
                        exact += 1;
                        continue;
                    }
                    let n = SCALED_BOUNDS
                        .iter()
                        .position(|b| b.0 == shrink)
                        .expect("a scale");
                    let (_, max_bound, mean_bound) = SCALED_BOUNDS[n];
                    scaled[n] += 1;
                    let diff = part[128..]
                        .iter()
                        .zip(&whole[128..])
                        .map(|(a, b)| a.abs_diff(*b));
                    let (max, sum) = diff.fold((0, 0), |(m, t), d| (d.max(m), t + u64::from(d)));
                    let mean = sum as f64 / (part.len() - 128) as f64;
                    assert!(
                        max <= max_bound && mean <= mean_bound,
                        "{}: max {max}, mean {mean:.2}",
                        at(&s.name)
                    );
                }
            }
        }
        assert!(exact >= 30, "{exact} renders at full scale");
        assert!(
            scaled.iter().all(|&n| n >= 9),
            "renders per scale: {scaled:?}"
        );
    }

    #[test]
    fn flip_and_layouts_agree_pixel_for_pixel() {
        // 19 columns: two blocks of eight and a tail, for the layouts that write eight at once.
        let of = |pipeline: &str| {
            render(
                &spec(pipeline),
                &crate::synthetic::photo(5).expect("jpeg"),
                0,
            )
            .expect("renders")
            .npy
        };
        let hwc = of("a=decode,center_crop(13, 19),uint8(hwc)");
        let flipped = of("c=decode,center_crop(13, 19),hflip(1),uint8(hwc)");
        let (h, w) = (13, 19);
        let px = |buf: &[u8], y: usize, x: usize, c: usize| buf[128 + (y * w + x) * 3 + c];
        for mirrored in [false, true] {
            let flip = if mirrored { ",hflip(1)" } else { "" };
            let chw = of(&format!("b=decode,center_crop(13, 19){flip},uint8"));
            let f32s = of(&format!("d=decode,center_crop(13, 19){flip}"));
            for y in 0..h {
                for x in 0..w {
                    let sx = if mirrored { w - 1 - x } else { x };
                    for c in 0..3 {
                        let v = px(&hwc, y, sx, c);
                        assert_eq!(
                            chw[128 + c * h * w + y * w + x],
                            v,
                            "chw {mirrored} {y} {x}"
                        );
                        assert_eq!(px(&flipped, y, w - 1 - sx, c), v);
                        let at = 128 + (c * h * w + y * w + x) * 4;
                        let f = f32::from_le_bytes(f32s[at..at + 4].try_into().expect("4 bytes"));
                        assert!((f - f32::from(v) / 255.0).abs() < 1e-6);
                    }
                }
            }
        }
    }

    #[test]
    fn every_layout_has_the_same_bytes_from_the_avx2_and_the_baseline_build() {
        // 19 columns: vector blocks and a tail; every byte value in every channel.
        let (w, h) = (19u32, 13u32);
        let data = (0..w * h * 3).map(|i| (i * 97 % 256) as u8).collect();
        let image = Rgb::from_raw(w, h, data).expect("an image");
        let imagenet = Some(([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]));
        for output in [Output::Float32Chw, Output::Uint8Chw, Output::Uint8Hwc] {
            for flip in [false, true] {
                for norm in [None, imagenet] {
                    let baseline = encode_any(output, &image, flip, norm);
                    assert_eq!(encode(output, &image, flip, norm), baseline);
                    if output == Output::Float32Chw {
                        // The value a float32 view promises: (v / 255 - mean) / std, computed as
                        // v * (1 / (255 std)) - mean / std in float32.
                        let (mean, std) = norm.unwrap_or(([0.0; 3], [1.0; 3]));
                        let (x, y, c) = (4, 7, 2);
                        let sx = if flip { w - 1 - x } else { x };
                        let v = f32::from(image.data[((y * w + sx) * 3 + c) as usize]);
                        let want = v * (1.0 / (255.0 * std[c as usize]))
                            + -mean[c as usize] / std[c as usize];
                        let at = 128 + 4 * (c * w * h + y * w + x) as usize;
                        assert_eq!(baseline[at..at + 4], want.to_le_bytes());
                    }
                }
            }
        }
    }

    #[test]
    fn center_crop_larger_than_the_image_pads_with_zeros() {
        let image = Rgb {
            width: 2,
            height: 2,
            data: vec![9; 12],
        };
        let out = center_crop(&image, 4, 4);
        let ones: Vec<usize> = (0..16).filter(|i| out.data[i * 3] == 9).collect();
        assert_eq!(ones, vec![5, 6, 9, 10]);
        // Odd padding: torchvision puts (crop - size) // 2 before and the odd pixel after.
        let dot = Rgb {
            width: 1,
            height: 1,
            data: vec![9; 3],
        };
        let out = center_crop(&dot, 4, 4);
        let ones: Vec<usize> = (0..16).filter(|i| out.data[i * 3] == 9).collect();
        assert_eq!(ones, vec![5], "1 row and column before, 2 after");
    }

    #[test]
    fn random_crop_boxes_stay_inside_the_image() {
        use plan::random_crop_box;
        let mut rng = fastrand::Rng::with_seed(9);
        for (w, h) in [(500, 375), (10, 1000), (1000, 10), (1, 1), (224, 224)] {
            for _ in 0..200 {
                let (top, left, ch, cw) =
                    random_crop_box(&mut rng, w, h, (0.08, 1.0), (0.75, 4.0 / 3.0));
                assert!(
                    ch >= 1 && cw >= 1 && top + ch <= h && left + cw <= w,
                    "{w}x{h}: {top},{left},{ch},{cw}"
                );
            }
        }
    }

    /// A black PNG of `width` x `height`, compressed hard (a few hundred bytes however tall).
    fn black_png(width: u32, height: u32) -> Vec<u8> {
        use image::codecs::png::{CompressionType, FilterType, PngEncoder};
        let mut png = Vec::new();
        image::RgbImage::new(width, height)
            .write_with_encoder(PngEncoder::new_with_quality(
                &mut png,
                CompressionType::Best,
                FilterType::NoFilter,
            ))
            .expect("encodes");
        png
    }

    #[test]
    fn a_decode_is_charged_its_native_image_before_the_rgb_copy() {
        use image::codecs::png::PngEncoder;
        let (w, h) = (64u32, 48u32);
        let mut deep = Vec::new();
        image::ImageBuffer::<image::Rgba<u16>, _>::new(w, h)
            .write_with_encoder(PngEncoder::new(&mut deep))
            .expect("encodes");
        let pixels = u64::from(w * h);
        let rgb = decode_overhead(&black_png(w, h), (w, h));
        let rgba16 = decode_overhead(&deep, (w, h));
        assert_eq!(
            rgba16 - rgb,
            8 * pixels,
            "16-bit RGBA: 8 bytes a pixel more"
        );
        assert!(rgb < 2 << 20, "RGB8 decodes straight into its pixels");
    }

    #[test]
    fn an_op_whose_output_passes_the_pixel_limits_is_refused_not_allocated() {
        // 1x16384 decodes to 48 KiB, but resize(256) would make 256 x 4194304 (3 GiB) before
        // center_crop(224): refused from the plan, before the resizer allocates its output.
        let png = black_png(1, 16384);
        assert!(png.len() < 1024, "{} bytes", png.len());
        let image = decode(&png).expect("the image itself is within the limits");
        assert_eq!(image.size(), (1, 16384));
        let val = spec("v=decode,resize(256),center_crop(224),normalize(imagenet)");
        for refused in [
            transform(&val, &image, 0).expect_err("too large"),
            render(&val, &png, 0).expect_err("too large"),
        ] {
            assert!(
                matches!(&refused, RenderError::TooLarge(why) if why.contains("256x4194304")),
                "{refused}"
            );
        }
        // A pipeline that keeps every step within the limits renders the same image.
        let small = spec("s=decode,center_crop(224),resize(64),uint8(hwc)");
        assert!(render(&small, &png, 0).is_ok());
    }

    /// `jpeg` with every restart marker renumbered RST0, as some encoders write them.
    fn restarts_all_rst0(jpeg: &[u8]) -> Vec<u8> {
        let mut out = jpeg.to_vec();
        // Past the headers: each marker segment's length, up to the scan header's end.
        let mut at = 2;
        while out[at + 1] != 0xDA {
            at += 2 + usize::from(u16::from_be_bytes([out[at + 2], out[at + 3]]));
        }
        at += 2 + usize::from(u16::from_be_bytes([out[at + 2], out[at + 3]]));
        let mut renumbered = 0;
        while at + 1 < out.len() {
            if out[at] == 0xFF && (0xD1..=0xD7).contains(&out[at + 1]) {
                out[at + 1] = 0xD0;
                renumbered += 1;
            }
            at += 1;
        }
        assert!(renumbered > 0, "the copy has restart markers");
        out
    }

    #[test]
    fn renders_equal_whole_decodes_when_restart_markers_are_out_of_turn() {
        // The decoded cache renders from the whole decode's pixels; without it a render decodes
        // only its crop. A JPEG whose restart markers are all RST0 must give the same bytes both
        // ways (libjpeg-turbo resynchronises at each marker out of turn in a whole decode).
        use turbojpeg::Subsamp;
        let s = spec("t=decode,random_resized_crop(64, scale=(0.05, 0.2)),uint8(hwc)");
        for subsampling in [Subsamp::Sub2x2, Subsamp::None] {
            let jpeg = crate::view::jpeg::tests::encoded(305, 217, subsampling, false);
            let marked = crate::view::jpeg::restart_marked(&jpeg).expect("copy");
            let bad = restarts_all_rst0(&marked);
            let pixels = decode(&bad).expect("the image crate decodes it");
            let mut compared = 0;
            for seed in 0..16 {
                if reads_scaled(&s, pixels.size(), seed) {
                    continue;
                }
                let part = render(&s, &bad, seed).expect("renders").npy;
                let whole = transform(&s, &pixels, seed).expect("renders").npy;
                assert!(
                    part == whole,
                    "{subsampling:?} seed {seed}: not byte for byte"
                );
                compared += 1;
            }
            assert!(compared >= 8, "{compared} renders at full scale");
        }
    }

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        let jpeg = crate::synthetic::photo(1).expect("jpeg");
        let s = spec("t=decode,random_resized_crop(32)");
        assert!(matches!(
            render(&s, b"hello, not an image", 0),
            Err(RenderError::NotAnImage(_))
        ));
        for cut in [4, 100, jpeg.len() / 2] {
            assert!(render(&s, &jpeg[..cut], 0).is_err(), "truncated at {cut}");
        }
        // Only the end-of-image marker missing: crops anywhere in the image (libjpeg-turbo
        // stops after a part's rows) still fail, as does the whole decode.
        let short = &jpeg[..jpeg.len() - 2];
        for seed in 0..8 {
            assert!(render(&s, short, seed).is_err(), "seed {seed}");
        }
        assert!(decode(short).is_err());
        let mut flipped = jpeg.clone();
        for i in (200..flipped.len()).step_by(97) {
            flipped[i] ^= 0x5a;
        }
        let _ = render(&s, &flipped, 0); // may decode with artefacts or fail; must not panic
        // A PNG header claiming 100000 x 100000 pixels.
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend_from_slice(&100_000u32.to_be_bytes());
        png.extend_from_slice(&100_000u32.to_be_bytes());
        png.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            render(&s, &png, 0),
            Err(RenderError::TooLarge(_)) | Err(RenderError::Corrupt(_))
        ));
    }
}
