//! Decode benchmark: what a view render spends decoding a JPEG, before (zune-jpeg through the
//! image crate, the whole image) and after (libjpeg-turbo: the whole image, the part a
//! RandomResizedCrop(224) draw reads, and that part DCT-scaled when the draw shrinks by 2-8),
//! and the whole render (RRC(224) + flip + normalize, float32) old against new, then the same
//! renders as uint8 (the view the uint8 target reads).
//!
//! Run with `cargo bench --bench decode`. One core, bytes in memory. Images: synthetic photos
//! (`prepfs::synthetic`, 400-640 x 300-480, ImageNet-like), as the image crate encodes them
//! (4:4:4) and re-encoded 4:2:0 by libjpeg-turbo at quality 90 (as cameras and most datasets
//! store photos), and the 4:2:0 photos mirrored to twice their size (800-1280 x 600-960, where
//! RRC(224) draws often shrink by 2 or more). Every image gets a fresh draw each round; within a
//! round the ways are run on each image in turn, rotating which goes first, so drift on this
//! shared machine hits them alike. Reported: the median time per image of each way, and its
//! ratio to the baseline. Knobs: `PREPFS_BENCH_IMAGES` (per set, default 100),
//! `PREPFS_BENCH_REPS` (rounds, default 5). Benchmarks report numbers; they never assert timing.

use std::hint::black_box;
use std::time::{Duration, Instant};

use prepfs::view::jpeg::{self, Jpeg};
use prepfs::view::{ViewSpec, plan, render};

#[path = "../tests/common/jpeg.rs"]
mod test_jpeg;
use test_jpeg::{encode_420, mirrored};

/// The training pipeline of the benchmark.
const TRAIN: &str = "t=decode,random_resized_crop(224),hflip,normalize(imagenet)";
/// The same draws as uint8 CHW, normalised on the device.
const UINT8: &str = "u=decode,random_resized_crop(224),hflip,uint8";

/// One way of decoding (or rendering) an image, timed per call.
struct Way {
    name: &'static str,
    run: fn(&Image, &ViewSpec, u64),
}

/// An encoded image, its size, and its restart-marked copy (`jpeg::restart_marked`).
struct Image {
    jpeg: Vec<u8>,
    size: (u32, u32),
    marked: Vec<u8>,
}

fn main() {
    let count: u64 = env_or("PREPFS_BENCH_IMAGES", 100);
    let rounds: u64 = env_or("PREPFS_BENCH_REPS", 5);
    let spec = ViewSpec::parse(TRAIN).expect("the bench pipeline is valid");
    let uint8 = ViewSpec::parse(UINT8).expect("the uint8 pipeline is valid");
    eprintln!("prepfs decode bench: {count} images per set, {rounds} rounds, one core");
    let photos: Vec<Vec<u8>> = (0..count)
        .map(|seed| prepfs::synthetic::photo(seed).expect("jpeg"))
        .collect();
    let pixels: Vec<image::RgbImage> = photos
        .iter()
        .map(|j| image::load_from_memory(j).expect("decodes").to_rgb8())
        .collect();
    let sets = [
        (
            "photos, 4:4:4 (synthetic, as the image crate encodes)",
            photos.clone(),
        ),
        (
            "photos, 4:2:0 (re-encoded by libjpeg-turbo, q90)",
            pixels.iter().map(encode_420).collect(),
        ),
        (
            "large photos, 4:2:0 (mirrored to 2x: 800-1280 x 600-960)",
            pixels
                .iter()
                .map(|p| encode_420(&mirrored(p, p.width() * 2, p.height() * 2)))
                .collect(),
        ),
    ];
    let decodes = [
        Way {
            name: "zune-jpeg, whole image (before)",
            run: |img, _, _| {
                black_box(zune_whole(&img.jpeg));
            },
        },
        Way {
            name: "libjpeg-turbo, whole image",
            run: |img, _, _| {
                black_box(render::decode(&img.jpeg).expect("decodes"));
            },
        },
        Way {
            name: "libjpeg-turbo, the crop's part",
            run: |img, spec, seed| {
                black_box(part(&img.jpeg, img.size, spec, seed, false));
            },
        },
        Way {
            name: "libjpeg-turbo, the crop's part, DCT-scaled",
            run: |img, spec, seed| {
                black_box(part(&img.jpeg, img.size, spec, seed, true));
            },
        },
        Way {
            name: "the same, cut from the restart-marked copy",
            run: |img, spec, seed| {
                black_box(part(&img.marked, img.size, spec, seed, true));
            },
        },
        Way {
            name: "making the restart-marked copy (once a file)",
            run: |img, _, _| {
                black_box(jpeg::restart_marked(&img.jpeg).expect("transcodes"));
            },
        },
    ];
    let renders = [
        Way {
            name: "render: zune-jpeg whole + transform (before)",
            run: |img, spec, seed| {
                let image = zune_whole(&img.jpeg);
                black_box(render::transform(spec, &image, seed).expect("renders"));
            },
        },
        Way {
            name: "render: crop-aware, DCT-scaled (after)",
            run: |img, spec, seed| {
                black_box(render::render(spec, &img.jpeg, seed).expect("renders"));
            },
        },
        Way {
            name: "render: the same from the restart-marked copy",
            run: |img, spec, seed| {
                black_box(render::render(spec, &img.marked, seed).expect("renders"));
            },
        },
    ];
    for (title, encoded) in &sets {
        let images: Vec<Image> = encoded
            .iter()
            .map(|jpeg| Image {
                size: render::dimensions(jpeg).expect("header"),
                jpeg: jpeg.clone(),
                marked: jpeg::restart_marked(jpeg).expect("transcodes"),
            })
            .collect();
        let kb = images.iter().map(|i| i.jpeg.len()).sum::<usize>() as f64 / 1e3 / count as f64;
        let marked = images.iter().map(|i| i.marked.len()).sum::<usize>() as f64 / 1e3;
        let (scaled, parts) = draw_stats(&images, &spec, rounds);
        println!(
            "\n{title}: {count} images, {kb:.0} KB average; restart-marked copies {:+.1}%",
            (marked / count as f64 / kb - 1.0) * 100.0
        );
        println!(
            "RRC(224) draws: the part holds {:.0}% of the pixels on average; {:.0}% of draws \
             read at 1/2 or less",
            parts * 100.0,
            scaled * 100.0
        );
        let as_uint8 = format!("The renders as uint8 (`{UINT8}`):\n");
        for (ways, spec, title) in [
            (&decodes[..], &spec, ""),
            (&renders[..], &spec, ""),
            (&renders[..], &uint8, as_uint8.as_str()),
        ] {
            print!("{title}");
            let medians = measure(ways, &images, spec, rounds);
            println!("| way | median ms/image | images/s, one core | vs first row |");
            println!("|---|---:|---:|---:|");
            for (way, median) in ways.iter().zip(&medians) {
                let ms = median.as_secs_f64() * 1e3;
                println!(
                    "| {} | {ms:.3} | {:.0} | {:.2}x |",
                    way.name,
                    1e3 / ms,
                    medians[0].as_secs_f64() / median.as_secs_f64()
                );
            }
        }
    }
}

/// The median time per image of each of `ways` over `rounds` interleaved rounds.
fn measure(ways: &[Way], images: &[Image], spec: &ViewSpec, rounds: u64) -> Vec<Duration> {
    let mut times = vec![Vec::new(); ways.len()];
    for round in 0..rounds {
        for (i, img) in images.iter().enumerate() {
            let seed = round * 1_000_003 + i as u64;
            for k in 0..ways.len() {
                let w = (k + i + round as usize) % ways.len();
                let started = Instant::now();
                (ways[w].run)(img, spec, seed);
                times[w].push(started.elapsed());
            }
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort();
            t[t.len() / 2]
        })
        .collect()
}

/// Of the draws `measure` makes: the share read at 1/2 or less, and the part's mean share of
/// the image's pixels.
fn draw_stats(images: &[Image], spec: &ViewSpec, rounds: u64) -> (f64, f64) {
    let (mut scaled, mut share, mut n) = (0u64, 0.0, 0u64);
    for round in 0..rounds {
        for (i, img) in images.iter().enumerate() {
            let (w, h) = img.size;
            let draws = plan::draw(spec, w, h, round * 1_000_003 + i as u64).expect("draws");
            let read = draws.first_read(w, h);
            scaled += u64::from(read.shrink > 1);
            let part = Jpeg::open(&img.jpeg).expect("header").part(read.region, 1);
            share += f64::from(part.size.0 * part.size.1) / f64::from(w * h);
            n += 1;
        }
    }
    (scaled as f64 / n as f64, share / n as f64)
}

/// The pixels of the part of `encoded` (of size (`w`, `h`)) a draw of `spec` with `seed` reads, at full scale or at the
/// draw's DCT scale.
fn part(encoded: &[u8], (w, h): (u32, u32), spec: &ViewSpec, seed: u64, scaled: bool) -> Vec<u8> {
    let read = plan::draw(spec, w, h, seed)
        .expect("draws")
        .first_read(w, h);
    let mut jpeg = Jpeg::open(encoded).expect("header");
    let part = jpeg.part(read.region, if scaled { read.shrink } else { 1 });
    jpeg.decode(&part).expect("decodes")
}

/// The whole image decoded as views did before libjpeg-turbo: the image crate (zune-jpeg).
fn zune_whole(jpeg: &[u8]) -> render::Rgb {
    let rgb = image::load_from_memory_with_format(jpeg, image::ImageFormat::Jpeg)
        .expect("decodes")
        .into_rgb8();
    render::Rgb::from_raw(rgb.width(), rgb.height(), rgb.into_raw()).expect("within limits")
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1)
}
