//! Scheduler on the real system: images/s and stall of a view-reading loader through prepfs when
//! background CPU load arrives and leaves mid-run, for the shipped policy, the heuristics and a
//! static setting, plus the scheduler's own CPU cost.
//!
//! `cargo bench --bench adapt -- [--phase SECS] [--runs N] [--images N]` (root not needed).
//! Builds N synthetic photos in /var/tmp, then per run and mode mounts them with the view
//! `train=decode,random_resized_crop(224),hflip,normalize(imagenet)`, reads shuffled epochs of
//! the view with 2 reader threads (a DataLoader's workers) for three phases: quiet, with
//! `stress-ng --cpu <cores>` running (installed from Debian if missing), quiet again. Reports
//! per phase the median images/s and stall seconds over the runs, the time from each change to
//! the scheduler's first different action, the share of the phase the policy held the knobs
//! (with the guard on; `policy-unguarded` runs the same policy with `--policy-guard off`), and
//! the CPU time of the `prepfs-scheduler` and `prepfs-telemetry` threads. Timing is reported,
//! never asserted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PREPFS: &str = env!("CARGO_BIN_EXE_prepfs");
const VIEW: &str = "train=decode,random_resized_crop(224),hflip,normalize(imagenet)";
/// Readers: the worker processes of a typical 2-core DataLoader.
const READERS: usize = 2;

struct Args {
    phase: f64,
    runs: usize,
    images: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        phase: 15.0,
        runs: 3,
        images: 400,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--phase" => a.phase = value()?.parse().map_err(|e| format!("--phase: {e}"))?,
            "--runs" => a.runs = value()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--images" => a.images = value()?.parse().map_err(|e| format!("--images: {e}"))?,
            "--bench" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// The modes compared, with their extra mount flags.
const MODES: [(&str, &[&str]); 4] = [
    ("policy", &["--scheduler", "policy"]),
    (
        "policy-unguarded",
        &["--scheduler", "policy", "--policy-guard", "off"],
    ),
    ("heuristic", &["--scheduler", "heuristic"]),
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
];

fn dataset(dir: &Path, images: usize) -> Result<(), String> {
    let marker = dir.join(format!(".complete-{images}"));
    if marker.exists() {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    for i in 0..images {
        let class = dir.join(format!("c{}", i % 10));
        std::fs::create_dir_all(&class).map_err(|e| e.to_string())?;
        let jpeg = prepfs::synthetic::photo(i as u64)?;
        std::fs::write(class.join(format!("{i:05}.jpg")), jpeg).map_err(|e| e.to_string())?;
    }
    std::fs::write(marker, b"").map_err(|e| e.to_string())
}

fn stats(mnt: &Path) -> serde_json::Value {
    std::fs::read_to_string(mnt.join(".prepfs/stats.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

fn stall_seconds(s: &serde_json::Value) -> f64 {
    let f = |k: &str| s["stall"][k].as_f64().unwrap_or(0.0);
    f("fetch_seconds") + f("prep_seconds")
}

/// CPU seconds of the daemon's threads named `prefix*`.
fn thread_cpu(pid: u32, prefix: &str) -> f64 {
    let tick = 100.0; // USER_HZ on Linux
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
            let rest = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / tick)
        })
        .sum()
}

struct Mount {
    child: Child,
    mnt: PathBuf,
}

impl Mount {
    fn start(src: &Path, mnt: &Path, extra: &[&str]) -> Result<Mount, String> {
        std::fs::create_dir_all(mnt).map_err(|e| e.to_string())?;
        let child = Command::new(PREPFS)
            .arg("mount")
            .arg(src)
            .arg(mnt)
            .args(["--foreground", "--view", VIEW, "--cache-mem", "256M"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let m = Mount {
            child,
            mnt: mnt.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mnt.join(".prepfs/stats.json").exists() {
            if Instant::now() > deadline {
                return Err("mount did not become ready".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new(PREPFS).arg("umount").arg(&self.mnt).output();
        let _ = self.child.wait();
    }
}

/// One phase's figures.
#[derive(Default, Clone)]
struct Phase {
    images_per_s: f64,
    stall_s: f64,
    /// Seconds from the phase's start to the scheduler's first action that differs from the
    /// action in force when it started (`None`: unchanged).
    reacted_s: Option<f64>,
    /// Share of the phase's stats polls in which the guard let the policy act (`None`: no
    /// guard).
    policy_share: Option<f64>,
}

struct RunResult {
    phases: Vec<Phase>,
    scheduler_cpu_s: f64,
    telemetry_cpu_s: f64,
    seconds: f64,
}

fn run(
    src: &Path,
    mnt: &Path,
    extra: &[&str],
    phase: f64,
    cores: usize,
) -> Result<RunResult, String> {
    let mount = Mount::start(src, mnt, extra)?;
    let root = mnt.join(".prepfs/views/train");
    let mut files: Vec<PathBuf> = Vec::new();
    for c in std::fs::read_dir(&root)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        for f in std::fs::read_dir(c.path())
            .map_err(|e| e.to_string())?
            .flatten()
        {
            files.push(f.path());
        }
    }
    let files = Arc::new(files);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (files, done, stop) = (files.clone(), done.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(r as u64);
                let mut order: Vec<usize> = (0..files.len()).collect();
                while !stop.load(Ordering::Relaxed) {
                    rng.shuffle(&mut order);
                    for i in order.iter().skip(r).step_by(READERS) {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        if std::fs::read(&files[*i]).is_ok() {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let started = Instant::now();
    let mut phases = Vec::new();
    let mut stress: Option<Child> = None;
    for p in 0..3 {
        if p == 1 {
            stress = Some(
                Command::new("stress-ng")
                    .args(["--cpu", &cores.to_string(), "--quiet"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("stress-ng: {e}"))?,
            );
        } else if let Some(mut s) = stress.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let s0 = stats(mnt);
        let action0 = s0["scheduler"]["action"].clone();
        let (n0, t0) = (done.load(Ordering::Relaxed), Instant::now());
        let mut reacted = None;
        let (mut polls, mut policy_polls, mut guarded) = (0u32, 0u32, false);
        while t0.elapsed().as_secs_f64() < phase {
            std::thread::sleep(Duration::from_millis(100));
            let s = stats(mnt);
            if reacted.is_none() && s["scheduler"]["action"] != action0 {
                reacted = Some(t0.elapsed().as_secs_f64());
            }
            let acting = &s["scheduler"]["guard"]["acting"];
            guarded |= acting.is_string();
            polls += 1;
            policy_polls += u32::from(acting == "policy");
        }
        let s1 = stats(mnt);
        phases.push(Phase {
            images_per_s: (done.load(Ordering::Relaxed) - n0) as f64 / t0.elapsed().as_secs_f64(),
            stall_s: stall_seconds(&s1) - stall_seconds(&s0),
            reacted_s: reacted,
            policy_share: guarded.then(|| f64::from(policy_polls) / f64::from(polls.max(1))),
        });
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let _ = r.join();
    }
    let pid = mount.child.id();
    let result = RunResult {
        phases,
        scheduler_cpu_s: thread_cpu(pid, "prepfs-schedul"),
        telemetry_cpu_s: thread_cpu(pid, "prepfs-telemet"),
        seconds: started.elapsed().as_secs_f64(),
    };
    drop(mount);
    Ok(result)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    if xs.is_empty() { 0.0 } else { xs[xs.len() / 2] }
}

fn main() {
    if let Err(e) = bench() {
        eprintln!("adapt: {e}");
        std::process::exit(1);
    }
}

fn bench() -> Result<(), String> {
    let a = args()?;
    if Command::new("stress-ng").arg("--version").output().is_err() {
        eprintln!("adapt: installing stress-ng");
        let ok = Command::new("apt-get")
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
    let src = work.join("images");
    dataset(&src, a.images)?;
    let mut results: Vec<(&str, Vec<RunResult>)> =
        MODES.iter().map(|(m, _)| (*m, Vec::new())).collect();
    for run_i in 0..a.runs {
        // Modes interleave within a run, so drift of the shared machine hits them alike.
        for (i, (mode, extra)) in MODES.iter().enumerate() {
            let r = run(
                &src,
                &work.join(format!("mnt-{mode}")),
                extra,
                a.phase,
                cores,
            )?;
            eprintln!(
                "run {run_i} {mode}: {}",
                r.phases
                    .iter()
                    .map(|p| format!("{:.0} img/s, stall {:.1} s", p.images_per_s, p.stall_s))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            results[i].1.push(r);
        }
    }
    let names = ["quiet", "stress-ng", "quiet again"];
    println!(
        "\n| mode | {} | reacted after (s), per change | policy acting, per phase | scheduler + telemetry CPU |",
        names
            .iter()
            .map(|n| format!("{n}: img/s, stall s"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|---|---|---|---|---|---|");
    let (_, static_runs) = results
        .iter()
        .find(|(mode, _)| *mode == "static")
        .ok_or("no static mode")?;
    let base: Vec<f64> = (0..3)
        .map(|p| {
            median(
                static_runs
                    .iter()
                    .map(|r| r.phases[p].images_per_s)
                    .collect(),
            )
        })
        .collect();
    for (mode, runs) in &results {
        let cells: Vec<String> = (0..3)
            .map(|p| {
                let ips = median(runs.iter().map(|r| r.phases[p].images_per_s).collect());
                let stall = median(runs.iter().map(|r| r.phases[p].stall_s).collect());
                format!(
                    "{ips:.0} ({:.2}x static), {stall:.1}",
                    ips / base[p].max(1e-9)
                )
            })
            .collect();
        let reacted: Vec<String> = (1..3)
            .map(|p| {
                let times: Vec<String> = runs
                    .iter()
                    .map(|r| {
                        r.phases[p]
                            .reacted_s
                            .map_or("-".into(), |t| format!("{t:.1}"))
                    })
                    .collect();
                times.join("/")
            })
            .collect();
        let share: Vec<String> = (0..3)
            .map(|p| {
                let shares: Vec<f64> = runs
                    .iter()
                    .filter_map(|r| r.phases[p].policy_share)
                    .collect();
                if shares.is_empty() {
                    "-".into()
                } else {
                    format!("{:.0}%", median(shares) * 100.0)
                }
            })
            .collect();
        let cpu = median(
            runs.iter()
                .map(|r| (r.scheduler_cpu_s + r.telemetry_cpu_s) / r.seconds * 100.0)
                .collect(),
        );
        println!(
            "| {mode} | {} | {} | {} | {cpu:.2}% of a core |",
            cells.join(" | "),
            reacted.join("; "),
            share.join(" / ")
        );
    }
    println!(
        "\n{} runs, {} s per phase, {} images, {READERS} readers, {cores} cores; medians over runs.",
        a.runs, a.phase, a.images
    );
    Ok(())
}
