//! The demo's second comparison: a tensor view read through the mount against decoding in the
//! loader, on the same threads of the same process (so the same cores).
//!
//! Owns the loader's side, done in Rust as a stock loader does it per image: read the JPEG,
//! decode it whole (libjpeg-turbo), then the view's ops on the decoded pixels (crop, resize,
//! flip, normalize, .npy layout) — `render::decode` and `render::transform`, the same code the
//! view runs, without what the view adds (decoding only the crop, at a reduced scale). CPU time
//! is the whole process's, which holds the mount's daemon too. Must never leave threads behind:
//! every reader is scoped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use crate::sandbox;
use crate::view::ViewSpec;
use crate::view::render;

/// Images per second and CPU per image of one pipeline over the same images.
#[derive(Debug, Clone, Copy)]
pub struct Throughput {
    /// Images done.
    pub images: usize,
    /// Wall time, seconds.
    pub seconds: f64,
    /// CPU time of the process (user + system, every thread), seconds.
    pub cpu_seconds: f64,
}

impl Throughput {
    /// Images per second of wall time.
    pub fn images_per_s(&self) -> f64 {
        self.images as f64 / self.seconds.max(1e-9)
    }

    /// CPU milliseconds per image.
    pub fn cpu_ms_per_image(&self) -> f64 {
        1000.0 * self.cpu_seconds / self.images.max(1) as f64
    }
}

/// Runs `work` on every path with `threads` threads, with a progress bar named `what`.
fn measure(
    paths: &[PathBuf],
    threads: usize,
    what: &str,
    interrupted: &AtomicBool,
    work: &(dyn Fn(&Path) -> Result<(), String> + Sync),
) -> Result<Throughput, String> {
    let progress = super::bar(paths.len() as u64, what);
    let next = AtomicUsize::new(0);
    // Set by the first reader that fails: the others stop at their next image.
    let failed = AtomicBool::new(false);
    let pid = std::process::id();
    let cpu0 = sandbox::process_cpu_seconds(pid);
    let started = Instant::now();
    let outcome: Result<(), String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| -> Result<(), String> {
                    loop {
                        if interrupted.load(Ordering::Relaxed) {
                            return Err(super::INTERRUPTED.into());
                        }
                        let next = paths.get(next.fetch_add(1, Ordering::Relaxed));
                        let Some(path) = next.filter(|_| !failed.load(Ordering::Relaxed)) else {
                            return Ok(());
                        };
                        if let Err(e) = work(path) {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        progress.inc(1);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|_| Err("a reader panicked".into())))
    });
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = sandbox::process_cpu_seconds(pid) - cpu0;
    progress.finish_and_clear();
    outcome?;
    Ok(Throughput {
        images: paths.len(),
        seconds,
        cpu_seconds,
    })
}

/// Decoding in the loader: each image of `paths` under `source` read, decoded whole and run
/// through `spec`'s ops, on `threads` threads.
pub fn in_loader(
    source: &Path,
    paths: &[PathBuf],
    spec: &ViewSpec,
    threads: usize,
    interrupted: &AtomicBool,
) -> Result<Throughput, String> {
    let seed = AtomicUsize::new(0);
    measure(paths, threads, "loader", interrupted, &|rel| {
        let encoded =
            std::fs::read(source.join(rel)).map_err(|e| format!("{}: {e}", rel.display()))?;
        let decoded = render::decode(&encoded).map_err(|e| format!("{}: {e}", rel.display()))?;
        let draw = seed.fetch_add(1, Ordering::Relaxed) as u64;
        let tensor = render::transform(spec, &decoded, draw)
            .map_err(|e| format!("{}: {e}", rel.display()))?;
        std::hint::black_box(tensor.npy);
        Ok(())
    })
}

/// One epoch of the view: each image's .npy file under `view` (the view's directory in the
/// mount) read whole, on `threads` threads, with a progress bar named `what`.
pub fn from_view(
    view: &Path,
    paths: &[PathBuf],
    threads: usize,
    what: &str,
    interrupted: &AtomicBool,
) -> Result<Throughput, String> {
    measure(paths, threads, what, interrupted, &|rel| {
        let mut npy = rel.as_os_str().to_owned();
        npy.push(".npy");
        let tensor =
            std::fs::read(view.join(&npy)).map_err(|e| format!("{}: {e}", rel.display()))?;
        std::hint::black_box(tensor);
        Ok(())
    })
}
