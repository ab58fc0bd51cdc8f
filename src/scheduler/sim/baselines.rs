//! The policies the learned one is compared with in the simulator: a static CPU-only setting,
//! the heuristic fallback as it would run on a scenario's machine, and round-robin placement.
//!
//! Owns: those baselines and the simulator's policy signature. Must never hold a rule of its
//! own beyond the baseline's definition: the heuristic baseline calls `scheduler::heuristic`,
//! which calls the modules' rules.

use super::scenario::Scenario;
use crate::cache::policy::{DecodedCaching, PixelSignals, keep_decoded};
use crate::control::action::{Action, Head, Mask};
use crate::control::observation::Observation;
use crate::scheduler::heuristic::{self, Context};

/// A policy as the simulator runs it: (observation, the action in force, mask, step index).
pub type Policy<'a> = dyn Fn(&Observation, &Action, &Mask, usize) -> Action + 'a;

/// Static CPU-only baseline: decode and augment on the CPU, no codec, prefetch depth 16, one
/// worker per core, no decoded caching, whatever happens.
pub fn static_cpu(_: &Observation, _: &Action, _: &Mask, _: usize) -> Action {
    Action::default()
        .with(Head::Depth, 1)
        .with(Head::Workers, 2)
}

/// The heuristic fallback as it would run on `scenario`'s machine (prefetch threads = the
/// source's concurrency; decoded caching from `cache::policy::keep_decoded` in auto mode).
pub fn heuristic_policy(
    scenario: &Scenario,
) -> impl Fn(&Observation, &Action, &Mask, usize) -> Action + use<> {
    let (threads, decode, pixels) = (
        scenario.source.concurrency,
        scenario.costs.decode_s,
        scenario.costs.pixel_bytes as u64,
    );
    move |obs: &Observation, current: &Action, mask: &Mask, _: usize| {
        let signals = PixelSignals {
            decode_s_per_byte: decode / pixels.max(1) as f64,
            source_bytes_per_s: (obs.source_bytes_per_s > 0.0).then_some(obs.source_bytes_per_s),
            working_set_fit: obs.whole_working_set_fit(),
        };
        let keep = keep_decoded(DecodedCaching::Auto, &signals, None, current.decoded());
        let ctx = Context {
            prefetch_threads: threads,
            keep_decoded: keep.keeps(),
        };
        heuristic::action(obs, mask, &ctx)
    }
}

/// Round-robin baseline: the heuristic's knobs, with (decode, augment) placement cycling each
/// step through the combinations the mask allows.
pub fn round_robin(
    scenario: &Scenario,
) -> impl Fn(&Observation, &Action, &Mask, usize) -> Action + use<> {
    let heuristic = heuristic_policy(scenario);
    move |obs: &Observation, current: &Action, mask: &Mask, step: usize| {
        let combos: Vec<(usize, usize)> = [(0, 0), (1, 0), (0, 1), (1, 1)]
            .into_iter()
            .filter(|(d, a)| mask.allows(Head::Decode, *d) && mask.allows(Head::Augment, *a))
            .collect();
        let (d, a) = combos
            .get(step % combos.len().max(1))
            .copied()
            .unwrap_or((0, 0));
        heuristic(obs, current, mask, step)
            .with(Head::Decode, d)
            .with(Head::Augment, a)
    }
}
