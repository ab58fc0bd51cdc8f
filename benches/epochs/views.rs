//! The views comparison (issue 4): the stock PyTorch pipeline against the same training loop over
//! a prepfs tensor view, side by side on the same images and the same cores, from a warm cache.
//!
//! - stock: torchvision ImageFolder over the ext4 mount (PIL decode, RandomResizedCrop, flip,
//!   ToTensor, Normalize in the DataLoader's 2 workers), its page cache warm after epoch 1.
//! - prepfs float32 / uint8: DatasetFolder + np.load over `.prepfs/views/<view>/images` of one
//!   prepfs mount whose cache holds the whole dataset; the daemon decodes and augments on the
//!   same cores as the loader. The float32 view is the drop-in for the stock transforms; uint8
//!   leaves ToTensor/Normalize to the training step (4x fewer bytes). This mount keeps no
//!   decoded pixels (`--decoded-cache off`), so every render decodes.
//! - prepfs float32, decoded cache: the float32 view on a second mount with `--decoded-cache on`
//!   and a budget of 6x the dataset, so epochs 2+ run only the ops after the decode: memory
//!   traded for CPU.
//!
//! Each pipeline runs in its own cpuacct cgroup (with the daemon, for prepfs), so CPU seconds per
//! image count everything the pipeline costs. No throttling and no memory limit: this measures
//! preprocessing, not storage. Epoch 1 warms the caches; epochs 2+ are the result. Owns these
//! runs only; reporting is in `report`. Must never assert on timing.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::dataset::Manifest;
use crate::sandbox::{Cgroup, Limits, SlowDisk};
use crate::{Options, PrepfsMount, ReaderSession};

/// The drop-in view: what the stock transforms produce, as float32 CHW.
pub const FLOAT32_VIEW: &str = "train=decode,random_resized_crop(224),hflip,normalize(imagenet)";
/// The same augmentation as uint8 CHW; normalisation left to the training step.
pub const UINT8_VIEW: &str = "train_u8=decode,random_resized_crop(224),hflip,uint8";
/// Cache memory beyond the dataset's size (block rounding, small files' tails).
const CACHE_SLACK: u64 = 64 << 20;
/// Budget of the decoded-cache mount, in dataset sizes: JPEGs (1x) plus their pixels, ~6x
/// their size raw and ~3.5x once packed.
const DECODED_BUDGET: u64 = 6;

/// Which pipeline a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pipeline {
    /// ImageFolder + PIL + torchvision transforms in the workers.
    Stock,
    /// DatasetFolder + np.load over the float32 view.
    ViewFloat32,
    /// DatasetFolder + np.load over the uint8 view.
    ViewUint8,
    /// The float32 view with decoded pixels cached.
    ViewFloat32Decoded,
}

impl Pipeline {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Pipeline::Stock => "stock PyTorch (ImageFolder + transforms)",
            Pipeline::ViewFloat32 => "prepfs view, float32 (drop-in)",
            Pipeline::ViewUint8 => "prepfs view, uint8",
            Pipeline::ViewFloat32Decoded => "prepfs view, float32, decoded cache (6x budget)",
        }
    }
}

/// One epoch of one pipeline.
#[derive(Debug, Clone, Serialize)]
pub struct ViewEpoch {
    pub epoch: u32,
    pub seconds: f64,
    pub items: u64,
    pub items_per_s: f64,
    /// CPU seconds of every process of the pipeline (loader, workers, daemon) in the epoch.
    pub cpu_seconds: f64,
    /// The view's statistics from prepfs after the epoch (latencies, errors).
    pub view_stats: Option<Value>,
}

/// All epochs of one pipeline.
#[derive(Debug, Clone, Serialize)]
pub struct ViewRun {
    pub pipeline: Pipeline,
    pub spec: Option<&'static str>,
    pub epochs: Vec<ViewEpoch>,
}

/// Runs the three pipelines, `opts.epochs` epochs each.
pub fn run(
    opts: &Options,
    python: &Path,
    disk: &SlowDisk,
    manifest: &Manifest,
) -> Result<Vec<ViewRun>, String> {
    let unlimited = Limits {
        memory: None,
        throttle: None,
    };
    let images = |root: &Path| root.join("images");
    let stock_group = Cgroup::create("views-stock", &unlimited)?;
    let stock = epochs(
        opts,
        &stock_group,
        python,
        "torch",
        &images(&disk.mountpoint),
        Pipeline::Stock,
        None,
    )?;
    drop(stock_group);

    let group = Cgroup::create("views-prepfs", &unlimited)?;
    let cache_mem = manifest.file_bytes + CACHE_SLACK;
    let extra = [
        "--view",
        FLOAT32_VIEW,
        "--view",
        UINT8_VIEW,
        "--decoded-cache",
        "off",
    ]
    .map(String::from);
    let mount = PrepfsMount::start(&group, opts, &disk.mountpoint, cache_mem, &extra)?;
    let mut runs = vec![ViewRun {
        pipeline: Pipeline::Stock,
        spec: None,
        epochs: stock,
    }];
    // One pipeline over view `spec` of `mount`.
    let view_run = |mount: &PrepfsMount, pipeline, spec: &'static str| {
        let name = spec.split_once('=').map_or(spec, |(n, _)| n);
        let root = mount.mountpoint.join(".prepfs/views").join(name);
        let epochs = epochs(
            opts,
            &group,
            python,
            "view",
            &images(&root),
            pipeline,
            Some((mount, name)),
        )?;
        Ok::<_, String>(ViewRun {
            pipeline,
            spec: Some(spec),
            epochs,
        })
    };
    runs.push(view_run(&mount, Pipeline::ViewFloat32, FLOAT32_VIEW)?);
    runs.push(view_run(&mount, Pipeline::ViewUint8, UINT8_VIEW)?);
    mount.stop();

    let cache_mem = manifest.file_bytes * DECODED_BUDGET + CACHE_SLACK;
    let extra = ["--view", FLOAT32_VIEW, "--decoded-cache", "on"].map(String::from);
    let mount = PrepfsMount::start(&group, opts, &disk.mountpoint, cache_mem, &extra)?;
    runs.push(view_run(
        &mount,
        Pipeline::ViewFloat32Decoded,
        FLOAT32_VIEW,
    )?);
    mount.stop();
    Ok(runs)
}

/// `opts.epochs` epochs of readers.py `kind` over `root` in `group`, with CPU time per epoch.
fn epochs(
    opts: &Options,
    group: &Cgroup,
    python: &Path,
    kind: &str,
    root: &Path,
    pipeline: Pipeline,
    view: Option<(&PrepfsMount, &str)>,
) -> Result<Vec<ViewEpoch>, String> {
    let mut session = ReaderSession::start(group, python, kind, root, opts.epochs, opts.seed, &[])?;
    let mut out = Vec::new();
    for _ in 0..opts.epochs {
        let cpu_before = group.cpu_seconds();
        let record = session.next_epoch()?;
        let cpu_seconds = group.cpu_seconds() - cpu_before;
        let view_stats = view.map(|(mount, name)| mount.stats()["views"][name].clone());
        let epoch = ViewEpoch {
            epoch: record.epoch,
            seconds: record.seconds,
            items: record.items,
            items_per_s: record.items as f64 / record.seconds.max(1e-9),
            cpu_seconds,
            view_stats,
        };
        eprintln!(
            "epochs: views: {:<40} epoch {}: {:6.2} s, {:6.0} images/s, {:.2} CPU ms/image",
            pipeline.name(),
            epoch.epoch,
            epoch.seconds,
            epoch.items_per_s,
            epoch.cpu_seconds * 1e3 / epoch.items.max(1) as f64
        );
        out.push(epoch);
    }
    session.finish()?;
    Ok(out)
}
