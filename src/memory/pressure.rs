//! The pressure watch: notices memory running short before the kernel's OOM killer does, and
//! makes the budget give back what can be fetched again.
//!
//! Owns: one thread (`prepfs-memory`) that every `EVERY` reads the daemon's cgroup (its memory
//! that the kernel cannot reclaim, against its limit) or, outside a limited cgroup, the host's
//! available memory, and turns the budget's pressure on when little is left and off once there is
//! room again (with hysteresis) or memory has not been short for 3 s; when memory is still short
//! a beat after everything was shed, it asks the budget to give back what is kept for good
//! (`MemoryBudget::give_back`: the RAM tier's unopened cached files) up to the room pressure ends
//! at. Since pressure the budget admits only into room this watch has seen free
//! (`MemoryBudget::room_seen`, short of where pressure would begin), so a co-tenant that keeps
//! its memory does not make pressure come and go. On the same
//! beat it hands freed heap pages back to the kernel when `heap::Trimmer` says so, and as
//! pressure begins or cached files are given back (after shedding, so the shed bytes leave the
//! process). Must never block anything but itself (a trim holds each allocator arena's lock in
//! turn, so an allocating thread may wait that long: 52-66 ms for a heap of a million small
//! blocks, measured outside prepfs), and never take memory back from a reader: shedding is the
//! budget's, and it only drops what nobody is using.

use std::collections::VecDeque;
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
/// Since pressure, admission takes only room seen beyond this much left: halfway between where
/// pressure begins and ends ...
const ROOM_LEFT: u64 = (ON_LEFT + OFF_LEFT) / 2;
/// ... at every beat of the last `ROOM_BEATS` (3 s): work in flight (reads, renders) comes and
/// goes within them, so room seen between two renders is not taken and then missed at the next.
const ROOM_BEATS: usize = 30;

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

/// Whether pressure holds, given what is `left`, whether it held before, and whether memory was
/// not short at any of the last `ROOM_BEATS` beats (`calm`). Pressure that shed what it could
/// ends then, though less than `OFF_LEFT` is free: the ceiling since pressure keeps admission out
/// of the room memory lacks, while pressure held on paused admission for good (measured: a run of
/// the epochs bench sat at 63 MiB left with pressure on for four epochs, the cache 26 MB short of
/// its slice).
fn pressing(left: u64, before: bool, calm: bool) -> bool {
    if before {
        left < OFF_LEFT && !(calm && left >= ON_LEFT)
    } else {
        left < ON_LEFT
    }
}

/// What the watch remembers from beat to beat.
#[derive(Default)]
struct Watch {
    /// Whether pressure holds.
    pressing: bool,
    /// Memory left at the last `ROOM_BEATS` beats, oldest first.
    recent: VecDeque<u64>,
}

impl Watch {
    /// One beat, `read` telling how much memory is left: tells `budget` what changed; whether
    /// the heap should be trimmed (`trim`: already due).
    fn beat(&mut self, budget: &MemoryBudget, read: &dyn Fn() -> Option<u64>, trim: bool) -> bool {
        let Some(mut left) = read() else {
            return trim;
        };
        let mut trim = trim;
        if !self.pressing && left < ON_LEFT {
            // Heap the allocator kept after renders and reads counts as used: it goes back
            // first, and pressure begins only if that was not enough (it made one-beat pressure
            // about once a second that shed nothing, while a co-tenant held its memory).
            budget.trim_heap();
            trim = false;
            left = read().unwrap_or(left);
        }
        budget.saw_left(left);
        let calm = self.recent.len() == ROOM_BEATS && self.recent.iter().all(|&l| l >= ON_LEFT);
        let now = pressing(left, self.pressing, calm);
        if now != self.pressing {
            budget.set_pressure(now);
            trim |= now;
        } else if now && left < ON_LEFT {
            // Still short a beat after everything was shed: what is kept for good goes too, up
            // to the room pressure ends at.
            trim |= budget.give_back(OFF_LEFT - left) > 0;
        }
        self.pressing = now;
        if self.recent.len() == ROOM_BEATS {
            self.recent.pop_front();
        }
        self.recent.push_back(left);
        if !now {
            let least = self.recent.iter().copied().min().unwrap_or(left);
            budget.room_seen(least.saturating_sub(ROOM_LEFT));
        }
        trim
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
                let mut watch = Watch::default();
                let mut trimmer = Trimmer::default();
                while !flag.load(Ordering::Relaxed) {
                    let due = trimmer.due(budget.heap_charged());
                    if watch.beat(&budget, &|| left(cgroup.as_ref()), due) {
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
    use crate::memory::{MemoryPlan, Shed, Use};

    #[test]
    fn pressure_turns_on_near_the_limit_and_off_with_room_again() {
        assert!(!pressing(OFF_LEFT, false, false));
        assert!(pressing(ON_LEFT - 1, false, false));
        assert!(
            pressing(ON_LEFT + 1, true, false),
            "hysteresis: still on until OFF_LEFT"
        );
        assert!(!pressing(OFF_LEFT, true, false));
        assert!(left(None).is_some(), "the host's memory is readable");
    }

    const MIB: u64 = 1 << 20;

    /// Memory that was short once and then not, though less than `OFF_LEFT` stays free (what
    /// a transient spike leaves, or a co-tenant that gave back part of what it took): pressure
    /// ends within 3 s, and admission takes the room seen beyond `ROOM_LEFT` (pressure used to
    /// hold on, admission paused, for as long as memory stayed in that band).
    #[test]
    fn pressure_ends_once_memory_is_no_longer_short_though_less_than_its_end_is_free() {
        let (limit, daemon_own) = (400 * MIB, 30 * MIB);
        let budget = MemoryBudget::new(MemoryPlan {
            cache: 300 * MIB,
            staging: 0,
            work: 40 * MIB,
        });
        let mut cached = 0;
        while cached < 250 * MIB && budget.admit(Use::Cache, MIB) {
            cached += MIB;
        }
        let mut watch = Watch::default();
        let mut beat = |co_tenant: u64| {
            let left = || Some(limit - daemon_own - co_tenant - budget.used(Use::Cache));
            watch.beat(&budget, &left, false);
            // The readers' misses fill the cache as far as admission lets them.
            while budget.admit(Use::Cache, MIB) {}
            watch.pressing
        };
        assert!(beat(100 * MIB), "20 MiB left: pressure");
        // 63 MiB left from now on: no longer short, not yet OFF_LEFT.
        let beats = (1..=100).find(|_| !beat(57 * MIB));
        assert!(
            beats.is_some_and(|n| n <= ROOM_BEATS + 1),
            "pressure ended after {beats:?} beats"
        );
        for _ in 0..40 {
            assert!(!beat(57 * MIB), "pressure stays off");
        }
        let g = budget.gauges();
        assert_eq!(g.pressure_events, 1);
        assert_eq!(
            g.used[Use::Cache as usize],
            265 * MIB,
            "admission took the room beyond ROOM_LEFT (63 - 48 MiB), no more"
        );
        assert_eq!(g.left, ROOM_LEFT);
    }

    /// A RAM tier: holds what it admitted, gives back whole 24 MiB files when asked.
    struct Tier {
        budget: Arc<MemoryBudget>,
        held: parking_lot::Mutex<u64>,
    }

    impl Shed for Tier {
        fn shed(&self) -> u64 {
            0
        }

        fn give_back(&self, bytes: u64) -> u64 {
            let mut held = self.held.lock();
            let n = bytes.next_multiple_of(24 * MIB).min(*held);
            *held -= n;
            self.budget.release(Use::Cache, n);
            n
        }
    }

    /// A co-tenant in the daemon's cgroup takes memory and keeps it, while renders come and go:
    /// pressure begins once, cached files are given back, and the readers' misses do not fill
    /// the cache again into room that the next render needs (before, pressure came and went
    /// every other beat, shedding or giving back the same data and fetching it again); once the
    /// co-tenant leaves, the cache fills its slice again.
    #[test]
    fn a_co_tenant_that_keeps_its_memory_does_not_make_pressure_come_and_go() {
        let (limit, daemon_own) = (400 * MIB, 30 * MIB);
        let plan = MemoryPlan {
            cache: 300 * MIB,
            staging: 0,
            work: 40 * MIB,
        };
        let budget = MemoryBudget::new(plan);
        let tier = Arc::new(Tier {
            budget: budget.clone(),
            held: parking_lot::Mutex::new(0),
        });
        let shed: Arc<dyn Shed> = tier.clone();
        budget.add_shed(Use::Cache, Arc::downgrade(&shed));
        let mut watch = Watch::default();
        let mut beat_no = 0;
        // Each beat: the readers' misses fill the cache as far as admission lets them, a
        // 30 MiB render is in flight at every other beat, then the watch looks at what is left
        // under the cgroup's limit.
        let mut beats = |n: usize, co_tenant: u64| {
            for _ in 0..n {
                while budget.admit(Use::Cache, MIB) {
                    *tier.held.lock() += MIB;
                }
                beat_no += 1;
                let render = (beat_no % 2 == 0).then(|| budget.in_flight(30 * MIB));
                let left = || {
                    let charged: u64 = Use::ALL.iter().map(|&u| budget.used(u)).sum();
                    Some(limit.saturating_sub(daemon_own + co_tenant + charged))
                };
                watch.beat(&budget, &left, false);
                drop(render);
            }
            (budget.gauges(), watch.pressing)
        };
        let (calm, on) = beats(40, 0);
        assert!(!on);
        assert_eq!(calm.used[0], 300 * MIB, "the cache fills its slice");
        assert_eq!(calm.pressure_events, 0);
        let (early, _) = beats(10, 128 * MIB);
        assert_eq!(early.pressure_events, 1);
        assert!(early.given_back_bytes > 0, "cached files given back");
        let (hog, on) = beats(100, 128 * MIB);
        assert!(!on, "pressure ended");
        assert_eq!(
            hog.pressure_events, 1,
            "pressure began once while the co-tenant stayed"
        );
        assert_eq!(
            hog.given_back_bytes, early.given_back_bytes,
            "nothing more given back"
        );
        assert!(hog.held_back > 0, "admission held short of the slices");
        assert!(
            (ON_LEFT..OFF_LEFT + 30 * MIB).contains(&hog.left),
            "what was left at the last beat: {} MiB",
            hog.left / MIB
        );
        assert!(
            hog.used[0] >= 100 * MIB,
            "the cache kept what fits beside the co-tenant: {} MiB",
            hog.used[0] / MIB
        );
        let (after, on) = beats(40, 0);
        assert!(!on);
        assert_eq!(after.used[0], 300 * MIB, "the cache fills its slice again");
        assert_eq!(after.held_back, 0);
        assert_eq!(after.pressure_events, 1);
    }
}
