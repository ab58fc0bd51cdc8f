//! `prepfs demo`, the README's first command's end, run as a user would: its epochs, its summary
//! of the two comparisons, and that it leaves nothing behind. A test binary of its own: as root
//! the demo drops the machine's page and dentry caches between its sides, which tests of other
//! mounts running beside it would see.

mod common;

use std::fs;
use std::path::Path;

/// Runs `prepfs demo --files FILES --memory 72` and returns its stdout; panics with its stderr
/// unless it succeeds.
fn demo(files: &str) -> String {
    let out = common::prepfs()
        .args(["demo", "--files", files, "--memory", "72"])
        .env("RUST_LOG", "warn,fuser=error")
        .output()
        .expect("demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn demo_runs_two_epochs_and_the_second_is_all_hits() {
    // The smallest slow-storage comparison prepfs allows (its headroom is 64 MiB).
    let stdout = demo("80");
    assert!(
        // Epoch 1 reads from the source, though prefetch may already turn some reads into hits.
        stdout.contains("epoch 1: 80 files, ") && stdout.contains("every byte matched the source"),
        "{stdout}"
    );
    assert!(
        stdout.contains("epoch 2: 80 files") && stdout.contains("cache hit rate 100.0%"),
        "{stdout}"
    );
    assert!(stdout.contains("Unmounted and cleaned up"), "{stdout}");
}

#[test]
fn demo_summary_shows_both_comparisons_on_one_screen_and_leaves_nothing_behind() {
    let stdout = demo("30");
    let summary: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("=== prepfs demo: summary"))
        .collect();
    assert!(
        !summary.is_empty() && summary.len() <= 25,
        "{} lines:\n{stdout}",
        summary.len()
    );
    let summary = summary.join("\n");
    // As root with cgroup v1 (how the suite runs) the slow-storage comparison runs; elsewhere the
    // summary says in one line why it was skipped.
    let sandboxed = rustix::process::geteuid().is_root()
        && Path::new("/sys/fs/cgroup/blkio/cgroup.procs").exists();
    if sandboxed {
        for epoch in ["epoch 1", "epoch 2", "epoch 3"] {
            assert!(summary.contains(epoch), "{summary}");
        }
        assert!(
            summary.contains("page cache") && summary.contains("prepfs (--cache-mem 8M)"),
            "{summary}"
        );
        assert!(
            summary.contains("MB read") && summary.contains("epochs 2+"),
            "{summary}"
        );
    } else {
        assert!(
            summary.contains("Slow storage comparison skipped: "),
            "{summary}"
        );
    }
    for expected in [
        "decoding in the loader",
        "prepfs view",
        "images/s",
        "CPU ms/image",
        "--view train=",
        "np.load(",
        "prepfs top",
        "stats.json",
        "docs/",
    ] {
        assert!(summary.contains(expected), "{expected}: {summary}");
    }
    // Nothing of the run is left: no mount, loop device or cgroup of the demo's sandbox.
    let mounts = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let work = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Mounted at "))
        .and_then(|l| l.split("/mnt ").next())
        .expect("the demo names its mount");
    assert!(!mounts.contains(work), "{work} left mounted");
    assert!(!Path::new(work).exists(), "{work} left behind");
    if sandboxed {
        let losetup = std::process::Command::new("losetup")
            .arg("--list")
            .output()
            .expect("losetup");
        assert!(!String::from_utf8_lossy(&losetup.stdout).contains(work));
    }
}
