//! Slow storage and fair memory, for the epochs benchmark and `prepfs demo`: a loop-mounted ext4
//! image, cgroup v1 memory and blkio groups, page-cache dropping, device counters, and the
//! teardown of all of it.
//!
//! Owns every piece of system state its user creates. Each piece is registered for teardown
//! the moment it exists and torn down when its guard drops, on panic, or on SIGINT/SIGTERM/SIGHUP
//! (a signal thread runs every pending teardown, then exits 130); `clear_leftovers` removes what a
//! killed run left behind. Must never touch anything it did not create (cgroup names carry
//! `PREFIX` and a tag of the run's working directory, so a run never removes the groups of one
//! running beside it in another directory).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Prefix of every cgroup this harness creates.
pub const PREFIX: &str = "prepfs-sandbox";
/// `PREFIX` and the working directory's tag: the start of this run's cgroup names.
static GROUP_PREFIX: OnceLock<String> = OnceLock::new();
const MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";
const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";
const CPUACCT_ROOT: &str = "/sys/fs/cgroup/cpuacct";

/// One piece of system state to undo.
#[derive(Debug, Clone)]
enum Teardown {
    /// A process: SIGTERM, then SIGKILL if it has not exited after a while.
    Stop(u32),
    Unmount(PathBuf),
    Detach(PathBuf),
    RemoveCgroup(PathBuf),
}

static PENDING: Mutex<Vec<(u64, Teardown)>> = Mutex::new(Vec::new());
/// Set once a signal started the teardown: from then on only the teardown thread exits.
static TEARING_DOWN: AtomicBool = AtomicBool::new(false);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Undoes its piece of state when dropped (unless `disarm`ed).
#[must_use]
pub struct Guard(u64);

impl Guard {
    fn new(teardown: Teardown) -> Guard {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        lock_pending().push((id, teardown));
        Guard(id)
    }

    /// Forgets the teardown (the state was undone another way).
    pub fn disarm(self) {
        take(self.0);
        std::mem::forget(self);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(teardown) = take(self.0) {
            run(&teardown);
        }
    }
}

fn lock_pending() -> std::sync::MutexGuard<'static, Vec<(u64, Teardown)>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

fn take(id: u64) -> Option<Teardown> {
    let mut pending = lock_pending();
    let at = pending.iter().position(|(i, _)| *i == id)?;
    Some(pending.remove(at).1)
}

/// On SIGINT, SIGTERM or SIGHUP: undo everything still pending, newest first, and exit 130.
pub fn install_signal_teardown() -> Result<(), String> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    std::thread::Builder::new()
        .name("teardown".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                TEARING_DOWN.store(true, Ordering::SeqCst);
                eprintln!(
                    "\nprepfs sandbox: signal {signal}; cleaning up mounts, loop devices, cgroups"
                );
                let pending: Vec<Teardown> =
                    lock_pending().drain(..).rev().map(|(_, t)| t).collect();
                for teardown in &pending {
                    run(teardown);
                }
                std::process::exit(130);
            }
        })
        .map_err(|e| format!("cannot start the teardown thread: {e}"))?;
    Ok(())
}

/// Exits with `code`, unless a signal's teardown is running: then waits for it to exit 130
/// (the main thread failing because its processes were just stopped must not cut it short).
pub fn exit(code: i32) -> ! {
    if TEARING_DOWN.load(Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    std::process::exit(code)
}

fn run(teardown: &Teardown) {
    match teardown {
        Teardown::Stop(pid) => stop_process(*pid),
        Teardown::Unmount(path) => {
            if is_mounted(path) && !quiet(Command::new("umount").arg(path)) {
                quiet(Command::new("umount").arg("-l").arg(path));
            }
        }
        Teardown::Detach(dev) => {
            quiet(Command::new("losetup").arg("-d").arg(dev));
        }
        Teardown::RemoveCgroup(dir) => remove_cgroup(dir),
    }
}

fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn alive(pid: u32) -> bool {
    // A zombie has exited; it only waits for its parent to collect it.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

fn stop_process(pid: u32) {
    let pid_t = pid as libc::pid_t;
    // SAFETY: kill(2) has no memory effects; a stale pid at worst gets ESRCH.
    unsafe { libc::kill(pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        // SAFETY: as above.
        unsafe { libc::kill(pid_t, libc::SIGKILL) };
    }
}

/// Registers a started process to be stopped at teardown.
pub fn guard_process(pid: u32) -> Guard {
    Guard::new(Teardown::Stop(pid))
}

/// Registers a mount point to be unmounted at teardown.
pub fn guard_mount(path: &Path) -> Guard {
    Guard::new(Teardown::Unmount(path.to_owned()))
}

/// Whether `path` is a mount point (from /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    mount_points().iter().any(|m| m == path)
}

fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .collect()
}

/// Runs a command that must succeed; its stderr becomes the error.
pub fn must(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{:?} failed: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The start of the names of the cgroups of runs in `workdir`: `PREFIX` and a hash of its path.
fn group_prefix_of(workdir: &Path) -> String {
    let path = std::path::absolute(workdir).unwrap_or_else(|_| workdir.to_owned());
    let tag = xxhash_rust::xxh3::xxh3_64(path.as_os_str().as_encoded_bytes());
    format!("{PREFIX}-{:08x}", tag as u32)
}

/// This run's cgroup name prefix, fixed by the first `clear_leftovers`.
fn group_prefix() -> &'static str {
    GROUP_PREFIX.get().map_or(PREFIX, String::as_str)
}

/// Makes `workdir` this run's (its cgroups are named after it; the first call decides) and
/// removes what an interrupted or killed earlier run in it left: mounts under it, loop devices
/// on its images, and its cgroups. Call before creating any cgroup.
pub fn clear_leftovers(workdir: &Path) {
    let prefix = GROUP_PREFIX.get_or_init(|| group_prefix_of(workdir));
    let mut mounts: Vec<PathBuf> = mount_points()
        .into_iter()
        .filter(|m| m.starts_with(workdir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in mounts {
        eprintln!("prepfs sandbox: unmounting leftover {}", m.display());
        run(&Teardown::Unmount(m));
    }
    if let Ok(listing) =
        must(Command::new("losetup").args(["--list", "--noheadings", "-O", "NAME,BACK-FILE"]))
    {
        for line in listing.lines() {
            let mut cols = line.split_whitespace();
            if let (Some(dev), Some(back)) = (cols.next(), cols.next())
                && Path::new(back).starts_with(workdir)
            {
                eprintln!("prepfs sandbox: detaching leftover {dev}");
                run(&Teardown::Detach(dev.into()));
            }
        }
    }
    for root in [MEMORY_ROOT, BLKIO_ROOT, CPUACCT_ROOT] {
        for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("{prefix}-"))
            {
                remove_cgroup(&entry.path());
            }
        }
    }
}

/// Whether this process can build a sandbox: root, FUSE, cgroup v1 memory, blkio and cpuacct,
/// drop_caches, and the loop-device and ext4 tools; the first thing missing, in one line.
pub fn preflight() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("must run as root (loop devices, cgroups, drop_caches)".into());
    }
    for path in [
        "/dev/fuse",
        "/sys/fs/cgroup/memory/cgroup.procs",
        "/sys/fs/cgroup/blkio/cgroup.procs",
        "/sys/fs/cgroup/cpuacct/cgroup.procs",
        "/proc/sys/vm/drop_caches",
    ] {
        if !Path::new(path).exists() {
            return Err(format!(
                "{path} is missing: this needs FUSE and cgroup v1 memory, blkio and cpuacct"
            ));
        }
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if must(Command::new("sh").args(["-c", &format!("command -v {tool}")])).is_err() {
            return Err(format!("{tool} not found (util-linux / e2fsprogs)"));
        }
    }
    Ok(())
}

/// CPU time process `pid` and all its threads used so far, user and system, in seconds
/// (/proc/PID/stat utime + stime; 0 if it is gone).
pub fn process_cpu_seconds(pid: u32) -> f64 {
    // SAFETY: sysconf(3) reads a constant of the system; no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // Fields after the command name (which may hold spaces), from field 3 on: utime and
            // stime are fields 14 and 15.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) as f64 / ticks)
        })
        .unwrap_or(0.0)
}

/// CPU time the machine's cores were not idle so far, in seconds: every process, interrupts, and
/// time the hypervisor gave to others (steal); /proc/stat's `cpu` line without idle and iowait
/// (guest time is already in user).
pub fn machine_cpu_seconds() -> f64 {
    // SAFETY: as in `process_cpu_seconds`.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|stat| {
            let line = stat.lines().find(|l| l.starts_with("cpu "))?;
            let fields: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .map(|f| f.parse().unwrap_or(0))
                .collect();
            // user nice system idle iowait irq softirq steal
            let busy: u64 = fields
                .iter()
                .take(8)
                .enumerate()
                .filter(|(i, _)| *i != 3 && *i != 4)
                .map(|(_, v)| v)
                .sum();
            Some(busy as f64 / ticks)
        })
        .unwrap_or(0.0)
}

/// The parsed `.prepfs/stats.json` of the mount at `mountpoint` (null if unreadable).
pub fn read_stats(mountpoint: &Path) -> serde_json::Value {
    std::fs::read(mountpoint.join(".prepfs/stats.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Drops clean page cache, dentries and inodes system-wide, so the next run starts cold.
pub fn drop_caches() -> Result<(), String> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| format!("cannot drop caches: {e}"))
}

/// An ext4 image attached read-only to a loop device (direct I/O, so the image file's own page
/// cache never serves reads) and mounted read-only.
pub struct SlowDisk {
    /// The loop device, e.g. /dev/loop3.
    pub device: PathBuf,
    /// "major:minor" of the loop device, as cgroup files want it.
    pub devnum: String,
    /// Where its filesystem is mounted.
    pub mountpoint: PathBuf,
    _unmount: Guard,
    _detach: Guard,
}

impl SlowDisk {
    /// Attaches `image` and mounts it at `mountpoint`, read-only unless `writable`.
    pub fn attach(image: &Path, mountpoint: &Path, writable: bool) -> Result<SlowDisk, String> {
        let mut losetup = Command::new("losetup");
        losetup.args(["--find", "--show"]);
        if !writable {
            losetup.args(["--read-only", "--direct-io=on"]);
        }
        let device = PathBuf::from(must(losetup.arg(image))?);
        let detach = Guard::new(Teardown::Detach(device.clone()));
        let name = device
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let devnum = std::fs::read_to_string(format!("/sys/block/{name}/dev"))
            .map_err(|e| format!("{}: {e}", device.display()))?
            .trim()
            .to_owned();
        std::fs::create_dir_all(mountpoint)
            .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
        let options = if writable { "rw,noatime" } else { "ro,noatime" };
        must(
            Command::new("mount")
                .args(["-o", options])
                .arg(&device)
                .arg(mountpoint),
        )?;
        Ok(SlowDisk {
            device,
            devnum,
            mountpoint: mountpoint.to_owned(),
            _unmount: guard_mount(mountpoint),
            _detach: detach,
        })
    }

    /// Read requests completed and bytes read by the device since it was attached
    /// (/proc/diskstats: reads completed, sectors of 512 B read).
    pub fn reads(&self) -> (u64, u64) {
        let name = self
            .device
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        std::fs::read_to_string("/proc/diskstats")
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cols| cols.get(2) == Some(&name.as_str()))
            .map_or((0, 0), |cols| {
                let field = |i: usize| cols.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
                (field(3), field(5) * 512)
            })
    }
}

/// What a cgroup does to its members.
pub struct Limits {
    /// memory.limit_in_bytes, if any.
    pub memory: Option<u64>,
    /// Read throttle on one device: ("major:minor", bytes/s, IOs/s).
    pub throttle: Option<(String, u64, u64)>,
}

/// A memory, a blkio and a cpuacct cgroup of the same name, joined together by the processes
/// that `command` starts.
pub struct Cgroup {
    memory: PathBuf,
    blkio: PathBuf,
    cpuacct: PathBuf,
    _guards: [Guard; 3],
}

impl Cgroup {
    /// Creates `PREFIX-<workdir tag>-name` in the three hierarchies with `limits`.
    pub fn create(name: &str, limits: &Limits) -> Result<Cgroup, String> {
        let dir = format!("{}-{name}", group_prefix());
        let memory = Path::new(MEMORY_ROOT).join(&dir);
        let blkio = Path::new(BLKIO_ROOT).join(&dir);
        let cpuacct = Path::new(CPUACCT_ROOT).join(&dir);
        let mut guards = Vec::new();
        for path in [&memory, &blkio, &cpuacct] {
            std::fs::create_dir(path).map_err(|e| format!("{}: {e}", path.display()))?;
            guards.push(Guard::new(Teardown::RemoveCgroup(path.clone())));
        }
        let write = |path: PathBuf, value: String| {
            std::fs::write(&path, &value).map_err(|e| format!("{} <- {value}: {e}", path.display()))
        };
        if let Some(bytes) = limits.memory {
            write(memory.join("memory.limit_in_bytes"), bytes.to_string())?;
        }
        if let Some((dev, bps, iops)) = &limits.throttle {
            write(
                blkio.join("blkio.throttle.read_bps_device"),
                format!("{dev} {bps}"),
            )?;
            write(
                blkio.join("blkio.throttle.read_iops_device"),
                format!("{dev} {iops}"),
            )?;
        }
        let guards: [Guard; 3] = guards.try_into().map_err(|_| "three guards".to_owned())?;
        Ok(Cgroup {
            memory,
            blkio,
            cpuacct,
            _guards: guards,
        })
    }

    /// Throttles its members' reads from device `dev` ("major:minor") to `bytes_per_s`, or lifts
    /// the throttle (`None`), from now on.
    pub fn throttle_reads(&self, dev: &str, bytes_per_s: Option<u64>) -> Result<(), String> {
        let path = self.blkio.join("blkio.throttle.read_bps_device");
        let value = format!("{dev} {}", bytes_per_s.unwrap_or(0));
        std::fs::write(&path, &value).map_err(|e| format!("{} <- {value}: {e}", path.display()))
    }

    /// A command that joins this cgroup, then runs `program` with `args`.
    pub fn command(&self, program: &Path, args: &[String]) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(r#"for g in "$1" "$2" "$3"; do echo $$ > "$g/cgroup.procs" || exit 1; done; shift 3 && exec "$@""#)
            .arg("sh")
            .arg(&self.memory)
            .arg(&self.blkio)
            .arg(&self.cpuacct)
            .arg(program)
            .args(args);
        cmd
    }

    /// CPU time its members used so far, user and system, in seconds (cpuacct.usage).
    pub fn cpu_seconds(&self) -> f64 {
        std::fs::read_to_string(self.cpuacct.join("cpuacct.usage"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(0.0, |ns| ns as f64 / 1e9)
    }

    /// memory.stat of this group.
    pub fn memory_stat(&self) -> HashMap<String, u64> {
        std::fs::read_to_string(self.memory.join("memory.stat"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter_map(|(k, v)| Some((k.to_owned(), v.trim().parse().ok()?)))
            .collect()
    }

    /// One of this group's memory-controller files.
    pub fn memory_path(&self, file: &str) -> PathBuf {
        self.memory.join(file)
    }

    /// A number from one of this group's memory files (0 if unreadable).
    pub fn memory_value(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.memory_path(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Memory its members cannot give back under pressure, now: anonymous and shared memory,
    /// mapped files (libraries, code) and kernel objects. Page cache that is not mapped is left
    /// out: that is what the limit lets the two sides compete for.
    pub fn footprint(&self) -> u64 {
        let stat = self.memory_stat();
        let get = |k: &str| stat.get(k).copied().unwrap_or(0);
        get("total_rss")
            + get("total_shmem")
            + get("total_mapped_file")
            + self.memory_value("memory.kmem.usage_in_bytes")
    }

    /// Makes the kernel reclaim everything it can from this group now (page cache, mapped files:
    /// its members then keep only what they touch again), by asking for a limit it cannot meet;
    /// the limit is then lifted again.
    pub fn squeeze(&self) {
        let limit = self.memory_path("memory.limit_in_bytes");
        let _ = std::fs::write(&limit, "1");
        let _ = std::fs::write(&limit, "-1");
    }

    /// Samples `footprint` every 20 ms until the returned watch is finished.
    pub fn watch_footprint(self: &Arc<Self>) -> PeakWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (group, flag) = (self.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(group.footprint());
                std::thread::sleep(Duration::from_millis(20));
            }
            peak.max(group.footprint())
        });
        PeakWatch { stop, thread }
    }
}

/// A running footprint sampler.
pub struct PeakWatch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl PeakWatch {
    /// Stops sampling; the largest footprint seen.
    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

fn remove_cgroup(dir: &Path) {
    for _ in 0..100 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs
            .lines()
            .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
        {
            // SAFETY: kill(2) has no memory effects.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("prepfs sandbox: could not remove cgroup {}", dir.display());
}

/// Starts `prepfs` with `args` inside `group`, its stderr to `log`, and waits (20 s at most) until
/// `mountpoint` answers. Returns the daemon with its guards: SIGTERM it, then free the mountpoint.
pub fn start_prepfs(
    group: &Cgroup,
    prepfs: &Path,
    args: &[String],
    mountpoint: &Path,
    log: &Path,
) -> Result<(Child, Guard, Guard), String> {
    std::fs::create_dir_all(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let log_file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = group
        .command(prepfs, args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("cannot start prepfs: {e}"))?;
    let stop_daemon = guard_process(child.id());
    let unmount = guard_mount(mountpoint);
    let stats = mountpoint.join(".prepfs/stats.json");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&stats).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("prepfs exited ({status}) before mounting:\n{tail}"));
        }
        if Instant::now() > deadline {
            return Err("prepfs did not mount within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((child, stop_daemon, unmount))
}
