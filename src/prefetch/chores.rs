//! `Chores`: the planner's helper thread, for the work of a pass that grows with the size of a
//! file set: listing, sorting and indexing a directory for a tree walk, and freeing the tables of
//! a pass or of listings that ended. Done on the planner thread, such work held up a million-file
//! set's opens long enough for the bounded event queue to overflow (3.7% of the opens dropped);
//! here it only delays what it produces (a walk waits for its listing; a prediction made
//! meanwhile is empty).
//!
//! Owns the thread and its bounded queue. Must never touch planner state: a chore owns what it
//! works on and answers through a channel of its own; a full queue refuses a chore rather than
//! wait (`dispose` then frees in place).

use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

/// Chores waiting: a few passes' worth of listings and frees; more means the helper is stuck
/// (a hung source's listing) and the planner goes on without.
const QUEUE: usize = 64;

/// Work for the helper thread.
pub type Chore = Box<dyn FnOnce() + Send>;

/// A handle on the helper thread; the thread ends when the last handle is dropped.
#[derive(Clone)]
pub struct Chores {
    /// `None`: chores run at once, on the caller's thread (unit tests).
    queue: Option<SyncSender<Chore>>,
}

impl Chores {
    /// Starts the helper thread (`prepfs-chores`); where it cannot start, chores run in place.
    pub fn start() -> Chores {
        let (tx, rx) = sync_channel::<Chore>(QUEUE);
        let started = std::thread::Builder::new()
            .name("prepfs-chores".into())
            .spawn(move || {
                for chore in rx {
                    chore();
                }
            });
        match started {
            Ok(_) => Chores { queue: Some(tx) },
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the planner's helper; it does its chores itself");
                Chores { queue: None }
            }
        }
    }

    /// Chores run at once, on the caller's thread.
    #[cfg(test)]
    pub fn inline() -> Chores {
        Chores { queue: None }
    }

    /// Hands `chore` to the helper; when its queue is full, the chore comes back undone (to be
    /// asked again, or dropped).
    pub fn run(&self, chore: Chore) -> Result<(), Chore> {
        match &self.queue {
            None => {
                chore();
                Ok(())
            }
            Some(queue) => match queue.try_send(chore) {
                Ok(()) => Ok(()),
                Err(TrySendError::Full(chore) | TrySendError::Disconnected(chore)) => Err(chore),
            },
        }
    }

    /// Frees `value` on the helper thread (here when its queue is full).
    pub fn dispose<T: Send + 'static>(&self, value: T) {
        if let Some(queue) = &self.queue
            && let Err(TrySendError::Full(chore) | TrySendError::Disconnected(chore)) =
                queue.try_send(Box::new(move || drop(value)))
        {
            drop(chore);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn a_chore_runs_on_the_helper_and_answers_through_its_channel() {
        let chores = Chores::start();
        let (tx, rx) = channel();
        let caller = std::thread::current().id();
        let asked = chores.run(Box::new(move || {
            let _ = tx.send(std::thread::current().id());
        }));
        assert!(asked.is_ok());
        let ran_on = rx.recv_timeout(Duration::from_secs(10)).expect("answered");
        assert_ne!(ran_on, caller);
    }

    #[test]
    fn a_full_queue_refuses_a_chore_instead_of_waiting() {
        let chores = Chores::start();
        let (hold, held) = channel::<()>();
        // The helper waits inside the first chore while the queue fills behind it.
        let asked = chores.run(Box::new(move || {
            let _ = held.recv_timeout(Duration::from_secs(30));
        }));
        assert!(asked.is_ok());
        let (ran, runs) = channel();
        let (mut refused, mut taken) = (None, 0);
        for _ in 0..=QUEUE + 1 {
            let ran = ran.clone();
            match chores.run(Box::new(move || {
                let _ = ran.send(());
            })) {
                Ok(()) => taken += 1,
                Err(chore) => refused = refused.or(Some(chore)),
            }
        }
        let refused = refused.expect("a full queue refuses");
        // Disposal with a full queue frees in place, at once.
        chores.dispose(vec![0u8; 1 << 20]);
        // What was refused comes back undone, and runs once asked again with room.
        drop(hold);
        let mut again = Some(refused);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while let Some(chore) = again.take() {
            again = chores.run(chore).err();
            assert!(std::time::Instant::now() < deadline, "the queue drains");
            std::thread::yield_now();
        }
        drop(ran);
        assert_eq!(
            runs.iter().count(),
            taken + 1,
            "every chore taken ran, once"
        );
    }
}
