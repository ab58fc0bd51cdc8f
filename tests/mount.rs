//! Real-mount tests: the `prepfs` binary mounted over generated trees, checked against the
//! source through the kernel.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{TestMount, is_mounted, pattern};

const MIB: usize = 1 << 20;

/// name -> (type, size, mode, symlink target) for every entry under `root`.
fn tree(root: &Path) -> BTreeMap<String, (String, u64, u32, Option<String>)> {
    fn walk(
        root: &Path,
        dir: &Path,
        out: &mut BTreeMap<String, (String, u64, u32, Option<String>)>,
    ) {
        for entry in fs::read_dir(dir).expect("read_dir") {
            let entry = entry.expect("entry");
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).expect("lstat");
            let rel = path
                .strip_prefix(root)
                .expect("prefix")
                .to_string_lossy()
                .into_owned();
            let kind = if meta.is_dir() {
                "dir"
            } else if meta.is_symlink() {
                "link"
            } else {
                "file"
            };
            let target = meta.is_symlink().then(|| {
                fs::read_link(&path)
                    .expect("readlink")
                    .to_string_lossy()
                    .into_owned()
            });
            let size = if meta.is_dir() { 0 } else { meta.len() };
            out.insert(rel, (kind.to_owned(), size, meta.mode() & 0o7777, target));
            if meta.is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn differential_tree_matches_source_byte_for_byte() {
    let mut t = TestMount::new();
    let sizes = [
        0,
        1,
        4095,
        4096,
        65_537,
        MIB - 1,
        MIB,
        MIB + 1,
        2 * MIB + 12_345,
    ];
    fs::create_dir_all(t.s("a/b/c")).expect("mkdir");
    fs::create_dir_all(t.s("empty_dir")).expect("mkdir");
    fs::create_dir_all(t.s("ünïcödé ✓/日本")).expect("mkdir");
    for (i, len) in sizes.iter().enumerate() {
        fs::write(t.s(&format!("a/b/f{i}.bin")), pattern(*len, i as u64)).expect("write");
    }
    fs::write(t.s("ünïcödé ✓/日本/画像 1.jpg"), pattern(1234, 99)).expect("write");
    fs::write(t.s("a/b/c/big.bin"), pattern(200 * MIB, 7)).expect("write big");
    fs::set_permissions(t.s("a/b/f2.bin"), fs::Permissions::from_mode(0o640)).expect("chmod");
    std::os::unix::fs::symlink("../b/f1.bin", t.s("a/b/c/rel_link")).expect("symlink");
    std::os::unix::fs::symlink("/etc/passwd", t.s("abs_link")).expect("symlink");
    std::os::unix::fs::symlink("loop", t.s("loop")).expect("symlink");
    t.mount(&["--cache-mem", "512M"]);

    assert_eq!(
        tree(&t.mnt),
        tree(&t.src),
        "names, types, sizes, modes and link targets match"
    );
    for pass in 0..2 {
        for (rel, (kind, ..)) in tree(&t.src) {
            if kind == "file" {
                assert!(
                    fs::read(t.mnt.join(&rel)).expect("read")
                        == fs::read(t.src.join(&rel)).expect("read"),
                    "pass {pass}: {rel} differs"
                );
            }
        }
    }
    let big_src = fs::File::open(t.s("a/b/c/big.bin")).expect("open");
    let big_mnt = fs::File::open(t.m("a/b/c/big.bin")).expect("open");
    let mut rng = fastrand::Rng::with_seed(3);
    for _ in 0..300 {
        let offset = rng.u64(0..200 * MIB as u64 + 10);
        let len = rng.usize(1..3 * MIB);
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        let na = big_src.read_at(&mut a, offset).expect("pread source");
        let nb = big_mnt.read_at(&mut b, offset).expect("pread mount");
        assert_eq!(na, nb, "length at offset {offset}");
        assert!(a[..na] == b[..nb], "bytes at offset {offset} len {len}");
    }
    drop((big_src, big_mnt));
    // The symlink loop is shown as a link and fails to resolve, as on any filesystem.
    assert!(
        fs::symlink_metadata(t.m("loop"))
            .expect("lstat")
            .is_symlink()
    );
    assert!(fs::read(t.m("loop")).is_err());
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
}

#[test]
fn concurrent_random_reads_never_mismatch() {
    let mut t = TestMount::new();
    let mut files = Vec::new();
    for i in 0..40u64 {
        let len = [1000, 100_000, MIB, MIB + 4097, 3 * MIB][i as usize % 5];
        let data = pattern(len, i);
        fs::write(t.s(&format!("f{i}")), &data).expect("write");
        files.push(data);
    }
    t.mount(&["--cache-mem", "24M"]);
    let files = std::sync::Arc::new(files);
    let deadline = Instant::now() + Duration::from_secs(4);
    let readers: Vec<_> = (0..8u64)
        .map(|r| {
            let (files, mnt) = (files.clone(), t.mnt.clone());
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(r);
                let mut reads = 0u64;
                while Instant::now() < deadline {
                    let i = rng.usize(0..files.len());
                    let data = &files[i];
                    let f = fs::File::open(mnt.join(format!("f{i}"))).expect("open");
                    let offset = rng.usize(0..data.len() + 1);
                    let mut buf = vec![0u8; rng.usize(1..2 * MIB)];
                    let n = f.read_at(&mut buf, offset as u64).expect("read");
                    let want = &data[offset.min(data.len())..(offset + buf.len()).min(data.len())];
                    assert!(&buf[..n] == want, "reader {r}: file {i} offset {offset}");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let total: u64 = readers.into_iter().map(|h| h.join().expect("reader")).sum();
    assert!(total > 100, "readers made progress ({total} reads)");
    let stats = t.stats();
    assert!(
        stats["cache"]["admission_rejected"].as_u64() > Some(0),
        "a 24M budget under 50M of data rejects some"
    );
    assert!(
        stats["cache"]["bytes"].as_u64() <= Some(24 << 20),
        "the budget is hard"
    );
}

#[test]
fn rewritten_source_file_is_seen_fresh_on_next_open() {
    let mut t = TestMount::new();
    fs::write(t.s("small"), b"old contents").expect("write");
    fs::write(t.s("large"), pattern(3 * MIB, 1)).expect("write");
    t.mount(&[]);
    assert_eq!(fs::read(t.m("small")).expect("read"), b"old contents");
    assert!(fs::read(t.m("large")).expect("read") == pattern(3 * MIB, 1));
    assert!(
        fs::read(t.m("large")).expect("read") == pattern(3 * MIB, 1),
        "second read: cached"
    );
    // Rewrite in place (same inode) and by rename (new inode).
    fs::write(t.s("small"), b"new, longer contents").expect("rewrite");
    let tmp = t.s("large.tmp");
    fs::write(&tmp, pattern(2 * MIB + 5, 2)).expect("write");
    fs::rename(&tmp, t.s("large")).expect("rename");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        fs::read(t.m("small")).expect("read"),
        b"new, longer contents"
    );
    assert!(
        fs::read(t.m("large")).expect("read") == pattern(2 * MIB + 5, 2),
        "only new bytes"
    );
    assert!(t.stats()["stale_detections"].as_u64() >= Some(1));
}

#[test]
fn python_opens_leave_the_warn_level_log_quiet() {
    // Python's open() asks each file whether it is a terminal (an ioctl the kernel passes to
    // the daemon): normal operation at RUST_LOG=warn must log nothing per open.
    let mut t = TestMount::new();
    fs::write(t.s("small"), b"a small file").expect("write");
    fs::write(t.s("large"), pattern(3 * MIB, 1)).expect("write");
    let log = t.dir.path().join("prepfs.log");
    t.mount_logged(&[], "warn", &log);
    let before = fs::read(&log).expect("log").len();
    let script = "import sys\n\
                  for _ in range(25):\n\
                  \x20   for path in sys.argv[1:]:\n\
                  \x20       with open(path, 'rb') as f: f.read()\n";
    common::run_checked(
        std::process::Command::new(common::python())
            .args(["-c", script])
            .arg(t.m("small"))
            .arg(t.m("large"))
            .arg(t.m(".prepfs/stats.json")),
    );
    let log = fs::read(&log).expect("log");
    let added = String::from_utf8_lossy(&log[before..]);
    assert!(added.is_empty(), "75 opens logged at warn:\n{added}");
}

#[test]
fn source_file_going_bad_fails_that_read_only() {
    let mut t = TestMount::new();
    fs::write(t.s("victim"), pattern(3 * MIB, 5)).expect("write");
    fs::write(t.s("healthy"), pattern(1000, 6)).expect("write");
    // Without readahead, so that the later block is still to be fetched when the source goes bad.
    t.mount(&["--no-prefetch"]);
    let f = fs::File::open(t.m("victim")).expect("open");
    let mut buf = vec![0u8; 4096];
    f.read_at(&mut buf, 0).expect("first block reads");
    // Truncate the source behind the open handle: its version is gone.
    fs::OpenOptions::new()
        .write(true)
        .open(t.s("victim"))
        .expect("open")
        .set_len(10)
        .expect("truncate");
    let err = f
        .read_at(&mut buf, 2 * MIB as u64)
        .expect_err("later block of a vanished version");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(
        fs::read(t.m("healthy")).expect("mount still serves"),
        pattern(1000, 6)
    );
    assert!(t.stats()["stale_detections"].as_u64() >= Some(1));
    assert!(t.stats()["ops"]["read"]["errors"].as_u64() >= Some(1));
}

#[test]
fn mount_is_read_only() {
    let mut t = TestMount::new();
    fs::write(t.s("f"), b"data").expect("write");
    fs::create_dir(t.s("d")).expect("mkdir");
    t.mount(&[]);
    let erofs = |r: std::io::Result<()>, what: &str| {
        assert_eq!(
            r.expect_err(what).raw_os_error(),
            Some(libc::EROFS),
            "{what}"
        );
    };
    erofs(fs::write(t.m("new"), b"x"), "create");
    erofs(
        fs::OpenOptions::new().write(true).open(t.m("f")).map(drop),
        "open for write",
    );
    erofs(
        fs::OpenOptions::new().append(true).open(t.m("f")).map(drop),
        "open for append",
    );
    erofs(fs::remove_file(t.m("f")), "unlink");
    erofs(fs::create_dir(t.m("d2")), "mkdir");
    erofs(fs::remove_dir(t.m("d")), "rmdir");
    erofs(fs::rename(t.m("f"), t.m("g")), "rename");
    erofs(
        fs::set_permissions(t.m("f"), fs::Permissions::from_mode(0o777)),
        "chmod",
    );
    erofs(std::os::unix::fs::symlink("f", t.m("l")), "symlink");
    erofs(fs::hard_link(t.m("f"), t.m("h")), "link");
    assert_eq!(fs::read(t.s("f")).expect("source intact"), b"data");
    let st = rustix::fs::statvfs(&t.mnt).expect("statvfs");
    assert!(st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY));
    assert!(st.f_flag.contains(rustix::fs::StatVfsMountFlags::NOSUID));
    assert!(st.f_flag.contains(rustix::fs::StatVfsMountFlags::NODEV));
}

#[test]
fn control_dir_is_hidden_and_stats_move() {
    let mut t = TestMount::new();
    fs::create_dir(t.s("class_a")).expect("mkdir");
    fs::write(t.s("class_a/img.jpg"), pattern(50_000, 1)).expect("write");
    t.mount(&[]);
    let names: Vec<String> = fs::read_dir(&t.mnt)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["class_a"], ".prepfs is not listed");
    assert!(t.m(".prepfs").is_dir(), "but reachable by path");
    let mut control: Vec<String> = fs::read_dir(t.m(".prepfs"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    control.sort();
    assert_eq!(control, vec!["metrics", "stats.json"]);

    let before = t.stats();
    fs::read(t.m("class_a/img.jpg")).expect("read");
    let mid = t.stats();
    fs::read(t.m("class_a/img.jpg")).expect("read");
    let after = t.stats();
    let get = |v: &serde_json::Value, a: &str, b: &str| v[a][b].as_u64().expect("counter");
    assert_eq!(
        get(&mid, "cache", "misses") - get(&before, "cache", "misses"),
        1
    );
    // The second read is a hit: of the daemon, or of the kernel serving the cached memfd by
    // passthrough (as root), which counts one hit per block at its open.
    assert_eq!(get(&after, "cache", "hits") - get(&mid, "cache", "hits"), 1);
    // One 4 KiB-page-rounded memfd with passthrough, the bytes themselves on the heap otherwise.
    assert!([50_000, 53_248].contains(&get(&after, "cache", "bytes")));
    // Passthrough reads never reach the daemon, so only the first read is sure to be counted.
    assert!(after["bytes_served"].as_u64() >= Some(50_000));
    assert!(after["read_latency_us"]["p99"].as_f64() > Some(0.0));
    assert!(after["uptime_seconds"].as_f64() > Some(0.0));

    // A snapshot taken at open does not change while read in small pieces.
    let mut f = fs::File::open(t.m(".prepfs/stats.json")).expect("open");
    let mut text = String::new();
    let mut chunk = [0u8; 7];
    loop {
        let n = f.read(&mut chunk).expect("read");
        if n == 0 {
            break;
        }
        text.push_str(std::str::from_utf8(&chunk[..n]).unwrap_or_default());
    }
    serde_json::from_str::<serde_json::Value>(&text)
        .expect("a piecewise read is one consistent snapshot");

    let metrics = fs::read_to_string(t.m(".prepfs/metrics")).expect("metrics");
    let mut typed = std::collections::HashSet::new();
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            typed.insert(parts.next().expect("name").to_owned());
            assert!(matches!(parts.next(), Some("counter" | "gauge")), "{line}");
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        value
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("numeric value in {line:?}"));
        let name = series.split('{').next().expect("name");
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "metric name {name:?}"
        );
        assert!(
            typed.contains(name),
            "{name} has a TYPE line before its samples"
        );
        if let Some(labels) = series.strip_prefix(name) {
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "{line}"
            );
        }
    }
    assert!(metrics.contains("prepfs_cache_hits_total "));
    assert!(metrics.contains("prepfs_requests_total{op=\"read\"} "));
}

#[test]
fn an_open_held_across_a_source_replacement_never_makes_new_opens_fail() {
    let mut t = TestMount::new();
    fs::write(t.s("shard"), pattern(3 * MIB, 1)).expect("write");
    t.mount(&[]);
    assert!(fs::read(t.m("shard")).expect("fill") == pattern(3 * MIB, 1));
    // Cached whole: as root this open is served by passthrough, and it stays open.
    let held = fs::File::open(t.m("shard")).expect("open");
    let tmp = t.s("shard.tmp");
    fs::write(&tmp, pattern(2 * MIB + 5, 2)).expect("write");
    fs::rename(&tmp, t.s("shard")).expect("rename");
    for _ in 0..3 {
        let got = fs::read(t.m("shard")).expect("an open beside the held one succeeds");
        assert!(
            got == pattern(3 * MIB, 1) || got == pattern(2 * MIB + 5, 2),
            "one whole version"
        );
    }
    let mut first = vec![0; 4096];
    held.read_exact_at(&mut first, 0)
        .expect("the held open reads");
    assert!(first[..] == pattern(3 * MIB, 1)[..4096], "its own version");
    drop(held);
    // The kernel's release of the held open reaches the daemon shortly after the close.
    let deadline = Instant::now() + Duration::from_secs(5);
    while fs::read(t.m("shard")).expect("read") != pattern(2 * MIB + 5, 2) {
        assert!(
            Instant::now() < deadline,
            "the new version once the held open is closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(t.stats()["cache"]["passthrough_pinned_opens"].as_u64() >= Some(3));
}

#[test]
fn mmap_reads_match_source() {
    let mut t = TestMount::new();
    fs::write(t.s("small.npy"), pattern(300_000, 1)).expect("write");
    fs::write(t.s("large.bin"), pattern(5 * MIB + 3, 2)).expect("write");
    t.mount(&[]);
    for rel in ["small.npy", "large.bin", "large.bin"] {
        // The second mapping of large.bin comes after it is fully cached: passthrough (as root).
        let want = fs::read(t.s(rel)).expect("source");
        let f = fs::File::open(t.m(rel)).expect("open");
        let len = want.len();
        // SAFETY: a fresh read-only private view of a file nobody truncates during the test.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                &f,
                0,
            )
        }
        .expect("mmap through the mount");
        // SAFETY: `ptr` maps `len` readable bytes until munmap below.
        let got = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        assert!(got == &want[..], "{rel}: mapped bytes match");
        // SAFETY: unmapping what was mapped above; `got` is not used after.
        unsafe { rustix::mm::munmap(ptr, len) }.expect("munmap");
    }
}

#[test]
fn mount_is_lazy_and_ready_before_any_walk() {
    let mut t = TestMount::new();
    for d in 0..20 {
        fs::create_dir(t.s(&format!("d{d}"))).expect("mkdir");
        for f in 0..1000 {
            fs::write(t.s(&format!("d{d}/f{f}")), b"").expect("write");
        }
    }
    t.mount(&[]);
    assert!(
        t.stats()["inodes"].as_u64() <= Some(2),
        "no inode was created before the first lookup"
    );
    assert_eq!(fs::read_dir(t.m("d7")).expect("readdir").count(), 1000);
    // A listing creates no inode (the kernel holds no lookup of a listed name, so it would
    // never forget one): the root and d7.
    assert_eq!(
        t.stats()["inodes"].as_u64(),
        Some(1 + 1),
        "only what was looked up exists"
    );
}

#[test]
fn sigterm_unmounts_cleanly_and_exits_zero() {
    let mut t = TestMount::new();
    fs::write(t.s("f"), b"x").expect("write");
    t.mount(&[]);
    let mut child = t.child.take().expect("child");
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    let status = child.wait().expect("wait");
    assert!(status.success(), "exit status {status}");
    assert!(!is_mounted(&t.mnt), "no mount left behind");
    assert_eq!(
        fs::read_dir(&t.mnt)
            .expect("mountpoint usable, not ENOTCONN")
            .count(),
        0
    );
}

#[test]
fn daemon_returns_when_ready_and_umount_stops_it() {
    let t = TestMount::new();
    fs::write(t.s("f"), b"hello").expect("write");
    let out = common::prepfs()
        .arg("mount")
        .arg(&t.src)
        .arg(&t.mnt)
        .arg("--cache-mem")
        .arg("16M")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Ready means answering, with no retry needed.
    assert_eq!(fs::read(t.m("f")).expect("read right away"), b"hello");
    let table = common::prepfs()
        .arg("stats")
        .arg(&t.mnt)
        .output()
        .expect("stats");
    assert!(String::from_utf8_lossy(&table.stdout).contains("cache.budget_bytes"));
    let out = common::prepfs()
        .arg("umount")
        .arg(&t.mnt)
        .output()
        .expect("umount");
    assert!(
        out.status.success(),
        "umount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&t.mnt));
}

#[test]
fn bad_input_gets_one_line_and_nothing_mounted() {
    let t = TestMount::new();
    fs::write(t.s("file"), b"x").expect("write");
    let full = t.dir.path().join("full");
    fs::create_dir(&full).expect("mkdir");
    fs::write(full.join("occupant"), b"x").expect("write");
    let missing = t.dir.path().join("missing");
    let bad_log = missing.join("prepfs.log");
    let src = t.src.as_os_str();
    let mnt = t.mnt.as_os_str();
    let file = t.s("file");
    let cases: Vec<(&str, Vec<&std::ffi::OsStr>, &str)> = vec![
        (
            "missing source",
            vec!["mount".as_ref(), missing.as_os_str(), mnt],
            "source",
        ),
        (
            "source is a file",
            vec!["mount".as_ref(), file.as_os_str(), mnt],
            "not a directory",
        ),
        (
            "missing mountpoint",
            vec!["mount".as_ref(), src, missing.as_os_str()],
            "mountpoint",
        ),
        (
            "mountpoint not empty",
            vec!["mount".as_ref(), src, full.as_os_str()],
            "not empty",
        ),
        (
            "bad size",
            vec![
                "mount".as_ref(),
                src,
                mnt,
                "--cache-mem".as_ref(),
                "12X".as_ref(),
            ],
            "invalid size",
        ),
        (
            "log file in a missing directory",
            vec![
                "mount".as_ref(),
                src,
                mnt,
                "--log-file".as_ref(),
                bad_log.as_os_str(),
            ],
            "cannot open the log file",
        ),
        (
            "bad decoded-cache mode",
            vec![
                "mount".as_ref(),
                src,
                mnt,
                "--decoded-cache".as_ref(),
                "sometimes".as_ref(),
            ],
            "decoded-cache",
        ),
        (
            "umount of a non-mount",
            vec!["umount".as_ref(), mnt],
            "not a mount point",
        ),
        (
            "stats of a non-mount",
            vec!["stats".as_ref(), mnt],
            "prepfs mount",
        ),
    ];
    for (what, args, needle) in cases {
        let out = common::run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{what}: exit code (stderr {stderr:?})"
        );
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{what}: one line, got {stderr:?}"
        );
        assert!(
            stderr.starts_with("prepfs: ") && stderr.contains(needle),
            "{what}: {stderr:?}"
        );
        assert!(
            !is_mounted(&t.mnt) && !is_mounted(&full),
            "{what}: nothing mounted"
        );
    }
    // Already mounted: the second mount is refused, the first keeps working.
    let mut first = TestMount::new();
    fs::write(first.s("f"), b"1").expect("write");
    first.mount(&[]);
    let out = common::run(&[
        "mount".as_ref(),
        first.src.as_os_str(),
        first.mnt.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already a mount point"));
    assert_eq!(
        fs::read(first.m("f")).expect("first mount still serves"),
        b"1"
    );
}

/// A mount point detached (`umount -l`) when the test ends, however it ends.
struct Detached(std::path::PathBuf);

impl Detached {
    /// Runs `mount ARGS... SOURCE TARGET`; TARGET is detached on drop.
    fn mount(args: &[&str], source: &Path, target: &Path) -> Detached {
        common::run_checked(
            std::process::Command::new("mount")
                .args(args)
                .arg(source)
                .arg(target),
        );
        Detached(target.to_owned())
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .output();
    }
}

/// Runs `prepfs mount SRC MNT --foreground`, which is expected to refuse, and returns its
/// stderr. Should it mount instead, it is killed and the mount detached before the test fails:
/// a mount inside its own source hangs whoever touches it, so it must never outlive the test.
fn refused_mount(src: &Path, mnt: &Path) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = dir.path().join("stderr");
    let mut child = common::prepfs()
        .arg("mount")
        .arg(src)
        .arg(mnt)
        .args(["--foreground", "--cache-mem", "16M"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("spawn prepfs");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if is_mounted(mnt) || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(mnt)
                .output();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = fs::read_to_string(&err).expect("read stderr");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "mount on {} was not refused: {stderr}",
        mnt.display()
    );
    stderr
}

#[test]
fn a_mountpoint_the_source_reaches_is_refused_before_anything_is_mounted() {
    let t = TestMount::new();
    fs::create_dir_all(t.s("sub/mnt")).expect("mkdir");
    fs::write(t.s("sub/f"), b"x").expect("write");
    let link = t.dir.path().join("link");
    std::os::unix::fs::symlink(&t.src, &link).expect("symlink");
    // The same directories again, through a bind mount of one of the source's directories.
    let alias = t.dir.path().join("alias");
    fs::create_dir(&alias).expect("mkdir");
    let _bind = Detached::mount(&["--bind"], &t.s("sub"), &alias);
    let empty = t.dir.path().join("empty");
    fs::create_dir(&empty).expect("mkdir");
    for (what, src, mnt, needle) in [
        (
            "the source itself",
            empty.clone(),
            empty.clone(),
            "is the source",
        ),
        (
            "a directory in the source",
            t.src.clone(),
            t.s("sub/mnt"),
            "inside the source",
        ),
        (
            "the source through a symlink",
            t.src.clone(),
            link.join("sub/mnt"),
            "inside the source",
        ),
        (
            "a bind mount of a source directory",
            t.src.clone(),
            alias.join("mnt"),
            "inside the source",
        ),
    ] {
        let stderr = refused_mount(&src, &mnt);
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{what}: one line: {stderr:?}"
        );
        assert!(
            stderr.starts_with("prepfs: mountpoint ") && stderr.contains(needle),
            "{what}: {stderr:?}"
        );
        assert!(!is_mounted(&mnt), "{what}: nothing mounted");
    }
}

#[test]
fn a_dead_mount_gets_the_umount_hint_and_umount_clears_it() {
    let mut t = TestMount::new();
    fs::write(t.s("f"), b"x").expect("write");
    t.mount(&["--cache-mem", "16M"]);
    let mut child = t.child.take().expect("daemon");
    let _dead = Detached(t.mnt.clone());
    child.kill().expect("SIGKILL the daemon");
    child.wait().expect("wait");
    assert!(is_mounted(&t.mnt), "the dead mount stays attached");
    let out = common::run(&["mount".as_ref(), t.src.as_os_str(), t.mnt.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr:?}");
    assert!(
        stderr.contains("dead FUSE mount") && stderr.contains("prepfs umount"),
        "{stderr:?}"
    );
    common::run_checked(common::prepfs().arg("umount").arg(&t.mnt));
    assert!(!is_mounted(&t.mnt));
    t.mount(&["--cache-mem", "16M"]);
    assert_eq!(fs::read(t.m("f")).expect("the next mount serves"), b"x");
}

/// A daemon killed at any moment of its start-up exits, and `prepfs umount` clears what it left:
/// the daemon never waits on a request to its own mount (one in flight when SIGKILL came would
/// leave it unkillable in the kernel, holding the mount, until someone aborted the connection).
/// The kills move across start-up, from before the mount appears to a few ms after (200 of them:
/// before the fix, 1 kill in 40 left the daemon stuck).
#[test]
fn a_daemon_killed_during_start_up_exits() {
    let t = TestMount::new();
    fs::write(t.s("f"), b"x").expect("write");
    for round in 0..200u64 {
        let mut child = common::prepfs()
            .arg("mount")
            .arg(&t.src)
            .arg(&t.mnt)
            .args(["--foreground", "--cache-mem", "16M"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn prepfs");
        let deadline = Instant::now() + Duration::from_secs(30);
        while round % 10 != 0 && !is_mounted(&t.mnt) {
            assert!(
                Instant::now() < deadline,
                "round {round}: no mount appeared"
            );
            std::thread::sleep(Duration::from_micros(50));
        }
        std::thread::sleep(Duration::from_micros(
            100 * (round % 10) * (round / 10 % 4 + 1),
        ));
        child.kill().expect("SIGKILL the daemon");
        let exited = common::exit_within(&mut child, Duration::from_secs(10)).is_some();
        if !exited {
            // Leave nothing hung behind the failure: the daemon then exits, the mount can go.
            abort_fuse_connection(&t.mnt);
            let _ = child.wait();
        }
        if is_mounted(&t.mnt) {
            common::run_checked(common::prepfs().arg("umount").arg(&t.mnt));
        }
        assert!(
            exited,
            "round {round}: the killed daemon did not exit (stuck on a request to its own mount)"
        );
        assert!(!is_mounted(&t.mnt), "round {round}: the mount is left");
    }
}

/// Aborts the FUSE connection of the mount at `mnt` (`/sys/fs/fuse/connections/N/abort`, N being
/// the mount's device minor in /proc/self/mountinfo), mounting fusectl if it is not.
fn abort_fuse_connection(mnt: &Path) {
    let connections = Path::new("/sys/fs/fuse/connections");
    let listed = fs::read_dir(connections).is_ok_and(|mut d| d.next().is_some());
    if !listed {
        let _ = std::process::Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(connections)
            .output();
    }
    let wanted = mnt.to_string_lossy().replace(' ', "\\040");
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.get(4) == Some(&wanted.as_str())
            && let Some((_, minor)) = fields.get(2).and_then(|d| d.split_once(':'))
        {
            let _ = fs::write(connections.join(minor).join("abort"), "1");
        }
    }
}

#[test]
fn normal_user_without_fusermount_gets_a_clear_error() {
    let t = TestMount::new();
    for p in [t.dir.path(), t.src.as_path(), t.mnt.as_path()] {
        rustix::fs::chown(
            p,
            Some(rustix::process::Uid::from_raw(65534)),
            Some(rustix::process::Gid::from_raw(65534)),
        )
        .expect("chown");
    }
    let out = std::process::Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_prepfs"))
        .arg("mount")
        .arg(&t.src)
        .arg(&t.mnt)
        .env("PATH", "/nonexistent")
        .output()
        .expect("setpriv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("fusermount3"), "{stderr}");
    assert!(!is_mounted(&t.mnt));
}

#[test]
fn normal_user_mounts_with_fusermount3_and_others_are_kept_out() {
    let t = TestMount::new();
    fs::write(t.s("f"), b"user data").expect("write");
    for p in [
        t.dir.path(),
        t.src.as_path(),
        t.mnt.as_path(),
        t.s("f").as_path(),
    ] {
        rustix::fs::chown(
            p,
            Some(rustix::process::Uid::from_raw(65534)),
            Some(rustix::process::Gid::from_raw(65534)),
        )
        .expect("chown");
    }
    let as_nobody = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .env("PATH", "/usr/bin:/bin")
            .output()
            .expect("setpriv")
    };
    // The checkout may sit where `nobody` cannot reach (a clone in /root or in a mode-0700
    // directory): the user runs a copy in the test's own directory, which it owns.
    let copy = t.dir.path().join("prepfs");
    fs::copy(env!("CARGO_BIN_EXE_prepfs"), &copy).expect("copy the binary for nobody");
    let exe = copy.as_os_str();
    let out = as_nobody(&[
        exe,
        "mount".as_ref(),
        t.src.as_os_str(),
        t.mnt.as_os_str(),
        "--cache-mem".as_ref(),
        "8M".as_ref(),
    ]);
    assert!(
        out.status.success(),
        "user mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // fusermount3 gives the mount prepfs's type, as mount(2) does for root.
    assert_eq!(
        common::mount_type(&t.mnt)
            .map(|(fstype, _)| fstype)
            .as_deref(),
        Some("fuse.prepfs")
    );
    let cat = as_nobody(&["/bin/cat".as_ref(), t.s("f").as_os_str()]);
    let through = as_nobody(&["/bin/cat".as_ref(), t.m("f").as_os_str()]);
    assert_eq!(
        through.stdout, cat.stdout,
        "the owner reads through the mount"
    );
    // allow_other is off: even root is refused.
    assert_eq!(
        fs::read(t.m("f"))
            .expect_err("root is another user")
            .raw_os_error(),
        Some(libc::EACCES)
    );
    let out = as_nobody(&[exe, "umount".as_ref(), t.mnt.as_os_str()]);
    assert!(
        out.status.success(),
        "user umount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&t.mnt));
}

#[test]
fn the_mount_shows_its_type_as_fuse_prepfs_and_its_source() {
    let mut t = TestMount::new();
    fs::write(t.s("f"), b"data").expect("write");
    t.mount(&[]);
    // As libfuse and fusermount3 show a FUSE filesystem with a subtype: what `findmnt -t`,
    // `umount -t` and /etc/fstab's `fuse.prepfs` entries match.
    let (fstype, source) = common::mount_type(&t.mnt).expect("the mount is listed");
    assert_eq!(fstype, "fuse.prepfs");
    assert_eq!(source, format!("prepfs:{}", t.src.display()));
    assert_eq!(fs::read(t.m("f")).expect("read"), b"data");
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
    assert!(!is_mounted(&t.mnt));
}

#[test]
fn a_replayed_order_is_prefetched_through_a_real_mount() {
    let mut t = TestMount::new();
    let files: Vec<String> = (0..80).map(|i| format!("shard-{i:03}.bin")).collect();
    for (i, f) in files.iter().enumerate() {
        fs::write(t.s(f), pattern(200_000, i as u64)).expect("write");
    }
    // Room in RAM for a few files; the rest can only be prefetched into the staging buffer.
    t.mount(&["--cache-mem", "1M", "--prefetch-buffer", "32M"]);
    let mut order: Vec<usize> = (0..files.len()).collect();
    // A fixed permutation every epoch: neither sorted nor listing order predicts it.
    order.reverse();
    order.swap(3, 40);
    for _ in 0..3 {
        for &i in &order {
            assert_eq!(
                fs::read(t.m(&files[i])).expect("read"),
                pattern(200_000, i as u64),
                "{}",
                files[i]
            );
            // What a training step computes between samples: prefetch runs meanwhile.
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let stats = t.stats();
    let set = &stats["epochs"]["files"];
    assert_eq!(set["epoch"], 3, "{set}");
    assert_eq!(set["predictor"], "replay", "{set}");
    assert_eq!(set["history"][1]["files"], 80, "{set}");
    assert!(stats["prefetch"]["useful"].as_u64() > Some(0), "{stats}");
    assert!(
        stats["prefetch"]["staged"]["reads"].as_u64() > Some(0),
        "{stats}"
    );
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
}

#[test]
fn filesystems_mounted_inside_the_source_are_served_and_keep_their_own_identity() {
    let mut t = TestMount::new();
    // Two copies of one ext4 image: `x` has the same inode, size and times in both, and only
    // the device tells them apart; the copy's bytes of `x` are inverted in place. Source access
    // crosses mounts (see source::local), and the device is part of a file's identity.
    let content = t.dir.path().join("content");
    fs::create_dir(&content).expect("mkdir");
    let original = pattern(300_000, 7);
    let inverted: Vec<u8> = original.iter().map(|b| !b).collect();
    fs::write(content.join("x"), &original).expect("write");
    // The images keep x's times and are mounted read-only: dated back before they are made.
    common::date_back(&content);
    let first = t.dir.path().join("first.img");
    fs::File::create(&first)
        .and_then(|f| f.set_len(8 << 20))
        .expect("image file");
    common::run_checked(
        std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&content)
            .arg(&first),
    );
    let mut image = fs::read(&first).expect("read image");
    let at = image
        .windows(4096)
        .position(|w| w == &original[..4096])
        .expect("x's data lies in the image");
    image[at..at + original.len()].copy_from_slice(&inverted);
    let second = t.dir.path().join("second.img");
    fs::write(&second, &image).expect("write image");
    for dir in ["a", "b", "again"] {
        fs::create_dir(t.s(dir)).expect("mkdir");
    }
    let _a = Detached::mount(&["-o", "ro,noload,loop"], &first, &t.s("a"));
    let _b = Detached::mount(&["-o", "ro,noload,loop"], &second, &t.s("b"));
    let _again = Detached::mount(&["--bind"], &t.s("a"), &t.s("again"));
    let (a, b) = (
        fs::metadata(t.s("a/x")).expect("stat"),
        fs::metadata(t.s("b/x")).expect("stat"),
    );
    let identity = |m: &fs::Metadata| {
        (
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    };
    assert_eq!(identity(&a), identity(&b), "the same but for the device");
    assert_ne!(a.dev(), b.dev());

    t.mount(&["--cache-mem", "64M", "--codec", "none"]);
    assert_eq!(fs::read(t.m("a/x")).expect("read a/x"), original);
    let cached = |rel: &str| {
        let mut value = [0u8; 96];
        let len =
            rustix::fs::getxattr(t.m(rel), "user.prepfs.cached", &mut value[..]).expect("getxattr");
        String::from_utf8_lossy(&value[..len]).into_owned()
    };
    assert_eq!(cached("a/x"), "ram=1 disk=0 blocks=1", "a/x is cached");
    assert_eq!(
        cached("again/x"),
        "ram=1 disk=0 blocks=1",
        "a bind mount shows the same file: the same cached bytes"
    );
    assert_eq!(
        cached("b/x"),
        "ram=0 disk=0 blocks=1",
        "b/x is another file: a/x's cached bytes are not its"
    );
    assert_eq!(fs::read(t.m("b/x")).expect("read b/x"), inverted);
    assert_eq!(fs::read(t.m("a/x")).expect("read a/x again"), original);
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
}

/// The value of `name` of `path` through the mount, or the errno it was answered with.
fn xattr(path: &Path, name: &str) -> Result<String, rustix::io::Errno> {
    let mut value = [0u8; 96];
    rustix::fs::getxattr(path, name, &mut value[..])
        .map(|len| String::from_utf8_lossy(&value[..len]).into_owned())
}

#[test]
fn attributes_outside_the_user_namespace_are_unsupported_and_ls_stops_asking() {
    const FILES: usize = 200;
    let mut t = TestMount::new();
    fs::create_dir(t.s("flat")).expect("mkdir");
    for i in 0..FILES {
        fs::write(t.s(&format!("flat/{i:04}")), b"x").expect("write");
    }
    t.mount(&["--cache-mem", "16M"]);
    let file = t.m("flat/0000");
    for name in ["security.selinux", "system.posix_acl_access", "trusted.x"] {
        assert_eq!(xattr(&file, name), Err(rustix::io::Errno::NOTSUP), "{name}");
        assert_eq!(xattr(&t.m("flat"), name), Err(rustix::io::Errno::NOTSUP));
    }
    assert_eq!(xattr(&file, "user.other"), Err(rustix::io::Errno::NODATA));
    fs::read(&file).expect("read");
    assert_eq!(
        xattr(&file, "user.prepfs.cached").as_deref(),
        Ok("ram=1 disk=0 blocks=1"),
        "prepfs's own attribute still answers"
    );

    // Python's view of the same answers.
    let probe = "import errno, os, sys\n\
        try:\n    os.getxattr(sys.argv[1], 'security.selinux')\n    print('value')\n\
        except OSError as e:\n    print(e.errno == errno.EOPNOTSUPP and 'EOPNOTSUPP' or errno.errorcode[e.errno])\n\
        print(os.getxattr(sys.argv[1], 'user.prepfs.cached').decode())\n";
    let out = common::run_checked(
        std::process::Command::new(common::python())
            .args(["-c", probe])
            .arg(&file),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "EOPNOTSUPP\nram=1 disk=0 blocks=1\n"
    );

    // `ls -l` asks each file for its SELinux label and ACL; told the file system supports
    // neither, it stops asking: a handful of xattr requests for the whole directory.
    let xattrs = |t: &TestMount| {
        t.stats()["ops"]["xattr"]["requests"]
            .as_u64()
            .expect("xattr")
    };
    let before = xattrs(&t);
    let out = common::run_checked(std::process::Command::new("ls").arg("-l").arg(t.m("flat")));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        FILES + 1,
        "ls -l lists every file"
    );
    let asked = xattrs(&t) - before;
    assert!(
        asked < 10,
        "ls -l of {FILES} files asked {asked} xattrs: it should stop after the first"
    );
}

#[test]
fn a_change_to_a_local_source_file_is_seen_by_the_next_open_checked_on_the_kernels_thread() {
    let mut t = TestMount::new();
    let mut current = pattern(100_000, 1);
    fs::write(t.s("f"), &current).expect("write");
    t.mount(&["--cache-mem", "64M"]);
    assert!(fs::read(t.m("f")).expect("read") == current, "first read");
    for round in 1..=5 {
        assert!(
            fs::read(t.m("f")).expect("read") == current,
            "round {round}: the cached version"
        );
        // Rewritten in place (same inode), each time to a new size.
        current = pattern(100_000 + round * 1000, round as u64 + 1);
        fs::write(t.s("f"), &current).expect("rewrite");
        // Written before the open, not during it: a version of the last 2 s is never cached.
        common::date_back(&t.src);
        assert!(
            fs::read(t.m("f")).expect("read") == current,
            "round {round}: the open right after the change sees it"
        );
    }
    let stats = t.stats();
    assert!(
        stats["source"]["opens_at_once"].as_u64() >= Some(5),
        "each cached version's open was checked against the local source on the kernel's thread: {stats:#}"
    );
}
