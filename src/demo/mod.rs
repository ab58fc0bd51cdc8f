//! `prepfs demo`: what the README's first command (`./demo.sh`) runs, end to end in a temporary
//! directory.
//!
//! Owns: building a small synthetic JPEG dataset in class folders, mounting it, reading two
//! shuffled epochs through the mount with a progress bar (checking every byte against the
//! source), printing the cache's hit rate per epoch and the stats summary, then unmounting and
//! removing everything, also when interrupted. Must never leave a mount or files behind.

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

/// Classes (sub-directories) of the demo dataset, as an ImageFolder expects.
const CLASSES: usize = 10;
/// The demo's tensor view: ImageNet training augmentation, served as .npy files.
const DEMO_VIEW: &str = "train=decode,random_resized_crop(224),hflip,normalize(imagenet)";
/// RAM budget of the demo mount: the whole dataset fits, so epoch 2 is all hits.
const DEMO_CACHE_BYTES: u64 = 512 << 20;

/// Runs the demo with `files` images.
pub fn run(files: usize) -> Result<(), String> {
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, interrupted.clone())
            .map_err(|e| format!("cannot install signal handler: {e}"))?;
    }
    let work = tempfile::Builder::new()
        .prefix("prepfs-demo-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let source = work.path().join("dataset");
    let mountpoint = work.path().join("mnt");
    std::fs::create_dir(&mountpoint).map_err(|e| e.to_string())?;
    println!(
        "Building {files} JPEG images in {CLASSES} classes under {}",
        source.display()
    );
    let paths = build_dataset(&source, files, &interrupted)?;
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
    cfg.views.specs = vec![crate::view::ViewSpec::parse(DEMO_VIEW).map_err(|e| e.to_string())?];
    let mounted = run::start(&cfg).map_err(|e| e.to_string())?;
    println!(
        "Mounted at {} ({:.1} MB dataset, {} MB cache budget)\n",
        mountpoint.display(),
        bytes as f64 / 1e6,
        DEMO_CACHE_BYTES >> 20
    );
    let outcome = read_epochs(&source, &mountpoint, &paths, &interrupted)
        .and_then(|()| read_view(&mountpoint, &paths, &interrupted));
    if outcome.is_ok() {
        println!("\nprepfs stats {}:", mountpoint.display());
        let _ = crate::stats::print(&mountpoint, crate::stats::Shown::Summary);
    }
    let unmounted = mounted.unmount().map_err(|e| e.to_string());
    outcome.and(unmounted)?;
    println!(
        "\nUnmounted and cleaned up. Mount your own data with: prepfs mount DATASET MOUNTPOINT\n\
         Then watch it live with prepfs top MOUNTPOINT (MOUNTPOINT/.prepfs/stats.json has every \
         figure); the rest is in docs/GUIDE.md."
    );
    Ok(())
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
    Ok(samples.into_iter().map(|s| s.path).collect())
}

/// One epoch over the view: every image as a decoded, augmented float32 tensor file.
fn read_view(mountpoint: &Path, paths: &[PathBuf], interrupted: &AtomicBool) -> Result<(), String> {
    let view = mountpoint.join(CONTROL_DIR_NAME).join("views/train");
    println!("\nView {DEMO_VIEW}\n  served at {}", view.display());
    let progress = bar(paths.len() as u64, "view");
    let started = Instant::now();
    let mut bytes = 0u64;
    for rel in paths {
        if interrupted.load(Ordering::Relaxed) {
            progress.abandon();
            return Err("interrupted; unmounted and cleaned up".into());
        }
        let mut npy = rel.clone().into_os_string();
        npy.push(".npy");
        let tensor =
            std::fs::read(view.join(&npy)).map_err(|e| format!("{}: {e}", rel.display()))?;
        bytes += tensor.len() as u64;
        progress.inc(1);
    }
    progress.finish();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "view epoch: {} tensors (float32, 3x224x224, {:.0} MB) in {secs:.2} s, {:.0} images/s; load them with numpy.load",
        paths.len(),
        bytes as f64 / 1e6,
        paths.len() as f64 / secs.max(1e-9)
    );
    Ok(())
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
                return Err("interrupted; unmounted and cleaned up".into());
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
