//! What the scheduler sees and how it is scored: an observation (`control::observation`) as a
//! normalised state vector, and the reward.
//!
//! Owns: the state schema and `SCHEMA_VERSION` (of the state and of `control::action`'s
//! schema), shared by the mount (observations from telemetry) and the simulator (observations
//! from its model), so a policy trained in one acts in the other. Must never read the machine
//! itself: `telemetry` and `sim` fill observations.

use crate::control::action::{Action, LOGITS};
use crate::control::observation::Observation;

/// Version of the state and action schema. A policy trained on another version is refused.
pub const SCHEMA_VERSION: u32 = 1;

/// Features taken from an observation (the rest of the state is the current action, one-hot).
pub const FEATURES: usize = 16;
/// Length of the state vector.
pub const STATE: usize = FEATURES + LOGITS;

/// `x` on a log scale from `lo` (0) to `hi` (1), clamped; 0 and below map to 0.
fn log_scale(x: f64, lo: f64, hi: f64) -> f32 {
    if x <= lo {
        return 0.0;
    }
    ((x.ln() - lo.ln()) / (hi.ln() - lo.ln())).clamp(0.0, 1.0) as f32
}

fn unit(x: f64) -> f32 {
    if x.is_finite() {
        x.clamp(0.0, 1.0) as f32
    } else {
        0.0
    }
}

/// The normalised features of `obs`, each in 0..=1 (non-finite inputs become 0).
pub fn features(obs: &Observation) -> [f32; FEATURES] {
    let gpu = obs.gpu.unwrap_or_default();
    [
        unit(obs.cpu_busy),
        unit(obs.cpu_prepfs),
        unit(obs.memory_available),
        if obs.gpu.is_some() { 1.0 } else { 0.0 },
        unit(gpu.busy),
        unit(gpu.memory_free),
        // 1 MB/s .. 10 GB/s
        log_scale(obs.source_bytes_per_s, 1e6, 1e10),
        // 10 µs .. 1 s
        log_scale(obs.source_latency_s, 1e-5, 1.0),
        // 1 .. 100k requests/s
        log_scale(obs.request_rate, 1.0, 1e5),
        // 10 µs .. 10 s
        log_scale(obs.latency_p50_s, 1e-5, 10.0),
        log_scale(obs.latency_p99_s, 1e-5, 10.0),
        unit(obs.stall_share),
        unit(obs.render_queue),
        unit(obs.prefetch_queue),
        unit(obs.cache_fill),
        unit(obs.hit_rate),
    ]
}

/// The state vector of `obs`: features, then the knobs as they are (the current action,
/// one-hot).
pub fn state_vector(obs: &Observation, current: &Action) -> [f32; STATE] {
    let mut out = [0.0; STATE];
    out[..FEATURES].copy_from_slice(&features(obs));
    out[FEATURES..].copy_from_slice(&current.one_hot());
    out
}

/// The reward's weights (`--reward-alpha`, `--reward-beta`, `--stall-penalty`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RewardWeights {
    /// Per millisecond of median load latency.
    pub alpha: f64,
    /// Per unit of CPU-GPU imbalance |u_gpu - u_cpu| (only with a GPU).
    pub beta: f64,
    /// Per unit of stall share (time consumers waited on prepfs per second).
    pub stall: f64,
}

impl Default for RewardWeights {
    /// alpha = 1/ms: latency is what the trainer feels. beta = 1: a fully lopsided CPU/GPU split
    /// costs as much as 1 ms of latency, enough to break ties towards balance without hiding
    /// latency. stall = 10: a second of waiting per second (the loader starved) costs as much
    /// as 10 ms of added latency on every request, so the policy never trades stalls for balance.
    fn default() -> RewardWeights {
        RewardWeights {
            alpha: 1.0,
            beta: 1.0,
            stall: 10.0,
        }
    }
}

/// Latency counted by the reward is capped here, so one pathological interval does not swamp
/// the value function.
const LATENCY_CAP_MS: f64 = 1000.0;

impl RewardWeights {
    /// The reward of an interval that ended in `obs`:
    /// `-(alpha * latency_ms + beta * |u_gpu - u_cpu|) - stall * stall_share`.
    /// The balance term only counts with a GPU: without one, the CPU is the only place work can
    /// run and "imbalance" would just punish doing the work.
    pub fn reward(&self, obs: &Observation) -> f64 {
        let latency_ms = (obs.latency_p50_s * 1e3).clamp(0.0, LATENCY_CAP_MS);
        let imbalance = obs
            .gpu
            .map_or(0.0, |g| (g.busy - obs.cpu_busy).abs().clamp(0.0, 1.0));
        let stall = obs.stall_share.clamp(0.0, 1.0);
        let r = -(self.alpha * latency_ms + self.beta * imbalance) - self.stall * stall;
        if r.is_finite() { r } else { -LATENCY_CAP_MS }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::observation::GpuObservation;

    #[test]
    fn features_are_bounded_whatever_the_input() {
        let wild = Observation {
            cpu_busy: 7.0,
            cpu_prepfs: f64::NAN,
            source_bytes_per_s: 1e15,
            source_latency_s: -3.0,
            latency_p50_s: f64::INFINITY,
            ..Observation::default()
        };
        let s = state_vector(&wild, &Action::default());
        assert!(s.iter().all(|x| (0.0..=1.0).contains(x)), "{s:?}");
        assert_eq!(s[0], 1.0);
        assert_eq!(s[1], 0.0);
        assert_eq!(s[6], 1.0);
        assert_eq!(s[3], 0.0, "no GPU");
        let mid = Observation {
            source_bytes_per_s: 1e8,
            ..Observation::default()
        };
        assert!(
            (features(&mid)[6] - 0.5).abs() < 1e-6,
            "1e8 is halfway on 1e6..1e10"
        );
    }

    #[test]
    fn reward_is_latency_balance_and_stall() {
        let w = RewardWeights {
            alpha: 2.0,
            beta: 3.0,
            stall: 5.0,
        };
        let obs = Observation {
            cpu_busy: 0.9,
            latency_p50_s: 0.004,
            stall_share: 0.5,
            ..Observation::default()
        };
        // No GPU: -(2 * 4) - 5 * 0.5
        assert!((w.reward(&obs) - (-10.5)).abs() < 1e-9);
        let with_gpu = Observation {
            gpu: Some(GpuObservation {
                busy: 0.1,
                memory_free: 1.0,
            }),
            ..obs
        };
        // -(2 * 4 + 3 * 0.8) - 2.5
        assert!((w.reward(&with_gpu) - (-12.9)).abs() < 1e-9);
        let broken = Observation {
            latency_p50_s: f64::NAN,
            ..obs
        };
        assert!(w.reward(&broken).is_finite());
    }
}
