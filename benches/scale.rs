//! Scale benchmark: 100,000 and 1,000,000 small files in one directory (and, when asked, more
//! in a tree of class directories) through a real mount.
//!
//! Run with `cargo bench --bench scale` (as root, with /dev/fuse); `-- --quick` runs 2,000 files
//! once and checks what it can check without timing (every file listed and read through the
//! mount, every open seen by the planner or counted as dropped): test.sh runs it. Measures, per
//! file count: the mount's start (the command until stats.json answers), `ls -l` and
//! `find -type f` once listed against the same commands on the source directory (interleaved,
//! medians, the ratio mount/native), the daemon's resident memory per file after the metadata
//! walk and after reading every file twice (sorted, then shuffled, as a loader's epochs do), the
//! planner's CPU per open and the files it looked at per open (`prefetch.planner.*`), the
//! daemon's whole CPU per open during the reads, and opens the planner dropped.
//!
//! Past `FLAT_MAX` files (or at any count with `PREPFS_SCALE_TREE=1`, to tell what the tree
//! costs from what the count costs) the dataset is a tree, as ImageNet-21k's is: directories of
//! `PER_DIR` files, listed with `ls -lR` instead of `ls -l`, and the RAM cache grows with the
//! count (`cache_mem`). The files are sparse (a size, no blocks): 1M of them take inodes, not
//! disk. Knobs (environment): `PREPFS_BENCH_DIR` (where the dataset lives, default /var/tmp; it
//! is kept between runs, as `prepfs-scale-N` or `prepfs-scale-tree-N`), `PREPFS_SCALE_COUNTS`
//! (file counts, default `100000,1000000`), `PREPFS_BENCH_REPS` (listing repetitions, default 5;
//! 0 lists nothing), `PREPFS_SCALE_PASS_SECONDS` (each read pass stops after that long: a
//! 10M-file pass takes about 45 minutes), `PREPFS_SCALE_BIN` (another prepfs binary to measure,
//! e.g. a build of an older commit).
//! Mounts are always unmounted, also on panic. Benchmarks report numbers; they never assert
//! timing.

#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/measure.rs"]
mod measure;

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use measure::{loadavg, median};

/// The binary under test, built by cargo for this bench.
const PREPFS: &str = env!("CARGO_BIN_EXE_prepfs");
/// Bytes of each file: a small sample's order of magnitude, sparse on the source.
const FILE_SIZE: u64 = 512;
/// RAM cache budget up to 1M files: holds their bytes and entries with room to spare.
const CACHE_MEM_BYTES: u64 = 3 << 30;
/// The most files a dataset keeps in one directory; more make a tree.
const FLAT_MAX: usize = 1_000_000;
/// Files per directory of a tree, about an ImageNet class's.
const PER_DIR: usize = 1_000;
/// The quick mode's files.
const QUICK_FILES: usize = 2_000;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let counts: Vec<usize> = if quick {
        vec![QUICK_FILES]
    } else {
        std::env::var("PREPFS_SCALE_COUNTS")
            .ok()
            .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![100_000, 1_000_000])
    };
    let reps: usize = if quick {
        1
    } else {
        std::env::var("PREPFS_BENCH_REPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5)
    };
    let pass_limit = std::env::var("PREPFS_SCALE_PASS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs_f64);
    let binary = std::env::var("PREPFS_SCALE_BIN").unwrap_or_else(|_| PREPFS.to_owned());
    let parent = std::env::var_os("PREPFS_BENCH_DIR")
        .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    eprintln!(
        "prepfs scale bench: binary {binary}, load at start: {}",
        loadavg()
    );
    // Quick runs leave nothing behind; full runs keep their datasets (creating 1M files takes
    // a minute).
    let scratch = quick.then(|| {
        tempfile::Builder::new()
            .prefix("prepfs-scale-")
            .tempdir_in(&parent)
            .expect("create scratch dir")
    });
    let base = scratch
        .as_ref()
        .map_or(parent.clone(), |s| s.path().to_path_buf());
    println!(
        "| files | mount s | ls -l native s | ls -l mount s | ratio | find native s | find mount s | ratio | RSS B/file after stat | RSS B/file after reads | planner us/open | planner candidates/open | daemon CPU us/open | dropped opens |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in counts {
        let source = dataset(&base, n);
        let row = measure(&binary, &source, n, reps, pass_limit, quick);
        println!("{row}");
    }
    eprintln!("load at end: {}", loadavg());
}

/// `n` sparse files of `FILE_SIZE` bytes under `base` (see `name`), made once.
fn dataset(base: &Path, n: usize) -> PathBuf {
    let layout = if tree(n) && n <= FLAT_MAX {
        "tree-"
    } else {
        ""
    };
    let dir = base.join(format!("prepfs-scale-{layout}{n}"));
    let data = dir.join("data");
    let done = dir.join("complete");
    if done.exists() {
        return data;
    }
    let t = Instant::now();
    std::fs::create_dir_all(&data).expect("mkdir dataset");
    for i in 0..n {
        let path = data.join(name(i, n));
        if i % PER_DIR == 0 && tree(n) {
            std::fs::create_dir_all(path.parent().expect("a class directory"))
                .expect("mkdir class");
        }
        let f = File::create(path).expect("create file");
        f.set_len(FILE_SIZE).expect("size file");
    }
    File::create(&done).expect("mark dataset complete");
    eprintln!("{n} files made in {:.1?}", t.elapsed());
    data
}

/// Whether a dataset of `n` files is a tree: past `FLAT_MAX` files, or when
/// `PREPFS_SCALE_TREE=1` says so.
fn tree(n: usize) -> bool {
    n > FLAT_MAX || std::env::var_os("PREPFS_SCALE_TREE").is_some_and(|v| v == "1")
}

/// File `i` of a dataset of `n`: flat unless `tree(n)`, else in class directories of
/// `PER_DIR` files.
fn name(i: usize, n: usize) -> String {
    if tree(n) {
        format!("n{:08}/n{:08}_{i:08}.JPEG", i / PER_DIR, i / PER_DIR)
    } else {
        format!("n{:08}_{i:07}.JPEG", i % 1000)
    }
}

/// The listing command for a dataset of `n` files and the lines it prints: `ls -l` of the one
/// directory (the files and a total line), or `ls -lR` of the tree (a header and a total for
/// the top, its directories, and per directory a blank line, a header, a total and its files).
fn listing(n: usize) -> (&'static [&'static str], usize) {
    if tree(n) {
        let dirs = n.div_ceil(PER_DIR);
        (&["-lR"], 2 + dirs + 3 * dirs + n)
    } else {
        (&["-l"], n + 1)
    }
}

/// The RAM cache budget for `n` files: `CACHE_MEM_BYTES`, or 1 KB per file past it.
fn cache_mem(n: usize) -> String {
    CACHE_MEM_BYTES.max(n as u64 * 1000).to_string()
}

/// One row of the table for `n` files.
fn measure(
    binary: &str,
    source: &Path,
    n: usize,
    reps: usize,
    pass_limit: Option<Duration>,
    quick: bool,
) -> String {
    let mnt = tempfile::Builder::new()
        .prefix("prepfs-scale-mnt-")
        .tempdir()
        .expect("mountpoint");
    let t = Instant::now();
    let mount = MountGuard::mount(binary, source, mnt.path(), &cache_mem(n));
    let mount_s = t.elapsed().as_secs_f64();
    let rss_empty = mount.rss();

    // Listings: the first through the mount (cold) is not counted; then each repetition lists
    // natively and through the mount, interleaved (none at all with 0 repetitions).
    let (ls_args, ls_lines) = listing(n);
    if reps > 0 {
        let listed = timed_count("ls", ls_args, mnt.path()).1;
        assert_eq!(listed, ls_lines, "ls lists every file (and its headers)");
    }
    let (mut ls, mut find) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let native = timed_count("ls", ls_args, source).0;
        let (through, lines) = timed_count("ls", ls_args, mnt.path());
        assert_eq!(lines, ls_lines);
        ls.push((native, through));
        let native = timed_count("find", &["-type", "f"], source).0;
        let (through, lines) = timed_count("find", &["-type", "f"], mnt.path());
        assert_eq!(lines, n, "find lists every file");
        find.push((native, through));
    }
    let rss_listed = mount.rss();

    // Two passes over every file: sorted, then shuffled.
    let mut names: Vec<String> = (0..n).map(|i| name(i, n)).collect();
    names.sort();
    let cpu = mount.daemon_cpu();
    let mut buf = Vec::new();
    let mut opens = 0u64;
    for pass in 0..2 {
        if pass == 1 {
            fastrand::Rng::with_seed(7).shuffle(&mut names);
        }
        let started = Instant::now();
        for f in &names {
            if pass_limit.is_some_and(|limit| started.elapsed() >= limit) {
                break;
            }
            opens += 1;
            buf.clear();
            File::open(mnt.path().join(f))
                .and_then(|mut file| file.read_to_end(&mut buf))
                .expect("read a file through the mount");
            assert_eq!(buf.len() as u64, FILE_SIZE);
        }
    }
    let daemon_cpu = mount.daemon_cpu() - cpu;
    // Let the planner take what is queued before reading its counters.
    std::thread::sleep(Duration::from_millis(500));
    let rss_read = mount.rss();
    let stats = mount.stats();
    let prefetch = &stats["prefetch"];
    let dropped = prefetch["events_dropped"].as_u64().unwrap_or(0);
    let planner = &prefetch["planner"];
    let planner_us = match (planner["seconds"].as_f64(), planner["opens"].as_u64()) {
        (Some(s), Some(opens)) if opens > 0 => format!("{:.1}", s * 1e6 / opens as f64),
        // A build without the planner's counters.
        _ => "-".to_owned(),
    };
    // Files the planner looked at per open (its predictors' candidates and plans).
    let planner_work = match (planner["work"].as_u64(), planner["opens"].as_u64()) {
        (Some(w), Some(opens)) if opens > 0 => format!("{:.0}", w as f64 / opens as f64),
        _ => "-".to_owned(),
    };
    if quick {
        let opens = planner["opens"].as_u64().expect("prefetch.planner.opens");
        assert_eq!(
            opens + dropped,
            opens,
            "every open is planned or counted as dropped"
        );
    }
    let per_file = |rss: u64| (rss.saturating_sub(rss_empty)) as f64 / n as f64;
    let ratio = |v: &[(f64, f64)]| {
        let native = median(&v.iter().map(|p| p.0).collect::<Vec<_>>());
        let through = median(&v.iter().map(|p| p.1).collect::<Vec<_>>());
        (native, through, through / native)
    };
    let listings = if reps > 0 {
        let (ls_n, ls_m, ls_r) = ratio(&ls);
        let (find_n, find_m, find_r) = ratio(&find);
        format!("{ls_n:.2} | {ls_m:.2} | {ls_r:.2}x | {find_n:.2} | {find_m:.2} | {find_r:.2}x")
    } else {
        "- | - | - | - | - | -".to_owned()
    };
    // Passes cut short by `PREPFS_SCALE_PASS_SECONDS` say how far they got.
    let files = if opens < 2 * n as u64 {
        format!("{n} ({opens} opens)")
    } else {
        n.to_string()
    };
    format!(
        "| {files} | {mount_s:.2} | {listings} | {:.0} | {:.0} | {planner_us} | {planner_work} | {:.1} | {dropped} |",
        per_file(rss_listed),
        per_file(rss_read),
        daemon_cpu * 1e6 / opens.max(1) as f64,
    )
}

/// Runs `cmd dir args` with its output counted, not kept: (seconds, lines).
fn timed_count(cmd: &str, args: &[&str], dir: &Path) -> (f64, usize) {
    let t = Instant::now();
    let mut child = Command::new(cmd)
        .arg(dir)
        .args(args)
        .env("LC_ALL", "C")
        .stdout(Stdio::piped())
        .spawn()
        .expect("run a listing");
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_end(&mut out)
        .expect("read the listing");
    assert!(child.wait().expect("wait").success(), "{cmd} failed");
    let secs = t.elapsed().as_secs_f64();
    (secs, out.iter().filter(|&&b| b == b'\n').count())
}

/// A mounted prepfs; unmounts on drop, so panics never leave a mount behind.
struct MountGuard {
    binary: String,
    path: PathBuf,
    daemon: Option<u32>,
}

impl MountGuard {
    fn mount(binary: &str, source: &Path, mnt: &Path, cache_mem: &str) -> MountGuard {
        let status = Command::new(binary)
            .arg("mount")
            .arg(source)
            .arg(mnt)
            .args(["--cache-mem", cache_mem])
            .status()
            .expect("run prepfs mount");
        assert!(status.success(), "prepfs mount failed: {status}");
        let mut guard = MountGuard {
            binary: binary.to_owned(),
            path: mnt.to_path_buf(),
            daemon: None,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !guard.path.join(".prepfs/stats.json").exists() {
            assert!(Instant::now() < deadline, "mount not ready");
            std::thread::sleep(Duration::from_millis(5));
        }
        guard.daemon = daemon::daemon_of(&guard.path);
        guard
    }

    /// The daemon's user + system CPU so far, in seconds.
    fn daemon_cpu(&self) -> f64 {
        let Some(stat) = self
            .daemon
            .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        else {
            return 0.0;
        };
        let Some(at) = stat.rfind(')') else {
            return 0.0;
        };
        let f: Vec<&str> = stat[at + 2..].split_whitespace().collect();
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
            .sum();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
        ticks as f64 / hz as f64
    }

    /// The daemon's resident memory, in bytes.
    fn rss(&self) -> u64 {
        let status = self
            .daemon
            .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    fn stats(&self) -> serde_json::Value {
        let text =
            std::fs::read_to_string(self.path.join(".prepfs/stats.json")).expect("read stats");
        serde_json::from_str(&text).expect("parse stats.json")
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let ok = Command::new(&self.binary)
            .arg("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new(&self.binary)
                .args(["umount", "--lazy"])
                .arg(&self.path)
                .status();
        }
    }
}
