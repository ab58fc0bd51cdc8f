//! Actions: one factored, discrete choice of every knob the scheduler drives, and the masks that
//! rule out what this machine cannot do.
//!
//! Owns: the action schema, one table (`HEADS`: every head in logits order with its options'
//! names), from which the logits layout and its length are derived; it is part of
//! `scheduler::state::SCHEMA_VERSION`, derived too, so a policy file trained on another table is
//! refused. Adding a knob is one entry here, its variant of `Head`, and its rule where it acts
//! (`control::knobs`, the heuristic, the simulator). Must never touch a knob itself
//! (`control::knobs` applies actions) and never pick an action (`scheduler::logits` does).

use super::codec::Codec;

/// Where a view's decode (or augmentation) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// The render pool's threads.
    Cpu,
    /// The GPU backend (masked while the mount has none).
    Gpu,
}

/// One head of the factored action: a knob (its options: `HEADS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Decode placement.
    Decode,
    /// Augmentation placement.
    Augment,
    /// Codec of new cache entries: `CODECS`.
    Codec,
    /// Prefetch depth (files queued ahead): `DEPTHS`.
    Depth,
    /// Decode workers, as multiples of the cores: `WORKER_SHARES`.
    Workers,
    /// Whether view renders keep decoded pixels.
    Decoded,
}

/// One head as the schema lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadSpec {
    /// The head (its `as usize` is its place in `HEADS`).
    pub head: Head,
    /// A stable snake_case name for stats and artifacts.
    pub name: &'static str,
    /// Its options' names, in option order (stats, the action histogram).
    pub options: &'static [&'static str],
}

/// The action schema: every head, in logits order.
pub const HEADS: &[HeadSpec] = &[
    HeadSpec {
        head: Head::Decode,
        name: "decode",
        options: &["cpu", "gpu"],
    },
    HeadSpec {
        head: Head::Augment,
        name: "augment",
        options: &["cpu", "gpu"],
    },
    HeadSpec {
        head: Head::Codec,
        name: "codec",
        options: &["none", "lz4", "zstd-1", "zstd-3"],
    },
    HeadSpec {
        head: Head::Depth,
        name: "prefetch_depth",
        options: &["4", "16", "64", "128"],
    },
    HeadSpec {
        head: Head::Workers,
        name: "workers",
        options: &["0.25x_cores", "0.5x_cores", "1x_cores", "2x_cores"],
    },
    HeadSpec {
        head: Head::Decoded,
        name: "decoded_cache",
        options: &["off", "on"],
    },
];

/// How many heads.
pub const HEAD_COUNT: usize = HEADS.len();

/// Length of the logits vector: the options of every head.
pub const LOGITS: usize = {
    let mut total = 0;
    let mut i = 0;
    while i < HEADS.len() {
        // Each head's place in the table is its variant's number.
        assert!(HEADS[i].head as usize == i, "HEADS out of Head's order");
        assert!(!HEADS[i].options.is_empty(), "a head without options");
        total += HEADS[i].options.len();
        i += 1;
    }
    total
};

impl Head {
    /// Every head, in logits order.
    pub const ALL: [Head; HEAD_COUNT] = {
        let mut all = [Head::Decode; HEAD_COUNT];
        let mut i = 0;
        while i < HEAD_COUNT {
            all[i] = HEADS[i].head;
            i += 1;
        }
        all
    };

    fn spec(self) -> &'static HeadSpec {
        &HEADS[self as usize]
    }

    /// How many options the head has.
    pub fn options(self) -> usize {
        self.spec().options.len()
    }

    /// Where the head's logits start in the logits vector.
    pub fn offset(self) -> usize {
        HEADS[..self as usize].iter().map(|h| h.options.len()).sum()
    }

    /// A stable snake_case name for stats and artifacts.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The name of option `i` (stats, the action histogram); out-of-range options clamp.
    pub fn option_name(self, i: usize) -> &'static str {
        let options = self.spec().options;
        options[i.min(options.len() - 1)]
    }
}

/// Codec options, from cheapest to best ratio.
pub const CODECS: [Codec; 4] = [Codec::None, Codec::Lz4, Codec::Zstd(1), Codec::Zstd(3)];
/// Prefetch depth options: the prefetcher's own range (4..=128 files) in factor-of-4 steps.
pub const DEPTHS: [usize; 4] = [4, 16, 64, 128];
/// Decode worker options as multiples of the cores: fewer leaves cores to the trainer, more
/// overlaps waits on the source or the GPU.
pub const WORKER_SHARES: [f64; 4] = [0.25, 0.5, 1.0, 2.0];

/// One choice per head, each an option index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Action(pub [u8; HEAD_COUNT]);

impl Action {
    /// The option chosen for `head`.
    pub fn get(&self, head: Head) -> usize {
        usize::from(self.0[head as usize])
    }

    /// This action with `head` set to option `i`.
    pub fn with(mut self, head: Head, i: usize) -> Action {
        self.0[head as usize] = i.min(head.options() - 1) as u8;
        self
    }

    /// Decode placement.
    pub fn decode(&self) -> Placement {
        placement(self.get(Head::Decode))
    }

    /// Augmentation placement.
    pub fn augment(&self) -> Placement {
        placement(self.get(Head::Augment))
    }

    /// Codec for new cache entries.
    pub fn codec(&self) -> Codec {
        CODECS[self.get(Head::Codec)]
    }

    /// Prefetch depth in files.
    pub fn depth(&self) -> usize {
        DEPTHS[self.get(Head::Depth)]
    }

    /// Decode workers on a machine with `cores` cores (at least one).
    pub fn workers(&self, cores: usize) -> usize {
        ((cores as f64 * WORKER_SHARES[self.get(Head::Workers)]).round() as usize).max(1)
    }

    /// Whether renders keep decoded pixels.
    pub fn decoded(&self) -> bool {
        self.get(Head::Decoded) == 1
    }

    /// Indices into the logits vector of the chosen options, one per head.
    pub fn logit_indices(&self) -> [usize; HEAD_COUNT] {
        let mut out = [0; HEAD_COUNT];
        for (i, head) in Head::ALL.iter().enumerate() {
            out[i] = head.offset() + self.get(*head);
        }
        out
    }

    /// One-hot encoding over the logits layout (part of the state: the knobs as they are).
    pub fn one_hot(&self) -> [f32; LOGITS] {
        let mut out = [0.0; LOGITS];
        for i in self.logit_indices() {
            out[i] = 1.0;
        }
        out
    }

    /// `head=option` pairs, for stats and logs.
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        Head::ALL
            .iter()
            .map(|h| (h.name(), h.option_name(self.get(*h)).to_owned()))
            .collect()
    }
}

fn placement(i: usize) -> Placement {
    if i == 1 {
        Placement::Gpu
    } else {
        Placement::Cpu
    }
}

/// Which options are possible now; every head keeps at least one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mask(pub [bool; LOGITS]);

impl Default for Mask {
    fn default() -> Mask {
        Mask([true; LOGITS])
    }
}

impl Mask {
    /// The mask for a machine: GPU placements need a GPU backend; the decode knobs (workers,
    /// decoded caching, placement) only matter with views, so without views each keeps only
    /// its default (option `fixed`).
    pub fn new(gpu: bool, views: bool) -> Mask {
        let mut mask = Mask::default();
        if !gpu {
            mask.only(Head::Decode, 0);
            mask.only(Head::Augment, 0);
        }
        if !views {
            mask.only(Head::Decode, 0);
            mask.only(Head::Augment, 0);
            mask.only(Head::Workers, 2);
            mask.only(Head::Decoded, 0);
        }
        mask
    }

    /// Allows only option `i` of `head`.
    pub fn only(&mut self, head: Head, i: usize) {
        for o in 0..head.options() {
            self.0[head.offset() + o] = o == i;
        }
    }

    /// Whether option `i` of `head` is allowed.
    pub fn allows(&self, head: Head, i: usize) -> bool {
        i < head.options() && self.0[head.offset() + i]
    }

    /// Whether every choice of `action` is allowed.
    pub fn admits(&self, action: &Action) -> bool {
        Head::ALL.iter().all(|h| self.allows(*h, action.get(*h)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed options the knobs apply are the ones the table names.
    #[test]
    fn the_table_names_the_options_the_knobs_apply() {
        let names = |head: Head| (0..head.options()).map(move |i| head.option_name(i));
        assert!(names(Head::Codec).eq(CODECS.iter().map(|c| c.to_string())));
        assert!(names(Head::Depth).eq(DEPTHS.iter().map(|d| d.to_string())));
        assert!(names(Head::Workers).eq(WORKER_SHARES.iter().map(|w| format!("{w}x_cores"))));
        let placements = |head: Head| {
            (0..head.options()).map(move |i| {
                let a = Action::default().with(head, i);
                match head {
                    Head::Decode => a.decode(),
                    _ => a.augment(),
                }
            })
        };
        assert!(placements(Head::Decode).eq([Placement::Cpu, Placement::Gpu]));
        assert!(placements(Head::Augment).eq([Placement::Cpu, Placement::Gpu]));
        assert!(names(Head::Decode).eq(["cpu", "gpu"]));
        assert!(names(Head::Decoded).eq(["off", "on"]));
        assert!(!Action::default().decoded() && Action::default().with(Head::Decoded, 1).decoded());
        assert_eq!(Head::ALL.len(), HEADS.len());
    }

    #[test]
    fn heads_tile_the_logits_vector() {
        let total: usize = Head::ALL.iter().map(|h| h.options()).sum();
        assert_eq!(total, LOGITS);
        assert_eq!(Head::Decode.offset(), 0);
        assert_eq!(Head::Codec.offset(), 4);
        assert_eq!(Head::Decoded.offset(), LOGITS - 2);
        let a = Action::default().with(Head::Codec, 3).with(Head::Depth, 9);
        assert_eq!(a.codec(), Codec::Zstd(3));
        assert_eq!(a.depth(), 128, "out-of-range options clamp");
        assert_eq!(a.one_hot().iter().sum::<f32>(), HEAD_COUNT as f32);
        assert_eq!(Action::default().with(Head::Workers, 0).workers(2), 1);
        assert_eq!(Action::default().with(Head::Workers, 3).workers(2), 4);
    }
}
