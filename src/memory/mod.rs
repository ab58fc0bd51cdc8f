//! The one hard memory budget (`--cache-mem`): every byte prepfs holds for data is charged here.
//!
//! Owns: the budget's split into three slices and what each may hold, the charges against them, and
//! giving memory back. The **cache** slice holds the never-evict RAM tier (file blocks, decoded
//! pixels, and each cached file's own bookkeeping); the **staging** slice holds prefetched blocks
//! the cache had no room for; the **work** slice is for data in motion: reads in flight, renders
//! being made, and rendered view files waiting to be read. Cache and staging admit only within
//! their slice (so a full cache never starves prefetch, and neither starves the work in flight);
//! work may use any free byte under the limit. Staging's free room may be moved to the cache for
//! good (`lend_staging`: prefetch asks once it knows staging saves nothing), never back. Reads in
//! flight are always charged and never wait (there is at most one per I/O, prefetch and render
//! thread); a render that finds no room first sheds what can be fetched again (registered `Shed`s:
//! staging first, then decoded pixels nobody is reading), then waits for room within a patience of
//! its own, then fails. Under memory pressure (see `pressure`) admission to cache and staging stops
//! and everything that can be shed is shed; after it, they admit only into room the pressure watch
//! has seen free again (`room_seen`), so admission does not take back at once what pressure just
//! freed. Must never hand out more than the limit for anything but reads in flight, never evict a
//! cached file block to make room, and never block a FUSE thread (only renders wait, on their own
//! threads).

pub mod heap;
pub mod limits;
pub mod metrics;
pub mod pressure;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// What a charge pays for; each has its own slice of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The never-evict RAM tier: file blocks, decoded pixels, cached files' bookkeeping.
    Cache,
    /// The prefetch staging buffer.
    Staging,
    /// Data in motion: reads in flight, renders, rendered files waiting to be read.
    Work,
}

impl Use {
    /// Every use, in the order of `MemoryBudget::used`.
    pub const ALL: [Use; 3] = [Use::Cache, Use::Staging, Use::Work];

    /// Its name in the stats files.
    pub fn name(self) -> &'static str {
        match self {
            Use::Cache => "cache",
            Use::Staging => "staging",
            Use::Work => "work",
        }
    }
}

/// Share of the budget a default staging slice takes at most: prefetch hides the misses of what
/// the cache cannot hold, so the cache keeps most of a small budget ...
const STAGING_SHARE_DEFAULT: f64 = 0.125;
/// ... and the share a staging slice the user asked for may take.
const STAGING_SHARE_MAX: f64 = 0.5;
/// Share of the budget the work slice may take at most.
const WORK_SHARE_MAX: f64 = 0.25;
/// Work slice per thread that may hold a read in flight (a block is 1 MiB).
const WORK_PER_READER: u64 = 1 << 20;
/// Work slice per render thread: a typical photo's decode, one resize and its output tensor
/// (a 500x375 JPEG to a 224x224 float32 view is about 2.5 MB); larger images wait for room.
pub const WORK_PER_RENDER: u64 = 8 << 20;

/// The staging slice a mount asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// No prefetch: no staging.
    None,
    /// The default size, within an eighth of the budget.
    Default(u64),
    /// A size the user chose, within half of the budget.
    Asked(u64),
}

/// How one budget is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The cache slice.
    pub cache: u64,
    /// The staging slice (0: prefetch only into the cache).
    pub staging: u64,
    /// The work slice (what cache and staging never take).
    pub work: u64,
}

impl MemoryPlan {
    /// The split of a `limit`-byte budget for a mount that asks for `staging` and runs `readers`
    /// threads that may hold a read in flight and `renders` render threads: work gets what they
    /// need within a quarter of the budget, staging what was asked within its share (an eighth
    /// by default, half when the user chose it), the cache the rest.
    pub fn split(limit: u64, staging: Staging, readers: usize, renders: usize) -> MemoryPlan {
        let share = |s: f64| (limit as f64 * s) as u64;
        let work = (readers as u64 * WORK_PER_READER + renders as u64 * WORK_PER_RENDER)
            .min(share(WORK_SHARE_MAX));
        let staging = match staging {
            Staging::None => 0,
            Staging::Default(bytes) => bytes.min(share(STAGING_SHARE_DEFAULT)),
            Staging::Asked(bytes) => bytes.min(share(STAGING_SHARE_MAX)),
        }
        .min(limit - work);
        MemoryPlan {
            cache: limit - work - staging,
            staging,
            work,
        }
    }

    /// The whole budget.
    pub fn limit(&self) -> u64 {
        self.cache + self.staging + self.work
    }
}

/// Something holding memory that can be fetched or computed again, given back under pressure.
pub trait Shed: Send + Sync {
    /// Drops what it can of what nobody is using now; the bytes it released.
    fn shed(&self) -> u64;

    /// When memory is still short after everything was shed: gives back about `bytes` of what
    /// it keeps for good but could fetch again (the RAM tier's cached source data), rather than
    /// let the kernel kill the daemon; the bytes it released.
    fn give_back(&self, _bytes: u64) -> u64 {
        0
    }
}

/// A render's (or any work's) share of the work slice, released when dropped.
#[derive(Debug)]
pub struct Work {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Work {
    /// Bytes it holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes over `more`'s charge: one charge for something that grew.
    pub fn absorb(&mut self, mut more: Work) {
        self.bytes += std::mem::take(&mut more.bytes);
    }

    /// Gives back all but `bytes` (what the work keeps, e.g. a finished render's file).
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.budget.release(Use::Work, self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        self.budget.release(Use::Work, self.bytes);
    }
}

/// Why work could not have memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoMemory {
    /// It needs more than the whole budget.
    #[error("needs {0} bytes, more than the whole memory budget")]
    TooLarge(u64),
    /// Nothing freed enough room within its patience.
    #[error("no room for {0} bytes in the memory budget in time")]
    Timeout(u64),
}

/// Figures for the stats files.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryGauges {
    /// The whole budget (`--cache-mem`).
    pub limit: u64,
    /// Each slice's size: cache, staging, work.
    pub slices: [u64; 3],
    /// Bytes charged now: cache, staging, work.
    pub used: [u64; 3],
    /// Whether memory pressure holds admission now.
    pub pressure: bool,
    /// Times memory pressure began.
    pub pressure_events: u64,
    /// Bytes given back by shedding.
    pub shed_bytes: u64,
    /// Bytes kept for good given back because memory stayed short (`give_back`).
    pub given_back_bytes: u64,
    /// Bytes of their slices cache and staging may not take since memory pressure, until the
    /// pressure watch sees that room free (0: their whole slices).
    pub held_back: u64,
    /// Renders that waited for room.
    pub waits: u64,
    /// Renders refused memory (too large, or no room in time).
    pub refused: u64,
    /// Times freed heap memory was given back to the kernel.
    pub heap_trims: u64,
    /// Memory left at the pressure watch's last look (`saw_left`; 0 before it).
    pub left: u64,
}

/// The budget of one mount.
pub struct MemoryBudget {
    plan: MemoryPlan,
    /// Staging room given to the cache slice for good (`lend_staging`).
    lent: AtomicU64,
    used: [AtomicU64; 3],
    total: AtomicU64,
    pressure: AtomicBool,
    pressure_events: AtomicU64,
    shed_bytes: AtomicU64,
    /// Bytes kept for good given back under pressure (`give_back`).
    given_back: AtomicU64,
    /// What cache and staging may hold together since memory pressure: set to what they held
    /// once pressure shed what it could (and again after a give-back), raised as the pressure
    /// watch sees room (`room_seen`); `u64::MAX`: their slices alone. Without it admission,
    /// resumed as pressure ended, took the freed room back at once while a co-tenant still held
    /// its memory: pressure on and off every ~200 ms, the same data shed or given back and
    /// fetched again.
    ceiling: AtomicU64,
    waits: AtomicU64,
    refused: AtomicU64,
    heap_trims: AtomicU64,
    /// Memory left at the pressure watch's last look.
    left: AtomicU64,
    /// Renders waiting for room (counted under `room`, read without it: a release takes the
    /// lock only when someone waits, so the read path's releases share no lock); released bytes
    /// wake them.
    waiting: AtomicUsize,
    room: Mutex<()>,
    freed: Condvar,
    /// What can give memory back, with the slice it frees, in the order it is asked.
    shedders: Mutex<Vec<(Use, Weak<dyn Shed>)>>,
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("plan", &self.plan)
            .field("total", &self.total.load(Ordering::Relaxed))
            .finish()
    }
}

impl MemoryBudget {
    /// An empty budget split as `plan` says.
    pub fn new(plan: MemoryPlan) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            plan,
            lent: AtomicU64::new(0),
            used: Default::default(),
            total: AtomicU64::new(0),
            pressure: AtomicBool::new(false),
            pressure_events: AtomicU64::new(0),
            shed_bytes: AtomicU64::new(0),
            given_back: AtomicU64::new(0),
            ceiling: AtomicU64::new(u64::MAX),
            waits: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            heap_trims: AtomicU64::new(0),
            left: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            room: Mutex::new(()),
            freed: Condvar::new(),
            shedders: Mutex::new(Vec::new()),
        })
    }

    /// How it is split.
    pub fn plan(&self) -> MemoryPlan {
        self.plan
    }

    /// The size of `use_`'s slice now (the plan's, but for staging room lent to the cache).
    pub fn slice(&self, use_: Use) -> u64 {
        let lent = self.lent.load(Ordering::Acquire);
        match use_ {
            Use::Cache => self.plan.cache + lent,
            Use::Staging => self.plan.staging - lent,
            Use::Work => self.plan.work,
        }
    }

    /// Moves the staging slice's free room to the cache slice for good: the cache never evicts,
    /// so nothing moves back. Staged blocks keep their room until they are read or dropped (a
    /// later call moves it then). The bytes moved.
    pub fn lend_staging(&self) -> u64 {
        let staged = self.used(Use::Staging);
        let mut moved = 0;
        let _ = self
            .lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |lent| {
                moved = (self.plan.staging - lent).saturating_sub(staged);
                Some(lent + moved)
            });
        moved
    }

    /// Bytes charged to `use_` now.
    pub fn used(&self, use_: Use) -> u64 {
        self.used[use_ as usize].load(Ordering::Relaxed)
    }

    /// Bytes of the whole budget not charged to anything now (a hint, as `has_room`).
    pub fn free(&self) -> u64 {
        self.plan
            .limit()
            .saturating_sub(self.total.load(Ordering::Relaxed))
    }

    /// Bytes charged to staging and work now: heap memory that comes and goes. (The cache's
    /// bytes are mostly memfds, and it frees heap only when pressure sheds decoded pixels.)
    pub fn heap_charged(&self) -> u64 {
        self.used(Use::Staging) + self.used(Use::Work)
    }

    /// Gives the heap's free pages back to the kernel (`heap::trim`), counted in the stats.
    /// Only for the memory watch's thread: a trim walks the allocator's arenas.
    pub fn trim_heap(&self) {
        heap::trim();
        self.heap_trims.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `bytes` more for `use_` would be admitted now (a hint: another admission may take
    /// the room first).
    pub fn has_room(&self, use_: Use, bytes: u64) -> bool {
        !self.pressure.load(Ordering::Relaxed)
            && self.used(use_).saturating_add(bytes) <= self.slice(use_)
            && self.total.load(Ordering::Relaxed).saturating_add(bytes) <= self.plan.limit()
            && self.under_ceiling(bytes)
    }

    /// Bytes cache and staging hold together: what admission adds to.
    fn admitted(&self) -> u64 {
        self.used(Use::Cache) + self.used(Use::Staging)
    }

    /// What cache and staging may hold together when nothing holds admission back: their slices.
    fn admittable(&self) -> u64 {
        self.slice(Use::Cache) + self.slice(Use::Staging)
    }

    /// Whether `bytes` more stay under the ceiling since pressure (a hint: two admissions at
    /// once may pass it by one charge; the budget's limit is what is never passed).
    fn under_ceiling(&self, bytes: u64) -> bool {
        self.admitted().saturating_add(bytes) <= self.ceiling.load(Ordering::Acquire)
    }

    /// Holds admission to what cache and staging hold now: memory ran short with this much.
    fn hold_admission(&self) {
        self.ceiling.fetch_min(self.admitted(), Ordering::AcqRel);
    }

    /// The pressure watch saw `left` bytes of memory left (for the stats: what admission held
    /// back since pressure is measured against).
    pub fn saw_left(&self, left: u64) {
        self.left.store(left, Ordering::Relaxed);
    }

    /// The pressure watch saw `room` bytes stay free beyond where admission should stop:
    /// admission, held since pressure, may add that much to what cache and staging hold now
    /// (their whole slices once that covers them). Never lowers the ceiling.
    pub fn room_seen(&self, room: u64) {
        if self.ceiling.load(Ordering::Acquire) == u64::MAX {
            return;
        }
        let reach = self.admitted().saturating_add(room);
        let raised = if reach >= self.admittable() {
            u64::MAX
        } else {
            reach
        };
        let was = self.ceiling.fetch_max(raised, Ordering::AcqRel);
        if raised == u64::MAX && was != u64::MAX {
            tracing::info!("memory: room seen again, cache and staging may fill their slices");
        }
    }

    /// Charges `bytes` to the cache or staging slice if they fit it and the budget now (and no
    /// memory pressure holds admission); false, and nothing charged, otherwise. Never waits.
    pub fn admit(&self, use_: Use, bytes: u64) -> bool {
        if self.pressure.load(Ordering::Relaxed) || !self.under_ceiling(bytes) {
            return false;
        }
        let slice = &self.used[use_ as usize];
        let cap = self.slice(use_);
        let limit = self.plan.limit();
        if slice
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|&t| t <= cap)
            })
            .is_err()
        {
            return false;
        }
        if self
            .total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                t.checked_add(bytes).filter(|&t| t <= limit)
            })
            .is_err()
        {
            slice.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Charges `bytes` to `use_` whatever the room: for what is bounded by a count prepfs chose
    /// (a read in flight per thread, a cached file's bookkeeping). Pair with `release`.
    pub fn charge(&self, use_: Use, bytes: u64) {
        self.used[use_ as usize].fetch_add(bytes, Ordering::AcqRel);
        self.total.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Gives back `bytes` charged to `use_`.
    pub fn release(&self, use_: Use, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.used[use_ as usize].fetch_sub(bytes, Ordering::AcqRel);
        self.total.fetch_sub(bytes, Ordering::AcqRel);
        // Paired with the fence in `work`: either this sees the waiter, or the waiter's next
        // look at the room sees these bytes released.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            let _room = self.room.lock();
            self.freed.notify_all();
        }
    }

    /// A read in flight: charged to the work slice at once, whatever the room (there is at most
    /// one per thread that reads), released when dropped.
    pub fn in_flight(self: &Arc<Self>, bytes: u64) -> Work {
        self.charge(Use::Work, bytes);
        Work {
            budget: self.clone(),
            bytes,
        }
    }

    /// `bytes` of work memory if the budget has them free now; never waits, never sheds.
    pub fn try_work(self: &Arc<Self>, bytes: u64) -> Option<Work> {
        let limit = self.plan.limit();
        self.total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                t.checked_add(bytes).filter(|&t| t <= limit)
            })
            .ok()?;
        self.used[Use::Work as usize].fetch_add(bytes, Ordering::AcqRel);
        Some(Work {
            budget: self.clone(),
            bytes,
        })
    }

    /// `bytes` of work memory (a render): at once if free, else after shedding what can be
    /// fetched again, else once other work gives memory back, waiting at most `patience`.
    pub fn work(self: &Arc<Self>, bytes: u64, patience: Duration) -> Result<Work, NoMemory> {
        if bytes > self.plan.limit() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(NoMemory::TooLarge(bytes));
        }
        if let Some(work) = self.try_work(bytes) {
            return Ok(work);
        }
        // Idle work first (renders held for jobs that have not come for them), so a render
        // never costs the caches while work can make room for work.
        for shed in [Some(Use::Work), None] {
            self.shed(shed);
            if let Some(work) = self.try_work(bytes) {
                return Ok(work);
            }
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + patience;
        let mut room = self.room.lock();
        self.waiting.fetch_add(1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        let granted = loop {
            if let Some(work) = self.try_work(bytes) {
                break Some(work);
            }
            if self.freed.wait_until(&mut room, deadline).timed_out() {
                break self.try_work(bytes);
            }
        };
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        drop(room);
        granted.ok_or_else(|| {
            self.refused.fetch_add(1, Ordering::Relaxed);
            NoMemory::Timeout(bytes)
        })
    }

    /// Registers something that can give back memory of slice `frees`; asked in registration
    /// order.
    pub fn add_shed(&self, frees: Use, shed: Weak<dyn Shed>) {
        self.shedders.lock().push((frees, shed));
    }

    /// Asks every registered `Shed` to give back what it can; the bytes released.
    pub fn shed_all(&self) -> u64 {
        self.shed(None)
    }

    /// The registered `Shed`s still alive (of `only`'s use, or all), taken out of the lock so
    /// that none is called under it; the dead ones leave the list.
    fn live_shedders(&self, only: Option<Use>) -> Vec<Arc<dyn Shed>> {
        let mut list = self.shedders.lock();
        list.retain(|(_, s)| s.strong_count() > 0);
        list.iter()
            .filter(|(frees, _)| only.is_none_or(|u| u == *frees))
            .filter_map(|(_, s)| s.upgrade())
            .collect()
    }

    /// Asks the registered `Shed`s of slice `only` (all when `None`) to give back what they
    /// can; the bytes released.
    fn shed(&self, only: Option<Use>) -> u64 {
        let freed: u64 = self.live_shedders(only).iter().map(|s| s.shed()).sum();
        self.shed_bytes.fetch_add(freed, Ordering::Relaxed);
        freed
    }

    /// Memory is still short after shedding: asks the registered `Shed`s to give back about
    /// `bytes` of what they keep for good; the bytes released.
    pub fn give_back(&self, bytes: u64) -> u64 {
        let mut freed = 0;
        for shed in self.live_shedders(None) {
            if freed >= bytes {
                break;
            }
            freed += shed.give_back(bytes - freed);
        }
        self.given_back.fetch_add(freed, Ordering::Relaxed);
        self.hold_admission();
        freed
    }

    /// Memory pressure began (`true`) or ended: while it holds, cache and staging admit nothing;
    /// as it begins, everything that can be shed is, and admission stays held to what is left
    /// charged until the watch sees room (`room_seen`).
    pub fn set_pressure(&self, on: bool) {
        let was = self.pressure.swap(on, Ordering::AcqRel);
        if on && !was {
            self.pressure_events.fetch_add(1, Ordering::Relaxed);
            let freed = self.shed_all();
            self.hold_admission();
            tracing::warn!(
                shed_bytes = freed,
                "memory pressure: admission paused, refetchable data given back"
            );
        } else if !on && was {
            tracing::info!("memory pressure over: admission resumes");
        }
    }

    /// Current figures.
    pub fn gauges(&self) -> MemoryGauges {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MemoryGauges {
            limit: self.plan.limit(),
            slices: Use::ALL.map(|u| self.slice(u)),
            used: Use::ALL.map(|u| self.used(u)),
            pressure: self.pressure.load(Ordering::Relaxed),
            pressure_events: load(&self.pressure_events),
            shed_bytes: load(&self.shed_bytes),
            given_back_bytes: load(&self.given_back),
            held_back: match self.ceiling.load(Ordering::Relaxed) {
                u64::MAX => 0,
                ceiling => self.admittable().saturating_sub(ceiling),
            },
            waits: load(&self.waits),
            refused: load(&self.refused),
            heap_trims: load(&self.heap_trims),
            left: load(&self.left),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn budget(cache: u64, staging: u64, work: u64) -> Arc<MemoryBudget> {
        MemoryBudget::new(MemoryPlan {
            cache,
            staging,
            work,
        })
    }

    #[test]
    fn the_split_gives_staging_and_work_what_they_want_within_their_shares() {
        let plan = MemoryPlan::split(1 << 30, Staging::Default(64 * MIB), 20, 2);
        assert_eq!((plan.staging, plan.work), (64 * MIB, 36 * MIB));
        assert_eq!(plan.limit(), 1 << 30);
        let small = MemoryPlan::split(200 * MIB, Staging::Default(64 * MIB), 20, 2);
        assert_eq!((small.staging, small.work), (25 * MIB, 36 * MIB));
        assert_eq!(small.cache, 139 * MIB);
        let asked = MemoryPlan::split(200 * MIB, Staging::Asked(64 * MIB), 20, 0);
        assert_eq!(
            (asked.staging, asked.work, asked.cache),
            (64 * MIB, 20 * MIB, 116 * MIB)
        );
        let none = MemoryPlan::split(200 * MIB, Staging::None, 20, 0);
        assert_eq!(none.staging, 0);
    }

    #[test]
    fn staging_lends_its_free_room_to_the_cache_for_good_within_the_same_budget() {
        let b = budget(4 * MIB, 2 * MIB, MIB);
        assert!(b.admit(Use::Staging, MIB / 2));
        assert_eq!(
            b.lend_staging(),
            3 * MIB / 2,
            "the free room, not the staged block's"
        );
        assert_eq!(b.slice(Use::Cache), 4 * MIB + 3 * MIB / 2);
        assert_eq!(b.slice(Use::Staging), MIB / 2);
        assert!(
            !b.admit(Use::Staging, 1),
            "staging keeps only what it holds"
        );
        assert!(
            b.admit(Use::Cache, 5 * MIB),
            "the cache admits into the lent room"
        );
        b.release(Use::Staging, MIB / 2);
        assert_eq!(
            b.lend_staging(),
            MIB / 2,
            "the rest once the staged block is read"
        );
        assert_eq!(b.slice(Use::Staging), 0);
        assert_eq!(b.lend_staging(), 0);
        assert_eq!(b.gauges().limit, 7 * MIB, "the budget is unchanged");
        assert!(!b.admit(Use::Cache, MIB + 1), "nor ever exceeded");
    }

    #[test]
    fn cache_and_staging_admit_only_within_their_slices() {
        let b = budget(4 * MIB, 2 * MIB, 2 * MIB);
        assert!(b.admit(Use::Cache, 3 * MIB));
        assert!(!b.admit(Use::Cache, 2 * MIB), "past the cache slice");
        assert!(b.admit(Use::Staging, 2 * MIB));
        assert!(!b.admit(Use::Staging, 1), "past the staging slice");
        assert_eq!(b.used(Use::Cache), 3 * MIB, "a refusal charges nothing");
        b.release(Use::Cache, 3 * MIB);
        assert!(b.admit(Use::Cache, 4 * MIB));
    }

    #[test]
    fn work_takes_any_free_byte_under_the_limit_and_waits_for_room_otherwise() {
        let b = budget(4 * MIB, 0, MIB);
        let first = b.work(3 * MIB, Duration::ZERO).expect("free room");
        assert_eq!(b.used(Use::Work), 3 * MIB);
        assert!(
            !b.admit(Use::Cache, 3 * MIB),
            "work took the cache's free room"
        );
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || b.work(2 * MIB, Duration::from_secs(10)).map(|w| w.bytes()))
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(first);
        assert_eq!(waiter.join().expect("joins"), Ok(2 * MIB));
        assert_eq!(
            b.work(6 * MIB, Duration::ZERO).map(|w| w.bytes()),
            Err(NoMemory::TooLarge(6 * MIB))
        );
        let _held = b.work(5 * MIB, Duration::ZERO).expect("all of it");
        assert_eq!(
            b.work(1, Duration::from_millis(20)).map(|w| w.bytes()),
            Err(NoMemory::Timeout(1))
        );
        assert_eq!(b.gauges().refused, 2);
    }

    #[test]
    fn reads_in_flight_are_charged_whatever_the_room_and_released_on_drop() {
        let b = budget(MIB, 0, 0);
        let read = b.in_flight(2 * MIB);
        assert_eq!(b.used(Use::Work), 2 * MIB);
        assert!(
            !b.has_room(Use::Cache, 1),
            "over the limit: nothing admitted"
        );
        drop(read);
        assert_eq!(b.used(Use::Work), 0);
        assert!(b.admit(Use::Cache, MIB));
    }

    struct Held(Mutex<u64>);
    impl Shed for Held {
        fn shed(&self) -> u64 {
            std::mem::take(&mut *self.0.lock())
        }
    }

    #[test]
    fn a_render_sheds_idle_work_before_anything_cached() {
        let b = budget(2 * MIB, 0, 2 * MIB);
        assert!(b.admit(Use::Cache, 2 * MIB));
        // Renders held for other jobs: work nobody is using now.
        struct Idle(Mutex<Option<Work>>);
        impl Shed for Idle {
            fn shed(&self) -> u64 {
                self.0.lock().take().map_or(0, |w| w.bytes())
            }
        }
        let idle = Arc::new(Idle(Mutex::new(Some(b.in_flight(2 * MIB)))));
        let cached = Arc::new(Held(Mutex::new(2 * MIB)));
        let (idle_shed, cached_shed): (Arc<dyn Shed>, Arc<dyn Shed>) =
            (idle.clone(), cached.clone());
        // Registered first, so only the slice it frees puts it ahead.
        b.add_shed(Use::Cache, Arc::downgrade(&cached_shed));
        b.add_shed(Use::Work, Arc::downgrade(&idle_shed));
        let work = b
            .work(2 * MIB, Duration::ZERO)
            .expect("the idle work made room");
        assert_eq!(work.bytes(), 2 * MIB);
        assert!(idle.0.lock().is_none(), "idle work shed");
        assert_eq!(*cached.0.lock(), 2 * MIB, "the cache kept");
        assert_eq!(b.used(Use::Cache), 2 * MIB);
    }

    #[test]
    fn a_render_without_room_sheds_first_and_pressure_stops_admission() {
        let b = budget(2 * MIB, 2 * MIB, 0);
        assert!(b.admit(Use::Staging, 2 * MIB));
        assert!(b.admit(Use::Cache, 2 * MIB));
        let staged: Arc<dyn Shed> = Arc::new(Held(Mutex::new(2 * MIB)));
        let staging = b.clone();
        struct Release(Arc<MemoryBudget>, Arc<dyn Shed>);
        impl Shed for Release {
            fn shed(&self) -> u64 {
                let n = self.1.shed();
                self.0.release(Use::Staging, n);
                n
            }
        }
        let shed: Arc<dyn Shed> = Arc::new(Release(staging, staged));
        b.add_shed(Use::Staging, Arc::downgrade(&shed));
        let work = b
            .work(2 * MIB, Duration::ZERO)
            .expect("staging was shed for it");
        assert_eq!(b.gauges().shed_bytes, 2 * MIB);
        drop(work);
        b.set_pressure(true);
        assert!(!b.admit(Use::Staging, 1), "pressure holds admission");
        assert_eq!(b.gauges().pressure_events, 1);
        b.set_pressure(false);
        assert!(
            !b.admit(Use::Staging, 1),
            "held to what pressure left charged until room is seen"
        );
        assert_eq!(b.gauges().held_back, 2 * MIB);
        b.room_seen(MIB);
        assert!(b.admit(Use::Staging, MIB), "the room seen");
        assert!(!b.admit(Use::Staging, 1), "and no more");
        b.room_seen(2 * MIB);
        assert_eq!(b.gauges().held_back, 0, "the whole budget again");
        assert!(b.admit(Use::Staging, MIB));
    }
}
