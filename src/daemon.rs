//! The composition root: builds every piece of one mount's daemon and wires them together.
//!
//! Owns: the order pieces are built in (the memory budget, the cache tiers and the fetch chain,
//! the GPU backend and the view service, the one I/O pool, the prefetcher that runs its jobs on
//! that pool's background lane, telemetry and the scheduler), which
//! piece gets which handle to which other, and `Board`: what the control files show, gathered
//! from every piece when one of them is opened (it also keeps the background pieces alive, and
//! drops the scheduler before the sampler and the modules it drives). `Fs` gets only what
//! file-system semantics need. Must never hold file-system semantics itself, and never build a
//! piece anywhere else: a new piece is wired here.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use crate::cache::cluster::{Credentials, RedisCluster};
use crate::cache::metrics::CacheMetrics;
use crate::cache::policy::{CodecPolicy, DecodedCaching, Fixed, ScheduledCodec};
use crate::cache::{
    BlockFetcher, CacheConfig, ClusterTier, DiskSetup, DiskTier, Packer, RamTier, Staging,
};
use crate::config::MountConfig;
use crate::control::action::{Action, CODECS, Head, Mask};
use crate::control::knobs::Knobs;
use crate::fs::{Figures, Fs, FsMetrics, FsOptions, Parts, Report, View, Views};
use crate::inode::InodeTable;
use crate::memory::{MemoryBudget, MemoryPlan, Shed, Use};
use crate::metrics::Samples;
use crate::prefetch::{
    Ahead, Prefetcher, ReaderWaits, SetId, ViewWork, WorkAhead, WorkingSetFigures,
};
use crate::requests::RequestPool;
use crate::scheduler::runtime::{Scheduler, Setup};
use crate::source::{Source, SourceFile};
use crate::telemetry::{Pipeline, Probe, Sampler, Sources, Telemetry};
use crate::view::gpu::{Gpu, GpuMode, GpuOptions};

/// Share of the machine's CPU that must be idle for prefetch to decode view images ahead.
const WORK_AHEAD_IDLE: f64 = 0.25;
/// Requests waiting for an I/O thread at most. The kernel has at most one request out per
/// waiting reader thread, so a full queue means thousands of readers or a hung source; beyond it
/// a request is answered EIO at once instead of blocking a FUSE thread.
const REQUEST_QUEUE_DEPTH: usize = 4096;

/// One mount's daemon: the file system the FUSE adapter serves, and the I/O pool its requests
/// that may wait on the source run on (prefetch's jobs run there too, behind them).
pub struct Daemon {
    /// The file system.
    pub fs: Fs,
    /// The one I/O pool (its board keeps it too, so prefetch runs without a mount).
    pub requests: Arc<RequestPool>,
}

/// Builds the daemon of `config`'s mount over `source`, its memory budget split as `plan` (see
/// `MountConfig::memory_plan`), with a disk tier when `disk` is given (started in the
/// background): every piece, wired, behind the `Fs` the FUSE adapter serves. Does no I/O on the
/// source: the mount is ready at once. Fails only when the I/O pool's threads cannot start.
pub fn build(
    source: Arc<dyn Source>,
    config: &MountConfig,
    plan: MemoryPlan,
    disk: Option<DiskSetup>,
) -> std::io::Result<Daemon> {
    build_observed(source, config, plan, disk, Arc::new(Telemetry::default()))
}

/// `build`, with the machine and pipeline figures kept in `telemetry` (tests set them).
pub(crate) fn build_observed(
    source: Arc<dyn Source>,
    config: &MountConfig,
    plan: MemoryPlan,
    disk: Option<DiskSetup>,
    telemetry: Arc<Telemetry>,
) -> std::io::Result<Daemon> {
    let (cache, views_config) = (&config.cache, &config.views);
    let metrics = Arc::new(CacheMetrics::default());
    let fs_metrics = Arc::new(FsMetrics::default());
    let knobs = Arc::new(Knobs::default());
    let policy: Box<dyn CodecPolicy> = match cache.codec {
        Some(codec) => Box::new(Fixed(codec)),
        None => Box::new(ScheduledCodec(knobs.clone())),
    };

    // The memory budget and the tiers under it. What can be given back under pressure: staged
    // blocks first (the cheapest to fetch again), then decoded pixels.
    let budget = MemoryBudget::new(plan);
    let packer = Arc::new(Packer::new(policy, telemetry.clone(), metrics.clone()));
    let staging = Arc::new(Staging::new(budget.clone(), metrics.clone()));
    budget.add_shed(
        Use::Staging,
        Arc::downgrade(&(staging.clone() as Arc<dyn Shed>)),
    );
    let ram = RamTier::new(budget.clone(), packer.clone(), metrics.clone())
        .with_decoded_caching(cache.decoded)
        .with_small_memfds(config.fuse.passthrough)
        .with_knobs(knobs.clone())
        .with_telemetry(telemetry.clone())
        .shared();
    let disk = disk.map(|d| {
        let held = ram.clone();
        Arc::new(DiskTier::start(
            d.dir,
            d.options,
            d.validate,
            Box::new(move |identity, index| held.recall(identity, index)),
            packer.clone(),
            budget.clone(),
            metrics.clone(),
        ))
    });
    let cluster = match &cache.cluster {
        Some(c) => Some(Arc::new(start_cluster(c, &budget, &packer)?)),
        None => None,
    };
    let fetcher = Arc::new(BlockFetcher::new(
        ram,
        staging,
        disk,
        cluster,
        budget,
        metrics.clone(),
    ));

    // Views, rendered on the GPU only where one is usable (nothing else renders).
    let gpu = Gpu::open(&if views_config.specs.is_empty() {
        GpuOptions {
            mode: GpuMode::Off,
            ..views_config.gpu.clone()
        }
    } else {
        views_config.gpu.clone()
    });
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // A scheduled mount starts render threads for the largest worker option; the knob decides
    // how many take jobs (the configured count while it is released).
    let configured = views_config.render_threads;
    let render_threads = match config.scheduler {
        Some(_) => configured.max(Action::default().with(Head::Workers, 3).workers(cores)),
        None => configured,
    };
    let k = knobs.clone();
    let views = Arc::new(
        Views::start(
            &views_config.specs,
            views_config.seed,
            render_threads,
            Arc::new(move || k.workers().unwrap_or(configured)),
            Box::new(gpu.placed(knobs.clone(), telemetry.clone())),
            source.clone(),
            fetcher.clone(),
        )
        .with_copies(views_config.copies)
        .sharing_renders(views_config.share)
        .read_by_others(config.fuse.allow_other),
    );

    let inodes =
        Arc::new(InodeTable::with_views(views.len()).charged_to(fetcher.ram().budget().clone()));
    // The one pool for everything that may wait on the source: kernel requests on
    // `--io-threads`, prefetch's jobs on `--prefetch-threads` more, behind the requests.
    let requests = Arc::new(RequestPool::new(
        "prepfs-io",
        config.fuse.io_threads,
        config.prefetch.readers(),
        REQUEST_QUEUE_DEPTH,
    )?);
    let view_names: Vec<String> = views_config.specs.iter().map(|v| v.name.clone()).collect();
    let prefetcher = Arc::new(Prefetcher::start(
        source.clone(),
        fetcher.clone(),
        waits(&fs_metrics),
        &config.prefetch,
        &requests,
        config.fuse.source_timeout,
        &config.mountpoint,
        &view_names,
        work_ahead(&views, &inodes, &telemetry),
        knobs.clone(),
    ));
    let sampler = Sampler::start(
        telemetry.clone(),
        Sources {
            probe: Some(probe(&fs_metrics, &fetcher, &prefetcher, &views)),
            source_root: Some(config.source.clone()),
        },
    );
    let scheduler = config.scheduler.clone().map(|s| {
        let mask = scheduler_mask(cache, gpu.available(), !views.is_empty());
        let ram = fetcher.ram().clone();
        Scheduler::start(
            s,
            telemetry.clone(),
            knobs.clone(),
            Setup {
                mask,
                cores,
                prefetch_threads: config.prefetch.threads,
                keeps_decoded: Box::new(move || ram.derived().decoded_choice().1.keeps()),
            },
        )
    });
    let board = Board {
        scheduler,
        metrics: fs_metrics.clone(),
        fetcher: fetcher.clone(),
        prefetcher: prefetcher.clone(),
        views: views.clone(),
        telemetry,
        gpu,
        _sampler: sampler,
        _requests: requests.clone(),
    };
    let owner = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let fs = Fs::new(
        FsOptions {
            passthrough: config.fuse.passthrough,
            owner,
        },
        Parts {
            inodes,
            source,
            fetcher,
            prefetcher,
            views,
            metrics: fs_metrics,
            board: Box::new(board),
        },
    );
    Ok(Daemon { fs, requests })
}

/// View work ahead for prefetch (views only): decoding the predicted images, or rendering their
/// next opens (`Views::ahead`: decoding only while at least `WORK_AHEAD_IDLE` of the CPU is idle,
/// since the pixels may go unused), for the files a view shows.
fn work_ahead(
    views: &Arc<Views>,
    inodes: &Arc<InodeTable>,
    telemetry: &Arc<Telemetry>,
) -> Option<WorkAhead> {
    if views.is_empty() {
        return None;
    }
    Some(Arc::new(ViewsAhead {
        views: views.clone(),
        inodes: inodes.clone(),
        telemetry: telemetry.clone(),
    }))
}

/// The views' side of prefetch (`prefetch::ViewWork`).
struct ViewsAhead {
    views: Arc<Views>,
    inodes: Arc<InodeTable>,
    telemetry: Arc<Telemetry>,
}

impl ViewsAhead {
    /// View `set - 1`: set 0 is the source tree, set 1 + i is view i.
    fn view(set: SetId) -> Option<u16> {
        set.checked_sub(1).and_then(|v| u16::try_from(v).ok())
    }
}

impl ViewWork for ViewsAhead {
    fn shows(&self, set: SetId, path: &Path) -> bool {
        Self::view(set).is_some() && Views::shows(path)
    }

    fn worth_planning(&self, _set: SetId) -> bool {
        self.views.renders_waiting() == 0 || self.telemetry.cpu_idle() >= WORK_AHEAD_IDLE
    }

    fn prepare(&self, set: SetId, path: &Path, source: &dyn SourceFile) -> Ahead {
        let Some(view) = Self::view(set) else {
            return Ahead::Nothing;
        };
        let idle = self.telemetry.cpu_idle() >= WORK_AHEAD_IDLE;
        let inodes = &self.inodes;
        self.views
            .ahead(view, || inodes.view_file(view, path), source, idle)
    }
}

/// What the scheduler may choose on this mount: GPU placements only with a usable GPU backend,
/// decode knobs only with views, and no choice where an option is fixed by the user.
fn scheduler_mask(cache: &CacheConfig, gpu: bool, views: bool) -> Mask {
    let mut mask = Mask::new(gpu, views);
    if let Some(codec) = cache.codec {
        mask.only(
            Head::Codec,
            CODECS.iter().position(|c| *c == codec).unwrap_or(0),
        );
    }
    match cache.decoded {
        DecodedCaching::Auto => {}
        DecodedCaching::Off => mask.only(Head::Decoded, 0),
        DecodedCaching::On => mask.only(Head::Decoded, 1),
    }
    mask
}

/// How prefetch reads how long readers waited (the file system measures it).
fn waits(metrics: &Arc<FsMetrics>) -> crate::prefetch::Waits {
    let metrics = metrics.clone();
    Box::new(move || ReaderWaits {
        fetch_ns: metrics.fetch_stall_ns.get(),
        prep_ns: metrics.prep_stall_ns.get(),
    })
}

/// The cluster tier of `config` (its credentials read now; it connects on first use).
fn start_cluster(
    config: &crate::cache::ClusterConfig,
    budget: &Arc<MemoryBudget>,
    packer: &Arc<Packer>,
) -> std::io::Result<ClusterTier> {
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let credentials = config
        .auth
        .as_deref()
        .map(Credentials::read)
        .transpose()
        .map_err(invalid)?;
    let remote =
        RedisCluster::new(&config.urls, credentials.as_ref(), config.timeout).map_err(invalid)?;
    ClusterTier::start(
        Arc::new(remote),
        config,
        budget.clone(),
        packer.clone(),
        Arc::default(),
    )
}

/// How telemetry reads this mount's pipeline: counters from the file system's and the cache's
/// metrics, gauges from the cache, the prefetcher and the render queue. Every read is an atomic
/// load or a short lock that no request path holds for long.
fn probe(
    metrics: &Arc<FsMetrics>,
    fetcher: &Arc<BlockFetcher>,
    prefetcher: &Prefetcher,
    views: &Arc<Views>,
) -> Probe {
    let (metrics, fetcher, views) = (metrics.clone(), fetcher.clone(), views.clone());
    let prefetch_queue = prefetcher.queue_share();
    let working_sets = prefetcher.working_sets();
    Box::new(move || {
        let cache = fetcher.metrics();
        let (working_set_bytes, pixel_set_bytes, working_set_whole) =
            working_set(&working_sets(), &views);
        Pipeline {
            // Opens of items: one per item a loader fetches (files, shards, view tensors; not
            // the control files); reads of passthrough files never reach the daemon, opens and
            // releases always do. Latency: an item's open to its release (a sample's load, as
            // the simulator's requests), not one read call, which is microseconds once the item
            // is rendered or cached.
            requests: metrics.item_opens.get(),
            latency: metrics.load_latency.counts(),
            stall_ns: metrics.fetch_stall_ns.get() + metrics.prep_stall_ns.get(),
            hits: cache.hits.get(),
            misses: cache.misses.get(),
            source_bytes: cache.source_bytes.get(),
            source_busy_ns: cache.source_busy_ns.get(),
            source_latency: cache.source_latency.counts(),
            render_queue: views.render_queue_share(),
            prefetch_queue: prefetch_queue(),
            cache_fill: fetcher.ram().fill(),
            disk_tier: fetcher.has_disk(),
            cache_bytes: fetcher.ram().capacity(),
            working_set_bytes,
            pixel_set_bytes,
            working_set_whole,
        }
    })
}

/// The bytes the readers' working set takes as encoded files, and as decoded pixels: the
/// dataset files' own bytes where the planner knows them, and each view's files at its images'
/// mean sizes so far (a view's files are its images; set `1 + i` is view `i`'s); and whether
/// they are a whole pass's (every set read has ended one).
fn working_set(sets: &[WorkingSetFigures], views: &Views) -> (u64, u64, bool) {
    let (mut encoded, mut pixels) = (0.0, 0.0);
    let read = || sets.iter().filter(|f| f.files > 0);
    let whole = read().next().is_some() && read().all(|f| f.whole);
    for (set, figures) in sets.iter().enumerate() {
        match set.checked_sub(1).and_then(|i| views.iter().nth(i)) {
            Some(view) => {
                if let Some((image, decoded)) = view.metrics.image_sizes() {
                    encoded += figures.files as f64 * image;
                    pixels += figures.files as f64 * decoded;
                }
            }
            None => encoded += figures.bytes.unwrap_or(0) as f64,
        }
    }
    (encoded as u64, pixels as u64, whole)
}

/// What the control files show, gathered from every piece of the mount when one is opened. Also
/// where the background pieces live: fields drop in order, the scheduler (which sets the knobs)
/// before the sampler and the modules it drives.
struct Board {
    scheduler: Option<Scheduler>,
    metrics: Arc<FsMetrics>,
    fetcher: Arc<BlockFetcher>,
    prefetcher: Arc<Prefetcher>,
    views: Arc<Views>,
    telemetry: Arc<Telemetry>,
    gpu: Gpu,
    _sampler: Sampler,
    /// Dropped after the prefetcher above stops asking it for jobs.
    _requests: Arc<RequestPool>,
}

impl Report for Board {
    /// Every figure of the mount now, each from the piece that owns it.
    fn samples(&self, fs: Figures) -> Samples {
        let mut out = Samples::default();
        self.metrics.samples(&fs, &mut out);
        self.fetcher
            .metrics()
            .samples(&self.fetcher.figures(), &mut out);
        if let Some(cluster) = self.fetcher.cluster() {
            cluster.metrics().samples(cluster.nodes(), &mut out);
        }
        self.prefetcher.samples(&mut out);
        self.fetcher.ram().budget().gauges().samples(&mut out);
        for (index, view) in self.views.iter().enumerate() {
            let jobs = self.views.job_figures(index as u16);
            view.metrics.samples(&view.spec.name, &jobs, &mut out);
        }
        out
    }

    /// What stats.json shows that is not a number: the cache's policies, the epochs, telemetry,
    /// the scheduler, the GPU, and the files each view failed to render.
    fn documents(&self) -> Vec<(String, serde_json::Value)> {
        let ram = self.fetcher.ram();
        let choice = ram.codec_choice();
        let codec = json!({
            "choice": choice.codec.to_string(),
            "reason": choice.reason.name(),
        });
        let (mode, reason) = ram.derived().decoded_choice();
        let decoded = json!({
            "mode": mode.name(),
            "keeping": reason.keeps(),
            "reason": reason.name(),
        });
        [
            ("cache.codec".to_owned(), codec),
            ("cache.decoded.policy".to_owned(), decoded),
            ("epochs".to_owned(), self.prefetcher.status()),
            ("telemetry".to_owned(), self.telemetry.to_json()),
            (
                "scheduler".to_owned(),
                self.scheduler
                    .as_ref()
                    .map_or(json!({"mode": "off"}), Scheduler::to_json),
            ),
            ("gpu".to_owned(), self.gpu.to_json()),
        ]
        .into_iter()
        .chain(self.views.iter().map(|v: &View| {
            let path = format!("views.{}.failed_files", v.spec.name);
            (path, v.metrics.failed_files.to_json())
        }))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::action::{Action, Head};

    #[test]
    fn without_a_usable_gpu_the_scheduler_cannot_place_work_there() {
        let o = CacheConfig::default();
        let mask = scheduler_mask(&o, false, true);
        let gpu_decode = Action::default().with(Head::Decode, 1);
        let gpu_augment = Action::default().with(Head::Augment, 1);
        assert!(!mask.admits(&gpu_decode) && !mask.admits(&gpu_augment));
        assert!(mask.admits(&Action::default()));
        let with_gpu = scheduler_mask(&o, true, true);
        assert!(with_gpu.admits(&gpu_decode) && with_gpu.admits(&gpu_augment));
    }
}
