//! `BlockFetcher`: the one way a block reaches a reader, the RAM tier, or the tiers below it.
//!
//! Owns: the tier order (RAM first, then the staging buffer, the disk tier, the cluster tier,
//! then the source), single-flight fetching (concurrent readers of one block share one fetch,
//! whatever asked first: a reader or prefetch), admission (a block fetched for a reader is kept by
//! the RAM tier if it has room, else by the disk tier; one fetched ahead goes to RAM, else to
//! staging, into room it took before its source read; every block read from the source is also
//! offered to the disk and cluster tiers; a tier may say its hits stay out of RAM), reading from
//! the source (charged to the memory budget while in flight, verified to be of the version asked
//! for), and what a full cache reads: only the bytes asked for. Must never serve bytes that failed
//! their checksum or belong to another version, never hold a lock while fetching, and never let
//! two fetches of one block run at once.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use parking_lot::{Condvar, Mutex};

use super::block::{self, Block};
use super::cluster::ClusterTier;
use super::disk::{self, DiskTier};
use super::ram::{Derived, RamFile, RamRoom, RamTier, ReadBytes, Unpacked};
use super::staging::{Room, Staging};
use super::tier::{Asker, BlockKey, Tier};
use crate::cache::BLOCK_SIZE;
use crate::cache::metrics::{CacheFigures, CacheMetrics};
use crate::error::FsError;
use crate::memory::MemoryBudget;
use crate::shards::ShardedMap;
use crate::source::{Identity, SourceFile, read_full};

/// What `BlockFetcher::prefetch` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefetched {
    /// Already held, or being fetched by another: nothing to do.
    Present,
    /// Fetched into the RAM tier.
    Fetched,
    /// Fetched into the staging buffer.
    Staged,
    /// Neither the RAM tier nor the staging buffer has room.
    NoRoom,
    /// A tier below did not answer in time and may hold the block: left to its readers, who ask
    /// it again, rather than read from the source ahead of them.
    Late,
}

/// Room a fetch ahead of the readers took before its source read, so that it keeps what it reads.
enum Reserved<'a> {
    /// In the RAM tier.
    Ram(RamRoom<'a>),
    /// In the staging buffer.
    Staging(Room<'a>),
}

/// How a fetch ended: the block, or `None` when the RAM tier turned out to hold it already.
type Fetched = Result<Option<Arc<Block>>, FsError>;

/// A fetch in progress; concurrent askers of the same block wait on it.
#[derive(Default)]
struct Flight {
    result: Mutex<Option<Fetched>>,
    done: Condvar,
}

impl Flight {
    fn finish(&self, result: Fetched) {
        *self.result.lock() = Some(result);
        self.done.notify_all();
    }

    fn wait(&self) -> Fetched {
        let mut result = self.result.lock();
        loop {
            if let Some(r) = result.as_ref() {
                return r.clone();
            }
            self.done.wait(&mut result);
        }
    }
}

/// The fetch of one block this thread leads. Ending it (or dropping it unfinished, which answers
/// "ask the RAM tier again") takes the flight out of the map and wakes its waiters.
struct Lead<'a> {
    flights: &'a ShardedMap<BlockKey, Arc<Flight>>,
    key: BlockKey,
    flight: Arc<Flight>,
    result: Option<Fetched>,
}

impl Lead<'_> {
    /// Ends the fetch with `result` for every waiter.
    fn finish(mut self, result: Fetched) {
        self.result = Some(result);
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.flights
            .remove_if(&self.key, |f| Arc::ptr_eq(f, &self.flight));
        self.flight.finish(self.result.take().unwrap_or(Ok(None)));
    }
}

/// The fetch chain of one mount.
pub struct BlockFetcher {
    ram: Arc<RamTier>,
    staging: Arc<Staging>,
    /// The tiers below staging that keep what readers fetch, in order: the disk tier (local),
    /// then the cluster tier (other nodes).
    lower: Vec<Arc<dyn Tier>>,
    /// The disk tier again, for what only it can tell (its figures, what it holds).
    disk: Option<Arc<DiskTier>>,
    /// The cluster tier again, for its figures.
    cluster: Option<Arc<ClusterTier>>,
    flights: ShardedMap<BlockKey, Arc<Flight>>,
    budget: Arc<MemoryBudget>,
    metrics: Arc<CacheMetrics>,
}

impl BlockFetcher {
    /// The chain over `ram`, `staging` and optional `disk` and `cluster` tiers, charging reads in
    /// flight to `budget`.
    pub fn new(
        ram: Arc<RamTier>,
        staging: Arc<Staging>,
        disk: Option<Arc<DiskTier>>,
        cluster: Option<Arc<ClusterTier>>,
        budget: Arc<MemoryBudget>,
        metrics: Arc<CacheMetrics>,
    ) -> BlockFetcher {
        let lower = (disk.iter().map(|d| d.clone() as Arc<dyn Tier>))
            .chain(cluster.iter().map(|c| c.clone() as Arc<dyn Tier>))
            .collect();
        BlockFetcher {
            ram,
            staging,
            lower,
            disk,
            cluster,
            flights: ShardedMap::default(),
            budget,
            metrics,
        }
    }

    /// The chain over `ram`, `staging` and `lower` tiers of any kind (tests: fault doubles).
    #[cfg(test)]
    fn with_lower(
        ram: Arc<RamTier>,
        staging: Arc<Staging>,
        lower: Vec<Arc<dyn Tier>>,
        budget: Arc<MemoryBudget>,
        metrics: Arc<CacheMetrics>,
    ) -> BlockFetcher {
        BlockFetcher {
            ram,
            staging,
            lower,
            disk: None,
            cluster: None,
            flights: ShardedMap::default(),
            budget,
            metrics,
        }
    }

    /// The RAM tier.
    pub fn ram(&self) -> &Arc<RamTier> {
        &self.ram
    }

    /// The staging buffer.
    pub fn staging(&self) -> &Arc<Staging> {
        &self.staging
    }

    /// The memory budget every tier and every read in flight is charged to.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// What renders derive from images (decoded pixels, restart-marked copies): the render
    /// service's front door to the RAM tier.
    pub fn derived(&self) -> &Derived {
        self.ram.derived()
    }

    /// The first `limit` bytes of `source` read through the cache (fewer at its end). May wait
    /// on the source.
    pub fn read_prefix(&self, source: &dyn SourceFile, limit: u64) -> Result<Vec<u8>, FsError> {
        let entry = self.ram.file(source.identity());
        let memo = Unpacked::default();
        let end = source.identity().size.min(limit);
        let mut out = Vec::with_capacity(end as usize);
        while (out.len() as u64) < end {
            let want = (end - out.len() as u64).min(BLOCK_SIZE) as u32;
            let bytes = self.read(&entry, source, out.len() as u64, want, &memo)?;
            if bytes.as_slice().is_empty() {
                break;
            }
            out.extend_from_slice(bytes.as_slice());
        }
        self.ram.settle(&entry);
        Ok(out)
    }

    /// Answers a read of `entry` (whose source file `source` must be this version): every piece
    /// from the RAM tier where it hits, else fetched through the chain. May wait on the source.
    pub fn read(
        &self,
        entry: &Arc<RamFile>,
        source: &dyn SourceFile,
        offset: u64,
        len: u32,
        memo: &Unpacked,
    ) -> Result<ReadBytes, FsError> {
        entry.assemble(entry.pieces(offset, len), |index, range| {
            match entry.hit(index, range.clone(), memo) {
                Some(bytes) => Ok(bytes),
                None => self.piece(entry, index, range, source, memo),
            }
        })
    }

    /// Whether every block of `entry` is in the RAM tier or the staging buffer: its reads need
    /// not touch the source. (A huge file with sparse slots counts only when complete.)
    pub fn is_available(&self, entry: &RamFile) -> bool {
        entry.is_complete()
            || (entry.slots_are_dense()
                && (0..entry.blocks())
                    .all(|i| entry.is_stored(i) || self.staging.contains(entry.identity(), i)))
    }

    /// Whether a prefetch of a block of `bytes` would find room for it now: in the never-evict
    /// tiers, else in the staging buffer.
    pub fn has_prefetch_room(&self, bytes: u64) -> bool {
        self.ram.has_room(bytes) || self.lower_has_room(bytes) || self.staging.has_room(bytes)
    }

    /// Whether a tier below staging would keep a block of `bytes` now.
    fn lower_has_room(&self, bytes: u64) -> bool {
        self.lower.iter().any(|t| t.has_room(bytes))
    }

    /// Fetches block `index` of `entry` ahead of its readers: into the RAM tier while it has
    /// room, else into the staging buffer. Counts no hit or miss: no reader asked yet.
    pub fn prefetch(
        &self,
        entry: &Arc<RamFile>,
        index: usize,
        source: &dyn SourceFile,
    ) -> Result<Prefetched, FsError> {
        if index >= entry.blocks() || entry.is_stored(index) {
            return Ok(Prefetched::Present);
        }
        // Being fetched (by a reader): that fetch keeps it if the RAM tier has room. Prefetch
        // leads the fetch before it takes room, so a reader that comes meanwhile joins it rather
        // than fetching beside it (taking the room for a block a reader fetches made the
        // reader's store fail, and neither kept the block).
        let key = BlockKey {
            identity: entry.identity(),
            index,
        };
        let Ok(lead) = self.lead(key) else {
            return Ok(Prefetched::Present);
        };
        // A version that may still be being written can be read but not kept: nothing to do
        // ahead of its readers.
        if !source.settled(SystemTime::now()) {
            return Ok(Prefetched::NoRoom);
        }
        let span = entry.block_span(index);
        let len = span.end - span.start;
        // Room before the source read, the RAM tier's or else staging's, taken now: fetches
        // racing for the last room once each read a block and all but one threw theirs away
        // (prefetch threads for staging's: a third more source reads per shuffled epoch over a
        // dataset twice the budget; a prefetch for the RAM tier's, against readers' misses: 2-5%
        // more per epoch in a full cache whose slice grows).
        let room = match entry.reserve(len) {
            Some(ram) => Reserved::Ram(ram),
            None => match self.staging.reserve(len) {
                Some(staging) => Reserved::Staging(staging),
                None => return Ok(Prefetched::NoRoom),
            },
        };
        match self.fetch(lead, entry, index, source, Asker::Prefetch, Some(room)) {
            None if entry.is_stored(index) => Ok(Prefetched::Present),
            None => Ok(Prefetched::Late),
            Some(Err(e)) => Err(e),
            Some(Ok(_)) if entry.is_stored(index) => Ok(Prefetched::Fetched),
            Some(Ok(_)) if self.staging.contains(entry.identity(), index) => Ok(Prefetched::Staged),
            // Fetched and kept nowhere (a tier below keeps its hits out of RAM and staging is
            // full; a memfd write failed): counted, since its reader fetches it again.
            Some(Ok(block)) => {
                self.metrics
                    .prefetch_discarded_bytes
                    .add(block.data.len() as u64);
                Ok(Prefetched::NoRoom)
            }
        }
    }

    /// Blocks of `identity` the RAM tier and the disk tier hold: `(ram, disk)`; the disk count is
    /// 0 without a disk tier (which holds at most a file's first `disk::MAX_BLOCKS`).
    pub fn held(&self, identity: &Identity) -> (usize, usize) {
        let disk = self.disk.as_ref().map_or(0, |d| {
            (0..disk::blocks_held(identity))
                .filter(|&i| d.holds(identity, i))
                .count()
        });
        (self.ram.held(identity), disk)
    }

    /// Drops every tier's copy of a file version the source no longer has. Its RAM returns to
    /// the budget once the last open handle on it is released.
    pub fn forget(&self, identity: &Identity) {
        self.ram.forget(identity);
        if let Some(disk) = &self.disk {
            disk.forget(*identity);
        }
    }

    /// Drops the cached blocks of a file version the source no longer has (it changed since),
    /// counted as a stale detection.
    pub fn drop_stale(&self, identity: &Identity) {
        self.forget(identity);
        self.metrics.stale_detections.inc();
    }

    /// The cluster tier, if any.
    pub fn cluster(&self) -> Option<&Arc<ClusterTier>> {
        self.cluster.as_ref()
    }

    /// Whether there is a disk tier.
    pub fn has_disk(&self) -> bool {
        self.disk.is_some()
    }

    /// What every tier holds now.
    pub fn figures(&self) -> CacheFigures {
        CacheFigures {
            ram: self.ram.gauges(),
            staged_bytes: self.staging.bytes(),
            staged_budget_bytes: self.staging.budget(),
            disk: self.disk.as_ref().map(|d| d.gauges()),
        }
    }

    /// The cache's counters.
    pub fn metrics(&self) -> &Arc<CacheMetrics> {
        &self.metrics
    }

    /// Piece `range` of block `index` that the RAM tier did not have.
    fn piece(
        &self,
        entry: &Arc<RamFile>,
        index: usize,
        range: Range<usize>,
        source: &dyn SourceFile,
        memo: &Unpacked,
    ) -> Result<ReadBytes, FsError> {
        let span = entry.block_span(index);
        let len = span.end - span.start;
        let key = BlockKey {
            identity: entry.identity(),
            index,
        };
        // A fetch of this block in flight (a prefetch holding room for it) is joined below.
        if !entry.fits(len) && !self.lower_has_room(len) && self.flights.get(&key).is_none() {
            // Never-evict and full: this block can never be admitted, so fetching all of it
            // would only multiply source reads for small or unaligned requests. Serve it from
            // the staging buffer (fetched ahead: no miss) or the disk tier if either has it,
            // else read exactly what was asked for.
            if let Some(block) = self.in_tier(self.staging.as_ref(), &key, source.path(), &range) {
                return Ok(ReadBytes::Shared(block, range));
            }
            self.metrics.misses.inc();
            if let (Some((block, _)), _) = self.in_lower(&key, source.path(), &range, Asker::Reader)
            {
                return Ok(ReadBytes::Shared(block, range));
            }
            self.metrics.admission_rejected.inc();
            let start = span.start + range.start as u64;
            let (bytes, _) =
                self.read_source(entry.identity(), start..start + range.len() as u64, source)?;
            return Ok(ReadBytes::Owned(bytes));
        }
        loop {
            match self.shared(entry, index, source, Asker::Reader) {
                // Stored meanwhile: a hit, unless it failed its checksum and was dropped again.
                None => match entry.hit(index, range.clone(), memo) {
                    Some(bytes) => return Ok(bytes),
                    None => continue,
                },
                Some(result) => {
                    self.metrics.misses.inc();
                    return result.map(|block| ReadBytes::Shared(block, range));
                }
            }
        }
    }

    /// Block `index` of `entry`, fetched once however many ask at the same time (the first
    /// fetches and places it, the others wait on its flight); `None` when the RAM tier holds it.
    fn shared(
        &self,
        entry: &Arc<RamFile>,
        index: usize,
        source: &dyn SourceFile,
        asker: Asker,
    ) -> Option<Result<Arc<Block>, FsError>> {
        if entry.is_stored(index) {
            return None;
        }
        let key = BlockKey {
            identity: entry.identity(),
            index,
        };
        match self.lead(key) {
            Ok(lead) => self.fetch(lead, entry, index, source, asker, None),
            Err(leader) => leader.wait().transpose(),
        }
    }

    /// The lead of the fetch of `key`, or the flight of the fetch another leads.
    fn lead(&self, key: BlockKey) -> Result<Lead<'_>, Arc<Flight>> {
        let flight = Arc::new(Flight::default());
        let leader = self.flights.get_or_insert_with(key, || flight.clone());
        if !Arc::ptr_eq(&leader, &flight) {
            return Err(leader);
        }
        Ok(Lead {
            flights: &self.flights,
            key,
            flight,
            result: None,
        })
    }

    /// The fetch `lead` leads, of block `index` of `entry`, placed where it may be kept; `None`
    /// when the RAM tier holds it already, or a prefetch leaves it to its readers. `room`: room
    /// prefetch reserved for the block, in the RAM tier or else in staging (given back if unused).
    fn fetch(
        &self,
        lead: Lead<'_>,
        entry: &Arc<RamFile>,
        index: usize,
        source: &dyn SourceFile,
        asker: Asker,
        room: Option<Reserved<'_>>,
    ) -> Option<Result<Arc<Block>, FsError>> {
        let key = lead.key;
        // Stored by a fetch that ended before this one began: nothing to do.
        if entry.is_stored(index) {
            return None;
        }
        let span = entry.block_span(index);
        let whole = 0..(span.end - span.start) as usize;
        // `keep`: the block may be kept at all; `in_ram`: by the RAM tier too (else only
        // staged for the reader a prefetch fetched it for).
        let (below, late) = match self.in_tier(self.staging.as_ref(), &key, source.path(), &whole) {
            Some(block) => (Some((block, true)), false),
            None => self.in_lower(&key, source.path(), &whole, asker),
        };
        let (result, keep, in_ram) = match below {
            Some((block, in_ram)) => (Ok(block), true, in_ram),
            // A tier below may hold it but did not answer in time: a fetch ahead of the readers
            // leaves the block to them (a reader waiting on this flight asks again) rather than
            // reading the source for it.
            None if late && asker == Asker::Prefetch => return None,
            None => match self.read_source(key.identity, span.clone(), source) {
                Ok((bytes, settled)) => {
                    let block = Arc::new(Block::new(bytes));
                    // Every block read from the source is offered to the persistent tiers, but
                    // one of a version that may still be being written is only served.
                    if settled {
                        for tier in &self.lower {
                            tier.put(&key, source.path(), &block);
                        }
                    }
                    (Ok(block), settled, true)
                }
                Err(e) => (Err(e), false, false),
            },
        };
        if let Ok(block) = &result
            && keep
        {
            let (ram_room, staging_room) = match room {
                Some(Reserved::Ram(room)) => (Some(room), None),
                Some(Reserved::Staging(room)) => (None, Some(room)),
                None => (None, None),
            };
            let kept = in_ram && entry.store(index, block, ram_room);
            if kept {
                // The RAM tier holds these bytes now; the kernel's copy would be a second one.
                source.drop_page_cache(span);
            } else if asker == Asker::Prefetch {
                self.staging.stage(&key, source.path(), block, staging_room);
            }
        }
        lead.finish(result.clone().map(Some));
        Some(result)
    }

    /// The block from the first tier below staging that holds it intact and whether the RAM
    /// tier may keep it too; and whether a tier asked missed only because it answered late.
    fn in_lower(
        &self,
        key: &BlockKey,
        path: &Path,
        range: &Range<usize>,
        asker: Asker,
    ) -> (Option<(Arc<Block>, bool)>, bool) {
        let mut late = false;
        for tier in &self.lower {
            let (found, was_late) = tier.lookup(key, path, range, asker);
            late |= was_late;
            if let Some(block) = found.and_then(|b| self.verified(tier.as_ref(), key, b, range)) {
                return (Some((block, tier.hits_kept_in_ram())), late);
            }
        }
        (None, late)
    }

    /// The block from `tier` if it holds it intact.
    fn in_tier(
        &self,
        tier: &dyn Tier,
        key: &BlockKey,
        path: &Path,
        range: &Range<usize>,
    ) -> Option<Arc<Block>> {
        let block = tier.get(key, path, range)?;
        self.verified(tier, key, block, range)
    }

    /// `block`, from `tier`, if its bytes in `range` match their checksums.
    fn verified(
        &self,
        tier: &dyn Tier,
        key: &BlockKey,
        block: Arc<Block>,
        range: &Range<usize>,
    ) -> Option<Arc<Block>> {
        // A tier verifies what it keeps; this catches one that hands back damaged bytes.
        if block::verify(&block.data, &block.sums, range.clone()) {
            Some(block)
        } else {
            self.metrics.integrity_errors.inc();
            tracing::warn!(
                tier = tier.name(),
                block = key.index,
                "block from a tier failed its checksum; skipped"
            );
            None
        }
    }

    /// Bytes `span` of version `identity` from the source, and whether they may be cached (the
    /// version was settled when the read started: see `SourceFile::settled`); EIO if the read
    /// fails or the file changed.
    fn read_source(
        &self,
        identity: Identity,
        span: Range<u64>,
        source: &dyn SourceFile,
    ) -> Result<(Vec<u8>, bool), FsError> {
        let metrics = &self.metrics;
        // A read in flight: charged to the budget's work slice while it runs.
        let _in_flight = self.budget.in_flight(span.end - span.start);
        let mut buf = vec![0u8; (span.end - span.start) as usize];
        let read_start = SystemTime::now();
        let started = Instant::now();
        let read = read_full(source, &mut buf, span.start);
        let took = started.elapsed();
        metrics.source_latency.record(took);
        metrics.source_busy_ns.add(took.as_nanos() as u64);
        metrics.source_reads.inc();
        let n = read.map_err(|e| {
            metrics.source_errors.inc();
            tracing::warn!(error = %e, offset = span.start, "source read failed; answering EIO");
            FsError::Io
        })?;
        metrics.source_bytes.add(n as u64);
        // A short read or a changed identity means the file changed under us: these bytes may
        // belong to another version, so they are neither cached nor served.
        if n != buf.len() || source.current_identity().ok() != Some(identity) {
            metrics.stale_detections.inc();
            tracing::warn!(
                offset = span.start,
                "source file changed while being read; answering EIO"
            );
            return Err(FsError::Io);
        }
        let settled = source.settled(read_start);
        if !settled {
            metrics.unsettled_reads.inc();
        }
        Ok((buf, settled))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use super::*;
    use crate::cache::codec::Codec;
    use crate::cache::policy::Fixed;
    use crate::cache::ram::Packer;
    use crate::cache::tier::faulty::{Faulty, Memory};
    use crate::memory::{MemoryPlan, Shed, Use};
    use crate::telemetry::Telemetry;

    /// A source file in memory whose content the test can replace with a new version: a handle
    /// keeps the identity it was opened at, and reads whatever the file holds now.
    struct Versions {
        identity: Identity,
        data: Vec<u8>,
    }

    struct MemFile {
        opened: Identity,
        now: Arc<Mutex<Versions>>,
        reads: Arc<AtomicU64>,
        path: Arc<Path>,
    }

    impl MemFile {
        /// A file holding `data` at version `id`, opened at it, with its count of source reads.
        fn of(id: Identity, data: &[u8]) -> (MemFile, Arc<AtomicU64>) {
            let reads = Arc::new(AtomicU64::new(0));
            let file = MemFile {
                opened: id,
                now: Arc::new(Mutex::new(Versions {
                    identity: id,
                    data: data.to_vec(),
                })),
                reads: reads.clone(),
                path: Arc::from(Path::new("f")),
            };
            (file, reads)
        }
    }

    impl SourceFile for MemFile {
        fn identity(&self) -> Identity {
            self.opened
        }

        fn path(&self) -> &Arc<Path> {
            &self.path
        }

        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            let now = self.now.lock();
            let start = (offset as usize).min(now.data.len());
            let n = buf.len().min(now.data.len() - start);
            buf[..n].copy_from_slice(&now.data[start..start + n]);
            Ok(n)
        }

        fn current_identity(&self) -> std::io::Result<Identity> {
            Ok(self.now.lock().identity)
        }

        fn settled(&self, read_start: SystemTime) -> bool {
            self.opened.settled_at(read_start, crate::source::SETTLE)
        }
    }

    fn identity(file: u64, version: i64, size: usize) -> Identity {
        Identity {
            dev: 1,
            ino: file,
            size: size as u64,
            mtime_ns: version,
            ctime_ns: version,
        }
    }

    fn chain(cache: u64, staging: u64, codec: Codec) -> (BlockFetcher, Arc<Faulty<Memory>>) {
        let budget = MemoryBudget::new(MemoryPlan {
            cache,
            staging,
            work: 64 << 20,
        });
        let metrics = Arc::new(CacheMetrics::default());
        let packer = Arc::new(Packer::new(
            Box::new(Fixed(codec)),
            Arc::new(Telemetry::default()),
            metrics.clone(),
        ));
        let ram = RamTier::new(budget.clone(), packer, metrics.clone()).shared();
        let staging = Arc::new(Staging::new(budget.clone(), metrics.clone()));
        let lower = Arc::new(Faulty::new(Memory::default()));
        let fetcher = BlockFetcher::with_lower(
            ram,
            staging,
            vec![lower.clone() as Arc<dyn Tier>],
            budget,
            metrics,
        );
        (fetcher, lower)
    }

    /// What the RAM tier charges for one entry's bookkeeping (a file of `len` bytes).
    fn entry_overhead(len: usize) -> u64 {
        chain(64 << 20, 0, Codec::None)
            .0
            .ram()
            .file(identity(20, 0, len))
            .charged_bytes()
    }

    /// A chain whose cache has room for the bookkeeping and one block of a file of `len` bytes
    /// (and half a block more), with no tier below that takes anything.
    fn room_for_one_block(len: usize) -> BlockFetcher {
        let overhead = entry_overhead(len);
        let (fetcher, lower) = chain(overhead + len as u64 + len as u64 / 2, 0, Codec::None);
        lower.refuse.store(true, Ordering::Relaxed);
        fetcher
    }

    /// Puts `data` into `lower` as block 0 of file version `id`.
    fn held_below(lower: &Faulty<Memory>, id: Identity, data: &[u8]) {
        let key = BlockKey {
            identity: id,
            index: 0,
        };
        lower.put(
            &key,
            &Arc::from(Path::new("f")),
            &Arc::new(Block::new(data.to_vec())),
        );
    }

    /// A RAM tier of `cache` bytes packing with `codec`, keeping decoded pixels as `mode`
    /// says and weighing them against the telemetry returned; with its counters.
    fn pixel_tier(
        cache: u64,
        codec: Codec,
        mode: crate::cache::policy::DecodedCaching,
    ) -> (RamTier, Arc<CacheMetrics>, Arc<Telemetry>) {
        let budget = MemoryBudget::new(MemoryPlan {
            cache,
            staging: 0,
            work: 64 << 20,
        });
        let metrics = Arc::new(CacheMetrics::default());
        let telemetry = Arc::new(Telemetry::default());
        let packer = Arc::new(Packer::new(
            Box::new(Fixed(codec)),
            telemetry.clone(),
            metrics.clone(),
        ));
        let ram = RamTier::new(budget, packer, metrics.clone())
            .with_decoded_caching(mode)
            .with_telemetry(telemetry.clone());
        (ram, metrics, telemetry)
    }

    /// In `auto`, decoded pixels of a source too fast for them (a decode 20 times faster than
    /// fetching their size) are declined, until telemetry says a whole pass of the files fits
    /// the tier with room to spare: then they are kept, for that reason.
    #[test]
    fn pixels_are_kept_in_the_room_a_whole_pass_of_files_leaves() {
        use crate::cache::policy::{DecodedCaching, DecodedReason};
        use crate::control::observation::Observation;
        let (ram, metrics, telemetry) = pixel_tier(64 << 20, Codec::None, DecodedCaching::Auto);
        // 1 GB/s from the source; 1 MB of pixels decoded in 50 us.
        metrics.source_bytes.add(1 << 30);
        metrics.source_busy_ns.add(1 << 30);
        let (len, decode) = (1u64 << 20, std::time::Duration::from_micros(50));
        let offer = |file| {
            let pixels = || vec![7u8; len as usize];
            let kept =
                ram.derived()
                    .offer_decoded(identity(file, 0, 1), (len, 1024), decode, pixels);
            (kept, ram.derived().decoded_choice().1)
        };
        assert_eq!(
            offer(1),
            (false, DecodedReason::SourceSlower),
            "nothing known"
        );
        let fits = |fit, whole| Observation {
            working_set_fit: fit,
            working_set_whole: whole,
            ..Observation::default()
        };
        telemetry.observe_for_test(fits(5.0, false));
        assert_eq!(
            offer(2),
            (false, DecodedReason::SourceSlower),
            "a first pass"
        );
        telemetry.observe_for_test(fits(5.0, true));
        assert_eq!(offer(3), (true, DecodedReason::RoomToSpare));
        telemetry.observe_for_test(fits(0.8, true));
        assert_eq!(
            offer(4),
            (false, DecodedReason::SourceSlower),
            "files need it"
        );
    }

    /// Decoded pixels take only the room files leave: a file's blocks that find the slice full
    /// of pixels no render reads drop as many of them as they need, and pixels never take a
    /// file's room back.
    #[test]
    fn decoded_pixels_give_their_room_to_files() {
        use crate::cache::policy::DecodedCaching;
        let (ram, metrics, _) = pixel_tier(4 << 20, Codec::None, DecodedCaching::On);
        let len = 1u64 << 20;
        let offer = |image| {
            let pixels = || vec![1u8; len as usize];
            let decode = std::time::Duration::from_millis(1);
            ram.derived()
                .offer_decoded(identity(image, 0, 1), (len, 1024), decode, pixels)
        };
        for image in 100..103 {
            assert!(offer(image), "3 of the 4 MiB");
        }
        let file = ram.file(identity(1, 0, 2 << 20));
        for index in 0..2 {
            assert!(file.fits(len), "counting the pixels' room");
            let room = file.reserve(len).expect("room, the pixels' if need be");
            let block = Arc::new(Block::new(vec![2u8; len as usize]));
            assert!(file.store(index, &block, Some(room)));
        }
        assert_eq!(file.cached_blocks(), 2);
        let yielded = metrics.decoded_yielded.get();
        assert!((1..=2).contains(&yielded), "{yielded} images gave way");
        assert!(!offer(103), "no pixels in a file's room");
        let kept = (100..103)
            .filter(|&image| ram.derived().has_decoded(&identity(image, 0, 1)))
            .count() as u64;
        assert_eq!(kept, 3 - yielded, "only as many as the file needed");
    }

    /// The packer packs decoded pixels only where unpacking them costs less than the decodes the
    /// room saves: pixels that decoded in a microsecond stay raw (and are counted), pixels that
    /// took a second are packed.
    #[test]
    fn pixels_are_packed_only_where_unpacking_costs_less_than_decoding() {
        use crate::cache::policy::DecodedCaching;
        let packed_after = |decode: std::time::Duration| {
            let (ram, metrics, _) = pixel_tier(16 << 20, Codec::Zstd(1), DecodedCaching::On);
            let (len, row) = (1usize << 20, 3 * 512);
            let pixels = || (0..len).map(|i| (i % row / 3) as u8).collect();
            let offered =
                ram.derived()
                    .offer_decoded(identity(1, 0, 1), (len as u64, row), decode, pixels);
            assert!(offered);
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            while metrics.packed_blocks.get() + metrics.decoded_kept_raw.get() == 0
                && Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            (metrics.packed_blocks.get(), metrics.decoded_kept_raw.get())
        };
        assert_eq!(packed_after(std::time::Duration::from_micros(1)), (0, 1));
        assert_eq!(packed_after(std::time::Duration::from_secs(1)), (1, 0));
    }

    /// What a test holds open: the version it opened and its entry.
    struct Open {
        file: usize,
        content: Arc<Vec<u8>>,
        source: MemFile,
        entry: Arc<RamFile>,
        memo: Unpacked,
    }

    /// Random reads, prefetches, new versions of files, damaged RAM blocks and a lower tier that
    /// loses, refuses and damages blocks: every read answers its handle's version byte for byte,
    /// or EIO (only for a handle whose file changed since), never other bytes.
    #[test]
    fn random_reads_against_a_model_of_the_source_never_mismatch() {
        let mut checked = 0;
        for seed in 0..40u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let cache = [0, 600 << 10, 2 << 20, 16 << 20][rng.usize(0..4)];
            let staging = [0, 1 << 20][rng.usize(0..2)];
            let codec = [Codec::None, Codec::Lz4][rng.usize(0..2)];
            let (fetcher, lower) = chain(cache, staging, codec);
            let reads = Arc::new(AtomicU64::new(0));
            let make = |rng: &mut fastrand::Rng| -> Vec<u8> {
                let len = rng.usize(0..(3 * BLOCK_SIZE as usize + 100));
                // Runs of 64 bytes, half of them compressible, so packed blocks are read too.
                let mut data = vec![0u8; len];
                for (run, bytes) in data.chunks_mut(64).enumerate() {
                    if rng.bool() {
                        bytes.fill((run / 7) as u8);
                    } else {
                        rng.fill(bytes);
                    }
                }
                data
            };
            let files: Vec<Arc<Mutex<Versions>>> = (0..3)
                .map(|f| {
                    let data = make(&mut rng);
                    Arc::new(Mutex::new(Versions {
                        identity: identity(f, 0, data.len()),
                        data,
                    }))
                })
                .collect();
            let open = |f: usize| {
                let now = files[f].lock();
                let id = now.identity;
                Open {
                    file: f,
                    content: Arc::new(now.data.clone()),
                    source: MemFile {
                        opened: id,
                        now: files[f].clone(),
                        reads: reads.clone(),
                        path: Arc::from(Path::new("f")),
                    },
                    entry: fetcher.ram().file(id),
                    memo: Unpacked::default(),
                }
            };
            let mut handles: Vec<Open> = (0..3).map(open).collect();
            let mut version = 0;
            for _ in 0..150 {
                let h = rng.usize(0..handles.len());
                match rng.u8(0..20) {
                    0 => {
                        // A new version of a file; its handles keep the old one.
                        let f = rng.usize(0..3);
                        version += 1;
                        let data = make(&mut rng);
                        let mut now = files[f].lock();
                        now.identity = identity(f as u64, version, data.len());
                        now.data = data;
                    }
                    1 => {
                        let f = handles[h].file;
                        handles[h] = open(f);
                    }
                    2 => lower.lose.store(rng.bool(), Ordering::Relaxed),
                    3 => lower.damage.store(rng.bool(), Ordering::Relaxed),
                    4 => lower.refuse.store(rng.bool(), Ordering::Relaxed),
                    5 => {
                        let o = &handles[h];
                        if o.entry.blocks() > 0 {
                            o.entry.corrupt_for_test(rng.usize(0..o.entry.blocks()));
                        }
                    }
                    6..=8 => {
                        let o = &handles[h];
                        if o.entry.blocks() > 0 {
                            let index = rng.usize(0..o.entry.blocks());
                            let _ = fetcher.prefetch(&o.entry, index, &o.source);
                        }
                    }
                    _ => {
                        let o = &handles[h];
                        let len = o.content.len() as u64;
                        let offset = rng.u64(0..=len + 10);
                        let size = rng.u32(0..(2 << 20));
                        let want_end = (offset + u64::from(size)).min(len);
                        let want = o
                            .content
                            .get(offset.min(len) as usize..want_end.max(offset.min(len)) as usize)
                            .unwrap_or(&[]);
                        match fetcher.read(&o.entry, &o.source, offset, size, &o.memo) {
                            Ok(bytes) => {
                                assert!(
                                    bytes.as_slice() == want,
                                    "seed {seed}: bytes of another version or damaged"
                                );
                                checked += 1;
                            }
                            Err(e) => {
                                let changed = files[o.file].lock().identity != o.source.opened;
                                assert!(
                                    changed && e == FsError::Io,
                                    "seed {seed}: {e:?} on an unchanged file"
                                );
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 2000, "reads checked: {checked}");
    }

    /// A version modified just now may still be being written: its reads are answered from the
    /// source every time, and nothing of it is kept by the RAM tier, the staging buffer or the
    /// tiers below, nor fetched ahead.
    #[test]
    fn blocks_of_a_version_modified_within_the_settle_time_are_served_but_never_cached() {
        let (fetcher, lower) = chain(64 << 20, 4 << 20, Codec::None);
        let data: Vec<u8> = (0..2 * BLOCK_SIZE as usize).map(|i| i as u8).collect();
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as i64;
        let id = identity(3, now_ns, data.len());
        let (source, _) = MemFile::of(id, &data);
        let entry = fetcher.ram().file(id);
        let memo = Unpacked::default();
        for _ in 0..2 {
            let got = fetcher
                .read(&entry, &source, 0, 2 << 20, &memo)
                .expect("read");
            assert!(got.as_slice() == &data[..]);
        }
        assert_eq!(fetcher.prefetch(&entry, 1, &source), Ok(Prefetched::NoRoom));
        assert_eq!(entry.cached_blocks(), 0);
        assert_eq!(fetcher.held(&id).0, 0);
        assert!(!fetcher.staging.contains(id, 0) && !fetcher.staging.contains(id, 1));
        let key = BlockKey {
            identity: id,
            index: 0,
        };
        assert!(
            lower.get(&key, Path::new(""), &(0..1)).is_none(),
            "nothing offered below"
        );
        assert_eq!(
            fetcher.metrics.source_reads.get(),
            4,
            "every read from the source"
        );
        assert_eq!(fetcher.metrics.unsettled_reads.get(), 4);
    }

    /// Memory still short under pressure: cached files no reader has open are given back (their
    /// budget with them) up to about what was asked; an open one stays, and a file given back is
    /// read again from the source, byte for byte.
    #[test]
    fn cached_files_nobody_has_open_are_given_back_when_memory_stays_short() {
        let (fetcher, _lower) = chain(64 << 20, 0, Codec::None);
        let data: Vec<u8> = (0..BLOCK_SIZE as usize).map(|i| (i % 251) as u8).collect();
        let memo = Unpacked::default();
        let (mut sources, mut entries) = (Vec::new(), Vec::new());
        for file in 0..4 {
            let id = identity(10 + file, 0, data.len());
            let (source, reads) = MemFile::of(id, &data);
            let entry = fetcher.ram().file(id);
            fetcher.read(&entry, &source, 0, 4096, &memo).expect("read");
            assert_eq!(entry.cached_blocks(), 1);
            sources.push((id, source, reads));
            entries.push(entry);
        }
        // File 0 stays open; the others' entries are held by the tier alone.
        let open = entries.remove(0);
        drop(entries);
        let budget = fetcher.ram().budget().clone();
        let cached = budget.used(Use::Cache);
        let shed: &dyn Shed = fetcher.ram().as_ref();
        let freed = shed.give_back(2 * BLOCK_SIZE);
        assert!(freed >= 2 * BLOCK_SIZE, "freed {freed}");
        assert_eq!(budget.used(Use::Cache), cached - freed, "charges released");
        assert_eq!(
            fetcher.held(&sources[0].0).0,
            1,
            "the open file keeps its block"
        );
        let kept = (1..4)
            .filter(|&f| fetcher.held(&sources[f].0).0 == 1)
            .count();
        assert_eq!(kept, 1, "two of the three unopened files given back");
        for (id, source, reads) in &sources[1..] {
            let before = reads.load(Ordering::Relaxed);
            let entry = fetcher.ram().file(*id);
            let got = fetcher
                .read(&entry, source, 0, 4096, &memo)
                .expect("read again");
            assert!(got.as_slice() == &data[..4096]);
            let from_source = reads.load(Ordering::Relaxed) - before;
            assert!(from_source <= 1);
        }
        drop(open);
    }

    /// A tier whose hits the RAM tier may not keep (`--cluster-keep-hits off`) is asked again on
    /// every read; one whose hits it may keep, once. Either way the source is read once.
    #[test]
    fn hits_of_a_tier_that_keeps_them_out_of_ram_are_fetched_each_time() {
        for not_in_ram in [false, true] {
            let (fetcher, lower) = chain(64 << 20, 4 << 20, Codec::None);
            lower.not_in_ram.store(not_in_ram, Ordering::Relaxed);
            let data: Vec<u8> = (0..BLOCK_SIZE as usize).map(|i| (i % 253) as u8).collect();
            let id = identity(4, 0, data.len());
            let (source, reads) = MemFile::of(id, &data);
            held_below(&lower, id, &data);
            let entry = fetcher.ram().file(id);
            let memo = Unpacked::default();
            for _ in 0..3 {
                let got = fetcher.read(&entry, &source, 0, 4096, &memo).expect("read");
                assert!(got.as_slice() == &data[..4096]);
            }
            assert_eq!(reads.load(Ordering::Relaxed), 0, "never the source");
            let (asked, held) = if not_in_ram { (3, 0) } else { (1, 1) };
            assert_eq!(
                lower.gets.load(Ordering::Relaxed),
                asked,
                "not_in_ram {not_in_ram}"
            );
            assert_eq!(entry.cached_blocks(), held);
        }
    }

    /// A reader of a block whose prefetch holds the cache's last room joins that fetch: one
    /// source read, and the block is kept (the reader used to see a full cache and read the
    /// bytes again beside it, and `prepfs warm` reported the file as not fitting).
    #[test]
    fn a_reader_joins_the_prefetch_that_holds_the_last_room_for_its_block() {
        let len = 64 << 10;
        // No tier below with room either: the cache is full but for the room prefetch holds.
        let fetcher = room_for_one_block(len);
        let data = vec![5u8; len];
        let id = identity(24, 0, len);
        let (source, reads) = MemFile::of(id, &data);
        let entry = fetcher.ram().file(id);
        let reading = source.now.lock();
        std::thread::scope(|s| {
            let ahead = s.spawn(|| fetcher.prefetch(&entry, 0, &source));
            while reads.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            let reader = s.spawn(|| {
                fetcher
                    .read(&entry, &source, 0, len as u32, &Unpacked::default())
                    .map(|b| b.as_slice() == &data[..])
            });
            // Give the reader time to reach the block (it waits on the flight or the source).
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(reading);
            assert_eq!(ahead.join().expect("prefetch"), Ok(Prefetched::Fetched));
            assert_eq!(reader.join().expect("reader"), Ok(true));
        });
        assert_eq!(reads.load(Ordering::Relaxed), 1, "one source read");
        assert_eq!(entry.cached_blocks(), 1);
    }

    /// Prefetch leaves a block a reader is fetching to that reader: no room taken, no source
    /// read beside it, and the reader's fetch keeps the block in the cache's last room (prefetch
    /// used to take that room and join the reader's fetch: the reader's store found no room,
    /// and neither kept the block).
    #[test]
    fn prefetch_leaves_a_block_a_reader_is_fetching_to_that_reader() {
        let len = 64 << 10;
        let fetcher = room_for_one_block(len);
        let data = vec![9u8; len];
        let id = identity(25, 0, len);
        let (source, reads) = MemFile::of(id, &data);
        let entry = fetcher.ram().file(id);
        let held = fetcher.budget.used(Use::Cache);
        let reading = source.now.lock();
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                fetcher
                    .read(&entry, &source, 0, len as u32, &Unpacked::default())
                    .map(|b| b.as_slice() == &data[..])
            });
            while reads.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            let ahead = s.spawn(|| fetcher.prefetch(&entry, 0, &source));
            // Give the prefetch time to reach the block before the reader's read ends.
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(reading);
            assert_eq!(ahead.join().expect("prefetch"), Ok(Prefetched::Present));
            assert_eq!(reader.join().expect("reader"), Ok(true));
        });
        assert_eq!(fetcher.budget.used(Use::Cache), held + len as u64);
        assert_eq!(reads.load(Ordering::Relaxed), 1, "one source read");
        assert_eq!(entry.cached_blocks(), 1, "the reader's fetch keeps it");
        assert_eq!(fetcher.metrics.prefetch_discarded_bytes.get(), 0);
    }

    /// A block prefetch fetched and could keep nowhere (a tier below keeps its hits out of RAM,
    /// and staging has no room) is counted as discarded: its reader fetches it again.
    #[test]
    fn a_prefetched_block_kept_nowhere_is_counted() {
        let (fetcher, lower) = chain(64 << 20, 0, Codec::None);
        lower.not_in_ram.store(true, Ordering::Relaxed);
        let data = vec![3u8; 4096];
        let id = identity(6, 0, data.len());
        let (source, reads) = MemFile::of(id, &data);
        held_below(&lower, id, &data);
        let entry = fetcher.ram().file(id);
        assert_eq!(fetcher.prefetch(&entry, 0, &source), Ok(Prefetched::NoRoom));
        assert_eq!(reads.load(Ordering::Relaxed), 0);
        assert_eq!(entry.cached_blocks(), 0);
        assert_eq!(fetcher.metrics.prefetch_discarded_bytes.get(), 4096);
    }

    /// A block a tier below did not answer for in time is left to its readers by prefetch (no
    /// source read ahead of them); a reader reads it from the source.
    #[test]
    fn prefetch_leaves_a_block_a_tier_answered_late_for_to_its_readers() {
        let (fetcher, lower) = chain(64 << 20, 4 << 20, Codec::None);
        lower.late.store(true, Ordering::Relaxed);
        let data: Vec<u8> = (0..BLOCK_SIZE as usize).map(|i| (i % 251) as u8).collect();
        let id = identity(5, 0, data.len());
        let (source, reads) = MemFile::of(id, &data);
        let entry = fetcher.ram().file(id);
        assert_eq!(fetcher.prefetch(&entry, 0, &source), Ok(Prefetched::Late));
        assert_eq!(reads.load(Ordering::Relaxed), 0, "no source read ahead");
        assert_eq!(entry.cached_blocks(), 0);
        let got = fetcher
            .read(&entry, &source, 0, 4096, &Unpacked::default())
            .expect("read");
        assert!(got.as_slice() == &data[..4096]);
        assert_eq!(
            reads.load(Ordering::Relaxed),
            1,
            "the reader goes to the source"
        );
        assert_eq!(
            fetcher.prefetch(&entry, 0, &source),
            Ok(Prefetched::Present)
        );
    }

    /// A prefetch into the RAM tier's last room keeps it while it reads: a reader's miss of
    /// another file meanwhile is served but not admitted (it used to take the room, and the
    /// prefetch threw its block away for the reader to read it again: 2-5% more source reads per
    /// epoch in the epochs benchmark); a prefetch that finds no room charges nothing.
    #[test]
    fn prefetch_keeps_the_ram_room_it_found_while_it_reads() {
        let len = 64 << 10;
        let overhead = entry_overhead(len);
        // Room for the entries' bookkeeping and one block, not two.
        let cache = 3 * overhead + len as u64 + len as u64 / 2;
        let (fetcher, _) = chain(cache, 0, Codec::None);
        let data = vec![7u8; len];
        let (a, b, c) = (
            identity(21, 0, len),
            identity(22, 0, len),
            identity(23, 0, len),
        );
        let ((a_source, a_reads), (b_source, _), (c_source, c_reads)) = (
            MemFile::of(a, &data),
            MemFile::of(b, &data),
            MemFile::of(c, &data),
        );
        let entries = [a, b, c].map(|id| fetcher.ram().file(id));
        let held = fetcher.budget.used(Use::Cache);
        assert_eq!(held, 3 * overhead);
        let reading = a_source.now.lock();
        std::thread::scope(|s| {
            let first = s.spawn(|| fetcher.prefetch(&entries[0], 0, &a_source));
            while a_reads.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            let got = fetcher
                .read(&entries[1], &b_source, 0, len as u32, &Unpacked::default())
                .expect("read");
            assert!(got.as_slice() == &data[..]);
            assert_eq!(entries[1].cached_blocks(), 0, "the reader's block: no room");
            drop(reading);
            assert_eq!(first.join().expect("prefetch"), Ok(Prefetched::Fetched));
        });
        assert_eq!(entries[0].cached_blocks(), 1);
        assert_eq!(a_reads.load(Ordering::Relaxed), 1);
        assert_eq!(fetcher.metrics.prefetch_discarded_bytes.get(), 0);
        assert_eq!(fetcher.budget.used(Use::Cache), held + len as u64);
        assert_eq!(
            fetcher.prefetch(&entries[2], 0, &c_source),
            Ok(Prefetched::NoRoom)
        );
        assert_eq!(c_reads.load(Ordering::Relaxed), 0);
        assert_eq!(
            fetcher.budget.used(Use::Cache),
            held + len as u64,
            "a refused room gives nothing back"
        );
    }

    /// Room prefetch takes for a file's first block covers what a memfd charges (whole pages):
    /// a reader's miss meanwhile cannot take the difference, which the block's store used to
    /// top up and, in a full cache, fail to (the block thrown away; 0-1.7 MB of epoch 2 in the
    /// epochs quick check).
    #[test]
    fn prefetch_takes_room_for_the_pages_a_memfd_charges() {
        // Two blocks, the last of 5,000 bytes: a memfd layout, 8,192 bytes charged for it.
        let tail = 5000;
        let len = BLOCK_SIZE as usize + tail;
        let small = 4096;
        let cache = entry_overhead(len) + entry_overhead(small) + 8192 + small as u64 - 1;
        let (fetcher, _) = chain(cache, 0, Codec::None);
        let data = vec![4u8; len];
        let (a, b) = (identity(26, 0, len), identity(27, 0, small));
        let ((a_source, a_reads), (b_source, _)) =
            (MemFile::of(a, &data), MemFile::of(b, &data[..small]));
        let (a_entry, b_entry) = (fetcher.ram().file(a), fetcher.ram().file(b));
        let reading = a_source.now.lock();
        std::thread::scope(|s| {
            let ahead = s.spawn(|| fetcher.prefetch(&a_entry, 1, &a_source));
            while a_reads.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            let got = fetcher
                .read(&b_entry, &b_source, 0, small as u32, &Unpacked::default())
                .expect("read");
            assert!(got.as_slice() == &data[..small]);
            drop(reading);
            assert_eq!(ahead.join().expect("prefetch"), Ok(Prefetched::Fetched));
        });
        assert_eq!(b_entry.cached_blocks(), 0, "the reader's block: no room");
        assert_eq!(a_entry.cached_blocks(), 1);
        assert_eq!(fetcher.metrics.prefetch_discarded_bytes.get(), 0);
    }

    /// `prepfs warm` reserves `whole_file_charge` of the cache's room per file: a cache of just
    /// that much holds the file whole, in either raw layout.
    #[test]
    fn a_cache_of_a_files_whole_charge_holds_it_whole() {
        let block = BLOCK_SIZE as usize;
        for len in [1, 5000, 256 << 10, block, block + 5000, 3 * block] {
            let charge = crate::cache::ram::whole_file_charge(len as u64);
            let (fetcher, lower) = chain(charge, 0, Codec::None);
            lower.refuse.store(true, Ordering::Relaxed);
            let id = identity(30, 0, len);
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let (source, _) = MemFile::of(id, &data);
            let entry = fetcher.ram().file(id);
            for offset in (0..len).step_by(block) {
                let got = fetcher
                    .read(
                        &entry,
                        &source,
                        offset as u64,
                        block as u32,
                        &Unpacked::default(),
                    )
                    .expect("read");
                assert!(got.as_slice() == &data[offset..(offset + block).min(len)]);
            }
            assert_eq!(entry.cached_blocks(), len.div_ceil(block), "{len} bytes");
            assert!(entry.charged_bytes() <= charge, "{len} bytes");
        }
    }

    /// Prefetch reads a block only once it holds room to keep it: a second prefetch that comes
    /// while the first is reading into staging's last room gets no room and reads nothing (it
    /// used to read a block too, and one of the two was thrown away).
    #[test]
    fn prefetch_reads_only_blocks_it_has_room_to_keep() {
        let len = 64 << 10;
        let (fetcher, _) = chain(0, len as u64, Codec::None);
        let data = vec![9u8; len];
        let (a, b) = (identity(21, 0, len), identity(22, 0, len));
        let ((a_source, a_reads), (b_source, b_reads)) =
            (MemFile::of(a, &data), MemFile::of(b, &data));
        let (a_entry, b_entry) = (fetcher.ram().file(a), fetcher.ram().file(b));
        let a_held = a_source.now.clone();
        let reading = a_held.lock();
        std::thread::scope(|s| {
            let first = s.spawn(|| fetcher.prefetch(&a_entry, 0, &a_source));
            while a_reads.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            assert_eq!(
                fetcher.prefetch(&b_entry, 0, &b_source),
                Ok(Prefetched::NoRoom)
            );
            assert_eq!(
                b_reads.load(Ordering::Relaxed),
                0,
                "no room: no source read"
            );
            drop(reading);
            assert_eq!(first.join().expect("prefetch"), Ok(Prefetched::Staged));
        });
        assert_eq!(
            fetcher.staging().bytes(),
            len as u64,
            "the one block staged, charged once"
        );
        assert_eq!(a_reads.load(Ordering::Relaxed), 1);
    }

    /// Many threads reading the same blocks at once: each block is read from the source once
    /// (single flight), every reader gets its bytes, and the slots end consistent.
    #[test]
    fn concurrent_readers_of_a_block_share_one_fetch() {
        let (fetcher, _) = chain(64 << 20, 0, Codec::None);
        let fetcher = Arc::new(fetcher);
        let blocks = 6;
        let data: Vec<u8> = (0..blocks * BLOCK_SIZE as usize)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let id = identity(9, 0, data.len());
        let now = Arc::new(Mutex::new(Versions {
            identity: id,
            data: data.clone(),
        }));
        let reads = Arc::new(AtomicU64::new(0));
        let entry = fetcher.ram().file(id);
        let done = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for t in 0..16u64 {
                let (fetcher, entry, now, reads, data, done) = (
                    fetcher.clone(),
                    entry.clone(),
                    now.clone(),
                    reads.clone(),
                    &data,
                    done.clone(),
                );
                s.spawn(move || {
                    let source = MemFile {
                        opened: id,
                        now,
                        reads,
                        path: Arc::from(Path::new("f")),
                    };
                    let memo = Unpacked::default();
                    let mut rng = fastrand::Rng::with_seed(t);
                    for _ in 0..200 {
                        let offset = rng.u64(0..data.len() as u64);
                        let size = rng.u32(1..(1 << 20));
                        let end = (offset + u64::from(size)).min(data.len() as u64);
                        let got = fetcher
                            .read(&entry, &source, offset, size, &memo)
                            .expect("read");
                        assert!(got.as_slice() == &data[offset as usize..end as usize]);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        assert_eq!(done.load(Ordering::Relaxed), 16);
        assert_eq!(entry.cached_blocks(), blocks);
        assert_eq!(
            fetcher.metrics.source_reads.get(),
            blocks as u64,
            "one source fetch per block, however many readers"
        );
    }
}
