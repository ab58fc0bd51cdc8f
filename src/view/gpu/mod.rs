//! The GPU backend of tensor views and where each render runs.
//!
//! Owns opening the backend (probe the CUDA driver, compile the fused kernel with NVRTC, load
//! nvJPEG, reserve GPU memory within `--gpu-mem`), the `gpu` document of stats.json that says
//! what was found and why the backend is unavailable, and `Placed`: the executor the views use,
//! which sends each decode and each transform to the CPU or the GPU executor as the scheduler's
//! placement knobs say (or, while it does not hold them, the views' own placement rule
//! `prefers_gpu`; or `--gpu on|off`), so view code is the same for both. The CUDA parts
//! (`cuda`, `nvjpeg`) exist only with the `cuda` cargo feature; without it, or without a usable
//! GPU, the backend reports unavailable with a reason and every render runs on the CPU. Must
//! never panic when a library or device is missing, and never fail a render the CPU could do:
//! every GPU failure falls back to the CPU for that request, counted.

pub mod batch;
#[cfg(feature = "cuda")]
pub mod budget;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod libs;
#[cfg(feature = "cuda")]
pub mod nvjpeg;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use serde_json::{Value, json};

use super::{Cpu, Executor, Plan, RenderError, Rendered, Rgb, ViewSpec};
use crate::control::action::Placement;
use crate::control::knobs::Knobs;
use crate::control::observation::Observation;
use crate::telemetry::Telemetry;

/// Whether renders may use the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMode {
    /// Never: the backend is not opened, and the scheduler's GPU actions are masked.
    Off,
    /// When a usable GPU exists: the scheduler places each batch (its heuristic when it does
    /// not hold the placement knobs).
    Auto,
    /// Every render the GPU can do, when a usable GPU exists (benchmarks, GPU-only setups).
    On,
}

impl GpuMode {
    /// Parses `--gpu`.
    pub fn parse(text: &str) -> Option<GpuMode> {
        match text {
            "off" => Some(GpuMode::Off),
            "auto" => Some(GpuMode::Auto),
            "on" => Some(GpuMode::On),
            _ => None,
        }
    }

    /// The mode as `--gpu` spells it.
    pub fn name(self) -> &'static str {
        match self {
            GpuMode::Off => "off",
            GpuMode::Auto => "auto",
            GpuMode::On => "on",
        }
    }
}

/// Default `--gpu-mem`: training owns the GPU; prepfs keeps to a small, hard share.
pub const DEFAULT_GPU_MEMORY: u64 = 1 << 30;
/// Smallest `--gpu-mem`: below this a launch holds too few images to beat the CPU.
pub const MIN_GPU_MEMORY: u64 = 64 << 20;

/// The backend's settings (`--gpu`, `--gpu-mem`, `--nvjpeg`, `--nvrtc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuOptions {
    /// Whether renders may use the GPU.
    pub mode: GpuMode,
    /// Hard cap on the GPU memory prepfs allocates (kernel buffers and nvJPEG's own).
    pub memory: u64,
    /// nvJPEG library (file or directory), first in the search order.
    pub nvjpeg: Option<PathBuf>,
    /// NVRTC library (file or directory), first in the search order.
    pub nvrtc: Option<PathBuf>,
}

impl Default for GpuOptions {
    fn default() -> GpuOptions {
        GpuOptions {
            mode: GpuMode::Auto,
            memory: DEFAULT_GPU_MEMORY,
            nvjpeg: None,
            nvrtc: None,
        }
    }
}

/// What the GPU executor did, for stats.json.
#[derive(Debug, Default)]
pub struct GpuCounters {
    /// Transforms rendered by the kernel.
    pub transforms: AtomicU64,
    /// Images decoded by nvJPEG.
    pub decodes: AtomicU64,
    /// Transforms placed on the GPU that ran on the CPU (pipeline not fusable, image over the
    /// memory cap, queue full, device error).
    pub transform_fallbacks: AtomicU64,
    /// Decodes placed on the GPU that ran on the CPU (not a JPEG nvJPEG takes, no nvJPEG, error).
    pub decode_fallbacks: AtomicU64,
    /// Kernel launches.
    pub launches: AtomicU64,
    /// nvJPEG batches.
    pub decode_batches: AtomicU64,
    /// GPU memory allocated now, bytes (never above the cap).
    pub memory_used: AtomicU64,
}

/// What opening the backend found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuReport {
    /// Whether renders can run on the GPU.
    pub available: bool,
    /// Why not, when not.
    pub reason: Option<String>,
    /// The device's name and compute capability.
    pub device: Option<String>,
    /// Where NVRTC was loaded from.
    pub nvrtc: Option<String>,
    /// Whether the fused kernel compiled and loaded.
    pub kernels_compiled: bool,
    /// Where nvJPEG was loaded from (decoding stays on the CPU without it).
    pub nvjpeg: Option<String>,
    /// nvJPEG's backend: "hardware" (the JPEG engine) or "default".
    pub nvjpeg_backend: Option<String>,
    /// Why nvJPEG is not used, when it is not.
    pub nvjpeg_error: Option<String>,
}

/// The opened backend: its executor when usable, and what was found.
pub struct Gpu {
    /// Renders on the GPU; `None` when unavailable.
    pub executor: Option<Arc<dyn Executor>>,
    /// What was found.
    pub report: GpuReport,
    /// What the executor did.
    pub counters: Arc<GpuCounters>,
    options: GpuOptions,
}

impl Gpu {
    /// Opens the backend as `options` say. Never panics: a missing driver, device, library or
    /// memory makes it unavailable, with the reason in the report.
    pub fn open(options: &GpuOptions) -> Gpu {
        let counters = Arc::new(GpuCounters::default());
        let (executor, report) = match options.mode {
            GpuMode::Off => (
                None,
                GpuReport {
                    reason: Some("--gpu off".into()),
                    ..GpuReport::default()
                },
            ),
            GpuMode::Auto | GpuMode::On => open_backend(options, &counters),
        };
        if let Some(reason) = &report.reason {
            tracing::info!(reason = %reason, "GPU backend unavailable; views render on the CPU");
        }
        Gpu {
            executor,
            report,
            counters,
            options: options.clone(),
        }
    }

    /// Whether renders can run on the GPU (the scheduler's GPU actions are masked otherwise).
    pub fn available(&self) -> bool {
        self.executor.is_some()
    }

    /// The executor views render with: the CPU, and the GPU where placed.
    pub fn placed(&self, knobs: Arc<Knobs>, telemetry: Arc<Telemetry>) -> Placed {
        let rule = match self.options.mode {
            GpuMode::Off => Rule::Cpu,
            GpuMode::On => Rule::Gpu,
            GpuMode::Auto => Rule::Scheduled(Scheduled {
                knobs,
                telemetry,
                started: Instant::now(),
                checked_ms: AtomicU64::new(u64::MAX),
                prefers_gpu: AtomicBool::new(false),
            }),
        };
        Placed {
            gpu: self.executor.clone(),
            rule,
        }
    }

    /// The `gpu` document of stats.json.
    pub fn to_json(&self) -> Value {
        let r = &self.report;
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "built_with_cuda": cfg!(feature = "cuda"),
            "mode": self.options.mode.name(),
            "available": self.available(),
            "reason": r.reason,
            "device": r.device,
            "memory_cap_bytes": self.options.memory,
            "memory_used_bytes": n(&c.memory_used),
            "nvrtc": r.nvrtc,
            "kernels_compiled": r.kernels_compiled,
            "nvjpeg": {
                "found": r.nvjpeg.is_some(),
                "path": r.nvjpeg,
                "backend": r.nvjpeg_backend,
                "error": r.nvjpeg_error,
            },
            "transforms": n(&c.transforms),
            "decodes": n(&c.decodes),
            "transform_fallbacks": n(&c.transform_fallbacks),
            "decode_fallbacks": n(&c.decode_fallbacks),
            "launches": n(&c.launches),
            "decode_batches": n(&c.decode_batches),
        })
    }
}

#[cfg(not(feature = "cuda"))]
fn open_backend(
    _options: &GpuOptions,
    _counters: &Arc<GpuCounters>,
) -> (Option<Arc<dyn Executor>>, GpuReport) {
    (
        None,
        GpuReport {
            reason: Some("prepfs was built without the `cuda` cargo feature".into()),
            ..GpuReport::default()
        },
    )
}

#[cfg(feature = "cuda")]
fn open_backend(
    options: &GpuOptions,
    counters: &Arc<GpuCounters>,
) -> (Option<Arc<dyn Executor>>, GpuReport) {
    match cuda::GpuExecutor::open(options, counters.clone()) {
        Ok((executor, report)) => (Some(Arc::new(executor) as Arc<dyn Executor>), report),
        Err(report) => (None, *report),
    }
}

/// CPU busy share above which decoding moves to an idle GPU.
const GPU_WHEN_CPU_BUSY: f64 = 0.8;
/// GPU busy share below which the GPU counts as idle.
const GPU_IDLE: f64 = 0.5;

/// The placement rule: decode and augment on the GPU when the CPU is busy and the GPU idle. The
/// views apply it while the scheduler does not hold the placement knobs; the scheduler's
/// heuristic restates it.
pub fn prefers_gpu(obs: &Observation) -> bool {
    let gpu_idle = obs.gpu.is_some_and(|g| g.busy < GPU_IDLE);
    gpu_idle && obs.cpu_busy >= GPU_WHEN_CPU_BUSY
}

/// How often, at most, a released placement re-reads the telemetry: the scheduler's cadence.
const PLACEMENT_REFRESH_MS: u64 = 200;

/// The scheduler's placement knobs, and the heuristic's rule while it does not hold them.
pub struct Scheduled {
    knobs: Arc<Knobs>,
    telemetry: Arc<Telemetry>,
    started: Instant,
    checked_ms: AtomicU64,
    prefers_gpu: AtomicBool,
}

impl Scheduled {
    /// The heuristic's placement (`prefers_gpu`), from the latest telemetry sample, re-read at
    /// most every `PLACEMENT_REFRESH_MS`.
    fn heuristic(&self) -> Placement {
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.checked_ms.load(Ordering::Relaxed);
        if (last == u64::MAX || now >= last + PLACEMENT_REFRESH_MS)
            && self
                .checked_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let gpu = self
                .telemetry
                .latest()
                .is_some_and(|s| prefers_gpu(&s.observation));
            self.prefers_gpu.store(gpu, Ordering::Relaxed);
        }
        if self.prefers_gpu.load(Ordering::Relaxed) {
            Placement::Gpu
        } else {
            Placement::Cpu
        }
    }
}

/// Who decides where renders run.
pub enum Rule {
    /// Always the CPU.
    Cpu,
    /// The GPU for everything it can do.
    Gpu,
    /// The scheduler, per request (so per batch).
    Scheduled(Scheduled),
}

/// The executor of a mount's views: each decode and each transform goes to the CPU or the GPU
/// executor as `Rule` places it.
pub struct Placed {
    gpu: Option<Arc<dyn Executor>>,
    rule: Rule,
}

impl Placed {
    /// Routes by `rule` between the CPU and `gpu` (everything on the CPU when `None`).
    pub fn new(gpu: Option<Arc<dyn Executor>>, rule: Rule) -> Placed {
        Placed { gpu, rule }
    }

    fn pick(&self, knob: impl Fn(&Knobs) -> Option<Placement>) -> Option<&dyn Executor> {
        let gpu = self.gpu.as_deref()?;
        let placement = match &self.rule {
            Rule::Cpu => Placement::Cpu,
            Rule::Gpu => Placement::Gpu,
            Rule::Scheduled(s) => knob(&s.knobs).unwrap_or_else(|| s.heuristic()),
        };
        (placement == Placement::Gpu).then_some(gpu)
    }
}

impl Executor for Placed {
    fn name(&self) -> &'static str {
        "placed"
    }

    fn decode(&self, encoded: &[u8]) -> Result<Rgb, RenderError> {
        match self.pick(Knobs::decode) {
            Some(gpu) => gpu.decode(encoded),
            None => Cpu.decode(encoded),
        }
    }

    fn decode_as_parts_do(&self, encoded: &[u8]) -> Result<Option<Rgb>, RenderError> {
        match self.pick(Knobs::decode) {
            Some(gpu) => gpu.decode_as_parts_do(encoded),
            None => Cpu.decode_as_parts_do(encoded),
        }
    }

    fn transform(
        &self,
        spec: &ViewSpec,
        image: &Rgb,
        plan: &Plan,
    ) -> Result<Rendered, RenderError> {
        match self.pick(Knobs::augment) {
            Some(gpu) => gpu.transform(spec, image, plan),
            None => Cpu.transform(spec, image, plan),
        }
    }

    fn render(
        &self,
        spec: &ViewSpec,
        encoded: &[u8],
        plan: &Plan,
    ) -> Result<Rendered, RenderError> {
        // All on the CPU: it decodes only what the render reads. So does a render that reads
        // its JPEG DCT-scaled, wherever it is placed: a whole decode then a resize is another
        // low-pass, and its bytes must not depend on the placement (nor on the cache).
        let on_cpu = self.pick(Knobs::decode).is_none() && self.pick(Knobs::augment).is_none();
        if on_cpu || plan.reads_scaled() {
            return Cpu.render(spec, encoded, plan);
        }
        super::decoded_then_transformed(self, spec, encoded, plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::action::{Action, Head};
    use std::time::Duration;

    /// A GPU stand-in that marks its renders, so routing is visible.
    struct Marked;

    impl Executor for Marked {
        fn name(&self) -> &'static str {
            "marked"
        }
        fn decode(&self, _: &[u8]) -> Result<Rgb, RenderError> {
            Rgb::from_raw(1, 1, vec![7, 7, 7])
        }
        fn transform(&self, _: &ViewSpec, _: &Rgb, _: &Plan) -> Result<Rendered, RenderError> {
            Ok(Rendered {
                npy: b"gpu".to_vec(),
                decode: Duration::ZERO,
                transform: Duration::ZERO,
                crops: Vec::new(),
                flipped: false,
            })
        }
    }

    fn scheduled(knobs: Arc<Knobs>) -> Rule {
        Rule::Scheduled(Scheduled {
            knobs,
            telemetry: Arc::new(Telemetry::default()),
            started: Instant::now(),
            checked_ms: AtomicU64::new(u64::MAX),
            prefers_gpu: AtomicBool::new(false),
        })
    }

    #[test]
    fn a_render_that_reads_its_jpeg_scaled_renders_on_the_cpu_wherever_it_is_placed() {
        let jpeg = crate::view::jpeg::tests::encoded(1000, 700, turbojpeg::Subsamp::Sub2x2, false);
        let on_gpu = Placed::new(Some(Arc::new(Marked)), Rule::Gpu);
        for (view, scaled) in [
            ("s=decode,resize(64),uint8", true),
            ("f=decode,resize(700),uint8", false),
        ] {
            let spec = ViewSpec::parse(view).expect("parses");
            let plan = Plan::new(&spec, (1000, 700), 0).expect("plans");
            assert_eq!(plan.reads_scaled(), scaled, "{view}");
            let rendered = on_gpu.render(&spec, &jpeg, &plan).expect("renders").npy;
            assert_eq!(rendered == b"gpu", !scaled, "{view}");
            if scaled {
                assert_eq!(
                    rendered,
                    Cpu.render(&spec, &jpeg, &plan).expect("renders").npy
                );
            }
        }
    }

    #[test]
    fn decode_and_augment_follow_their_own_placement_knobs() {
        let jpeg = crate::synthetic::photo(1).expect("jpeg");
        let spec = ViewSpec::parse("t=decode,center_crop(2),uint8").expect("parses");
        let knobs = Arc::new(Knobs::default());
        let placed = Placed::new(Some(Arc::new(Marked)), scheduled(knobs.clone()));
        let on_gpu = |p: &Placed| {
            let decoded = p.decode(&jpeg).expect("decodes").size() == (1, 1);
            let image = Rgb::from_raw(4, 4, vec![1; 48]).expect("image");
            let plan = Plan::new(&spec, image.size(), 0).expect("plans");
            let transformed = p.transform(&spec, &image, &plan).expect("renders").npy == b"gpu";
            (decoded, transformed)
        };
        assert_eq!(
            on_gpu(&placed),
            (false, false),
            "released, no telemetry: CPU"
        );
        let a = Action::default()
            .with(Head::Decode, 1)
            .with(Head::Augment, 0);
        knobs.apply(&a, 2);
        assert_eq!(on_gpu(&placed), (true, false));
        knobs.apply(&a.with(Head::Decode, 0).with(Head::Augment, 1), 2);
        assert_eq!(on_gpu(&placed), (false, true));
        let without_gpu = Placed::new(None, scheduled(knobs));
        assert_eq!(
            on_gpu(&without_gpu),
            (false, false),
            "no GPU: CPU whatever the knobs"
        );
        assert_eq!(
            on_gpu(&Placed::new(Some(Arc::new(Marked)), Rule::Gpu)),
            (true, true)
        );
        assert_eq!(
            on_gpu(&Placed::new(Some(Arc::new(Marked)), Rule::Cpu)),
            (false, false)
        );
    }

    #[test]
    fn an_unusable_backend_reports_why_and_renders_stay_on_the_cpu() {
        let off = Gpu::open(&GpuOptions {
            mode: GpuMode::Off,
            ..GpuOptions::default()
        });
        assert!(!off.available());
        assert_eq!(off.report.reason.as_deref(), Some("--gpu off"));
        let auto = Gpu::open(&GpuOptions::default());
        let doc = auto.to_json();
        assert_eq!(doc["available"], json!(auto.available()));
        if !auto.available() {
            let reason = auto.report.reason.clone().expect("a reason");
            assert!(!reason.is_empty());
            assert_eq!(doc["reason"], json!(reason));
            assert_eq!(doc["kernels_compiled"], json!(false));
        }
        if !cfg!(feature = "cuda") {
            assert!(!auto.available());
            assert!(
                auto.report
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.contains("`cuda` cargo feature"))
            );
        }
    }
}
