//! The never-evict ("MinIO", after CoorDL) RAM tier.
//!
//! Owns: which blocks of which file version are held in memory, under the memory budget's cache
//! slice, with the figures of each kind of entry; the background packer that compresses them;
//! and what view renders derive from images and may keep: decoded pixels, restart-marked JPEG
//! copies. Data is admitted until the slice is full; after
//! that nothing is evicted and nothing more is admitted, so a random-order epoch misses exactly
//! what did not fit instead of thrashing like an LRU. Compressible data is packed in the
//! background (see `packer`), so the same budget holds more of it. Entries are keyed by source
//! `Identity`: a changed file is a different key, and its old entry is dropped by `forget`.
//! Admission failures (no room, memfd refused, checksum mismatch) become misses and counters,
//! never errors for the reader. Decoded pixels are kept when the policy finds decoding dearer
//! than fetching (`decoded`, `offer_decoded`). Must never evict to make room, never fetch
//! (`BlockFetcher` brings blocks), and never take a tier-wide lock on the read path.

mod file;
mod memfd;
pub(crate) mod packer;
mod slots;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub use file::{PackOutcome, RamFile, ReadBytes, Unpacked};
pub use packer::Packer;

use super::codec::Codec;
use super::policy::{self, Choice, DecodedCaching, DecodedReason};
use crate::cache::metrics::{CacheMetrics, RamGauges};
use crate::control::knobs::Knobs;
use crate::memory::{MemoryBudget, Shed, Use};
use crate::shards::ShardedMap;
use crate::source::Identity;
use memfd::MemfdAllowance;

/// While the auto policy declines decoded pixels, one render in this many still decodes its
/// whole image and offers it, so the decision follows the source's speed (that render forgoes
/// decoding only the part it reads).
const REASK_DECLINED: u64 = 16;

/// What a cache entry holds; each kind has its own tallies under the one shared budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// Bytes of a source file.
    Source,
    /// Decoded pixels of a source image (see `RamTier::decoded`).
    Decoded,
    /// A restart-marked copy of a source JPEG (see `RamTier::marked`).
    Marked,
}

/// The figures of one kind of entry.
#[derive(Debug, Default)]
struct Tally {
    /// Bytes charged to the budget (stored size: compressed where packed).
    stored: AtomicU64,
    /// Bytes of content those blocks hold (before compression).
    logical: AtomicU64,
    /// Blocks by codec family: none, lz4, zstd.
    by_codec: [AtomicU64; 3],
    /// Entries with at least one block.
    entries: AtomicU64,
    /// Entries with every block.
    complete: AtomicU64,
}

/// The cache's side of the memory budget (its cache slice), with the figures of each kind of
/// entry; shared by the cache and every cached entry (entries release on drop).
#[derive(Debug)]
pub struct Ledger {
    budget: Arc<MemoryBudget>,
    tallies: [Tally; 3],
}

/// Index of a codec's family in `Tally::by_codec`.
fn family(codec: Codec) -> usize {
    match codec {
        Codec::None => 0,
        Codec::Lz4 => 1,
        Codec::Zstd(_) => 2,
    }
}

impl Ledger {
    fn new(budget: Arc<MemoryBudget>) -> Ledger {
        Ledger {
            budget,
            tallies: Default::default(),
        }
    }

    /// The figures of `content` entries.
    fn tally(&self, content: Content) -> &Tally {
        &self.tallies[content as usize]
    }

    /// Counts a block of `logical` bytes stored with `codec` in (`added`) or out.
    fn count_block(&self, content: Content, codec: Codec, logical: u64, added: bool) {
        let tally = self.tally(content);
        let blocks = &tally.by_codec[family(codec)];
        if added {
            blocks.fetch_add(1, Ordering::Relaxed);
            tally.logical.fetch_add(logical, Ordering::Relaxed);
        } else {
            blocks.fetch_sub(1, Ordering::Relaxed);
            tally.logical.fetch_sub(logical, Ordering::Relaxed);
        }
    }

    /// Reserves `bytes` for `content` if they fit the cache slice; false (and nothing reserved)
    /// otherwise.
    fn try_reserve(&self, content: Content, bytes: u64) -> bool {
        let reserved = self.budget.admit(Use::Cache, bytes);
        if reserved {
            self.tally(content)
                .stored
                .fetch_add(bytes, Ordering::Relaxed);
        }
        reserved
    }

    /// Whether `bytes` would fit now (a hint: a concurrent admission may take the room first).
    fn has_room(&self, bytes: u64) -> bool {
        self.budget.has_room(Use::Cache, bytes)
    }

    fn release(&self, content: Content, bytes: u64) {
        self.tally(content)
            .stored
            .fetch_sub(bytes, Ordering::Relaxed);
        self.budget.release(Use::Cache, bytes);
    }
}

/// What every file of the RAM tier shares: the budget, the counters, the packer.
pub(crate) struct Shared {
    ledger: Ledger,
    metrics: Arc<CacheMetrics>,
    packer: Arc<Packer>,
    /// Memfds that files may still take (a descriptor and a mapping each).
    memfds: MemfdAllowance,
    /// Whether files of one block take memfds too (only passthrough makes them worth it).
    small_memfds: AtomicBool,
}

/// The RAM tier of one mount: cached files (and decoded images) by identity.
pub struct RamTier {
    shared: Arc<Shared>,
    files: ShardedMap<Identity, Arc<RamFile>>,
    decoded: ShardedMap<Identity, Arc<RamFile>>,
    marked: ShardedMap<Identity, Arc<RamFile>>,
    decoded_caching: DecodedCaching,
    /// The scheduler's knobs (decoded caching), when a scheduler runs.
    knobs: Option<Arc<Knobs>>,
    /// The latest `DecodedReason`, as its `repr` value.
    decoded_last: AtomicU8,
    /// `may_keep_decoded` calls answered while the auto policy's latest decision declined.
    decoded_reasks: AtomicU64,
    packer_thread: Option<JoinHandle<()>>,
}

impl RamTier {
    /// An empty tier holding at most `budget`'s cache slice, packing with `packer`. Starts the
    /// packer thread (without it, entries stay raw).
    pub fn new(
        budget: Arc<MemoryBudget>,
        packer: Arc<Packer>,
        metrics: Arc<CacheMetrics>,
    ) -> RamTier {
        let packer_thread = if packer.enabled() {
            let p = packer.clone();
            std::thread::Builder::new()
                .name("prepfs-packer".into())
                .spawn(move || p.run())
                .inspect_err(
                    |e| tracing::warn!(error = %e, "cannot start the packer; entries stay raw"),
                )
                .ok()
        } else {
            None
        };
        RamTier {
            shared: Arc::new(Shared {
                ledger: Ledger::new(budget),
                metrics,
                packer,
                memfds: MemfdAllowance::new(MemfdAllowance::process_share()),
                small_memfds: AtomicBool::new(false),
            }),
            files: ShardedMap::default(),
            decoded: ShardedMap::default(),
            marked: ShardedMap::default(),
            decoded_caching: DecodedCaching::default(),
            knobs: None,
            decoded_last: AtomicU8::new(DecodedReason::Off as u8),
            decoded_reasks: AtomicU64::new(0),
            packer_thread,
        }
    }

    /// This cache, keeping files of one block in a memfd too (within the process's share, see
    /// `MemfdAllowance`) when `passthrough` can serve them from it; else on the heap, where a
    /// memfd would only cost a descriptor and a mapping.
    pub fn with_small_memfds(self, passthrough: bool) -> RamTier {
        self.shared
            .small_memfds
            .store(passthrough, Ordering::Relaxed);
        self
    }

    /// Leaves room for only `count` more memfds (tests of the allowance running out).
    #[cfg(test)]
    pub(crate) fn limit_memfds_for_test(&self, count: usize) {
        self.shared.memfds.limit_for_test(count);
    }

    /// This cache, keeping view images' decoded pixels as `mode` says.
    pub fn with_decoded_caching(mut self, mode: DecodedCaching) -> RamTier {
        self.decoded_caching = mode;
        // Until the first render, stats show what the mode decides with nothing measured yet.
        let first = policy::keep_decoded(mode, Duration::ZERO, 0, None, None);
        self.decoded_last = AtomicU8::new(first as u8);
        self
    }

    /// This cache, following the scheduler's decoded-caching knob while it holds it.
    pub fn with_knobs(mut self, knobs: Arc<Knobs>) -> RamTier {
        self.knobs = Some(knobs);
        self
    }

    /// This tier, shared, with the decoded pixels it can give back registered with its budget.
    pub fn shared(self) -> Arc<RamTier> {
        let ram = Arc::new(self);
        let decoded: Arc<dyn Shed> = ram.clone();
        ram.budget().add_shed(Arc::downgrade(&decoded));
        ram
    }

    /// The memory budget this cache's slice is part of.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.shared.ledger.budget
    }

    /// Drops `entry` from the cache's index if it holds no block and nobody else (but the
    /// caller) uses it: an opened or prefetched file the budget had no room for leaves nothing
    /// behind once it is closed.
    pub fn settle(&self, entry: &Arc<RamFile>) {
        if entry.cached_blocks() == 0 {
            self.files.remove_if(&entry.identity(), |held| {
                Arc::ptr_eq(held, entry) && Arc::strong_count(held) <= 2
            });
        }
    }

    /// Share of the cache slice in use (0..=1; a zero slice is full).
    pub fn fill(&self) -> f64 {
        let budget = &self.shared.ledger.budget;
        match budget.slice(Use::Cache) {
            0 => 1.0,
            slice => budget.used(Use::Cache) as f64 / slice as f64,
        }
    }

    /// The cache entry of one file version, created empty on first use. `path` (relative to the
    /// source root) is recorded in disk entries.
    pub fn file(&self, identity: Identity, path: &Path) -> Arc<RamFile> {
        self.files.get_or_insert_with(identity, || {
            Arc::new(RamFile::new(
                identity,
                Content::Source,
                identity.size,
                None,
                Arc::from(path),
                self.shared.clone(),
            ))
        })
    }

    /// Whether the RAM tier can still admit `bytes`.
    pub fn has_room(&self, bytes: u64) -> bool {
        self.shared.ledger.has_room(bytes)
    }

    /// The cache entry of one file version, if there is one.
    pub fn get(&self, identity: &Identity) -> Option<Arc<RamFile>> {
        self.files.get(identity)
    }

    /// The verified bytes of block `index` of `identity` if this tier holds them, not counted as
    /// a reader's hit: for the disk tier, writing a block it could not take when it was fetched.
    pub fn recall(&self, identity: &Identity, index: usize) -> Option<ReadBytes> {
        let file = self.get(identity)?;
        if index >= file.blocks() {
            return None;
        }
        let span = file.block_span(index);
        file.verified(
            index,
            0..(span.end - span.start) as usize,
            &Unpacked::default(),
        )
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

    /// Offers the decoded pixels of image `identity` (at `path`): `len` bytes in rows of `row`
    /// bytes that took `decode` to produce, made by `pixels` only if the policy finds them worth
    /// their memory and the budget has room. True when they were admitted.
    pub fn offer_decoded(
        &self,
        identity: Identity,
        path: &Path,
        (len, row): (u64, usize),
        decode: Duration,
        pixels: impl FnOnce() -> Vec<u8>,
    ) -> bool {
        let metrics = &self.shared.metrics;
        let reason = policy::keep_decoded(
            self.decoded_caching,
            decode,
            len,
            metrics.source_bytes_per_s(),
            self.knobs.as_ref().and_then(|k| k.decoded()),
        );
        self.decoded_last.store(reason as u8, Ordering::Relaxed);
        if !reason.keeps() {
            metrics.decoded_declined.inc();
            return false;
        }
        if len > u64::from(u32::MAX) || !self.shared.ledger.has_room(len) {
            metrics.decoded_rejected.inc();
            return false;
        }
        let admitted = self.admit_whole(
            (&self.decoded, Content::Decoded),
            identity,
            path,
            Some(row),
            pixels(),
        );
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
        let hit = self
            .marked
            .get(identity)
            .and_then(|entry| entry.read_cached(0, entry.content_len() as u32, memo));
        if hit.is_some() {
            self.shared.metrics.marked_hits.inc();
        }
        hit
    }

    /// Offers the restart-marked copy of JPEG `identity` (at `path`); true when the budget had
    /// room for it and it was admitted.
    pub fn offer_marked(&self, identity: Identity, path: &Path, copy: Vec<u8>) -> bool {
        if copy.len() as u64 > u64::from(u32::MAX)
            || !self.shared.ledger.has_room(copy.len() as u64)
        {
            return false;
        }
        let admitted =
            self.admit_whole((&self.marked, Content::Marked), identity, path, None, copy);
        if admitted {
            self.shared.metrics.marked_admitted.inc();
        }
        admitted
    }

    /// Admits `bytes` (image rows of `row` bytes, when they are) whole as the `content` entry
    /// of `identity` in `map`; true when admitted (a failed admission leaves no entry behind).
    fn admit_whole(
        &self,
        (map, content): (&ShardedMap<Identity, Arc<RamFile>>, Content),
        identity: Identity,
        path: &Path,
        row: Option<usize>,
        bytes: Vec<u8>,
    ) -> bool {
        let entry = map.get_or_insert_with(identity, || {
            Arc::new(RamFile::new(
                identity,
                content,
                bytes.len() as u64,
                row,
                Arc::from(path),
                self.shared.clone(),
            ))
        });
        let admitted = entry.admit_whole(bytes);
        if !admitted {
            map.remove(&identity);
        }
        admitted
    }

    /// Whether decoded pixels of `len` bytes offered now could be kept, asked before decoding,
    /// so a render whose pixels would be declined decodes only what it reads: not with decoded
    /// caching off, the scheduler's knob at no, or no room for them in the budget; in auto mode
    /// as the policy decided last, but yes every `REASK_DECLINED`th time all the same, so a
    /// decline made while the source was fast is made again, or not, as it slows.
    pub fn may_keep_decoded(&self, len: u64) -> bool {
        let scheduled = self.knobs.as_ref().and_then(|k| k.decoded());
        let wanted = match (self.decoded_caching, scheduled) {
            (DecodedCaching::Off, _) => false,
            (DecodedCaching::On, _) => true,
            (DecodedCaching::Auto, Some(keep)) => keep,
            (DecodedCaching::Auto, None) => {
                self.decoded_choice().1.keeps()
                    || self
                        .decoded_reasks
                        .fetch_add(1, Ordering::Relaxed)
                        .is_multiple_of(REASK_DECLINED)
            }
        };
        wanted && self.shared.ledger.has_room(len)
    }

    /// Flips a byte of the first block of image `identity`'s cached pixels.
    #[cfg(test)]
    pub(crate) fn corrupt_decoded_for_test(&self, identity: &Identity) {
        if let Some(entry) = self.decoded.get(identity) {
            entry.corrupt_for_test(0);
        }
    }

    /// The mode of decoded-pixel caching, and the reason of the latest decision.
    pub fn decoded_choice(&self) -> (DecodedCaching, DecodedReason) {
        let last = self.decoded_last.load(Ordering::Relaxed);
        let reason = DecodedReason::ALL
            .get(usize::from(last))
            .copied()
            .unwrap_or(DecodedReason::Off);
        (self.decoded_caching, reason)
    }

    /// The codec decision most recently taken, and why.
    pub fn codec_choice(&self) -> Choice {
        self.shared.packer.last_choice()
    }

    /// Blocks of `identity` the tier holds.
    pub fn held(&self, identity: &Identity) -> usize {
        self.get(identity).map_or(0, |c| c.cached_blocks())
    }

    /// Drops the entry of a file version that the source no longer has. Its memory returns to the
    /// budget once the last open handle on it is released.
    pub fn forget(&self, identity: &Identity) {
        self.files.remove(identity);
        self.decoded.remove(identity);
        self.marked.remove(identity);
    }

    /// Current figures for the stats files.
    pub fn gauges(&self) -> RamGauges {
        let ledger = &self.shared.ledger;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (files, decoded, marked) = (
            ledger.tally(Content::Source),
            ledger.tally(Content::Decoded),
            ledger.tally(Content::Marked),
        );
        let all = [files, decoded, marked];
        let sum = |field: fn(&Tally) -> &AtomicU64| all.iter().map(|t| load(field(t))).sum();
        let by_codec: [u64; 3] =
            std::array::from_fn(|i| all.iter().map(|t| load(&t.by_codec[i])).sum());
        let (pack_queue, repack_queue) = self.shared.packer.queued();
        RamGauges {
            bytes: sum(|t| &t.stored),
            logical_bytes: sum(|t| &t.logical),
            budget_bytes: ledger.budget.slice(Use::Cache),
            blocks: by_codec.iter().sum(),
            blocks_by_codec: by_codec,
            files: load(&files.entries),
            complete_files: load(&files.complete),
            decoded_entries: load(&decoded.complete),
            decoded_bytes: load(&decoded.stored),
            decoded_logical_bytes: load(&decoded.logical),
            marked_entries: load(&marked.complete),
            marked_bytes: load(&marked.stored),
            pack_queue: pack_queue as u64,
            repack_queue: repack_queue as u64,
        }
    }
}

impl Shed for RamTier {
    /// Decoded pixels and restart-marked copies no render is reading now: they can be made
    /// again from the source.
    fn shed(&self) -> u64 {
        let ledger = &self.shared.ledger;
        let stored = || {
            [Content::Decoded, Content::Marked]
                .map(|c| ledger.tally(c).stored.load(Ordering::Relaxed))
                .iter()
                .sum::<u64>()
        };
        let before = stored();
        self.decoded.retain(|_, entry| Arc::strong_count(entry) > 1);
        self.marked.retain(|_, entry| Arc::strong_count(entry) > 1);
        before.saturating_sub(stored())
    }
}

impl Drop for RamTier {
    fn drop(&mut self) {
        self.shared.packer.stop();
        if let Some(thread) = self.packer_thread.take() {
            let _ = thread.join();
        }
    }
}
