//! Gathering concurrent render requests into batches for one device thread: render workers
//! submit a job and wait; the device thread takes the first job, then whatever else arrives
//! until the queue has been quiet for a moment or a short deadline passes (up to a count and a
//! cost limit), runs them as one batch, and answers each job.
//!
//! Owns the bounded queue, the gathering rule and the device thread's lifetime (named, stopped
//! when the batcher is dropped). Must never run a job itself, drop a job unanswered (a caller
//! whose batch died gets an error and renders on the CPU), or wait longer than the deadline for
//! company.

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How batches are gathered.
#[derive(Debug, Clone, Copy)]
pub struct Gathering {
    /// Longest wait for more jobs after the first: a few ms, small next to a render on the CPU
    /// (~1 ms) times the workers waiting, and long enough to fill a launch.
    pub deadline: Duration,
    /// The batch closes once no job has arrived for this long: jobs that come together (a
    /// decode batch's answers, each going on to its transform) share a launch, while a lone
    /// job does not wait out the deadline for company that is not coming. Jobs arriving while
    /// a batch runs queue up and form the next one, so batches still grow with the load.
    pub quiet: Duration,
    /// Most jobs per batch.
    pub max_jobs: usize,
    /// Most summed cost per batch (a job alone may exceed it: it runs alone).
    pub max_cost: u64,
    /// Jobs waiting beyond the batch being gathered; a full queue refuses new jobs (the caller
    /// renders on the CPU instead of queueing without bound).
    pub queue: usize,
}

/// Why a job got no answer from the device thread.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The queue was full.
    #[error("the device queue is full")]
    Busy,
    /// The device thread is gone (stopped, or died on an error).
    #[error("the device thread stopped")]
    Stopped,
    /// The batch holding the job failed before answering it.
    #[error("the device batch failed")]
    Lost,
}

type Envelope<J, R> = (J, SyncSender<R>);

/// A device thread fed with batches of `J`, answering each with an `R`.
pub struct Batcher<J: Send + 'static, R: Send + 'static> {
    tx: Option<SyncSender<Envelope<J, R>>>,
    thread: Option<JoinHandle<()>>,
}

impl<J: Send + 'static, R: Send + 'static> Batcher<J, R> {
    /// Starts thread `name`, which calls `run` with each batch; `run` returns one answer per
    /// job, in order. `cost` weighs a job against `Gathering::max_cost`.
    pub fn start(
        name: &str,
        gathering: Gathering,
        cost: fn(&J) -> u64,
        mut run: impl FnMut(Vec<J>) -> Vec<R> + Send + 'static,
    ) -> std::io::Result<Batcher<J, R>> {
        let (tx, rx) = sync_channel::<Envelope<J, R>>(gathering.queue.max(1));
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let mut held = None;
                while let Some(batch) = gather(&rx, &mut held, &gathering, cost) {
                    let (jobs, replies): (Vec<J>, Vec<SyncSender<R>>) = batch.into_iter().unzip();
                    let answers = run(jobs);
                    if answers.len() != replies.len() {
                        tracing::error!(
                            jobs = replies.len(),
                            answers = answers.len(),
                            "device batch answered the wrong number of jobs"
                        );
                        continue; // dropping the replies answers every caller with an error
                    }
                    for (answer, reply) in answers.into_iter().zip(replies) {
                        let _ = reply.send(answer); // the caller may have gone
                    }
                }
            })?;
        Ok(Batcher {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Runs `job` in the next batch and waits for its answer.
    pub fn submit(&self, job: J) -> Result<R, BatchError> {
        let tx = self.tx.as_ref().ok_or(BatchError::Stopped)?;
        let (reply, answer) = sync_channel(1);
        tx.try_send((job, reply)).map_err(|e| match e {
            TrySendError::Full(_) => BatchError::Busy,
            TrySendError::Disconnected(_) => BatchError::Stopped,
        })?;
        answer.recv().map_err(|_| BatchError::Lost)
    }
}

/// The next batch: blocks for a first job, then gathers until the queue is quiet, the deadline,
/// the count or the cost limit. A job that would pass the cost limit is held for the next batch.
/// `None` when the queue is closed and nothing is held.
fn gather<J, R>(
    rx: &Receiver<Envelope<J, R>>,
    held: &mut Option<Envelope<J, R>>,
    g: &Gathering,
    cost: fn(&J) -> u64,
) -> Option<Vec<Envelope<J, R>>> {
    let first = match held.take() {
        Some(job) => job,
        None => rx.recv().ok()?,
    };
    let mut total = cost(&first.0);
    let mut batch = vec![first];
    let deadline = Instant::now() + g.deadline;
    while batch.len() < g.max_jobs {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(g.quiet);
        let next = match rx.try_recv() {
            Ok(job) => job,
            Err(_) if wait.is_zero() => break,
            Err(_) => match rx.recv_timeout(wait) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            },
        };
        let c = cost(&next.0);
        if total.saturating_add(c) > g.max_cost {
            *held = Some(next);
            break;
        }
        total += c;
        batch.push(next);
    }
    Some(batch)
}

impl<J: Send + 'static, R: Send + 'static> Drop for Batcher<J, R> {
    fn drop(&mut self) {
        self.tx.take(); // closes the queue: the thread finishes what it holds, then stops
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier, Mutex};

    fn gathering(max_jobs: usize, max_cost: u64) -> Gathering {
        Gathering {
            deadline: Duration::from_millis(200),
            quiet: Duration::from_millis(200),
            max_jobs,
            max_cost,
            queue: 64,
        }
    }

    #[test]
    fn concurrent_jobs_share_batches_and_each_gets_its_own_answer() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let batcher = Arc::new(
            Batcher::start(
                "test-batcher",
                gathering(4, u64::MAX),
                |_| 1,
                move |jobs| {
                    seen.lock().expect("lock").push(jobs.len());
                    jobs.into_iter().map(|j: u32| j * 10).collect()
                },
            )
            .expect("starts"),
        );
        let barrier = Arc::new(Barrier::new(8));
        let workers: Vec<_> = (0..8u32)
            .map(|i| {
                let (b, start) = (batcher.clone(), barrier.clone());
                std::thread::spawn(move || {
                    start.wait();
                    b.submit(i)
                })
            })
            .collect();
        for (i, w) in workers.into_iter().enumerate() {
            assert_eq!(w.join().expect("joins"), Ok(i as u32 * 10));
        }
        let sizes = sizes.lock().expect("lock").clone();
        assert_eq!(sizes.iter().sum::<usize>(), 8);
        assert!(sizes.iter().all(|s| *s <= 4), "{sizes:?}");
        assert!(
            sizes.len() < 8,
            "some jobs were batched together: {sizes:?}"
        );
    }

    #[test]
    fn a_job_over_the_cost_limit_waits_for_the_next_batch() {
        let (tx, rx) = sync_channel(8);
        let (reply, _answers) = sync_channel::<u64>(8);
        for cost in [3u64, 3, 5, 1] {
            tx.send((cost, reply.clone())).expect("queued");
        }
        let g = gathering(10, 7);
        let mut held = None;
        let costs = |b: Vec<Envelope<u64, u64>>| b.into_iter().map(|e| e.0).collect::<Vec<_>>();
        let first = gather(&rx, &mut held, &g, |c| *c).expect("a batch");
        assert_eq!(costs(first), vec![3, 3], "5 would pass the limit of 7");
        drop(tx);
        let second = gather(&rx, &mut held, &g, |c| *c).expect("a batch");
        assert_eq!(costs(second), vec![5, 1]);
        assert!(
            gather(&rx, &mut held, &g, |c| *c).is_none(),
            "closed and empty"
        );
    }

    #[test]
    fn a_batch_closes_once_the_queue_is_quiet_not_at_the_deadline() {
        let (tx, rx) = sync_channel(8);
        let (reply, _answers) = sync_channel::<u32>(8);
        let g = Gathering {
            deadline: Duration::from_secs(60),
            quiet: Duration::from_millis(20),
            ..gathering(10, u64::MAX)
        };
        tx.send((1u32, reply.clone())).expect("queued");
        tx.send((2, reply.clone())).expect("queued");
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            tx.send((3, reply)).expect("queued");
            tx // kept open: only the quiet gap can close the batch
        });
        let mut held = None;
        let started = Instant::now();
        let batch = gather(&rx, &mut held, &g, |_| 1).expect("a batch");
        let jobs: Vec<u32> = batch.into_iter().map(|e| e.0).collect();
        assert!(jobs.starts_with(&[1, 2]), "{jobs:?}");
        // 20 ms of quiet closes it; only a batch that waited for the deadline takes a minute.
        assert!(started.elapsed() < Duration::from_secs(30));
        drop(sender.join().expect("sender"));
    }

    #[test]
    fn a_batch_answered_wrongly_fails_its_callers_and_a_stopped_batcher_refuses_jobs() {
        let batcher = Batcher::start(
            "test-wrong",
            gathering(1, 1),
            |_| 1,
            |_jobs: Vec<u8>| Vec::<u8>::new(),
        )
        .expect("starts");
        assert_eq!(batcher.submit(1), Err(BatchError::Lost));
        let mut stopped = batcher;
        stopped.tx.take();
        assert_eq!(stopped.submit(1), Err(BatchError::Stopped));
    }
}
