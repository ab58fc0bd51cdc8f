//! Predictive prefetch: epochs inferred from opens, the next files fetched before they are asked.
//!
//! Owns: the planner thread (one `EpochTracker` and set of scored predictors per file set: the
//! source tree, and each view), the bounded queue of planned jobs, sequential readahead within
//! large files, per-epoch records, and the heuristic controller of depth and concurrency. The
//! fetches themselves run on the mount's one I/O pool (`requests::RequestPool`), as its
//! background lane: a free thread pulls the next job from this queue when no kernel request
//! waits, so this queue is the only one of planned files and the pool never holds a stale job.
//! Opens reach the planner through a bounded channel (an open never waits on it; a full channel
//! drops the event and counts it). The planner replaces its queued files after every open with
//! the best predictor's next ones; when no predictor has been right recently it falls back to
//! the files the last pass read and this one has not (epochs >= 2; their bytes smallest first,
//! since each is equally likely next); in epoch 1 it fetches nothing. Jobs fetch into the
//! never-evict cache, else into the staging buffer, else only open the file and park it for the
//! reader's open (`Parked`); once passes come in an order only the remaining set plans (shuffled),
//! the default staging slice's free room goes to the cache for good in a mount without views or a
//! cluster tier (in such an order a staged block saves a wait once, a cached one a source read
//! every epoch); a parked file is planned again only once room for its bytes frees,
//! and no file is opened ahead while the parked set is full and there is no room, so opens ahead
//! never churn. Demand reads never queue behind prefetch (the pool takes a queued request before
//! any job), at most `--prefetch-threads` jobs run at once (on threads the pool adds for them),
//! and while any demand read waits on the source, at most half of them. Must never serve bytes
//! (the cache does, keyed by file version), never block an open or a read on planning, and never
//! fetch past the cache's budget and the staging buffer's.
//!
//! Where each part lives: this file starts the planner, registers the lane and holds what they
//! share (the queues, outcomes, readahead, per-epoch marks); `planner` is the planner thread and
//! the depth controller; `fetch` runs one job; `files`, `epoch`, `predict`, `hint` and `parked`
//! what the planner and the jobs use; `diagnosis` and `metrics` what a pass and the mount report.

mod chores;
pub mod diagnosis;
pub mod epoch;
mod fetch;
pub mod files;
mod hint;
mod listing;
pub mod metrics;
mod parked;
mod planner;
pub mod predict;

use std::collections::VecDeque;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::cache::{BlockFetcher, RamFile};
use crate::control::knobs::Knobs;
use crate::metrics::Samples;
use crate::requests::{Bell, Lane, RequestPool};
use crate::source::{Identity, Source, SourceFile};
use diagnosis::PassFigures;
use files::FileKey;
use hint::OrderFile;
use metrics::PrefetchMetrics;
use parked::Parked;
pub use planner::{SEEN_FILE_BYTES, controller_depth};
use planner::{SetState, plan};

/// Opens waiting for the planner; beyond it they are dropped (and counted), never waited for.
const EVENT_QUEUE: usize = 4096;
/// Blocks a file prefetch fetches from the start of a file; sequential readahead fetches the
/// rest of larger files (shards) as they are read.
const FILE_BLOCKS: usize = 8;
/// Readahead window bounds, in blocks: it starts small and doubles while reads stay sequential.
const READAHEAD_MIN: u64 = 2;
const READAHEAD_MAX: u64 = 16;
/// Readahead jobs waiting at most: beyond it a window is not queued, and the handle asks again
/// on its next sequential read (the queue stays bounded however many files are streamed).
const READAHEAD_QUEUED: usize = 64;
/// Files the planner keeps queued ahead of the readers, at least and at most.
const DEPTH_MIN: usize = 4;
const DEPTH_MAX: usize = 128;
/// How often the planner refreshes the stats snapshot.
const STATUS_EVERY: Duration = Duration::from_millis(100);
/// Epoch records kept per set.
const HISTORY: usize = 32;
/// Weight of the newest sample in the controller's moving averages.
const EWMA: f64 = 0.1;

/// Prefetch jobs at once by default: concurrent fetches and opens hide a few ms of per-request
/// latency behind each other's transfers (two left a shuffled epoch's opens ahead behind the
/// reader); each holds a block in flight, charged to the memory budget's work slice.
pub const DEFAULT_THREADS: usize = 4;
/// Staging buffer by default: a few dozen files or shards' first blocks ahead, small next to any
/// cache budget worth having (`memory::MemoryPlan` keeps it to an eighth of a small budget).
pub const DEFAULT_BUFFER: u64 = 64 << 20;

/// Prefetch's configuration (`--no-prefetch`, `--prefetch-threads`, `--prefetch-buffer`,
/// `--order-file`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrefetchConfig {
    /// Whether to prefetch at all (epochs are tracked either way).
    pub enabled: bool,
    /// Jobs at once (concurrent source fetches ahead of the readers), on as many threads the
    /// I/O pool adds for them.
    pub threads: usize,
    /// The staging buffer asked for (`None`: `DEFAULT_BUFFER`, within its share of the budget).
    pub buffer: Option<u64>,
    /// An order file a sampler writes (an absolute path outside the mount), for prefetch to
    /// follow.
    pub order_file: Option<PathBuf>,
}

impl Default for PrefetchConfig {
    fn default() -> PrefetchConfig {
        PrefetchConfig {
            enabled: true,
            threads: DEFAULT_THREADS,
            buffer: None,
            order_file: None,
        }
    }
}

impl PrefetchConfig {
    /// Threads that may hold a source read in flight (none without prefetch).
    pub fn readers(&self) -> usize {
        if self.enabled { self.threads } else { 0 }
    }
}

/// A file set: the source tree (0) or view `n - 1`.
pub type SetId = usize;

/// What became of a file the planner queued in this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    InFlight,
    Done,
    /// Opened ahead without room for its bytes: planned again only once room frees.
    Parked,
    /// Needed nothing (already cached, or failed): not planned again in this pass.
    Settled,
}

/// What prefetch does for view sets (set 1 + i is view i), supplied by the views.
pub trait ViewWork: Send + Sync {
    /// Whether view set `set` shows the source file `path`: only those are planned for it (a
    /// walk of the source tree also predicts files no view shows).
    fn shows(&self, set: SetId, path: &Path) -> bool;
    /// Whether planning ahead for view set `set` can help now. Not while renders wait for a
    /// thread with the CPU busy: the CPU is then what the view waits for, its images' bytes are
    /// not, and work ahead would only take from it.
    fn worth_planning(&self, set: SetId) -> bool;
    /// Prepares the predicted view file of `path` (open as `source`) ahead of its open in view
    /// set `set`: decodes its pixels into the cache or renders its next open.
    fn prepare(&self, set: SetId, path: &Path, source: &dyn SourceFile) -> Ahead;
}

/// The views' side of prefetch, when the mount has views.
pub type WorkAhead = Arc<dyn ViewWork>;

/// What preparing a view file ahead of its open did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ahead {
    /// Work its open will use: pixels decoded into the cache, or its render made.
    Done,
    /// Nothing for a passing reason (a render waits for a thread, no spare memory, as many
    /// renders held as allowed): the planner may queue it again.
    NotNow,
    /// Nothing to do for it (prepared already, unknown, or it failed).
    Nothing,
}

enum Job {
    /// Fetch the first blocks of a file ahead of its open.
    File {
        set: SetId,
        file: FileKey,
        identity: Option<Identity>,
    },
    /// Fetch blocks of an open file ahead of a sequential reader.
    Blocks {
        entry: Arc<RamFile>,
        source: Arc<dyn SourceFile>,
        blocks: Range<usize>,
    },
}

struct Event {
    set: SetId,
    file: FileKey,
    identity: Option<Identity>,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Job>,
}

/// A set's working set: the files of the larger of its last complete pass and the current one
/// so far, and their bytes when every file's size is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkingSetFigures {
    /// Distinct files.
    pub files: u64,
    /// Their bytes (`None`: some size unknown, as for views' files).
    pub bytes: Option<u64>,
    /// Whether a pass of the set has ended, so the figures are at least a whole pass's (in the
    /// first pass they are only the files read so far).
    pub whole: bool,
}

/// A set's `WorkingSetFigures`, published by the planner thread and read by telemetry.
#[derive(Default)]
struct WorkingSet {
    files: AtomicU64,
    /// `u64::MAX`: unknown.
    bytes: AtomicU64,
    whole: AtomicBool,
}

impl WorkingSet {
    fn publish(&self, figures: WorkingSetFigures) {
        self.files.store(figures.files, Ordering::Relaxed);
        self.bytes
            .store(figures.bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.whole.store(figures.whole, Ordering::Relaxed);
    }

    fn figures(&self) -> WorkingSetFigures {
        let bytes = self.bytes.load(Ordering::Relaxed);
        WorkingSetFigures {
            files: self.files.load(Ordering::Relaxed),
            bytes: (bytes != u64::MAX).then_some(bytes),
            whole: self.whole.load(Ordering::Relaxed),
        }
    }
}

/// Counter values at an epoch boundary, to record each epoch's share.
#[derive(Debug, Clone, Copy, Default)]
struct Marks {
    hits: u64,
    misses: u64,
    fetch_stall_ns: u64,
    prep_stall_ns: u64,
    source_bytes: u64,
    useful: u64,
    late: u64,
    wasted: u64,
    staged_reads: u64,
}

impl Marks {
    fn now(shared: &Shared) -> Marks {
        let (cache, m) = (shared.fetcher.metrics(), &shared.metrics);
        let waits = (shared.waits)();
        Marks {
            hits: cache.hits.get(),
            misses: cache.misses.get(),
            fetch_stall_ns: waits.fetch_ns,
            prep_stall_ns: waits.prep_ns,
            source_bytes: cache.source_bytes.get(),
            useful: m.useful.get(),
            late: m.late.get(),
            wasted: m.wasted.get(),
            staged_reads: cache.staged_reads.get(),
        }
    }

    /// The record of the pass that ran from `start` to these marks.
    fn since(&self, start: &Marks, pass: &PassFigures, files: usize) -> Value {
        json!({
            "epoch": pass.epoch,
            "files": files,
            "seconds": pass.seconds,
            "working_set_bytes": pass.working_set_bytes,
            "cache_hits": self.hits - start.hits,
            "cache_misses": self.misses - start.misses,
            "fetch_stall_seconds": pass.fetch_stall_seconds,
            "prep_stall_seconds": pass.prep_stall_seconds,
            "source_bytes": pass.source_bytes,
            "prefetch_useful": self.useful - start.useful,
            "prefetch_late": self.late - start.late,
            "prefetch_wasted": self.wasted - start.wasted,
            "staged_reads": self.staged_reads - start.staged_reads,
        })
    }

    /// The figures the diagnosis needs of the pass from `start` to these marks.
    fn figures(
        &self,
        start: &Marks,
        epoch: u64,
        seconds: f64,
        working_set_bytes: Option<u64>,
    ) -> PassFigures {
        PassFigures {
            epoch,
            seconds,
            fetch_stall_seconds: (self.fetch_stall_ns - start.fetch_stall_ns) as f64 / 1e9,
            prep_stall_seconds: (self.prep_stall_ns - start.prep_stall_ns) as f64 / 1e9,
            source_bytes: self.source_bytes - start.source_bytes,
            working_set_bytes,
        }
    }
}

struct Shared {
    source: Arc<dyn Source>,
    fetcher: Arc<BlockFetcher>,
    metrics: PrefetchMetrics,
    /// How long readers have waited so far.
    waits: Waits,
    /// Whether jobs run, and how many at once.
    enabled: bool,
    threads: usize,
    jobs: Mutex<Jobs>,
    /// Wakes the I/O pool when a job is queued.
    bell: Bell,
    stop: AtomicBool,
    /// Demand reads waiting on the source now (the pool's lane runs half its jobs meanwhile).
    demand: Arc<AtomicUsize>,
    /// Per set: files queued or fetched ahead in this pass.
    outcomes: Vec<Mutex<foldhash::HashMap<FileKey, Outcome>>>,
    /// Per set: its working set as the planner last published it.
    working: Vec<WorkingSet>,
    /// Seconds a file prefetch takes (moving average, f64 bits).
    file_seconds: AtomicU64,
    depth: AtomicUsize,
    /// The scheduler's depth knob (released: the controller below decides).
    knobs: Arc<Knobs>,
    status: Mutex<Value>,
    /// Whether the staging slice goes to the cache once passes repeat in an order no predictor
    /// follows: the default one (not a `--prefetch-buffer` the user gave) of a mount without
    /// views (renders take their room from staging's when the work slice is full) and without a
    /// cluster tier (staging holds the cluster's blocks ahead of the readers, whose own lookups
    /// then wait on the network: measured, 2 timed out per run and read the source).
    lends_staging: bool,
    /// Files opened ahead whose bytes had no room anywhere.
    parked: Parked,
    /// Prepares view files ahead of their opens: decodes or renders them (view sets only).
    work_ahead: Option<WorkAhead>,
}

/// The prefetcher of one mount.
pub struct Prefetcher {
    shared: Arc<Shared>,
    events: Option<SyncSender<Event>>,
    planner: Option<JoinHandle<()>>,
}

/// Marks a demand read waiting on the source for as long as it lives.
pub struct DemandGuard<'a>(&'a Shared);

impl Drop for DemandGuard<'_> {
    fn drop(&mut self) {
        // The last reader waiting on the source is answered: the pool's lane may run all its
        // jobs again, at once rather than at the watchdog's next look.
        if self.0.demand.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.bell.ring();
        }
    }
}

/// How long readers have waited so far, summed over readers: on the source (fetch stall) and
/// for view renders (prep stall). The file system measures them; a pass's record shows its share.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReaderWaits {
    /// Nanoseconds demand reads of dataset files waited on the source.
    pub fetch_ns: u64,
    /// Nanoseconds view reads waited for their render.
    pub prep_ns: u64,
}

/// Reads `ReaderWaits` now.
pub type Waits = Box<dyn Fn() -> ReaderWaits + Send + Sync>;

/// Per-handle state of sequential readahead.
#[derive(Debug, Default)]
pub struct Readahead {
    next: AtomicU64,
    window: AtomicU64,
    requested: AtomicU64,
}

impl Prefetcher {
    /// Starts the planner for the source tree and `views` views (named `view_names`, their
    /// images prepared ahead by `work_ahead` once fetched: decoded, or rendered for their next
    /// open), following `config`'s order file too when there is one (its paths name files in the mount at `mountpoint`); its jobs run on
    /// `pool`'s background lane (sized for `config.readers()`), each stuck after `patience`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        source: Arc<dyn Source>,
        fetcher: Arc<BlockFetcher>,
        waits: Waits,
        config: &PrefetchConfig,
        pool: &RequestPool,
        patience: Duration,
        mountpoint: &Path,
        view_names: &[String],
        work_ahead: Option<WorkAhead>,
        knobs: Arc<Knobs>,
    ) -> Prefetcher {
        let names: Vec<String> = std::iter::once("files".to_owned())
            .chain(view_names.iter().map(|n| format!("view:{n}")))
            .collect();
        let lends_staging =
            config.buffer.is_none() && view_names.is_empty() && fetcher.cluster().is_none();
        let shared = Arc::new(Shared {
            source: source.clone(),
            fetcher,
            metrics: PrefetchMetrics::default(),
            waits,
            enabled: config.enabled,
            threads: config.threads,
            jobs: Mutex::new(Jobs::default()),
            bell: pool.bell(),
            stop: AtomicBool::new(false),
            demand: Arc::default(),
            outcomes: names.iter().map(|_| Mutex::default()).collect(),
            working: names.iter().map(|_| WorkingSet::default()).collect(),
            file_seconds: AtomicU64::new(0f64.to_bits()),
            depth: AtomicUsize::new(DEPTH_MIN),
            knobs,
            status: Mutex::new(json!({})),
            lends_staging,
            parked: Parked::for_open_file_limit(),
            work_ahead,
        });
        let order_file = config.order_file.clone().map(|file| {
            let budget = shared.fetcher.ram().budget().clone();
            OrderFile::new(file, mountpoint.to_path_buf(), budget)
        });
        let slot = order_file.as_ref().map(OrderFile::slot);
        let chores = chores::Chores::start();
        let sets: Vec<SetState> = names
            .into_iter()
            .map(|name| SetState::new(name, &source, &shared, slot.as_ref(), &chores))
            .collect();
        let (tx, rx) = sync_channel(EVENT_QUEUE);
        let s = shared.clone();
        let planner = std::thread::Builder::new()
            .name("prepfs-planner".into())
            .spawn(move || plan(&s, sets, &rx, order_file))
            .inspect_err(
                |e| tracing::warn!(error = %e, "cannot start the prefetch planner; no prefetch"),
            )
            .ok();
        if config.enabled {
            let s = shared.clone();
            let lane = Lane {
                next: Box::new(move || fetch::next(&s)),
                demand: shared.demand.clone(),
                patience,
            };
            if pool.serve(lane).is_err() {
                tracing::warn!("the I/O pool serves another lane already; no prefetch");
            }
        }
        Prefetcher {
            shared,
            events: Some(tx),
            planner,
        }
    }

    /// Tells the planner that a reader opened `file` of set `set` (at version `identity`, when
    /// the open knows it).
    pub fn opened(&self, set: SetId, file: &Arc<Path>, identity: Option<Identity>) {
        let Some(tx) = &self.events else { return };
        let event = Event {
            set,
            file: FileKey::from(file),
            identity,
        };
        if let Err(TrySendError::Full(_)) = tx.try_send(event) {
            self.shared.metrics.events_dropped.inc();
        }
    }

    /// Marks a demand read waiting on the source until the guard drops (prefetch yields).
    pub fn demand(&self) -> DemandGuard<'_> {
        self.shared.demand.fetch_add(1, Ordering::AcqRel);
        DemandGuard(&self.shared)
    }

    /// After a read of `len` bytes at `offset` of `entry` through one handle: when the handle
    /// reads sequentially, queues the blocks ahead of it, in a window that doubles while it
    /// stays sequential.
    pub fn readahead(
        &self,
        state: &Readahead,
        entry: &Arc<RamFile>,
        source: &Arc<dyn SourceFile>,
        offset: u64,
        len: u64,
    ) {
        if !self.shared.enabled || entry.blocks() <= 1 || entry.is_complete() {
            return;
        }
        let end = offset + len;
        if state.next.swap(end, Ordering::AcqRel) != offset {
            state.window.store(0, Ordering::Release);
            return;
        }
        let window = (state.window.load(Ordering::Acquire) * 2).clamp(READAHEAD_MIN, READAHEAD_MAX);
        state.window.store(window, Ordering::Release);
        let next_block = end.div_ceil(crate::cache::BLOCK_SIZE);
        let from = next_block.max(state.requested.load(Ordering::Acquire));
        let to = (next_block + window).min(entry.blocks() as u64);
        if from >= to {
            return;
        }
        let mut jobs = self.shared.jobs.lock();
        let queued = jobs
            .queue
            .iter()
            .filter(|j| matches!(j, Job::Blocks { .. }))
            .count();
        if queued >= READAHEAD_QUEUED {
            return;
        }
        state.requested.store(to, Ordering::Release);
        jobs.queue.push_front(Job::Blocks {
            entry: entry.clone(),
            source: source.clone(),
            blocks: from as usize..to as usize,
        });
        drop(jobs);
        self.shared.bell.ring();
    }

    /// The source file a prefetch opened ahead for `path`, if it is at version `identity`: the
    /// open that takes it makes no round trip to the source.
    pub fn take_opened(&self, path: &Path, identity: Identity) -> Option<Arc<dyn SourceFile>> {
        let file = self.shared.parked.take(path, Some(identity))?;
        self.shared.metrics.opens_saved.inc();
        Some(file)
    }

    /// The planner's latest view of epochs and predictors, for stats.json.
    pub fn status(&self) -> Value {
        self.shared.status.lock().clone()
    }

    /// Files opened ahead and not yet taken.
    pub fn parked(&self) -> usize {
        self.shared.parked.len()
    }

    /// Prefetch's samples for the stats files.
    pub fn samples(&self, out: &mut Samples) {
        let depth = self.depth() as u64;
        self.shared
            .metrics
            .samples(depth, self.parked() as u64, out);
    }

    /// Prefetch's counters.
    pub fn metrics(&self) -> &PrefetchMetrics {
        &self.shared.metrics
    }

    /// Files the planner keeps queued ahead (the controller's or the scheduler's depth).
    pub fn depth(&self) -> usize {
        self.shared.depth.load(Ordering::Relaxed)
    }

    /// A gauge of each set's working set (in set order: the source tree's files, then each
    /// view's).
    pub fn working_sets(&self) -> impl Fn() -> Vec<WorkingSetFigures> + Send + 'static {
        let shared = self.shared.clone();
        move || shared.working.iter().map(WorkingSet::figures).collect()
    }

    /// A gauge of the prefetch queue: files waiting, as a share of the current depth.
    pub fn queue_share(&self) -> impl Fn() -> f64 + Send + 'static {
        let shared = self.shared.clone();
        move || {
            let queued = shared.jobs.lock().queue.len() as f64;
            queued / shared.depth.load(Ordering::Relaxed).max(1) as f64
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.events = None;
        self.shared.stop.store(true, Ordering::Release);
        if let Some(planner) = self.planner.take() {
            let _ = planner.join();
        }
    }
}
