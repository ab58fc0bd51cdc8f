//! `Packer`: the background thread that compresses cached blocks, so reads never wait on it.
//!
//! Owns: the codec policy in force, the queues of blocks to pack (raw blocks of compressible
//! files) and to upgrade (blocks packed with a weaker codec than the policy's best), and the
//! thread that works through them. New blocks are admitted raw and served at once; the packer
//! compresses them as soon as the policy allows (not while the CPU is saturated), and the
//! budget each packing frees admits more data. Must never run on a request path and never hold a
//! block's lock while compressing; queues are bounded, and a block that finds them full simply
//! stays as it is.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::file::{PackOutcome, RamFile};
use crate::cache::codec::Codec;
use crate::cache::metrics::CacheMetrics;
use crate::cache::policy::{Choice, CodecPolicy, Signals, strength};
use crate::telemetry::Telemetry;

/// Blocks waiting in each queue at most: 64k entries of 16 bytes, up to 64 GiB of blocks.
const QUEUE_CAPACITY: usize = 1 << 16;
/// How long the packer waits before asking the policy again when it said "not now".
const RETRY: Duration = Duration::from_millis(200);

type Job = (Weak<RamFile>, usize);

#[derive(Default)]
struct Queues {
    fresh: VecDeque<Job>,
    upgrades: VecDeque<Job>,
}

/// The codec policy and the packing queues of one cache.
pub struct Packer {
    policy: Box<dyn CodecPolicy>,
    telemetry: Arc<Telemetry>,
    metrics: Arc<CacheMetrics>,
    queues: Mutex<Queues>,
    wake: Condvar,
    stop: AtomicBool,
    last: Mutex<Choice>,
}

impl Packer {
    /// A packer deciding with `policy`.
    pub fn new(
        policy: Box<dyn CodecPolicy>,
        telemetry: Arc<Telemetry>,
        metrics: Arc<CacheMetrics>,
    ) -> Packer {
        // Until the packer's first decision, stats show the one taken on the signals of now.
        let last = policy.choose(&Signals {
            cpu_idle: telemetry.cpu_idle(),
            source_bytes_per_s: None,
        });
        Packer {
            policy,
            telemetry,
            metrics,
            queues: Mutex::new(Queues::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            last: Mutex::new(last),
        }
    }

    /// Whether this policy ever compresses (with `--codec none` files are never probed).
    pub fn enabled(&self) -> bool {
        self.policy.target() != Codec::None
    }

    /// The strongest codec the policy ever chooses (what packed blocks are upgraded to).
    pub fn target(&self) -> Codec {
        self.policy.target()
    }

    /// The policy's decision for blocks packed now (recorded for stats).
    pub fn choose(&self) -> Choice {
        let signals = Signals {
            cpu_idle: self.telemetry.cpu_idle(),
            source_bytes_per_s: self.metrics.source_bytes_per_s(),
        };
        let choice = self.policy.choose(&signals);
        *self.last.lock() = choice;
        choice
    }

    /// The decision most recently taken (for stats; takes no new one).
    pub fn last_choice(&self) -> Choice {
        *self.last.lock()
    }

    /// Queues raw block `index` of `file` for packing; false (it stays raw) if the queue is full.
    pub fn enqueue(&self, file: &Arc<RamFile>, index: usize) -> bool {
        let mut queues = self.queues.lock();
        if queues.fresh.len() >= QUEUE_CAPACITY {
            return false;
        }
        queues.fresh.push_back((Arc::downgrade(file), index));
        self.wake.notify_one();
        true
    }

    /// Blocks waiting to be packed, and packed blocks waiting for an idle CPU to be repacked
    /// with the policy's best codec.
    pub fn queued(&self) -> (usize, usize) {
        let queues = self.queues.lock();
        (queues.fresh.len(), queues.upgrades.len())
    }

    /// Works through the queues until `stop`; the body of the packer thread.
    pub fn run(&self) {
        while !self.stop.load(Ordering::Acquire) {
            let choice = self.choose();
            let target = self.policy.target();
            let job = {
                let mut queues = self.queues.lock();
                let job = if choice.codec == Codec::None {
                    None
                } else if strength(choice.codec) >= strength(target) {
                    queues
                        .fresh
                        .pop_front()
                        .or_else(|| queues.upgrades.pop_front())
                } else {
                    queues.fresh.pop_front()
                };
                if job.is_none() {
                    self.wake.wait_for(&mut queues, RETRY);
                }
                job
            };
            let Some((file, index)) = job else { continue };
            let Some(file) = file.upgrade() else { continue };
            let upgradable = match file.pack(index, choice.codec) {
                PackOutcome::Packed(codec) => strength(codec) < strength(target),
                PackOutcome::NoGain => strength(choice.codec) < strength(target),
                PackOutcome::Unchanged => false,
            };
            if upgradable {
                let mut queues = self.queues.lock();
                if queues.upgrades.len() < QUEUE_CAPACITY {
                    queues.upgrades.push_back((Arc::downgrade(&file), index));
                }
            }
        }
    }

    /// Asks the thread running `run` to return.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _queues = self.queues.lock();
        self.wake.notify_all();
    }
}
