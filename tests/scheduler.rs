//! The scheduler through real mounts: knobs changed at random every decision never change a
//! byte; a broken policy file falls back to the heuristics with a warning; telemetry and the
//! scheduler's figures appear in stats.json; the guard lets the heuristics act first and hands
//! the knobs to the policy once it has measured them; a build without the `train` feature
//! refuses training with one line.

mod common;

use std::fs;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{TestMount, pattern};

const VAL: &str = "val=decode,resize(80),center_crop(64),uint8(hwc)";

/// Files of several sizes (compressible and not) and a few images.
fn dataset(t: &TestMount) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for i in 0..12u64 {
        let len = [4 << 10, 300 << 10, (1 << 20) + 17, 3 << 20][i as usize % 4];
        let bytes = if i % 2 == 0 {
            pattern(len, i)
        } else {
            // Compressible: long runs, so every codec changes the stored size.
            (0..len)
                .map(|j| ((j / 4096) as u8).wrapping_add(i as u8))
                .collect()
        };
        let name = format!("data/f{i:02}.bin");
        files.push((name, bytes));
    }
    fs::create_dir_all(t.s("data")).expect("mkdir");
    fs::create_dir_all(t.s("img")).expect("mkdir");
    for (name, bytes) in &files {
        fs::write(t.s(name), bytes).expect("write");
    }
    for j in 0..6u64 {
        let jpeg = prepfs::synthetic::photo(j).expect("jpeg");
        fs::write(t.s(&format!("img/p{j}.jpg")), jpeg).expect("write");
    }
    files
}

/// Waits until `stats` satisfies `ok` (or 15 s), returning the last stats.
fn wait_for(t: &TestMount, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    wait_for_within(t, Duration::from_secs(15), ok)
}

/// Waits until `stats` satisfies `ok` (or `limit`), returning the last stats.
fn wait_for_within(
    t: &TestMount,
    limit: Duration,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let stats = t.stats();
        if ok(&stats) || Instant::now() > deadline {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn random_decisions_every_interval_never_change_a_byte() {
    let mut t = TestMount::new();
    let files = dataset(&t);
    t.mount(&[
        "--scheduler",
        "random",
        "--view",
        VAL,
        "--cache-mem",
        // Tight: admission, packing and decoded caching all compete for it (18 MB of data).
        // Once the cache holds its share, a render gets the work and staging shares only: 4.5
        // MiB here, room for one of these photos' renders (2.6 MB with the decoder's own
        // buffers, charged since the second audit), where 6M left 2.25 MiB and renders failed.
        "12M",
    ]);
    let views: Vec<String> = (0..6)
        .map(|j| format!(".prepfs/views/val/img/p{j}.jpg.npy"))
        .collect();
    let first: Vec<Vec<u8>> = views
        .iter()
        .map(|v| fs::read(t.m(v)).expect("render"))
        .collect();
    let started = Instant::now();
    let mut epochs = 0;
    // At least 20 decisions (4 s at 200 ms), each of which may change every knob.
    while started.elapsed() < Duration::from_secs(4) || epochs < 3 {
        for (name, bytes) in &files {
            let got = fs::read(t.m(name)).expect("read through the mount");
            assert!(got == *bytes, "{name}: bytes differ in epoch {epochs}");
        }
        for (v, want) in views.iter().zip(&first) {
            assert!(fs::read(t.m(v)).expect("render") == *want, "{v} differs");
        }
        epochs += 1;
    }
    let stats = t.stats();
    let s = &stats["scheduler"];
    assert_eq!(s["mode"], "random", "{s}");
    assert_eq!(s["reason"], "random", "{s}");
    assert!(s["decisions"].as_u64().unwrap() >= 10, "{s}");
    assert_eq!(s["fallbacks"]["total"], 0, "{s}");
    // Random choices visit several options of every knob the mount lets it turn.
    for head in ["codec", "prefetch_depth", "workers", "decoded_cache"] {
        let used = s["histogram"][head]
            .as_object()
            .unwrap()
            .values()
            .filter(|c| c.as_u64().unwrap() > 0)
            .count();
        assert!(used >= 2, "{head} stuck on one option: {s}");
    }
    // Without a GPU backend the GPU placements are masked out.
    assert_eq!(s["histogram"]["decode"]["gpu"], 0, "{s}");
    assert_eq!(stats["cache"]["codec"]["reason"], "scheduler", "{stats}");
    assert_eq!(stats["views"]["val"]["errors"], 0);
    assert_eq!(stats["cache"]["integrity_errors"], 0);
    let status = t.unmount().expect("daemon status");
    assert!(status.success(), "clean exit: {status}");
}

#[test]
fn a_broken_policy_file_warns_and_the_heuristics_decide() {
    let mut t = TestMount::new();
    let files = dataset(&t);
    let policy = t.s("../policy.json");
    fs::write(
        &policy,
        b"{\"format\": \"prepfs-policy\", \"schema_version\": 1}",
    )
    .expect("write");
    let log = t.s("../mount.log");
    t.mount_logged(
        &[
            "--scheduler",
            "policy",
            "--policy",
            policy.to_str().unwrap(),
        ],
        "warn,fuser=error",
        &log,
    );
    for (name, bytes) in &files {
        assert!(fs::read(t.m(name)).expect("read") == *bytes, "{name}");
    }
    let stats = wait_for(&t, |s| {
        s["scheduler"]["fallbacks"]["no_policy"].as_u64() > Some(0)
    });
    let s = &stats["scheduler"];
    assert_eq!(s["mode"], "policy", "{s}");
    assert_eq!(s["policy"], serde_json::Value::Null, "{s}");
    assert_eq!(s["reason"], "fallback_no_policy", "{s}");
    assert_eq!(s["guard"], serde_json::Value::Null, "nothing to guard: {s}");
    assert_eq!(s["fallbacks"]["total"], s["fallbacks"]["no_policy"], "{s}");
    // The heuristics hold: the codec is the cache's own choice.
    assert_ne!(stats["cache"]["codec"]["reason"], "scheduler", "{stats}");
    assert!(t.unmount().expect("status").success());
    let log = fs::read_to_string(&log).expect("log");
    assert!(
        log.lines()
            .any(|l| l.contains("policy unusable") && l.contains("policy.json")),
        "one warning naming the file: {log}"
    );
}

#[test]
fn telemetry_and_the_shipped_policy_show_in_stats() {
    let mut t = TestMount::new();
    let files = dataset(&t);
    t.mount(&["--scheduler", "policy", "--policy-guard", "off"]);
    for (name, _) in &files {
        fs::read(t.m(name)).expect("read");
    }
    let stats = wait_for(&t, |s| {
        s["scheduler"]["decisions"].as_u64() >= Some(3)
            && s["telemetry"]["history"]
                .as_array()
                .is_some_and(|h| !h.is_empty())
    });
    let latest = &stats["telemetry"]["latest"];
    for key in [
        "cpu_busy",
        "cpu_prepfs",
        "memory_available",
        "request_rate",
        "latency_p50_s",
        "latency_p99_s",
        "stall_share",
        "cache_fill",
        "hit_rate",
    ] {
        let v = latest[key].as_f64().unwrap_or(-1.0);
        assert!(v >= 0.0, "{key} = {v}: {latest}");
    }
    assert!(latest["cache_fill"].as_f64().unwrap() > 0.0, "{latest}");
    assert!(
        latest.get("gpu").is_some(),
        "the GPU field is always present (null here)"
    );
    let s = &stats["scheduler"];
    assert_eq!(s["mode"], "policy", "{s}");
    assert_eq!(s["policy"]["source"], "shipped", "{s}");
    assert_eq!(s["reason"], "policy", "{s}");
    assert_eq!(s["guard"], serde_json::Value::Null, "{s}");
    assert_eq!(s["fallbacks"]["total"], 0, "{s}");
    assert!(
        s["decision_latency_us"]["p99"].as_f64().unwrap() < 20_000.0,
        "{s}"
    );
    assert!(s["action"]["codec"].is_string(), "{s}");
}

/// Telemetry's working-set fits: the RAM slice over the working set's bytes, the dataset files'
/// own and each view's files at its images' mean sizes, encoded and as decoded pixels.
#[test]
fn telemetry_says_how_many_times_the_working_set_fits_the_cache() {
    let mut t = TestMount::new();
    let files = dataset(&t);
    t.mount(&["--view", VAL]);
    let idle = wait_for(&t, |s| !s["telemetry"]["latest"].is_null());
    let latest = &idle["telemetry"]["latest"];
    assert_eq!(latest["working_set_fit"], 0.0, "nothing read: {latest}");
    assert_eq!(latest["pixels_fit"], 0.0, "nothing rendered: {latest}");
    for (name, bytes) in &files {
        assert_eq!(&fs::read(t.m(name)).expect("read"), bytes);
    }
    for j in 0..6 {
        fs::read(t.m(&format!(".prepfs/views/val/img/p{j}.jpg.npy"))).expect("read view");
    }
    let expected = |s: &serde_json::Value| {
        let budget = s["cache"]["budget_bytes"].as_f64().unwrap_or(0.0);
        let view = &s["views"]["val"];
        let renders = view["renders"].as_f64().unwrap_or(0.0);
        let per = |key: &str| view[key].as_f64().unwrap_or(0.0) / renders;
        let dataset: usize = files.iter().map(|(_, b)| b.len()).sum();
        let encoded = dataset as f64 + 6.0 * per("image_bytes");
        (budget / encoded, budget / (6.0 * per("pixel_bytes")))
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 0.01 * b;
    let stats = wait_for(&t, |s| {
        let (w, p) = expected(s);
        let latest = &s["telemetry"]["latest"];
        close(latest["working_set_fit"].as_f64().unwrap_or(0.0), w)
            && close(latest["pixels_fit"].as_f64().unwrap_or(0.0), p)
    });
    let (w, p) = expected(&stats);
    let latest = &stats["telemetry"]["latest"];
    assert_eq!(latest["working_set_whole"], false, "a first pass: {latest}");
    assert!(
        close(latest["working_set_fit"].as_f64().unwrap_or(0.0), w),
        "working_set_fit, want {w}: {latest}"
    );
    assert!(
        close(latest["pixels_fit"].as_f64().unwrap_or(0.0), p),
        "pixels_fit, want {p}: {latest}"
    );
    // A photo decoded takes several times its JPEG.
    let view = &stats["views"]["val"];
    let (image, pixels) = (view["image_bytes"].as_f64(), view["pixel_bytes"].as_f64());
    assert!(
        image
            .zip(pixels)
            .is_some_and(|(i, p)| i > 0.0 && p > 3.0 * i),
        "{view}"
    );
    // A second pass over the files and over the view ends both first passes (the planner
    // tells a new pass from a re-read after a few re-opens): the fits are a whole pass's from
    // then on.
    for (name, _) in &files {
        fs::read(t.m(name)).expect("read");
    }
    for j in 0..6 {
        fs::read(t.m(&format!(".prepfs/views/val/img/p{j}.jpg.npy"))).expect("read view");
    }
    let whole = wait_for(&t, |s| {
        s["telemetry"]["latest"]["working_set_whole"] == true
    });
    let latest = &whole["telemetry"]["latest"];
    assert_eq!(latest["working_set_whole"], true, "{latest}");
    let (w, _) = expected(&whole);
    assert!(
        close(latest["working_set_fit"].as_f64().unwrap_or(0.0), w),
        "a second pass of the same files, want {w}: {latest}"
    );
}

/// The guard (on by default): the heuristics act first, over busy intervals only, and the
/// policy gets the knobs once their reward is measured.
#[test]
fn the_guard_measures_the_heuristics_first_then_hands_the_policy_the_knobs() {
    let mut t = TestMount::new();
    let files = dataset(&t);
    t.mount(&["--scheduler", "policy"]);
    // Before reads: the heuristics keep the knobs (this test's own stats reads are opens, so
    // they count as busy intervals here; idle ones are the guard's unit tests').
    let idle = wait_for(&t, |s| s["scheduler"]["decisions"].as_u64() >= Some(3));
    let g = &idle["scheduler"]["guard"];
    assert_eq!(g["acting"], "heuristic", "{g}");
    assert_eq!(idle["scheduler"]["reason"], "guard_heuristic", "{idle}");
    assert_ne!(idle["cache"]["codec"]["reason"], "scheduler", "{idle}");
    // Busy: readers loop over the files until the policy has acted in a busy interval.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, paths) = (
            stop.clone(),
            files.iter().map(|(n, _)| t.m(n)).collect::<Vec<_>>(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for p in &paths {
                    fs::read(p).expect("read");
                }
            }
        })
    };
    let busy = wait_for_within(&t, Duration::from_secs(60), |s| {
        s["scheduler"]["guard"]["policy_reward"].is_f64()
    });
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader");
    let g = &busy["scheduler"]["guard"];
    assert!(g["heuristic_reward"].is_f64(), "{g}");
    assert!(g["policy_reward"].is_f64(), "the policy never acted: {g}");
    for (name, bytes) in &files {
        assert_eq!(&fs::read(t.m(name)).expect("read"), bytes, "{name}");
    }
}

/// A build without the `train` feature (the default) still checks and runs trained policies
/// (the mounts above), and refuses training with one line, before anything is mounted.
#[cfg(not(feature = "train"))]
#[test]
fn a_build_without_train_refuses_training_with_one_line_and_still_shows_the_policy() {
    const WITHOUT: &str =
        "this prepfs was built without the `train` feature: cargo build --features train";
    let t = TestMount::new();
    let out_file = t.dir.path().join("trained.json");
    let refused: [Vec<std::ffi::OsString>; 3] = [
        vec![
            "policy".into(),
            "train".into(),
            "--out".into(),
            out_file.clone().into(),
        ],
        vec![
            "policy".into(),
            "calibrate".into(),
            "--out".into(),
            out_file.clone().into(),
        ],
        vec![
            "mount".into(),
            t.src.clone().into(),
            t.mnt.clone().into(),
            "--foreground".into(),
            "--scheduler".into(),
            "policy".into(),
            "--learn".into(),
        ],
    ];
    for args in refused {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let out = common::run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("prepfs: ") && err.contains(WITHOUT),
            "{err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(!out_file.exists(), "nothing written");
    assert!(!common::is_mounted(&t.mnt), "nothing mounted");
    let shown = common::run(&["policy".as_ref(), "show".as_ref()]);
    assert_eq!(shown.status.code(), Some(0));
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.starts_with("shipped policy: valid"), "{text}");
}
