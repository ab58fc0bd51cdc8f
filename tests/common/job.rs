//! A data-parallel training job's reads, for the cluster tier's tests and benchmark: a dataset
//! written once into a shared source, and epochs in which node `n` of N mounts reads its
//! DistributedSampler share (every Nth file of the epoch's reshuffled order, from `n`), all nodes
//! at once, each file compared with the source's bytes. Test code: it panics on what it cannot go
//! on without, and reports read failures for the caller to assert on.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{TestMount, date_back, pattern};

/// `files` files of `len` bytes under `train/` in `dir`, dated back (so they are settled and
/// cacheable); their names and bytes.
pub fn dataset(dir: &Path, files: usize, len: usize) -> BTreeMap<String, Vec<u8>> {
    let files: BTreeMap<String, Vec<u8>> = (0..files)
        .map(|i| (format!("train/{i:05}.bin"), pattern(len, i as u64)))
        .collect();
    std::fs::create_dir_all(dir.join("train")).expect("mkdir train");
    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes).expect("write a file");
    }
    date_back(dir);
    files
}

/// What one epoch cost.
#[derive(Debug, Default)]
pub struct Epoch {
    /// Reads that failed, or returned other bytes than the source's.
    pub failures: Vec<String>,
    /// The longest read of one whole file.
    pub slowest: Duration,
}

/// Epoch `epoch` of a data-parallel job: the file order reshuffled with the epoch's seed, node
/// `n` of `mounts` reading every `mounts.len()`th file from `n` (DistributedSampler's share), all
/// nodes at once. `read` counts files read so far (all nodes), for a test to act mid-epoch.
pub fn run_epoch(
    mounts: &[TestMount],
    files: &BTreeMap<String, Vec<u8>>,
    epoch: u64,
    read: &AtomicUsize,
) -> Epoch {
    let mut order: Vec<&String> = files.keys().collect();
    fastrand::Rng::with_seed(epoch).shuffle(&mut order);
    let results: Vec<Epoch> = std::thread::scope(|s| {
        let nodes: Vec<_> = (0..mounts.len())
            .map(|n| {
                let (order, mount) = (&order, &mounts[n]);
                s.spawn(move || {
                    let mut out = Epoch::default();
                    for name in order.iter().skip(n).step_by(mounts.len()) {
                        let started = Instant::now();
                        match std::fs::read(mount.m(name)) {
                            Ok(bytes) if bytes == files[*name] => {}
                            Ok(_) => out.failures.push(format!("node {n}: {name}: other bytes")),
                            Err(e) => out.failures.push(format!("node {n}: {name}: {e}")),
                        }
                        out.slowest = out.slowest.max(started.elapsed());
                        read.fetch_add(1, Ordering::SeqCst);
                    }
                    out
                })
            })
            .collect();
        nodes
            .into_iter()
            .map(|h| h.join().expect("reader"))
            .collect()
    });
    let mut all = Epoch::default();
    for r in results {
        all.failures.extend(r.failures);
        all.slowest = all.slowest.max(r.slowest);
    }
    all
}

/// `path` (a dotted stats.json path) summed over `mounts`.
pub fn total(mounts: &[TestMount], path: &str) -> u64 {
    mounts
        .iter()
        .map(|m| {
            let stats = m.stats();
            path.split('.')
                .fold(&stats, |v, k| &v[k])
                .as_u64()
                .unwrap_or_else(|| panic!("{path} in stats.json"))
        })
        .sum()
}
