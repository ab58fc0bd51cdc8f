//! The knobs the scheduler sets and the modules read: codec of new cache entries, prefetch depth,
//! decode workers, decoded caching, decode and augment placement.
//!
//! Owns: one atomic per knob. Each knob is either held by the scheduler (a value) or released
//! (`None`): then its module applies its own heuristic, which is also what a scheduler fallback
//! does. Reading a knob is one relaxed load, so modules may read it anywhere. Must never decide
//! anything: the scheduler writes, the modules read.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use super::action::{Action, CODECS, Placement};
use super::codec::Codec;

/// The knobs of one mount.
#[derive(Debug, Default)]
pub struct Knobs {
    /// 0: released; i + 1: `CODECS[i]`.
    codec: AtomicU8,
    /// 0: released; else files.
    depth: AtomicUsize,
    /// 0: released; else threads.
    workers: AtomicUsize,
    /// 0: released; 1: off; 2: on.
    decoded: AtomicU8,
    /// 0: released; 1: cpu; 2: gpu.
    decode: AtomicU8,
    /// 0: released; 1: cpu; 2: gpu.
    augment: AtomicU8,
}

fn placement_code(p: Placement) -> u8 {
    match p {
        Placement::Cpu => 1,
        Placement::Gpu => 2,
    }
}

fn placement_of(code: u8) -> Option<Placement> {
    match code {
        1 => Some(Placement::Cpu),
        2 => Some(Placement::Gpu),
        _ => None,
    }
}

impl Knobs {
    /// Holds every knob at `action`'s choice (`cores` sizes the worker count).
    pub fn apply(&self, action: &Action, cores: usize) {
        let codec = CODECS
            .iter()
            .position(|c| *c == action.codec())
            .unwrap_or(0);
        self.codec.store(codec as u8 + 1, Ordering::Relaxed);
        self.depth.store(action.depth(), Ordering::Relaxed);
        self.workers.store(action.workers(cores), Ordering::Relaxed);
        self.decoded
            .store(if action.decoded() { 2 } else { 1 }, Ordering::Relaxed);
        self.decode
            .store(placement_code(action.decode()), Ordering::Relaxed);
        self.augment
            .store(placement_code(action.augment()), Ordering::Relaxed);
    }

    /// Hands every knob back to its module's heuristic.
    pub fn release(&self) {
        self.codec.store(0, Ordering::Relaxed);
        self.depth.store(0, Ordering::Relaxed);
        self.workers.store(0, Ordering::Relaxed);
        self.decoded.store(0, Ordering::Relaxed);
        self.decode.store(0, Ordering::Relaxed);
        self.augment.store(0, Ordering::Relaxed);
    }

    /// The codec for new cache entries, when held.
    pub fn codec(&self) -> Option<Codec> {
        let i = usize::from(self.codec.load(Ordering::Relaxed));
        i.checked_sub(1).and_then(|i| CODECS.get(i).copied())
    }

    /// The prefetch depth in files, when held.
    pub fn depth(&self) -> Option<usize> {
        Some(self.depth.load(Ordering::Relaxed)).filter(|d| *d > 0)
    }

    /// The number of decode workers, when held.
    pub fn workers(&self) -> Option<usize> {
        Some(self.workers.load(Ordering::Relaxed)).filter(|w| *w > 0)
    }

    /// Whether renders keep decoded pixels, when held.
    pub fn decoded(&self) -> Option<bool> {
        match self.decoded.load(Ordering::Relaxed) {
            1 => Some(false),
            2 => Some(true),
            _ => None,
        }
    }

    /// Where decoding runs, when held.
    pub fn decode(&self) -> Option<Placement> {
        placement_of(self.decode.load(Ordering::Relaxed))
    }

    /// Where augmentation runs, when held.
    pub fn augment(&self) -> Option<Placement> {
        placement_of(self.augment.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::action::Head;

    #[test]
    fn knobs_are_held_by_the_scheduler_until_released() {
        let knobs = Knobs::default();
        assert_eq!(
            (knobs.codec(), knobs.depth(), knobs.workers()),
            (None, None, None)
        );
        let a = Action::default()
            .with(Head::Codec, 1)
            .with(Head::Depth, 2)
            .with(Head::Workers, 3)
            .with(Head::Decoded, 1);
        knobs.apply(&a, 2);
        assert_eq!(knobs.codec(), Some(Codec::Lz4));
        assert_eq!(knobs.depth(), Some(64));
        assert_eq!(knobs.workers(), Some(4));
        assert_eq!(knobs.decoded(), Some(true));
        assert_eq!(knobs.decode(), Some(Placement::Cpu));
        knobs.release();
        assert_eq!(knobs.decoded(), None);
    }
}
