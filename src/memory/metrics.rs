//! The memory budget's figures: the budget, each slice and what it holds, pressure, and what was
//! given back or refused.
//!
//! Owns: these figures' definitions (path, Prometheus name, meaning). Must never count: the
//! budget keeps its own figures (`MemoryGauges`), this only names them.

use super::{MemoryGauges, Use};
use crate::metrics::{Metric, Samples};

/// The whole budget.
pub const BUDGET_BYTES: Metric = Metric::gauge(
    "memory.budget_bytes",
    "memory_budget_bytes",
    "The hard memory budget of everything held for data (--cache-mem).",
);
/// Whether pressure holds admission.
pub const PRESSURE: Metric = Metric::gauge(
    "memory.pressure",
    "memory_pressure",
    "1 while memory pressure holds admission (little left under the cgroup or host limit).",
);
/// Times pressure began.
pub const PRESSURE_EVENTS: Metric = Metric::counter(
    "memory.pressure_events",
    "memory_pressure_events_total",
    "Times memory pressure began.",
);
/// Bytes given back.
pub const SHED_BYTES: Metric = Metric::counter(
    "memory.shed_bytes",
    "memory_shed_bytes_total",
    "Bytes given back under pressure or for a render: staged blocks, unread decoded pixels.",
);
/// Cached data given back under pressure.
pub const GIVEN_BACK_BYTES: Metric = Metric::counter(
    "memory.given_back_bytes",
    "memory_given_back_bytes_total",
    "Bytes of cached source data the RAM tier gave back because memory was still short after shedding.",
);
/// Admission held back since pressure.
pub const HELD_BACK_BYTES: Metric = Metric::gauge(
    "memory.held_back_bytes",
    "memory_held_back_bytes",
    "Bytes of the budget cache and staging may not take since memory pressure, until that much is seen free.",
);
/// Memory left under the limit.
pub const LEFT_BYTES: Metric = Metric::gauge(
    "memory.left_bytes",
    "memory_left_bytes",
    "Memory left under the cgroup's limit (file pages counted as free), else the host's available memory, at the pressure watch's last look.",
);
/// Heap trims.
pub const HEAP_TRIMS: Metric = Metric::counter(
    "memory.heap_trims",
    "memory_heap_trims_total",
    "Times the heap's freed pages (drained staging, finished reads and renders) went back to the kernel.",
);
/// Renders that waited.
pub const RENDER_WAITS: Metric = Metric::counter(
    "memory.render_waits",
    "memory_render_waits_total",
    "Renders that waited for room in the budget.",
);
/// Renders refused.
pub const RENDER_REFUSALS: Metric = Metric::counter(
    "memory.render_refusals",
    "memory_render_refusals_total",
    "Renders refused memory (larger than the budget, or no room in time): EIO.",
);
/// Each use's slice.
pub const SLICE_BYTES: Metric = Metric::gauge(
    "memory.*.slice_bytes",
    "memory_slice_bytes",
    "Bytes of the budget this use may hold (work: what cache and staging leave).",
)
.by("use");
/// What each use holds.
pub const USED_BYTES: Metric = Metric::gauge(
    "memory.*.used_bytes",
    "memory_used_bytes",
    "Bytes of the budget this use holds now.",
)
.by("use");

impl MemoryGauges {
    /// The samples of these figures.
    pub fn samples(&self, out: &mut Samples) {
        out.put(&BUDGET_BYTES, self.limit as f64);
        out.flag(&PRESSURE, self.pressure);
        out.put(&PRESSURE_EVENTS, self.pressure_events as f64);
        out.put(&SHED_BYTES, self.shed_bytes as f64);
        out.put(&GIVEN_BACK_BYTES, self.given_back_bytes as f64);
        out.put(&HELD_BACK_BYTES, self.held_back as f64);
        out.put(&LEFT_BYTES, self.left as f64);
        out.put(&HEAP_TRIMS, self.heap_trims as f64);
        out.put(&RENDER_WAITS, self.waits as f64);
        out.put(&RENDER_REFUSALS, self.refused as f64);
        for (i, use_) in Use::ALL.into_iter().enumerate() {
            out.put_for(&SLICE_BYTES, use_.name(), self.slices[i] as f64);
            out.put_for(&USED_BYTES, use_.name(), self.used[i] as f64);
        }
    }
}
