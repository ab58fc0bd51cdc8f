//! Training the scheduler's policy in the simulator, and scoring policies there.
//!
//! Owns: the training loop (rollouts of the current network in several simulated environments
//! in turn, PPO updates, the learning curve with the heuristic's reward on the same episodes
//! for reference), the state normalisation and reward scale it fits before training, and
//! `evaluate`, which the tests and the benchmark use to compare policies. Deterministic for a
//! seed: every random number comes from seeded `scheduler::rng::Rng`s. Must never touch the
//! machine: the simulator is its only environment.

use super::logits::{log_probs, pick};
use super::network::{Network, Normalisation};
use super::ppo::{Learner, PpoConfig, Transition, UpdateStats};
use super::rng::Rng;
use super::sim::baselines::{self, Policy};
use super::sim::calibration::Calibration;
use super::sim::engine::Simulator;
use super::sim::scenario::Scenario;
use super::state::{RewardWeights, STATE, state_vector};
use crate::control::action::{Action, LOGITS, Mask};
use crate::control::observation::Observation;

/// Episodes run (half random, half heuristic) to fit the normalisation and the reward scale.
const FIT_EPISODES: usize = 8;
/// Steps per fitting episode: 12 simulated seconds, long enough to reach a second epoch.
const FIT_STEPS: usize = 60;

/// What to train and how.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TrainConfig {
    /// PPO updates.
    pub updates: usize,
    /// Environment steps per update, split evenly across `envs`.
    pub steps_per_update: usize,
    /// Simulated environments stepped in turn (each its own scenario).
    pub envs: usize,
    /// Steps per episode (150 = 30 simulated seconds); then a new scenario.
    pub episode_steps: usize,
    /// Seed of everything.
    pub seed: u64,
    /// PPO's hyperparameters (its seed is derived from `seed`).
    pub ppo: PpoConfig,
    /// The reward.
    pub reward: RewardWeights,
    /// Costs the random scenarios are drawn around.
    pub calibration: Calibration,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            updates: 1000,
            steps_per_update: 512,
            envs: 4,
            episode_steps: 150,
            seed: 0,
            ppo: PpoConfig::default(),
            reward: RewardWeights::default(),
            calibration: Calibration::default(),
        }
    }
}

/// One point of the learning curve.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CurvePoint {
    /// Update index, from 0.
    pub update: usize,
    /// Environment steps so far.
    pub env_steps: usize,
    /// Mean reward per step of the episodes that ended during this update (`None`: none ended).
    pub episode_reward: Option<f64>,
    /// The heuristic's mean reward per step on the same episodes (scenario and seed).
    pub heuristic_reward: Option<f64>,
    /// The update's loss terms.
    pub stats: UpdateStats,
}

/// A trained policy and how it got there.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Trained {
    /// The weights.
    pub network: Network,
    /// Applied to states before the network.
    pub normalisation: Normalisation,
    /// The factor on rewards the value head learned under (for fine-tuning with `Learner`).
    pub reward_scale: f64,
    /// The learning curve.
    pub curve: Vec<CurvePoint>,
}

/// How a policy did in one simulated run.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Evaluation {
    /// Mean load latency over every request delivered, seconds.
    pub mean_latency_s: f64,
    /// 99th percentile load latency, seconds.
    pub p99_s: f64,
    /// Mean stall share per interval.
    pub stall_share: f64,
    /// Mean reward per interval (default weights).
    pub mean_reward: f64,
}

/// The knobs for the first interval of every run, before any policy has seen an observation.
fn start() -> Action {
    baselines::static_cpu(
        &Observation::default(),
        &Action::default(),
        &Mask::default(),
        0,
    )
}

/// Runs `policy` for `steps` intervals of `scenario` (after one warm-up interval under the
/// static knobs) and scores it.
pub fn evaluate(policy: &Policy, scenario: &Scenario, seed: u64, steps: usize) -> Evaluation {
    run(policy, scenario, seed, steps, &RewardWeights::default())
}

fn run(
    policy: &Policy,
    scenario: &Scenario,
    seed: u64,
    steps: usize,
    w: &RewardWeights,
) -> Evaluation {
    let mut sim = Simulator::new(scenario.clone(), seed);
    let mask = sim.mask();
    let mut current = start();
    let mut obs = sim.step(&current);
    let (mut latencies, mut stall, mut reward) = (Vec::new(), 0.0, 0.0);
    for i in 0..steps {
        current = policy(&obs, &current, &mask, i);
        obs = sim.step(&current);
        latencies.extend(sim.last_latencies().iter().map(|l| f64::from(*l)));
        stall += obs.stall_share;
        reward += w.reward(&obs);
    }
    latencies.sort_by(f64::total_cmp);
    let n = latencies.len().max(1) as f64;
    let p99 = latencies
        .get(((latencies.len().saturating_sub(1)) as f64 * 0.99).round() as usize)
        .copied()
        .unwrap_or(0.0);
    let steps = steps.max(1) as f64;
    Evaluation {
        mean_latency_s: latencies.iter().sum::<f64>() / n,
        p99_s: p99,
        stall_share: stall / steps,
        mean_reward: reward / steps,
    }
}

/// The network as a policy: the most likely allowed option per head (the knobs in force when
/// the logits are not finite).
pub fn greedy(
    network: &Network,
    normalisation: &Normalisation,
) -> impl Fn(&Observation, &Action, &Mask, usize) -> Action + use<> {
    let (network, normalisation) = (network.clone(), normalisation.clone());
    move |obs: &Observation, current: &Action, mask: &Mask, _: usize| {
        let (logits, _) = network.forward(&normalisation.apply(&state_vector(obs, current)));
        pick(&logits, mask, None).unwrap_or(*current)
    }
}

/// Log-probability of `action` under `logits` (sum over heads).
fn log_prob(logits: &[f32; LOGITS], mask: &Mask, action: &Action) -> f32 {
    let lp = log_probs(logits, mask);
    action.logit_indices().iter().map(|i| lp[*i]).sum()
}

/// One simulated environment mid-episode.
struct Env {
    sim: Simulator,
    mask: Mask,
    obs: Observation,
    current: Action,
    steps: usize,
    reward_sum: f64,
    /// The heuristic's mean reward on this episode's scenario and seed.
    heuristic: f64,
}

impl Env {
    fn new(scenario: Scenario, seed: u64, cfg: &TrainConfig) -> Env {
        let heuristic = baselines::heuristic_policy(&scenario);
        let reference = run(&heuristic, &scenario, seed, cfg.episode_steps, &cfg.reward);
        let mut sim = Simulator::new(scenario, seed);
        let current = start();
        let obs = sim.step(&current);
        Env {
            mask: sim.mask(),
            sim,
            obs,
            current,
            steps: 0,
            reward_sum: 0.0,
            heuristic: reference.mean_reward,
        }
    }
}

/// Fits the state normalisation and the reward scale on episodes of random and heuristic
/// knobs: the states a learning policy will visit lie between the two. The reward scale is
/// `(1 - gamma) / median |reward|`, so typical returns are about 1 whatever the machine.
fn fit(
    cfg: &TrainConfig,
    scenarios: &dyn Fn(&mut Rng) -> Scenario,
    rng: &mut Rng,
) -> (Normalisation, f64) {
    let mut states: Vec<[f32; STATE]> = Vec::new();
    let mut rewards = Vec::new();
    for k in 0..FIT_EPISODES {
        let scenario = scenarios(rng);
        let seed = rng.next_u64();
        let heuristic = baselines::heuristic_policy(&scenario);
        let mut draw = Rng::new(seed ^ 0xF17);
        let mut sim = Simulator::new(scenario, seed);
        let mask = sim.mask();
        let mut current = start();
        let mut obs = sim.step(&current);
        for i in 0..FIT_STEPS {
            states.push(state_vector(&obs, &current));
            current = if k % 2 == 0 {
                pick(&[0.0; LOGITS], &mask, Some(&mut || draw.f64())).unwrap_or(current)
            } else {
                heuristic(&obs, &current, &mask, i)
            };
            obs = sim.step(&current);
            rewards.push(cfg.reward.reward(&obs).abs());
        }
    }
    rewards.sort_by(f64::total_cmp);
    let median = rewards.get(rewards.len() / 2).copied().unwrap_or(1.0);
    (
        Normalisation::fit(&states),
        (1.0 - cfg.ppo.gamma) / median.max(1e-3),
    )
}

/// Trains on random scenarios around `cfg.calibration`.
pub fn train(cfg: &TrainConfig, progress: &mut dyn FnMut(&CurvePoint)) -> Trained {
    let calibration = cfg.calibration.clone();
    train_on(
        cfg,
        &move |rng: &mut Rng| Scenario::random(rng, &calibration),
        progress,
    )
}

/// Trains on scenarios drawn by `scenarios`.
pub fn train_on(
    cfg: &TrainConfig,
    scenarios: &dyn Fn(&mut Rng) -> Scenario,
    progress: &mut dyn FnMut(&CurvePoint),
) -> Trained {
    let mut rng = Rng::new(cfg.seed);
    let (normalisation, reward_scale) = fit(cfg, scenarios, &mut rng);
    let ppo = PpoConfig {
        seed: cfg.seed ^ 0x9E37,
        reward_scale: Some(reward_scale),
        ..cfg.ppo.clone()
    };
    let gamma = ppo.gamma as f32;
    #[allow(clippy::expect_used)]
    let mut learner = Learner::new(ppo, None).expect("a fresh network always fits the schema");
    let mut envs: Vec<Env> = (0..cfg.envs.max(1))
        .map(|_| Env::new(scenarios(&mut rng), rng.next_u64(), cfg))
        .collect();
    let per_env = (cfg.steps_per_update / envs.len()).max(1);
    let mut draw = Rng::new(cfg.seed ^ 0xD2A3);
    let mut curve = Vec::with_capacity(cfg.updates);
    let mut env_steps = 0;
    for update in 0..cfg.updates {
        let net = learner.network();
        let mut segments = Vec::with_capacity(envs.len());
        let mut finished = Vec::new();
        for env in &mut envs {
            let mut segment = Vec::with_capacity(per_env);
            for _ in 0..per_env {
                let mask = env.mask;
                let state = normalisation.apply(&state_vector(&env.obs, &env.current));
                let (logits, value) = net.forward(&state);
                let action = pick(&logits, &mask, Some(&mut || draw.f64())).unwrap_or(env.current);
                let obs = env.sim.step(&action);
                let raw = cfg.reward.reward(&obs);
                env.reward_sum += raw;
                env.steps += 1;
                env.obs = obs;
                env.current = action;
                let done = env.steps >= cfg.episode_steps;
                let mut reward = raw as f32;
                if done {
                    // A time limit, not an end: the value of what follows is folded into the
                    // last reward (value is in scaled units, rewards are not).
                    let next = normalisation.apply(&state_vector(&env.obs, &env.current));
                    reward += gamma * net.forward(&next).1 / reward_scale as f32;
                    finished.push((env.reward_sum / env.steps as f64, env.heuristic));
                    *env = Env::new(scenarios(&mut rng), rng.next_u64(), cfg);
                }
                segment.push(Transition {
                    state,
                    mask,
                    action,
                    log_prob: log_prob(&logits, &mask, &action),
                    value,
                    reward,
                    done,
                });
            }
            let last = net
                .forward(&normalisation.apply(&state_vector(&env.obs, &env.current)))
                .1;
            segments.push((segment, last));
            env_steps += per_env;
        }
        let refs: Vec<(&[Transition], f32)> =
            segments.iter().map(|(s, v)| (s.as_slice(), *v)).collect();
        let stats = learner.update_segments(&refs);
        let mean = |f: fn(&(f64, f64)) -> f64| {
            (!finished.is_empty())
                .then(|| finished.iter().map(f).sum::<f64>() / finished.len() as f64)
        };
        let point = CurvePoint {
            update,
            env_steps,
            episode_reward: mean(|p| p.0),
            heuristic_reward: mean(|p| p.1),
            stats,
        };
        progress(&point);
        curve.push(point);
    }
    Trained {
        network: learner.network(),
        normalisation,
        reward_scale,
        curve,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::action::{Head, Placement};

    /// A CPU saturated by background load next to an idle GPU, and no cache room (so decoded
    /// caching cannot help): moving decode to the GPU is the one way to lower latency.
    fn saturated_cpu_idle_gpu() -> Scenario {
        let mut s = Scenario::cpu_bound().with_gpu(true);
        s.cache_bytes = 0.0;
        s
    }

    fn small(updates: usize, seed: u64) -> TrainConfig {
        TrainConfig {
            updates,
            steps_per_update: 256,
            envs: 2,
            episode_steps: 64,
            seed,
            ppo: PpoConfig {
                lr: 1e-3,
                ..PpoConfig::default()
            },
            ..TrainConfig::default()
        }
    }

    #[test]
    fn the_policy_learns_to_decode_on_an_idle_gpu_when_the_cpu_is_saturated() {
        let scenario = saturated_cpu_idle_gpu();
        let mut rewards = Vec::new();
        let trained = train_on(&small(12, 3), &|_| scenario.clone(), &mut |p| {
            rewards.extend(p.episode_reward);
        });
        let policy = greedy(&trained.network, &trained.normalisation);
        let mut sim = Simulator::new(scenario.clone(), 99);
        let obs = sim.step(&start());
        assert!(obs.cpu_busy > 0.9, "{obs:?}");
        assert!(obs.gpu.is_some_and(|g| g.busy < 0.5), "{obs:?}");
        let chosen = policy(&obs, &start(), &sim.mask(), 0);
        assert_eq!(
            chosen.decode(),
            Placement::Gpu,
            "{chosen:?}, rewards {rewards:?}"
        );
        let learned = evaluate(&policy, &scenario, 7, 100);
        let fixed = evaluate(&baselines::static_cpu, &scenario, 7, 100);
        assert!(
            learned.mean_latency_s < fixed.mean_latency_s,
            "{learned:?} vs {fixed:?}"
        );
    }

    #[test]
    fn training_is_deterministic_for_a_seed() {
        let scenario = Scenario::io_bound();
        let a = train_on(&small(2, 5), &|_| scenario.clone(), &mut |_| {});
        let b = train_on(&small(2, 5), &|_| scenario.clone(), &mut |_| {});
        assert_eq!(a, b);
        let c = train_on(&small(2, 6), &|_| scenario.clone(), &mut |_| {});
        assert_ne!(a.network, c.network, "another seed, other weights");
        assert_eq!(a.curve.len(), 2);
        assert!(a.normalisation.is_valid() && a.network.validate().is_ok());
        assert!(a.reward_scale > 0.0 && a.reward_scale.is_finite());
    }

    #[test]
    fn random_scenarios_train_without_breaking() {
        let cfg = TrainConfig {
            episode_steps: 20,
            ..small(2, 11)
        };
        let mut points = 0;
        let trained = train(&cfg, &mut |p| {
            points += 1;
            assert!(p.stats.value_loss.is_finite(), "{p:?}");
        });
        assert_eq!(points, 2);
        assert!(
            trained
                .curve
                .iter()
                .any(|p| p.episode_reward.is_some() && p.heuristic_reward.is_some())
        );
    }

    #[test]
    fn evaluation_ranks_a_fast_placement_above_a_slow_one() {
        let scenario = saturated_cpu_idle_gpu();
        let gpu = |_: &Observation, _: &Action, _: &Mask, _: usize| {
            start().with(Head::Decode, 1).with(Head::Augment, 1)
        };
        let on_gpu = evaluate(&gpu, &scenario, 1, 30);
        let on_cpu = evaluate(&baselines::static_cpu, &scenario, 1, 30);
        assert!(on_gpu.mean_latency_s < on_cpu.mean_latency_s);
        assert!(on_gpu.mean_reward > on_cpu.mean_reward);
        assert!(on_cpu.p99_s >= on_cpu.mean_latency_s && on_cpu.stall_share > 0.0);
    }
}
