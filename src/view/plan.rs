//! The geometry of one render, decided before any pixel is touched: every random draw of a view
//! (crop boxes, flips) made from the render's seed, and the concrete steps they imply.
//!
//! Owns the order and the arithmetic of the draws, so every executor (the CPU renderer, the GPU
//! kernel, its CPU mirror) sees the same crops and flips for the same (spec, image size, seed),
//! and the refusal of a render whose any step would make an image over the pixel limits of a
//! decode (`limits::within_limits`): every executor and the announced size go through `draw`, so
//! none allocates such an image. Must never read pixels, and never draw a random number anywhere
//! but here.

use super::limits::{self, RenderError};
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

/// A rectangle of an image in pixels, possibly fractional: what a resize reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Area {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
}

impl Area {
    /// The whole pixels `region` (left, top, width, height) covers.
    pub fn of(region: (u32, u32, u32, u32)) -> Area {
        let (left, top, width, height) = region;
        Area {
            left: f64::from(left),
            top: f64::from(top),
            width: f64::from(width),
            height: f64::from(height),
        }
    }
}

/// What a render reads of its image before any other step, so a decoder can produce only that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// (left, top, width, height) of the image that the first step reads.
    pub region: (u32, u32, u32, u32),
    /// The largest of 1, 2, 4 and 8 by which the first step shrinks `region` on both axes: a
    /// decode at 1/`shrink` leaves that step a resize that never upsamples.
    pub shrink: u32,
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
    /// (width, height) of the output.
    pub size: (u32, u32),
}

/// The draws of `spec` over an image of `width` x `height`, random numbers from `seed`, in the
/// order the ops consume them; `TooLarge` when a step's output would pass the pixel limits.
pub fn draw(spec: &ViewSpec, width: u32, height: u32, seed: u64) -> Result<Draws, RenderError> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut w, mut h) = (width, height);
    let mut out = Draws {
        steps: Vec::new(),
        crops: Vec::new(),
        flip: false,
        norm: None,
        size: (width, height),
    };
    for (n, op) in spec.ops.iter().enumerate() {
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
        if !limits::within_limits(w, h) {
            let what = format!("op {} ({}) would make", n + 1, op.name());
            return Err(limits::too_large(&what, w, h));
        }
    }
    out.size = (w, h);
    Ok(out)
}

impl Draws {
    /// What a render of these draws over an image of `width` x `height` reads first: the region
    /// its first step resizes (a random crop's box; the whole image for a plain resize) and how
    /// far that step shrinks it; the whole image, unshrunk, when the first step is not a resize.
    pub fn first_read(&self, width: u32, height: u32) -> Read {
        match self.steps.first() {
            Some(&Step::Resize {
                region,
                width: out_w,
                height: out_h,
            }) => {
                let (_, _, w, h) = region;
                let fits = |s: u32| {
                    u64::from(w) >= u64::from(s) * u64::from(out_w)
                        && u64::from(h) >= u64::from(s) * u64::from(out_h)
                };
                let shrink = [8, 4, 2].into_iter().find(|&s| fits(s)).unwrap_or(1);
                Read { region, shrink }
            }
            _ => Read {
                region: (0, 0, width, height),
                shrink: 1,
            },
        }
    }
}

/// One render, decided once before any pixel is touched: the image's (width, height), from its
/// header or its decoded pixels, and the draws of the render's seed over it. Every step of the
/// render (whether to decode whole, what a JPEG decode reads, the ops) uses this one plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// (width, height) of the image the draws are over.
    pub size: (u32, u32),
    /// The draws of the render's seed.
    pub draws: Draws,
}

impl Plan {
    /// The plan of `spec` with `seed` over a `size` (width, height) image; `TooLarge` as `draw`.
    pub fn new(
        spec: &ViewSpec,
        (width, height): (u32, u32),
        seed: u64,
    ) -> Result<Plan, RenderError> {
        Ok(Plan {
            size: (width, height),
            draws: draw(spec, width, height, seed)?,
        })
    }

    /// What the render reads of the image first (`Draws::first_read`).
    pub fn first_read(&self) -> Read {
        self.draws.first_read(self.size.0, self.size.1)
    }

    /// Whether the render reads a JPEG at a reduced scale (its first step shrinks by 2 or more):
    /// its bytes then differ from a render of the same draws over the whole decoded pixels, so
    /// it never renders from those.
    pub fn reads_scaled(&self) -> bool {
        self.first_read().shrink > 1
    }
}

/// `region` (left, top, width, height) of an image, in the pixels of a part of it decoded at
/// 1/`scale` whose top-left pixel is `origin` (in scaled pixels): a DCT-scaled pixel covers
/// `scale` x `scale` pixels of the image, so the area is fractional unless `scale` is 1.
pub fn rebase(region: (u32, u32, u32, u32), origin: (u32, u32), scale: u32) -> Area {
    let s = f64::from(scale.max(1));
    let (left, top, width, height) = region;
    Area {
        left: f64::from(left) / s - f64::from(origin.0),
        top: f64::from(top) / s - f64::from(origin.1),
        width: f64::from(width) / s,
        height: f64::from(height) / s,
    }
}

/// The output (height, width) of `spec` over an image of `width` x `height`, as every render
/// of it has (sizes never depend on the seed); `TooLarge` as `draw`. Allocates no pixels.
pub fn output_size(spec: &ViewSpec, width: u32, height: u32) -> Result<(u32, u32), RenderError> {
    let (w, h) = draw(spec, width, height, 0)?.size;
    Ok((h, w))
}

/// Bytes a render of `spec` over a `width` x `height` image holds at its peak, beside the encoded
/// file: the decoded pixels and the copy of them offered to the cache, the two largest images its
/// steps hold at once, and the output file. The same for every seed (a random crop's output size
/// is fixed); refused like `draw` when a step passes the pixel limits.
pub fn render_memory(spec: &ViewSpec, width: u32, height: u32) -> Result<u64, RenderError> {
    let draws = draw(spec, width, height, 0)?;
    let pixels = |w: u32, h: u32| u64::from(w) * u64::from(h) * 3;
    let largest = draws
        .steps
        .iter()
        .map(|step| match *step {
            Step::Resize { width, height, .. } | Step::CenterCrop { width, height } => {
                pixels(width, height)
            }
        })
        .max()
        .unwrap_or(0);
    let (w, h) = draws.size;
    Ok(2 * pixels(width, height) + 2 * largest + spec.npy_size(h, w))
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
        let d = draw(&spec, 500, 375, 7).expect("within the limits");
        assert_eq!(
            Ok(&d),
            draw(&spec, 500, 375, 7).as_ref(),
            "a pure function of the seed"
        );
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
    fn a_step_over_the_pixel_limits_is_refused_before_any_pixel() {
        // The guide's val pipeline (docs/GUIDE.md) over a 1x16384 image: resize(256) would make
        // 256 x 4194304.
        let val = ViewSpec::parse("v=decode,resize(256),center_crop(224),normalize(imagenet)")
            .expect("parses");
        for (w, h) in [(1, 16384), (16384, 1)] {
            let refused = draw(&val, w, h, 3).expect_err("over the side limit");
            assert!(
                matches!(&refused, RenderError::TooLarge(why) if why.contains("op 1 (resize)") && why.contains("4194304")),
                "{refused}"
            );
            assert_eq!(
                output_size(&val, w, h),
                Err(refused),
                "getattr refuses alike"
            );
        }
        // Sides within the limit, bytes not: 8000 x 8000 x 3 is over 128 MiB.
        let up = ViewSpec::parse("u=decode,resize(8000),center_crop(64)").expect("parses");
        assert!(matches!(
            draw(&up, 6000, 6000, 0),
            Err(RenderError::TooLarge(_))
        ));
        // The same pipelines over ordinary images draw, and announce the size they render.
        assert_eq!(output_size(&val, 500, 375), Ok((224, 224)));
        let free = ViewSpec::parse("f=decode,resize(100),hflip").expect("parses");
        assert_eq!(output_size(&free, 500, 375), Ok(free.output_size(500, 375)));
        assert_eq!(
            draw(&free, 500, 375, 1).map(|d| d.size),
            Ok((133, 100)),
            "(width, height)"
        );
    }

    #[test]
    fn the_first_read_is_the_crop_box_and_shrinks_only_as_far_as_the_resize_does() {
        let train = ViewSpec::parse("t=decode,random_resized_crop(56),hflip").expect("parses");
        for seed in 0..50 {
            let d = draw(&train, 640, 480, seed).expect("draws");
            let read = d.first_read(640, 480);
            let [top, left, h, w] = d.crops[0];
            assert_eq!(read.region, (left, top, w, h));
            let s = read.shrink;
            assert!([1, 2, 4, 8].contains(&s));
            assert!(w >= s * 56 && h >= s * 56, "never upsamples: {w}x{h} / {s}");
            assert!(
                s == 8 || w < 2 * s * 56 || h < 2 * s * 56,
                "the largest: {w}x{h} / {s}"
            );
        }
        // A plain resize reads the whole image; 500x375 -> 256 short side shrinks < 2x.
        let val = ViewSpec::parse("v=decode,resize(256),center_crop(224)").expect("parses");
        let read = draw(&val, 500, 375, 0).expect("draws").first_read(500, 375);
        assert_eq!(
            read,
            Read {
                region: (0, 0, 500, 375),
                shrink: 1
            }
        );
        let thumb = ViewSpec::parse("v=decode,resize(90)").expect("parses");
        assert_eq!(
            draw(&thumb, 800, 360, 0)
                .expect("draws")
                .first_read(800, 360)
                .shrink,
            4
        );
        // No resize first: the whole image, as it is.
        for text in [
            "p=decode,center_crop(224),resize(32)",
            "r=decode,uint8(hwc)",
        ] {
            let spec = ViewSpec::parse(text).expect("parses");
            let read = draw(&spec, 300, 200, 0)
                .expect("draws")
                .first_read(300, 200);
            assert_eq!(
                read,
                Read {
                    region: (0, 0, 300, 200),
                    shrink: 1
                }
            );
        }
        assert_eq!(
            rebase((40, 10, 20, 30), (16, 5), 2),
            Area {
                left: 4.0,
                top: 0.0,
                width: 10.0,
                height: 15.0
            }
        );
        assert_eq!(rebase((7, 3, 9, 9), (0, 0), 1), Area::of((7, 3, 9, 9)));
    }

    #[test]
    fn center_offsets_round_half_to_even_and_pad_before_by_the_floor() {
        assert_eq!(center_offset(10, 4), 3);
        assert_eq!(center_offset(5, 2), 2, "1.5 rounds to 2");
        assert_eq!(center_offset(6, 1), 2, "2.5 rounds to 2");
        assert_eq!(center_offset(1, 4), -1, "3 pixels of padding: 1 before");
    }
}
