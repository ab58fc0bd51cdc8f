//! The disk tier: cached blocks as files in a cache directory, kept across mounts.
//!
//! Owns: where entries live (`blocks/<2 hex>/<hash of identity and block>`, never a user path),
//! the disk budget and free-space floor, the writer thread (entries are compressed per the codec
//! policy, written to `tmp/` and renamed into place, so only complete entries are ever visible),
//! and the scan of an old cache in the background (entries of changed or deleted files are
//! removed and the rest counted against the budget). Admission waits for that scan; lookups do
//! not, so the mount is ready at once. A missing, truncated or corrupt entry is a miss and a
//! counter. Must never fail a read: no room, ENOSPC or an I/O error only stop admission.

mod dir;
pub mod entry;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use xxhash_rust::xxh3::xxh3_128;

pub use dir::{CacheDir, DiskError};

use super::block::Block;
use super::codec::{self, Codec};
use super::packer::Packer;
use super::thread_cpu;
use crate::memory::{MemoryBudget, Work};
use crate::shards::ShardedMap;
use crate::source::Identity;
use crate::stats::Metrics;

/// Blocks waiting for the writer at most (each up to 1 MiB, charged to the memory budget's work
/// slice until written: a queue this deep keeps the disk busy without starving renders).
const WRITE_QUEUE: usize = 16;
/// Blocks of a file the tier holds at most (its first 64 GiB): removing or counting a file's
/// entries walks its block numbers, so the walk must stay bounded whatever size a file reports.
pub const MAX_BLOCKS: usize = 64 << 10;
/// After running out of space, admission pauses this long before free space is checked again.
const FULL_PAUSE: Duration = Duration::from_secs(10);

/// What the disk tier may use.
#[derive(Debug, Clone)]
pub struct DiskOptions {
    /// Bytes of entries at most.
    pub budget: u64,
    /// Share of the filesystem that must stay free (0..1): admission stops below it.
    pub min_free: f64,
}

/// Figures for the stats files.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiskGauges {
    /// Entries counted (complete once `scanned`).
    pub entries: u64,
    /// Bytes of those entries on disk.
    pub bytes: u64,
    /// Bytes of file contents they hold.
    pub logical_bytes: u64,
    /// The budget.
    pub budget_bytes: u64,
    /// Free bytes on the cache dir's filesystem, for this user.
    pub free_bytes: u64,
    /// Whether the scan of the old cache has finished (admission starts then).
    pub scanned: bool,
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
}

struct Inner {
    dir: CacheDir,
    options: DiskOptions,
    used: AtomicU64,
    entries: AtomicU64,
    logical: AtomicU64,
    scanned: AtomicBool,
    paused_until: Mutex<Option<Instant>>,
    stop: AtomicBool,
    budget: Arc<MemoryBudget>,
    metrics: Arc<Metrics>,
    /// Blocks queued for the writer, served from here until written: a block the RAM tier
    /// could not admit would otherwise be fetched from the source again by every read of it
    /// until its entry lands. Bounded by the write queue.
    pending: ShardedMap<(Identity, usize), Arc<Block>>,
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

/// The file name of block `index` of `identity`, relative to the cache dir.
fn entry_name(identity: &Identity, index: usize) -> String {
    let mut key = Vec::with_capacity(48);
    for v in [identity.dev, identity.ino, identity.size] {
        key.extend_from_slice(&v.to_le_bytes());
    }
    key.extend_from_slice(&identity.mtime_ns.to_le_bytes());
    key.extend_from_slice(&identity.ctime_ns.to_le_bytes());
    key.extend_from_slice(&(index as u64).to_le_bytes());
    let hash = format!("{:032x}", xxh3_128(&key));
    format!("blocks/{}/{hash}", &hash[..2])
}

impl DiskTier {
    /// Starts the tier over an opened `dir`: the scan of what an earlier mount left (entries
    /// whose source no longer matches per `validate` are removed) and the writer, which packs
    /// entries with the codec `packer` chooses; blocks waiting for it are charged to `budget`.
    pub(crate) fn start(
        dir: CacheDir,
        options: DiskOptions,
        validate: Validate,
        packer: Arc<Packer>,
        budget: Arc<MemoryBudget>,
        metrics: Arc<Metrics>,
    ) -> DiskTier {
        let inner = Arc::new(Inner {
            dir,
            options,
            used: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            logical: AtomicU64::new(0),
            scanned: AtomicBool::new(false),
            paused_until: Mutex::new(None),
            stop: AtomicBool::new(false),
            budget,
            metrics,
            pending: ShardedMap::default(),
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
            .spawn(move || writer.write_all(&receiver, &packer))
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
    pub fn has_room(&self) -> bool {
        self.inner.admitting()
            && self.inner.used.load(Ordering::Relaxed) < self.inner.options.budget
    }

    /// The verified bytes of block `index` of `identity`, if the tier holds them intact. A
    /// damaged entry is removed and counted.
    pub fn get(&self, identity: &Identity, index: usize) -> Option<Vec<u8>> {
        let inner = &self.inner;
        if let Some(block) = inner.pending.get(&(*identity, index)) {
            inner.metrics.disk_hits.inc();
            return Some(block.data.to_vec());
        }
        let name = entry_name(identity, index);
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
                Some(logical)
            }
            Err(e) => {
                inner.metrics.disk_misses.inc();
                inner.metrics.disk_integrity_errors.inc();
                tracing::warn!(error = %e, entry = %name, "damaged disk cache entry removed; refetching");
                inner.remove(&name, bytes.len() as u64);
                None
            }
        }
    }

    /// Whether the tier holds an entry for block `index` of `identity`, queued or written. Not
    /// verified (a read is): a damaged entry still counts until a read finds it.
    pub fn holds(&self, identity: &Identity, index: usize) -> bool {
        let inner = &self.inner;
        inner.pending.get(&(*identity, index)).is_some()
            || rfs::statat(
                &inner.dir.fd,
                entry_name(identity, index),
                rfs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .is_ok()
    }

    /// Offers a block fetched from the source for admission; never waits (a full queue, no
    /// room on disk or in the memory budget, or a block past `MAX_BLOCKS` just skips it,
    /// counted).
    pub fn put(&self, identity: Identity, path: Arc<Path>, index: usize, block: Arc<Block>) {
        if index >= MAX_BLOCKS {
            return;
        }
        let held = self.inner.budget.try_work(block.data.len() as u64);
        let Some(held) = held.filter(|_| self.has_room()) else {
            if self.inner.scanned.load(Ordering::Acquire) {
                self.inner.metrics.disk_rejected.inc();
            }
            return;
        };
        let Some(sender) = &self.sender else { return };
        let key = (identity, index);
        self.inner.pending.insert(key, block.clone());
        let job = Job::Write {
            identity,
            path,
            index,
            block,
            _held: held,
        };
        if let Err(e) = sender.try_send(job) {
            self.inner.pending.remove(&key);
            if let TrySendError::Full(_) = e {
                self.inner.metrics.disk_rejected.inc();
            }
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
    fn read_entry(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let fd = match rfs::openat(
            &self.dir.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let len = rfs::fstat(&fd)?.st_size.max(0) as usize;
        // One byte more than any valid entry, so an oversized file shows as trailing bytes.
        let mut buf = vec![0u8; len.min(entry::MAX_ENTRY + 1)];
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

    fn remove(&self, name: &str, len: u64) {
        if rfs::unlinkat(&self.dir.fd, name, AtFlags::empty()).is_ok()
            && self.scanned.load(Ordering::Acquire)
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

    fn write_all(&self, jobs: &Receiver<Job>, packer: &Packer) {
        while let Ok(job) = jobs.recv() {
            match job {
                Job::Write {
                    identity,
                    path,
                    index,
                    block,
                    ..
                } => {
                    self.write(identity, &path, index, &block, packer);
                    self.pending.remove(&(identity, index));
                }
                Job::Remove { identity, blocks } => {
                    for index in 0..blocks {
                        let name = entry_name(&identity, index);
                        if let Ok(stat) =
                            rfs::statat(&self.dir.fd, &name, AtFlags::SYMLINK_NOFOLLOW)
                        {
                            self.remove(&name, stat.st_size.max(0) as u64);
                        }
                    }
                }
            }
        }
    }

    fn write(&self, identity: Identity, path: &Path, index: usize, block: &Block, packer: &Packer) {
        let name = entry_name(&identity, index);
        if rfs::statat(&self.dir.fd, &name, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
            return;
        }
        let logical = &block.data;
        let codec = if codec::is_compressible(logical) {
            packer.choose().codec
        } else {
            Codec::None
        };
        let started = thread_cpu();
        let packed = codec.compress(logical);
        self.metrics
            .compress_cpu_ns
            .add(thread_cpu().saturating_sub(started));
        let (codec, payload) = match &packed {
            Some(p) => (codec, p.as_slice()),
            None => (Codec::None, &logical[..]),
        };
        use std::os::unix::ffi::OsStrExt;
        let bytes = entry::encode(
            identity,
            index as u64,
            path.as_os_str().as_bytes(),
            codec,
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
            return;
        }
        let floor_ok = self.space().is_some_and(|(free, total)| {
            free.saturating_sub(len) as f64 >= total as f64 * self.options.min_free
        });
        let result = if floor_ok {
            self.publish(&name, &bytes)
        } else {
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        };
        match result {
            Ok(()) => {
                self.entries.fetch_add(1, Ordering::Relaxed);
                self.logical
                    .fetch_add(logical.len() as u64, Ordering::Relaxed);
                self.metrics.disk_writes.inc();
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
            }
        }
    }

    /// Writes `bytes` to a temporary file and renames it to `name`: readers see all or nothing.
    fn publish(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = format!("tmp/{:016x}", fastrand::u64(..));
        let fd: OwnedFd = rfs::openat(
            &self.dir.fd,
            &tmp,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(dir::FILE_MODE),
        )?;
        let written = (|| -> io::Result<()> {
            let mut done = 0;
            while done < bytes.len() {
                done += rustix::io::pwrite(&fd, &bytes[done..], done as u64)?;
            }
            let shard = &name[..name.rfind('/').unwrap_or(0)];
            match rfs::mkdirat(&self.dir.fd, shard, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            rfs::renameat(&self.dir.fd, &tmp, &self.dir.fd, name)?;
            Ok(())
        })();
        if written.is_err() {
            let _ = rfs::unlinkat(&self.dir.fd, &tmp, AtFlags::empty());
        }
        drop(fd);
        written
    }

    /// Counts the entries an earlier mount left, removing leftovers of interrupted writes and
    /// entries whose source file changed or vanished; then opens admission.
    fn scan(&self, validate: &Validate) {
        let started = Instant::now();
        for name in list(&self.dir.fd, "tmp") {
            let _ = rfs::unlinkat(&self.dir.fd, format!("tmp/{name}"), AtFlags::empty());
        }
        let (mut kept, mut dropped) = (0u64, 0u64);
        for shard in list(&self.dir.fd, "blocks") {
            for file in list(&self.dir.fd, &format!("blocks/{shard}")) {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                let name = format!("blocks/{shard}/{file}");
                match self.check_entry(&name, validate) {
                    Some((len, logical)) => {
                        self.used.fetch_add(len, Ordering::Relaxed);
                        self.logical.fetch_add(logical, Ordering::Relaxed);
                        self.entries.fetch_add(1, Ordering::Relaxed);
                        kept += 1;
                    }
                    None => {
                        let _ = rfs::unlinkat(&self.dir.fd, &name, AtFlags::empty());
                        self.metrics.disk_stale_dropped.inc();
                        dropped += 1;
                    }
                }
            }
        }
        self.scanned.store(true, Ordering::Release);
        tracing::info!(
            kept,
            dropped,
            bytes = self.used.load(Ordering::Relaxed),
            took_ms = started.elapsed().as_millis() as u64,
            "disk cache scanned"
        );
    }

    /// (entry bytes, logical bytes) of an entry whose header is intact and whose source file is
    /// still the version it was written for; `None` for anything else.
    fn check_entry(&self, name: &str, validate: &Validate) -> Option<(u64, u64)> {
        let fd = rfs::openat(
            &self.dir.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let len = rfs::fstat(&fd).ok()?.st_size.max(0) as u64;
        let mut head = vec![0u8; entry::HEADER_LEN + entry::MAX_PATH];
        let n = rustix::io::pread(fd.as_fd(), &mut head, 0).ok()?;
        let header = entry::decode_header(&head[..n]).ok()?;
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(&header.path));
        let current = validate(path)?;
        (current == header.identity
            && header.entry_len() as u64 == len
            && entry_name(&header.identity, header.index as usize) == name)
            .then_some((len, header.len as u64))
    }
}

/// Names in directory `sub` of `dir` (empty if it cannot be read).
fn list(dir: &OwnedFd, sub: &str) -> Vec<String> {
    let Ok(fd) = rfs::openat(
        dir,
        sub,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Vec::new();
    };
    let Ok(entries) = rfs::Dir::read_from(&fd) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_owned))
        .filter(|n| n != "." && n != "..")
        .collect()
}
