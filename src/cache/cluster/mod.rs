//! `ClusterTier`: a partitioned never-evict cache shared by the nodes of a training job, on a
//! Redis Cluster (CoorDL's partitioned MinIO cache on an existing distributed engine), asked by
//! the fetcher after the local tiers and before the source.
//!
//! Owns: the tier's requests (a lookup waits at most `--cluster-timeout`, then is a miss; an offer
//! is queued and never waited for), its threads (bounded lookup pools, the readers' and a smaller
//! one for prefetch, so that lookups ahead of the readers never crowd theirs out; a bounded writer
//! pool; the slot-map thread), the keys and values (`record`), node health (`health`: backoff after
//! failures, no writes to full nodes) and the figures (`metrics`). Redis Cluster's hash slots
//! spread the blocks over its nodes; SET NX lets the first node that fetched a block store it;
//! nodes run `maxmemory` with `noeviction`, so a full cluster refuses new keys (never-evict by
//! construction) and prepfs stops offering to it. The cluster is best effort: a node that is down,
//! slow, full or returns damaged bytes costs misses and counters, never a failed or late read.
//! Must never run a request on a FUSE thread, wait past the timeout, hold a lock while a request
//! runs, or serve a value whose checks failed.

pub mod health;
pub mod metrics;
pub mod record;
pub mod remote;

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::sync_channel;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use self::health::Health;
use self::metrics::ClusterMetrics;
use self::remote::{Remote, RemoteError, Stored};
use super::ram::Packer;
use super::tier::{Asker, BlockKey, Tier};
use super::{BLOCK_SIZE, Block};
use crate::memory::MemoryBudget;
use crate::workers::WorkerPool;

pub use self::remote::{Credentials, RedisCluster};

/// Default `--cluster-timeout`: a lookup of a 1 MiB block takes about a millisecond on a
/// 10 Gbit/s link, a source read of one from network storage several; past this a lookup is not
/// worth waiting for.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// Shortest and longest `--cluster-timeout`.
pub const TIMEOUT_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(2)..=Duration::from_secs(10);
/// Readers' lookup threads: each waits on the network, so a few more than the readers that miss
/// at once.
const LOOKUP_THREADS: usize = 8;
/// Readers' lookups queued beyond the busy threads; a lookup that finds the queue full is a miss
/// at once.
const LOOKUP_QUEUE: usize = 8;
/// Lookups made ahead of the readers (prefetch) in flight at once, on a thread of their own: a
/// reader's block shares the node's link with at most this one. The link is what bounds
/// prefetch from the cluster anyway. Measured on 1 Gbit/s links (8 ms per 1 MiB block): the four
/// default prefetch threads sharing the readers' pool left 3 to 7 readers' lookups per run of 4
/// epochs past the 50 ms timeout; two in flight, 0 to 3; one, 1 in 9 runs (BENCHMARKS-HISTORY.md).
const AHEAD_THREADS: usize = 1;
/// Prefetch lookups queued beyond that one (each waits at most the timeout); one that finds the
/// queue full is left to the readers.
const AHEAD_QUEUE: usize = 3;
/// Writer threads (each compresses a block, then sends it).
const WRITE_THREADS: usize = 2;
/// Offers queued for the writers (a block each, charged to the memory budget); more are dropped.
const WRITE_QUEUE: usize = 16;
/// How often the slot map is read again (a failover or reshard moves slots; a stale map only
/// makes a backoff cover the wrong slots for this long).
const MAP_REFRESH: Duration = Duration::from_secs(10);
/// Keys found damaged, remembered so that the next offer of their block overwrites them.
const DAMAGED_KEYS: usize = 1024;

/// The cluster tier's configuration (`--cluster`, `--cluster-auth`, `--cluster-timeout`,
/// `--cluster-dataset`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// Nodes to reach the cluster at (`redis://host:port` or `rediss://` for TLS).
    pub urls: Vec<String>,
    /// File with the password (or user and password).
    pub auth: Option<PathBuf>,
    /// How long a lookup may keep a reader waiting.
    pub timeout: Duration,
    /// What names this dataset in the cluster: the same on every node that shares it.
    pub dataset: String,
    /// Whether this node's RAM tier keeps a copy of the blocks the cluster hands it.
    pub keep_hits: bool,
}

/// The tier.
pub struct ClusterTier {
    remote: Arc<dyn Remote>,
    dataset: u64,
    timeout: Duration,
    keep_hits: bool,
    health: Arc<Health>,
    metrics: Arc<ClusterMetrics>,
    budget: Arc<MemoryBudget>,
    packer: Arc<Packer>,
    damaged: Mutex<HashSet<String>>,
    /// How many keys `damaged` holds: offers look in it only when there are some, so the
    /// usual offer takes no lock.
    damaged_keys: AtomicUsize,
    /// Readers' lookups.
    lookups: WorkerPool,
    /// Prefetch's lookups.
    ahead: WorkerPool,
    writers: WorkerPool,
    map: Option<JoinHandle<()>>,
    stop: Arc<(Mutex<bool>, Condvar)>,
}

impl ClusterTier {
    /// The tier over `remote` for `config`'s dataset, its memory charged to `budget`, values
    /// compressed as `packer`'s policy last chose. Starts its threads; connects lazily.
    pub fn start(
        remote: Arc<dyn Remote>,
        config: &ClusterConfig,
        budget: Arc<MemoryBudget>,
        packer: Arc<Packer>,
        metrics: Arc<ClusterMetrics>,
    ) -> std::io::Result<ClusterTier> {
        let health = Arc::new(Health::default());
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let map = {
            let (remote, health, stop) = (remote.clone(), health.clone(), stop.clone());
            std::thread::Builder::new()
                .name("prepfs-cluster-map".into())
                .spawn(move || read_map(&*remote, &health, &stop))?
        };
        Ok(ClusterTier {
            remote,
            dataset: record::dataset_id(&config.dataset),
            timeout: config.timeout,
            keep_hits: config.keep_hits,
            health,
            metrics,
            budget,
            packer,
            damaged: Mutex::new(HashSet::new()),
            damaged_keys: AtomicUsize::new(0),
            lookups: WorkerPool::new("prepfs-cluster-get", LOOKUP_THREADS, LOOKUP_QUEUE)?,
            ahead: WorkerPool::new("prepfs-cluster-ahead", AHEAD_THREADS, AHEAD_QUEUE)?,
            writers: WorkerPool::new("prepfs-cluster-put", WRITE_THREADS, WRITE_QUEUE)?,
            map: Some(map),
            stop,
        })
    }

    /// The tier's counters.
    pub fn metrics(&self) -> &Arc<ClusterMetrics> {
        &self.metrics
    }

    /// `(nodes known, nodes backing off now)`.
    pub fn nodes(&self) -> (usize, usize) {
        self.health.counts()
    }

    /// A miss, counted, with `also` (skipped, timeouts...) counted too.
    fn miss(&self, also: Option<&crate::metrics::Counter>) -> Option<Arc<Block>> {
        self.metrics.misses.inc();
        if let Some(c) = also {
            c.inc();
        }
        None
    }

    /// The node of `slot` failed a request: it backs off (said once per outage).
    fn node_failed(&self, slot: u16, what: &str) {
        if self.health.failed(slot) {
            tracing::warn!(
                slot,
                "a cluster node {what}; its blocks come from the source while it backs off"
            );
        }
    }
}

/// Length of block `key`, 0 past the end of its file.
fn block_len(key: &BlockKey) -> usize {
    let start = key.index as u64 * BLOCK_SIZE;
    key.identity.size.saturating_sub(start).min(BLOCK_SIZE) as usize
}

impl Tier for ClusterTier {
    fn name(&self) -> &'static str {
        "cluster"
    }

    fn get(&self, key: &BlockKey, path: &Path, range: &Range<usize>) -> Option<Arc<Block>> {
        self.lookup(key, path, range, Asker::Reader).0
    }

    fn lookup(
        &self,
        key: &BlockKey,
        path: &Path,
        _range: &Range<usize>,
        asker: Asker,
    ) -> (Option<Arc<Block>>, bool) {
        let len = block_len(key);
        if len == 0 {
            return (None, false);
        }
        let name = record::key_for(self.dataset, path, key);
        let slot = health::slot(&name);
        if !self.health.allows(slot) {
            return (self.miss(Some(&self.metrics.skipped)), false);
        }
        let tail = record::tail_key(&name);
        // A value is at most a header and the raw block, in one or two keys (see
        // `record::split`): each key is read up to that much, so a longer value is damaged and
        // its excess never read. The reply is read into memory by a lookup thread, then decoded
        // here: charged as the source read it stands in for would be, at once, whatever the
        // room.
        let max = record::HEADER + len;
        let reply = self.budget.in_flight(2 * max as u64);
        let (tx, rx) = sync_channel(1);
        let (remote, asked) = (self.remote.clone(), name.clone());
        let reader = asker == Asker::Reader;
        let pool = if reader { &self.lookups } else { &self.ahead };
        let queued = pool.try_submit(move || {
            let _reply = reply;
            let parts = [(asked.as_str(), max), (tail.as_str(), max)];
            let _ = tx.send(remote.get(&parts).map(|parts| parts.concat()));
        });
        if !queued {
            // Busy, not absent: a fetch ahead of the readers leaves the block to them.
            let why = if reader {
                &self.metrics.dropped
            } else {
                &self.metrics.ahead_late
            };
            return (self.miss(Some(why)), true);
        }
        let started = Instant::now();
        let answer = rx.recv_timeout(self.timeout);
        if reader {
            self.metrics.latency.record(started.elapsed());
        }
        let value = match answer {
            // Prefetch waits behind its own few threads: its lateness says nothing of the node.
            Err(_) if !reader => return (self.miss(Some(&self.metrics.ahead_late)), true),
            Err(_) => {
                if self.health.late(slot) {
                    tracing::warn!(
                        slot,
                        "a cluster node left {} lookups in a row unanswered; its blocks come \
                         from the source while it backs off",
                        health::LATE_TO_FAIL
                    );
                }
                return (self.miss(Some(&self.metrics.timeouts)), true);
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cluster lookup failed");
                self.node_failed(slot, "failed");
                return (self.miss(Some(&self.metrics.errors)), false);
            }
            Ok(Ok(value)) => value,
        };
        if self.health.answered(slot) {
            tracing::info!(slot, "a cluster node answers again");
        }
        self.metrics.bytes_in.add(value.len() as u64);
        if value.is_empty() {
            return (self.miss(None), false);
        }
        let _decoding = self.budget.in_flight(len as u64);
        let found = match record::decode(&name, &value, len) {
            Ok(data) => {
                self.metrics.hits.inc();
                Some(Arc::new(Block::new(data)))
            }
            Err(damage) => {
                tracing::warn!(%damage, block = key.index, "damaged cluster value; refetched from the source");
                let mut damaged = self.damaged.lock();
                if damaged.len() < DAMAGED_KEYS {
                    damaged.insert(name);
                    self.damaged_keys.store(damaged.len(), Ordering::Relaxed);
                }
                drop(damaged);
                self.miss(Some(&self.metrics.corrupt))
            }
        };
        (found, false)
    }

    fn put(&self, key: &BlockKey, path: &Arc<Path>, block: &Arc<Block>) -> bool {
        let name = record::key_for(self.dataset, path, key);
        let slot = health::slot(&name);
        if !self.health.takes(slot) {
            self.metrics.refused.inc();
            return false;
        }
        if !self.health.healthy(slot) {
            self.metrics.skipped.inc();
            return false;
        }
        // The block stays alive while queued, and its value is built beside it.
        let Some(work) = self.budget.try_work(2 * block.data.len() as u64) else {
            self.metrics.dropped.inc();
            return false;
        };
        let replace = self.damaged_keys.load(Ordering::Relaxed) > 0 && {
            let mut damaged = self.damaged.lock();
            let found = damaged.remove(&name);
            self.damaged_keys.store(damaged.len(), Ordering::Relaxed);
            found
        };
        let codec = self.packer.last_choice().codec;
        let (remote, health, metrics, block) = (
            self.remote.clone(),
            self.health.clone(),
            self.metrics.clone(),
            block.clone(),
        );
        let queued = self.writers.try_submit(move || {
            let _work = work;
            let value = record::encode(&name, &block.data, codec);
            let tail_key = record::tail_key(&name);
            // A replacement names the tail key even when this value has no tail: a tail left by
            // an earlier, split value would spoil it.
            let parts = match (record::split(&value), replace) {
                ((head, []), false) => vec![(name.as_str(), head)],
                ((head, tail), _) => vec![(name.as_str(), head), (tail_key.as_str(), tail)],
            };
            match remote.put(&parts, replace) {
                Ok(stored) => {
                    health.answered(slot);
                    if stored == Stored::Written {
                        metrics.writes.inc();
                        metrics.bytes_out.add(value.len() as u64);
                    }
                }
                Err(RemoteError::Full) => {
                    metrics.refused.inc();
                    if health.takes(slot) {
                        tracing::info!(
                            slot,
                            "a cluster node is full; no blocks offered to it for a while"
                        );
                    }
                    health.full(slot);
                }
                Err(RemoteError::Failed(e)) => {
                    metrics.errors.inc();
                    tracing::debug!(error = %e, "cluster write failed");
                    if health.failed(slot) {
                        tracing::warn!(slot, "a cluster node failed a write; it backs off");
                    }
                }
            }
        });
        if !queued {
            self.metrics.dropped.inc();
        }
        queued
    }

    fn has_room(&self, _bytes: u64) -> bool {
        self.health.has_room()
    }

    fn hits_kept_in_ram(&self) -> bool {
        self.keep_hits
    }
}

/// The slot-map thread: reads the map now and every `MAP_REFRESH` until `stop`, numbering nodes
/// by address in the order first seen (so a node keeps its health across refreshes).
fn read_map(remote: &dyn Remote, health: &Health, stop: &(Mutex<bool>, Condvar)) {
    let mut nodes: Vec<String> = Vec::new();
    loop {
        match remote.slots() {
            Ok(ranges) => {
                let numbered: Vec<(u16, u16, usize)> = ranges
                    .into_iter()
                    .map(|(first, last, addr)| {
                        let n = nodes.iter().position(|a| *a == addr).unwrap_or_else(|| {
                            nodes.push(addr);
                            nodes.len() - 1
                        });
                        (first, last, n)
                    })
                    .collect();
                health.set_map(&numbered, nodes.len());
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the cluster's slot map yet"),
        }
        let mut stopped = stop.0.lock();
        if !*stopped {
            stop.1.wait_for(&mut stopped, MAP_REFRESH);
        }
        if *stopped {
            return;
        }
    }
}

impl Drop for ClusterTier {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(map) = self.map.take() {
            let _ = map.join();
        }
    }
}

#[cfg(test)]
mod tests;
