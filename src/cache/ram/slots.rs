//! `Slots`: the per-block state of one cached file, dense for files of ordinary size and sparse
//! for huge ones.
//!
//! Owns: where a block's slot lives and its lock. A file of one block (most samples of an image
//! dataset) has its slot inline, with no allocation of its own; one of up to `DENSE_MAX` blocks
//! has an array of slots, one lock each; a larger one (a 15 TiB sparse file, a 100 GB LMDB) has slots only for
//! the blocks in use, in a sharded map that drops a slot once it is vacant again, so memory
//! follows what is held, never the size the source reports. Must never allocate by the file's
//! size beyond `DENSE_MAX` slots, and never call out while holding a slot's lock (callers get
//! the slot inside a closure).

use std::collections::HashMap;
use std::mem::size_of;

use parking_lot::Mutex;

/// Blocks (1 MiB each: 16 GiB) up to which a file's slots are one array: at most a few hundred
/// KiB of bookkeeping, charged to the budget with the file.
pub const DENSE_MAX: usize = 16 << 10;
/// Locks of a sparse file's map: enough that readers of different blocks rarely meet.
const SHARDS: usize = 16;

/// A slot that can tell whether it holds anything (a vacant sparse slot is dropped).
pub trait Vacant {
    /// True when the slot holds nothing and nothing is in flight.
    fn is_vacant(&self) -> bool;
}

/// The slots of one file's blocks.
pub enum Slots<T> {
    /// The one block's slot, inline.
    One(Mutex<T>),
    /// One locked slot per block.
    Dense(Box<[Mutex<T>]>),
    /// Slots of the blocks in use only.
    Sparse {
        /// Blocks of the file.
        len: usize,
        /// Block index -> slot, by `index % SHARDS`.
        shards: Box<[Mutex<HashMap<usize, T>>]>,
    },
}

impl<T: Default + Vacant> Slots<T> {
    /// Slots for a file of `len` blocks.
    pub fn new(len: usize) -> Slots<T> {
        if len == 1 {
            Slots::One(Mutex::new(T::default()))
        } else if len <= DENSE_MAX {
            Slots::Dense((0..len).map(|_| Mutex::new(T::default())).collect())
        } else {
            Slots::Sparse {
                len,
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            }
        }
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        match self {
            Slots::One(_) => 1,
            Slots::Dense(slots) => slots.len(),
            Slots::Sparse { len, .. } => *len,
        }
    }

    /// Whether every slot is in one array (so walking all blocks is cheap).
    pub fn is_dense(&self) -> bool {
        matches!(self, Slots::One(_) | Slots::Dense(_))
    }

    /// Bytes of bookkeeping these slots take before any block is held.
    #[cfg(test)]
    pub fn overhead(&self) -> u64 {
        Self::overhead_of(self.len())
    }

    /// Bytes of bookkeeping the slots of a file of `len` blocks take before any block is held
    /// (as `new` lays them out).
    pub fn overhead_of(len: usize) -> u64 {
        if len == 1 {
            // Inline: part of the entry itself.
            0
        } else if len <= DENSE_MAX {
            (len * size_of::<Mutex<T>>()) as u64
        } else {
            (SHARDS * size_of::<Mutex<HashMap<usize, T>>>()) as u64
        }
    }

    /// Runs `f` on block `index`'s slot under its lock; `None` past the last block.
    pub fn with<R>(&self, index: usize, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        match self {
            Slots::One(slot) => (index == 0).then(|| f(&mut slot.lock())),
            Slots::Dense(slots) => slots.get(index).map(|s| f(&mut s.lock())),
            Slots::Sparse { len, shards } => {
                if index >= *len {
                    return None;
                }
                let mut shard = shards[index % SHARDS].lock();
                let slot = shard.entry(index).or_default();
                let result = f(slot);
                if slot.is_vacant() {
                    shard.remove(&index);
                }
                Some(result)
            }
        }
    }

    /// Calls `f` with every slot that is not vacant (for a drop: exclusive access).
    pub fn for_each_held(&mut self, mut f: impl FnMut(usize, &mut T)) {
        match self {
            Slots::One(slot) => f(0, slot.get_mut()),
            Slots::Dense(slots) => slots
                .iter_mut()
                .enumerate()
                .for_each(|(i, s)| f(i, s.get_mut())),
            Slots::Sparse { shards, .. } => shards
                .iter_mut()
                .flat_map(|s| s.get_mut().iter_mut())
                .for_each(|(i, s)| f(*i, s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Cell(Option<u32>);
    impl Vacant for Cell {
        fn is_vacant(&self) -> bool {
            self.0.is_none()
        }
    }

    #[test]
    fn a_huge_file_holds_slots_only_for_blocks_in_use() {
        // 4 EiB: an array of slots would not fit in any machine.
        let slots: Slots<Cell> = Slots::new(1 << 42);
        assert!(!slots.is_dense() && slots.overhead() < 4096);
        assert_eq!(slots.with(7, |c| c.0.replace(3)), Some(None));
        assert_eq!(slots.with(7, |c| c.0), Some(Some(3)));
        assert_eq!(slots.with(1 << 42, |c| c.0), None, "past the end");
        let held = |s: &mut Slots<Cell>| {
            let mut n = 0;
            s.for_each_held(|_, _| n += 1);
            n
        };
        let mut slots = slots;
        assert_eq!(slots.with(9, |c| c.0), Some(None));
        assert_eq!(held(&mut slots), 1, "a looked-at vacant slot is not kept");
        slots.with(7, |c| c.0 = None);
        assert_eq!(held(&mut slots), 0);
        let dense: Slots<Cell> = Slots::new(3);
        assert!(dense.is_dense() && dense.len() == 3);
        let mut one: Slots<Cell> = Slots::new(1);
        assert!(one.is_dense() && one.len() == 1 && one.overhead() == 0);
        assert_eq!(one.with(0, |c| c.0.replace(5)), Some(None));
        assert_eq!(one.with(1, |c| c.0), None, "past the end");
        let mut seen = Vec::new();
        one.for_each_held(|i, c| seen.push((i, c.0)));
        assert_eq!(seen, [(0, Some(5))]);
    }
}
