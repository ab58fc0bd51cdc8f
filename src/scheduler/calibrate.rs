//! `prepfs policy calibrate`: measures the simulator's per-item costs on this machine.
//!
//! Owns: the measurements: JPEG decode and augmentation time per image on one core (prepfs's
//! own view code), a render that keeps no pixels (its crop-aware decode), the read path's CPU per
//! rendered tensor (a stand-in: its bytes through a pipe between two threads), codec speeds and
//! ratios on the decoded pixels (row-filtered, as the RAM tier stores them) and the encoded
//! files, and, when a dataset directory is given, its images and the source's read bandwidth,
//! latency and the machine's CPU per byte read.
//! Each figure is the median of several timed rounds (this machine is shared and noisy). Must
//! never write anywhere but the output file, and never read outside the given directory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::sim::calibration::{Calibration, CodecCost, REQUEST_CPU_S};
use crate::cache::rows::{delta, undelta};
use crate::control::codec::Codec;
use crate::telemetry::proc::{cpu_ticks, own_cpu};
use crate::view::ViewSpec;
use crate::view::render::{decode, render, transform};

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

/// What reading the source costs.
struct SourceCost {
    bytes_per_s: f64,
    latency_s: f64,
    /// The machine's CPU seconds per byte read (all cores: the filesystem's and block device's
    /// kernel work runs outside this process).
    cpu_s_per_byte: f64,
}

/// What reading `files` one at a time in a shuffled order costs, as an epoch of training reads
/// them (a sorted walk would measure the device's readahead), up to `SOURCE_SAMPLE` bytes (page
/// cache included: the figures are what prepfs would see now).
fn source(files: &[PathBuf]) -> Option<SourceCost> {
    use std::io::Read;
    let mut order: Vec<&PathBuf> = files.iter().collect();
    let mut rng = super::rng::Rng::new(7);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let (mut bytes, mut busy, mut firsts) = (0u64, Duration::ZERO, Vec::new());
    let mut buf = vec![0u8; 1 << 20];
    let busy_ticks = || cpu_ticks().map(|(idle, total)| total - idle);
    let ticks_before = busy_ticks();
    for path in order {
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
    let ticks = busy_ticks()
        .zip(ticks_before)
        .map_or(0, |(after, before)| after - before);
    let cpu_s = ticks as f64 / rustix::param::clock_ticks_per_second() as f64;
    (bytes > 0 && !busy.is_zero()).then(|| SourceCost {
        bytes_per_s: bytes as f64 / busy.as_secs_f64(),
        latency_s: median(firsts),
        cpu_s_per_byte: cpu_s / bytes as f64,
    })
}

/// Bytes one FUSE read request carries at most (the kernel's default of 32 pages).
const READ_REQUEST: usize = 128 << 10;

/// CPU seconds of the read path per tensor of `npys`, without a mount: each written by one
/// thread through a pipe the size of a FUSE read request and read by another into a fresh
/// buffer (a reply's copies, the wake-ups on both sides, the reader's new pages), plus the
/// open's and release's round trip (`REQUEST_CPU_S`). The simulator's check against the real
/// system (`cargo bench --features train --bench scheduler -- --real`) shows what it leaves out.
fn delivery(npys: &[Vec<u8>]) -> Result<f64, String> {
    use std::io::{Read, Write};
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let (mut rx, mut tx) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
        // A smaller pipe only means more wake-ups: the figure is then an overestimate.
        let _ = rustix::pipe::fcntl_setpipe_size(&tx, READ_REQUEST);
        let started = own_cpu();
        // The reading end moves into the scope's closure, so a failed read drops it and the
        // writer's next write fails instead of waiting for a reader that is gone.
        std::thread::scope(move |s| -> Result<(), String> {
            s.spawn(move || {
                for npy in npys {
                    for chunk in npy.chunks(READ_REQUEST) {
                        if tx.write_all(chunk).is_err() {
                            return;
                        }
                    }
                }
            });
            for npy in npys {
                let mut buf = vec![0u8; npy.len()];
                rx.read_exact(&mut buf).map_err(|e| format!("pipe: {e}"))?;
                std::hint::black_box(buf);
            }
            Ok(())
        })?;
        rounds.push((own_cpu() - started).as_secs_f64() / npys.len().max(1) as f64);
    }
    Ok(median(rounds) + REQUEST_CPU_S)
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
    let render_s = per_item(&encoded, |e| {
        std::hint::black_box(render(&spec, e, 7).ok());
    });
    let npys: Vec<Vec<u8>> = decoded
        .iter()
        .filter_map(|d| transform(&spec, d, 7).ok())
        .map(|r| r.npy)
        .collect();
    let deliver_s = delivery(&npys)?;
    // The RAM tier stores decoded pixels with the "up" row filter before the codec.
    let row = decoded[0].row_len();
    let pixels: Vec<Vec<u8>> = decoded
        .iter()
        .map(|d| delta(&d.to_bytes(), d.row_len()))
        .collect();
    // A hit: the block's checksums verified, its bytes copied into the render's buffer.
    let read_s = per_item(&pixels, |p| {
        std::hint::black_box((crate::cache::block::checksums(p), p.to_vec()));
    });
    let mean = |items: &[Vec<u8>]| {
        items.iter().map(Vec::len).sum::<usize>() as f64 / items.len().max(1) as f64
    };
    let defaults = Calibration::default();
    let source = source(&files);
    Ok(Calibration {
        decode_s,
        augment_s,
        render_s: Some(render_s),
        deliver_s: Some(deliver_s),
        cache_read_bytes_per_s: Some(mean(&pixels) / read_s.max(1e-9)),
        image_bytes: mean(&encoded),
        pixel_bytes: mean(&pixels),
        lz4: codec_cost(Codec::Lz4, &pixels, row, &encoded),
        zstd1: codec_cost(Codec::Zstd(1), &pixels, row, &encoded),
        zstd3: codec_cost(Codec::Zstd(3), &pixels, row, &encoded),
        source_bytes_per_s: source
            .as_ref()
            .map_or(defaults.source_bytes_per_s, |s| s.bytes_per_s),
        source_latency_s: source
            .as_ref()
            .map_or(defaults.source_latency_s, |s| s.latency_s),
        source_cpu_s_per_byte: source.map(|s| s.cpu_s_per_byte),
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
        assert!(c.render_s.is_some_and(|r| r > 0.0 && r < 1.0), "{c:?}");
        assert!(
            c.deliver_s.is_some_and(|d| d > REQUEST_CPU_S && d < 1.0),
            "the read path is its round trip and the tensor's copies: {c:?}"
        );
        assert!(c.cache_read_bytes_per_s.is_some_and(|b| b > 0.0), "{c:?}");
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
