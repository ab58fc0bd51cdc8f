//! The cluster tier's benchmark (issue 36): N = 3 nodes, each a network namespace with a shaped
//! veth, one Redis Cluster node and one prepfs mount in its own memory cgroup, over one shared slow
//! source (slowfs: a latency per request and one bandwidth cap for all nodes, direct I/O so that
//! no node reads from another's page cache). Each node reads its DistributedSampler share of the
//! reshuffled dataset per epoch, one reader per node. Independent per-node caches (the same mounts
//! without `--cluster`) run side by side, interleaved, in the same run; rounds give medians.
//!
//! Scenarios: `fits` (the cluster holds the dataset: ΣC >= D), `half` (it holds about half), and
//! `ram>share` (each node's RAM tier holds more than its share of an epoch: `--cluster-keep-hits`
//! on against off). Reported per scenario and setup: epoch 1 and epochs 2+ wall time, source
//! bytes per epoch 2+ (all nodes) against the bound 1.05 x max(0, D - ΣC), ΣC being what the
//! cluster stored, and cluster hits.
//!
//! `cargo bench --bench cluster -- [--files N] [--epochs E] [--rounds R] [--mbps M]
//! [--latency-ms MS] [--link-mbit M] [--cluster-timeout T] [--scenarios fits,half,ram>share]`;
//! root only (namespaces, cgroups, FUSE). Bench tooling, never part of prepfs.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "epochs/slowfs.rs"]
mod slowfs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Link};
use common::job::{self, run_epoch, total};
use common::{MemoryCgroup, TestMount};

/// Bytes of one dataset file: a block and a half, as a mid-size image shard's tail would be.
const FILE_LEN: usize = 3 << 19;
/// The cluster value's header (see src/cache/cluster/record.rs): stored bytes less this per value
/// are dataset bytes.
const HEADER: u64 = 28;

struct Options {
    files: usize,
    epochs: u64,
    rounds: usize,
    mbps: u64,
    latency_ms: u64,
    /// Each node's link, Mbit/s.
    link_mbit: u32,
    /// `--cluster-timeout`, when not prepfs's default.
    timeout: Option<String>,
    /// Scenarios to run (all when empty).
    only: Vec<String>,
}

/// How the nodes cache.
#[derive(Clone, Copy, PartialEq)]
enum Setup {
    /// Each node its own RAM tier, no cluster.
    Independent,
    /// The cluster tier, keeping cluster hits in RAM or not.
    Cluster { keep_hits: bool },
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Independent => "independent",
            Setup::Cluster { keep_hits: true } => "cluster",
            Setup::Cluster { keep_hits: false } => "cluster, keep-hits off",
        }
    }
}

struct Scenario {
    name: &'static str,
    /// Each Redis node's maxmemory.
    maxmemory: u64,
    /// Each mount's --cache-mem.
    cache_mem: u64,
    setups: [Setup; 2],
}

/// One run: per epoch, wall seconds, source bytes (all nodes) and cluster hits.
struct Run {
    epochs: Vec<(f64, u64, u64)>,
    /// Readers' lookups that timed out, all epochs.
    timeouts: u64,
    /// Prefetch's lookups left to the readers (late or no prefetch lookup thread), all epochs.
    ahead_late: u64,
    /// What the cluster stored after epoch 1 (dataset bytes), 0 without one.
    stored: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve-slowfs") {
        if let Err(e) = slowfs::main_from_args(&args[1..]) {
            eprintln!("slowfs: {e}");
            std::process::exit(1);
        }
        return;
    }
    let text = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let value = |flag: &str, default: u64| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    let opts = Options {
        files: value("--files", 128) as usize,
        epochs: value("--epochs", 4),
        rounds: value("--rounds", 3) as usize,
        mbps: value("--mbps", 60),
        latency_ms: value("--latency-ms", 2),
        link_mbit: value("--link-mbit", 1000) as u32,
        timeout: text("--cluster-timeout"),
        only: text("--scenarios")
            .map_or_else(Vec::new, |s| s.split(',').map(str::to_owned).collect()),
    };
    let work = tempfile::Builder::new()
        .prefix("prepfs-cluster-bench-")
        .tempdir_in("/var/tmp")
        .expect("scratch dir");
    let files = job::dataset(&work.path().join("data"), opts.files, FILE_LEN);
    let d = (opts.files * FILE_LEN) as u64;
    let slow = SlowMount::start(&work.path().join("data"), &work.path().join("slow"), &opts);
    eprintln!(
        "cluster bench: {} files, D = {} MiB, 3 nodes, slowfs {} MB/s shared, {} ms per request, \
         {} epochs, {} rounds; load {}",
        opts.files,
        d >> 20,
        opts.mbps,
        opts.latency_ms,
        opts.epochs,
        opts.rounds,
        loadavg()
    );
    let scenarios = [
        Scenario {
            name: "fits",
            maxmemory: d * 2 / 3,
            cache_mem: 64 << 20,
            setups: [Setup::Independent, Setup::Cluster { keep_hits: true }],
        },
        Scenario {
            name: "half",
            maxmemory: d / 6,
            cache_mem: 64 << 20,
            setups: [Setup::Independent, Setup::Cluster { keep_hits: true }],
        },
        Scenario {
            name: "ram>share",
            maxmemory: d * 2 / 3,
            cache_mem: 192 << 20,
            setups: [
                Setup::Cluster { keep_hits: true },
                Setup::Cluster { keep_hits: false },
            ],
        },
    ];
    let mut results: BTreeMap<(usize, usize), Vec<Run>> = BTreeMap::new();
    for round in 0..opts.rounds {
        for (s, scenario) in scenarios.iter().enumerate() {
            if !opts.only.is_empty() && !opts.only.iter().any(|o| o == scenario.name) {
                continue;
            }
            // Interleaved: the setups alternate which goes first.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for k in order {
                let setup = scenario.setups[k];
                let run = run_setup(scenario, setup, &slow.mountpoint, &files, &opts);
                eprintln!(
                    "round {round} {} / {}: {} timeouts, {} prefetch lookups left to the readers; \
                     epochs (s, source MiB, cluster hits) {:?}",
                    scenario.name,
                    setup.name(),
                    run.timeouts,
                    run.ahead_late,
                    run.epochs
                        .iter()
                        .map(|(t, b, h)| (format!("{t:.2}"), b >> 20, *h))
                        .collect::<Vec<_>>()
                );
                results.entry((s, k)).or_default().push(run);
            }
        }
    }
    report(&scenarios, &results, d, &opts);
}

/// One setup of one scenario: a fresh cluster (so it starts empty), three mounts, the epochs.
fn run_setup(
    scenario: &Scenario,
    setup: Setup,
    source: &Path,
    files: &BTreeMap<String, Vec<u8>>,
    opts: &Options,
) -> Run {
    let link = Link {
        rate_mbit: opts.link_mbit,
        ..Link::lan()
    };
    let cluster = Cluster::start(3, scenario.maxmemory, link);
    let groups: Vec<MemoryCgroup> = (0..3)
        .map(|_| MemoryCgroup::new(scenario.cache_mem + (128 << 20)))
        .collect();
    let cache_mem = format!("{}M", scenario.cache_mem >> 20);
    let urls = cluster.urls();
    let auth = cluster.auth_file().to_string_lossy().into_owned();
    let mounts: Vec<TestMount> = (0..3)
        .map(|i| {
            let mut mount = TestMount::new();
            mount.src = source.to_owned();
            mount.keep_times = true;
            let mut flags = vec!["--cache-mem", &cache_mem];
            if let Setup::Cluster { keep_hits } = setup {
                flags.extend([
                    "--cluster",
                    &urls,
                    "--cluster-auth",
                    &auth,
                    "--cluster-keep-hits",
                    if keep_hits { "on" } else { "off" },
                ]);
                if let Some(t) = &opts.timeout {
                    flags.extend(["--cluster-timeout", t]);
                }
            }
            mount.mount_prepared(&flags, |command| {
                cluster.in_node(i, command);
                groups[i].confine(command);
            });
            mount
        })
        .collect();
    let read = AtomicUsize::new(0);
    let mut epochs = Vec::new();
    let mut stored = 0;
    let (mut source_before, mut hits_before) = (0, 0);
    let clustered = setup != Setup::Independent;
    for epoch in 1..=opts.epochs {
        let started = Instant::now();
        let result = run_epoch(&mounts, files, epoch, &read);
        let seconds = started.elapsed().as_secs_f64();
        assert_eq!(result.failures, Vec::<String>::new(), "reads failed");
        let source = total(&mounts, "source.bytes_read");
        let hits = if clustered {
            total(&mounts, "cluster.hits")
        } else {
            0
        };
        epochs.push((seconds, source - source_before, hits - hits_before));
        (source_before, hits_before) = (source, hits);
        if epoch == 1 && clustered {
            // The writers finish after the reads that fetched their blocks.
            settle(&cluster);
            stored =
                total(&mounts, "cluster.bytes_out") - HEADER * total(&mounts, "cluster.writes");
        }
    }
    for g in &groups {
        assert_eq!(g.oom_kills(), 0, "a mount was OOM-killed");
    }
    let figure = |path| if clustered { total(&mounts, path) } else { 0 };
    let (timeouts, ahead_late) = (figure("cluster.timeouts"), figure("cluster.ahead_late"));
    drop(mounts);
    Run {
        epochs,
        stored,
        timeouts,
        ahead_late,
    }
}

/// Waits until the cluster's key count has not changed for a second.
fn settle(cluster: &Cluster) {
    let mut last = (cluster.keys(), Instant::now());
    while last.1.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(100));
        let keys = cluster.keys();
        if keys != last.0 {
            last = (keys, Instant::now());
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn report(
    scenarios: &[Scenario],
    results: &BTreeMap<(usize, usize), Vec<Run>>,
    d: u64,
    opts: &Options,
) {
    println!(
        "\n| scenario | setup | Redis maxmemory per node | --cache-mem | epoch 1 s | epochs 2+ s | \
         source MiB per epoch 2+ (all nodes) | ΣC stored MiB | bound 1.05 x max(0, D - ΣC) MiB | \
         cluster hits per epoch 2+ | lookups timed out per run | epochs 2+ speed-up vs first setup |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mib = |b: f64| b / f64::from(1 << 20);
    for (s, scenario) in scenarios.iter().enumerate() {
        if !results.contains_key(&(s, 0)) {
            continue;
        }
        let later = |k: usize, f: &dyn Fn(&(f64, u64, u64)) -> f64| {
            median(
                results[&(s, k)]
                    .iter()
                    .map(|r| {
                        let e = &r.epochs[1..];
                        e.iter().map(f).sum::<f64>() / e.len() as f64
                    })
                    .collect(),
            )
        };
        let base = later(0, &|e| e.0);
        for (k, setup) in scenario.setups.iter().enumerate() {
            let runs = &results[&(s, k)];
            let stored = median(runs.iter().map(|r| r.stored as f64).collect());
            let bound = if *setup == Setup::Independent {
                "-".to_owned()
            } else {
                format!("{:.1}", mib(1.05 * (d as f64 - stored).max(0.0)))
            };
            let time = later(k, &|e| e.0);
            println!(
                "| {} | {} | {} MiB | {} MiB | {:.2} | {:.2} | {:.1} | {} | {} | {:.0} | {:.0} | {:.2}x |",
                scenario.name,
                setup.name(),
                scenario.maxmemory >> 20,
                scenario.cache_mem >> 20,
                median(runs.iter().map(|r| r.epochs[0].0).collect()),
                time,
                mib(later(k, &|e| e.1 as f64)),
                if *setup == Setup::Independent {
                    "-".to_owned()
                } else {
                    format!("{:.1}", mib(stored))
                },
                bound,
                later(k, &|e| e.2 as f64),
                median(runs.iter().map(|r| r.timeouts as f64).collect()),
                base / time,
            );
        }
    }
    println!(
        "\nD = {} MiB ({} files of 1.5 MiB), epochs 2..{}, medians of {} rounds; links {} Mbit/s, \
         --cluster-timeout {}; load {}",
        d >> 20,
        opts.files,
        opts.epochs,
        opts.rounds,
        opts.link_mbit,
        opts.timeout.as_deref().unwrap_or("default"),
        loadavg()
    );
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The slow shared source, served by this binary in a child process.
struct SlowMount {
    mountpoint: PathBuf,
    child: Child,
}

impl SlowMount {
    fn start(dir: &Path, mountpoint: &Path, opts: &Options) -> SlowMount {
        std::fs::create_dir_all(mountpoint).expect("mkdir slow");
        let child = Command::new(std::env::current_exe().expect("own path"))
            .arg("--serve-slowfs")
            .arg(dir)
            .arg(mountpoint)
            .args([
                opts.latency_ms.to_string(),
                opts.latency_ms.to_string(),
                opts.mbps.to_string(),
                "direct".to_owned(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start slowfs");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mountpoint.join("train").is_dir() {
            assert!(Instant::now() < deadline, "slowfs did not mount");
            std::thread::sleep(Duration::from_millis(20));
        }
        SlowMount {
            mountpoint: mountpoint.to_owned(),
            child,
        }
    }
}

impl Drop for SlowMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mountpoint).status();
        let _ = self.child.wait();
    }
}
