//! The guard of a policy-run mount: who acts each interval, the policy or the modules'
//! heuristics, so that a user never pays for a policy that does worse than the default.
//!
//! Owns: the running reward of each (over the busy intervals of its latest turn: the
//! heuristics' figure is always from their last turn, the policy's from its turn so far), the
//! turns, and the hand-over rule. The heuristics act first, long enough to measure them; then
//! the policy acts. Once the policy has acted for `TRIAL` busy intervals, a running reward
//! below the heuristics' (by more than `margin`) hands the knobs back to the heuristics for a
//! hold that doubles with each hand-over in a row (`HOLD` to `MAX_HOLD`); after the hold the
//! policy is tried again. A policy that keeps its turn for `PROBE_EVERY` busy intervals gives
//! the heuristics `PROBE` intervals to refresh their figure (the load may have changed since: a
//! figure from another load would judge the policy against the wrong bar), then is judged
//! against it at once (its own figure carries over a probe), and its hold starts again from
//! `HOLD`. The first probes come sooner (`FIRST_PROBE`, doubling to `PROBE_EVERY`): the
//! heuristics' first figure is from the mount's first seconds, a cold cache's, a bar that any
//! policy acting on a warmer cache clears. Idle intervals (no requests) say nothing about either and are not counted. Must
//! never set a knob or look at telemetry itself: `runtime` feeds it rewards and asks it whose
//! turn it is.

use serde_json::{Value, json};

/// Busy intervals the heuristics act at the start and the policy before it is judged (5 s).
const TRIAL: u32 = 25;
/// The first hold after a hand-over (10 s); doubled per hand-over in a row.
const HOLD: u32 = 50;
/// The longest hold (about 5 min of busy intervals).
const MAX_HOLD: u32 = 1_600;
/// Busy intervals of the policy's turn between probes of the heuristics (30 s): the heuristics'
/// figure is at most this old. At the heuristics' level, so it costs a user only a policy
/// better than them, and at most 1/16 of that once the first probes (below) are past.
const PROBE_EVERY: u32 = 150;
/// Busy intervals of the policy's first turn before the first probe (5 s); each probe doubles
/// the wait for the next, up to `PROBE_EVERY` (probes at 5, 10, 20, then every 30 s of the
/// policy's turn: 3 probes, 6 s of the heuristics, in its first minute).
const FIRST_PROBE: u32 = TRIAL;
/// Busy intervals of a probe (2 s).
const PROBE: u32 = 10;
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

/// A running average that starts at its first value, and how many values it has seen.
#[derive(Debug, Clone, Copy, Default)]
struct Running {
    avg: Option<f64>,
    n: u32,
}

impl Running {
    fn add(&mut self, x: f64) {
        self.avg = Some(match self.avg {
            Some(avg) => avg + SMOOTHING * (x - avg),
            None => x,
        });
        self.n = self.n.saturating_add(1);
    }
}

/// Whose turn it is, and for how many more busy intervals (the heuristics; `probe`: a probe, after
/// which the policy's figure still stands) or how many since its turn or its last probe (the
/// policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Heuristic { left: u32, probe: bool },
    Policy { acted: u32 },
}

/// The guard of one mount.
#[derive(Debug)]
pub struct Guard {
    turn: Turn,
    /// The heuristics' running reward in their current or last turn.
    heuristic: Running,
    /// Their turn has begun and not been measured yet: the next figure starts afresh.
    heuristic_turn_begun: bool,
    /// The policy's running reward in its current turn (reset when a turn starts: an old turn's
    /// figure is not this one's).
    policy: Running,
    /// The next hold.
    hold: u32,
    /// Busy intervals of the policy's turn before the next probe.
    probe_after: u32,
    handovers: u64,
    probes: u64,
}

impl Default for Guard {
    fn default() -> Guard {
        Guard {
            turn: Turn::Heuristic {
                left: TRIAL,
                probe: false,
            },
            heuristic: Running::default(),
            heuristic_turn_begun: false,
            policy: Running::default(),
            hold: HOLD,
            probe_after: FIRST_PROBE,
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
            Actor::Heuristic => {
                if std::mem::take(&mut self.heuristic_turn_begun) {
                    self.heuristic = Running::default();
                }
                self.heuristic.add(reward);
            }
            Actor::Policy => self.policy.add(reward),
        }
        // A fallback interval in the policy's turn was the heuristics' (counted above as theirs)
        // and does not advance the turn; the heuristics' turn counts busy intervals.
        self.turn = match (self.turn, actor) {
            (Turn::Heuristic { left, probe }, Actor::Heuristic) if left > 1 => Turn::Heuristic {
                left: left - 1,
                probe,
            },
            (Turn::Heuristic { probe, .. }, Actor::Heuristic) => {
                // After a probe the policy's figure still stands (it is judged on its next
                // interval); after a hold it is another turn's.
                if !probe {
                    self.policy = Running::default();
                }
                Turn::Policy { acted: 0 }
            }
            (Turn::Policy { acted }, Actor::Policy) => self.judge(acted + 1),
            (turn, _) => turn,
        };
    }

    /// The turn after the policy's `acted`-th busy interval (since its turn or last probe).
    fn judge(&mut self, acted: u32) -> Turn {
        let (Some(policy), Some(heuristic)) = (self.policy.avg, self.heuristic.avg) else {
            return Turn::Policy { acted };
        };
        if self.policy.n < TRIAL {
            return Turn::Policy { acted };
        }
        let margin = (heuristic.abs() * MARGIN_SHARE).max(MARGIN_MIN);
        if policy < heuristic - margin {
            self.handovers += 1;
            self.heuristic_turn_begun = true;
            let left = self.hold;
            self.hold = (self.hold * 2).min(MAX_HOLD);
            Turn::Heuristic { left, probe: false }
        } else if acted >= self.probe_after {
            self.probes += 1;
            self.probe_after = (self.probe_after * 2).min(PROBE_EVERY);
            self.hold = HOLD;
            self.heuristic_turn_begun = true;
            Turn::Heuristic {
                left: PROBE,
                probe: true,
            }
        } else {
            Turn::Policy { acted }
        }
    }

    /// The `guard` part of the scheduler's stats.
    pub fn to_json(&self) -> Value {
        let (acting, left) = match self.turn {
            Turn::Heuristic { left, .. } => ("heuristic", Some(left)),
            Turn::Policy { .. } => ("policy", None),
        };
        json!({
            "acting": acting,
            "heuristic_turn_left": left,
            "policy_reward": self.policy.avg,
            "heuristic_reward": self.heuristic.avg,
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
        // The first measurement, then a probe after FIRST_PROBE of the policy's intervals, the
        // wait doubling per probe up to PROBE_EVERY.
        let (mut at, mut wait, mut probes, mut probing) = (TRIAL, FIRST_PROBE, 0, 0);
        while at + wait <= 3_000 {
            probes += 1;
            probing += PROBE.min(3_000 - at - wait);
            at += wait + PROBE;
            wait = (wait * 2).min(PROBE_EVERY);
        }
        assert_eq!(g.probes, probes);
        assert_eq!(heuristic, TRIAL + probing);
        assert_eq!(policy + heuristic, 3_000);
        assert!(policy > 2_700, "{policy}");
    }

    /// The heuristics' first figure comes from a cold cache: a policy that clears it but trails
    /// the heuristics on the warm cache loses the knobs after the first, early probe, not 30 s on.
    #[test]
    fn an_early_probe_judges_the_policy_against_the_heuristics_on_a_warm_cache() {
        let mut g = Guard::default();
        run(&mut g, TRIAL, by(0.0, -4.0));
        assert_eq!(g.actor(), Actor::Policy);
        let mut seen = 0;
        while g.handovers == 0 {
            run(&mut g, 1, by(-2.0, -1.0));
            seen += 1;
            // Its trial, the probe, and the interval it is judged on.
            assert!(seen <= TRIAL + PROBE + 1, "{}", g.to_json());
        }
        assert_eq!(g.probes, 1);
        assert_eq!(g.actor(), Actor::Heuristic);
    }

    #[test]
    fn an_equal_policy_within_the_noise_is_not_handed_over() {
        let mut g = Guard::default();
        let mut i = 0u32;
        // Both at -10 +- 0.3: within the 5% margin.
        run(&mut g, 3_000, |_| {
            i += 1;
            -10.0 + if i.is_multiple_of(2) { 0.3 } else { -0.3 }
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

    /// The load changes while the policy acts and the heuristics would now do better: a probe
    /// (at most two probe periods on: one may straddle the change) measures them afresh and the
    /// policy hands over at once.
    #[test]
    fn a_probe_finds_the_heuristics_better_and_the_policy_hands_over_at_once() {
        let mut g = Guard::default();
        run(&mut g, 500, by(-1.0, -2.0));
        assert_eq!(g.handovers, 0);
        let mut seen = 0;
        while g.handovers == 0 {
            run(&mut g, 1, by(-1.0, -0.5));
            seen += 1;
            assert!(seen <= 2 * (PROBE_EVERY + PROBE), "{}", g.to_json());
        }
        assert_eq!(g.actor(), Actor::Heuristic);
        run(&mut g, 1, by(-1.0, -0.5));
        assert_eq!(g.to_json()["heuristic_reward"], -0.5);
    }

    #[test]
    fn idle_and_fallback_intervals_do_not_move_the_turns() {
        let mut g = Guard::default();
        for _ in 0..1_000 {
            g.observe(Actor::Heuristic, 0.0, false);
        }
        assert_eq!(
            g.turn,
            Turn::Heuristic {
                left: TRIAL,
                probe: false
            }
        );
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
