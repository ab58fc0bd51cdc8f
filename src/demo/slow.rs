//! The demo's first comparison: shuffled epochs over slow storage with a dataset twice the memory
//! given, read by a plain reader through the page cache, then through prepfs with the same memory.
//!
//! Owns the slow disk (an ext4 image on a loop device, filled with copies of the demo's images
//! until it holds twice the memory), one cgroup per side (that memory limit, and the disk's reads
//! throttled), and the reader processes (`prepfs demo --read-listed`, one per epoch, inside the
//! side's cgroup, with prepfs's daemon beside it). Both sides read the same files in the same
//! orders. Everything it creates is a `sandbox` guard, undone when it returns, on error, or when
//! the demo is interrupted. Must never run without `sandbox::preflight`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::memory::limits::HEADROOM;
use crate::sandbox::{self, Cgroup, Limits, SlowDisk};

/// Shuffled epochs per side: the first reads everything on both; the later ones show the
/// difference.
const EPOCHS: u32 = 3;
/// Read throttle of the slow disk: a modest network volume, slow enough that bytes read decide
/// epoch time on a loaded 2-core machine too (at 100 MB/s FUSE's CPU cost made it noisy).
const READ_BPS: u64 = 60_000_000;
/// Read requests per second of the slow disk (per device; enough not to bind before bandwidth).
const READ_IOPS: u64 = 4000;
/// The dataset is this many times the memory given.
const DATA_PER_MEMORY: u64 = 2;
/// The seed of the epochs' shuffles, the same on both sides.
const SHUFFLE_SEED: u64 = 42;

/// One epoch: its wall time and the bytes the slow disk read during it.
#[derive(Debug, Clone, Copy)]
pub struct Epoch {
    /// Wall time, seconds.
    pub seconds: f64,
    /// Bytes the device read.
    pub device_bytes: u64,
}

/// Both sides of the comparison and its setting.
#[derive(Debug, Clone)]
pub struct SlowComparison {
    /// Files in the slow dataset.
    pub files: usize,
    /// Their bytes.
    pub data_bytes: u64,
    /// Memory limit of each side's cgroup.
    pub memory: u64,
    /// prepfs's `--cache-mem` within it.
    pub cache: u64,
    /// The disk's read throttle, bytes/s.
    pub read_bps: u64,
    /// The page cache side's epochs.
    pub page_cache: Vec<Epoch>,
    /// The prepfs side's epochs.
    pub prepfs: Vec<Epoch>,
}

/// Runs the comparison in `work` with `memory` bytes per side, the slow dataset made of copies of
/// `images` (relative to `source`).
pub fn compare(
    work: &Path,
    source: &Path,
    images: &[PathBuf],
    memory: u64,
    interrupted: &AtomicBool,
) -> Result<SlowComparison, String> {
    let cache = memory.saturating_sub(HEADROOM);
    if cache == 0 {
        return Err(format!(
            "--memory must be above {} MiB (prepfs keeps that much under a cgroup's limit)",
            HEADROOM >> 20
        ));
    }
    sandbox::clear_leftovers(work);
    println!(
        "Slow storage: building a {:.0} MB ext4 disk of copies of the images, {} MiB of memory per side",
        (memory * DATA_PER_MEMORY) as f64 / 1e6,
        memory >> 20
    );
    let image = work.join("slow.img");
    let (files, data_bytes) = fill_image(
        &image,
        &work.join("fill"),
        source,
        images,
        memory * DATA_PER_MEMORY,
        interrupted,
    )?;
    let disk = SlowDisk::attach(&image, &work.join("slow"), false)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find prepfs itself: {e}"))?;
    let sides = Sides {
        exe: &exe,
        disk: &disk,
        files: &files,
        limits: Limits {
            memory: Some(memory),
            throttle: Some((disk.devnum.clone(), READ_BPS, READ_IOPS)),
        },
        interrupted,
    };
    println!(
        "Slow storage: {EPOCHS} shuffled epochs of {} files from the disk throttled to {} MB/s, through the page cache, then through prepfs",
        files.len(),
        READ_BPS / 1_000_000,
    );
    let page_cache = sides.run("pagecache", None, work)?;
    let prepfs = sides.run("prepfs", Some(cache), work)?;
    Ok(SlowComparison {
        files: files.len(),
        data_bytes,
        memory,
        cache,
        read_bps: READ_BPS,
        page_cache,
        prepfs,
    })
}

/// Makes `image` an ext4 filesystem holding copies of `images` (under `source`) until they add
/// up to `target` bytes; returns the files' paths and their total size.
fn fill_image(
    image: &Path,
    mountpoint: &Path,
    source: &Path,
    images: &[PathBuf],
    target: u64,
    interrupted: &AtomicBool,
) -> Result<(Vec<PathBuf>, u64), String> {
    let sizes: Vec<u64> = images
        .iter()
        .map(|p| std::fs::metadata(source.join(p)).map_or(0, |m| m.len()))
        .collect();
    if sizes.iter().sum::<u64>() == 0 {
        return Err("no images to copy onto the slow disk".into());
    }
    // ext4's metadata and a margin on top of the data.
    let size = target + target / 8 + (64 << 20);
    let file = std::fs::File::create(image).map_err(|e| format!("{}: {e}", image.display()))?;
    file.set_len(size)
        .map_err(|e| format!("{}: {e}", image.display()))?;
    drop(file);
    sandbox::must(
        std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(image),
    )?;
    let disk = SlowDisk::attach(image, mountpoint, true)?;
    let estimate = target.div_ceil(sizes.iter().sum::<u64>() / images.len() as u64);
    let progress = super::bar(estimate, "slow disk");
    let (mut files, mut bytes) = (Vec::new(), 0u64);
    'fill: for copy in 0.. {
        for (rel, size) in images.iter().zip(&sizes) {
            if bytes >= target {
                break 'fill;
            }
            if interrupted.load(Ordering::Relaxed) {
                return Err(super::INTERRUPTED.into());
            }
            let mut name = rel.clone().into_os_string();
            name.push(format!(".{copy}"));
            let name = PathBuf::from(name);
            let to = disk.mountpoint.join(&name);
            if let Some(dir) = to.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            std::fs::copy(source.join(rel), &to).map_err(|e| format!("{}: {e}", to.display()))?;
            files.push(name);
            bytes += size;
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    drop(disk);
    Ok((files, bytes))
}

/// What both sides share.
struct Sides<'a> {
    exe: &'a Path,
    disk: &'a SlowDisk,
    files: &'a [PathBuf],
    limits: Limits,
    interrupted: &'a AtomicBool,
}

impl Sides<'_> {
    /// `EPOCHS` shuffled epochs in a fresh cgroup named `name`, from a cold page cache, through
    /// prepfs with `cache` bytes of `--cache-mem` when given, else straight from the disk.
    fn run(&self, name: &str, cache: Option<u64>, work: &Path) -> Result<Vec<Epoch>, String> {
        sandbox::drop_caches()?;
        let group = Cgroup::create(name, &self.limits)?;
        let mountpoint = work.join("mnt-slow");
        let daemon = match cache {
            Some(bytes) => Some(sandbox::start_prepfs(
                &group,
                self.exe,
                &[
                    "mount".into(),
                    self.disk.mountpoint.display().to_string(),
                    mountpoint.display().to_string(),
                    "--foreground".into(),
                    "--cache-mem".into(),
                    bytes.to_string(),
                    // Prefetch only into the cache: a staging buffer would be memory beyond it.
                    "--prefetch-buffer".into(),
                    "0".into(),
                ],
                &mountpoint,
                &work.join("prepfs-slow.log"),
            )?),
            None => None,
        };
        let root = if daemon.is_some() {
            mountpoint.as_path()
        } else {
            self.disk.mountpoint.as_path()
        };
        let mut order: Vec<&PathBuf> = self.files.iter().collect();
        let mut rng = fastrand::Rng::with_seed(SHUFFLE_SEED);
        let mut epochs = Vec::new();
        for epoch in 1..=EPOCHS {
            rng.shuffle(&mut order);
            let before = self.disk.reads().1;
            let started = Instant::now();
            self.read_epoch(&group, root, &order, &format!("{name} {epoch}"))?;
            epochs.push(Epoch {
                seconds: started.elapsed().as_secs_f64(),
                device_bytes: self.disk.reads().1 - before,
            });
        }
        if let Some((mut child, stop, unmount)) = daemon {
            drop(stop);
            let _ = child.wait();
            drop(unmount);
        }
        Ok(epochs)
    }

    /// One epoch: a reader process in `group` reads `order` under `root`.
    fn read_epoch(
        &self,
        group: &Cgroup,
        root: &Path,
        order: &[&PathBuf],
        what: &str,
    ) -> Result<(), String> {
        let mut child = group
            .command(
                self.exe,
                &[
                    "demo".into(),
                    "--read-listed".into(),
                    root.display().to_string(),
                ],
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the reader: {e}"))?;
        let stop = sandbox::guard_process(child.id());
        let mut list = Vec::new();
        for path in order {
            list.extend_from_slice(path.as_os_str().as_encoded_bytes());
            list.push(b'\n');
        }
        let stdin = child.stdin.take();
        let writer = std::thread::spawn(move || {
            if let Some(mut stdin) = stdin {
                let _ = stdin.write_all(&list);
            }
        });
        let progress = super::bar(order.len() as u64, what);
        if let Some(stdout) = child.stdout.take() {
            for _ in BufReader::new(stdout).lines() {
                if self.interrupted.load(Ordering::Relaxed) {
                    let _ = child.kill();
                    break;
                }
                progress.inc(1);
            }
        }
        progress.finish_and_clear();
        let _ = writer.join();
        let out = child
            .wait_with_output()
            .map_err(|e| format!("the reader: {e}"))?;
        // Reaped: its pid may be reused, so nothing may signal it any more.
        stop.disarm();
        if self.interrupted.load(Ordering::Relaxed) {
            return Err(super::INTERRUPTED.into());
        }
        if !out.status.success() {
            return Err(format!(
                "the reader failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }
}

/// The reader process: reads every file listed on stdin (one path a line, relative to `root`)
/// whole, and prints one line after each.
pub fn read_listed(root: &Path) -> Result<(), String> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let rel = line.map_err(|e| format!("reading the list: {e}"))?;
        let bytes = std::fs::read(root.join(&rel)).map_err(|e| format!("{rel}: {e}"))?;
        std::hint::black_box(bytes);
        writeln!(out, ".").map_err(|e| e.to_string())?;
    }
    Ok(())
}
