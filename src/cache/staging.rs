//! `Staging`: the prefetch staging buffer, for blocks the never-evict tiers had no room for.
//!
//! Owns: blocks the prefetcher fetched ahead of the readers (keyed by file version and block, so
//! a changed file never finds them), charged to the memory budget's staging slice, and their
//! lifetime: a block is dropped once a reader has read it to its end, blocks a pass staged but
//! never read are dropped when the next pass begins (`retire`, counted as wasted), and under
//! memory pressure every block nobody waits on is given back (`Shed`). A reader that asks for a
//! block still being fetched waits for that fetch instead of starting another. Must never admit
//! past its slice, never hand out bytes that fail their checksum, never drop a block a reader is
//! waiting on, and never hold a lock while fetching.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Block;
use super::block;
use super::file::Flight;
use crate::error::FsError;
use crate::memory::{MemoryBudget, Shed, Use};
use crate::shards::ShardedMap;
use crate::source::Identity;
use crate::stats::Metrics;

struct Staged {
    flight: Flight,
    /// Bytes charged to the budget.
    len: u64,
    /// The pass generation that staged it.
    generation: u64,
}

/// The staging buffer.
pub struct Staging {
    budget: Arc<MemoryBudget>,
    generation: AtomicU64,
    blocks: ShardedMap<(Identity, usize), Arc<Staged>>,
    metrics: Arc<Metrics>,
}

impl Staging {
    /// An empty buffer in `budget`'s staging slice (none: prefetch only into the cache).
    pub fn new(budget: Arc<MemoryBudget>, metrics: Arc<Metrics>) -> Staging {
        Staging {
            budget,
            generation: AtomicU64::new(0),
            blocks: ShardedMap::default(),
            metrics,
        }
    }

    /// Bytes held or reserved for fetches in flight.
    pub fn bytes(&self) -> u64 {
        self.budget.used(Use::Staging)
    }

    /// The budget.
    pub fn budget(&self) -> u64 {
        self.budget.slice(Use::Staging)
    }

    /// Whether `len` more bytes fit now.
    pub fn has_room(&self, len: u64) -> bool {
        self.budget.has_room(Use::Staging, len)
    }

    /// Whether block `index` of `identity` is staged or being staged.
    pub fn contains(&self, identity: Identity, index: usize) -> bool {
        self.blocks.get(&(identity, index)).is_some()
    }

    /// Stages block `index` of `identity` (`len` bytes) with `load`, unless it is staged already
    /// or does not fit; true when `load` ran and succeeded.
    pub fn fill(
        &self,
        identity: Identity,
        index: usize,
        len: u64,
        load: impl FnOnce() -> Result<Arc<Block>, FsError>,
    ) -> bool {
        if !self.budget.admit(Use::Staging, len) {
            return false;
        }
        let staged = Arc::new(Staged {
            flight: Flight::default(),
            len,
            generation: self.generation.load(Ordering::Acquire),
        });
        let key = (identity, index);
        let winner = self.blocks.get_or_insert_with(key, || staged.clone());
        if !Arc::ptr_eq(&winner, &staged) {
            self.budget.release(Use::Staging, len);
            return false;
        }
        let result = load();
        let ok = result.is_ok();
        staged.flight.finish(result);
        if !ok {
            self.remove(&key, &staged);
        }
        ok
    }

    /// The staged copy of `range` of block `index`, waiting for a fetch in flight; the block is
    /// dropped once `range` reaches its end. `None`: not staged, failed, or damaged.
    pub fn take(
        &self,
        identity: Identity,
        index: usize,
        range: &Range<usize>,
    ) -> Option<Arc<Block>> {
        let key = (identity, index);
        let staged = self.blocks.get(&key)?;
        let block = staged.flight.wait().ok()?;
        if !block::verify(&block.data, &block.sums, range.clone()) {
            self.metrics.integrity_errors.inc();
            tracing::warn!(block = index, "staged block failed its checksum; dropped");
            self.remove(&key, &staged);
            return None;
        }
        self.metrics.prefetch_staged_reads.inc();
        if range.end >= block.data.len() {
            self.remove(&key, &staged);
        }
        Some(block)
    }

    /// Starts a new pass. Blocks the ending pass staged stay (the new pass reads the same files);
    /// blocks staged before it and still not read to their end are dropped and counted as wasted.
    pub fn retire(&self) {
        let ending = self.generation.fetch_add(1, Ordering::AcqRel);
        let mut freed = 0;
        self.blocks.retain(|_, staged| {
            let keep = staged.generation >= ending || !staged.flight.is_done();
            if !keep {
                freed += staged.len;
            }
            keep
        });
        if freed > 0 {
            self.budget.release(Use::Staging, freed);
            self.metrics.prefetch_wasted_bytes.add(freed);
        }
    }

    fn remove(&self, key: &(Identity, usize), staged: &Arc<Staged>) {
        if self.blocks.remove_if(key, |v| Arc::ptr_eq(v, staged)) {
            self.budget.release(Use::Staging, staged.len);
        }
    }
}

impl Shed for Staging {
    /// Every staged block whose fetch is done and that no reader is taking now.
    fn shed(&self) -> u64 {
        let mut freed = 0;
        self.blocks.retain(|_, staged| {
            let keep = Arc::strong_count(staged) > 1 || !staged.flight.is_done();
            if !keep {
                freed += staged.len;
            }
            keep
        });
        self.budget.release(Use::Staging, freed);
        freed
    }
}
