//! The never-evict ("MinIO", after CoorDL) cache: a RAM tier, and optionally a disk tier.
//!
//! Owns: which bytes of which file version are held in memory and on disk, the hard byte
//! budgets, checksums, codecs and single-flight fetching. Data is admitted until a budget is
//! full; after that nothing is evicted and nothing more is admitted, so a random-order epoch
//! misses exactly what did not fit instead of thrashing like an LRU. Compressible data is packed
//! in the background (see `packer`), so the same budget holds more of it. Entries are keyed by
//! source `Identity`: a changed file is a different key, and its old entry is dropped by
//! `forget`. Cache failures (no memory, memfd refused, checksum mismatch, a bad disk entry) become
//! misses and counters, never errors for the reader. Must never evict to make room, and never
//! take a cache-wide lock on the read path.

mod block;
pub mod codec;
mod disk;
mod file;
mod memfd;
mod packer;
pub mod policy;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

pub use block::Block;
pub use disk::{CacheDir, DiskError, DiskGauges, DiskOptions, DiskSetup};
pub use file::{CachedFile, ReadBytes, Unpacked};
pub use policy::Choice;

use codec::Codec;
use disk::DiskTier;
use packer::Packer;
use policy::CodecPolicy;

use crate::shards::ShardedMap;
use crate::source::Identity;
use crate::stats::{Gauges, Metrics};
use crate::telemetry::Telemetry;

/// Cache block size. Equal to the largest FUSE read (256 pages), so an aligned request touches
/// one block and an unaligned one at most two.
pub const BLOCK_SIZE: u64 = 1 << 20;

/// Budget accounting shared by the cache and every cached file (files release on drop).
#[derive(Debug)]
pub struct Ledger {
    budget: u64,
    /// Bytes charged to the budget (stored size: compressed where packed).
    used: AtomicU64,
    /// Bytes of the file contents those blocks hold (before compression).
    logical: AtomicU64,
    /// Blocks by codec family: none, lz4, zstd.
    by_codec: [AtomicU64; 3],
    files: AtomicU64,
    complete_files: AtomicU64,
}

/// Index of a codec's family in `Ledger::by_codec`.
fn family(codec: Codec) -> usize {
    match codec {
        Codec::None => 0,
        Codec::Lz4 => 1,
        Codec::Zstd(_) => 2,
    }
}

impl Ledger {
    fn new(budget: u64) -> Ledger {
        Ledger {
            budget,
            used: AtomicU64::new(0),
            logical: AtomicU64::new(0),
            by_codec: Default::default(),
            files: AtomicU64::new(0),
            complete_files: AtomicU64::new(0),
        }
    }

    /// Counts a block of `logical` bytes stored with `codec` in (`added`) or out.
    fn count_block(&self, codec: Codec, logical: u64, added: bool) {
        let blocks = &self.by_codec[family(codec)];
        if added {
            blocks.fetch_add(1, Ordering::Relaxed);
            self.logical.fetch_add(logical, Ordering::Relaxed);
        } else {
            blocks.fetch_sub(1, Ordering::Relaxed);
            self.logical.fetch_sub(logical, Ordering::Relaxed);
        }
    }

    /// Reserves `bytes` if they fit under the budget; false (and nothing reserved) otherwise.
    fn try_reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|&total| total <= self.budget)
            })
            .is_ok()
    }

    /// Whether `bytes` would fit now (a hint: a concurrent admission may take the room first).
    fn has_room(&self, bytes: u64) -> bool {
        self.used.load(Ordering::Acquire).saturating_add(bytes) <= self.budget
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// What every cached file shares: the RAM budget, the counters, the packer and the disk tier.
pub(crate) struct Tiers {
    ledger: Ledger,
    metrics: Arc<Metrics>,
    packer: Arc<Packer>,
    disk: Option<DiskTier>,
}

/// CPU time this thread has used, in nanoseconds (for the codec CPU counters).
fn thread_cpu() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// The cache of one mount: cached files by identity, under hard budgets.
pub struct NeverEvictCache {
    tiers: Arc<Tiers>,
    files: ShardedMap<Identity, Arc<CachedFile>>,
    packer_thread: Option<JoinHandle<()>>,
}

impl NeverEvictCache {
    /// An empty cache holding at most `budget` bytes in RAM, packing with `policy`, over an
    /// optional disk tier. Starts the packer thread (without it, entries simply stay raw).
    pub fn new(
        budget: u64,
        policy: Box<dyn CodecPolicy>,
        telemetry: Arc<Telemetry>,
        disk: Option<DiskSetup>,
        metrics: Arc<Metrics>,
    ) -> NeverEvictCache {
        let packer = Arc::new(Packer::new(policy, telemetry, metrics.clone()));
        let disk = disk.map(|d| {
            DiskTier::start(
                d.dir,
                d.options,
                d.validate,
                packer.clone(),
                metrics.clone(),
            )
        });
        let packer_thread = if packer.enabled() {
            let p = packer.clone();
            std::thread::Builder::new()
                .name("prepfs-packer".into())
                .spawn(move || p.run())
                .inspect_err(
                    |e| tracing::warn!(error = %e, "cannot start the packer; entries stay raw"),
                )
                .ok()
        } else {
            None
        };
        NeverEvictCache {
            tiers: Arc::new(Tiers {
                ledger: Ledger::new(budget),
                metrics,
                packer,
                disk,
            }),
            files: ShardedMap::default(),
            packer_thread,
        }
    }

    /// The cache entry of one file version, created empty on first use. `path` (relative to the
    /// source root) is recorded in disk entries.
    pub fn file(&self, identity: Identity, path: &Path) -> Arc<CachedFile> {
        self.files.get_or_insert_with(identity, || {
            Arc::new(CachedFile::new(
                identity,
                Arc::from(path),
                self.tiers.clone(),
            ))
        })
    }

    /// The codec decision most recently taken, and why.
    pub fn codec_choice(&self) -> Choice {
        self.tiers.packer.last_choice()
    }

    /// The disk tier's figures, when there is one.
    pub fn disk_gauges(&self) -> Option<DiskGauges> {
        self.tiers.disk.as_ref().map(DiskTier::gauges)
    }

    /// Drops the entry of a file version that the source no longer has. Its memory returns to the
    /// budget once the last open handle on it is released.
    pub fn forget(&self, identity: &Identity) {
        self.files.remove(identity);
        if let Some(disk) = &self.tiers.disk {
            disk.forget(*identity);
        }
    }

    /// Current figures for the stats files.
    pub fn gauges(&self) -> Gauges {
        let ledger = &self.tiers.ledger;
        let by_codec = ledger
            .by_codec
            .each_ref()
            .map(|c| c.load(Ordering::Relaxed));
        let (pack_queue, repack_queue) = self.tiers.packer.queued();
        Gauges {
            cache_bytes: ledger.used.load(Ordering::Relaxed),
            cache_logical_bytes: ledger.logical.load(Ordering::Relaxed),
            cache_budget_bytes: ledger.budget,
            cache_blocks: by_codec.iter().sum(),
            cache_blocks_by_codec: by_codec,
            cache_files: ledger.files.load(Ordering::Relaxed),
            cache_complete_files: ledger.complete_files.load(Ordering::Relaxed),
            pack_queue: pack_queue as u64,
            repack_queue: repack_queue as u64,
            ..Gauges::default()
        }
    }
}

impl Drop for NeverEvictCache {
    fn drop(&mut self) {
        self.tiers.packer.stop();
        if let Some(thread) = self.packer_thread.take() {
            let _ = thread.join();
        }
    }
}
