//! `ShardedMap`: a hash map split over independently locked shards; `ShardedSet`, the same for
//! values that carry their own key (stored once, in the value).
//!
//! Owns: the sharding. It exists so that no request path takes a lock shared by the whole mount:
//! two requests contend only when their keys land in the same shard. Must never hold a shard lock
//! while calling out (values are cloned out; callers work on the clone).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;
use parking_lot::RwLock;

/// Shards per map: well above the number of threads that serve requests, so collisions are rare.
const SHARDS: usize = 64;

/// A concurrent map of cheaply clonable values (usually `Arc`s).
pub struct ShardedMap<K, V> {
    hasher: RandomState,
    shards: Box<[RwLock<HashMap<K, V>>]>,
}

impl<K: Hash + Eq, V: Clone> Default for ShardedMap<K, V> {
    fn default() -> Self {
        ShardedMap {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
        }
    }
}

impl<K: Hash + Eq, V: Clone> ShardedMap<K, V> {
    fn shard(&self, key: &K) -> &RwLock<HashMap<K, V>> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        &self.shards[index]
    }

    /// The value under `key`, cloned out of the shard.
    pub fn get(&self, key: &K) -> Option<V> {
        self.shard(key).read().get(key).cloned()
    }

    /// The value under `key`, inserting `make()` first if there is none.
    pub fn get_or_insert_with(&self, key: K, make: impl FnOnce() -> V) -> V {
        if let Some(v) = self.get(&key) {
            return v;
        }
        self.shard(&key)
            .write()
            .entry(key)
            .or_insert_with(make)
            .clone()
    }

    /// Inserts or replaces the value under `key`.
    pub fn insert(&self, key: K, value: V) {
        self.shard(&key).write().insert(key, value);
    }

    /// Removes and returns the value under `key`.
    pub fn remove(&self, key: &K) -> Option<V> {
        self.shard(key).write().remove(key)
    }

    /// Removes the value under `key` if `matches` it, and returns it (dropped by the caller,
    /// outside the shard's lock).
    pub fn remove_if(&self, key: &K, matches: impl FnOnce(&V) -> bool) -> Option<V> {
        let mut shard = self.shard(key).write();
        if shard.get(key).is_some_and(matches) {
            return shard.remove(key);
        }
        None
    }

    /// Keeps the entries for which `keep` returns true, one shard at a time (not a consistent
    /// cut); the values let go are returned, so they are dropped outside the shards' locks.
    pub fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) -> Vec<V> {
        self.take(|k, v| if keep(k, v) { Pick::Keep } else { Pick::Take })
    }

    /// Removes the entries `pick` takes, one shard at a time (not a consistent cut), looking at
    /// no more once it answers `Pick::Done`: the values taken are returned, to be dropped
    /// outside the shards' locks.
    pub fn take(&self, mut pick: impl FnMut(&K, &V) -> Pick) -> Vec<V> {
        let mut taken = Vec::new();
        let done = std::cell::Cell::new(false);
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            // Once done, the rest of this shard is passed over without a look (the iterator
            // still steps through it), and the shards after it are not visited.
            taken.extend(
                shard
                    .extract_if(|k, v| !done.get() && picked(pick(k, v), &done))
                    .map(|(_, v)| v),
            );
            drop(shard);
            if done.get() {
                break;
            }
        }
        taken
    }

    /// Number of entries (sums the shards; a snapshot, not a consistent cut).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// Whether the map holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What `take` (of a `ShardedMap` or a `ShardedSet`) does with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Leave it.
    Keep,
    /// Remove it and return it.
    Take,
    /// Leave it and look at no more.
    Done,
}

/// Whether `pick` takes the entry; `Done` takes none and marks `done`.
fn picked(pick: Pick, done: &std::cell::Cell<bool>) -> bool {
    match pick {
        Pick::Keep => false,
        Pick::Take => true,
        Pick::Done => {
            done.set(true);
            false
        }
    }
}

/// A value that carries the key it is found by.
pub trait Keyed {
    /// What it is found by.
    type Key: Hash + Eq;
    /// Its key.
    fn key(&self) -> &Self::Key;
}

impl<T: Keyed> Keyed for Arc<T> {
    type Key = T::Key;

    fn key(&self) -> &T::Key {
        (**self).key()
    }
}

/// A concurrent set of cheaply clonable values found by the key each carries: a map whose key
/// is not stored a second time beside its value (a million cached files' 40-byte identities).
pub struct ShardedSet<V> {
    hasher: RandomState,
    shards: Box<[RwLock<HashTable<V>>]>,
}

impl<V: Keyed + Clone> Default for ShardedSet<V> {
    fn default() -> Self {
        ShardedSet {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| RwLock::new(HashTable::new())).collect(),
        }
    }
}

impl<V: Keyed + Clone> ShardedSet<V> {
    /// The key's hash and its shard. The shard comes from middle bits of the hash: the table
    /// takes its buckets from the low ones and its tags from the top ones.
    fn place(&self, key: &V::Key) -> (u64, &RwLock<HashTable<V>>) {
        let hash = self.hasher.hash_one(key);
        (hash, &self.shards[(hash >> 32) as usize % SHARDS])
    }

    fn rehash(&self) -> impl Fn(&V) -> u64 + '_ {
        |v| self.hasher.hash_one(v.key())
    }

    /// The value found by `key`, cloned out of the shard.
    pub fn get(&self, key: &V::Key) -> Option<V> {
        let (hash, shard) = self.place(key);
        shard.read().find(hash, |v| v.key() == key).cloned()
    }

    /// The value found by `key`, inserting `make()` (whose key must be `key`) first if there is
    /// none.
    pub fn get_or_insert_with(&self, key: &V::Key, make: impl FnOnce() -> V) -> V {
        if let Some(v) = self.get(key) {
            return v;
        }
        let (hash, shard) = self.place(key);
        shard
            .write()
            .entry(hash, |v| v.key() == key, self.rehash())
            .or_insert_with(make)
            .get()
            .clone()
    }

    /// Removes and returns the value found by `key`.
    pub fn remove(&self, key: &V::Key) -> Option<V> {
        let (hash, shard) = self.place(key);
        let mut shard = shard.write();
        let found = shard.find_entry(hash, |v| v.key() == key).ok()?;
        Some(found.remove().0)
    }

    /// Keeps the values for which `keep` returns true, one shard at a time (not a consistent
    /// cut); the values let go are returned, so they are dropped outside the shards' locks.
    pub fn retain(&self, mut keep: impl FnMut(&V) -> bool) -> Vec<V> {
        self.take(|v| if keep(v) { Pick::Keep } else { Pick::Take })
    }

    /// Removes the values `pick` takes, one shard at a time (not a consistent cut), looking at
    /// no more once it answers `Pick::Done`; the values taken are returned, to be dropped
    /// outside the shards' locks.
    pub fn take(&self, mut pick: impl FnMut(&V) -> Pick) -> Vec<V> {
        let mut taken = Vec::new();
        let done = std::cell::Cell::new(false);
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            // Once done, the rest of this shard is passed over without a look.
            taken.extend(shard.extract_if(|v| !done.get() && picked(pick(v), &done)));
            drop(shard);
            if done.get() {
                break;
            }
        }
        taken
    }

    /// Removes the value found by `key` if `matches` it, and returns it (dropped by the caller,
    /// outside the shard's lock: a cached file's last reference frees its blocks).
    pub fn remove_if(&self, key: &V::Key, matches: impl FnOnce(&V) -> bool) -> Option<V> {
        let (hash, shard) = self.place(key);
        let mut shard = shard.write();
        match shard.find_entry(hash, |v| v.key() == key) {
            Ok(found) if matches(found.get()) => Some(found.remove().0),
            _ => None,
        }
    }

    /// Number of values (sums the shards; a snapshot, not a consistent cut).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// Whether the set holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Entry {
        id: u64,
        payload: String,
    }

    impl Keyed for Entry {
        type Key = u64;
        fn key(&self) -> &u64 {
            &self.id
        }
    }

    fn entry(id: u64) -> Entry {
        Entry {
            id,
            payload: format!("v{id}"),
        }
    }

    #[test]
    fn a_set_finds_each_value_by_the_key_it_carries_through_growth_and_removal() {
        let set: ShardedSet<Arc<Entry>> = ShardedSet::default();
        for id in 0..20_000 {
            let made = set.get_or_insert_with(&id, || Arc::new(entry(id)));
            assert_eq!(made.id, id);
        }
        assert_eq!(set.len(), 20_000);
        // A second insert keeps the first value.
        let kept = set.get_or_insert_with(&7, || {
            Arc::new(Entry {
                id: 7,
                payload: "new".into(),
            })
        });
        assert_eq!(kept.payload, "v7");
        for id in (0..20_000).step_by(2) {
            assert_eq!(set.remove(&id).map(|e| e.id), Some(id));
        }
        assert_eq!(set.remove(&0), None);
        assert!(
            set.remove_if(&1, |_| false).is_none(),
            "kept when it does not match"
        );
        assert_eq!(
            set.remove_if(&1, |e| e.payload == "v1").map(|e| e.id),
            Some(1)
        );
        assert!(set.get(&1).is_none() && set.get(&2).is_none());
        assert!(
            (3..20_000)
                .step_by(2)
                .all(|id| set.get(&id).is_some_and(|e| e.id == id))
        );
        assert_eq!(set.len(), 9_999);
        assert!(!set.is_empty());
    }

    #[test]
    fn take_returns_what_it_picks_and_looks_at_no_more_once_done() {
        let map: ShardedMap<u64, Arc<Entry>> = ShardedMap::default();
        for id in 0..10_000 {
            map.insert(id, Arc::new(entry(id)));
        }
        // Without `Done`, every entry is looked at: odd ids kept, even ones taken.
        let mut looked = 0;
        let taken = map.take(|id, _| {
            looked += 1;
            if id % 2 == 1 { Pick::Keep } else { Pick::Take }
        });
        assert_eq!(looked, 10_000);
        assert_eq!(taken.len(), 5_000);
        assert!(taken.iter().all(|e| e.id % 2 == 0));
        assert_eq!(map.len(), 5_000);
        assert!(map.get(&2).is_none() && map.get(&3).is_some());

        // With it, nothing after the first `Done` is looked at, and what was not taken stays.
        let (mut looked, mut wanted) = (0, 100);
        let taken = map.take(|_, _| {
            looked += 1;
            if wanted == 0 {
                return Pick::Done;
            }
            wanted -= 1;
            Pick::Take
        });
        assert_eq!((looked, taken.len(), map.len()), (101, 100, 4_900));

        // `retain` returns what it let go.
        let gone = map.retain(|id, _| *id < 5_000);
        assert!(gone.iter().all(|e| e.id >= 5_000));
        assert_eq!(gone.len() + map.len(), 4_900);

        // A set's take alike.
        let set: ShardedSet<Arc<Entry>> = ShardedSet::default();
        for id in 0..1_000 {
            set.get_or_insert_with(&id, || Arc::new(entry(id)));
        }
        let (mut looked, mut wanted) = (0, 10);
        let taken = set.take(|_| {
            looked += 1;
            if wanted == 0 {
                return Pick::Done;
            }
            wanted -= 1;
            Pick::Take
        });
        assert_eq!((looked, taken.len(), set.len()), (11, 10, 990));
        assert!(taken.iter().all(|e| set.get(&e.id).is_none()));
    }
}
