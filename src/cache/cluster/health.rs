//! `Health`: which cluster node owns each hash slot, and which nodes are failing or full, so a
//! dead or full node costs one failed request per backoff period instead of one per block.
//!
//! Owns: the slot map as last read from the cluster (`CLUSTER SLOTS`, refreshed by the tier's map
//! thread), each node's backoff after failures (doubling from `MIN_BACKOFF` to `MAX_BACKOFF`, one
//! probe request let through when it ends) and whether it refused a write as full. Reads are
//! atomic loads, no lock: every lookup asks. Before the first map, the whole cluster counts as one
//! node. Must never block, and never decide what a request does beyond "send it or not".

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Redis Cluster's hash slots.
pub const SLOTS: usize = 16384;
/// Nodes tracked one by one; a larger cluster's further nodes share the last entry. Redis
/// recommends at most about 1,000 nodes; a training job's cluster has its nodes' count.
pub const MAX_NODES: usize = 255;
/// First backoff of a node that failed: long enough that a dead node's blocks stop costing a
/// request each, short enough that a restarted node is used again within a second or two.
pub const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// Longest backoff: a node back after a long outage is probed at least this often.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// Lookups in a row a node may leave unanswered past the timeout before it backs off: one late
/// answer is a busy link (a block takes 8 ms on 1 Gbit/s, and readers queue behind each other),
/// three in a row a node that is not answering.
pub const LATE_TO_FAIL: u32 = 3;
/// How long a node that refused a write as full gets no more writes: a noeviction cluster frees
/// memory only when someone deletes keys, so asking it again soon only costs requests.
pub const FULL_PAUSE: Duration = Duration::from_secs(30);

/// Slot owner "not known yet".
const UNKNOWN: u8 = u8::MAX;

#[derive(Default)]
struct Node {
    /// Failures in a row (0: healthy).
    failures: AtomicU32,
    /// Lookups in a row not answered in time (each answer resets it).
    late: AtomicU32,
    /// Milliseconds since `Health::epoch` before which requests skip this node.
    down_until: AtomicU64,
    /// Milliseconds since `Health::epoch` before which writes skip this node.
    full_until: AtomicU64,
}

/// The map and the nodes' states.
pub struct Health {
    epoch: Instant,
    owners: Box<[AtomicU8]>,
    nodes: Box<[Node]>,
    known: AtomicU32,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            epoch: Instant::now(),
            owners: (0..SLOTS).map(|_| AtomicU8::new(UNKNOWN)).collect(),
            nodes: (0..=MAX_NODES).map(|_| Node::default()).collect(),
            known: AtomicU32::new(0),
        }
    }
}

/// The hash slot of `key`, as Redis Cluster computes it: CRC16-XMODEM mod 16384 of its hash tag
/// (what is between its first `{` and the next `}`, when not empty), else of the whole key.
pub fn slot(key: &str) -> u16 {
    let tag = key
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(tag, _)| tag)
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS as u16
}

impl Health {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn node(&self, slot: u16) -> &Node {
        let owner = self.owners[usize::from(slot) % SLOTS].load(Ordering::Relaxed);
        // Unknown owner: the whole cluster is one node (the last entry).
        &self.nodes[usize::from(owner).min(MAX_NODES)]
    }

    /// Records the slot map: `(first, last, node)` ranges, nodes numbered from 0. A node's state
    /// stays with its number, which the caller keeps stable across refreshes.
    pub fn set_map(&self, ranges: &[(u16, u16, usize)], nodes: usize) {
        for &(first, last, node) in ranges {
            let owner = node.min(MAX_NODES - 1) as u8;
            for s in first..=last.min(SLOTS as u16 - 1) {
                self.owners[usize::from(s)].store(owner, Ordering::Relaxed);
            }
        }
        self.known.store(nodes as u32, Ordering::Relaxed);
    }

    /// Whether a request for `slot` may be sent now. A node whose backoff has ended lets one
    /// request through (the probe) and stays skipped until it answers.
    pub fn allows(&self, slot: u16) -> bool {
        let node = self.node(slot);
        if node.failures.load(Ordering::Relaxed) == 0 {
            return true;
        }
        let now = self.now();
        let until = node.down_until.load(Ordering::Relaxed);
        // Backoff over: the first to move the deadline on is the probe.
        now >= until
            && node
                .down_until
                .compare_exchange(
                    until,
                    now + MIN_BACKOFF.as_millis() as u64,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// A request for `slot` failed: its node backs off, twice as long as last time.
    /// True when the node was healthy until now (worth one warning).
    pub fn failed(&self, slot: u16) -> bool {
        let node = self.node(slot);
        let failures = node.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let backoff = MIN_BACKOFF
            .saturating_mul(1 << (failures - 1).min(8))
            .min(MAX_BACKOFF);
        // Up to a quarter more, so that nodes that failed together are not probed together.
        let jitter = fastrand::u64(0..=backoff.as_millis() as u64 / 4);
        node.down_until.store(
            self.now() + backoff.as_millis() as u64 + jitter,
            Ordering::Relaxed,
        );
        failures == 1
    }

    /// A lookup for `slot` was not answered in time: the node backs off (as `failed`) once
    /// `LATE_TO_FAIL` in a row were. True when that made a healthy node back off.
    pub fn late(&self, slot: u16) -> bool {
        let node = self.node(slot);
        if node.late.fetch_add(1, Ordering::AcqRel) + 1 < LATE_TO_FAIL {
            return false;
        }
        node.late.store(0, Ordering::Relaxed);
        self.failed(slot)
    }

    /// A request for `slot` was answered. True when its node had been failing (worth a line).
    pub fn answered(&self, slot: u16) -> bool {
        let node = self.node(slot);
        if node.late.load(Ordering::Relaxed) > 0 {
            node.late.store(0, Ordering::Relaxed);
        }
        node.failures.load(Ordering::Relaxed) > 0 && node.failures.swap(0, Ordering::AcqRel) > 0
    }

    /// Whether the node of `slot` answered its last request (writes never probe a failing node).
    pub fn healthy(&self, slot: u16) -> bool {
        self.node(slot).failures.load(Ordering::Relaxed) == 0
    }

    /// The node of `slot` refused a write: full.
    pub fn full(&self, slot: u16) {
        self.node(slot).full_until.store(
            self.now() + FULL_PAUSE.as_millis() as u64,
            Ordering::Relaxed,
        );
    }

    /// Whether the node of `slot` takes writes (not known to be full).
    pub fn takes(&self, slot: u16) -> bool {
        self.now() >= self.node(slot).full_until.load(Ordering::Relaxed)
    }

    /// Whether some node may take a write now.
    pub fn has_room(&self) -> bool {
        let now = self.now();
        let known = (self.known.load(Ordering::Relaxed) as usize).min(MAX_NODES);
        let usable = |n: &Node| {
            now >= n.full_until.load(Ordering::Relaxed) && n.failures.load(Ordering::Relaxed) == 0
        };
        if known == 0 {
            return usable(&self.nodes[MAX_NODES]);
        }
        self.nodes[..known].iter().any(usable)
    }

    /// `(nodes known, nodes backing off now)`.
    pub fn counts(&self) -> (usize, usize) {
        let known = (self.known.load(Ordering::Relaxed) as usize).min(MAX_NODES);
        let failing = |n: &Node| n.failures.load(Ordering::Relaxed) > 0;
        let down = if known == 0 {
            usize::from(failing(&self.nodes[MAX_NODES]))
        } else {
            self.nodes[..known].iter().filter(|n| failing(n)).count()
        };
        (known, down)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_ones_redis_computes() {
        // Values from the Redis Cluster specification's CRC16 and `CLUSTER KEYSLOT`.
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
            0x31C3
        );
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        // Hash tags, from the specification's examples.
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(
            slot("foo{}{bar}"),
            slot("foo{}{bar}"),
            "empty tag: the whole key"
        );
        assert_ne!(slot("foo{}{bar}"), slot("bar"));
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
    }

    #[test]
    fn a_failed_node_is_skipped_until_its_backoff_ends_then_probed_once() {
        let health = Health::default();
        health.set_map(&[(0, 8191, 0), (8192, 16383, 1)], 2);
        assert!(health.allows(10) && health.allows(9000));
        assert!(health.failed(10), "first failure of a healthy node");
        assert!(!health.failed(11), "the same node again");
        assert!(
            !health.allows(10) && !health.allows(8000),
            "every slot of node 0 is skipped"
        );
        assert!(health.allows(9000), "node 1 is not");
        assert_eq!(health.counts(), (2, 1));
        assert!(health.has_room(), "node 1 takes writes");
        // Backoff over: exactly one probe goes through.
        health.nodes[0].down_until.store(0, Ordering::Relaxed);
        assert!(health.allows(10));
        assert!(!health.allows(10), "only one probe at a time");
        assert!(health.answered(10), "the probe's answer ends the backoff");
        assert!(health.allows(10) && health.allows(10));
        assert!(!health.answered(10));
    }

    #[test]
    fn a_late_answer_is_a_busy_link_and_three_in_a_row_a_node_not_answering() {
        let health = Health::default();
        health.set_map(&[(0, 16383, 0)], 1);
        assert!(!health.late(5) && !health.late(5));
        assert!(!health.answered(5), "an answer in between: not failing");
        assert!(!health.late(5) && !health.late(5));
        assert!(health.allows(5), "two late answers in a row: still asked");
        assert!(health.late(5), "the third backs it off");
        assert!(!health.allows(5));
    }

    #[test]
    fn backoff_doubles_up_to_its_limit() {
        let health = Health::default();
        let mut last = 0;
        for _ in 0..12 {
            health.failed(0);
            let wait = health.nodes[MAX_NODES].down_until.load(Ordering::Relaxed) - health.now();
            assert!(wait <= (MAX_BACKOFF.as_millis() as u64) * 5 / 4 + 1);
            last = wait;
        }
        assert!(
            last >= MAX_BACKOFF.as_millis() as u64 - 10,
            "reached the limit: {last}"
        );
    }

    #[test]
    fn a_full_node_takes_no_writes_and_a_full_cluster_has_no_room() {
        let health = Health::default();
        assert!(health.has_room(), "nothing known: try");
        health.set_map(&[(0, 8191, 0), (8192, 16383, 1)], 2);
        health.full(0);
        assert!(!health.takes(0) && health.takes(9000));
        assert!(health.has_room());
        health.full(9000);
        assert!(!health.has_room());
    }
}
