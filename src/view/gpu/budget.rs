//! `Budget`: the GPU memory prepfs may hold, a hard cap (`--gpu-mem`) charged before every
//! allocation, by the CUDA buffers and by nvJPEG's own allocations alike.
//!
//! Owns the count and the cap, and reports the count through the GPU counters. Must never
//! allocate anything itself, and never let a charge pass the cap.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::GpuCounters;

/// GPU memory prepfs may hold: a hard cap, charged before every allocation.
#[derive(Debug)]
pub struct Budget {
    cap: u64,
    used: AtomicU64,
    counters: Arc<GpuCounters>,
}

impl Budget {
    /// A budget of `cap` bytes, reported through `counters`.
    pub fn new(cap: u64, counters: Arc<GpuCounters>) -> Budget {
        Budget {
            cap,
            used: AtomicU64::new(0),
            counters,
        }
    }

    /// Charges `bytes` if they fit under the cap.
    pub fn take(&self, bytes: u64) -> bool {
        let ok = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(bytes).filter(|n| *n <= self.cap)
            })
            .is_ok();
        self.counters
            .memory_used
            .store(self.used.load(Ordering::Relaxed), Ordering::Relaxed);
        ok
    }

    /// Credits `bytes` back.
    pub fn give(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
        self.counters
            .memory_used
            .store(self.used.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_what_passes_the_cap_and_credits_frees() {
        let counters = Arc::new(GpuCounters::default());
        let budget = Budget::new(100, counters.clone());
        assert!(budget.take(60));
        assert!(!budget.take(41), "60 + 41 > 100");
        assert!(budget.take(40));
        assert_eq!(counters.memory_used.load(Ordering::Relaxed), 100);
        budget.give(60);
        assert!(budget.take(50));
        assert_eq!(counters.memory_used.load(Ordering::Relaxed), 90);
    }
}
