//! The prefetch comparison (issue 6): readers over a slow, latency-bound source, with prepfs
//! prefetching, with prepfs not prefetching (`--no-prefetch`), and with the kernel page cache and
//! its own readahead, side by side on the same data and the same memory.
//!
//! The source is `slowfs` over the ext4 image: every open and every read waits `SLOW_LATENCY_MS`,
//! and bytes pass one strict `--read-mbps` link, like network storage; its page cache stays on.
//! Memory is fair as in the main comparison: one cgroup per run, limit M + the reader's working
//! set; prepfs gets C = M - its own working set - headroom, and the prefetching mount takes its
//! staging buffer out of that C. Scenarios:
//! - sorted / shuffled / fixed: the plain reader (open, read, close) waiting `THINK_MS` after each
//!   file as a training step computes, in walk order, a new permutation per epoch, or the same
//!   permutation every epoch.
//! - torch: the stock DataLoader (decode and augmentation in 2 workers), shuffled.
//! - shards: the tar shards streamed in sorted order, no think time (bandwidth).
//! - view: the plain reader over a validation view's `.npy` files in walk order, thinking as
//!   above, on a mount whose memory holds the decoded pixels (`VIEW_BUDGET`): prefetch fetches
//!   the next images' bytes and, while the CPU is idle, decodes them ahead. Its third variant
//!   keeps no decoded pixels (`--decoded-cache off`), so prefetch can only fetch bytes: the
//!   difference is decode-ahead's. The page cache cannot serve a view, so it has no such run.
//!
//! Stall = epoch time - think time (what the reader waited for bytes); prepfs also counts its
//! own (`stall.fetch_seconds`). Owns these runs and their table; must never assert on timing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::dataset::Manifest;
use crate::target::{Target, median};
use crate::{Options, PrepfsMount, Reader, ReaderSession, Setup};
use prepfs::sandbox::{self, Cgroup, Guard, Limits, SlowDisk};

/// Latency of every open and every read of the slow source, ms (a nearby NFS server or a fast
/// object store answers in 1-10 ms).
pub const SLOW_LATENCY_MS: f64 = 2.0;
/// What the plain reader computes after each file, ms.
pub const THINK_MS: f64 = 2.0;
/// Memory the prefetching mount keeps free for the kernel's side of fetches in flight beyond the
/// demand reads' (4 prefetch threads, the page-cache pages of each 1 MiB fetch; their buffers are
/// in prepfs's budget). Without it the shards run thrashed in epoch 2: the cgroup full of memfd
/// pages, 5 MB reclaimable.
const PREFETCH_IN_FLIGHT: u64 = 8 << 20;
/// Staging buffer of the prefetching mount by default: the mount's own default
/// (`--prefetch-buffer 64M`), at most half of its budget, of which it is part (`--staging-mib`
/// sets another).
pub const STAGING: u64 = 64 << 20;

/// How a run reads the slow source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// The slow mount directly: the page cache and its readahead.
    PageCache,
    /// prepfs with `--no-prefetch`.
    NoPrefetch,
    /// prepfs prefetching.
    Prefetch,
    /// prepfs prefetching a view's bytes, keeping no decoded pixels (so no decode-ahead).
    PrefetchBytesOnly,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::PageCache => "page cache",
            Variant::NoPrefetch => "prepfs, no prefetch",
            Variant::Prefetch => "prepfs, prefetch",
            Variant::PrefetchBytesOnly => "prepfs, prefetch, no decode ahead",
        }
    }
}

/// What a scenario reads and how.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Scenario {
    pub name: &'static str,
    pub reader: Reader,
    pub order: &'static str,
    pub think_ms: f64,
    /// The view spec it reads through (`name=ops`), or none for the dataset's own files.
    pub view: Option<&'static str>,
}

/// The view scenario's transform: the stock validation pipeline.
const VAL_VIEW: &str = "val=decode,resize(256),center_crop(224),normalize(imagenet)";
/// Memory of the view scenario's mounts, in dataset sizes: the JPEGs and their decoded pixels
/// (about 3.5x packed), so that decode-ahead's pixels are kept; no cgroup limit.
const VIEW_BUDGET: u64 = 6;

impl Scenario {
    /// The planner's name of the file set it reads.
    fn set(&self) -> String {
        match self.view {
            Some(spec) => format!("view:{}", view_name(spec)),
            None => "files".into(),
        }
    }

    fn variants(&self) -> &'static [Variant] {
        match self.view {
            Some(_) => &[
                Variant::NoPrefetch,
                Variant::PrefetchBytesOnly,
                Variant::Prefetch,
            ],
            None => &[Variant::PageCache, Variant::NoPrefetch, Variant::Prefetch],
        }
    }
}

fn view_name(spec: &str) -> &str {
    spec.split_once('=').map_or(spec, |(n, _)| n)
}

const SCENARIOS: [Scenario; 6] = [
    Scenario {
        name: "sorted",
        reader: Reader::Plain,
        order: "sorted",
        think_ms: THINK_MS,
        view: None,
    },
    Scenario {
        name: "shuffled",
        reader: Reader::Plain,
        order: "shuffled",
        think_ms: THINK_MS,
        view: None,
    },
    Scenario {
        name: "fixed",
        reader: Reader::Plain,
        order: "fixed",
        think_ms: THINK_MS,
        view: None,
    },
    Scenario {
        name: "torch",
        reader: Reader::Torch,
        order: "shuffled",
        think_ms: 0.0,
        view: None,
    },
    Scenario {
        name: "shards",
        reader: Reader::Shards,
        order: "sorted",
        think_ms: 0.0,
        view: None,
    },
    Scenario {
        name: "view",
        reader: Reader::Plain,
        order: "sorted",
        think_ms: THINK_MS,
        view: Some(VAL_VIEW),
    },
];

/// One epoch of one run.
#[derive(Debug, Clone, Serialize)]
pub struct PrefetchEpoch {
    pub epoch: u32,
    pub seconds: f64,
    pub items: u64,
    /// Epoch time minus think time: what the reader waited for its bytes.
    pub stall_seconds: f64,
    /// prepfs's own count of time reads waited on the source in this epoch.
    pub fetch_stall_seconds: Option<f64>,
    /// prepfs's `prefetch` stats after the epoch.
    pub prefetch: Option<Value>,
    /// prepfs's epoch and predictor view of the set after the epoch.
    pub planner: Option<Value>,
}

/// All epochs of one scenario and variant.
#[derive(Debug, Clone, Serialize)]
pub struct PrefetchRun {
    pub scenario: Scenario,
    pub variant: Variant,
    pub data_bytes: u64,
    /// The cgroup's memory limit (0: none, the view scenario).
    pub memory_limit: u64,
    pub cache_mem: u64,
    pub epochs: Vec<PrefetchEpoch>,
}

/// The slow filesystem, served by this binary in a child process.
struct SlowMount {
    mountpoint: PathBuf,
    child: Child,
    _stop: Guard,
    _unmount: Guard,
}

impl SlowMount {
    fn start(opts: &Options, disk: &SlowDisk) -> Result<SlowMount, String> {
        let mountpoint = opts.workdir.join("slow");
        std::fs::create_dir_all(&mountpoint)
            .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .arg("--serve-slowfs")
            .arg(&disk.mountpoint)
            .arg(&mountpoint)
            .args([
                SLOW_LATENCY_MS.to_string(),
                SLOW_LATENCY_MS.to_string(),
                (opts.read_bps / 1_000_000).to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start slowfs: {e}"))?;
        let stop = sandbox::guard_process(child.id());
        let unmount = sandbox::guard_mount(&mountpoint);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mountpoint.join("images").is_dir() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("slowfs exited ({status}) before mounting"));
            }
            if Instant::now() > deadline {
                return Err("slowfs did not mount within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(SlowMount {
            mountpoint,
            child,
            _stop: stop,
            _unmount: unmount,
        })
    }
}

impl Drop for SlowMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mountpoint).status();
        let _ = self.child.wait();
    }
}

/// Runs every scenario with every variant, `opts.epochs` epochs each.
pub fn run(
    opts: &Options,
    python: &Path,
    disk: &SlowDisk,
    manifest: &Manifest,
) -> Result<Vec<PrefetchRun>, String> {
    let slow = SlowMount::start(opts, disk)?;
    eprintln!(
        "epochs: prefetch: slowfs at {}: {SLOW_LATENCY_MS} ms per open and per read, {} MB/s",
        slow.mountpoint.display(),
        opts.read_bps / 1_000_000
    );
    let mut setups: Vec<Setup> = Vec::new();
    let mut runs = Vec::new();
    let wanted =
        |s: &Scenario| opts.scenarios.is_empty() || opts.scenarios.iter().any(|n| n == s.name);
    for scenario in SCENARIOS.into_iter().filter(wanted) {
        let setup = match setups.iter().find(|s| s.reader == scenario.reader) {
            Some(s) => *s,
            None => {
                let s = crate::calibrate(opts, python, disk, scenario.reader, manifest)?;
                setups.push(s);
                s
            }
        };
        for &variant in scenario.variants() {
            runs.push(run_one(opts, python, &slow, &setup, scenario, variant)?);
        }
    }
    Ok(runs)
}

fn run_one(
    opts: &Options,
    python: &Path,
    slow: &SlowMount,
    setup: &Setup,
    scenario: Scenario,
    variant: Variant,
) -> Result<PrefetchRun, String> {
    sandbox::drop_caches()?;
    // A view's mounts hold its pixels: memory is not what this scenario measures.
    let (memory_limit, budget) = match scenario.view {
        Some(_) => (None, setup.data_bytes * VIEW_BUDGET),
        None => (Some(setup.memory_limit), setup.cache_mem),
    };
    let group = Cgroup::create(
        &format!("prefetch-{}-{variant:?}", scenario.name),
        &Limits {
            memory: memory_limit,
            throttle: None,
        },
    )?;
    let (cache_mem, mut extra): (u64, Vec<String>) = match variant {
        Variant::PageCache => (0, Vec::new()),
        Variant::NoPrefetch => (budget, vec!["--no-prefetch".into()]),
        Variant::Prefetch | Variant::PrefetchBytesOnly => {
            // `--staging-mib default`: the mount chooses (and may lend it to the cache).
            let mut extra = match opts.staging_bytes {
                Some(bytes) => vec![
                    "--prefetch-buffer".into(),
                    bytes.min(budget / 2).to_string(),
                ],
                None => Vec::new(),
            };
            if let Some(threads) = opts.prefetch_threads {
                extra.extend(["--prefetch-threads".into(), threads.to_string()]);
            }
            (budget.saturating_sub(PREFETCH_IN_FLIGHT), extra)
        }
    };
    if let Some(spec) = scenario.view {
        let decoded = match variant {
            Variant::PrefetchBytesOnly => "off",
            _ => "on",
        };
        extra.extend(["--view".into(), spec.into()]);
        extra.extend(["--decoded-cache".into(), decoded.into()]);
    }
    let mount = match variant {
        Variant::PageCache => None,
        _ => Some(PrepfsMount::start(
            &group,
            opts,
            &slow.mountpoint,
            Some(cache_mem),
            &extra,
        )?),
    };
    let top = mount
        .as_ref()
        .map_or(slow.mountpoint.as_path(), |m| m.mountpoint.as_path());
    let root = match scenario.view {
        Some(spec) => top.join(".prepfs/views").join(view_name(spec)),
        None => top.to_path_buf(),
    }
    .join(scenario.reader.subdir());
    let suffix = if scenario.view.is_some() {
        ".npy"
    } else {
        ".jpg"
    };
    let mut session = ReaderSession::start(
        &group,
        python,
        scenario.reader.name(),
        &root,
        opts.epochs,
        opts.seed,
        &[
            "--order".into(),
            scenario.order.into(),
            "--think-ms".into(),
            scenario.think_ms.to_string(),
            "--suffix".into(),
            suffix.into(),
        ],
    )?;
    let mut epochs = Vec::new();
    for _ in 0..opts.epochs {
        let before = mount.as_ref().map(PrepfsMount::stats);
        let record = session.next_epoch()?;
        let after = mount.as_ref().map(PrepfsMount::stats);
        let stall = |s: &Value| s["stall"]["fetch_seconds"].as_f64().unwrap_or(0.0);
        let epoch = PrefetchEpoch {
            epoch: record.epoch,
            seconds: record.seconds,
            items: record.items,
            stall_seconds: (record.seconds - record.items as f64 * scenario.think_ms / 1e3)
                .max(0.0),
            fetch_stall_seconds: before
                .as_ref()
                .zip(after.as_ref())
                .map(|(b, a)| stall(a) - stall(b)),
            prefetch: after.as_ref().map(|a| a["prefetch"].clone()),
            planner: after.as_ref().map(|a| a["epochs"][scenario.set()].clone()),
        };
        eprintln!(
            "epochs: prefetch: {:<8} {:<20} epoch {}: {:6.2} s, stall {:6.2} s{}",
            scenario.name,
            variant.name(),
            epoch.epoch,
            epoch.seconds,
            epoch.stall_seconds,
            epoch
                .planner
                .as_ref()
                .map(|p| format!(
                    ", prepfs stall {:.2} s, predictor {}, useful {}",
                    epoch.fetch_stall_seconds.unwrap_or(0.0),
                    p["predictor"],
                    epoch
                        .prefetch
                        .as_ref()
                        .map_or(Value::Null, |x| x["useful"].clone())
                ))
                .unwrap_or_default()
        );
        epochs.push(epoch);
    }
    session.finish()?;
    if let Some(m) = mount {
        m.stop();
    }
    Ok(PrefetchRun {
        scenario,
        variant,
        data_bytes: setup.data_bytes,
        memory_limit: memory_limit.unwrap_or(0),
        cache_mem,
        epochs,
    })
}

fn find<'a>(runs: &'a [PrefetchRun], scenario: &str, variant: Variant) -> Option<&'a PrefetchRun> {
    runs.iter()
        .find(|r| r.scenario.name == scenario && r.variant == variant)
}

fn first(run: &PrefetchRun, f: impl Fn(&PrefetchEpoch) -> f64) -> f64 {
    run.epochs.first().map_or(0.0, f)
}

fn later(run: &PrefetchRun, f: impl Fn(&PrefetchEpoch) -> f64) -> f64 {
    median(run.epochs.iter().skip(1).map(f).collect())
}

/// Precision of the predictor the planner used, after the last epoch.
fn precision(run: &PrefetchRun) -> f64 {
    let Some(planner) = run.epochs.last().and_then(|e| e.planner.as_ref()) else {
        return 0.0;
    };
    let name = planner["predictor"].as_str().unwrap_or("");
    planner["predictors"][name]["precision"]
        .as_f64()
        .unwrap_or(0.0)
}

/// The targets of issue 6, from the runs (empty when the comparison did not run).
pub fn targets(runs: &[PrefetchRun], read_bps: u64) -> Vec<Target> {
    let mut out = Vec::new();
    let pair =
        |name| find(runs, name, Variant::Prefetch).zip(find(runs, name, Variant::NoPrefetch));
    if let Some((on, off)) = pair("sorted") {
        let ratio = first(on, |e| e.seconds) / first(off, |e| e.seconds).max(1e-9);
        out.push(Target {
            name: "prefetch: cold epoch 1 in sorted order, time vs no prefetch".into(),
            measured: ratio,
            bound: "<= 0.7".into(),
            met: ratio <= 0.7,
        });
    }
    if let Some((on, off)) = pair("shuffled") {
        let ratio = later(on, |e| e.stall_seconds) / later(off, |e| e.stall_seconds).max(1e-9);
        out.push(Target {
            name: "prefetch: shuffled epochs 2+, stall vs no prefetch".into(),
            measured: ratio,
            bound: "<= 0.5".into(),
            met: ratio <= 0.5,
        });
    }
    if let Some((on, off)) = pair("fixed") {
        let ratio = later(on, |e| e.stall_seconds) / later(off, |e| e.stall_seconds).max(1e-9);
        out.push(Target {
            name: "prefetch: fixed order epochs 2+, stall vs no prefetch".into(),
            measured: ratio,
            bound: "<= 0.2".into(),
            met: ratio <= 0.2,
        });
        let p = precision(on);
        out.push(Target {
            name: "prefetch: fixed order, precision of the predictor in use".into(),
            measured: p,
            bound: ">= 0.9".into(),
            met: p >= 0.9,
        });
    }
    if let Some(on) = find(runs, "shards", Variant::Prefetch) {
        let rate = on.data_bytes as f64 / first(on, |e| e.seconds).max(1e-9);
        let ratio = rate / read_bps as f64;
        out.push(Target {
            name: "prefetch: sequential shards, cold, throughput vs the link".into(),
            measured: ratio,
            bound: ">= 0.9".into(),
            met: ratio >= 0.9,
        });
    }
    out
}

/// The comparison's table (empty when it did not run).
pub fn markdown(runs: &[PrefetchRun], read_bps: u64) -> String {
    if runs.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\nPrefetch: readers over slowfs ({SLOW_LATENCY_MS} ms per open and per read, one {} MB/s \
         link, page cache on) with the same memory per run as above (M = D x mem-ratio). The \
         plain reader thinks {THINK_MS} ms after each file; stall = epoch time - think time. \
         The view scenario's mounts have memory for the pixels ({VIEW_BUDGET} x D, no limit). \
         Epochs 2+ are medians; precision is the predictor's in use after the last epoch.\n\n\
         | scenario | variant | epoch 1 s | epoch 1 stall s | epochs 2+ s | epochs 2+ stall s | prepfs stall s, 2+ | predictor | precision | useful / issued, last epoch |\n\
         |---|---|---:|---:|---:|---:|---:|---|---:|---|\n",
        read_bps / 1_000_000
    );
    for run in runs {
        let last = run.epochs.last();
        let planner = last.and_then(|e| e.planner.as_ref());
        let prefetch = last.and_then(|e| e.prefetch.as_ref());
        md.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} |\n",
            run.scenario.name,
            run.variant.name(),
            first(run, |e| e.seconds),
            first(run, |e| e.stall_seconds),
            later(run, |e| e.seconds),
            later(run, |e| e.stall_seconds),
            if run.variant == Variant::PageCache {
                "-".into()
            } else {
                format!(
                    "{:.2}",
                    later(run, |e| e.fetch_stall_seconds.unwrap_or(0.0))
                )
            },
            planner.map_or("-".into(), |p| p["predictor"]
                .as_str()
                .unwrap_or("-")
                .to_owned()),
            if matches!(run.variant, Variant::Prefetch | Variant::PrefetchBytesOnly) {
                format!("{:.2}", precision(run))
            } else {
                "-".into()
            },
            prefetch.map_or("-".into(), |p| {
                let decoded = match run.scenario.view {
                    Some(_) => format!(", {} decoded ahead", p["decoded_ahead"]),
                    None => String::new(),
                };
                format!("{} / {}{decoded}", p["useful"], p["issued"])
            }),
        ));
    }
    md
}
