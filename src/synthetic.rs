//! Synthetic photographs: the stand-in dataset of the demo, the benchmarks and the tests.
//!
//! Owns: generating JPEG images whose statistics resemble photographs (a 1/f spectrum of detail
//! over smooth large-scale shapes, colour that varies more slowly than brightness, sensor grain),
//! so they compress, decode and cost like real ImageNet samples rather than flat colours or pure
//! noise; and laying them out in class folders the way `torchvision.datasets.ImageFolder`
//! expects. Everything is a pure function of the seed. Must never be used on a request path.

use std::path::{Path, PathBuf};

use image::codecs::jpeg::JpegEncoder;
use image::{Rgb, RgbImage};

/// JPEG quality of the generated images: what photo datasets are typically saved with.
const QUALITY: u8 = 90;

/// One image to generate: its place in the dataset and its seed.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Path relative to the dataset root: `class_NN/img_NNNNN.jpg`.
    pub path: PathBuf,
    /// Seed of its content.
    pub seed: u64,
}

/// The layout of a dataset of `files` images in `classes` class folders, for `seed`.
pub fn layout(files: usize, classes: usize, seed: u64) -> Vec<Sample> {
    let classes = classes.max(1);
    (0..files)
        .map(|i| Sample {
            path: PathBuf::from(format!("class_{:02}", i % classes))
                .join(format!("img_{i:05}.jpg")),
            seed: seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(i as u64),
        })
        .collect()
}

/// Writes one sample under `root` (creating its class folder); returns its size in bytes.
pub fn write_sample(root: &Path, sample: &Sample) -> Result<u64, String> {
    let path = root.join(&sample.path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let jpeg = photo(sample.seed)?;
    std::fs::write(&path, &jpeg).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(jpeg.len() as u64)
}

/// Writes every sample under `root` on all cores, calling `written` after each one; stops early
/// (with an error) when `written` returns false. Returns the total size in bytes.
pub fn write_all(
    root: &Path,
    samples: &[Sample],
    written: &(dyn Fn() -> bool + Sync),
) -> Result<u64, String> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = samples.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = samples
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut bytes = 0;
                    for sample in part {
                        bytes += write_sample(root, sample)?;
                        if !written() {
                            return Err("interrupted".to_owned());
                        }
                    }
                    Ok(bytes)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("image writer panicked".to_owned()))
            })
            .sum()
    })
}

/// A photograph-like JPEG, 400-640 x 300-480 pixels, typically 60-150 KB.
pub fn photo(seed: u64) -> Result<Vec<u8>, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (width, height) = (400 + rng.u32(0..241), 300 + rng.u32(0..181));
    // How busy the scene is: scales the fine detail, which is what sets the JPEG size.
    let detail = 0.85 + 0.15 * rng.f32();
    let luma = Octaves::new(&mut rng, width, height, 7, detail);
    let chroma_b = Octaves::new(&mut rng, width, height, 3, 0.5);
    let chroma_r = Octaves::new(&mut rng, width, height, 3, 0.5);
    let (horizon, sky) = (0.3 + 0.4 * rng.f32(), rng.f32() * 80.0 - 40.0);
    let tint = [rng.f32() * 40.0 - 20.0, rng.f32() * 40.0 - 20.0];
    let img = RgbImage::from_fn(width, height, |x, y| {
        let (fx, fy) = (x as f32 / width as f32, y as f32 / height as f32);
        let shape = if fy < horizon { sky } else { -sky * 0.5 };
        let grain = (rng.f32() - 0.5) * 24.0;
        let l = 128.0 + shape + 70.0 * luma.at(fx, fy) + grain;
        let cb = tint[0] + 40.0 * chroma_b.at(fx, fy);
        let cr = tint[1] + 40.0 * chroma_r.at(fx, fy);
        Rgb([
            (l + 1.402 * cr).clamp(0.0, 255.0) as u8,
            (l - 0.344 * cb - 0.714 * cr).clamp(0.0, 255.0) as u8,
            (l + 1.772 * cb).clamp(0.0, 255.0) as u8,
        ])
    });
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, QUALITY)
        .encode_image(&img)
        .map_err(|e| format!("JPEG encoding failed: {e}"))?;
    Ok(out)
}

/// Fractal value noise: octaves of smoothly interpolated random grids, each twice as fine and
/// `persistence` times as strong as the one before (a 1/f-like spectrum, as in photographs).
struct Octaves {
    layers: Vec<Grid>,
}

struct Grid {
    cols: usize,
    rows: usize,
    values: Vec<f32>,
    amplitude: f32,
}

impl Octaves {
    fn new(rng: &mut fastrand::Rng, width: u32, height: u32, count: u32, persistence: f32) -> Self {
        let aspect = height as f32 / width as f32;
        let mut amplitude = 1.0;
        let layers = (0..count)
            .map(|k| {
                let cols = 2usize << k;
                let rows = ((cols as f32 * aspect).ceil() as usize).max(2);
                let grid = Grid {
                    cols,
                    rows,
                    values: (0..(cols + 1) * (rows + 1))
                        .map(|_| rng.f32() * 2.0 - 1.0)
                        .collect(),
                    amplitude,
                };
                amplitude *= persistence;
                grid
            })
            .collect();
        Octaves { layers }
    }

    /// The noise at (`fx`, `fy`) in 0..1, roughly in -1..1.
    fn at(&self, fx: f32, fy: f32) -> f32 {
        self.layers.iter().map(|g| g.amplitude * g.at(fx, fy)).sum()
    }
}

impl Grid {
    fn at(&self, fx: f32, fy: f32) -> f32 {
        let (gx, gy) = (fx * self.cols as f32, fy * self.rows as f32);
        let (x0, y0) = (gx as usize, gy as usize);
        let (tx, ty) = (smooth(gx - x0 as f32), smooth(gy - y0 as f32));
        let v =
            |x: usize, y: usize| self.values[y.min(self.rows) * (self.cols + 1) + x.min(self.cols)];
        let top = v(x0, y0) + (v(x0 + 1, y0) - v(x0, y0)) * tx;
        let bottom = v(x0, y0 + 1) + (v(x0 + 1, y0 + 1) - v(x0, y0 + 1)) * tx;
        top + (bottom - top) * ty
    }
}

fn smooth(t: f32) -> f32 {
    t * t * (3.0 - 2.0 * t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn photos_are_deterministic_decodable_and_photo_sized() {
        let sizes: Vec<usize> = (0..5)
            .map(|seed| {
                let jpeg = photo(seed).expect("encodes");
                assert_eq!(jpeg, photo(seed).expect("encodes"), "same seed, same bytes");
                let img = image::load_from_memory(&jpeg).expect("decodes");
                assert!((400..=640).contains(&img.width()), "width {}", img.width());
                jpeg.len()
            })
            .collect();
        let mean = sizes.iter().sum::<usize>() / sizes.len();
        assert!(
            (60_000..=150_000).contains(&mean),
            "mean size {mean} B, sizes {sizes:?}"
        );
    }
}
