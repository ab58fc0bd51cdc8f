//! Prefetch's figures: files fetched ahead and whether they were useful, late or wasted, the
//! planner's depth, and files opened or decoded ahead.
//!
//! Owns: these figures' definitions (path, Prometheus name, meaning) and their counters. Must
//! never count a figure another module owns (the staging buffer's are the cache's).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::{Counter, Metric, Samples};

/// Files fetched ahead.
pub const ISSUED: Metric = Metric::counter(
    "prefetch.issued",
    "prefetch_issued_total",
    "Files fetched ahead of their open.",
);
/// Prefetches that finished in time.
pub const USEFUL: Metric = Metric::counter(
    "prefetch.useful",
    "prefetch_useful_total",
    "Prefetched files opened in the same pass after their prefetch finished.",
);
/// Prefetches still running at the open.
pub const LATE: Metric = Metric::counter(
    "prefetch.late",
    "prefetch_late_total",
    "Prefetched files opened while their prefetch was still running.",
);
/// Prefetches never opened.
pub const WASTED: Metric = Metric::counter(
    "prefetch.wasted",
    "prefetch_wasted_total",
    "Prefetched files not opened before their pass ended.",
);
/// Blocks fetched ahead.
pub const BLOCKS: Metric = Metric::counter(
    "prefetch.blocks",
    "prefetch_blocks_total",
    "Blocks fetched ahead of the readers (whole files and sequential readahead).",
);
/// Failed prefetches.
pub const FAILED: Metric = Metric::counter(
    "prefetch.failed",
    "prefetch_failed_total",
    "Prefetches that failed; the reader's own read reports any error.",
);
/// Opens the planner missed.
pub const EVENTS_DROPPED: Metric = Metric::counter(
    "prefetch.events_dropped",
    "prefetch_events_dropped_total",
    "Opens the planner never saw because its queue was full.",
);
/// Files opened ahead.
pub const OPENED_AHEAD: Metric = Metric::counter(
    "prefetch.opened_ahead",
    "prefetch_opened_ahead_total",
    "Source files opened ahead of their readers when their bytes had no room.",
);
/// Opens saved.
pub const OPENS_SAVED: Metric = Metric::counter(
    "prefetch.opens_saved",
    "prefetch_opens_saved_total",
    "Reader opens that took a file opened ahead (no round trip to the source).",
);
/// Images decoded or rendered ahead.
pub const DECODED_AHEAD: Metric = Metric::counter(
    "prefetch.decoded_ahead",
    "prefetch_decoded_ahead_total",
    "View images prepared ahead of their opens: decoded into the cache, or rendered for the next open.",
);
/// Opens the planner took.
pub const PLANNED: Metric = Metric::counter(
    "prefetch.planner.opens",
    "prefetch_planner_opens_total",
    "Opens the planner took in (recorded and scored; a set plans after the latest of a backlog, and every quarter depth while its followed order is fetched ahead).",
);
/// CPU the planner spent on them.
pub const PLANNER_SECONDS: Metric = Metric::counter(
    "prefetch.planner.seconds",
    "prefetch_planner_seconds_total",
    "CPU time the planner thread spent on the opens it took.",
);
/// Items the planner examined.
pub const PLANNER_WORK: Metric = Metric::counter(
    "prefetch.planner.work",
    "prefetch_planner_work_total",
    "Candidate files, names and directories the planner examined for the opens it took (listings are its helper's).",
);
/// Memory the planner keeps for the files its sets have seen.
pub const PLANNER_BYTES: Metric = Metric::gauge(
    "prefetch.planner.bytes",
    "prefetch_planner_bytes",
    "Memory the planner keeps for the files its sets have seen, charged to the cache's slice of the budget.",
);
/// The planner's depth.
pub const DEPTH: Metric = Metric::gauge(
    "prefetch.depth",
    "prefetch_depth",
    "Files the planner keeps queued ahead of the readers (controller output).",
);
/// Files opened ahead, not yet taken.
pub const PARKED: Metric = Metric::gauge(
    "prefetch.parked",
    "prefetch_parked",
    "Source files opened ahead and not yet taken by a reader's open.",
);

/// Prefetch's counters.
#[derive(Debug, Default)]
pub struct PrefetchMetrics {
    /// See `ISSUED`.
    pub issued: Counter,
    /// See `USEFUL`.
    pub useful: Counter,
    /// See `LATE`.
    pub late: Counter,
    /// See `WASTED`.
    pub wasted: Counter,
    /// See `BLOCKS`.
    pub blocks: Counter,
    /// See `FAILED`.
    pub failed: Counter,
    /// See `EVENTS_DROPPED`.
    pub events_dropped: Counter,
    /// See `OPENED_AHEAD`.
    pub opened_ahead: Counter,
    /// See `OPENS_SAVED`.
    pub opens_saved: Counter,
    /// See `DECODED_AHEAD`.
    pub decoded_ahead: Counter,
    /// See `PLANNED`.
    pub planned: Counter,
    /// Nanoseconds of `PLANNER_SECONDS`.
    pub planner_ns: Counter,
    /// See `PLANNER_WORK`.
    pub planner_work: Counter,
    /// See `PLANNER_BYTES`.
    pub planner_bytes: AtomicU64,
}

impl PrefetchMetrics {
    /// The samples of these counters, with the planner's `depth` and the `parked` files now.
    pub fn samples(&self, depth: u64, parked: u64, out: &mut Samples) {
        out.count(&ISSUED, &self.issued);
        out.count(&USEFUL, &self.useful);
        out.count(&LATE, &self.late);
        out.count(&WASTED, &self.wasted);
        out.count(&BLOCKS, &self.blocks);
        out.count(&FAILED, &self.failed);
        out.count(&EVENTS_DROPPED, &self.events_dropped);
        out.count(&OPENED_AHEAD, &self.opened_ahead);
        out.count(&OPENS_SAVED, &self.opens_saved);
        out.count(&DECODED_AHEAD, &self.decoded_ahead);
        out.count(&PLANNED, &self.planned);
        out.seconds(&PLANNER_SECONDS, &self.planner_ns);
        out.count(&PLANNER_WORK, &self.planner_work);
        out.put(
            &PLANNER_BYTES,
            self.planner_bytes.load(Ordering::Relaxed) as f64,
        );
        out.put(&DEPTH, depth as f64);
        out.put(&PARKED, parked as f64);
    }
}
