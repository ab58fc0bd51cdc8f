//! The disk tier: cached blocks as files in a cache directory, kept across mounts.
//!
//! Owns: the disk budget and free-space floor, the writer thread (entries are compressed per the
//! codec policy, image rows after the row filter as in the RAM tier (the row length from a
//! `.npy` header in block 0, kept in every entry so later blocks find it in block 0's entry),
//! written to `tmp/` and renamed into place, so only complete entries are ever
//! visible; an entry written while the policy chose less than its best codec is rewritten with the
//! best once the writer is idle and the policy allows it, as the RAM tier's packer upgrades its
//! blocks), blocks the writer could not take when they were fetched (its queue full, the scan below
//! not finished, no room in the memory budget), remembered by key and written from the RAM tier
//! when it is idle, and the scan of an old cache in the background (`scan`: entries of changed or
//! deleted files are removed and the rest counted against the budget). Admission waits for that
//! scan; lookups do not, so the mount is ready at once. A missing, truncated or corrupt entry is
//! a miss and a counter. Where entries live and how the directory is touched belong to `dir`
//! (`CacheDir`): this module never opens a path inside the cache dir itself. Must never fail a
//! read: no room, ENOSPC or an I/O error only stop admission.

mod dir;
pub mod entry;
mod scan;

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::fs as rfs;

pub use dir::{CacheDir, DiskError};
use dir::{EntryFile, EntryName, Slot};

use super::block::{Block, compress_rows};
use super::codec::{self, Codec};
use super::ram::{Packer, ReadBytes};
use super::tier::{BlockKey, Tier};
use super::{rows, thread_cpu};
use crate::cache::metrics::{CacheMetrics, DiskGauges};
use crate::cache::policy::strength;
use crate::memory::{MemoryBudget, Work};
use crate::shards::ShardedMap;
use crate::source::Identity;
use scan::ScanProgress;

/// Blocks waiting for the writer at most (each up to 1 MiB, charged to the memory budget's work
/// slice until written: a queue this deep keeps the disk busy without starving renders).
const WRITE_QUEUE: usize = 16;
/// Blocks of a file the tier holds at most (its first 64 GiB): removing or counting a file's
/// entries walks its block numbers, so the walk must stay bounded whatever size a file reports.
pub const MAX_BLOCKS: usize = 64 << 10;
/// Entries waiting to be rewritten with a stronger codec at most (48 bytes each: 768 KiB; an
/// entry that finds the list full keeps its codec).
const UPGRADE_QUEUE: usize = 16 << 10;
/// Blocks remembered for a later write at most (about 64 bytes each: 1 MiB); an offer that
/// finds the list full is refused, counted.
const DEFERRED_QUEUE: usize = 16 << 10;
/// While entries wait for an upgrade, or blocks for admission to open, how often an idle writer
/// looks again.
const UPGRADE_POLL: Duration = Duration::from_millis(200);
/// After running out of space, admission pauses this long before free space is checked again.
const FULL_PAUSE: Duration = Duration::from_secs(10);

/// The disk tier's configuration (`--cache-dir`, `--cache-disk`, `--disk-min-free`).
#[derive(Debug, Clone, PartialEq)]
pub struct DiskConfig {
    /// The cache directory (absolute).
    pub dir: std::path::PathBuf,
    /// Bytes of entries at most (`None`: half the free space in `dir` at mount).
    pub budget: Option<u64>,
    /// Share of the filesystem that must stay free (0..1): admission stops below it.
    pub min_free: f64,
}

/// What the disk tier may use.
#[derive(Debug, Clone)]
pub struct DiskOptions {
    /// Bytes of entries at most.
    pub budget: u64,
    /// Share of the filesystem that must stay free (0..1): admission stops below it.
    pub min_free: f64,
}

enum Job {
    Write {
        identity: Identity,
        path: Arc<Path>,
        index: usize,
        block: Arc<Block>,
        /// The block's charge to the memory budget while it waits.
        _held: Work,
    },
    /// Remove the entries of a file version the source no longer has.
    Remove { identity: Identity, blocks: usize },
    /// Look at the deferred blocks: sent with the first one deferred, which may find the writer
    /// asleep on an empty queue.
    Wake,
}

/// A block offered when the writer could not take it, to be written from the RAM tier later.
struct Deferred {
    identity: Identity,
    path: Arc<Path>,
    index: usize,
}

/// The verified bytes of a block the RAM tier holds (`RamTier::recall`), for deferred blocks.
pub type Recall = Box<dyn Fn(&Identity, usize) -> Option<ReadBytes> + Send>;

struct Inner {
    dir: CacheDir,
    options: DiskOptions,
    used: AtomicU64,
    entries: AtomicU64,
    logical: AtomicU64,
    scanned: AtomicBool,
    /// What the start-up scan has counted so far (`scanned` is set under it).
    scan: Mutex<ScanProgress>,
    paused_until: Mutex<Option<Instant>>,
    stop: AtomicBool,
    budget: Arc<MemoryBudget>,
    metrics: Arc<CacheMetrics>,
    /// Blocks queued for the writer, served from here until written: a block the RAM tier
    /// could not admit would otherwise be fetched from the source again by every read of it
    /// until its entry lands. Bounded by the write queue.
    pending: ShardedMap<(Identity, usize), Arc<Block>>,
    /// Blocks offered while the writer could not take them, oldest first (at most
    /// `DEFERRED_QUEUE`): written from the RAM tier when the writer is idle.
    deferred: Mutex<VecDeque<Deferred>>,
}

/// Keeps block `key` for a rewrite with the best codec when it was written `weaker` (at most
/// `UPGRADE_QUEUE` kept; past that its entry keeps its codec).
fn keep_for_upgrade(
    upgrades: &mut VecDeque<(Identity, usize)>,
    weaker: bool,
    key: (Identity, usize),
) {
    if weaker && upgrades.len() < UPGRADE_QUEUE {
        upgrades.push_back(key);
    }
}

/// Tells whether a source path still holds the file version an old entry was written for.
pub type Validate = Box<dyn Fn(&Path) -> Option<Identity> + Send>;

/// Everything needed to start a disk tier.
pub struct DiskSetup {
    /// The opened, locked directory.
    pub dir: CacheDir,
    /// Budget and free-space floor.
    pub options: DiskOptions,
    /// The current identity of a source path (`None`: gone), for the scan of an old cache.
    pub validate: Validate,
}

/// The disk tier of one mount.
pub struct DiskTier {
    inner: Arc<Inner>,
    sender: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

/// How many of `identity`'s blocks the tier may hold: its first `MAX_BLOCKS`.
pub fn blocks_held(identity: &Identity) -> usize {
    usize::try_from(identity.size.div_ceil(super::BLOCK_SIZE))
        .map_or(MAX_BLOCKS, |b| b.min(MAX_BLOCKS))
}

impl DiskTier {
    /// Starts the tier over an opened `dir`: the scan of what an earlier mount left (entries
    /// whose source no longer matches per `validate` are removed) and the writer, which packs
    /// entries with the codec `packer` chooses and takes deferred blocks back through `recall`;
    /// blocks waiting for it are charged to `budget`.
    pub(crate) fn start(
        dir: CacheDir,
        options: DiskOptions,
        validate: Validate,
        recall: Recall,
        packer: Arc<Packer>,
        budget: Arc<MemoryBudget>,
        metrics: Arc<CacheMetrics>,
    ) -> DiskTier {
        let inner = Arc::new(Inner {
            dir,
            options,
            used: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            logical: AtomicU64::new(0),
            scanned: AtomicBool::new(false),
            scan: Mutex::new(ScanProgress::default()),
            paused_until: Mutex::new(None),
            stop: AtomicBool::new(false),
            budget,
            metrics,
            pending: ShardedMap::default(),
            deferred: Mutex::new(VecDeque::new()),
        });
        let (sender, receiver) = std::sync::mpsc::sync_channel(WRITE_QUEUE);
        let mut threads = Vec::new();
        let scan = inner.clone();
        match std::thread::Builder::new()
            .name("prepfs-disk-scan".into())
            .spawn(move || scan.scan(&validate))
        {
            Ok(t) => threads.push(t),
            Err(e) => tracing::warn!(error = %e, "cannot start the disk scan; disk tier read-only"),
        }
        let writer = inner.clone();
        match std::thread::Builder::new()
            .name("prepfs-disk-writer".into())
            .spawn(move || writer.write_all(&receiver, &packer, &recall))
        {
            Ok(t) => threads.push(t),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the disk writer; disk tier read-only")
            }
        }
        DiskTier {
            inner,
            sender: Some(sender),
            threads,
        }
    }

    /// Whether a new entry would be admitted now (a hint).
    pub fn admitting(&self) -> bool {
        self.inner.admitting()
            && self.inner.used.load(Ordering::Relaxed) < self.inner.options.budget
    }

    /// The verified bytes of block `index` of `identity`, if the tier holds them intact. A
    /// damaged entry is removed and counted.
    fn read_block(&self, identity: &Identity, index: usize) -> Option<Arc<Block>> {
        let inner = &self.inner;
        if let Some(block) = inner.pending.get(&(*identity, index)) {
            inner.metrics.disk_hits.inc();
            return Some(block);
        }
        let name = EntryName::of(identity, index);
        // The entry read and its decoded block, charged while they are made (at most one read
        // per thread that reads, as a source read's): the block is the caller's once returned.
        let _reading = inner
            .budget
            .in_flight(entry::MAX_ENTRY as u64 + 1 + super::BLOCK_SIZE);
        let bytes = match inner.read_entry(&name) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                inner.metrics.disk_misses.inc();
                return None;
            }
            Err(e) => {
                inner.metrics.disk_misses.inc();
                tracing::warn!(error = %e, "cannot read a disk cache entry; treated as a miss");
                return None;
            }
        };
        let started = thread_cpu();
        let decoded = entry::decode(&bytes, identity, index as u64);
        inner
            .metrics
            .decompress_cpu_ns
            .add(thread_cpu().saturating_sub(started));
        match decoded {
            Ok(logical) => {
                inner.metrics.disk_hits.inc();
                Some(Arc::new(Block::new(logical)))
            }
            Err(e) => {
                inner.metrics.disk_misses.inc();
                inner.metrics.disk_integrity_errors.inc();
                tracing::warn!(error = %e, entry = %name, "damaged disk cache entry removed; refetching");
                inner.remove(&name);
                None
            }
        }
    }

    /// Whether the tier holds an entry for block `index` of `identity`, queued or written. Not
    /// verified (a read is): a damaged entry still counts until a read finds it.
    pub fn holds(&self, identity: &Identity, index: usize) -> bool {
        let inner = &self.inner;
        inner.pending.get(&(*identity, index)).is_some()
            || matches!(
                inner.dir.slot(&EntryName::of(identity, index)),
                Slot::Entry(_)
            )
    }

    /// Offers a block fetched from the source for admission; never waits. One the writer cannot
    /// take now (its queue full, the old cache's scan not finished, no room in the memory budget
    /// for it to wait in) is deferred: remembered by key, and written from the RAM tier when the
    /// writer is idle. One with no room on disk, or past `MAX_BLOCKS`, is skipped, counted. True
    /// when it was queued now.
    fn queue(&self, identity: Identity, path: Arc<Path>, index: usize, block: Arc<Block>) -> bool {
        if index >= MAX_BLOCKS {
            return false;
        }
        let inner = &self.inner;
        let defer = |path| {
            self.defer(Deferred {
                identity,
                path,
                index,
            })
        };
        if !inner.scanned.load(Ordering::Acquire) {
            defer(path);
            return false;
        }
        if !self.admitting() {
            inner.metrics.disk_rejected.inc();
            return false;
        }
        let (Some(held), Some(sender)) =
            (inner.budget.try_work(block.data.len() as u64), &self.sender)
        else {
            defer(path);
            return false;
        };
        let key = (identity, index);
        inner.pending.insert(key, block.clone());
        let job = Job::Write {
            identity,
            path: path.clone(),
            index,
            block,
            _held: held,
        };
        if let Err(e) = sender.try_send(job) {
            inner.pending.remove(&key);
            if let TrySendError::Full(_) = e {
                defer(path);
            }
            return false;
        }
        true
    }

    /// Defers `block` (see `queue`), waking the writer when it is the first waiting.
    fn defer(&self, block: Deferred) {
        if self.inner.defer(block)
            && let Some(sender) = &self.sender
        {
            // A full queue means a busy writer, which looks at the deferred blocks when idle.
            let _ = sender.try_send(Job::Wake);
        }
    }

    /// Removes the entries of a file version the source no longer has (in the background).
    pub fn forget(&self, identity: Identity) {
        let blocks = blocks_held(&identity);
        if let Some(sender) = &self.sender {
            let _ = sender.try_send(Job::Remove { identity, blocks });
        }
    }

    /// Current figures.
    pub fn gauges(&self) -> DiskGauges {
        let inner = &self.inner;
        DiskGauges {
            entries: inner.entries.load(Ordering::Relaxed),
            bytes: inner.used.load(Ordering::Relaxed),
            logical_bytes: inner.logical.load(Ordering::Relaxed),
            budget_bytes: inner.options.budget,
            free_bytes: inner.space().map_or(0, |(free, _)| free),
            scanned: inner.scanned.load(Ordering::Relaxed),
        }
    }
}

impl Tier for DiskTier {
    fn name(&self) -> &'static str {
        "disk"
    }

    /// The entry's bytes, verified against the entry's own checksum (a damaged entry is removed,
    /// counted, and a miss).
    fn get(
        &self,
        key: &BlockKey,
        _path: &Path,
        _range: &std::ops::Range<usize>,
    ) -> Option<Arc<Block>> {
        self.read_block(&key.identity, key.index)
    }

    /// Queued for the writer (compressed per the codec policy there); refused without room on
    /// disk or in the memory budget, past `MAX_BLOCKS`, or with the queue full.
    fn put(&self, key: &BlockKey, path: &Arc<Path>, block: &Arc<Block>) -> bool {
        self.queue(key.identity, path.clone(), key.index, block.clone())
    }

    fn has_room(&self, _bytes: u64) -> bool {
        self.admitting()
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        // Closing the queue lets the writer finish what is queued and return; the scan stops.
        self.inner.stop.store(true, Ordering::Release);
        self.sender = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Inner {
    fn admitting(&self) -> bool {
        if !self.scanned.load(Ordering::Acquire) {
            return false;
        }
        let mut paused = self.paused_until.lock();
        match *paused {
            Some(until) if Instant::now() < until => false,
            Some(_) => {
                *paused = None;
                true
            }
            None => true,
        }
    }

    fn pause(&self, why: &str) {
        let mut paused = self.paused_until.lock();
        if paused.is_none() {
            tracing::warn!(why, "disk cache admission paused");
        }
        *paused = Some(Instant::now() + FULL_PAUSE);
    }

    /// (free bytes for this user, total bytes) of the cache dir's filesystem.
    fn space(&self) -> Option<(u64, u64)> {
        let s = rfs::fstatvfs(&self.dir.fd).ok()?;
        Some((
            s.f_bavail.saturating_mul(s.f_frsize),
            s.f_blocks.saturating_mul(s.f_frsize),
        ))
    }

    /// The bytes of entry `name`; `None` when there is none. Bounded by `MAX_ENTRY`.
    fn read_entry(&self, name: &EntryName) -> io::Result<Option<Vec<u8>>> {
        let Some(EntryFile { fd, len }) = self.dir.open_entry(name)? else {
            return Ok(None);
        };
        // One byte more than any valid entry, so an oversized file shows as trailing bytes.
        let mut buf = vec![0u8; len.min(entry::MAX_ENTRY as u64 + 1) as usize];
        let mut done = 0;
        while done < buf.len() {
            match rustix::io::pread(&fd, &mut buf[done..], done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        buf.truncate(done);
        // The RAM tier keeps what it needs; the kernel's copy would be a second one.
        let _ = rfs::fadvise(&fd, 0, None, rfs::Advice::DontNeed);
        Ok(Some(buf))
    }

    /// Removes entry `name` (if it is one) and takes it off the tally if the scan counted it
    /// (always once the scan is over). Under the scan's lock, so the scan either finds the entry
    /// gone or counts it before this looks.
    fn remove(&self, name: &EntryName) {
        let scan = self.scan.lock();
        if let Some(len) = self.dir.remove_entry(name)
            && (self.scanned.load(Ordering::Acquire) || scan.has_counted(name))
        {
            let _ = self
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                    Some(u.saturating_sub(len))
                });
            let _ = self
                .entries
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                    Some(e.saturating_sub(1))
                });
        }
    }

    /// The writer thread's body: queued jobs first; while none arrives, deferred blocks are
    /// written from the RAM tier (`recall`), then entries written with a weaker codec than the
    /// policy's best are rewritten, one at a time, when it allows its best.
    fn write_all(&self, jobs: &Receiver<Job>, packer: &Packer, recall: &Recall) {
        let mut upgrades: VecDeque<(Identity, usize)> = VecDeque::new();
        loop {
            let job = match jobs.try_recv() {
                Ok(job) => Some(job),
                Err(TryRecvError::Disconnected) => None,
                // Idle: the next deferred block, else the next upgrade while the policy allows
                // its best, else wait (with a timeout while either waits for its moment).
                Err(TryRecvError::Empty) => {
                    if self.write_deferred(recall, packer, &mut upgrades) {
                        continue;
                    }
                    let deferred = !self.deferred.lock().is_empty();
                    if upgrades.is_empty() && !deferred {
                        jobs.recv().ok()
                    } else {
                        let codec = packer.choose().codec;
                        if strength(codec) >= strength(packer.target())
                            && let Some((identity, index)) = upgrades.pop_front()
                        {
                            self.upgrade(&identity, index, codec);
                            continue;
                        }
                        match jobs.recv_timeout(UPGRADE_POLL) {
                            Ok(job) => Some(job),
                            Err(RecvTimeoutError::Timeout) => continue,
                            Err(RecvTimeoutError::Disconnected) => None,
                        }
                    }
                }
            };
            let Some(job) = job else { return };
            match job {
                Job::Write {
                    identity,
                    path,
                    index,
                    block,
                    ..
                } => {
                    let weaker = self.write(identity, &path, index, &block.data, packer);
                    self.pending.remove(&(identity, index));
                    keep_for_upgrade(&mut upgrades, weaker, (identity, index));
                }
                Job::Remove { identity, blocks } => {
                    for index in 0..blocks {
                        self.remove(&EntryName::of(&identity, index));
                    }
                }
                Job::Wake => {}
            }
        }
    }

    /// Rewrites the entry of block `index` of `identity` with `codec` if that makes it smaller;
    /// one that is gone, already as strong, or damaged (then removed and counted) is left.
    fn upgrade(&self, identity: &Identity, index: usize, codec: Codec) {
        let name = EntryName::of(identity, index);
        let Ok(Some(old)) = self.read_entry(&name) else {
            return;
        };
        let Ok(header) = entry::decode_header(&old) else {
            return;
        };
        if strength(header.codec) >= strength(codec) {
            return;
        }
        let started = thread_cpu();
        let Ok(logical) = entry::decode(&old, identity, index as u64) else {
            self.metrics.disk_integrity_errors.inc();
            self.remove(&name);
            return;
        };
        let rows = match header.rows {
            0 => self.rows_of(identity, index, &logical),
            known => known,
        };
        let packed = compress_rows(codec, rows, &logical);
        self.metrics
            .compress_cpu_ns
            .add(thread_cpu().saturating_sub(started));
        let Some(payload) = packed else { return };
        let new = entry::encode(
            *identity,
            index as u64,
            &header.path,
            (codec, rows),
            &logical,
            &payload,
        );
        let saved = (old.len() as u64).saturating_sub(new.len() as u64);
        if saved == 0 {
            return;
        }
        // The rename replaces the old entry at once: a reader has the old file or the new one.
        match self.dir.publish(&name, &new) {
            Ok(()) => {
                let _ = self
                    .used
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                        Some(u.saturating_sub(saved))
                    });
                self.metrics.disk_recompressions.inc();
            }
            Err(e) => tracing::warn!(error = %e, "cannot rewrite a disk cache entry"),
        }
    }

    /// Remembers a block the writer could not take, for `write_deferred`; with `DEFERRED_QUEUE`
    /// remembered already, it is refused (counted). True when it is the only one waiting.
    fn defer(&self, block: Deferred) -> bool {
        let mut deferred = self.deferred.lock();
        if deferred.len() < DEFERRED_QUEUE {
            deferred.push_back(block);
            self.metrics.disk_deferred.inc();
            deferred.len() == 1
        } else {
            self.metrics.disk_rejected.inc();
            false
        }
    }

    /// Writes the oldest deferred block, its bytes recalled from the RAM tier (and charged to the
    /// memory budget while written), keeping it in `upgrades` if written with a weaker codec than
    /// the best. A block the RAM tier no longer holds, or one past the disk budget, is dropped,
    /// counted as refused. False when none was taken: none waits, or admission or the memory
    /// budget has no room now (the block waits).
    fn write_deferred(
        &self,
        recall: &Recall,
        packer: &Packer,
        upgrades: &mut VecDeque<(Identity, usize)>,
    ) -> bool {
        if !self.admitting() {
            return false;
        }
        let Some(_held) = self.budget.try_work(super::BLOCK_SIZE) else {
            return false;
        };
        let Some(Deferred {
            identity,
            path,
            index,
        }) = self.deferred.lock().pop_front()
        else {
            return false;
        };
        // A spent disk budget refuses every entry: no block is recalled and compressed for it.
        let spent = self.used.load(Ordering::Acquire) >= self.options.budget;
        let Some(bytes) = (!spent).then(|| recall(&identity, index)).flatten() else {
            self.metrics.disk_rejected.inc();
            return true;
        };
        self.metrics.disk_recalled.inc();
        let weaker = self.write(identity, &path, index, bytes.as_slice(), packer);
        keep_for_upgrade(upgrades, weaker, (identity, index));
        true
    }

    /// Writes block `index` of `identity` (its `logical` bytes) as an entry, compressed with the
    /// policy's choice now; true when it was written with less than the policy's best codec
    /// (worth an upgrade).
    fn write(
        &self,
        identity: Identity,
        path: &Path,
        index: usize,
        logical: &[u8],
        packer: &Packer,
    ) -> bool {
        let name = EntryName::of(&identity, index);
        // An entry already there is not written again; anything else there is not prepfs's to
        // replace.
        if self.dir.slot(&name) != Slot::Free {
            return false;
        }
        let rows = self.rows_of(&identity, index, logical);
        // Image rows compress once filtered, even when the raw bytes look random.
        let compressible = rows > 0 || codec::is_compressible(logical);
        let codec = if compressible {
            packer.choose().codec
        } else {
            Codec::None
        };
        let weaker = compressible && strength(codec) < strength(packer.target());
        let started = thread_cpu();
        let packed = compress_rows(codec, rows, logical);
        self.metrics
            .compress_cpu_ns
            .add(thread_cpu().saturating_sub(started));
        let (codec, payload) = match &packed {
            Some(p) => (codec, p.as_slice()),
            None => (Codec::None, logical),
        };
        use std::os::unix::ffi::OsStrExt;
        let bytes = entry::encode(
            identity,
            index as u64,
            path.as_os_str().as_bytes(),
            (codec, rows),
            logical,
            payload,
        );
        let len = bytes.len() as u64;
        if self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(len).filter(|&t| t <= self.options.budget)
            })
            .is_err()
        {
            self.metrics.disk_rejected.inc();
            return false;
        }
        let floor_ok = self.space().is_some_and(|(free, total)| {
            free.saturating_sub(len) as f64 >= total as f64 * self.options.min_free
        });
        let result = if floor_ok {
            self.dir.publish(&name, &bytes)
        } else {
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        };
        match result {
            Ok(()) => {
                self.entries.fetch_add(1, Ordering::Relaxed);
                self.logical
                    .fetch_add(logical.len() as u64, Ordering::Relaxed);
                self.metrics.disk_writes.inc();
                weaker
            }
            Err(e) => {
                self.used.fetch_sub(len, Ordering::AcqRel);
                self.metrics.disk_rejected.inc();
                if e.raw_os_error() == Some(libc::ENOSPC) {
                    self.metrics.disk_enospc.inc();
                    self.pause("the cache dir's filesystem is (nearly) full");
                } else {
                    tracing::warn!(error = %e, "cannot write a disk cache entry");
                    self.pause("a disk cache write failed");
                }
                false
            }
        }
    }

    /// The image row length of the file whose block `index` of `identity` holds `logical` (0:
    /// none known): block 0's `.npy` header says it, and later blocks find it in block 0's
    /// entry (written first when the file is read from its start, as the RAM tier needs too).
    fn rows_of(&self, identity: &Identity, index: usize, logical: &[u8]) -> usize {
        if index == 0 {
            return rows::npy_row_bytes(logical).unwrap_or(0);
        }
        let first = self
            .dir
            .open_entry(&EntryName::of(identity, 0))
            .ok()
            .flatten();
        first
            .and_then(|file| read_header(&file))
            .filter(|h| h.identity == *identity && h.index == 0)
            .map_or(0, |h| h.rows)
    }
}

/// The header of the entry open as `file`, if intact.
fn read_header(file: &EntryFile) -> Option<entry::Header> {
    let mut head = vec![0u8; entry::HEADER_LEN + entry::MAX_PATH];
    let n = rustix::io::pread(file.fd.as_fd(), &mut head, 0).ok()?;
    entry::decode_header(&head[..n]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::policy::{Choice, CodecPolicy, Reason, Signals};
    use crate::memory::MemoryPlan;
    use crate::telemetry::Telemetry;

    /// A codec policy that leaves blocks raw while `busy` holds, and chooses zstd-3 after.
    struct Busy(Arc<AtomicBool>);

    impl CodecPolicy for Busy {
        fn choose(&self, _: &Signals) -> Choice {
            match self.0.load(Ordering::Relaxed) {
                true => Choice {
                    codec: Codec::None,
                    reason: Reason::CpuSaturated,
                },
                false => Choice {
                    codec: Codec::Zstd(3),
                    reason: Reason::CpuIdle,
                },
            }
        }

        fn target(&self) -> Codec {
            Codec::Zstd(3)
        }
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A tier in `dir` with a 1 GiB budget, its codec policy busy while `busy` holds.
    fn start(
        dir: &Path,
        validate: Validate,
        recall: Recall,
        busy: Arc<AtomicBool>,
        metrics: &Arc<CacheMetrics>,
    ) -> DiskTier {
        let packer = Arc::new(Packer::new(
            Box::new(Busy(busy)),
            Arc::new(Telemetry::default()),
            metrics.clone(),
        ));
        DiskTier::start(
            CacheDir::open(dir).expect("cache dir"),
            DiskOptions {
                budget: 1 << 30,
                min_free: 0.0,
            },
            validate,
            recall,
            packer,
            MemoryBudget::new(MemoryPlan {
                cache: 0,
                staging: 0,
                work: 64 << 20,
            }),
            metrics.clone(),
        )
    }

    fn identity(ino: u64, blocks: u64) -> Identity {
        Identity {
            dev: 1,
            ino,
            size: blocks * super::super::BLOCK_SIZE,
            mtime_ns: 3,
            ctime_ns: 3,
        }
    }

    fn block_bytes(seed: u8) -> Vec<u8> {
        (0..super::super::BLOCK_SIZE as usize)
            .map(|i| (i / 89) as u8 ^ seed)
            .collect()
    }

    /// What an earlier mount left in `cache`: block 0 of each (identity, path, seed) written,
    /// as `block_bytes(seed)`.
    fn earlier_mount(cache: &Path, entries: &[(Identity, &str, u8)]) {
        let metrics = Arc::new(CacheMetrics::default());
        let first = start(
            cache,
            Box::new(|_| None),
            Box::new(|_, _| None),
            Arc::default(),
            &metrics,
        );
        wait_until("the first scan", || first.admitting());
        for &(identity, path, seed) in entries {
            let key = BlockKey { identity, index: 0 };
            let path: Arc<Path> = Arc::from(Path::new(path));
            assert!(first.put(&key, &path, &Arc::new(Block::new(block_bytes(seed)))));
        }
        let written = entries.len() as u64;
        wait_until("the writes", || metrics.disk_writes.get() == written);
    }

    /// Blocks offered while the old cache's scan runs are deferred, not lost: once the scan ends,
    /// the idle writer takes their bytes back from the RAM tier and writes them. One the RAM
    /// tier no longer holds is counted as refused.
    #[test]
    fn blocks_offered_during_the_scan_are_written_from_ram_once_it_ends() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("c");
        let old = identity(1, 1);
        let path: Arc<Path> = Arc::from(Path::new("f"));
        // An earlier mount's entry, so the next scan has one to check.
        earlier_mount(&cache, &[(old, "f", 9)]);

        let metrics = Arc::new(CacheMetrics::default());
        let (open_gate, gate) = std::sync::mpsc::channel::<()>();
        let validate: Validate = Box::new(move |_| {
            let _ = gate.recv();
            Some(old)
        });
        let fresh = identity(2, 4);
        let held: Vec<Vec<u8>> = (0..4u8).map(block_bytes).collect();
        let in_ram = held.clone();
        // The RAM tier holds blocks 0, 1 and 3 of `fresh`; block 2 is gone by the time.
        let recall: Recall = Box::new(move |id, index| {
            (*id == fresh && index != 2).then(|| ReadBytes::Owned(in_ram[index].clone()))
        });
        let tier = start(&cache, validate, recall, Arc::default(), &metrics);
        // Let the writer fall asleep on its empty queue first: the first block deferred must
        // wake it (with nothing else ever queued, nothing else would).
        std::thread::sleep(Duration::from_millis(100));
        for (index, bytes) in held.iter().enumerate() {
            let key = BlockKey {
                identity: fresh,
                index,
            };
            assert!(
                !tier.put(&key, &path, &Arc::new(Block::new(bytes.clone()))),
                "nothing is queued while the scan runs"
            );
        }
        assert_eq!(metrics.disk_deferred.get(), 4);
        assert_eq!(metrics.disk_writes.get(), 0);

        open_gate.send(()).expect("the scan waits");
        wait_until("the deferred writes", || {
            metrics.disk_writes.get() == 3 && metrics.disk_rejected.get() == 1
        });
        assert_eq!(metrics.disk_recalled.get(), 3);
        for (index, bytes) in held.iter().enumerate() {
            let key = BlockKey {
                identity: fresh,
                index,
            };
            let read = tier.get(&key, Path::new(""), &(0..1));
            match index {
                2 => assert!(read.is_none(), "block 2 was in neither tier"),
                _ => assert_eq!(
                    &read.expect("written").data[..],
                    &bytes[..],
                    "block {index}"
                ),
            }
        }
        let kept = BlockKey {
            identity: old,
            index: 0,
        };
        assert!(
            tier.get(&kept, Path::new(""), &(0..1)).is_some(),
            "the scan kept the old entry"
        );
    }

    /// An entry the scan counted and a read then found damaged, while the scan still ran, comes
    /// off the tally: after the scan, the tally is what the cache dir holds.
    #[test]
    fn an_entry_removed_while_the_scan_runs_comes_off_the_tally_only_if_it_was_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("c");
        let files = [(identity(1, 1), "a"), (identity(2, 1), "b")];
        earlier_mount(&cache, &[(files[0].0, "a", 0), (files[1].0, "b", 1)]);
        // The second scan checks its first entry at once and waits inside the second.
        let (seen, checked) = std::sync::mpsc::channel::<std::path::PathBuf>();
        let (open_gate, gate) = std::sync::mpsc::channel::<()>();
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let validate: Validate = Box::new(move |path| {
            if calls.fetch_add(1, Ordering::SeqCst) == 1 {
                let _ = seen.send(path.to_owned());
                let _ = gate.recv();
            } else {
                let _ = seen.send(path.to_owned());
            }
            files
                .iter()
                .find(|(_, n)| Path::new(n) == path)
                .map(|(id, _)| *id)
        });
        let metrics = Arc::new(CacheMetrics::default());
        let tier = start(
            &cache,
            validate,
            Box::new(|_, _| None),
            Arc::default(),
            &metrics,
        );
        let first = checked.recv().expect("the first entry checked");
        let _second = checked.recv().expect("the scan waits in the second");
        // The counted entry is damaged on disk; a read finds it and removes it.
        let (id, _) = files
            .iter()
            .find(|(_, n)| Path::new(n) == first)
            .expect("a file");
        let name = EntryName::of(id, 0);
        let entry = cache.join(name.to_string());
        let mut bytes = std::fs::read(&entry).expect("entry");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xFF;
        std::fs::write(&entry, bytes).expect("damage");
        let key = BlockKey {
            identity: *id,
            index: 0,
        };
        assert!(
            tier.get(&key, Path::new(""), &(0..1)).is_none(),
            "damaged: removed"
        );
        assert!(!entry.exists());
        open_gate.send(()).expect("the scan waits");
        wait_until("the scan", || tier.admitting());
        let held: Vec<u64> = walk_files(&cache.join("blocks"));
        let gauges = tier.gauges();
        assert_eq!(gauges.entries, held.len() as u64);
        assert_eq!(gauges.entries, 1);
        assert_eq!(
            gauges.bytes,
            held.iter().sum::<u64>(),
            "the tally is what the dir holds"
        );
    }

    /// The sizes of the files under `dir`, at any depth.
    fn walk_files(dir: &Path) -> Vec<u64> {
        let mut sizes = Vec::new();
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let entry = entry.expect("entry");
            let meta = entry.metadata().expect("stat");
            if meta.is_dir() {
                sizes.extend(walk_files(&entry.path()));
            } else {
                sizes.push(meta.len());
            }
        }
        sizes
    }

    /// Entries written raw while the CPU was saturated end packed as the policy's best, as the
    /// RAM tier's blocks do, and still read back byte for byte.
    #[test]
    fn entries_written_raw_while_busy_are_rewritten_with_the_best_codec_when_idle() {
        let dir = tempfile::tempdir().expect("tempdir");
        let busy = Arc::new(AtomicBool::new(true));
        let metrics = Arc::new(CacheMetrics::default());
        let tier = start(
            &dir.path().join("c"),
            Box::new(|_| None),
            Box::new(|_, _| None),
            busy.clone(),
            &metrics,
        );
        wait_until("the scan", || tier.admitting());
        let identity = Identity {
            dev: 1,
            ino: 2,
            size: 4 * super::super::BLOCK_SIZE,
            mtime_ns: 3,
            ctime_ns: 3,
        };
        let data: Vec<Vec<u8>> = (0..4u8)
            .map(|b| {
                (0..super::super::BLOCK_SIZE as usize)
                    .map(|i| (i / 97) as u8 ^ b)
                    .collect()
            })
            .collect();
        let path: Arc<Path> = Arc::from(Path::new("f"));
        for (index, d) in data.iter().enumerate() {
            let key = BlockKey { identity, index };
            assert!(tier.put(&key, &path, &Arc::new(Block::new(d.clone()))));
        }
        wait_until("the raw writes", || metrics.disk_writes.get() == 4);
        let raw = tier.gauges();
        assert!(raw.bytes >= raw.logical_bytes, "written raw: {raw:?}");
        assert_eq!(metrics.disk_recompressions.get(), 0, "not while busy");

        busy.store(false, Ordering::Relaxed);
        wait_until("the upgrades", || metrics.disk_recompressions.get() == 4);
        let packed = tier.gauges();
        assert!(packed.bytes * 4 < packed.logical_bytes, "{packed:?}");
        for (index, d) in data.iter().enumerate() {
            let key = BlockKey { identity, index };
            let block = tier
                .get(&key, Path::new(""), &(0..1))
                .expect("entry reads back");
            assert_eq!(&block.data[..], &d[..], "block {index}");
        }
    }

    /// Image rows (a uint8 `.npy` array over three blocks) are stored after the row filter, as
    /// the RAM tier packs them, whether written packed or raw while busy and upgraded later:
    /// later blocks find the row length in block 0's entry.
    #[test]
    fn pixel_arrays_are_stored_filtered_like_the_ram_tier_packs_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (width, height) = (500usize, 800usize);
        let row = width * 3;
        let header = {
            let dict = format!(
                "{{'descr': '|u1', 'fortran_order': False, 'shape': ({height}, {width}, 3), }}"
            );
            let mut h = b"\x93NUMPY\x01\x00".to_vec();
            let pad = 64 - (10 + dict.len() + 1) % 64;
            h.extend_from_slice(&((dict.len() + pad + 1) as u16).to_le_bytes());
            h.extend_from_slice(dict.as_bytes());
            h.extend(std::iter::repeat_n(b' ', pad));
            h.push(b'\n');
            h
        };
        assert_eq!(rows::npy_row_bytes(&header), Some(row));
        // Photo-like: each column its own tone, rows alike but for a little noise, so the bytes
        // look random along a row and repeat (nearly) a row below.
        let mut rng = fastrand::Rng::with_seed(7);
        let tones: Vec<u8> = (0..row).map(|_| rng.u8(..)).collect();
        let mut file = header.clone();
        for y in 0..height {
            file.extend(
                tones
                    .iter()
                    .map(|t| t.wrapping_add((y / 16) as u8 + rng.u8(..2))),
            );
        }
        let blocks: Vec<Vec<u8>> = file
            .chunks(super::super::BLOCK_SIZE as usize)
            .map(<[u8]>::to_vec)
            .collect();
        assert_eq!(blocks.len(), 2);
        let filtered: u64 = blocks
            .iter()
            .map(|b| {
                compress_rows(Codec::Zstd(3), row, b)
                    .expect("compressible")
                    .len() as u64
            })
            .sum();
        let plain: u64 = blocks
            .iter()
            .map(|b| Codec::Zstd(3).compress(b).map_or(b.len(), |p| p.len()) as u64)
            .sum();
        assert!(filtered * 2 < plain, "filtered {filtered}, plain {plain}");
        let path: Arc<Path> = Arc::from(Path::new("px.npy"));
        let limit = filtered + 2 * (entry::HEADER_LEN + 6) as u64;
        for (ino, busy) in [(1, false), (2, true)] {
            let busy = Arc::new(AtomicBool::new(busy));
            let metrics = Arc::new(CacheMetrics::default());
            let tier = start(
                &dir.path().join(format!("c{ino}")),
                Box::new(|_| None),
                Box::new(|_, _| None),
                busy.clone(),
                &metrics,
            );
            wait_until("the scan", || tier.admitting());
            let identity = Identity {
                dev: 1,
                ino,
                size: file.len() as u64,
                mtime_ns: 3,
                ctime_ns: 3,
            };
            for (index, b) in blocks.iter().enumerate() {
                let key = BlockKey { identity, index };
                assert!(tier.put(&key, &path, &Arc::new(Block::new(b.clone()))));
                // In order, as a reader from the start would fetch them.
                wait_until("the write", || {
                    metrics.disk_writes.get() == index as u64 + 1
                });
            }
            busy.store(false, Ordering::Relaxed);
            if ino == 2 {
                wait_until("the upgrades", || metrics.disk_recompressions.get() == 2);
            }
            let stored = tier.gauges();
            assert!(
                stored.bytes <= limit,
                "{stored:?}, limit {limit}, busy first: {}",
                ino == 2
            );
            for (index, b) in blocks.iter().enumerate() {
                let key = BlockKey { identity, index };
                let read = tier
                    .get(&key, Path::new(""), &(0..1))
                    .expect("entry reads back");
                assert_eq!(&read.data[..], &b[..], "block {index}");
            }
        }
    }
}
