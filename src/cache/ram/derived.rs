//! What view renders derive from source images, kept beside the files in the RAM tier: decoded
//! pixels and restart-marked JPEG copies, each keyed by the source version it was made from.
//!
//! Owns these two kinds of entries and the decision whether decoded pixels are worth their
//! memory (`--decoded-cache`, the scheduler's knob, else the policy). The render service reaches
//! them only through this front door (`BlockFetcher::derived`), so the RAM tier's own methods
//! know nothing of images. Entries share the tier's budget slice, tallies and counters
//! (`Shared`): admitted only into free room, dropped with their source version (`forget`), when
//! the budget needs room, while no render reads them (`shed_unread`), and pixels when a file's
//! block (or a copy) finds no room (`Shared::yield_pixels`: pixels take only the room files
//! leave; in a first pass they had taken the room of files not read yet, which then came from
//! the source at every epoch). An admitted copy takes the place of its file's own entry when
//! nobody holds that (`offer_marked`). Must never evict another entry to make room, and never
//! hand out pixels whose checksums do not verify.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use super::{Content, RamFile, ReadBytes, Shared, Unpacked};
use crate::cache::policy::{self, DecodedCaching, DecodedReason, PixelSignals};
use crate::control::knobs::Knobs;
use crate::shards::{ShardedMap, ShardedSet};
use crate::source::Identity;
use crate::telemetry::Telemetry;

/// While the auto policy declines decoded pixels, one render in this many still decodes its
/// whole image and offers it, so the decision follows the source's speed (that render forgoes
/// decoding only the part it reads).
const REASK_DECLINED: u64 = 16;

/// Decoded pixels and restart-marked copies of one mount's images.
pub struct Derived {
    shared: Arc<Shared>,
    /// The tier's files: an admitted copy takes the place of its file's entry.
    files: Arc<ShardedSet<Arc<RamFile>>>,
    /// Shared (weakly) with the tier's files, which take the room back when they need it.
    decoded: Arc<ShardedMap<Identity, Arc<RamFile>>>,
    marked: ShardedMap<Identity, Arc<RamFile>>,
    mode: DecodedCaching,
    /// The scheduler's knobs (decoded caching), when a scheduler runs.
    knobs: Option<Arc<Knobs>>,
    /// The mount's telemetry (how a whole pass of the readers' files fits the tier), when it
    /// samples the pipeline.
    telemetry: Option<Arc<Telemetry>>,
    /// The latest `DecodedReason`, as its `repr` value.
    last: AtomicU8,
    /// `may_keep_decoded` calls answered while the auto policy's latest decision declined.
    reasks: AtomicU64,
}

/// Weight of the latest image in the decode cost (`Shared::pixel_decode_cost`, an average over
/// ~32 images).
const DECODE_COST_WEIGHT: f64 = 1.0 / 32.0;

impl Derived {
    /// None yet, charged to the tier's `shared` slice; decoded pixels kept as the default mode
    /// says until `set_mode`.
    pub(super) fn new(shared: Arc<Shared>, files: Arc<ShardedSet<Arc<RamFile>>>) -> Derived {
        let decoded = Arc::<ShardedMap<_, _>>::default();
        // Set once: a tier has one `Derived`.
        let _ = shared.pixels.set(Arc::downgrade(&decoded));
        let mut derived = Derived {
            shared,
            files,
            decoded,
            marked: ShardedMap::default(),
            mode: DecodedCaching::default(),
            knobs: None,
            telemetry: None,
            last: AtomicU8::new(0),
            reasks: AtomicU64::new(0),
        };
        derived.set_mode(DecodedCaching::default());
        derived
    }

    /// Keeps decoded pixels as `mode` says from now on.
    pub(super) fn set_mode(&mut self, mode: DecodedCaching) {
        self.mode = mode;
        // Until the first render, stats show what the mode decides with nothing measured yet.
        let first = policy::keep_decoded(mode, &PixelSignals::default(), None, true);
        self.last.store(first as u8, Ordering::Relaxed);
    }

    /// Follows the scheduler's decoded-caching knob while it holds it.
    pub(super) fn set_knobs(&mut self, knobs: Arc<Knobs>) {
        self.knobs = Some(knobs);
    }

    /// Weighs pixels against the working set `telemetry` measures.
    pub(super) fn set_telemetry(&mut self, telemetry: Arc<Telemetry>) {
        self.telemetry = Some(telemetry);
    }

    /// The decoded pixels of image `identity`, if the cache holds them whole and intact.
    pub fn decoded(&self, identity: &Identity, memo: &Unpacked) -> Option<ReadBytes> {
        let metrics = &self.shared.metrics;
        let hit = self
            .decoded
            .get(identity)
            .and_then(|entry| entry.read_cached(0, entry.content_len() as u32, memo));
        match hit {
            Some(_) => metrics.decoded_hits.inc(),
            None => metrics.decoded_misses.inc(),
        }
        hit
    }

    /// Whether the cache holds decoded pixels of image `identity` (not checked or counted as a
    /// hit: for prefetch to skip decoding them again).
    pub fn has_decoded(&self, identity: &Identity) -> bool {
        self.decoded.get(identity).is_some()
    }

    /// Offers the decoded pixels of image `identity`: `len` bytes in rows of `row` bytes that
    /// took `decode` to produce, made by `pixels` only if the policy finds them worth their
    /// memory and the budget has room. True when they were admitted.
    pub fn offer_decoded(
        &self,
        identity: Identity,
        (len, row): (u64, usize),
        decode: Duration,
        pixels: impl FnOnce() -> Vec<u8>,
    ) -> bool {
        let metrics = &self.shared.metrics;
        let signals = PixelSignals {
            decode_s_per_byte: self.decode_cost(decode, len),
            source_bytes_per_s: metrics.source_bytes_per_s(),
            working_set_fit: self
                .telemetry
                .as_ref()
                .and_then(|t| t.whole_working_set_fit()),
        };
        let reason = policy::keep_decoded(
            self.mode,
            &signals,
            self.knobs.as_ref().and_then(|k| k.decoded()),
            self.decoded_choice().1.keeps(),
        );
        self.last.store(reason as u8, Ordering::Relaxed);
        if !reason.keeps() {
            metrics.decoded_declined.inc();
            return false;
        }
        if len > u64::from(u32::MAX) || !self.shared.ledger.has_room(len) {
            metrics.decoded_rejected.inc();
            return false;
        }
        let admitted = self.admit_whole(Content::Decoded, identity, row, pixels());
        if admitted {
            metrics.decoded_admitted.inc();
        } else {
            metrics.decoded_rejected.inc();
        }
        admitted
    }

    /// The restart-marked copy of JPEG `identity` (`view::jpeg::restart_marked`), if the cache
    /// holds it whole and intact.
    pub fn marked(&self, identity: &Identity, memo: &Unpacked) -> Option<ReadBytes> {
        let hit = self.peek_marked(identity, memo);
        if hit.is_some() {
            self.shared.metrics.marked_hits.inc();
        }
        hit
    }

    /// The same copy, not counted as a render's hit (a look at its header).
    pub fn peek_marked(&self, identity: &Identity, memo: &Unpacked) -> Option<ReadBytes> {
        self.marked
            .get(identity)
            .and_then(|entry| entry.read_cached(0, entry.content_len() as u32, memo))
    }

    /// Whether the cache could take `bytes` more now (a hint: another admission may take the
    /// room first).
    pub fn has_room(&self, bytes: u64) -> bool {
        self.shared.ledger.has_room(bytes)
    }

    /// Whether the cache holds a restart-marked copy of JPEG `identity` (a render of it would
    /// start from the copy, not the file).
    pub fn has_marked(&self, identity: &Identity) -> bool {
        self.marked.get(identity).is_some()
    }

    /// Offers the restart-marked copy of JPEG `identity`; true when the budget had room for it
    /// and it was admitted. The copy then takes the place of the file's own entry if nobody
    /// holds that (no open handle, prefetch or packer): renders start from the copy, so keeping
    /// both would give each image its room twice. A reader of the file itself fetches it again,
    /// and its entry stays from then on (the copy is made once).
    pub fn offer_marked(&self, identity: Identity, copy: Vec<u8>) -> bool {
        if copy.len() as u64 > u64::from(u32::MAX) || !self.has_room(copy.len() as u64) {
            return false;
        }
        let admitted = self.admit_whole(Content::Marked, identity, 0, copy);
        if admitted {
            self.shared.metrics.marked_admitted.inc();
            // The file's entry, dropped here outside the set's lock (it frees its blocks).
            let replaced = self
                .files
                .remove_if(&identity, |file| Arc::strong_count(file) == 1);
            if replaced.is_some() {
                self.shared.metrics.marked_replaced.inc();
            }
        }
        admitted
    }

    /// Admits `bytes` (image rows of `row` bytes for decoded pixels, else 0) whole as the
    /// `content` entry of `identity`; true when admitted (a failed admission leaves no entry
    /// behind).
    fn admit_whole(
        &self,
        content: Content,
        identity: Identity,
        row: usize,
        bytes: Vec<u8>,
    ) -> bool {
        let map = match content {
            Content::Marked => &self.marked,
            _ => &self.decoded,
        };
        let entry = map.get_or_insert_with(identity, || {
            Arc::new(RamFile::new(
                identity,
                content,
                bytes.len() as u64,
                row,
                self.shared.clone(),
            ))
        });
        let admitted = entry.admit_whole(bytes);
        if !admitted {
            // Only this entry, and only left empty: another render's copy of the same image,
            // admitted meanwhile, stays.
            map.remove_if(&identity, |held| {
                Arc::ptr_eq(held, &entry) && held.cached_blocks() == 0
            });
        }
        admitted
    }

    /// Whether the cache holds the file `identity` (an image's own bytes) whole.
    pub fn has_file(&self, identity: &Identity) -> bool {
        (self.files.get(identity)).is_some_and(|file| file.is_complete())
    }

    /// Whether an image's pixels may take room, `held` telling whether the cache held its
    /// encoded form (as renders keep it: the copy, else the file) before this render: with
    /// `--decoded-cache on` always; in auto mode (the rule, or the scheduler's knob) only then.
    /// Under never-evict the room goes first to the encoded images, which serve five to ten
    /// images for the bytes of one image's pixels, and pixels take what they leave: offered from
    /// the first render on, pixels filled the room a working set's copies needed, and every
    /// image left out was read from the source again at each render.
    pub fn pixels_may_follow(&self, held: bool) -> bool {
        held || self.mode == DecodedCaching::On
    }

    /// Whether decoded pixels of `len` bytes offered now could be kept (`held`: see
    /// `pixels_may_follow`), asked before decoding, so a render whose pixels would be declined
    /// decodes only what it reads: not with decoded caching off, the scheduler's knob at no, or
    /// no room for them in the budget; in auto mode as the policy decided last, but yes every
    /// `REASK_DECLINED`th time all the same, so a decline made while the source was fast is
    /// made again, or not, as it slows.
    pub fn may_keep_decoded(&self, len: u64, held: bool) -> bool {
        if !self.pixels_may_follow(held) {
            return false;
        }
        let scheduled = self.knobs.as_ref().and_then(|k| k.decoded());
        let wanted = match (self.mode, scheduled) {
            (DecodedCaching::Off, _) => false,
            (DecodedCaching::On, _) => true,
            (DecodedCaching::Auto, Some(keep)) => keep,
            (DecodedCaching::Auto, None) => {
                self.decoded_choice().1.keeps()
                    || self
                        .reasks
                        .fetch_add(1, Ordering::Relaxed)
                        .is_multiple_of(REASK_DECLINED)
            }
        };
        wanted && self.shared.ledger.has_room(len)
    }

    /// The running average of decode seconds per byte of pixels, with an image of `len` bytes
    /// decoded in `decode` taken in. (Renders race on it: one image's share may be lost, never
    /// the average.)
    fn decode_cost(&self, decode: Duration, len: u64) -> f64 {
        let image = decode.as_secs_f64() / len.max(1) as f64;
        let before = self.shared.pixel_decode_s_per_byte();
        let now = if before > 0.0 {
            before + DECODE_COST_WEIGHT * (image - before)
        } else {
            image
        };
        self.shared
            .pixel_decode_cost
            .store(now.to_bits(), Ordering::Relaxed);
        now
    }

    /// The mode of decoded-pixel caching, and the reason of the latest decision.
    pub fn decoded_choice(&self) -> (DecodedCaching, DecodedReason) {
        let last = self.last.load(Ordering::Relaxed);
        let reason = DecodedReason::ALL
            .get(usize::from(last))
            .copied()
            .unwrap_or(DecodedReason::Off);
        (self.mode, reason)
    }

    /// Flips a byte of the first block of image `identity`'s cached pixels.
    #[cfg(test)]
    pub(crate) fn corrupt_decoded_for_test(&self, identity: &Identity) {
        if let Some(entry) = self.decoded.get(identity) {
            entry.corrupt_for_test(0);
        }
    }

    /// Drops what was derived from a source version the source no longer has.
    pub(super) fn forget(&self, identity: &Identity) {
        self.decoded.remove(identity);
        self.marked.remove(identity);
    }

    /// Drops every entry no render is reading now: each can be made again from the source.
    pub(super) fn shed_unread(&self) {
        // What is let go is dropped here, outside the maps' locks.
        let _decoded = self.decoded.retain(|_, entry| Arc::strong_count(entry) > 1);
        let _marked = self.marked.retain(|_, entry| Arc::strong_count(entry) > 1);
    }
}
