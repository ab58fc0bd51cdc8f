//! The cluster tier against a cluster in memory whose faults the tests switch: slow, failing,
//! full, or holding damaged values.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;
use crate::cache::codec::Codec;
use crate::cache::metrics::CacheMetrics;
use crate::cache::policy::Fixed;
use crate::memory::MemoryPlan;
use crate::source::Identity;
use crate::telemetry::Telemetry;

#[derive(Default)]
struct Fake {
    values: Mutex<HashMap<String, Vec<u8>>>,
    /// Every request sleeps this long first.
    delay_ms: AtomicU64,
    /// Requests that arrive while this is set wait until `released` is: nothing they hold
    /// finishes meanwhile, however slowly the test's threads start.
    hold: AtomicBool,
    released: AtomicBool,
    /// Every request fails.
    down: AtomicBool,
    /// Writes are refused as full.
    full: AtomicBool,
    requests: AtomicU64,
    replaces: AtomicU64,
}

/// Releases the requests `Fake::hold` holds when dropped, also when a test fails: a failed
/// assertion while they are held would otherwise hang in the tier's drop, which joins the
/// threads they hold.
struct Release<'a>(&'a Fake);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.released.store(true, Ordering::SeqCst);
    }
}

impl Fake {
    fn answer(&self) -> Result<(), RemoteError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if self.hold.load(Ordering::SeqCst) {
            while !self.released.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(Duration::from_millis(self.delay_ms.load(Ordering::SeqCst)));
        if self.down.load(Ordering::SeqCst) {
            return Err(RemoteError::Failed("connection refused".into()));
        }
        Ok(())
    }
}

impl Remote for Fake {
    fn get(&self, keys: &[(&str, usize)]) -> Result<Vec<Vec<u8>>, RemoteError> {
        self.answer()?;
        let values = self.values.lock();
        Ok(keys
            .iter()
            .map(|(key, max)| {
                values
                    .get(*key)
                    .map_or_else(Vec::new, |v| v[..v.len().min(*max)].to_vec())
            })
            .collect())
    }

    fn put(&self, parts: &[(&str, &[u8])], replace: bool) -> Result<Stored, RemoteError> {
        self.answer()?;
        if self.full.load(Ordering::SeqCst) {
            return Err(RemoteError::Full);
        }
        let mut values = self.values.lock();
        if replace {
            self.replaces.fetch_add(1, Ordering::SeqCst);
        } else if parts.iter().any(|(key, _)| values.contains_key(*key)) {
            return Ok(Stored::Present);
        }
        for (key, value) in parts {
            if value.is_empty() {
                values.remove(*key);
            } else {
                values.insert((*key).to_owned(), value.to_vec());
            }
        }
        Ok(Stored::Written)
    }

    fn slots(&self) -> Result<Vec<(u16, u16, String)>, RemoteError> {
        Ok(vec![(0, 16383, "fake:7000".into())])
    }
}

fn tier(fake: &Arc<Fake>, timeout: Duration) -> ClusterTier {
    let budget = MemoryBudget::new(MemoryPlan {
        cache: 64 << 20,
        staging: 0,
        work: 64 << 20,
    });
    let packer = Arc::new(Packer::new(
        Box::new(Fixed(Codec::Lz4)),
        Arc::new(Telemetry::default()),
        Arc::new(CacheMetrics::default()),
    ));
    let config = ClusterConfig {
        urls: vec!["redis://fake:7000".into()],
        auth: None,
        timeout,
        dataset: "test".into(),
        keep_hits: true,
    };
    ClusterTier::start(fake.clone(), &config, budget, packer, Arc::default()).expect("start")
}

fn key(index: usize) -> BlockKey {
    BlockKey {
        identity: Identity {
            dev: 1,
            ino: 2,
            size: 3 << 20,
            mtime_ns: 4,
            ctime_ns: 5,
        },
        index,
    }
}

fn block(seed: u8) -> Arc<Block> {
    Arc::new(Block::new(
        (0..BLOCK_SIZE as usize)
            .map(|i| (i / 512) as u8 ^ seed)
            .collect(),
    ))
}

/// Waits (at most 10 s) until `done` holds.
fn until(what: &str, done: impl Fn() -> bool) {
    until_seen(what, done, |done| *done);
}

/// Waits up to 10 s until what `seen` reads is `done`; fails with `what` and the last reading.
fn until_seen<T: std::fmt::Debug>(what: &str, seen: impl Fn() -> T, done: impl Fn(&T) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = seen();
        if done(&now) {
            return;
        }
        assert!(Instant::now() < deadline, "never: {what}: saw {now:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until the writers have sent what was offered (they never keep a reader waiting).
fn settle(fake: &Fake, requests: u64) {
    until("the writers sent the offer", || {
        fake.requests.load(Ordering::SeqCst) >= requests
    });
    std::thread::sleep(Duration::from_millis(20));
}

fn path() -> Arc<Path> {
    Arc::from(Path::new("train/a.bin"))
}

#[test]
fn a_block_offered_by_one_node_is_found_by_another_and_the_first_writer_wins() {
    let fake = Arc::new(Fake::default());
    let (one, two) = (tier(&fake, DEFAULT_TIMEOUT), tier(&fake, DEFAULT_TIMEOUT));
    assert!(two.get(&key(1), &path(), &(0..10)).is_none(), "nothing yet");
    assert!(one.put(&key(1), &path(), &block(7)));
    settle(&fake, 2);
    let got = two
        .get(&key(1), &path(), &(0..10))
        .expect("stored by the other node");
    assert_eq!(got.data, block(7).data);
    assert!(two.put(&key(1), &path(), &block(9)), "offered");
    settle(&fake, 4);
    let again = one.get(&key(1), &path(), &(0..10)).expect("still there");
    assert_eq!(
        again.data,
        block(7).data,
        "SET NX: the first writer's value stays"
    );
    let m = two.metrics();
    assert_eq!((m.hits.get(), m.misses.get(), m.writes.get()), (1, 1, 0));
    assert_eq!(one.metrics().writes.get(), 1);
    assert!(
        one.metrics().bytes_out.get() < BLOCK_SIZE / 2,
        "stored with the policy's lz4"
    );
    // Another file version, another block: a miss.
    let mut changed = key(1);
    changed.identity.mtime_ns += 1;
    assert!(two.get(&changed, &path(), &(0..10)).is_none());
}

#[test]
fn a_full_block_of_incompressible_bytes_is_stored_in_two_keys_and_read_whole() {
    let fake = Arc::new(Fake::default());
    let tier = tier(&fake, DEFAULT_TIMEOUT);
    let mut rng = fastrand::Rng::with_seed(3);
    let data: Vec<u8> = (0..BLOCK_SIZE).map(|_| rng.u8(..)).collect();
    assert!(tier.put(&key(0), &path(), &Arc::new(Block::new(data.clone()))));
    settle(&fake, 1);
    let sizes: Vec<(bool, usize)> = fake
        .values
        .lock()
        .iter()
        .map(|(k, v)| (k.ends_with(":t"), v.len()))
        .collect();
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    assert!(sizes.contains(&(false, (1 << 20) - 64)), "{sizes:?}");
    let got = tier.get(&key(0), &path(), &(0..10)).expect("read whole");
    assert_eq!(got.data[..], data[..]);
    // Its tail lost: damaged, a miss.
    fake.values.lock().retain(|key, _| !key.ends_with(":t"));
    assert!(tier.get(&key(0), &path(), &(0..10)).is_none());
    assert_eq!(tier.metrics().corrupt.get(), 1);
    // A stale tail beside a value stored whole (another node wrote it compressed) spoils it
    // until the replacement, which removes the tail.
    let compressible = block(5);
    let name = record::key_for(record::dataset_id("test"), &path(), &key(0));
    let whole = record::encode(&name, &compressible.data, Codec::Lz4);
    fake.values.lock().insert(name.clone(), whole);
    fake.values
        .lock()
        .insert(record::tail_key(&name), b"stale".to_vec());
    assert!(tier.get(&key(0), &path(), &(0..10)).is_none());
    assert_eq!(tier.metrics().corrupt.get(), 2);
    assert!(tier.put(&key(0), &path(), &compressible));
    settle(&fake, 5);
    assert!(!fake.values.lock().contains_key(&record::tail_key(&name)));
    let got = tier.get(&key(0), &path(), &(0..10)).expect("whole again");
    assert_eq!(got.data, compressible.data);
}

#[test]
fn a_slow_node_never_keeps_a_reader_past_the_timeout_and_is_then_skipped() {
    let fake = Arc::new(Fake::default());
    let tier = tier(&fake, Duration::from_millis(50));
    assert!(tier.put(&key(0), &path(), &block(1)));
    settle(&fake, 1);
    fake.delay_ms.store(3_000, Ordering::SeqCst);
    for late in 1..=health::LATE_TO_FAIL {
        let asked = Instant::now();
        assert!(tier.get(&key(0), &path(), &(0..10)).is_none());
        assert!(
            asked.elapsed() < Duration::from_millis(1_500),
            "waited {:?} for a node that takes 3 s",
            asked.elapsed()
        );
        assert_eq!(tier.metrics().timeouts.get(), u64::from(late));
    }
    // Backing off: the next lookups and offers are not sent at all.
    let sent = fake.requests.load(Ordering::SeqCst);
    for i in 0..20 {
        assert!(tier.get(&key(i % 3), &path(), &(0..10)).is_none());
    }
    assert!(!tier.put(&key(2), &path(), &block(2)));
    assert_eq!(
        fake.requests.load(Ordering::SeqCst),
        sent,
        "no request to a node backing off"
    );
    assert_eq!(tier.metrics().skipped.get(), 21);
    assert_eq!(tier.nodes(), (1, 1));
    assert!(!tier.has_room(BLOCK_SIZE), "no node to offer blocks to");
}

/// Prefetch's lookups wait on threads of their own: however many it makes at once, a reader's
/// lookup is sent and answered; those beyond prefetch's threads and queue are left to the
/// readers at once.
#[test]
fn lookups_ahead_of_the_readers_never_take_the_readers_threads() {
    let fake = Arc::new(Fake::default());
    // Longer than `until` waits: a queued lookup ahead that timed out would count as late too,
    // and the refusals would overshoot what the test waits for.
    let tier = Arc::new(tier(&fake, Duration::from_secs(60)));
    let release = Release(&fake);
    assert!(tier.put(&key(0), &path(), &block(1)));
    settle(&fake, 1);
    // Prefetch's lookups are held until the reader's was answered: a delay instead (200 ms)
    // let a slow start of the asking threads free prefetch's thread before all had asked, and
    // fewer were refused than the test waited for.
    fake.hold.store(true, Ordering::SeqCst);
    let ask = || {
        let tier = tier.clone();
        std::thread::spawn(move || tier.lookup(&key(0), &path(), &(0..10), Asker::Prefetch))
    };
    // Prefetch's threads are held first, so the rest find them busy: asked all at once, the
    // queue could fill before a worker took its first job, and one more was refused than the
    // test counts (reproduced 9 times in 12 on one loaded core).
    let mut ahead: Vec<_> = (0..AHEAD_THREADS).map(|_| ask()).collect();
    until("prefetch's threads busy", || {
        fake.requests.load(Ordering::SeqCst) == 1 + AHEAD_THREADS as u64
    });
    // More than the readers' threads and queue would hold, too.
    let asked = LOOKUP_THREADS + LOOKUP_QUEUE + 1;
    ahead.extend((AHEAD_THREADS..asked).map(|_| ask()));
    let refused = (asked - AHEAD_THREADS - AHEAD_QUEUE) as u64;
    // (requests, refused, skipped) as the tier and the fake count them now.
    let seen = || {
        (
            fake.requests.load(Ordering::SeqCst),
            tier.metrics().ahead_late.get(),
            tier.metrics().skipped.get(),
        )
    };
    let want = format!(
        "prefetch's threads busy and the rest refused: (requests, refused, skipped), want \
         requests {} and {refused} refused",
        1 + AHEAD_THREADS
    );
    until_seen(&want, seen, |now| {
        now.0 == 1 + AHEAD_THREADS as u64 && now.1 == refused
    });
    fake.hold.store(false, Ordering::SeqCst);
    let (found, late) = tier.lookup(&key(0), &path(), &(0..10), Asker::Reader);
    assert_eq!(found.map(|b| b.data.clone()), Some(block(1).data.clone()));
    assert!(!late);
    drop(release);
    let answers: Vec<_> = ahead
        .into_iter()
        .map(|t| t.join().expect("a lookup panicked"))
        .collect();
    let found = answers.iter().filter(|(b, _)| b.is_some()).count();
    assert_eq!(
        found,
        AHEAD_THREADS + AHEAD_QUEUE,
        "those sent were answered"
    );
    assert!(answers.iter().all(|(b, late)| b.is_some() != *late));
    assert_eq!(tier.metrics().ahead_late.get(), refused);
    assert_eq!(
        tier.metrics().dropped.get(),
        0,
        "no reader's lookup dropped"
    );
    assert_eq!(tier.metrics().timeouts.get(), 0);
}

/// A prefetch lookup past the timeout leaves its block to the readers; it waited behind
/// prefetch's own queue, so it never makes the node back off (a reader's lateness does).
#[test]
fn late_lookups_ahead_of_the_readers_never_make_the_node_back_off() {
    let fake = Arc::new(Fake::default());
    let tier = tier(&fake, Duration::from_millis(20));
    assert!(tier.put(&key(0), &path(), &block(1)));
    settle(&fake, 1);
    fake.delay_ms.store(300, Ordering::SeqCst);
    for _ in 0..=health::LATE_TO_FAIL {
        let (found, late) = tier.lookup(&key(0), &path(), &(0..10), Asker::Prefetch);
        assert!(found.is_none() && late);
    }
    assert_eq!(tier.metrics().timeouts.get(), 0);
    assert_eq!(
        tier.metrics().ahead_late.get(),
        u64::from(health::LATE_TO_FAIL) + 1
    );
    assert_eq!(tier.nodes(), (1, 0), "no backoff");
    fake.delay_ms.store(0, Ordering::SeqCst);
    let (found, _) = tier.lookup(&key(0), &path(), &(0..10), Asker::Reader);
    assert!(
        found.is_some(),
        "a reader's lookup is still sent and answered"
    );
}

#[test]
fn a_failing_node_costs_misses_and_is_used_again_once_it_answers() {
    let fake = Arc::new(Fake::default());
    let tier = tier(&fake, DEFAULT_TIMEOUT);
    assert!(tier.put(&key(0), &path(), &block(1)));
    settle(&fake, 1);
    fake.down.store(true, Ordering::SeqCst);
    assert!(tier.get(&key(0), &path(), &(0..10)).is_none());
    assert_eq!(tier.metrics().errors.get(), 1);
    fake.down.store(false, Ordering::SeqCst);
    // The backoff ends (at most MAX_BACKOFF plus its jitter); the probe finds the node back.
    let deadline = Instant::now() + health::MAX_BACKOFF * 2;
    while tier.get(&key(0), &path(), &(0..10)).is_none() {
        assert!(Instant::now() < deadline, "the node was never probed again");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(tier.nodes(), (1, 0));
}

#[test]
fn a_damaged_value_is_a_miss_and_the_next_offer_replaces_it() {
    let fake = Arc::new(Fake::default());
    let tier = tier(&fake, DEFAULT_TIMEOUT);
    assert!(tier.put(&key(0), &path(), &block(3)));
    settle(&fake, 1);
    for value in fake.values.lock().values_mut() {
        let n = value.len();
        value.truncate(n / 2);
    }
    assert!(tier.get(&key(0), &path(), &(0..10)).is_none(), "truncated");
    assert_eq!(tier.metrics().corrupt.get(), 1);
    assert!(tier.put(&key(0), &path(), &block(3)));
    settle(&fake, 3);
    assert_eq!(
        fake.replaces.load(Ordering::SeqCst),
        1,
        "overwritten, not SET NX"
    );
    let got = tier.get(&key(0), &path(), &(0..10)).expect("intact again");
    assert_eq!(got.data, block(3).data);
    // A value of another block under this key is caught too.
    let foreign = fake
        .values
        .lock()
        .values()
        .next()
        .cloned()
        .expect("a value");
    fake.values.lock().clear();
    let other = record::key_for(record::dataset_id("test"), &path(), &key(1));
    fake.values.lock().insert(other, foreign);
    assert!(tier.get(&key(1), &path(), &(0..10)).is_none());
    assert_eq!(tier.metrics().corrupt.get(), 2);
}

#[test]
fn a_full_cluster_is_counted_and_offered_nothing_more() {
    let fake = Arc::new(Fake::default());
    let tier = tier(&fake, DEFAULT_TIMEOUT);
    // The slot map is read by the tier's own thread: wait for it.
    until("a slot map", || tier.nodes().0 > 0);
    let before = fake.requests.load(Ordering::SeqCst);
    fake.full.store(true, Ordering::SeqCst);
    assert!(tier.put(&key(0), &path(), &block(1)), "offered");
    settle(&fake, before + 1);
    assert_eq!(tier.metrics().refused.get(), 1);
    assert!(!tier.has_room(BLOCK_SIZE));
    assert!(
        !tier.put(&key(1), &path(), &block(1)),
        "not offered to a full node"
    );
    assert_eq!(tier.metrics().refused.get(), 2);
    assert_eq!(fake.requests.load(Ordering::SeqCst), before + 1);
    // Reads go on.
    assert!(tier.get(&key(0), &path(), &(0..10)).is_none());
    assert_eq!(tier.metrics().errors.get(), 0);
}

#[test]
fn every_figure_of_the_tier_has_a_row_in_docs_stats() {
    let mut samples = crate::metrics::Samples::default();
    ClusterMetrics::default().samples((3, 1), &mut samples);
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/STATS.md"))
        .expect("docs/STATS.md");
    for s in samples.iter() {
        let m = s.metric;
        assert!(
            docs.lines()
                .any(|l| l.starts_with(&format!("| `{}` | `{}` |", m.path, m.prom))),
            "docs/STATS.md has no row for {} ({})",
            m.path,
            m.prom
        );
    }
}
