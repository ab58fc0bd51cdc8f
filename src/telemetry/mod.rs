//! Telemetry: cheap, continuous measurements of the machine that policies read.
//!
//! Owns: the sampler thread and the latest figures it produced (today the machine's CPU idle
//! share from /proc/stat, sampled every 100 ms and smoothed over about a second). Readers get the
//! latest value with one atomic load. Must never sit on a request path, and never fail a mount:
//! when /proc cannot be read the figures stay at their neutral default.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Sampling period: /proc/stat costs ~25 µs to read, so 10 samples a second are free.
const PERIOD: Duration = Duration::from_millis(100);
/// Weight of a new sample in the moving average: ~1 s of memory at a 100 ms period.
const SMOOTHING: f64 = 0.2;

/// The latest machine figures, shared with every reader.
#[derive(Debug)]
pub struct Telemetry {
    /// Share of CPU time the whole machine spent idle recently, 0..=1, as f64 bits.
    cpu_idle: AtomicU64,
}

impl Default for Telemetry {
    fn default() -> Telemetry {
        // Until the first sample arrives, assume a half-busy machine: neither extreme.
        Telemetry {
            cpu_idle: AtomicU64::new(0.5f64.to_bits()),
        }
    }
}

impl Telemetry {
    /// Share of the machine's CPU time spent idle over about the last second (0..=1).
    pub fn cpu_idle(&self) -> f64 {
        f64::from_bits(self.cpu_idle.load(Ordering::Relaxed))
    }

    /// Sets the idle share (the sampler, and tests that need a given load).
    pub fn set_cpu_idle(&self, idle: f64) {
        self.cpu_idle
            .store(idle.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }
}

/// CPU time counters from the first line of /proc/stat: (idle incl. iowait, total), in ticks.
fn cpu_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already inside user).
    let total = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((idle, total))
}

/// The thread that keeps a `Telemetry` current; stops when dropped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling into `telemetry`. Without a thread (resource limits) the figures stay
    /// at their defaults and a warning is logged.
    pub fn start(telemetry: Arc<Telemetry>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("prepfs-telemetry".into())
            .spawn(move || sample(&telemetry, &flag))
            .inspect_err(|e| tracing::warn!(error = %e, "cannot start the telemetry sampler"))
            .ok();
        Sampler { stop, thread }
    }
}

fn sample(telemetry: &Telemetry, stop: &AtomicBool) {
    let mut last = cpu_ticks();
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(PERIOD);
        let now = cpu_ticks();
        if let (Some((idle0, total0)), Some((idle1, total1))) = (last, now)
            && total1 > total0
        {
            let idle = (idle1.saturating_sub(idle0)) as f64 / (total1 - total0) as f64;
            let smoothed = if first {
                idle
            } else {
                telemetry.cpu_idle() * (1.0 - SMOOTHING) + idle * SMOOTHING
            };
            telemetry.set_cpu_idle(smoothed);
            first = false;
        }
        last = now.or(last);
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampler_replaces_the_idle_share_with_a_measured_one() {
        let (idle, total) = cpu_ticks().expect("/proc/stat");
        assert!(idle <= total && total > 0);
        let telemetry = Arc::new(Telemetry::default());
        telemetry.set_cpu_idle(2.0);
        assert_eq!(telemetry.cpu_idle(), 1.0, "clamped");
        let sentinel = 0.123_456_789;
        telemetry.set_cpu_idle(sentinel);
        let sampler = Sampler::start(telemetry.clone());
        std::thread::sleep(PERIOD * 5);
        drop(sampler);
        let idle = telemetry.cpu_idle();
        assert!(idle != sentinel && (0.0..=1.0).contains(&idle), "{idle}");
    }
}
