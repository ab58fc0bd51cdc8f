//! JPEG decoding with libjpeg-turbo (its TurboJPEG 3 API), the decoder PIL, torchvision and DALI
//! use: the whole image, or only the part of it a render reads, at full size or at 1/2, 1/4 or
//! 1/8 scale in the DCT domain; and the lossless restart-marked copy (`restart_marked`) from
//! which a part is decoded out of a cut holding only its MCUs (`segments`).
//!
//! A part is the region asked for, widened by one column on each side and rounded out to the
//! image's iMCU columns (TurboJPEG's cropping region: `jpeg_crop_scanline` for the columns,
//! `jpeg_skip_scanlines` for the rows). The extra columns keep every pixel of the region equal to
//! the whole image's decode: chroma upsampling treats a cut column as the image's edge, so the
//! outermost column of a part can differ from the whole decode (measured: up to 68 levels in
//! 4:2:0 and 4:2:2 files); rows are exact.
//!
//! Owns the views' calls into C, their only unsafe code but for `render`'s choice of its AVX2
//! build: one TurboJPEG handle per image (a fresh one costs ~0.3 µs, so no state passes between
//! images), the parameters that bound a decode (a warning is an error, so truncated or corrupt
//! data is never returned grey-filled; progressive scans and libjpeg's own buffers are capped;
//! ICC profiles are not copied), and the size of the buffer TurboJPEG writes into. Must never
//! decide what to decode (`plan` does) nor allocate a part before its caller has checked its size
//! against the pixel limits, and never hand back pixels of a decode that failed or warned: the
//! caller falls back to the image crate's decoder.

use std::ffi::CStr;

use turbojpeg_sys as tj;

use super::segments::{self, Restarts, Segments};

/// Progressive scans a decode accepts: libjpeg-turbo's own fuzzers' limit. Real encoders write
/// about 10; thousands of tiny scans make a small file decode for minutes.
const SCAN_LIMIT: i32 = 500;
/// Megabytes libjpeg may allocate for its own buffers, beyond which it fails: a progressive
/// image holds all its coefficients, 2 bytes per sample (6 per pixel at 4:4:4), so this is what
/// the largest image a render accepts needs (`limits::MAX_DECODE_BYTES` of RGB, 3 bytes per
/// pixel, twice over).
const MAX_MEMORY_MB: i32 = 256;
/// Bytes per output pixel (TJPF_RGB).
const RGB: usize = 3;
/// Width in pixels of an iMCU column by TurboJPEG's subsampling (TJSAMP_444, 422, 420, GRAY,
/// 440, 411, 441): turbojpeg.h's `tjMCUWidth`, a `static const` in the header that the library
/// does not export.
const IMCU_WIDTH: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];

/// Why libjpeg-turbo did not decode an image (the caller falls back to another decoder).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("libjpeg-turbo: {0}")]
pub struct Refused(String);

/// The part of an image to decode: a rectangle of the image scaled to 1/`scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// (left, top) in the scaled image's pixels.
    pub origin: (u32, u32),
    /// (width, height) in the scaled image's pixels.
    pub size: (u32, u32),
    /// The image is decoded at 1/`scale` of its size: 1, 2, 4 or 8.
    pub scale: u32,
}

/// A JPEG whose header TurboJPEG has read, ready to decode parts of.
pub struct Jpeg<'a> {
    handle: Handle,
    encoded: &'a [u8],
    width: u32,
    height: u32,
    /// Width of an iMCU column in pixels (the alignment of a part's left edge); `None` when
    /// TurboJPEG cannot tell the subsampling, which it cannot crop.
    imcu_width: Option<u32>,
    /// Its restart segments, when it is a copy made by `restart_marked`: a part is then decoded
    /// from a cut holding only its MCUs.
    segments: Option<Segments<'a>>,
}

/// (width, height) of the JPEG `encoded` from its header, as libjpeg-turbo reads it; refused when
/// it cannot read the header.
pub fn size(encoded: &[u8]) -> Result<(u32, u32), Refused> {
    let (width, height, _) = Handle::new(tj::TJINIT_TJINIT_DECOMPRESS)?.read_header(encoded)?;
    Ok((width, height))
}

/// A copy of `encoded` that `Segments` can cut: the same DCT coefficients (so every decode of
/// it gives the same pixels), written losslessly by libjpeg-turbo as a baseline JPEG with a
/// restart marker every `segments::interval_for` MCUs and no metadata. Refused when
/// libjpeg-turbo cannot read the whole file without a warning, or cannot tell its subsampling.
/// Costs about two whole decodes' Huffman work; libjpeg-turbo allocates the coefficients of the
/// whole image (2 bytes a sample), within `MAX_MEMORY_MB`.
pub fn restart_marked(encoded: &[u8]) -> Result<Vec<u8>, Refused> {
    let handle = Handle::new(tj::TJINIT_TJINIT_TRANSFORM)?;
    let (width, _, imcu_width) = handle.read_header(encoded)?;
    let imcu_width = imcu_width.ok_or_else(|| Refused("an unknown subsampling".into()))?;
    let interval = segments::interval_for(width.div_ceil(imcu_width), imcu_width);
    // Reading the header set these from the source; the copy is baseline Huffman whatever it was.
    for (param, value) in [
        (tj::TJPARAM_TJPARAM_PROGRESSIVE, 0),
        (tj::TJPARAM_TJPARAM_ARITHMETIC, 0),
        (tj::TJPARAM_TJPARAM_RESTARTBLOCKS, interval as i32),
    ] {
        // SAFETY: a live handle; tj3Set checks the parameter and value.
        handle.check(unsafe { tj::tj3Set(handle.0, param as i32, value) })?;
    }
    let transform = tj::tjtransform {
        r: tj::tjregion {
            x: 0,
            y: 0,
            w: 0,
            h: 0,
        },
        op: tj::TJXOP_TJXOP_NONE as i32,
        options: tj::TJXOPT_COPYNONE as i32,
        data: std::ptr::null_mut(),
        customFilter: None,
    };
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut len: tj::size_t = 0;
    // SAFETY: a live transform handle whose header was read from `encoded`, passed again with
    // its length; one transform, one output pointer and size, which TurboJPEG allocates (with
    // tj3Alloc) and fills, or leaves null on failure.
    let status = unsafe {
        tj::tj3Transform(
            handle.0,
            encoded.as_ptr(),
            encoded.len() as tj::size_t,
            1,
            &mut out,
            &mut len,
            &transform,
        )
    };
    let copy = (status == 0 && !out.is_null()).then(|| {
        // SAFETY: on success TurboJPEG wrote `len` bytes at `out`.
        unsafe { std::slice::from_raw_parts(out, len as usize) }.to_vec()
    });
    // SAFETY: `out` is null or was allocated by TurboJPEG; freed once, after the copy.
    unsafe { tj::tj3Free(out.cast()) };
    handle.check(status)?;
    copy.map(segments::with_index)
        .ok_or_else(|| Refused("no output".into()))
}

impl<'a> Jpeg<'a> {
    /// Reads the header of `encoded`; refused when TurboJPEG cannot decode it (not a JPEG, a
    /// header it rejects, or out of memory), and when its restart markers are out of turn (its
    /// whole decode warns, so a part decoded without reaching them, or from a renumbered cut,
    /// would not be the whole decode's pixels: the caller decodes it whole, another way).
    pub fn open(encoded: &'a [u8]) -> Result<Jpeg<'a>, Refused> {
        let mut jpeg = Jpeg::open_plain(encoded)?;
        jpeg.segments = match Restarts::of(encoded) {
            Restarts::Segments(segments) => Some(segments),
            Restarts::OutOfTurn => {
                return Err(Refused("restart markers out of turn".into()));
            }
            Restarts::Unknown => None,
        };
        Ok(jpeg)
    }

    /// `open` without looking for restart segments (a cut is decoded as it is).
    fn open_plain(encoded: &'a [u8]) -> Result<Jpeg<'a>, Refused> {
        let handle = Handle::new(tj::TJINIT_TJINIT_DECOMPRESS)?;
        let (width, height, imcu_width) = handle.read_header(encoded)?;
        Ok(Jpeg {
            handle,
            encoded,
            width,
            height,
            imcu_width,
            segments: None,
        })
    }

    /// (width, height) of the image.
    pub fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    /// The part that holds `region` (left, top, width, height, in the image's pixels, within
    /// it) decoded at 1/`scale` (1, 2, 4 or 8): the scaled region rounded out to whole pixels,
    /// one more column on each side, the left edge moved down to an iMCU column; the whole
    /// scaled image when the subsampling cannot be cropped.
    pub fn part(&self, region: (u32, u32, u32, u32), scale: u32) -> Part {
        let scale = scale.clamp(1, 8);
        let scaled = |side: u32| side.div_ceil(scale);
        let (width, height) = (scaled(self.width), scaled(self.height));
        let Some(imcu) = self.imcu_width.map(|w| scaled(w).max(1)) else {
            return Part {
                origin: (0, 0),
                size: (width, height),
                scale,
            };
        };
        let (left, top, w, h) = region;
        let x0 = (left / scale).saturating_sub(1).min(width - 1) / imcu * imcu;
        let x1 = (left.saturating_add(w).div_ceil(scale) + 1).clamp(x0 + 1, width);
        let y0 = (top / scale).min(height - 1);
        let y1 = top.saturating_add(h).div_ceil(scale).clamp(y0 + 1, height);
        Part {
            origin: (x0, y0),
            size: (x1 - x0, y1 - y0),
            scale,
        }
    }

    /// The RGB pixels of `part` (`Jpeg::part` of this image), rows of `part.size.0 * 3` bytes.
    /// The caller checks the part's size against its limits first: this allocates it.
    pub fn decode(&mut self, part: &Part) -> Result<Vec<u8>, Refused> {
        let factor = tj::tjscalingfactor {
            num: 1,
            denom: part.scale as i32,
        };
        // SAFETY: a live handle whose header was read; TurboJPEG validates the factor.
        self.handle
            .check(unsafe { tj::tj3SetScalingFactor(self.handle.0, factor) })?;
        let full = (
            self.width.div_ceil(part.scale),
            self.height.div_ceil(part.scale),
        );
        let (w, h) = part.size;
        if w == 0 || h == 0 || part.origin.0 + w > full.0 || part.origin.1 + h > full.1 {
            return Err(Refused(format!("{part:?} is outside the image")));
        }
        let s = part.scale;
        let region = (
            part.origin.0 * s,
            part.origin.1 * s,
            ((part.origin.0 + w) * s).min(self.width),
            ((part.origin.1 + h) * s).min(self.height),
        );
        if let Some(cut) = self.segments.as_ref().and_then(|g| g.cut(region)) {
            // The cut starts on an MCU, a whole number of scaled iMCUs: the part's left edge
            // stays aligned in it.
            // A cut is decoded as it is (finding its segments would only scan it).
            let mut inner = Jpeg::open_plain(&cut.jpeg)?;
            let origin = (
                part.origin.0 - cut.origin.0 / s,
                part.origin.1 - cut.origin.1 / s,
            );
            return inner.decode(&Part { origin, ..*part });
        }
        let region = if part.origin == (0, 0) && part.size == full {
            // TJUNCROPPED.
            tj::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            }
        } else {
            tj::tjregion {
                x: part.origin.0 as i32,
                y: part.origin.1 as i32,
                w: w as i32,
                h: h as i32,
            }
        };
        // SAFETY: a live handle; TurboJPEG checks the region against the scaled image and the
        // iMCU alignment of its left edge.
        self.handle
            .check(unsafe { tj::tj3SetCroppingRegion(self.handle.0, region) })?;
        let pitch = w as usize * RGB;
        let len = pitch * h as usize;
        // Not zeroed: TurboJPEG writes every byte, and the bytes are only read once it has.
        let mut pixels = Vec::with_capacity(len);
        // SAFETY: TurboJPEG writes the cropping region's rows (or, uncropped, the scaled image's
        // `full` rows), each of its width in RGB pixels, `pitch` bytes apart: exactly the `len`
        // bytes `pixels` has room for; it reads `encoded` within its length.
        self.handle.check(unsafe {
            tj::tj3Decompress8(
                self.handle.0,
                self.encoded.as_ptr(),
                self.encoded.len() as tj::size_t,
                pixels.spare_capacity_mut().as_mut_ptr().cast(),
                pitch as i32,
                tj::TJPF_TJPF_RGB,
            )
        })?;
        // SAFETY: the decode succeeded, so all `len` bytes are written (see above).
        unsafe { pixels.set_len(len) };
        Ok(pixels)
    }
}

/// An initialised TurboJPEG decompression instance, destroyed on drop.
struct Handle(tj::tjhandle);

impl Handle {
    /// A decompressor or transformer (`kind`) with the parameters that bound its work.
    fn new(kind: tj::TJINIT) -> Result<Handle, Refused> {
        // SAFETY: no preconditions; a null handle is the error.
        let raw = unsafe { tj::tj3Init(kind as i32) };
        if raw.is_null() {
            return Err(Refused("cannot create a TurboJPEG instance".into()));
        }
        let handle = Handle(raw);
        for (param, value) in [
            (tj::TJPARAM_TJPARAM_STOPONWARNING, 1),
            (tj::TJPARAM_TJPARAM_SCANLIMIT, SCAN_LIMIT),
            (tj::TJPARAM_TJPARAM_MAXMEMORY, MAX_MEMORY_MB),
            (tj::TJPARAM_TJPARAM_SAVEMARKERS, 0),
        ] {
            // SAFETY: a live handle; tj3Set checks the parameter and value.
            handle.check(unsafe { tj::tj3Set(handle.0, param as i32, value) })?;
        }
        Ok(handle)
    }

    /// Reads the header of `encoded`: (width, height, iMCU width when TurboJPEG can tell the
    /// subsampling).
    fn read_header(&self, encoded: &[u8]) -> Result<(u32, u32, Option<u32>), Refused> {
        // SAFETY: the pointer and length describe `encoded`, which outlives every use of the
        // handle (TurboJPEG keeps the pointer until the next header read, decode or transform,
        // each of which passes the same slice).
        self.check(unsafe {
            tj::tj3DecompressHeader(self.0, encoded.as_ptr(), encoded.len() as tj::size_t)
        })?;
        let get = |param: tj::TJPARAM| {
            // SAFETY: a live handle; tj3Get only reads the instance.
            unsafe { tj::tj3Get(self.0, param as i32) }
        };
        let side = |param| u32::try_from(get(param)).ok().filter(|&v| v > 0);
        let (Some(width), Some(height)) = (
            side(tj::TJPARAM_TJPARAM_JPEGWIDTH),
            side(tj::TJPARAM_TJPARAM_JPEGHEIGHT),
        ) else {
            return Err(Refused("a header without an image size".into()));
        };
        let imcu_width = usize::try_from(get(tj::TJPARAM_TJPARAM_SUBSAMP))
            .ok()
            .and_then(|s| IMCU_WIDTH.get(s).copied());
        Ok((width, height, imcu_width))
    }

    /// `Ok` for a TurboJPEG status of 0, else the instance's error message.
    fn check(&self, status: i32) -> Result<(), Refused> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: a live handle; the message is a NUL-terminated string owned by the instance
        // (or a thread-local one), copied before any other call.
        let message = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.0)) };
        Err(Refused(message.to_string_lossy().trim().to_string()))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by tj3Init, destroyed once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

#[cfg(test)]
#[path = "../../tests/common/jpeg.rs"]
mod test_jpeg;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A JPEG of `width` x `height` made of a synthetic photo mirrored as often as it takes (a
    /// photo's detail at every scale), encoded by libjpeg-turbo at quality 90 with
    /// `subsampling`, progressive or not.
    pub(crate) fn encoded(
        width: usize,
        height: usize,
        subsampling: turbojpeg::Subsamp,
        progressive: bool,
    ) -> Vec<u8> {
        let photo = crate::synthetic::photo(7).expect("jpeg");
        let rgb = image::load_from_memory(&photo).expect("decodes").to_rgb8();
        let pixels = test_jpeg::mirrored(&rgb, width as u32, height as u32);
        test_jpeg::encode(&pixels, subsampling, progressive)
    }

    fn whole(jpeg: &[u8], scale: u32) -> (Part, Vec<u8>) {
        let mut j = Jpeg::open(jpeg).expect("header");
        let (w, h) = j.size();
        let part = j.part((0, 0, w, h), scale);
        let pixels = j.decode(&part).expect("decodes");
        (part, pixels)
    }

    #[test]
    fn parts_equal_the_whole_decode_byte_for_byte_at_every_scale_and_subsampling() {
        use turbojpeg::Subsamp::*;
        let mut rng = fastrand::Rng::with_seed(3);
        for subsampling in [Sub2x2, Sub2x1, Sub1x2, Sub4x1, None, Gray] {
            for progressive in [false, true] {
                // 305 pixels: a part of an MCU at the right edge, and rows of segments of 1-3
                // MCUs in the copy at every subsampling.
                let jpeg = encoded(305, 217, subsampling, progressive);
                let marked = restart_marked(&jpeg).expect("transcodes");
                assert!(
                    Segments::find(&marked).is_some(),
                    "{subsampling:?} {progressive}"
                );
                for (scale, cut) in [1, 2, 4, 8]
                    .into_iter()
                    .flat_map(|s| [(s, false), (s, true)])
                {
                    let (full, all) = whole(&jpeg, scale);
                    assert_eq!(full.origin, (0, 0));
                    assert_eq!(all, whole(&marked, scale).1, "the copy decodes the same");
                    let mut j = Jpeg::open(if cut { &marked } else { &jpeg }).expect("header");
                    assert_eq!(j.segments.is_some(), cut);
                    for _ in 0..40 {
                        let (w, h) = (rng.u32(1..=305), rng.u32(1..=217));
                        let (l, t) = (rng.u32(0..=305 - w), rng.u32(0..=217 - h));
                        let part = j.part((l, t, w, h), scale);
                        let pixels = j.decode(&part).expect("decodes");
                        let (pw, ph) = part.size;
                        assert_eq!(pixels.len(), (pw * ph * 3) as usize);
                        // The scaled region lies inside the part...
                        let (x0, y0) = part.origin;
                        assert!(x0 <= l / scale && y0 <= t / scale);
                        assert!(x0 + pw >= (l + w).div_ceil(scale));
                        assert!(y0 + ph >= (t + h).div_ceil(scale));
                        // ...and every pixel of it equals the whole decode's.
                        let (from, to) = (l / scale, (l + w).div_ceil(scale));
                        let columns = |x0: u32| (from - x0) as usize * 3..(to - x0) as usize * 3;
                        for y in t / scale..(t + h).div_ceil(scale) {
                            let mine = &pixels[((y - y0) * pw * 3) as usize..][columns(x0)];
                            let theirs = &all[(y * full.size.0 * 3) as usize..][columns(0)];
                            assert!(
                                mine == theirs,
                                "{subsampling:?} progressive={progressive} cut={cut} 1/{scale} \
                                 region {l},{t} {w}x{h} part {part:?}: row {y} differs"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn part_edges_follow_the_imcu_grid_and_the_image() {
        let jpeg = encoded(100, 60, turbojpeg::Subsamp::Sub2x2, false);
        let j = Jpeg::open(&jpeg).expect("header");
        assert_eq!(j.size(), (100, 60));
        // 4:2:0: 16-pixel iMCU columns; one column of margin each side, rows exact.
        let part = j.part((40, 10, 20, 30), 1);
        assert_eq!((part.origin, part.size), ((32, 10), (29, 30)));
        assert_eq!(j.part((0, 0, 100, 60), 1).size, (100, 60), "margins clip");
        // At 1/2 the iMCU column is 8 scaled pixels: 40/2 - 1 = 19 rounds down to 16.
        let part = j.part((40, 10, 20, 30), 2);
        assert_eq!((part.origin, part.size), ((16, 5), (15, 15)));
        // The whole image at 1/8 of 100 x 60 is 13 x 8.
        assert_eq!(j.part((0, 0, 100, 60), 8).size, (13, 8));
    }

    #[test]
    fn truncated_corrupt_and_foreign_data_are_refused() {
        let jpeg = encoded(64, 48, turbojpeg::Subsamp::Sub2x2, false);
        assert!(Jpeg::open(b"not a jpeg").is_err());
        let png = {
            let mut out = Vec::new();
            image::RgbImage::new(4, 4)
                .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
                .expect("png");
            out
        };
        assert!(Jpeg::open(&png).is_err());
        for cut in [jpeg.len() / 2, jpeg.len() - 2] {
            let short = &jpeg[..cut];
            let mut j = Jpeg::open(short).expect("the header is whole");
            for scale in [1, 2, 8] {
                let part = j.part((0, 0, 64, 48), scale);
                let refused = j.decode(&part).expect_err("truncated");
                assert!(refused.0.contains("Premature end"), "{refused}");
            }
        }
        // A part that ends before the cut decodes: libjpeg-turbo skips the rows after it
        // without reading them, which is why a render checks that the file is complete first.
        let mut j = Jpeg::open(&jpeg[..jpeg.len() - 2]).expect("header");
        assert!(j.decode(&j.part((0, 0, 64, 8), 1)).is_ok());
    }
}
