//! `WorkerPool`: a fixed pool of named threads fed by a bounded queue.
//!
//! Owns: running work away from the FUSE threads, so cached answers keep flowing while it runs:
//! the I/O pool waits on the source (cache misses), the render pool decodes views. The queue is
//! bounded: when it is full,
//! `submit` blocks the submitter, which pushes back on the kernel instead of growing memory.
//! Must never run unbounded work or outlive its owner (dropping it joins every thread).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use parking_lot::Mutex;

type Job = Box<dyn FnOnce() + Send>;

/// The pool.
pub struct WorkerPool {
    queue: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// Starts `threads` workers named `name-N` sharing a queue of at most `depth` waiting jobs.
    pub fn new(name: &str, threads: usize, depth: usize) -> std::io::Result<WorkerPool> {
        let (tx, rx) = sync_channel::<Job>(depth);
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || work(&rx))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(WorkerPool {
            queue: Some(tx),
            threads,
        })
    }

    /// Queues `job`, waiting for room if the queue is full. Runs it inline if the pool is gone.
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let job: Job = Box::new(job);
        match &self.queue {
            Some(tx) => {
                if let Err(returned) = tx.send(job) {
                    (returned.0)();
                }
            }
            None => job(),
        }
    }
}

fn work(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.queue = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_submitted_job_runs_before_drop_returns() {
        let done = Arc::new(AtomicUsize::new(0));
        let pool = WorkerPool::new("test", 3, 2).expect("threads start");
        for _ in 0..100 {
            let done = done.clone();
            pool.submit(move || {
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        drop(pool);
        assert_eq!(done.load(Ordering::SeqCst), 100);
    }
}
