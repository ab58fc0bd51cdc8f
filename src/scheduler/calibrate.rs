//! `prepfs policy calibrate`: measures the simulator's per-item costs on this machine.
//!
//! Owns: the measurements: JPEG decode and augmentation time per image on one core (prepfs's
//! own view code), codec speeds and ratios on the decoded pixels (row-filtered, as the RAM tier
//! stores them) and the encoded files, and,
//! when a dataset directory is given, its images and the source's read bandwidth and latency.
//! Each figure is the median of several timed rounds (this machine is shared and noisy). Must
//! never write anywhere but the output file, and never read outside the given directory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::sim::calibration::{Calibration, CodecCost};
use crate::cache::rows::{delta, undelta};
use crate::control::codec::Codec;
use crate::view::ViewSpec;
use crate::view::render::{decode, transform};

/// Images measured (synthetic photos, or the first of the dataset's).
const IMAGES: usize = 24;
/// Timed rounds per figure; the median is kept.
const ROUNDS: usize = 5;
/// The augmentation measured: the ImageNet training recipe.
const AUGMENT: &str = "calibrate=decode,random_resized_crop(224),hflip,normalize(imagenet)";
/// Bytes read to measure the source (or all of it, if smaller).
const SOURCE_SAMPLE: u64 = 256 << 20;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// Seconds per call of `f` over `items`, median of `ROUNDS` rounds.
fn per_item<T>(items: &[T], mut f: impl FnMut(&T)) -> f64 {
    let rounds = (0..ROUNDS).map(|_| {
        let t = Instant::now();
        items.iter().for_each(&mut f);
        t.elapsed().as_secs_f64() / items.len().max(1) as f64
    });
    median(rounds.collect())
}

/// Every regular file under `dir`, sorted by path.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => files.push(e.path()),
                _ => {}
            }
        }
    }
    files.sort();
    files
}

/// The first `IMAGES` JPEG files of `files`.
fn jpegs(files: &[PathBuf]) -> impl Iterator<Item = &PathBuf> {
    files
        .iter()
        .filter(|p| {
            p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| x.eq_ignore_ascii_case("jpg") || x.eq_ignore_ascii_case("jpeg"))
        })
        .take(IMAGES)
}

/// Bandwidth and first-byte latency of reading `files` in order, up to `SOURCE_SAMPLE` bytes
/// (page cache included: the figure is what prepfs would see now).
fn source(files: &[PathBuf]) -> Option<(f64, f64)> {
    use std::io::Read;
    let (mut bytes, mut busy, mut firsts) = (0u64, Duration::ZERO, Vec::new());
    let mut buf = vec![0u8; 1 << 20];
    for path in files {
        let t = Instant::now();
        let Ok(mut f) = std::fs::File::open(path) else {
            continue;
        };
        let mut first = true;
        loop {
            let n = f.read(&mut buf).unwrap_or(0);
            if first {
                firsts.push(t.elapsed().as_secs_f64());
                first = false;
            }
            if n == 0 {
                break;
            }
            bytes += n as u64;
        }
        busy += t.elapsed();
        if bytes >= SOURCE_SAMPLE {
            break;
        }
    }
    (bytes > 0 && !busy.is_zero()).then(|| (bytes as f64 / busy.as_secs_f64(), median(firsts)))
}

/// Speeds and ratios of `codec` on `pixels` (already row-filtered as the RAM tier stores them,
/// rows of `row` bytes; undoing the filter is part of a hit) and on `encoded` files.
fn codec_cost(codec: Codec, pixels: &[Vec<u8>], row: usize, encoded: &[Vec<u8>]) -> CodecCost {
    let ratio = |items: &[Vec<u8>]| {
        let raw: usize = items.iter().map(Vec::len).sum();
        let packed: usize = items
            .iter()
            .map(|i| codec.compress(i).map_or(i.len(), |c| c.len()))
            .sum();
        raw as f64 / packed.max(1) as f64
    };
    let bytes: usize = pixels.iter().map(Vec::len).sum::<usize>() / pixels.len().max(1);
    let compress_s = per_item(pixels, |p| {
        std::hint::black_box(codec.compress(p));
    });
    let packed: Vec<(Vec<u8>, usize)> = pixels
        .iter()
        .filter_map(|p| Some((codec.compress(p)?, p.len())))
        .collect();
    let decompress_s = per_item(&packed, |(c, len)| {
        if let Ok(mut p) = codec.decompress(c, *len) {
            undelta(&mut p, row); // the cost is the same whatever the row length

            std::hint::black_box(p);
        }
    });
    CodecCost {
        compress_bytes_per_s: bytes as f64 / compress_s.max(1e-9),
        decompress_bytes_per_s: bytes as f64 / decompress_s.max(1e-9),
        pixel_ratio: ratio(pixels),
        encoded_ratio: ratio(encoded),
    }
}

/// Measures this machine (and `dataset`'s images and read speed, when given).
pub fn calibrate(dataset: Option<&Path>) -> Result<Calibration, String> {
    let files = dataset.map(files_under).unwrap_or_default();
    let encoded: Vec<Vec<u8>> = match dataset {
        Some(_) => jpegs(&files)
            .filter_map(|p| std::fs::read(p).ok())
            .collect(),
        None => (0..IMAGES as u64)
            .map(crate::synthetic::photo)
            .collect::<Result<_, _>>()?,
    };
    let decoded: Vec<_> = encoded.iter().filter_map(|e| decode(e).ok()).collect();
    if decoded.is_empty() {
        return Err("no decodable JPEG images to measure".to_owned());
    }
    let spec = ViewSpec::parse(AUGMENT).map_err(|e| e.to_string())?;
    let decode_s = per_item(&encoded, |e| {
        std::hint::black_box(decode(e).ok());
    });
    let augment_s = per_item(&decoded, |d| {
        std::hint::black_box(transform(&spec, d, 7).ok());
    });
    // The RAM tier stores decoded pixels with the "up" row filter before the codec.
    let row = decoded[0].row_len();
    let pixels: Vec<Vec<u8>> = decoded
        .iter()
        .map(|d| delta(&d.to_bytes(), d.row_len()))
        .collect();
    let mean = |items: &[Vec<u8>]| {
        items.iter().map(Vec::len).sum::<usize>() as f64 / items.len().max(1) as f64
    };
    let defaults = Calibration::default();
    let (source_bytes_per_s, source_latency_s) =
        source(&files).unwrap_or((defaults.source_bytes_per_s, defaults.source_latency_s));
    Ok(Calibration {
        decode_s,
        augment_s,
        image_bytes: mean(&encoded),
        pixel_bytes: mean(&pixels),
        lz4: codec_cost(Codec::Lz4, &pixels, row, &encoded),
        zstd1: codec_cost(Codec::Zstd(1), &pixels, row, &encoded),
        zstd3: codec_cost(Codec::Zstd(3), &pixels, row, &encoded),
        source_bytes_per_s,
        source_latency_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_measures_plausible_costs() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..3 {
            let jpeg = crate::synthetic::photo(i).unwrap();
            std::fs::write(dir.path().join(format!("{i}.jpg")), jpeg).unwrap();
        }
        let c = calibrate(Some(dir.path())).unwrap();
        assert!(c.decode_s > 0.0 && c.decode_s < 1.0, "{c:?}");
        assert!(c.augment_s > 0.0 && c.augment_s < 1.0, "{c:?}");
        assert!(
            c.pixel_bytes > c.image_bytes,
            "pixels outweigh JPEG bytes: {c:?}"
        );
        assert!(c.lz4.pixel_ratio > 1.0 && c.zstd3.pixel_ratio >= c.zstd1.pixel_ratio * 0.95);
        assert!(c.lz4.encoded_ratio < 1.1, "JPEG is incompressible: {c:?}");
        assert!(c.source_bytes_per_s > 0.0);
        let empty = tempfile::tempdir().unwrap();
        assert!(calibrate(Some(empty.path())).is_err());
    }
}
