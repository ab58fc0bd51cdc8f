//! `Tier`: a place below the RAM tier where blocks of file versions can be kept (the staging
//! buffer, the disk tier, the cluster tier), asked in order by `BlockFetcher`.
//!
//! Owns the seam and its fault-injecting double (`Faulty`, for tests): a tier that loses blocks,
//! refuses them, or hands back damaged ones, so the fetcher's handling of each is tested against
//! a model of the source. Must never decide anything about other tiers: a tier answers for
//! itself, and the fetcher decides what to ask and where to put.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::Block;
use crate::source::Identity;

/// Block `index` (of `BLOCK_SIZE` bytes) of the file version `identity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockKey {
    /// The file version.
    pub identity: Identity,
    /// The block number.
    pub index: usize,
}

/// Who asked for a block: a reader waits for it; prefetch fetches it ahead of the readers. The
/// fetcher keeps a block where its asker needs it; a tier that answers slowly may serve readers
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A reader waits for it.
    Reader,
    /// Prefetch, ahead of the readers.
    Prefetch,
}

/// One place blocks can be kept below the RAM tier.
pub trait Tier: Send + Sync {
    /// Short name for logs and stats ("staging", "disk").
    fn name(&self) -> &'static str;
    /// The block if this tier holds it intact (verified: a damaged copy is dropped and counted,
    /// and answers `None`). `path` is the file's path relative to the source root (what names a
    /// block between nodes); `range` is the part a reader wants now: a tier that keeps a block
    /// only until it is read (the staging buffer) lets go of it once `range` reaches its end.
    fn get(&self, key: &BlockKey, path: &Path, range: &Range<usize>) -> Option<Arc<Block>>;
    /// Offers a block fetched from below (`path`: the file's path, for tiers that record it);
    /// true when this tier keeps it. Never waits.
    fn put(&self, key: &BlockKey, path: &Arc<Path>, block: &Arc<Block>) -> bool;
    /// Whether a block of `bytes` offered now would be kept (a hint).
    fn has_room(&self, bytes: u64) -> bool;
    /// Like `get`, for `asker`, and whether a miss was only late: the tier did not answer in
    /// time and may hold the block (the cluster tier, which also keeps lookups made ahead of
    /// the readers from crowding out theirs). A fetch ahead of the readers leaves such a block
    /// to them instead of reading the source for it.
    fn lookup(
        &self,
        key: &BlockKey,
        path: &Path,
        range: &Range<usize>,
        _asker: Asker,
    ) -> (Option<Arc<Block>>, bool) {
        (self.get(key, path, range), false)
    }
    /// Whether the RAM tier may keep a copy of what this tier hands back (all but a cluster
    /// tier told otherwise: `--cluster-keep-hits off`).
    fn hits_kept_in_ram(&self) -> bool {
        true
    }
}

/// A fault-injecting tier for tests: wraps a real one and, by its switches, loses what it is
/// given, keeps nothing, or hands back blocks with a flipped byte (as a bad disk would; a real
/// tier's own checks must catch that).
#[cfg(test)]
pub mod faulty {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// The double.
    pub struct Faulty<T> {
        /// The tier it wraps.
        pub inner: T,
        /// Refuse every `put`.
        pub refuse: AtomicBool,
        /// Answer every `get` with nothing.
        pub lose: AtomicBool,
        /// Flip a byte of every block `get` returns.
        pub damage: AtomicBool,
        /// Say that the RAM tier must not keep what `get` returns (a cluster tier with
        /// `--cluster-keep-hits off`).
        pub not_in_ram: AtomicBool,
        /// Answer every lookup late (a cluster node that did not answer in time).
        pub late: AtomicBool,
        /// Gets answered.
        pub gets: AtomicU64,
    }

    impl<T> Faulty<T> {
        /// `inner`, behaving until a switch is flipped.
        pub fn new(inner: T) -> Faulty<T> {
            Faulty {
                inner,
                refuse: AtomicBool::new(false),
                lose: AtomicBool::new(false),
                damage: AtomicBool::new(false),
                not_in_ram: AtomicBool::new(false),
                late: AtomicBool::new(false),
                gets: AtomicU64::new(0),
            }
        }
    }

    impl<T: Tier> Tier for Faulty<T> {
        fn name(&self) -> &'static str {
            "faulty"
        }

        fn get(&self, key: &BlockKey, path: &Path, range: &Range<usize>) -> Option<Arc<Block>> {
            if self.lose.load(Ordering::Relaxed) {
                return None;
            }
            let block = self.inner.get(key, path, range)?;
            self.gets.fetch_add(1, Ordering::Relaxed);
            if !self.damage.load(Ordering::Relaxed) || block.data.is_empty() {
                return Some(block);
            }
            let mut data = block.data.to_vec();
            data[0] ^= 0x01;
            Some(Arc::new(Block {
                data: data.into_boxed_slice(),
                sums: block.sums.clone(),
            }))
        }

        fn put(&self, key: &BlockKey, path: &Arc<Path>, block: &Arc<Block>) -> bool {
            !self.refuse.load(Ordering::Relaxed) && self.inner.put(key, path, block)
        }

        fn has_room(&self, bytes: u64) -> bool {
            !self.refuse.load(Ordering::Relaxed) && self.inner.has_room(bytes)
        }

        fn lookup(
            &self,
            key: &BlockKey,
            path: &Path,
            range: &Range<usize>,
            _asker: Asker,
        ) -> (Option<Arc<Block>>, bool) {
            if self.late.load(Ordering::Relaxed) {
                return (None, true);
            }
            (self.get(key, path, range), false)
        }

        fn hits_kept_in_ram(&self) -> bool {
            !self.not_in_ram.load(Ordering::Relaxed)
        }
    }

    /// A tier that keeps every block it is given, in memory (a stand-in for the disk tier).
    #[derive(Default)]
    pub struct Memory {
        blocks: parking_lot::Mutex<std::collections::HashMap<BlockKey, Arc<Block>>>,
    }

    impl Tier for Memory {
        fn name(&self) -> &'static str {
            "memory"
        }

        fn get(&self, key: &BlockKey, _path: &Path, _range: &Range<usize>) -> Option<Arc<Block>> {
            self.blocks.lock().get(key).cloned()
        }

        fn put(&self, key: &BlockKey, _path: &Arc<Path>, block: &Arc<Block>) -> bool {
            self.blocks.lock().insert(*key, block.clone());
            true
        }

        fn has_room(&self, _bytes: u64) -> bool {
            true
        }
    }
}
