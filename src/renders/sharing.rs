//! Coordinated prep: the training jobs reading one view at once share its renders.
//!
//! Owns each job's open counts of view files, which fix every open's seed (the `k`th open of a file
//! by a job is rendered with the seed of (view, path, k), so jobs in the same epoch ask for the
//! same tensor, and each job still gets a fresh one every epoch), and the renders held for other
//! jobs: when more than one job reads a view, an open's render is published under (file, k) until
//! the other jobs reading the view have taken it, `HOLD_PATIENCE` passes, newer ones push it out
//! (at most `MAX_HELD`, and only while the budget keeps a work slice's worth free for renders in
//! flight), or the memory budget sheds it (each held render stays charged to the budget, so
//! holding never takes the daemon past it: a render that needs the room sheds them before
//! anything cached). A job whose process ended stops counting as a reader within
//! `SWEEP_EVERY`. Must
//! never make a job wait for another (an open that finds no render held makes its own; one that
//! finds a render still running waits for it, which is the work it would do anyway), never hold a
//! render the budget needs, never count a job's opens by another's, and never count them by inode
//! number: the kernel may forget a view file's node between epochs, and the next lookup makes a
//! new number for it, whose count would start at 0 again and repeat the first epoch's
//! augmentations. Counts follow the view and the image's path; renders are held and made ahead
//! under the node's number (exact for the node's life, never reused).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::jobs::{Job, JobId, Jobs};
use crate::memory::{MemoryBudget, Shed, Use, Work};
use crate::view::metrics::JobFigures;

/// A job that opened no file of a view for this long no longer counts as reading it: renders are
/// no longer held for it (one whose process ended stops counting at the next sweep).
const JOB_ACTIVE: Duration = Duration::from_secs(30);
/// Renders held for other jobs at most (each a whole .npy file, charged to the budget, which
/// binds first for large tensors).
const MAX_HELD: usize = 4096;
/// How long a render waits for the other jobs to take it: jobs that shuffle on their own reach a
/// file up to an epoch apart. Jobs further apart lose the sharing, never correctness (a render is
/// a pure function of its seed, so a job that comes later renders the same bytes again).
const HOLD_PATIENCE: Duration = Duration::from_secs(60);
/// How often jobs whose processes ended are forgotten with their counts: a few /proc reads per
/// job, under the lock, once a second.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// A job named by `PREPFS_JOB` (whose end prepfs cannot see) is forgotten after this long idle.
const NAMED_JOB_IDLE: Duration = Duration::from_secs(3600);
/// What one open count costs in memory, charged to the budget: key (the view and the path's
/// shared pointer) and value (32 B) and the hash table's control byte at its 7/8 load; the path's
/// own bytes are shared with its inode node and prefetch's keys.
const COUNT_BYTES: u64 = 40;

/// A place a render lands in for the opens that share it: `None` when it failed (each open then
/// renders for itself).
pub type Slot<T> = Arc<std::sync::OnceLock<Option<T>>>;

/// What an open of a view file does about sharing.
pub enum Share<T> {
    /// One job reads the view: render as always.
    Alone,
    /// Another job's render of this (file, k) is held (finished or running): take it.
    Take(Slot<T>),
    /// Other jobs read the view: render, and fill this slot for them.
    Publish(Slot<T>),
}

/// An open of view `view`'s file `ino`: its `k` and what to do about sharing.
pub struct Opened<T> {
    /// Opens of this file by this job before this one.
    pub count: u64,
    /// Whether and how its render is shared.
    pub share: Share<T>,
    /// Whether this job had not opened a file of this view before.
    pub new_job: bool,
}

/// The jobs reading the mount's views, their open counts and the renders held between them.
pub struct Sharing<T> {
    jobs: Jobs,
    /// Whether renders are held for other jobs (`--share-renders`); counts are kept per job
    /// either way, so turning it off changes no tensor, only how often it is rendered.
    enabled: AtomicBool,
    state: Mutex<State<T>>,
    budget: Arc<MemoryBudget>,
}

/// A held render's key: view, file (inode) and the `k` of the opens it is for.
type Key = (u16, u64, u64);

struct State<T> {
    per_job: HashMap<JobId, JobState>,
    held: HashMap<Key, Waiting<T>>,
    /// Held renders' keys, oldest first (a key taken meanwhile may linger here; `started` tells).
    order: VecDeque<(Key, Instant)>,
    /// Held renders dropped before every job took them, by view.
    evicted: HashMap<u16, u64>,
    swept: Instant,
}

struct JobState {
    job: Job,
    /// Opens so far of each view file (by view and image path) by this job.
    counts: HashMap<(u16, Arc<Path>), u32>,
    /// When it last opened a file of each view it reads.
    views: HashMap<u16, Instant>,
    last_open: Instant,
    /// The budget's charge for `counts`.
    charge: Work,
}

struct Waiting<T> {
    slot: Slot<T>,
    started: Instant,
    /// Jobs that may still take it.
    takers: usize,
}

impl<T> Sharing<T> {
    /// No jobs yet; counts are charged to `budget`.
    pub fn new(budget: Arc<MemoryBudget>) -> Sharing<T> {
        Sharing {
            jobs: Jobs::default(),
            enabled: AtomicBool::new(true),
            state: Mutex::new(State {
                per_job: HashMap::new(),
                held: HashMap::new(),
                order: VecDeque::new(),
                evicted: HashMap::new(),
                swept: Instant::now(),
            }),
            budget,
        }
    }

    /// Holds renders for other jobs (`true`, the default) or never does.
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Whether the job of `pid` is known without reading its memory through /proc
    /// (`Jobs::knows`): else its first open should not run on a FUSE thread.
    pub fn knows_job(&self, pid: u32) -> bool {
        self.jobs.knows(pid)
    }

    /// An open of view `view`'s file `ino`, the render of image `path`, by the process (or
    /// thread) `pid`.
    pub fn open(&self, view: u16, ino: u64, path: &Arc<Path>, pid: u32) -> Opened<T> {
        let job = self.jobs.of(pid);
        let now = Instant::now();
        let mut state = self.state.lock();
        state.sweep(now);
        // Jobs reading this view besides this one.
        let others = state.jobs_reading(view, now, Some(job.id));
        let entry = state.per_job.entry(job.id).or_insert_with(|| JobState {
            job,
            counts: HashMap::new(),
            views: HashMap::new(),
            last_open: now,
            charge: self.budget.in_flight(0),
        });
        entry.last_open = now;
        let new_job = entry.views.insert(view, now).is_none();
        let count = match entry.counts.entry((view, path.clone())) {
            Entry::Occupied(mut c) => {
                let k = *c.get();
                *c.get_mut() = k.saturating_add(1);
                k
            }
            Entry::Vacant(c) => {
                c.insert(1);
                entry.charge.absorb(self.budget.in_flight(COUNT_BYTES));
                0
            }
        };
        let count = u64::from(count);
        if others == 0 || !self.enabled.load(Ordering::Relaxed) {
            return Opened {
                count,
                share: Share::Alone,
                new_job,
            };
        }
        let key = (view, ino, count);
        let share = match state.held.get_mut(&key) {
            Some(held) => {
                held.takers = held.takers.saturating_sub(1);
                let slot = held.slot.clone();
                if held.takers == 0 {
                    state.held.remove(&key);
                }
                Share::Take(slot)
            }
            None => {
                // Held renders live in free room only: a work slice's worth stays free for the
                // renders in flight, which would otherwise have to shed the caches.
                let keep_free = self.budget.slice(Use::Work);
                while (state.held.len() >= MAX_HELD || self.budget.free() < keep_free)
                    && !state.order.is_empty()
                {
                    state.drop_oldest();
                }
                if self.budget.free() < keep_free {
                    return Opened {
                        count,
                        share: Share::Alone,
                        new_job,
                    };
                }
                if state.order.len() >= 4 * MAX_HELD {
                    // Keys of renders taken since: only those still held stay in line.
                    let State { held, order, .. } = &mut *state;
                    order.retain(|(key, started)| {
                        held.get(key).is_some_and(|h| h.started == *started)
                    });
                }
                let slot = Slot::default();
                state.held.insert(
                    key,
                    Waiting {
                        slot: slot.clone(),
                        started: now,
                        takers: others,
                    },
                );
                state.order.push_back((key, now));
                Share::Publish(slot)
            }
        };
        Opened {
            count,
            share,
            new_job,
        }
    }

    /// The opens so far of view `view`'s file of image `path` by the job that opened a file of
    /// that view last:
    /// the `k` a render made ahead of that job's next open of it uses.
    pub fn next_count(&self, view: u16, path: &Arc<Path>) -> u64 {
        let state = self.state.lock();
        state
            .per_job
            .values()
            .filter_map(|j| j.views.get(&view).map(|at| (at, j)))
            .max_by_key(|(at, _)| **at)
            .and_then(|(_, j)| j.counts.get(&(view, path.clone())))
            .map_or(0, |&c| u64::from(c))
    }

    /// Holds `slot` for the other jobs in place of the one published for view `view`'s file
    /// `ino` at open count `count` (a render made ahead of the publishing open, which fills it
    /// whatever that open does: a job must never wait on whether another reads its open).
    pub fn hold_instead(&self, view: u16, ino: u64, count: u64, slot: Slot<T>) {
        if let Some(held) = self.state.lock().held.get_mut(&(view, ino, count)) {
            held.slot = slot;
        }
    }

    /// What view `view`'s jobs hold now, finished renders sized by `bytes` (at most `MAX_HELD`
    /// looked at, under the lock: for the stats, a few times a second at most).
    pub fn figures(&self, view: u16, bytes: impl Fn(&T) -> u64) -> JobFigures {
        let state = self.state.lock();
        let mut figures = JobFigures {
            jobs: state.jobs_reading(view, Instant::now(), None),
            evicted: state.evicted.get(&view).copied().unwrap_or(0),
            ..JobFigures::default()
        };
        for waiting in state
            .held
            .iter()
            .filter(|(k, _)| k.0 == view)
            .map(|(_, w)| w)
        {
            figures.held_renders += 1;
            if let Some(Some(render)) = waiting.slot.get() {
                figures.held_bytes += bytes(render);
            }
        }
        figures
    }
}

impl<T> State<T> {
    /// Jobs other than `except` that opened a file of `view` within `JOB_ACTIVE` of `now`.
    fn jobs_reading(&self, view: u16, now: Instant, except: Option<JobId>) -> usize {
        self.per_job
            .iter()
            .filter(|(id, j)| {
                Some(**id) != except
                    && j.views
                        .get(&view)
                        .is_some_and(|at| now.duration_since(*at) < JOB_ACTIVE)
            })
            .count()
    }

    /// Drops held renders past their patience and, every `SWEEP_EVERY`, the jobs that ended
    /// (their counts and their charge with them).
    fn sweep(&mut self, now: Instant) {
        while self
            .order
            .front()
            .is_some_and(|(_, started)| now.duration_since(*started) >= HOLD_PATIENCE)
        {
            self.drop_oldest();
        }
        if now.duration_since(self.swept) < SWEEP_EVERY {
            return;
        }
        self.swept = now;
        self.per_job
            .retain(|_, j| now.duration_since(j.last_open) < NAMED_JOB_IDLE && j.job.alive());
    }
}

impl<T> State<T> {
    /// Drops the oldest held render (or a key of one already taken).
    fn drop_oldest(&mut self) {
        if let Some((key, started)) = self.order.pop_front()
            && self.held.get(&key).is_some_and(|h| h.started == started)
        {
            self.held.remove(&key);
            *self.evicted.entry(key.0).or_default() += 1;
        }
    }
}

impl<T: Send + Sync> Shed for Sharing<T> {
    /// Lets go of every held render: each is computed again, identically, by a job that comes
    /// for it later.
    fn shed(&self) -> u64 {
        let held = {
            let mut state = self.state.lock();
            state.order.clear();
            let held = std::mem::take(&mut state.held);
            for (view, _, _) in held.keys() {
                *state.evicted.entry(*view).or_default() += 1;
            }
            held
        };
        drop(held);
        // The memory comes back as the renders' last holders (open files) let go of them.
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryPlan;
    use std::process::{Child, Command, Stdio};

    /// The image path of the test's view file `ino`.
    fn path(ino: u64) -> Arc<Path> {
        Path::new(&format!("class/img{ino}.jpg")).into()
    }

    /// An open of view `view`'s file `ino` (image `path(ino)`) by `pid`.
    fn open<T>(sharing: &Sharing<T>, view: u16, ino: u64, pid: u32) -> Opened<T> {
        sharing.open(view, ino, &path(ino), pid)
    }

    /// Another job: a process of its own (a `sleep`), ended when dropped.
    struct OtherJob(Child);

    impl OtherJob {
        fn start() -> OtherJob {
            let child = Command::new("sleep")
                .arg("30")
                .stdout(Stdio::null())
                .spawn()
                .expect("sleep");
            OtherJob(child)
        }

        fn pid(&self) -> u32 {
            self.0.id()
        }
    }

    impl Drop for OtherJob {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn sharing() -> (Sharing<u32>, Arc<MemoryBudget>) {
        let budget = MemoryBudget::new(MemoryPlan {
            cache: 1 << 30,
            staging: 0,
            work: 1 << 27,
        });
        (Sharing::new(budget.clone()), budget)
    }

    #[test]
    fn counts_follow_the_image_path_not_the_inode_number() {
        let (sharing, _budget) = sharing();
        let me = std::process::id();
        let image = path(7);
        assert_eq!(sharing.open(0, 100, &image, me).count, 0);
        // The kernel forgot the node and a lookup made a new one: the count goes on.
        assert_eq!(sharing.open(0, 200, &image, me).count, 1);
        assert_eq!(sharing.next_count(0, &image), 2);
        // The same image in another view counts on its own.
        assert_eq!(sharing.open(1, 300, &image, me).count, 0);
        assert_eq!(sharing.open(0, 200, &image, me).count, 2);
    }

    #[test]
    fn one_job_counts_its_opens_of_each_file_and_shares_nothing() {
        let (sharing, budget) = sharing();
        let me = std::process::id();
        let counts: Vec<u64> = (0..3).map(|_| open(&sharing, 0, 7, me).count).collect();
        assert_eq!(counts, [0, 1, 2]);
        assert_eq!(open(&sharing, 0, 8, me).count, 0);
        assert!(matches!(open(&sharing, 0, 9, me).share, Share::Alone));
        assert_eq!(sharing.figures(0, |_| 0).jobs, 1);
        assert_eq!(sharing.figures(1, |_| 0).jobs, 0);
        assert_eq!(budget.used(crate::memory::Use::Work), 3 * COUNT_BYTES);
        // The ahead render for this job's next open of file 7 is its fourth.
        assert_eq!(sharing.next_count(0, &path(7)), 3);
    }

    #[test]
    fn a_render_held_instead_of_the_published_slot_is_what_the_other_job_takes() {
        let (sharing, _budget) = sharing();
        let other = OtherJob::start();
        let (a, b) = (std::process::id(), other.pid());
        assert!(matches!(open(&sharing, 0, 9, b).share, Share::Alone));
        let Share::Publish(published) = open(&sharing, 0, 5, a).share else {
            panic!("a render for the other job to take");
        };
        // a's open found a render made ahead: that is held instead.
        let ahead: Slot<u32> = Slot::default();
        sharing.hold_instead(0, 5, 0, ahead.clone());
        let Share::Take(taken) = open(&sharing, 0, 5, b).share else {
            panic!("b takes a's render");
        };
        assert!(Arc::ptr_eq(&taken, &ahead) && !Arc::ptr_eq(&taken, &published));
        // Nothing is held under another key.
        sharing.hold_instead(0, 6, 0, Slot::default());
        assert_eq!(sharing.figures(0, |_| 0).held_renders, 0);
    }

    #[test]
    fn a_second_job_takes_the_render_the_first_published_for_the_same_file_and_epoch() {
        let (sharing, _budget) = sharing();
        let other = OtherJob::start();
        let (a, b) = (std::process::id(), other.pid());
        // Job b reads the view; then a opens file 5 first and publishes its render...
        assert!(matches!(open(&sharing, 0, 9, b).share, Share::Alone));
        let Share::Publish(published) = open(&sharing, 0, 5, a).share else {
            panic!("a render for the other job to take");
        };
        // ... which b's open of file 5 in the same epoch takes, once.
        let opened = open(&sharing, 0, 5, b);
        assert_eq!(opened.count, 0);
        let Share::Take(taken) = opened.share else {
            panic!("b takes a's render");
        };
        assert!(Arc::ptr_eq(&published, &taken));
        // The next epoch of file 5 is another render: b publishes it this time.
        let Share::Publish(next) = open(&sharing, 0, 5, b).share else {
            panic!("b publishes epoch 1");
        };
        // b's render of epoch 1 is held for a: its bytes once finished.
        let held = |sharing: &Sharing<u32>| sharing.figures(0, |n| u64::from(*n));
        assert_eq!(held(&sharing).held_renders, 1);
        assert_eq!(held(&sharing).held_bytes, 0, "running");
        let _ = next.set(Some(40));
        assert_eq!(held(&sharing).held_bytes, 40, "finished");
        assert_eq!(held(&sharing).evicted, 0);
        // Shed, nothing stays held (counted as evicted): a's second open renders its own.
        let _ = sharing.shed();
        assert_eq!(
            (held(&sharing).held_renders, held(&sharing).evicted),
            (0, 1)
        );
        assert!(matches!(open(&sharing, 0, 5, a).share, Share::Publish(_)));
        assert_eq!(sharing.figures(0, |_| 0).jobs, 2);
    }

    #[test]
    fn a_job_whose_process_ended_stops_counting_at_the_next_sweep() {
        let (sharing, _budget) = sharing();
        let other = OtherJob::start();
        let (a, b) = (std::process::id(), other.pid());
        assert!(matches!(open(&sharing, 0, 9, b).share, Share::Alone));
        assert!(matches!(open(&sharing, 0, 5, a).share, Share::Publish(_)));
        drop(other);
        std::thread::sleep(SWEEP_EVERY + Duration::from_millis(50));
        // b ended well within JOB_ACTIVE of its open: nothing is held for it any more.
        assert!(matches!(open(&sharing, 0, 6, a).share, Share::Alone));
        assert_eq!(sharing.figures(0, |_| 0).jobs, 1);
    }

    #[test]
    fn held_renders_leave_a_work_slice_free_for_renders_in_flight() {
        // 80 MiB, 16 of them the work slice; the held renders are their charges.
        let budget = MemoryBudget::new(MemoryPlan {
            cache: 64 << 20,
            staging: 0,
            work: 16 << 20,
        });
        let sharing: Sharing<Work> = Sharing::new(budget.clone());
        let other = OtherJob::start();
        let (a, b) = (std::process::id(), other.pid());
        assert!(matches!(open(&sharing, 0, 9, b).share, Share::Alone));
        let publish = |file: u64| {
            let Share::Publish(slot) = open(&sharing, 0, file, a).share else {
                panic!("file {file}: a render held for b");
            };
            let _ = slot.set(Some(budget.in_flight(30 << 20)));
        };
        // 80, 50, 20 MiB free when each is published: all three held.
        for file in 1..=3 {
            publish(file);
        }
        assert_eq!(budget.free(), 0);
        // The fourth finds less than the work slice free: the oldest goes first.
        publish(4);
        let figures = sharing.figures(0, |_| 0);
        assert_eq!((figures.held_renders, figures.evicted), (3, 1));
        // With the room taken by something else, nothing is held: each job renders its own.
        let _ = sharing.shed();
        let _taken = budget.in_flight(70 << 20);
        assert!(matches!(open(&sharing, 0, 5, a).share, Share::Alone));
    }

    #[test]
    fn with_sharing_off_two_jobs_keep_their_own_counts_and_hold_nothing() {
        let (sharing, _budget) = sharing();
        sharing.set_enabled(false);
        let other = OtherJob::start();
        let (a, b) = (std::process::id(), other.pid());
        for pid in [b, a, b, a] {
            assert!(matches!(open(&sharing, 0, 5, pid).share, Share::Alone));
        }
        // Each job's own count: the same tensors as with sharing on, rendered by each.
        assert_eq!(open(&sharing, 0, 5, a).count, 2);
        assert_eq!(open(&sharing, 0, 5, b).count, 2);
        assert_eq!(sharing.figures(0, |_| 0).jobs, 2);
    }
}
