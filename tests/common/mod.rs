//! Shared harness of the real-mount tests: a source tree in a temporary directory, the `prepfs`
//! binary mounted over it in the foreground, and an unmount that always runs.

#![allow(dead_code)]

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

/// A foreground prepfs mount over `src`, unmounted on drop.
pub struct TestMount {
    pub dir: tempfile::TempDir,
    pub src: PathBuf,
    pub mnt: PathBuf,
    pub child: Option<Child>,
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
        }
    }

    /// Mounts in the foreground with `extra` flags and waits until the mount answers.
    pub fn mount(&mut self, extra: &[&str]) {
        self.mount_logging(extra, "warn,fuser=error", Stdio::inherit());
    }

    /// Like `mount`, with the daemon's log filtered by `rust_log` (RUST_LOG syntax) and written
    /// to `log` (a foreground prepfs logs to stderr; `--log-file` is for the detached daemon).
    pub fn mount_logged(&mut self, extra: &[&str], rust_log: &str, log: &Path) {
        let file = std::fs::File::create(log).expect("create the log file");
        self.mount_logging(extra, rust_log, file.into());
    }

    fn mount_logging(&mut self, extra: &[&str], rust_log: &str, stderr: Stdio) {
        let child = prepfs()
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

    /// The parsed stats.json of the mount.
    pub fn stats(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.m(".prepfs/stats.json")).expect("read stats.json");
        serde_json::from_str(&text).expect("stats.json parses")
    }

    /// Unmounts and returns the daemon's exit status.
    pub fn unmount(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = prepfs().arg("umount").arg(&self.mnt).output();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        self.unmount();
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
