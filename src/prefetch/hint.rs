//! `Hint`: the order a sampler publishes in an order file (`--order-file`), as a predictor.
//!
//! Owns: polling the order file for changes (on the planner thread, at most every `POLL`),
//! reading each version of it once (a version that fails to read too: its stamp is recorded, so
//! a bad file is read and logged once, not at every poll), turning its lines into the names the
//! planner keys files by, held compactly in one buffer, and predicting from that list as `Replay`
//! does from the last pass. The mount itself is read-only, so the file lives outside it (e.g. in
//! `/dev/shm`); a sampler that knows its order (NoPFS-style clairvoyance) writes the upcoming
//! paths there, one per line. Must never trust the file: lines are bytes in any encoding; a line
//! naming nothing under the mount, with `..`, a NUL or over `MAX_LINE` bytes is skipped, not the
//! file; it is read up to `MAX_BYTES`; a file that cannot be read keeps the last order. The
//! parsed order is charged to the memory budget as it grows, within `order_cap` (an eighth of
//! the budget, at most `MAX_ORDER_BYTES`), and cut where either runs out; a file rewritten
//! without pause is read again only after a rest of `REST_PER_READ` times what the last read
//! held the planner thread (its wall time less what the thread waited for a CPU, so a read that
//! a loaded machine preempted does not silence the next epoch's order). Must never do I/O except
//! that poll.

use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::epoch::EpochTracker;
use super::files::FileKey;
use super::predict::{Predictor, SCAN_PER_PREDICTION, take_unskipped};
use crate::inode::dataset_path;
use crate::memory::{MemoryBudget, Work};

/// How often the planner checks the order file for a change.
pub const POLL: Duration = Duration::from_millis(10);
/// Bytes of the order file read at most: an ImageNet-1k epoch's 1.28 million paths fit even as
/// absolute paths (~50 bytes each); past it the order is cut. Parsed, the order holds at most
/// these bytes plus 8 per path (about 1.2x for such paths; under 3x for any file, as a path
/// takes at least its own bytes and a newline of the file).
const MAX_BYTES: u64 = 64 << 20;
/// Longest line taken as a path (Linux's PATH_MAX): no open names a longer one.
const MAX_LINE: usize = 4096;
/// Bytes read from the file per system call.
const READ_CHUNK: usize = 64 << 10;

/// Memory one parsed order may hold at most (paths' bytes plus 8 per path): an ImageNet-1k
/// epoch's 1.28 million relative paths take about 50 MiB. While a new version is parsed the
/// last one still serves, so the hint holds at most twice this.
const MAX_ORDER_BYTES: u64 = 64 << 20;
/// ... and at most this fraction of the memory budget (1/8), so a small budget keeps its room
/// for data: the order is cut where it ends.
const ORDER_BUDGET_DIVISOR: u64 = 8;
/// After reading a version, the file is left alone for this many times as long as the read held
/// the planner thread (`held_for`): a sampler that rewrites a large file without pause costs at
/// most a tenth of a core and of the planner's time.
const REST_PER_READ: u32 = 9;
/// Paths whose index entry (4 bytes each) is charged at a time.
const INDEX_STEP: usize = 1024;

// Positions in `Order::names` are u32.
const _: () = assert!(MAX_BYTES <= u32::MAX as u64);

/// The bytes one order of a mount with budget `budget` may hold.
pub fn order_cap(budget: &MemoryBudget) -> u64 {
    MAX_ORDER_BYTES.min(budget.plan().limit() / ORDER_BUDGET_DIVISOR)
}

/// What an order holds, charged to the memory budget as it grows, within a cap.
struct Charge {
    budget: Arc<MemoryBudget>,
    cap: u64,
    held: Option<Work>,
}

impl Charge {
    fn new(budget: Arc<MemoryBudget>, cap: u64) -> Charge {
        Charge {
            budget,
            cap,
            held: None,
        }
    }

    fn bytes(&self) -> u64 {
        self.held.as_ref().map_or(0, Work::bytes)
    }

    /// Charges `bytes` more if they fit the cap and the budget has them free now.
    fn grow(&mut self, bytes: u64) -> bool {
        if self.bytes().saturating_add(bytes) > self.cap {
            return false;
        }
        let Some(more) = self.budget.try_work(bytes) else {
            return false;
        };
        match &mut self.held {
            Some(held) => held.absorb(more),
            None => self.held = Some(more),
        }
        true
    }

    /// Makes room in `v` for `more` elements, charged first: doubling, else all the cap has
    /// left, else an eighth more (each step grows geometrically, so filling costs linear time);
    /// false, and nothing changed, when none fits.
    fn reserve<T>(&mut self, v: &mut Vec<T>, more: usize) -> bool {
        let needed = v.len() + more;
        if needed <= v.capacity() {
            return true;
        }
        let size = std::mem::size_of::<T>();
        let left = ((self.cap - self.bytes()) / size as u64) as usize;
        let steps = [
            (v.capacity() * 2).max(INDEX_STEP),
            v.capacity().saturating_add(left),
            v.capacity() + (v.capacity() / 8).max(INDEX_STEP),
        ];
        for target in steps.into_iter().filter(|&t| t >= needed) {
            let extra = ((target - v.capacity()) as u64).saturating_mul(size as u64);
            if self.grow(extra) {
                v.reserve_exact(target - v.len());
                return true;
            }
        }
        false
    }

    /// Gives back what `freed` bytes no longer need.
    fn release(&mut self, freed: u64) {
        if let Some(held) = &mut self.held {
            held.shrink_to(held.bytes().saturating_sub(freed));
        }
    }
}

/// A published order: the paths, one after another in one buffer, and where each first appears.
#[derive(Default)]
pub struct Order {
    /// Every path's bytes, in the published order.
    names: Vec<u8>,
    /// Where each path ends in `names`.
    ends: Vec<u32>,
    /// Position of each distinct path's first appearance, sorted by path (binary searched).
    first: Vec<u32>,
    /// Its memory's charge to the budget (none for the empty order).
    charge: Option<Work>,
}

impl Order {
    /// Paths in the order.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The path at position `i`.
    fn path(&self, i: usize) -> &Path {
        let start = i.checked_sub(1).map_or(0, |p| self.ends[p] as usize);
        Path::new(OsStr::from_bytes(&self.names[start..self.ends[i] as usize]))
    }

    /// Where `path` first appears.
    fn first(&self, path: &Path) -> Option<usize> {
        let wanted = path.as_os_str().as_bytes();
        self.first
            .binary_search_by(|&i| self.path(i as usize).as_os_str().as_bytes().cmp(wanted))
            .ok()
            .map(|at| self.first[at] as usize)
    }

    /// Appends `path` if `charge` has room for it (its bytes, its end and its index entry);
    /// false, and nothing appended, when it has not.
    fn push(&mut self, path: &Path, charge: &mut Charge, indexed: &mut usize) -> bool {
        let bytes = path.as_os_str().as_bytes();
        if self.ends.len() == *indexed {
            let step = (INDEX_STEP * std::mem::size_of::<u32>()) as u64;
            if !charge.grow(step) {
                return false;
            }
            *indexed += INDEX_STEP;
        }
        if !charge.reserve(&mut self.names, bytes.len()) || !charge.reserve(&mut self.ends, 1) {
            return false;
        }
        self.names.extend_from_slice(bytes);
        self.ends.push(self.names.len() as u32);
        true
    }

    /// Indexes the paths pushed (`indexed` entries were charged) and gives back the room
    /// growing left over; the order keeps the charge.
    fn finish(mut self, mut charge: Charge, indexed: usize) -> Order {
        let mut first: Vec<u32> = (0..self.ends.len() as u32).collect();
        let bytes = |i: u32| self.path(i as usize).as_os_str().as_bytes();
        first.sort_unstable_by(|&a, &b| bytes(a).cmp(bytes(b)).then(a.cmp(&b)));
        first.dedup_by(|a, b| bytes(*a) == bytes(*b));
        first.shrink_to_fit();
        let size = std::mem::size_of::<u32>();
        let spare = (self.names.capacity() - self.names.len())
            + (self.ends.capacity() - self.ends.len()) * size
            + indexed.saturating_sub(first.len()) * size;
        self.first = first;
        self.names.shrink_to_fit();
        self.ends.shrink_to_fit();
        charge.release(spare as u64);
        self.charge = charge.held.take();
        self
    }

    /// Bytes charged for it.
    fn charged(&self) -> u64 {
        self.charge.as_ref().map_or(0, Work::bytes)
    }
}

/// The planner's key for the path a line of the order file names (see `inode::dataset_path`);
/// `None` when it names no dataset file.
fn key_of(line: &[u8], mountpoint: &Path) -> Option<PathBuf> {
    if line.contains(&0) {
        return None;
    }
    let path = dataset_path(Path::new(OsStr::from_bytes(line)), mountpoint)?;
    (!path.as_os_str().is_empty()).then_some(path)
}

/// What reading one version of the order file gave.
struct Parsed {
    order: Order,
    /// Lines that named no dataset file (not counting blank lines and comments).
    skipped: usize,
    /// The order ended where its memory did, before the file's end.
    full: bool,
}

/// Reads the order from `reader`, line by line, holding at most `MAX_LINE` bytes of a line;
/// `cut`: the reader stops short of the file's end, so its last, unterminated line is partial.
/// The order grows within `charge` and ends where it runs out.
fn parse(
    mut reader: impl BufRead,
    mountpoint: &Path,
    cut: bool,
    mut charge: Charge,
) -> io::Result<Parsed> {
    let mut order = Order::default();
    let mut skipped = 0;
    let mut indexed = 0;
    let mut line = Vec::new();
    let mut long = false;
    // Whether there is room for more: false once a path did not fit.
    let mut take = |line: &[u8], long: bool, order: &mut Order, charge: &mut Charge| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() || line.starts_with(b"#") {
            return true;
        }
        match (!long).then(|| key_of(line, mountpoint)).flatten() {
            Some(key) => order.push(&key, charge, &mut indexed),
            None => {
                skipped += 1;
                true
            }
        }
    };
    let mut full = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let end = buf.iter().position(|&b| b == b'\n');
        let chunk = &buf[..end.unwrap_or(buf.len())];
        if line.len() + chunk.len() <= MAX_LINE {
            line.extend_from_slice(chunk);
        } else {
            long = true;
        }
        let used = end.map_or(buf.len(), |i| i + 1);
        reader.consume(used);
        if end.is_some() {
            if !take(&line, long, &mut order, &mut charge) {
                full = true;
                break;
            }
            line.clear();
            long = false;
        }
    }
    if !cut && !full {
        full = !take(&line, long, &mut order, &mut charge);
    }
    Ok(Parsed {
        order: order.finish(charge, indexed),
        skipped,
        full,
    })
}

/// Why a version of the order file gave no order.
#[derive(Debug, thiserror::Error)]
enum OrderFileError {
    /// Opening or reading it failed.
    #[error("{0}")]
    Read(#[from] io::Error),
    /// It is a directory, a FIFO, a device...
    #[error("not a regular file")]
    NotAFile,
}

/// A version of the order file: inode, size, and modification and change times (a `chmod` that
/// makes an unreadable file readable changes the ctime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// What a poll of the order file found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// Nothing to do: not due yet, no file, or a version already read (or tried).
    Unchanged,
    /// A new version was read and its order published.
    Published,
    /// A new version could not be read; the last order stays (logged once per version).
    Unusable,
}

/// The latest order, shared by every set's `Hint`.
pub type OrderSlot = Arc<Mutex<Arc<Order>>>;

/// The order file of a mount, read once per version.
pub struct OrderFile {
    path: PathBuf,
    mountpoint: PathBuf,
    /// The version last read, or tried.
    seen: Option<Stamp>,
    polled: Option<Instant>,
    /// Not looked at again before this (the rest after a read: `REST_PER_READ`).
    rest_until: Option<Instant>,
    /// Bytes read at most (`MAX_BYTES`).
    max_bytes: u64,
    /// What the order is charged to, and the most it may hold (`order_cap`).
    budget: Arc<MemoryBudget>,
    cap: u64,
    slot: OrderSlot,
}

impl OrderFile {
    /// The order file at `path`, for a mount at `mountpoint` whose memory budget is `budget`;
    /// nothing is read yet.
    pub fn new(path: PathBuf, mountpoint: PathBuf, budget: Arc<MemoryBudget>) -> OrderFile {
        OrderFile {
            path,
            mountpoint,
            seen: None,
            polled: None,
            rest_until: None,
            max_bytes: MAX_BYTES,
            cap: order_cap(&budget),
            budget,
            slot: OrderSlot::default(),
        }
    }

    /// Where its order is published.
    pub fn slot(&self) -> OrderSlot {
        self.slot.clone()
    }

    /// Reads the file if `POLL` has passed and it is a version not read (or tried) before.
    pub fn poll(&mut self) -> Polled {
        let now = Instant::now();
        if self.polled.is_some_and(|t| now.duration_since(t) < POLL)
            || self.rest_until.is_some_and(|t| now < t)
        {
            return Polled::Unchanged;
        }
        self.polled = Some(now);
        let Ok(meta) = std::fs::metadata(&self.path) else {
            return Polled::Unchanged;
        };
        let stamp = Stamp::of(&meta);
        if self.seen == Some(stamp) {
            return Polled::Unchanged;
        }
        self.seen = Some(stamp);
        let (started, waited) = (Instant::now(), runqueue_wait());
        let read = self.read(&meta);
        let waited = waited
            .zip(runqueue_wait())
            .and_then(|(before, after)| after.checked_sub(before));
        let held = held_for(started.elapsed(), waited);
        self.rest_until = Some(Instant::now() + held * REST_PER_READ);
        match read {
            Ok(parsed) => {
                if parsed.full {
                    tracing::warn!(path = %self.path.display(), paths = parsed.order.len(), bytes = parsed.order.charged(), limit = self.cap, "order file's order reached its memory limit (an eighth of the budget, at most 64 MiB, and what the budget has free); the order ends there");
                }
                if parsed.skipped > 0 {
                    tracing::warn!(path = %self.path.display(), skipped = parsed.skipped, "order file lines name no file under the mount (outside it, `..`, a NUL, or longer than PATH_MAX); skipped");
                }
                tracing::debug!(
                    paths = parsed.order.len(),
                    held_us = held.as_micros() as u64,
                    "order file read"
                );
                *self.slot.lock() = Arc::new(parsed.order);
                Polled::Published
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the order file; keeping the last order until it changes");
                Polled::Unusable
            }
        }
    }

    /// Reads the file, which `meta` says is there, up to `max_bytes`; anything but a regular
    /// file is refused, also one swapped in after `meta` (opened without blocking to find out).
    fn read(&self, meta: &Metadata) -> Result<Parsed, OrderFileError> {
        if !meta.is_file() {
            return Err(OrderFileError::NotAFile);
        }
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&self.path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(OrderFileError::NotAFile);
        }
        let cut = meta.size() > self.max_bytes;
        if cut {
            tracing::warn!(path = %self.path.display(), size = meta.size(), limit = self.max_bytes, "order file larger than its limit; only its start is read");
        }
        let reader = BufReader::with_capacity(READ_CHUNK, file.take(self.max_bytes));
        let charge = Charge::new(self.budget.clone(), self.cap);
        Ok(parse(reader, &self.mountpoint, cut, charge)?)
    }
}

/// What a read of `wall` held its thread for: `wall` less `waited`, the time the thread spent
/// ready but waiting for a CPU (`runqueue_wait`), so preemption on a loaded machine does not
/// count; all of `wall` when that is not known. Time blocked in the read (a slow filesystem)
/// counts: the planner could not plan meanwhile.
fn held_for(wall: Duration, waited: Option<Duration>) -> Duration {
    wall.saturating_sub(waited.unwrap_or_default())
}

/// Time this thread has spent ready to run but waiting for a CPU since it started (the second
/// field of `/proc/thread-self/schedstat`); `None` where the kernel does not report it.
fn runqueue_wait() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns = stat.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Predicts the files after the last open in the published order.
pub struct Hint {
    slot: OrderSlot,
    /// Just past where the last open was found (orders may list a file once per epoch).
    cursor: usize,
}

impl Hint {
    /// A predictor following the order published in `slot`.
    pub fn new(slot: OrderSlot) -> Hint {
        Hint { slot, cursor: 0 }
    }
}

impl Predictor for Hint {
    fn name(&self) -> &'static str {
        "hint"
    }

    fn predict(
        &mut self,
        _tracker: &EpochTracker,
        last: &Path,
        n: usize,
        skip: &dyn Fn(&Path) -> bool,
        out: &mut Vec<FileKey>,
    ) {
        let order = self.slot.lock().clone();
        let start = self.cursor.min(order.len());
        let near = (start..order.len())
            .take(n * SCAN_PER_PREDICTION)
            .find(|&i| order.path(i) == last);
        let Some(at) = near.or_else(|| order.first(last)) else {
            return;
        };
        self.cursor = at + 1;
        take_unskipped((at + 1..order.len()).map(|i| order.path(i)), n, skip, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{MemoryPlan, Use};

    /// A budget of `limit` bytes (its work slice an eighth).
    fn budget(limit: u64) -> Arc<MemoryBudget> {
        MemoryBudget::new(MemoryPlan {
            cache: limit - limit / 8,
            staging: 0,
            work: limit / 8,
        })
    }

    fn order(text: &[u8]) -> Order {
        let charge = Charge::new(budget(1 << 30), u64::MAX);
        parse(text, Path::new("/mnt/d"), false, charge)
            .expect("parse")
            .order
    }

    fn keys(order: &Order) -> Vec<&[u8]> {
        (0..order.len())
            .map(|i| order.path(i).as_os_str().as_bytes())
            .collect()
    }

    /// Polls `file` now, whatever `POLL` says.
    fn poll_now(file: &mut OrderFile) -> Polled {
        file.polled = None;
        file.rest_until = None;
        file.poll()
    }

    #[test]
    fn lines_become_the_names_the_planner_keys_files_by() {
        let text = b"train/a.jpg\n/mnt/d/train/b.jpg\r\n./train/c.jpg\n\n# a comment\n\
                    /elsewhere/x.jpg\ntrain/../../etc/passwd\n.prepfs/stats.json\n\
                    /mnt/d/.prepfs/views/v/train/d.jpg.npy\n.prepfs/views/v/e.png.npy";
        let charge = Charge::new(budget(1 << 30), u64::MAX);
        let parsed = parse(&text[..], Path::new("/mnt/d"), false, charge).expect("parse");
        assert_eq!(
            keys(&parsed.order),
            [
                &b"train/a.jpg"[..],
                b"train/b.jpg",
                b"train/c.jpg",
                b"train/d.jpg",
                b"e.png"
            ]
        );
        assert_eq!(parsed.skipped, 3, "outside, `..`, the stats file");
    }

    #[test]
    fn the_hint_predicts_what_follows_the_last_open_also_in_a_later_epoch() {
        let slot = OrderSlot::default();
        *slot.lock() = Arc::new(order(b"c\nb\na\nd\nc\nd\na\nb\n"));
        let mut hint = Hint::new(slot);
        let tracker = EpochTracker::default();
        let mut out = Vec::new();
        let never = |_: &Path| false;
        hint.predict(&tracker, Path::new("c"), 2, &never, &mut out);
        assert_eq!(
            out,
            [FileKey::from(Path::new("b")), FileKey::from(Path::new("a"))]
        );
        for last in ["b", "a", "d", "c"] {
            out.clear();
            hint.predict(&tracker, Path::new(last), 2, &never, &mut out);
        }
        // The second "c" is the one after the cursor: the second epoch's order follows.
        assert_eq!(
            out,
            [FileKey::from(Path::new("d")), FileKey::from(Path::new("a"))]
        );
        out.clear();
        hint.predict(&tracker, Path::new("zz"), 2, &never, &mut out);
        assert!(out.is_empty(), "a file not in the order predicts nothing");
        // Far from the cursor, a path is found where it first appears.
        let mut fresh = Hint::new(hint.slot.clone());
        out.clear();
        fresh.predict(&tracker, Path::new("d"), 3, &never, &mut out);
        assert_eq!(
            out,
            [
                FileKey::from(Path::new("c")),
                FileKey::from(Path::new("d")),
                FileKey::from(Path::new("a"))
            ]
        );
    }

    #[test]
    fn an_order_file_is_read_again_only_when_it_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("order");
        let mut file = OrderFile::new(path.clone(), PathBuf::from("/m"), budget(1 << 30));
        assert_eq!(poll_now(&mut file), Polled::Unchanged, "no file yet");
        std::fs::write(&path, "a\nb\n").expect("write");
        assert_eq!(poll_now(&mut file), Polled::Published);
        assert_eq!(file.slot().lock().len(), 2);
        assert_eq!(poll_now(&mut file), Polled::Unchanged);
        std::fs::write(&path, "a\nb\nc\n").expect("write");
        assert_eq!(poll_now(&mut file), Polled::Published);
        assert_eq!(file.slot().lock().len(), 3);
    }

    #[test]
    fn lines_that_are_not_utf8_are_names_and_only_bad_lines_are_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("order");
        let mut text = b"a.jpg\ncaf\xe9.jpg\n\xff\xfe/x.jpg\nwith\0nul\n".to_vec();
        text.extend(std::iter::repeat_n(b'l', MAX_LINE + 1));
        text.extend(b"\nb.jpg\n");
        std::fs::write(&path, &text).expect("write");
        let mut file = OrderFile::new(path, PathBuf::from("/m"), budget(1 << 30));
        assert_eq!(poll_now(&mut file), Polled::Published);
        assert_eq!(
            keys(&file.slot().lock()),
            [&b"a.jpg"[..], b"caf\xe9.jpg", b"\xff\xfe/x.jpg", b"b.jpg"],
            "Linux names are bytes: a line in Latin-1 names a file as much as UTF-8 does"
        );
    }

    #[test]
    fn a_version_that_cannot_be_read_is_not_read_again_until_the_file_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("order");
        let mut file = OrderFile::new(path.clone(), PathBuf::from("/m"), budget(1 << 30));
        std::fs::write(&path, "a\nb\n").expect("write");
        assert_eq!(poll_now(&mut file), Polled::Published);
        // A regular file whose every read fails (EIO), and a directory.
        std::fs::remove_file(&path).expect("rm");
        std::os::unix::fs::symlink("/proc/self/mem", &path).expect("symlink");
        assert_eq!(poll_now(&mut file), Polled::Unusable);
        assert_eq!(poll_now(&mut file), Polled::Unchanged, "not tried again");
        std::fs::remove_file(&path).expect("rm");
        std::fs::create_dir(&path).expect("mkdir");
        assert_eq!(poll_now(&mut file), Polled::Unusable);
        assert_eq!(poll_now(&mut file), Polled::Unchanged, "not tried again");
        assert_eq!(file.slot().lock().len(), 2, "the last order stays");
        std::fs::remove_dir(&path).expect("rmdir");
        std::fs::write(&path, "c\n").expect("write");
        assert_eq!(
            poll_now(&mut file),
            Polled::Published,
            "a new version is read"
        );
        assert_eq!(keys(&file.slot().lock()), [&b"c"[..]]);
    }

    #[test]
    fn an_oversized_file_is_cut_at_the_bound_without_its_partial_last_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("order");
        let text: String = (0..30).map(|i| format!("f{i:04}\n")).collect();
        std::fs::write(&path, &text).expect("write");
        let mut file = OrderFile::new(path, PathBuf::from("/m"), budget(1 << 30));
        // Sixteen 6-byte lines, then "f001" of "f0016".
        file.max_bytes = 100;
        assert_eq!(poll_now(&mut file), Polled::Published);
        let order = file.slot().lock().clone();
        assert_eq!(order.len(), 16);
        assert_eq!(order.path(15), Path::new("f0015"));
        assert_eq!(order.first(Path::new("f0016")), None);
    }

    #[test]
    fn the_parsed_order_holds_a_small_multiple_of_the_bytes_read() {
        // The costliest lines per byte: short and distinct, so every path is also indexed.
        let mut text = Vec::new();
        for i in 0..200_000u32 {
            let digit = |place: u32| b'a' + (i / 26u32.pow(place) % 26) as u8;
            text.extend([digit(3), digit(2), digit(1), digit(0), b'\n']);
        }
        let order = order(&text);
        assert_eq!(order.first.len(), 200_000, "all distinct");
        let held = order.names.capacity() + 4 * (order.ends.capacity() + order.first.capacity());
        assert_eq!(order.len(), 200_000);
        assert!(
            held <= 3 * text.len(),
            "{held} bytes held for {} read",
            text.len()
        );
    }

    #[test]
    fn an_order_is_charged_to_the_budget_and_cut_where_its_share_ends() {
        // 200,000 short distinct lines need about 2.6 MB parsed; an 8 MiB budget gives the
        // order 1 MiB.
        let mut text = Vec::new();
        for i in 0..200_000u32 {
            text.extend(format!("{i:x}\n").bytes());
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("order");
        std::fs::write(&path, &text).expect("write");
        let budget = budget(8 << 20);
        let mut file = OrderFile::new(path, PathBuf::from("/m"), budget.clone());
        assert_eq!(file.cap, 1 << 20);
        assert_eq!(poll_now(&mut file), Polled::Published);
        let order = file.slot().lock().clone();
        assert!(
            order.len() > 50_000 && order.len() < 200_000,
            "{}",
            order.len()
        );
        assert!(order.charged() <= 1 << 20);
        let held = order.names.capacity() + 4 * (order.ends.capacity() + order.first.capacity());
        assert!(
            held as u64 <= order.charged(),
            "{held} held, {} charged",
            order.charged()
        );
        assert_eq!(budget.used(Use::Work), order.charged());
        assert_eq!(order.first(Path::new("0")), Some(0));
        // A budget with no room left cuts the next version at once, and the last one stays
        // charged until it is replaced.
        let _taken = budget.try_work(budget.plan().limit() - budget.used(Use::Work));
        std::fs::write(file.path.clone(), "a\nb\n").expect("write");
        assert_eq!(poll_now(&mut file), Polled::Published);
        assert_eq!(file.slot().lock().len(), 0);
        drop(order);
        drop(_taken);
        assert_eq!(budget.used(Use::Work), 0, "every byte given back");
    }

    #[test]
    fn a_read_holds_its_thread_for_its_time_less_its_wait_for_a_cpu() {
        let ms = Duration::from_millis;
        assert_eq!(held_for(ms(52), Some(ms(50))), ms(2));
        assert_eq!(held_for(ms(52), None), ms(52));
        assert_eq!(held_for(ms(2), Some(ms(3))), Duration::ZERO);
        // This thread's own wait is readable and only grows.
        let before = runqueue_wait().expect("schedstat");
        std::thread::yield_now();
        assert!(runqueue_wait().expect("schedstat") >= before);
    }

    #[test]
    fn after_a_read_the_file_rests_for_nine_times_as_long() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("order");
        std::fs::write(&path, "a\nb\n").expect("write");
        let mut file = OrderFile::new(path.clone(), PathBuf::from("/m"), budget(1 << 30));
        let before = Instant::now();
        assert_eq!(poll_now(&mut file), Polled::Published);
        let rest = file.rest_until.expect("resting");
        assert!(rest >= before);
        // A new version while the file rests is not read...
        std::fs::write(&path, "a\nb\nc\n").expect("write");
        file.polled = None;
        file.rest_until = Some(Instant::now() + Duration::from_secs(3600));
        assert_eq!(file.poll(), Polled::Unchanged);
        // ... until the rest is over.
        file.rest_until = Some(Instant::now());
        file.polled = None;
        assert_eq!(file.poll(), Polled::Published);
        assert_eq!(file.slot().lock().len(), 3);
    }
}
