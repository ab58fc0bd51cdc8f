//! Epochs benchmark: multi-epoch training reads through prepfs versus the kernel page cache, on
//! throttled slow storage, with the same memory for both, with the real PyTorch loader.
//!
//! `cargo bench --bench epochs` (root; see BENCHMARKS.md) builds (once) an ext4 image of
//! photograph-like JPEGs in class folders plus the same samples in tar shards, attaches it to a
//! loop device, and for each reader (plain reads, the stock PyTorch DataLoader, shards) runs the
//! epochs twice: against the ext4 mount directly (the page cache) and through a prepfs mount of
//! it. Each run lives in one memory cgroup (reader, and daemon for prepfs) and one blkio cgroup
//! throttling reads of the loop device. Memory is fair: M = D x mem-ratio for the data; the limit
//! is M plus the reader's own measured footprint (a tenth more in `--quick`, so a smoke run never
//! thrashes on a footprint measured low), and prepfs gets `--cache-mem` = M minus the daemon's
//! measured footprint. Results: JSON files, SVG plots and Markdown tables (appended to
//! docs/BENCHMARKS-HISTORY.md for a run of this checkout's build, not of `PREPFS_BENCH_BIN`'s),
//! and the targets of issue 3 checked side by side. The views comparison
//! (`views`: tensor views against stock PyTorch, torchvision.io and DALI on the CPU, issues 4 and
//! 25; with `--jobs 1,3`, several training jobs at once over one mount, issue 35) runs on a
//! dataset of its own (`--view-files`, 2,000 by default) and asks
//! `python/ensure-env --bench` for DALI when a DALI pipeline is selected. `--quick` is the CI
//! smoke test: small datasets, two epochs, and two checks: prepfs's misses in epoch 2 are within
//! 5% of the never-evict optimum D - C, and every views pipeline (DALI's left out, so CI never
//! installs it) delivers every image with no view error. Timing is reported, never asserted.

#[path = "../common/binary.rs"]
mod binary;
mod dataset;
mod jobs_report;
mod prefetch;
mod report;
mod slowfs;
mod target;
mod views;
mod views_report;

use std::io::{BufRead, BufReader, Lines, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use prepfs::memory::limits::HEADROOM;
use prepfs::sandbox::{self, Cgroup, Guard, Limits, SlowDisk};

const READERS_PY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/epochs/readers.py");
const ENSURE_ENV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/ensure-env");
const BENCHMARKS_HISTORY_MD: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/docs/BENCHMARKS-HISTORY.md");
const RESULTS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/results");
/// Memory the prepfs side keeps free beyond the measured footprints, taken out of its cache:
/// the page cache and buffers of source reads in flight (a couple of concurrent 1 MiB fetches,
/// each a buffer plus its page-cache pages, plus ext4 readahead). Without it the cgroup sits at
/// its limit with nothing reclaimable but code pages, and thrashes (measured: 500 reads in 11
/// minutes, memory.failcnt 79 million).
pub const IN_FLIGHT_HEADROOM: u64 = 16 << 20;
/// The quick mode's bound on |prepfs misses - (D - C)| / (D - C) in epoch 2.
const QUICK_MISS_TOLERANCE: f64 = 0.05;
/// Images of the quick mode's views dataset: one full batch and a partial one, so CI checks
/// every pipeline's delivery of both in seconds.
const QUICK_VIEW_FILES: usize = 100;

/// What reads the dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reader {
    /// open().read() of every file in a random permutation.
    Plain,
    /// torchvision ImageFolder + DataLoader with the standard augmentation, 2 workers.
    Torch,
    /// tar shards streamed one after the other, shard order shuffled.
    Shards,
}

impl Reader {
    fn name(self) -> &'static str {
        match self {
            Reader::Plain => "plain",
            Reader::Torch => "torch",
            Reader::Shards => "shards",
        }
    }

    fn subdir(self) -> &'static str {
        match self {
            Reader::Shards => "shards",
            Reader::Plain | Reader::Torch => "images",
        }
    }

    fn data_bytes(self, manifest: &dataset::Manifest) -> u64 {
        match self {
            Reader::Shards => manifest.shard_bytes,
            Reader::Plain | Reader::Torch => manifest.file_bytes,
        }
    }
}

/// Where the reader's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// The ext4 mount itself: the kernel page cache under the memory limit.
    PageCache,
    /// A prepfs mount over it.
    Prepfs,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::PageCache => "page cache",
            Side::Prepfs => "prepfs",
        }
    }
}

/// Command-line knobs.
#[derive(Debug, Clone, Serialize)]
pub struct Options {
    pub quick: bool,
    pub files: usize,
    pub epochs: u32,
    pub read_bps: u64,
    pub read_iops: u64,
    pub mem_ratio: f64,
    pub shard_bytes: u64,
    pub readers: Vec<Reader>,
    /// Whether to run the views comparison (tensor views vs stock PyTorch, torchvision.io, DALI).
    pub views: bool,
    /// Images of the views comparison's own dataset.
    pub view_files: usize,
    /// Rounds of the views comparison (each runs every pipeline once, order rotated).
    pub rounds: usize,
    /// The views comparison's pipelines, in the order of its first round.
    pub pipelines: Vec<views::Pipeline>,
    /// Job counts of the views comparison: each pipeline runs that many readers at once, each
    /// a training job of its own (issue 35's coordinated prep).
    pub jobs: Vec<usize>,
    /// DataLoader workers or DALI threads of every views pipeline alike.
    pub workers: usize,
    /// The views consumers' compute per batch, ms (a training step on a device).
    pub step_ms: f64,
    /// Whether to run the prefetch comparison over a slow, latency-bound source.
    pub prefetch: bool,
    /// The prefetch comparison's scenarios to run (all when empty).
    pub scenarios: Vec<String>,
    /// Staging buffer of the prefetching mount, taken out of its cache budget (`None`: the
    /// mount's default, which a shuffled order lends to the cache).
    pub staging_bytes: Option<u64>,
    /// `--prefetch-threads` of the prefetching mount (its default when `None`).
    pub prefetch_threads: Option<usize>,
    pub seed: u64,
    #[serde(skip)]
    pub workdir: PathBuf,
    #[serde(skip)]
    pub out: PathBuf,
    pub args: String,
}

const USAGE: &str = "usage: cargo bench --bench epochs -- [--quick] [--files N] [--epochs N] \
[--read-mbps N] [--read-iops N] [--mem-ratio F] [--shard-mib N] [--readers plain,torch,shards,views,prefetch] \
[--scenarios sorted,shuffled,fixed,torch,shards] [--staging-mib N|default] [--prefetch-threads N] \
[--view-files N] [--rounds N] [--workers N] [--step-ms F] \
[--pipelines stock,tvio,dali,dali-roi,f32-off,u8-off,f32,u8,u8-ahead,f32-alone,u8-alone] [--jobs 1,3] \
[--seed N] [--workdir DIR] [--out DIR]\n       (results: benches/results, or DIR/quick-results with --quick and DIR/partial-results with \
--pipelines, DIR being the workdir, unless --out)\n       cargo bench --bench epochs -- --replot-views   (benches/results/views.json again as a plot)";

impl Options {
    fn parse() -> Result<Options, String> {
        let args: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .collect();
        let quick = args.iter().any(|a| a == "--quick");
        let mut o = Options {
            quick,
            // The quick dataset leaves prepfs, after its 64 MiB cgroup headroom, a cache of a
            // tenth of it.
            files: if quick { 1600 } else { 3000 },
            epochs: if quick { 2 } else { 4 },
            read_bps: 80_000_000,
            read_iops: 800,
            mem_ratio: 0.5,
            shard_bytes: if quick { 8 << 20 } else { 64 << 20 },
            readers: vec![Reader::Plain, Reader::Torch, Reader::Shards],
            views: true,
            view_files: if quick { QUICK_VIEW_FILES } else { 2000 },
            rounds: if quick { 1 } else { 3 },
            // The quick mode (CI) leaves out DALI: its install is the benchmark's alone.
            pipelines: views::Pipeline::defaults()
                .filter(|p| !(quick && p.needs_dali()))
                .collect(),
            jobs: vec![1],
            workers: views::WORKERS,
            step_ms: 0.0,
            prefetch: false,
            scenarios: Vec::new(),
            staging_bytes: Some(prefetch::STAGING),
            prefetch_threads: None,
            seed: 1,
            workdir: std::env::var_os("PREPFS_EPOCHS_DIR")
                .map_or_else(|| PathBuf::from("/var/tmp/prepfs-epochs"), PathBuf::from),
            out: PathBuf::new(),
            args: args.join(" "),
        };
        let mut out = None;
        // A run of chosen pipelines only: its results go beside the dataset, not over the full
        // run's in benches/results (which BENCHMARKS.md's plots and rows are drawn from).
        let mut chosen = false;
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            if flag == "--quick" {
                continue;
            }
            if flag == "-h" || flag == "--help" {
                return Err(USAGE.into());
            }
            let value = it
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let bad = |_: std::num::ParseIntError| format!("bad value for {flag}: {value}");
            match flag.as_str() {
                "--files" => o.files = value.parse().map_err(bad)?,
                "--epochs" => o.epochs = value.parse().map_err(bad)?,
                "--read-mbps" => o.read_bps = value.parse::<u64>().map_err(bad)? * 1_000_000,
                "--read-iops" => o.read_iops = value.parse().map_err(bad)?,
                "--mem-ratio" => {
                    o.mem_ratio = value
                        .parse()
                        .map_err(|_| format!("bad value for {flag}: {value}"))?
                }
                "--shard-mib" => o.shard_bytes = value.parse::<u64>().map_err(bad)? << 20,
                "--seed" => o.seed = value.parse().map_err(bad)?,
                "--scenarios" => o.scenarios = value.split(',').map(str::to_owned).collect(),
                "--staging-mib" if value == "default" => o.staging_bytes = None,
                "--staging-mib" => o.staging_bytes = Some(value.parse::<u64>().map_err(bad)? << 20),
                "--prefetch-threads" => o.prefetch_threads = Some(value.parse().map_err(bad)?),
                "--view-files" => o.view_files = value.parse().map_err(bad)?,
                "--rounds" => o.rounds = value.parse().map_err(bad)?,
                "--workers" => o.workers = value.parse::<usize>().map_err(bad)?.max(1),
                "--step-ms" => {
                    o.step_ms = value
                        .parse()
                        .map_err(|_| format!("bad value for {flag}: {value}"))?
                }
                "--pipelines" => {
                    chosen = true;
                    o.pipelines = value
                        .split(',')
                        .map(|k| {
                            views::Pipeline::from_key(k)
                                .ok_or_else(|| format!("unknown pipeline {k}\n{USAGE}"))
                        })
                        .collect::<Result<_, _>>()?
                }
                "--jobs" => {
                    o.jobs = value
                        .split(',')
                        .map(|n| match n.parse::<usize>() {
                            Ok(n) if n >= 1 => Ok(n),
                            _ => Err(format!("bad job count {n} in {flag}")),
                        })
                        .collect::<Result<_, _>>()?
                }
                "--workdir" => o.workdir = PathBuf::from(value),
                "--out" => out = Some(PathBuf::from(value)),
                "--readers" => {
                    let names: Vec<&str> = value.split(',').collect();
                    o.views = names.contains(&"views");
                    o.prefetch = names.contains(&"prefetch");
                    o.readers = names
                        .into_iter()
                        .filter(|r| !["views", "prefetch"].contains(r))
                        .map(|r| match r {
                            "plain" => Ok(Reader::Plain),
                            "torch" => Ok(Reader::Torch),
                            "shards" => Ok(Reader::Shards),
                            other => Err(format!("unknown reader {other}")),
                        })
                        .collect::<Result<_, _>>()?;
                }
                _ => return Err(format!("unknown option {flag}\n{USAGE}")),
            }
        }
        if o.files == 0 || o.epochs < 2 || !(0.05..=1.0).contains(&o.mem_ratio) {
            return Err("need --files >= 1, --epochs >= 2 and 0.05 <= --mem-ratio <= 1".into());
        }
        if o.view_files == 0 || o.rounds == 0 || o.pipelines.is_empty() || o.jobs.is_empty() {
            return Err(
                "need --view-files >= 1, --rounds >= 1, at least one pipeline and one job count"
                    .into(),
            );
        }
        // The mount follows one published order; several jobs would overwrite each other's.
        if o.jobs.iter().any(|&n| n > 1) && o.pipelines.contains(&views::Pipeline::ViewUint8Ahead) {
            return Err(
                "u8-ahead publishes one job's order: leave it out of --pipelines with --jobs > 1"
                    .into(),
            );
        }
        o.out = out.unwrap_or_else(|| {
            if quick {
                o.workdir.join("quick-results")
            } else if chosen {
                o.workdir.join("partial-results")
            } else {
                PathBuf::from(RESULTS_DIR)
            }
        });
        Ok(o)
    }
}

/// Memory each side gets, from the calibration run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Setup {
    pub reader: Reader,
    /// D: bytes the reader reads per epoch.
    pub data_bytes: u64,
    /// M: memory for data, D x mem-ratio.
    pub data_memory: u64,
    /// Peak footprint of the reader (processes, libraries, kernel objects), measured.
    pub reader_footprint: u64,
    /// Peak footprint of the prepfs daemon with an empty cache, measured.
    pub daemon_footprint: u64,
    /// memory.limit_in_bytes of both runs: M + reader footprint (a tenth more in the quick mode).
    pub memory_limit: u64,
    /// Kept free on the prepfs side for reads in flight (`IN_FLIGHT_HEADROOM`).
    pub in_flight_headroom: u64,
    /// prepfs --cache-mem: M - daemon footprint - in-flight headroom, at most the memory limit
    /// less prepfs's 64 MiB headroom (prepfs splits it into its RAM tier, C, and its own working
    /// memory).
    pub cache_mem: u64,
}

/// One epoch as measured.
#[derive(Debug, Clone, Serialize)]
pub struct Epoch {
    pub epoch: u32,
    pub seconds: f64,
    pub items: u64,
    pub items_per_s: f64,
    /// Read from the slow device during the epoch (/proc/diskstats).
    pub device_bytes: u64,
    /// Read requests the slow device completed during the epoch (what its IOPS limit counts).
    pub device_reads: u64,
    /// Bytes prepfs read from its source during the epoch (its own count of misses).
    pub prepfs_miss_bytes: Option<u64>,
    /// The run's memory cgroup after the epoch.
    pub memory_usage: u64,
    pub memory_failcnt: u64,
    /// Major page faults in the cgroup during the epoch: code or data paged back in (thrash).
    pub major_faults: u64,
    /// prepfs's stats.json after the epoch.
    pub prepfs_stats: Option<Value>,
}

/// All epochs of one reader on one side.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub setup: Setup,
    pub side: Side,
    pub epochs: Vec<Epoch>,
    /// C: the RAM tier's slice of `--cache-mem`, as the prepfs mount reported it.
    pub cache: Option<u64>,
}

impl Run {
    /// D - C: what a never-evict cache of the prepfs mount's RAM tier must miss per epoch.
    pub fn optimum_misses(&self) -> Option<u64> {
        self.cache.map(|c| self.setup.data_bytes.saturating_sub(c))
    }
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
    if args.first().map(String::as_str) == Some("--replot-views") {
        if let Err(e) = replot_views() {
            eprintln!("epochs: {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = run() {
        eprintln!("epochs: {e}");
        sandbox::exit(1);
    }
}

/// `--replot-views`: draws benches/results' images/s plot again from its views.json, without
/// running anything (for a plot added after the run).
fn replot_views() -> Result<(), String> {
    let dir = Path::new(RESULTS_DIR);
    let json = dir.join("views.json");
    let text = std::fs::read_to_string(&json).map_err(|e| format!("{}: {e}", json.display()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    let bars = views_report::bars_from_json(&doc)?;
    views_report::plot(
        &bars,
        &dir.join(views_report::PLOT),
        views_report::PLOT_TITLE,
    )
}

fn run() -> Result<(), String> {
    let opts = Options::parse()?;
    sandbox::preflight()?;
    sandbox::install_signal_teardown()?;
    std::fs::create_dir_all(&opts.workdir)
        .map_err(|e| format!("{}: {e}", opts.workdir.display()))?;
    sandbox::clear_leftovers(&opts.workdir);
    let python = ensure_python(opts.views && opts.pipelines.iter().any(|p| p.needs_dali()))?;
    let started = Instant::now();
    let mut main = None;
    let (mut runs, mut prefetch_runs) = (Vec::new(), Vec::new());
    if !opts.readers.is_empty() || opts.prefetch {
        let (image, manifest) = dataset::prepare(&opts.workdir, opts.files, opts.shard_bytes)?;
        let disk = SlowDisk::attach(&image, &opts.workdir.join("disk"), false)?;
        eprintln!(
            "epochs: {} files ({:.0} MB), {} shards ({:.0} MB) on {} at {} MB/s, {} IOPS",
            manifest.files,
            manifest.file_bytes as f64 / 1e6,
            manifest.shards,
            manifest.shard_bytes as f64 / 1e6,
            disk.device.display(),
            opts.read_bps / 1_000_000,
            opts.read_iops
        );
        for &reader in &opts.readers {
            let setup = calibrate(&opts, &python, &disk, reader, &manifest)?;
            eprintln!(
                "epochs: {}: D {:.0} MB, M {:.0} MB; reader footprint {:.0} MB, daemon {:.0} MB -> limit {:.0} MB, --cache-mem {:.0} MB",
                reader.name(),
                mb(setup.data_bytes),
                mb(setup.data_memory),
                mb(setup.reader_footprint),
                mb(setup.daemon_footprint),
                mb(setup.memory_limit),
                mb(setup.cache_mem)
            );
            for side in [Side::PageCache, Side::Prepfs] {
                runs.push(run_epochs(&opts, &python, &disk, &setup, side)?);
            }
        }
        if opts.prefetch {
            prefetch_runs = prefetch::run(&opts, &python, &disk, &manifest)?;
        }
        main = Some(manifest);
    }
    let mut views = None;
    if opts.views {
        // Its own dataset (the same image when --view-files equals --files), unthrottled.
        let (image, manifest) = dataset::prepare(&opts.workdir, opts.view_files, opts.shard_bytes)?;
        let disk = SlowDisk::attach(&image, &opts.workdir.join("views-disk"), false)?;
        let view_runs = views::run(&opts, &python, &disk, &manifest)?;
        views = Some((manifest, view_runs));
    }
    eprintln!(
        "epochs: measured in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let outcome = report::write(
        &opts,
        main.as_ref(),
        &runs,
        views.as_ref().map(|(m, r)| (m, r.as_slice())),
        &prefetch_runs,
    )?;
    if opts.quick {
        if !opts.readers.is_empty() {
            quick_check(&runs)?;
        }
        if let Some((manifest, view_runs)) = &views {
            views::quick_check(view_runs, manifest.files)?;
        }
    }
    println!("{outcome}");
    Ok(())
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// The Python of the readers, from `python/ensure-env`; `bench`: with the benchmarks' peers
/// (DALI), installed on first use.
fn ensure_python(bench: bool) -> Result<PathBuf, String> {
    let status = Command::new(ENSURE_ENV)
        .args(bench.then_some("--bench"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {ENSURE_ENV}: {e}"))?;
    if !status.status.success() {
        return Err("the Python environment could not be prepared (see above)".into());
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&status.stdout).trim(),
    ))
}

/// Measures the reader's and the daemon's own memory: two epochs through a prepfs mount with an
/// empty cache, unthrottled, each in its own cgroup. Between them both groups are squeezed, so
/// what start-up touched once (most of torch's libraries) is dropped; the footprint sampled in
/// epoch 2 is then the working set each needs, not everything it ever mapped.
fn calibrate(
    opts: &Options,
    python: &Path,
    disk: &SlowDisk,
    reader: Reader,
    manifest: &dataset::Manifest,
) -> Result<Setup, String> {
    let unlimited = Limits {
        memory: None,
        throttle: None,
    };
    let daemon_group = Arc::new(Cgroup::create("calibrate-daemon", &unlimited)?);
    let reader_group = Arc::new(Cgroup::create("calibrate-reader", &unlimited)?);
    // Without prefetch: its staging buffer would count as the daemon's own footprint.
    let mount = PrepfsMount::start(
        &daemon_group,
        opts,
        &disk.mountpoint,
        Some(0),
        &["--no-prefetch".into()],
    )?;
    let mut session = ReaderSession::start(
        &reader_group,
        python,
        reader.name(),
        &mount.mountpoint.join(reader.subdir()),
        2,
        opts.seed,
        &[],
    )?;
    session.next_epoch()?;
    daemon_group.squeeze();
    reader_group.squeeze();
    let (daemon_watch, reader_watch) = (
        daemon_group.watch_footprint(),
        reader_group.watch_footprint(),
    );
    session.next_epoch()?;
    let reader_footprint = reader_watch.finish();
    let daemon_footprint = daemon_watch.finish();
    session.finish()?;
    mount.stop();
    let data_bytes = reader.data_bytes(manifest);
    let data_memory = (data_bytes as f64 * opts.mem_ratio) as u64;
    // The quick mode (test.sh's and CI's smoke run) gives the reader a tenth more than it
    // measured: the footprint varies by ~8% from run to run (torch: 604 and 653 MB on one
    // machine the same day), and a prepfs side that fills its M share with memory it cannot give
    // back left a reader measured low thrashing on its own libraries for over 12 minutes. The
    // full runs keep exactly M + the footprint.
    let reader_room = if opts.quick {
        reader_footprint + reader_footprint / 10
    } else {
        reader_footprint
    };
    // Whole pages: the kernel rounds a cgroup's limit down to them.
    let memory_limit = (data_memory + reader_room) / 4096 * 4096;
    Ok(Setup {
        reader,
        data_bytes,
        data_memory,
        reader_footprint,
        daemon_footprint,
        memory_limit,
        in_flight_headroom: IN_FLIGHT_HEADROOM,
        // prepfs refuses a budget that leaves less than its documented headroom under its
        // cgroup's limit: in a tight group that, not the measured working set, bounds it.
        cache_mem: data_memory
            .saturating_sub(daemon_footprint + IN_FLIGHT_HEADROOM)
            .min(memory_limit.saturating_sub(HEADROOM)),
    })
}

fn run_epochs(
    opts: &Options,
    python: &Path,
    disk: &SlowDisk,
    setup: &Setup,
    side: Side,
) -> Result<Run, String> {
    sandbox::drop_caches()?;
    let group = Cgroup::create(
        &format!(
            "{}-{}",
            setup.reader.name(),
            if side == Side::Prepfs {
                "prepfs"
            } else {
                "pagecache"
            }
        ),
        &Limits {
            memory: Some(setup.memory_limit),
            throttle: Some((disk.devnum.clone(), opts.read_bps, opts.read_iops)),
        },
    )?;
    let mount = match side {
        // The default mount, prefetch's staging buffer included: what a user gets.
        Side::Prepfs => Some(PrepfsMount::start(
            &group,
            opts,
            &disk.mountpoint,
            Some(setup.cache_mem),
            &[],
        )?),
        Side::PageCache => None,
    };
    let root = mount
        .as_ref()
        .map_or(disk.mountpoint.as_path(), |m| m.mountpoint.as_path());
    let cache = mount.as_ref().map(PrepfsMount::cache_slice);
    let optimum = cache.map(|c| setup.data_bytes.saturating_sub(c));
    let mut session = ReaderSession::start(
        &group,
        python,
        setup.reader.name(),
        &root.join(setup.reader.subdir()),
        opts.epochs,
        opts.seed,
        &[],
    )?;
    let mut epochs = Vec::new();
    for _ in 0..opts.epochs {
        let (reads_before, bytes_before) = disk.reads();
        let misses_before = mount.as_ref().map(PrepfsMount::miss_bytes);
        let faults_before = major_faults(&group);
        let record = session.next_epoch().map_err(|e| {
            format!(
                "{} on {}: {e} (memory.failcnt {}, {})",
                setup.reader.name(),
                side.name(),
                group.memory_value("memory.failcnt"),
                std::fs::read_to_string(group.memory_path("memory.oom_control"))
                    .unwrap_or_default()
                    .replace('\n', ", ")
            )
        })?;
        let stats = mount.as_ref().map(PrepfsMount::stats);
        let (reads_after, bytes_after) = disk.reads();
        let epoch = Epoch {
            epoch: record.epoch,
            seconds: record.seconds,
            items: record.items,
            items_per_s: record.items as f64 / record.seconds.max(1e-9),
            device_bytes: bytes_after - bytes_before,
            device_reads: reads_after - reads_before,
            prepfs_miss_bytes: mount
                .as_ref()
                .zip(misses_before)
                .map(|(m, before)| m.miss_bytes().saturating_sub(before)),
            memory_usage: group.memory_value("memory.usage_in_bytes"),
            memory_failcnt: group.memory_value("memory.failcnt"),
            major_faults: major_faults(&group) - faults_before,
            prepfs_stats: stats,
        };
        eprintln!(
            "epochs: {:>6} {:<10} epoch {}: {:6.2} s, {:7.0} items/s, device {:6.1} MB in {} reads, {} major faults{}",
            setup.reader.name(),
            side.name(),
            epoch.epoch,
            epoch.seconds,
            epoch.items_per_s,
            mb(epoch.device_bytes),
            epoch.device_reads,
            epoch.major_faults,
            epoch
                .prepfs_miss_bytes
                .map(|m| format!(
                    ", prepfs misses {:.1} MB (D-C {:.1} MB)",
                    mb(m),
                    mb(optimum.unwrap_or(0))
                ))
                .unwrap_or_default()
        );
        epochs.push(epoch);
    }
    session.finish()?;
    if let Some(m) = mount {
        m.stop();
    }
    Ok(Run {
        setup: *setup,
        side,
        epochs,
        cache,
    })
}

fn major_faults(group: &Cgroup) -> u64 {
    group
        .memory_stat()
        .get("total_pgmajfault")
        .copied()
        .unwrap_or(0)
}

/// The CI smoke test's one assertion: the never-evict cache missed what it must, no more.
fn quick_check(runs: &[Run]) -> Result<(), String> {
    let mut checked = 0;
    for run in runs
        .iter()
        .filter(|r| r.side == Side::Prepfs && r.setup.reader == Reader::Plain)
    {
        let optimum = run.optimum_misses().unwrap_or(0) as f64;
        for epoch in run.epochs.iter().skip(1) {
            let misses = epoch.prepfs_miss_bytes.unwrap_or(0) as f64;
            let off = (misses - optimum).abs() / optimum.max(1.0);
            if off > QUICK_MISS_TOLERANCE {
                return Err(format!(
                    "quick check failed: epoch {} missed {:.1} MB, the never-evict optimum D-C is {:.1} MB ({:.1}% off, bound {:.0}%)",
                    epoch.epoch,
                    misses / 1e6,
                    optimum / 1e6,
                    off * 100.0,
                    QUICK_MISS_TOLERANCE * 100.0
                ));
            }
            eprintln!(
                "epochs: quick check: epoch {} prepfs missed {:.1} MB vs D-C {:.1} MB ({:.2}% off): ok",
                epoch.epoch,
                misses / 1e6,
                optimum / 1e6,
                off * 100.0
            );
            checked += 1;
        }
    }
    if checked == 0 {
        return Err("quick check: no prepfs run of the plain reader past epoch 1".into());
    }
    Ok(())
}

/// A prepfs mount over the slow disk, its daemon inside a cgroup.
struct PrepfsMount {
    mountpoint: PathBuf,
    child: Child,
    stop_daemon: Guard,
    _unmount: Guard,
}

impl PrepfsMount {
    /// Mounts `source` (the slow disk's mount, or a slow filesystem over it) with
    /// `--cache-mem cache_mem` (the default budget when `None`) and `extra` arguments.
    fn start(
        group: &Cgroup,
        opts: &Options,
        source: &Path,
        cache_mem: Option<u64>,
        extra: &[String],
    ) -> Result<PrepfsMount, String> {
        let mountpoint = opts.workdir.join("mnt");
        let mut args: Vec<String> = vec![
            "mount".into(),
            source.display().to_string(),
            mountpoint.display().to_string(),
            "--foreground".into(),
        ];
        if let Some(bytes) = cache_mem {
            args.extend(["--cache-mem".into(), bytes.to_string()]);
        }
        args.extend_from_slice(extra);
        let log = opts.workdir.join("prepfs.log");
        let (child, stop_daemon, unmount) =
            sandbox::start_prepfs(group, &binary::prepfs(), &args, &mountpoint, &log)?;
        Ok(PrepfsMount {
            mountpoint,
            child,
            stop_daemon,
            _unmount: unmount,
        })
    }

    fn stats(&self) -> Value {
        sandbox::read_stats(&self.mountpoint)
    }

    /// The daemon's process id (the cgroup's shell execs prepfs in place).
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The RAM tier's slice of the mount's budget (C).
    fn cache_slice(&self) -> u64 {
        self.stats()["cache"]["budget_bytes"].as_u64().unwrap_or(0)
    }

    fn miss_bytes(&self) -> u64 {
        self.stats()["source"]["bytes_read"].as_u64().unwrap_or(0)
    }

    /// SIGTERM (a clean unmount), reap, and make sure the mount point is free.
    fn stop(mut self) {
        drop(self.stop_daemon);
        let _ = self.child.wait();
    }
}

/// Data the reader prints after each epoch.
#[derive(Debug, serde::Deserialize)]
struct EpochRecord {
    epoch: u32,
    seconds: f64,
    items: u64,
}

/// A running readers.py, stepped one epoch at a time.
struct ReaderSession {
    /// The line it printed when set up (`{"ready": true, ...}`).
    ready: Value,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    stop: Option<Guard>,
}

impl ReaderSession {
    /// Starts readers.py `--kind kind` over `root` (the directory it lists) in `group`, with
    /// `extra` arguments.
    fn start(
        group: &Cgroup,
        python: &Path,
        kind: &str,
        root: &Path,
        epochs: u32,
        seed: u64,
        extra: &[String],
    ) -> Result<ReaderSession, String> {
        let mut args: Vec<String> = vec![
            READERS_PY.into(),
            "--kind".into(),
            kind.into(),
            "--root".into(),
            root.display().to_string(),
            "--epochs".into(),
            epochs.to_string(),
            "--seed".into(),
            seed.to_string(),
        ];
        args.extend_from_slice(extra);
        let mut child = group
            .command(python, &args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the {kind} reader: {e}"))?;
        let stop = sandbox::guard_process(child.id());
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("reader has no stdout")?;
        let mut session = ReaderSession {
            ready: Value::Null,
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            stop: Some(stop),
        };
        let ready = session.line()?;
        if ready["ready"] != Value::Bool(true) {
            return Err(format!("reader said {ready} instead of ready"));
        }
        session.ready = ready;
        Ok(session)
    }

    fn line(&mut self) -> Result<Value, String> {
        match self.lines.next() {
            Some(Ok(line)) => {
                serde_json::from_str(&line).map_err(|e| format!("reader printed {line:?}: {e}"))
            }
            _ => Err(format!("reader exited ({})", self.reap()?)),
        }
    }

    /// The versions of the Python packages it runs, as it reported them when ready.
    fn versions(&self) -> Value {
        self.ready["versions"].clone()
    }

    fn next_epoch(&mut self) -> Result<EpochRecord, String> {
        self.go()?;
        self.epoch_line()
    }

    /// Lets the reader start its next epoch, without waiting for it: the views comparison
    /// starts every job's epoch before it waits for any.
    fn go(&mut self) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("reader stdin closed")?;
        stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("reader went away: {e}"))
    }

    /// Waits for the end of the epoch that `go` started.
    fn epoch_line(&mut self) -> Result<EpochRecord, String> {
        let line = self.line()?;
        serde_json::from_value(line.clone()).map_err(|e| format!("reader printed {line}: {e}"))
    }

    /// Waits for the reader to exit; once reaped its pid may be reused, so it is no longer ours
    /// to signal.
    fn reap(&mut self) -> Result<std::process::ExitStatus, String> {
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if let Some(guard) = self.stop.take() {
            guard.disarm();
        }
        Ok(status)
    }

    fn finish(mut self) -> Result<(), String> {
        drop(self.stdin.take());
        let status = self.reap()?;
        if !status.success() {
            return Err(format!("reader exited ({status})"));
        }
        Ok(())
    }
}
