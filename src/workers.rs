//! `WorkerPool`: a fixed pool of named threads fed by a bounded queue.
//!
//! Owns: running CPU work away from the request threads (the render pool decodes views). The
//! queue is bounded, and `try_submit` never waits: a caller with a full queue does the work
//! itself later (a view's first read renders it), so neither memory nor waiting grows with it.
//! A pool may be sized live (`Active`): workers beyond the active count finish their job and
//! wait, so the scheduler can give cores back to the trainer or overlap more waits.
//! Must never run unbounded work, lose a thread to a job that panics (`survive`), or outlive its
//! owner (dropping it joins every thread).
//!
//! `Permits` bounds work that any thread may start (renders start on the render pool, on the
//! reads that find their file unrendered and on prefetch's threads): at most as many at once as
//! the pool has active workers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// How many of the pool's workers take jobs now (read before each job; at least one).
pub type Active = Arc<dyn Fn() -> usize + Send + Sync>;

/// How often a worker beyond the active count looks again: fast next to the scheduler's 200 ms
/// decisions, and a sleeping thread's wake-up costs microseconds.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(20);

/// The pool.
pub struct WorkerPool {
    queue: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    /// Tells workers beyond the active count to stop waiting for a turn.
    closing: Arc<AtomicBool>,
    /// Jobs submitted and not yet started.
    queued: Arc<AtomicUsize>,
}

impl WorkerPool {
    /// Starts `threads` workers named `name-N` sharing a queue of at most `depth` waiting jobs.
    pub fn new(name: &str, threads: usize, depth: usize) -> std::io::Result<WorkerPool> {
        WorkerPool::sized(name, threads, depth, Arc::new(|| usize::MAX))
    }

    /// Like `new`, with only the first `active()` workers taking jobs at any moment.
    pub fn sized(
        name: &str,
        threads: usize,
        depth: usize,
        active: Active,
    ) -> std::io::Result<WorkerPool> {
        let (tx, rx) = sync_channel::<Job>(depth);
        let rx = Arc::new(Mutex::new(rx));
        let closing = Arc::new(AtomicBool::new(false));
        let threads = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                let active = active.clone();
                let closing = closing.clone();
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || work(i, &rx, &*active, &closing))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(WorkerPool {
            queue: Some(tx),
            threads,
            closing,
            queued: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// A gauge of the jobs submitted and not yet started.
    pub fn queued(&self) -> Arc<AtomicUsize> {
        self.queued.clone()
    }

    /// Queues `job` unless the queue is full (or the pool is gone); never waits. True when
    /// queued.
    pub fn try_submit(&self, job: impl FnOnce() + Send + 'static) -> bool {
        let Some(tx) = &self.queue else {
            return false;
        };
        let queued = self.queued.clone();
        queued.fetch_add(1, Ordering::Relaxed);
        let job: Job = Box::new(move || {
            queued.fetch_sub(1, Ordering::Relaxed);
            job();
        });
        if tx.try_send(job).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }
}

fn work(
    index: usize,
    rx: &Mutex<Receiver<Job>>,
    active: &(dyn Fn() -> usize + Send + Sync),
    closing: &AtomicBool,
) {
    loop {
        // Worker 0 is always active, so the queue always drains.
        if index >= active().max(1) {
            if closing.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(RECHECK);
            continue;
        }
        let job = rx.lock().recv();
        match job {
            Ok(job) => survive("render pool job", job),
            Err(_) => return,
        }
    }
}

/// Runs `task` (a `what`) on a pool's thread; a panic in it (a bug) is caught and logged, so the
/// thread goes on serving and the pool keeps its size.
pub fn survive(what: &str, task: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(task)).is_err() {
        tracing::error!("a {what} panicked; its thread goes on serving");
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        self.queue = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// At most `limit()` pieces of work at once (read live, like a pool's active count), whichever
/// threads start them.
pub struct Permits {
    running: Mutex<usize>,
    freed: Condvar,
    limit: Active,
}

/// One piece of work's permit, given back when dropped.
pub struct Permit<'a>(&'a Permits);

impl Permits {
    /// Permits for at most `limit()` pieces of work at once (at least one).
    pub fn new(limit: Active) -> Permits {
        Permits {
            running: Mutex::new(0),
            freed: Condvar::new(),
            limit,
        }
    }

    /// A permit if one is free now.
    pub fn try_take(&self) -> Option<Permit<'_>> {
        let mut running = self.running.lock();
        (*running < (self.limit)().max(1)).then(|| {
            *running += 1;
            Permit(self)
        })
    }

    /// A permit, waiting at most `patience` for one to be given back (or the limit to rise).
    pub fn take(&self, patience: std::time::Duration) -> Option<Permit<'_>> {
        let deadline = std::time::Instant::now() + patience;
        let mut running = self.running.lock();
        while *running >= (self.limit)().max(1) {
            if std::time::Instant::now() >= deadline {
                return None;
            }
            let _ = self.freed.wait_until(
                &mut running,
                deadline.min(std::time::Instant::now() + RECHECK),
            );
        }
        *running += 1;
        Some(Permit(self))
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.running.lock() -= 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_queued_job_runs_before_drop_returns_and_a_full_queue_refuses() {
        let done = Arc::new(AtomicUsize::new(0));
        let pool = WorkerPool::new("test", 3, 2).expect("threads start");
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock();
        let mut queued = 0;
        for _ in 0..100 {
            let (done, gate) = (done.clone(), gate.clone());
            queued += usize::from(pool.try_submit(move || {
                let _open = gate.lock();
                done.fetch_add(1, Ordering::SeqCst);
            }));
        }
        // Three workers hold a job each (waiting at the gate), two wait in the queue.
        assert!(
            queued <= 5,
            "a full queue refuses instead of waiting: {queued}"
        );
        drop(held);
        drop(pool);
        assert_eq!(done.load(Ordering::SeqCst), queued);
    }

    #[test]
    fn a_job_that_panics_leaves_its_worker_serving() {
        // One worker: were it to die with the panic, the job after it would never run.
        let pool = WorkerPool::new("panics", 1, 4).expect("threads start");
        let (tx, rx) = std::sync::mpsc::channel();
        assert!(pool.try_submit(|| panic!("a bug in a render")));
        assert!(pool.try_submit(move || {
            let _ = tx.send("ran");
        }));
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok("ran"));
    }

    #[test]
    fn only_the_active_workers_take_jobs_and_the_count_follows_the_knob() {
        let active = Arc::new(AtomicUsize::new(1));
        let a = active.clone();
        let pool = WorkerPool::sized("sized", 4, 64, Arc::new(move || a.load(Ordering::Relaxed)))
            .expect("threads start");
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let run = |pool: &WorkerPool| {
            most.store(0, Ordering::SeqCst);
            for _ in 0..16 {
                let (running, most) = (running.clone(), most.clone());
                assert!(pool.try_submit(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(15));
                    running.fetch_sub(1, Ordering::SeqCst);
                }));
            }
            while running.load(Ordering::SeqCst) > 0 || most.load(Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        run(&pool);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(most.load(Ordering::SeqCst), 1, "one active worker");
        active.store(4, Ordering::Relaxed);
        std::thread::sleep(RECHECK * 3);
        run(&pool);
        std::thread::sleep(Duration::from_millis(300));
        assert!(most.load(Ordering::SeqCst) > 1, "more workers once allowed");
        drop(pool); // inactive workers must not keep drop waiting
    }

    #[test]
    fn permits_bound_work_and_come_back_when_dropped() {
        let permits = Permits::new(Arc::new(|| 2));
        let a = permits.try_take().expect("first");
        let _b = permits.try_take().expect("second");
        assert!(permits.try_take().is_none(), "two at most");
        assert!(
            permits.take(std::time::Duration::from_millis(10)).is_none(),
            "waits, then gives up"
        );
        drop(a);
        assert!(permits.take(std::time::Duration::ZERO).is_some());
    }
}
