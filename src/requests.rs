//! `RequestPool`: kernel requests that may wait on the source, run off the FUSE threads, each
//! answered by its deadline whatever the source does.
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

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// How often the watchdog looks at running and queued requests.
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

/// One request: what it does, and what answers it if it is not done by `deadline`.
pub struct Request {
    run: Box<dyn FnOnce() + Send>,
    expire: Expire,
    deadline: Instant,
}

impl Request {
    /// `run` within `patience`, else `expire` (from the watchdog's thread, or at once when the
    /// queue is full).
    pub fn new(
        patience: Duration,
        run: impl FnOnce() + Send + 'static,
        expire: impl FnOnce(Expiry) + Send + 'static,
    ) -> Request {
        Request {
            run: Box::new(run),
            expire: Box::new(expire),
            deadline: Instant::now() + patience,
        }
    }
}

/// A request a worker is running: its deadline and its expiry, until the watchdog takes it.
type Running = Mutex<Option<(Instant, Expire)>>;

struct Shared {
    name: String,
    queue: Mutex<VecDeque<Request>>,
    work: Condvar,
    depth: usize,
    /// Threads that should be running requests (the pool's size).
    size: usize,
    /// Threads alive and not stuck.
    live: AtomicUsize,
    threads: AtomicUsize,
    stop: AtomicBool,
    expired: AtomicU64,
    refused: AtomicU64,
    running: Mutex<Vec<Arc<Running>>>,
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
}

/// The pool.
pub struct RequestPool {
    shared: Arc<Shared>,
    watchdog: Option<JoinHandle<()>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl RequestPool {
    /// Starts `threads` workers named `name-N` over a queue of at most `depth` waiting requests,
    /// and the watchdog.
    pub fn new(name: &str, threads: usize, depth: usize) -> std::io::Result<RequestPool> {
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            queue: Mutex::new(VecDeque::new()),
            work: Condvar::new(),
            depth,
            size: threads.max(1),
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

    /// Queues `request`; never waits. A full queue (or a stopped pool) expires it at once.
    pub fn submit(&self, request: Request) {
        let shared = &self.shared;
        let mut queue = shared.queue.lock();
        if queue.len() >= shared.depth || shared.stop.load(Ordering::Acquire) {
            drop(queue);
            shared.refused.fetch_add(1, Ordering::Relaxed);
            (request.expire)(Expiry::Refused);
            return;
        }
        queue.push_back(request);
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
        RequestGauges {
            queued: s.queue.lock().len() as u64,
            stuck: s
                .threads
                .load(Ordering::Relaxed)
                .saturating_sub(s.live.load(Ordering::Relaxed)) as u64,
            expired: s.expired.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
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

fn work(shared: &Shared) {
    let slot: Arc<Running> = Arc::new(Mutex::new(None));
    shared.running.lock().push(slot.clone());
    loop {
        let request = {
            let mut queue = shared.queue.lock();
            loop {
                if let Some(r) = queue.pop_front() {
                    break Some(r);
                }
                if shared.stop.load(Ordering::Acquire) {
                    break None;
                }
                shared.work.wait(&mut queue);
            }
        };
        let Some(request) = request else { break };
        *slot.lock() = Some((request.deadline, request.expire));
        (request.run)();
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
        let overdue: Vec<Expire> = {
            let mut queue = shared.queue.lock();
            let mut overdue = Vec::new();
            let mut kept = VecDeque::with_capacity(queue.len());
            for r in queue.drain(..) {
                if r.deadline <= now {
                    overdue.push(r.expire);
                } else {
                    kept.push_back(r);
                }
            }
            *queue = kept;
            overdue
        };
        let stuck: Vec<Expire> = shared
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
        let n = (overdue.len() + stuck.len()) as u64;
        if n > 0 {
            shared.expired.fetch_add(n, Ordering::Relaxed);
            tracing::warn!(
                requests = n,
                stuck_threads = stuck.len(),
                "requests passed their deadline waiting on the source; answered without it"
            );
        }
        for expire in overdue.into_iter().chain(stuck) {
            expire(Expiry::Deadline);
        }
    }
}

impl Drop for RequestPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.work.notify_all();
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
        // Requests still queued are answered; threads stuck in the source are left behind
        // (joining them could take forever), the others finish their request and return.
        let queued: Vec<Request> = self.shared.queue.lock().drain(..).collect();
        for r in queued {
            (r.expire)(Expiry::Refused);
        }
        let stuck_free =
            self.shared.threads.load(Ordering::Acquire) == self.shared.live.load(Ordering::Acquire);
        for handle in self.workers.lock().drain(..) {
            if stuck_free || handle.is_finished() {
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
        let pool = RequestPool::new("t", 2, 16).expect("starts");
        let (tx, rx) = mpsc::channel::<&str>();
        let hang = Arc::new((Mutex::new(false), Condvar::new()));
        // Two requests that hang (as on a dead NFS server) take both threads...
        for _ in 0..2 {
            let (tx, etx, hang) = (tx.clone(), tx.clone(), hang.clone());
            pool.submit(Request::new(
                Duration::from_millis(100),
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
    fn a_full_queue_refuses_at_once_and_every_request_is_answered_once() {
        let pool = RequestPool::new("q", 1, 1).expect("starts");
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
}
