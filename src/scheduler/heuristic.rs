//! The heuristic the scheduler falls back to, written as an action so the simulator can run it
//! side by side with the learned policy.
//!
//! Owns: nothing of its own. It restates the rules each module applies when the scheduler is
//! off or falls back (the cache's codec policy, the prefetcher's depth controller, the render
//! pool's size, the decoded-caching rule, the views' GPU placement rule) by calling them. In the
//! mount a fallback does not apply this action: it hands each knob back to its module. Must
//! never diverge from those modules: it calls their rules where they are functions, and holds
//! no rule of its own.

use crate::cache::policy::{CodecPolicy, Heuristic as CodecHeuristic, Signals};
use crate::control::action::{Action, CODECS, DEPTHS, Head, Mask};
use crate::control::observation::Observation;
use crate::prefetch::controller_depth;
use crate::view::gpu::prefers_gpu;

/// What the heuristic needs beyond the observation.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    /// Prefetch jobs at once (`--prefetch-threads`; the depth controller adds them to its
    /// estimate).
    pub prefetch_threads: usize,
    /// Whether the decoded-caching rule (`cache::policy::keep_decoded`) keeps pixels here.
    pub keep_decoded: bool,
}

/// The modules' own choices for `obs`, within `mask`.
pub fn action(obs: &Observation, mask: &Mask, ctx: &Context) -> Action {
    let signals = Signals {
        cpu_idle: 1.0 - obs.cpu_busy,
        source_bytes_per_s: (obs.source_bytes_per_s > 0.0).then_some(obs.source_bytes_per_s),
    };
    let codec = CodecHeuristic.choose(&signals).codec;
    let codec = CODECS.iter().position(|c| *c == codec).unwrap_or(0);
    // The prefetcher's controller, with the source's fetch time for a file's; the smallest
    // option that covers it.
    let want = controller_depth(obs.request_rate, obs.source_latency_s, ctx.prefetch_threads);
    let depth = DEPTHS
        .iter()
        .position(|d| *d >= want)
        .unwrap_or(DEPTHS.len() - 1);
    let gpu = usize::from(prefers_gpu(obs));
    let mut a = Action::default()
        .with(Head::Decode, gpu)
        .with(Head::Augment, gpu)
        .with(Head::Codec, codec)
        .with(Head::Depth, depth)
        .with(Head::Workers, 2)
        .with(Head::Decoded, usize::from(ctx.keep_decoded));
    // Whatever the rules say, stay inside the mask (first allowed option of a refused head).
    for head in Head::ALL {
        if !mask.allows(head, a.get(head))
            && let Some(i) = (0..head.options()).find(|i| mask.allows(head, *i))
        {
            a = a.with(head, i);
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::action::Placement;
    use crate::control::codec::Codec;
    use crate::control::observation::GpuObservation;

    #[test]
    fn the_heuristic_restates_the_module_rules() {
        let ctx = Context {
            prefetch_threads: 2,
            keep_decoded: false,
        };
        let idle = Observation {
            cpu_busy: 0.1,
            source_bytes_per_s: 50e6,
            request_rate: 100.0,
            source_latency_s: 0.05,
            ..Observation::default()
        };
        let a = action(&idle, &Mask::default(), &ctx);
        assert_eq!(a.codec(), Codec::Zstd(3));
        assert_eq!(a.depth(), 16, "100/s * 50 ms * 2 + 2 = 12 -> 16");
        assert_eq!(a.decode(), Placement::Cpu);
        assert!(!a.decoded());
        let busy_with_gpu = Observation {
            cpu_busy: 0.95,
            gpu: Some(GpuObservation {
                busy: 0.1,
                memory_free: 0.9,
            }),
            ..idle
        };
        let a = action(&busy_with_gpu, &Mask::new(true, true), &ctx);
        assert_eq!((a.decode(), a.codec()), (Placement::Gpu, Codec::None));
        let masked = action(&busy_with_gpu, &Mask::new(false, true), &ctx);
        assert_eq!(masked.decode(), Placement::Cpu, "the mask wins");
    }
}
