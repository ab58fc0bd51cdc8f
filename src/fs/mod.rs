//! The filesystem core: read-only semantics of the mount, free of any FUSE type.
//!
//! Owns: lookup/getattr/readlink/open/read/release/opendir/readdir/statfs, file and directory
//! handles, the hidden control directory `.prepfs` with its snapshot files, and the staleness rule
//! (a changed source file is a new cache key; the old entry is dropped on the next open). Tests
//! drive it directly; the `fuse` adapter only translates. Reaches data only through `Source` and
//! the cache. Must never block a caller of `read_cached` on the source, and never serve bytes of
//! two versions of one file through one handle.

#[cfg(test)]
mod tests;
mod views;

pub use views::View;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cache::codec::Codec;
use crate::cache::policy::{CodecPolicy, DecodedCaching, Fixed, ScheduledCodec};
use crate::cache::{BLOCK_SIZE, CachedFile, DiskSetup, NeverEvictCache, ReadBytes, Unpacked};
use crate::control::action::{Action, CODECS, Head, Mask};
use crate::control::knobs::Knobs;
use crate::error::FsError;
use crate::inode::{
    self, CONTROL_DIR, CONTROL_DIR_NAME, InodeTable, METRICS_FILE, Node, ROOT, STATS_FILE,
    VIEWS_DIR,
};
use crate::memory::{MemoryBudget, MemoryPlan};
use crate::prefetch::{DecodeAhead, OrderHint, PrefetchOptions, Prefetcher, Readahead};
use crate::scheduler::runtime::{Scheduler, SchedulerOptions, Setup};
use crate::shards::ShardedMap;
use crate::source::{Deferred, Kind, Meta, Source, SourceFile, SpaceStats};
use crate::stats::{self, Gauges, Metrics};
use crate::telemetry::{Pipeline, Probe, Sampler, Sources, Telemetry};
use crate::view::ViewSpec;
use crate::view::gpu::{Gpu, GpuMode, GpuOptions};
use crate::workers::WorkerPool;
use views::Views;

/// How long the kernel may trust names and attributes of source entries. The tree is read-only
/// through the mount; changes made in the source are picked up on open (see `open`).
const SOURCE_TTL: Duration = Duration::from_secs(3600);
/// Renders waiting for a render thread; beyond it, opens of view files wait (backpressure).
const RENDER_QUEUE_DEPTH: usize = 64;

/// Options of the core that the CLI can change.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// The memory budget and its split: the RAM tier, prefetch staging, data in motion.
    pub memory: MemoryPlan,
    /// Offer kernel passthrough for fully cached files (needs root and Linux >= 6.9).
    pub passthrough: bool,
    /// Owner shown for the virtual control files.
    pub owner: (u32, u32),
    /// Tensor views shown under `.prepfs/views/` (at most `inode::MAX_VIEWS`).
    pub views: Vec<ViewSpec>,
    /// Seed of every view's random augmentation.
    pub seed: u64,
    /// Threads of the render pool (started only when there are views).
    pub render_threads: usize,
    /// Codec of cache entries: fixed, or `None` for the adaptive heuristic.
    pub codec: Option<Codec>,
    /// Whether view renders keep decoded pixels in the cache.
    pub decoded_caching: DecodedCaching,
    /// Prefetch workers, or off.
    pub prefetch: PrefetchOptions,
    /// An order file a sampler writes, for prefetch to follow.
    pub order_hint: Option<OrderHint>,
    /// The scheduler, or `None`: the modules' heuristics decide and nobody observes.
    pub scheduler: Option<SchedulerOptions>,
    /// The source directory's path (telemetry finds its block device there).
    pub source_root: Option<PathBuf>,
    /// The GPU backend of the views (`--gpu`, `--gpu-mem`, `--nvjpeg`, `--nvrtc`).
    pub gpu: GpuOptions,
}

/// Attributes of one node, with how long the kernel may cache them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Node kind.
    pub kind: Kind,
    /// Size in bytes.
    pub size: u64,
    /// Allocated 512-byte blocks.
    pub blocks: u64,
    /// Permission bits.
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// Preferred I/O size (st_blksize): what buffered readers read at once.
    pub io_block: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Access time, ns since the epoch.
    pub atime_ns: i64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
    /// Status change time, ns since the epoch.
    pub ctime_ns: i64,
    /// How long the kernel may cache this answer.
    pub valid_for: Duration,
}

/// How the kernel should serve an opened file's reads.
pub enum Serve {
    /// Every read comes to the daemon (direct I/O: the page cache does not keep a second copy).
    Daemon,
    /// The kernel reads the fully cached bytes itself from this entry's memfd.
    Passthrough(Arc<CachedFile>),
}

/// Extended attribute of each dataset file telling how much of it the cache tiers hold (see
/// `Fs::xattr`); the only one the mount has.
pub const CACHED_XATTR: &str = "user.prepfs.cached";

/// What an open is for, as its flags say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Any write, truncate or append intent: refused, the mount is read-only.
    Write,
    /// A reader's open: an access the epoch tracker and the predictors learn from.
    Read,
    /// An open with `O_NOATIME`, as `prepfs warm` makes: served like `Read` but not counted as an
    /// access, so warming the cache does not look like an epoch of training.
    Quiet,
}

/// A successful open.
pub struct Opened {
    /// The handle for later reads and the release.
    pub fh: u64,
    /// How reads are served.
    pub serve: Serve,
}

/// One directory entry as listed.
#[derive(Debug, Clone)]
pub struct DirItem {
    /// Inode number of the entry.
    pub ino: u64,
    /// Kind of the entry.
    pub kind: Kind,
    /// Name of the entry.
    pub name: OsString,
}

enum Handle {
    File {
        source: Arc<dyn SourceFile>,
        cached: Arc<CachedFile>,
        unpacked: Unpacked,
        readahead: Readahead,
    },
    Snapshot(Arc<Vec<u8>>),
    View(Arc<views::ViewOpen>),
    Dir(DirSnapshot),
}

/// The names of a directory as seen at opendir.
struct DirSnapshot {
    /// The directory itself (interns children); the root stands in for the control directory.
    node: Arc<Node>,
    /// Inode numbers shown for `.` and `..`.
    dots: (u64, u64),
    /// Names, kinds, and fixed inode numbers for virtual entries.
    names: Vec<(OsString, Kind, Option<u64>)>,
}

/// The state of one mount.
pub struct Fs {
    source: Arc<dyn Source>,
    options: FsOptions,
    inodes: InodeTable,
    cache: Arc<NeverEvictCache>,
    handles: ShardedMap<u64, Arc<Handle>>,
    next_fh: AtomicU64,
    metrics: Arc<Metrics>,
    views: Arc<Views>,
    /// Runs view renders; started only when there are views.
    render_pool: Option<WorkerPool>,
    /// Infers epochs from opens and fetches ahead of the readers.
    prefetcher: Prefetcher,
    /// Keeps the machine and pipeline figures current.
    telemetry: Arc<Telemetry>,
    /// Sets the knobs; dropped before the sampler and the modules it drives.
    scheduler: Option<Scheduler>,
    /// The views' GPU backend and what opening it found.
    gpu: Gpu,
    _sampler: Sampler,
}

/// Share of the machine's CPU that must be idle for prefetch to decode view images ahead.
const DECODE_AHEAD_IDLE: f64 = 0.25;

/// Decoding ahead for prefetch (views only): while at least `DECODE_AHEAD_IDLE` of the CPU is
/// idle and no render waits for a thread, so it only takes time nobody else wants.
fn decode_ahead(
    views: &Arc<Views>,
    telemetry: &Arc<Telemetry>,
    render_pool: Option<&WorkerPool>,
) -> Option<DecodeAhead> {
    if views.is_empty() {
        return None;
    }
    let (views, telemetry) = (views.clone(), telemetry.clone());
    let waiting = render_pool.map(WorkerPool::queued);
    Some(Arc::new(move |_, path: &Path, source: &dyn SourceFile| {
        let idle = telemetry.cpu_idle() >= DECODE_AHEAD_IDLE
            && waiting
                .as_ref()
                .is_none_or(|w| w.load(Ordering::Relaxed) == 0);
        idle && views.decode_ahead(path, source)
    }))
}

/// What the scheduler may choose on this mount: GPU placements only with a usable GPU backend,
/// decode knobs only with views, and no choice where an option is fixed by the user.
fn scheduler_mask(options: &FsOptions, gpu: bool, views: bool) -> Mask {
    let mut mask = Mask::new(gpu, views);
    if let Some(codec) = options.codec {
        mask.only(
            Head::Codec,
            CODECS.iter().position(|c| *c == codec).unwrap_or(0),
        );
    }
    match options.decoded_caching {
        DecodedCaching::Auto => {}
        DecodedCaching::Off => mask.only(Head::Decoded, 0),
        DecodedCaching::On => mask.only(Head::Decoded, 1),
    }
    mask
}

/// How telemetry reads this mount's pipeline: counters from the metrics, gauges from the cache,
/// the prefetcher and the render queue. Every read is an atomic load or a short lock that no
/// request path holds for long.
fn probe(
    metrics: &Arc<Metrics>,
    cache: &Arc<NeverEvictCache>,
    prefetcher: &Prefetcher,
    render_queued: Option<Arc<std::sync::atomic::AtomicUsize>>,
) -> Probe {
    let (metrics, cache) = (metrics.clone(), cache.clone());
    let prefetch_queue = prefetcher.queue_share();
    Box::new(move || {
        Pipeline {
            // Opens: one per item a loader fetches (files, shards, view tensors); reads of
            // passthrough files never reach the daemon, opens always do.
            requests: metrics.op(stats::Op::Open).requests.get(),
            latency: metrics.read_latency.counts(),
            stall_ns: metrics.fetch_stall_ns.get() + metrics.prep_stall_ns.get(),
            hits: metrics.cache_hits.get(),
            misses: metrics.cache_misses.get(),
            source_bytes: metrics.source_bytes.get(),
            source_busy_ns: metrics.source_busy_ns.get(),
            source_latency: metrics.source_latency.counts(),
            render_queue: render_queued.as_ref().map_or(0.0, |q| {
                q.load(Ordering::Relaxed) as f64 / RENDER_QUEUE_DEPTH as f64
            }),
            prefetch_queue: prefetch_queue(),
            cache_fill: cache.fill(),
            disk_tier: cache.disk_gauges().is_some(),
        }
    })
}

impl Fs {
    /// A mount over `source` with a RAM cache only. Does no I/O: the mount is ready at once.
    pub fn new(source: Arc<dyn Source>, options: FsOptions) -> Fs {
        Fs::with_disk(source, options, None)
    }

    /// A mount over `source` whose cache has a disk tier too (started in the background).
    pub fn with_disk(source: Arc<dyn Source>, options: FsOptions, disk: Option<DiskSetup>) -> Fs {
        let metrics = Arc::new(Metrics::default());
        let telemetry = Arc::new(Telemetry::default());
        let knobs = Arc::new(Knobs::default());
        let policy: Box<dyn CodecPolicy> = match options.codec {
            Some(codec) => Box::new(Fixed(codec)),
            None => Box::new(ScheduledCodec(knobs.clone())),
        };
        let budget = MemoryBudget::new(options.memory);
        let cache = NeverEvictCache::new(budget, policy, telemetry.clone(), disk, metrics.clone())
            .with_decoded_caching(options.decoded_caching)
            .with_knobs(knobs.clone())
            .shared();
        // The GPU backend is opened only for views (nothing else renders).
        let gpu = Gpu::open(&if options.views.is_empty() {
            GpuOptions {
                mode: GpuMode::Off,
                ..options.gpu.clone()
            }
        } else {
            options.gpu.clone()
        });
        let views = Arc::new(Views::new(
            &options.views,
            Box::new(gpu.placed(knobs.clone(), telemetry.clone())),
            source.clone(),
            cache.clone(),
        ));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let render_pool = if views.is_empty() {
            None
        } else {
            // A scheduled mount starts threads for the largest worker option; the knob decides
            // how many take jobs (the configured count while it is released).
            let threads = match options.scheduler {
                Some(_) => options
                    .render_threads
                    .max(Action::default().with(Head::Workers, 3).workers(cores)),
                None => options.render_threads,
            };
            let (k, configured) = (knobs.clone(), options.render_threads);
            WorkerPool::sized(
                "prepfs-render",
                threads,
                RENDER_QUEUE_DEPTH,
                Arc::new(move || k.workers().unwrap_or(configured)),
            )
            .inspect_err(|e| {
                tracing::warn!(error = %e, "cannot start render threads; rendering on open");
            })
            .ok()
        };
        let view_names: Vec<String> = options.views.iter().map(|v| v.name.clone()).collect();
        let prefetcher = Prefetcher::start(
            source.clone(),
            cache.clone(),
            metrics.clone(),
            options.prefetch,
            &view_names,
            decode_ahead(&views, &telemetry, render_pool.as_ref()),
            options.order_hint.clone(),
            knobs.clone(),
        );
        let sampler = Sampler::start(
            telemetry.clone(),
            Sources {
                probe: Some(probe(
                    &metrics,
                    &cache,
                    &prefetcher,
                    render_pool.as_ref().map(WorkerPool::queued),
                )),
                source_root: options.source_root.clone(),
            },
        );
        let scheduler = options.scheduler.clone().map(|s| {
            let mask = scheduler_mask(&options, gpu.available(), !views.is_empty());
            let c = cache.clone();
            Scheduler::start(
                s,
                telemetry.clone(),
                knobs.clone(),
                Setup {
                    mask,
                    cores,
                    prefetch_threads: options.prefetch.threads,
                    keeps_decoded: Box::new(move || c.decoded_choice().1.keeps()),
                },
            )
        });
        Fs {
            source,
            cache,
            inodes: InodeTable::with_views(views.len()),
            options,
            handles: ShardedMap::default(),
            next_fh: AtomicU64::new(1),
            metrics,
            views,
            render_pool,
            prefetcher,
            telemetry,
            scheduler,
            gpu,
            _sampler: sampler,
        }
    }

    /// The mount's metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The mount's memory budget.
    pub fn memory(&self) -> &Arc<MemoryBudget> {
        self.cache.budget()
    }

    fn node(&self, ino: u64) -> Result<Arc<Node>, FsError> {
        self.inodes.get(ino).ok_or(FsError::NotFound)
    }

    fn stat_node(&self, node: &Node) -> Result<Meta, FsError> {
        let meta = self
            .source
            .stat(&node.path)
            .map_err(|e| FsError::from_source(&e));
        match meta {
            // The name now refers to something else, or nothing: this inode is gone, and so is
            // the version the cache held for it.
            Ok(meta) if meta.kind == node.kind => Ok(meta),
            Ok(_) | Err(FsError::NotFound) => {
                if let Some(old) = node.last_identity.lock().take() {
                    self.cache.forget(&old);
                }
                Err(FsError::NotFound)
            }
            Err(e) => Err(e),
        }
    }

    fn source_attr(ino: u64, meta: &Meta) -> Attr {
        Attr {
            ino,
            kind: meta.kind,
            size: meta.identity.size,
            blocks: meta.blocks,
            perm: meta.perm,
            nlink: meta.nlink,
            io_block: BLOCK_SIZE as u32,
            uid: meta.uid,
            gid: meta.gid,
            atime_ns: meta.atime_ns,
            mtime_ns: meta.identity.mtime_ns,
            ctime_ns: meta.identity.ctime_ns,
            valid_for: SOURCE_TTL,
        }
    }

    fn virtual_attr(&self, ino: u64) -> Option<Attr> {
        match ino {
            CONTROL_DIR => self.virtual_dir_attr(ino),
            STATS_FILE | METRICS_FILE => {
                Some(self.make_virtual_attr(ino, Kind::File, 0o444, self.render(ino)?.len() as u64))
            }
            _ => self.views_dir_attr(ino),
        }
    }

    /// The control directories never change during a mount, so the kernel may keep them as long
    /// as source entries: every path into a view passes three of them (`.prepfs/views/NAME`).
    fn virtual_dir_attr(&self, ino: u64) -> Option<Attr> {
        Some(Attr {
            valid_for: SOURCE_TTL,
            ..self.make_virtual_attr(ino, Kind::Directory, 0o555, 0)
        })
    }

    fn make_virtual_attr(&self, ino: u64, kind: Kind, perm: u16, size: u64) -> Attr {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        Attr {
            ino,
            kind,
            size,
            blocks: size.div_ceil(512),
            perm,
            nlink: if kind == Kind::Directory { 2 } else { 1 },
            io_block: BLOCK_SIZE as u32,
            uid: self.options.owner.0,
            gid: self.options.owner.1,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            valid_for: Duration::ZERO,
        }
    }

    /// The current content of a virtual file.
    fn render(&self, ino: u64) -> Option<Vec<u8>> {
        let mut samples = self.metrics.samples(&self.gauges());
        for view in self.views.iter() {
            stats::view_samples(&view.spec.name, &view.metrics, &mut samples);
        }
        match ino {
            STATS_FILE => {
                let choice = self.cache.codec_choice();
                let codec = serde_json::json!({
                    "choice": choice.codec.to_string(),
                    "reason": choice.reason.name(),
                });
                let (mode, reason) = self.cache.decoded_choice();
                let decoded = serde_json::json!({
                    "mode": mode.name(),
                    "keeping": reason.keeps(),
                    "reason": reason.name(),
                });
                let documents = [
                    ("cache.codec".to_owned(), codec),
                    ("cache.decoded.policy".to_owned(), decoded),
                    ("epochs".to_owned(), self.prefetcher.status()),
                    ("telemetry".to_owned(), self.telemetry.to_json()),
                    (
                        "scheduler".to_owned(),
                        self.scheduler
                            .as_ref()
                            .map_or(serde_json::json!({"mode": "off"}), Scheduler::to_json),
                    ),
                    ("gpu".to_owned(), self.gpu.to_json()),
                ]
                .into_iter()
                .chain(self.views.iter().map(|v| {
                    let path = format!("views.{}.failed_files", v.spec.name);
                    (path, v.metrics.failed_files.to_json())
                }))
                .collect();
                Some(stats::render_json(&samples, documents).into_bytes())
            }
            METRICS_FILE => Some(stats::render_prometheus(&samples).into_bytes()),
            _ => None,
        }
    }

    /// Cache and table figures for the stats files.
    pub fn gauges(&self) -> Gauges {
        let (staged_bytes, staging_budget_bytes) = self.cache.staged();
        Gauges {
            open_handles: self.handles.len() as u64,
            inodes: self.inodes.len() as u64,
            disk: self.cache.disk_gauges(),
            staged_bytes,
            staging_budget_bytes,
            prefetch_depth: self.prefetcher.depth() as u64,
            prefetch_parked: self.prefetcher.parked() as u64,
            memory: self.memory().gauges(),
            ..self.cache.gauges()
        }
    }

    /// Resolves `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr, FsError> {
        match parent {
            ROOT if name == CONTROL_DIR_NAME => {
                return self.virtual_attr(CONTROL_DIR).ok_or(FsError::NotFound);
            }
            CONTROL_DIR => {
                let ino = match name.to_str() {
                    Some("stats.json") => STATS_FILE,
                    Some("metrics") => METRICS_FILE,
                    Some("views") => VIEWS_DIR,
                    _ => return Err(FsError::NotFound),
                };
                return self.virtual_attr(ino).ok_or(FsError::NotFound);
            }
            VIEWS_DIR => return self.lookup_view_root(name),
            _ => {}
        }
        let parent = self.node(parent)?;
        if parent.kind != Kind::Directory {
            return Err(FsError::NotDirectory);
        }
        if parent.view.is_some() {
            return self.lookup_in_view(&parent, name);
        }
        let path = inode::validate_name(name)?;
        let child_path = if parent.ino == ROOT {
            path.to_path_buf()
        } else {
            parent.path.join(path)
        };
        let meta = self
            .source
            .stat(&child_path)
            .map_err(|e| FsError::from_source(&e))?;
        let node = self.inodes.intern(&parent, name, meta.kind);
        self.inodes.remember(&node);
        Ok(Self::source_attr(node.ino, &meta))
    }

    /// Whether `ino` is a virtual node (the control directory, its files, the views' roots):
    /// answered without the source, so never held up by it.
    pub fn is_virtual(&self, ino: u64) -> bool {
        ino != ROOT && ino < inode::FIRST_SOURCE_INODE
    }

    /// Whether looking `name` up in `parent` is answered without the source.
    pub fn lookup_is_virtual(&self, parent: u64, name: &OsStr) -> bool {
        (parent == ROOT && name == CONTROL_DIR_NAME) || parent == CONTROL_DIR || parent == VIEWS_DIR
    }

    /// The kernel dropped `nlookup` lookups of `ino` (its inode left the kernel's caches).
    pub fn forget(&self, ino: u64, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
    }

    /// Attributes of inode `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        if let Some(attr) = self.virtual_attr(ino) {
            return Ok(attr);
        }
        let node = self.node(ino)?;
        if node.view.is_some() {
            return self.view_attr(&node);
        }
        let meta = self.stat_node(&node)?;
        Ok(Self::source_attr(ino, &meta))
    }

    /// The value of extended attribute `name` of `ino`. Only `CACHED_XATTR` exists, on dataset
    /// files: `ram=R disk=D blocks=N`, the 1 MiB blocks of the source file's current version
    /// that the RAM tier and the disk tier hold, out of its `N`.
    pub fn xattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>, FsError> {
        let node = match self.inodes.get(ino) {
            Some(node)
                if name == CACHED_XATTR && node.kind == Kind::File && node.view.is_none() =>
            {
                node
            }
            _ => return Err(FsError::NoAttribute),
        };
        let identity = self.stat_node(&node)?.identity;
        let blocks = identity.size.div_ceil(BLOCK_SIZE);
        let (ram, disk) = self.cache.held(&identity);
        Ok(format!("ram={ram} disk={disk} blocks={blocks}").into_bytes())
    }

    /// The stored target of symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<OsString, FsError> {
        let node = self.node(ino)?;
        if node.kind != Kind::Symlink {
            return Err(FsError::InvalidName);
        }
        self.source
            .read_link(&node.path)
            .map_err(|e| FsError::from_source(&e))
    }

    /// Opens `ino` for reading; `Intent::Write` is refused.
    pub fn open(&self, ino: u64, intent: Intent) -> Result<Opened, FsError> {
        if intent == Intent::Write {
            return Err(FsError::ReadOnly);
        }
        if let Some(content) = self.render(ino) {
            let fh = self.add_handle(Handle::Snapshot(Arc::new(content)));
            return Ok(Opened {
                fh,
                serve: Serve::Daemon,
            });
        }
        let node = self.node(ino)?;
        match node.kind {
            Kind::File => {}
            Kind::Directory => return Err(FsError::IsDirectory),
            Kind::Symlink | Kind::Other => return Err(FsError::AccessDenied),
        }
        if node.view.is_some() {
            let fh = self.add_handle(self.open_view_file(node, intent)?);
            return Ok(Opened {
                fh,
                serve: Serve::Daemon,
            });
        }
        let source = self.open_source(&node)?;
        let identity = source.identity();
        {
            let mut last = node.last_identity.lock();
            if let Some(old) = *last
                && old != identity
            {
                self.cache.forget(&old);
                self.metrics.stale_detections.inc();
                tracing::info!(path = %node.path.display(), "source file changed; old cache entry dropped");
            }
            *last = Some(identity);
        }
        let cached = self.cache.file(identity, &node.path);
        if intent == Intent::Read {
            self.prefetcher.opened(0, &node.path, Some(identity));
        }
        let serve = if self.options.passthrough && cached.passthrough_fd().is_some() {
            Serve::Passthrough(cached.clone())
        } else {
            Serve::Daemon
        };
        let fh = self.add_handle(Handle::File {
            source,
            cached,
            unpacked: Unpacked::default(),
            readahead: Readahead::default(),
        });
        Ok(Opened { fh, serve })
    }

    /// Whether `open_cached` can answer for `ino`: a dataset file whose version seen by the last
    /// open the cache holds whole. Asks nothing of the source.
    pub fn has_cached_version(&self, ino: u64) -> bool {
        self.cached_version(ino).is_some()
    }

    fn cached_version(&self, ino: u64) -> Option<(Arc<Node>, Arc<CachedFile>)> {
        let node = self.inodes.get(ino)?;
        if node.kind != Kind::File || node.view.is_some() {
            return None;
        }
        let identity = (*node.last_identity.lock())?;
        let cached = self.cache.get(&identity).filter(|c| c.is_complete())?;
        Some((node, cached))
    }

    /// Opens `ino` from the cache alone, as the version the last open saw, without asking the
    /// source: for when the source does not answer an open in time (a hung network filesystem).
    /// Counted in `source.unanswered_opens`.
    pub fn open_cached(&self, ino: u64) -> Result<Opened, FsError> {
        let (node, cached) = self.cached_version(ino).ok_or(FsError::Io)?;
        self.metrics.unanswered_opens.inc();
        let source: Arc<dyn SourceFile> = Arc::new(Deferred::new(
            self.source.clone(),
            &node.path,
            cached.identity(),
        ));
        let serve = if self.options.passthrough && cached.passthrough_fd().is_some() {
            Serve::Passthrough(cached.clone())
        } else {
            Serve::Daemon
        };
        let fh = self.add_handle(Handle::File {
            source,
            cached,
            unpacked: Unpacked::default(),
            readahead: Readahead::default(),
        });
        Ok(Opened { fh, serve })
    }

    /// The source file behind an open of `node`. A version whose every block the cache or the
    /// staging buffer holds is identified by a stat and opened only if a read comes to need it
    /// (an open is a round trip on network storage); any other is the file prefetch opened
    /// ahead at this version, else opened now, so reads of it keep that descriptor's version.
    fn open_source(&self, node: &Node) -> Result<Arc<dyn SourceFile>, FsError> {
        let meta = self.stat_node(node)?;
        if self
            .cache
            .get(&meta.identity)
            .is_some_and(|c| c.is_available())
        {
            return Ok(Arc::new(Deferred::new(
                self.source.clone(),
                &node.path,
                meta.identity,
            )));
        }
        if let Some(file) = self.prefetcher.take_opened(&node.path, meta.identity) {
            return Ok(file);
        }
        self.source
            .open(&node.path)
            .map_err(|e| FsError::from_source(&e))
    }

    fn add_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.insert(fh, Arc::new(handle));
        fh
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>, FsError> {
        self.handles.get(&fh).ok_or(FsError::BadHandle)
    }

    /// Answers a read without waiting on the source: `None` when it needs [`Fs::read`].
    pub fn read_cached(
        &self,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Option<Result<ReadBytes, FsError>> {
        let handle = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return Some(Err(e)),
        };
        match &*handle {
            Handle::File {
                source,
                cached,
                unpacked,
                readahead,
            } => {
                let bytes = cached.read_cached(offset, size, unpacked)?;
                self.prefetcher
                    .readahead(readahead, cached, source, offset, u64::from(size));
                Some(Ok(bytes))
            }
            Handle::Snapshot(content) => Some(Ok(snapshot_range(content, offset, size))),
            Handle::View(open) => open
                .ready()
                .map(|r| r.map(|bytes| snapshot_range(&bytes, offset, size))),
            Handle::Dir(_) => Some(Err(FsError::IsDirectory)),
        }
    }

    /// Answers a read, fetching from the source where the cache misses. May block.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<ReadBytes, FsError> {
        match &*self.handle(fh)? {
            Handle::File {
                source,
                cached,
                unpacked,
                readahead,
            } => {
                let waited = Instant::now();
                let bytes = {
                    let _demand = self.prefetcher.demand();
                    cached.read(source.as_ref(), offset, size, unpacked)
                };
                self.metrics
                    .fetch_stall_ns
                    .add(waited.elapsed().as_nanos() as u64);
                self.prefetcher
                    .readahead(readahead, cached, source, offset, u64::from(size));
                bytes
            }
            Handle::Snapshot(content) => Ok(snapshot_range(content, offset, size)),
            Handle::View(open) => {
                let waited = Instant::now();
                let rendered = self.views.rendered(open);
                self.metrics
                    .prep_stall_ns
                    .add(waited.elapsed().as_nanos() as u64);
                Ok(snapshot_range(&rendered?, offset, size))
            }
            Handle::Dir(_) => Err(FsError::IsDirectory),
        }
    }

    /// Forgets a file or directory handle (and a cache entry it leaves holding nothing).
    pub fn release(&self, fh: u64) -> Result<(), FsError> {
        let handle = self.handles.remove(&fh).ok_or(FsError::BadHandle)?;
        if let Handle::File { cached, .. } = &*handle {
            self.cache.settle(cached);
        }
        Ok(())
    }

    /// Opens directory `ino`, taking a snapshot of its names.
    pub fn opendir(&self, ino: u64) -> Result<u64, FsError> {
        if ino == CONTROL_DIR {
            let mut names = vec![
                ("stats.json".into(), Kind::File, Some(STATS_FILE)),
                ("metrics".into(), Kind::File, Some(METRICS_FILE)),
            ];
            if !self.views.is_empty() {
                names.push(("views".into(), Kind::Directory, Some(VIEWS_DIR)));
            }
            let node = self.node(ROOT)?;
            return Ok(self.add_handle(Handle::Dir(DirSnapshot {
                node,
                dots: (CONTROL_DIR, ROOT),
                names,
            })));
        }
        if ino == VIEWS_DIR && !self.views.is_empty() {
            let node = self.node(ROOT)?;
            return Ok(self.add_handle(Handle::Dir(DirSnapshot {
                node,
                dots: (VIEWS_DIR, CONTROL_DIR),
                names: self.list_views(),
            })));
        }
        let node = self.node(ino)?;
        if node.kind != Kind::Directory {
            return Err(FsError::NotDirectory);
        }
        if node.view.is_some() {
            let snapshot = self.opendir_in_view(node)?;
            return Ok(self.add_handle(Handle::Dir(snapshot)));
        }
        let entries = self
            .source
            .list(&node.path)
            .map_err(|e| FsError::from_source(&e))?;
        let names = entries
            .into_iter()
            // `.prepfs` is reachable but never listed: loaders such as torchvision's ImageFolder
            // treat every listed directory as a class.
            .filter(|e| !(ino == ROOT && e.name == CONTROL_DIR_NAME))
            .map(|e| (e.name, e.kind, None))
            .collect();
        let dots = (node.ino, node.parent);
        Ok(self.add_handle(Handle::Dir(DirSnapshot { node, dots, names })))
    }

    /// Entries of an open directory from position `offset` on (`.` and `..` first), handed to
    /// `take` with the offset that resumes after each; `take` returns true to stop.
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        mut take: impl FnMut(u64, DirItem) -> bool,
    ) -> Result<(), FsError> {
        let handle = self.handle(fh)?;
        let Handle::Dir(dir) = &*handle else {
            return Err(FsError::NotDirectory);
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for position in start..dir.names.len().saturating_add(2) {
            let item = match position {
                0 => DirItem {
                    ino: dir.dots.0,
                    kind: Kind::Directory,
                    name: ".".into(),
                },
                1 => DirItem {
                    ino: dir.dots.1,
                    kind: Kind::Directory,
                    name: "..".into(),
                },
                _ => {
                    let (name, kind, fixed) = &dir.names[position - 2];
                    // A listing creates no node (only a lookup does, which the kernel forgets):
                    // names not looked up yet show a number of their own, derived from the name.
                    let ino = fixed
                        .or_else(|| self.inodes.find(dir.node.ino, name))
                        .unwrap_or_else(|| inode::listed_only(dir.node.ino, name));
                    DirItem {
                        ino,
                        kind: *kind,
                        name: name.clone(),
                    }
                }
            };
            if take(position as u64 + 1, item) {
                break;
            }
        }
        Ok(())
    }

    /// Capacity of the filesystem holding the source.
    pub fn statfs(&self) -> Result<SpaceStats, FsError> {
        self.source.space().map_err(|e| FsError::from_source(&e))
    }
}

fn snapshot_range(content: &Arc<Vec<u8>>, offset: u64, size: u32) -> ReadBytes {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(content.len());
    let end = start.saturating_add(size as usize).min(content.len());
    ReadBytes::Whole(content.clone(), start..end)
}
