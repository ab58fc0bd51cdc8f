//! Statistics: one metrics registry, rendered into `.prepfs/stats.json` and `.prepfs/metrics`.
//!
//! Owns: every metric's name, unit and meaning (defined once in `Metrics::samples`), lock-free
//! counters and latency histograms, and the two renderers. Both files render the same sample list,
//! so they cannot disagree. Must never take a lock or block: request paths only add to atomics.

pub mod diagnosis;
pub mod histogram;
pub mod live;
pub mod table;
mod view;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::{Map, Value};

pub use histogram::Histogram;
pub use view::{FailedFiles, RateMeter, ViewMetrics, view_samples};

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The filesystem operations counted per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Name lookup.
    Lookup,
    /// Attribute query.
    Getattr,
    /// Symlink target query.
    Readlink,
    /// File open.
    Open,
    /// File read.
    Read,
    /// File release (last close).
    Release,
    /// Directory open.
    Opendir,
    /// Directory listing.
    Readdir,
    /// Directory release.
    Releasedir,
    /// Filesystem capacity query.
    Statfs,
    /// Extended attribute query or listing.
    Xattr,
    /// Any attempt to modify the mount (answered EROFS).
    Modify,
}

impl Op {
    /// Every op, in rendering order.
    pub const ALL: [Op; 12] = [
        Op::Lookup,
        Op::Getattr,
        Op::Readlink,
        Op::Open,
        Op::Read,
        Op::Release,
        Op::Opendir,
        Op::Readdir,
        Op::Releasedir,
        Op::Statfs,
        Op::Xattr,
        Op::Modify,
    ];

    /// The op's name in both stats files.
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Readlink => "readlink",
            Op::Open => "open",
            Op::Read => "read",
            Op::Release => "release",
            Op::Opendir => "opendir",
            Op::Readdir => "readdir",
            Op::Releasedir => "releasedir",
            Op::Statfs => "statfs",
            Op::Xattr => "xattr",
            Op::Modify => "modify",
        }
    }
}

/// Requests and errors of one op.
#[derive(Debug, Default)]
pub struct OpCounters {
    /// Requests received.
    pub requests: Counter,
    /// Requests answered with an error.
    pub errors: Counter,
}

/// Every counter of one mount. Request paths hold an `Arc<Metrics>` and only add.
#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    ops: [OpCounters; Op::ALL.len()],
    /// Bytes returned by read requests answered by the daemon.
    pub bytes_served: Counter,
    /// Block reads answered from the cache (checksum verified).
    pub cache_hits: Counter,
    /// Block reads that had to go to the source.
    pub cache_misses: Counter,
    /// Blocks read from the source but not admitted because the memory budget was full.
    pub admission_rejected: Counter,
    /// Cached blocks whose checksum did not match (dropped and refetched).
    pub integrity_errors: Counter,
    /// Opens that found the source file changed since its bytes were cached.
    pub stale_detections: Counter,
    /// Bytes read from the source.
    pub source_bytes: Counter,
    /// Block fetches from the source.
    pub source_reads: Counter,
    /// Source reads that failed (answered EIO).
    pub source_errors: Counter,
    /// Opens answered with kernel passthrough to a fully cached file.
    pub passthrough_opens: Counter,
    /// Latency of read requests answered by the daemon, from arrival to reply.
    pub read_latency: Histogram,
    /// Latency of one block fetch from the source.
    pub source_latency: Histogram,
    /// Nanoseconds spent in source fetches (with `source_bytes`: the source's bandwidth).
    pub source_busy_ns: Counter,
    /// CPU nanoseconds spent compressing cache entries (RAM packing and disk writes).
    pub compress_cpu_ns: Counter,
    /// CPU nanoseconds spent decompressing cache entries on hits.
    pub decompress_cpu_ns: Counter,
    /// Raw RAM blocks packed in the background.
    pub packed_blocks: Counter,
    /// Packed RAM blocks repacked with a stronger codec.
    pub recompressions: Counter,
    /// Blocks read from the disk tier.
    pub disk_hits: Counter,
    /// Disk tier lookups that found no usable entry.
    pub disk_misses: Counter,
    /// Entries written to the disk tier.
    pub disk_writes: Counter,
    /// Disk entries found damaged (truncated, corrupt, wrong version or identity); removed.
    pub disk_integrity_errors: Counter,
    /// Blocks not written to the disk tier (budget, free-space floor, queue full, write error).
    pub disk_rejected: Counter,
    /// Disk writes that hit ENOSPC or the free-space floor.
    pub disk_enospc: Counter,
    /// Entries of an earlier mount removed because their source file changed or vanished.
    pub disk_stale_dropped: Counter,
    /// View renders that found the image's decoded pixels cached (no fetch, no decode).
    pub decoded_hits: Counter,
    /// View renders that had to decode.
    pub decoded_misses: Counter,
    /// Decoded images admitted to the RAM tier.
    pub decoded_admitted: Counter,
    /// Decoded images the policy chose not to keep (`--decoded-cache`).
    pub decoded_declined: Counter,
    /// Decoded images the policy would have kept but the budget had no room for.
    pub decoded_rejected: Counter,
    /// Nanoseconds demand reads of source files waited on a fetch (the fetch stall).
    pub fetch_stall_ns: Counter,
    /// Nanoseconds view reads waited for their render (the preprocessing stall).
    pub prep_stall_ns: Counter,
    /// Files the prefetcher fetched ahead of their open (at least one block).
    pub prefetch_issued: Counter,
    /// Prefetched files opened in the same pass after their prefetch finished.
    pub prefetch_useful: Counter,
    /// Prefetched files opened while their prefetch was still running.
    pub prefetch_late: Counter,
    /// Prefetched files not opened before the pass ended.
    pub prefetch_wasted: Counter,
    /// Staged bytes dropped unread two passes after they were staged.
    pub prefetch_wasted_bytes: Counter,
    /// Block reads answered from the staging buffer.
    pub prefetch_staged_reads: Counter,
    /// Blocks fetched ahead of the readers (files and readahead).
    pub prefetch_blocks: Counter,
    /// Prefetches that failed (the reader's own read reports any error).
    pub prefetch_failed: Counter,
    /// Opens the planner never saw because its queue was full.
    pub prefetch_events_dropped: Counter,
    /// Source files opened ahead of their readers whose bytes had no room (parked open).
    pub prefetch_opened_ahead: Counter,
    /// Reader opens that took a file opened ahead instead of opening it (round trips saved).
    pub prefetch_opens_saved: Counter,
    /// View images prefetch decoded into the decoded-pixel cache while the CPU was idle.
    pub prefetch_decoded_ahead: Counter,
    /// Requests that waited on the source past their deadline and were answered without it.
    pub requests_expired: Counter,
    /// Requests refused at once because the queue of requests waiting on the source was full.
    pub requests_refused: Counter,
    /// Opens of fully cached files answered from the cache because the source did not answer.
    pub unanswered_opens: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            ops: Default::default(),
            bytes_served: Counter::default(),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            admission_rejected: Counter::default(),
            integrity_errors: Counter::default(),
            stale_detections: Counter::default(),
            source_bytes: Counter::default(),
            source_reads: Counter::default(),
            source_errors: Counter::default(),
            passthrough_opens: Counter::default(),
            read_latency: Histogram::default(),
            source_latency: Histogram::default(),
            source_busy_ns: Counter::default(),
            compress_cpu_ns: Counter::default(),
            decompress_cpu_ns: Counter::default(),
            packed_blocks: Counter::default(),
            recompressions: Counter::default(),
            disk_hits: Counter::default(),
            disk_misses: Counter::default(),
            disk_writes: Counter::default(),
            disk_integrity_errors: Counter::default(),
            disk_rejected: Counter::default(),
            disk_enospc: Counter::default(),
            disk_stale_dropped: Counter::default(),
            decoded_hits: Counter::default(),
            decoded_misses: Counter::default(),
            decoded_admitted: Counter::default(),
            decoded_declined: Counter::default(),
            decoded_rejected: Counter::default(),
            fetch_stall_ns: Counter::default(),
            prep_stall_ns: Counter::default(),
            prefetch_issued: Counter::default(),
            prefetch_useful: Counter::default(),
            prefetch_late: Counter::default(),
            prefetch_wasted: Counter::default(),
            prefetch_wasted_bytes: Counter::default(),
            prefetch_staged_reads: Counter::default(),
            prefetch_blocks: Counter::default(),
            prefetch_failed: Counter::default(),
            prefetch_events_dropped: Counter::default(),
            prefetch_opened_ahead: Counter::default(),
            prefetch_opens_saved: Counter::default(),
            prefetch_decoded_ahead: Counter::default(),
            requests_expired: Counter::default(),
            requests_refused: Counter::default(),
            unanswered_opens: Counter::default(),
        }
    }
}

/// Figures owned elsewhere (the cache) that the stats files show beside the counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    /// Bytes held by the RAM tier (stored size).
    pub cache_bytes: u64,
    /// Bytes of file contents the RAM tier holds (before compression).
    pub cache_logical_bytes: u64,
    /// RAM blocks by codec family: none, lz4, zstd.
    pub cache_blocks_by_codec: [u64; 3],
    /// View images whose decoded pixels the RAM tier holds whole.
    pub decoded_entries: u64,
    /// RAM tier bytes holding decoded pixels (stored size).
    pub decoded_bytes: u64,
    /// Bytes of decoded pixels held, before compression.
    pub decoded_logical_bytes: u64,
    /// Raw RAM blocks waiting to be packed.
    pub pack_queue: u64,
    /// Packed RAM blocks waiting for an idle CPU to be repacked with the best codec.
    pub repack_queue: u64,
    /// The disk tier's figures, when there is one.
    pub disk: Option<crate::cache::DiskGauges>,
    /// The RAM tier's hard budget.
    pub cache_budget_bytes: u64,
    /// Blocks held by the RAM tier.
    pub cache_blocks: u64,
    /// Files with at least one cached block.
    pub cache_files: u64,
    /// Files whose every block is cached.
    pub cache_complete_files: u64,
    /// Open file and directory handles.
    pub open_handles: u64,
    /// Inodes known to the mount.
    pub inodes: u64,
    /// Bytes held (or being fetched) by the prefetch staging buffer.
    pub staged_bytes: u64,
    /// Budget of the staging buffer.
    pub staging_budget_bytes: u64,
    /// Files the prefetch planner keeps queued ahead of the readers.
    pub prefetch_depth: u64,
    /// Source files opened ahead and not yet taken by a reader's open.
    pub prefetch_parked: u64,
    /// The memory budget's figures.
    pub memory: crate::memory::MemoryGauges,
}

/// Whether a sample only grows or may go down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleKind {
    /// Monotonic.
    Counter,
    /// Point-in-time value.
    Gauge,
}

/// One rendered metric value.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Position in stats.json, dot separated (`cache.hits`).
    pub json_path: String,
    /// Prometheus metric name without the `prepfs_` prefix.
    pub prom_name: &'static str,
    /// Prometheus labels.
    pub labels: Vec<(&'static str, String)>,
    /// Counter or gauge.
    pub kind: SampleKind,
    /// One line: meaning and unit.
    pub help: &'static str,
    /// The value.
    pub value: f64,
}

impl Metrics {
    /// Counts one request of `op`, and an error if `failed`.
    pub fn record(&self, op: Op, failed: bool) {
        let c = &self.ops[op as usize];
        c.requests.inc();
        if failed {
            c.errors.inc();
        }
    }

    /// Counters of `op`.
    pub fn op(&self, op: Op) -> &OpCounters {
        &self.ops[op as usize]
    }

    /// Bytes per second the source delivered while a fetch was in flight, over the mount's life;
    /// `None` before any fetch.
    pub fn source_bytes_per_s(&self) -> Option<f64> {
        let busy_ns = self.source_busy_ns.get();
        (busy_ns > 0).then(|| self.source_bytes.get() as f64 * 1e9 / busy_ns as f64)
    }

    /// Every metric with its name, unit and meaning: the single definition both files render.
    pub fn samples(&self, g: &Gauges) -> Vec<Sample> {
        use SampleKind::{Counter as C, Gauge as G};
        let mut out = Vec::new();
        let (hits, misses) = (self.cache_hits.get(), self.cache_misses.get());
        let hit_rate = if hits + misses == 0 {
            0.0
        } else {
            hits as f64 / (hits + misses) as f64
        };
        let table = [
            (
                "uptime_seconds",
                "uptime_seconds",
                G,
                "Seconds since the mount became ready.",
                self.started.elapsed().as_secs_f64(),
            ),
            (
                "bytes_served",
                "bytes_served_total",
                C,
                "Bytes returned by reads answered by the daemon (passthrough reads bypass it).",
                self.bytes_served.get() as f64,
            ),
            (
                "cache.hits",
                "cache_hits_total",
                C,
                "Block reads answered from the cache, checksum verified.",
                hits as f64,
            ),
            (
                "cache.misses",
                "cache_misses_total",
                C,
                "Block reads that went to the source.",
                misses as f64,
            ),
            (
                "cache.hit_rate",
                "cache_hit_ratio",
                G,
                "hits / (hits + misses), 0..1.",
                hit_rate,
            ),
            (
                "cache.admission_rejected",
                "cache_admission_rejected_total",
                C,
                "Blocks not admitted because the budget was full (never-evict).",
                self.admission_rejected.get() as f64,
            ),
            (
                "cache.integrity_errors",
                "cache_integrity_errors_total",
                C,
                "Cached blocks whose checksum failed; dropped and refetched.",
                self.integrity_errors.get() as f64,
            ),
            (
                "cache.bytes",
                "cache_bytes",
                G,
                "Bytes held by the RAM tier (stored size, compressed where packed).",
                g.cache_bytes as f64,
            ),
            (
                "cache.budget_bytes",
                "cache_budget_bytes",
                G,
                "Hard byte budget of the RAM tier.",
                g.cache_budget_bytes as f64,
            ),
            (
                "cache.blocks",
                "cache_blocks",
                G,
                "Blocks (up to 1 MiB each) held by the RAM tier.",
                g.cache_blocks as f64,
            ),
            (
                "cache.files",
                "cache_files",
                G,
                "Files with at least one cached block.",
                g.cache_files as f64,
            ),
            (
                "cache.complete_files",
                "cache_complete_files",
                G,
                "Files whose every block is cached.",
                g.cache_complete_files as f64,
            ),
            (
                "cache.passthrough_opens",
                "passthrough_opens_total",
                C,
                "Opens served by kernel passthrough from a fully cached file.",
                self.passthrough_opens.get() as f64,
            ),
            (
                "stale_detections",
                "stale_detections_total",
                C,
                "Opens or reads that found the source file changed; old cache entries dropped.",
                self.stale_detections.get() as f64,
            ),
            (
                "source.bytes_read",
                "source_bytes_read_total",
                C,
                "Bytes read from the source.",
                self.source_bytes.get() as f64,
            ),
            (
                "source.reads",
                "source_reads_total",
                C,
                "Block fetches from the source.",
                self.source_reads.get() as f64,
            ),
            (
                "source.errors",
                "source_errors_total",
                C,
                "Source reads that failed (answered EIO).",
                self.source_errors.get() as f64,
            ),
            (
                "source.unanswered_opens",
                "source_unanswered_opens_total",
                C,
                "Opens of fully cached files served from the cache because the source did not answer.",
                self.unanswered_opens.get() as f64,
            ),
            (
                "requests.expired",
                "requests_expired_total",
                C,
                "Requests that waited on the source past --source-timeout; answered EIO.",
                self.requests_expired.get() as f64,
            ),
            (
                "requests.refused",
                "requests_refused_total",
                C,
                "Requests answered EIO at once: the queue of requests waiting on the source was full.",
                self.requests_refused.get() as f64,
            ),
        ];
        let ratio = |logical: u64, stored: u64| {
            if stored == 0 {
                1.0
            } else {
                logical as f64 / stored as f64
            }
        };
        let seconds = |c: &Counter| c.get() as f64 / 1e9;
        let codec_table = [
            (
                "cache.logical_bytes",
                "cache_logical_bytes",
                G,
                "Bytes of file contents held by the RAM tier, before compression.",
                g.cache_logical_bytes as f64,
            ),
            (
                "cache.capacity_ratio",
                "cache_capacity_ratio",
                G,
                "Effective capacity of the RAM tier: logical_bytes / bytes.",
                ratio(g.cache_logical_bytes, g.cache_bytes),
            ),
            (
                "cache.pack_queue",
                "cache_pack_queue",
                G,
                "Raw RAM blocks of compressible files waiting to be packed in the background.",
                g.pack_queue as f64,
            ),
            (
                "cache.repack_queue",
                "cache_repack_queue",
                G,
                "Packed RAM blocks waiting for an idle CPU to be repacked with the best codec.",
                g.repack_queue as f64,
            ),
            (
                "cache.packed_blocks",
                "cache_packed_blocks_total",
                C,
                "Raw RAM blocks packed (compressed) in the background.",
                self.packed_blocks.get() as f64,
            ),
            (
                "cache.recompressions",
                "cache_recompressions_total",
                C,
                "Packed RAM blocks repacked with a stronger codec when the CPU was idle.",
                self.recompressions.get() as f64,
            ),
            (
                "cache.compress_cpu_seconds",
                "cache_compress_cpu_seconds_total",
                C,
                "CPU seconds spent compressing cache entries (RAM and disk).",
                seconds(&self.compress_cpu_ns),
            ),
            (
                "cache.decompress_cpu_seconds",
                "cache_decompress_cpu_seconds_total",
                C,
                "CPU seconds spent decompressing cache entries on hits (RAM and disk).",
                seconds(&self.decompress_cpu_ns),
            ),
        ];
        let disk_table = g.disk.as_ref().map(|d| [
            (
                "disk.entries",
                "disk_entries",
                G,
                "Entries (blocks) in the disk tier.",
                d.entries as f64,
            ),
            (
                "disk.bytes",
                "disk_bytes",
                G,
                "Bytes of disk tier entries.",
                d.bytes as f64,
            ),
            (
                "disk.logical_bytes",
                "disk_logical_bytes",
                G,
                "Bytes of file contents the disk tier holds, before compression.",
                d.logical_bytes as f64,
            ),
            (
                "disk.capacity_ratio",
                "disk_capacity_ratio",
                G,
                "Effective capacity of the disk tier: logical_bytes / bytes.",
                ratio(d.logical_bytes, d.bytes),
            ),
            (
                "disk.budget_bytes",
                "disk_budget_bytes",
                G,
                "Byte budget of the disk tier.",
                d.budget_bytes as f64,
            ),
            (
                "disk.free_bytes",
                "disk_free_bytes",
                G,
                "Free bytes on the cache dir's filesystem.",
                d.free_bytes as f64,
            ),
            (
                "disk.scanned",
                "disk_scanned",
                G,
                "1 once the background scan of the old cache finished (admission starts then).",
                f64::from(u8::from(d.scanned)),
            ),
            (
                "disk.hits",
                "disk_hits_total",
                C,
                "Blocks read from the disk tier.",
                self.disk_hits.get() as f64,
            ),
            (
                "disk.misses",
                "disk_misses_total",
                C,
                "Disk tier lookups that found no usable entry.",
                self.disk_misses.get() as f64,
            ),
            (
                "disk.writes",
                "disk_writes_total",
                C,
                "Entries written to the disk tier.",
                self.disk_writes.get() as f64,
            ),
            (
                "disk.integrity_errors",
                "disk_integrity_errors_total",
                C,
                "Damaged disk entries (truncated, corrupt, wrong version or identity); removed, refetched.",
                self.disk_integrity_errors.get() as f64,
            ),
            (
                "disk.admission_rejected",
                "disk_admission_rejected_total",
                C,
                "Blocks not written to disk: budget, free-space floor, queue full or write error.",
                self.disk_rejected.get() as f64,
            ),
            (
                "disk.enospc",
                "disk_enospc_total",
                C,
                "Disk writes stopped by ENOSPC or the free-space floor (admission pauses 10 s).",
                self.disk_enospc.get() as f64,
            ),
            (
                "disk.stale_dropped",
                "disk_stale_dropped_total",
                C,
                "Entries of an earlier mount removed because their source file changed or vanished.",
                self.disk_stale_dropped.get() as f64,
            ),
        ]);
        let decoded_table = [
            (
                "cache.decoded.entries",
                "cache_decoded_entries",
                G,
                "View images whose decoded pixels the RAM tier holds.",
                g.decoded_entries as f64,
            ),
            (
                "cache.decoded.bytes",
                "cache_decoded_bytes",
                G,
                "RAM tier bytes holding decoded pixels (stored size; part of cache.bytes).",
                g.decoded_bytes as f64,
            ),
            (
                "cache.decoded.logical_bytes",
                "cache_decoded_logical_bytes",
                G,
                "Bytes of decoded pixels held, before compression (part of cache.logical_bytes).",
                g.decoded_logical_bytes as f64,
            ),
            (
                "cache.decoded.hits",
                "cache_decoded_hits_total",
                C,
                "View renders that found the decoded pixels cached: no fetch, no decode.",
                self.decoded_hits.get() as f64,
            ),
            (
                "cache.decoded.misses",
                "cache_decoded_misses_total",
                C,
                "View renders that decoded the image.",
                self.decoded_misses.get() as f64,
            ),
            (
                "cache.decoded.admitted",
                "cache_decoded_admitted_total",
                C,
                "Decoded images admitted to the RAM tier.",
                self.decoded_admitted.get() as f64,
            ),
            (
                "cache.decoded.declined",
                "cache_decoded_declined_total",
                C,
                "Decoded images the policy chose not to keep (--decoded-cache).",
                self.decoded_declined.get() as f64,
            ),
            (
                "cache.decoded.rejected",
                "cache_decoded_rejected_total",
                C,
                "Decoded images the policy would keep but the budget had no room for.",
                self.decoded_rejected.get() as f64,
            ),
        ];
        let prefetch_table = [
            (
                "stall.fetch_seconds",
                "stall_fetch_seconds_total",
                C,
                "Seconds demand reads of dataset files waited on the source (fetch stall).",
                seconds(&self.fetch_stall_ns),
            ),
            (
                "stall.prep_seconds",
                "stall_prep_seconds_total",
                C,
                "Seconds view reads waited for their render (preprocessing stall, fetch included).",
                seconds(&self.prep_stall_ns),
            ),
            (
                "prefetch.issued",
                "prefetch_issued_total",
                C,
                "Files fetched ahead of their open.",
                self.prefetch_issued.get() as f64,
            ),
            (
                "prefetch.useful",
                "prefetch_useful_total",
                C,
                "Prefetched files opened in the same pass after their prefetch finished.",
                self.prefetch_useful.get() as f64,
            ),
            (
                "prefetch.late",
                "prefetch_late_total",
                C,
                "Prefetched files opened while their prefetch was still running.",
                self.prefetch_late.get() as f64,
            ),
            (
                "prefetch.wasted",
                "prefetch_wasted_total",
                C,
                "Prefetched files not opened before their pass ended.",
                self.prefetch_wasted.get() as f64,
            ),
            (
                "prefetch.blocks",
                "prefetch_blocks_total",
                C,
                "Blocks fetched ahead of the readers (whole files and sequential readahead).",
                self.prefetch_blocks.get() as f64,
            ),
            (
                "prefetch.failed",
                "prefetch_failed_total",
                C,
                "Prefetches that failed; the reader's own read reports any error.",
                self.prefetch_failed.get() as f64,
            ),
            (
                "prefetch.events_dropped",
                "prefetch_events_dropped_total",
                C,
                "Opens the planner never saw because its queue was full.",
                self.prefetch_events_dropped.get() as f64,
            ),
            (
                "prefetch.opened_ahead",
                "prefetch_opened_ahead_total",
                C,
                "Source files opened ahead of their readers when their bytes had no room.",
                self.prefetch_opened_ahead.get() as f64,
            ),
            (
                "prefetch.opens_saved",
                "prefetch_opens_saved_total",
                C,
                "Reader opens that took a file opened ahead (no round trip to the source).",
                self.prefetch_opens_saved.get() as f64,
            ),
            (
                "prefetch.decoded_ahead",
                "prefetch_decoded_ahead_total",
                C,
                "View images decoded ahead of their opens into the decoded-pixel cache.",
                self.prefetch_decoded_ahead.get() as f64,
            ),
            (
                "prefetch.depth",
                "prefetch_depth",
                G,
                "Files the planner keeps queued ahead of the readers (controller output).",
                g.prefetch_depth as f64,
            ),
            (
                "prefetch.parked",
                "prefetch_parked",
                G,
                "Source files opened ahead and not yet taken by a reader's open.",
                g.prefetch_parked as f64,
            ),
            (
                "prefetch.staged.bytes",
                "prefetch_staged_bytes",
                G,
                "Bytes in the staging buffer: prefetched blocks no cache tier had room for.",
                g.staged_bytes as f64,
            ),
            (
                "prefetch.staged.budget_bytes",
                "prefetch_staged_budget_bytes",
                G,
                "Budget of the staging buffer (--prefetch-buffer).",
                g.staging_budget_bytes as f64,
            ),
            (
                "prefetch.staged.reads",
                "prefetch_staged_reads_total",
                C,
                "Block reads answered from the staging buffer.",
                self.prefetch_staged_reads.get() as f64,
            ),
            (
                "prefetch.staged.wasted_bytes",
                "prefetch_staged_wasted_bytes_total",
                C,
                "Staged bytes dropped unread.",
                self.prefetch_wasted_bytes.get() as f64,
            ),
        ];
        let m = &g.memory;
        let memory_table = [
            (
                "memory.budget_bytes",
                "memory_budget_bytes",
                G,
                "The hard memory budget of everything held for data (--cache-mem).",
                m.limit as f64,
            ),
            (
                "memory.pressure",
                "memory_pressure",
                G,
                "1 while memory pressure holds admission (little left under the cgroup or host limit).",
                f64::from(u8::from(m.pressure)),
            ),
            (
                "memory.pressure_events",
                "memory_pressure_events_total",
                C,
                "Times memory pressure began.",
                m.pressure_events as f64,
            ),
            (
                "memory.shed_bytes",
                "memory_shed_bytes_total",
                C,
                "Bytes given back under pressure or for a render: staged blocks, unread decoded pixels.",
                m.shed_bytes as f64,
            ),
            (
                "memory.render_waits",
                "memory_render_waits_total",
                C,
                "Renders that waited for room in the budget.",
                m.waits as f64,
            ),
            (
                "memory.render_refusals",
                "memory_render_refusals_total",
                C,
                "Renders refused memory (larger than the budget, or no room in time): EIO.",
                m.refused as f64,
            ),
        ];
        let rows = table
            .into_iter()
            .chain(codec_table)
            .chain(decoded_table)
            .chain(prefetch_table)
            .chain(memory_table)
            .chain(disk_table.into_iter().flatten());
        for (json_path, prom_name, kind, help, value) in rows {
            out.push(Sample {
                json_path: json_path.to_owned(),
                prom_name,
                labels: Vec::new(),
                kind,
                help,
                value,
            });
        }
        for (i, use_) in crate::memory::Use::ALL.into_iter().enumerate() {
            for (what, prom, help, value) in [
                (
                    "slice_bytes",
                    "memory_slice_bytes",
                    "Bytes of the budget this use may hold (work: what cache and staging leave).",
                    m.slices[i],
                ),
                (
                    "used_bytes",
                    "memory_used_bytes",
                    "Bytes of the budget this use holds now.",
                    m.used[i],
                ),
            ] {
                out.push(Sample {
                    json_path: format!("memory.{}.{what}", use_.name()),
                    prom_name: prom,
                    labels: vec![("use", use_.name().to_owned())],
                    kind: G,
                    help,
                    value: value as f64,
                });
            }
        }
        for (name, blocks) in ["none", "lz4", "zstd"]
            .into_iter()
            .zip(g.cache_blocks_by_codec)
        {
            out.push(Sample {
                json_path: format!("cache.blocks_by_codec.{name}"),
                prom_name: "cache_blocks_by_codec",
                labels: vec![("codec", name.to_owned())],
                kind: G,
                help: "RAM blocks by the codec they are stored with.",
                value: blocks as f64,
            });
        }
        for (prefix, prom, help, h) in [
            (
                "source.read_latency_us",
                "source_read_latency_microseconds",
                "Latency of one block fetch from the source, microseconds.",
                &self.source_latency,
            ),
            (
                "read_latency_us",
                "read_latency_microseconds",
                "Latency of a read request answered by the daemon, microseconds.",
                &self.read_latency,
            ),
        ] {
            histogram_samples(&mut out, prefix, prom, help, h, &[]);
        }
        out.push(Sample {
            json_path: "open_handles".into(),
            prom_name: "open_handles",
            labels: vec![],
            kind: G,
            help: "Open file and directory handles.",
            value: g.open_handles as f64,
        });
        out.push(Sample {
            json_path: "inodes".into(),
            prom_name: "inodes",
            labels: vec![],
            kind: G,
            help: "Inodes known to the mount (created lazily).",
            value: g.inodes as f64,
        });
        for op in Op::ALL {
            let c = self.op(op);
            for (what, prom, help, value) in [
                (
                    "requests",
                    "requests_total",
                    "Requests received, by op.",
                    c.requests.get(),
                ),
                (
                    "errors",
                    "errors_total",
                    "Requests answered with an error, by op.",
                    c.errors.get(),
                ),
            ] {
                out.push(Sample {
                    json_path: format!("ops.{}.{what}", op.name()),
                    prom_name: prom,
                    labels: vec![("op", op.name().to_owned())],
                    kind: C,
                    help,
                    value: value as f64,
                });
            }
        }
        out
    }
}

/// p50, p99 and count of `h`, in microseconds, with `labels` added to each.
pub(crate) fn histogram_samples(
    out: &mut Vec<Sample>,
    prefix: &str,
    prom: &'static str,
    help: &'static str,
    h: &Histogram,
    labels: &[(&'static str, String)],
) {
    let with = |quantile: String| {
        let mut l = labels.to_vec();
        l.push(("quantile", quantile));
        l
    };
    for (q, v) in [("p50", 0.5), ("p99", 0.99)] {
        out.push(Sample {
            json_path: format!("{prefix}.{q}"),
            prom_name: prom,
            labels: with(v.to_string()),
            kind: SampleKind::Gauge,
            help,
            value: h.quantile_us(v),
        });
    }
    out.push(Sample {
        json_path: format!("{prefix}.count"),
        prom_name: prom,
        labels: with("count".into()),
        kind: SampleKind::Gauge,
        help,
        value: h.count() as f64,
    });
}

/// Renders samples as the nested JSON document of `.prepfs/stats.json`, plus `documents`: JSON
/// values placed whole at a dotted path (for keys that are data, such as file paths).
pub fn render_json(samples: &[Sample], documents: Vec<(String, Value)>) -> String {
    let mut root = Map::new();
    for s in samples {
        let value = if s.value.fract() == 0.0 && s.value.abs() < 9.0e15 {
            Value::from(s.value as i64)
        } else {
            serde_json::Number::from_f64(s.value)
                .map(Value::Number)
                .unwrap_or(Value::Null)
        };
        insert_path(&mut root, &s.json_path, value);
    }
    for (path, value) in documents {
        insert_path(&mut root, &path, value);
    }
    let mut text =
        serde_json::to_string_pretty(&Value::Object(root)).unwrap_or_else(|_| "{}".into());
    text.push('\n');
    text
}

/// Inserts `value` at dotted `path`. A path through an existing leaf is skipped; the
/// `stats_paths_never_collide` test keeps the sample table free of those.
fn insert_path(root: &mut Map<String, Value>, path: &str, value: Value) {
    let mut node = root;
    let mut parts = path.split('.').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            node.insert(part.to_owned(), value);
            return;
        }
        let entry = node
            .entry(part.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(map) = entry else { return };
        node = map;
    }
}

/// Renders samples in the Prometheus text exposition format of `.prepfs/metrics`.
pub fn render_prometheus(samples: &[Sample]) -> String {
    let mut out = String::new();
    let mut described = std::collections::HashSet::new();
    for s in samples {
        let name = format!("prepfs_{}", s.prom_name);
        if described.insert(name.clone()) {
            let kind = match s.kind {
                SampleKind::Counter => "counter",
                SampleKind::Gauge => "gauge",
            };
            out.push_str(&format!("# HELP {name} {}\n# TYPE {name} {kind}\n", s.help));
        }
        out.push_str(&name);
        if !s.labels.is_empty() {
            let labels: Vec<String> = s
                .labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{v}\""))
                .collect();
            out.push_str(&format!("{{{}}}", labels.join(",")));
        }
        out.push_str(&format!(" {}\n", s.value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_paths_never_collide() {
        let m = Metrics::default();
        let samples = m.samples(&Gauges::default());
        let paths: Vec<&str> = samples.iter().map(|s| s.json_path.as_str()).collect();
        for a in &paths {
            for b in &paths {
                assert!(
                    !b.starts_with(&format!("{a}.")),
                    "{a} is both a leaf and a branch of {b}"
                );
            }
        }
        let json: Value =
            serde_json::from_str(&render_json(&samples, Vec::new())).expect("valid json");
        assert!(json["cache"]["hits"].is_number());
        assert!(json["ops"]["read"]["requests"].is_number());
    }

    #[test]
    fn counters_move_in_both_renderings() {
        let m = Metrics::default();
        m.cache_hits.add(3);
        m.record(Op::Read, true);
        let samples = m.samples(&Gauges {
            cache_bytes: 42,
            ..Gauges::default()
        });
        let json: Value =
            serde_json::from_str(&render_json(&samples, Vec::new())).expect("valid json");
        assert_eq!(json["cache"]["hits"], 3);
        assert_eq!(json["cache"]["bytes"], 42);
        assert_eq!(json["ops"]["read"]["errors"], 1);
        let prom = render_prometheus(&samples);
        assert!(prom.contains("prepfs_cache_hits_total 3\n"));
        assert!(prom.contains("prepfs_errors_total{op=\"read\"} 1\n"));
        assert_eq!(
            prom.matches("# TYPE prepfs_requests_total counter").count(),
            1
        );
    }
}
