//! The views comparison (issues 4, 25 and 35): prepfs tensor views against the input pipelines a
//! training job would otherwise run, side by side on the same images and the same 2 cores, one
//! job or several at once.
//!
//! Pipelines (`Pipeline`), each producing shuffled batches of 64 RandomResizedCrop(224) + flip
//! images as torch tensors:
//! - stock: torchvision ImageFolder (PIL decode, ToTensor, Normalize) in a DataLoader with 2
//!   workers kept between epochs (`persistent_workers`: this bench's epochs are small, so
//!   re-forking them would weigh as it never does at ImageNet scale); tvio:
//!   torchvision.io.decode_jpeg + transforms v2, same DataLoader;
//! - DALI on the CPU (`device_id=None`, 2 threads): whole-image decode + random_resized_crop, and
//!   `fn.decoders.image_random_crop`, which decodes only the crop;
//! - prepfs float32 and uint8 views (DatasetFolder + np.load over `.prepfs/views/<view>`), on a
//!   mount with `--decoded-cache off` (every render decodes: ImageNet-sized data whose pixels do
//!   not fit) and on a mount with the defaults (budget and `--decoded-cache auto`); and the
//!   uint8 view with `--decoded-cache off` whose sampler publishes each epoch's order to the
//!   mount's `--order-file`, so prefetch renders the next opens ahead with idle CPU;
//! - not run unless `--pipelines` names them: the float32 and uint8 views with `--decoded-cache
//!   off --share-renders off`, coordination off (every job renders its own tensors), the
//!   baseline of coordinated prep.
//!
//! `--jobs 1,3` runs every pipeline with each of those numbers of jobs: readers started together
//! in the pipeline's cgroup (over one mount for a view), each a process of its own with its own
//! shuffle seed, so each is a job of its own to prepfs; every epoch starts in all of them at
//! once, and its time is the harness's, from the start to the last job's end. A view's renders
//! and shared hits per epoch come from the mount's stats.json.
//!
//! `--step-ms` makes every consumer compute that long per batch, as a training step on a device
//! does while the loader works ahead (what render-ahead is for).
//!
//! Each pipeline runs in a fresh process (and, for a view, a fresh mount) inside its own cpuacct
//! cgroup that also holds the prepfs daemon, so CPU per image counts everything the pipeline
//! costs; the daemon's own share comes from its utime + stime. One warm-up epoch fills the caches
//! (page cache, prepfs's RAM tier); the epochs after it are measured. CPU is counted from the end
//! of the previous epoch, so work a pipeline does between epochs (prefetch, render-ahead) is not
//! free. Rounds repeat every pipeline (at every job count) with the order rotated by one each
//! round, so drift on the machine spreads over all of them. No throttling and no memory limit:
//! this measures preprocessing, not storage. Owns these runs only; reporting is in `report`.
//! Must never assert on timing.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::dataset::Manifest;
use crate::{EpochRecord, Options, PrepfsMount, ReaderSession};
use prepfs::sandbox::{self, Cgroup, Limits, SlowDisk};

/// The drop-in view: what the stock transforms produce, as float32 CHW.
pub const FLOAT32_VIEW: &str = "train=decode,random_resized_crop(224),hflip,normalize(imagenet)";
/// The same augmentation as uint8 CHW; normalisation left to the training step.
pub const UINT8_VIEW: &str = "train_u8=decode,random_resized_crop(224),hflip,uint8";
/// Where a sampler publishes its order for the mount (outside it; the mount is read-only).
const ORDER_FILE: &str = "/dev/shm/prepfs-views-order";
/// Images per batch, as in the measurements (ResNet-50 on one device).
const BATCH: usize = 64;
/// DataLoader workers, DALI threads by default (`--workers`): one per core of the 2-core machine
/// the targets are set on.
pub const WORKERS: usize = 2;
/// What each further job adds to a round's shuffle seed, so no two jobs of any round share one.
const JOB_SEED_STRIDE: u64 = 1000;

/// Which pipeline a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pipeline {
    /// ImageFolder + PIL + torchvision transforms in the workers.
    Stock,
    /// torchvision.io.decode_jpeg + transforms v2 in the workers.
    TorchvisionIo,
    /// DALI CPU: whole-image decode, then random_resized_crop.
    Dali,
    /// DALI CPU: `fn.decoders.image_random_crop` (decodes only the crop), then resize.
    DaliRoi,
    /// The float32 view on a mount with `--decoded-cache off`.
    ViewFloat32Off,
    /// The uint8 view on a mount with `--decoded-cache off`.
    ViewUint8Off,
    /// The float32 view with `--decoded-cache off --share-renders off`: coordination off, every
    /// job renders its own tensors (issue 35's baseline).
    ViewFloat32Alone,
    /// The uint8 view with `--decoded-cache off --share-renders off`.
    ViewUint8Alone,
    /// The float32 view on a mount with the defaults.
    ViewFloat32,
    /// The uint8 view on a mount with the defaults.
    ViewUint8,
    /// The uint8 view with `--decoded-cache off`, its order published: renders made ahead.
    ViewUint8Ahead,
}

impl Pipeline {
    /// Every pipeline, in the order of the tables.
    pub const ALL: [Pipeline; 11] = [
        Pipeline::Stock,
        Pipeline::TorchvisionIo,
        Pipeline::Dali,
        Pipeline::DaliRoi,
        Pipeline::ViewFloat32Off,
        Pipeline::ViewFloat32Alone,
        Pipeline::ViewUint8Off,
        Pipeline::ViewUint8Alone,
        Pipeline::ViewFloat32,
        Pipeline::ViewUint8,
        Pipeline::ViewUint8Ahead,
    ];

    /// The pipelines run when `--pipelines` names none, in the order of the first round. The
    /// coordination-off baselines are left out: with one job they render exactly what the
    /// `--decoded-cache off` views do, so they only tell something next to `--jobs` runs that
    /// ask for them.
    pub fn defaults() -> impl Iterator<Item = Pipeline> {
        Pipeline::ALL.into_iter().filter(|p| !p.is_alone())
    }

    /// Its name for `--pipelines`.
    pub fn key(self) -> &'static str {
        match self {
            Pipeline::Stock => "stock",
            Pipeline::TorchvisionIo => "tvio",
            Pipeline::Dali => "dali",
            Pipeline::DaliRoi => "dali-roi",
            Pipeline::ViewFloat32Off => "f32-off",
            Pipeline::ViewUint8Off => "u8-off",
            Pipeline::ViewFloat32Alone => "f32-alone",
            Pipeline::ViewUint8Alone => "u8-alone",
            Pipeline::ViewFloat32 => "f32",
            Pipeline::ViewUint8 => "u8",
            Pipeline::ViewUint8Ahead => "u8-ahead",
        }
    }

    /// The pipeline whose `key` is `key`.
    pub fn from_key(key: &str) -> Option<Pipeline> {
        Pipeline::ALL.into_iter().find(|p| p.key() == key)
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Pipeline::Stock => "stock PyTorch (ImageFolder, PIL, ToTensor, Normalize)",
            Pipeline::TorchvisionIo => "torchvision.io.decode_jpeg + transforms v2",
            Pipeline::Dali => "DALI CPU (decoders.image + random_resized_crop)",
            Pipeline::DaliRoi => "DALI CPU (decoders.image_random_crop: decodes only the crop)",
            Pipeline::ViewFloat32Off => "prepfs float32 view, --decoded-cache off",
            Pipeline::ViewUint8Off => "prepfs uint8 view, --decoded-cache off",
            Pipeline::ViewFloat32Alone => {
                "prepfs float32 view, --decoded-cache off --share-renders off (coordination off)"
            }
            Pipeline::ViewUint8Alone => {
                "prepfs uint8 view, --decoded-cache off --share-renders off (coordination off)"
            }
            Pipeline::ViewFloat32 => "prepfs float32 view, defaults (--decoded-cache auto)",
            Pipeline::ViewUint8 => "prepfs uint8 view, defaults (--decoded-cache auto)",
            Pipeline::ViewUint8Ahead => {
                "prepfs uint8 view, --decoded-cache off, order published (renders made ahead)"
            }
        }
    }

    /// The `readers.py --kind` that runs it.
    fn reader(self) -> &'static str {
        match self {
            Pipeline::Stock => "torch",
            Pipeline::TorchvisionIo => "tvio",
            Pipeline::Dali => "dali",
            Pipeline::DaliRoi => "dali_roi",
            Pipeline::ViewFloat32Off
            | Pipeline::ViewUint8Off
            | Pipeline::ViewFloat32Alone
            | Pipeline::ViewUint8Alone
            | Pipeline::ViewFloat32
            | Pipeline::ViewUint8
            | Pipeline::ViewUint8Ahead => "view",
        }
    }

    /// The view it reads and the prepfs options beyond it, for the prepfs pipelines.
    fn view(self) -> Option<(&'static str, &'static [&'static str])> {
        const OFF: &[&str] = &["--decoded-cache", "off"];
        const ALONE: &[&str] = &["--decoded-cache", "off", "--share-renders", "off"];
        match self {
            Pipeline::ViewFloat32Off => Some((FLOAT32_VIEW, OFF)),
            Pipeline::ViewUint8Off => Some((UINT8_VIEW, OFF)),
            Pipeline::ViewFloat32Alone => Some((FLOAT32_VIEW, ALONE)),
            Pipeline::ViewUint8Alone => Some((UINT8_VIEW, ALONE)),
            Pipeline::ViewFloat32 => Some((FLOAT32_VIEW, &[])),
            Pipeline::ViewUint8 => Some((UINT8_VIEW, &[])),
            Pipeline::ViewUint8Ahead => Some((UINT8_VIEW, OFF)),
            Pipeline::Stock | Pipeline::TorchvisionIo | Pipeline::Dali | Pipeline::DaliRoi => None,
        }
    }

    /// Whether its sampler publishes each epoch's order to the mount's `--order-file`.
    fn publishes_order(self) -> bool {
        self == Pipeline::ViewUint8Ahead
    }

    /// Whether it is a coordination-off baseline (`--share-renders off`).
    pub fn is_alone(self) -> bool {
        matches!(self, Pipeline::ViewFloat32Alone | Pipeline::ViewUint8Alone)
    }

    /// Whether it needs the benchmarks' peers (`python/ensure-env --bench`).
    pub fn needs_dali(self) -> bool {
        matches!(self, Pipeline::Dali | Pipeline::DaliRoi)
    }
}

/// The view name of a `--view` spec (`name=ops`).
fn view_name(spec: &str) -> &str {
    spec.split_once('=').map_or(spec, |(name, _)| name)
}

/// One epoch of one pipeline: every job's epoch, started together.
#[derive(Debug, Clone, Serialize)]
pub struct ViewEpoch {
    pub epoch: u32,
    /// From the harness's `go` to the last job's end of epoch, as the harness timed it: the
    /// jobs' epochs overlap, so only this wall time makes their images per second add up.
    pub seconds: f64,
    /// Images every job delivered in the epoch, together.
    pub items: u64,
    pub items_per_s: f64,
    /// Each job's own epoch time, as its reader timed it.
    pub job_seconds: Vec<f64>,
    /// CPU seconds of every process of the pipeline (loaders, workers, DALI threads, daemon)
    /// from the end of the previous epoch to the end of this one.
    pub cpu_seconds: f64,
    /// The prepfs daemon's share of `cpu_seconds`.
    pub daemon_cpu_seconds: Option<f64>,
    /// CPU seconds the rest of the machine used meanwhile: other load that skews the numbers.
    pub others_cpu_seconds: f64,
    /// Renders of view files the mount made during the epoch (`views.<name>.renders`).
    pub renders: Option<u64>,
    /// Opens served by a render made for another job during the epoch
    /// (`views.<name>.shared_hits`).
    pub shared_hits: Option<u64>,
    /// prepfs's stats.json after the epoch (view latencies and errors, decoded pixels).
    pub prepfs_stats: Option<Value>,
}

/// One pipeline in one round: its warm-up epoch first, then the measured ones.
#[derive(Debug, Clone, Serialize)]
pub struct ViewRun {
    pub pipeline: Pipeline,
    /// Round number, from 1.
    pub round: usize,
    /// Jobs (reader processes, each its own loader and workers) that read every epoch at once.
    pub jobs: usize,
    /// The `--view` spec, for the prepfs pipelines.
    pub spec: Option<&'static str>,
    /// Versions of the Python packages that ran it, as the reader reported them.
    pub versions: Value,
    pub epochs: Vec<ViewEpoch>,
}

impl ViewRun {
    /// The epochs after the warm-up.
    pub fn measured(&self) -> &[ViewEpoch] {
        self.epochs.get(1..).unwrap_or(&[])
    }
}

/// Runs `opts.rounds` rounds of every pipeline in `opts.pipelines` at every job count in
/// `opts.jobs` over the views dataset on `disk`, the order of those runs rotated by one each
/// round.
pub fn run(
    opts: &Options,
    python: &Path,
    disk: &SlowDisk,
    manifest: &Manifest,
) -> Result<Vec<ViewRun>, String> {
    let order: Vec<(Pipeline, usize)> = opts
        .pipelines
        .iter()
        .flat_map(|&p| opts.jobs.iter().map(move |&jobs| (p, jobs)))
        .collect();
    eprintln!(
        "epochs: views: {} images ({:.0} KB mean), {} rounds of {} pipelines x jobs {:?}, 1 warm-up + {} measured epochs each",
        manifest.files,
        manifest.file_bytes as f64 / manifest.files.max(1) as f64 / 1e3,
        opts.rounds,
        opts.pipelines.len(),
        opts.jobs,
        opts.epochs - 1
    );
    let mut runs = Vec::new();
    for round in 0..opts.rounds {
        for i in 0..order.len() {
            let (pipeline, jobs) = order[(i + round) % order.len()];
            runs.push(run_pipeline(opts, python, disk, pipeline, round + 1, jobs)?);
        }
    }
    Ok(runs)
}

/// `opts.epochs` epochs of `jobs` readers of `pipeline` at once, in one cgroup of their own with
/// one fresh mount for a view.
fn run_pipeline(
    opts: &Options,
    python: &Path,
    disk: &SlowDisk,
    pipeline: Pipeline,
    round: usize,
    jobs: usize,
) -> Result<ViewRun, String> {
    let group = Cgroup::create(
        &format!("views-{}", pipeline.key()),
        &Limits {
            memory: None,
            throttle: None,
        },
    )?;
    let mount = start_mount(opts, &group, disk, pipeline)?;
    let root = match (&mount, pipeline.view()) {
        (Some(m), Some((spec, _))) => m.mountpoint.join(".prepfs/views").join(view_name(spec)),
        _ => disk.mountpoint.clone(),
    };
    let mut sessions = start_jobs(opts, python, &group, pipeline, &root, round, jobs)?;
    let counters = || {
        mount
            .as_ref()
            .zip(pipeline.view())
            .map(|(m, (spec, _))| view_counters(&m.stats(), view_name(spec)))
    };
    let daemon_cpu = || {
        mount
            .as_ref()
            .map(|m| sandbox::process_cpu_seconds(m.pid()))
    };
    let marks = || {
        (
            group.cpu_seconds(),
            daemon_cpu(),
            sandbox::machine_cpu_seconds(),
            counters(),
        )
    };
    let mut before = marks();
    let mut epochs = Vec::new();
    for _ in 0..opts.epochs {
        let (records, seconds) = epoch_of_jobs(&mut sessions)?;
        let after = marks();
        let cpu_seconds = after.0 - before.0;
        let items = records.iter().map(|r| r.items).sum();
        let delta = |f: fn(&ViewCounters) -> u64| {
            after
                .3
                .zip(before.3)
                .map(|(now, then)| f(&now).saturating_sub(f(&then)))
        };
        let epoch = ViewEpoch {
            epoch: records.first().map_or(0, |r| r.epoch),
            seconds,
            items,
            items_per_s: items as f64 / seconds.max(1e-9),
            job_seconds: records.iter().map(|r| r.seconds).collect(),
            cpu_seconds,
            daemon_cpu_seconds: after.1.zip(before.1).map(|(now, then)| now - then),
            others_cpu_seconds: (after.2 - before.2 - cpu_seconds).max(0.0),
            renders: delta(|c| c.renders),
            shared_hits: delta(|c| c.shared_hits),
            prepfs_stats: mount.as_ref().map(PrepfsMount::stats),
        };
        before = after;
        log_epoch(pipeline, round, jobs, &epoch);
        epochs.push(epoch);
    }
    let versions = sessions
        .first()
        .map_or(Value::Null, ReaderSession::versions);
    for session in sessions {
        session.finish()?;
    }
    if let Some(m) = mount {
        m.stop();
    }
    Ok(ViewRun {
        pipeline,
        round,
        jobs,
        spec: pipeline.view().map(|(spec, _)| spec),
        versions,
        epochs,
    })
}

/// A fresh mount of the views dataset for a view pipeline, its daemon in `group`.
fn start_mount(
    opts: &Options,
    group: &Cgroup,
    disk: &SlowDisk,
    pipeline: Pipeline,
) -> Result<Option<PrepfsMount>, String> {
    let Some((spec, options)) = pipeline.view() else {
        return Ok(None);
    };
    let mut extra = vec!["--view".to_owned(), spec.to_owned()];
    extra.extend(options.iter().map(|o| (*o).to_owned()));
    if pipeline.publishes_order() {
        extra.push("--order-file".to_owned());
        extra.push(ORDER_FILE.to_owned());
    }
    PrepfsMount::start(group, opts, &disk.mountpoint, None, &extra).map(Some)
}

/// Starts `jobs` readers of `pipeline` over `root` in `group`, each ready for its first epoch.
/// Each is a job of its own to prepfs (a process of its own, its workers its children), with a
/// shuffle seed of its own: job 0's is the seed a lone reader of this round has always had.
fn start_jobs(
    opts: &Options,
    python: &Path,
    group: &Cgroup,
    pipeline: Pipeline,
    root: &Path,
    round: usize,
    jobs: usize,
) -> Result<Vec<ReaderSession>, String> {
    let mut extra = vec![
        "--batch-size".to_owned(),
        BATCH.to_string(),
        "--workers".to_owned(),
        opts.workers.to_string(),
        "--step-ms".to_owned(),
        opts.step_ms.to_string(),
    ];
    if pipeline.publishes_order() {
        extra.push("--order-file".to_owned());
        extra.push(ORDER_FILE.to_owned());
    }
    (0..jobs)
        .map(|job| {
            ReaderSession::start(
                group,
                python,
                pipeline.reader(),
                &root.join("images"),
                opts.epochs,
                opts.seed + round as u64 + JOB_SEED_STRIDE * job as u64,
                &extra,
            )
        })
        .collect()
}

/// One epoch of every job, started together: `go` to each, then each one's end-of-epoch line.
/// Returns their records and the wall seconds from the first `go` to the last line.
fn epoch_of_jobs(sessions: &mut [ReaderSession]) -> Result<(Vec<EpochRecord>, f64), String> {
    let started = Instant::now();
    for session in sessions.iter_mut() {
        session.go()?;
    }
    let records = sessions
        .iter_mut()
        .map(ReaderSession::epoch_line)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((records, started.elapsed().as_secs_f64()))
}

/// A view's counters of work shared between jobs, as stats.json has them.
#[derive(Debug, Clone, Copy)]
struct ViewCounters {
    renders: u64,
    shared_hits: u64,
}

fn view_counters(stats: &Value, view: &str) -> ViewCounters {
    let counter = |name: &str| stats["views"][view][name].as_u64().unwrap_or(0);
    ViewCounters {
        renders: counter("renders"),
        shared_hits: counter("shared_hits"),
    }
}

fn log_epoch(pipeline: Pipeline, round: usize, jobs: usize, epoch: &ViewEpoch) {
    let per_image = |s: f64| s * 1e3 / epoch.items.max(1) as f64;
    eprintln!(
        "epochs: views: round {round} {:<62} x{jobs} epoch {}: {:6.2} s, {:6.0} images/s, {:.2} CPU ms/image{}{}",
        pipeline.name(),
        epoch.epoch,
        epoch.seconds,
        epoch.items_per_s,
        per_image(epoch.cpu_seconds),
        epoch
            .daemon_cpu_seconds
            .map(|d| format!(" (daemon {:.2})", per_image(d)))
            .unwrap_or_default(),
        epoch
            .renders
            .zip(epoch.shared_hits)
            .map(|(r, h)| format!(", {r} renders, {h} shared hits"))
            .unwrap_or_default()
    );
}

/// The CI smoke test's check of the views runs: every epoch of every pipeline delivered every
/// image to each of its jobs, and no view reported a render error. Behaviour, never timing.
pub fn quick_check(runs: &[ViewRun], images: usize) -> Result<(), String> {
    if runs.is_empty() {
        return Err("quick check: the views comparison ran no pipeline".into());
    }
    for run in runs {
        if run.measured().is_empty() {
            return Err(format!(
                "quick check: {} has no epoch after the warm-up",
                run.pipeline.name()
            ));
        }
        for epoch in &run.epochs {
            let expected = (images * run.jobs) as u64;
            if epoch.items != expected {
                return Err(format!(
                    "quick check failed: {} epoch {} delivered {} of {expected} images ({} jobs)",
                    run.pipeline.name(),
                    epoch.epoch,
                    epoch.items,
                    run.jobs
                ));
            }
            if let (Some(stats), Some(spec)) = (&epoch.prepfs_stats, run.spec) {
                let errors = stats["views"][view_name(spec)]["errors"].as_u64();
                if errors != Some(0) {
                    return Err(format!(
                        "quick check failed: {} epoch {}: view errors {errors:?}",
                        run.pipeline.name(),
                        epoch.epoch
                    ));
                }
            }
        }
    }
    eprintln!(
        "epochs: quick check: {} views runs delivered all {images} images every epoch, no view errors: ok",
        runs.len()
    );
    Ok(())
}
