//! `RamFile`: the blocks of one file version the RAM tier holds, and how reads are answered from
//! them.
//!
//! Owns: per-block slots (stored bytes), admission of a block under the shared budget, the
//! file's layout, verification of every hit, packing a block in place, and the memfd a complete
//! raw file offers to kernel passthrough. The first admitted block decides the layout: bytes
//! worth compressing (see `codec`) stay on the heap, raw until the packer compresses them; other
//! files keep their bytes in a memfd (see `memfd`), which the kernel can serve by passthrough
//! once every block is present, except files past the process's memfd allowance (and files of
//! one block without passthrough), which stay raw on the heap. Must never
//! return bytes that failed their checksum, never evict a block to make room, and never fetch:
//! blocks come from `BlockFetcher`, which decides what is fetched from where.

use std::any::Any;
use std::borrow::Cow;
use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::memfd::MemfdBody;
use super::slots::{Slots, Vacant};
use super::{Content, RamRoom, Shared, Tally};
use crate::cache::block::{self, Block, Packed};
use crate::cache::codec::{self, Codec};
use crate::cache::policy::{self, strength};
use crate::cache::{BLOCK_SIZE, rows, thread_cpu};
use crate::error::FsError;
use crate::memory::Use;
use crate::source::Identity;

/// Page size used to account memfd storage (the kernel allocates whole pages).
const PAGE: u64 = 4096;

/// What `len` bytes in a memfd take: whole pages.
fn whole_pages(len: u64) -> u64 {
    len.div_ceil(PAGE) * PAGE
}

/// The most a source file of `len` bytes costs the RAM tier's budget once held whole and raw:
/// its bytes in whole pages (as a memfd holds them) and its entry's own bookkeeping. Packed, it
/// costs less.
pub fn whole_file_charge(len: u64) -> u64 {
    let blocks = usize::try_from(len.div_ceil(BLOCK_SIZE)).unwrap_or(usize::MAX);
    whole_pages(len) + entry_overhead(blocks)
}

/// Bytes of an entry's own bookkeeping for a file of `blocks` blocks, charged to the budget
/// while the entry lives.
fn entry_overhead(blocks: usize) -> u64 {
    std::mem::size_of::<RamFile>() as u64 + Slots::<Slot>::overhead_of(blocks)
}

/// Where a published block's bytes live.
#[derive(Debug, Clone)]
enum Stored {
    /// Raw on the heap (files of a single block, and compressible files not yet packed).
    Heap(Arc<Block>),
    /// In the file's memfd at the block's offset; only the checksums live here (behind a thin
    /// pointer: every slot is as wide as the widest variant).
    Memfd(Arc<Box<[u64]>>),
    /// Compressed on the heap.
    Packed(Arc<Packed>),
}

impl Stored {
    /// The codec its bytes are stored with.
    fn codec(&self) -> Codec {
        match self {
            Stored::Packed(p) => p.codec,
            Stored::Heap(_) | Stored::Memfd(_) => Codec::None,
        }
    }
}

/// How a file's blocks are stored, decided by its first admitted block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Raw: in a memfd (passthrough-able), or on the heap (files past the process's memfd
    /// allowance, files of one block without passthrough, and decoded pixels of one block).
    Raw {
        /// Whether the bytes live in a memfd.
        memfd: bool,
    },
    /// Compressible: on the heap, packed in the background, after the row filter at `lag`
    /// when the bytes are image rows of that length (0: no filter).
    Packable {
        /// Row length in bytes, or 0.
        lag: u32,
    },
}

/// What `RamFile::pack` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackOutcome {
    /// The block is now stored with this codec.
    Packed(Codec),
    /// Nothing to do: gone, changed meanwhile, or already at least as strong.
    Unchanged,
    /// This codec did not make it smaller (a stronger one may).
    NoGain,
}

/// The last block a handle decompressed, so that small sequential reads of a packed block
/// decompress it once, not once per read. One per open handle, dropped with it.
#[derive(Default)]
pub struct Unpacked(Mutex<Option<(usize, Arc<Vec<u8>>)>>);

#[derive(Default)]
struct Slot {
    stored: Option<Stored>,
}

impl Vacant for Slot {
    fn is_vacant(&self) -> bool {
        self.stored.is_none()
    }
}

/// Bytes answering one read, borrowed from the cache where possible.
pub enum ReadBytes {
    /// A range of one heap block.
    Shared(Arc<Block>, Range<usize>),
    /// A range of a file's memfd mapping.
    Mapped(Arc<RamFile>, Range<usize>),
    /// Bytes assembled from several blocks.
    Owned(Vec<u8>),
    /// A range of a file held whole in memory (a view render, a stats snapshot).
    Whole(Arc<Vec<u8>>, Range<usize>),
}

impl ReadBytes {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            ReadBytes::Shared(block, range) => &block.data[range.clone()],
            ReadBytes::Mapped(file, range) => file.memfd_bytes().map_or(&[], |b| &b[range.clone()]),
            ReadBytes::Owned(bytes) => bytes,
            ReadBytes::Whole(bytes, range) => &bytes[range.clone()],
        }
    }
}

/// The RAM tier's entry of one file version (its bytes, or its decoded pixels).
pub struct RamFile {
    identity: Identity,
    content: Content,
    /// Bytes of content: the file's size, or the decoded pixels' length.
    len: u64,
    /// Length of decoded pixels' image rows (0: stored unfiltered); other content finds its rows
    /// from an `.npy` header, if any, when the layout is decided. Every field counts (one entry
    /// per cached file; `an_entry_fits_a_160_byte_chunk`): 32 bits, no `Option`.
    rows: u32,
    slots: Slots<Slot>,
    layout: OnceLock<Layout>,
    /// Multi-block raw files only; `Some(None)` when the memfd could not be created. Boxed, so
    /// the many files that never have one carry a pointer, not its state.
    memfd: OnceLock<Option<Box<MemfdPart>>>,
    ram: Arc<Shared>,
    admitted_bytes: AtomicU64,
    /// Blocks held: at most what fits in memory, far below 2^32 blocks of 1 MiB.
    present: AtomicU32,
}

/// What only a file whose bytes live in a memfd has.
struct MemfdPart {
    body: MemfdBody,
    /// Set once every block was verified against the memfd after completion.
    verified_complete: AtomicBool,
    /// What the FUSE adapter registered for passthrough (its backing id), opaque here; released
    /// with this entry, so the kernel never pins a memfd the budget no longer counts.
    backing: Mutex<Option<Arc<dyn Any + Send + Sync>>>,
}

/// Found in the tier by the identity of the version it holds.
impl crate::shards::Keyed for RamFile {
    type Key = Identity;

    fn key(&self) -> &Identity {
        &self.identity
    }
}

impl RamFile {
    /// Bytes of the budget it holds: its blocks as stored and its own overhead.
    pub fn charged_bytes(&self) -> u64 {
        self.admitted_bytes.load(Ordering::Acquire) + self.overhead()
    }

    /// Bytes of this entry's own bookkeeping, charged to the budget while it lives.
    fn overhead(&self) -> u64 {
        entry_overhead(self.slots.len())
    }

    /// An empty entry of `len` bytes of `content`; `rows`, the row length of decoded pixels
    /// (`Content::Decoded` only).
    pub(super) fn new(
        identity: Identity,
        content: Content,
        len: u64,
        rows: usize,
        ram: Arc<Shared>,
    ) -> RamFile {
        let slots = Slots::new(usize::try_from(len.div_ceil(BLOCK_SIZE)).unwrap_or(usize::MAX));
        let file = RamFile {
            identity,
            content,
            len,
            // A row past 4 GiB is no image's: such bytes are stored unfiltered.
            rows: u32::try_from(rows).unwrap_or(0),
            slots,
            layout: OnceLock::new(),
            memfd: OnceLock::new(),
            ram,
            admitted_bytes: AtomicU64::new(0),
            present: AtomicU32::new(0),
        };
        file.ram.ledger.budget.charge(Use::Cache, file.overhead());
        file
    }

    /// Blocks held.
    fn present(&self) -> usize {
        self.present.load(Ordering::Acquire) as usize
    }

    /// The file version this entry holds.
    pub fn identity(&self) -> Identity {
        self.identity
    }

    /// Bytes of content: the file's size, or its decoded pixels' length.
    pub fn content_len(&self) -> u64 {
        self.len
    }

    /// Raw files of more than one block (and a dense slot array: a huge file's bytes stay on
    /// the heap, block by block) keep their bytes in a memfd, which passthrough can serve.
    fn uses_memfd(&self) -> bool {
        self.slots.is_dense() && self.layout.get() == Some(&Layout::Raw { memfd: true })
    }

    /// Whether block `index` is stored (false past the end).
    pub fn is_stored(&self, index: usize) -> bool {
        self.slots
            .with(index, |s| s.stored.is_some())
            .unwrap_or(false)
    }

    fn tally(&self) -> &Tally {
        self.ram.ledger.tally(self.content)
    }

    fn memfd_part(&self) -> Option<&MemfdPart> {
        self.memfd.get().and_then(Option::as_deref)
    }

    fn memfd_bytes(&self) -> Option<&[u8]> {
        self.memfd_part().map(|part| part.body.bytes())
    }

    /// The bytes of the file block `index` covers.
    pub fn block_span(&self, index: usize) -> Range<u64> {
        let start = index as u64 * BLOCK_SIZE;
        start..(start + BLOCK_SIZE).min(self.len)
    }

    /// The blocks touched by `len` bytes at `offset`, each with the byte range inside it; empty
    /// at or past end of file.
    pub fn pieces(&self, offset: u64, len: u32) -> Vec<(usize, Range<usize>)> {
        let end = offset.saturating_add(u64::from(len)).min(self.len);
        let mut out = Vec::with_capacity(2);
        let mut pos = offset;
        while pos < end {
            let index = (pos / BLOCK_SIZE) as usize;
            let block_start = index as u64 * BLOCK_SIZE;
            let piece_end = end.min(block_start + BLOCK_SIZE);
            out.push((
                index,
                (pos - block_start) as usize..(piece_end - block_start) as usize,
            ));
            pos = piece_end;
        }
        out
    }

    /// Whether its blocks' slots are one array (walking every block is cheap), as for every
    /// file of up to 16 GiB.
    pub fn slots_are_dense(&self) -> bool {
        self.slots.is_dense()
    }

    /// Whether every block is cached.
    pub fn is_complete(&self) -> bool {
        self.present() == self.slots.len()
    }

    /// Answers a read only if every block it touches is cached and verifies; `None` means the
    /// caller must go to `BlockFetcher` (off the FUSE thread: it may wait on the source). A
    /// packed hit is decompressed here: bounded CPU work, never a wait on I/O.
    pub fn read_cached(
        self: &Arc<Self>,
        offset: u64,
        len: u32,
        memo: &Unpacked,
    ) -> Option<ReadBytes> {
        let pieces = self.pieces(offset, len);
        if !pieces.iter().all(|(i, _)| self.is_stored(*i)) {
            return None;
        }
        self.assemble(pieces, |index, range| {
            self.hit(index, range, memo).ok_or(FsError::Io)
        })
        .ok()
    }

    /// The pieces' bytes, each from `piece`: borrowed when there is one, copied together when a
    /// read spans blocks.
    pub fn assemble(
        &self,
        pieces: Vec<(usize, Range<usize>)>,
        mut piece: impl FnMut(usize, Range<usize>) -> Result<ReadBytes, FsError>,
    ) -> Result<ReadBytes, FsError> {
        match pieces.as_slice() {
            [] => Ok(ReadBytes::Owned(Vec::new())),
            [(index, range)] => piece(*index, range.clone()),
            _ => {
                let total = pieces.iter().map(|(_, r)| r.len()).sum();
                let mut out = Vec::with_capacity(total);
                for (index, range) in pieces {
                    out.extend_from_slice(piece(index, range)?.as_slice());
                }
                Ok(ReadBytes::Owned(out))
            }
        }
    }

    /// A verified cached piece of block `index` for a reader, counted as a hit; or `None`
    /// (absent, or corrupt and now dropped).
    pub fn hit(
        self: &Arc<Self>,
        index: usize,
        range: Range<usize>,
        memo: &Unpacked,
    ) -> Option<ReadBytes> {
        let bytes = self.verified(index, range, memo)?;
        self.ram.metrics.hits.inc();
        Some(bytes)
    }

    /// A verified cached piece of block `index`, or `None` (absent, or corrupt and now dropped,
    /// counted). Not a reader's hit: `hit` counts those.
    pub fn verified(
        self: &Arc<Self>,
        index: usize,
        range: Range<usize>,
        memo: &Unpacked,
    ) -> Option<ReadBytes> {
        let stored = self.slots.with(index, |s| s.stored.clone()).flatten()?;
        let bytes = match &stored {
            Stored::Packed(packed) => {
                let mut last = memo.0.lock();
                let unpacked = match &*last {
                    Some((i, bytes)) if *i == index => Some(bytes.clone()),
                    _ => {
                        let started = thread_cpu();
                        let bytes = packed.unpack().map(Arc::new);
                        self.ram
                            .metrics
                            .decompress_cpu_ns
                            .add(thread_cpu().saturating_sub(started));
                        if let Some(b) = &bytes {
                            *last = Some((index, b.clone()));
                        }
                        bytes
                    }
                };
                unpacked.map(|b| ReadBytes::Whole(b, range.clone()))
            }
            Stored::Heap(block) => block::verify(&block.data, &block.sums, range.clone())
                .then(|| ReadBytes::Shared(block.clone(), range.clone())),
            Stored::Memfd(sums) => {
                let span = self.block_span(index);
                let data = &self.memfd_bytes()?[span.start as usize..span.end as usize];
                let base = span.start as usize;
                block::verify(data, sums, range.clone())
                    .then(|| ReadBytes::Mapped(self.clone(), base + range.start..base + range.end))
            }
        };
        if bytes.is_none() {
            self.ram.metrics.integrity_errors.inc();
            tracing::warn!(
                block = index,
                "cached block failed its checksum; dropped, refetching"
            );
            self.drop_block(index);
        }
        bytes
    }

    /// Number of blocks held in RAM.
    pub fn cached_blocks(&self) -> usize {
        self.present()
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.slots.len()
    }

    /// Keeps `block`, fetched for block `index`, if the slot is vacant and `room` (reserved for
    /// it) or else the budget has room; true when the RAM tier holds the block now. Compressible
    /// layouts are queued for packing.
    pub fn store(
        self: &Arc<Self>,
        index: usize,
        block: &Arc<Block>,
        room: Option<RamRoom<'_>>,
    ) -> bool {
        let stored = self
            .slots
            .with(index, |slot| {
                if slot.stored.is_none() {
                    slot.stored = self.admit(index, block, room);
                    return slot.stored.is_some().then_some(true);
                }
                Some(false)
            })
            .flatten();
        if stored == Some(true)
            && matches!(self.layout.get(), Some(Layout::Packable { .. }))
            && !self.ram.packer.enqueue(self, index)
        {
            tracing::debug!(block = index, "packing queue full; block stays raw");
        }
        stored.is_some()
    }

    /// Whether a block of `len` bytes of this file would fit the RAM tier's budget now, counting
    /// the room decoded pixels would give back to it (a hint).
    pub fn fits(&self, len: u64) -> bool {
        let charge = self.charge(len);
        self.ram.ledger.has_room(charge)
            || (self.content != Content::Decoded && self.ram.pixel_bytes() >= charge)
    }

    /// Frees `bytes` for this entry by dropping decoded pixels no render reads, unless this
    /// entry is pixels itself (`Shared::yield_pixels`); true when it did.
    fn takes_room_from_pixels(&self, bytes: u64) -> bool {
        self.content != Content::Decoded && self.ram.yield_pixels(bytes)
    }

    /// Room for a block of `len` bytes of this file, taken from the RAM tier's budget now, for
    /// `store` to use once the block is read; none when the budget has no room. Before the first
    /// block sets the layout, room for the dearer one (a memfd's whole pages), the rest given
    /// back at `store`: a top-up there fails in a full cache, and the block read is thrown away.
    pub fn reserve(&self, len: u64) -> Option<RamRoom<'_>> {
        let charge = match self.layout.get() {
            Some(_) => self.charge(len),
            None => whole_pages(len),
        };
        let ledger = &self.ram.ledger;
        ledger.reserve(charge).or_else(|| {
            self.takes_room_from_pixels(charge)
                .then(|| ledger.reserve(charge))
                .flatten()
        })
    }

    /// What storing `len` raw bytes of this file costs the budget (a memfd takes whole pages).
    fn charge(&self, len: u64) -> u64 {
        if self.uses_memfd() {
            whole_pages(len)
        } else {
            len
        }
    }

    /// What a stored block of block `index` costs the budget now.
    fn stored_charge(&self, index: usize, stored: &Stored) -> u64 {
        match stored {
            Stored::Packed(p) => p.payload.len() as u64,
            Stored::Heap(_) | Stored::Memfd(_) => {
                let span = self.block_span(index);
                self.charge(span.end - span.start)
            }
        }
    }

    /// Admits a fetched block if the budget allows; returns how it is stored. The first block
    /// admitted decides the file's layout.
    fn admit(&self, index: usize, block: &Arc<Block>, room: Option<RamRoom<'_>>) -> Option<Stored> {
        let ledger = &self.ram.ledger;
        self.layout.get_or_init(|| {
            let lag = match self.content {
                Content::Decoded => self.rows,
                Content::Source | Content::Marked if index == 0 => rows::npy_row_bytes(&block.data)
                    .and_then(|row| u32::try_from(row).ok())
                    .unwrap_or(0),
                Content::Source | Content::Marked => 0,
            };
            if self.ram.packer.enabled() && (lag > 0 || codec::is_compressible(&block.data)) {
                // Image rows compress once filtered, even when the raw bytes look random.
                Layout::Packable { lag }
            } else {
                // A memfd while the process's share lasts; past it, the heap (served by the
                // daemon) rather than running out of descriptors or mappings.
                let wanted = self.slots.len() > 1
                    || (self.content == Content::Source
                        && self.ram.small_memfds.load(Ordering::Relaxed));
                Layout::Raw {
                    memfd: wanted && self.ram.memfds.take(),
                }
            }
        });
        let bytes = self.charge(block.data.len() as u64);
        // A refused charge gives back any room reserved for it: the second try needs all of it.
        let charged = ledger.try_reserve(self.content, bytes, room)
            || (self.takes_room_from_pixels(bytes)
                && ledger.try_reserve(self.content, bytes, None));
        if !charged {
            self.ram.metrics.admission_rejected.inc();
            return None;
        }
        let stored = if self.uses_memfd() {
            let part = self.memfd.get_or_init(|| {
                let body = MemfdBody::create(self.len as usize)
                    .inspect_err(
                        |e| tracing::warn!(error = %e, "cannot create a memfd; file not cached"),
                    )
                    .ok()?;
                Some(Box::new(MemfdPart {
                    body,
                    verified_complete: AtomicBool::new(false),
                    backing: Mutex::new(None),
                }))
            });
            match part
                .as_ref()
                .map(|p| p.body.write_at(&block.data, self.block_span(index).start))
            {
                Some(Ok(())) => Stored::Memfd(Arc::new(block.sums.clone())),
                failed => {
                    if let Some(Err(e)) = failed {
                        tracing::warn!(error = %e, "cannot write to the cache memfd; block not cached");
                    }
                    ledger.release(self.content, bytes);
                    self.ram.metrics.admission_rejected.inc();
                    return None;
                }
            }
        } else {
            Stored::Heap(block.clone())
        };
        self.admitted_bytes.fetch_add(bytes, Ordering::AcqRel);
        ledger.count_block(self.content, Codec::None, block.data.len() as u64, true);
        let before = self.present.fetch_add(1, Ordering::AcqRel) as usize;
        if before == 0 {
            self.tally().entries.fetch_add(1, Ordering::Relaxed);
        }
        if before + 1 == self.slots.len() {
            self.tally().complete.fetch_add(1, Ordering::Relaxed);
        }
        Some(stored)
    }

    /// Admits `bytes`, the whole content of this entry (decoded pixels, which have no source to
    /// fetch from), if it all fits the budget; true once every block is stored (also when they
    /// all were already: another render's copy of the same content). All or nothing: a block
    /// refused midway drops the ones this call stored before it, never another's. Compressible
    /// content is queued for packing like fetched blocks.
    pub fn admit_whole(self: &Arc<Self>, bytes: Vec<u8>) -> bool {
        if bytes.len() as u64 != self.len {
            return false;
        }
        if self.is_complete() {
            return true;
        }
        if !self.ram.ledger.has_room(self.len) {
            return false;
        }
        let mut stored_now = Vec::new();
        let blocks: Vec<Block> = if self.slots.len() == 1 {
            vec![Block::new(bytes)]
        } else {
            bytes
                .chunks(BLOCK_SIZE as usize)
                .map(|chunk| Block::new(chunk.to_vec()))
                .collect()
        };
        for (index, block) in blocks.into_iter().enumerate() {
            let block = Arc::new(block);
            // Some(true): admitted now; Some(false): already there; None: refused.
            let outcome = self.slots.with(index, |slot| match &slot.stored {
                Some(_) => Some(false),
                None => {
                    slot.stored = Some(self.admit(index, &block, None)?);
                    Some(true)
                }
            });
            match outcome.flatten() {
                Some(true) => {
                    stored_now.push(index);
                    if matches!(self.layout.get(), Some(Layout::Packable { .. })) {
                        self.ram.packer.enqueue(self, index);
                    }
                }
                Some(false) => {}
                None => {
                    stored_now.into_iter().for_each(|i| self.drop_block(i));
                    return false;
                }
            }
        }
        true
    }

    /// Compresses block `index` with `codec` if that is stronger than how it is stored now and
    /// makes it smaller; the budget it frees returns to the ledger. Run by the packer thread:
    /// compresses outside the block's lock and publishes only if the block did not change.
    pub fn pack(&self, index: usize, codec: Codec) -> PackOutcome {
        let Some(stored) = self.slots.with(index, |s| s.stored.clone()).flatten() else {
            return PackOutcome::Unchanged;
        };
        let from = stored.codec();
        if strength(codec) <= strength(from) {
            return PackOutcome::Unchanged;
        }
        let metrics = &self.ram.metrics;
        let logical: Option<Cow<'_, [u8]>> = match &stored {
            Stored::Heap(block) if block::verify(&block.data, &block.sums, 0..block.data.len()) => {
                Some(Cow::Borrowed(&block.data))
            }
            Stored::Packed(packed) => packed.unpack().map(Cow::Owned),
            Stored::Memfd(_) => return PackOutcome::Unchanged,
            Stored::Heap(_) => None,
        };
        let Some(logical) = logical else {
            metrics.integrity_errors.inc();
            tracing::warn!(
                block = index,
                "cached block failed its checksum before packing; dropped"
            );
            self.drop_block(index);
            return PackOutcome::Unchanged;
        };
        let started = thread_cpu();
        let lag = match self.layout.get() {
            Some(Layout::Packable { lag }) => *lag as usize,
            _ => 0,
        };
        let packed = Packed::pack(codec, lag, &logical)
            .filter(|p| self.content != Content::Decoded || self.packing_pays(p, logical.len()));
        metrics
            .compress_cpu_ns
            .add(thread_cpu().saturating_sub(started));
        let Some(packed) = packed else {
            return PackOutcome::NoGain;
        };
        let (old, new) = (
            self.stored_charge(index, &stored),
            packed.payload.len() as u64,
        );
        let published = self.slots.with(index, |slot| {
            let unchanged = match (&slot.stored, &stored) {
                (Some(Stored::Heap(a)), Stored::Heap(b)) => Arc::ptr_eq(a, b),
                (Some(Stored::Packed(a)), Stored::Packed(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            if unchanged && new < old {
                slot.stored = Some(Stored::Packed(Arc::new(packed)));
            }
            unchanged && new < old
        });
        if published != Some(true) {
            return PackOutcome::Unchanged;
        }
        let ledger = &self.ram.ledger;
        self.admitted_bytes.fetch_sub(old - new, Ordering::AcqRel);
        ledger.release(self.content, old - new);
        ledger.count_block(self.content, from, logical.len() as u64, false);
        ledger.count_block(self.content, codec, logical.len() as u64, true);
        if from == Codec::None {
            metrics.packed_blocks.inc();
        } else {
            metrics.recompressions.inc();
        }
        PackOutcome::Packed(codec)
    }

    /// Whether decoded pixels packed as `packed` (of `raw` bytes) are worth it: their unpack
    /// time, measured here once, against the decodes the room saves
    /// (`policy::packing_pixels_pays`). Counted when not.
    fn packing_pays(&self, packed: &Packed, raw: usize) -> bool {
        let started = thread_cpu();
        let unpacks = packed.unpack().is_some();
        let unpack_s = thread_cpu().saturating_sub(started) as f64 / 1e9;
        let decode_s = self.ram.pixel_decode_s_per_byte() * raw as f64;
        let pays = unpacks
            && policy::packing_pixels_pays(
                decode_s,
                unpack_s,
                raw as u64,
                packed.payload.len() as u64,
            );
        if !pays {
            self.ram.metrics.decoded_kept_raw.inc();
        }
        pays
    }

    fn drop_block(&self, index: usize) {
        let Some(stored) = self.slots.with(index, |s| s.stored.take()).flatten() else {
            return;
        };
        let span = self.block_span(index);
        let len = self.stored_charge(index, &stored);
        let ledger = &self.ram.ledger;
        ledger.count_block(self.content, stored.codec(), span.end - span.start, false);
        drop(stored);
        if let Some(part) = self.memfd_part() {
            part.verified_complete.store(false, Ordering::Release);
        }
        let before = self.present.fetch_sub(1, Ordering::AcqRel) as usize;
        if before == self.slots.len() {
            self.tally().complete.fetch_sub(1, Ordering::Relaxed);
        }
        if before == 1 {
            self.tally().entries.fetch_sub(1, Ordering::Relaxed);
        }
        self.admitted_bytes.fetch_sub(len, Ordering::AcqRel);
        ledger.release(self.content, len);
    }

    /// The memfd holding this whole file, if every block is cached and verified: the kernel can
    /// then serve it by passthrough. Verifies every block once, the first time it is asked.
    pub fn passthrough_fd(&self) -> Option<BorrowedFd<'_>> {
        if !self.uses_memfd() || !self.is_complete() {
            return None;
        }
        let part = self.memfd_part()?;
        if !part.verified_complete.load(Ordering::Acquire) {
            for index in 0..self.slots.len() {
                let Some(Stored::Memfd(sums)) =
                    self.slots.with(index, |s| s.stored.clone()).flatten()
                else {
                    return None;
                };
                let span = self.block_span(index);
                let data = &part.body.bytes()[span.start as usize..span.end as usize];
                if !block::verify(data, &sums, 0..data.len()) {
                    self.ram.metrics.integrity_errors.inc();
                    self.drop_block(index);
                    return None;
                }
            }
            part.verified_complete.store(true, Ordering::Release);
        }
        Some(part.body.fd())
    }

    /// Counts an open the kernel serves by passthrough as a hit of every block: its reads never
    /// reach the daemon, and the hit rate must not fall as the kernel serves more of the cache.
    pub fn count_passthrough_open(&self) {
        self.ram.metrics.hits.add(self.slots.len() as u64);
    }

    /// The passthrough registration of this complete file, made once by `register` from its memfd
    /// and shared by every later open (the kernel wants one backing file per inode).
    pub fn passthrough_backing<T: Any + Send + Sync>(
        &self,
        register: impl FnOnce(BorrowedFd<'_>) -> std::io::Result<T>,
    ) -> std::io::Result<Arc<T>> {
        let not_complete = || std::io::Error::other("cache entry is not complete");
        let mut slot = self.memfd_part().ok_or_else(not_complete)?.backing.lock();
        if let Some(existing) = slot.clone().and_then(|b| b.downcast::<T>().ok()) {
            return Ok(existing);
        }
        let fd = self.passthrough_fd().ok_or_else(not_complete)?;
        let made = Arc::new(register(fd)?);
        *slot = Some(made.clone());
        Ok(made)
    }

    /// Flips a byte of block `index` where it is stored (tests of verification).
    #[cfg(test)]
    pub(crate) fn corrupt_for_test(&self, index: usize) {
        let span = self.block_span(index);
        self.slots.with(index, |slot| match slot.stored.as_mut() {
            Some(Stored::Heap(block)) => {
                let mut data = block.data.to_vec();
                data[0] ^= 0xff;
                *block = Arc::new(Block {
                    data: data.into_boxed_slice(),
                    sums: block.sums.clone(),
                });
            }
            Some(Stored::Memfd(_)) => {
                if let Some(part) = self.memfd_part() {
                    let byte = part.body.bytes()[span.start as usize] ^ 0xff;
                    let _ = part.body.write_at(&[byte], span.start);
                }
            }
            Some(Stored::Packed(packed)) => {
                let mut payload = packed.payload.to_vec();
                payload[0] ^= 0xff;
                *packed = Arc::new(Packed {
                    payload: payload.into_boxed_slice(),
                    ..**packed
                });
            }
            None => {}
        });
    }
}

impl Drop for RamFile {
    fn drop(&mut self) {
        let ledger = &self.ram.ledger;
        let present = *self.present.get_mut() as usize;
        ledger.release(self.content, *self.admitted_bytes.get_mut());
        let (content, len) = (self.content, self.len);
        self.slots.for_each_held(|index, slot| {
            if let Some(stored) = &slot.stored {
                let start = index as u64 * BLOCK_SIZE;
                let logical = (start + BLOCK_SIZE).min(len) - start;
                ledger.count_block(content, stored.codec(), logical, false);
            }
        });
        ledger.budget.release(Use::Cache, self.overhead());
        if self.layout.get() == Some(&Layout::Raw { memfd: true }) {
            self.ram.memfds.give_back();
        }
        let tally = ledger.tally(self.content);
        if present > 0 {
            tally.entries.fetch_sub(1, Ordering::Relaxed);
        }
        if present == self.slots.len() && present > 0 {
            tally.complete.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod size {
    /// An entry is made per cached file: with its `Arc` header it fits the allocator's 160-byte
    /// chunk (fields widened past it cost 16-32 bytes per file at a million files).
    #[test]
    fn an_entry_fits_a_160_byte_chunk() {
        let size = std::mem::size_of::<super::RamFile>();
        assert!(size + 16 <= 152, "RamFile is {size} bytes");
    }
}
