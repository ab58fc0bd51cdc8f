//! `ShardedMap`: a hash map split over independently locked shards.
//!
//! Owns: the sharding. It exists so that no request path takes a lock shared by the whole mount:
//! two requests contend only when their keys land in the same shard. Must never hold a shard lock
//! while calling out (values are cloned out; callers work on the clone).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};

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

    /// Removes the value under `key` if `matches` it; true when it did.
    pub fn remove_if(&self, key: &K, matches: impl FnOnce(&V) -> bool) -> bool {
        let mut shard = self.shard(key).write();
        if shard.get(key).is_some_and(matches) {
            shard.remove(key);
            return true;
        }
        false
    }

    /// Keeps the entries for which `keep` returns true, one shard at a time (not a consistent cut).
    pub fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) {
        for shard in self.shards.iter() {
            shard.write().retain(|k, v| keep(k, v));
        }
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
