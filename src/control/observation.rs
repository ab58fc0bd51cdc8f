//! What the machine and the pipeline look like now: one telemetry sample, in natural units.
//!
//! Owns: the observation's fields. `telemetry` fills them on the mount and the scheduler's
//! simulator from its model; the scheduler encodes them into its state vector
//! (`scheduler::state`; `working_set_fit`, `pixels_fit` and `working_set_whole` are telemetry's
//! only, not in the state yet; the decoded-caching rule reads them) and the views read them for the GPU placement rule. Must never read the
//! machine itself, nor normalise or score an observation.

/// One sample of the machine and the pipeline, in natural units.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Observation {
    /// Share of the machine's CPU time busy (all processes), 0..=1.
    pub cpu_busy: f64,
    /// Share of the machine's CPU time that prepfs used, 0..=1.
    pub cpu_prepfs: f64,
    /// Share of memory available, 0..=1.
    pub memory_available: f64,
    /// The GPU, when there is one.
    pub gpu: Option<GpuObservation>,
    /// Bytes per second the source delivered per fetch recently (0: no fetch yet).
    pub source_bytes_per_s: f64,
    /// Median source fetch latency, seconds.
    pub source_latency_s: f64,
    /// Items (source files, view tensors) consumers opened per second.
    pub request_rate: f64,
    /// Median load latency of an item (its open to its release), seconds.
    pub latency_p50_s: f64,
    /// 99th percentile load latency, seconds.
    pub latency_p99_s: f64,
    /// Share of wall time consumers waited on prepfs (fetch + prep stalls, summed over readers,
    /// per second of wall time; capped at 1).
    pub stall_share: f64,
    /// Renders waiting for a worker, as a share of the queue's capacity.
    pub render_queue: f64,
    /// Files queued for prefetch, as a share of the depth limit.
    pub prefetch_queue: f64,
    /// Share of the cache budget in use.
    pub cache_fill: f64,
    /// Share of reads served from the cache recently.
    pub hit_rate: f64,
    /// Whether the disk tier is on.
    pub disk_tier: bool,
    /// How many times the readers' working set, as encoded files, fits the RAM tier's share of
    /// the budget (`fit`; 0: not known yet).
    pub working_set_fit: f64,
    /// How many times the decoded pixels of the views' working set fit it (0: no view read yet):
    /// whether keeping pixels can serve a whole epoch.
    pub pixels_fit: f64,
    /// Whether the two fits are a whole pass's: every file set read has ended a pass (in the
    /// first pass they count only the files read so far, so they only fall).
    pub working_set_whole: bool,
}

impl Observation {
    /// `working_set_fit` once it is a whole pass's (`None` before, or while nothing is known).
    pub fn whole_working_set_fit(&self) -> Option<f64> {
        (self.working_set_whole && self.working_set_fit > 0.0).then_some(self.working_set_fit)
    }
}

/// How many times `demand` bytes fit in `capacity` bytes; 0 when the demand is not known (0).
pub fn fit(capacity: f64, demand: f64) -> f64 {
    if demand > 0.0 && capacity.is_finite() {
        capacity.max(0.0) / demand
    } else {
        0.0
    }
}

/// GPU figures (NVML, or the simulator's model).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct GpuObservation {
    /// Share of time a kernel ran, 0..=1.
    pub busy: f64,
    /// Share of GPU memory free, 0..=1.
    pub memory_free: f64,
}
