//! The CUDA side of the GPU backend: probing the driver, compiling the fused kernel with NVRTC,
//! and the device threads that run batched kernel launches and batched nvJPEG decodes.
//!
//! Owns every CUDA object (context, streams, device and pinned buffers, the kernel module):
//! buffers are allocated once at open, sized from `--gpu-mem`, so the cap holds by construction
//! (nvJPEG's own allocations are charged to the same budget). Each launch splits its batch over
//! two streams ("lanes"), so one lane's upload overlaps the other's kernel. Must never call into
//! cudarc before probing for the library it loads (cudarc panics when a library is missing),
//! never let a device error fail a request (the executor renders that request on the CPU), and
//! never hold GPU memory beyond the budget.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PinnedHostSlice,
    PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::{CompileOptions, Ptx};
use libloading::Library;
use parking_lot::Mutex;

use super::batch::{Batcher, Gathering};
use super::budget::Budget;
use super::libs::{self, Candidate, Lib};
use super::nvjpeg::{self, Nvjpeg};
use super::{GpuCounters, GpuOptions, GpuReport};
use crate::view::fused::{self, Fused, Item, Launch};
use crate::view::render;
use crate::view::{Executor, Plan, RenderError, Rendered, Rgb, ViewSpec};

/// The fused kernel's CUDA source.
pub const KERNEL_SOURCE: &str = include_str!("kernel.cu");
/// Its entry point.
const KERNEL: &str = "render_batch";
/// Threads per block: one per output pixel; 256 keeps several blocks per SM at ~40 registers.
const BLOCK: u32 = 256;
/// Streams a batch is split over, so copies of one overlap the kernel of the other.
const LANES: usize = 2;
/// Most images per launch (grid.y; far below CUDA's 65535).
const MAX_JOBS: usize = 512;
/// How long the device thread waits to fill a batch after its first job: a CPU render takes
/// ~1 ms per core, so a few ms gathers the render pool's concurrent requests.
const GATHER: Duration = Duration::from_millis(2);
/// A batch closes once no job came for this long: jobs that arrive together (one decode batch's
/// images going on to their transforms, within tens of µs) share a launch, and a lone job is not
/// held for the rest of `GATHER`. Measured on an H200 (8 DataLoader workers, 4 cores; with the
/// blocking waits below): 565 images/s when every render waited out two gathers, 1,240 with it.
const QUIET: Duration = Duration::from_micros(200);
/// Jobs queued beyond the batch being gathered (render workers block on their job, so this
/// only bounds bursts).
const QUEUE: usize = 1024;

// SAFETY: `Item` is `#[repr(C)]`, plain data, laid out as kernel.cu's `struct Item`; all-zero
// bits are a valid `Item`.
unsafe impl DeviceRepr for Item {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for Item {}

/// Libraries loaded by path, kept loaded for the process (cudarc finds them by soname).
static PRELOADED: Mutex<Vec<Library>> = Mutex::new(Vec::new());

/// Makes NVRTC loadable for cudarc by the documented search order: a library found by path is
/// loaded first, so cudarc's load by soname finds it. Returns where it was found.
pub fn locate_nvrtc(explicit: Option<&Path>) -> Result<String, String> {
    let mut tried = Vec::new();
    for candidate in libs::candidates(Lib::Nvrtc, explicit, &libs::python_envs_from_env()) {
        match &candidate {
            Candidate::Path(path) => {
                // SAFETY: loading NVRTC runs only its own initialisers.
                match unsafe { Library::new(path) } {
                    Ok(lib) => {
                        PRELOADED.lock().push(lib);
                        // SAFETY: probing loads and unloads by name; no symbol is called.
                        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                            return Ok(candidate.to_string());
                        }
                        tried.push(format!("{candidate}: loaded, but not under its soname"));
                    }
                    Err(e) => tried.push(format!("{candidate}: {e}")),
                }
            }
            Candidate::Name(_) => {
                // SAFETY: as above.
                if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                    return Ok(candidate.to_string());
                }
                tried.push(format!("{candidate}: not found"));
            }
        }
    }
    Err(format!("NVRTC not found; tried {}", tried.join("; ")))
}

/// Compiles the fused kernel to PTX (for `arch`, e.g. "compute_90", or NVRTC's default).
/// Needs only NVRTC, no GPU. Call `locate_nvrtc` first.
pub fn compile_kernel(arch: Option<&'static str>) -> Result<Ptx, String> {
    // SAFETY: probing only; cudarc would panic below without the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("NVRTC is not loadable".into());
    }
    let options = CompileOptions {
        // The kernel rounds float ops explicitly; no contraction anywhere else either.
        fmad: Some(false),
        arch,
        name: Some("prepfs_render.cu".into()),
        ..CompileOptions::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, options).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            format!("kernel compilation failed: {}", log.to_string_lossy())
        }
        other => format!("kernel compilation failed: {other}"),
    })
}

/// NVRTC's `--gpu-architecture` for a compute capability (PTX the driver compiles for it).
fn arch_for(major: i32, minor: i32) -> Option<&'static str> {
    Some(match (major, minor) {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

/// One stream with its buffers.
struct Lane {
    stream: Arc<CudaStream>,
    host_src: PinnedHostSlice<u8>,
    host_dst: PinnedHostSlice<u8>,
    src: CudaSlice<u8>,
    dst: CudaSlice<u8>,
    taps: CudaSlice<i32>,
    items: CudaSlice<Item>,
}

/// Byte sizes of a lane's buffers.
#[derive(Debug, Clone, Copy)]
struct LaneSizes {
    src: usize,
    dst: usize,
    taps: usize,
}

impl LaneSizes {
    /// Shares of the cap: kernel lanes get 3/4 (source and output a sixth each per lane, taps
    /// a 48th), nvJPEG the rest (its scratch and the decoded images).
    fn of(cap: u64) -> LaneSizes {
        LaneSizes {
            src: (cap / 6) as usize,
            dst: (cap / 6) as usize,
            taps: (cap / 48) as usize / 4,
        }
    }

    fn bytes(&self) -> u64 {
        (self.src + self.dst + self.taps * 4 + MAX_JOBS * std::mem::size_of::<Item>()) as u64
    }
}

fn driver(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl Lane {
    fn new(ctx: &Arc<CudaContext>, sizes: LaneSizes, budget: &Budget) -> Result<Lane, String> {
        if !budget.take(sizes.bytes()) {
            return Err("--gpu-mem is too small for the kernel buffers".into());
        }
        let stream = ctx.new_stream().map_err(|e| driver("stream", e))?;
        // SAFETY: pinned buffers are written before they are read (source) or read only after
        // the copy into them completed (output).
        let (host_src, host_dst) = unsafe {
            (
                ctx.alloc_pinned::<u8>(sizes.src)
                    .map_err(|e| driver("pinned memory", e))?,
                ctx.alloc_pinned_with_flags::<u8>(sizes.dst, 0)
                    .map_err(|e| driver("pinned memory", e))?,
            )
        };
        Ok(Lane {
            src: stream
                .alloc_zeros(sizes.src)
                .map_err(|e| driver("GPU memory", e))?,
            dst: stream
                .alloc_zeros(sizes.dst)
                .map_err(|e| driver("GPU memory", e))?,
            taps: stream
                .alloc_zeros(sizes.taps)
                .map_err(|e| driver("GPU memory", e))?,
            items: stream
                .alloc_zeros(MAX_JOBS)
                .map_err(|e| driver("GPU memory", e))?,
            stream,
            host_src,
            host_dst,
        })
    }
}

/// A transform for the kernel: the fused render and its region's pixels.
pub struct TransformJob {
    fused: Fused,
    region: Vec<u8>,
}

fn transform_cost(job: &TransformJob) -> u64 {
    job.region.len() as u64 + job.fused.body_len() as u64
}

/// The kernel's device thread state.
struct Kernels {
    ctx: Arc<CudaContext>,
    function: CudaFunction,
    lanes: Vec<Lane>,
    sizes: LaneSizes,
    counters: Arc<GpuCounters>,
}

/// What one lane carries in one round.
#[derive(Default)]
struct Load {
    jobs: Vec<usize>,
    launch: Launch,
}

impl Kernels {
    fn fits(&self, load: &Load, job: &TransformJob, taps: usize) -> bool {
        let dst =
            load.launch.dst_len.next_multiple_of(fused::BODY_ALIGN) as usize + job.fused.body_len();
        load.jobs.len() < MAX_JOBS
            && load.launch.src_len as usize + job.region.len() <= self.sizes.src
            && dst <= self.sizes.dst
            && load.launch.taps.len() + taps <= self.sizes.taps
    }

    /// Renders `jobs`: rounds of up to one load per lane until every job that fits a lane alone
    /// is done; answers are complete .npy files.
    fn run(&mut self, jobs: Vec<TransformJob>) -> Vec<Result<Vec<u8>, String>> {
        let mut answers: Vec<Option<Result<Vec<u8>, String>>> = jobs.iter().map(|_| None).collect();
        if let Err(e) = self.ctx.bind_to_thread() {
            return jobs.iter().map(|_| Err(driver("context", e))).collect();
        }
        let mut pending: Vec<usize> = (0..jobs.len()).collect();
        while !pending.is_empty() {
            let mut loads: Vec<Load> = (0..self.lanes.len()).map(|_| Load::default()).collect();
            let mut left = Vec::new();
            for i in pending {
                let job = &jobs[i];
                let taps = fused_taps_len(&job.fused);
                if !self.fits(&Load::default(), job, taps) {
                    answers[i] = Some(Err("image over the GPU memory cap".into()));
                    continue;
                }
                // The emptiest lane that takes it.
                let lane = (0..loads.len())
                    .filter(|l| self.fits(&loads[*l], job, taps))
                    .min_by_key(|l| loads[*l].launch.src_len + loads[*l].launch.dst_len);
                match lane {
                    Some(l) => {
                        let load = &mut loads[l];
                        let (w, h) = (job.fused.region.2, job.fused.region.3);
                        load.launch.push(&job.fused, w, h, 0, 0);
                        load.jobs.push(i);
                    }
                    None => left.push(i),
                }
            }
            let issued: Vec<(usize, Result<(), String>)> = loads
                .iter()
                .enumerate()
                .filter(|(_, load)| !load.jobs.is_empty())
                .map(|(l, load)| (l, self.issue(l, load, &jobs)))
                .collect();
            for (l, result) in issued {
                let load = &loads[l];
                let lane = &mut self.lanes[l];
                let done = result
                    .and_then(|()| lane.stream.synchronize().map_err(|e| driver("kernel", e)));
                match done.and_then(|()| lane.host_dst.as_slice().map_err(|e| driver("copy", e))) {
                    Ok(out) => {
                        for (k, &i) in load.jobs.iter().enumerate() {
                            let item = &load.launch.items[k];
                            let body = &out[item.dst as usize..][..jobs[i].fused.body_len()];
                            let mut npy = jobs[i].fused.header();
                            npy.extend_from_slice(body);
                            answers[i] = Some(Ok(npy));
                        }
                    }
                    Err(e) => {
                        for &i in &load.jobs {
                            answers[i] = Some(Err(e.clone()));
                        }
                    }
                }
            }
            pending = left;
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err("not rendered".into())))
            .collect()
    }

    /// Enqueues lane `l`'s uploads, launch and download (no wait).
    fn issue(&mut self, l: usize, load: &Load, jobs: &[TransformJob]) -> Result<(), String> {
        let lane = &mut self.lanes[l];
        let Lane {
            stream,
            host_src,
            host_dst,
            src,
            dst,
            taps,
            items,
        } = lane;
        let staged = host_src.as_mut_slice().map_err(|e| driver("pinned", e))?;
        let mut at = 0;
        for &i in &load.jobs {
            let region = &jobs[i].region;
            staged[at..at + region.len()].copy_from_slice(region);
            at += region.len();
        }
        let launch = &load.launch;
        let (n_src, n_dst) = (launch.src_len as usize, launch.dst_len as usize);
        stream
            .memcpy_htod(&staged[..n_src], &mut src.slice_mut(..n_src.max(1)))
            .map_err(|e| driver("upload", e))?;
        if !launch.taps.is_empty() {
            stream
                .memcpy_htod(&launch.taps, &mut taps.slice_mut(..launch.taps.len()))
                .map_err(|e| driver("upload", e))?;
        }
        stream
            .memcpy_htod(&launch.items, &mut items.slice_mut(..launch.items.len()))
            .map_err(|e| driver("upload", e))?;
        let widest = launch
            .items
            .iter()
            .map(|it| it.out_w as u64 * it.out_h as u64)
            .max()
            .unwrap_or(0);
        let config = LaunchConfig {
            grid_dim: (
                widest.div_ceil(u64::from(BLOCK)) as u32,
                launch.items.len() as u32,
                1,
            ),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let n = launch.items.len() as i32;
        // SAFETY: the arguments match `render_batch`'s signature; every offset in the items
        // lies within the buffers, as `Launch::push` and `fits` guarantee.
        unsafe {
            stream
                .launch_builder(&self.function)
                .arg(&*items)
                .arg(&n)
                .arg(&*taps)
                .arg(&*src)
                .arg(&mut *dst)
                .launch(config)
        }
        .map_err(|e| driver("launch", e))?;
        self.counters.launches.fetch_add(1, Ordering::Relaxed);
        let out = host_dst.as_mut_slice().map_err(|e| driver("pinned", e))?;
        stream
            .memcpy_dtoh(&dst.slice(..n_dst.max(1)), &mut out[..n_dst.max(1)])
            .map_err(|e| driver("download", e))
    }
}

/// Entries the fused render's filter tables take in the taps buffer.
fn fused_taps_len(f: &Fused) -> usize {
    let axis = |i: u32, o: u32| {
        fused::AxisTaps::new(i, o).map_or(0, |t| 2 * t.starts.len() + t.weights.len())
    };
    axis(f.region.2, f.resized.0) + axis(f.region.3, f.resized.1)
}

/// A JPEG for nvJPEG.
pub struct DecodeJob {
    encoded: Vec<u8>,
}

fn decode_cost(job: &DecodeJob) -> u64 {
    job.encoded.len() as u64
}

/// The decode thread's state.
struct Decoder {
    ctx: Arc<CudaContext>,
    nvjpeg: Nvjpeg,
    stream: Arc<CudaStream>,
    out: CudaSlice<u8>,
    host: PinnedHostSlice<u8>,
    counters: Arc<GpuCounters>,
}

impl Decoder {
    fn run(&mut self, jobs: Vec<DecodeJob>) -> Vec<Result<Rgb, String>> {
        if let Err(e) = self.ctx.bind_to_thread() {
            return jobs.iter().map(|_| Err(driver("context", e))).collect();
        }
        let capacity = self.out.len();
        let mut answers: Vec<Result<Rgb, String>> = Vec::with_capacity(jobs.len());
        // (job, offset, width, height, batchable) of the images placed in this round.
        let mut placed = Vec::new();
        let mut used = 0usize;
        for (i, job) in jobs.iter().enumerate() {
            let info = self.nvjpeg.info(&job.encoded);
            let slot = info.and_then(|info| {
                let bytes = u64::from(info.width) * u64::from(info.height) * 3;
                if !crate::view::limits::within_limits(info.width, info.height) {
                    return Err("over the pixel limits".to_owned());
                }
                if used + bytes as usize > capacity {
                    return Err("no room in the decode buffer".to_owned());
                }
                Ok((info, bytes as usize))
            });
            match slot {
                Ok((info, bytes)) => {
                    let batchable = self.nvjpeg.batchable(&job.encoded);
                    placed.push((i, used, info.width, info.height, batchable));
                    used = (used + bytes).next_multiple_of(256);
                    answers.push(Err(String::new())); // filled below
                }
                Err(e) => answers.push(Err(e)),
            }
        }
        if placed.is_empty() {
            return answers;
        }
        let (base, guard) = {
            use cudarc::driver::DevicePtr;
            self.out.device_ptr(&self.stream)
        };
        let image = |offset: usize, width: u32| nvjpeg::Image {
            channel: [
                (base as usize + offset) as *mut u8,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ],
            pitch: [width as usize * 3, 0, 0, 0],
        };
        let stream = self.stream.cu_stream() as *mut std::ffi::c_void;
        let batch: Vec<(&[u8], nvjpeg::Image)> = placed
            .iter()
            .filter(|p| p.4)
            .map(|&(i, off, w, _, _)| (jobs[i].encoded.as_slice(), image(off, w)))
            .collect();
        // SAFETY: each destination is a slot of `out` sized width * 3 * height, alive until
        // the stream is synchronised below.
        let batched_ok = batch.is_empty()
            || unsafe { self.nvjpeg.decode_batch(&batch, stream) }
                .inspect_err(
                    |e| tracing::debug!(error = %e, "nvJPEG batch failed; decoding one by one"),
                )
                .is_ok();
        self.counters.decode_batches.fetch_add(1, Ordering::Relaxed);
        let mut failed = vec![false; jobs.len()];
        for &(i, off, w, _, batchable) in &placed {
            if !batchable || !batched_ok {
                // SAFETY: as above.
                if let Err(e) = unsafe {
                    self.nvjpeg
                        .decode_one(&jobs[i].encoded, image(off, w), stream)
                } {
                    answers[i] = Err(e);
                    failed[i] = true;
                }
            }
        }
        drop(guard);
        let used = used.min(capacity); // the last slot's rounding may pass the end
        let copied = self
            .host
            .as_mut_slice()
            .map_err(|e| driver("pinned", e))
            .and_then(|host| {
                self.stream
                    .memcpy_dtoh(&self.out.slice(..used), &mut host[..used])
                    .map_err(|e| driver("download", e))
            })
            .and_then(|()| self.stream.synchronize().map_err(|e| driver("decode", e)))
            .and_then(|()| self.host.as_slice().map_err(|e| driver("pinned", e)));
        match copied {
            Ok(host) => {
                for &(i, off, w, h, _) in &placed {
                    if failed[i] {
                        continue;
                    }
                    let bytes = w as usize * h as usize * 3;
                    answers[i] = Rgb::from_raw(w, h, host[off..off + bytes].to_vec())
                        .map_err(|e| e.to_string());
                }
            }
            Err(e) => {
                for &(i, ..) in &placed {
                    answers[i] = Err(e.clone());
                }
            }
        }
        answers
    }
}

/// The nvJPEG device thread.
type DecodeBatcher = Batcher<DecodeJob, Result<Rgb, String>>;

/// Renders on the GPU: transforms through the fused kernel, JPEG decodes through nvJPEG; what
/// either cannot do runs on the CPU, counted.
pub struct GpuExecutor {
    transforms: Batcher<TransformJob, Result<Vec<u8>, String>>,
    decodes: Option<DecodeBatcher>,
    counters: Arc<GpuCounters>,
}

impl GpuExecutor {
    /// Opens device 0 within `options.memory`; the report says what was found, and why the
    /// backend is unusable when it is (`Err`).
    pub fn open(
        options: &GpuOptions,
        counters: Arc<GpuCounters>,
    ) -> Result<(GpuExecutor, GpuReport), Box<GpuReport>> {
        let mut report = GpuReport::default();
        let fail = |mut report: GpuReport, reason: String| {
            report.reason = Some(reason);
            Box::new(report)
        };
        // SAFETY: probing loads and unloads libcuda by name; cudarc would panic without it.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(fail(
                report,
                "no CUDA driver (libcuda.so.1 not found)".into(),
            ));
        }
        if let Err(e) = cudarc::driver::result::init() {
            return Err(fail(report, format!("CUDA driver: {e}")));
        }
        match cudarc::driver::result::device::get_count() {
            Ok(n) if n > 0 => {}
            Ok(_) => return Err(fail(report, "no CUDA device".into())),
            Err(e) => return Err(fail(report, format!("CUDA driver: {e}"))),
        }
        let ctx = match CudaContext::new(0) {
            Ok(ctx) => ctx,
            Err(e) => return Err(fail(report, format!("CUDA context: {e}"))),
        };
        // Threads waiting for the GPU sleep instead of spinning (the driver's default spins
        // while the process has fewer contexts than CPUs): behind a training job's kernels a
        // wait can be long, and the CPU is what the GPU path is for saving.
        if let Err(e) = ctx.set_blocking_synchronize() {
            tracing::warn!(error = %e, "the GPU threads will spin while they wait for the GPU");
        }
        let (major, minor) = ctx.compute_capability().unwrap_or((0, 0));
        report.device = Some(format!(
            "{} (compute {major}.{minor})",
            ctx.name().unwrap_or_else(|_| "unknown".into())
        ));
        match locate_nvrtc(options.nvrtc.as_deref()) {
            Ok(path) => report.nvrtc = Some(path),
            Err(e) => return Err(fail(report, e)),
        }
        let ptx = match compile_kernel(arch_for(major, minor)) {
            Ok(ptx) => ptx,
            Err(e) => return Err(fail(report, e)),
        };
        let function = match ctx.load_module(ptx).and_then(|m| m.load_function(KERNEL)) {
            Ok(f) => f,
            Err(e) => return Err(fail(report, format!("loading the kernel: {e}"))),
        };
        report.kernels_compiled = true;
        let budget = Arc::new(Budget::new(options.memory, counters.clone()));
        let sizes = LaneSizes::of(options.memory);
        let mut lanes = Vec::new();
        for _ in 0..LANES {
            match Lane::new(&ctx, sizes, &budget) {
                Ok(lane) => lanes.push(lane),
                Err(e) => return Err(fail(report, e)),
            }
        }
        let mut kernels = Kernels {
            ctx: ctx.clone(),
            function,
            lanes,
            sizes,
            counters: counters.clone(),
        };
        let gathering = Gathering {
            deadline: GATHER,
            quiet: QUIET,
            max_jobs: MAX_JOBS * LANES,
            max_cost: (LANES * sizes.src.min(sizes.dst)) as u64,
            queue: QUEUE,
        };
        let transforms =
            match Batcher::start("prepfs-gpu", gathering, transform_cost, move |jobs| {
                kernels.run(jobs)
            }) {
                Ok(b) => b,
                Err(e) => return Err(fail(report, format!("cannot start the GPU thread: {e}"))),
            };
        let decodes = match open_decoder(&ctx, options, &budget, &counters) {
            Ok((decoder, path, backend)) => {
                report.nvjpeg = Some(path);
                report.nvjpeg_backend = Some(backend.into());
                Some(decoder)
            }
            Err(e) => {
                tracing::info!(error = %e, "nvJPEG unavailable; decoding stays on the CPU");
                report.nvjpeg_error = Some(e);
                None
            }
        };
        Ok((
            GpuExecutor {
                transforms,
                decodes,
                counters,
            },
            report,
        ))
    }
}

/// Share of the cap for decoded images (nvJPEG's scratch takes what else is left).
fn decode_buffer(cap: u64) -> u64 {
    cap / 8
}

fn open_decoder(
    ctx: &Arc<CudaContext>,
    options: &GpuOptions,
    budget: &Arc<Budget>,
    counters: &Arc<GpuCounters>,
) -> Result<(DecodeBatcher, String, &'static str), String> {
    let nvjpeg = Nvjpeg::open(options.nvjpeg.as_deref(), budget.clone())?;
    let (path, backend) = (nvjpeg.path.clone(), nvjpeg.backend());
    let bytes = decode_buffer(options.memory);
    if !budget.take(bytes) {
        return Err("--gpu-mem is too small for a decode buffer".into());
    }
    let stream = ctx.new_stream().map_err(|e| driver("stream", e))?;
    let out = stream
        .alloc_zeros::<u8>(bytes as usize)
        .map_err(|e| driver("GPU memory", e))?;
    // SAFETY: read only after the copy into it completed.
    let host = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes as usize, 0) }
        .map_err(|e| driver("pinned memory", e))?;
    let mut decoder = Decoder {
        ctx: ctx.clone(),
        nvjpeg,
        stream,
        out,
        host,
        counters: counters.clone(),
    };
    let gathering = Gathering {
        deadline: GATHER,
        quiet: QUIET,
        max_jobs: MAX_JOBS,
        max_cost: bytes / 4, // encoded bytes; decoded images are ~10x larger
        queue: QUEUE,
    };
    let batcher = Batcher::start("prepfs-nvjpeg", gathering, decode_cost, move |jobs| {
        decoder.run(jobs)
    })
    .map_err(|e| format!("cannot start the decode thread: {e}"))?;
    Ok((batcher, path, backend))
}

impl Executor for GpuExecutor {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn decode(&self, encoded: &[u8]) -> Result<Rgb, RenderError> {
        if let Some(decodes) = &self.decodes
            && render::is_complete_jpeg(encoded)
        {
            match decodes.submit(DecodeJob {
                encoded: encoded.to_vec(),
            }) {
                Ok(Ok(image)) => {
                    self.counters.decodes.fetch_add(1, Ordering::Relaxed);
                    return Ok(image);
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "nvJPEG refused an image; CPU decode"),
                Err(e) => tracing::debug!(error = %e, "GPU decode unavailable; CPU decode"),
            }
        }
        self.counters
            .decode_fallbacks
            .fetch_add(1, Ordering::Relaxed);
        render::decode(encoded)
    }

    fn transform(
        &self,
        spec: &ViewSpec,
        image: &Rgb,
        plan: &Plan,
    ) -> Result<Rendered, RenderError> {
        let started = Instant::now();
        render::check_planned(image, plan)?;
        let (w, h) = image.size();
        let draws = &plan.draws;
        if let Some(fused) = Fused::new(draws, w, h, spec.output) {
            let mut region = Vec::with_capacity(fused::region_bytes(&fused) as usize);
            fused::copy_region(image, &fused, &mut region);
            match self.transforms.submit(TransformJob { fused, region }) {
                Ok(Ok(npy)) => {
                    self.counters.transforms.fetch_add(1, Ordering::Relaxed);
                    return Ok(Rendered {
                        npy,
                        decode: Duration::ZERO,
                        transform: started.elapsed(),
                        crops: draws.crops.clone(),
                        flipped: draws.flip,
                    });
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "GPU transform failed; CPU transform"),
                Err(e) => tracing::debug!(error = %e, "GPU transform unavailable; CPU transform"),
            }
        }
        self.counters
            .transform_fallbacks
            .fetch_add(1, Ordering::Relaxed);
        render::transform_planned(spec, image, plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused kernel compiles through NVRTC, which needs no GPU. Run by ./test.sh with
    /// PREPFS_CUDA_PYTHON pointing at the client venv (its pip `nvidia/cu13/lib` has
    /// libnvrtc.so.13) and PREPFS_REQUIRE_NVRTC=1, where a missing NVRTC fails the test.
    #[test]
    fn the_fused_kernel_compiles_with_nvrtc() {
        let required = std::env::var_os("PREPFS_REQUIRE_NVRTC").is_some_and(|v| v == "1");
        let path = match locate_nvrtc(None) {
            Ok(path) => path,
            Err(why) if !required => {
                eprintln!(
                    "NOT RUN: {why}. Set PREPFS_NVRTC=/path/to/libnvrtc.so.13 or \
                     PREPFS_CUDA_PYTHON=<venv with nvidia-cuda-nvrtc>; PREPFS_REQUIRE_NVRTC=1 \
                     makes this a failure."
                );
                return;
            }
            Err(why) => panic!("PREPFS_REQUIRE_NVRTC=1 but {why}"),
        };
        let ptx = compile_kernel(None).unwrap_or_else(|e| panic!("with {path}: {e}"));
        let text = ptx.to_src();
        assert!(
            text.contains(".entry render_batch"),
            "PTX without the entry point"
        );
        // The architecture of the GPU prepfs is benchmarked on compiles too.
        compile_kernel(Some("compute_90")).unwrap_or_else(|e| panic!("compute_90: {e}"));
    }

    #[test]
    fn lane_buffers_and_the_decode_buffer_stay_under_the_cap() {
        for cap in [super::super::MIN_GPU_MEMORY, 1 << 30, 40 << 30] {
            let lanes = LaneSizes::of(cap).bytes() * LANES as u64;
            assert!(lanes + decode_buffer(cap) < cap, "{cap}");
        }
    }

    #[test]
    fn without_a_driver_the_executor_reports_why_instead_of_panicking() {
        // SAFETY: probing only.
        let driver = unsafe { cudarc::driver::sys::is_culib_present() };
        let opened = GpuExecutor::open(&GpuOptions::default(), Arc::new(GpuCounters::default()));
        if !driver {
            let report = opened.err().expect("unavailable without libcuda");
            assert_eq!(
                report.reason.as_deref(),
                Some("no CUDA driver (libcuda.so.1 not found)")
            );
            assert!(!report.kernels_compiled);
        }
    }
}
