//! The actor-critic network as plain numbers, and its forward pass by hand.
//!
//! Owns: the weights' layout (shared with `ppo`, which trains them with burn, and `artifact`,
//! which stores them) and the inference the mount runs every decision: about 7k multiply-adds,
//! well under a microsecond, with no allocation and no autodiff graph (burn's per-call overhead
//! and its autodiff bookkeeping stay out of the mount's decision loop). Must never train.

use super::state::STATE;
use crate::control::action::LOGITS;

/// Width of the two hidden layers: small enough that a decision costs microseconds, large
/// enough to carve the state space into the handful of regimes the knobs need.
pub const HIDDEN: usize = 64;

/// A dense layer: `y = x · W + b`, `W` row-major `[inputs, outputs]` (burn's layout).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Dense {
    /// Input width.
    pub inputs: usize,
    /// Output width.
    pub outputs: usize,
    /// `inputs * outputs` weights, row-major.
    pub weight: Vec<f32>,
    /// `outputs` biases.
    pub bias: Vec<f32>,
}

impl Dense {
    /// Whether the shapes agree and every number is finite.
    fn is_valid(&self, inputs: usize, outputs: usize) -> bool {
        self.inputs == inputs
            && self.outputs == outputs
            && self.weight.len() == inputs * outputs
            && self.bias.len() == outputs
            && self.weight.iter().chain(&self.bias).all(|w| w.is_finite())
    }

    fn forward(&self, x: &[f32], y: &mut [f32]) {
        y.copy_from_slice(&self.bias);
        for (xi, row) in x.iter().zip(self.weight.chunks_exact(self.outputs)) {
            for (yj, w) in y.iter_mut().zip(row) {
                *yj += xi * w;
            }
        }
    }
}

/// Shared tanh trunk, then a policy head (logits) and a value head.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Network {
    /// STATE -> HIDDEN, tanh.
    pub l1: Dense,
    /// HIDDEN -> HIDDEN, tanh.
    pub l2: Dense,
    /// HIDDEN -> LOGITS.
    pub policy: Dense,
    /// HIDDEN -> 1.
    pub value: Dense,
}

/// Why a network cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "network shape does not match the schema (state {STATE}, hidden {HIDDEN}, logits {LOGITS}) or holds non-finite weights"
)]
pub struct InvalidNetwork;

impl Network {
    /// Checks shapes and finiteness.
    pub fn validate(&self) -> Result<(), InvalidNetwork> {
        let ok = self.l1.is_valid(STATE, HIDDEN)
            && self.l2.is_valid(HIDDEN, HIDDEN)
            && self.policy.is_valid(HIDDEN, LOGITS)
            && self.value.is_valid(HIDDEN, 1);
        if ok { Ok(()) } else { Err(InvalidNetwork) }
    }

    /// Logits and the value estimate of `state`.
    pub fn forward(&self, state: &[f32; STATE]) -> ([f32; LOGITS], f32) {
        let mut h1 = [0.0; HIDDEN];
        let mut h2 = [0.0; HIDDEN];
        self.l1.forward(state, &mut h1);
        h1.iter_mut().for_each(|v| *v = v.tanh());
        self.l2.forward(&h1, &mut h2);
        h2.iter_mut().for_each(|v| *v = v.tanh());
        let mut logits = [0.0; LOGITS];
        let mut value = [0.0; 1];
        self.policy.forward(&h2, &mut logits);
        self.value.forward(&h2, &mut value);
        (logits, value[0])
    }
}

/// Per-feature shift and scale applied to the state before the network (`(x - mean) / std`),
/// measured on the states seen in training.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Normalisation {
    /// `STATE` means.
    pub mean: Vec<f32>,
    /// `STATE` standard deviations (each at least `MIN_STD`).
    pub std: Vec<f32>,
}

/// Floor of a feature's standard deviation: a constant feature (one-hot of a masked option)
/// must not blow up to infinity.
pub const MIN_STD: f32 = 1e-2;

impl Normalisation {
    /// No change: mean 0, std 1.
    pub fn identity() -> Normalisation {
        Normalisation {
            mean: vec![0.0; STATE],
            std: vec![1.0; STATE],
        }
    }

    /// From the states seen (identity when there are none).
    pub fn fit(states: &[[f32; STATE]]) -> Normalisation {
        if states.is_empty() {
            return Normalisation::identity();
        }
        let n = states.len() as f64;
        let mut mean = vec![0.0f32; STATE];
        let mut std = vec![0.0f32; STATE];
        for i in 0..STATE {
            let m = states.iter().map(|s| f64::from(s[i])).sum::<f64>() / n;
            let var = states
                .iter()
                .map(|s| (f64::from(s[i]) - m).powi(2))
                .sum::<f64>()
                / n;
            mean[i] = m as f32;
            std[i] = (var.sqrt() as f32).max(MIN_STD);
        }
        Normalisation { mean, std }
    }

    /// Whether it has `STATE` finite entries and positive scales.
    pub fn is_valid(&self) -> bool {
        self.mean.len() == STATE
            && self.std.len() == STATE
            && self.mean.iter().all(|m| m.is_finite())
            && self.std.iter().all(|s| s.is_finite() && *s >= MIN_STD)
    }

    /// The normalised state.
    pub fn apply(&self, state: &[f32; STATE]) -> [f32; STATE] {
        let mut out = *state;
        for ((x, m), s) in out.iter_mut().zip(&self.mean).zip(&self.std) {
            *x = (*x - m) / s;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(inputs: usize, outputs: usize, w: f32) -> Dense {
        Dense {
            inputs,
            outputs,
            weight: vec![w; inputs * outputs],
            bias: vec![0.5; outputs],
        }
    }

    #[test]
    fn forward_matches_a_hand_computation() {
        let net = Network {
            l1: dense(STATE, HIDDEN, 0.0),
            l2: dense(HIDDEN, HIDDEN, 0.01),
            policy: dense(HIDDEN, LOGITS, 1.0),
            value: dense(HIDDEN, 1, -1.0),
        };
        net.validate().unwrap();
        let (logits, value) = net.forward(&[1.0; STATE]);
        let h1 = 0.5f32.tanh();
        let h2 = (0.5 + HIDDEN as f32 * 0.01 * h1).tanh();
        let expect = 0.5 + HIDDEN as f32 * h2;
        assert!(
            logits.iter().all(|l| (l - expect).abs() < 1e-4),
            "{logits:?}"
        );
        assert!((value - (0.5 - HIDDEN as f32 * h2)).abs() < 1e-4);
        let mut bad = net.clone();
        bad.value.bias[0] = f32::NAN;
        assert_eq!(bad.validate(), Err(InvalidNetwork));
        let mut wrong = net;
        wrong.l1 = dense(STATE - 1, HIDDEN, 0.0);
        assert_eq!(wrong.validate(), Err(InvalidNetwork));
    }

    #[test]
    fn normalisation_centres_and_scales_with_a_floor() {
        let mut a = [0.0; STATE];
        let mut b = [0.0; STATE];
        a[0] = 1.0;
        b[0] = 3.0;
        let n = Normalisation::fit(&[a, b]);
        assert!(n.is_valid());
        assert_eq!((n.mean[0], n.std[0]), (2.0, 1.0));
        assert_eq!(n.std[1], MIN_STD, "constant features get the floor");
        assert_eq!(n.apply(&b)[0], 1.0);
        assert_eq!(Normalisation::fit(&[]), Normalisation::identity());
    }
}
