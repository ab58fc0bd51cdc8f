//! The geometry of one render, decided before any pixel is touched: every random draw of a view
//! (crop boxes, flips) made from the render's seed, and the concrete steps they imply.
//!
//! Owns the order and the arithmetic of the draws, so every executor (the CPU renderer, the GPU
//! kernel, its CPU mirror) sees the same crops and flips for the same (spec, image size, seed).
//! Must never read pixels, and never draw a random number anywhere but here.

use super::spec::{Op, Size, ViewSpec, short_side};

/// One pixel step of a render, with its random draws resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Resample `region` (left, top, width, height) of the current image to `width` x `height`
    /// with Pillow's antialiased bilinear filter (the region is cut out first).
    Resize {
        /// (left, top, width, height) of the current image.
        region: (u32, u32, u32, u32),
        /// Output width.
        width: u32,
        /// Output height.
        height: u32,
    },
    /// torchvision's `CenterCrop`: the central `width` x `height`, zero-padded where the image
    /// is smaller.
    CenterCrop {
        /// Output width.
        width: u32,
        /// Output height.
        height: u32,
    },
}

/// Everything a render decides from its seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Draws {
    /// The pixel steps, in order.
    pub steps: Vec<Step>,
    /// The random crop boxes drawn, as (top, left, height, width).
    pub crops: Vec<[u32; 4]>,
    /// Whether the output is mirrored left-right.
    pub flip: bool,
    /// Per-channel (mean, std) of a normalize op, if any.
    pub norm: Option<([f32; 3], [f32; 3])>,
}

/// The draws of `spec` over an image of `width` x `height`, random numbers from `seed`, in the
/// order the ops consume them.
pub fn draw(spec: &ViewSpec, width: u32, height: u32, seed: u64) -> Draws {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut w, mut h) = (width, height);
    let mut out = Draws {
        steps: Vec::new(),
        crops: Vec::new(),
        flip: false,
        norm: None,
    };
    for op in &spec.ops {
        match *op {
            Op::Resize(size) => {
                let (rh, rw) = match size {
                    Size::Short(s) => short_side(h, w, s),
                    Size::Exact(rh, rw) => (rh, rw),
                };
                let (rw, rh) = (rw.max(1), rh.max(1));
                out.steps.push(Step::Resize {
                    region: (0, 0, w, h),
                    width: rw,
                    height: rh,
                });
                (w, h) = (rw, rh);
            }
            Op::CenterCrop { height, width } => {
                out.steps.push(Step::CenterCrop { width, height });
                (w, h) = (width, height);
            }
            Op::RandomResizedCrop {
                height,
                width,
                scale,
                ratio,
            } => {
                let (top, left, ch, cw) = random_crop_box(&mut rng, w, h, scale, ratio);
                out.crops.push([top, left, ch, cw]);
                out.steps.push(Step::Resize {
                    region: (left, top, cw, ch),
                    width,
                    height,
                });
                (w, h) = (width, height);
            }
            Op::HorizontalFlip { p } => {
                if rng.f64() < p {
                    out.flip = !out.flip;
                }
            }
            Op::Normalize { mean, std } => out.norm = Some((mean, std)),
        }
    }
    out
}

/// Offset of a `crop`-long center crop in a `size`-long side, as torchvision computes it:
/// rounded half to even (Python's round) when the crop fits; when it is larger, -(padding
/// before), where torchvision pads (crop - size) // 2 before and the odd pixel after.
pub fn center_offset(size: u32, crop: u32) -> i64 {
    if crop > size {
        -i64::from((crop - size) / 2)
    } else {
        ((f64::from(size) - f64::from(crop)) / 2.0).round_ties_even() as i64
    }
}

/// torchvision's `RandomResizedCrop.get_params`: (top, left, height, width) of the crop.
pub fn random_crop_box(
    rng: &mut fastrand::Rng,
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
) -> (u32, u32, u32, u32) {
    let area = f64::from(width) * f64::from(height);
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * (scale.0 + rng.f64() * (scale.1 - scale.0));
        let aspect = (log_lo + rng.f64() * (log_hi - log_lo)).exp();
        let w = (target * aspect).sqrt().round();
        let h = (target / aspect).sqrt().round();
        if 0.0 < w && w <= f64::from(width) && 0.0 < h && h <= f64::from(height) {
            let (w, h) = (w as u32, h as u32);
            let top = rng.u32(0..=height - h);
            let left = rng.u32(0..=width - w);
            return (top, left, h, w);
        }
    }
    // Fallback to a central crop of the allowed aspect ratio.
    let in_ratio = f64::from(width) / f64::from(height);
    let (w, h) = if in_ratio < ratio.0 {
        (
            width,
            ((f64::from(width) / ratio.0).round() as u32).clamp(1, height),
        )
    } else if in_ratio > ratio.1 {
        (
            ((f64::from(height) * ratio.1).round() as u32).clamp(1, width),
            height,
        )
    } else {
        (width, height)
    };
    ((height - h) / 2, (width - w) / 2, h, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_the_ops_and_the_seed() {
        let spec = ViewSpec::parse("t=decode,resize(100),random_resized_crop(32),hflip(1)")
            .expect("parses");
        let d = draw(&spec, 500, 375, 7);
        assert_eq!(d, draw(&spec, 500, 375, 7), "a pure function of the seed");
        assert!(d.flip);
        assert_eq!(d.crops.len(), 1);
        let [top, left, h, w] = d.crops[0];
        assert_eq!(
            d.steps,
            vec![
                Step::Resize {
                    region: (0, 0, 500, 375),
                    width: 133,
                    height: 100
                },
                Step::Resize {
                    region: (left, top, w, h),
                    width: 32,
                    height: 32
                }
            ]
        );
        assert!(
            top + h <= 100 && left + w <= 133,
            "inside the resized image"
        );
    }

    #[test]
    fn center_offsets_round_half_to_even_and_pad_before_by_the_floor() {
        assert_eq!(center_offset(10, 4), 3);
        assert_eq!(center_offset(5, 2), 2, "1.5 rounds to 2");
        assert_eq!(center_offset(6, 1), 2, "2.5 rounds to 2");
        assert_eq!(center_offset(1, 4), -1, "3 pixels of padding: 1 before");
    }
}
