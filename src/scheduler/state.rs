//! What the scheduler sees and how it is scored: an observation (`control::observation`) as a
//! normalised state vector, and the reward.
//!
//! Owns: the state schema, one table (`FEATURE_TABLE`: each feature's name and how it is taken
//! from an observation), and `SCHEMA_VERSION`, derived from it and from `control::action`'s
//! table, shared by the mount (observations from telemetry) and the simulator (observations
//! from its model), so a policy trained in one acts in the other. Adding a feature is one entry
//! here (and the observation's field it reads). Must never read the machine itself: `telemetry`
//! and `sim` fill observations.

use crate::control::action::{Action, HEADS, LOGITS};
use crate::control::observation::Observation;

/// One feature of the state: its name (part of the schema) and its value, in 0..=1 (non-finite
/// inputs become 0).
pub struct Feature {
    /// A stable snake_case name.
    pub name: &'static str,
    /// The normalised value of an observation.
    pub of: fn(&Observation) -> f32,
}

/// The features taken from an observation, in state order (the rest of the state is the
/// current action, one-hot).
pub const FEATURE_TABLE: &[Feature] = &[
    Feature {
        name: "cpu_busy",
        of: |o| unit(o.cpu_busy),
    },
    Feature {
        name: "cpu_prepfs",
        of: |o| unit(o.cpu_prepfs),
    },
    Feature {
        name: "memory_available",
        of: |o| unit(o.memory_available),
    },
    Feature {
        name: "gpu_present",
        of: |o| if o.gpu.is_some() { 1.0 } else { 0.0 },
    },
    Feature {
        name: "gpu_busy",
        of: |o| unit(o.gpu.unwrap_or_default().busy),
    },
    Feature {
        name: "gpu_memory_free",
        of: |o| unit(o.gpu.unwrap_or_default().memory_free),
    },
    // 1 MB/s .. 10 GB/s
    Feature {
        name: "source_bytes_per_s",
        of: |o| log_scale(o.source_bytes_per_s, 1e6, 1e10),
    },
    // 10 µs .. 1 s
    Feature {
        name: "source_latency_s",
        of: |o| log_scale(o.source_latency_s, 1e-5, 1.0),
    },
    // 1 .. 100k requests/s
    Feature {
        name: "request_rate",
        of: |o| log_scale(o.request_rate, 1.0, 1e5),
    },
    // 10 µs .. 10 s
    Feature {
        name: "latency_p50_s",
        of: |o| log_scale(o.latency_p50_s, 1e-5, 10.0),
    },
    Feature {
        name: "latency_p99_s",
        of: |o| log_scale(o.latency_p99_s, 1e-5, 10.0),
    },
    Feature {
        name: "stall_share",
        of: |o| unit(o.stall_share),
    },
    Feature {
        name: "render_queue",
        of: |o| unit(o.render_queue),
    },
    Feature {
        name: "prefetch_queue",
        of: |o| unit(o.prefetch_queue),
    },
    Feature {
        name: "cache_fill",
        of: |o| unit(o.cache_fill),
    },
    Feature {
        name: "hit_rate",
        of: |o| unit(o.hit_rate),
    },
];

/// Features taken from an observation.
pub const FEATURES: usize = FEATURE_TABLE.len();
/// Length of the state vector.
pub const STATE: usize = FEATURES + LOGITS;

/// Version of the state and action schema: a hash (FNV-1a, 32 bits) of every head's name and
/// options' names and every feature's name, in order, so that no change to either table can
/// leave it unchanged. A policy trained on another version is refused.
pub const SCHEMA_VERSION: u32 = {
    const fn mix(mut hash: u32, text: &str) -> u32 {
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            hash = (hash ^ bytes[i] as u32).wrapping_mul(0x0100_0193);
            i += 1;
        }
        // A separator, so that ("ab", "c") and ("a", "bc") differ.
        (hash ^ 0xff).wrapping_mul(0x0100_0193)
    }
    let mut hash = 0x811c_9dc5;
    let mut h = 0;
    while h < HEADS.len() {
        hash = mix(hash, HEADS[h].name);
        let mut o = 0;
        while o < HEADS[h].options.len() {
            hash = mix(hash, HEADS[h].options[o]);
            o += 1;
        }
        h += 1;
    }
    hash = mix(hash, "|");
    let mut f = 0;
    while f < FEATURE_TABLE.len() {
        hash = mix(hash, FEATURE_TABLE[f].name);
        f += 1;
    }
    hash
};

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
    std::array::from_fn(|i| (FEATURE_TABLE[i].of)(obs))
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

    /// Names are what the schema version is made of: each names one thing.
    #[test]
    fn the_schema_tables_name_each_head_option_and_feature_once() {
        fn unique(names: impl Iterator<Item = &'static str>) -> bool {
            let mut names: Vec<_> = names.collect();
            let n = names.len();
            names.sort_unstable();
            names.dedup();
            names.len() == n && names.iter().all(|s| !s.is_empty())
        }
        assert!(unique(FEATURE_TABLE.iter().map(|f| f.name)));
        assert!(unique(HEADS.iter().map(|h| h.name)));
        assert!(HEADS.iter().all(|h| unique(h.options.iter().copied())));
        assert_eq!(STATE, FEATURES + LOGITS);
        assert_ne!(
            SCHEMA_VERSION, 1,
            "derived, not the hand-kept version of old"
        );
    }

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
