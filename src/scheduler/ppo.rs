//! Proximal policy optimisation of the scheduler's actor-critic, with burn.
//!
//! Owns: the burn twin of `network::Network` (same layers, same `[in, out]` weight layout, so
//! weights move both ways without transposing), generalised advantage estimation, the clipped
//! PPO loss over the factored action, and the `Learner` (model + Adam) that the trainer and the
//! mount's online fine-tuning drive. Transitions carry the state already normalised (what the
//! network saw), so the learner never knows about `Normalisation`. All randomness (weight
//! init, minibatch shuffles) comes from its own seeded RNG and burn's CPU backend runs on one
//! thread, so an update is bit-reproducible. Must never act (rollouts use the hand-written
//! `Network::forward`) and never panic on odd input: non-finite numbers are cleaned or dropped.

use burn::grad_clipping::GradientClippingConfig;
use burn::module::Param;
use burn::nn::Linear;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use burn::tensor::activation::log_softmax;

use super::logits::MASKED;
use super::network::{Dense, HIDDEN, Network};
use super::rng::Rng;
use super::state::STATE;
use crate::control::action::{Action, Head, LOGITS, Mask};

/// Heads of the factored action.
const HEADS: usize = Head::ALL.len();
/// Rewards (after scaling) are clamped to this, so one absurd sample cannot wreck the value head.
const REWARD_LIMIT: f32 = 1e4;
/// Log-probabilities below this belong to masked options: such transitions are dropped.
const MIN_LOG_PROB: f32 = -1e6;

/// PPO's hyperparameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PpoConfig {
    /// Adam's learning rate.
    pub lr: f64,
    /// Discount per interval: 0.9 looks about ten intervals (2 s) ahead, enough to see a
    /// placement or a prefetch depth pay off, short enough to learn fast.
    pub gamma: f64,
    /// GAE's bias-variance trade-off.
    pub lambda: f64,
    /// Ratio clip.
    pub clip: f64,
    /// Weight of the value loss.
    pub value_coef: f64,
    /// Weight of the entropy bonus.
    pub entropy_coef: f64,
    /// Passes over each batch.
    pub epochs: usize,
    /// Transitions per gradient step.
    pub minibatch: usize,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// Seed of weight init and minibatch shuffles.
    pub seed: u64,
    /// Factor on rewards before learning (`None`: 1; the trainer fits one).
    pub reward_scale: Option<f64>,
}

impl Default for PpoConfig {
    fn default() -> PpoConfig {
        PpoConfig {
            lr: 3e-4,
            gamma: 0.9,
            lambda: 0.95,
            clip: 0.2,
            value_coef: 0.5,
            entropy_coef: 0.01,
            epochs: 4,
            minibatch: 64,
            max_grad_norm: 0.5,
            seed: 0,
            reward_scale: None,
        }
    }
}

/// Why a learner cannot start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PpoError {
    /// The initial network does not fit the schema.
    #[error(transparent)]
    Network(#[from] super::network::InvalidNetwork),
}

/// One decision as the learner needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    /// The state the network saw: `Normalisation::apply(obs.state(current))`.
    pub state: [f32; STATE],
    /// The options allowed.
    pub mask: Mask,
    /// The action taken.
    pub action: Action,
    /// Its log-probability under the acting policy (sum over heads).
    pub log_prob: f32,
    /// The acting policy's value estimate of `state`.
    pub value: f32,
    /// The reward of the interval that followed (unscaled).
    pub reward: f32,
    /// Whether an episode ended after this transition.
    pub done: bool,
}

/// Mean loss terms over one update.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct UpdateStats {
    /// Clipped surrogate loss.
    pub policy_loss: f32,
    /// Value loss (mean squared error).
    pub value_loss: f32,
    /// Sum of per-head entropies.
    pub entropy: f32,
    /// Approximate KL divergence from the acting policy (`(r - 1) - ln r`).
    pub approx_kl: f32,
    /// Share of samples whose ratio left the clip range.
    pub clip_fraction: f32,
}

/// The actor-critic in burn: tanh trunk, policy head (logits), value head.
#[derive(Module, Debug)]
pub struct ActorCritic {
    l1: Linear,
    l2: Linear,
    policy: Linear,
    value: Linear,
}

fn linear(d: &Dense, device: &Device) -> Linear {
    Linear {
        weight: Param::from_data(
            TensorData::new(d.weight.clone(), [d.inputs, d.outputs]),
            device,
        ),
        bias: Some(Param::from_data(
            TensorData::new(d.bias.clone(), [d.outputs]),
            device,
        )),
    }
}

/// A layer's numbers; a readback failure yields empty vectors, which `Network::validate` refuses.
fn dense(l: &Linear) -> Dense {
    let [inputs, outputs] = l.weight.val().dims();
    let read = |t: Tensor<1>| t.into_data().try_into_vec::<f32>().unwrap_or_default();
    Dense {
        inputs,
        outputs,
        weight: read(l.weight.val().reshape([inputs * outputs])),
        bias: l.bias.as_ref().map(|b| read(b.val())).unwrap_or_default(),
    }
}

/// A fresh network: weights uniform in ±1/sqrt(inputs) (burn's default), zero biases, and the
/// policy head scaled by 0.01 so the first policy is close to uniform.
pub fn random_network(seed: u64) -> Network {
    let mut rng = Rng::new(seed);
    let mut layer = |inputs: usize, outputs: usize, gain: f64| {
        let bound = gain / (inputs as f64).sqrt();
        Dense {
            inputs,
            outputs,
            weight: (0..inputs * outputs)
                .map(|_| rng.range(-bound, bound) as f32)
                .collect(),
            bias: vec![0.0; outputs],
        }
    };
    Network {
        l1: layer(STATE, HIDDEN, 1.0),
        l2: layer(HIDDEN, HIDDEN, 1.0),
        policy: layer(HIDDEN, LOGITS, 0.01),
        value: layer(HIDDEN, 1, 1.0),
    }
}

impl ActorCritic {
    /// The same weights as `network`, on `device`.
    pub fn from_network(network: &Network, device: &Device) -> Result<ActorCritic, PpoError> {
        network.validate()?;
        Ok(ActorCritic {
            l1: linear(&network.l1, device),
            l2: linear(&network.l2, device),
            policy: linear(&network.policy, device),
            value: linear(&network.value, device),
        })
    }

    /// The weights as plain numbers.
    pub fn to_network(&self) -> Network {
        Network {
            l1: dense(&self.l1),
            l2: dense(&self.l2),
            policy: dense(&self.policy),
            value: dense(&self.value),
        }
    }

    /// States `[B, STATE]` to logits `[B, LOGITS]` and values `[B, 1]`.
    pub fn forward(&self, states: Tensor<2>) -> (Tensor<2>, Tensor<2>) {
        let h = self.l1.forward(states).tanh();
        let h = self.l2.forward(h).tanh();
        (self.policy.forward(h.clone()), self.value.forward(h))
    }
}

/// Generalised advantage estimation over one trajectory segment: `done[t]` ends an episode
/// after step t; `last_value` bootstraps the step after the segment. Returns (advantages,
/// returns = advantages + values). Lengths follow the shortest input.
pub fn gae(
    rewards: &[f32],
    values: &[f32],
    dones: &[bool],
    last_value: f32,
    gamma: f32,
    lambda: f32,
) -> (Vec<f32>, Vec<f32>) {
    let n = rewards.len().min(values.len()).min(dones.len());
    let mut advantages = vec![0.0; n];
    let (mut next_advantage, mut next_value) = (0.0, last_value);
    for t in (0..n).rev() {
        let live = if dones[t] { 0.0 } else { 1.0 };
        let delta = rewards[t] + gamma * next_value * live - values[t];
        next_advantage = delta + gamma * lambda * live * next_advantage;
        advantages[t] = next_advantage;
        next_value = values[t];
    }
    let returns = advantages.iter().zip(values).map(|(a, v)| a + v).collect();
    (advantages, returns)
}

/// A minibatch as tensors.
struct Minibatch {
    states: Tensor<2>,
    /// True where an option is masked.
    invalid: Tensor<2, Bool>,
    /// Logit index of the chosen option of each head.
    chosen: Tensor<2, Int>,
    old_log_prob: Tensor<2>,
    advantage: Tensor<2>,
    returns: Tensor<2>,
}

/// A cleaned sample: finite numbers, an admitted action.
#[derive(Clone)]
struct Sample {
    state: [f32; STATE],
    mask: Mask,
    action: Action,
    log_prob: f32,
    advantage: f32,
    returns: f32,
}

impl Minibatch {
    fn new(samples: &[&Sample], device: &Device) -> Minibatch {
        let b = samples.len();
        let column = |f: &dyn Fn(&Sample) -> f32| {
            let data: Vec<f32> = samples.iter().map(|s| f(s)).collect();
            Tensor::<2>::from_data(TensorData::new(data, [b, 1]), device)
        };
        let states: Vec<f32> = samples.iter().flat_map(|s| s.state).collect();
        let invalid: Vec<bool> = samples
            .iter()
            .flat_map(|s| s.mask.0.map(|ok| !ok))
            .collect();
        let chosen: Vec<i64> = samples
            .iter()
            .flat_map(|s| s.action.logit_indices().map(|i| i as i64))
            .collect();
        Minibatch {
            states: Tensor::from_data(TensorData::new(states, [b, STATE]), device),
            invalid: Tensor::from_data(TensorData::new(invalid, [b, LOGITS]), device),
            chosen: Tensor::from_data(TensorData::new(chosen, [b, HEADS]), device),
            old_log_prob: column(&|s| s.log_prob),
            advantage: column(&|s| s.advantage),
            returns: column(&|s| s.returns),
        }
    }
}

/// The loss and its terms as tensors.
struct Loss {
    total: Tensor<1>,
    policy: Tensor<1>,
    value: Tensor<1>,
    entropy: Tensor<1>,
    log_ratio: Tensor<2>,
}

/// The clipped PPO loss: `-mean(min(r A, clip(r) A)) + c_v mean((V - R)^2) - c_e H`, with
/// `r = exp(new - old)` over the factored action (per-head masked log-softmax, summed) and H the
/// sum of per-head entropies.
fn loss(logits: Tensor<2>, value: Tensor<2>, mb: &Minibatch, cfg: &PpoConfig) -> Loss {
    let logits = logits.mask_fill(mb.invalid.clone(), MASKED);
    let sizes = Head::ALL.iter().map(|h| h.options()).collect();
    let heads = logits.split_with_sizes(sizes, 1);
    let log_p = Tensor::cat(heads.into_iter().map(|l| log_softmax(l, 1)).collect(), 1);
    let new = log_p.clone().gather(1, mb.chosen.clone()).sum_dim(1);
    let log_ratio = new - mb.old_log_prob.clone();
    let ratio = log_ratio.clone().exp();
    let clip = cfg.clip as f32;
    let unclipped = ratio.clone() * mb.advantage.clone();
    let clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * mb.advantage.clone();
    let policy = unclipped.min_pair(clipped).mean().neg();
    let value = (value - mb.returns.clone()).square().mean();
    let entropy = (log_p.clone().exp() * log_p)
        .mask_fill(mb.invalid.clone(), 0.0)
        .sum_dim(1)
        .mean()
        .neg();
    let total = policy.clone() + value.clone().mul_scalar(cfg.value_coef as f32)
        - entropy.clone().mul_scalar(cfg.entropy_coef as f32);
    Loss {
        total,
        policy,
        value,
        entropy,
        log_ratio,
    }
}

/// The burn model and its Adam state; `update` runs PPO on a batch.
pub struct Learner {
    cfg: PpoConfig,
    device: Device,
    model: Option<ActorCritic>,
    optim: ModuleOptimizer,
    rng: Rng,
    network: Network,
}

impl Learner {
    /// A learner starting from `init` (fine-tuning) or from fresh weights seeded by `cfg.seed`.
    pub fn new(cfg: PpoConfig, init: Option<&Network>) -> Result<Learner, PpoError> {
        let device = Device::flex().autodiff();
        let network = match init {
            Some(n) => n.clone(),
            None => random_network(cfg.seed),
        };
        let model = ActorCritic::from_network(&network, &device)?;
        let optim = AdamConfig::new()
            .with_epsilon(1e-5)
            .with_grad_clipping(Some(GradientClippingConfig::Norm(cfg.max_grad_norm as f32)))
            .init();
        Ok(Learner {
            rng: Rng::new(cfg.seed ^ 0x1EA2),
            cfg,
            device,
            model: Some(model),
            optim,
            network,
        })
    }

    /// The current weights.
    pub fn network(&self) -> Network {
        self.network.clone()
    }

    /// The configuration in use.
    pub fn config(&self) -> &PpoConfig {
        &self.cfg
    }

    /// PPO on one trajectory segment, bootstrapped with `last_value`.
    pub fn update(&mut self, batch: &[Transition], last_value: f32) -> UpdateStats {
        self.update_segments(&[(batch, last_value)])
    }

    /// PPO on several segments (one per environment), each with its bootstrap value. Empty or
    /// unusable input is a no-op with zero stats.
    pub fn update_segments(&mut self, segments: &[(&[Transition], f32)]) -> UpdateStats {
        let samples = self.samples(segments);
        if samples.is_empty() {
            return UpdateStats::default();
        }
        let Some(mut model) = self.model.take() else {
            return UpdateStats::default();
        };
        let mut order: Vec<usize> = (0..samples.len()).collect();
        let (mut sum, mut batches, mut kl, mut clipped, mut seen) =
            (UpdateStats::default(), 0.0f32, 0.0f64, 0usize, 0usize);
        for _ in 0..self.cfg.epochs.max(1) {
            for i in (1..order.len()).rev() {
                order.swap(i, self.rng.below(i + 1));
            }
            for chunk in order.chunks(self.cfg.minibatch.max(1)) {
                let picked: Vec<&Sample> = chunk.iter().map(|i| &samples[*i]).collect();
                let mb = Minibatch::new(&picked, &self.device);
                let (logits, value) = model.forward(mb.states.clone());
                let l = loss(logits, value, &mb, &self.cfg);
                sum.policy_loss += l.policy.into_scalar::<f32>();
                sum.value_loss += l.value.into_scalar::<f32>();
                sum.entropy += l.entropy.into_scalar::<f32>();
                let log_ratio = l
                    .log_ratio
                    .into_data()
                    .try_into_vec::<f32>()
                    .unwrap_or_default();
                for lr in log_ratio {
                    let r = f64::from(lr).exp();
                    kl += (r - 1.0) - f64::from(lr);
                    clipped += usize::from((r - 1.0).abs() > self.cfg.clip);
                    seen += 1;
                }
                batches += 1.0;
                let grads = GradientsParams::from_grads(l.total.backward(), &model);
                model = self.optim.step(self.cfg.lr, model, grads);
            }
        }
        let candidate = model.valid().to_network();
        if candidate.validate().is_ok() {
            self.network = candidate;
            self.model = Some(model);
        } else {
            // A diverged step: keep the last good weights (and start Adam over).
            self.model = ActorCritic::from_network(&self.network, &self.device).ok();
        }
        let seen = seen.max(1) as f64;
        UpdateStats {
            policy_loss: sum.policy_loss / batches,
            value_loss: sum.value_loss / batches,
            entropy: sum.entropy / batches,
            approx_kl: (kl / seen) as f32,
            clip_fraction: (clipped as f64 / seen) as f32,
        }
    }

    /// Advantages and returns per segment, then the usable samples with advantages normalised.
    fn samples(&self, segments: &[(&[Transition], f32)]) -> Vec<Sample> {
        let scale = self.cfg.reward_scale.unwrap_or(1.0) as f32;
        let finite = |x: f32| if x.is_finite() { x } else { 0.0 };
        let mut samples = Vec::new();
        for (batch, last_value) in segments {
            let rewards: Vec<f32> = batch
                .iter()
                .map(|t| finite(t.reward * scale).clamp(-REWARD_LIMIT, REWARD_LIMIT))
                .collect();
            let values: Vec<f32> = batch.iter().map(|t| finite(t.value)).collect();
            let dones: Vec<bool> = batch.iter().map(|t| t.done).collect();
            let (adv, ret) = gae(
                &rewards,
                &values,
                &dones,
                finite(*last_value),
                self.cfg.gamma as f32,
                self.cfg.lambda as f32,
            );
            for ((t, a), r) in batch.iter().zip(adv).zip(ret) {
                if t.log_prob.is_finite() && t.log_prob > MIN_LOG_PROB && t.mask.admits(&t.action) {
                    samples.push(Sample {
                        state: t.state.map(finite),
                        mask: t.mask,
                        action: t.action,
                        log_prob: t.log_prob,
                        advantage: a,
                        returns: r,
                    });
                }
            }
        }
        let n = samples.len().max(1) as f32;
        let mean = samples.iter().map(|s| s.advantage).sum::<f32>() / n;
        let var = samples
            .iter()
            .map(|s| (s.advantage - mean).powi(2))
            .sum::<f32>()
            / n;
        let std = var.sqrt() + 1e-8;
        for s in &mut samples {
            s.advantage = (s.advantage - mean) / std;
        }
        samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::logits::log_probs;

    #[test]
    fn gae_matches_a_hand_computation() {
        // gamma 0.5, lambda 0.5; the episode ends after step 1, step 2 is bootstrapped by 10.
        let (adv, ret) = gae(
            &[1.0, 2.0, 3.0],
            &[0.5, 1.0, 2.0],
            &[false, true, false],
            10.0,
            0.5,
            0.5,
        );
        // t=2: delta = 3 + 0.5*10 - 2 = 6; A2 = 6
        // t=1: done, so delta = 2 - 1 = 1; A1 = 1 (nothing flows back across the episode end)
        // t=0: delta = 1 + 0.5*1.0 - 0.5 = 1; A0 = 1 + 0.5*0.5*A1 = 1.25
        let expect_adv = [1.25, 1.0, 6.0];
        let expect_ret = [1.75, 2.0, 8.0];
        for i in 0..3 {
            assert!((adv[i] - expect_adv[i]).abs() < 1e-6, "{adv:?}");
            assert!((ret[i] - expect_ret[i]).abs() < 1e-6, "{ret:?}");
        }
        assert_eq!(gae(&[], &[], &[], 1.0, 0.9, 0.95), (vec![], vec![]));
    }

    fn state(seed: u64) -> [f32; STATE] {
        let mut rng = Rng::new(seed);
        std::array::from_fn(|_| rng.range(-2.0, 2.0) as f32)
    }

    #[test]
    fn burn_forward_equals_the_hand_written_forward() {
        let net = random_network(7);
        let mut sharper = net.clone();
        sharper.policy.weight.iter_mut().for_each(|w| *w *= 100.0);
        for net in [net, sharper] {
            let device = Device::flex();
            let model = ActorCritic::from_network(&net, &device).unwrap();
            assert_eq!(model.to_network(), net, "weights round-trip exactly");
            for seed in 0..4 {
                let s = state(seed);
                let (logits, value) = net.forward(&s);
                let x = Tensor::<2>::from_data(TensorData::new(s.to_vec(), [1, STATE]), &device);
                let (bl, bv) = model.forward(x);
                let bl = bl.into_data().try_into_vec::<f32>().unwrap();
                for (a, b) in logits.iter().zip(&bl) {
                    assert!((a - b).abs() < 1e-5, "{a} vs {b}");
                }
                assert!((value - bv.into_scalar::<f32>()).abs() < 1e-5);
            }
        }
    }

    /// The loss in f64, straight from its definition.
    fn reference_loss(
        logits: &[[f32; LOGITS]],
        values: &[f64],
        samples: &[Sample],
        cfg: &PpoConfig,
    ) -> (f64, f64, f64, f64) {
        let n = samples.len() as f64;
        let (mut pg, mut vf, mut ent) = (0.0, 0.0, 0.0);
        for ((l, v), s) in logits.iter().zip(values).zip(samples) {
            let lp = log_probs(l, &s.mask);
            let new: f64 = s
                .action
                .logit_indices()
                .iter()
                .map(|i| f64::from(lp[*i]))
                .sum();
            let ratio = (new - f64::from(s.log_prob)).exp();
            let a = f64::from(s.advantage);
            let clipped = ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip);
            pg += (ratio * a).min(clipped * a);
            vf += (v - f64::from(s.returns)).powi(2);
            for (i, ok) in s.mask.0.iter().enumerate() {
                if *ok {
                    ent -= f64::from(lp[i]).exp() * f64::from(lp[i]);
                }
            }
        }
        let (pg, vf, ent) = (-pg / n, vf / n, ent / n);
        (
            pg + cfg.value_coef * vf - cfg.entropy_coef * ent,
            pg,
            vf,
            ent,
        )
    }

    fn burn_loss(
        logits: &[[f32; LOGITS]],
        values: &[f64],
        samples: &[Sample],
    ) -> (f32, f32, f32, f32) {
        let device = Device::flex();
        let b = samples.len();
        let refs: Vec<&Sample> = samples.iter().collect();
        let mb = Minibatch::new(&refs, &device);
        let flat: Vec<f32> = logits.iter().flatten().copied().collect();
        let lt = Tensor::<2>::from_data(TensorData::new(flat, [b, LOGITS]), &device);
        let vals: Vec<f32> = values.iter().map(|v| *v as f32).collect();
        let vt = Tensor::<2>::from_data(TensorData::new(vals, [b, 1]), &device);
        let l = loss(lt, vt, &mb, &PpoConfig::default());
        let s = |t: Tensor<1>| t.into_scalar::<f32>();
        (s(l.total), s(l.policy), s(l.value), s(l.entropy))
    }

    #[test]
    fn ppo_loss_matches_a_hand_computation() {
        // Zero logits: each head is uniform over its allowed options. Without a GPU the two
        // placement heads have one option (log-prob 0); codec, depth, workers have 4 and
        // decoded caching 2, so the new log-prob of any action is -(3 ln 4 + ln 2) = -7 ln 2.
        let mask = Mask::new(false, true);
        let new = -7.0 * 2f32.ln();
        let sample = |ratio: f32, advantage: f32, returns: f32| Sample {
            state: [0.0; STATE],
            mask,
            action: Action::default().with(Head::Codec, 2).with(Head::Depth, 3),
            log_prob: new - ratio.ln(),
            advantage,
            returns,
        };
        // Sample 1: ratio 1.5, A = +1 -> min(1.5, 1.2) = 1.2 (clipped).
        // Sample 2: ratio 0.5, A = -2 -> min(-1.0, 0.8 * -2 = -1.6) = -1.6 (clipped).
        // Policy loss = -(1.2 - 1.6) / 2 = 0.2.
        // Values 0, returns 1 and 3: value loss = (1 + 9) / 2 = 5.
        // Entropy per sample = 3 ln 4 + ln 2 = 7 ln 2 = 4.852.
        // Total = 0.2 + 0.5 * 5 - 0.01 * 4.852 = 2.65148.
        let samples = [sample(1.5, 1.0, 1.0), sample(0.5, -2.0, 3.0)];
        let logits = [[0.0; LOGITS]; 2];
        let (total, pg, vf, ent) = burn_loss(&logits, &[0.0, 0.0], &samples);
        assert!((pg - 0.2).abs() < 1e-5, "{pg}");
        assert!((vf - 5.0).abs() < 1e-5, "{vf}");
        assert!((ent - 7.0 * 2f32.ln()).abs() < 1e-5, "{ent}");
        assert!(
            (total - (0.2 + 2.5 - 0.01 * 7.0 * 2f32.ln())).abs() < 1e-5,
            "{total}"
        );
        let (rt, ..) = reference_loss(&logits, &[0.0, 0.0], &samples, &PpoConfig::default());
        assert!((f64::from(total) - rt).abs() < 1e-5);

        // Arbitrary logits, masks and actions: burn agrees with the f64 reference.
        let mut rng = Rng::new(3);
        let logits: Vec<[f32; LOGITS]> = (0..5)
            .map(|_| std::array::from_fn(|_| rng.range(-3.0, 3.0) as f32))
            .collect();
        let samples: Vec<Sample> = (0..5)
            .map(|i| Sample {
                state: [0.0; STATE],
                mask: Mask::new(i % 2 == 0, true),
                action: Action([
                    rng.below(2) as u8 * (i % 2 == 0) as u8,
                    0,
                    rng.below(4) as u8,
                    1,
                    2,
                    1,
                ]),
                log_prob: rng.range(-8.0, -4.0) as f32,
                advantage: rng.range(-2.0, 2.0) as f32,
                returns: rng.range(-1.0, 1.0) as f32,
            })
            .collect();
        let values: Vec<f64> = (0..5).map(|i| f64::from(i) * 0.1).collect();
        let (total, pg, vf, ent) = burn_loss(&logits, &values, &samples);
        let (rt, rpg, rvf, rent) =
            reference_loss(&logits, &values, &samples, &PpoConfig::default());
        for (b, r) in [(total, rt), (pg, rpg), (vf, rvf), (ent, rent)] {
            assert!(
                (f64::from(b) - r).abs() < 1e-4 * r.abs().max(1.0),
                "{b} vs {r}"
            );
        }
    }

    fn transition(i: usize) -> Transition {
        let net = random_network(1);
        let s = state(i as u64);
        let mask = Mask::new(i.is_multiple_of(3), true);
        let (logits, value) = net.forward(&s);
        let action = Action::default()
            .with(Head::Codec, i % 4)
            .with(Head::Depth, (i / 4) % 4);
        let lp = log_probs(&logits, &mask);
        Transition {
            state: s,
            mask,
            action,
            log_prob: action.logit_indices().iter().map(|k| lp[*k]).sum(),
            value,
            reward: if i.is_multiple_of(4) { 1.0 } else { -1.0 },
            done: i % 10 == 9,
        }
    }

    #[test]
    fn odd_input_never_panics_and_empty_batches_are_no_ops() {
        let mut learner = Learner::new(PpoConfig::default(), None).unwrap();
        let before = learner.network();
        assert_eq!(learner.update(&[], 0.0), UpdateStats::default());
        assert_eq!(learner.network(), before);
        let mut batch: Vec<Transition> = (0..20).map(transition).collect();
        batch[0].reward = f32::NAN;
        batch[1].value = f32::INFINITY;
        batch[2].state[0] = f32::NAN;
        batch[3].log_prob = f32::NAN;
        batch[4].action = batch[4].action.with(Head::Decode, 1);
        batch[4].mask = Mask::new(false, true);
        let stats = learner.update(&batch, f32::NAN);
        assert!(stats.policy_loss.is_finite() && stats.value_loss.is_finite());
        assert!(learner.network().validate().is_ok());
        assert_ne!(learner.network(), before, "the usable transitions trained");
        assert!(
            Learner::new(
                PpoConfig::default(),
                Some(&Network {
                    l1: before.l2.clone(),
                    ..before
                })
            )
            .is_err()
        );
    }

    #[test]
    fn updates_raise_the_probability_of_rewarded_actions() {
        let cfg = PpoConfig {
            lr: 3e-3,
            ..PpoConfig::default()
        };
        let mut learner = Learner::new(cfg, None).unwrap();
        let batch: Vec<Transition> = (0..64).map(transition).collect();
        let codec0 = |net: &Network| {
            let t = transition(0);
            let (logits, _) = net.forward(&t.state);
            log_probs(&logits, &t.mask)[Head::Codec.offset()]
        };
        let before = codec0(&learner.network());
        for _ in 0..5 {
            let mut b = batch.clone();
            let net = learner.network();
            for t in &mut b {
                let (logits, value) = net.forward(&t.state);
                let lp = log_probs(&logits, &t.mask);
                t.log_prob = t.action.logit_indices().iter().map(|k| lp[*k]).sum();
                t.value = value;
            }
            let stats = learner.update(&b, 0.0);
            assert!(stats.approx_kl >= 0.0 && stats.clip_fraction <= 1.0);
        }
        assert!(
            codec0(&learner.network()) > before,
            "codec none (rewarded +1) became likelier"
        );
    }

    #[test]
    fn learner_can_move_to_a_background_thread() {
        fn send<T: Send>() {}
        send::<Learner>();
    }
}
