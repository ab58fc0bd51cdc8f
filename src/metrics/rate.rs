//! `RateMeter`: events per second over the last few whole seconds, lock-free.
//!
//! Owns: the per-second ring and the window it averages. Must never lock or allocate when
//! counting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds averaged by `RateMeter::per_second` (the current, partial second is left out).
const RATE_WINDOW: u64 = 5;
/// Per-second buckets kept: the window plus the second being filled.
const RATE_BUCKETS: usize = RATE_WINDOW as usize + 1;

/// Events per second over the last few whole seconds, lock-free.
#[derive(Debug, Default)]
pub struct RateMeter {
    /// (second since the epoch, events in that second), one bucket per second modulo the ring.
    buckets: [(AtomicU64, AtomicU64); RATE_BUCKETS],
}

fn now_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl RateMeter {
    /// Counts one event now.
    pub fn tick(&self) {
        let second = now_second();
        let (stamp, count) = &self.buckets[(second % RATE_BUCKETS as u64) as usize];
        let seen = stamp.load(Ordering::Acquire);
        if seen != second
            && stamp
                .compare_exchange(seen, second, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // This thread turned the bucket over; events racing the reset may be lost (stats).
            count.store(0, Ordering::Release);
        }
        count.fetch_add(1, Ordering::AcqRel);
    }

    /// Mean events per second over the last `RATE_WINDOW` whole seconds.
    pub fn per_second(&self) -> f64 {
        let now = now_second();
        let total: u64 = self
            .buckets
            .iter()
            .filter(|(stamp, _)| {
                let s = stamp.load(Ordering::Acquire);
                s < now && now - s <= RATE_WINDOW
            })
            .map(|(_, count)| count.load(Ordering::Acquire))
            .sum();
        total as f64 / RATE_WINDOW as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_meter_counts_only_whole_recent_seconds() {
        let meter = RateMeter::default();
        for _ in 0..10 {
            meter.tick();
        }
        // Events of the current second are not in the window yet.
        let now = now_second();
        assert!(meter.per_second() <= 10.0 / RATE_WINDOW as f64);
        let (stamp, count) = &meter.buckets[((now - 1) % RATE_BUCKETS as u64) as usize];
        stamp.store(now - 1, Ordering::Release);
        count.store(25, Ordering::Release);
        assert!(meter.per_second() >= 25.0 / RATE_WINDOW as f64);
    }
}
