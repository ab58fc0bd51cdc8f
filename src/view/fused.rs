//! The fused render kernel's contract: a render reduced to one resample of a source region, a
//! window of the result (zero outside its valid rectangle), a left-right flip, a per-channel
//! affine map and a layout, plus the integer filter tables the resample uses, packed into the
//! flat arrays the kernel reads. `mirror` runs the kernel's exact arithmetic on the CPU.
//!
//! Owns the arithmetic that makes GPU renders equal CPU renders: the filter taps are those of
//! fast_image_resize's antialiased bilinear convolution for u8 (Pillow's: f64 weights normalised
//! per output pixel, rounded to i16 at a per-axis precision, vertical pass first with a u8
//! result, then the horizontal pass), and floats are `v * scale + offset` rounded once per
//! operation (no fused multiply-add), as `render::encode` does. The CUDA source in
//! `gpu/kernel.cu` is a line-for-line translation of `pixel`; change both or neither. Must never
//! decide a random draw (that is `plan`'s) or touch a device.

use super::npy::{self, Dtype};
use super::plan::{Draws, Step, center_offset};
use super::render::{self, Rgb};
use super::spec::Output;

/// A render in the fused kernel's form.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fused {
    /// (left, top, width, height) of the decoded image that is resampled.
    pub region: (u32, u32, u32, u32),
    /// (width, height) of the resampled grid (the region's own size: no resample).
    pub resized: (u32, u32),
    /// (left, top) of the output in the resampled grid; negative where padding comes before.
    pub window: (i64, i64),
    /// (width, height) of the output.
    pub out: (u32, u32),
    /// The grid rectangle (x0, y0, x1, y1) whose pixels are real; the rest of the output is 0.
    pub valid: (i64, i64, i64, i64),
    /// Mirror the output left-right.
    pub flip: bool,
    /// Element type and layout.
    pub output: Output,
    /// float32 output: per channel, `v * scale + offset` of each u8 value `v`.
    pub scale: [f32; 3],
    /// See `scale`.
    pub offset: [f32; 3],
}

fn intersect(a: (i64, i64, i64, i64), b: (i64, i64, i64, i64)) -> (i64, i64, i64, i64) {
    (a.0.max(b.0), a.1.max(b.1), a.2.min(b.2), a.3.min(b.3))
}

impl Fused {
    /// The fused form of `draws` over an image of `width` x `height`, or `None` when the
    /// pipeline resamples twice or resamples padding (those renders stay on the CPU path).
    pub fn new(draws: &Draws, width: u32, height: u32, output: Output) -> Option<Fused> {
        let mut region = (0u32, 0u32, width, height);
        let mut resized = (width, height);
        let mut resampled = false;
        let mut window = (0i64, 0i64);
        let mut out = (width, height);
        let mut valid = (0i64, 0i64, i64::from(width), i64::from(height));
        for step in &draws.steps {
            match *step {
                Step::Resize {
                    region: (l, t, w, h),
                    width: rw,
                    height: rh,
                } => {
                    let extent = (
                        window.0,
                        window.1,
                        window.0 + i64::from(out.0),
                        window.1 + i64::from(out.1),
                    );
                    // Only the source's own pixels can be resampled, once.
                    if resampled || valid != extent {
                        return None;
                    }
                    let left = u32::try_from(window.0 + i64::from(l)).ok()?;
                    let top = u32::try_from(window.1 + i64::from(t)).ok()?;
                    region = (region.0 + left, region.1 + top, w, h);
                    resampled = (rw, rh) != (w, h);
                    resized = (rw, rh);
                    window = (0, 0);
                    out = (rw, rh);
                    valid = (0, 0, i64::from(rw), i64::from(rh));
                }
                Step::CenterCrop {
                    width: cw,
                    height: ch,
                } => {
                    window = (
                        window.0 + center_offset(out.0, cw),
                        window.1 + center_offset(out.1, ch),
                    );
                    out = (cw, ch);
                    let extent = (
                        window.0,
                        window.1,
                        window.0 + i64::from(cw),
                        window.1 + i64::from(ch),
                    );
                    valid = intersect(valid, extent);
                }
            }
        }
        let (scale, offset) = render::affine(draws.norm);
        Some(Fused {
            region,
            resized,
            window,
            out,
            valid,
            flip: draws.flip,
            output,
            scale,
            offset,
        })
    }

    /// Bytes of the output body (the .npy file without its header).
    pub fn body_len(&self) -> usize {
        self.out.0 as usize * self.out.1 as usize * 3 * self.output.element_bytes()
    }

    /// The .npy header of the output.
    pub fn header(&self) -> Vec<u8> {
        let (w, h) = (self.out.0 as usize, self.out.1 as usize);
        match self.output {
            Output::Float32Chw => npy::header(Dtype::F32, &[3, h, w]),
            Output::Uint8Chw => npy::header(Dtype::U8, &[3, h, w]),
            Output::Uint8Hwc => npy::header(Dtype::U8, &[h, w, 3]),
        }
        .to_vec()
    }
}

/// Largest usable precision of an i16 weight with an i32 accumulator over u8 values
/// (fast_image_resize's `PRECISION_BITS`: 8 bits of result, 2 of overflow room).
const PRECISION_BITS: u8 = 32 - 8 - 2;
/// i16 weights: 15 bits of magnitude.
const MAX_COEFFS_PRECISION: u8 = 16 - 1;

/// The integer filter of one axis: for each output index, the first input index and the
/// weights of the inputs from there, at `precision` fractional bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AxisTaps {
    /// First input index of each output index.
    pub starts: Vec<u32>,
    /// Number of weights used by each output index.
    pub counts: Vec<u32>,
    /// Weights, `window` per output index (the unused tail zero).
    pub weights: Vec<i16>,
    /// Stride of `weights`.
    pub window: usize,
    /// Fractional bits of the weights.
    pub precision: u8,
}

fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 { 1.0 - x } else { 0.0 }
}

impl AxisTaps {
    /// The taps resampling `in_size` inputs to `out_size` outputs, as fast_image_resize
    /// computes them for `Convolution(Bilinear)` (`precompute_coefficients` with an adaptive
    /// kernel, then `Normalizer16`), or `None` when the sizes are equal (no pass on this axis).
    pub fn new(in_size: u32, out_size: u32) -> Option<AxisTaps> {
        if in_size == out_size || in_size == 0 || out_size == 0 {
            return None;
        }
        let scale = f64::from(in_size) / f64::from(out_size);
        let filter_scale = scale.max(1.0);
        let radius = filter_scale; // bilinear support 1.0
        let window = radius.ceil() as usize * 2 + 1;
        let recip = 1.0 / filter_scale;
        let mut values: Vec<f64> = Vec::with_capacity(window * out_size as usize);
        let (mut starts, mut counts) = (Vec::new(), Vec::new());
        for out_x in 0..out_size {
            let in_center = (f64::from(out_x) + 0.5) * scale;
            let x_min = (in_center - radius).floor().max(0.) as u32;
            let x_max = (in_center + radius).ceil().min(f64::from(in_size)) as u32;
            let cur = values.len();
            let mut ww = 0.0;
            let center = in_center - 0.5;
            let (mut bound_start, mut bound_end) = (x_min, x_max);
            for x in x_min..x_max {
                let w = bilinear((f64::from(x) - center) * recip);
                if x == bound_start && w == 0. {
                    bound_start += 1;
                } else {
                    values.push(w);
                    ww += w;
                }
            }
            for &c in values.iter().rev() {
                if bound_end <= bound_start || c != 0. {
                    break;
                }
                bound_end -= 1;
            }
            if ww != 0.0 {
                values[cur..].iter_mut().for_each(|w| *w /= ww);
            }
            values.resize(cur + window, 0.);
            starts.push(bound_start);
            counts.push(bound_end - bound_start);
        }
        let max_weight = values.iter().copied().fold(0.0f64, f64::max);
        let mut precision = 0u8;
        for p in 0..PRECISION_BITS {
            precision = p;
            let next = (max_weight * f64::from(1u32 << (p + 1))).round() as i32;
            if next >= 1 << MAX_COEFFS_PRECISION {
                break;
            }
        }
        let unit = f64::from(1u32 << precision);
        let mut weights = vec![0i16; window * out_size as usize];
        for (i, chunk) in values.chunks_exact(window).enumerate() {
            for (j, v) in chunk.iter().take(counts[i] as usize).enumerate() {
                weights[i * window + j] = (v * unit).round() as i16;
            }
        }
        Some(AxisTaps {
            starts,
            counts,
            weights,
            window,
            precision,
        })
    }

    /// Appends this table to `taps` in the kernel's layout (start, count pairs, then the
    /// weights), returning where it begins.
    fn pack(&self, taps: &mut Vec<i32>) -> i32 {
        let at = taps.len() as i32;
        for (s, c) in self.starts.iter().zip(&self.counts) {
            taps.push(*s as i32);
            taps.push(*c as i32);
        }
        taps.extend(self.weights.iter().map(|w| i32::from(*w)));
        at
    }
}

/// Output layouts as the kernel numbers them.
pub const LAYOUT_F32_CHW: i32 = 0;
/// See [`LAYOUT_F32_CHW`].
pub const LAYOUT_U8_CHW: i32 = 1;
/// See [`LAYOUT_F32_CHW`].
pub const LAYOUT_U8_HWC: i32 = 2;

/// One image of a kernel launch. `#[repr(C)]` and laid out as `struct Item` in `kernel.cu`
/// (128 bytes, no padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Item {
    /// Byte offset of the item's source pixels in the launch's source buffer.
    pub src: u64,
    /// Byte offset of the item's output body in the launch's output buffer.
    pub dst: u64,
    /// Source pixels per row (the row stride is `src_w * 3` bytes).
    pub src_w: i32,
    /// Source rows.
    pub src_h: i32,
    /// Left of the resampled region in the source.
    pub reg_l: i32,
    /// Top of the resampled region in the source.
    pub reg_t: i32,
    /// Width of the resampled grid.
    pub res_w: i32,
    /// Height of the resampled grid.
    pub res_h: i32,
    /// Left of the output in the grid.
    pub win_l: i32,
    /// Top of the output in the grid.
    pub win_t: i32,
    /// Output width.
    pub out_w: i32,
    /// Output height.
    pub out_h: i32,
    /// Valid grid rectangle (x0, y0, x1, y1).
    pub valid: [i32; 4],
    /// Offset of the horizontal taps in the taps buffer, -1: no horizontal pass.
    pub xtaps: i32,
    /// Weights per output column.
    pub xwin: i32,
    /// Fractional bits of the horizontal weights.
    pub xprec: i32,
    /// Offset of the vertical taps, -1: no vertical pass.
    pub ytaps: i32,
    /// Weights per output row.
    pub ywin: i32,
    /// Fractional bits of the vertical weights.
    pub yprec: i32,
    /// 1: mirror left-right.
    pub flip: i32,
    /// `LAYOUT_*`.
    pub layout: i32,
    /// float32: per-channel scale.
    pub scale: [f32; 3],
    /// float32: per-channel offset.
    pub offset: [f32; 3],
}

/// Alignment of each output body in the output buffer (float32 stores need 4; 16 keeps rows of
/// different items off shared cache sectors).
pub const BODY_ALIGN: u64 = 16;

/// The launch parameters of a batch, built on the host.
#[derive(Debug, Default, Clone)]
pub struct Launch {
    /// One per image.
    pub items: Vec<Item>,
    /// All the items' filter tables.
    pub taps: Vec<i32>,
    /// Bytes of source pixels the items read.
    pub src_len: u64,
    /// Bytes of output the items write.
    pub dst_len: u64,
}

impl Launch {
    /// Adds `fused`, whose source is an image of `src_w` x `src_h` pixels about to be placed at
    /// the end of the source buffer with its region at (`reg_l`, `reg_t`); returns the item's
    /// output offset.
    pub fn push(&mut self, fused: &Fused, src_w: u32, src_h: u32, reg_l: u32, reg_t: u32) -> u64 {
        let dst = self.dst_len.next_multiple_of(BODY_ALIGN);
        let mut item = Item {
            src: self.src_len,
            dst,
            src_w: src_w as i32,
            src_h: src_h as i32,
            reg_l: reg_l as i32,
            reg_t: reg_t as i32,
            res_w: fused.resized.0 as i32,
            res_h: fused.resized.1 as i32,
            win_l: fused.window.0 as i32,
            win_t: fused.window.1 as i32,
            out_w: fused.out.0 as i32,
            out_h: fused.out.1 as i32,
            valid: [
                fused.valid.0.clamp(0, i64::from(fused.resized.0)) as i32,
                fused.valid.1.clamp(0, i64::from(fused.resized.1)) as i32,
                fused.valid.2.clamp(0, i64::from(fused.resized.0)) as i32,
                fused.valid.3.clamp(0, i64::from(fused.resized.1)) as i32,
            ],
            xtaps: -1,
            ytaps: -1,
            flip: i32::from(fused.flip),
            layout: match fused.output {
                Output::Float32Chw => LAYOUT_F32_CHW,
                Output::Uint8Chw => LAYOUT_U8_CHW,
                Output::Uint8Hwc => LAYOUT_U8_HWC,
            },
            scale: fused.scale,
            offset: fused.offset,
            ..Item::default()
        };
        if let Some(t) = AxisTaps::new(fused.region.2, fused.resized.0) {
            item.xtaps = t.pack(&mut self.taps);
            item.xwin = t.window as i32;
            item.xprec = i32::from(t.precision);
        }
        if let Some(t) = AxisTaps::new(fused.region.3, fused.resized.1) {
            item.ytaps = t.pack(&mut self.taps);
            item.ywin = t.window as i32;
            item.yprec = i32::from(t.precision);
        }
        self.src_len += u64::from(src_w) * u64::from(src_h) * 3;
        self.dst_len = dst + fused.body_len() as u64;
        self.items.push(item);
        dst
    }
}

/// Bytes of source pixels an item reads when only its region is uploaded.
pub fn region_bytes(fused: &Fused) -> u64 {
    u64::from(fused.region.2) * u64::from(fused.region.3) * 3
}

/// Appends the rows of `fused`'s region of `image` to `src`, compactly (the upload of one item).
pub fn copy_region(image: &Rgb, fused: &Fused, src: &mut Vec<u8>) {
    let (l, t, w, h) = fused.region;
    let (row, bytes) = (image.row_len(), image.pixels());
    for y in t..t + h {
        let start = y as usize * row + l as usize * 3;
        src.extend_from_slice(&bytes[start..start + w as usize * 3]);
    }
}

/// The kernel's arithmetic on the CPU: `kernel.cu`'s `render_batch`, one thread at a time.
pub mod mirror {
    use super::{Item, LAYOUT_F32_CHW, LAYOUT_U8_CHW};

    fn clip(v: i32, precision: i32) -> u8 {
        (v >> precision).clamp(0, 255) as u8
    }

    /// The vertical pass at grid row `gy`, source column `sx` (region coordinates), one channel.
    fn vertical(it: &Item, taps: &[i32], src: &[u8], gy: i32, sx: i32, c: usize) -> u8 {
        let stride = it.src_w as usize * 3;
        let base = it.src as usize + (it.reg_l + sx) as usize * 3 + c;
        if it.ytaps < 0 {
            return src[base + (it.reg_t + gy) as usize * stride];
        }
        let bound = (it.ytaps + 2 * gy) as usize;
        let (start, count) = (taps[bound], taps[bound + 1]);
        let w = (it.ytaps + 2 * it.res_h + gy * it.ywin) as usize;
        let mut sum: i32 = 1 << (it.yprec - 1);
        for i in 0..count {
            let row = (it.reg_t + start + i) as usize;
            sum += i32::from(src[base + row * stride]) * taps[w + i as usize];
        }
        clip(sum, it.yprec)
    }

    /// The resampled value at grid (`gx`, `gy`), channel `c`.
    fn sample(it: &Item, taps: &[i32], src: &[u8], gx: i32, gy: i32, c: usize) -> u8 {
        if it.xtaps < 0 {
            return vertical(it, taps, src, gy, gx, c);
        }
        let bound = (it.xtaps + 2 * gx) as usize;
        let (start, count) = (taps[bound], taps[bound + 1]);
        let w = (it.xtaps + 2 * it.res_w + gx * it.xwin) as usize;
        let mut sum: i32 = 1 << (it.xprec - 1);
        for j in 0..count {
            let v = vertical(it, taps, src, gy, start + j, c);
            sum += i32::from(v) * taps[w + j as usize];
        }
        clip(sum, it.xprec)
    }

    /// Output pixel (`x`, `y`) of item `it`, written into `dst`.
    pub fn pixel(it: &Item, taps: &[i32], src: &[u8], dst: &mut [u8], x: i32, y: i32) {
        let sx = if it.flip != 0 { it.out_w - 1 - x } else { x };
        let (gx, gy) = (it.win_l + sx, it.win_t + y);
        let inside = gx >= it.valid[0] && gy >= it.valid[1] && gx < it.valid[2] && gy < it.valid[3];
        let plane = (it.out_w * it.out_h) as usize;
        let at = (y * it.out_w + x) as usize;
        for c in 0..3 {
            let v = if inside {
                sample(it, taps, src, gx, gy, c)
            } else {
                0
            };
            if it.layout == LAYOUT_F32_CHW {
                let f = f32::from(v) * it.scale[c] + it.offset[c];
                let o = it.dst as usize + (c * plane + at) * 4;
                dst[o..o + 4].copy_from_slice(&f.to_le_bytes());
            } else if it.layout == LAYOUT_U8_CHW {
                dst[it.dst as usize + c * plane + at] = v;
            } else {
                dst[it.dst as usize + at * 3 + c] = v;
            }
        }
    }

    /// Every pixel of every item, as the launch would compute them.
    pub fn run(items: &[Item], taps: &[i32], src: &[u8], dst: &mut [u8]) {
        for it in items {
            for y in 0..it.out_h {
                for x in 0..it.out_w {
                    pixel(it, taps, src, dst, x, y);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::plan::draw;
    use crate::view::render;
    use crate::view::spec::ViewSpec;

    /// Renders `spec` over `image` through the fused form and the mirror, as a batch of one.
    fn mirrored(spec: &ViewSpec, image: &Rgb, seed: u64) -> Option<Vec<u8>> {
        let (w, h) = image.size();
        let fused = Fused::new(&draw(spec, w, h, seed).expect("draws"), w, h, spec.output)?;
        let mut launch = Launch::default();
        let mut src = Vec::new();
        copy_region(image, &fused, &mut src);
        launch.push(&fused, fused.region.2, fused.region.3, 0, 0);
        let mut dst = vec![0u8; launch.dst_len as usize];
        mirror::run(&launch.items, &launch.taps, &src, &mut dst);
        let mut npy = fused.header();
        npy.extend_from_slice(&dst[launch.items[0].dst as usize..]);
        Some(npy)
    }

    /// A random image: smooth gradients plus noise, so both flat and busy regions are covered.
    fn random_image(rng: &mut fastrand::Rng, w: u32, h: u32) -> Rgb {
        let mut data = Vec::with_capacity((w * h * 3) as usize);
        let (a, b) = (rng.u32(1..8), rng.u32(1..8));
        for y in 0..h {
            for x in 0..w {
                for c in 0..3 {
                    let smooth = (x * a + y * b + c * 40) % 256;
                    let noise = rng.u32(0..64);
                    data.push(((smooth + noise) % 256) as u8);
                }
            }
        }
        Rgb::from_raw(w, h, data).expect("valid image")
    }

    #[test]
    fn struct_item_is_128_bytes_without_padding() {
        assert_eq!(std::mem::size_of::<Item>(), 128);
        assert_eq!(std::mem::align_of::<Item>(), 8);
        // The offsets of kernel.cu's `struct Item` (same field order, no padding).
        use std::mem::offset_of;
        assert_eq!(offset_of!(Item, src_w), 16);
        assert_eq!(offset_of!(Item, valid), 56);
        assert_eq!(offset_of!(Item, xtaps), 72);
        assert_eq!(offset_of!(Item, flip), 96);
        assert_eq!(offset_of!(Item, scale), 104);
        assert_eq!(offset_of!(Item, offset), 116);
    }

    #[test]
    fn taps_match_pillow_bilinear_weights() {
        // Downscale by 2: each output averages a 4-pixel triangle (weights 1,3,3,1 / 8).
        let t = AxisTaps::new(8, 4).expect("a pass");
        assert_eq!((t.starts[1], t.counts[1]), (1, 4));
        let w = &t.weights[t.window..t.window + 4];
        let unit = f64::from(1u32 << t.precision);
        for (got, want) in w.iter().zip([1.0, 3.0, 3.0, 1.0]) {
            assert!((f64::from(*got) - want / 8.0 * unit).abs() <= 1.0, "{w:?}");
        }
        assert!(AxisTaps::new(10, 10).is_none(), "same size: no pass");
    }

    /// The fused kernel's arithmetic equals the CPU renderer byte for byte (tolerance: none),
    /// over random image sizes, crop draws, flips, layouts and pipelines.
    #[test]
    fn mirror_of_the_kernel_equals_the_cpu_path_on_random_images() {
        let specs = [
            "a=decode,random_resized_crop(224),hflip,normalize(imagenet)",
            "b=decode,random_resized_crop(64, 48, scale=(0.01, 1)),hflip,uint8",
            "c=decode,random_resized_crop(96, ratio=(0.2, 5)),hflip(1),uint8(hwc)",
            "d=decode,resize(256),center_crop(224),normalize(imagenet)",
            "e=decode,resize(40),uint8(hwc)",
            "f=decode,center_crop(300),hflip,normalize(imagenet)",
            "g=decode,random_resized_crop(512),float32",
            "h=decode,resize(33, 71),center_crop(50, 20),hflip(1),uint8",
            "i=decode,center_crop(64),random_resized_crop(32),hflip,normalize(imagenet)",
            "j=decode,resize(64),center_crop(100)",
        ]
        .map(|s| ViewSpec::parse(s).expect("parses"));
        let mut rng = fastrand::Rng::with_seed(42);
        let mut compared = 0;
        for round in 0..40 {
            let (w, h) = (rng.u32(1..700), rng.u32(1..700));
            let image = random_image(&mut rng, w, h);
            for spec in &specs {
                let seed = rng.u64(..);
                let cpu = render::transform(spec, &image, seed)
                    .expect("cpu renders")
                    .npy;
                let Some(gpu) = mirrored(spec, &image, seed) else {
                    // Only a center crop padding a small image before a resample falls back.
                    assert!(spec.name == "i" && (w < 64 || h < 64), "{}", spec.text);
                    continue;
                };
                assert!(
                    cpu == gpu,
                    "round {round}, {w}x{h}, {}, seed {seed}: first difference at byte {:?}",
                    spec.text,
                    cpu.iter().zip(&gpu).position(|(a, b)| a != b)
                );
                compared += 1;
            }
        }
        assert!(compared >= 390, "{compared} compared");
    }

    #[test]
    fn pipelines_that_resample_twice_or_resample_padding_stay_on_the_cpu() {
        for text in [
            "a=decode,resize(100),random_resized_crop(32)",
            "b=decode,center_crop(900),resize(64)",
        ] {
            let spec = ViewSpec::parse(text).expect("parses");
            let d = draw(&spec, 500, 375, 1).expect("within the limits");
            assert_eq!(Fused::new(&d, 500, 375, spec.output), None, "{text}");
        }
        let ok = ViewSpec::parse("c=decode,center_crop(100),resize(64)").expect("parses");
        assert!(Fused::new(&draw(&ok, 500, 375, 1).expect("draws"), 500, 375, ok.output).is_some());
    }

    #[test]
    fn a_batch_of_many_items_renders_each_as_alone() {
        let spec = ViewSpec::parse("a=decode,random_resized_crop(32),hflip,normalize(imagenet)")
            .expect("parses");
        let mut rng = fastrand::Rng::with_seed(3);
        let images: Vec<Rgb> = (0..12)
            .map(|_| {
                let (w, h) = (rng.u32(16..300), rng.u32(16..300));
                random_image(&mut rng, w, h)
            })
            .collect();
        let mut launch = Launch::default();
        let mut src = Vec::new();
        let mut fused = Vec::new();
        for (i, image) in images.iter().enumerate() {
            let (w, h) = image.size();
            let f = Fused::new(
                &draw(&spec, w, h, i as u64).expect("draws"),
                w,
                h,
                spec.output,
            )
            .expect("fuses");
            copy_region(image, &f, &mut src);
            launch.push(&f, f.region.2, f.region.3, 0, 0);
            fused.push(f);
        }
        assert_eq!(src.len() as u64, launch.src_len);
        let mut dst = vec![0u8; launch.dst_len as usize];
        mirror::run(&launch.items, &launch.taps, &src, &mut dst);
        for (i, (image, f)) in images.iter().zip(&fused).enumerate() {
            let at = launch.items[i].dst as usize;
            let mut npy = f.header();
            npy.extend_from_slice(&dst[at..at + f.body_len()]);
            let cpu = render::transform(&spec, image, i as u64)
                .expect("renders")
                .npy;
            assert!(npy == cpu, "item {i}");
        }
    }
}
