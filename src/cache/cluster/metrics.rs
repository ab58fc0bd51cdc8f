//! The cluster tier's figures: what the node asked the cluster and how it went.
//!
//! Owns: these figures' definitions (path, Prometheus name, meaning) and their counters. Must
//! never count a figure of another tier: a cluster hit is also a cache miss of the RAM tier, which
//! the fetcher counts.

use crate::metrics::{Counter, Histogram, Metric, Samples};

/// Blocks the cluster answered.
pub const HITS: Metric = Metric::counter(
    "cluster.hits",
    "cluster_hits_total",
    "Blocks read from the cluster tier, intact (checksum verified).",
);
/// Lookups that found nothing usable.
pub const MISSES: Metric = Metric::counter(
    "cluster.misses",
    "cluster_misses_total",
    "Cluster lookups that brought no usable block: absent, damaged, timed out, failed or skipped.",
);
/// Requests not sent because their node is backing off.
pub const SKIPPED: Metric = Metric::counter(
    "cluster.skipped",
    "cluster_skipped_total",
    "Lookups and offers not sent: their node failed lately and is backing off.",
);
/// Requests not sent for want of a thread or memory.
pub const DROPPED: Metric = Metric::counter(
    "cluster.dropped",
    "cluster_dropped_total",
    "Lookups and offers not sent: the tier's queue was full, or (offers) the memory budget had no room for the block to wait in.",
);
/// Blocks written.
pub const WRITES: Metric = Metric::counter(
    "cluster.writes",
    "cluster_writes_total",
    "Blocks this node stored in the cluster (SET NX won; a block another node stored first is not counted).",
);
/// Offers the cluster refused: full.
pub const REFUSED: Metric = Metric::counter(
    "cluster.refused",
    "cluster_refused_total",
    "Blocks the cluster refused because its node was full (maxmemory with noeviction), or not offered while it is.",
);
/// Requests that failed.
pub const ERRORS: Metric = Metric::counter(
    "cluster.errors",
    "cluster_errors_total",
    "Cluster requests that failed (connection refused or lost, cluster down, protocol error).",
);
/// Lookups that took longer than the timeout.
pub const TIMEOUTS: Metric = Metric::counter(
    "cluster.timeouts",
    "cluster_timeouts_total",
    "Lookups not answered within --cluster-timeout; served from the source instead.",
);
/// Prefetch's lookups left to the readers.
pub const AHEAD_LATE: Metric = Metric::counter(
    "cluster.ahead_late",
    "cluster_ahead_late_total",
    "Lookups made ahead of the readers (prefetch) not answered within --cluster-timeout or not sent for want of a prefetch lookup thread; their blocks were left to the readers.",
);
/// Damaged values.
pub const CORRUPT: Metric = Metric::counter(
    "cluster.corrupt",
    "cluster_corrupt_total",
    "Cluster values that failed their checks (truncated, foreign, checksum); refetched and replaced.",
);
/// Bytes read from the cluster.
pub const BYTES_IN: Metric = Metric::counter(
    "cluster.bytes_in",
    "cluster_bytes_in_total",
    "Bytes of values received from the cluster (stored size).",
);
/// Bytes written to the cluster.
pub const BYTES_OUT: Metric = Metric::counter(
    "cluster.bytes_out",
    "cluster_bytes_out_total",
    "Bytes of values sent to the cluster (stored size).",
);
/// Lookup latency.
pub const LATENCY: Metric = Metric::latency(
    "cluster.latency_us",
    "cluster_latency_microseconds",
    "Time of a cluster lookup as the reader waited for it (a timeout counts as the timeout).",
);
/// Nodes backing off now.
pub const NODES_DOWN: Metric = Metric::gauge(
    "cluster.nodes_down",
    "cluster_nodes_down",
    "Cluster nodes that failed lately and are skipped until their backoff ends.",
);
/// Nodes known.
pub const NODES: Metric = Metric::gauge(
    "cluster.nodes",
    "cluster_nodes",
    "Primary nodes in the cluster's slot map as last read (0 until the first read succeeds).",
);

/// The counters.
#[derive(Default)]
pub struct ClusterMetrics {
    /// See `HITS`.
    pub hits: Counter,
    /// See `MISSES`.
    pub misses: Counter,
    /// See `SKIPPED`.
    pub skipped: Counter,
    /// See `DROPPED`.
    pub dropped: Counter,
    /// See `WRITES`.
    pub writes: Counter,
    /// See `REFUSED`.
    pub refused: Counter,
    /// See `ERRORS`.
    pub errors: Counter,
    /// See `TIMEOUTS`.
    pub timeouts: Counter,
    /// See `AHEAD_LATE`.
    pub ahead_late: Counter,
    /// See `CORRUPT`.
    pub corrupt: Counter,
    /// See `BYTES_IN`.
    pub bytes_in: Counter,
    /// See `BYTES_OUT`.
    pub bytes_out: Counter,
    /// See `LATENCY`.
    pub latency: Histogram,
}

impl ClusterMetrics {
    /// The samples of these counters, with the node gauges `(known, down)`.
    pub fn samples(&self, (nodes, down): (usize, usize), out: &mut Samples) {
        out.count(&HITS, &self.hits);
        out.count(&MISSES, &self.misses);
        out.count(&SKIPPED, &self.skipped);
        out.count(&DROPPED, &self.dropped);
        out.count(&WRITES, &self.writes);
        out.count(&REFUSED, &self.refused);
        out.count(&ERRORS, &self.errors);
        out.count(&TIMEOUTS, &self.timeouts);
        out.count(&AHEAD_LATE, &self.ahead_late);
        out.count(&CORRUPT, &self.corrupt);
        out.count(&BYTES_IN, &self.bytes_in);
        out.count(&BYTES_OUT, &self.bytes_out);
        out.latency(&LATENCY, &self.latency);
        out.put(&NODES, nodes as f64);
        out.put(&NODES_DOWN, down as f64);
    }
}
