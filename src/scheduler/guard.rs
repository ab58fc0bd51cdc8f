//! The guard of a policy-run mount: who acts each interval, the policy or the modules'
//! heuristics, so that a user never pays for a policy that does worse than the default.
//!
//! Owns: the running reward of each (over the intervals each acted in while requests came), the
//! turns, and the hand-over rule. The heuristics act first, long enough to measure them; then the
//! policy acts. Once the policy has acted for `TRIAL` busy intervals, a running reward below the
//! heuristics' (by more than `margin`) hands the knobs back to the heuristics for a hold that
//! doubles with each hand-over in a row (`HOLD` to `MAX_HOLD`); after the hold the policy is
//! tried again. A policy that keeps its turn for `PROBE_EVERY` busy intervals gives the
//! heuristics `PROBE` intervals to refresh their figure (the load may have changed since), and
//! its hold starts again from `HOLD`. Idle intervals (no requests) say nothing about either and
//! are not counted. Must never set a knob or look at telemetry itself: `runtime` feeds it rewards
//! and asks it whose turn it is.

use serde_json::{Value, json};

/// Busy intervals the heuristics act at the start and the policy before it is judged (5 s).
const TRIAL: u32 = 25;
/// The first hold after a hand-over (10 s); doubled per hand-over in a row.
const HOLD: u32 = 50;
/// The longest hold (about 5 min of busy intervals).
const MAX_HOLD: u32 = 1_600;
/// Busy intervals of the policy's turn between probes of the heuristics (60 s).
const PROBE_EVERY: u32 = 300;
/// Busy intervals of a probe (3 s).
const PROBE: u32 = 15;
/// Weight of a new reward in each running figure (about the last 10 busy intervals).
const SMOOTHING: f64 = 0.1;
/// The policy may trail the heuristics by this share of their reward before it loses its turn
/// (rewards are noisy: two equal deciders must not trade turns) ...
const MARGIN_SHARE: f64 = 0.05;
/// ... or by this much, whichever is larger (0.05 ms of latency with the default weights).
const MARGIN_MIN: f64 = 0.05;

/// Who sets the knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    Policy,
    Heuristic,
}

/// A running average that starts at its first value.
#[derive(Debug, Clone, Copy, Default)]
struct Running(Option<f64>);

impl Running {
    fn add(&mut self, x: f64) {
        self.0 = Some(match self.0 {
            Some(avg) => avg + SMOOTHING * (x - avg),
            None => x,
        });
    }
}

/// Whose turn it is, and for how many more busy intervals (the heuristics) or how many so far
/// (the policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Heuristic { left: u32 },
    Policy { acted: u32 },
}

/// The guard of one mount.
#[derive(Debug)]
pub struct Guard {
    turn: Turn,
    heuristic: Running,
    /// The policy's running reward in its current turn (reset when a turn starts: an old turn's
    /// figure is not this one's).
    policy: Running,
    /// The next hold.
    hold: u32,
    handovers: u64,
    probes: u64,
}

impl Default for Guard {
    fn default() -> Guard {
        Guard {
            turn: Turn::Heuristic { left: TRIAL },
            heuristic: Running::default(),
            policy: Running::default(),
            hold: HOLD,
            handovers: 0,
            probes: 0,
        }
    }
}

impl Guard {
    /// Who acts next.
    pub fn actor(&self) -> Actor {
        match self.turn {
            Turn::Heuristic { .. } => Actor::Heuristic,
            Turn::Policy { .. } => Actor::Policy,
        }
    }

    /// The reward of an interval `actor` set the knobs in (`busy`: requests came in it), and the
    /// turn that follows.
    pub fn observe(&mut self, actor: Actor, reward: f64, busy: bool) {
        if !busy || !reward.is_finite() {
            return;
        }
        match actor {
            Actor::Heuristic => self.heuristic.add(reward),
            Actor::Policy => self.policy.add(reward),
        }
        // A fallback interval in the policy's turn was the heuristics' (counted above as theirs)
        // and does not advance the turn; the heuristics' turn counts busy intervals.
        self.turn = match (self.turn, actor) {
            (Turn::Heuristic { left }, Actor::Heuristic) if left > 1 => {
                Turn::Heuristic { left: left - 1 }
            }
            (Turn::Heuristic { .. }, Actor::Heuristic) => {
                self.policy = Running::default();
                Turn::Policy { acted: 0 }
            }
            (Turn::Policy { acted }, Actor::Policy) => self.judge(acted + 1),
            (turn, _) => turn,
        };
    }

    /// The turn after the policy's `acted`-th busy interval.
    fn judge(&mut self, acted: u32) -> Turn {
        if acted < TRIAL {
            return Turn::Policy { acted };
        }
        let (Some(policy), Some(heuristic)) = (self.policy.0, self.heuristic.0) else {
            return Turn::Policy { acted };
        };
        let margin = (heuristic.abs() * MARGIN_SHARE).max(MARGIN_MIN);
        if policy < heuristic - margin {
            self.handovers += 1;
            let left = self.hold;
            self.hold = (self.hold * 2).min(MAX_HOLD);
            Turn::Heuristic { left }
        } else if acted >= PROBE_EVERY {
            self.probes += 1;
            self.hold = HOLD;
            Turn::Heuristic { left: PROBE }
        } else {
            Turn::Policy { acted }
        }
    }

    /// The `guard` part of the scheduler's stats.
    pub fn to_json(&self) -> Value {
        let (acting, left) = match self.turn {
            Turn::Heuristic { left } => ("heuristic", Some(left)),
            Turn::Policy { .. } => ("policy", None),
        };
        json!({
            "acting": acting,
            "heuristic_turn_left": left,
            "policy_reward": self.policy.0,
            "heuristic_reward": self.heuristic.0,
            "handovers": self.handovers,
            "probes": self.probes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` busy intervals, each rewarded by who acts; returns the intervals each acted.
    fn run(g: &mut Guard, n: u32, mut reward: impl FnMut(Actor) -> f64) -> (u32, u32) {
        let (mut policy, mut heuristic) = (0, 0);
        for _ in 0..n {
            let actor = g.actor();
            match actor {
                Actor::Policy => policy += 1,
                Actor::Heuristic => heuristic += 1,
            }
            g.observe(actor, reward(actor), true);
        }
        (policy, heuristic)
    }

    fn by(policy: f64, heuristic: f64) -> impl Fn(Actor) -> f64 {
        move |a| match a {
            Actor::Policy => policy,
            Actor::Heuristic => heuristic,
        }
    }

    #[test]
    fn a_better_policy_keeps_the_knobs_but_for_short_probes() {
        let mut g = Guard::default();
        let (policy, heuristic) = run(&mut g, 3_000, by(-1.0, -2.0));
        assert_eq!(g.handovers, 0, "{}", g.to_json());
        // The first measurement, then one probe per PROBE_EVERY of the policy's intervals.
        assert!(g.probes >= 8, "{}", g.to_json());
        assert_eq!(heuristic, TRIAL + g.probes as u32 * PROBE);
        assert_eq!(policy + heuristic, 3_000);
        assert!(policy > 2_700, "{policy}");
    }

    #[test]
    fn an_equal_policy_within_the_noise_is_not_handed_over() {
        let mut g = Guard::default();
        let mut i = 0u32;
        // Both at -10 +- 0.3: within the 5% margin.
        run(&mut g, 3_000, |_| {
            i += 1;
            -10.0 + if i % 2 == 0 { 0.3 } else { -0.3 }
        });
        assert_eq!(g.handovers, 0, "{}", g.to_json());
    }

    #[test]
    fn a_worse_policy_loses_the_knobs_within_a_trial_and_waits_longer_each_time() {
        let mut g = Guard::default();
        run(&mut g, TRIAL, by(-5.0, -1.0));
        assert_eq!(g.actor(), Actor::Policy);
        run(&mut g, TRIAL, by(-5.0, -1.0));
        assert_eq!(g.actor(), Actor::Heuristic, "{}", g.to_json());
        assert_eq!(g.handovers, 1);
        // The hold doubles with each hand-over in a row, so the policy acts an ever smaller share.
        let (policy, heuristic) = run(&mut g, 2_000, by(-5.0, -1.0));
        assert!(g.handovers >= 4, "{}", g.to_json());
        assert!(
            policy * 10 < heuristic,
            "policy {policy}, heuristic {heuristic}"
        );
        assert_eq!(g.to_json()["heuristic_reward"], -1.0);
    }

    #[test]
    fn a_policy_that_recovers_gets_the_knobs_back_and_its_hold_resets() {
        let mut g = Guard::default();
        run(&mut g, 500, by(-5.0, -1.0));
        let after = g.handovers;
        assert!(after >= 2);
        // The load changes: now the policy does better. It acts again after the current hold
        // and keeps the knobs.
        run(&mut g, 2 * MAX_HOLD, by(-1.0, -5.0));
        assert_eq!(g.handovers, after, "{}", g.to_json());
        assert_eq!(g.hold, HOLD, "a probe survived resets the hold");
        // The heuristics' figure followed the load (refreshed by its probes).
        assert_eq!(
            g.to_json()["heuristic_reward"].as_f64().map(|r| r < -4.9),
            Some(true)
        );
    }

    #[test]
    fn idle_and_fallback_intervals_do_not_move_the_turns() {
        let mut g = Guard::default();
        for _ in 0..1_000 {
            g.observe(Actor::Heuristic, 0.0, false);
        }
        assert_eq!(g.turn, Turn::Heuristic { left: TRIAL });
        run(&mut g, TRIAL, by(-1.0, -1.0));
        assert_eq!(g.actor(), Actor::Policy);
        // Fallbacks in the policy's turn: the heuristics' figure, not a step of the turn.
        for _ in 0..1_000 {
            g.observe(Actor::Heuristic, -1.0, true);
        }
        assert_eq!(g.turn, Turn::Policy { acted: 0 });
        g.observe(Actor::Policy, f64::NAN, true);
        assert_eq!(g.turn, Turn::Policy { acted: 0 });
    }
}
