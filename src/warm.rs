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

use crate::cache::ram::whole_file_charge;
use crate::fs::CACHED_XATTR;
use crate::inode::dataset_path;
use crate::memory::Use;
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
    /// The cache's room, as handed out to the files read.
    ledger: Ledger,
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
        ledger: Ledger::default(),
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
        let Some(room) = self
            .ledger
            .resample(|| table::read(&self.mnt).map(|s| Room::of(&s)).ok())
        else {
            // The mount went away: the readers' own errors say so, file by file.
            return;
        };
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
    /// tier already holds whole is not read again. A file is read only if what it costs the
    /// RAM tier held whole (its size and its entry's bookkeeping) fits in the room left (first
    /// fit: a large file that does not fit is passed over, smaller ones after it still go in,
    /// and never-evict is not left holding parts of files), so after the cache is full the rest
    /// are only sorted into already held and did not fit.
    fn run(&self) {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let full = self.full.load(Ordering::Relaxed);
            if !full && !self.ledger.has_room() {
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
                continue;
            }
            let reserved = if full {
                None
            } else {
                self.ledger.reserve(whole_file_charge(*size))
            };
            let Some(to_come) = reserved else {
                self.unfit.lock().push(i);
                continue;
            };
            match self.read_file(&path, to_come) {
                Ok(bytes) if is_held(&path) => self.warmed.add(bytes),
                // Read, but the room sampled was more than the cache had.
                Ok(_) => self.unfit.lock().push(i),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return,
                Err(e) => self.failed.lock().push((rel.clone(), e.to_string())),
            }
        }
    }

    /// Reads one file, for which `to_come` holds room, to its end; its pages are then dropped
    /// from the page cache (the point was the mount's cache, not the kernel's).
    fn read_file(&self, path: &Path, mut to_come: ToCome<'_>) -> std::io::Result<u64> {
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
            to_come.read(n);
            self.bar.inc(n as u64);
        }
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
        Ok(total)
    }
}

/// The cache's room as the readers hand it out, so that what one file was given is never given
/// again: a stats sample sees the cache's bytes, not the room that files being read have taken
/// and not yet filled.
#[derive(Debug)]
struct Ledger {
    /// Room for files not started yet, in bytes of content: the room at the last sample less
    /// what was then still to come of the files being read, less the sizes of the files
    /// started since. Held while a sample is taken, so no file starts during one.
    room: Mutex<i64>,
    /// Bytes of the files being read that have not been read yet.
    to_come: AtomicI64,
}

impl Default for Ledger {
    /// Unbounded until the first sample.
    fn default() -> Ledger {
        Ledger {
            room: Mutex::new(i64::MAX),
            to_come: AtomicI64::new(0),
        }
    }
}

impl Ledger {
    /// Takes a fresh `sample` of the cache's room and returns it; none leaves the room as it was.
    fn resample(&self, sample: impl FnOnce() -> Option<Room>) -> Option<Room> {
        let mut room = self.room.lock();
        // Loaded before the sample: a chunk read meanwhile counts twice (the room comes out a
        // little short), never not at all, since a read returns once its bytes are cached.
        let to_come = self.to_come.load(Ordering::Relaxed);
        let sampled = sample()?;
        *room = (sampled.bytes.min(i64::MAX as u64) as i64).saturating_sub(to_come);
        Some(sampled)
    }

    /// Whether any room is left.
    fn has_room(&self) -> bool {
        *self.room.lock() > 0
    }

    /// Takes `size` bytes of room, if that much is left: they are to come until read.
    fn reserve(&self, size: u64) -> Option<ToCome<'_>> {
        let size = size.min(i64::MAX as u64) as i64;
        let mut room = self.room.lock();
        if *room < size {
            return None;
        }
        *room -= size;
        self.to_come.fetch_add(size, Ordering::Relaxed);
        Some(ToCome {
            of: &self.to_come,
            left: size,
        })
    }
}

/// The bytes of one file being read that are still to come; what is left when it is dropped
/// (the file ended early, or its read failed) no longer is.
#[derive(Debug)]
struct ToCome<'a> {
    of: &'a AtomicI64,
    left: i64,
}

impl ToCome<'_> {
    /// `n` more bytes were read (and so are cached).
    fn read(&mut self, n: usize) {
        let n = (n.min(i64::MAX as usize) as i64).min(self.left);
        self.left -= n;
        self.of.fetch_sub(n, Ordering::Relaxed);
    }
}

impl Drop for ToCome<'_> {
    fn drop(&mut self) {
        self.of.fetch_sub(self.left, Ordering::Relaxed);
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
    /// (every block fetched is offered to both), each at its current compression ratio. The
    /// RAM tier's is its memory slice less what admission counts charged to it: blocks, every
    /// entry's bookkeeping, and room taken for blocks being read (not the cache's `bytes`,
    /// which counts blocks only).
    bytes: u64,
    /// Whether the packer has blocks queued, whose compression will free RAM.
    packing: bool,
}

impl Room {
    fn of(stats: &Value) -> Room {
        use crate::cache::metrics::{
            CAPACITY_RATIO, DISK_BUDGET_BYTES, DISK_BYTES, DISK_CAPACITY_RATIO, DISK_FREE_BYTES,
            PACK_QUEUE,
        };
        use crate::memory::metrics::{SLICE_BYTES, USED_BYTES};
        let number = |metric: &Metric| table::number(stats, metric.path);
        let cache = |metric: &Metric| table::number(stats, &metric.path_for(Use::Cache.name()));
        let ram =
            (cache(&SLICE_BYTES) - cache(&USED_BYTES)).max(0.0) * number(&CAPACITY_RATIO).max(1.0);
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

    fn room(bytes: u64) -> Option<Room> {
        Some(Room {
            bytes,
            packing: false,
        })
    }

    #[test]
    fn room_a_file_being_read_was_given_is_not_given_again_by_a_sample() {
        const MIB: u64 = 1 << 20;
        let ledger = Ledger::default();
        ledger.resample(|| room(8 * MIB));
        let mut first = ledger.reserve(3 * MIB).expect("3 of 8 MiB");
        let second = ledger.reserve(3 * MIB).expect("3 of 5 MiB");
        assert!(ledger.reserve(3 * MIB).is_none(), "2 MiB left");
        // A sample while the first file is a third read sees 7 MiB free in the cache; 5 of
        // them are still to come for the two files.
        first.read(MIB as usize);
        ledger.resample(|| room(7 * MIB));
        assert!(ledger.reserve(3 * MIB).is_none(), "still 2 MiB left");
        let small = ledger.reserve(2 * MIB).expect("the 2 MiB left");
        assert!(!ledger.has_room());
        // Read to the end (or failed): nothing of them is to come, a sample sees the cache.
        drop((first, second, small));
        ledger.resample(|| room(MIB));
        assert!(ledger.reserve(MIB).is_some());
        assert!(!ledger.has_room());
        // No sample: the room is as it was.
        assert!(ledger.resample(|| None).is_none());
        assert!(!ledger.has_room());
    }

    #[test]
    fn room_is_the_larger_tier_room_at_its_compression_ratio() {
        let stats = serde_json::json!({
            "cache": {"budget_bytes": 100, "bytes": 30, "capacity_ratio": 2.0, "pack_queue": 0},
            "memory": {"cache": {"slice_bytes": 100, "used_bytes": 40}},
        });
        assert_eq!(
            Room::of(&stats),
            Room {
                bytes: 120,
                packing: false
            }
        );
        let stats = serde_json::json!({
            "cache": {"budget_bytes": 100, "bytes": 90, "capacity_ratio": 1, "pack_queue": 3},
            "memory": {"cache": {"slice_bytes": 100, "used_bytes": 100}},
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
