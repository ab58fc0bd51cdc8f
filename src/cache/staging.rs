//! `Staging`: the prefetch staging buffer, for blocks the never-evict tiers had no room for.
//!
//! Owns: blocks the prefetcher fetched ahead of the readers (keyed by file version and block, so a
//! changed file never finds them), charged to the memory budget's staging slice, and their
//! lifetime: room is reserved for a block before prefetch reads it (`reserve`), so a read ahead
//! never finds the slice full after the fact; a block is dropped once a reader has read it to its
//! end; when a new pass begins (`retire`), blocks staged before the ending pass and blocks of files
//! no pass is reading are dropped and counted as wasted (a walk that ran past the files the readers
//! read, into a directory of shards they never open, must not hold the room the next pass needs);
//! and under memory pressure every block is given back (`Shed`). A `Tier` below RAM: the fetcher
//! asks it before the disk tier and the source, and only prefetch offers it blocks. Must never
//! admit past its slice and never hand out bytes that fail their checksum.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Block;
use super::block;
use super::tier::{BlockKey, Tier};
use crate::cache::metrics::CacheMetrics;
use crate::memory::{MemoryBudget, Shed, Use};
use crate::shards::ShardedMap;
use crate::source::Identity;

struct Staged {
    block: Arc<Block>,
    /// The pass generation that staged it.
    generation: u64,
    /// The file it is of, relative to the source root.
    path: Arc<Path>,
}

impl Staged {
    fn len(&self) -> u64 {
        self.block.data.len() as u64
    }
}

/// Staging room reserved for one block being read; given back when dropped unused.
pub struct Room<'a> {
    staging: &'a Staging,
    bytes: u64,
}

impl Room<'_> {
    /// The reserved bytes now belong to a staged block, given back with it.
    fn keep(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        self.staging.budget.release(Use::Staging, self.bytes);
    }
}

/// The staging buffer.
pub struct Staging {
    budget: Arc<MemoryBudget>,
    generation: AtomicU64,
    blocks: ShardedMap<BlockKey, Arc<Staged>>,
    metrics: Arc<CacheMetrics>,
}

impl Staging {
    /// An empty buffer in `budget`'s staging slice (none: prefetch only into the cache).
    pub fn new(budget: Arc<MemoryBudget>, metrics: Arc<CacheMetrics>) -> Staging {
        Staging {
            budget,
            generation: AtomicU64::new(0),
            blocks: ShardedMap::default(),
            metrics,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.budget.used(Use::Staging)
    }

    /// The budget.
    pub fn budget(&self) -> u64 {
        self.budget.slice(Use::Staging)
    }

    /// Whether block `index` of `identity` is staged.
    pub fn contains(&self, identity: Identity, index: usize) -> bool {
        self.blocks.get(&BlockKey { identity, index }).is_some()
    }

    /// Room for one block of `bytes`, taken from the staging slice now (before the block is
    /// read), or `None` when the slice has none: prefetch reads a block only once it knows it
    /// can keep it. The room goes back when dropped unless `stage` used it.
    pub fn reserve(&self, bytes: u64) -> Option<Room<'_>> {
        // Lazily: a `Room` made and dropped on refusal would give back bytes never taken.
        self.budget.admit(Use::Staging, bytes).then(|| Room {
            staging: self,
            bytes,
        })
    }

    /// Stages `block` in `room` (reserved for it) or, without one, if the slice has room now;
    /// whether it is staged.
    pub fn stage(
        &self,
        key: &BlockKey,
        path: &Arc<Path>,
        block: &Arc<Block>,
        room: Option<Room<'_>>,
    ) -> bool {
        let len = block.data.len() as u64;
        match room {
            Some(room) if room.bytes == len => room.keep(),
            other => {
                drop(other);
                if !self.budget.admit(Use::Staging, len) {
                    return false;
                }
            }
        }
        let staged = Arc::new(Staged {
            block: block.clone(),
            generation: self.generation.load(Ordering::Acquire),
            path: path.clone(),
        });
        let kept = self.blocks.get_or_insert_with(*key, || staged.clone());
        if !Arc::ptr_eq(&kept, &staged) {
            // Staged already (by a racing prefetch): one copy is enough.
            self.budget.release(Use::Staging, len);
        }
        true
    }

    /// Starts a new pass. Blocks the ending pass staged of files a pass reads (`read`: the
    /// ending or the current pass of any file set opened it) stay, since the new pass reads the
    /// same files; blocks staged before it, or of files no pass opened, are dropped unread and
    /// counted as wasted.
    pub fn retire(&self, read: impl Fn(&Path) -> bool) {
        let ending = self.generation.fetch_add(1, Ordering::AcqRel);
        let freed = self.drop_where(|staged| staged.generation < ending || !read(&staged.path));
        self.metrics.staged_wasted_bytes.add(freed);
    }

    /// Drops the blocks `stale` picks; the bytes given back.
    fn drop_where(&self, stale: impl Fn(&Staged) -> bool) -> u64 {
        let gone = self.blocks.retain(|_, staged| !stale(staged));
        let freed = gone.iter().map(|staged| staged.len()).sum();
        // The blocks are freed here, outside the map's locks.
        drop(gone);
        self.budget.release(Use::Staging, freed);
        freed
    }

    fn remove(&self, key: &BlockKey, staged: &Arc<Staged>) {
        if self
            .blocks
            .remove_if(key, |v| Arc::ptr_eq(v, staged))
            .is_some()
        {
            self.budget.release(Use::Staging, staged.len());
        }
    }
}

impl Tier for Staging {
    fn name(&self) -> &'static str {
        "staging"
    }

    /// The staged block, verified for `range`; dropped once `range` reaches its end.
    fn get(&self, key: &BlockKey, _path: &Path, range: &Range<usize>) -> Option<Arc<Block>> {
        let staged = self.blocks.get(key)?;
        let block = staged.block.clone();
        if !block::verify(&block.data, &block.sums, range.clone()) {
            self.metrics.integrity_errors.inc();
            tracing::warn!(
                block = key.index,
                "staged block failed its checksum; dropped"
            );
            self.remove(key, &staged);
            return None;
        }
        self.metrics.staged_reads.inc();
        if range.end >= block.data.len() {
            self.remove(key, &staged);
        }
        Some(block)
    }

    fn put(&self, key: &BlockKey, path: &Arc<Path>, block: &Arc<Block>) -> bool {
        self.stage(key, path, block, None)
    }

    fn has_room(&self, bytes: u64) -> bool {
        self.budget.has_room(Use::Staging, bytes)
    }
}

impl Shed for Staging {
    /// Every staged block: each can be fetched again (a reader being served one holds its own
    /// reference to the bytes).
    fn shed(&self) -> u64 {
        self.drop_where(|_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryPlan;

    fn key(index: usize) -> BlockKey {
        BlockKey {
            identity: Identity {
                dev: 1,
                ino: 2,
                size: 3 << 20,
                mtime_ns: 4,
                ctime_ns: 5,
            },
            index,
        }
    }

    fn staging(slice: u64) -> Staging {
        let budget = MemoryBudget::new(MemoryPlan {
            cache: 0,
            staging: slice,
            work: 0,
        });
        Staging::new(budget, Arc::new(CacheMetrics::default()))
    }

    #[test]
    fn a_staged_block_is_read_once_to_its_end_then_dropped_and_never_past_the_slice() {
        let s = staging(2000);
        let path: Arc<Path> = Arc::from(Path::new("f"));
        let block = Arc::new(Block::new(vec![7; 1000]));
        assert!(s.put(&key(0), &path, &block));
        assert!(s.put(&key(1), &path, &block));
        assert!(!s.put(&key(2), &path, &block), "the slice is full");
        assert!(s.get(&key(0), Path::new(""), &(0..10)).is_some());
        assert!(s.contains(key(0).identity, 0), "a partial read keeps it");
        assert!(s.get(&key(0), Path::new(""), &(10..1000)).is_some());
        assert!(!s.contains(key(0).identity, 0), "read to its end: dropped");
        assert_eq!(s.bytes(), 1000);
        s.retire(|_| true);
        assert!(
            s.contains(key(1).identity, 1),
            "staged by the ending pass: kept"
        );
        s.retire(|_| true);
        assert!(!s.contains(key(1).identity, 1), "two passes unread: wasted");
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn blocks_of_files_no_pass_read_are_dropped_when_the_next_pass_begins() {
        let s = staging(1 << 20);
        let block = Arc::new(Block::new(vec![7; 1000]));
        let (read, shard): (Arc<Path>, Arc<Path>) = (
            Arc::from(Path::new("samples/1.jpg")),
            Arc::from(Path::new("shards/0.tar")),
        );
        assert!(s.put(&key(0), &read, &block));
        assert!(s.put(&key(1), &shard, &block));
        s.retire(|p| p.starts_with("samples"));
        assert!(s.contains(key(0).identity, 0), "the next pass reads it");
        assert!(!s.contains(key(1).identity, 1), "no pass read it: wasted");
        assert_eq!(s.bytes(), 1000);
        assert_eq!(s.metrics.staged_wasted_bytes.get(), 1000);
    }

    #[test]
    fn a_damaged_staged_block_is_dropped_and_counted() {
        let s = staging(1 << 20);
        let path: Arc<Path> = Arc::from(Path::new("f"));
        let mut bytes = vec![3u8; 4096];
        let sums = block::checksums(&bytes);
        bytes[5] ^= 1;
        let damaged = Arc::new(Block {
            data: bytes.into_boxed_slice(),
            sums,
        });
        assert!(s.put(&key(0), &path, &damaged));
        assert!(s.get(&key(0), Path::new(""), &(0..100)).is_none());
        assert_eq!(s.metrics.integrity_errors.get(), 1);
        assert_eq!(s.bytes(), 0);
        assert!(s.put(&key(1), &path, &damaged));
        assert_eq!(s.shed(), 4096);
    }
}
