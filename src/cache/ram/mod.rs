//! The never-evict ("MinIO", after CoorDL) RAM tier.
//!
//! Owns: which blocks of which file version are held in memory, under the memory budget's cache
//! slice, with the figures of each kind of entry; the background packer that compresses them;
//! and, behind its own front door (`derived`), what view renders derive from images and may
//! keep: decoded pixels, restart-marked JPEG copies. Data is admitted until the slice is full; after
//! that nothing is evicted and nothing more is admitted, so a random-order epoch misses exactly
//! what did not fit instead of thrashing like an LRU. Compressible data is packed in the
//! background (see `packer`), so the same budget holds more of it. Entries are keyed by source
//! `Identity`: a changed file is a different key, and its old entry is dropped by `forget`. A
//! JPEG whose restart-marked copy is admitted gives up its own entry if no reader holds it: the
//! renders start from the copy, so a view's images take their room once, not twice (a direct
//! read of the file then fetches it again, and keeps it).
//! Admission failures (no room, memfd refused, checksum mismatch) become misses and counters,
//! never errors for the reader. Must never evict to make room (memory still short under
//! pressure is not room: then unopened entries are given back, `Shed::give_back`, rather than
//! let the kernel kill the daemon), never fetch
//! (`BlockFetcher` brings blocks), and never take a tier-wide lock on the read path.

mod derived;
mod file;
mod memfd;
pub(crate) mod packer;
mod slots;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;

pub use derived::Derived;
pub use file::{PackOutcome, RamFile, ReadBytes, Unpacked, whole_file_charge};
pub use packer::Packer;

use super::codec::Codec;
use super::policy::{Choice, DecodedCaching};
use crate::cache::metrics::{CacheMetrics, RamGauges};
use crate::control::knobs::Knobs;
use crate::memory::{MemoryBudget, Shed, Use};
use crate::shards::{Keyed, Pick, ShardedMap, ShardedSet};
use crate::source::Identity;
use crate::telemetry::Telemetry;
use memfd::MemfdAllowance;

/// What a cache entry holds; each kind has its own tallies under the one shared budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// Bytes of a source file.
    Source,
    /// Decoded pixels of a source image (see `Derived::decoded`).
    Decoded,
    /// A restart-marked copy of a source JPEG (see `Derived::marked`).
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

    /// Room for a block of about `bytes` in the cache slice, taken now, before the block is read.
    fn reserve(&self, bytes: u64) -> Option<RamRoom<'_>> {
        // Lazily: a `RamRoom` made and dropped on refusal would give back bytes never taken.
        self.budget.admit(Use::Cache, bytes).then(|| RamRoom {
            ledger: self,
            bytes,
        })
    }

    /// Charges `bytes` for a block of `content` being stored: to `room` where one was reserved
    /// for it (topped up, or the rest given back, when the stored charge differs from the
    /// guess), else to the cache slice if it has room now. False, and nothing charged, otherwise.
    fn try_reserve(&self, content: Content, bytes: u64, room: Option<RamRoom<'_>>) -> bool {
        let reserved = match room {
            None => self.budget.admit(Use::Cache, bytes),
            Some(mut room) => {
                let held = std::mem::take(&mut room.bytes);
                if held >= bytes {
                    self.budget.release(Use::Cache, held - bytes);
                    true
                } else if self.budget.admit(Use::Cache, bytes - held) {
                    true
                } else {
                    self.budget.release(Use::Cache, held);
                    false
                }
            }
        };
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

/// Room in the cache slice taken for one block before its source read (`RamFile::reserve`), so
/// that no other admission takes it while the read runs: a fetch ahead of the readers that found
/// room and lost it to a reader's miss meanwhile read the block for nothing, and the reader read
/// it again. Given back when dropped unless the block's `store` used it.
pub struct RamRoom<'a> {
    ledger: &'a Ledger,
    bytes: u64,
}

impl Drop for RamRoom<'_> {
    fn drop(&mut self) {
        self.ledger.budget.release(Use::Cache, self.bytes);
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
    /// The tier's decoded pixels (`Derived` owns them), which give their room back to files.
    pixels: OnceLock<Weak<ShardedMap<Identity, Arc<RamFile>>>>,
    /// Decode seconds per byte of pixels, a running average over the images offered (`f64`
    /// bits; 0 before the first): `Derived` keeps it, the packer weighs unpacking against it.
    pixel_decode_cost: AtomicU64,
}

impl Shared {
    /// Decode seconds per byte of pixels (0 before any image was offered).
    fn pixel_decode_s_per_byte(&self) -> f64 {
        f64::from_bits(self.pixel_decode_cost.load(Ordering::Relaxed))
    }

    /// Bytes of decoded pixels held: what `yield_pixels` could free at most.
    fn pixel_bytes(&self) -> u64 {
        self.ledger
            .tally(Content::Decoded)
            .stored
            .load(Ordering::Relaxed)
    }

    /// Makes room for `bytes` of a file (or a restart-marked copy) by dropping decoded pixels
    /// no render reads: they are made again from the file, and take only the room files leave.
    /// True when it freed that much.
    fn yield_pixels(&self, bytes: u64) -> bool {
        if self.pixel_bytes() == 0 {
            return false;
        }
        let Some(pixels) = self.pixels.get().and_then(Weak::upgrade) else {
            return false;
        };
        let mut freed = 0;
        let dropped = {
            let mut pick = unused_until(bytes, &mut freed);
            pixels.take(|_, entry| pick(entry))
        };
        self.metrics.decoded_yielded.add(dropped.len() as u64);
        // Dropped here, outside the map's locks: each gives its room back to the budget.
        drop(dropped);
        freed >= bytes
    }
}

/// What a tier's `take` lets go to free `bytes`: entries no reader, prefetch or packer uses (only
/// the map holds them), until their charges add up to `bytes`, counted in `freed`.
fn unused_until(bytes: u64, freed: &mut u64) -> impl FnMut(&Arc<RamFile>) -> Pick + '_ {
    move |entry| {
        if *freed >= bytes {
            Pick::Done
        } else if Arc::strong_count(entry) > 1 {
            Pick::Keep
        } else {
            *freed += entry.charged_bytes();
            Pick::Take
        }
    }
}

/// The RAM tier of one mount: cached files (and decoded images) by identity.
pub struct RamTier {
    shared: Arc<Shared>,
    /// Shared with `derived`, which lets a file's own entry go once its restart-marked copy
    /// serves the renders instead.
    files: Arc<ShardedSet<Arc<RamFile>>>,
    derived: Derived,
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
        let shared = Arc::new(Shared {
            ledger: Ledger::new(budget),
            metrics,
            packer,
            memfds: MemfdAllowance::new(MemfdAllowance::process_share()),
            small_memfds: AtomicBool::new(false),
            pixels: OnceLock::new(),
            pixel_decode_cost: AtomicU64::new(0),
        });
        let files = Arc::<ShardedSet<_>>::default();
        RamTier {
            derived: Derived::new(shared.clone(), files.clone()),
            shared,
            files,
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
        self.derived.set_mode(mode);
        self
    }

    /// This cache, following the scheduler's decoded-caching knob while it holds it.
    pub fn with_knobs(mut self, knobs: Arc<Knobs>) -> RamTier {
        self.derived.set_knobs(knobs);
        self
    }

    /// This cache, weighing decoded pixels against the working set `telemetry` measures.
    pub fn with_telemetry(mut self, telemetry: Arc<Telemetry>) -> RamTier {
        self.derived.set_telemetry(telemetry);
        self
    }

    /// This tier, shared, with the decoded pixels it can give back registered with its budget.
    pub fn shared(self) -> Arc<RamTier> {
        let ram = Arc::new(self);
        let decoded: Arc<dyn Shed> = ram.clone();
        ram.budget().add_shed(Use::Cache, Arc::downgrade(&decoded));
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

    /// Bytes of the budget's cache slice: what the RAM tier may hold.
    pub fn capacity(&self) -> u64 {
        self.shared.ledger.budget.slice(Use::Cache)
    }

    /// Share of the cache slice in use (0..=1; a zero slice is full).
    pub fn fill(&self) -> f64 {
        let budget = &self.shared.ledger.budget;
        match budget.slice(Use::Cache) {
            0 => 1.0,
            slice => budget.used(Use::Cache) as f64 / slice as f64,
        }
    }

    /// The cache entry of one file version, created empty on first use. It keeps no path: the
    /// tiers below that record one take it from the open source file (a path kept here was a
    /// second copy of each file's name whenever prefetch made the entry before an open).
    pub fn file(&self, identity: Identity) -> Arc<RamFile> {
        self.files.get_or_insert_with(&identity, || {
            Arc::new(RamFile::new(
                identity,
                Content::Source,
                identity.size,
                0,
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

    /// What renders derive from images, kept beside the files: the front door for them.
    pub fn derived(&self) -> &Derived {
        &self.derived
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
        self.derived.forget(identity);
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
        self.derived.shed_unread();
        before.saturating_sub(stored())
    }

    /// Cached source files no reader has open, until about `bytes` are let go, when the daemon
    /// would otherwise be killed. They are read from the source again when next asked for. (The
    /// tier lets go of a file it admitted only here, and when a render's restart-marked copy of
    /// it takes its place: `Derived::offer_marked`.)
    fn give_back(&self, bytes: u64) -> u64 {
        let mut freed = 0;
        let gone = self.files.take(unused_until(bytes, &mut freed));
        for entry in &gone {
            self.derived.forget(entry.key());
        }
        drop(gone);
        if freed > 0 {
            tracing::warn!(
                freed_bytes = freed,
                "memory still short under pressure: cached files given back"
            );
        }
        freed
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
