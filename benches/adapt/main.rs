//! Scheduler on the real system (issue 38): images/s and load latency of a view-reading loader
//! through prepfs while the machine changes under it, for the shipped policy, the heuristics and
//! a static setting, with paired t-tests over runs and the scheduler's own CPU cost.
//!
//! `cargo bench --bench adapt -- [--scenarios abcde] [--runs N] [--phase SECS] [--images N]
//! [--modes policy,heuristic,heuristic-again,static] [--save FILE]` (as root: cgroups, a loop
//! device; `--save` keeps the medians per phase for the simulator's check). Each scenario
//! (scenario.rs) has three phases, the middle one disturbed: (a) stress-ng on every
//! core, (b) the source device throttled to 20 MB/s, (c) a working set twice the budget instead
//! of one that fits, (d) a memory hog in the daemon's cgroup, (e) two more jobs over the same
//! view. Per run and mode it mounts the view
//! `train=decode,random_resized_crop(224),hflip,normalize(imagenet)` with the daemon in a cgroup
//! of its own, reads shuffled epochs of it with 2 reader threads (a DataLoader's workers), and
//! records every read's latency (after a warm-up of half a phase, not counted). Runs are rounds: within a round every mode runs each scenario
//! once, in an order rotated per round, with the same readers' seeds, so drift of the shared
//! machine hits the modes alike and the runs pair. `heuristic-again` is the heuristic mounted a
//! second time: its difference from `heuristic` is the noise floor, and the report says how
//! large a difference the runs can tell at p < 0.05. `policy-unguarded` (the policy with
//! `--policy-guard off`) and the probes `pixels-raw`, `pixels-zstd1` and `workers-2x` (the
//! heuristic with decoded pixels kept raw or zstd-1-packed, or render threads at twice the
//! cores) and `heuristic-before` (the heuristic of the earlier build `PREPFS_BENCH_BEFORE_BIN`,
//! a change's before beside its after) can be asked for by name. Timing is reported, never
//! asserted.

#[path = "../common/binary.rs"]
mod binary;
#[path = "../common/measure.rs"]
mod measure;
mod report;
mod scenario;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use prepfs::sandbox;
use report::Run;
use scenario::{Scenario, World};

const VIEW: &str = "train=decode,random_resized_crop(224),hflip,normalize(imagenet)";
/// Readers: the worker processes of a typical 2-core DataLoader.
const READERS: usize = 2;

/// The modes compared, with their extra mount flags.
const MODES: [(&str, &[&str]); 9] = [
    ("policy", &["--scheduler", "policy"]),
    ("heuristic", &["--scheduler", "heuristic"]),
    ("heuristic-again", &["--scheduler", "heuristic"]),
    // Static CPU-only: no scheduler, fixed codec, no decoded pixels.
    (
        "static",
        &[
            "--scheduler",
            "heuristic",
            "--codec",
            "none",
            "--decoded-cache",
            "off",
        ],
    ),
    (
        "policy-unguarded",
        &["--scheduler", "policy", "--policy-guard", "off"],
    ),
    // Probes: the heuristic with one of the policy's choices forced, to check the simulator's
    // cost of each choice against the mount's (`scheduler --real` predicts them the same way).
    (
        "pixels-raw",
        &[
            "--scheduler",
            "heuristic",
            "--codec",
            "none",
            "--decoded-cache",
            "on",
        ],
    ),
    (
        "pixels-zstd1",
        &[
            "--scheduler",
            "heuristic",
            "--codec",
            "zstd-1",
            "--decoded-cache",
            "on",
        ],
    ),
    (
        "workers-2x",
        &[
            "--scheduler",
            "heuristic",
            "--render-threads",
            TWICE_THE_CORES,
        ],
    ),
    // The heuristic of an earlier build (`PREPFS_BENCH_BEFORE_BIN`), for a change's before and
    // after interleaved in one run.
    ("heuristic-before", &["--scheduler", "heuristic"]),
];

/// The earlier build the `-before` modes mount: `PREPFS_BENCH_BEFORE_BIN`.
fn before_binary() -> Result<PathBuf, String> {
    std::env::var_os("PREPFS_BENCH_BEFORE_BIN")
        .map(PathBuf::from)
        .ok_or_else(|| "a -before mode needs PREPFS_BENCH_BEFORE_BIN (an earlier build)".into())
}

/// Stands for twice this machine's cores in a mode's flags (the policy's largest worker option).
const TWICE_THE_CORES: &str = "2x-cores";

struct Args {
    phase: f64,
    runs: usize,
    images: usize,
    scenarios: Vec<Scenario>,
    modes: Vec<(&'static str, &'static [&'static str])>,
    /// Where to write the medians per phase as JSON (`--save`), for the simulator's check.
    save: Option<PathBuf>,
}

fn args(raw: &[String]) -> Result<Args, String> {
    let mut a = Args {
        phase: 15.0,
        runs: 5,
        images: 400,
        scenarios: Scenario::ALL.to_vec(),
        modes: MODES[..4].to_vec(),
        save: None,
    };
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--phase" => a.phase = value()?.parse().map_err(|e| format!("--phase: {e}"))?,
            "--runs" => a.runs = value()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--images" => a.images = value()?.parse().map_err(|e| format!("--images: {e}"))?,
            "--scenarios" => {
                a.scenarios = value()?
                    .chars()
                    .map(|c| Scenario::parse(c).ok_or(format!("no scenario '{c}' (a-e)")))
                    .collect::<Result<_, _>>()?;
            }
            "--modes" => {
                a.modes = value()?
                    .split(',')
                    .map(|m| {
                        MODES
                            .iter()
                            .find(|(name, _)| *name == m)
                            .copied()
                            .ok_or(format!("no mode {m}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--save" => a.save = Some(PathBuf::from(value()?)),
            "--bench" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let result = match raw.first().map(String::as_str) {
        Some("--hog") => hog(&raw[1..]),
        Some("--job") => job(&raw[1..]),
        _ => sandbox::install_signal_teardown().and_then(|()| bench(&raw)),
    };
    if let Err(e) = result {
        eprintln!("adapt: {e}");
        sandbox::exit(1);
    }
}

/// `--hog BYTES BYTES_PER_S`: takes BYTES of memory, touched at BYTES_PER_S (a process growing,
/// as a loader's batches do), and holds it until killed (scenario (d)).
fn hog(raw: &[String]) -> Result<(), String> {
    let [bytes, rate] = raw else {
        return Err("usage: --hog BYTES BYTES_PER_S".into());
    };
    let bytes: usize = bytes.parse().map_err(|e| format!("--hog size: {e}"))?;
    let rate: f64 = rate.parse().map_err(|e| format!("--hog rate: {e}"))?;
    let step = 1 << 20;
    let mut held = vec![0u8; bytes];
    for chunk in held.chunks_mut(step) {
        for page in chunk.chunks_mut(4096) {
            page[0] = 1;
        }
        std::thread::sleep(Duration::from_secs_f64(step as f64 / rate));
    }
    std::hint::black_box(&held);
    loop {
        std::thread::park();
    }
}

/// `--job ROOT SEED`: another training job, reading the view under ROOT in shuffled epochs
/// with `READERS` threads until killed (scenario (e)).
fn job(raw: &[String]) -> Result<(), String> {
    let [root, seed] = raw else {
        return Err("usage: --job ROOT SEED".into());
    };
    let seed: u64 = seed.parse().map_err(|e| format!("--job seed: {e}"))?;
    let files = Arc::new(view_files(Path::new(root))?);
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let files = files.clone();
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(seed * 16 + r as u64);
                let mut order: Vec<usize> = (0..files.len()).collect();
                loop {
                    rng.shuffle(&mut order);
                    for &i in order.iter().skip(r).step_by(READERS) {
                        let _ = std::fs::read(&files[i]);
                    }
                }
            })
        })
        .collect();
    for r in readers {
        let _ = r.join();
    }
    Ok(())
}

/// The view's files under `root` (its class folders), sorted.
fn view_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for class in std::fs::read_dir(root).map_err(|e| format!("{}: {e}", root.display()))? {
        let class = class.map_err(|e| e.to_string())?.path();
        if !class.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&class).map_err(|e| format!("{}: {e}", class.display()))? {
            files.push(f.map_err(|e| e.to_string())?.path());
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(format!("no view files under {}", root.display()));
    }
    Ok(files)
}

/// Each knob's option most in force between stats `s0` and `s1`, with its share of the
/// decisions taken between them (`scheduler.histogram.<knob>.<option>` counts).
fn choices(s0: &serde_json::Value, s1: &serde_json::Value) -> String {
    let Some(knobs) = s1["scheduler"]["histogram"].as_object() else {
        return String::new();
    };
    knobs
        .iter()
        .filter_map(|(knob, options)| {
            let counts: Vec<(&String, u64)> = options
                .as_object()?
                .iter()
                .filter_map(|(option, n)| {
                    let before = s0["scheduler"]["histogram"][knob][option].as_u64();
                    Some((option, n.as_u64()?.saturating_sub(before.unwrap_or(0))))
                })
                .collect();
            let total: u64 = counts.iter().map(|(_, n)| n).sum();
            let (option, n) = counts.into_iter().max_by_key(|(_, n)| *n)?;
            (total > 0).then(|| format!("{knob}={option} {:.0}%", n as f64 / total as f64 * 100.0))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The RAM tier's blocks per codec and its decoded pixels in `s`, e.g.
/// `blocks none 410 lz4 0 zstd 380, pixels 218 MB`.
fn stored(s: &serde_json::Value) -> String {
    let blocks = ["none", "lz4", "zstd"].map(|c| {
        format!(
            "{c} {}",
            s["cache"]["blocks_by_codec"][c].as_u64().unwrap_or(0)
        )
    });
    let pixels = s["cache"]["decoded"]["logical_bytes"].as_u64().unwrap_or(0);
    format!(
        "blocks {}, pixels {:.0} MB",
        blocks.join(" "),
        pixels as f64 / 1e6
    )
}

/// CPU seconds spent unpacking cache entries on hits (`cache.decompress_cpu_seconds`).
fn unpack_seconds(s: &serde_json::Value) -> f64 {
    s["cache"]["decompress_cpu_seconds"].as_f64().unwrap_or(0.0)
}

/// Bytes prepfs has read from the source (`source.bytes_read`).
fn source_bytes(s: &serde_json::Value) -> u64 {
    s["source"]["bytes_read"].as_u64().unwrap_or(0)
}

fn stall_seconds(s: &serde_json::Value) -> f64 {
    let f = |k: &str| s["stall"][k].as_f64().unwrap_or(0.0);
    f("fetch_seconds") + f("prep_seconds")
}

/// CPU seconds of the daemon's threads named `prefix*`.
fn thread_cpu(pid: u32, prefix: &str) -> f64 {
    // SAFETY: sysconf(3) reads a constant of the system; no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim().starts_with(prefix))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| {
            // utime and stime: fields 14 and 15, counted after the command name.
            let rest = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / ticks)
        })
        .sum()
}

/// Reads the measured job makes: (phase, latency in ms, or `None` for a read that failed) per
/// read, per reader; phase 0 is the warm-up, 1 to 3 the measured phases.
type Reads = Vec<(usize, Option<f32>)>;

/// One run: mounts, reads through three phases, unmounts.
fn run(
    world: &World,
    scenario: Scenario,
    (mode, flags): (&str, &[&str]),
    phase_s: f64,
    seed: u64,
) -> Result<Run, String> {
    if scenario.on_disk() {
        // The image's pages a previous run read stay in the page cache (charged to that run's
        // cgroup): without this, every run after the first read little from the device, and a
        // throttle on it showed nothing.
        sandbox::drop_caches()?;
    }
    let mut setup = world.setup(scenario, mode)?;
    let mut mount_args: Vec<String> = vec![
        "mount".into(),
        setup.source.display().to_string(),
        setup.mountpoint.display().to_string(),
        "--foreground".into(),
        "--view".into(),
        VIEW.into(),
        "--cache-mem".into(),
        setup.cache_mem.to_string(),
    ];
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    mount_args.extend(flags.iter().map(|f| match *f {
        TWICE_THE_CORES => (2 * cores).to_string(),
        f => f.to_owned(),
    }));
    let binary = if mode.ends_with("-before") {
        before_binary()?
    } else {
        binary::prepfs()
    };
    let (mut daemon, stop_daemon, _unmount) = sandbox::start_prepfs(
        &setup.group,
        &binary,
        &mount_args,
        &setup.mountpoint,
        &setup.log,
    )?;
    let mnt = setup.mountpoint.clone();
    let root = mnt.join(".prepfs/views/train");
    let files = Arc::new(view_files(&root)?);
    // The working set: readers take files among the first `active`.
    let active = Arc::new(AtomicUsize::new(files.len()));
    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (files, active, phase, stop) =
                (files.clone(), active.clone(), phase.clone(), stop.clone());
            std::thread::spawn(move || -> Reads {
                let mut rng = fastrand::Rng::with_seed(seed * 16 + r as u64);
                let mut reads = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = active.load(Ordering::Relaxed).min(files.len());
                    let mut order: Vec<usize> = (0..n).collect();
                    rng.shuffle(&mut order);
                    for &i in order.iter().skip(r).step_by(READERS) {
                        if stop.load(Ordering::Relaxed) || active.load(Ordering::Relaxed) != n {
                            break;
                        }
                        let t = Instant::now();
                        let ok = std::fs::read(&files[i]).is_ok();
                        let ms = ok.then(|| (t.elapsed().as_secs_f64() * 1e3) as f32);
                        reads.push((phase.load(Ordering::Relaxed), ms));
                    }
                }
                reads
            })
        })
        .collect();
    let started = Instant::now();
    let mut phases = Vec::new();
    let mut marks = Vec::new();
    let mut cache_slice = 0;
    for p in 0..3 {
        let given = setup.enter(p, &root)?;
        let n = ((files.len() as f64 * given.share).ceil() as usize).clamp(1, files.len());
        active.store(n, Ordering::Relaxed);
        if p == 0 {
            // Warm-up, not measured: the first epoch's listing, cache fill and first renders.
            std::thread::sleep(Duration::from_secs_f64(phase_s / 2.0));
        }
        phase.store(p + 1, Ordering::Relaxed);
        let device0 = setup
            .device
            .as_deref()
            .and_then(scenario::device_read_bytes);
        let s0 = sandbox::read_stats(&mnt);
        let action0 = s0["scheduler"]["action"].clone();
        let t0 = Instant::now();
        let mut reacted = None;
        let (mut polls, mut policy_polls, mut guarded) = (0u32, 0u32, false);
        while t0.elapsed().as_secs_f64() < phase_s {
            std::thread::sleep(Duration::from_millis(100));
            let s = sandbox::read_stats(&mnt);
            if reacted.is_none() && s["scheduler"]["action"] != action0 {
                reacted = Some(t0.elapsed().as_secs_f64());
            }
            let acting = &s["scheduler"]["guard"]["acting"];
            guarded |= acting.is_string();
            polls += 1;
            policy_polls += u32::from(acting == "policy");
        }
        let s1 = sandbox::read_stats(&mnt);
        cache_slice = s1["memory"]["cache"]["slice_bytes"].as_u64().unwrap_or(0);
        let device1 = setup
            .device
            .as_deref()
            .and_then(scenario::device_read_bytes);
        marks.push(t0.elapsed().as_secs_f64());
        let memory = |s: &serde_json::Value, k: &str| s["memory"][k].as_u64().unwrap_or(0);
        phases.push(report::Phase {
            stall_s: stall_seconds(&s1) - stall_seconds(&s0),
            pressure_events: memory(&s1, "pressure_events")
                .saturating_sub(memory(&s0, "pressure_events")),
            given_back_bytes: memory(&s1, "given_back_bytes")
                .saturating_sub(memory(&s0, "given_back_bytes")),
            held_back_bytes: memory(&s1, "held_back_bytes"),
            choices: choices(&s0, &s1),
            stored: format!(
                "{}; unpacking {:.2} s of CPU",
                stored(&s1),
                unpack_seconds(&s1) - unpack_seconds(&s0)
            ),
            device_mb_s: device0
                .zip(device1)
                .map(|(a, b)| b.saturating_sub(a) as f64 / 1e6 / t0.elapsed().as_secs_f64()),
            source_mb_s: source_bytes(&s1).saturating_sub(source_bytes(&s0)) as f64
                / 1e6
                / t0.elapsed().as_secs_f64(),
            reacted_s: reacted,
            policy_share: guarded.then(|| f64::from(policy_polls) / f64::from(polls.max(1))),
            ..Default::default()
        });
    }
    stop.store(true, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let mut latencies: [Vec<f32>; 3] = Default::default();
    for r in readers {
        for (p, ms) in r.join().map_err(|_| "a reader panicked")? {
            let Some(p) = p.checked_sub(1).filter(|&p| p < 3) else {
                continue;
            };
            match ms {
                Some(ms) => latencies[p].push(ms),
                None => phases[p].failed_reads += 1,
            }
        }
    }
    // A daemon that is gone before it is asked to stop was killed (the kernel's OOM killer).
    let killed = daemon.try_wait().ok().flatten().is_some();
    if killed {
        eprintln!("adapt: the daemon of this run was gone before its end; see dmesg");
    }
    for (p, figures) in phases.iter_mut().enumerate() {
        let v = &mut latencies[p];
        figures.images_per_s = v.len() as f64 / marks[p];
        figures.p50_ms = report::quantile(v, 0.50);
        figures.p99_ms = report::quantile(v, 0.99);
    }
    let pid = daemon.id();
    let control = thread_cpu(pid, "prepfs-schedul") + thread_cpu(pid, "prepfs-telemet");
    drop(stop_daemon);
    let _ = daemon.wait();
    Ok(Run {
        phases,
        cache_mem: setup.cache_mem,
        cache_slice,
        files: files.len(),
        control_cpu_pct: control / seconds * 100.0,
        killed,
    })
}

fn bench(raw: &[String]) -> Result<(), String> {
    let a = args(raw)?;
    report::self_check()?;
    sandbox::preflight()?;
    if a.scenarios.contains(&Scenario::Cpu)
        && std::process::Command::new("stress-ng")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("adapt: installing stress-ng");
        let ok = std::process::Command::new("apt-get")
            .args(["install", "-y", "-qq", "stress-ng"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err("stress-ng is missing and could not be installed".into());
        }
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let work = PathBuf::from("/var/tmp/prepfs-adapt");
    let world = World::prepare(&work, a.images, &a.scenarios)?;
    eprintln!("adapt: load at start {}", measure::loadavg());
    let mut results: Vec<Vec<(&str, Vec<Run>)>> = a
        .scenarios
        .iter()
        .map(|_| a.modes.iter().map(|(m, _)| (*m, Vec::new())).collect())
        .collect();
    for round in 0..a.runs {
        for (s, &scenario) in a.scenarios.iter().enumerate() {
            for k in 0..a.modes.len() {
                let i = (k + round) % a.modes.len();
                let r = run(&world, scenario, a.modes[i], a.phase, round as u64)?;
                eprintln!("round {round} ({}) {}:", scenario.letter(), a.modes[i].0);
                for (name, p) in scenario.phases().iter().zip(&r.phases) {
                    eprintln!(
                        "  {name}: {:.0} img/s, p50 {:.1} ms, p99 {:.1} ms; pressure {}x, {:.0} MB given back, {:.0} MB held back{}; {}; {}",
                        p.images_per_s,
                        p.p50_ms,
                        p.p99_ms,
                        p.pressure_events,
                        p.given_back_bytes as f64 / 1e6,
                        p.held_back_bytes as f64 / 1e6,
                        p.device_mb_s.map_or(String::new(), |d| format!(
                            ", device {d:.0} MB/s (prepfs read {:.0} MB/s from the source)",
                            p.source_mb_s
                        )),
                        p.choices,
                        p.stored
                    );
                }
                results[s][i].1.push(r);
            }
        }
    }
    for (scenario, rows) in a.scenarios.iter().zip(&results) {
        report::print_scenario(scenario.title(), scenario.phases(), rows);
    }
    if let Some(path) = &a.save {
        let saved = report::Saved {
            phase_s: a.phase,
            runs: a.runs,
            readers: READERS,
            cores,
            scenarios: a
                .scenarios
                .iter()
                .zip(&results)
                .map(|(s, rows)| {
                    report::SavedScenario::new(s.letter(), s.cpu_load(), s.device_limit(), rows)
                })
                .collect(),
        };
        let json = serde_json::to_string_pretty(&saved).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("adapt: medians per phase written to {}", path.display());
    }
    println!(
        "\n{} rounds, {} s per phase, {READERS} readers, {cores} cores, load at end {}; medians over rounds, paired ratios are geometric means with a t-test on their logs.",
        a.runs,
        a.phase,
        measure::loadavg()
    );
    Ok(())
}
