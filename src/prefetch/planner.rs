//! The planner thread: one `SetState` per file set (the source tree, each view), which takes
//! each open from the bounded event channel, feeds the epoch tracker and scores the predictors,
//! and replaces the set's queued files with the best predictor's next ones (or the remaining
//! set's), once per backlog of opens (after its latest; between backlogs it rests a beat, so a
//! stream of opens does not wake it once each), and while readers find a followed order's files
//! fetched, once per quarter of the depth; and the depth controller. Publishes
//! each set's status for stats.json.
//!
//! Owns what the planner knows per set and what it decides. Must never fetch (the workers in
//! `fetch` do), never block an open (events arrive through a channel that drops when full), and
//! never do work per open that grows with the number of files, nor per pass: what a pass's end
//! needs in proportion to the set (the remaining-set walks' order and position sets, listings,
//! freeing the pass that ended) is made or freed by the helper thread (`Chores`), and the
//! remaining-set walks start once it has answered. Left here: the epoch tracker's one position
//! set for the pass that ended, made at memory speed, and the sweep of the prefetch outcomes
//! (one per file prefetch looked at in the pass).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::chores::{Chore, Chores};
use super::diagnosis::{Capacity, diagnose};
use super::epoch::{EpochTracker, Opened, Positions};
use super::files::{FileId, FileKey};
use super::hint::{Hint, OrderFile, OrderSlot, Polled};
use super::predict::{self, Predictor, Replay, SCORED, Score, Tree, Verdict};
use super::{
    DEPTH_MAX, DEPTH_MIN, EVENT_QUEUE, EWMA, Event, HISTORY, Job, Marks, Outcome, STATUS_EVERY,
    SetId, Shared, WorkingSetFigures,
};
use crate::memory::Use;
use crate::source::{Identity, Source};

/// Bytes the planner keeps for each file a set has seen, as charged to the memory budget: its
/// key and identity columns with their vectors' spare room and its index slot (85), its size
/// class in the pass (2: one byte, and the vector's spare room), its place in the epoch
/// tracker's pass sets (23) and the predictors' (4), and its name in the walks' kept listing of
/// its directory (38): heaptrack of a daemon's peak over two passes of 100,000 files in one
/// directory (`benches/memory/heap.sh`). Charged as the inode table charges its nodes, so what
/// the planner keeps comes out of the cache's room instead of on top of the budget (14M files:
/// 2.2 GB).
pub const SEEN_FILE_BYTES: u64 = 154;

/// Plans from the remaining set a pass needs, at the least, before it counts as shuffled
/// (`SetState::shuffled`).
const SHUFFLED_AFTER: u64 = 64;

/// What the planner knows about one file set.
pub(super) struct SetState {
    name: String,
    tracker: EpochTracker,
    /// The budget's charge for the files `tracker` has seen.
    seen: SeenCharge,
    predictors: Vec<(Box<dyn Predictor>, Score)>,
    /// Size classes of the current pass's files, in its order (`predict::size_class`), and their
    /// sizes' sum (`None` when one is not known): the remaining-set order of the next pass, kept
    /// as files come.
    classes: Vec<u8>,
    working_set: Option<u64>,
    /// The last complete pass's files and bytes (what `classes` and `working_set` were then).
    ended: WorkingSetFigures,
    opens: u64,
    /// The remaining-set walks of this pass, once the helper has made them.
    remaining: Option<Remaining>,
    /// The chore making them, when the helper's full queue refused it as the pass began: asked
    /// again at each open until taken (else the pass would have no remaining-set plan).
    unasked: Option<Chore>,
    /// The last first open of a backlog not planned after yet (see `backlog`).
    owed: Option<FileKey>,
    made: Sender<(u64, Remaining)>,
    ready: Receiver<(u64, Remaining)>,
    chores: Chores,
    in_use: &'static str,
    /// This pass's plans (an open planned after, or that let a followed order's queue be), and
    /// how many of them the remaining set made (no predictor trusted).
    plans: u64,
    /// Opens since the last plan.
    since_plan: usize,
    unpredicted: u64,
    /// Whether most plans of the pass that ended last were the remaining set's.
    ended_unpredicted: bool,
    /// Opens per second (moving average) and when the last one came.
    rate: f64,
    last_open: Option<Instant>,
    epoch_started: Instant,
    marks: Marks,
    history: VecDeque<Value>,
    /// What kept readers waiting in the last complete pass (`null` before one).
    diagnosis: Value,
}

/// Where the remaining-set walks of a pass stand: opens ahead in the last pass's order, fetches
/// in `by_size` (the last pass's files, smallest first). The last pass's files (positions) and
/// `by_size` entries not settled in this pass are sets of positions: the walks step over each
/// settled file once, not at every open.
struct Remaining {
    by_size: Vec<u32>,
    unplanned: Positions,
    unfetched: Positions,
    cursor: usize,
    fetch_cursor: usize,
}

impl Remaining {
    /// The walks over a pass of files of size `classes` (on the helper thread: linear in the
    /// files).
    fn of(classes: &[u8]) -> Remaining {
        let by_size = predict::smallest_first(classes);
        Remaining {
            unplanned: Positions::all(classes.len()),
            unfetched: Positions::all(by_size.len()),
            // The walk starts after the cursor: at the smallest file.
            fetch_cursor: by_size.len().saturating_sub(1),
            cursor: 0,
            by_size,
        }
    }
}

/// The depth controller: twice the files consumed while one file is fetched (`rate` opens/s x
/// `file_seconds`), plus one per worker, within `DEPTH_MIN..=DEPTH_MAX`. Also restated as the
/// scheduler's heuristic action.
pub fn controller_depth(rate: f64, file_seconds: f64, threads: usize) -> usize {
    ((rate * file_seconds * 2.0).ceil() as usize + threads).clamp(DEPTH_MIN, DEPTH_MAX)
}

impl SetState {
    pub(super) fn new(
        name: String,
        source: &Arc<dyn Source>,
        shared: &Arc<Shared>,
        hint: Option<&OrderSlot>,
        chores: &Chores,
    ) -> SetState {
        // Both walks read each directory's names from one listing a pass (`listing::Shelf`).
        let shelf = Arc::default();
        let tree = |sorted| {
            Box::new(Tree::new(source.clone(), sorted, chores.clone()).sharing(Arc::clone(&shelf)))
        };
        let mut predictors: Vec<(Box<dyn Predictor>, Score)> = vec![
            (Box::new(Replay), Score::default()),
            (tree(true), Score::default()),
            (tree(false), Score::default()),
        ];
        if let Some(slot) = hint {
            predictors.push((Box::new(Hint::new(slot.clone())), Score::default()));
        }
        let (made, ready) = channel();
        SetState {
            name,
            tracker: EpochTracker::default(),
            seen: SeenCharge::new(shared),
            predictors,
            classes: Vec::new(),
            working_set: Some(0),
            ended: WorkingSetFigures::default(),
            opens: 0,
            remaining: None,
            unasked: None,
            owed: None,
            made,
            ready,
            chores: chores.clone(),
            in_use: "none",
            plans: 0,
            since_plan: 0,
            unpredicted: 0,
            ended_unpredicted: false,
            rate: 0.0,
            last_open: None,
            epoch_started: Instant::now(),
            marks: Marks::now(shared),
            history: VecDeque::new(),
            diagnosis: Value::Null,
        }
    }

    /// Ends the epoch that just ended, of files of size `classes` (`working_set` bytes when all
    /// are known): its record, its wasted prefetches (the staged leftovers go once every set is
    /// asked, `retire_staged`), and the next pass's remaining-set walks, asked of the helper.
    fn close_epoch(
        &mut self,
        shared: &Shared,
        set: SetId,
        classes: Vec<u8>,
        working_set: Option<u64>,
    ) {
        let mut outcomes = shared.outcomes[set].lock();
        let wasted = outcomes.values().filter(|o| **o == Outcome::Done).count();
        outcomes.retain(|_, o| matches!(o, Outcome::InFlight | Outcome::Parked));
        drop(outcomes);
        shared.metrics.wasted.add(wasted as u64);
        for (p, score) in &mut self.predictors {
            p.forget_listings();
            score.new_pass();
        }
        if let Some(pass) = self.tracker.take_retired() {
            self.chores.dispose(pass);
        }
        if let Some(old) = self.remaining.take() {
            self.chores.dispose(old);
        }
        let now = Marks::now(shared);
        let files = classes.len();
        let (made, epoch) = (self.made.clone(), self.tracker.epoch());
        // A chore still unasked from the pass before is of no use now: replaced.
        self.unasked = self
            .chores
            .run(Box::new(move || {
                let _ = made.send((epoch, Remaining::of(&classes)));
            }))
            .err();
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

    /// Takes an open of `set`'s file, and plans after it when `plan` (the latest of a `backlog`);
    /// true when it began a new pass.
    fn opened(&mut self, shared: &Shared, set: SetId, event: Event, plan: bool) -> bool {
        // The set's files hold each file once (its identity, the latest an open saw: a fully
        // cached file is not queued again); passes and maps share that key.
        let Some((id, opened)) = self.tracker.open(event.file, event.identity) else {
            return false;
        };
        self.seen.cover(self.tracker.files().len());
        let file = self.tracker.key(id).clone();
        // Sizes are known for dataset files (their identities), not for view files.
        let size_of =
            |tracker: &EpochTracker, f: FileId| tracker.files().identity(f).map(|i| i.size);
        let new_pass = match opened {
            Opened::Repeat | Opened::Straggler => {
                // A backlog that ends in a repeat still plans, after its last first open.
                if plan
                    && shared.enabled
                    && let Some(last) = self.owed.take()
                {
                    let work = self.plan(shared, set, &last);
                    shared.metrics.planner_work.add(work);
                }
                return false;
            }
            Opened::NewEpoch => {
                // The new pass began with a few files (bounded repeats).
                // With room for as many files as the pass that ended (grown as it goes, a
                // million-entry vector is copied at once on this thread).
                let files = self.tracker.previous().map_or(0, |p| p.len());
                let mut begun = Vec::with_capacity(files);
                let mut working_set = Some(0);
                for &f in self.tracker.current().order() {
                    let size = size_of(&self.tracker, f);
                    working_set = working_set.zip(size).map(|(a, b)| a + b);
                    begun.push(predict::size_class(size));
                }
                self.ended_unpredicted = 2 * self.unpredicted > self.plans;
                (self.plans, self.unpredicted) = (0, 0);
                let ended = std::mem::replace(&mut self.classes, begun);
                let ended_set = std::mem::replace(&mut self.working_set, working_set);
                self.ended = WorkingSetFigures {
                    files: ended.len() as u64,
                    bytes: ended_set,
                    whole: true,
                };
                self.close_epoch(shared, set, ended, ended_set);
                true
            }
            Opened::First => {
                let size = size_of(&self.tracker, id);
                self.classes.push(predict::size_class(size));
                self.working_set = self.working_set.zip(size).map(|(a, b)| a + b);
                false
            }
        };
        let current = WorkingSetFigures {
            files: self.classes.len() as u64,
            bytes: self.working_set,
            whole: self.ended.whole,
        };
        shared.working[set].publish(if current.files >= self.ended.files {
            current
        } else {
            self.ended
        });
        if let Some(chore) = self.unasked.take() {
            self.unasked = self.chores.run(chore).err();
        }
        while let Ok((epoch, remaining)) = self.ready.try_recv() {
            if epoch == self.tracker.epoch() {
                self.remaining = Some(remaining);
            } else {
                self.chores.dispose(remaining);
            }
        }
        let outcome = shared.outcomes[set].lock().remove(&file);
        match outcome {
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
        let tracker = &self.tracker;
        let looked = std::cell::Cell::new(0u64);
        let opened_now = |p: &Path| {
            looked.set(looked.get() + 1);
            tracker.opened(p)
        };
        let predicts = Score::predicts_after(self.opens);
        for (predictor, score) in &mut self.predictors {
            score.opened(&file, self.opens);
            if predicts {
                let mut out = Vec::new();
                predictor.predict(&self.tracker, &file, SCORED as usize, &opened_now, &mut out);
                score.predicted(&out, self.opens);
            }
        }
        let mut work = looked.get();
        self.since_plan += 1;
        if !plan {
            self.owed = Some(file);
        } else if shared.enabled {
            self.owed = None;
            // While a followed order's readers find their files fetched, a plan every quarter
            // of the depth keeps three quarters of it queued ahead of them, for a quarter of the
            // work: each plan judges the depth's queued files again (one plan per open was ~30
            // files judged per open, ~45 µs, when opens came one at a time at 10M files). An
            // open the plan did not fetch in time plans at once.
            let followed = !matches!(self.in_use, "remaining" | "none");
            let every = (shared.depth.load(Ordering::Relaxed) / 4).max(1);
            if !(followed && outcome == Some(Outcome::Done) && self.since_plan < every) {
                work += self.plan(shared, set, &file);
                self.since_plan = 0;
            }
            self.plans += 1;
            self.unpredicted += u64::from(self.in_use == "remaining");
        }
        for (predictor, _) in &mut self.predictors {
            work += predictor.take_work();
        }
        shared.metrics.planner_work.add(work);
        new_pass
    }

    /// Whether this set's passes follow no predictor: most plans of the pass that ended last
    /// came from the remaining set, or three in four of this pass's have, over at least
    /// `SHUFFLED_AFTER` plans and an eighth of the last pass's files (by then an order that is
    /// followed, such as a replay of the last pass, has earned a predictor's trust).
    fn shuffled(&self) -> bool {
        let evidence =
            SHUFFLED_AFTER.max(self.tracker.previous().map_or(0, |p| p.len()) as u64 / 8);
        self.ended_unpredicted
            || (self.unpredicted >= evidence && 4 * self.unpredicted > 3 * self.plans)
    }

    /// Whether a pass of this set reads `file`: the one that ended last or the current one.
    fn reads(&self, file: &Path) -> bool {
        let Some(f) = self.tracker.files().id(file) else {
            return false;
        };
        self.tracker.current().contains(f) || self.tracker.previous().is_some_and(|p| p.contains(f))
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
        let view_work = shared.work_ahead.as_ref().filter(|_| set > 0);
        if view_work.is_some_and(|w| !w.worth_planning(set)) {
            let mut jobs = shared.jobs.lock();
            jobs.queue
                .retain(|j| !matches!(j, Job::File { set: s, .. } if *s == set));
            return 0;
        }
        let outcomes = &shared.outcomes[set];
        let current = self.tracker.current();
        let previous = self.tracker.previous();
        let fetcher = &shared.fetcher;
        let files = self.tracker.files();
        let parked_full = shared.parked.is_full();
        // A file's first block, as much as a prefetch of it needs room for at first.
        let first_block = |identity: Option<Identity>| {
            identity.map_or(crate::cache::BLOCK_SIZE, |id| {
                id.size.clamp(1, crate::cache::BLOCK_SIZE)
            })
        };
        let looked = std::cell::Cell::new(0u64);
        let judge = |p: &Path| {
            looked.set(looked.get() + 1);
            if view_work.is_some_and(|w| !w.shows(set, p)) {
                return Verdict::Settled;
            }
            // Outcomes first: ahead of the readers most candidates are fetched already.
            let outcome = outcomes.lock().get(p.as_os_str()).copied();
            match outcome {
                Some(Outcome::InFlight) => return Verdict::Later,
                Some(Outcome::Done | Outcome::Settled) => return Verdict::Settled,
                Some(Outcome::Parked) | None => {}
            }
            let id = files.id(p);
            if id.is_some_and(|f| current.contains(f)) {
                return Verdict::Settled;
            }
            // Once a pass has ended, the files the readers read are known: a walk that runs past
            // them (into a directory of shards nobody opens) stages nothing there.
            if previous.is_some_and(|pass| !id.is_some_and(|f| pass.contains(f))) {
                return Verdict::Settled;
            }
            let identity = id.and_then(|f| files.identity(f));
            if identity
                .and_then(|id| fetcher.ram().get(&id))
                .is_some_and(|e| e.is_complete())
            {
                return Verdict::Settled;
            }
            // Without room for its bytes a file is worth an open ahead, once, while there are
            // descriptors to hold it.
            if !fetcher.has_prefetch_room(first_block(identity))
                && (outcome == Some(Outcome::Parked) || parked_full)
            {
                return Verdict::Later;
            }
            Verdict::Take
        };
        let best = self
            .predictors
            .iter_mut()
            .filter(|(_, s)| s.trusted())
            .max_by(|a, b| a.1.recent.total_cmp(&b.1.recent));
        let mut next = Vec::new();
        match best {
            Some((predictor, _)) => {
                self.in_use = predictor.name();
                predictor.plan(&self.tracker, last, depth, &judge, &mut next);
            }
            // The remaining set: fetch its smallest files while their bytes have room (the most
            // misses hidden per byte held), then open the next ones ahead, in any order.
            None if self.tracker.previous().is_some() => {
                self.in_use = "remaining";
                // Until the helper has made this pass's walks: nothing yet.
                let Some(walks) = self.remaining.as_mut() else {
                    return looked.get();
                };
                let fits = |p: &Path| fetcher.has_prefetch_room(first_block(files.identity_of(p)));
                // Stragglers joined the last pass since it closed: their positions too.
                let files = self.tracker.previous().map_or(0, |p| p.len());
                while walks.unplanned.len() < files {
                    walks.unplanned.push();
                }
                walks.fetch_cursor = predict::smallest_remaining(
                    &self.tracker,
                    &walks.by_size,
                    &mut walks.unfetched,
                    walks.fetch_cursor,
                    depth,
                    &judge,
                    &fits,
                    &mut next,
                );
                let mut opens = Vec::new();
                let taken: foldhash::HashSet<&std::ffi::OsStr> =
                    next.iter().map(|f| f.as_os_str()).collect();
                walks.cursor = predict::remaining(
                    &self.tracker,
                    &mut walks.unplanned,
                    walks.cursor,
                    depth.saturating_sub(next.len()),
                    &|p: &Path| {
                        if taken.contains(p.as_os_str()) {
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
        let due = !next.is_empty();
        for file in next {
            let identity = self.tracker.files().identity_of(&file);
            jobs.queue.push_back(Job::File {
                set,
                file,
                identity,
            });
        }
        drop(jobs);
        // One thread woken; each that takes a job wakes the next while the lane has room, so an
        // open costs one wake per job, never one per thread.
        if due {
            shared.bell.ring();
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

/// A new pass began in a set: the staging buffer keeps what the ending pass staged of files a
/// pass of some set reads, and drops the rest (`Staging::retire`).
fn retire_staged(shared: &Shared, sets: &[SetState]) {
    shared
        .fetcher
        .staging()
        .retire(|file| sets.iter().any(|s| s.reads(file)));
}

/// How long the planner rests after a backlog before it takes the next. A reader's open wakes a
/// planner waiting on the channel (a futex wake on the FUSE thread, a context switch): under a
/// stream of cached opens (B2) that was once per open, and the daemon's CPU per file fell from
/// 34-42 to 33 µs without it. Resting, the planner is not waiting: opens queue, and a stream of
/// them is taken once per beat. A plan comes at most a beat later, against files that take far
/// longer than that to fetch.
const PLAN_BEAT: Duration = Duration::from_millis(1);

/// `first` and the opens queued behind it (at most a full queue's), each with whether it is its
/// set's latest in them: the one to plan after.
fn backlog(first: Event, events: &Receiver<Event>) -> Vec<(Event, bool)> {
    let mut batch = vec![first];
    while batch.len() < EVENT_QUEUE
        && let Ok(event) = events.try_recv()
    {
        batch.push(event);
    }
    let of_set: Vec<SetId> = batch.iter().map(|e| e.set).collect();
    (batch.into_iter().enumerate())
        .map(|(i, event)| {
            let latest = !of_set[i + 1..].contains(&event.set);
            (event, latest)
        })
        .collect()
}

/// Passes come in an order no predictor follows: the default staging slice's free room goes to
/// the cache. In such an order a staged block only moves a source read earlier (once), while a
/// cached one saves a read every epoch (measured over a shuffled dataset twice the budget: device
/// bytes per epoch 395 -> 368 MB once the cache held the lent room).
fn lend_staging(shared: &Shared) {
    let budget = shared.fetcher.ram().budget();
    let first = budget.slice(Use::Staging) == budget.plan().staging;
    let moved = budget.lend_staging();
    if first && moved > 0 {
        tracing::info!(
            bytes = moved,
            "passes repeat in an order no predictor follows: the prefetch staging buffer's room goes to the cache (give --prefetch-buffer to keep it)"
        );
    }
}

pub(super) fn plan(
    shared: &Shared,
    mut sets: Vec<SetState>,
    events: &Receiver<Event>,
    mut order_file: Option<OrderFile>,
) {
    // Published at once, so stats.json names every set from the mount's first moment.
    publish(shared, &sets);
    let mut published = Instant::now();
    let mut dirty = false;
    loop {
        if let Some(file) = &mut order_file {
            dirty |= file.poll() == Polled::Published;
        }
        match events.recv_timeout(STATUS_EVERY) {
            Ok(event) => {
                let cpu = crate::cache::thread_cpu();
                // A backlog (opens that came while the last one was planned) is taken in whole:
                // every open is recorded (its pass, the predictors' scores) and a set plans once,
                // after its latest open, since a plan replaces the one before. A pass's first
                // opens can cost far more than most (the remaining-set walks settle up to their
                // scan cap per plan), and opens must not be dropped meanwhile.
                let backlog = backlog(event, events);
                shared.metrics.planned.add(backlog.len() as u64);
                for (event, latest) in backlog {
                    let set = event.set;
                    let Some(state) = sets.get_mut(set) else {
                        continue;
                    };
                    if state.opened(shared, set, event, latest) {
                        retire_staged(shared, &sets);
                    }
                    if shared.lends_staging && sets[set].shuffled() {
                        lend_staging(shared);
                    }
                }
                let spent = crate::cache::thread_cpu().saturating_sub(cpu);
                shared.metrics.planner_ns.add(spent);
                dirty = true;
                // Opens that come during the beat queue without waking the planner.
                std::thread::sleep(PLAN_BEAT);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if dirty && published.elapsed() >= STATUS_EVERY {
            publish(shared, &sets);
            published = Instant::now();
            dirty = false;
        }
    }
}

/// The memory budget's charge for what the planner keeps per file a set has seen
/// (`SEEN_FILE_BYTES` each, shown as `prefetch.planner.bytes`), grown as the set meets new files
/// (it never forgets one) and given back when the set goes.
struct SeenCharge {
    /// Where the budget and the stats are.
    shared: Arc<Shared>,
    files: u64,
}

impl SeenCharge {
    /// No files yet, charged to `shared`'s budget.
    fn new(shared: &Arc<Shared>) -> SeenCharge {
        SeenCharge {
            shared: shared.clone(),
            files: 0,
        }
    }

    /// Charges the files of `seen` not charged yet.
    fn cover(&mut self, seen: usize) {
        let more = (seen as u64).saturating_sub(self.files);
        if more > 0 {
            self.files += more;
            let bytes = more * SEEN_FILE_BYTES;
            self.shared.fetcher.ram().budget().charge(Use::Cache, bytes);
            let shown = &self.shared.metrics.planner_bytes;
            shown.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

impl Drop for SeenCharge {
    fn drop(&mut self) {
        let bytes = self.files * SEEN_FILE_BYTES;
        self.shared
            .fetcher
            .ram()
            .budget()
            .release(Use::Cache, bytes);
        let shown = &self.shared.metrics.planner_bytes;
        shown.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Puts every set's status where `Prefetcher::status` reads it.
fn publish(shared: &Shared, sets: &[SetState]) {
    let status: serde_json::Map<String, Value> =
        sets.iter().map(|s| (s.name.clone(), s.status())).collect();
    *shared.status.lock() = Value::Object(status);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    fn open(set: SetId, name: &str) -> Event {
        Event {
            set,
            file: FileKey::from(Path::new(name)),
            identity: None,
        }
    }

    #[test]
    fn a_backlog_is_taken_whole_and_each_set_plans_after_its_latest_open() {
        let (tx, rx) = sync_channel(EVENT_QUEUE);
        for (set, name) in [(0, "b"), (1, "x"), (0, "c"), (1, "y"), (1, "z")] {
            tx.send(open(set, name)).expect("queued");
        }
        let got: Vec<(SetId, String, bool)> = backlog(open(0, "a"), &rx)
            .into_iter()
            .map(|(e, latest)| (e.set, e.file.to_string_lossy().into_owned(), latest))
            .collect();
        let want = [
            (0, "a", false),
            (0, "b", false),
            (1, "x", false),
            (0, "c", true),
            (1, "y", false),
            (1, "z", true),
        ]
        .map(|(s, n, l)| (s, n.to_owned(), l));
        assert_eq!(got, want);
        // Nothing queued: the one open plans.
        assert!(backlog(open(0, "d"), &rx).iter().all(|(_, latest)| *latest));
    }
}
