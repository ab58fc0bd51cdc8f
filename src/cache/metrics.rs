//! The cache's figures: hits and misses, what the tiers hold and how it is stored, decoded
//! pixels, the fetches from the source, the staging buffer and the disk tier.
//!
//! Owns: these figures' definitions (path, Prometheus name, meaning), their counters
//! (`CacheMetrics`, shared by every tier and the fetcher) and the gauges the tiers report
//! (`CacheFigures`). Must never count a figure another module owns.

use crate::metrics::{Counter, Histogram, Metric, Samples};

/// Block reads answered from the cache.
pub const HITS: Metric = Metric::counter(
    "cache.hits",
    "cache_hits_total",
    "Block reads answered from the cache, checksum verified.",
);
/// Block reads that went to the source.
pub const MISSES: Metric = Metric::counter(
    "cache.misses",
    "cache_misses_total",
    "Block reads that went to the source.",
);
/// hits / (hits + misses).
pub const HIT_RATE: Metric = Metric::gauge(
    "cache.hit_rate",
    "cache_hit_ratio",
    "hits / (hits + misses), 0..1.",
);
/// Blocks the full budget turned away.
pub const ADMISSION_REJECTED: Metric = Metric::counter(
    "cache.admission_rejected",
    "cache_admission_rejected_total",
    "Blocks not admitted because the budget was full (never-evict).",
);
/// Cached blocks whose checksum failed.
pub const INTEGRITY_ERRORS: Metric = Metric::counter(
    "cache.integrity_errors",
    "cache_integrity_errors_total",
    "Cached blocks whose checksum failed; dropped and refetched.",
);
/// Bytes the RAM tier holds.
pub const BYTES: Metric = Metric::gauge(
    "cache.bytes",
    "cache_bytes",
    "Bytes held by the RAM tier (stored size, compressed where packed).",
);
/// The RAM tier's budget.
pub const BUDGET_BYTES: Metric = Metric::gauge(
    "cache.budget_bytes",
    "cache_budget_bytes",
    "Hard byte budget of the RAM tier.",
);
/// Blocks the RAM tier holds.
pub const BLOCKS: Metric = Metric::gauge(
    "cache.blocks",
    "cache_blocks",
    "Blocks (up to 1 MiB each) held by the RAM tier.",
);
/// Files with a cached block.
pub const FILES: Metric = Metric::gauge(
    "cache.files",
    "cache_files",
    "Files with at least one cached block.",
);
/// Files cached whole.
pub const COMPLETE_FILES: Metric = Metric::gauge(
    "cache.complete_files",
    "cache_complete_files",
    "Files whose every block is cached.",
);
/// RAM blocks by codec.
pub const BLOCKS_BY_CODEC: Metric = Metric::gauge(
    "cache.blocks_by_codec.*",
    "cache_blocks_by_codec",
    "RAM blocks by the codec they are stored with.",
)
.by("codec");
/// Source files found changed.
pub const STALE_DETECTIONS: Metric = Metric::counter(
    "stale_detections",
    "stale_detections_total",
    "Opens or reads that found the source file changed; old cache entries dropped.",
);
/// Bytes of file contents the RAM tier holds.
pub const LOGICAL_BYTES: Metric = Metric::gauge(
    "cache.logical_bytes",
    "cache_logical_bytes",
    "Bytes of file contents held by the RAM tier, before compression.",
);
/// The RAM tier's compression ratio.
pub const CAPACITY_RATIO: Metric = Metric::gauge(
    "cache.capacity_ratio",
    "cache_capacity_ratio",
    "Effective capacity of the RAM tier: logical_bytes / bytes.",
);
/// Raw blocks waiting to be packed.
pub const PACK_QUEUE: Metric = Metric::gauge(
    "cache.pack_queue",
    "cache_pack_queue",
    "Raw RAM blocks of compressible files waiting to be packed in the background.",
);
/// Packed blocks waiting to be repacked.
pub const REPACK_QUEUE: Metric = Metric::gauge(
    "cache.repack_queue",
    "cache_repack_queue",
    "Packed RAM blocks waiting for an idle CPU to be repacked with the best codec.",
);
/// Raw blocks packed.
pub const PACKED_BLOCKS: Metric = Metric::counter(
    "cache.packed_blocks",
    "cache_packed_blocks_total",
    "Raw RAM blocks packed (compressed) in the background.",
);
/// Packed blocks repacked.
pub const RECOMPRESSIONS: Metric = Metric::counter(
    "cache.recompressions",
    "cache_recompressions_total",
    "Packed RAM blocks repacked with a stronger codec when the CPU was idle.",
);
/// CPU time compressing.
pub const COMPRESS_CPU: Metric = Metric::counter(
    "cache.compress_cpu_seconds",
    "cache_compress_cpu_seconds_total",
    "CPU seconds spent compressing cache entries (RAM and disk).",
);
/// CPU time decompressing.
pub const DECOMPRESS_CPU: Metric = Metric::counter(
    "cache.decompress_cpu_seconds",
    "cache_decompress_cpu_seconds_total",
    "CPU seconds spent decompressing cache entries on hits (RAM and disk).",
);
/// Images whose decoded pixels are held.
pub const DECODED_ENTRIES: Metric = Metric::gauge(
    "cache.decoded.entries",
    "cache_decoded_entries",
    "View images whose decoded pixels the RAM tier holds.",
);
/// Bytes of decoded pixels held.
pub const DECODED_BYTES: Metric = Metric::gauge(
    "cache.decoded.bytes",
    "cache_decoded_bytes",
    "RAM tier bytes holding decoded pixels (stored size; part of cache.bytes).",
);
/// Decoded pixels before compression.
pub const DECODED_LOGICAL_BYTES: Metric = Metric::gauge(
    "cache.decoded.logical_bytes",
    "cache_decoded_logical_bytes",
    "Bytes of decoded pixels held, before compression (part of cache.logical_bytes).",
);
/// Renders from cached pixels.
pub const DECODED_HITS: Metric = Metric::counter(
    "cache.decoded.hits",
    "cache_decoded_hits_total",
    "View renders that found the decoded pixels cached: no fetch, no decode.",
);
/// Renders that decoded.
pub const DECODED_MISSES: Metric = Metric::counter(
    "cache.decoded.misses",
    "cache_decoded_misses_total",
    "View renders that decoded the image.",
);
/// Decoded images admitted.
pub const DECODED_ADMITTED: Metric = Metric::counter(
    "cache.decoded.admitted",
    "cache_decoded_admitted_total",
    "Decoded images admitted to the RAM tier.",
);
/// Decoded images the policy did not keep.
pub const DECODED_DECLINED: Metric = Metric::counter(
    "cache.decoded.declined",
    "cache_decoded_declined_total",
    "Decoded images the policy chose not to keep (--decoded-cache).",
);
/// Decoded images with no room.
pub const DECODED_REJECTED: Metric = Metric::counter(
    "cache.decoded.rejected",
    "cache_decoded_rejected_total",
    "Decoded images the policy would keep but the budget had no room for.",
);
/// Decoded images dropped to give their room to files.
pub const DECODED_YIELDED: Metric = Metric::counter(
    "cache.decoded.yielded",
    "cache_decoded_yielded_total",
    "Decoded images dropped, while no render read them, to make room for a file's blocks: pixels take only the room files leave.",
);
/// Blocks of decoded pixels left raw because unpacking them would cost more than they save.
pub const DECODED_KEPT_RAW: Metric = Metric::counter(
    "cache.decoded.kept_raw",
    "cache_decoded_kept_raw_blocks_total",
    "Times the packer left a block of decoded pixels raw because unpacking it at every render would cost more than the decodes the room it frees saves.",
);
/// Restart-marked JPEG copies held.
pub const MARKED_ENTRIES: Metric = Metric::gauge(
    "cache.marked.entries",
    "cache_marked_entries",
    "View images whose restart-marked JPEG copy the RAM tier holds.",
);
/// Bytes of restart-marked copies held.
pub const MARKED_BYTES: Metric = Metric::gauge(
    "cache.marked.bytes",
    "cache_marked_bytes",
    "RAM tier bytes holding restart-marked JPEG copies (part of cache.bytes).",
);
/// Renders from a restart-marked copy.
pub const MARKED_HITS: Metric = Metric::counter(
    "cache.marked.hits",
    "cache_marked_hits_total",
    "View renders that decoded their part from a cached restart-marked copy.",
);
/// Restart-marked copies admitted.
pub const MARKED_ADMITTED: Metric = Metric::counter(
    "cache.marked.admitted",
    "cache_marked_admitted_total",
    "Restart-marked JPEG copies made and admitted to the RAM tier.",
);
/// Files whose own entry a restart-marked copy took the place of.
pub const MARKED_REPLACED: Metric = Metric::counter(
    "cache.marked.replaced_files",
    "cache_marked_replaced_files_total",
    "Cached JPEGs whose own RAM entry was let go once their restart-marked copy was admitted.",
);
/// Bytes read from the source.
pub const SOURCE_BYTES: Metric = Metric::counter(
    "source.bytes_read",
    "source_bytes_read_total",
    "Bytes read from the source.",
);
/// Block fetches.
pub const SOURCE_READS: Metric = Metric::counter(
    "source.reads",
    "source_reads_total",
    "Block fetches from the source.",
);
/// Failed source reads.
pub const SOURCE_ERRORS: Metric = Metric::counter(
    "source.errors",
    "source_errors_total",
    "Source reads that failed (answered EIO).",
);
/// Source reads of a version that may still be being written.
pub const SOURCE_UNSETTLED: Metric = Metric::counter(
    "source.unsettled_reads",
    "source_unsettled_reads_total",
    "Source reads served but not cached: the file was modified less than 2 s before the read.",
);
/// Latency of one fetch.
pub const SOURCE_LATENCY: Metric = Metric::latency(
    "source.read_latency_us",
    "source_read_latency_microseconds",
    "Latency of one block fetch from the source, microseconds.",
);
/// Bytes staged.
pub const STAGED_BYTES: Metric = Metric::gauge(
    "prefetch.staged.bytes",
    "prefetch_staged_bytes",
    "Bytes in the staging buffer: prefetched blocks no cache tier had room for.",
);
/// The staging buffer's budget.
pub const STAGED_BUDGET_BYTES: Metric = Metric::gauge(
    "prefetch.staged.budget_bytes",
    "prefetch_staged_budget_bytes",
    "Budget of the staging buffer (--prefetch-buffer).",
);
/// Reads answered from staging.
pub const STAGED_READS: Metric = Metric::counter(
    "prefetch.staged.reads",
    "prefetch_staged_reads_total",
    "Block reads answered from the staging buffer.",
);
/// Staged bytes dropped unread.
pub const STAGED_WASTED_BYTES: Metric = Metric::counter(
    "prefetch.staged.wasted_bytes",
    "prefetch_staged_wasted_bytes_total",
    "Staged bytes dropped unread.",
);
/// Bytes prefetch fetched and kept nowhere.
pub const PREFETCH_DISCARDED_BYTES: Metric = Metric::counter(
    "prefetch.discarded_bytes",
    "prefetch_discarded_bytes_total",
    "Bytes prefetch fetched that neither the RAM tier nor the staging buffer kept (their reader fetches them again).",
);
/// Disk entries.
pub const DISK_ENTRIES: Metric = Metric::gauge(
    "disk.entries",
    "disk_entries",
    "Entries (blocks) in the disk tier.",
);
/// Disk bytes.
pub const DISK_BYTES: Metric =
    Metric::gauge("disk.bytes", "disk_bytes", "Bytes of disk tier entries.");
/// Disk contents before compression.
pub const DISK_LOGICAL_BYTES: Metric = Metric::gauge(
    "disk.logical_bytes",
    "disk_logical_bytes",
    "Bytes of file contents the disk tier holds, before compression.",
);
/// The disk tier's compression ratio.
pub const DISK_CAPACITY_RATIO: Metric = Metric::gauge(
    "disk.capacity_ratio",
    "disk_capacity_ratio",
    "Effective capacity of the disk tier: logical_bytes / bytes.",
);
/// The disk budget.
pub const DISK_BUDGET_BYTES: Metric = Metric::gauge(
    "disk.budget_bytes",
    "disk_budget_bytes",
    "Byte budget of the disk tier.",
);
/// Free bytes under the cache dir.
pub const DISK_FREE_BYTES: Metric = Metric::gauge(
    "disk.free_bytes",
    "disk_free_bytes",
    "Free bytes on the cache dir's filesystem.",
);
/// Whether the old cache was scanned.
pub const DISK_SCANNED: Metric = Metric::gauge(
    "disk.scanned",
    "disk_scanned",
    "1 once the background scan of the old cache finished (admission starts then).",
);
/// Disk hits.
pub const DISK_HITS: Metric = Metric::counter(
    "disk.hits",
    "disk_hits_total",
    "Blocks read from the disk tier.",
);
/// Disk misses.
pub const DISK_MISSES: Metric = Metric::counter(
    "disk.misses",
    "disk_misses_total",
    "Disk tier lookups that found no usable entry.",
);
/// Disk writes.
pub const DISK_WRITES: Metric = Metric::counter(
    "disk.writes",
    "disk_writes_total",
    "Entries written to the disk tier.",
);
/// Disk entries rewritten with a stronger codec.
pub const DISK_RECOMPRESSIONS: Metric = Metric::counter(
    "disk.recompressions",
    "disk_recompressions_total",
    "Disk entries rewritten with the codec policy's stronger choice once the CPU allowed it.",
);
/// Damaged disk entries.
pub const DISK_INTEGRITY_ERRORS: Metric = Metric::counter(
    "disk.integrity_errors",
    "disk_integrity_errors_total",
    "Damaged disk entries (truncated, corrupt, wrong version or identity); removed, refetched.",
);
/// Blocks not written to disk.
pub const DISK_REJECTED: Metric = Metric::counter(
    "disk.admission_rejected",
    "disk_admission_rejected_total",
    "Blocks not written to disk: budget, free-space floor, deferred list full, gone from RAM or write error.",
);
/// Blocks deferred for a later write.
pub const DISK_DEFERRED: Metric = Metric::counter(
    "disk.deferred",
    "disk_deferred_total",
    "Blocks the disk writer could not take when fetched (queue full, scan running, no memory), kept for a later write from RAM.",
);
/// Deferred blocks written from RAM.
pub const DISK_RECALLED: Metric = Metric::counter(
    "disk.recalled",
    "disk_recalled_total",
    "Deferred blocks read back from the RAM tier by the idle disk writer and written.",
);
/// Writes stopped by a full disk.
pub const DISK_ENOSPC: Metric = Metric::counter(
    "disk.enospc",
    "disk_enospc_total",
    "Disk writes stopped by ENOSPC or the free-space floor (admission pauses 10 s).",
);
/// Entries of an earlier mount dropped.
pub const DISK_STALE_DROPPED: Metric = Metric::counter(
    "disk.stale_dropped",
    "disk_stale_dropped_total",
    "Entries of an earlier mount removed because their source file changed or vanished.",
);

/// The cache's counters, shared by the tiers and the fetcher, which only add.
#[derive(Debug, Default)]
pub struct CacheMetrics {
    /// See `HITS`.
    pub hits: Counter,
    /// See `MISSES`.
    pub misses: Counter,
    /// See `ADMISSION_REJECTED`.
    pub admission_rejected: Counter,
    /// See `INTEGRITY_ERRORS`.
    pub integrity_errors: Counter,
    /// See `STALE_DETECTIONS`.
    pub stale_detections: Counter,
    /// See `PACKED_BLOCKS`.
    pub packed_blocks: Counter,
    /// See `RECOMPRESSIONS`.
    pub recompressions: Counter,
    /// Nanoseconds of `COMPRESS_CPU`.
    pub compress_cpu_ns: Counter,
    /// Nanoseconds of `DECOMPRESS_CPU`.
    pub decompress_cpu_ns: Counter,
    /// See `DECODED_HITS`.
    pub decoded_hits: Counter,
    /// See `DECODED_MISSES`.
    pub decoded_misses: Counter,
    /// See `DECODED_ADMITTED`.
    pub decoded_admitted: Counter,
    /// See `DECODED_DECLINED`.
    pub decoded_declined: Counter,
    /// See `DECODED_REJECTED`.
    pub decoded_rejected: Counter,
    /// See `DECODED_YIELDED`.
    pub decoded_yielded: Counter,
    /// See `DECODED_KEPT_RAW`.
    pub decoded_kept_raw: Counter,
    /// See `MARKED_HITS`.
    pub marked_hits: Counter,
    /// See `MARKED_ADMITTED`.
    pub marked_admitted: Counter,
    /// See `MARKED_REPLACED`.
    pub marked_replaced: Counter,
    /// See `SOURCE_BYTES`.
    pub source_bytes: Counter,
    /// See `SOURCE_READS`.
    pub source_reads: Counter,
    /// See `SOURCE_ERRORS`.
    pub source_errors: Counter,
    /// See `SOURCE_UNSETTLED`.
    pub unsettled_reads: Counter,
    /// See `SOURCE_LATENCY`.
    pub source_latency: Histogram,
    /// Nanoseconds spent in source fetches (with `source_bytes`: the source's bandwidth).
    pub source_busy_ns: Counter,
    /// See `STAGED_READS`.
    pub staged_reads: Counter,
    /// See `STAGED_WASTED_BYTES`.
    pub staged_wasted_bytes: Counter,
    /// See `PREFETCH_DISCARDED_BYTES`.
    pub prefetch_discarded_bytes: Counter,
    /// See `DISK_HITS`.
    pub disk_hits: Counter,
    /// See `DISK_MISSES`.
    pub disk_misses: Counter,
    /// See `DISK_WRITES`.
    pub disk_writes: Counter,
    /// See `DISK_RECOMPRESSIONS`.
    pub disk_recompressions: Counter,
    /// See `DISK_INTEGRITY_ERRORS`.
    pub disk_integrity_errors: Counter,
    /// See `DISK_REJECTED`.
    pub disk_rejected: Counter,
    /// See `DISK_DEFERRED`.
    pub disk_deferred: Counter,
    /// See `DISK_RECALLED`.
    pub disk_recalled: Counter,
    /// See `DISK_ENOSPC`.
    pub disk_enospc: Counter,
    /// See `DISK_STALE_DROPPED`.
    pub disk_stale_dropped: Counter,
}

/// The disk tier's figures now, for the stats files.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiskGauges {
    /// Entries counted (complete once `scanned`).
    pub entries: u64,
    /// Bytes of those entries on disk.
    pub bytes: u64,
    /// Bytes of file contents they hold.
    pub logical_bytes: u64,
    /// The budget.
    pub budget_bytes: u64,
    /// Free bytes on the cache dir's filesystem, for this user.
    pub free_bytes: u64,
    /// Whether the scan of the old cache has finished (admission starts then).
    pub scanned: bool,
}

/// What the RAM tier holds now.
#[derive(Debug, Clone, Copy, Default)]
pub struct RamGauges {
    /// See `BYTES`.
    pub bytes: u64,
    /// See `LOGICAL_BYTES`.
    pub logical_bytes: u64,
    /// See `BUDGET_BYTES`.
    pub budget_bytes: u64,
    /// See `BLOCKS`.
    pub blocks: u64,
    /// See `BLOCKS_BY_CODEC`: none, lz4, zstd.
    pub blocks_by_codec: [u64; 3],
    /// See `FILES`.
    pub files: u64,
    /// See `COMPLETE_FILES`.
    pub complete_files: u64,
    /// See `DECODED_ENTRIES`.
    pub decoded_entries: u64,
    /// See `DECODED_BYTES`.
    pub decoded_bytes: u64,
    /// See `DECODED_LOGICAL_BYTES`.
    pub decoded_logical_bytes: u64,
    /// See `MARKED_ENTRIES`.
    pub marked_entries: u64,
    /// See `MARKED_BYTES`.
    pub marked_bytes: u64,
    /// See `PACK_QUEUE`.
    pub pack_queue: u64,
    /// See `REPACK_QUEUE`.
    pub repack_queue: u64,
}

/// What every tier holds now.
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheFigures {
    /// The RAM tier.
    pub ram: RamGauges,
    /// See `STAGED_BYTES`.
    pub staged_bytes: u64,
    /// See `STAGED_BUDGET_BYTES`.
    pub staged_budget_bytes: u64,
    /// The disk tier, when there is one.
    pub disk: Option<DiskGauges>,
}

/// Stored bytes' worth of contents: `logical / stored`, 1 when nothing is stored.
fn ratio(logical: u64, stored: u64) -> f64 {
    if stored == 0 {
        1.0
    } else {
        logical as f64 / stored as f64
    }
}

impl CacheMetrics {
    /// Bytes per second the source delivered while a fetch was in flight, over the mount's life;
    /// `None` before any fetch.
    pub fn source_bytes_per_s(&self) -> Option<f64> {
        let busy_ns = self.source_busy_ns.get();
        (busy_ns > 0).then(|| self.source_bytes.get() as f64 * 1e9 / busy_ns as f64)
    }

    /// The samples of these counters and of `now`.
    pub fn samples(&self, now: &CacheFigures, out: &mut Samples) {
        let (hits, misses) = (self.hits.get(), self.misses.get());
        out.put(&HITS, hits as f64);
        out.put(&MISSES, misses as f64);
        let rate = if hits + misses == 0 {
            0.0
        } else {
            hits as f64 / (hits + misses) as f64
        };
        out.put(&HIT_RATE, rate);
        out.count(&ADMISSION_REJECTED, &self.admission_rejected);
        out.count(&INTEGRITY_ERRORS, &self.integrity_errors);
        out.count(&STALE_DETECTIONS, &self.stale_detections);
        let ram = &now.ram;
        out.put(&BYTES, ram.bytes as f64);
        out.put(&BUDGET_BYTES, ram.budget_bytes as f64);
        out.put(&BLOCKS, ram.blocks as f64);
        for (codec, blocks) in ["none", "lz4", "zstd"].into_iter().zip(ram.blocks_by_codec) {
            out.put_for(&BLOCKS_BY_CODEC, codec, blocks as f64);
        }
        out.put(&FILES, ram.files as f64);
        out.put(&COMPLETE_FILES, ram.complete_files as f64);
        out.put(&LOGICAL_BYTES, ram.logical_bytes as f64);
        out.put(&CAPACITY_RATIO, ratio(ram.logical_bytes, ram.bytes));
        out.put(&PACK_QUEUE, ram.pack_queue as f64);
        out.put(&REPACK_QUEUE, ram.repack_queue as f64);
        out.count(&PACKED_BLOCKS, &self.packed_blocks);
        out.count(&RECOMPRESSIONS, &self.recompressions);
        out.seconds(&COMPRESS_CPU, &self.compress_cpu_ns);
        out.seconds(&DECOMPRESS_CPU, &self.decompress_cpu_ns);
        out.put(&DECODED_ENTRIES, ram.decoded_entries as f64);
        out.put(&DECODED_BYTES, ram.decoded_bytes as f64);
        out.put(&DECODED_LOGICAL_BYTES, ram.decoded_logical_bytes as f64);
        out.count(&DECODED_HITS, &self.decoded_hits);
        out.count(&DECODED_MISSES, &self.decoded_misses);
        out.count(&DECODED_ADMITTED, &self.decoded_admitted);
        out.count(&DECODED_DECLINED, &self.decoded_declined);
        out.count(&DECODED_REJECTED, &self.decoded_rejected);
        out.count(&DECODED_YIELDED, &self.decoded_yielded);
        out.count(&DECODED_KEPT_RAW, &self.decoded_kept_raw);
        out.put(&MARKED_ENTRIES, ram.marked_entries as f64);
        out.put(&MARKED_BYTES, ram.marked_bytes as f64);
        out.count(&MARKED_HITS, &self.marked_hits);
        out.count(&MARKED_ADMITTED, &self.marked_admitted);
        out.count(&MARKED_REPLACED, &self.marked_replaced);
        out.count(&SOURCE_BYTES, &self.source_bytes);
        out.count(&SOURCE_READS, &self.source_reads);
        out.count(&SOURCE_ERRORS, &self.source_errors);
        out.count(&SOURCE_UNSETTLED, &self.unsettled_reads);
        out.latency(&SOURCE_LATENCY, &self.source_latency);
        out.put(&STAGED_BYTES, now.staged_bytes as f64);
        out.put(&STAGED_BUDGET_BYTES, now.staged_budget_bytes as f64);
        out.count(&STAGED_READS, &self.staged_reads);
        out.count(&STAGED_WASTED_BYTES, &self.staged_wasted_bytes);
        out.count(&PREFETCH_DISCARDED_BYTES, &self.prefetch_discarded_bytes);
        if let Some(d) = &now.disk {
            out.put(&DISK_ENTRIES, d.entries as f64);
            out.put(&DISK_BYTES, d.bytes as f64);
            out.put(&DISK_LOGICAL_BYTES, d.logical_bytes as f64);
            out.put(&DISK_CAPACITY_RATIO, ratio(d.logical_bytes, d.bytes));
            out.put(&DISK_BUDGET_BYTES, d.budget_bytes as f64);
            out.put(&DISK_FREE_BYTES, d.free_bytes as f64);
            out.flag(&DISK_SCANNED, d.scanned);
            out.count(&DISK_HITS, &self.disk_hits);
            out.count(&DISK_MISSES, &self.disk_misses);
            out.count(&DISK_WRITES, &self.disk_writes);
            out.count(&DISK_RECOMPRESSIONS, &self.disk_recompressions);
            out.count(&DISK_INTEGRITY_ERRORS, &self.disk_integrity_errors);
            out.count(&DISK_REJECTED, &self.disk_rejected);
            out.count(&DISK_DEFERRED, &self.disk_deferred);
            out.count(&DISK_RECALLED, &self.disk_recalled);
            out.count(&DISK_ENOSPC, &self.disk_enospc);
            out.count(&DISK_STALE_DROPPED, &self.disk_stale_dropped);
        }
    }
}
