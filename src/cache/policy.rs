//! The cache's policies: which codec new cache entries get, and whether a view image's decoded
//! pixels are worth their memory; each decision with its reason.
//!
//! Owns: those decisions, from live signals (the machine's CPU idle share, the source's observed
//! bandwidth, the decode time of the image at hand). The interface is one call,
//! `CodecPolicy::choose`, so the scheduler takes the decision over through its codec knob
//! (`ScheduledCodec`) while the heuristic stays as its fallback. Must never compress anything
//! itself and never block: it is called from background threads that pack entries and from the
//! stats snapshot.

use std::sync::Arc;

use super::codec::Codec;
use crate::control::knobs::Knobs;

/// What the policy sees when it decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Signals {
    /// Share of the machine's CPU time spent idle over the last second, 0..=1.
    pub cpu_idle: f64,
    /// Bytes per second one source fetch delivered recently (bytes / fetch time); `None` before
    /// any fetch.
    pub source_bytes_per_s: Option<f64>,
}

/// Why the policy chose what it chose (shown in stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The user fixed the codec (`--codec`).
    Fixed,
    /// CPU is mostly idle: spend it on the best ratio.
    CpuIdle,
    /// CPU is partly busy: the cheapest codec still gains capacity.
    CpuBusy,
    /// CPU is saturated: entries stay raw and are packed when it idles.
    CpuSaturated,
    /// The source is as fast as decompression: a heavier codec would make hits cost about what
    /// misses cost, so only the cheap one is worth it.
    FastSource,
    /// The scheduler holds the codec knob (see `control::knobs`).
    Scheduler,
}

impl Reason {
    /// A stable snake_case name for stats.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Fixed => "fixed",
            Reason::CpuIdle => "cpu_idle",
            Reason::CpuBusy => "cpu_busy",
            Reason::CpuSaturated => "cpu_saturated",
            Reason::FastSource => "fast_source",
            Reason::Scheduler => "scheduler",
        }
    }
}

/// A decision: the codec for entries packed now, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Codec to pack with (`None`: leave entries raw for now).
    pub codec: Codec,
    /// Why.
    pub reason: Reason,
}

/// Decides the codec of new cache entries. Implemented by a fixed codec, the heuristic below and
/// the scheduler's knob.
pub trait CodecPolicy: Send + Sync {
    /// The codec for entries packed now.
    fn choose(&self, signals: &Signals) -> Choice;
    /// The best codec this policy would ever pick: entries packed with anything weaker are
    /// upgraded when the CPU is idle.
    fn target(&self) -> Codec;
}

/// One codec, whatever the load (`--codec none|lz4|zstd-N`).
#[derive(Debug, Clone, Copy)]
pub struct Fixed(pub Codec);

impl CodecPolicy for Fixed {
    fn choose(&self, _: &Signals) -> Choice {
        Choice {
            codec: self.0,
            reason: Reason::Fixed,
        }
    }

    fn target(&self) -> Codec {
        self.0
    }
}

/// The default policy (`--codec auto`).
///
/// - CPU idle share >= 50%: zstd-3. It measured a ratio of 1.7-2.1 on uint8 pixels at
///   ~350 MB/s per core, and its ~1.4 GB/s decompression is cheap next to any miss.
/// - 20-50%: lz4 (~1 GB/s to pack, ~4 GB/s to unpack): most of the gain for a fifth of the CPU.
/// - below 20%: leave entries raw. The loader needs the CPU now; the entries are packed when
///   it idles, and the space that frees admits more data.
/// - a source that delivers >= 1 GB/s per fetch (local NVMe, page cache): lz4 at most, since
///   a zstd hit would cost about what a miss costs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Heuristic;

/// Idle share above which the heuristic spends CPU on the best ratio.
const IDLE_FOR_BEST_RATIO: f64 = 0.5;
/// Idle share below which the heuristic packs nothing.
const IDLE_FOR_ANY_PACKING: f64 = 0.2;
/// Source bandwidth at which zstd's decompression (~1.4 GB/s) stops being much cheaper than a miss.
const FAST_SOURCE_BYTES_PER_S: f64 = 1e9;
/// The heuristic's best codec.
const BEST: Codec = Codec::Zstd(3);

impl CodecPolicy for Heuristic {
    fn choose(&self, s: &Signals) -> Choice {
        let (codec, reason) = if s.cpu_idle < IDLE_FOR_ANY_PACKING {
            (Codec::None, Reason::CpuSaturated)
        } else if s
            .source_bytes_per_s
            .is_some_and(|b| b >= FAST_SOURCE_BYTES_PER_S)
        {
            (Codec::Lz4, Reason::FastSource)
        } else if s.cpu_idle < IDLE_FOR_BEST_RATIO {
            (Codec::Lz4, Reason::CpuBusy)
        } else {
            (BEST, Reason::CpuIdle)
        };
        Choice { codec, reason }
    }

    fn target(&self) -> Codec {
        BEST
    }
}

/// The adaptive codec policy of a scheduled mount: the scheduler's codec while it holds the
/// knob, the cache's heuristic otherwise.
pub struct ScheduledCodec(pub Arc<Knobs>);

impl CodecPolicy for ScheduledCodec {
    fn choose(&self, signals: &Signals) -> Choice {
        match self.0.codec() {
            Some(codec) => Choice {
                codec,
                reason: Reason::Scheduler,
            },
            None => Heuristic.choose(signals),
        }
    }

    fn target(&self) -> Codec {
        // Idle-time upgrades follow whoever holds the knob now.
        self.0.codec().unwrap_or_else(|| Heuristic.target())
    }
}

/// Whether view renders keep decoded pixels in the cache (`--decoded-cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodedCaching {
    /// Never: the budget holds encoded files only.
    Off,
    /// Always, while the budget has room.
    On,
    /// When decoding costs more than fetching (see `keep_decoded`).
    #[default]
    Auto,
}

impl DecodedCaching {
    /// The mode as `--decoded-cache` spells it.
    pub fn name(self) -> &'static str {
        match self {
            DecodedCaching::Off => "off",
            DecodedCaching::On => "on",
            DecodedCaching::Auto => "auto",
        }
    }
}

/// Why decoded pixels were kept or not (shown in stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DecodedReason {
    /// `--decoded-cache off`.
    Off,
    /// `--decoded-cache on`.
    On,
    /// The scheduler chose to keep pixels.
    SchedulerOn,
    /// The scheduler chose not to.
    SchedulerOff,
    /// Decoding the image took longer than the source takes to deliver as many bytes as its
    /// pixels occupy: memory spent on pixels saves more time than on encoded files.
    DecodeSlower,
    /// The source delivers the pixels' size in bytes faster than the image decodes: the memory
    /// saves more time holding encoded files.
    SourceSlower,
    /// A whole pass of the readers' files, encoded, fits the RAM tier with room to spare: pixels
    /// take only room no file needs.
    RoomToSpare,
}

impl DecodedReason {
    /// Every reason, by its `repr` value.
    pub const ALL: [DecodedReason; 7] = [
        DecodedReason::Off,
        DecodedReason::On,
        DecodedReason::SchedulerOn,
        DecodedReason::SchedulerOff,
        DecodedReason::DecodeSlower,
        DecodedReason::SourceSlower,
        DecodedReason::RoomToSpare,
    ];

    /// Whether pixels are kept for this reason.
    pub fn keeps(self) -> bool {
        matches!(
            self,
            DecodedReason::On
                | DecodedReason::SchedulerOn
                | DecodedReason::DecodeSlower
                | DecodedReason::RoomToSpare
        )
    }

    /// A stable snake_case name for stats.
    pub fn name(self) -> &'static str {
        match self {
            DecodedReason::Off => "off",
            DecodedReason::On => "on",
            DecodedReason::SchedulerOn => "scheduler_on",
            DecodedReason::SchedulerOff => "scheduler_off",
            DecodedReason::DecodeSlower => "decode_slower_than_source",
            DecodedReason::SourceSlower => "source_slower_than_decode",
            DecodedReason::RoomToSpare => "room_to_spare",
        }
    }
}

/// How far the auto rule's two sides must differ before it changes its mind: a mount's images
/// differ in decode time per pixel byte, and a decision that followed each image's would have
/// renders decode whole images (to offer their pixels) that the next image's decision then
/// declines.
pub const DECODED_BAND: f64 = 1.5;

/// What the decoded-caching rule weighs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PixelSignals {
    /// Decode time per byte of pixels (the mount's running average).
    pub decode_s_per_byte: f64,
    /// Bytes per second one source fetch delivered recently; `None` before any fetch.
    pub source_bytes_per_s: Option<f64>,
    /// How many times a whole pass of the readers' files, encoded, fits the RAM tier's slice
    /// (`Observation::whole_working_set_fit`; `None` until a pass has ended).
    pub working_set_fit: Option<f64>,
}

/// Whether to keep decoded pixels, when the scheduler does not hold the knob (`scheduled`; it
/// only holds it in `auto` mode): `kept` is the decision so far.
///
/// Pixels only ever take room the budget has free, and only of images whose encoded file the
/// cache already holds (`RamTier`'s derived entries). So while a whole pass of the files fits
/// with room to spare (`DECODED_BAND` times to start keeping, once to go on), pixels cost no
/// file its place and save decodes: keep them. Otherwise memory is short, and under
/// never-evict it is spent once, so the question is which use of a byte saves more time per
/// epoch. A byte of encoded file saves a fetch of one byte (1 / source bandwidth); a byte of
/// pixels saves `decode / pixels` of decoding. Pixels win when `decode * bandwidth >= pixels`:
/// with a 50 MB/s source and a 0.6 ms decode of a 560 KB image they lose (30 KB), from a 2 GB/s
/// source they win (1.2 MB). The decision changes only once the other side wins by
/// `DECODED_BAND`. With no fetch measured yet the source costs nothing seen, so pixels win.
/// Their size is counted before packing, which favours encoded files a little. (In a first
/// pass the files read so far are no measure of the room: pixels kept on it would take the room
/// of files not read yet, so only the second rule decides then.)
pub fn keep_decoded(
    mode: DecodedCaching,
    signals: &PixelSignals,
    scheduled: Option<bool>,
    kept: bool,
) -> DecodedReason {
    match (mode, scheduled) {
        (DecodedCaching::Auto, Some(true)) => return DecodedReason::SchedulerOn,
        (DecodedCaching::Auto, Some(false)) => return DecodedReason::SchedulerOff,
        _ => {}
    }
    match mode {
        DecodedCaching::Off => DecodedReason::Off,
        DecodedCaching::On => DecodedReason::On,
        DecodedCaching::Auto => {
            let room = if kept { 1.0 } else { DECODED_BAND };
            if signals.working_set_fit.is_some_and(|fit| fit >= room) {
                return DecodedReason::RoomToSpare;
            }
            // Seconds of decoding a byte of pixels saves, per second of fetching a byte.
            let gain = signals
                .source_bytes_per_s
                .map_or(f64::INFINITY, |bw| signals.decode_s_per_byte * bw);
            let needed = if kept {
                1.0 / DECODED_BAND
            } else {
                DECODED_BAND
            };
            if gain >= needed {
                DecodedReason::DecodeSlower
            } else {
                DecodedReason::SourceSlower
            }
        }
    }
}

/// Whether packing a block of decoded pixels pays: a packed block is unpacked at every render
/// that reads it (`unpack_s`), and the room packing frees, a share `1 - packed / raw` of it,
/// holds that many more images' pixels, each saving a decode (`decode_s`, the whole block's: an
/// upper bound of what a render from the encoded file costs beyond one from pixels). Per image
/// of pixels held: `raw / packed` renders from packed pixels, each saving `decode - unpack`,
/// against one from raw pixels saving `decode`, so it pays when `unpack < decode * (1 - packed /
/// raw)`. Measured on this project's photos (~570 KB of pixels, a 1.05 ms decode): lz4 packs
/// them to 0.92 of their size in 0.24 ms of unpacking, zstd-1 to 0.72 in 0.46 ms, so neither pays
/// (the adapt bench's renders spent 12-15% of 2 cores unpacking lz4 pixels); pixels that take
/// far longer to decode than to unpack (large PNGs) still get packed.
pub fn packing_pixels_pays(decode_s: f64, unpack_s: f64, raw: u64, packed: u64) -> bool {
    packed < raw && unpack_s < decode_s * (1.0 - packed as f64 / raw as f64)
}

/// How much space `codec` is expected to save: a rank for "is this an upgrade".
pub fn strength(codec: Codec) -> u8 {
    match codec {
        Codec::None => 0,
        Codec::Lz4 => 1,
        Codec::Zstd(level) => 1 + level,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(cpu_idle: f64, source: Option<f64>) -> Choice {
        Heuristic.choose(&Signals {
            cpu_idle,
            source_bytes_per_s: source,
        })
    }

    #[test]
    fn the_heuristic_spends_cpu_only_when_it_is_there() {
        assert_eq!(at(0.9, Some(50e6)).codec, Codec::Zstd(3));
        assert_eq!(at(0.9, None).reason, Reason::CpuIdle);
        assert_eq!(at(0.3, Some(50e6)).codec, Codec::Lz4);
        assert_eq!(at(0.3, None).reason, Reason::CpuBusy);
        assert_eq!(at(0.1, Some(50e6)).codec, Codec::None);
        assert_eq!(at(0.1, Some(5e9)).reason, Reason::CpuSaturated);
        assert_eq!(
            at(0.9, Some(3e9)),
            Choice {
                codec: Codec::Lz4,
                reason: Reason::FastSource
            }
        );
    }

    #[test]
    fn decoded_pixels_are_kept_when_decoding_costs_more_than_fetching() {
        // A 0.6 ms decode of a 500 x 375 RGB image.
        let per_byte = 600e-6 / (500.0 * 375.0 * 3.0);
        let at = |bw| PixelSignals {
            decode_s_per_byte: per_byte,
            source_bytes_per_s: bw,
            working_set_fit: None,
        };
        let auto = |bw| keep_decoded(DecodedCaching::Auto, &at(bw), None, false);
        assert_eq!(auto(Some(50e6)), DecodedReason::SourceSlower);
        assert_eq!(auto(Some(2e9)), DecodedReason::DecodeSlower);
        assert_eq!(auto(None), DecodedReason::DecodeSlower);
        assert!(!auto(Some(50e6)).keeps() && auto(Some(2e9)).keeps());
        let fixed = |mode| keep_decoded(mode, &at(Some(2e9)), Some(true), false);
        assert!(!fixed(DecodedCaching::Off).keeps());
        assert!(keep_decoded(DecodedCaching::On, &at(Some(1.0)), None, false).keeps());
        let held = |on| keep_decoded(DecodedCaching::Auto, &at(Some(50e6)), Some(on), false);
        assert_eq!(held(true), DecodedReason::SchedulerOn);
        assert!(held(true).keeps() && !held(false).keeps());
        for reason in DecodedReason::ALL {
            assert_eq!(DecodedReason::ALL[reason as usize], reason);
        }
    }

    /// Decode costs up to 40% off the break-even point either way never change the decision
    /// (whichever it was); twice or half of it does.
    #[test]
    fn the_decoded_decision_holds_within_its_band() {
        let bw = 100e6;
        let even = 1.0 / bw;
        let auto = |k: f64, kept| {
            let signals = PixelSignals {
                decode_s_per_byte: even * k,
                source_bytes_per_s: Some(bw),
                working_set_fit: None,
            };
            keep_decoded(DecodedCaching::Auto, &signals, None, kept).keeps()
        };
        for kept in [true, false] {
            let mut now = kept;
            for k in [0.7, 1.3, 0.8, 1.2, 0.69, 1.4, 1.0] {
                now = auto(k, now);
                assert_eq!(now, kept, "flipped at {k} x break-even");
            }
        }
        assert!(!auto(0.5, true), "a source twice as fast declines pixels");
        assert!(auto(2.0, false), "one twice as slow keeps them");
    }

    /// Once a whole pass of the files fits with room to spare, pixels are kept however fast
    /// the source: they cost no file its place. Within `DECODED_BAND` of a full cache the
    /// decision holds; below a fit of 1 (files need the room) the bandwidth rule decides again.
    #[test]
    fn pixels_fill_the_room_a_whole_pass_of_files_leaves() {
        let at = |fit| PixelSignals {
            // A decode twenty times faster than the source delivers its pixels' size.
            decode_s_per_byte: 1.0 / 20e9,
            source_bytes_per_s: Some(1e9),
            working_set_fit: fit,
        };
        let auto = |fit, kept| keep_decoded(DecodedCaching::Auto, &at(fit), None, kept);
        assert_eq!(auto(None, false), DecodedReason::SourceSlower, "first pass");
        assert_eq!(auto(Some(5.0), false), DecodedReason::RoomToSpare);
        assert_eq!(
            auto(Some(1.2), false),
            DecodedReason::SourceSlower,
            "not yet"
        );
        assert_eq!(auto(Some(1.2), true), DecodedReason::RoomToSpare, "holds");
        assert_eq!(
            auto(Some(0.9), true),
            DecodedReason::SourceSlower,
            "files need it"
        );
        let held = keep_decoded(DecodedCaching::Auto, &at(Some(5.0)), Some(false), true);
        assert_eq!(
            held,
            DecodedReason::SchedulerOff,
            "the scheduler's knob wins"
        );
        assert!(!keep_decoded(DecodedCaching::Off, &at(Some(5.0)), None, true).keeps());
        assert!(DecodedReason::RoomToSpare.keeps());
    }

    #[test]
    fn packing_pixels_pays_only_when_the_room_it_frees_saves_more_decodes_than_it_costs_unpacks() {
        let mb = 1 << 20;
        // The photos measured here: neither lz4 nor zstd-1 pays.
        assert!(!packing_pixels_pays(1.05e-3, 0.24e-3, mb, mb * 92 / 100));
        assert!(!packing_pixels_pays(1.05e-3, 0.46e-3, mb, mb * 72 / 100));
        // A 10 ms decode (a large PNG): zstd-1's 28% of room saves more than it costs.
        assert!(packing_pixels_pays(10e-3, 0.46e-3, mb, mb * 72 / 100));
        // No gain, or nothing measured: never.
        assert!(!packing_pixels_pays(10e-3, 0.0, mb, mb));
        assert!(!packing_pixels_pays(0.0, 0.1e-3, mb, mb / 2));
    }

    #[test]
    fn fixed_ignores_load_and_upgrades_rank_by_ratio() {
        let fixed = Fixed(Codec::Zstd(1));
        assert_eq!(
            fixed
                .choose(&Signals {
                    cpu_idle: 0.0,
                    source_bytes_per_s: None
                })
                .codec,
            Codec::Zstd(1)
        );
        assert!(strength(Codec::None) < strength(Codec::Lz4));
        assert!(strength(Codec::Lz4) < strength(Codec::Zstd(1)));
        assert!(strength(Codec::Zstd(1)) < strength(Heuristic.target()));
    }

    #[test]
    fn the_scheduler_codec_holds_while_the_knob_is_held_then_the_heuristic() {
        use crate::control::action::{Action, Head};
        let knobs = Arc::new(Knobs::default());
        knobs.apply(&Action::default().with(Head::Codec, 1), 2);
        let policy = ScheduledCodec(knobs.clone());
        let busy = Signals {
            cpu_idle: 0.0,
            source_bytes_per_s: None,
        };
        assert_eq!(policy.choose(&busy).reason, Reason::Scheduler);
        assert_eq!(policy.target(), Codec::Lz4);
        knobs.release();
        assert_eq!(policy.choose(&busy), Heuristic.choose(&busy));
    }
}
