//! Unit tests of the FUSE-free core: real local sources in temporary directories, and the
//! fault-injecting double for failures a healthy disk cannot produce on demand.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::cache::BLOCK_SIZE;
use crate::cache::codec::Codec;
use crate::cache::policy::DecodedCaching;
use crate::config::MountConfig;
use crate::daemon::build;
use crate::memory::{Staging, Use};
use crate::source::LocalSource;
use crate::source::Source;
use crate::source::faulty::{FaultPlan, FaultySource};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// A test mount: `config` as a user would give it, and the memory plan its pieces get.
#[derive(Clone)]
struct Setup {
    config: MountConfig,
    plan: crate::memory::MemoryPlan,
}

impl Setup {
    fn build(self, source: Arc<dyn Source>) -> Fs {
        build(source, &self.config, self.plan, None)
            .expect("the daemon starts")
            .fs
    }
}

fn options(budget: u64) -> Setup {
    let mut config = MountConfig::new("/src".into(), "/mnt/data".into());
    config.cache.budget = budget;
    config.cache.codec = Some(Codec::None);
    // Prefetch reads ahead of the reader; these tests count source reads exactly.
    config.prefetch.enabled = false;
    config.prefetch.threads = 2;
    config.views.render_threads = 2;
    // Tests render on the CPU whatever the machine has.
    config.views.gpu.mode = crate::view::gpu::GpuMode::Off;
    config.scheduler = None;
    Setup {
        config,
        // The RAM tier gets `budget`; no staging (prefetch is off), and room for reads in
        // flight and renders beside it.
        plan: crate::memory::MemoryPlan {
            cache: budget,
            staging: 0,
            work: 64 << 20,
        },
    }
}

fn local_fs(dir: &Path, budget: u64) -> Fs {
    options(budget).build(Arc::new(
        LocalSource::open(dir)
            .expect("source opens")
            .settled_at_once(),
    ))
}

fn faulty_fs(dir: &Path, budget: u64) -> (Fs, Arc<FaultPlan>) {
    let (source, plan) = FaultySource::new(Arc::new(
        LocalSource::open(dir)
            .expect("source opens")
            .settled_at_once(),
    ));
    (options(budget).build(Arc::new(source)), plan)
}

/// The cache's counters, which the fetcher owns.
fn cache(fs: &Fs) -> &crate::cache::metrics::CacheMetrics {
    fs.fetcher.metrics()
}

/// The RAM tier's gauges now.
fn ram(fs: &Fs) -> crate::cache::metrics::RamGauges {
    fs.fetcher.ram().gauges()
}

fn ino_of(fs: &Fs, path: &str) -> u64 {
    let mut ino = inode::ROOT;
    for part in path.split('/') {
        ino = fs.lookup(ino, OsStr::new(part)).expect("lookup").ino;
    }
    ino
}

fn read_all(fs: &Fs, fh: u64, size: u64) -> Result<Vec<u8>, FsError> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < size {
        let bytes = fs.read(fh, offset, 256 << 10)?;
        let got = bytes.as_slice();
        if got.is_empty() {
            break;
        }
        out.extend_from_slice(got);
        offset += got.len() as u64;
    }
    Ok(out)
}

/// The file at `path` (from the mount root: a source file, or a view's) read whole: looked up,
/// opened, read to its size and released.
fn read_file(fs: &Fs, path: &str) -> Vec<u8> {
    let ino = ino_of(fs, path);
    let size = fs.getattr(ino).expect("attr").size;
    let fh = fs.open(ino, Intent::Read).expect("open").fh;
    let bytes = read_all(fs, fh, size).expect("read");
    fs.release(fh).expect("release");
    bytes
}

#[test]
fn reads_match_source_at_block_boundaries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = BLOCK_SIZE as usize;
    for (i, len) in [0, 1, b - 1, b, b + 1, 3 * b + 7].into_iter().enumerate() {
        std::fs::write(dir.path().join(format!("f{i}")), pattern(len, i as u8)).expect("write");
    }
    let fs = local_fs(dir.path(), 1 << 30);
    for (i, len) in [0, 1, b - 1, b, b + 1, 3 * b + 7].into_iter().enumerate() {
        let want = pattern(len, i as u8);
        let opened = fs
            .open(ino_of(&fs, &format!("f{i}")), Intent::Read)
            .expect("open");
        for (offset, size) in [
            (0u64, 4096u32),
            (b as u64 - 3, 10),
            (b as u64 + 1, b as u32),
            (len as u64, 10),
            (len as u64 + 99, 1),
        ] {
            let got = fs.read(opened.fh, offset, size).expect("read");
            let start = (offset as usize).min(len);
            let end = (offset as usize + size as usize).min(len);
            assert_eq!(
                got.as_slice(),
                &want[start..end],
                "file {i} offset {offset} size {size}"
            );
            // The same range again is a verified hit answered without the source.
            let again = fs
                .read_cached(opened.fh, offset, size)
                .expect("cached")
                .expect("ok");
            assert_eq!(again.as_slice(), &want[start..end]);
        }
        assert_eq!(
            read_all(&fs, opened.fh, len as u64).expect("read all"),
            want
        );
        fs.release(opened.fh).expect("release");
    }
}

#[test]
fn eio_on_one_source_read_fails_that_call_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = pattern(3 * BLOCK_SIZE as usize, 1);
    std::fs::write(dir.path().join("f"), &data).expect("write");
    let (fs, plan) = faulty_fs(dir.path(), 1 << 30);
    let fh = fs.open(ino_of(&fs, "f"), Intent::Read).expect("open").fh;
    plan.fail_read_number.store(2, Ordering::SeqCst);
    assert!(fs.read(fh, 0, 4096).is_ok());
    assert_eq!(fs.read(fh, BLOCK_SIZE, 4096).err(), Some(FsError::Io));
    // The failed block was not cached; the next call succeeds with the right bytes.
    let again = fs.read(fh, BLOCK_SIZE, 4096).expect("retry succeeds");
    assert_eq!(
        again.as_slice(),
        &data[BLOCK_SIZE as usize..BLOCK_SIZE as usize + 4096]
    );
    assert_eq!(cache(&fs).source_errors.get(), 1);
}

#[test]
fn short_source_reads_still_return_whole_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = pattern(BLOCK_SIZE as usize + 5000, 2);
    std::fs::write(dir.path().join("f"), &data).expect("write");
    let (fs, plan) = faulty_fs(dir.path(), 1 << 30);
    plan.short_reads.store(true, Ordering::SeqCst);
    let fh = fs.open(ino_of(&fs, "f"), Intent::Read).expect("open").fh;
    assert_eq!(read_all(&fs, fh, data.len() as u64).expect("read"), data);
}

#[test]
fn vanished_source_answers_errors_not_panics() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("d")).expect("mkdir");
    std::fs::write(dir.path().join("d/f"), pattern(10_000, 3)).expect("write");
    let (fs, plan) = faulty_fs(dir.path(), 1 << 30);
    let ino = ino_of(&fs, "d/f");
    let fh = fs.open(ino, Intent::Read).expect("open").fh;
    plan.vanished.store(true, Ordering::SeqCst);
    assert_eq!(fs.read(fh, 0, 100).err(), Some(FsError::Io));
    assert_eq!(fs.getattr(ino).err(), Some(FsError::NotFound));
    assert_eq!(
        fs.lookup(inode::ROOT, OsStr::new("d")).err(),
        Some(FsError::NotFound)
    );
    assert_eq!(fs.open(ino, Intent::Read).err(), Some(FsError::NotFound));
    assert!(fs.opendir(inode::ROOT).is_err());
    // Control files keep working when the source is gone.
    assert!(fs.lookup(inode::ROOT, OsStr::new(".prepfs")).is_ok());
}

#[test]
fn changed_file_is_served_fresh_on_next_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("f");
    let old = pattern(2 * BLOCK_SIZE as usize, 4);
    std::fs::write(&path, &old).expect("write");
    let fs = local_fs(dir.path(), 1 << 30);
    let ino = ino_of(&fs, "f");
    let fh = fs.open(ino, Intent::Read).expect("open").fh;
    assert_eq!(read_all(&fs, fh, old.len() as u64).expect("read"), old);
    fs.release(fh).expect("release");
    let cached_before = ram(&fs).bytes;
    assert!(cached_before > 0);

    let new = pattern(BLOCK_SIZE as usize + 17, 5);
    std::fs::write(&path, &new).expect("rewrite");
    let fh = fs.open(ino, Intent::Read).expect("reopen").fh;
    assert_eq!(read_all(&fs, fh, new.len() as u64).expect("read"), new);
    assert_eq!(cache(&fs).stale_detections.get(), 1);
    assert!(
        ram(&fs).bytes < cached_before + new.len() as u64,
        "old entry dropped"
    );
}

#[test]
fn a_file_deleted_in_the_source_gives_its_cached_memory_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("f");
    std::fs::write(&path, pattern(300_000, 6)).expect("write");
    let fs = local_fs(dir.path(), 1 << 30);
    let ino = ino_of(&fs, "f");
    let fh = fs.open(ino, Intent::Read).expect("open").fh;
    read_all(&fs, fh, 300_000).expect("read");
    fs.release(fh).expect("release");
    assert_eq!(ram(&fs).files, 1);
    std::fs::remove_file(&path).expect("rm");
    assert_eq!(fs.getattr(ino).err(), Some(FsError::NotFound));
    assert_eq!(
        ram(&fs).bytes,
        0,
        "the vanished version's blocks are released"
    );
    assert_eq!(ram(&fs).files, 0);
}

#[test]
fn file_changed_during_reading_answers_eio_not_mixed_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("f");
    std::fs::write(&path, pattern(2 * BLOCK_SIZE as usize, 6)).expect("write");
    let fs = local_fs(dir.path(), 1 << 30);
    let fh = fs.open(ino_of(&fs, "f"), Intent::Read).expect("open").fh;
    assert!(fs.read(fh, 0, 4096).is_ok());
    // Rewrite in place (same inode): the second block now belongs to another version.
    std::fs::write(&path, pattern(2 * BLOCK_SIZE as usize, 7)).expect("rewrite");
    assert_eq!(fs.read(fh, BLOCK_SIZE, 4096).err(), Some(FsError::Io));
    assert!(cache(&fs).stale_detections.get() >= 1);
}

#[test]
fn corrupt_block_is_refetched_from_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let small = pattern(70_000, 8);
    let large = pattern(2 * BLOCK_SIZE as usize + 3, 9);
    std::fs::write(dir.path().join("small"), &small).expect("write");
    std::fs::write(dir.path().join("large"), &large).expect("write");
    let fs = local_fs(dir.path(), 1 << 30);
    for (name, data) in [("small", &small), ("large", &large)] {
        let fh = fs.open(ino_of(&fs, name), Intent::Read).expect("open").fh;
        assert_eq!(&read_all(&fs, fh, data.len() as u64).expect("read"), data);
        let Handle::File(reader) = &fs.handle(fh).expect("handle").handle else {
            panic!("file handle")
        };
        reader.entry().corrupt_for_test(0);
        let errors = cache(&fs).integrity_errors.get();
        assert!(
            fs.read_cached(fh, 0, 100).is_none(),
            "a corrupt block is never a hit"
        );
        assert_eq!(cache(&fs).integrity_errors.get(), errors + 1);
        let got = fs.read(fh, 0, 100).expect("refetch");
        assert_eq!(
            got.as_slice(),
            &data[..100],
            "{name}: correct bytes after refetch"
        );
    }
}

#[test]
fn concurrent_misses_on_one_block_read_the_source_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = pattern(BLOCK_SIZE as usize, 10);
    std::fs::write(dir.path().join("f"), &data).expect("write");
    let (fs, plan) = faulty_fs(dir.path(), 1 << 30);
    let fs = Arc::new(fs);
    let fh = fs.open(ino_of(&fs, "f"), Intent::Read).expect("open").fh;
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (fs, barrier, data) = (fs.clone(), barrier.clone(), data.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let got = fs.read(fh, i * 1000, 1000).expect("read");
                assert_eq!(
                    got.as_slice(),
                    &data[i as usize * 1000..(i as usize + 1) * 1000]
                );
            })
        })
        .collect();
    for t in threads {
        t.join().expect("reader thread");
    }
    assert_eq!(
        plan.reads.load(Ordering::SeqCst),
        1,
        "one source read for eight concurrent misses"
    );
}

#[test]
fn full_budget_stops_admitting_and_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..10 {
        std::fs::write(dir.path().join(format!("f{i}")), pattern(100_000, i)).expect("write");
    }
    let fs = local_fs(dir.path(), 350_000);
    for round in 0..2 {
        for i in 0..10u8 {
            let fh = fs
                .open(ino_of(&fs, &format!("f{i}")), Intent::Read)
                .expect("open")
                .fh;
            assert_eq!(
                read_all(&fs, fh, 100_000).expect("read"),
                pattern(100_000, i),
                "round {round} file {i}"
            );
            fs.release(fh).expect("release");
        }
    }
    let g = ram(&fs);
    // With passthrough (as root) each file lives in a memfd, charged in whole 4 KiB pages.
    assert!(
        [300_000, 3 * 100_000u64.div_ceil(4096) * 4096].contains(&g.bytes),
        "three files fit, nothing evicted: {}",
        g.bytes
    );
    assert_eq!(
        cache(&fs).admission_rejected.get(),
        14,
        "7 files rejected in each of 2 rounds"
    );
    assert_eq!(
        cache(&fs).hits.get(),
        3,
        "round 2 hits exactly what was admitted"
    );
}

#[test]
fn full_cache_reads_only_the_requested_bytes_from_the_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("small"), pattern(100_000, 1)).expect("write");
    std::fs::write(dir.path().join("big"), pattern(3 * BLOCK_SIZE as usize, 2)).expect("write");
    let fs = local_fs(dir.path(), 0);
    for (name, len) in [("small", 100_000usize), ("big", 3 * BLOCK_SIZE as usize)] {
        let before = cache(&fs).source_bytes.get();
        let fh = fs.open(ino_of(&fs, name), Intent::Read).expect("open").fh;
        let mut got = Vec::new();
        while got.len() < len {
            got.extend_from_slice(
                fs.read(fh, got.len() as u64, 8192)
                    .expect("read")
                    .as_slice(),
            );
        }
        fs.release(fh).expect("release");
        assert_eq!(
            got,
            pattern(len, if name == "small" { 1 } else { 2 }),
            "{name}"
        );
        assert_eq!(
            cache(&fs).source_bytes.get() - before,
            len as u64,
            "{name}: 8 KiB reads of a never-admittable file read each byte from the source once"
        );
    }
    assert_eq!(ram(&fs).bytes, 0);
}

#[test]
fn writes_and_bad_handles_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("f"), b"x").expect("write");
    let fs = local_fs(dir.path(), 1 << 20);
    assert_eq!(
        fs.open(ino_of(&fs, "f"), Intent::Write).err(),
        Some(FsError::ReadOnly)
    );
    assert_eq!(fs.read(999, 0, 1).err(), Some(FsError::BadHandle));
    assert_eq!(fs.release(999).err(), Some(FsError::BadHandle));
    assert_eq!(
        fs.open(inode::ROOT, Intent::Read).err(),
        Some(FsError::IsDirectory)
    );
    assert_eq!(
        fs.opendir(ino_of(&fs, "f")).err(),
        Some(FsError::NotDirectory)
    );
}

#[test]
fn control_dir_is_reachable_but_not_listed() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("class_a")).expect("mkdir");
    let fs = local_fs(dir.path(), 1 << 20);
    let fh = fs.opendir(inode::ROOT).expect("opendir");
    let mut names = Vec::new();
    fs.readdir(fh, 0, |_, item| {
        names.push(item.name);
        false
    })
    .expect("readdir");
    assert_eq!(names, vec![".", "..", "class_a"]);
    let control = fs
        .lookup(inode::ROOT, OsStr::new(".prepfs"))
        .expect("reachable");
    assert_eq!(control.kind, Kind::Directory);
    let stats = fs
        .lookup(control.ino, OsStr::new("stats.json"))
        .expect("stats file");
    let opened = fs.open(stats.ino, Intent::Read).expect("open stats");
    let text = read_all(&fs, opened.fh, 1 << 20).expect("read stats");
    let json: serde_json::Value = serde_json::from_slice(&text).expect("stats.json parses");
    assert!(json["cache"]["budget_bytes"].as_u64() == Some(1 << 20));
}

/// What telemetry and the reward count as a sample: items (files, view tensors) from their
/// open to their release; the control files and directories are not items, so a user polling
/// stats.json never makes an idle mount look busy.
#[test]
fn items_are_timed_from_open_to_release_and_control_files_are_not_items() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("f"), pattern(5_000, 1)).expect("write");
    let fs = local_fs(dir.path(), 1 << 30);
    let metrics = fs.metrics();
    let opened = fs.open(ino_of(&fs, "f"), Intent::Read).expect("open");
    read_all(&fs, opened.fh, 5_000).expect("read");
    std::thread::sleep(std::time::Duration::from_millis(30));
    fs.release(opened.fh).expect("release");
    assert_eq!(metrics.item_opens.get(), 1);
    let counts = metrics.load_latency.counts();
    assert_eq!(counts.iter().sum::<u64>(), 1);
    // One duration: its estimate is the middle of its bucket, 1/16 of 16.8 ms wide from 16.8 ms
    // to 33.6 ms, so at most half of that (524 us) below the truth.
    let p50_us = crate::metrics::quantile_us(&counts, 0.5);
    assert!(
        p50_us >= 30_000.0 - 525.0,
        "open to release took at least the 30 ms slept: {p50_us}"
    );
    for path in [".prepfs/stats.json", ".prepfs/metrics"] {
        let control = fs
            .open(ino_of(&fs, path), Intent::Read)
            .expect("open control");
        fs.release(control.fh).expect("release control");
    }
    let dir_fh = fs.opendir(inode::ROOT).expect("opendir");
    fs.release(dir_fh).expect("releasedir");
    assert_eq!(
        metrics.item_opens.get(),
        1,
        "control files and directories are not items"
    );
    assert_eq!(metrics.load_latency.counts().iter().sum::<u64>(), 1);
}

/// Which requests may wait on the source, tree by tree (`Tree::needs_source`): the adapter runs
/// the others on the kernel's thread, so none of them may touch the source; and the requests that
/// list or resolve names under a view's root (the source root's) must go to the I/O pool.
#[test]
fn only_requests_that_touch_the_source_are_said_to_need_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_photos(dir.path(), 1, |i| format!("a{i}.jpg"));
    std::fs::create_dir(dir.path().join("d")).expect("mkdir");
    let mut o = options(1 << 30);
    o.config.views.specs =
        vec![crate::view::ViewSpec::parse("v=decode,resize(32),uint8").expect("spec")];
    let fs = o.build(Arc::new(
        LocalSource::open(dir.path())
            .expect("source")
            .settled_at_once(),
    ));
    let name = |n: &'static str| Ask::Lookup(OsStr::new(n));
    let cached = Ask::Xattr(OsStr::new(CACHED_XATTR));
    let other_xattr = Ask::Xattr(OsStr::new("security.selinux"));
    let view_root = ino_of(&fs, ".prepfs/views/v");
    let view_file = ino_of(&fs, ".prepfs/views/v/a0.jpg.npy");
    let (file, subdir) = (ino_of(&fs, "a0.jpg"), ino_of(&fs, "d"));
    let cases = [
        (inode::ROOT, name(".prepfs"), false),
        (inode::ROOT, name("a0.jpg"), true),
        (inode::ROOT, Ask::Getattr, true),
        (inode::ROOT, Ask::Opendir, true),
        (inode::CONTROL_DIR, name("stats.json"), false),
        (inode::CONTROL_DIR, Ask::Opendir, false),
        (inode::STATS_FILE, Ask::Open, false),
        (inode::METRICS_FILE, Ask::Getattr, false),
        (inode::VIEWS_DIR, name("v"), false),
        (inode::VIEWS_DIR, Ask::Opendir, false),
        (view_root, Ask::Getattr, false),
        (view_root, name("a0.jpg.npy"), true),
        (view_root, Ask::Opendir, true),
        (view_file, Ask::Getattr, true),
        (view_file, Ask::Open, false),
        (view_file, cached, false),
        (file, Ask::Open, true),
        (file, cached, true),
        (file, other_xattr, false),
        (subdir, Ask::Opendir, true),
        // A number no node has is answered NotFound at once.
        (1 << 40, Ask::Getattr, false),
    ];
    for (ino, ask, needs) in cases {
        assert_eq!(fs.needs_source(ino, ask), needs, "{ino} {ask:?}");
    }
    // The view root's listing is the source root's images, as .npy files.
    let fh = fs.opendir(view_root).expect("opendir");
    let mut names = Vec::new();
    fs.readdir(fh, 0, |_, item| {
        names.push(item.name);
        false
    })
    .expect("readdir");
    assert_eq!(names, vec![".", "..", "a0.jpg.npy", "d"]);
}

#[test]
fn readdir_resumes_from_any_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..500 {
        std::fs::write(dir.path().join(format!("n{i:03}")), b"").expect("write");
    }
    let fs = local_fs(dir.path(), 1 << 20);
    let fh = fs.opendir(inode::ROOT).expect("opendir");
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let mut batch = 0;
        fs.readdir(fh, offset, |next, item| {
            seen.push(item.name);
            offset = next;
            batch += 1;
            batch == 37
        })
        .expect("readdir");
        if batch < 37 {
            break;
        }
    }
    assert_eq!(seen.len(), 502);
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen.len(),
        502,
        "no name repeated or lost across resumptions"
    );
}

#[test]
fn symlinks_are_shown_never_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("escape")).expect("symlink");
    std::os::unix::fs::symlink("loop", dir.path().join("loop")).expect("symlink");
    std::fs::create_dir(dir.path().join("d")).expect("mkdir");
    let fs = local_fs(dir.path(), 1 << 20);
    let escape = fs
        .lookup(inode::ROOT, OsStr::new("escape"))
        .expect("lookup");
    assert_eq!(escape.kind, Kind::Symlink);
    assert_eq!(fs.readlink(escape.ino).expect("readlink"), "/etc/passwd");
    assert_eq!(
        fs.open(escape.ino, Intent::Read).err(),
        Some(FsError::AccessDenied)
    );
    let looped = fs.lookup(inode::ROOT, OsStr::new("loop")).expect("lookup");
    assert_eq!(fs.readlink(looped.ino).expect("readlink"), "loop");
    assert_eq!(
        fs.lookup(inode::ROOT, OsStr::new("..")).err(),
        Some(FsError::InvalidName)
    );
    assert_eq!(
        fs.lookup(escape.ino, OsStr::new("x")).err(),
        Some(FsError::NotDirectory)
    );
}

/// Writes `count` synthetic photos into `dir`, photo `i` named `name(i)`; their bytes.
fn write_photos(dir: &Path, count: u64, name: fn(u64) -> String) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let jpeg = crate::synthetic::photo(i).expect("jpeg");
            std::fs::write(dir.join(name(i)), &jpeg).expect("write");
            jpeg
        })
        .collect()
}

#[test]
fn decoded_pixels_are_cached_and_a_damaged_copy_is_decoded_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jpegs = write_photos(dir.path(), 3, |i| format!("a{i}.jpg"));
    // 300-480 rows to 256: never shrinks by 2, so renders read the images at full scale.
    let spec = crate::view::ViewSpec::parse("v=decode,resize(256),uint8(hwc)").expect("spec");
    let fs_with = |mode| {
        let mut o = options(1 << 30);
        o.config.views.specs = vec![spec.clone()];
        o.config.cache.decoded = mode;
        o.build(Arc::new(
            LocalSource::open(dir.path())
                .expect("source")
                .settled_at_once(),
        ))
    };
    let read_view = |fs: &Fs, i: usize| read_file(fs, &format!(".prepfs/views/v/a{i}.jpg.npy"));
    let want: Vec<Vec<u8>> = jpegs
        .iter()
        .map(|j| {
            crate::view::render::render(&spec, j, 0)
                .expect("renders")
                .npy
        })
        .collect();
    let pixel_bytes: u64 = jpegs
        .iter()
        .map(|j| crate::view::render::decode(j).expect("decodes").byte_len() as u64)
        .sum();

    let fs = fs_with(DecodedCaching::On);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&read_view(&fs, i), w, "first render of a{i}");
    }
    let source_bytes = cache(&fs).source_bytes.get();
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&read_view(&fs, i), w, "render of a{i} from cached pixels");
    }
    let m = cache(&fs);
    assert_eq!(
        (
            m.decoded_misses.get(),
            m.decoded_admitted.get(),
            m.decoded_hits.get()
        ),
        (3, 3, 3)
    );
    assert_eq!(
        m.source_bytes.get(),
        source_bytes,
        "cached pixels need no fetch"
    );
    let g = ram(&fs);
    assert_eq!((g.decoded_entries, g.decoded_bytes), (3, pixel_bytes));
    // The copies the first renders made took the files' places, and pixels are not files.
    assert_eq!(
        (g.files, g.marked_entries),
        (0, 3),
        "decoded entries are not counted as files"
    );

    // A damaged cached copy is a miss: decoded again from the cached JPEG copy, and re-admitted.
    let identity = LocalSource::open(dir.path())
        .expect("source")
        .settled_at_once()
        .stat(Path::new("a1.jpg"))
        .expect("stat")
        .identity;
    fs.fetcher.derived().corrupt_decoded_for_test(&identity);
    assert_eq!(read_view(&fs, 1), want[1]);
    assert_eq!(m.integrity_errors.get(), 1);
    assert_eq!((m.decoded_misses.get(), m.decoded_admitted.get()), (4, 4));

    // Off: the same bytes, decoded only where the renders read, so nothing is offered.
    let off = fs_with(DecodedCaching::Off);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&read_view(&off, i), w);
    }
    assert_eq!(cache(&off).decoded_declined.get(), 0);
    assert_eq!(ram(&off).decoded_entries, 0);

    // Pixels that do not fit the budget are not even decoded whole; renders still succeed.
    let mut o = options(jpegs.iter().map(|j| j.len() as u64).sum::<u64>() + 1000);
    o.config.views.specs = vec![spec.clone()];
    o.config.cache.decoded = DecodedCaching::On;
    let tight = o.build(Arc::new(
        LocalSource::open(dir.path())
            .expect("source")
            .settled_at_once(),
    ));
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&read_view(&tight, i), w);
    }
    assert_eq!(cache(&tight).decoded_rejected.get(), 0);
    assert_eq!(ram(&tight).decoded_bytes, 0);
}

#[test]
fn renders_that_read_their_jpeg_scaled_never_render_from_cached_pixels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jpeg = crate::synthetic::photo(5).expect("jpeg");
    std::fs::write(dir.path().join("a.jpg"), &jpeg).expect("write");
    // 300-480 rows to 64 shrinks by 4 or more: read at 1/4 or 1/8 scale.
    let spec = crate::view::ViewSpec::parse("v=decode,resize(64),uint8(hwc)").expect("spec");
    let size = crate::view::render::dimensions(&jpeg).expect("header");
    assert!(
        crate::view::Plan::new(&spec, size, 0)
            .expect("plans")
            .reads_scaled()
    );
    let mut o = options(1 << 30);
    o.config.views.specs = vec![spec.clone()];
    o.config.cache.decoded = DecodedCaching::On;
    let fs = o.build(Arc::new(
        LocalSource::open(dir.path())
            .expect("source")
            .settled_at_once(),
    ));
    let want = crate::view::render::render(&spec, &jpeg, 0)
        .expect("renders")
        .npy;
    // Pixels already cached (as prefetch's decode-ahead leaves them) are not used either.
    let identity = LocalSource::open(dir.path())
        .expect("source")
        .settled_at_once()
        .stat(Path::new("a.jpg"))
        .expect("stat")
        .identity;
    let pixels = crate::view::render::decode(&jpeg).expect("decodes");
    assert!(fs.fetcher.derived().offer_decoded(
        identity,
        (pixels.byte_len() as u64, pixels.row_len()),
        Duration::from_secs(1),
        || pixels.to_bytes(),
    ));
    let ino = ino_of(&fs, ".prepfs/views/v/a.jpg.npy");
    for _ in 0..2 {
        let size = fs.getattr(ino).expect("attr").size;
        let opened = fs.open(ino, Intent::Read).expect("open");
        assert_eq!(read_all(&fs, opened.fh, size).expect("read"), want);
        fs.release(opened.fh).expect("release");
    }
    assert_eq!(
        cache(&fs).decoded_admitted.get(),
        1,
        "only the one offered here"
    );
}

/// `files` files of 64 KiB behind a source that takes 2 ms per read, a 256 KiB cache, a
/// staging buffer of `staging` bytes (sized as by `--prefetch-buffer`), and prefetch (2 threads)
/// following `order_hint` when given.
fn slow_prefetching_fs(
    files: u8,
    staging: u64,
    order_file: Option<std::path::PathBuf>,
) -> (tempfile::TempDir, Fs, Arc<FaultPlan>) {
    slow_prefetching_fs_sized(files, |_| 64 << 10, Staging::Asked(staging), order_file)
}

/// As `slow_prefetching_fs`, file `fNN` holding `size(NN)` bytes, and the staging slice the
/// user asked for or the default one.
fn slow_prefetching_fs_sized(
    files: u8,
    size: impl Fn(u8) -> usize,
    staging: Staging,
    order_file: Option<std::path::PathBuf>,
) -> (tempfile::TempDir, Fs, Arc<FaultPlan>) {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..files {
        std::fs::write(dir.path().join(format!("f{i:02}")), pattern(size(i), i)).expect("write");
    }
    let (source, plan) = FaultySource::new(Arc::new(
        LocalSource::open(dir.path())
            .expect("source")
            .settled_at_once(),
    ));
    plan.read_delay_us.store(2000, Ordering::SeqCst);
    let mut setup = options(256 << 10);
    setup.config.prefetch.enabled = true;
    setup.config.prefetch.order_file = order_file;
    (setup.config.prefetch.buffer, setup.plan.staging) = match staging {
        Staging::Asked(bytes) => (Some(bytes), bytes),
        Staging::Default(bytes) => (None, bytes),
        Staging::None => (None, 0),
    };
    let fs = setup.build(Arc::new(source));
    (dir, fs, plan)
}

/// Reads `order` through `fs` as a training loop does, thinking 3 ms after each file.
fn read_pass(fs: &Fs, order: &[u8], want: impl Fn(u8) -> Vec<u8>) {
    for &i in order {
        let name = format!("f{i:02}");
        let fh = fs.open(ino_of(fs, &name), Intent::Read).expect("open").fh;
        assert_eq!(read_all(fs, fh, 1 << 20).expect("read"), want(i), "{name}");
        fs.release(fh).expect("release");
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// Reads passes 1 and 2 of 200 files of 8 KiB in `orders` and the first file of pass 3; the
/// staging slice once the planner has taken that open.
fn staging_after_two_passes(staging: Staging, orders: [&[u8]; 2]) -> u64 {
    let (_dir, fs, _plan) = slow_prefetching_fs_sized(200, |_| 8 << 10, staging, None);
    let want = |i: u8| pattern(8 << 10, i);
    for order in orders {
        read_pass(&fs, order, want);
    }
    read_pass(&fs, &orders[0][..1], want);
    status_at_epoch(&fs, 3);
    let memory = fs.memory();
    assert_eq!(
        memory.slice(Use::Cache) + memory.slice(Use::Staging),
        (256 << 10) + (1 << 20),
        "staging's room moves to the cache, the budget stays"
    );
    memory.slice(Use::Staging)
}

/// Two orders of 200 files no predictor follows.
fn shuffled_twice() -> [Vec<u8>; 2] {
    [3, 4].map(|seed| {
        let mut order: Vec<u8> = (0..200).collect();
        fastrand::Rng::with_seed(seed).shuffle(&mut order);
        order
    })
}

/// A pass in an order no predictor follows (the remaining set planned it) gives the default
/// staging slice's free room to the cache: in such an order a staged block moves a read earlier
/// once, a cached one saves a read every epoch.
#[test]
fn shuffled_passes_give_the_default_staging_room_to_the_cache() {
    let [first, second] = shuffled_twice();
    let staging = staging_after_two_passes(Staging::Default(1 << 20), [&first, &second]);
    assert!(staging < 1 << 20, "staging kept its slice");
}

/// A shuffled second pass gives the staging room to the cache once it is clearly shuffled (an
/// eighth of the pass, at least `SHUFFLED_AFTER` plans), not at its end: the rest of that pass
/// then fills the lent room, and every later pass reads that much less from the source.
#[test]
fn a_pass_seen_to_be_shuffled_gives_the_staging_room_before_it_ends() {
    let [first, second] = shuffled_twice();
    let (_dir, fs, _plan) =
        slow_prefetching_fs_sized(200, |_| 8 << 10, Staging::Default(1 << 20), None);
    let want = |i: u8| pattern(8 << 10, i);
    read_pass(&fs, &first, want);
    read_pass(&fs, &second[..120], want);
    let memory = fs.memory();
    for _ in 0..100 {
        if memory.slice(Use::Staging) < 1 << 20 {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "staging kept its slice 120 opens into a shuffled second pass: {}",
        fs.prefetcher.status()
    );
}

/// Passes in one order keep the default staging slice (prefetch follows them and hides the
/// source's latency), and a slice the user sized is kept whatever the order.
#[test]
fn a_followed_order_or_an_asked_staging_size_keeps_the_staging_slice() {
    let sorted: Vec<u8> = (0..200).collect();
    let staging = staging_after_two_passes(Staging::Default(1 << 20), [&sorted, &sorted]);
    assert_eq!(staging, 1 << 20, "sorted passes");
    let [shuffled, _] = shuffled_twice();
    let staging = staging_after_two_passes(Staging::Default(1 << 20), [&shuffled, &shuffled]);
    assert_eq!(staging, 1 << 20, "one shuffled order, replayed");
    let [first, second] = shuffled_twice();
    let staging = staging_after_two_passes(Staging::Asked(1 << 20), [&first, &second]);
    assert_eq!(staging, 1 << 20, "--prefetch-buffer given");
}

/// Once a pass has ended, prefetch stages nothing of files the readers never open: a sorted walk
/// past the last file they read (here into `zz/`, as into a directory of shards beside the
/// samples) would otherwise hold staging room every pass.
#[test]
fn after_a_pass_prefetch_stages_nothing_of_files_the_readers_never_open() {
    let (dir, fs, _plan) = slow_prefetching_fs(12, 8 << 20, None);
    std::fs::create_dir(dir.path().join("zz")).expect("mkdir");
    for name in ["a", "b", "c"] {
        std::fs::write(dir.path().join("zz").join(name), pattern(2 << 20, 9)).expect("write");
    }
    let order: Vec<u8> = (0..12).collect();
    let want = |i: u8| pattern(64 << 10, i);
    read_pass(&fs, &order, want);
    read_pass(&fs, &order, want);
    // The planner has taken the second pass's last open, and the workers have had time to fetch
    // whatever it planned after it.
    status_at_epoch(&fs, 2);
    std::thread::sleep(Duration::from_secs(1));
    for name in ["a", "b", "c"] {
        let path = std::path::PathBuf::from("zz").join(name);
        let identity = fs.source.stat(&path).expect("stat").identity;
        assert!(
            !fs.fetcher.staging().contains(identity, 0),
            "zz/{name} staged in the second pass"
        );
    }
}

/// The planner's published status once it shows `epoch` for the source tree.
fn status_at_epoch(fs: &Fs, epoch: u64) -> serde_json::Value {
    for _ in 0..100 {
        let status = fs.prefetcher.status();
        if status["files"]["epoch"] == epoch {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "planner never showed epoch {epoch}: {}",
        fs.prefetcher.status()
    );
}

/// The planner's status at epoch 3, checked to follow `predictor` with precision above 0.9.
fn followed_at_epoch_3(fs: &Fs, predictor: &str) -> serde_json::Value {
    let status = status_at_epoch(fs, 3);
    assert_eq!(status["files"]["predictor"], predictor, "{status}");
    assert!(
        status["files"]["predictors"][predictor]["precision"]
            .as_f64()
            .is_some_and(|p| p > 0.9),
        "{status}"
    );
    status
}

/// Rewrites `order[at]` in `dir` with new bytes of another size, then reads `order[at..]`
/// through `fs`, checking that file at its new version and the others unchanged.
fn rewrite_next_and_read_the_rest(dir: &Path, fs: &Fs, order: &[u8], at: usize) {
    let changed = order[at];
    let fresh = pattern(70_000, 99);
    std::fs::write(dir.join(format!("f{changed:02}")), &fresh).expect("rewrite");
    read_pass(fs, &order[at..], |i| {
        if i == changed {
            fresh.clone()
        } else {
            pattern(64 << 10, i)
        }
    });
}

#[test]
fn replayed_order_is_prefetched_from_a_slow_source_into_the_staging_buffer() {
    let (_dir, fs, _plan) = slow_prefetching_fs(60, 8 << 20, None);
    let mut order: Vec<u8> = (0..60).collect();
    fastrand::Rng::with_seed(7).shuffle(&mut order);
    for _ in 0..3 {
        read_pass(&fs, &order, |i| pattern(64 << 10, i));
    }
    let status = followed_at_epoch_3(&fs, "replay");
    let m = cache(&fs);
    assert!(
        fs.prefetcher.metrics().useful.get() > 0,
        "no prefetched file was opened"
    );
    assert!(m.staged_reads.get() > 0, "nothing served from staging");
    assert_eq!(
        status["files"]["history"][1]["files"], 60,
        "epoch 2 recorded: {status}"
    );
}

#[test]
fn a_prefetched_file_changed_in_the_source_is_served_at_its_new_version() {
    let (dir, fs, _plan) = slow_prefetching_fs(40, 8 << 20, None);
    let order: Vec<u8> = (0..40).rev().collect();
    for _ in 0..2 {
        read_pass(&fs, &order, |i| pattern(64 << 10, i));
    }
    read_pass(&fs, &order[..10], |i| pattern(64 << 10, i));
    // Let the prefetcher fetch the next files of the replayed order (old versions).
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        fs.fetcher.staging().bytes() > 0,
        "the next files were staged"
    );
    rewrite_next_and_read_the_rest(dir.path(), &fs, &order, 10);
}

#[test]
fn a_sampler_order_file_is_followed_where_no_pass_repeats_the_last() {
    let hint_dir = tempfile::tempdir().expect("tempdir");
    let order_file = hint_dir.path().join("order");
    // The test mount is at /mnt/data (see `options`).
    let (_dir, fs, _plan) = slow_prefetching_fs(60, 8 << 20, Some(order_file.clone()));
    let mut rng = fastrand::Rng::with_seed(11);
    for _ in 0..3 {
        // A fresh shuffle each epoch, published before the epoch starts, as absolute paths.
        let mut order: Vec<u8> = (0..60).collect();
        rng.shuffle(&mut order);
        let text: String = order
            .iter()
            .map(|i| format!("/mnt/data/f{i:02}\n"))
            .collect();
        std::fs::write(&order_file, text).expect("order file");
        std::thread::sleep(Duration::from_millis(400));
        read_pass(&fs, &order, |i| pattern(64 << 10, i));
    }
    followed_at_epoch_3(&fs, "hint");
    assert!(
        fs.prefetcher.metrics().useful.get() > 0,
        "no hinted file was prefetched in time"
    );
}

#[test]
fn without_room_for_their_bytes_files_are_opened_ahead_and_never_at_a_stale_version() {
    let (dir, fs, _plan) = slow_prefetching_fs(40, 0, None);
    let order: Vec<u8> = (0..40).rev().collect();
    for _ in 0..2 {
        read_pass(&fs, &order, |i| pattern(64 << 10, i));
    }
    read_pass(&fs, &order[..10], |i| pattern(64 << 10, i));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        fs.prefetcher.metrics().opened_ahead.get() > 0,
        "nothing opened ahead"
    );
    assert!(
        fs.prefetcher.metrics().opens_saved.get() > 0,
        "no open took a file opened ahead"
    );
    assert!(fs.prefetcher.parked() > 0, "the next files wait opened");
    // Rewritten in place: the parked descriptor now names another version.
    rewrite_next_and_read_the_rest(dir.path(), &fs, &order, 10);
}

#[test]
fn shuffled_epochs_stage_the_smallest_remaining_files_first() {
    // 120 files of 2 to 240 KiB, sizes unrelated to names (so no walk predicts the order).
    let size = |i: u8| (1 + (usize::from(i) * 7) % 120) * (2 << 10);
    let (dir, fs, _plan) = slow_prefetching_fs_sized(120, size, Staging::Asked(64 << 10), None);
    let local = LocalSource::open(dir.path())
        .expect("source")
        .settled_at_once();
    let held = |i: u8| {
        let id = local
            .stat(Path::new(&format!("f{i:02}")))
            .expect("stat")
            .identity;
        fs.fetcher.ram().get(&id).is_some_and(|e| e.is_complete())
    };
    let mut rng = fastrand::Rng::with_seed(5);
    let mut order: Vec<u8> = (0..120).collect();
    rng.shuffle(&mut order);
    read_pass(&fs, &order, |i| pattern(size(i), i));
    let cached: Vec<u8> = (0..120).filter(|&i| held(i)).collect();
    rng.shuffle(&mut order);
    read_pass(&fs, &order[..3], |i| pattern(size(i), i));
    std::thread::sleep(Duration::from_millis(300));
    let status = status_at_epoch(&fs, 2);
    assert_eq!(status["files"]["predictor"], "remaining", "{status}");
    assert!(fs.fetcher.staging().bytes() > 0, "nothing staged: {status}");
    // The smallest files not yet read (nor cached in epoch 1) are the ones staged.
    let mut unread: Vec<u8> = order[3..]
        .iter()
        .copied()
        .filter(|i| !cached.contains(i))
        .collect();
    unread.sort_by_key(|&i| size(i));
    let staged_reads = || cache(&fs).staged_reads.get();
    let before = staged_reads();
    read_pass(&fs, &unread[..3], |i| pattern(size(i), i));
    assert_eq!(staged_reads() - before, 3, "the 3 smallest were staged");
    let rest: Vec<u8> = order[3..]
        .iter()
        .copied()
        .filter(|i| !unread[..3].contains(i))
        .collect();
    read_pass(&fs, &rest, |i| pattern(size(i), i));
}

/// A mount of `spec` over the photos in `dir`, decoded pixels cached as `decoded`, over a source
/// of 2 ms reads, with prefetch when `prefetch`; and the telemetry it reads the CPU from.
fn view_fs(
    dir: &Path,
    spec: &crate::view::ViewSpec,
    decoded: DecodedCaching,
    prefetch: bool,
) -> (Arc<Fs>, Arc<crate::telemetry::Telemetry>) {
    let (source, plan) = FaultySource::new(Arc::new(
        LocalSource::open(dir).expect("source").settled_at_once(),
    ));
    plan.read_delay_us.store(2000, Ordering::SeqCst);
    let telemetry = Arc::new(crate::telemetry::Telemetry::default());
    let mut setup = options(1 << 30);
    setup.config.views.specs = vec![spec.clone()];
    setup.config.cache.decoded = decoded;
    setup.config.prefetch.enabled = prefetch;
    setup.plan.staging = 8 << 20;
    let fs = Arc::new(
        crate::daemon::build_observed(
            Arc::new(source),
            &setup.config,
            setup.plan,
            None,
            telemetry.clone(),
        )
        .expect("the daemon starts")
        .fs,
    );
    (fs, telemetry)
}

#[test]
fn view_images_predicted_next_are_decoded_ahead_while_the_cpu_is_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jpegs = write_photos(dir.path(), 24, |i| format!("a{i:02}.jpg"));
    // Never shrinks by 2 (see `renders_that_read_their_jpeg_scaled_never_render_from_cached_pixels`).
    let spec = crate::view::ViewSpec::parse("v=decode,resize(256),uint8(hwc)").expect("spec");
    let (fs, telemetry) = view_fs(dir.path(), &spec, DecodedCaching::On, true);
    // The test machine may be busy; the rule under test is what happens when it is idle.
    let stop = Arc::new(AtomicBool::new(false));
    let idle = {
        let (telemetry, stop) = (telemetry.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                telemetry.set_cpu_idle(1.0);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    // One pass in walk order, as a validation pass reads, with a training step between files.
    for (i, jpeg) in jpegs.iter().enumerate() {
        let ino = ino_of(&fs, &format!(".prepfs/views/v/a{i:02}.jpg.npy"));
        let size = fs.getattr(ino).expect("attr").size;
        let fh = fs.open(ino, Intent::Read).expect("open").fh;
        let want = crate::view::render::render(&spec, jpeg, 0)
            .expect("renders")
            .npy;
        assert_eq!(read_all(&fs, fh, size).expect("read"), want, "a{i:02}");
        fs.release(fh).expect("release");
        std::thread::sleep(Duration::from_millis(30));
    }
    stop.store(true, Ordering::Relaxed);
    idle.join().expect("idle thread");
    let m = cache(&fs);
    // The status is published a beat after the planner takes an open: wait until it has all 24.
    let mut status = fs.prefetcher.status();
    for _ in 0..100 {
        if status["view:v"]["files_this_epoch"] == 24 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        status = fs.prefetcher.status();
    }
    assert_eq!(status["view:v"]["predictor"], "sorted", "{status}");
    assert!(
        fs.prefetcher.metrics().decoded_ahead.get() > 0,
        "nothing decoded ahead"
    );
    assert!(
        m.decoded_hits.get() > 0,
        "no first render found its pixels decoded ahead"
    );
    assert!(m.decoded_hits.get() <= fs.prefetcher.metrics().decoded_ahead.get());
}

#[test]
fn predicted_view_files_are_rendered_ahead_byte_identical_to_their_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_photos(dir.path(), 24, |i| format!("a{i:02}.jpg"));
    // Renders are made ahead whatever the CPU does (only while no render waits for a thread).
    let spec = crate::view::ViewSpec::parse("v=decode,random_resized_crop(64),hflip,uint8(hwc)")
        .expect("spec");
    let (fs, _) = view_fs(dir.path(), &spec, DecodedCaching::Off, true);
    let (reference, _) = view_fs(dir.path(), &spec, DecodedCaching::Off, false);
    let read_view = |fs: &Fs, i: u32| read_file(fs, &format!(".prepfs/views/v/a{i:02}.jpg.npy"));
    // Two passes in walk order, a training step between files: every open's tensor is the one
    // a mount without prefetch renders for the same open, made ahead or not.
    let mut distinct = std::collections::HashSet::new();
    for pass in 0..2 {
        for i in 0..24 {
            let got = read_view(&fs, i);
            assert_eq!(got, read_view(&reference, i), "pass {pass}, a{i:02}");
            distinct.insert(got);
            std::thread::sleep(Duration::from_millis(30));
        }
    }
    assert_eq!(distinct.len(), 48, "a fresh augmentation per open");
    let m = &fs.views.iter().next().expect("view").metrics;
    let (made, used) = (m.rendered_ahead.get(), m.ahead_used.get());
    assert!(
        used > 0,
        "no open found its render made ahead ({made} made)"
    );
    assert!(used <= made);
    assert_eq!(m.errors.get(), 0);
    let none = &reference.views.iter().next().expect("view").metrics;
    assert_eq!((none.rendered_ahead.get(), none.ahead_used.get()), (0, 0));
}

/// Reads view `v`'s file of every image `a{i}.jpg` of `jpegs` once (pass `pass`, counting from
/// 0) and checks each equals `render::render` of the image's own bytes with that open's seed.
fn read_pass_as_rendered(fs: &Fs, spec: &crate::view::ViewSpec, jpegs: &[Vec<u8>], pass: u64) {
    let view = fs.views.iter().next().expect("view");
    for (i, jpeg) in jpegs.iter().enumerate() {
        let name = format!("a{i}.jpg");
        let got = read_file(fs, &format!(".prepfs/views/v/{name}.npy"));
        let seed = fs.views.seed_of(view, Path::new(&name), pass);
        let want = crate::view::render::render(spec, jpeg, seed).expect("renders");
        assert!(
            got == want.npy,
            "pass {pass}, {name}: differs from the file's own render"
        );
    }
}

#[test]
fn renders_from_a_restart_marked_copy_have_the_bytes_the_file_itself_gives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jpegs = write_photos(dir.path(), 6, |i| format!("a{i}.jpg"));
    // Crops of every size, some read DCT-scaled: parts cut from the copy at every scale.
    let spec = crate::view::ViewSpec::parse("v=decode,random_resized_crop(64),hflip,uint8(hwc)")
        .expect("spec");
    let (fs, _) = view_fs(dir.path(), &spec, DecodedCaching::Off, false);
    let view = fs.views.iter().next().expect("view");
    for pass in 0..3u64 {
        read_pass_as_rendered(&fs, &spec, &jpegs, pass);
        // The first pass makes the copies as it reads the files; later ones find them cached.
        let m = cache(&fs);
        assert_eq!(
            (m.marked_admitted.get(), m.marked_hits.get()),
            (6, 6 * pass),
            "pass {pass}"
        );
    }
    let held = ram(&fs);
    assert_eq!(held.marked_entries, 6);
    let sources: u64 = jpegs.iter().map(|j| j.len() as u64).sum();
    // The copies are about the files' size: markers and their table in, metadata out (11% more
    // for these 4:4:4 photos, some of whose widths allow only one-MCU segments).
    assert!(held.marked_bytes > sources * 9 / 10 && held.marked_bytes < sources * 5 / 4);
    assert_eq!(view.metrics.errors.get(), 0);
}

#[test]
fn a_views_copy_takes_the_place_of_its_files_own_bytes_until_the_file_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jpegs = write_photos(dir.path(), 6, |i| format!("a{i}.jpg"));
    let spec = crate::view::ViewSpec::parse("v=decode,random_resized_crop(64),hflip,uint8(hwc)")
        .expect("spec");
    let (fs, _) = view_fs(dir.path(), &spec, DecodedCaching::Off, false);
    read_pass_as_rendered(&fs, &spec, &jpegs, 0);
    // Each image's room is taken once: by its copy, which every later render starts from.
    let m = cache(&fs);
    assert_eq!((m.marked_admitted.get(), m.marked_replaced.get()), (6, 6));
    let held = ram(&fs);
    assert_eq!((held.files, held.marked_entries), (0, 6));
    let fetched = m.source_bytes.get();
    read_pass_as_rendered(&fs, &spec, &jpegs, 1);
    assert_eq!(
        m.source_bytes.get(),
        fetched,
        "renders start from the copies"
    );
    // A reader of the file itself gets its bytes, fetched again, and the file stays cached
    // beside its copy from then on.
    assert_eq!(read_file(&fs, "a2.jpg"), jpegs[2]);
    assert_eq!(m.source_bytes.get(), fetched + jpegs[2].len() as u64);
    read_pass_as_rendered(&fs, &spec, &jpegs, 2);
    assert_eq!(read_file(&fs, "a2.jpg"), jpegs[2]);
    assert_eq!(m.source_bytes.get(), fetched + jpegs[2].len() as u64);
    assert_eq!((ram(&fs).files, m.marked_replaced.get()), (1, 6));
}

#[test]
fn in_auto_mode_pixels_take_only_the_room_the_encoded_images_leave() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jpegs = write_photos(dir.path(), 4, |i| format!("a{i}.jpg"));
    // Full-scale reads (300-480 rows to 256), so renders may decode whole and offer pixels; a
    // source with nothing fetched yet makes the auto rule keep them.
    let spec = crate::view::ViewSpec::parse("v=decode,resize(256),uint8(hwc)").expect("spec");
    for (mode, first_pass) in [(DecodedCaching::Auto, 0), (DecodedCaching::On, 4)] {
        let mut o = options(1 << 30);
        o.config.views.specs = vec![spec.clone()];
        o.config.cache.decoded = mode;
        let fs = o.build(Arc::new(
            LocalSource::open(dir.path())
                .expect("source")
                .settled_at_once(),
        ));
        let m = cache(&fs);
        // First the images' encoded forms (their copies); pixels from the next pass on.
        read_pass_as_rendered(&fs, &spec, &jpegs, 0);
        assert_eq!(m.decoded_admitted.get(), first_pass, "{mode:?}");
        assert_eq!(ram(&fs).marked_entries, 4, "{mode:?}");
        read_pass_as_rendered(&fs, &spec, &jpegs, 1);
        assert_eq!(m.decoded_admitted.get(), 4, "{mode:?}");
        read_pass_as_rendered(&fs, &spec, &jpegs, 2);
        assert_eq!(m.decoded_hits.get(), 4 + first_pass, "{mode:?}");
    }
}

#[test]
fn with_view_copies_off_renders_make_no_copy_and_give_the_same_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jpegs = write_photos(dir.path(), 3, |i| format!("a{i}.jpg"));
    let spec =
        crate::view::ViewSpec::parse("v=decode,random_resized_crop(64),uint8(hwc)").expect("spec");
    let mut o = options(1 << 30);
    o.config.views.specs = vec![spec.clone()];
    o.config.views.copies = false;
    let fs = o.build(Arc::new(
        LocalSource::open(dir.path())
            .expect("source")
            .settled_at_once(),
    ));
    for pass in 0..2u64 {
        read_pass_as_rendered(&fs, &spec, &jpegs, pass);
    }
    let m = cache(&fs);
    assert_eq!((m.marked_admitted.get(), m.marked_hits.get()), (0, 0));
    assert_eq!(ram(&fs).marked_entries, 0);
}

#[test]
fn prefetch_for_a_view_plans_only_the_images_it_shows() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_photos(dir.path(), 24, |i| format!("a{i:02}.jpg"));
    // What a walk of the source tree meets after the images: files no view shows.
    for i in 0..4 {
        std::fs::write(dir.path().join(format!("b{i}.tar")), vec![7u8; 3 << 20]).expect("write");
    }
    let spec =
        crate::view::ViewSpec::parse("v=decode,random_resized_crop(64),uint8(hwc)").expect("spec");
    let (fs, _) = view_fs(dir.path(), &spec, DecodedCaching::Off, true);
    for _ in 0..2 {
        for i in 0..24 {
            read_file(&fs, &format!(".prepfs/views/v/a{i:02}.jpg.npy"));
        }
    }
    // The walk's last files were predicted; prefetch has had time to fetch what it planned.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        fs.prefetcher.metrics().issued.get() > 0,
        "prefetch planned the images"
    );
    for i in 0..4 {
        let tar = fs
            .source
            .open(Path::new(&format!("b{i}.tar")))
            .expect("open");
        assert_eq!(
            fs.fetcher.ram().held(&tar.identity()),
            0,
            "b{i}.tar was fetched"
        );
    }
}

#[test]
fn what_the_planner_keeps_per_file_seen_is_charged_to_the_budget_once() {
    let (_dir, fs, _plan) = slow_prefetching_fs(10, 0, None);
    let metrics = fs.prefetcher.metrics();
    let planner_bytes = || metrics.planner_bytes.load(Ordering::Relaxed);
    // What the planner charged once it took `opens` in all (counted as a backlog is taken,
    // before its opens are: the charge must reach `files` and then stay).
    let charged_after = |opens: u64, files: u64| {
        let want = files * crate::prefetch::SEEN_FILE_BYTES;
        for _ in 0..100 {
            if metrics.planned.get() == opens && planner_bytes() == want {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(metrics.planned.get(), opens);
        planner_bytes() / crate::prefetch::SEEN_FILE_BYTES
    };
    let before = fs.fetcher.budget().used(Use::Cache);
    assert_eq!(planner_bytes(), 0);
    let order: Vec<u8> = (0..10).collect();
    read_pass(&fs, &order[..6], |i| pattern(64 << 10, i));
    assert_eq!(charged_after(6, 6), 6);
    // Files seen again are not charged again; new ones are.
    read_pass(&fs, &order, |i| pattern(64 << 10, i));
    assert_eq!(charged_after(16, 10), 10);
    assert!(fs.fetcher.budget().used(Use::Cache) >= before + planner_bytes());
}

#[test]
fn quiet_opens_are_served_but_not_counted_as_accesses() {
    let (_dir, fs, _plan) = slow_prefetching_fs(10, 0, None);
    for i in 0..10u8 {
        let name = format!("f{i:02}");
        let fh = fs.open(ino_of(&fs, &name), Intent::Quiet).expect("open").fh;
        assert_eq!(
            read_all(&fs, fh, 1 << 20).expect("read"),
            pattern(64 << 10, i)
        );
        fs.release(fh).expect("release");
    }
    // The planner sees events in order: once it shows the one counted open, it has passed over
    // the ten quiet ones before it.
    read_pass(&fs, &[3], |i| pattern(64 << 10, i));
    for _ in 0..100 {
        if fs.prefetcher.status()["files"]["files_this_epoch"] == 1 {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{}", fs.prefetcher.status());
}

#[test]
fn a_pass_waiting_on_a_source_larger_than_the_cache_is_diagnosed_as_short_of_cache() {
    let (_dir, fs, _plan) = slow_prefetching_fs(40, 0, None);
    let order: Vec<u8> = (0..40).collect();
    for _ in 0..2 {
        read_pass(&fs, &order, |i| pattern(64 << 10, i));
    }
    // The first open of pass 3 closes pass 2.
    read_pass(&fs, &order[..1], |i| pattern(64 << 10, i));
    let status = status_at_epoch(&fs, 3);
    let d = &status["files"]["diagnosis"];
    assert_eq!(d["epoch"], 2, "{status}");
    assert_eq!(d["working_set_bytes"], 40 * (64 << 10), "{d}");
    assert_eq!(
        status["files"]["history"][1]["working_set_bytes"],
        40 * (64 << 10)
    );
    // 2.5 MiB of files, a 256 KiB budget: most of each pass comes from the slow source.
    assert_eq!(d["verdict"], "cache", "{d}");
    assert_eq!(d["ram_budget_needed_bytes"], 40 * (64 << 10), "{d}");
    assert!(
        d["fetch_stall_share"].as_f64().is_some_and(|s| s > 0.05),
        "{d}"
    );
}

/// Telemetry's working-set fits read a set's working set: the larger of its last complete
/// pass and the current one, so a smaller working set shows one pass after it began; and
/// whether it is a whole pass's yet.
#[test]
fn a_sets_working_set_is_the_larger_of_its_last_pass_and_this_one() {
    let (_dir, fs, _plan) = slow_prefetching_fs(40, 0, None);
    let working = fs.prefetcher.working_sets();
    let wait_for = |files: u64, whole: bool| {
        let want = crate::prefetch::WorkingSetFigures {
            files,
            bytes: Some(files * (64 << 10)),
            whole,
        };
        for _ in 0..200 {
            if working()[0] == want {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("working set {:?}, not {want:?}", working()[0]);
    };
    let order: Vec<u8> = (0..40).collect();
    read_pass(&fs, &order[..25], |i| pattern(64 << 10, i));
    wait_for(25, false);
    read_pass(&fs, &order[25..], |i| pattern(64 << 10, i));
    wait_for(40, false);
    // A pass of 10: the one before it still decides, until it ends.
    read_pass(&fs, &order[..10], |i| pattern(64 << 10, i));
    status_at_epoch(&fs, 2);
    wait_for(40, true);
    read_pass(&fs, &order[..3], |i| pattern(64 << 10, i));
    status_at_epoch(&fs, 3);
    wait_for(10, true);
    assert_eq!(working().len(), 1, "one set: no views");
}

#[test]
fn stats_say_whether_views_can_use_a_gpu_and_renders_are_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jpeg = crate::synthetic::photo(2).expect("jpeg");
    std::fs::write(dir.path().join("a.jpg"), &jpeg).expect("write");
    let spec = crate::view::ViewSpec::parse("v=decode,center_crop(32),uint8(hwc)").expect("spec");
    let mut setup = options(1 << 20);
    setup.config.views.specs = vec![spec.clone()];
    setup.config.views.gpu = crate::view::gpu::GpuOptions::default();
    let fs = setup.build(Arc::new(
        LocalSource::open(dir.path())
            .expect("source")
            .settled_at_once(),
    ));
    let control = fs
        .lookup(inode::ROOT, OsStr::new(".prepfs"))
        .expect("control");
    let stats = fs
        .lookup(control.ino, OsStr::new("stats.json"))
        .expect("stats");
    let opened = fs.open(stats.ino, Intent::Read).expect("open stats");
    let json: serde_json::Value =
        serde_json::from_slice(&read_all(&fs, opened.fh, 1 << 20).expect("read")).expect("json");
    let gpu = &json["gpu"];
    assert_eq!(gpu["mode"], "auto");
    assert_eq!(gpu["built_with_cuda"], cfg!(feature = "cuda"));
    let available = gpu["available"].as_bool().expect("available is a bool");
    if !available {
        assert!(
            gpu["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{gpu}"
        );
    }
    assert!(gpu["memory_used_bytes"].as_u64() <= gpu["memory_cap_bytes"].as_u64());
    let views = fs.lookup(control.ino, OsStr::new("views")).expect("views");
    let root = fs.lookup(views.ino, OsStr::new("v")).expect("view root");
    let file = fs
        .lookup(root.ino, OsStr::new("a.jpg.npy"))
        .expect("view file");
    let fh = fs.open(file.ino, Intent::Read).expect("open").fh;
    let served = read_all(&fs, fh, 1 << 20).expect("read");
    let cpu = crate::view::render::render(&spec, &jpeg, 0)
        .expect("renders")
        .npy;
    assert_eq!(served.len(), cpu.len());
    if !available {
        assert_eq!(
            served, cpu,
            "no GPU: the CPU's bytes (center crops draw nothing)"
        );
    }
}

/// A mount with every piece on (a disk tier, prefetch, a view, a stats file opened) shows each
/// figure at one path that is never also a branch, under one Prometheus name, with a row in
/// docs/STATS.md that names both: the table cannot fall behind what the modules define.
#[test]
fn every_figure_of_a_full_mount_has_one_path_one_name_and_a_documented_row() {
    use std::collections::{BTreeMap, BTreeSet};
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("a.jpg"),
        crate::synthetic::photo(0).expect("jpeg"),
    )
    .expect("write");
    let cache_dir = tempfile::tempdir().expect("cache dir");
    let mut setup = options(64 << 20);
    setup.config.views.specs =
        vec![crate::view::ViewSpec::parse("v=decode,resize(40),uint8(hwc)").expect("spec")];
    setup.config.prefetch.enabled = true;
    let disk = crate::cache::DiskSetup {
        dir: crate::cache::CacheDir::open(&cache_dir.path().join("c")).expect("cache dir opens"),
        options: crate::cache::DiskOptions {
            budget: 1 << 30,
            min_free: 0.0,
        },
        validate: Box::new(|_| None),
    };
    let source: Arc<dyn Source> = Arc::new(
        LocalSource::open(dir.path())
            .expect("source")
            .settled_at_once(),
    );
    let fs = build(source, &setup.config, setup.plan, Some(disk))
        .expect("the daemon starts")
        .fs;
    let ino = ino_of(&fs, ".prepfs/views/v/a.jpg.npy");
    let opened = fs.open(ino, Intent::Read).expect("open view");
    read_all(&fs, opened.fh, 1 << 20).expect("read view");
    fs.release(opened.fh).expect("release");

    let samples = fs.board.samples(fs.figures());
    let mut paths: BTreeSet<String> = BTreeSet::new();
    for s in samples.iter() {
        assert!(paths.insert(s.path.clone()), "{} is shown twice", s.path);
    }
    for (path, _) in fs.board.documents() {
        assert!(paths.insert(path.clone()), "{path} is shown twice");
    }
    for p in &paths {
        let branch = format!("{p}.");
        let under: Vec<&String> = paths.iter().filter(|q| q.starts_with(&branch)).collect();
        assert!(under.is_empty(), "{p} is a value and a branch of {under:?}");
    }
    for expected in [
        "disk.writes",
        "views.v.renders",
        "prefetch.issued",
        "memory.budget_bytes",
    ] {
        assert!(paths.contains(expected), "a full mount shows {expected}");
    }

    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/STATS.md"))
        .expect("docs/STATS.md");
    let rows: Vec<&str> = docs.lines().filter(|l| l.starts_with("| `")).collect();
    let mut names: BTreeMap<&str, &str> = BTreeMap::new();
    let mut missing = BTreeSet::new();
    for s in samples.iter() {
        let m = s.metric;
        let other = names.insert(m.prom, m.path);
        assert!(
            other.is_none_or(|p| p == m.path),
            "{} names both {} and {other:?}",
            m.prom,
            m.path
        );
        // A labelled figure's row writes its `*` as `<name>`: the row names the part after it.
        let path = m.path.rsplit_once('*').map_or(m.path, |(_, tail)| tail);
        let named = |row: &&str| {
            (row.contains(&format!("`{}`", m.prom)) || row.contains(&format!("`{}{{", m.prom)))
                && row.contains(path)
        };
        if !rows.iter().any(named) {
            missing.insert(format!("`{}` `{}`", m.path, m.prom));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/STATS.md has no row naming these paths and names: {missing:#?}"
    );
}

#[test]
fn a_cached_file_of_one_block_opens_by_passthrough_only_when_passthrough_is_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("small"), pattern(100_000, 3)).expect("write");
    for passthrough in [true, false] {
        let mut setup = options(1 << 20);
        setup.config.fuse.passthrough = passthrough;
        let fs = setup.build(Arc::new(
            LocalSource::open(dir.path())
                .expect("source opens")
                .settled_at_once(),
        ));
        let ino = ino_of(&fs, "small");
        let first = fs.open(ino, Intent::Read).expect("open");
        assert!(matches!(first.serve, Serve::Daemon), "not cached yet");
        assert_eq!(
            read_all(&fs, first.fh, 100_000).expect("read"),
            pattern(100_000, 3)
        );
        fs.release(first.fh).expect("release");
        let second = fs.open(ino, Intent::Read).expect("open");
        assert_eq!(
            matches!(second.serve, Serve::Passthrough(_)),
            passthrough,
            "passthrough {passthrough}"
        );
        // Bytes served by the daemon are the same either way.
        assert_eq!(
            read_all(&fs, second.fh, 100_000).expect("read"),
            pattern(100_000, 3)
        );
        fs.release(second.fh).expect("release");
        // In a memfd (whole pages) only where passthrough can use it; on the heap otherwise.
        let want = if passthrough { 102_400 } else { 100_000 };
        assert_eq!(ram(&fs).bytes, want, "passthrough {passthrough}");
    }
}

/// Past the process's memfd allowance a multi-block file stays on the heap, served by the
/// daemon, with the same bytes: the cache never runs the daemon out of descriptors or mappings.
#[test]
fn multi_block_files_past_the_memfd_allowance_stay_on_the_heap_and_read_the_same() {
    let dir = tempfile::tempdir().expect("tempdir");
    let len = 2 * BLOCK_SIZE as usize + 1000;
    for (i, name) in ["a", "b"].iter().enumerate() {
        std::fs::write(dir.path().join(name), pattern(len, i as u8)).expect("write");
    }
    let mut setup = options(64 << 20);
    setup.config.fuse.passthrough = true;
    let fs = setup.build(Arc::new(
        LocalSource::open(dir.path())
            .expect("source opens")
            .settled_at_once(),
    ));
    fs.fetcher.ram().limit_memfds_for_test(1);
    for round in 0..2 {
        for (i, name) in ["a", "b"].iter().enumerate() {
            let opened = fs.open(ino_of(&fs, name), Intent::Read).expect("open");
            let passthrough = matches!(opened.serve, Serve::Passthrough(_));
            assert_eq!(
                passthrough,
                round == 1 && i == 0,
                "{name}, round {round}: only the first file got a memfd, and only once complete"
            );
            if !passthrough {
                assert_eq!(
                    read_all(&fs, opened.fh, len as u64).expect("read"),
                    pattern(len, i as u8),
                    "{name}, round {round}"
                );
            }
            fs.release(opened.fh).expect("release");
        }
    }
}
