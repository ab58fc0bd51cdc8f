//! Predictive prefetch: epochs inferred from opens, the next files fetched before they are asked.
//!
//! Owns: the planner thread (one `EpochTracker` and set of scored predictors per file set: the
//! source tree, and each view), the prefetch workers and their bounded queue, sequential
//! readahead within large files, per-epoch records, and the heuristic controller of depth and
//! concurrency. Opens reach the planner through a bounded channel (an open never waits on it;
//! a full channel drops the event and counts it). The planner replaces its queued files after
//! every open with the best predictor's next ones; when no predictor has been right recently it
//! falls back to the files the last pass read and this one has not (epochs >= 2; their bytes
//! smallest first, since each is equally likely next); in epoch 1 it fetches nothing. Workers
//! fetch into the never-evict cache, else into the staging buffer, else only open the file and
//! park it for the reader's open (`Parked`); a parked file is planned again only once room for
//! its bytes frees, and no file is opened ahead while the parked set is full and there is no
//! room, so opens ahead never churn. Demand reads never queue behind prefetch (they do not use
//! this queue), and while any demand read waits on the source, at most half the workers run.
//! Must never serve bytes (the cache does, keyed by file version), never block an open or a read
//! on planning, and never fetch past the cache's budget and the staging buffer's.

pub mod diagnosis;
pub mod epoch;
mod hint;
pub mod metrics;
mod parked;
pub mod predict;

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde_json::{Value, json};

use crate::cache::{BlockFetcher, Prefetched, RamFile};
use crate::control::knobs::Knobs;
use crate::metrics::Samples;
use crate::source::{Identity, Source, SourceFile};
use diagnosis::{Capacity, PassFigures, diagnose};
use epoch::{EpochTracker, FileKey, Opened, Positions};
use hint::{Hint, OrderFile, OrderSlot, Polled};
use metrics::PrefetchMetrics;
use parked::Parked;
use predict::{HORIZON, Predictor, Replay, Score, Tree, Verdict};

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

/// Prefetch workers by default: concurrent fetches and opens hide a few ms of per-request
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
    /// Worker threads (concurrent source fetches ahead of the readers).
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

/// Decodes a view image ahead of its open when the CPU is idle (the view set, the image's path,
/// the open source file); true when it decoded and the cache kept the pixels.
pub type DecodeAhead = Arc<dyn Fn(SetId, &Path, &dyn SourceFile) -> bool + Send + Sync>;

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
    running: usize,
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

/// What the planner knows about one file set.
struct SetState {
    name: String,
    tracker: EpochTracker,
    predictors: Vec<(Box<dyn Predictor>, Score)>,
    /// Identities seen at opens (a fully cached file is not queued again).
    known: HashMap<FileKey, Identity>,
    opens: u64,
    /// Where the remaining-set walks stand: opens ahead in the last pass's order, fetches in
    /// `by_size` (the last pass's files, smallest first).
    cursor: usize,
    fetch_cursor: usize,
    by_size: Vec<u32>,
    /// The last pass's files (positions) and `by_size` entries not settled in this pass: the
    /// remaining-set walks step over each settled file once, not at every open.
    unplanned: Positions,
    unfetched: Positions,
    in_use: &'static str,
    /// Opens per second (moving average) and when the last one came.
    rate: f64,
    last_open: Option<Instant>,
    epoch_started: Instant,
    marks: Marks,
    history: VecDeque<Value>,
    /// What kept readers waiting in the last complete pass (`null` before one).
    diagnosis: Value,
}

/// The depth controller: twice the files consumed while one file is fetched (`rate` opens/s x
/// `file_seconds`), plus one per worker, within `DEPTH_MIN..=DEPTH_MAX`. Also restated as the
/// scheduler's heuristic action.
pub fn controller_depth(rate: f64, file_seconds: f64, threads: usize) -> usize {
    ((rate * file_seconds * 2.0).ceil() as usize + threads).clamp(DEPTH_MIN, DEPTH_MAX)
}

struct Shared {
    source: Arc<dyn Source>,
    fetcher: Arc<BlockFetcher>,
    metrics: PrefetchMetrics,
    /// How long readers have waited so far.
    waits: Waits,
    /// Whether workers run, and how many.
    enabled: bool,
    threads: usize,
    jobs: Mutex<Jobs>,
    work: Condvar,
    stop: AtomicBool,
    /// Demand reads waiting on the source now.
    demand: AtomicUsize,
    /// Per set: files queued or fetched ahead in this pass.
    outcomes: Vec<Mutex<HashMap<FileKey, Outcome>>>,
    /// Seconds a file prefetch takes (moving average, f64 bits).
    file_seconds: AtomicU64,
    depth: AtomicUsize,
    /// The scheduler's depth knob (released: the controller below decides).
    knobs: Arc<Knobs>,
    status: Mutex<Value>,
    /// Files opened ahead whose bytes had no room anywhere.
    parked: Parked,
    /// Decodes view images ahead of their opens (view sets only).
    decode_ahead: Option<DecodeAhead>,
}

/// The prefetcher of one mount.
pub struct Prefetcher {
    shared: Arc<Shared>,
    events: Option<SyncSender<Event>>,
    threads: Vec<JoinHandle<()>>,
}

/// Marks a demand read waiting on the source for as long as it lives.
pub struct DemandGuard<'a>(&'a AtomicUsize);

impl Drop for DemandGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
    /// Starts the planner and `config.threads` workers for the source tree and `views` views
    /// (named `view_names`, their images decoded ahead by `decode_ahead` once fetched), following
    /// `config`'s order file too when there is one (its paths name files in the mount at
    /// `mountpoint`).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        source: Arc<dyn Source>,
        fetcher: Arc<BlockFetcher>,
        waits: Waits,
        config: &PrefetchConfig,
        mountpoint: &Path,
        view_names: &[String],
        decode_ahead: Option<DecodeAhead>,
        knobs: Arc<Knobs>,
    ) -> Prefetcher {
        let names: Vec<String> = std::iter::once("files".to_owned())
            .chain(view_names.iter().map(|n| format!("view:{n}")))
            .collect();
        let shared = Arc::new(Shared {
            source: source.clone(),
            fetcher,
            metrics: PrefetchMetrics::default(),
            waits,
            enabled: config.enabled,
            threads: config.threads,
            jobs: Mutex::new(Jobs::default()),
            work: Condvar::new(),
            stop: AtomicBool::new(false),
            demand: AtomicUsize::new(0),
            outcomes: names.iter().map(|_| Mutex::default()).collect(),
            file_seconds: AtomicU64::new(0f64.to_bits()),
            depth: AtomicUsize::new(DEPTH_MIN),
            knobs,
            status: Mutex::new(json!({})),
            parked: Parked::for_open_file_limit(),
            decode_ahead,
        });
        let order_file = config
            .order_file
            .clone()
            .map(|file| OrderFile::new(file, mountpoint.to_path_buf()));
        let slot = order_file.as_ref().map(OrderFile::slot);
        let sets: Vec<SetState> = names
            .into_iter()
            .map(|name| SetState::new(name, &source, Marks::now(&shared), slot.as_ref()))
            .collect();
        let (tx, rx) = sync_channel(EVENT_QUEUE);
        let mut threads = Vec::new();
        let s = shared.clone();
        match std::thread::Builder::new()
            .name("prepfs-planner".into())
            .spawn(move || plan(&s, sets, &rx, order_file))
        {
            Ok(t) => threads.push(t),
            Err(e) => tracing::warn!(error = %e, "cannot start the prefetch planner; no prefetch"),
        }
        if config.enabled {
            for i in 0..config.threads.max(1) {
                let s = shared.clone();
                match std::thread::Builder::new()
                    .name(format!("prepfs-prefetch-{i}"))
                    .spawn(move || work(&s))
                {
                    Ok(t) => threads.push(t),
                    Err(e) => tracing::warn!(error = %e, "cannot start a prefetch worker"),
                }
            }
        }
        Prefetcher {
            shared,
            events: Some(tx),
            threads,
        }
    }

    /// Tells the planner that a reader opened `file` of set `set` (at version `identity`, when
    /// the open knows it).
    pub fn opened(&self, set: SetId, file: &Path, identity: Option<Identity>) {
        let Some(tx) = &self.events else { return };
        let event = Event {
            set,
            file: Arc::from(file),
            identity,
        };
        if let Err(TrySendError::Full(_)) = tx.try_send(event) {
            self.shared.metrics.events_dropped.inc();
        }
    }

    /// Marks a demand read waiting on the source until the guard drops (prefetch yields).
    pub fn demand(&self) -> DemandGuard<'_> {
        self.shared.demand.fetch_add(1, Ordering::AcqRel);
        DemandGuard(&self.shared.demand)
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
        self.shared.work.notify_one();
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
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl SetState {
    fn new(
        name: String,
        source: &Arc<dyn Source>,
        marks: Marks,
        hint: Option<&OrderSlot>,
    ) -> SetState {
        let mut predictors: Vec<(Box<dyn Predictor>, Score)> = vec![
            (Box::new(Replay), Score::default()),
            (Box::new(Tree::new(source.clone(), true)), Score::default()),
            (Box::new(Tree::new(source.clone(), false)), Score::default()),
        ];
        if let Some(slot) = hint {
            predictors.push((Box::new(Hint::new(slot.clone())), Score::default()));
        }
        SetState {
            name,
            tracker: EpochTracker::default(),
            predictors,
            known: HashMap::new(),
            opens: 0,
            cursor: 0,
            fetch_cursor: 0,
            by_size: Vec::new(),
            unplanned: Positions::all(0),
            unfetched: Positions::all(0),
            in_use: "none",
            rate: 0.0,
            last_open: None,
            epoch_started: Instant::now(),
            marks,
            history: VecDeque::new(),
            diagnosis: Value::Null,
        }
    }

    /// Ends the epoch that just ended: its record, wasted prefetches, staged leftovers.
    fn close_epoch(&mut self, shared: &Shared, set: SetId) {
        let mut outcomes = shared.outcomes[set].lock();
        let wasted = outcomes.values().filter(|o| **o == Outcome::Done).count();
        outcomes.retain(|_, o| matches!(o, Outcome::InFlight | Outcome::Parked));
        drop(outcomes);
        shared.metrics.wasted.add(wasted as u64);
        shared.fetcher.staging().retire();
        for (p, score) in &mut self.predictors {
            p.forget_listings();
            score.new_pass();
        }
        let now = Marks::now(shared);
        let pass = self.tracker.previous();
        let files = pass.map_or(0, |p| p.len());
        // Sizes are known for dataset files (their identities), not for view files.
        let sizes: Vec<Option<u64>> = pass.map_or_else(Vec::new, |p| {
            p.order()
                .iter()
                .map(|f| self.known.get(f).map(|i| i.size))
                .collect()
        });
        self.by_size = predict::smallest_first(&sizes);
        self.unplanned = Positions::all(files);
        self.unfetched = Positions::all(self.by_size.len());
        // The walk starts after the cursor: at the smallest file.
        self.fetch_cursor = self.by_size.len().saturating_sub(1);
        let working_set = pass.and_then(|_| sizes.iter().copied().sum::<Option<u64>>());
        let figures = now.figures(
            &self.marks,
            self.tracker.epoch() - 1,
            self.epoch_started.elapsed().as_secs_f64(),
            working_set,
        );
        self.diagnosis = diagnose(&figures, &Capacity::of(&shared.fetcher.figures()));
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history
            .push_back(now.since(&self.marks, &figures, files));
        self.marks = now;
        self.epoch_started = Instant::now();
    }

    fn opened(&mut self, shared: &Shared, set: SetId, event: Event) {
        let file = event.file;
        if let Some(identity) = event.identity {
            self.known.insert(file.clone(), identity);
        }
        match self.tracker.open(&file) {
            Opened::Repeat | Opened::Straggler => return,
            Opened::NewEpoch => self.close_epoch(shared, set),
            Opened::First => {}
        }
        match shared.outcomes[set].lock().remove(&file) {
            Some(Outcome::Done) => shared.metrics.useful.inc(),
            Some(Outcome::InFlight) => shared.metrics.late.inc(),
            Some(Outcome::Parked | Outcome::Settled) | None => {}
        }
        let now = Instant::now();
        if let Some(last) = self.last_open.replace(now) {
            let gap = now.duration_since(last).as_secs_f64().max(1e-6);
            self.rate += EWMA * (1.0 / gap - self.rate);
        }
        self.opens += 1;
        let current = self.tracker.current();
        let looked = std::cell::Cell::new(0u64);
        let opened_now = |p: &Path| {
            looked.set(looked.get() + 1);
            current.contains(p)
        };
        for (predictor, score) in &mut self.predictors {
            score.opened(&file, self.opens);
            let mut out = Vec::new();
            predictor.predict(
                &self.tracker,
                &file,
                HORIZON as usize / 2,
                &opened_now,
                &mut out,
            );
            score.predicted(&out, self.opens);
        }
        let mut work = looked.get();
        if shared.enabled {
            work += self.plan(shared, set, &file);
        }
        for (predictor, _) in &mut self.predictors {
            work += predictor.take_work();
        }
        shared.metrics.planner_work.add(work);
    }

    /// Replaces this set's queued files with the next `depth` predicted ones (the scheduler's
    /// depth while it holds the knob, else `controller_depth`); returns the candidates it looked
    /// at.
    fn plan(&mut self, shared: &Shared, set: SetId, last: &Path) -> u64 {
        let file_seconds = f64::from_bits(shared.file_seconds.load(Ordering::Relaxed));
        let threads = shared.threads.max(1);
        let depth = shared
            .knobs
            .depth()
            .unwrap_or_else(|| controller_depth(self.rate, file_seconds, threads));
        shared.depth.store(depth, Ordering::Relaxed);
        let outcomes = &shared.outcomes[set];
        let current = self.tracker.current();
        let fetcher = &shared.fetcher;
        let known = &self.known;
        let parked_full = shared.parked.is_full();
        // A file's first block, as much as a prefetch of it needs room for at first.
        let first_block = |p: &Path| {
            known.get(p).map_or(crate::cache::BLOCK_SIZE, |id| {
                id.size.clamp(1, crate::cache::BLOCK_SIZE)
            })
        };
        let looked = std::cell::Cell::new(0u64);
        let judge = |p: &Path| {
            looked.set(looked.get() + 1);
            // Outcomes first: ahead of the readers most candidates are fetched already.
            let outcome = outcomes.lock().get(p).copied();
            match outcome {
                Some(Outcome::InFlight) => return Verdict::Later,
                Some(Outcome::Done | Outcome::Settled) => return Verdict::Settled,
                Some(Outcome::Parked) | None => {}
            }
            if current.contains(p) {
                return Verdict::Settled;
            }
            let identity = known.get(p);
            if identity
                .and_then(|id| fetcher.ram().get(id))
                .is_some_and(|e| e.is_complete())
            {
                return Verdict::Settled;
            }
            // Without room for its bytes a file is worth an open ahead, once, while there are
            // descriptors to hold it.
            if !fetcher.has_prefetch_room(first_block(p))
                && (outcome == Some(Outcome::Parked) || parked_full)
            {
                return Verdict::Later;
            }
            Verdict::Take
        };
        let skip = |p: &Path| judge(p) != Verdict::Take;
        let best = self
            .predictors
            .iter_mut()
            .filter(|(_, s)| s.trusted())
            .max_by(|a, b| a.1.recent.total_cmp(&b.1.recent));
        let mut next = Vec::new();
        match best {
            Some((predictor, _)) => {
                self.in_use = predictor.name();
                predictor.predict(&self.tracker, last, depth, &skip, &mut next);
            }
            // The remaining set: fetch its smallest files while their bytes have room (the most
            // misses hidden per byte held), then open the next ones ahead, in any order.
            None if self.tracker.previous().is_some() => {
                self.in_use = "remaining";
                let fits = |p: &Path| fetcher.has_prefetch_room(first_block(p));
                // Stragglers joined the last pass since it closed: their positions too.
                let files = self.tracker.previous().map_or(0, |p| p.len());
                while self.unplanned.len() < files {
                    self.unplanned.push();
                }
                self.fetch_cursor = predict::smallest_remaining(
                    &self.tracker,
                    &self.by_size,
                    &mut self.unfetched,
                    self.fetch_cursor,
                    depth,
                    &judge,
                    &fits,
                    &mut next,
                );
                let mut opens = Vec::new();
                let taken: std::collections::HashSet<&Path> = next.iter().map(|f| &**f).collect();
                self.cursor = predict::remaining(
                    &self.tracker,
                    &mut self.unplanned,
                    self.cursor,
                    depth.saturating_sub(next.len()),
                    &|p: &Path| {
                        if taken.contains(p) {
                            Verdict::Later
                        } else {
                            judge(p)
                        }
                    },
                    &mut opens,
                );
                drop(taken);
                next.append(&mut opens);
            }
            // Epoch 1 in an order nobody predicts: nothing worth the source's time. A
            // speculative fill of the cache in walk order was measured to starve the page
            // cache under a tight memory limit (cold shards 1.1-2.0x the page cache) for at
            // most 0.88x on a shuffled cold epoch.
            None => {
                self.in_use = "none";
                return looked.get();
            }
        }
        let mut jobs = shared.jobs.lock();
        jobs.queue
            .retain(|j| !matches!(j, Job::File { set: s, .. } if *s == set));
        // One worker woken per job, at most all of them: waking every worker at every open
        // cost the planner more CPU than planning (each wake is a system call).
        let wake = next.len().min(threads);
        for file in next {
            let identity = self.known.get(&file).copied();
            jobs.queue.push_back(Job::File {
                set,
                file,
                identity,
            });
        }
        drop(jobs);
        for _ in 0..wake {
            shared.work.notify_one();
        }
        looked.get()
    }

    fn status(&self) -> Value {
        let predictors: serde_json::Map<String, Value> = self
            .predictors
            .iter()
            .map(|(p, s)| {
                (
                    p.name().to_owned(),
                    json!({
                        "precision": s.precision(),
                        "recall": s.recall(),
                        "recent_recall": s.recent,
                        "recent_precision": s.recent_precision,
                        "hits": s.hits,
                        "expired": s.expired,
                    }),
                )
            })
            .collect();
        json!({
            "epoch": self.tracker.epoch(),
            "progress": self.tracker.progress(),
            "files_this_epoch": self.tracker.current().len(),
            "files_last_epoch": self.tracker.previous().map(|p| p.len()),
            "predictor": self.in_use,
            "opens_per_second": self.rate,
            "predictors": predictors,
            "history": self.history.iter().cloned().collect::<Vec<_>>(),
            "diagnosis": self.diagnosis,
        })
    }
}

fn plan(
    shared: &Shared,
    mut sets: Vec<SetState>,
    events: &Receiver<Event>,
    mut order_file: Option<OrderFile>,
) {
    let mut published = Instant::now();
    let mut dirty = true;
    loop {
        if let Some(file) = &mut order_file {
            dirty |= file.poll() == Polled::Published;
        }
        match events.recv_timeout(STATUS_EVERY) {
            Ok(event) => {
                let set = event.set;
                if let Some(state) = sets.get_mut(set) {
                    let cpu = crate::cache::thread_cpu();
                    state.opened(shared, set, event);
                    shared.metrics.planned.inc();
                    let spent = crate::cache::thread_cpu().saturating_sub(cpu);
                    shared.metrics.planner_ns.add(spent);
                    dirty = true;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if dirty && published.elapsed() >= STATUS_EVERY {
            let status: serde_json::Map<String, Value> =
                sets.iter().map(|s| (s.name.clone(), s.status())).collect();
            *shared.status.lock() = Value::Object(status);
            published = Instant::now();
            dirty = false;
        }
    }
}

fn work(shared: &Shared) {
    loop {
        let job = {
            let mut jobs = shared.jobs.lock();
            loop {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                let threads = shared.threads.max(1);
                let allowed = if shared.demand.load(Ordering::Acquire) > 0 {
                    (threads / 2).max(1)
                } else {
                    threads
                };
                if jobs.running < allowed
                    && let Some(job) = jobs.queue.pop_front()
                {
                    jobs.running += 1;
                    break job;
                }
                shared.work.wait_for(&mut jobs, Duration::from_millis(20));
            }
        };
        match job {
            Job::File {
                set,
                file,
                identity,
            } => fetch_file(shared, set, &file, identity),
            Job::Blocks {
                entry,
                source,
                blocks,
            } => {
                for index in blocks {
                    if shared.stop.load(Ordering::Acquire) {
                        break;
                    }
                    match shared.fetcher.prefetch(&entry, index, source.as_ref()) {
                        Ok(Prefetched::Fetched | Prefetched::Staged) => {
                            shared.metrics.blocks.inc();
                        }
                        Ok(Prefetched::Present) => {}
                        Ok(Prefetched::NoRoom) | Err(_) => break,
                    }
                }
            }
        }
        shared.jobs.lock().running -= 1;
        shared.work.notify_one();
    }
}

/// Fetches the first blocks of `file` ahead of its open, and for a view set decodes the image
/// ahead when the CPU is idle. When there is no room for the bytes, the opened file is parked
/// instead, so that the reader's open at least makes no round trip (and a later try, once room
/// frees, makes none either).
fn fetch_file(shared: &Shared, set: SetId, file: &FileKey, known: Option<Identity>) {
    if let Some(entry) = known.and_then(|id| shared.fetcher.ram().get(&id))
        && entry.is_complete()
    {
        return;
    }
    {
        let mut outcomes = shared.outcomes[set].lock();
        if matches!(
            outcomes.get(file),
            Some(Outcome::InFlight | Outcome::Done | Outcome::Settled)
        ) {
            return;
        }
        outcomes.insert(file.clone(), Outcome::InFlight);
    }
    let started = Instant::now();
    let mut fetched = false;
    let mut took = 0.0;
    let mut decoded = false;
    let mut parked_now = false;
    let parked = shared.parked.take(file, None);
    let opened_now = parked.is_none();
    match parked.map_or_else(|| shared.source.open(file), Ok) {
        Ok(source) => {
            let entry = shared.fetcher.ram().file(source.identity(), file);
            let mut no_room = false;
            for index in 0..entry.blocks().min(FILE_BLOCKS) {
                if shared.stop.load(Ordering::Acquire) {
                    break;
                }
                match shared.fetcher.prefetch(&entry, index, source.as_ref()) {
                    Ok(Prefetched::Fetched | Prefetched::Staged) => {
                        shared.metrics.blocks.inc();
                        fetched = true;
                    }
                    Ok(Prefetched::Present) => {}
                    Ok(Prefetched::NoRoom) => {
                        no_room = index == 0;
                        break;
                    }
                    Err(_) => {
                        shared.metrics.failed.inc();
                        break;
                    }
                }
            }
            took = started.elapsed().as_secs_f64();
            shared.fetcher.ram().settle(&entry);
            if set > 0
                && !no_room
                && let Some(decode) = &shared.decode_ahead
                && decode(set, file, source.as_ref())
            {
                shared.metrics.decoded_ahead.inc();
                decoded = true;
            }
            if no_room {
                if opened_now {
                    shared.metrics.opened_ahead.inc();
                }
                parked_now = true;
                for closed in shared.parked.park(file.clone(), source) {
                    for outcomes in &shared.outcomes {
                        let mut outcomes = outcomes.lock();
                        if outcomes.get(&closed) == Some(&Outcome::Parked) {
                            outcomes.remove(&closed);
                        }
                    }
                }
            }
        }
        Err(e) => {
            tracing::debug!(path = %file.display(), error = %e, "prefetch could not open a file");
            shared.metrics.failed.inc();
        }
    }
    let mut outcomes = shared.outcomes[set].lock();
    // The reader may have opened it meanwhile (counted late, entry gone): leave that be.
    if outcomes.get(file) == Some(&Outcome::InFlight) {
        if fetched || decoded {
            outcomes.insert(file.clone(), Outcome::Done);
        } else if parked_now {
            outcomes.insert(file.clone(), Outcome::Parked);
        } else {
            outcomes.insert(file.clone(), Outcome::Settled);
        }
    }
    drop(outcomes);
    if fetched || decoded {
        shared.metrics.issued.inc();
    }
    if fetched {
        let old = f64::from_bits(shared.file_seconds.load(Ordering::Relaxed));
        let new = if old == 0.0 {
            took
        } else {
            old + EWMA * (took - old)
        };
        shared.file_seconds.store(new.to_bits(), Ordering::Relaxed);
    }
}
