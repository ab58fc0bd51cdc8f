//! Compression and the disk tier through real mounts: packed blocks serve intact bytes, a disk
//! cache survives a clean unmount and a SIGKILL, damaged entries become misses, a full cache
//! filesystem never fails a read, the cache directory's permissions and lock are enforced, and
//! prepfs uses only a cache directory it made (or an empty one it adopts), never changing,
//! following, blocking on or deleting what it did not create there.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestMount, is_mounted, pattern, prepfs};
use serde_json::Value;

/// Bytes that compress well (uint8-pixel-like gradients with noise), deterministic per seed.
fn compressible(len: usize, seed: u64) -> Vec<u8> {
    let noise = pattern(len, seed);
    (0..len)
        .map(|i| ((i % 640) / 5) as u8 ^ (noise[i] & 0x03))
        .collect()
}

/// A uint8 .npy image (rows x cols x 3) whose bytes look random (no probe accepts them) but
/// whose rows are alike, as in photos: only the row filter makes it compress.
fn image_npy(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let dict =
        format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({rows}, {cols}, 3), }}");
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    let pad = 128 - 10 - dict.len() - 1;
    out.extend_from_slice(&((dict.len() + pad + 1) as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out.push(b'\n');
    let noise = pattern(rows * cols * 3, seed);
    let mut row = pattern(cols * 3, seed + 1);
    for r in 0..rows {
        for (i, px) in row.iter_mut().enumerate() {
            *px = px.wrapping_add(noise[r * cols * 3 + i] & 0x03);
        }
        out.extend_from_slice(&row);
    }
    out
}

fn stat(stats: &Value, path: &str) -> f64 {
    path.split('.')
        .fold(stats, |v, k| &v[k])
        .as_f64()
        .unwrap_or_else(|| panic!("stats.json has no number at {path}"))
}

/// Polls the mount's stats until `done` holds (or fails after 30 s with the last stats).
fn wait_for(t: &TestMount, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = t.stats();
        if done(&stats) {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {stats:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `files` into the source and returns their names and bytes.
fn fill(t: &TestMount, files: &[(&str, Vec<u8>)]) {
    for (name, bytes) in files {
        std::fs::write(t.s(name), bytes).expect("write source file");
    }
}

fn read_all_and_compare(t: &TestMount, files: &[(&str, Vec<u8>)]) {
    for (name, bytes) in files {
        let got = std::fs::read(t.m(name)).expect("read through the mount");
        assert!(got == *bytes, "{name}: bytes differ from the source");
    }
}

fn dataset() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("pixels.npy", compressible(3 << 20, 1)),
        ("image.npy", image_npy(400, 1000, 4)),
        ("small.bin", compressible(200_000, 2)),
        ("random.bin", pattern(2 << 20, 3)),
        ("empty", Vec::new()),
        ("one", vec![7]),
    ]
}

#[test]
fn compressible_files_are_packed_in_the_background_and_read_back_intact() {
    let mut t = TestMount::new();
    let files = dataset();
    fill(&t, &files);
    t.mount(&["--codec", "zstd-3", "--cache-mem", "64M"]);
    read_all_and_compare(&t, &files);
    // 3 blocks of pixels.npy, 2 of image.npy (by its rows) and 1 of small.bin are
    // compressible; random.bin's 2 are not.
    let stats = wait_for(&t, "the packer", |s| {
        stat(s, "cache.blocks_by_codec.zstd") >= 6.0 && stat(s, "cache.pack_queue") == 0.0
    });
    assert_eq!(
        stat(&stats, "cache.blocks_by_codec.none"),
        3.0,
        "random 2 + one-byte file 1"
    );
    // The compressible 4.4 MB must take well under 2/3 of their size; random.bin stays raw.
    let packed = stat(&stats, "cache.bytes") - (2 << 20) as f64 - 1.0;
    assert!(
        packed * 1.5 < (3_145_728 + 1_200_128 + 200_000) as f64,
        "{stats:#}"
    );
    assert!(stat(&stats, "cache.capacity_ratio") > 1.3, "{stats:#}");
    assert!(stat(&stats, "cache.logical_bytes") > stat(&stats, "cache.bytes"));
    assert!(stat(&stats, "cache.compress_cpu_seconds") > 0.0);
    assert_eq!(stats["cache"]["codec"]["choice"], "zstd-3");
    assert_eq!(stats["cache"]["codec"]["reason"], "fixed");
    let before = stat(&stats, "source.bytes_read");
    // Packed blocks serve the same bytes, from RAM, in reads of every size.
    read_all_and_compare(&t, &files);
    let pixels = &files[0].1;
    let file = std::fs::File::open(t.m("pixels.npy")).expect("open");
    let mut buf = vec![0u8; 4096];
    for offset in [0u64, 4095, (1 << 20) - 10, 2 << 20, (3 << 20) - 4096] {
        use std::os::unix::fs::FileExt;
        let n = file.read_at(&mut buf, offset).expect("pread");
        assert_eq!(
            &buf[..n],
            &pixels[offset as usize..offset as usize + n],
            "at {offset}"
        );
    }
    drop(file);
    let stats = t.stats();
    assert_eq!(
        stat(&stats, "source.bytes_read"),
        before,
        "rereads were hits"
    );
    assert!(stat(&stats, "cache.decompress_cpu_seconds") > 0.0);
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
}

#[test]
fn the_adaptive_codec_explains_its_choice() {
    let mut t = TestMount::new();
    let files = dataset();
    fill(&t, &files);
    t.mount(&["--cache-mem", "64M"]);
    read_all_and_compare(&t, &files);
    // Either the policy found CPU to spare and packed the 4 compressible blocks, or it says
    // the CPU is saturated and they wait, raw, in the queue.
    let stats = wait_for(&t, "the packer or a saturated verdict", |s| {
        stat(s, "cache.packed_blocks") >= 4.0
            || (s["cache"]["codec"]["reason"] == "cpu_saturated"
                && stat(s, "cache.pack_queue") >= 1.0)
    });
    let reason = stats["cache"]["codec"]["reason"].as_str().unwrap_or("");
    assert!(
        ["cpu_idle", "cpu_busy", "cpu_saturated", "fast_source"].contains(&reason),
        "{stats:#}"
    );
    if stat(&stats, "cache.packed_blocks") >= 4.0 {
        let packed =
            stat(&stats, "cache.blocks_by_codec.lz4") + stat(&stats, "cache.blocks_by_codec.zstd");
        assert!(packed >= 4.0, "{stats:#}");
    }
    read_all_and_compare(&t, &files);
}

/// The cache dir of a test: on the machine's disk, however full, so the tests that expect disk
/// writes pass `--disk-min-free 0` (the floor itself is tested on a filesystem of its own, see
/// `a_full_cache_filesystem_stops_admission_and_never_fails_a_read`).
fn cache_dir(t: &TestMount) -> PathBuf {
    t.dir.path().join("cache")
}

/// Mount options of a 1 GiB disk tier in `dir`, admitting whatever the disk's free share.
fn disk_tier(dir: &str) -> [&str; 6] {
    [
        "--cache-dir",
        dir,
        "--cache-disk",
        "1G",
        "--disk-min-free",
        "0",
    ]
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(dir.join("blocks")).expect("blocks/") {
        for entry in std::fs::read_dir(shard.expect("shard").path()).expect("shard dir") {
            out.push(entry.expect("entry").path());
        }
    }
    out.sort();
    out
}

#[test]
fn the_disk_tier_survives_sigkill_and_serves_the_next_mount_without_the_source() {
    let mut t = TestMount::new();
    let mut files = dataset();
    for i in 0..12 {
        let name: &'static str = Box::leak(format!("extra{i}.bin").into_boxed_str());
        files.push((name, compressible(1_500_000, 10 + i)));
    }
    fill(&t, &files);
    let dir = cache_dir(&t);
    let dir_arg = dir.to_str().expect("utf-8 path");
    let args = [
        "--cache-dir",
        dir_arg,
        "--cache-disk",
        "1G",
        "--cache-mem",
        "64M",
        "--disk-min-free",
        "0",
        // What this test counts is what the disk tier keeps across a kill, not how prefetch's
        // bursts are admitted (`a_burst_of_misses_ends_on_disk_whole_in_the_same_mount`).
        "--no-prefetch",
    ];
    t.mount(&args);
    // Kill the daemon while the writer is busy: some entries written, others in flight.
    read_all_and_compare(&t, &files);
    wait_for(&t, "the first disk writes", |s| {
        stat(s, "disk.writes") >= 1.0
    });
    let mut child = t.child.take().expect("daemon");
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let _ = Command::new("umount").arg("-l").arg(&t.mnt).output();
    assert!(!is_mounted(&t.mnt));

    // The next mount reads everything intact, whatever the kill left. Its reads wait for the
    // writer file by file (every block it was offered written or counted refused), so that what
    // is counted below is what survived the kill, not admission under a burst.
    t.mount(&args);
    wait_for(&t, "the scan", |s| stat(s, "disk.scanned") == 1.0);
    for file in &files {
        read_all_and_compare(&t, std::slice::from_ref(file));
        wait_for(&t, "the writer to take every offer", |s| {
            stat(s, "disk.writes") + stat(s, "disk.admission_rejected") >= stat(s, "disk.misses")
        });
    }
    // Caught up: every 1 MiB block of every file has its entry (a clean unmount right after
    // may leave a block that was still on its way to the writer unwritten).
    let blocks: usize = files.iter().map(|(_, b)| b.len().div_ceil(1 << 20)).sum();
    let stats = wait_for(&t, "the writer to catch up", |s| {
        stat(s, "disk.scanned") == 1.0 && stat(s, "disk.entries") >= blocks as f64
    });
    assert_eq!(stat(&stats, "cache.integrity_errors"), 0.0);
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
    for entry in entries(&dir) {
        let mode = std::fs::metadata(&entry)
            .expect("entry")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{}", entry.display());
    }

    // Change one file and delete another: their entries must go, the rest must be reused.
    std::fs::write(t.s("small.bin"), compressible(200_000, 99)).expect("rewrite");
    std::fs::remove_file(t.s("extra0.bin")).expect("delete");
    files.retain(|(n, _)| *n != "extra0.bin");
    for (name, bytes) in files.iter_mut() {
        if *name == "small.bin" {
            *bytes = compressible(200_000, 99);
        }
    }
    t.mount(&args);
    let stats = wait_for(&t, "the scan", |s| stat(s, "disk.scanned") == 1.0);
    assert!(
        stat(&stats, "disk.stale_dropped") >= 3.0,
        "2 blocks of extra0 + small.bin: {stats:#}"
    );
    read_all_and_compare(&t, &files);
    let stats = t.stats();
    let fresh = 200_000.0;
    assert!(stat(&stats, "disk.hits") >= 20.0, "{stats:#}");
    assert_eq!(
        stat(&stats, "source.bytes_read"),
        fresh,
        "only the changed file came from the source"
    );
}

/// A burst of source reads offers the disk tier more blocks than its writer's queue holds (and
/// may start before the empty cache dir's scan ends); none is lost: what the writer could not take
/// at once is deferred and written from the RAM tier when it is idle, so every block of every
/// file is on disk in the same mount.
#[test]
fn a_burst_of_misses_ends_on_disk_whole_in_the_same_mount() {
    let mut t = TestMount::new();
    let files: Vec<(&str, Vec<u8>)> = (0..6u64)
        .map(|i| {
            let name: &'static str = Box::leak(format!("burst{i}.bin").into_boxed_str());
            (name, compressible(8 << 20, 40 + i))
        })
        .collect();
    fill(&t, &files);
    let dir = cache_dir(&t);
    let mut args = disk_tier(dir.to_str().expect("utf-8 path")).to_vec();
    args.extend(["--cache-mem", "256M"]);
    t.mount(&args);
    std::thread::scope(|s| {
        for file in &files {
            let t = &t;
            s.spawn(move || read_all_and_compare(t, std::slice::from_ref(file)));
        }
    });
    let blocks = files.len() * 8;
    // The writer counts an entry a moment before its write: both, so no count lags the other.
    let stats = wait_for(&t, "every block on disk", |s| {
        stat(s, "disk.entries") >= blocks as f64 && stat(s, "disk.writes") >= blocks as f64
    });
    eprintln!(
        "{} of {blocks} blocks deferred",
        stat(&stats, "disk.deferred")
    );
    assert_eq!(stat(&stats, "disk.writes"), blocks as f64, "{stats:#}");
    assert_eq!(stat(&stats, "disk.admission_rejected"), 0.0, "{stats:#}");
    assert_eq!(
        stat(&stats, "disk.recalled"),
        stat(&stats, "disk.deferred"),
        "the RAM tier held every deferred block: {stats:#}"
    );
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
    assert_eq!(entries(&dir).len(), blocks);
}

#[test]
fn damaged_disk_entries_are_misses_and_the_right_bytes_are_served() {
    let mut t = TestMount::new();
    let files: Vec<(&str, Vec<u8>)> = (0..6)
        .map(|i| {
            let name: &'static str = Box::leak(format!("f{i}.npy").into_boxed_str());
            (name, compressible(300_000, i))
        })
        .collect();
    fill(&t, &files);
    let dir = cache_dir(&t);
    let dir_arg = dir.to_str().expect("utf-8 path");
    let args = disk_tier(dir_arg);
    t.mount(&args);
    read_all_and_compare(&t, &files);
    wait_for(&t, "all disk writes", |s| stat(s, "disk.entries") == 6.0);
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));

    let victims = entries(&dir);
    assert_eq!(victims.len(), 6);
    let damage = |path: &Path, f: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = std::fs::read(path).expect("read entry");
        f(&mut bytes);
        std::fs::write(path, bytes).expect("write entry");
    };
    damage(&victims[0], &|b| {
        let last = b.len() - 1;
        b[last] ^= 0x01; // a flipped payload bit
    });
    damage(&victims[1], &|b| b.truncate(b.len() / 2));
    damage(&victims[2], &|b| b[8] = 99); // another format version
    damage(&victims[3], &|b| {
        b[16..20].copy_from_slice(&u32::MAX.to_le_bytes())
    });
    // An entry renamed over another: right format, wrong identity for that name.
    std::fs::copy(&victims[5], &victims[4]).expect("copy entry");

    t.mount(&args);
    read_all_and_compare(&t, &files);
    let stats = t.stats();
    let caught = stat(&stats, "disk.integrity_errors") + stat(&stats, "disk.stale_dropped");
    assert!(caught >= 5.0, "every damaged entry counted: {stats:#}");
    assert!(
        stat(&stats, "disk.hits") >= 1.0,
        "the intact entry was used"
    );
    assert_eq!(stat(&stats, "ops.read.errors"), 0.0);
}

#[test]
fn a_full_cache_filesystem_stops_admission_and_never_fails_a_read() {
    let mut t = TestMount::new();
    let dir = cache_dir(&t);
    std::fs::create_dir(&dir).expect("mkdir");
    let tmpfs = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=3m,mode=0700",
            "prepfs-test",
            dir.to_str().expect("utf-8"),
        ])
        .status()
        .expect("mount tmpfs");
    assert!(tmpfs.success(), "mounting a tmpfs needs root");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _tmpfs = Unmount(dir.clone());
    let files: Vec<(&str, Vec<u8>)> = (0..10)
        .map(|i| {
            let name: &'static str = Box::leak(format!("r{i}.bin").into_boxed_str());
            (name, pattern(1 << 20, 100 + i))
        })
        .collect();
    fill(&t, &files);
    let dir_arg = dir.to_str().expect("utf-8 path");
    // A RAM tier of a few blocks: most blocks go to the disk tier, whose writer queue holds
    // them in the memory budget's work slice until written (so the budget has room for some).
    t.mount(&[
        "--cache-dir",
        dir_arg,
        "--cache-disk",
        "100M",
        "--cache-mem",
        "8M",
    ]);
    for _ in 0..3 {
        read_all_and_compare(&t, &files);
    }
    let stats = wait_for(&t, "the writer", |s| stat(s, "disk.enospc") >= 1.0);
    assert_eq!(stat(&stats, "ops.read.errors"), 0.0);
    assert!(stat(&stats, "disk.entries") < 10.0, "{stats:#}");
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
}

/// Runs `prepfs mount` in the foreground expecting it to fail; returns its stderr. A mount that
/// starts instead is unmounted after 30 s and fails the test (rather than hanging it).
fn mount_fails(t: &TestMount, cache: &Path) -> String {
    let err_path = t.dir.path().join("mount-fails.err");
    let mut child = prepfs()
        .arg("mount")
        .arg(&t.src)
        .arg(&t.mnt)
        .arg("--foreground")
        .arg("--cache-dir")
        .arg(cache)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).expect("create stderr file"))
        .spawn()
        .expect("run prepfs");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for prepfs") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = prepfs().arg("umount").arg(&t.mnt).output();
            let _ = child.kill();
            let _ = child.wait();
            panic!("the mount should have been refused, and it started");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = std::fs::read_to_string(&err_path).expect("read stderr");
    assert!(!status.success(), "mount should have been refused: {err}");
    assert!(!is_mounted(&t.mnt));
    assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
    err
}

/// Every path under `root` (not following symlinks) with its mode and, for files and symlinks,
/// its bytes or target: what must stay as it was.
fn tree(root: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("lstat");
        let content = if meta.is_dir() {
            for entry in std::fs::read_dir(&path).expect("list") {
                todo.push(entry.expect("entry").path());
            }
            Vec::new()
        } else if meta.file_type().is_symlink() {
            use std::os::unix::ffi::OsStrExt;
            let target = std::fs::read_link(&path).expect("readlink");
            target.as_os_str().as_bytes().to_vec()
        } else if meta.is_file() {
            std::fs::read(&path).expect("read")
        } else {
            Vec::new()
        };
        out.insert(path, (meta.mode(), content));
    }
    out
}

#[test]
fn an_existing_directory_prepfs_did_not_create_is_refused_and_left_untouched() {
    let t = TestMount::new();
    fill(&t, &[("a", vec![1, 2, 3])]);
    // Like `cache_dir = "/etc"`: this user's, 0755, full of files, some named as prepfs's are.
    let theirs = t.dir.path().join("theirs");
    for (name, bytes) in [
        ("passwd", b"root:x:0:0::/root:/bin/sh\n".to_vec()),
        ("tmp/x", b"x".to_vec()),
        ("tmp/0123456789abcdef", b"a temporary-looking name".to_vec()),
        ("blocks/ab/y", b"y".to_vec()),
        (
            "blocks/ab/ab0000000000000000000000000000cd",
            pattern(1000, 1),
        ),
        ("lock", b"not a lock".to_vec()),
    ] {
        let path = theirs.join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, bytes).expect("write");
    }
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let before = tree(&theirs);

    let err = mount_fails(&t, &theirs);
    assert!(err.contains(&theirs.display().to_string()), "{err}");
    assert!(err.contains("no PREPFS-CACHE marker"), "{err}");
    assert_eq!(
        std::fs::metadata(&theirs).expect("dir").mode() & 0o7777,
        0o755,
        "mode unchanged"
    );
    assert_eq!(
        tree(&theirs),
        before,
        "nothing in it changed, added or removed"
    );
}

#[test]
fn an_empty_directory_is_adopted_as_it_is_and_serves_the_next_mount_from_disk() {
    let mut t = TestMount::new();
    let files = vec![("f.bin", compressible(2 << 20, 5))];
    fill(&t, &files);
    let dir = t.dir.path().join("empty");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    let dir_arg = dir.to_str().expect("utf-8 path");
    let args = disk_tier(dir_arg);
    t.mount(&args);
    let marker = std::fs::symlink_metadata(dir.join("PREPFS-CACHE")).expect("marker written");
    assert!(marker.is_file());
    assert_eq!(marker.mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(&dir).expect("dir").mode() & 0o7777,
        0o750,
        "its mode is the user's"
    );
    read_all_and_compare(&t, &files);
    wait_for(&t, "both blocks on disk", |s| {
        stat(s, "disk.entries") == 2.0
    });
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));

    t.mount(&args);
    read_all_and_compare(&t, &files);
    let stats = t.stats();
    assert!(stat(&stats, "disk.hits") >= 2.0, "{stats:#}");
    assert_eq!(stat(&stats, "source.bytes_read"), 0.0, "{stats:#}");
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
}

#[test]
fn a_symlinked_blocks_or_tmp_dir_is_refused_and_its_target_left_untouched() {
    let mut t = TestMount::new();
    let files = vec![("f.bin", compressible(300_000, 6))];
    fill(&t, &files);
    for sub in ["blocks", "tmp"] {
        let dir = t.dir.path().join(format!("cache-{sub}"));
        t.mount(&["--cache-dir", dir.to_str().expect("utf-8")]);
        read_all_and_compare(&t, &files);
        assert_eq!(t.unmount().map(|s| s.success()), Some(true));

        // Somewhere else, with names prepfs would read, write or remove there.
        let elsewhere = t.dir.path().join(format!("elsewhere-{sub}"));
        for name in ["ab/ab0000000000000000000000000000cd", "0123456789abcdef"] {
            let path = elsewhere.join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, b"not prepfs's").expect("write");
        }
        std::fs::remove_dir_all(dir.join(sub)).expect("rm");
        std::os::unix::fs::symlink(&elsewhere, dir.join(sub)).expect("symlink");
        let before = tree(&elsewhere);

        let err = mount_fails(&t, &dir);
        assert!(err.contains(&format!("{sub}/ is a symlink")), "{err}");
        assert_eq!(
            tree(&elsewhere),
            before,
            "{sub}: the link's target untouched"
        );
    }
}

#[test]
fn a_fifo_in_the_cache_dir_is_a_miss_and_blocks_neither_the_scan_nor_a_read() {
    let mut t = TestMount::new();
    let files = vec![("f.bin", compressible(300_000, 8))];
    fill(&t, &files);
    let dir = cache_dir(&t);
    let dir_arg = dir.to_str().expect("utf-8 path");
    let args = disk_tier(dir_arg);
    t.mount(&args);
    read_all_and_compare(&t, &files);
    wait_for(&t, "the block on disk", |s| stat(s, "disk.entries") == 1.0);
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));

    // FIFOs at the entry the next read looks up, at another valid-looking entry name, and at a
    // temporary file's name.
    let written = entries(&dir);
    assert_eq!(written.len(), 1, "{written:?}");
    let entry = written[0].clone();
    std::fs::remove_file(&entry).expect("rm entry");
    let other = dir.join("blocks/ab/ab0000000000000000000000000000cd");
    std::fs::create_dir_all(other.parent().expect("shard")).expect("mkdir shard");
    let fifos = [entry, other, dir.join("tmp/0123456789abcdef")];
    for fifo in &fifos {
        let made = Command::new("mkfifo").arg(fifo).status().expect("mkfifo");
        assert!(made.success());
    }

    t.mount(&args);
    // A reader whose request the daemon has taken cannot be killed until the daemon answers:
    // a regression that hangs is turned into a failure by killing the daemon.
    let out = t.dir.path().join("read.out");
    let mut cat = Command::new("cat")
        .arg(t.m("f.bin"))
        .stdout(std::fs::File::create(&out).expect("create read.out"))
        .spawn()
        .expect("run cat");
    let deadline = Instant::now() + Duration::from_secs(20);
    while cat.try_wait().expect("wait for cat").is_none() {
        if Instant::now() > deadline {
            if let Some(mut daemon) = t.child.take() {
                let _ = daemon.kill();
                let _ = daemon.wait();
            }
            let _ = cat.wait();
            let _ = Command::new("umount").arg("-l").arg(&t.mnt).output();
            panic!("the read hung (FIFO opened as a cache entry)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        std::fs::read(&out).expect("read.out") == files[0].1,
        "bytes differ from the source"
    );
    let stats = wait_for(&t, "the scan", |s| stat(s, "disk.scanned") == 1.0);
    assert_eq!(stat(&stats, "ops.read.errors"), 0.0);
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
    for fifo in &fifos {
        let kind = std::fs::symlink_metadata(fifo)
            .expect("still there")
            .file_type();
        assert!(kind.is_fifo(), "{} left in place", fifo.display());
    }
}

#[test]
fn the_cache_dir_must_be_private_and_used_by_one_mount_at_a_time() {
    let mut t = TestMount::new();
    fill(&t, &[("a", vec![1, 2, 3])]);
    let open = t.dir.path().join("world-writable");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    assert!(mount_fails(&t, &open).contains("writable by group or others"));

    let foreign = t.dir.path().join("foreign");
    std::fs::create_dir(&foreign).expect("mkdir");
    std::os::unix::fs::chown(&foreign, Some(4321), Some(4321)).expect("chown (needs root)");
    assert!(mount_fails(&t, &foreign).contains("owned by uid 4321"));

    let loose = t.dir.path().join("loose");
    std::fs::create_dir(&loose).expect("mkdir");
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let created = t.dir.path().join("new/nested");
    t.mount(&["--cache-dir", loose.to_str().expect("utf-8")]);
    assert_eq!(
        std::fs::metadata(&loose).expect("dir").mode() & 0o777,
        0o755,
        "an empty directory is adopted as it is: prepfs never chmods what it did not create"
    );
    assert_eq!(
        std::fs::metadata(loose.join("lock")).expect("lock").mode() & 0o777,
        0o600
    );

    // A second mount of the same cache dir is refused while the first holds it.
    let mut other = TestMount::new();
    fill(&other, &[("b", vec![4])]);
    let err = mount_fails(&other, &loose);
    assert!(err.contains("in use by another prepfs mount"), "{err}");
    assert!(
        err.contains(&format!("pid {}", t.child.as_ref().map_or(0, |c| c.id()))),
        "{err}"
    );
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));

    // Once it is released, the other mount may use it; a missing dir is created 0700.
    other.mount(&["--cache-dir", loose.to_str().expect("utf-8")]);
    assert_eq!(other.unmount().map(|s| s.success()), Some(true));
    t.mount(&["--cache-dir", created.to_str().expect("utf-8")]);
    assert_eq!(
        std::fs::metadata(&created).expect("dir").mode() & 0o777,
        0o700
    );
    assert_eq!(std::fs::read(t.m("a")).expect("read"), vec![1, 2, 3]);
}
