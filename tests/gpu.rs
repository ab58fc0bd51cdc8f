//! GPU checks of the views' backend: they need an NVIDIA GPU and driver, so each is
//! ignored by default (each with its reason) and run by `benches/gpu/check.sh` (`--ignored`). Without a GPU they fail with
//! the backend's reason (never skip silently). Tolerances are the ones docs/CONFIGURATION.md
//! documents: transforms exact, nvJPEG decodes within `DECODE_MEAN_ABS` of the CPU decoder.
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prepfs::view::gpu::{Gpu, GpuMode, GpuOptions};
use prepfs::view::{Plan, Rgb, ViewSpec, render};

/// Mean absolute difference per channel value allowed between nvJPEG and the CPU decoder: the
/// IDCT and chroma upsampling differ by design; the crop/resize/normalize after them does not.
const DECODE_MEAN_ABS: f64 = 2.0;

fn open(memory: u64) -> Gpu {
    let gpu = Gpu::open(&GpuOptions {
        mode: GpuMode::On,
        memory,
        ..GpuOptions::default()
    });
    assert!(gpu.available(), "GPU backend unavailable: {:?}", gpu.report);
    gpu
}

fn random_image(rng: &mut fastrand::Rng, w: u32, h: u32) -> Rgb {
    let (a, b) = (rng.u32(1..8), rng.u32(1..8));
    let data = (0..h)
        .flat_map(|y| (0..w).flat_map(move |x| (0..3).map(move |c| (x * a + y * b + c * 40) % 256)))
        .map(|v| ((v + rng.u32(0..64)) % 256) as u8)
        .collect();
    Rgb::from_raw(w, h, data).expect("image")
}

const SPECS: [&str; 6] = [
    "a=decode,random_resized_crop(224),hflip,normalize(imagenet)",
    "b=decode,random_resized_crop(64, 48, scale=(0.01, 1)),hflip,uint8",
    "c=decode,random_resized_crop(96, ratio=(0.2, 5)),hflip(1),uint8(hwc)",
    "d=decode,resize(256),center_crop(224),normalize(imagenet)",
    "e=decode,center_crop(300),hflip,normalize(imagenet)",
    "f=decode,random_resized_crop(512),float32",
];

/// Renders many random images on the GPU from 8 threads at once (so launches batch) and
/// compares each with the CPU path: equal bytes. Run twice by check.sh: on an idle GPU and
/// with a concurrent training-like process (PREPFS_GPU_BUSY=1 says which, for the log).
#[test]
#[ignore = "needs an NVIDIA GPU; run by benches/gpu/check.sh"]
fn gpu_transforms_equal_cpu_transforms_on_random_images() {
    let gpu = open(1 << 30);
    let executor = gpu.executor.clone().expect("executor");
    let specs: Arc<Vec<ViewSpec>> = Arc::new(
        SPECS
            .iter()
            .map(|s| ViewSpec::parse(s).expect("spec"))
            .collect(),
    );
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (executor, specs) = (executor.clone(), specs.clone());
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t);
                let (mut compared, mut refused) = (0, 0);
                for round in 0..60 {
                    let (w, h) = (rng.u32(1..1200), rng.u32(1..1200));
                    let image = random_image(&mut rng, w, h);
                    for spec in specs.iter() {
                        let seed = rng.u64(..);
                        let plan = match Plan::new(spec, (w, h), seed) {
                            Ok(plan) => plan,
                            Err(too_large) => {
                                // Past the pixel limits (resize(256) of a 3x1000 image): refused
                                // before any executor runs, with the CPU's own error.
                                let cpu = render::transform(spec, &image, seed).err();
                                assert_eq!(cpu, Some(too_large), "{w}x{h} {}", spec.text);
                                refused += 1;
                                continue;
                            }
                        };
                        let want = render::transform(spec, &image, seed).expect("cpu").npy;
                        let got = executor.transform(spec, &image, &plan).expect("gpu").npy;
                        assert!(
                            got == want,
                            "thread {t} round {round} {w}x{h} {} seed {seed}: first difference at {:?}",
                            spec.text,
                            got.iter().zip(&want).position(|(a, b)| a != b)
                        );
                        compared += 1;
                    }
                }
                (compared, refused)
            })
        })
        .collect();
    let (compared, refused) = threads
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .fold((0, 0), |(c, r), (tc, tr)| (c + tc, r + tr));
    let c = &gpu.counters;
    println!(
        "compared {compared} renders, {refused} refused alike (busy GPU: {}); on the GPU {}, CPU fallbacks {}, launches {}",
        std::env::var("PREPFS_GPU_BUSY").unwrap_or_default() == "1",
        c.transforms.load(Ordering::Relaxed),
        c.transform_fallbacks.load(Ordering::Relaxed),
        c.launches.load(Ordering::Relaxed),
    );
    assert!(
        c.transforms.load(Ordering::Relaxed) > 0,
        "nothing ran on the GPU"
    );
    assert!(
        c.launches.load(Ordering::Relaxed) < c.transforms.load(Ordering::Relaxed),
        "launches carry several images"
    );
}

/// nvJPEG's pixels are within the documented tolerance of the CPU decoder's, with the same
/// dimensions; PNGs and truncated JPEGs take the CPU path (same result or error as the CPU).
#[test]
#[ignore = "needs an NVIDIA GPU and nvJPEG; run by benches/gpu/check.sh"]
fn nvjpeg_decodes_within_the_documented_tolerance() {
    let gpu = open(1 << 30);
    assert!(
        gpu.report.nvjpeg.is_some(),
        "nvJPEG not found: {:?}",
        gpu.report.nvjpeg_error
    );
    let executor = gpu.executor.clone().expect("executor");
    let mut worst: f64 = 0.0;
    let mut max_diff = 0u8;
    for seed in 0..64 {
        let jpeg = prepfs::synthetic::photo(seed).expect("jpeg");
        let cpu = render::decode(&jpeg).expect("cpu decode");
        let got = executor.decode(&jpeg).expect("gpu decode");
        assert_eq!(got.size(), cpu.size());
        let diffs = got
            .pixels()
            .iter()
            .zip(cpu.pixels())
            .map(|(a, b)| a.abs_diff(*b));
        let (sum, max) = diffs.fold((0u64, 0u8), |(s, m), d| (s + u64::from(d), m.max(d)));
        let mean = sum as f64 / cpu.pixels().len() as f64;
        worst = worst.max(mean);
        max_diff = max_diff.max(max);
        assert!(
            mean <= DECODE_MEAN_ABS,
            "photo {seed}: mean |diff| {mean:.3}"
        );
    }
    println!(
        "nvJPEG ({:?} backend) vs CPU decode: worst mean |diff| {worst:.3}, max |diff| {max_diff}",
        gpu.report.nvjpeg_backend
    );
    assert!(gpu.counters.decodes.load(Ordering::Relaxed) >= 64);
    let jpeg = prepfs::synthetic::photo(1).expect("jpeg");
    assert_eq!(
        executor.decode(&jpeg[..jpeg.len() / 2]).err(),
        render::decode(&jpeg[..jpeg.len() / 2]).err(),
        "truncated: the CPU's error"
    );
}

/// With a small `--gpu-mem`, prepfs's GPU allocations (kernel buffers and nvJPEG's) stay under
/// it, and an image too large for the buffers renders on the CPU, correctly.
#[test]
#[ignore = "needs an NVIDIA GPU; run by benches/gpu/check.sh"]
fn gpu_memory_stays_under_the_cap() {
    let cap = 64 << 20;
    let gpu = open(cap);
    let executor = gpu.executor.clone().expect("executor");
    let spec = ViewSpec::parse("a=decode,random_resized_crop(224),hflip,normalize(imagenet)")
        .expect("spec");
    let mut rng = fastrand::Rng::with_seed(5);
    for seed in 0..32 {
        let jpeg = prepfs::synthetic::photo(seed).expect("jpeg");
        let image = executor.decode(&jpeg).expect("decode");
        let plan = Plan::new(&spec, image.size(), seed).expect("plan");
        let got = executor
            .transform(&spec, &image, &plan)
            .expect("render")
            .npy;
        assert_eq!(
            got,
            render::transform(&spec, &image, seed).expect("cpu").npy
        );
        assert!(gpu.counters.memory_used.load(Ordering::Relaxed) <= cap);
    }
    // 4000 x 4000 pixels (48 MB) do not fit a lane of a 64 MB cap: CPU fallback, same bytes.
    let big = random_image(&mut rng, 4000, 4000);
    let full = ViewSpec::parse("b=decode,resize(64),uint8").expect("spec");
    let before = gpu.counters.transform_fallbacks.load(Ordering::Relaxed);
    let plan = Plan::new(&full, big.size(), 0).expect("plan");
    let got = executor.transform(&full, &big, &plan).expect("render").npy;
    assert_eq!(got, render::transform(&full, &big, 0).expect("cpu").npy);
    assert_eq!(
        gpu.counters.transform_fallbacks.load(Ordering::Relaxed),
        before + 1
    );
    let used = gpu.counters.memory_used.load(Ordering::Relaxed);
    println!("GPU memory charged: {used} of the {cap}-byte cap");
    assert!(used <= cap);
}
