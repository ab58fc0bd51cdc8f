//! The machines, sources and workloads the simulator runs: named scenarios for tests and the
//! benchmark, random ones drawn around a calibration for training.
//!
//! Owns: the scenario (cores, memory, cache budget, GPU model, source model, per-item costs,
//! dataset size, the consumer's rate and outstanding requests, background load and source
//! throttling over time) and how random ones are drawn. Must never run anything: the engine
//! steps a scenario.

use super::calibration::Calibration;
use crate::scheduler::rng::Rng;

/// The simulated GPU: one device, work queued first come first served.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuModel {
    /// GPU seconds to decode one image (nvJPEG, batch of one).
    pub decode_s: f64,
    /// GPU seconds to augment one image.
    pub augment_s: f64,
    /// Wall seconds per submission that do not occupy the GPU: transfers, launch, sync.
    pub overhead_s: f64,
    /// CPU seconds to prepare and submit one image.
    pub submit_cpu_s: f64,
    /// Share of the GPU busy with other work (the trainer); it slows prepfs' kernels.
    pub background: f64,
    /// Share of GPU memory free.
    pub memory_free: f64,
}

impl Default for GpuModel {
    /// A GPU about 5x faster per image than a core, but with ~1 ms of transfer and sync per
    /// image: it loses to an idle core and wins against a saturated CPU.
    fn default() -> GpuModel {
        GpuModel {
            decode_s: 0.12e-3,
            augment_s: 0.04e-3,
            overhead_s: 1.0e-3,
            submit_cpu_s: 0.03e-3,
            background: 0.3,
            memory_free: 0.6,
        }
    }
}

/// The dataset's source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceModel {
    /// Bandwidth shared by all fetches in flight, bytes per second.
    pub bytes_per_s: f64,
    /// Latency of one fetch before bytes flow, seconds.
    pub latency_s: f64,
    /// Fetches in flight at most.
    pub concurrency: usize,
}

/// A machine, a source and a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Short name for tables.
    pub name: String,
    /// CPU cores.
    pub cores: usize,
    /// Machine memory, bytes.
    pub memory_bytes: f64,
    /// The cache's RAM budget, bytes.
    pub cache_bytes: f64,
    /// The GPU, if any.
    pub gpu: Option<GpuModel>,
    /// The source.
    pub source: SourceModel,
    /// Per-item costs.
    pub costs: Calibration,
    /// Images in the dataset.
    pub items: usize,
    /// Images per second the consumer (the training loop) wants.
    pub consumer_rate: f64,
    /// Requests the consumer keeps outstanding at most (loader workers times prefetch factor).
    pub outstanding: usize,
    /// Background CPU load as `(from time s, share of cores busy)`, piecewise constant.
    pub background: Vec<(f64, f64)>,
    /// Source throttling as `(from time s, factor on bandwidth)`, piecewise constant.
    pub throttle: Vec<(f64, f64)>,
}

impl Scenario {
    /// Decode-bound: a busy 4-core machine (95% background load) wants 3,000 img/s from a fast
    /// local source, with room for every file and most of the pixels.
    pub fn cpu_bound() -> Scenario {
        let costs = Calibration::default();
        Scenario {
            name: "cpu_bound".into(),
            cores: 4,
            memory_bytes: 16e9,
            cache_bytes: 2e9,
            gpu: None,
            source: SourceModel {
                bytes_per_s: 1e9,
                latency_s: 0.1e-3,
                concurrency: 8,
            },
            items: 4000,
            consumer_rate: 3000.0,
            outstanding: 16,
            background: vec![(0.0, 0.95)],
            throttle: vec![],
            costs,
        }
    }

    /// Source-bound: an 8-core machine reads from a 100 MB/s, 20 ms source and the dataset is
    /// larger than the cache, so every epoch fetches.
    pub fn io_bound() -> Scenario {
        let costs = Calibration {
            source_bytes_per_s: 100e6,
            source_latency_s: 20e-3,
            ..Calibration::default()
        };
        Scenario {
            name: "io_bound".into(),
            cores: 8,
            memory_bytes: 16e9,
            cache_bytes: 400e6,
            gpu: None,
            source: SourceModel {
                bytes_per_s: 100e6,
                latency_s: 20e-3,
                concurrency: 16,
            },
            items: 6000,
            consumer_rate: 600.0,
            outstanding: 16,
            background: vec![(0.0, 0.2)],
            throttle: vec![],
            costs,
        }
    }

    /// A load shift: a 4-core machine idles for 10 s, then a background job takes 95% of it.
    pub fn load_shift() -> Scenario {
        let mut s = Scenario::cpu_bound();
        s.name = "load_shift".into();
        s.source = SourceModel {
            bytes_per_s: 500e6,
            latency_s: 1e-3,
            concurrency: 8,
        };
        s.consumer_rate = 2500.0;
        s.background = vec![(0.0, 0.1), (10.0, 0.95)];
        s
    }

    /// The same scenario with (the default GPU) or without a GPU.
    pub fn with_gpu(mut self, gpu: bool) -> Scenario {
        self.gpu = gpu.then(GpuModel::default);
        if gpu && !self.name.ends_with("+gpu") {
            self.name.push_str("+gpu");
        }
        self
    }

    /// A random machine, source and workload around `calibration`, for training: costs x0.5..x2,
    /// 2-16 cores, half with a GPU, sources from 20 MB/s to 2 GB/s and 50 µs to 50 ms, caches
    /// from a third of the dataset's files to ten times them (where their decoded pixels, ~6x the
    /// JPEG bytes, fit too), loads that change up to twice.
    pub fn random(rng: &mut Rng, calibration: &Calibration) -> Scenario {
        let costs = calibration.jittered(rng, 0.5, 2.0);
        let cores = [2, 4, 8, 16][rng.below(4)];
        let items = 1000 + rng.below(7000);
        let per_item = costs.render() + costs.deliver();
        let capacity = cores as f64 / per_item;
        let consumer_rate = (capacity * rng.range(0.15, 1.0)).clamp(50.0, 3000.0);
        let gpu = (rng.f64() < 0.5).then(|| GpuModel {
            background: rng.range(0.0, 0.95),
            overhead_s: GpuModel::default().overhead_s * rng.log_range(0.5, 2.0),
            ..GpuModel::default()
        });
        let mut background = vec![(0.0, rng.range(0.0, 1.0))];
        for _ in 0..rng.below(3) {
            let from = background.last().map_or(0.0, |b| b.0) + rng.range(3.0, 15.0);
            background.push((from, rng.range(0.0, 1.0)));
        }
        let throttle = if rng.f64() < 0.25 {
            vec![(rng.range(5.0, 20.0), rng.range(0.1, 1.0))]
        } else {
            vec![]
        };
        Scenario {
            name: "random".into(),
            cores,
            memory_bytes: 16e9,
            cache_bytes: items as f64 * costs.image_bytes * rng.log_range(0.33, 10.0),
            gpu,
            source: SourceModel {
                bytes_per_s: rng.log_range(20e6, 2e9),
                latency_s: rng.log_range(50e-6, 50e-3),
                concurrency: [4, 8, 16, 32][rng.below(4)],
            },
            items,
            consumer_rate,
            outstanding: [4, 8, 16, 32][rng.below(4)],
            background,
            throttle,
            costs,
        }
    }

    /// The value of a piecewise-constant schedule at time `t` (`default` before its first entry).
    pub(super) fn at(schedule: &[(f64, f64)], t: f64, default: f64) -> f64 {
        schedule
            .iter()
            .take_while(|(from, _)| *from <= t + 1e-9)
            .last()
            .map_or(default, |(_, v)| *v)
    }
}
