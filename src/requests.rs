//! `RequestPool`: kernel requests that may wait on the source, run off the FUSE threads, each
//! answered by its deadline whatever the source does; and the mount's background work (prefetch's
//! fetches) on the same threads, behind them.
//!
//! Owns: a bounded queue and a pool of named threads that run requests (lookups, attributes,
//! opens, listings, reads that miss), and a watchdog that answers any request still queued or
//! running at its deadline with the request's own `expire` (EIO, or a fallback such as serving a
//! fully cached file's last-seen version). A thread whose request expired is stuck in the source
//! (a hung NFS server, a stopped FUSE daemon below): the pool starts a replacement, up to
//! `MAX_SPARE` times its size, so a hang takes only the calls that touch it. A reader waiting in
//! the kernel is therefore never stuck past its deadline, and `kill -9` works again. Must never
//! block a submitter (a full queue refuses at once), answer a request twice (the caller's reply
//! lives in one `Once`), or outlive its owner's drop (threads that are not stuck are joined).
//!
//! Places: each request names the part of the source it waits on (the device of the file or
//! directory it touches), and one place holds at most `share` threads at once, stuck ones
//! included: all but a quarter of the request threads (at least one left). A request of a full
//! place waits in the queue (requests of other places behind it are taken first) until a thread
//! of its place returns or its deadline passes. So a hung filesystem mounted inside the source
//! (a stopped FUSE daemon, a dead NFS server) holds at most `share` threads however many
//! requests go to it, and the others, with their replacements, keep serving the rest.
//!
//! The background lane: the pool runs `threads` threads for requests plus `background` more, and
//! a free thread takes a background job only when no request is queued, pulling it from the
//! `Lane` its owner registered (`serve`), so the owner's queue stays the only queue of planned
//! work and the pool never holds a stale job. The lane guarantees: requests first (a queued
//! request is always taken before a background job); at most `background` jobs at once, and at
//! most half of them (at least one) while the owner's demand counter says a reader waits on the
//! source, so background jobs never take the `threads` threads requests have; a job past the
//! lane's patience is stuck like a request (its thread replaced, within `MAX_SPARE`) and keeps
//! its place in the lane until it returns, so a hung source takes at most `background` threads
//! from the lane and none from requests. A job that finds the pool stopping is not started.
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::workers::survive;

/// How often the watchdog looks at running and queued requests (and lets the lane take up
/// threads a demand read no longer holds back).
const WATCH_EVERY: Duration = Duration::from_millis(50);
/// Replacement threads for stuck ones, at most this many times the pool's size.
const MAX_SPARE: usize = 4;

/// A value handed out at most once, to whichever of the request and its watchdog comes first.
pub struct Once<T>(Mutex<Option<T>>);

impl<T> Once<T> {
    /// Holds `value`.
    pub fn new(value: T) -> Arc<Once<T>> {
        Arc::new(Once(Mutex::new(Some(value))))
    }

    /// The value, unless it was taken already.
    pub fn take(&self) -> Option<T> {
        self.0.lock().take()
    }
}

/// Why a request is answered without its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Its deadline passed (queued, or running in a source that does not answer).
    Deadline,
    /// The queue was full when it came.
    Refused,
}

type Expire = Box<dyn FnOnce(Expiry) + Send>;

/// The part of the source a request waits on (see the module doc): the device of the file or
/// directory it touches, 0 where that is not known yet.
pub type Place = u64;

/// One request: what it does, where it waits, and what answers it if it is not done by
/// `deadline`.
pub struct Request {
    run: Box<dyn FnOnce() + Send>,
    expire: Expire,
    deadline: Instant,
    place: Place,
}

impl Request {
    /// `run` within `patience`, else `expire` (from the watchdog's thread, or at once when the
    /// queue is full); it waits on the source at `place`.
    pub fn new(
        patience: Duration,
        place: Place,
        run: impl FnOnce() + Send + 'static,
        expire: impl FnOnce(Expiry) + Send + 'static,
    ) -> Request {
        Request {
            run: Box::new(run),
            expire: Box::new(expire),
            deadline: Instant::now() + patience,
            place,
        }
    }
}

/// One job of the background lane.
pub type Job = Box<dyn FnOnce() + Send>;

/// Where the background lane's jobs come from (see the module doc).
pub struct Lane {
    /// The next job due, if any: asked by a free thread when no request is queued, under the
    /// pool's queue lock (so it must be quick and never call into the pool).
    pub next: Box<dyn Fn() -> Option<Job> + Send + Sync>,
    /// Readers waiting on the source now: while it is above zero, the lane runs at most half
    /// its threads.
    pub demand: Arc<AtomicUsize>,
    /// How long a job may run before its thread counts as stuck and is replaced.
    pub patience: Duration,
}

/// Tells the pool that its lane has a job due; holds no reference that keeps the pool alive.
#[derive(Clone)]
pub struct Bell(Weak<Shared>);

impl Bell {
    /// Wakes a free thread to ask the lane for its next job.
    pub fn ring(&self) {
        if let Some(shared) = self.0.upgrade() {
            // Taken so that a thread between asking the lane and waiting cannot miss the ring.
            drop(shared.queue.lock());
            shared.work.notify_one();
        }
    }
}

/// A running thread's task: its deadline and its expiry (none for a background job), until the
/// watchdog takes it.
type Running = Mutex<Option<(Instant, Option<Expire>)>>;

struct Queue {
    requests: VecDeque<Request>,
    /// Background jobs running (stuck ones included, until they return).
    background: usize,
    /// Threads running a request of each place (stuck ones included, until they return); a
    /// place is removed when it holds none.
    held: HashMap<Place, usize>,
}

impl Queue {
    /// The first queued request whose place has a thread to spare, taken and counted.
    fn take_request(&mut self, share: usize) -> Option<Request> {
        let held = &self.held;
        let at = self
            .requests
            .iter()
            .position(|r| held.get(&r.place).is_none_or(|&n| n < share))?;
        let request = self.requests.remove(at)?;
        *self.held.entry(request.place).or_insert(0) += 1;
        Some(request)
    }

    /// A thread of `place` returned; whether the place was full (a request of it may wait).
    fn release(&mut self, place: Place, share: usize) -> bool {
        match self.held.get_mut(&place) {
            Some(n) if *n > 1 => {
                *n -= 1;
                *n + 1 == share
            }
            Some(_) => {
                self.held.remove(&place);
                share == 1
            }
            None => false,
        }
    }
}

struct Shared {
    name: String,
    queue: Mutex<Queue>,
    work: Condvar,
    depth: usize,
    /// Threads that should be running requests and background jobs (the pool's size).
    size: usize,
    /// Threads one place may hold at once (see the module doc).
    share: usize,
    /// Background jobs at once, at most.
    background: usize,
    lane: OnceLock<Lane>,
    /// Threads alive and not stuck.
    live: AtomicUsize,
    threads: AtomicUsize,
    stop: AtomicBool,
    expired: AtomicU64,
    refused: AtomicU64,
    running: Mutex<Vec<Arc<Running>>>,
}

impl Shared {
    /// Background jobs allowed to run now.
    fn lane_allows(&self, lane: &Lane) -> usize {
        if lane.demand.load(Ordering::Acquire) > 0 {
            // Half, at least one, but none from a lane of no threads.
            self.background.min((self.background / 2).max(1))
        } else {
            self.background
        }
    }
}

/// Figures for the stats files.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestGauges {
    /// Requests waiting for a thread.
    pub queued: u64,
    /// Threads stuck in a request that expired.
    pub stuck: u64,
    /// Requests answered by their deadline instead of their work.
    pub expired: u64,
    /// Requests refused because the queue was full.
    pub refused: u64,
    /// Background jobs running (stuck ones included).
    pub background: u64,
}

/// The pool.
pub struct RequestPool {
    shared: Arc<Shared>,
    watchdog: Option<JoinHandle<()>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl RequestPool {
    /// Starts `threads + background` workers named `name-N` over a queue of at most `depth`
    /// waiting requests, and the watchdog; at most `background` of the workers run the lane's
    /// jobs once one is registered (`serve`).
    pub fn new(
        name: &str,
        threads: usize,
        background: usize,
        depth: usize,
    ) -> std::io::Result<RequestPool> {
        let size = threads.max(1) + background;
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            queue: Mutex::new(Queue {
                requests: VecDeque::new(),
                background: 0,
                held: HashMap::new(),
            }),
            work: Condvar::new(),
            depth,
            size,
            share: size.saturating_sub((threads / 4).max(1)).max(1),
            background,
            lane: OnceLock::new(),
            live: AtomicUsize::new(0),
            threads: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            expired: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            running: Mutex::new(Vec::new()),
        });
        let pool = RequestPool {
            shared: shared.clone(),
            watchdog: None,
            workers: Mutex::new(Vec::new()),
        };
        // On an error the pool drops, which stops what was started.
        for _ in 0..shared.size {
            pool.workers.lock().push(spawn_worker(&shared)?);
        }
        let s = shared.clone();
        let watchdog = std::thread::Builder::new()
            .name(format!("{name}-watchdog"))
            .spawn(move || watch(&s))?;
        let mut pool = pool;
        pool.watchdog = Some(watchdog);
        Ok(pool)
    }

    /// Registers the background lane (once: a second lane is ignored and returned). Its jobs
    /// start when it rings the `bell`.
    pub fn serve(&self, lane: Lane) -> Result<(), Lane> {
        self.shared.lane.set(lane)?;
        self.bell().ring();
        Ok(())
    }

    /// What the lane's owner rings when a job is due.
    pub fn bell(&self) -> Bell {
        Bell(Arc::downgrade(&self.shared))
    }

    /// Queues `request`; never waits. A full queue (or a stopped pool) expires it at once.
    pub fn submit(&self, request: Request) {
        let shared = &self.shared;
        let mut queue = shared.queue.lock();
        if queue.requests.len() >= shared.depth || shared.stop.load(Ordering::Acquire) {
            drop(queue);
            shared.refused.fetch_add(1, Ordering::Relaxed);
            (request.expire)(Expiry::Refused);
            return;
        }
        queue.requests.push_back(request);
        drop(queue);
        shared.work.notify_one();
        self.replace_stuck();
    }

    /// Starts replacements for stuck threads (bounded by `MAX_SPARE`).
    fn replace_stuck(&self) {
        let shared = &self.shared;
        while shared.live.load(Ordering::Acquire) < shared.size
            && shared.threads.load(Ordering::Acquire) < shared.size * MAX_SPARE
        {
            match spawn_worker(shared) {
                Ok(handle) => self.workers.lock().push(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a replacement request thread");
                    break;
                }
            }
        }
    }

    /// Current figures.
    pub fn gauges(&self) -> RequestGauges {
        let s = &self.shared;
        let queue = s.queue.lock();
        RequestGauges {
            queued: queue.requests.len() as u64,
            stuck: s
                .threads
                .load(Ordering::Relaxed)
                .saturating_sub(s.live.load(Ordering::Relaxed)) as u64,
            expired: s.expired.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            background: queue.background as u64,
        }
    }
}

fn spawn_worker(shared: &Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    let index = shared.threads.fetch_add(1, Ordering::AcqRel);
    shared.live.fetch_add(1, Ordering::AcqRel);
    let s = shared.clone();
    std::thread::Builder::new()
        .name(format!("{}-{index}", shared.name))
        .spawn(move || work(&s))
        .inspect_err(|_| {
            shared.threads.fetch_sub(1, Ordering::AcqRel);
            shared.live.fetch_sub(1, Ordering::AcqRel);
        })
}

/// What a thread takes next.
enum Task {
    Request(Request),
    /// A job of the lane, and how long it may run before its thread counts as stuck.
    Background(Job, Duration),
}

/// The next task: a queued request, else a background job the lane allows and has due, else
/// waits; `None` once the pool stops.
fn next_task(shared: &Shared) -> Option<Task> {
    let mut queue = shared.queue.lock();
    loop {
        if let Some(r) = queue.take_request(shared.share) {
            return Some(Task::Request(r));
        }
        if shared.stop.load(Ordering::Acquire) {
            return None;
        }
        if let Some(lane) = shared.lane.get() {
            let allowed = shared.lane_allows(lane);
            if queue.background < allowed
                && let Some(job) = (lane.next)()
            {
                queue.background += 1;
                let more = queue.background < allowed;
                drop(queue);
                // The lane may have more due: the next free thread asks (one wake per job).
                if more {
                    shared.work.notify_one();
                }
                return Some(Task::Background(job, lane.patience));
            }
        }
        shared.work.wait(&mut queue);
    }
}

fn work(shared: &Shared) {
    let slot: Arc<Running> = Arc::new(Mutex::new(None));
    shared.running.lock().push(slot.clone());
    while let Some(task) = next_task(shared) {
        match task {
            Task::Request(request) => {
                *slot.lock() = Some((request.deadline, Some(request.expire)));
                // A run that panics drops its reply, which answers the kernel EIO; the thread
                // gives its place back as after any request.
                survive("request", request.run);
                let was_full = shared.queue.lock().release(request.place, shared.share);
                // A request of that place may have waited for this thread.
                if was_full {
                    shared.work.notify_one();
                }
            }
            Task::Background(job, patience) => {
                *slot.lock() = Some((Instant::now() + patience, None));
                survive("background job", job);
                shared.queue.lock().background -= 1;
            }
        }
        // Taken by the watchdog meanwhile: this thread was counted stuck and replaced.
        if slot.lock().take().is_none() {
            shared.live.fetch_add(1, Ordering::AcqRel);
            if shared.live.load(Ordering::Acquire) > shared.size {
                break;
            }
        }
    }
    shared.live.fetch_sub(1, Ordering::AcqRel);
    shared.threads.fetch_sub(1, Ordering::AcqRel);
    shared.running.lock().retain(|s| !Arc::ptr_eq(s, &slot));
}
fn watch(shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(WATCH_EVERY);
        let now = Instant::now();
        let (overdue, lane_room): (Vec<Expire>, bool) = {
            let mut queue = shared.queue.lock();
            let mut overdue = Vec::new();
            let mut kept = VecDeque::with_capacity(queue.requests.len());
            for r in queue.requests.drain(..) {
                if r.deadline <= now {
                    overdue.push(r.expire);
                } else {
                    kept.push_back(r);
                }
            }
            queue.requests = kept;
            let room = shared
                .lane
                .get()
                .is_some_and(|lane| queue.background < shared.lane_allows(lane));
            (overdue, room)
        };
        // A demand read that held the lane back may have finished: a free thread asks the lane.
        if lane_room {
            shared.work.notify_one();
        }
        let stuck: Vec<Option<Expire>> = shared
            .running
            .lock()
            .iter()
            .filter_map(|slot| {
                let mut slot = slot.lock();
                match &*slot {
                    Some((deadline, _)) if *deadline <= now => slot.take().map(|(_, e)| e),
                    _ => None,
                }
            })
            .collect();
        shared.live.fetch_sub(stuck.len(), Ordering::AcqRel);
        let stuck_threads = stuck.len();
        let expired: Vec<Expire> = overdue
            .into_iter()
            .chain(stuck.into_iter().flatten())
            .collect();
        if !expired.is_empty() || stuck_threads > 0 {
            shared
                .expired
                .fetch_add(expired.len() as u64, Ordering::Relaxed);
            tracing::warn!(
                requests = expired.len(),
                stuck_threads,
                "requests or background jobs passed their deadline waiting on the source; \
                 answered without it, their threads replaced"
            );
        }
        for expire in expired {
            expire(Expiry::Deadline);
        }
    }
}

impl Drop for RequestPool {
    fn drop(&mut self) {
        {
            // Under the queue's lock: a thread that saw `stop` unset is waiting by the time the
            // lock is free, so the notice reaches it (set without the lock, it could come
            // between the check and the wait, and the drop below would join a thread that waits
            // for ever).
            let _queue = self.shared.queue.lock();
            self.shared.stop.store(true, Ordering::Release);
        }
        self.shared.work.notify_all();
        // The last owner may be a task on one of the pool's own threads: that one is not joined.
        let me = std::thread::current().id();
        if let Some(w) = self.watchdog.take()
            && w.thread().id() != me
        {
            let _ = w.join();
        }
        // Requests still queued are answered; threads stuck in the source are left behind
        // (joining them could take forever), the others finish their task and return.
        let queued: Vec<Request> = self.shared.queue.lock().requests.drain(..).collect();
        for r in queued {
            (r.expire)(Expiry::Refused);
        }
        let stuck_free =
            self.shared.threads.load(Ordering::Acquire) == self.shared.live.load(Ordering::Acquire);
        for handle in self.workers.lock().drain(..) {
            if (stuck_free || handle.is_finished()) && handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn requests_past_their_deadline_are_expired_and_stuck_threads_replaced() {
        let pool = RequestPool::new("t", 2, 0, 16).expect("starts");
        let (tx, rx) = mpsc::channel::<&str>();
        let hang = Arc::new((Mutex::new(false), Condvar::new()));
        // Two requests that hang (as on two dead NFS servers) take both threads...
        for place in 1..=2 {
            let (tx, etx, hang) = (tx.clone(), tx.clone(), hang.clone());
            pool.submit(Request::new(
                Duration::from_millis(100),
                place,
                move || {
                    let mut released = hang.0.lock();
                    while !*released {
                        hang.1.wait(&mut released);
                    }
                    let _ = tx.send("late");
                },
                move |_| {
                    let _ = etx.send("expired");
                },
            ));
        }
        let got: Vec<&str> = (0..2).map(|_| rx.recv().expect("answer")).collect();
        assert_eq!(got, ["expired", "expired"]);
        // ... and replacements still serve the others.
        let etx = tx.clone();
        let ok = tx.clone();
        pool.submit(Request::new(
            Duration::from_secs(10),
            0,
            move || {
                let _ = ok.send("served");
            },
            move |_| {
                let _ = etx.send("expired too");
            },
        ));
        assert_eq!(rx.recv().expect("answer"), "served");
        let g = pool.gauges();
        assert_eq!((g.stuck, g.expired), (2, 2));
        *hang.0.lock() = true;
        hang.1.notify_all();
        assert_eq!(rx.recv().expect("late"), "late");
        assert_eq!(rx.recv().expect("late"), "late");
        drop(pool);
    }

    #[test]
    fn a_pool_dropped_right_after_it_starts_always_returns() {
        // A thread between its check of `stop` and its wait missed a stop set without the
        // queue's lock, and the drop joined it for ever (seen once in 201 tests).
        for _ in 0..300 {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                drop(RequestPool::new("d", 2, 1, 4).expect("starts"));
                let _ = tx.send(());
            });
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(20)),
                Ok(()),
                "a dropped pool never returned"
            );
        }
    }

    #[test]
    fn requests_that_panic_leave_their_place_and_threads_serving() {
        let pool = RequestPool::new("q", 2, 0, 16).expect("starts");
        let (tx, rx) = mpsc::channel::<&str>();
        // More panics in one place than the pool has threads, or the place may hold.
        for _ in 0..6 {
            let tx = tx.clone();
            pool.submit(Request::new(
                Duration::from_secs(10),
                7,
                || panic!("a bug on a request path"),
                move |_| {
                    let _ = tx.send("expired");
                },
            ));
        }
        for place in [7, 0] {
            let (ok, etx) = (tx.clone(), tx.clone());
            pool.submit(Request::new(
                Duration::from_secs(10),
                place,
                move || {
                    let _ = ok.send("served");
                },
                move |_| {
                    let _ = etx.send("expired");
                },
            ));
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(10)),
                Ok("served"),
                "place {place}"
            );
        }
        assert_eq!(pool.gauges().expired, 0);
    }

    #[test]
    fn a_hung_place_holds_at_most_its_share_of_threads_and_the_others_are_served() {
        // Four threads: one place may hold three of them.
        let pool = RequestPool::new("p", 4, 0, 64).expect("starts");
        let (tx, rx) = mpsc::channel::<&str>();
        let hang = Gate::default();
        let started = Arc::new(AtomicUsize::new(0));
        // Three waves of requests into a place that never answers (a stopped FUSE daemon
        // mounted inside the source) ...
        for _ in 0..3 {
            for _ in 0..10 {
                let (tx, etx, hang, started) =
                    (tx.clone(), tx.clone(), hang.clone(), started.clone());
                pool.submit(Request::new(
                    Duration::from_millis(200),
                    7,
                    move || {
                        started.fetch_add(1, Ordering::AcqRel);
                        hang.wait();
                        let _ = tx.send("late");
                    },
                    move |_| {
                        let _ = etx.send("expired");
                    },
                ));
            }
            for _ in 0..10 {
                assert_eq!(rx.recv_timeout(MINUTE).expect("answered"), "expired");
            }
        }
        // ... started three of thirty, and requests elsewhere are still served, at once.
        assert_eq!(started.load(Ordering::Acquire), 3);
        assert_eq!(pool.gauges().stuck, 3);
        for place in [0, 8] {
            let (ok, etx) = (tx.clone(), tx.clone());
            pool.submit(Request::new(
                Duration::from_secs(60),
                place,
                move || {
                    let _ = ok.send("served");
                },
                move |_| {
                    let _ = etx.send("expired elsewhere");
                },
            ));
            assert_eq!(rx.recv_timeout(MINUTE).expect("answered"), "served");
        }
        // The place answers again: its threads return, and its requests run again.
        hang.open();
        for _ in 0..3 {
            assert_eq!(rx.recv_timeout(MINUTE).expect("late"), "late");
        }
        let ok = tx.clone();
        pool.submit(Request::new(
            Duration::from_secs(60),
            7,
            move || {
                let _ = ok.send("served");
            },
            |_| {},
        ));
        assert_eq!(rx.recv_timeout(MINUTE).expect("answered"), "served");
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_every_request_is_answered_once() {
        let pool = RequestPool::new("q", 1, 0, 1).expect("starts");
        let once = Once::new(());
        let (tx, rx) = mpsc::channel::<bool>();
        let (started_tx, started) = mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock();
        for i in 0..3 {
            let (tx, etx, once, eonce, gate) = (
                tx.clone(),
                tx.clone(),
                once.clone(),
                once.clone(),
                gate.clone(),
            );
            let started_tx = started_tx.clone();
            pool.submit(Request::new(
                Duration::from_secs(10),
                0,
                move || {
                    let _ = started_tx.send(());
                    let _g = gate.lock();
                    let _ = tx.send(once.take().is_some());
                },
                move |_| {
                    let _ = etx.send(eonce.take().is_some());
                },
            ));
            if i == 0 {
                started.recv().expect("the first request runs");
            }
        }
        // One running, one queued: the third found the queue full and was refused at once.
        assert_eq!(pool.gauges().refused, 1);
        drop(held);
        let answers: Vec<bool> = (0..3).map(|_| rx.recv().expect("answer")).collect();
        assert_eq!(
            answers.iter().filter(|a| **a).count(),
            1,
            "one value, taken once"
        );
    }

    /// Each lane test's bound on a broken pool: it fails, never hangs.
    const MINUTE: Duration = Duration::from_secs(60);

    /// A gate jobs and requests wait at until the test opens it (or a minute passes: the pool
    /// of a failed test still drops).
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<bool>, Condvar)>);

    impl Gate {
        fn wait(&self) {
            let mut open = self.0.0.lock();
            let start = Instant::now();
            while !*open && start.elapsed() < MINUTE {
                self.0.1.wait_for(&mut open, MINUTE);
            }
        }

        fn open(&self) {
            *self.0.0.lock() = true;
            self.0.1.notify_all();
        }

        fn opened(self) -> Gate {
            self.open();
            self
        }
    }

    /// A lane over a queue of jobs the test fills, each of which logs "job" when it starts and
    /// counts itself running while it waits at its gate.
    struct TestLane {
        jobs: Arc<Mutex<VecDeque<Job>>>,
        running: Arc<AtomicUsize>,
        demand: Arc<AtomicUsize>,
    }

    impl TestLane {
        fn serve(pool: &RequestPool, patience: Duration) -> TestLane {
            let jobs: Arc<Mutex<VecDeque<Job>>> = Arc::default();
            let demand: Arc<AtomicUsize> = Arc::default();
            let queue = jobs.clone();
            let lane = Lane {
                next: Box::new(move || queue.lock().pop_front()),
                demand: demand.clone(),
                patience,
            };
            assert!(pool.serve(lane).is_ok(), "one lane");
            TestLane {
                jobs,
                running: Arc::default(),
                demand,
            }
        }

        fn push(&self, pool: &RequestPool, gate: &Gate, log: &mpsc::Sender<&'static str>) {
            let (running, gate, log) = (self.running.clone(), gate.clone(), log.clone());
            self.jobs.lock().push_back(Box::new(move || {
                running.fetch_add(1, Ordering::AcqRel);
                let _ = log.send("job");
                gate.wait();
                running.fetch_sub(1, Ordering::AcqRel);
            }));
            pool.bell().ring();
        }
    }

    /// A request that logs `name` when it starts, then waits at `gate`.
    fn gated(gate: &Gate, log: &mpsc::Sender<&'static str>, name: &'static str) -> Request {
        // Each in a place of its own: these tests are about threads, not places.
        static PLACE: AtomicU64 = AtomicU64::new(1000);
        let (gate, log, expired) = (gate.clone(), log.clone(), log.clone());
        Request::new(
            Duration::from_secs(60),
            PLACE.fetch_add(1, Ordering::Relaxed),
            move || {
                let _ = log.send(name);
                gate.wait();
            },
            move |_| {
                let _ = expired.send("expired");
            },
        )
    }

    /// Waits until `what` holds.
    fn until(what: impl Fn() -> bool) {
        let start = Instant::now();
        while !what() {
            assert!(start.elapsed() < MINUTE, "never happened");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_queued_request_is_taken_before_a_background_job() {
        let pool = RequestPool::new("d", 1, 1, 16).expect("starts");
        let (log, logged) = mpsc::channel();
        let (first, second, rest) = (Gate::default(), Gate::default(), Gate::default());
        // Both threads busy with requests, then a job and a request are due together.
        pool.submit(gated(&first, &log, "first"));
        pool.submit(gated(&second, &log, "second"));
        let mut started = [
            logged.recv_timeout(MINUTE).expect("started"),
            logged.recv_timeout(MINUTE).expect("started"),
        ];
        started.sort_unstable();
        assert_eq!(started, ["first", "second"]);
        let lane = TestLane::serve(&pool, Duration::from_secs(60));
        lane.push(&pool, &rest, &log);
        pool.submit(gated(&rest, &log, "request"));
        // The thread that frees first takes the request; the job waits for the next free one.
        first.open();
        assert_eq!(logged.recv_timeout(MINUTE).expect("next"), "request");
        second.open();
        assert_eq!(logged.recv_timeout(MINUTE).expect("next"), "job");
        rest.open();
    }

    #[test]
    fn the_lane_runs_at_most_its_threads_and_never_takes_those_of_requests() {
        let pool = RequestPool::new("c", 1, 2, 16).expect("starts");
        let (log, logged) = mpsc::channel();
        let gate = Gate::default();
        let lane = TestLane::serve(&pool, Duration::from_secs(60));
        for _ in 0..6 {
            lane.push(&pool, &gate, &log);
        }
        until(|| lane.running.load(Ordering::Acquire) == 2);
        // Every job that could start has: two of six, and the pool's third thread serves a
        // request while the lane is full.
        pool.submit(gated(&Gate::default().opened(), &log, "request"));
        let request = std::iter::from_fn(|| logged.recv_timeout(MINUTE).ok()).find(|l| *l != "job");
        assert_eq!(request, Some("request"));
        assert_eq!(lane.running.load(Ordering::Acquire), 2);
        assert_eq!(pool.gauges().background, 2);
        assert_eq!(
            lane.jobs.lock().len(),
            4,
            "the others stay in the owner's queue"
        );
        gate.open();
        until(|| lane.jobs.lock().is_empty() && pool.gauges().background == 0);
    }

    #[test]
    fn the_lane_runs_half_its_threads_while_a_reader_waits_on_the_source() {
        let pool = RequestPool::new("h", 1, 4, 16).expect("starts");
        let (log, _logged) = mpsc::channel();
        let gate = Gate::default();
        let lane = TestLane::serve(&pool, Duration::from_secs(60));
        lane.demand.store(1, Ordering::Release);
        for _ in 0..8 {
            lane.push(&pool, &gate, &log);
        }
        until(|| lane.running.load(Ordering::Acquire) == 2);
        // A request runs to its end meanwhile: the threads it frees do not take more jobs.
        let (done_tx, done) = mpsc::channel();
        pool.submit(Request::new(
            Duration::from_secs(60),
            0,
            move || {
                let _ = done_tx.send(());
            },
            |_| {},
        ));
        done.recv_timeout(MINUTE).expect("the request ran");
        assert_eq!(lane.running.load(Ordering::Acquire), 2);
        assert_eq!(lane.jobs.lock().len(), 6);
        // The reader is answered: the lane takes up all its threads again.
        lane.demand.store(0, Ordering::Release);
        until(|| lane.running.load(Ordering::Acquire) == 4);
        assert_eq!(lane.jobs.lock().len(), 4);
        gate.open();
        until(|| lane.jobs.lock().is_empty() && pool.gauges().background == 0);
    }

    #[test]
    fn a_background_job_stuck_in_the_source_is_replaced_and_keeps_its_place() {
        let pool = RequestPool::new("s", 1, 1, 16).expect("starts");
        let (log, logged) = mpsc::channel();
        let hang = Gate::default();
        let lane = TestLane::serve(&pool, Duration::from_millis(100));
        lane.push(&pool, &hang, &log);
        lane.push(&pool, &hang, &log);
        assert_eq!(logged.recv_timeout(MINUTE).expect("a job starts"), "job");
        until(|| pool.gauges().stuck == 1);
        // Both request threads serve at once (the stuck one was replaced), while the stuck job
        // holds the lane's one place: the second job does not start.
        let both = Gate::default();
        pool.submit(gated(&both, &log, "request"));
        pool.submit(gated(&both, &log, "request"));
        assert_eq!(logged.recv_timeout(MINUTE).expect("first"), "request");
        assert_eq!(logged.recv_timeout(MINUTE).expect("second"), "request");
        assert_eq!(lane.jobs.lock().len(), 1);
        assert_eq!(pool.gauges().expired, 0, "no request expired");
        both.open();
        // The source answers again: the stuck job returns and the next one runs.
        hang.open();
        until(|| lane.jobs.lock().is_empty() && pool.gauges().background == 0);
        assert_eq!(logged.recv_timeout(MINUTE).expect("the next job"), "job");
    }
}
