//! `CachedFile`: the cached blocks of one file version, and how reads are answered from them.
//!
//! Owns: per-block slots (stored bytes or an in-flight fetch), single-flight fetching, admission
//! of fetched blocks under the shared budget, and verification of every hit. Files of one block
//! keep it on the heap; larger files keep their bytes in a memfd (see `memfd`), which the kernel
//! can serve by passthrough once every block is present. Must never return bytes that failed
//! their checksum, or bytes of another file version: a fetch that sees the source change fails.

use std::any::Any;
use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::block::{self, Block};
use super::memfd::MemfdBody;
use super::{BLOCK_SIZE, Ledger};
use crate::error::FsError;
use crate::source::{Identity, SourceFile, read_full};
use crate::stats::Metrics;

/// Page size used to account memfd storage (the kernel allocates whole pages).
const PAGE: u64 = 4096;

/// Where a published block's bytes live.
#[derive(Debug, Clone)]
enum Stored {
    /// On the heap (files of a single block).
    Heap(Arc<Block>),
    /// In the file's memfd at the block's offset; only the checksums live here.
    Memfd(Arc<[u64]>),
}

/// A fetch in progress; concurrent readers of the same block wait on it instead of reading the
/// source again.
#[derive(Default)]
struct Flight {
    result: Mutex<Option<Result<Arc<Block>, FsError>>>,
    done: Condvar,
}

impl Flight {
    fn finish(&self, result: Result<Arc<Block>, FsError>) {
        *self.result.lock() = Some(result);
        self.done.notify_all();
    }

    fn wait(&self) -> Result<Arc<Block>, FsError> {
        let mut result = self.result.lock();
        loop {
            if let Some(r) = result.as_ref() {
                return r.clone();
            }
            self.done.wait(&mut result);
        }
    }
}

#[derive(Default)]
struct Slot {
    stored: Option<Stored>,
    flight: Option<Arc<Flight>>,
}

/// Bytes answering one read, borrowed from the cache where possible.
pub enum ReadBytes {
    /// A range of one heap block.
    Shared(Arc<Block>, Range<usize>),
    /// A range of a file's memfd mapping.
    Mapped(Arc<CachedFile>, Range<usize>),
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

/// The cache entry of one file version.
pub struct CachedFile {
    identity: Identity,
    slots: Box<[Mutex<Slot>]>,
    /// Multi-block files only; `Some(None)` when the memfd could not be created.
    memfd: OnceLock<Option<MemfdBody>>,
    ledger: Arc<Ledger>,
    metrics: Arc<Metrics>,
    admitted_bytes: AtomicU64,
    present: AtomicUsize,
    /// Set once every block was verified against the memfd after completion.
    verified_complete: AtomicBool,
    /// What the FUSE adapter registered for passthrough (its backing id), opaque here; released
    /// with this entry, so the kernel never pins a memfd the budget no longer counts.
    backing: Mutex<Option<Arc<dyn Any + Send + Sync>>>,
}

impl CachedFile {
    pub(super) fn new(
        identity: Identity,
        ledger: Arc<Ledger>,
        metrics: Arc<Metrics>,
    ) -> CachedFile {
        let blocks = identity.size.div_ceil(BLOCK_SIZE) as usize;
        CachedFile {
            identity,
            slots: (0..blocks).map(|_| Mutex::new(Slot::default())).collect(),
            memfd: OnceLock::new(),
            ledger,
            metrics,
            admitted_bytes: AtomicU64::new(0),
            present: AtomicUsize::new(0),
            verified_complete: AtomicBool::new(false),
            backing: Mutex::new(None),
        }
    }

    /// The file version this entry holds.
    pub fn identity(&self) -> Identity {
        self.identity
    }

    fn uses_memfd(&self) -> bool {
        self.slots.len() > 1
    }

    fn memfd_bytes(&self) -> Option<&[u8]> {
        self.memfd
            .get()
            .and_then(Option::as_ref)
            .map(MemfdBody::bytes)
    }

    fn block_span(&self, index: usize) -> Range<u64> {
        let start = index as u64 * BLOCK_SIZE;
        start..(start + BLOCK_SIZE).min(self.identity.size)
    }

    /// The blocks touched by `len` bytes at `offset`, each with the byte range inside it; empty
    /// at or past end of file.
    fn pieces(&self, offset: u64, len: u32) -> Vec<(usize, Range<usize>)> {
        let end = offset
            .saturating_add(u64::from(len))
            .min(self.identity.size);
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

    /// Whether every block is cached.
    pub fn is_complete(&self) -> bool {
        self.present.load(Ordering::Acquire) == self.slots.len()
    }

    /// Answers a read only if every block it touches is cached and verifies; `None` means the
    /// caller must use [`CachedFile::read`] (off the FUSE thread: it may wait on the source).
    pub fn read_cached(self: &Arc<Self>, offset: u64, len: u32) -> Option<ReadBytes> {
        let pieces = self.pieces(offset, len);
        if !pieces
            .iter()
            .all(|(i, _)| self.slots[*i].lock().stored.is_some())
        {
            return None;
        }
        self.assemble(pieces, |index, range| {
            self.hit(index, range).ok_or(FsError::Io)
        })
        .ok()
    }

    /// Answers a read, fetching missing blocks from `source` (which must be this version).
    pub fn read(
        self: &Arc<Self>,
        source: &dyn SourceFile,
        offset: u64,
        len: u32,
    ) -> Result<ReadBytes, FsError> {
        let pieces = self.pieces(offset, len);
        self.assemble(pieces, |index, range| {
            match self.hit(index, range.clone()) {
                Some(bytes) => Ok(bytes),
                None => self.fetch_piece(index, range, source),
            }
        })
    }

    fn assemble(
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

    /// A verified cached piece of block `index`, or `None` (absent, or corrupt and now dropped).
    fn hit(self: &Arc<Self>, index: usize, range: Range<usize>) -> Option<ReadBytes> {
        let stored = self.slots[index].lock().stored.clone()?;
        let bytes = match &stored {
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
        match bytes {
            Some(b) => {
                self.metrics.cache_hits.inc();
                Some(b)
            }
            None => {
                self.metrics.integrity_errors.inc();
                tracing::warn!(
                    block = index,
                    "cached block failed its checksum; dropped, refetching"
                );
                self.drop_block(index);
                None
            }
        }
    }

    fn fetch_piece(
        self: &Arc<Self>,
        index: usize,
        range: Range<usize>,
        source: &dyn SourceFile,
    ) -> Result<ReadBytes, FsError> {
        let span = self.block_span(index);
        if !self.ledger.has_room(self.charge(span.end - span.start)) {
            // Never-evict and full: this block can never be admitted, so fetching all of it
            // would only multiply source reads for small or unaligned requests. Read exactly
            // what was asked for instead.
            self.metrics.cache_misses.inc();
            self.metrics.admission_rejected.inc();
            let start = span.start + range.start as u64;
            let bytes = self.fetch(start..start + range.len() as u64, source)?;
            return Ok(ReadBytes::Owned(bytes));
        }
        loop {
            let (flight, leader) = {
                let mut slot = self.slots[index].lock();
                if slot.stored.is_some() {
                    drop(slot);
                    match self.hit(index, range.clone()) {
                        Some(bytes) => return Ok(bytes),
                        None => continue,
                    }
                }
                match &slot.flight {
                    Some(f) => (f.clone(), false),
                    None => {
                        let f = Arc::new(Flight::default());
                        slot.flight = Some(f.clone());
                        (f, true)
                    }
                }
            };
            self.metrics.cache_misses.inc();
            let result = if leader {
                let result = self
                    .fetch(span.clone(), source)
                    .map(|b| Arc::new(Block::new(b)));
                let mut slot = self.slots[index].lock();
                if let Ok(block) = &result {
                    slot.stored = self.admit(index, block);
                }
                let admitted = slot.stored.is_some();
                slot.flight = None;
                drop(slot);
                if admitted {
                    // The cache holds these bytes now; the kernel's copy would be a second one.
                    source.drop_page_cache(span.clone());
                }
                flight.finish(result.clone());
                result
            } else {
                flight.wait()
            };
            return result.map(|block| ReadBytes::Shared(block, range));
        }
    }

    /// Bytes `span` of this version from the source; EIO if the read fails or the file changed.
    fn fetch(&self, span: Range<u64>, source: &dyn SourceFile) -> Result<Vec<u8>, FsError> {
        let mut buf = vec![0u8; (span.end - span.start) as usize];
        let started = Instant::now();
        let read = read_full(source, &mut buf, span.start);
        self.metrics.source_latency.record(started.elapsed());
        self.metrics.source_reads.inc();
        let n = read.map_err(|e| {
            self.metrics.source_errors.inc();
            tracing::warn!(error = %e, offset = span.start, "source read failed; answering EIO");
            FsError::Io
        })?;
        self.metrics.source_bytes.add(n as u64);
        // A short read or a changed identity means the file changed under us: these bytes may
        // belong to another version, so they are neither cached nor served.
        if n != buf.len() || source.current_identity().ok() != Some(self.identity) {
            self.metrics.stale_detections.inc();
            tracing::warn!(
                offset = span.start,
                "source file changed while being read; answering EIO"
            );
            return Err(FsError::Io);
        }
        Ok(buf)
    }

    /// What storing `len` bytes of this file costs the budget (a memfd takes whole pages).
    fn charge(&self, len: u64) -> u64 {
        if self.uses_memfd() {
            len.div_ceil(PAGE) * PAGE
        } else {
            len
        }
    }

    /// Admits a fetched block if the budget allows; returns how it is stored.
    fn admit(&self, index: usize, block: &Arc<Block>) -> Option<Stored> {
        let bytes = self.charge(block.data.len() as u64);
        if !self.ledger.try_reserve(bytes) {
            self.metrics.admission_rejected.inc();
            return None;
        }
        let stored = if self.uses_memfd() {
            let body = self.memfd.get_or_init(|| {
                MemfdBody::create(self.identity.size as usize)
                    .inspect_err(
                        |e| tracing::warn!(error = %e, "cannot create a memfd; file not cached"),
                    )
                    .ok()
            });
            match body
                .as_ref()
                .map(|b| b.write_at(&block.data, self.block_span(index).start))
            {
                Some(Ok(())) => Stored::Memfd(Arc::from(&*block.sums)),
                failed => {
                    if let Some(Err(e)) = failed {
                        tracing::warn!(error = %e, "cannot write to the cache memfd; block not cached");
                    }
                    self.ledger.release(bytes);
                    self.metrics.admission_rejected.inc();
                    return None;
                }
            }
        } else {
            Stored::Heap(block.clone())
        };
        self.admitted_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.ledger.blocks.fetch_add(1, Ordering::Relaxed);
        let before = self.present.fetch_add(1, Ordering::AcqRel);
        if before == 0 {
            self.ledger.files.fetch_add(1, Ordering::Relaxed);
        }
        if before + 1 == self.slots.len() {
            self.ledger.complete_files.fetch_add(1, Ordering::Relaxed);
        }
        Some(stored)
    }

    fn drop_block(&self, index: usize) {
        let Some(stored) = self.slots[index].lock().stored.take() else {
            return;
        };
        let span = self.block_span(index);
        let len = self.charge(span.end - span.start);
        drop(stored);
        self.verified_complete.store(false, Ordering::Release);
        let before = self.present.fetch_sub(1, Ordering::AcqRel);
        if before == self.slots.len() {
            self.ledger.complete_files.fetch_sub(1, Ordering::Relaxed);
        }
        if before == 1 {
            self.ledger.files.fetch_sub(1, Ordering::Relaxed);
        }
        self.ledger.blocks.fetch_sub(1, Ordering::Relaxed);
        self.admitted_bytes.fetch_sub(len, Ordering::AcqRel);
        self.ledger.release(len);
    }

    /// The memfd holding this whole file, if every block is cached and verified: the kernel can
    /// then serve it by passthrough. Verifies every block once, the first time it is asked.
    pub fn passthrough_fd(&self) -> Option<BorrowedFd<'_>> {
        if !self.uses_memfd() || !self.is_complete() {
            return None;
        }
        let body = self.memfd.get()?.as_ref()?;
        if !self.verified_complete.load(Ordering::Acquire) {
            for index in 0..self.slots.len() {
                let Some(Stored::Memfd(sums)) = self.slots[index].lock().stored.clone() else {
                    return None;
                };
                let span = self.block_span(index);
                let data = &body.bytes()[span.start as usize..span.end as usize];
                if !block::verify(data, &sums, 0..data.len()) {
                    self.metrics.integrity_errors.inc();
                    self.drop_block(index);
                    return None;
                }
            }
            self.verified_complete.store(true, Ordering::Release);
        }
        Some(body.fd())
    }

    /// The passthrough registration of this complete file, made once by `register` from its memfd
    /// and shared by every later open (the kernel wants one backing file per inode).
    pub fn passthrough_backing<T: Any + Send + Sync>(
        &self,
        register: impl FnOnce(BorrowedFd<'_>) -> std::io::Result<T>,
    ) -> std::io::Result<Arc<T>> {
        let mut slot = self.backing.lock();
        if let Some(existing) = slot.clone().and_then(|b| b.downcast::<T>().ok()) {
            return Ok(existing);
        }
        let fd = self
            .passthrough_fd()
            .ok_or_else(|| std::io::Error::other("cache entry is not complete"))?;
        let made = Arc::new(register(fd)?);
        *slot = Some(made.clone());
        Ok(made)
    }

    #[cfg(test)]
    pub(crate) fn corrupt_for_test(&self, index: usize) {
        let span = self.block_span(index);
        let mut slot = self.slots[index].lock();
        match slot.stored.as_mut() {
            Some(Stored::Heap(block)) => {
                let mut data = block.data.to_vec();
                data[0] ^= 0xff;
                *block = Arc::new(Block {
                    data: data.into_boxed_slice(),
                    sums: block.sums.clone(),
                });
            }
            Some(Stored::Memfd(_)) => {
                if let Some(body) = self.memfd.get().and_then(Option::as_ref) {
                    let byte = body.bytes()[span.start as usize] ^ 0xff;
                    let _ = body.write_at(&[byte], span.start);
                }
            }
            None => {}
        }
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        let present = *self.present.get_mut();
        self.ledger.release(*self.admitted_bytes.get_mut());
        self.ledger
            .blocks
            .fetch_sub(present as u64, Ordering::Relaxed);
        if present > 0 {
            self.ledger.files.fetch_sub(1, Ordering::Relaxed);
        }
        if present == self.slots.len() && present > 0 {
            self.ledger.complete_files.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
