//! Shared harness of the real-mount tests: a source tree in a temporary directory, the `prepfs`
//! binary mounted over it in the foreground, and an unmount that always runs.

#![allow(dead_code)]

pub mod cluster;
pub mod job;
pub mod jpeg;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn prepfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prepfs"))
}

/// Deterministic bytes for a file.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = vec![0u8; len];
    rng.fill(&mut out);
    out
}

/// Whether `path` is a mount point now.
pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let wanted = path.to_string_lossy().replace(' ', "\\040");
    mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m == wanted)
}

/// The filesystem type and source of the mount at `path` (`fuse.prepfs`, `prepfs:/data`), as
/// /proc/self/mountinfo shows them.
pub fn mount_type(path: &Path) -> Option<(String, String)> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let wanted = path.to_string_lossy().replace(' ', "\\040");
    mounts.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if left.split(' ').nth(4)? != wanted {
            return None;
        }
        let mut fields = right.split(' ');
        Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
    })
}

/// A foreground prepfs mount over `src`, unmounted on drop.
pub struct TestMount {
    pub dir: tempfile::TempDir,
    pub src: PathBuf,
    pub mnt: PathBuf,
    pub child: Option<Child>,
    /// Mount without dating the source's files back first (see `date_back`).
    pub keep_times: bool,
}

impl TestMount {
    /// An empty source directory and mountpoint (call `mount` after filling `src`).
    pub fn new() -> TestMount {
        let dir = tempfile::Builder::new()
            .prefix("prepfs-test-")
            .tempdir()
            .expect("tempdir");
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&src).expect("mkdir src");
        std::fs::create_dir(&mnt).expect("mkdir mnt");
        TestMount {
            dir,
            src: src.canonicalize().expect("canonical"),
            mnt: mnt.canonicalize().expect("canonical"),
            child: None,
            keep_times: false,
        }
    }

    /// Mounts in the foreground with `extra` flags and waits until the mount answers.
    pub fn mount(&mut self, extra: &[&str]) {
        self.mount_logging(extra, "warn,fuser=error", Stdio::inherit(), |_| ());
    }

    /// Like `mount`, with the daemon inside `group` from its start.
    pub fn mount_confined(&mut self, extra: &[&str], group: &MemoryCgroup) {
        self.mount_logging(extra, "warn,fuser=error", Stdio::inherit(), |c| {
            group.confine(c)
        });
    }

    /// Like `mount`, with the daemon's command prepared by `prepare` first (a cgroup, a network
    /// namespace).
    pub fn mount_prepared(&mut self, extra: &[&str], prepare: impl FnOnce(&mut Command)) {
        self.mount_logging(extra, "warn,fuser=error", Stdio::inherit(), prepare);
    }

    /// Like `mount`, with the daemon's log filtered by `rust_log` (RUST_LOG syntax) and written
    /// to `log` (a foreground prepfs logs to stderr; `--log-file` is for the detached daemon).
    pub fn mount_logged(&mut self, extra: &[&str], rust_log: &str, log: &Path) {
        let file = std::fs::File::create(log).expect("create the log file");
        self.mount_logging(extra, rust_log, file.into(), |_| ());
    }

    fn mount_logging(
        &mut self,
        extra: &[&str],
        rust_log: &str,
        stderr: Stdio,
        prepare: impl FnOnce(&mut Command),
    ) {
        if !self.keep_times {
            date_back(&self.src);
        }
        let mut command = prepfs();
        prepare(&mut command);
        let child = command
            .arg("mount")
            .arg(&self.src)
            .arg(&self.mnt)
            .arg("--foreground")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .env("RUST_LOG", rust_log)
            .spawn()
            .expect("spawn prepfs");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.mnt.join(".prepfs/stats.json").exists() {
            assert!(Instant::now() < deadline, "mount did not become ready");
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("prepfs exited early: {status}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Path inside the mount.
    pub fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Path inside the source.
    pub fn s(&self, rel: &str) -> PathBuf {
        self.src.join(rel)
    }

    /// Whether the daemon this mount started is still running.
    pub fn daemon_alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().expect("wait").is_none())
    }

    /// The parsed stats.json of the mount.
    pub fn stats(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.m(".prepfs/stats.json")).expect("read stats.json");
        serde_json::from_str(&text).expect("stats.json parses")
    }

    /// Unmounts and returns the daemon's exit status.
    pub fn unmount(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = prepfs().arg("umount").arg(&self.mnt).output();
        exit_within(&mut child, Duration::from_secs(20)).or_else(|| {
            let _ = child.kill();
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
            child.wait().ok()
        })
    }
}

/// `child`'s exit status once it has exited, waiting at most `limit`; `None` if it is still
/// running then.
pub fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Sets the mtime of every regular file under `dir` modified in the last minute an hour back, as
/// for a dataset written before its training starts: prepfs caches no bytes of a file modified
/// less than 2 s before they are read (it may still be being written; docs/SEMANTICS.md).
pub fn date_back(dir: &Path) {
    let now = std::time::SystemTime::now();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        if meta.is_dir() {
            date_back(&entry.path());
        } else if meta.is_file()
            && let Ok(mtime) = meta.modified()
            && now.duration_since(mtime).unwrap_or_default() < Duration::from_secs(60)
            && let Ok(file) = std::fs::File::open(entry.path())
        {
            let _ = file.set_modified(mtime - Duration::from_secs(3600));
        }
    }
}

/// Runs prepfs with `args` and returns its output.
pub fn run(args: &[&std::ffi::OsStr]) -> Output {
    prepfs()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run prepfs")
}

/// The Python of the client tests and examples: the environment `python/ensure-env` prepared
/// (`./test.sh` runs it once before any test). Tests never install anything: a missing or
/// half-made environment fails the test with how to prepare it; it is never skipped.
pub fn python() -> PathBuf {
    let ensure_env = concat!(env!("CARGO_MANIFEST_DIR"), "/python/ensure-env");
    let mut check = Command::new(ensure_env);
    check.arg("--check");
    let out = check.output().expect("run python/ensure-env --check");
    assert!(
        out.status.success(),
        "no complete Python environment: {}",
        described(&check, &out)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Runs `command` and returns its output, panicking with how it ended (exit code or signal),
/// its command line, stdout and stderr unless it exited 0.
pub fn run_checked(command: &mut Command) -> Output {
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(out.status.success(), "{}", described(command, &out));
    out
}

/// How a finished command ended, for a failure message: exit code or signal, the command line,
/// and its stdout and stderr (each said to be empty when it is).
pub fn described(command: &Command, out: &Output) -> String {
    use std::os::unix::process::ExitStatusExt;
    let ended = match (out.status.code(), out.status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!(
            "killed by signal {signal}{}",
            if out.status.core_dumped() {
                " (core dumped)"
            } else {
                ""
            }
        ),
        (None, None) => format!("ended: {}", out.status),
    };
    let stream = |name: &str, bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes);
        if text.trim().is_empty() {
            format!("{name}: (empty)")
        } else {
            format!("{name}:\n{text}")
        }
    };
    format!(
        "{ended}\ncommand: {command:?}\n{}\n{}",
        stream("stdout", &out.stdout),
        stream("stderr", &out.stderr)
    )
}

/// A memory cgroup of its own for a daemon under test (cgroup v1's memory controller where the
/// machine has it, else v2), removed on drop. Members join before they exec (`confine`), so a
/// daemon sees its limit from its first instruction on.
pub struct MemoryCgroup {
    dir: PathBuf,
    v1: bool,
}

impl MemoryCgroup {
    /// A new group limited to `limit` bytes (no swap), below this process's own group.
    pub fn new(limit: u64) -> MemoryCgroup {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let v1_root = Path::new("/sys/fs/cgroup/memory");
        let v1 = v1_root.join("memory.limit_in_bytes").exists();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let own_path = own
            .lines()
            .filter_map(|l| l.splitn(3, ':').nth(2).map(|p| (l, p)))
            .find(|(l, _)| {
                if v1 {
                    l.split(':')
                        .nth(1)
                        .is_some_and(|c| c.split(',').any(|c| c == "memory"))
                } else {
                    l.starts_with("0::")
                }
            })
            .map_or("/", |(_, p)| p)
            .trim_start_matches('/')
            .to_owned();
        let root = if v1 {
            v1_root
        } else {
            Path::new("/sys/fs/cgroup")
        };
        let name = format!(
            "prepfs-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let dir = root.join(own_path).join(name);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create the cgroup {}: {e}", dir.display()));
        let group = MemoryCgroup { dir, v1 };
        if v1 {
            group.write("memory.limit_in_bytes", &limit.to_string());
            // Swap would let the group exceed its limit instead of meeting the OOM killer.
            let _ = std::fs::write(
                group.dir.join("memory.memsw.limit_in_bytes"),
                limit.to_string(),
            );
            let _ = std::fs::write(group.dir.join("memory.swappiness"), "0");
        } else {
            group.write("memory.max", &limit.to_string());
            let _ = std::fs::write(group.dir.join("memory.swap.max"), "0");
        }
        group
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .unwrap_or_else(|e| panic!("cannot write {value} to {}: {e}", path.display()));
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// Makes `command`'s process join this group before it execs.
    pub fn confine(&self, command: &mut Command) {
        use std::os::unix::process::CommandExt;
        let procs =
            std::ffi::CString::new(self.dir.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .expect("cgroup path without NUL");
        // SAFETY: between fork and exec only async-signal-safe calls are made: open, write,
        // close on a path prepared before the fork.
        unsafe {
            command.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Processes the kernel's OOM killer killed in this group so far.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v1 {
            ("memory.oom_control", "oom_kill")
        } else {
            ("memory.events", "oom_kill")
        };
        self.read(file)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            for pid in self
                .read("cgroup.procs")
                .lines()
                .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
            {
                // SAFETY: kill(2) has no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
