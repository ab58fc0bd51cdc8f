//! Online fine-tuning (`--learn`): the mounted scheduler samples its actions from the policy,
//! collects the transitions it lives through, and runs a PPO update every `BATCH` decisions
//! with a tenth of training's learning rate. In the guard's turns the heuristics act, and their
//! actions are kept as transitions too (with the policy's own probability of them as the old
//! one), so a policy that trails the heuristics is pulled towards what earned more.
//!
//! Owns: the transition buffer, the learner, and the tuned policy. Updates run on the
//! scheduler's thread between decisions (tens of milliseconds every ~50 s), never on a request
//! path. Must never let a broken update take the policy down: a network that comes back
//! invalid is dropped and the previous one kept.

use serde_json::{Value, json};

use super::artifact::Payload;
use super::logits::{log_probs, pick};
use super::ppo::{Learner, PpoConfig, Transition, UpdateStats};
use super::state::STATE;
use crate::control::action::{Action, Mask};

/// Decisions per update: about 50 s of experience at 200 ms, so one update sees a few regimes.
const BATCH: usize = 256;
/// Learning rate online: a tenth of offline training's, so a few noisy minutes cannot undo
/// what the simulator taught.
const LR: f64 = 3e-5;

/// The online learner of one mount.
pub struct Online {
    learner: Learner,
    payload: Payload,
    rng: fastrand::Rng,
    /// The decision taken last, waiting for its interval's reward.
    pending: Option<Transition>,
    batch: Vec<Transition>,
    updates: u64,
    last: Option<UpdateStats>,
}

impl Online {
    /// Fine-tunes `payload`'s network; `None` (and a warning) when the learner cannot start.
    pub fn new(payload: &Payload, seed: u64) -> Option<Online> {
        let cfg = PpoConfig {
            lr: LR,
            seed,
            reward_scale: Some(payload.reward_scale),
            ..PpoConfig::default()
        };
        match Learner::new(cfg, Some(&payload.network)) {
            Ok(learner) => Some(Online {
                learner,
                payload: payload.clone(),
                rng: fastrand::Rng::with_seed(seed),
                pending: None,
                batch: Vec::with_capacity(BATCH),
                updates: 0,
                last: None,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot fine-tune this policy; it acts unchanged");
                None
            }
        }
    }

    /// Samples an action for `state` (raw, before normalisation) and remembers it.
    pub fn act(&mut self, state: &[f32; STATE], mask: &Mask) -> Option<Action> {
        let p = &self.payload;
        let (logits, _) = p.network.forward(&p.normalisation.apply(state));
        let rng = &mut self.rng;
        let mut draw = || rng.f64();
        let action = pick(&logits, mask, Some(&mut draw))?;
        self.follow(state, mask, &action);
        Some(action)
    }

    /// Remembers `action`, taken for `state` by whoever acted (the policy, or the heuristics in
    /// the guard's turn), scored by the policy as it is now; one the mask forbids breaks the
    /// trajectory instead.
    pub fn follow(&mut self, state: &[f32; STATE], mask: &Mask, action: &Action) {
        if !mask.admits(action) {
            self.discard();
            return;
        }
        let p = &self.payload;
        let normalised = p.normalisation.apply(state);
        let (logits, value) = p.network.forward(&normalised);
        let lp = log_probs(&logits, mask);
        let log_prob = action.logit_indices().iter().map(|i| lp[*i]).sum();
        self.pending = Some(Transition {
            state: normalised,
            mask: *mask,
            action: *action,
            log_prob,
            value,
            reward: 0.0,
            done: false,
        });
    }

    /// The reward of the interval after the last action: completes its transition, and updates
    /// the policy when a batch is full.
    pub fn reward(&mut self, reward: f64) {
        let Some(mut t) = self.pending.take() else {
            return;
        };
        t.reward = reward as f32;
        self.batch.push(t);
        if self.batch.len() >= BATCH {
            self.update();
        }
    }

    /// The last action was not applied (a fallback): the trajectory breaks here.
    pub fn discard(&mut self) {
        self.pending = None;
        if let Some(last) = self.batch.last_mut() {
            last.done = true;
        }
    }

    fn update(&mut self) {
        let last_value = self.batch.last().map_or(0.0, |t| t.value);
        let stats = self.learner.update(&self.batch, last_value);
        let network = self.learner.network();
        if network.validate().is_ok() {
            self.payload.network = network;
            self.payload.metadata.steps += self.batch.len() as u64;
            self.updates += 1;
            self.last = Some(stats);
        } else {
            tracing::warn!("an online update produced an invalid network; kept the previous one");
        }
        self.batch.clear();
    }

    /// The policy as tuned so far.
    pub fn payload(&self) -> &Payload {
        &self.payload
    }

    /// The `learning` part of the scheduler's stats.
    pub fn to_json(&self) -> Value {
        json!({
            "updates": self.updates,
            "transitions_pending": self.batch.len(),
            "batch": BATCH,
            "learning_rate": LR,
            "last_update": self.last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::action::Head;
    use crate::scheduler::artifact::Metadata;
    use crate::scheduler::network::Normalisation;
    use crate::scheduler::ppo::random_network;
    use crate::scheduler::state::RewardWeights;

    fn payload() -> Payload {
        Payload {
            network: random_network(3),
            normalisation: Normalisation::identity(),
            reward_scale: 1.0,
            metadata: Metadata {
                command: "test".into(),
                prepfs_version: "0".into(),
                reward: RewardWeights::default(),
                training: Value::Null,
                steps: 0,
            },
        }
    }

    #[test]
    fn a_full_batch_updates_the_policy_and_fallbacks_cut_the_trajectory() {
        let payload = payload();
        let mut online = Online::new(&payload, 1).unwrap();
        let mask = Mask::new(false, true);
        let mut state = [0.0f32; STATE];
        for i in 0..BATCH + 1 {
            state[0] = (i % 7) as f32 / 7.0;
            let a = online.act(&state, &mask).unwrap();
            assert!(mask.admits(&a));
            if i == 10 {
                online.discard();
                assert!(online.batch.last().unwrap().done);
                continue;
            }
            // Reward the cheapest codec: the update must move towards it.
            online.reward(if a.get(Head::Codec) == 0 { 0.0 } else { -1.0 });
        }
        assert_eq!(online.updates, 1, "{}", online.to_json());
        assert_ne!(online.payload().network, payload.network);
        assert_eq!(online.payload().metadata.steps, BATCH as u64);
        assert!(online.payload().network.validate().is_ok());
    }

    /// In the guard's turns the heuristics act; their actions are the policy's lessons.
    #[test]
    fn the_heuristics_actions_are_learned_from_and_forbidden_ones_cut_the_trajectory() {
        let payload = payload();
        let mut online = Online::new(&payload, 2).unwrap();
        let mask = Mask::new(false, true);
        let gpu = Action::default().with(Head::Decode, 1);
        online.follow(&[0.0; STATE], &mask, &gpu);
        assert!(
            online.pending.is_none(),
            "a GPU placement without a GPU is not a lesson"
        );
        // The heuristics alternate two codecs; zstd-3 earns more. The policy must come to
        // prefer it over lz4 more than it did.
        let state = [0.5f32; STATE];
        let zstd = Action::default().with(Head::Codec, 3);
        let lz4 = Action::default().with(Head::Codec, 1);
        let preference = |o: &Online| {
            let p = &o.payload;
            let (logits, _) = p.network.forward(&p.normalisation.apply(&state));
            let lp = log_probs(&logits, &mask);
            lp[Head::Codec.offset() + 3] - lp[Head::Codec.offset() + 1]
        };
        let before = preference(&online);
        for i in 0..BATCH {
            let (action, reward) = if i % 2 == 0 { (zstd, 0.0) } else { (lz4, -1.0) };
            online.follow(&state, &mask, &action);
            online.reward(reward);
        }
        assert_eq!(online.updates, 1, "{}", online.to_json());
        assert!(online.payload().network.validate().is_ok());
        assert!(
            preference(&online) > before,
            "{before} -> {}",
            preference(&online)
        );
    }
}
