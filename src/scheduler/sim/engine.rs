//! The simulator's event engine: a discrete-event model of the prepfs pipeline under one
//! scenario, stepped one decision interval at a time.
//!
//! Owns: the model (a consumer reading images in shuffled epoch order with a bounded number of
//! requests outstanding; a source with a per-fetch latency, shared bandwidth, limited concurrency
//! and CPU work of its own; a never-evict RAM cache that admits entries raw and packs the
//! compressible ones in the background with the codec then in force, as the RAM tier does;
//! render workers sharing the cores with a background load by processor sharing, each render a
//! crop-aware decode unless it keeps the pixels, and each delivered image's read path on the
//! cores outside the workers; an optional GPU) and the observation it reports. Each `step` advances simulated time by one decision interval and
//! returns the same `Observation` the mount fills from telemetry, so a policy trained here acts
//! there. Deterministic for a seed (no clock, no threads). Must never touch the machine or the
//! real cache.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::baselines::static_cpu;
use super::scenario::Scenario;
use crate::cache::policy::packing_pixels_pays;
use crate::control::action::{Action, Head, Mask, Placement};
use crate::control::observation::{GpuObservation, Observation, fit};
use crate::scheduler::rng::Rng;

/// Simulated seconds per `step`: the mount's decision interval.
pub const INTERVAL_S: f64 = 0.2;
/// Share of the machine's memory used by everything but prepfs (the trainer, the OS).
const MEMORY_BASELINE: f64 = 0.3;
/// Dataset sizes are raised to this so the deepest prefetch window stays inside two epochs.
const MIN_ITEMS: usize = 256;
/// Guard against a modelling bug turning one step into an endless loop.
const MAX_EVENTS_PER_STEP: usize = 1_000_000;

/// Time-ordered events; `u64` bits of non-negative times sort like the times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The consumer wants its next image.
    Issue,
    /// A fetch's latency has passed; its bytes start to flow.
    FetchFlowing(u32),
    /// A request's GPU stage completed.
    GpuDone(u32),
}

/// Threads (or transfers) sharing a resource equally: each progresses at the same rate, so a
/// virtual clock and a heap of virtual finish times give every completion in O(log n).
#[derive(Debug, Default)]
struct Shared {
    virt: f64,
    jobs: BinaryHeap<Reverse<(u64, u64, u32)>>,
    seq: u64,
}

impl Shared {
    fn push(&mut self, work: f64, owner: u32) {
        self.seq += 1;
        let finish = self.virt + work.max(0.0);
        self.jobs.push(Reverse((finish.to_bits(), self.seq, owner)));
    }
    /// Virtual work left of the job finishing first.
    fn next(&self) -> Option<f64> {
        self.jobs
            .peek()
            .map(|Reverse((f, ..))| (f64::from_bits(*f) - self.virt).max(0.0))
    }
    fn pop(&mut self) -> Option<u32> {
        let Reverse((f, _, owner)) = self.jobs.pop()?;
        self.virt = self.virt.max(f64::from_bits(f));
        Some(owner)
    }
}

/// One step of a request's processing after its bytes are available.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Cpu(f64),
    Gpu(f64),
}

#[derive(Debug, Clone)]
struct Request {
    item: u32,
    issued: f64,
    live: bool,
    stages: [Stage; 3],
    len: u8,
    next: u8,
    /// Its render is done and its worker free; the read path's CPU (`deliver_s`) is running.
    delivering: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum FetchState {
    Queued,
    Waiting,
    Flowing,
}

#[derive(Debug, Clone)]
struct Fetch {
    item: u32,
    started: f64,
    state: FetchState,
    /// Started by the prefetcher (counted in `prefetching` until done).
    prefetched: bool,
    waiters: Vec<u32>,
}

/// Where an item's bytes are: cached encoded or decoded (with the codec option), staged by the
/// prefetcher, or being fetched.
#[derive(Debug, Clone, Copy, Default)]
struct Item {
    encoded: Option<u8>,
    decoded: Option<u8>,
    staged: bool,
    fetch: Option<u32>,
    /// Size and cost factor of this image relative to the calibrated one.
    scale: f32,
}

/// Counters over the current interval.
#[derive(Debug, Default)]
struct Interval {
    issued: usize,
    hits: usize,
    delivered: usize,
    latencies: Vec<f32>,
    stall_s: f64,
    prepfs_core_s: f64,
    busy_core_s: f64,
    gpu_busy_s: f64,
    fetches: usize,
    fetch_s: f64,
    fetch_bytes_per_s: f64,
}

/// The pipeline under one scenario; see the module documentation.
#[derive(Debug)]
pub struct Simulator {
    s: Scenario,
    rng: Rng,
    now: f64,
    action: Action,
    background: f64,
    bandwidth: f64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    cpu: Shared,
    source: Shared,
    items: Vec<Item>,
    /// Epoch orders of epochs `epoch0` and `epoch0 + 1`.
    orders: [Vec<u32>; 2],
    epoch0: usize,
    /// Position (in the concatenated epoch orders) of the consumer's next request.
    position: usize,
    prefetch_cursor: usize,
    prefetching: usize,
    requests: Vec<Request>,
    free_requests: Vec<u32>,
    fetches: Vec<Fetch>,
    free_fetches: Vec<u32>,
    demand: VecDeque<u32>,
    prefetch: VecDeque<u32>,
    flowing_or_waiting: usize,
    render_queue: VecDeque<u32>,
    busy_workers: usize,
    outstanding: usize,
    blocked: bool,
    /// Items whose bytes or pixels the cache holds raw, waiting for the packer (in order).
    to_pack: VecDeque<u32>,
    /// The item the packer is compressing: its pixels (or else its encoded bytes), with the
    /// codec it packs them with.
    packing: Option<(u32, bool, u8)>,
    gpu_free_at: f64,
    cache_used: f64,
    staged: usize,
    obs: Observation,
    iv: Interval,
}

/// The packer's owner id in the CPU pool (requests use their slab index).
const PACKER: u32 = u32::MAX;
/// The source's CPU work's owner id in the CPU pool.
const SOURCE_WORK: u32 = u32::MAX - 1;
/// A codec packs an entry only if it shrinks it below this share of its raw size (the RAM tier
/// keeps incompressible data raw).
const PACK_GAIN: f64 = 0.95;

impl Simulator {
    /// A fresh pipeline (empty cache, epoch 1 about to start) for `scenario`.
    pub fn new(scenario: Scenario, seed: u64) -> Simulator {
        let mut rng = Rng::new(seed);
        let n = scenario.items.max(MIN_ITEMS);
        let items = (0..n)
            .map(|_| Item {
                scale: rng.range(0.7, 1.3) as f32,
                ..Item::default()
            })
            .collect();
        let first = permutation(n, &mut rng);
        let second = permutation(n, &mut rng);
        let mut sim = Simulator {
            rng,
            now: 0.0,
            action: static_cpu(
                &Observation::default(),
                &Action::default(),
                &Mask::default(),
                0,
            ),
            background: 0.0,
            bandwidth: scenario.source.bytes_per_s,
            events: BinaryHeap::new(),
            seq: 0,
            cpu: Shared::default(),
            source: Shared::default(),
            items,
            orders: [first, second],
            epoch0: 0,
            position: 0,
            prefetch_cursor: 0,
            prefetching: 0,
            requests: Vec::new(),
            free_requests: Vec::new(),
            fetches: Vec::new(),
            free_fetches: Vec::new(),
            demand: VecDeque::new(),
            prefetch: VecDeque::new(),
            flowing_or_waiting: 0,
            render_queue: VecDeque::new(),
            busy_workers: 0,
            outstanding: 0,
            blocked: false,
            to_pack: VecDeque::new(),
            packing: None,
            gpu_free_at: 0.0,
            cache_used: 0.0,
            staged: 0,
            obs: Observation::default(),
            iv: Interval::default(),
            s: scenario,
        };
        sim.schedule(0.0, Event::Issue);
        sim
    }

    /// The options this machine allows: GPU placements only with a GPU; views always.
    pub fn mask(&self) -> Mask {
        Mask::new(self.s.gpu.is_some(), true)
    }

    /// Simulated seconds elapsed.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// The scenario being simulated.
    pub fn scenario(&self) -> &Scenario {
        &self.s
    }

    /// Load latencies (seconds) of the requests delivered during the last step.
    pub fn last_latencies(&self) -> &[f32] {
        &self.iv.latencies
    }

    /// Applies `action` (clamped to the mask) for one interval and returns what telemetry would
    /// report at its end.
    pub fn step(&mut self, action: &Action) -> Observation {
        let mask = self.mask();
        self.action = *action;
        for head in Head::ALL {
            if !mask.allows(head, self.action.get(head)) {
                self.action = self.action.with(head, 0);
            }
        }
        self.background = Scenario::at(&self.s.background, self.now, 0.0).clamp(0.0, 1.0);
        let factor = Scenario::at(&self.s.throttle, self.now, 1.0).max(0.01);
        self.bandwidth = self.s.source.bytes_per_s * factor;
        self.iv = Interval {
            latencies: std::mem::take(&mut self.iv.latencies),
            ..Interval::default()
        };
        self.iv.latencies.clear();
        let end = self.now + INTERVAL_S;
        self.top_up();
        for _ in 0..MAX_EVENTS_PER_STEP {
            let cpu_rate = self.cpu_rate();
            let src_rate = self.source_rate();
            let t_event = self
                .events
                .peek()
                .map(|Reverse((t, ..))| f64::from_bits(*t));
            let t_cpu = self.cpu.next().map(|w| self.now + w / cpu_rate);
            let t_src = self.source.next().map(|w| self.now + w / src_rate);
            let t = [t_event, t_cpu, t_src]
                .into_iter()
                .flatten()
                .fold(end, f64::min);
            self.advance(t, cpu_rate, src_rate);
            if t >= end {
                break;
            }
            if t_cpu == Some(t) {
                if let Some(owner) = self.cpu.pop() {
                    self.cpu_done(owner);
                }
            } else if t_src == Some(t) {
                if let Some(f) = self.source.pop() {
                    self.fetch_done(f);
                }
            } else if let Some(Reverse((_, _, event))) = self.events.pop() {
                self.handle(event);
            }
            self.top_up();
        }
        self.observe();
        self.obs
    }

    /// Seconds of work per second each runnable prepfs thread gets: processor sharing with
    /// `background * cores` always-runnable threads.
    fn cpu_rate(&self) -> f64 {
        let runnable = self.background * self.s.cores as f64 + self.cpu.jobs.len() as f64;
        (self.s.cores as f64 / runnable.max(1e-9)).min(1.0)
    }

    /// Bytes per second each flowing fetch gets.
    fn source_rate(&self) -> f64 {
        self.bandwidth / self.source.jobs.len().max(1) as f64
    }

    fn advance(&mut self, t: f64, cpu_rate: f64, src_rate: f64) {
        let dt = (t - self.now).max(0.0);
        let n = self.cpu.jobs.len() as f64;
        self.cpu.virt += dt * cpu_rate;
        self.source.virt += dt * src_rate;
        self.iv.prepfs_core_s += n * cpu_rate * dt;
        self.iv.busy_core_s += (self.background * self.s.cores as f64 + n) * cpu_rate * dt;
        self.iv.gpu_busy_s += (self.gpu_free_at - self.now).clamp(0.0, dt);
        if self.blocked {
            self.iv.stall_s += dt;
        }
        self.now = t.max(self.now);
    }

    fn schedule(&mut self, t: f64, event: Event) {
        self.seq += 1;
        self.events
            .push(Reverse((t.max(self.now).to_bits(), self.seq, event)));
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Issue => {
                if self.outstanding < self.s.outstanding {
                    self.issue();
                } else {
                    self.blocked = true;
                }
            }
            Event::FetchFlowing(f) => {
                let bytes = self.bytes(self.fetches[f as usize].item);
                self.fetches[f as usize].state = FetchState::Flowing;
                self.source.push(bytes, f);
            }
            Event::GpuDone(r) => self.advance_request(r),
        }
    }

    fn bytes(&self, item: u32) -> f64 {
        self.s.costs.image_bytes * f64::from(self.items[item as usize].scale)
    }

    fn item_at(&mut self, position: usize) -> u32 {
        let n = self.items.len();
        while position / n >= self.epoch0 + 2 {
            let next = permutation(n, &mut self.rng);
            self.orders[0] = std::mem::replace(&mut self.orders[1], next);
            self.epoch0 += 1;
        }
        let e = (position / n).saturating_sub(self.epoch0).min(1);
        self.orders[e][position % n]
    }

    fn issue(&mut self) {
        let item = self.item_at(self.position);
        self.position += 1;
        let request = Request {
            item,
            issued: self.now,
            live: true,
            stages: [Stage::Cpu(0.0); 3],
            len: 0,
            next: 0,
            delivering: false,
        };
        let id = match self.free_requests.pop() {
            Some(id) => {
                self.requests[id as usize] = request;
                id
            }
            None => {
                self.requests.push(request);
                (self.requests.len() - 1) as u32
            }
        };
        self.outstanding += 1;
        self.iv.issued += 1;
        self.render_queue.push_back(id);
        self.schedule(
            self.now + 1.0 / self.s.consumer_rate.max(1e-3),
            Event::Issue,
        );
    }

    /// Starts what can start: queued renders on free workers, fetches on free source slots,
    /// prefetches inside the window, the packer.
    fn top_up(&mut self) {
        let workers = self.action.workers(self.s.cores);
        while self.busy_workers < workers {
            let Some(r) = self.render_queue.pop_front() else {
                break;
            };
            self.busy_workers += 1;
            self.take(r);
        }
        let window = self.position + self.action.depth();
        self.prefetch_cursor = self.prefetch_cursor.max(self.position);
        while self.prefetch_cursor < window {
            let item = self.item_at(self.prefetch_cursor);
            self.prefetch_cursor += 1;
            let it = self.items[item as usize];
            if it.encoded.is_none() && it.decoded.is_none() && !it.staged && it.fetch.is_none() {
                let f = self.new_fetch(item, None);
                self.prefetch.push_back(f);
                self.prefetching += 1;
            }
        }
        while self.flowing_or_waiting < self.s.source.concurrency {
            let Some(f) = self
                .demand
                .pop_front()
                .or_else(|| self.prefetch.pop_front())
            else {
                break;
            };
            if self.fetches[f as usize].state != FetchState::Queued {
                continue;
            }
            self.flowing_or_waiting += 1;
            let latency = self.s.source.latency_s * self.rng.range(0.5, 1.5);
            self.fetches[f as usize].state = FetchState::Waiting;
            self.fetches[f as usize].started = self.now;
            self.schedule(self.now + latency, Event::FetchFlowing(f));
        }
        self.start_packing();
    }

    fn new_fetch(&mut self, item: u32, waiter: Option<u32>) -> u32 {
        let fetch = Fetch {
            item,
            started: self.now,
            state: FetchState::Queued,
            prefetched: waiter.is_none(),
            waiters: waiter.into_iter().collect(),
        };
        let id = match self.free_fetches.pop() {
            Some(id) => {
                self.fetches[id as usize] = fetch;
                id
            }
            None => {
                self.fetches.push(fetch);
                (self.fetches.len() - 1) as u32
            }
        };
        self.items[item as usize].fetch = Some(id);
        id
    }

    /// A worker takes request `r`: bytes at hand are processed, else it waits on a fetch.
    fn take(&mut self, r: u32) {
        let item = self.requests[r as usize].item;
        let it = self.items[item as usize];
        if it.encoded.is_some() || it.decoded.is_some() || it.staged {
            self.iv.hits += 1;
            if it.staged {
                self.items[item as usize].staged = false;
                self.staged -= 1;
            }
            self.plan(r, it.encoded);
        } else if let Some(f) = it.fetch {
            self.fetches[f as usize].waiters.push(r);
            if self.fetches[f as usize].state == FetchState::Queued {
                self.demand.push_back(f);
            }
        } else {
            let f = self.new_fetch(item, Some(r));
            self.demand.push_back(f);
        }
    }

    fn fetch_done(&mut self, f: u32) {
        let fetch = std::mem::replace(
            &mut self.fetches[f as usize],
            Fetch {
                item: 0,
                started: 0.0,
                state: FetchState::Queued,
                prefetched: false,
                waiters: Vec::new(),
            },
        );
        self.free_fetches.push(f);
        self.flowing_or_waiting -= 1;
        let item = fetch.item as usize;
        let bytes = self.bytes(fetch.item);
        let took = (self.now - fetch.started).max(1e-9);
        self.iv.fetches += 1;
        self.iv.fetch_s += took;
        self.iv.fetch_bytes_per_s += bytes / took;
        self.items[item].fetch = None;
        // The source's own CPU work (filesystem, block device): on the cores, waited for by no one.
        if let Some(cost) = self.s.costs.source_cpu_s_per_byte {
            self.cpu.push(bytes * cost, SOURCE_WORK);
        }
        // Admitted raw, as the RAM tier admits blocks; the packer compresses them later.
        if self.items[item].decoded.is_none() && self.cache_used + bytes <= self.s.cache_bytes {
            self.cache_used += bytes;
            self.items[item].encoded = Some(0);
            self.to_pack.push_back(fetch.item);
        } else if fetch.waiters.is_empty() {
            self.items[item].staged = true;
            self.staged += 1;
        }
        if fetch.prefetched {
            self.prefetching = self.prefetching.saturating_sub(1);
        }
        for r in fetch.waiters {
            // The fetched bytes are at hand raw: no decompression on this request.
            self.plan(r, None);
        }
    }

    /// Sets request `r`'s stages from where its bytes are (`encoded`: the codec its encoded
    /// bytes are stored with, `None` when raw) and the action in force, then starts them.
    fn plan(&mut self, r: u32, encoded: Option<u8>) {
        let item = self.requests[r as usize].item as usize;
        let scale = f64::from(self.items[item].scale);
        let c = &self.s.costs;
        let gpu = self.s.gpu;
        let gpu_submit = gpu.map_or(0.0, |g| g.submit_cpu_s);
        let (pixels, image) = (c.pixel_bytes * scale, c.image_bytes * scale);
        let mut cpu = 0.0;
        let mut augment = c.augment_s * scale;
        let mut stages = Vec::with_capacity(3);
        let decode_on_gpu = self.action.decode() == Placement::Gpu && gpu.is_some();
        let augment_on_gpu = self.action.augment() == Placement::Gpu && gpu.is_some();
        if let Some(codec) = self.items[item].decoded {
            cpu += c.cache_read(self.stored(pixels, codec, true));
            cpu += c
                .codec(codec)
                .map_or(0.0, |k| pixels / k.decompress_bytes_per_s);
        } else {
            if let Some(k) = encoded {
                cpu += c.cache_read(self.stored(image, k, false));
            }
            cpu += encoded
                .and_then(|k| c.codec(k))
                .map_or(0.0, |k| image / k.decompress_bytes_per_s);
            let freed = self.items[item]
                .encoded
                .map_or(0.0, |e| self.stored(image, e, false));
            let keeps =
                self.action.decoded() && self.cache_used - freed + pixels <= self.s.cache_bytes;
            if decode_on_gpu {
                stages.push(Stage::Cpu(cpu + gpu_submit));
                stages.push(Stage::Gpu(gpu.map_or(0.0, |g| g.decode_s) * scale));
                cpu = 0.0;
            } else if !keeps && !augment_on_gpu {
                // A render that keeps no pixels and augments on the CPU decodes only its crop.
                cpu += c.render() * scale;
                augment = 0.0;
            } else {
                cpu += c.decode_s * scale;
            }
            if keeps {
                self.cache_used += pixels - freed;
                self.items[item].encoded = None;
                self.items[item].decoded = Some(0);
                self.to_pack.push_back(item as u32);
            }
        }
        if augment_on_gpu {
            let g = gpu.map_or(0.0, |g| g.augment_s) * scale;
            match stages.last_mut() {
                Some(Stage::Gpu(w)) if cpu == 0.0 => *w += g,
                _ => {
                    stages.push(Stage::Cpu(cpu + gpu_submit));
                    stages.push(Stage::Gpu(g));
                }
            }
        } else {
            stages.push(Stage::Cpu(cpu + augment));
        }
        let req = &mut self.requests[r as usize];
        req.len = stages.len().min(3) as u8;
        req.next = 0;
        for (slot, stage) in req.stages.iter_mut().zip(stages) {
            *slot = stage;
        }
        self.advance_request(r);
    }

    /// Starts request `r`'s next stage; when none is left, frees its worker and runs its read
    /// path (on the CPU, outside the workers), then delivers it.
    fn advance_request(&mut self, r: u32) {
        let req = &mut self.requests[r as usize];
        if req.next >= req.len {
            if req.delivering {
                self.deliver(r);
            } else {
                req.delivering = true;
                self.busy_workers -= 1;
                self.cpu.push(self.s.costs.deliver(), r);
            }
            return;
        }
        let stage = req.stages[usize::from(req.next)];
        req.next += 1;
        match stage {
            Stage::Cpu(work) => self.cpu.push(work, r),
            Stage::Gpu(work) => {
                let g = self.s.gpu.unwrap_or_default();
                let start = self.gpu_free_at.max(self.now);
                self.gpu_free_at = start + work / (1.0 - g.background).max(0.05);
                self.schedule(self.gpu_free_at + g.overhead_s, Event::GpuDone(r));
            }
        }
    }

    fn cpu_done(&mut self, owner: u32) {
        match owner {
            SOURCE_WORK => {}
            PACKER => self.packed(),
            request => self.advance_request(request),
        }
    }

    /// Bytes the cache holds for `raw` bytes stored with codec option `codec` (of decoded
    /// `pixels`, or of an encoded file).
    fn stored(&self, raw: f64, codec: u8, pixels: bool) -> f64 {
        let ratio = self.s.costs.codec(codec).map_or(1.0, |k| {
            if pixels {
                k.pixel_ratio
            } else {
                k.encoded_ratio
            }
        });
        raw / ratio
    }

    /// The packer, when idle and a codec is in force, takes the next item held raw that the codec
    /// shrinks (the RAM tier leaves incompressible files raw, e.g. JPEGs) and compresses it on
    /// the CPU like any thread.
    fn start_packing(&mut self) {
        let codec = self.action.get(Head::Codec) as u8;
        if self.packing.is_some() || codec == 0 {
            return;
        }
        while let Some(item) = self.to_pack.pop_front() {
            let Some((raw, pixels)) = self.held_raw(item) else {
                continue;
            };
            if self.stored(raw, codec, pixels) >= raw * PACK_GAIN
                || (pixels && !self.packing_pixels_pays(raw, codec))
            {
                continue;
            }
            let speed = self
                .s
                .costs
                .codec(codec)
                .map_or(f64::INFINITY, |k| k.compress_bytes_per_s);
            self.cpu.push(raw / speed, PACKER);
            self.packing = Some((item, pixels, codec));
            return;
        }
    }

    /// Whether the RAM tier would pack `raw` bytes of pixels with codec option `codec`
    /// (`cache::policy::packing_pixels_pays`, with the scenario's decode and unpack costs).
    fn packing_pixels_pays(&self, raw: f64, codec: u8) -> bool {
        let c = &self.s.costs;
        c.codec(codec).is_some_and(|k| {
            packing_pixels_pays(
                c.decode_s * raw / c.pixel_bytes.max(1.0),
                raw / k.decompress_bytes_per_s,
                raw as u64,
                self.stored(raw, codec, true) as u64,
            )
        })
    }

    /// The raw bytes the cache holds of `item` unpacked, and whether they are its pixels.
    fn held_raw(&self, item: u32) -> Option<(f64, bool)> {
        let it = self.items[item as usize];
        let (c, scale) = (&self.s.costs, f64::from(it.scale));
        match (it.decoded, it.encoded) {
            (Some(0), _) => Some((c.pixel_bytes * scale, true)),
            (None, Some(0)) => Some((c.image_bytes * scale, false)),
            _ => None,
        }
    }

    /// The packer's item is compressed: it now holds less of the cache, if still held raw.
    fn packed(&mut self) {
        let Some((item, was_pixels, codec)) = self.packing.take() else {
            return;
        };
        let Some((raw, pixels)) = self.held_raw(item).filter(|(_, p)| *p == was_pixels) else {
            return;
        };
        self.cache_used -= raw - self.stored(raw, codec, pixels);
        let entry = &mut self.items[item as usize];
        if pixels {
            entry.decoded = Some(codec);
        } else {
            entry.encoded = Some(codec);
        }
    }

    fn deliver(&mut self, r: u32) {
        let latency = self.now - self.requests[r as usize].issued;
        self.iv.latencies.push(latency as f32);
        self.iv.delivered += 1;
        self.requests[r as usize].live = false;
        self.free_requests.push(r);
        self.outstanding -= 1;
        if self.blocked {
            self.blocked = false;
            self.issue();
        }
    }

    fn observe(&mut self) {
        let iv = &mut self.iv;
        let cores = self.s.cores as f64 * INTERVAL_S;
        let (p50, p99) = if iv.latencies.is_empty() {
            // Nothing delivered: the oldest request's age says how stuck the pipeline is.
            let live = self.requests.iter().filter(|r| r.live);
            let age = self.now - live.map(|r| r.issued).fold(self.now, f64::min);
            (age, age)
        } else {
            let mut sorted = iv.latencies.clone();
            sorted.sort_by(f32::total_cmp);
            let q = |p: f64| f64::from(sorted[((sorted.len() - 1) as f64 * p).round() as usize]);
            (q(0.5), q(0.99))
        };
        let gpu = self.s.gpu.map(|g| GpuObservation {
            busy: (g.background + (1.0 - g.background) * iv.gpu_busy_s / INTERVAL_S).min(1.0),
            memory_free: g.memory_free,
        });
        let (bw, lat) = if iv.fetches > 0 {
            let n = iv.fetches as f64;
            (iv.fetch_bytes_per_s / n, iv.fetch_s / n)
        } else {
            (self.obs.source_bytes_per_s, self.obs.source_latency_s)
        };
        let staged_bytes = self.staged as f64 * self.s.costs.image_bytes;
        // The working set as the mount's planner knows it: the images read so far in the first
        // pass, every image after it.
        let seen = self.position.min(self.items.len()) as f64;
        self.obs = Observation {
            cpu_busy: (iv.busy_core_s / cores).min(1.0),
            cpu_prepfs: (iv.prepfs_core_s / cores).min(1.0),
            memory_available: (1.0
                - MEMORY_BASELINE
                - (self.cache_used + staged_bytes) / self.s.memory_bytes)
                .clamp(0.0, 1.0),
            gpu,
            source_bytes_per_s: bw,
            source_latency_s: lat,
            request_rate: iv.issued as f64 / INTERVAL_S,
            latency_p50_s: p50,
            latency_p99_s: p99,
            stall_share: (iv.stall_s / INTERVAL_S).min(1.0),
            render_queue: self.render_queue.len() as f64 / self.s.outstanding.max(1) as f64,
            prefetch_queue: self.prefetching as f64 / self.action.depth() as f64,
            cache_fill: (self.cache_used / self.s.cache_bytes.max(1.0)).min(1.0),
            hit_rate: if iv.delivered > 0 {
                (iv.hits as f64 / iv.delivered as f64).min(1.0)
            } else {
                self.obs.hit_rate
            },
            disk_tier: false,
            working_set_fit: fit(self.s.cache_bytes, seen * self.s.costs.image_bytes),
            pixels_fit: fit(self.s.cache_bytes, seen * self.s.costs.pixel_bytes),
            // The mount's planner ends a pass at the next pass's first open.
            working_set_whole: self.position > self.items.len(),
        };
    }
}

/// A shuffled order of `0..n` (Fisher-Yates).
fn permutation(n: usize, rng: &mut Rng) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::action::LOGITS;
    use crate::scheduler::logits::pick;
    use crate::scheduler::sim::calibration::Calibration;

    fn run(scenario: &Scenario, action: Action, steps: usize) -> (f64, Observation) {
        let mut sim = Simulator::new(scenario.clone(), 1);
        let (mut sum, mut n, mut obs) = (0.0, 0, Observation::default());
        for _ in 0..steps {
            obs = sim.step(&action);
            sum += sim
                .last_latencies()
                .iter()
                .map(|l| f64::from(*l))
                .sum::<f64>();
            n += sim.last_latencies().len();
        }
        (sum / n.max(1) as f64, obs)
    }

    fn cpu() -> Action {
        static_cpu(
            &Observation::default(),
            &Action::default(),
            &Mask::default(),
            0,
        )
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let a = Action::default()
            .with(Head::Decoded, 1)
            .with(Head::Codec, 3);
        let s = Scenario::load_shift().with_gpu(true);
        let mut x = Simulator::new(s.clone(), 4);
        let mut y = Simulator::new(s.clone(), 4);
        let mut z = Simulator::new(s, 5);
        let (mut same, mut differs) = (true, false);
        for _ in 0..20 {
            let (ox, oy, oz) = (x.step(&a), y.step(&a), z.step(&a));
            same &= ox == oy && x.last_latencies() == y.last_latencies();
            differs |= ox != oz;
        }
        assert!(same && differs);
    }

    #[test]
    fn more_background_load_raises_latency_on_the_cpu() {
        let mut s = Scenario::cpu_bound();
        let mut latencies = Vec::new();
        for load in [0.0, 0.5, 0.9, 1.0] {
            s.background = vec![(0.0, load)];
            latencies.push(run(&s, cpu(), 20).0);
        }
        assert!(latencies.windows(2).all(|w| w[0] < w[1]), "{latencies:?}");
    }

    #[test]
    fn a_slower_source_delivers_fewer_images_when_nothing_is_cached() {
        let mut s = Scenario::io_bound();
        s.cache_bytes = 0.0;
        let mut rates = Vec::new();
        for bw in [200e6, 50e6, 10e6] {
            s.source.bytes_per_s = bw;
            let (_, obs) = run(&s, cpu().with(Head::Depth, 3), 20);
            assert_eq!(obs.cache_fill, 0.0);
            rates.push(obs.request_rate);
        }
        assert!(rates.windows(2).all(|w| w[0] > w[1]), "{rates:?}");
    }

    #[test]
    fn deeper_prefetch_hides_a_slow_source() {
        let s = Scenario::io_bound();
        let shallow = run(&s, cpu().with(Head::Depth, 0), 50).0;
        let deep = run(&s, cpu().with(Head::Depth, 3), 50).0;
        assert!(deep < shallow, "{deep} vs {shallow}");
    }

    #[test]
    fn a_gpu_relieves_a_saturated_cpu_and_is_masked_without_one() {
        let s = Scenario::cpu_bound().with_gpu(true);
        let gpu = cpu().with(Head::Decode, 1).with(Head::Augment, 1);
        let (on_cpu, busy) = run(&s, cpu(), 20);
        let (on_gpu, relieved) = run(&s, gpu, 20);
        assert!(on_gpu < on_cpu, "{on_gpu} vs {on_cpu}");
        assert!(relieved.cpu_prepfs < busy.cpu_prepfs);
        assert!(relieved.gpu.unwrap().busy > busy.gpu.unwrap().busy);
        assert!(busy.stall_share > 0.0);
        let no_gpu = Scenario::cpu_bound();
        assert_eq!(
            Simulator::new(no_gpu.clone(), 1).mask(),
            Mask::new(false, true)
        );
        assert_eq!(
            run(&no_gpu, gpu, 20).0,
            run(&no_gpu, cpu(), 20).0,
            "gpu clamps to cpu"
        );
    }

    /// The simulator reports the mount's working-set fits: the working set grows with the first
    /// pass's images, then stays the dataset.
    #[test]
    fn the_working_set_fits_follow_the_images_read() {
        let s = Scenario::cpu_bound();
        let mut sim = Simulator::new(s.clone(), 1);
        let items = sim.items.len() as f64;
        let first = sim.step(&cpu());
        let seen = sim.position.min(sim.items.len()) as f64;
        assert!(seen > 0.0 && seen < items, "{seen} of {items}");
        let fits = |obs: &Observation, n: f64| {
            let want = (
                s.cache_bytes / (n * s.costs.image_bytes),
                s.cache_bytes / (n * s.costs.pixel_bytes),
            );
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
            close(obs.working_set_fit, want.0) && close(obs.pixels_fit, want.1)
        };
        assert!(fits(&first, seen), "{first:?}");
        let mut obs = first;
        for _ in 0..100_000 {
            obs = sim.step(&cpu());
            if sim.position > sim.items.len() {
                break;
            }
        }
        assert!(fits(&obs, items), "{obs:?}");
        assert!(obs.working_set_fit < first.working_set_fit);
    }

    #[test]
    fn decoded_caching_skips_decode_once_pixels_fit() {
        let s = Scenario::cpu_bound();
        let (plain, _) = run(&s, cpu(), 40);
        let (decoded, obs) = run(&s, cpu().with(Head::Decoded, 1).with(Head::Codec, 1), 40);
        assert!(decoded < plain, "{decoded} vs {plain}");
        assert!(obs.cache_fill > 0.5 && obs.hit_rate > 0.9, "{obs:?}");
    }

    #[test]
    fn entries_are_admitted_raw_and_packed_later_with_the_codec_then_in_force() {
        let mut s = Scenario::cpu_bound();
        s.cache_bytes = 20e9;
        let keep = cpu().with(Head::Decoded, 1);
        // These photos' pixels are not worth packing: unpacking costs more than the decodes the
        // room would save, and the RAM tier leaves them raw.
        let mut cheap = Simulator::new(s.clone(), 1);
        for _ in 0..20 {
            cheap.step(&keep);
        }
        for _ in 0..40 {
            cheap.step(&keep.with(Head::Codec, 3));
        }
        assert!(cheap.items.iter().all(|i| i.decoded.is_none_or(|k| k == 0)));
        // Images ten times as slow to decode (large PNGs) are.
        s.costs.decode_s *= 10.0;
        let mut sim = Simulator::new(s.clone(), 1);
        for _ in 0..20 {
            sim.step(&keep);
        }
        let raw = sim.cache_used;
        assert!(
            raw > 0.0 && sim.to_pack.len() > 100,
            "{raw} {}",
            sim.to_pack.len()
        );
        for _ in 0..40 {
            sim.step(&keep.with(Head::Codec, 3));
        }
        let packed = sim.items.iter().filter(|i| i.decoded == Some(3)).count();
        assert!(
            packed > 100,
            "pixels held raw under `none` are packed once zstd-3 is in force"
        );
        // What the cache holds, against those bytes unpacked.
        let unpacked: f64 = sim
            .items
            .iter()
            .map(|i| {
                let scale = f64::from(i.scale);
                let pixels = i.decoded.map_or(0.0, |_| s.costs.pixel_bytes * scale);
                pixels + i.encoded.map_or(0.0, |_| s.costs.image_bytes * scale)
            })
            .sum();
        assert!(
            sim.cache_used < unpacked * 0.9,
            "{} vs {unpacked}",
            sim.cache_used
        );
        // JPEG files shrink by about 1%: the packer leaves them raw.
        let mut jpegs = Simulator::new(s, 1);
        for _ in 0..20 {
            jpegs.step(&cpu().with(Head::Codec, 3));
        }
        assert!(jpegs.items.iter().all(|i| i.encoded.is_none_or(|k| k == 0)));
        assert!(jpegs.packing.is_none() && jpegs.cache_used > 0.0);
    }

    #[test]
    fn the_read_path_runs_on_the_cores_outside_the_render_workers() {
        let mut s = Scenario::cpu_bound();
        s.background = vec![(0.0, 0.0)];
        s.costs.render_s = Some(1e-3);
        s.costs.deliver_s = Some(1e-3);
        // One render worker on four idle cores: renders bound the rate, not renders plus reads.
        let one_worker = cpu().with(Head::Workers, 0);
        let (_, obs) = run(&s, one_worker, 20);
        assert!(obs.request_rate > 1.5 / 2e-3, "{obs:?}");
        assert!(obs.request_rate < 1.0 / 1e-3 * 1.05, "{obs:?}");
    }

    #[test]
    fn observations_stay_in_range_on_random_scenarios() {
        let mut rng = Rng::new(9);
        for _ in 0..6 {
            let s = Scenario::random(&mut rng, &Calibration::default());
            let mut sim = Simulator::new(s, rng.next_u64());
            let mask = sim.mask();
            for i in 0..15 {
                let a = pick(&[0.0; LOGITS], &mask, Some(&mut || rng.f64())).unwrap();
                let o = sim.step(&a);
                let shares = [
                    o.cpu_busy,
                    o.cpu_prepfs,
                    o.memory_available,
                    o.stall_share,
                    o.cache_fill,
                    o.hit_rate,
                ];
                assert!(
                    shares.iter().all(|x| (0.0..=1.0).contains(x)),
                    "step {i}: {o:?}"
                );
                assert!(
                    o.latency_p50_s >= 0.0 && o.latency_p99_s >= o.latency_p50_s,
                    "{o:?}"
                );
                assert!(o.request_rate >= 0.0 && o.cpu_busy >= o.cpu_prepfs - 1e-9);
            }
            assert!((sim.now() - 15.0 * INTERVAL_S).abs() < 1e-9);
        }
    }
}
