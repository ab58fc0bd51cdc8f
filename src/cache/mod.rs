//! The never-evict ("MinIO", after CoorDL) RAM cache.
//!
//! Owns: which bytes of which file version are held in memory, the hard byte budget, checksums
//! and single-flight fetching. Data is admitted until the budget is full; after that nothing is
//! evicted and nothing more is admitted, so a random-order epoch misses exactly what did not fit
//! instead of thrashing like an LRU. Entries are keyed by source `Identity`: a changed file is a
//! different key, and its old entry is dropped by `forget`. Cache failures (no memory, memfd
//! refused, checksum mismatch) become misses and counters, never errors for the reader. Must
//! never evict to make room, and never take a cache-wide lock on the read path.

mod block;
mod file;
mod memfd;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use block::Block;
pub use file::{CachedFile, ReadBytes};

use crate::shards::ShardedMap;
use crate::source::Identity;
use crate::stats::{Gauges, Metrics};

/// Cache block size. Equal to the largest FUSE read (256 pages), so an aligned request touches
/// one block and an unaligned one at most two.
pub const BLOCK_SIZE: u64 = 1 << 20;

/// Budget accounting shared by the cache and every cached file (files release on drop).
#[derive(Debug)]
pub struct Ledger {
    budget: u64,
    used: AtomicU64,
    blocks: AtomicU64,
    files: AtomicU64,
    complete_files: AtomicU64,
}

impl Ledger {
    fn new(budget: u64) -> Ledger {
        Ledger {
            budget,
            used: AtomicU64::new(0),
            blocks: AtomicU64::new(0),
            files: AtomicU64::new(0),
            complete_files: AtomicU64::new(0),
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

/// The RAM tier: cached files by identity, under one hard budget.
pub struct NeverEvictCache {
    ledger: Arc<Ledger>,
    files: ShardedMap<Identity, Arc<CachedFile>>,
    metrics: Arc<Metrics>,
}

impl NeverEvictCache {
    /// An empty cache that will hold at most `budget` bytes.
    pub fn new(budget: u64, metrics: Arc<Metrics>) -> NeverEvictCache {
        NeverEvictCache {
            ledger: Arc::new(Ledger::new(budget)),
            files: ShardedMap::default(),
            metrics,
        }
    }

    /// The cache entry of one file version, created empty on first use.
    pub fn file(&self, identity: Identity) -> Arc<CachedFile> {
        self.files.get_or_insert_with(identity, || {
            Arc::new(CachedFile::new(
                identity,
                self.ledger.clone(),
                self.metrics.clone(),
            ))
        })
    }

    /// Drops the entry of a file version that the source no longer has. Its memory returns to the
    /// budget once the last open handle on it is released.
    pub fn forget(&self, identity: &Identity) {
        self.files.remove(identity);
    }

    /// Current figures for the stats files.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            cache_bytes: self.ledger.used.load(Ordering::Relaxed),
            cache_budget_bytes: self.ledger.budget,
            cache_blocks: self.ledger.blocks.load(Ordering::Relaxed),
            cache_files: self.ledger.files.load(Ordering::Relaxed),
            cache_complete_files: self.ledger.complete_files.load(Ordering::Relaxed),
            ..Gauges::default()
        }
    }
}
