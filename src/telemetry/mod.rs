//! Telemetry: cheap, continuous measurements of the machine and the pipeline, which the codec
//! policy and the scheduler read.
//!
//! Owns: the sampler thread and what it produced: the machine's CPU idle share (every 100 ms,
//! smoothed over about a second, one atomic load to read), and every 200 ms a full `Sample`:
//! machine and prepfs CPU, memory, GPU (NVML), the source device (/proc/diskstats), and the
//! pipeline's own counters (request rate, load latency p50/p99, stalls, hit rate, queues, cache
//! fill) over the last second; plus a one-sample-per-second history for stats.json. Must never
//! sit on a request path, and never fail a mount: what cannot be read stays at its last value
//! or is absent.

mod gpu;
pub(crate) mod proc;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use crate::control::observation::{Observation, fit};
use crate::metrics::quantile_us;

/// Sampling period of the CPU figures: /proc/stat costs ~25 µs to read, so 10 samples a second
/// are free.
const PERIOD: Duration = Duration::from_millis(100);
/// Full samples are taken every this many periods (200 ms: the scheduler's cadence).
const FULL_EVERY: u64 = 2;
/// GPU queries every this many periods (500 ms): an NVML query can take a millisecond.
const GPU_EVERY: u64 = 5;
/// Window of the rates and quantiles in a full sample, in full samples (~1 s).
const WINDOW: usize = 5;
/// Samples kept in the history (one a second: the last half minute).
const HISTORY: usize = 30;
/// Weight of a new sample in the idle share's moving average: ~1 s of memory at 100 ms.
const SMOOTHING: f64 = 0.2;

/// Cumulative counters and current gauges of the pipeline, read from the mount by the sampler.
#[derive(Debug, Clone, Default)]
pub struct Pipeline {
    /// Items opened by consumers (source files and view tensors).
    pub requests: u64,
    /// Bucket counts of the items' load latency, open to release (`Histogram::counts`).
    pub latency: Vec<u64>,
    /// Nanoseconds consumers waited on prepfs (fetch + prep stalls).
    pub stall_ns: u64,
    /// Reads served from the cache.
    pub hits: u64,
    /// Reads that went to the source.
    pub misses: u64,
    /// Bytes fetched from the source.
    pub source_bytes: u64,
    /// Nanoseconds source fetches took (summed over fetches).
    pub source_busy_ns: u64,
    /// Bucket counts of the source fetch latency.
    pub source_latency: Vec<u64>,
    /// Renders waiting for a worker, as a share of the queue's capacity.
    pub render_queue: f64,
    /// Files queued for prefetch, as a share of the depth limit.
    pub prefetch_queue: f64,
    /// Share of the cache budget in use.
    pub cache_fill: f64,
    /// Whether the disk tier is on.
    pub disk_tier: bool,
    /// Bytes of the RAM tier's share of the budget.
    pub cache_bytes: u64,
    /// Bytes the readers' working set takes as encoded files (0: not known yet).
    pub working_set_bytes: u64,
    /// Bytes the views' working set takes as decoded pixels (0: no view read yet).
    pub pixel_set_bytes: u64,
    /// Whether those are a whole pass's (every set read has ended one).
    pub working_set_whole: bool,
}

/// How the sampler reads the pipeline (a closure over the mount's metrics and components).
pub type Probe = Box<dyn Fn() -> Pipeline + Send>;

/// The source's block device, from /proc/diskstats.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DeviceSample {
    /// Bytes per second read from the device by anyone (prepfs, the page cache's readahead,
    /// other processes) over the last second.
    pub read_bytes_per_s: f64,
    /// Mean time a read request spent on the device, seconds.
    pub read_latency_s: f64,
}

/// One full sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Milliseconds since the sampler started.
    pub at_ms: u64,
    /// The figures the scheduler's state is made of.
    #[serde(flatten)]
    pub observation: Observation,
    /// The source's block device, when it is one.
    pub source_device: Option<DeviceSample>,
}

/// The latest figures, shared with every reader.
#[derive(Debug)]
pub struct Telemetry {
    /// Share of CPU time the whole machine spent idle recently, 0..=1, as f64 bits.
    cpu_idle: AtomicU64,
    latest: Mutex<Option<Sample>>,
    history: Mutex<VecDeque<Sample>>,
}

impl Default for Telemetry {
    fn default() -> Telemetry {
        // Until the first sample arrives, assume a half-busy machine: neither extreme.
        Telemetry {
            cpu_idle: AtomicU64::new(0.5f64.to_bits()),
            latest: Mutex::new(None),
            history: Mutex::new(VecDeque::new()),
        }
    }
}

impl Telemetry {
    /// Share of the machine's CPU time spent idle over about the last second (0..=1).
    pub fn cpu_idle(&self) -> f64 {
        f64::from_bits(self.cpu_idle.load(Ordering::Relaxed))
    }

    /// Sets the idle share (the sampler, and tests that need a given load).
    pub fn set_cpu_idle(&self, idle: f64) {
        self.cpu_idle
            .store(idle.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    /// The latest full sample (`None` until the first, ~1 s after the start).
    pub fn latest(&self) -> Option<Sample> {
        self.latest.lock().clone()
    }

    /// Makes `observation` the latest sample (tests of what reads it).
    #[cfg(test)]
    pub(crate) fn observe_for_test(&self, observation: Observation) {
        self.publish(Sample {
            at_ms: 0,
            observation,
            source_device: None,
        });
    }

    /// The latest sample's `Observation::whole_working_set_fit`.
    pub fn whole_working_set_fit(&self) -> Option<f64> {
        self.latest
            .lock()
            .as_ref()
            .and_then(|s| s.observation.whole_working_set_fit())
    }

    /// Stats document: the latest sample and the history, oldest first.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "period_ms": (PERIOD.as_millis() as u64) * FULL_EVERY,
            "latest": *self.latest.lock(),
            "history": *self.history.lock(),
        })
    }

    fn publish(&self, sample: Sample) {
        let mut history = self.history.lock();
        let due = history
            .back()
            .is_none_or(|last| sample.at_ms >= last.at_ms + 1000);
        if due {
            if history.len() == HISTORY {
                history.pop_front();
            }
            history.push_back(sample.clone());
        }
        drop(history);
        *self.latest.lock() = Some(sample);
    }
}

/// What the sampler measures beyond the machine.
pub struct Sources {
    /// The mount's pipeline; `None` samples the machine only.
    pub probe: Option<Probe>,
    /// A path on the source's filesystem, to find its block device.
    pub source_root: Option<PathBuf>,
}

/// The thread that keeps a `Telemetry` current; stops when dropped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling into `telemetry`. Without a thread (resource limits) the figures stay
    /// at their defaults and a warning is logged.
    pub fn start(telemetry: Arc<Telemetry>, sources: Sources) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("prepfs-telemetry".into())
            .spawn(move || sample(&telemetry, sources, &flag))
            .inspect_err(|e| tracing::warn!(error = %e, "cannot start the telemetry sampler"))
            .ok();
        Sampler { stop, thread }
    }
}

/// Cumulative readings at one instant; a full sample compares two of them.
struct Reading {
    at: Instant,
    cpu: Option<(u64, u64)>,
    own_cpu: Duration,
    pipeline: Pipeline,
    disk: Option<proc::DiskCounters>,
}

fn sample(telemetry: &Telemetry, sources: Sources, stop: &AtomicBool) {
    let start = Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let device = sources.source_root.as_deref().and_then(proc::device_of);
    let gpu = gpu::Gpu::probe();
    let mut gpu_now = gpu.sample();
    let read = |cpu| Reading {
        at: Instant::now(),
        cpu,
        own_cpu: proc::own_cpu(),
        pipeline: sources.probe.as_ref().map(|p| p()).unwrap_or_default(),
        disk: device.and_then(|(major, minor)| proc::disk_counters(major, minor)),
    };
    let mut last_cpu = proc::cpu_ticks();
    let mut window: VecDeque<Reading> = VecDeque::from([read(last_cpu)]);
    let mut first = true;
    let mut tick = 0u64;
    while !stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(PERIOD);
        tick += 1;
        let now = proc::cpu_ticks();
        if let (Some((idle0, total0)), Some((idle1, total1))) = (last_cpu, now)
            && total1 > total0
        {
            let idle = (idle1.saturating_sub(idle0)) as f64 / (total1 - total0) as f64;
            let smoothed = if first {
                idle
            } else {
                telemetry.cpu_idle() * (1.0 - SMOOTHING) + idle * SMOOTHING
            };
            telemetry.set_cpu_idle(smoothed);
            first = false;
        }
        last_cpu = now.or(last_cpu);
        if tick.is_multiple_of(GPU_EVERY) {
            gpu_now = gpu.sample();
        }
        if !tick.is_multiple_of(FULL_EVERY) {
            continue;
        }
        let newest = read(now);
        if let Some(oldest) = window.front() {
            let observation = Observation {
                gpu: gpu_now,
                ..observe(oldest, &newest, cores)
            };
            telemetry.publish(Sample {
                at_ms: start.elapsed().as_millis() as u64,
                observation,
                source_device: device_rate(oldest, &newest),
            });
        }
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(newest);
    }
}

/// The figures between two readings.
fn observe(old: &Reading, new: &Reading, cores: f64) -> Observation {
    let secs = new.at.duration_since(old.at).as_secs_f64().max(1e-3);
    let (p0, p1) = (&old.pipeline, &new.pipeline);
    let cpu_busy = match (old.cpu, new.cpu) {
        (Some((i0, t0)), Some((i1, t1))) if t1 > t0 => {
            1.0 - (i1.saturating_sub(i0)) as f64 / (t1 - t0) as f64
        }
        _ => 0.0,
    };
    let own = new.own_cpu.saturating_sub(old.own_cpu).as_secs_f64();
    let diff = |a: &[u64], b: &[u64]| -> Vec<u64> {
        b.iter()
            .zip(a.iter().chain(std::iter::repeat(&0)))
            .map(|(b, a)| b.saturating_sub(*a))
            .collect()
    };
    let latency = diff(&p0.latency, &p1.latency);
    let source_latency = diff(&p0.source_latency, &p1.source_latency);
    let hits = p1.hits.saturating_sub(p0.hits) as f64;
    let misses = p1.misses.saturating_sub(p0.misses) as f64;
    let busy_s = p1.source_busy_ns.saturating_sub(p0.source_busy_ns) as f64 / 1e9;
    let fetched = p1.source_bytes.saturating_sub(p0.source_bytes) as f64;
    Observation {
        cpu_busy,
        cpu_prepfs: (own / secs / cores).clamp(0.0, 1.0),
        memory_available: proc::memory_available().unwrap_or(1.0),
        gpu: None,
        source_bytes_per_s: if busy_s > 0.0 { fetched / busy_s } else { 0.0 },
        source_latency_s: quantile_us(&source_latency, 0.5) / 1e6,
        request_rate: p1.requests.saturating_sub(p0.requests) as f64 / secs,
        latency_p50_s: quantile_us(&latency, 0.5) / 1e6,
        latency_p99_s: quantile_us(&latency, 0.99) / 1e6,
        stall_share: (p1.stall_ns.saturating_sub(p0.stall_ns) as f64 / 1e9 / secs).min(1.0),
        render_queue: p1.render_queue,
        prefetch_queue: p1.prefetch_queue,
        cache_fill: p1.cache_fill,
        hit_rate: if hits + misses > 0.0 {
            hits / (hits + misses)
        } else {
            1.0
        },
        disk_tier: p1.disk_tier,
        working_set_fit: fit(p1.cache_bytes as f64, p1.working_set_bytes as f64),
        pixels_fit: fit(p1.cache_bytes as f64, p1.pixel_set_bytes as f64),
        working_set_whole: p1.working_set_whole,
    }
}

fn device_rate(old: &Reading, new: &Reading) -> Option<DeviceSample> {
    let (d0, d1) = (old.disk?, new.disk?);
    let secs = new.at.duration_since(old.at).as_secs_f64().max(1e-3);
    let reads = d1.reads.saturating_sub(d0.reads);
    Some(DeviceSample {
        read_bytes_per_s: d1.bytes.saturating_sub(d0.bytes) as f64 / secs,
        read_latency_s: if reads > 0 {
            d1.read_ms.saturating_sub(d0.read_ms) as f64 / 1e3 / reads as f64
        } else {
            0.0
        },
    })
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64 as Counter;

    #[test]
    fn the_sampler_measures_the_machine_and_the_pipeline() {
        let telemetry = Arc::new(Telemetry::default());
        telemetry.set_cpu_idle(2.0);
        assert_eq!(telemetry.cpu_idle(), 1.0, "clamped");
        let sentinel = 0.123_456_789;
        telemetry.set_cpu_idle(sentinel);
        // A pipeline that serves 100 requests per probe, all 1 ms, half of them hits.
        let calls = Arc::new(Counter::new(0));
        let c = calls.clone();
        let probe: Probe = Box::new(move || {
            let n = c.fetch_add(1, Ordering::Relaxed) + 1;
            let h = crate::metrics::Histogram::default();
            for _ in 0..n * 100 {
                h.record(Duration::from_millis(1));
            }
            Pipeline {
                requests: n * 100,
                latency: h.counts(),
                hits: n * 50,
                misses: n * 50,
                cache_fill: 0.25,
                ..Pipeline::default()
            }
        });
        let sampler = Sampler::start(
            telemetry.clone(),
            Sources {
                probe: Some(probe),
                source_root: Some(PathBuf::from("/")),
            },
        );
        std::thread::sleep(PERIOD * 12);
        drop(sampler);
        let idle = telemetry.cpu_idle();
        assert!(idle != sentinel && (0.0..=1.0).contains(&idle), "{idle}");
        let s = telemetry.latest().expect("a full sample after 1.2 s");
        let o = s.observation;
        assert!(o.request_rate > 100.0, "{o:?}");
        assert!((0.0005..0.002).contains(&o.latency_p50_s), "{o:?}");
        assert!((o.hit_rate - 0.5).abs() < 1e-9 && o.cache_fill == 0.25);
        assert!((0.0..=1.0).contains(&o.cpu_busy) && o.memory_available > 0.0);
        let json = telemetry.to_json();
        assert_eq!(json["latest"]["cache_fill"], 0.25);
        assert!(!json["history"].as_array().unwrap().is_empty());
    }
}
