//! From the policy's logits to an action: per-head log-softmax under the machine's mask, and a
//! greedy or sampled pick.
//!
//! Owns: the masking of logits and the pick, shared by the mounted scheduler and the trainer
//! (PPO, online learning, rollouts in the simulator). Must never let a masked option be picked, and never turn a
//! non-finite logit into an action: the caller falls back to the heuristic instead.

use crate::control::action::{Action, Head, LOGITS, Mask};

/// The logit of a masked option: exp() underflows to 0 without making 0 * log(0) a NaN.
pub const MASKED: f32 = -1e9;

/// `logits` with the options `mask` refuses pushed to `MASKED` (not -inf: the entropy stays
/// finite).
fn masked(logits: &[f32; LOGITS], mask: &Mask) -> [f32; LOGITS] {
    let mut out = *logits;
    for (l, ok) in out.iter_mut().zip(mask.0) {
        if !ok {
            *l = MASKED;
        }
    }
    out
}

/// Per head, the log-probabilities of its options under masked `logits` (log-softmax per head).
pub fn log_probs(logits: &[f32; LOGITS], mask: &Mask) -> [f32; LOGITS] {
    let masked = masked(logits, mask);
    let mut out = [0.0; LOGITS];
    for head in Head::ALL {
        let range = head.offset()..head.offset() + head.options();
        let max = masked[range.clone()]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = masked[range.clone()].iter().map(|l| (l - max).exp()).sum();
        let log_sum = max + sum.ln();
        for i in range {
            out[i] = masked[i] - log_sum;
        }
    }
    out
}

/// Picks an action from `logits`: the most likely allowed option per head when `draw` is
/// `None`, else a sample (each head consumes one uniform number in 0..1 from `draw`). `None`
/// when a logit is not finite: the caller falls back to the heuristic.
pub fn pick(
    logits: &[f32; LOGITS],
    mask: &Mask,
    mut draw: Option<&mut dyn FnMut() -> f64>,
) -> Option<Action> {
    if logits.iter().any(|l| !l.is_finite()) {
        return None;
    }
    let lp = log_probs(logits, mask);
    let mut action = Action::default();
    for head in Head::ALL {
        let off = head.offset();
        let allowed = (0..head.options()).filter(|i| mask.allows(head, *i));
        let choice = match draw.as_mut() {
            None => allowed.max_by(|a, b| lp[off + a].total_cmp(&lp[off + b]))?,
            Some(draw) => {
                let u = draw();
                let mut acc = 0.0;
                let mut last = None;
                let mut chosen = None;
                for i in allowed {
                    acc += f64::from(lp[off + i].exp());
                    last = Some(i);
                    if u < acc {
                        chosen = Some(i);
                        break;
                    }
                }
                chosen.or(last)?
            }
        };
        action = action.with(head, choice);
    }
    Some(action)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::action::Placement;

    #[test]
    fn masked_options_are_never_picked_however_strong_their_logits() {
        let mut logits = [0.0f32; LOGITS];
        logits[Head::Decode.offset() + 1] = 50.0; // the policy loves the GPU...
        logits[Head::Workers.offset()] = 50.0;
        let mask = Mask::new(false, true); // ...which this machine lacks.
        let greedy = pick(&logits, &mask, None).unwrap();
        assert_eq!(greedy.decode(), Placement::Cpu);
        assert_eq!(
            greedy.get(Head::Workers),
            0,
            "unmasked preferences still win"
        );
        let mut seq = [0.999, 0.5, 0.0].into_iter().cycle();
        let mut draw = || seq.next().unwrap();
        for _ in 0..100 {
            let a = pick(&logits, &mask, Some(&mut draw)).unwrap();
            assert!(mask.admits(&a), "{a:?}");
        }
        let lp = log_probs(&logits, &mask);
        assert!(
            lp.iter().all(|l| l.is_finite()),
            "masking keeps log-probs finite"
        );
        assert!((lp[Head::Decode.offset()]).abs() < 1e-6, "all mass on cpu");
        let no_views = Mask::new(true, false);
        assert!(!no_views.allows(Head::Workers, 0) && no_views.allows(Head::Workers, 2));
        assert!(no_views.admits(&Action::default().with(Head::Workers, 2)));
    }

    #[test]
    fn non_finite_logits_are_refused() {
        let mut logits = [0.0f32; LOGITS];
        logits[5] = f32::NAN;
        assert_eq!(pick(&logits, &Mask::default(), None), None);
    }
}
