//! `prepfs warm`: pulls dataset files into a mount's cache before training asks for them.
//!
//! Owns: turning the paths given (or a list file, in the `--order-file` format) into the files to
//! read, reading each once through the mount in that order, the progress bar, stopping once the
//! cache has no room left, and the report of what was warmed and what did not fit. Files are
//! opened with `O_NOATIME`: the mount serves such opens like any other but does not count them as
//! accesses, so a warm-up neither looks like an epoch nor teaches the predictors its order, and
//! it can run while training reads the mount. It reaches the daemon only through the mount (the
//! files and `stats.json`), so any user who can read the files can warm them. Must never write,
//! and never read outside the mount.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use serde_json::Value;

use crate::fs::CACHED_XATTR;
use crate::inode::dataset_path;
use crate::metrics::Metric;
use crate::stats::table;

/// Read size: the mount's largest request, so each read is one FUSE request.
const CHUNK: usize = 1 << 20;
/// How often the cache's room is read from stats.json while files are read (a rendering costs
/// about a millisecond of the daemon's time).
const ROOM_EVERY: Duration = Duration::from_millis(200);
/// Room, in bytes of content, below which the cache counts as full: not one more block fits.
const FULL_BELOW: u64 = 1 << 20;
/// How long a full cache may wait for the packer, whose compression of queued blocks frees
/// room, before it counts as full.
const PACKER_GRACE: Duration = Duration::from_secs(10);
/// Paths of files that did not fit shown in the report (all are counted).
const UNFIT_SHOWN: usize = 5;

/// What to warm.
#[derive(Debug, Clone)]
pub struct WarmRequest {
    /// The prepfs mount.
    pub mountpoint: PathBuf,
    /// Paths inside the mount, relative to its root or absolute under it; none and no list: the
    /// whole mount. A directory is walked; a view path stands for its source file.
    pub paths: Vec<PathBuf>,
    /// A file listing paths in the same form, one per line (`-`: standard input), read after
    /// `paths`; blank lines and `#` comments are skipped.
    pub from_list: Option<PathBuf>,
    /// Files read at once.
    pub jobs: usize,
}

/// What a warm-up did.
#[derive(Debug, Default)]
pub struct WarmReport {
    /// Files read whole.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files the RAM tier already held whole (not read again).
    pub held_files: u64,
    /// Their bytes.
    pub held_bytes: u64,
    /// Files not read because the cache had no room left.
    pub unfit_files: u64,
    /// Bytes of those files.
    pub unfit_bytes: u64,
    /// The first few of them, relative to the mount.
    pub unfit_shown: Vec<PathBuf>,
    /// Files that could not be read, relative to the mount, with the error.
    pub failed: Vec<(PathBuf, String)>,
    /// Paths (arguments or list lines) naming nothing warmable: outside the mount, missing,
    /// not a file or directory.
    pub ignored: Vec<String>,
    /// Opens that fell back to a plain open (`O_NOATIME` refused: the file is someone else's),
    /// which the mount counts as accesses.
    pub counted_opens: u64,
    /// Stopped by SIGINT or SIGTERM before the end.
    pub interrupted: bool,
    /// Wall time of the reading phase.
    pub seconds: f64,
}

/// Reads the requested files through the mount into its cache, with a progress bar on stderr.
/// Errors only when nothing can start (not a prepfs mount, an unreadable list).
pub fn warm(request: &WarmRequest) -> Result<WarmReport, String> {
    let mnt = request
        .mountpoint
        .canonicalize()
        .map_err(|e| format!("cannot use {}: {e}", request.mountpoint.display()))?;
    table::read(&mnt)?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())
            .map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    let mut report = WarmReport::default();
    let targets = targets(request, &mnt, &mut report.ignored)?;
    let files = enumerate(&mnt, &targets, &stop, &mut report.ignored);
    if stop.load(Ordering::Relaxed) {
        report.interrupted = true;
        return Ok(report);
    }
    read_all(&mnt, files, request.jobs.max(1), stop, report)
}

/// Dataset paths (relative to the mount root) named by the arguments and the list, in order.
fn targets(
    request: &WarmRequest,
    mnt: &Path,
    ignored: &mut Vec<String>,
) -> Result<Vec<PathBuf>, String> {
    let mut lines: Vec<String> = request
        .paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(list) = &request.from_list {
        let reader: Box<dyn BufRead> = if list.as_os_str() == "-" {
            Box::new(BufReader::new(std::io::stdin()))
        } else {
            Box::new(BufReader::new(File::open(list).map_err(|e| {
                format!("cannot read the list {}: {e}", list.display())
            })?))
        };
        for line in reader.lines() {
            let line = line.map_err(|e| format!("cannot read the list: {e}"))?;
            let line = line.trim();
            if !line.is_empty() && !line.starts_with('#') {
                lines.push(line.to_owned());
            }
        }
    } else if lines.is_empty() {
        lines.push(String::new());
    }
    let mut out = Vec::with_capacity(lines.len());
    for line in lines {
        match dataset_path(Path::new(&line), mnt) {
            Some(path) => out.push(path),
            None => ignored.push(line),
        }
    }
    Ok(out)
}

/// The files under `targets` with their sizes, each once, directories walked depth first in
/// name order; a spinner shows the count while the walk goes through the mount.
fn enumerate(
    mnt: &Path,
    targets: &[PathBuf],
    stop: &AtomicBool,
    ignored: &mut Vec<String>,
) -> Vec<(PathBuf, u64)> {
    let spinner = ProgressBar::new_spinner().with_message("finding files");
    spinner.enable_steady_tick(Duration::from_millis(120));
    let mut seen = HashSet::new();
    let mut files = Vec::new();
    let mut bytes = 0u64;
    for target in targets {
        let mut stack = vec![target.clone()];
        let mut first = true;
        while let Some(rel) = stack.pop() {
            if stop.load(Ordering::Relaxed) {
                return files;
            }
            let meta = std::fs::symlink_metadata(mnt.join(&rel));
            match meta {
                // A file named twice is read once, where it was first named.
                Ok(m) if m.is_file() && !seen.insert(rel.clone()) => {}
                Ok(m) if m.is_file() => {
                    bytes += m.len();
                    files.push((rel, m.len()));
                    if files.len() % 256 == 0 {
                        spinner.set_message(format!(
                            "finding files: {} ({})",
                            files.len(),
                            HumanBytes(bytes)
                        ));
                    }
                }
                Ok(m) if m.is_dir() => {
                    let mut names: Vec<_> = std::fs::read_dir(mnt.join(&rel))
                        .into_iter()
                        .flatten()
                        .filter_map(Result::ok)
                        .map(|e| e.file_name())
                        .collect();
                    // Popped from the end: reverse name order makes the walk go in name order.
                    names.sort_unstable_by(|a, b| b.cmp(a));
                    stack.extend(names.into_iter().map(|n| rel.join(n)));
                }
                // Symlinks, devices and vanished entries met inside a walk are passed over;
                // a target itself that names none of the above is reported.
                _ if first => ignored.push(target.display().to_string()),
                _ => {}
            }
            first = false;
        }
    }
    spinner.finish_and_clear();
    files
}

/// A count of files and of their bytes.
#[derive(Debug, Default)]
struct Tally {
    files: AtomicU64,
    bytes: AtomicU64,
}

impl Tally {
    fn add(&self, bytes: u64) {
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        (
            self.files.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// What the reader threads share.
struct Readers {
    mnt: PathBuf,
    files: Vec<(PathBuf, u64)>,
    next: AtomicUsize,
    stop: Arc<AtomicBool>,
    /// Set once the cache has no room left: no file is read after it.
    full: AtomicBool,
    /// Room in the cache at the last stats sample, less the sizes of the files started since
    /// (bytes of content).
    room: AtomicI64,
    /// Files read now.
    warmed: Tally,
    /// Files the RAM tier already held whole.
    held: Tally,
    /// Indices of the files not read because the cache was full.
    unfit: Mutex<Vec<usize>>,
    counted_opens: AtomicU64,
    failed: Mutex<Vec<(PathBuf, String)>>,
    bar: ProgressBar,
}

fn read_all(
    mnt: &Path,
    files: Vec<(PathBuf, u64)>,
    jobs: usize,
    stop: Arc<AtomicBool>,
    mut report: WarmReport,
) -> Result<WarmReport, String> {
    let total: u64 = files.iter().map(|(_, size)| size).sum();
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{spinner} {bytes}/{total_bytes} [{wide_bar}] {binary_bytes_per_sec}, ETA {eta} {msg}",
        )
        .map_err(|e| e.to_string())?
        .progress_chars("=> "),
    );
    let count = files.len();
    let readers = Arc::new(Readers {
        mnt: mnt.to_owned(),
        files,
        next: AtomicUsize::new(0),
        stop,
        full: AtomicBool::new(false),
        room: AtomicI64::new(i64::MAX),
        warmed: Tally::default(),
        held: Tally::default(),
        unfit: Mutex::new(Vec::new()),
        counted_opens: AtomicU64::new(0),
        failed: Mutex::new(Vec::new()),
        bar,
    });
    let mut full_since = None;
    readers.sample_room(&mut full_since);
    let started = Instant::now();
    let threads: Vec<_> = (0..jobs.min(count.max(1)))
        .map(|i| {
            let r = readers.clone();
            std::thread::Builder::new()
                .name(format!("prepfs-warm-{i}"))
                .spawn(move || r.run())
                .map_err(|e| format!("cannot start a reader thread: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut sampled = Instant::now();
    while threads.iter().any(|t| !t.is_finished()) {
        if sampled.elapsed() >= ROOM_EVERY {
            readers.sample_room(&mut full_since);
            sampled = Instant::now();
        }
        let done = readers.warmed.get().0 + readers.held.get().0;
        readers.bar.set_message(format!("{done}/{count} files"));
        // Short steps, so the end of the last file is noticed promptly.
        std::thread::sleep(Duration::from_millis(20));
    }
    for t in threads {
        let _ = t.join();
    }
    readers.bar.finish_and_clear();
    report.seconds = started.elapsed().as_secs_f64();
    (report.files, report.bytes) = readers.warmed.get();
    (report.held_files, report.held_bytes) = readers.held.get();
    report.counted_opens = readers.counted_opens.load(Ordering::Relaxed);
    report.failed = std::mem::take(&mut *readers.failed.lock());
    report.interrupted = readers.stop.load(Ordering::Relaxed);
    let mut unfit = std::mem::take(&mut *readers.unfit.lock());
    unfit.sort_unstable();
    for i in unfit {
        let (path, size) = &readers.files[i];
        report.unfit_files += 1;
        report.unfit_bytes += size;
        if report.unfit_shown.len() < UNFIT_SHOWN {
            report.unfit_shown.push(path.clone());
        }
    }
    Ok(report)
}

impl Readers {
    /// Reads the cache's room from the stats file; the cache is full once the room stays below
    /// `FULL_BELOW` with no packer work pending that could free some (`full_since`: when it was
    /// first found below).
    fn sample_room(&self, full_since: &mut Option<Instant>) {
        let Ok(room) = table::read(&self.mnt).map(|s| Room::of(&s)) else {
            // The mount went away: the readers' own errors say so, file by file.
            return;
        };
        self.room
            .store(room.bytes.min(i64::MAX as u64) as i64, Ordering::Relaxed);
        if room.bytes >= FULL_BELOW {
            *full_since = None;
            return;
        }
        let since = *full_since.get_or_insert_with(Instant::now);
        if !room.packing || since.elapsed() > PACKER_GRACE {
            self.full.store(true, Ordering::Relaxed);
        }
    }

    /// One reader thread: takes the next file until none is left. A file the RAM tier or disk
    /// tier already holds whole is not read again. A file is read only if its size fits in the
    /// room left (first fit: a large file that does not fit is passed over, smaller ones after
    /// it still go in, and never-evict is not left holding parts of files), so after the cache
    /// is full the rest are only sorted into already held and did not fit.
    fn run(&self) {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let full = self.full.load(Ordering::Relaxed);
            if !full && self.room.load(Ordering::Relaxed) <= 0 {
                // Wait for the next sample: it may show room freed by the packer.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some((rel, size)) = self.files.get(i) else {
                return;
            };
            let path = self.mnt.join(rel);
            if is_held(&path) {
                self.held.add(*size);
                self.bar.inc(*size);
            } else if full || !self.reserve(*size) {
                self.unfit.lock().push(i);
            } else {
                match self.read_file(&path) {
                    Ok(bytes) if is_held(&path) => self.warmed.add(bytes),
                    // Read, but the room sampled was more than the cache had.
                    Ok(_) => self.unfit.lock().push(i),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return,
                    Err(e) => self.failed.lock().push((rel.clone(), e.to_string())),
                }
            }
        }
    }

    /// Takes `size` bytes from the room left, if it has them.
    fn reserve(&self, size: u64) -> bool {
        let size = size.min(i64::MAX as u64) as i64;
        self.room
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |room| {
                (room >= size).then_some(room - size)
            })
            .is_ok()
    }

    /// Reads one file to its end; its pages are then dropped from the page cache (the point was
    /// the mount's cache, not the kernel's).
    fn read_file(&self, path: &Path) -> std::io::Result<u64> {
        let mut file = match File::options()
            .read(true)
            .custom_flags(libc::O_NOATIME)
            .open(path)
        {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                self.counted_opens.fetch_add(1, Ordering::Relaxed);
                File::open(path)?
            }
            other => other?,
        };
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            total += n as u64;
            self.bar.inc(n as u64);
        }
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
        Ok(total)
    }
}

/// Whether the mount's RAM tier or its disk tier holds every block of the file at `path`, as
/// its `CACHED_XATTR` (`ram=R disk=D blocks=N`) says.
fn is_held(path: &Path) -> bool {
    let mut value = [0u8; 96];
    let Ok(len) = rustix::fs::getxattr(path, CACHED_XATTR, &mut value[..]) else {
        return false;
    };
    let Ok(text) = std::str::from_utf8(&value[..len]) else {
        return false;
    };
    let field = |key: &str| {
        text.split(' ')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse::<u64>().ok())
    };
    field("blocks").is_some_and(|n| field("ram") == Some(n) || field("disk") == Some(n))
}

/// Room left in the cache, from a stats.json document.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Room {
    /// Bytes of content that still fit: the larger of the RAM tier's and the disk tier's room
    /// (every block fetched is offered to both), each at its current compression ratio.
    bytes: u64,
    /// Whether the packer has blocks queued, whose compression will free RAM.
    packing: bool,
}

impl Room {
    fn of(stats: &Value) -> Room {
        use crate::cache::metrics::{
            BUDGET_BYTES, BYTES, CAPACITY_RATIO, DISK_BUDGET_BYTES, DISK_BYTES,
            DISK_CAPACITY_RATIO, DISK_FREE_BYTES, PACK_QUEUE,
        };
        let number = |metric: &Metric| table::number(stats, metric.path);
        let ram =
            (number(&BUDGET_BYTES) - number(&BYTES)).max(0.0) * number(&CAPACITY_RATIO).max(1.0);
        let disk = (number(&DISK_BUDGET_BYTES) - number(&DISK_BYTES))
            .min(number(&DISK_FREE_BYTES))
            .max(0.0)
            * number(&DISK_CAPACITY_RATIO).max(1.0);
        Room {
            bytes: ram.max(disk) as u64,
            packing: number(&PACK_QUEUE) > 0.0,
        }
    }
}

impl WarmReport {
    /// The report for people, a few lines.
    pub fn lines(&self) -> Vec<String> {
        let rate = if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds
        } else {
            0.0
        };
        let mut lines = vec![format!(
            "warmed {} files, {} in {:.1} s ({}/s){}",
            self.files,
            HumanBytes(self.bytes),
            self.seconds,
            HumanBytes(rate as u64),
            if self.interrupted {
                "; interrupted"
            } else {
                ""
            }
        )];
        if self.held_files > 0 {
            lines.push(format!(
                "already cached: {} files, {}",
                self.held_files,
                HumanBytes(self.held_bytes)
            ));
        }
        if self.unfit_files > 0 {
            let shown: Vec<String> = self
                .unfit_shown
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            lines.push(format!(
                "did not fit: {} files, {} (the cache is full and never evicts); first: {}",
                self.unfit_files,
                HumanBytes(self.unfit_bytes),
                shown.join(", ")
            ));
        }
        if self.counted_opens > 0 {
            lines.push(format!(
                "note: {} files are not yours, so O_NOATIME was refused and their reads counted \
                 as accesses (the prefetcher saw them as reads of a training pass)",
                self.counted_opens
            ));
        }
        for path in &self.ignored {
            lines.push(format!(
                "ignored: {path:?} names no file or directory in the mount"
            ));
        }
        for (path, error) in &self.failed {
            lines.push(format!("failed: {}: {error}", path.display()));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_the_larger_tier_room_at_its_compression_ratio() {
        let stats = serde_json::json!({
            "cache": {"budget_bytes": 100, "bytes": 40, "capacity_ratio": 2.0, "pack_queue": 0},
        });
        assert_eq!(
            Room::of(&stats),
            Room {
                bytes: 120,
                packing: false
            }
        );
        let stats = serde_json::json!({
            "cache": {"budget_bytes": 100, "bytes": 100, "capacity_ratio": 1, "pack_queue": 3},
            "disk": {"budget_bytes": 1000, "bytes": 200, "free_bytes": 500, "capacity_ratio": 1},
        });
        assert_eq!(
            Room::of(&stats),
            Room {
                bytes: 500,
                packing: true
            }
        );
    }
}
