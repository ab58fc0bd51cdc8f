//! `prepfs demo`: what the README's first command (`./demo.sh`) runs, end to end in a temporary
//! directory: why prepfs exists, in about a minute, side by side.
//!
//! Owns the demo's flow and its one-screen summary: building a small synthetic JPEG dataset in
//! class folders, mounting it, reading two shuffled epochs through the mount (checking every byte
//! against the source), then the two comparisons — a tensor view against decoding in the loader
//! (`decode`), and, as root, shuffled epochs on slow storage with a dataset twice the memory
//! given, the page cache against prepfs with the same memory (`slow`) — and where to look next.
//! Must never leave a mount, loop device, cgroup or file behind, also when interrupted
//! (SIGINT/SIGTERM stop the work at the next file; every piece is undone as the demo returns).

mod decode;
mod slow;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use crate::config::{self, MountConfig};
use crate::inode::CONTROL_DIR_NAME;
use crate::run;
use crate::synthetic;

pub use slow::read_listed;

/// Classes (sub-directories) of the demo dataset, as an ImageFolder expects.
const CLASSES: usize = 10;
/// The demo's view name and pipeline: ImageNet training augmentation, served as .npy files.
const VIEW_NAME: &str = "train";
const VIEW_PIPELINE: &str = "decode,random_resized_crop(224),hflip,normalize(imagenet)";
/// RAM budget of the demo mount: the whole dataset fits, so epoch 2 is all hits.
const DEMO_CACHE_BYTES: u64 = 512 << 20;
/// The error of work stopped by SIGINT or SIGTERM.
const INTERRUPTED: &str = "interrupted; unmounted and cleaned up";

/// What `prepfs demo` was asked for.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Distinct images to generate.
    pub files: usize,
    /// Memory of each side of the slow-storage comparison, bytes.
    pub memory: u64,
    /// Also print the mount's full stats.
    pub full_stats: bool,
}

/// The view comparison's two sides and its setting.
struct ViewComparison {
    threads: usize,
    loader: decode::Throughput,
    /// The view's first epoch (it also keeps decoded pixels or restart-marked copies for later).
    view_first: decode::Throughput,
    /// Its second: what every later epoch costs.
    view_later: decode::Throughput,
}

/// Runs the demo.
pub fn run(options: &DemoOptions) -> Result<(), String> {
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, interrupted.clone())
            .map_err(|e| format!("cannot install signal handler: {e}"))?;
    }
    let started = Instant::now();
    let work = tempfile::Builder::new()
        .prefix("prepfs-demo-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let outcome = demo(work.path(), options, &interrupted);
    // Everything inside is undone by now; the directory goes last.
    let removed = work
        .close()
        .map_err(|e| format!("cannot remove the temporary directory: {e}"));
    let (views, slow) = outcome?;
    removed?;
    print_summary(&views, &slow, started.elapsed().as_secs_f64());
    Ok(())
}

/// The demo's work in `work`: the view comparison, and the slow-storage one (or why it was
/// skipped).
fn demo(
    work: &Path,
    options: &DemoOptions,
    interrupted: &AtomicBool,
) -> Result<(ViewComparison, Result<slow::SlowComparison, String>), String> {
    let source = work.join("dataset");
    let mountpoint = work.join("mnt");
    std::fs::create_dir(&mountpoint).map_err(|e| e.to_string())?;
    println!(
        "Building {} JPEG images in {CLASSES} classes under {}",
        options.files,
        source.display()
    );
    let paths = build_dataset(&source, options.files, interrupted)?;
    let bytes: u64 = paths
        .iter()
        .filter_map(|p| std::fs::metadata(source.join(p)).ok())
        .map(|m| m.len())
        .sum();

    config::check_fuse_device().map_err(|e| e.to_string())?;
    let canonical = config::check_source(&source).map_err(|e| e.to_string())?;
    let mut cfg = MountConfig::new(
        canonical.clone(),
        config::check_mountpoint(&mountpoint, &canonical).map_err(|e| e.to_string())?,
    );
    cfg.foreground = true;
    cfg.cache.budget = DEMO_CACHE_BYTES;
    let spec = crate::view::ViewSpec::parse(&format!("{VIEW_NAME}={VIEW_PIPELINE}"))
        .map_err(|e| e.to_string())?;
    cfg.views.specs = vec![spec.clone()];
    let mounted = run::start(&cfg).map_err(|e| e.to_string())?;
    println!(
        "Mounted at {} ({:.1} MB dataset, {} MB cache budget)",
        mountpoint.display(),
        bytes as f64 / 1e6,
        DEMO_CACHE_BYTES >> 20
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let outcome = read_epochs(&source, &mountpoint, &paths, interrupted).and_then(|()| {
        println!("Tensor view against decoding in the loader, {threads} threads each");
        let view_dir = mountpoint
            .join(CONTROL_DIR_NAME)
            .join("views")
            .join(VIEW_NAME);
        // A new shuffle every epoch, as a training loader's sampler draws: nothing can render
        // ahead of an order it cannot predict, so each epoch pays for its own renders.
        let mut rng = fastrand::Rng::with_seed(7);
        let mut shuffled = || {
            let mut order = paths.clone();
            rng.shuffle(&mut order);
            order
        };
        let view_first = decode::from_view(&view_dir, &shuffled(), threads, "view 1", interrupted)?;
        let view_later = decode::from_view(&view_dir, &shuffled(), threads, "view 2", interrupted)?;
        let loader = decode::in_loader(&source, &shuffled(), &spec, threads, interrupted)?;
        Ok(ViewComparison {
            threads,
            loader,
            view_first,
            view_later,
        })
    });
    if options.full_stats && outcome.is_ok() {
        println!("\nprepfs stats --all {}:", mountpoint.display());
        let _ = crate::stats::print(&mountpoint, crate::stats::Shown::All);
    }
    let unmounted = mounted.unmount().map_err(|e| e.to_string());
    let views = outcome?;
    unmounted?;
    let slow = match crate::sandbox::preflight() {
        Ok(()) => slow::compare(work, &source, &paths, options.memory, interrupted)
            .map_err(|e| format!("failed: {e}")),
        Err(why) => Err(format!("skipped: {why}; run ./demo.sh as root for it")),
    };
    if interrupted.load(Ordering::Relaxed) {
        return Err(INTERRUPTED.into());
    }
    Ok((views, slow))
}

/// The one-screen summary (at most 25 lines): both comparisons, how to use a view, where next.
fn print_summary(
    views: &ViewComparison,
    slow: &Result<slow::SlowComparison, String>,
    seconds: f64,
) {
    let mb = |bytes: u64| bytes as f64 / 1e6;
    println!("\n=== prepfs demo: summary ({seconds:.0} s) ===");
    match slow {
        Ok(c) => {
            println!(
                "Slow storage: {} files, {:.0} MB (twice the memory) on a disk throttled to {} MB/s,",
                c.files,
                mb(c.data_bytes),
                c.read_bps / 1_000_000
            );
            println!(
                "  shuffled epochs, {} MiB of memory for reader and cache on each side:",
                c.memory >> 20
            );
            println!(
                "  {:<8} {:>24} {:>32}",
                "",
                "page cache",
                format!("prepfs (--cache-mem {}M)", c.cache >> 20)
            );
            for (i, (p, q)) in c.page_cache.iter().zip(&c.prepfs).enumerate() {
                println!(
                    "  epoch {:<2} {:>7.2} s {:>7.0} MB read {:>15.2} s {:>7.0} MB read",
                    i + 1,
                    p.seconds,
                    mb(p.device_bytes),
                    q.seconds,
                    mb(q.device_bytes)
                );
            }
            let later = |epochs: &[slow::Epoch]| {
                epochs
                    .iter()
                    .skip(1)
                    .fold((0.0, 0u64), |(s, b), e| (s + e.seconds, b + e.device_bytes))
            };
            let ((ps, pb), (qs, qb)) = (later(&c.page_cache), later(&c.prepfs));
            println!(
                "  epochs 2+: prepfs read {:.2}x the bytes in {:.2}x the time of the page cache",
                qb as f64 / pb.max(1) as f64,
                qs / ps.max(1e-9)
            );
        }
        Err(why) => {
            println!("Slow storage: comparison skipped: {why} (it needs root: ./demo.sh as root)")
        }
    }
    println!(
        "Tensor view vs decoding in the loader: {} images, {} threads each on the same cores:",
        views.loader.images, views.threads
    );
    println!("  {:<38} {:>9} {:>13}", "", "images/s", "CPU ms/image");
    for (name, t) in [
        ("decoding in the loader, every epoch", &views.loader),
        ("prepfs view (float32 .npy), epoch 1", &views.view_first),
        ("prepfs view, epoch 2 and later", &views.view_later),
    ] {
        println!(
            "  {name:<38} {:>9.0} {:>13.2}",
            t.images_per_s(),
            t.cpu_ms_per_image()
        );
    }
    println!(
        "  loader: in Rust, libjpeg-turbo decodes each whole image, then RandomResizedCrop(224), flip,"
    );
    println!(
        "  normalize (a Python loader costs more: BENCHMARKS.md). The view decodes only the crop,"
    );
    println!(
        "  scaled when it can; in epoch 1 it keeps what makes later epochs cheaper: decoded pixels when"
    );
    println!(
        "  they fit (the scheduler's choice, cache.decoded in --stats), else restart-marked copies."
    );
    println!("  Use it: prepfs mount DATA MNT --view {VIEW_NAME}='{VIEW_PIPELINE}'");
    println!(
        "  and in the loader: np.load(MNT/.prepfs/views/{VIEW_NAME}/<path>.npy) (README's DatasetFolder)"
    );
    println!(
        "Where next: prepfs top MNT (live), MNT/.prepfs/stats.json (every figure, docs/STATS.md),"
    );
    println!("  docs/GUIDE.md, and prepfs demo --stats for the full stats of this run.");
    println!("Unmounted and cleaned up: no mount, loop device, cgroup or file is left.");
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let style = ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} files {per_sec}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(len)
        .with_style(style.progress_chars("=> "))
        .with_message(what.to_owned())
}

fn build_dataset(
    root: &Path,
    files: usize,
    interrupted: &AtomicBool,
) -> Result<Vec<PathBuf>, String> {
    let samples = synthetic::layout(files, CLASSES, 7);
    let progress = bar(files as u64, "building");
    synthetic::write_all(root, &samples, &|| {
        progress.inc(1);
        !interrupted.load(Ordering::Relaxed)
    })?;
    progress.finish();
    // Bytes of a file modified in the last `SETTLE` are served but not cached (it may still be
    // being written): epoch 1 starts once the newest image is that old.
    std::thread::sleep(crate::source::SETTLE);
    Ok(samples.into_iter().map(|s| s.path).collect())
}

fn cache_counts(mountpoint: &Path) -> (u64, u64) {
    let path = mountpoint.join(CONTROL_DIR_NAME).join("stats.json");
    let stats: Value = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    (
        stats["cache"]["hits"].as_u64().unwrap_or(0),
        stats["cache"]["misses"].as_u64().unwrap_or(0),
    )
}

fn read_epochs(
    source: &Path,
    mountpoint: &Path,
    paths: &[PathBuf],
    interrupted: &AtomicBool,
) -> Result<(), String> {
    let mut order: Vec<&PathBuf> = paths.iter().collect();
    let mut rng = fastrand::Rng::with_seed(42);
    for epoch in 1..=2 {
        rng.shuffle(&mut order);
        let (hits0, misses0) = cache_counts(mountpoint);
        let progress = bar(order.len() as u64, &format!("epoch {epoch}"));
        let started = Instant::now();
        let mut bytes = 0u64;
        for rel in &order {
            if interrupted.load(Ordering::Relaxed) {
                progress.abandon();
                return Err(INTERRUPTED.into());
            }
            let through_mount = std::fs::read(mountpoint.join(rel))
                .map_err(|e| format!("{}: {e}", rel.display()))?;
            let original =
                std::fs::read(source.join(rel)).map_err(|e| format!("{}: {e}", rel.display()))?;
            if through_mount != original {
                return Err(format!(
                    "{}: bytes through the mount differ from the source",
                    rel.display()
                ));
            }
            bytes += through_mount.len() as u64;
            progress.inc(1);
        }
        progress.finish();
        let secs = started.elapsed().as_secs_f64();
        let (hits, misses) = cache_counts(mountpoint);
        let (h, m) = (hits - hits0, misses - misses0);
        let rate = if h + m == 0 {
            0.0
        } else {
            100.0 * h as f64 / (h + m) as f64
        };
        println!(
            "epoch {epoch}: {} files, {:.1} MB in {secs:.2} s, every byte matched the source; cache hit rate {rate:.1}%",
            order.len(),
            bytes as f64 / 1e6
        );
    }
    Ok(())
}
