//! The mounted scheduler: a thread that, every 200 ms, turns the latest telemetry sample into
//! a state, asks the policy for an action and sets the knobs, or hands them back to the modules'
//! heuristics when it cannot decide in time or sensibly.
//!
//! Owns: the decision loop, its fallbacks (no sample yet, late, invalid or non-finite decision,
//! no usable policy), the reward it observes, the guard's turns (`--policy-guard`: the
//! heuristics act while the policy trails them), online fine-tuning (`--learn`, in a build with
//! the `train` feature; the policy also learns from the heuristics' turns) and the scheduler's
//! stats document. Must never touch a request path or block a module: knobs are atomics, and
//! nothing here is awaited by a reader.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Value, json};

use super::artifact::Payload;
use super::guard::{Actor, Guard};
use super::heuristic;
use super::logits::pick;
#[cfg(feature = "train")]
use super::online::Online;
use super::state::{RewardWeights, STATE, state_vector};
use crate::control::action::{Action, Head, LOGITS, Mask};
use crate::control::knobs::Knobs;
use crate::control::observation::Observation;
use crate::metrics::{Histogram, quantile_us};
use crate::telemetry::Telemetry;

/// Decision cadence: the telemetry's full-sample period.
pub const INTERVAL: Duration = Duration::from_millis(200);
/// A decision that takes longer than this is not applied (the heuristic runs instead): by then
/// the sample it answered is a tenth of an interval old, and something is starving the thread.
pub const DEADLINE: Duration = Duration::from_millis(20);
/// Weight of a new reward in the moving average shown in stats (~5 s at 200 ms).
const REWARD_SMOOTHING: f64 = 0.04;

/// Who decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The modules' own heuristics; the scheduler only observes.
    Heuristic,
    /// The learned policy (shipped, or `--policy FILE`).
    Policy,
    /// Uniformly random allowed actions every decision (stress testing).
    Random,
}

impl Mode {
    /// The mode as `--scheduler` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Heuristic => "heuristic",
            Mode::Policy => "policy",
            Mode::Random => "random",
        }
    }

    /// Parses `--scheduler`.
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "heuristic" | "off" => Some(Mode::Heuristic),
            "policy" | "ppo" => Some(Mode::Policy),
            "random" => Some(Mode::Random),
            _ => None,
        }
    }
}

/// The scheduler's settings.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Who decides.
    pub mode: Mode,
    /// A policy file instead of the shipped policy.
    pub policy: Option<PathBuf>,
    /// Keep training the policy online (`--learn`).
    pub learn: bool,
    /// Where `--learn` saves the tuned policy at unmount.
    pub save: Option<PathBuf>,
    /// Whether a policy acts only while its reward keeps up with the heuristics'
    /// (`--policy-guard`).
    pub guard: bool,
    /// Reward weights.
    pub reward: RewardWeights,
    /// Seed of random actions (random mode, exploration while learning).
    pub seed: u64,
}

impl SchedulerOptions {
    /// Refuses what this build cannot do: `--learn` needs the `train` feature.
    pub fn validate(&self) -> Result<(), String> {
        if self.learn && !cfg!(feature = "train") {
            return Err(format!("--learn: {}", super::WITHOUT_TRAIN));
        }
        Ok(())
    }
}

impl Default for SchedulerOptions {
    fn default() -> SchedulerOptions {
        SchedulerOptions {
            // The learned policy is opt-in until it beats the heuristics on real workloads
            // (BENCHMARKS.md, scheduler on the real system).
            mode: Mode::Heuristic,
            policy: None,
            learn: false,
            save: None,
            guard: true,
            reward: RewardWeights::default(),
            seed: 0,
        }
    }
}

/// What the mount tells the scheduler about itself.
pub struct Setup {
    /// The options that bound the knobs (fixed codec, fixed decoded caching, views, GPU).
    pub mask: Mask,
    /// Cores the worker knob is sized by.
    pub cores: usize,
    /// Prefetch threads (the heuristic's depth estimate).
    pub prefetch_threads: usize,
    /// Whether the cache's decoded-caching rule keeps pixels now (the heuristic's view).
    pub keeps_decoded: Box<dyn Fn() -> bool + Send>,
}

/// Why the knobs are as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Policy,
    Random,
    Heuristic,
    Guard,
    WarmingUp,
    Late,
    Invalid,
    NoPolicy,
}

impl Reason {
    fn name(self) -> &'static str {
        match self {
            Reason::Policy => "policy",
            Reason::Random => "random",
            Reason::Heuristic => "heuristic",
            Reason::Guard => "guard_heuristic",
            Reason::WarmingUp => "no_sample_yet",
            Reason::Late => "fallback_late",
            Reason::Invalid => "fallback_invalid",
            Reason::NoPolicy => "fallback_no_policy",
        }
    }

    fn is_fallback(self) -> bool {
        matches!(self, Reason::Late | Reason::Invalid | Reason::NoPolicy)
    }
}

/// The loaded policy and what it was.
struct Loaded {
    payload: Payload,
    source: String,
}

/// The stats the loop keeps (one lock, taken by the loop and the stats file only).
struct Record {
    mode: Mode,
    policy: Value,
    action: Option<Action>,
    reason: Reason,
    decisions: u64,
    fallbacks: [u64; 3],
    reward_avg: Option<f64>,
    last_reward: Option<f64>,
    latency: Histogram,
    histogram: Vec<Vec<u64>>,
    started: Instant,
    learning: Value,
    guard: Value,
}

/// The scheduler of one mount; stops (and saves a tuned policy) when dropped.
pub struct Scheduler {
    record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Scheduler {
    /// Loads the policy (warning and heuristic fallback when it is unusable) and starts the loop.
    pub fn start(
        options: SchedulerOptions,
        telemetry: Arc<Telemetry>,
        knobs: Arc<Knobs>,
        setup: Setup,
    ) -> Scheduler {
        let loaded = (options.mode == Mode::Policy)
            .then(|| load(&options))
            .flatten();
        let policy = match &loaded {
            Some(l) => json!({
                "source": l.source,
                "command": l.payload.metadata.command,
                "prepfs_version": l.payload.metadata.prepfs_version,
                "steps": l.payload.metadata.steps,
            }),
            None => Value::Null,
        };
        let record = Arc::new(Mutex::new(Record {
            mode: options.mode,
            policy,
            action: None,
            reason: Reason::WarmingUp,
            decisions: 0,
            fallbacks: [0; 3],
            reward_avg: None,
            last_reward: None,
            latency: Histogram::default(),
            histogram: Head::ALL.iter().map(|h| vec![0; h.options()]).collect(),
            started: Instant::now(),
            learning: Value::Null,
            guard: Value::Null,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        // Without a usable policy there is nothing to guard: the fallback says why.
        let guard = (loaded.is_some() && options.guard).then(Guard::default);
        let mut decider = Decider {
            options,
            loaded,
            telemetry,
            knobs,
            setup,
            record: record.clone(),
            rng: fastrand::Rng::new(),
            current: None,
            guard,
            learner: None,
        };
        decider.rng.seed(decider.options.seed);
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("prepfs-scheduler".into())
            .spawn(move || decider.run(&flag))
            .inspect_err(|e| {
                tracing::warn!(error = %e, "cannot start the scheduler; modules keep their heuristics")
            })
            .ok();
        Scheduler {
            record,
            stop,
            thread,
        }
    }

    /// The `scheduler` document of stats.json.
    pub fn to_json(&self) -> Value {
        let r = self.record.lock();
        let counts = r.latency.counts();
        let secs = r.started.elapsed().as_secs_f64().max(1e-3);
        let histogram: serde_json::Map<String, Value> = Head::ALL
            .iter()
            .zip(&r.histogram)
            .map(|(h, counts)| {
                let options: serde_json::Map<String, Value> = counts
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (h.option_name(i).to_owned(), json!(c)))
                    .collect();
                (h.name().to_owned(), Value::Object(options))
            })
            .collect();
        json!({
            "mode": r.mode.name(),
            "policy": r.policy,
            "reason": r.reason.name(),
            "action": r.action.map(|a| a.describe().into_iter().map(|(k, v)| (k.to_owned(), json!(v))).collect::<serde_json::Map<_, _>>()),
            "reward": {"last": r.last_reward, "average": r.reward_avg},
            "decisions": r.decisions,
            "decisions_per_second": r.decisions as f64 / secs,
            "fallbacks": {
                "total": r.fallbacks.iter().sum::<u64>(),
                "late": r.fallbacks[0],
                "invalid": r.fallbacks[1],
                "no_policy": r.fallbacks[2],
            },
            "decision_latency_us": {"p50": quantile_us(&counts, 0.5), "p99": quantile_us(&counts, 0.99)},
            "histogram": histogram,
            "learning": r.learning,
            "guard": r.guard,
        })
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

fn load(options: &SchedulerOptions) -> Option<Loaded> {
    let (result, source) = match &options.policy {
        Some(path) => (Payload::load(path), path.display().to_string()),
        None => (Payload::shipped(), "shipped".to_owned()),
    };
    match result {
        Ok(payload) => Some(Loaded { payload, source }),
        Err(e) => {
            tracing::warn!(policy = %source, error = %e, "policy unusable; the modules' heuristics decide");
            None
        }
    }
}

/// Online fine-tuning in a build without the trainer: no learner ever exists (`validate` refuses
/// `--learn`), so this type has no value and its methods cannot run.
#[cfg(not(feature = "train"))]
enum Online {}

#[cfg(not(feature = "train"))]
impl Online {
    fn new(_: &Payload, _: u64) -> Option<Online> {
        tracing::warn!("{}; the policy acts unchanged", super::WITHOUT_TRAIN);
        None
    }

    fn act(&mut self, _: &[f32; STATE], _: &Mask) -> Option<Action> {
        match *self {}
    }

    fn reward(&mut self, _: f64) {
        match *self {}
    }

    fn discard(&mut self) {
        match *self {}
    }

    fn follow(&mut self, _: &[f32; STATE], _: &Mask, _: &Action) {
        match *self {}
    }

    fn payload(&self) -> &Payload {
        match *self {}
    }

    fn to_json(&self) -> Value {
        match *self {}
    }
}

/// The loop's state (lives on the scheduler thread).
struct Decider {
    options: SchedulerOptions,
    loaded: Option<Loaded>,
    telemetry: Arc<Telemetry>,
    knobs: Arc<Knobs>,
    setup: Setup,
    record: Arc<Mutex<Record>>,
    rng: fastrand::Rng,
    /// The action applied last, with the state it answered (`None`: knobs released).
    current: Option<Action>,
    /// Who acts while a policy runs (`--scheduler policy` with `--policy-guard on`).
    guard: Option<Guard>,
    /// Online fine-tuning (`--learn` with a usable policy).
    learner: Option<Online>,
}

impl Decider {
    fn run(&mut self, stop: &AtomicBool) {
        if self.options.learn {
            self.learner = self
                .loaded
                .as_ref()
                .and_then(|l| Online::new(&l.payload, self.options.seed));
        }
        let mut next = Instant::now() + INTERVAL;
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now < next {
                std::thread::park_timeout(next - now);
                continue;
            }
            next += INTERVAL;
            if next < now {
                next = now + INTERVAL; // the thread was starved: do not burst to catch up
            }
            self.tick();
        }
        self.knobs.release();
        if let (Some(learner), Some(path)) = (&self.learner, &self.options.save) {
            match learner.payload().save(path) {
                Ok(()) => tracing::info!(path = %path.display(), "saved the tuned policy"),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot save the tuned policy")
                }
            }
        }
    }

    fn tick(&mut self) {
        let Some(sample) = self.telemetry.latest() else {
            return;
        };
        let obs = sample.observation;
        let reward = self.options.reward.reward(&obs);
        // The state describes the knobs as they were during the interval just observed.
        let knobs_were = self.current.unwrap_or_else(|| self.heuristic(&obs));
        let state = state_vector(&obs, &knobs_were);
        if let Some(learner) = &mut self.learner {
            learner.reward(reward);
        }
        if let Some(guard) = &mut self.guard {
            let acted = match self.current {
                Some(_) => Actor::Policy,
                None => Actor::Heuristic,
            };
            guard.observe(acted, reward, obs.request_rate > 0.0);
        }
        let started = Instant::now();
        let (decision, reason) = self.decide(&state);
        let elapsed = started.elapsed();
        let (applied, reason) = match decision {
            Some(_) if elapsed > DEADLINE => (None, Reason::Late),
            Some(a) if !self.setup.mask.admits(&a) => (None, Reason::Invalid),
            other => (other, reason),
        };
        match &applied {
            Some(a) => self.knobs.apply(a, self.setup.cores),
            None => self.knobs.release(),
        }
        let described = applied.unwrap_or_else(|| self.heuristic(&obs));
        if applied.is_none()
            && let Some(learner) = &mut self.learner
        {
            if reason == Reason::Guard {
                // The heuristics act in their turn: the policy learns from what they do.
                learner.follow(&state, &self.setup.mask, &described);
            } else {
                learner.discard(); // a fallback: not a decision anyone chose for this state
            }
        }
        self.current = applied;
        let mut r = self.record.lock();
        r.decisions += 1;
        r.latency.record(elapsed);
        r.reason = reason;
        r.action = Some(described);
        r.last_reward = Some(reward);
        r.reward_avg = Some(match r.reward_avg {
            Some(avg) => avg + REWARD_SMOOTHING * (reward - avg),
            None => reward,
        });
        if reason.is_fallback() {
            let i = match reason {
                Reason::Late => 0,
                Reason::Invalid => 1,
                _ => 2,
            };
            r.fallbacks[i] += 1;
        }
        for (i, h) in Head::ALL.iter().enumerate() {
            r.histogram[i][described.get(*h)] += 1;
        }
        if let Some(learner) = &self.learner {
            r.learning = learner.to_json();
        }
        if let Some(guard) = &self.guard {
            r.guard = guard.to_json();
        }
    }

    /// The action for `state`, or `None` to release the knobs, and why.
    fn decide(&mut self, state: &[f32; STATE]) -> (Option<Action>, Reason) {
        let mask = self.setup.mask;
        match self.options.mode {
            Mode::Heuristic => (None, Reason::Heuristic),
            Mode::Random => {
                let rng = &mut self.rng;
                let mut draw = || rng.f64();
                (pick(&[0.0; LOGITS], &mask, Some(&mut draw)), Reason::Random)
            }
            Mode::Policy => {
                if self.guard.as_ref().map(Guard::actor) == Some(Actor::Heuristic) {
                    return (None, Reason::Guard);
                }
                if let Some(learner) = &mut self.learner {
                    return match learner.act(state, &mask) {
                        Some(a) => (Some(a), Reason::Policy),
                        None => (None, Reason::Invalid),
                    };
                }
                let Some(loaded) = &self.loaded else {
                    return (None, Reason::NoPolicy);
                };
                let p = &loaded.payload;
                let (logits, _) = p.network.forward(&p.normalisation.apply(state));
                match pick(&logits, &mask, None) {
                    Some(a) => (Some(a), Reason::Policy),
                    None => (None, Reason::Invalid),
                }
            }
        }
    }

    /// What the modules' heuristics are doing, as an action (stats, and the state's knobs).
    fn heuristic(&self, obs: &Observation) -> Action {
        let ctx = heuristic::Context {
            prefetch_threads: self.setup.prefetch_threads,
            keep_decoded: (self.setup.keeps_decoded)(),
        };
        heuristic::action(obs, &self.setup.mask, &ctx)
    }
}
