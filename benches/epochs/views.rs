//! The views comparison (issues 4 and 25): prepfs tensor views against the input pipelines a
//! training job would otherwise run, side by side on the same images and the same 2 cores.
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
//!   mount's `--order-file`, so prefetch renders the next opens ahead with idle CPU.
//!
//! `--step-ms` makes every consumer compute that long per batch, as a training step on a device
//! does while the loader works ahead (what render-ahead is for).
//!
//! Each pipeline runs in a fresh process (and, for a view, a fresh mount) inside its own cpuacct
//! cgroup that also holds the prepfs daemon, so CPU per image counts everything the pipeline
//! costs; the daemon's own share comes from its utime + stime. One warm-up epoch fills the caches
//! (page cache, prepfs's RAM tier); the epochs after it are measured. CPU is counted from the end
//! of the previous epoch, so work a pipeline does between epochs (prefetch, render-ahead) is not
//! free. Rounds repeat every pipeline with the order rotated by one each round, so drift on the
//! machine spreads over all of them. No throttling and no memory limit: this measures
//! preprocessing, not storage. Owns these runs only; reporting is in `report`. Must never assert
//! on timing.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::dataset::Manifest;
use crate::{Options, PrepfsMount, ReaderSession};
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
    /// The float32 view on a mount with the defaults.
    ViewFloat32,
    /// The uint8 view on a mount with the defaults.
    ViewUint8,
    /// The uint8 view with `--decoded-cache off`, its order published: renders made ahead.
    ViewUint8Ahead,
}

impl Pipeline {
    /// Every pipeline, in the order of the first round and of the table.
    pub const ALL: [Pipeline; 9] = [
        Pipeline::Stock,
        Pipeline::TorchvisionIo,
        Pipeline::Dali,
        Pipeline::DaliRoi,
        Pipeline::ViewFloat32Off,
        Pipeline::ViewUint8Off,
        Pipeline::ViewFloat32,
        Pipeline::ViewUint8,
        Pipeline::ViewUint8Ahead,
    ];

    /// Its name for `--pipelines`.
    pub fn key(self) -> &'static str {
        match self {
            Pipeline::Stock => "stock",
            Pipeline::TorchvisionIo => "tvio",
            Pipeline::Dali => "dali",
            Pipeline::DaliRoi => "dali-roi",
            Pipeline::ViewFloat32Off => "f32-off",
            Pipeline::ViewUint8Off => "u8-off",
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
            | Pipeline::ViewFloat32
            | Pipeline::ViewUint8
            | Pipeline::ViewUint8Ahead => "view",
        }
    }

    /// The view it reads and the prepfs options beyond it, for the prepfs pipelines.
    fn view(self) -> Option<(&'static str, &'static [&'static str])> {
        const OFF: &[&str] = &["--decoded-cache", "off"];
        match self {
            Pipeline::ViewFloat32Off => Some((FLOAT32_VIEW, OFF)),
            Pipeline::ViewUint8Off => Some((UINT8_VIEW, OFF)),
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

    /// Whether it needs the benchmarks' peers (`python/ensure-env --bench`).
    pub fn needs_dali(self) -> bool {
        matches!(self, Pipeline::Dali | Pipeline::DaliRoi)
    }
}

/// The view name of a `--view` spec (`name=ops`).
fn view_name(spec: &str) -> &str {
    spec.split_once('=').map_or(spec, |(name, _)| name)
}

/// One epoch of one pipeline.
#[derive(Debug, Clone, Serialize)]
pub struct ViewEpoch {
    pub epoch: u32,
    pub seconds: f64,
    pub items: u64,
    pub items_per_s: f64,
    /// CPU seconds of every process of the pipeline (loader, workers, DALI threads, daemon)
    /// from the end of the previous epoch to the end of this one.
    pub cpu_seconds: f64,
    /// The prepfs daemon's share of `cpu_seconds`.
    pub daemon_cpu_seconds: Option<f64>,
    /// CPU seconds the rest of the machine used meanwhile: other load that skews the numbers.
    pub others_cpu_seconds: f64,
    /// prepfs's stats.json after the epoch (view latencies and errors, decoded pixels).
    pub prepfs_stats: Option<Value>,
}

/// One pipeline in one round: its warm-up epoch first, then the measured ones.
#[derive(Debug, Clone, Serialize)]
pub struct ViewRun {
    pub pipeline: Pipeline,
    /// Round number, from 1.
    pub round: usize,
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

/// Runs `opts.rounds` rounds of `opts.pipelines` over the views dataset on `disk`, the order
/// rotated by one each round.
pub fn run(
    opts: &Options,
    python: &Path,
    disk: &SlowDisk,
    manifest: &Manifest,
) -> Result<Vec<ViewRun>, String> {
    eprintln!(
        "epochs: views: {} images ({:.0} KB mean), {} rounds of {} pipelines, 1 warm-up + {} measured epochs each",
        manifest.files,
        manifest.file_bytes as f64 / manifest.files.max(1) as f64 / 1e3,
        opts.rounds,
        opts.pipelines.len(),
        opts.epochs - 1
    );
    let mut runs = Vec::new();
    for round in 0..opts.rounds {
        let count = opts.pipelines.len();
        for i in 0..count {
            let pipeline = opts.pipelines[(i + round) % count];
            runs.push(run_pipeline(opts, python, disk, pipeline, round + 1)?);
        }
    }
    Ok(runs)
}

/// `opts.epochs` epochs of `pipeline` in a cgroup of its own, with a fresh mount for a view.
fn run_pipeline(
    opts: &Options,
    python: &Path,
    disk: &SlowDisk,
    pipeline: Pipeline,
    round: usize,
) -> Result<ViewRun, String> {
    let group = Cgroup::create(
        &format!("views-{}", pipeline.key()),
        &Limits {
            memory: None,
            throttle: None,
        },
    )?;
    let mount = match pipeline.view() {
        Some((spec, options)) => {
            let mut extra = vec!["--view".to_owned(), spec.to_owned()];
            extra.extend(options.iter().map(|o| (*o).to_owned()));
            if pipeline.publishes_order() {
                extra.push("--order-file".to_owned());
                extra.push(ORDER_FILE.to_owned());
            }
            Some(PrepfsMount::start(
                &group,
                opts,
                &disk.mountpoint,
                None,
                &extra,
            )?)
        }
        None => None,
    };
    let root = match (&mount, pipeline.view()) {
        (Some(m), Some((spec, _))) => m.mountpoint.join(".prepfs/views").join(view_name(spec)),
        _ => disk.mountpoint.clone(),
    };
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
    let mut session = ReaderSession::start(
        &group,
        python,
        pipeline.reader(),
        &root.join("images"),
        opts.epochs,
        opts.seed + round as u64,
        &extra,
    )?;
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
        )
    };
    let mut before = marks();
    let mut epochs = Vec::new();
    for _ in 0..opts.epochs {
        let record = session.next_epoch()?;
        let after = marks();
        let cpu_seconds = after.0 - before.0;
        let epoch = ViewEpoch {
            epoch: record.epoch,
            seconds: record.seconds,
            items: record.items,
            items_per_s: record.items as f64 / record.seconds.max(1e-9),
            cpu_seconds,
            daemon_cpu_seconds: after.1.zip(before.1).map(|(now, then)| now - then),
            others_cpu_seconds: (after.2 - before.2 - cpu_seconds).max(0.0),
            prepfs_stats: mount.as_ref().map(PrepfsMount::stats),
        };
        before = after;
        let per_image = |s: f64| s * 1e3 / epoch.items.max(1) as f64;
        eprintln!(
            "epochs: views: round {round} {:<62} epoch {}: {:6.2} s, {:6.0} images/s, {:.2} CPU ms/image{}",
            pipeline.name(),
            epoch.epoch,
            epoch.seconds,
            epoch.items_per_s,
            per_image(epoch.cpu_seconds),
            epoch
                .daemon_cpu_seconds
                .map(|d| format!(" (daemon {:.2})", per_image(d)))
                .unwrap_or_default()
        );
        epochs.push(epoch);
    }
    let versions = session.versions();
    session.finish()?;
    if let Some(m) = mount {
        m.stop();
    }
    Ok(ViewRun {
        pipeline,
        round,
        spec: pipeline.view().map(|(spec, _)| spec),
        versions,
        epochs,
    })
}

/// The CI smoke test's check of the views runs: every measured epoch of every pipeline delivered
/// every image, and no view reported a render error. Behaviour, never timing.
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
            if epoch.items != images as u64 {
                return Err(format!(
                    "quick check failed: {} epoch {} delivered {} of {images} images",
                    run.pipeline.name(),
                    epoch.epoch,
                    epoch.items
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
