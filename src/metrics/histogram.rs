//! `Histogram`: a lock-free log-linear latency histogram (16 sub-buckets per power of two).
//!
//! Owns: bucketing and quantile estimation. A bucket is 1/16 of its power of two wide (4.4% at
//! most of its values) and a quantile is interpolated by rank inside its bucket, so an estimate
//! is within a few percent of the truth and follows a distribution that shifts by less than a
//! bucket: the scheduler's reward and its guard compare intervals whose latencies differ by 5%
//! (with 4 sub-buckets, 19% wide, two such intervals read the same). Must never allocate or lock
//! when recording.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two, as bits.
const SUB_BITS: u32 = 4;
/// Sub-buckets per power of two.
const SUB: u32 = 1 << SUB_BITS;
/// Buckets cover 1 ns .. 2^64 ns.
const BUCKETS: usize = 64 * SUB as usize;

/// Latency distribution of one kind of operation.
#[derive(Debug)]
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
        }
    }
}

/// The bucket of `ns`: each value below `SUB` has its own; above, `SUB` per power of two.
fn bucket_of(ns: u64) -> usize {
    if ns < u64::from(SUB) {
        return ns as usize;
    }
    let msb = 63 - ns.leading_zeros();
    let sub = (ns >> (msb - SUB_BITS)) & u64::from(SUB - 1);
    (msb * SUB + sub as u32) as usize
}

/// The lowest value of bucket `b` (the numbers between the one-value buckets and the first
/// power of two's are no bucket's: they start where the one-value buckets end), or for `b` one
/// past the last, where the last ends.
fn bucket_low(b: usize) -> u64 {
    let b = b as u32;
    if b < SUB {
        return u64::from(b);
    }
    let (msb, sub) = (b / SUB, u64::from(b % SUB));
    if msb < SUB_BITS {
        return u64::from(SUB);
    }
    if msb >= u64::BITS {
        // The end of the last bucket.
        return u64::MAX;
    }
    (1u64 << msb) | (sub << (msb - SUB_BITS))
}

impl Histogram {
    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(ns).min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Number of recorded durations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Estimated `q` quantile (0..1) in microseconds; 0 when empty.
    pub fn quantile_us(&self, q: f64) -> f64 {
        quantile_us(&self.counts(), q)
    }

    /// The bucket counts now: subtract an earlier snapshot to get a window's distribution.
    pub fn counts(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }
}

/// Estimated `q` quantile (0..1), in microseconds, of bucket `counts` (from `Histogram::counts`,
/// or a difference of two); 0 when empty.
pub fn quantile_us(counts: &[u64], q: f64) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = ((q * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            // The rank's place among the bucket's values, taken as spread evenly over it.
            let (lo, hi) = (bucket_low(i) as f64, bucket_low(i + 1) as f64);
            let place = (rank - (seen - c)) as f64 - 0.5;
            return (lo + (hi - lo) * place / *c as f64) / 1000.0;
        }
    }
    0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_land_within_a_bucket_of_the_truth() {
        let h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile_us(0.5);
        let p99 = h.quantile_us(0.99);
        assert!((400.0..=640.0).contains(&p50), "p50 {p50}");
        assert!((800.0..=1250.0).contains(&p99), "p99 {p99}");
        assert_eq!(h.count(), 1000);
        let before = h.counts();
        for _ in 0..10 {
            h.record(Duration::from_millis(50));
        }
        let window: Vec<u64> = h.counts().iter().zip(&before).map(|(a, b)| a - b).collect();
        let p50 = quantile_us(&window, 0.5);
        assert!((40_000.0..=64_000.0).contains(&p50), "window p50 {p50}");
    }

    /// Two intervals 4.5% apart, inside the same 19%-wide bucket of the former 4 sub-buckets:
    /// the estimates are each near its truth and tell them apart.
    #[test]
    fn a_shift_smaller_than_a_bucket_moves_the_estimate_with_it() {
        let p50 = |from_us: u64| {
            let h = Histogram::default();
            for i in 0..200 {
                h.record(Duration::from_micros(from_us + i));
            }
            h.quantile_us(0.5)
        };
        let (a, b) = (p50(2_100), p50(2_200));
        assert!(
            (a / 2_200.0 - 1.0).abs() < 0.02,
            "p50 {a} of 2,100-2,299 us"
        );
        assert!(
            (b / 2_300.0 - 1.0).abs() < 0.02,
            "p50 {b} of 2,200-2,399 us"
        );
        assert!(b > a * 1.03, "{a} vs {b}");
    }

    #[test]
    fn buckets_are_monotonic() {
        let mut last = 0;
        for ns in [
            0u64,
            1,
            3,
            4,
            5,
            7,
            8,
            15,
            16,
            17,
            31,
            32,
            100,
            1 << 20,
            u64::MAX,
        ] {
            let b = bucket_of(ns);
            assert!(b >= last);
            assert!(bucket_low(b) <= ns, "{ns}");
            assert!(b + 1 == BUCKETS || ns < bucket_low(b + 1), "{ns}");
            last = b;
        }
    }
}
