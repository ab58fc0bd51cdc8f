//! The pressure watch: notices memory running short before the kernel's OOM killer does, and
//! makes the budget give back what can be fetched again.
//!
//! Owns: one thread (`prepfs-memory`) that every `EVERY` reads the daemon's cgroup (its memory
//! that the kernel cannot reclaim, against its limit) or, outside a limited cgroup, the host's
//! available memory, and turns the budget's pressure on when little is left and off once there is
//! room again (with hysteresis, so it does not flap); when memory is still short a beat after
//! everything was shed, it asks the budget to give back what is kept for good
//! (`MemoryBudget::give_back`: the RAM tier's unopened cached files) up to the room pressure
//! ends at. On the same beat it hands freed heap pages back to the kernel when `heap::Trimmer`
//! says so, and as pressure begins or cached files are given back (after shedding, so
//! the shed bytes leave the process). Must never block anything but itself (a trim holds each
//! allocator arena's lock in turn, so an allocating thread may wait that long: 52-66 ms for a
//! heap of a million small blocks, measured outside prepfs), and never take memory back from a
//! reader: shedding is the budget's, and it only drops what nobody is using.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::MemoryBudget;
use super::heap::Trimmer;
use super::limits::{self, Cgroup, HEADROOM};

/// How often memory is read: a 1 MiB read in flight per thread cannot outrun 100 ms by much.
const EVERY: Duration = Duration::from_millis(100);
/// Pressure begins when less than this is left (half the headroom under a cgroup's limit) ...
const ON_LEFT: u64 = HEADROOM / 2;
/// ... and ends once twice as much is free again.
const OFF_LEFT: u64 = HEADROOM;

/// The running watch; stops when dropped.
pub struct PressureWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How much memory is left before the daemon would be killed: under a cgroup limit, the limit
/// less what the group cannot reclaim; else the host's available memory.
fn left(cgroup: Option<&Cgroup>) -> Option<u64> {
    match cgroup {
        Some(g) => g.usage().map(|u| g.limit.saturating_sub(u.unreclaimable)),
        None => limits::host().map(|h| h.available),
    }
}

/// Whether pressure holds, given what is `left` and whether it held before.
fn pressing(left: u64, before: bool) -> bool {
    if before {
        left < OFF_LEFT
    } else {
        left < ON_LEFT
    }
}

impl PressureWatch {
    /// Starts watching for `budget`, in the cgroup the process is in now.
    pub fn start(budget: Arc<MemoryBudget>) -> PressureWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let cgroup = limits::cgroup();
        let thread = std::thread::Builder::new()
            .name("prepfs-memory".into())
            .spawn(move || {
                let mut before = false;
                let mut trimmer = Trimmer::default();
                while !flag.load(Ordering::Relaxed) {
                    let mut trim = trimmer.due(budget.heap_charged());
                    if let Some(left) = left(cgroup.as_ref()) {
                        let now = pressing(left, before);
                        if now != before {
                            budget.set_pressure(now);
                            trim |= now;
                        } else if now && left < ON_LEFT {
                            // Still short a beat after everything was shed: what is kept for
                            // good goes too, up to the room pressure ends at.
                            trim |= budget.give_back(OFF_LEFT - left) > 0;
                        }
                        before = now;
                    }
                    if trim {
                        budget.trim_heap();
                    }
                    std::thread::sleep(EVERY);
                }
            })
            .inspect_err(|e| tracing::warn!(error = %e, "cannot start the memory pressure watch"))
            .ok();
        PressureWatch { stop, thread }
    }
}

impl Drop for PressureWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_turns_on_near_the_limit_and_off_with_room_again() {
        assert!(!pressing(OFF_LEFT, false));
        assert!(pressing(ON_LEFT - 1, false));
        assert!(
            pressing(ON_LEFT + 1, true),
            "hysteresis: still on until OFF_LEFT"
        );
        assert!(!pressing(OFF_LEFT, true));
        assert!(left(None).is_some(), "the host's memory is readable");
    }
}
