//! The real clients over real mounts: PyTorch (torchvision DatasetFolder + DataLoader with two
//! workers) and tf.data reading tensor views, and the views' pixels against torchvision's own
//! transforms on the same JPEGs. The Python environment is the one `python/ensure-env` prepared
//! before the tests (`common::python`).

mod common;

use std::process::Command;

use common::{TestMount, described, python, run_checked};

const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");

/// `classes` folders `class_N` of `per_class` synthetic photos each, in the source.
fn class_folders(t: &TestMount, classes: usize, per_class: usize) {
    for c in 0..classes {
        let dir = t.s(&format!("class_{c}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for i in 0..per_class {
            let jpeg = prepfs::synthetic::photo((c * 100 + i) as u64).expect("jpeg");
            std::fs::write(dir.join(format!("{i}.jpg")), jpeg).expect("write");
        }
    }
}

#[test]
fn pytorch_dataloader_reads_a_view_epoch_with_shapes_dtypes_and_labels() {
    let mut t = TestMount::new();
    let (classes, per_class) = (3, 5);
    class_folders(&t, classes, per_class);
    t.mount(&[
        "--view",
        "train=decode,random_resized_crop(96),hflip,normalize(imagenet)",
    ]);
    let (n, c) = ((classes * per_class).to_string(), classes.to_string());
    let stdout = run_client(
        "torch_view.py",
        &[
            t.m(".prepfs/views/train").as_os_str(),
            n.as_ref(),
            c.as_ref(),
            "96".as_ref(),
        ],
    );
    assert!(stdout.contains("\"images\": 15"), "{stdout}");
    assert_eq!(t.stats()["views"]["train"]["errors"], 0);
}

#[test]
fn a_pytorch_sampler_publishing_its_order_is_followed_by_prefetch() {
    let mut t = TestMount::new();
    class_folders(&t, 4, 10);
    let order_dir = tempfile::tempdir().expect("tempdir");
    let order_file = order_dir.path().join("order");
    t.mount(&[
        "--order-file",
        order_file.to_str().expect("utf-8 path"),
        "--cache-mem",
        "64K",
    ]);
    let stdout = run_client(
        "torch_order_file.py",
        &[t.m("").as_os_str(), order_file.as_os_str(), "4".as_ref()],
    );
    assert!(stdout.contains("\"images\": 160"), "{stdout}");
    let files = &t.stats()["epochs"]["files"];
    let hint = &files["predictors"]["hint"];
    assert!(files["epoch"].as_u64() >= Some(4), "{files}");
    assert_eq!(files["predictor"], "hint", "{files}");
    assert!(hint["hits"].as_u64() > Some(80), "{files}");
    assert!(hint["precision"].as_f64() > Some(0.8), "{files}");
}

/// Runs a client script with the venv's python; panics with how it ended (status or signal,
/// command line, stdout, stderr) unless it exits 0 with output.
fn run_client(script: &str, args: &[&std::ffi::OsStr]) -> String {
    let mut command = Command::new(python());
    command.arg(format!("{CLIENTS}/{script}")).args(args);
    let out = run_checked(&mut command);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !stdout.trim().is_empty(),
        "{script} printed nothing: {}",
        described(&command, &out)
    );
    stdout
}

/// A synthetic photo cut to `width` x `height` from its top-left corner and re-encoded.
fn photo_cut(seed: u64, width: u32, height: u32) -> Vec<u8> {
    let jpeg = prepfs::synthetic::photo(seed).expect("jpeg");
    let img = image::load_from_memory(&jpeg).expect("decode").to_rgb8();
    assert!(
        img.width() >= width && img.height() >= height,
        "photo {seed} too small"
    );
    let cut = image::imageops::crop_imm(&img, 0, 0, width, height).to_image();
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
        .encode_image(&cut)
        .expect("encode");
    out
}

#[test]
fn tf_data_reads_views_by_np_load_and_decode_raw_alike() {
    let mut t = TestMount::new();
    let (classes, per_class) = (3, 5);
    class_folders(&t, classes, per_class);
    t.mount(&[
        "--view",
        "train=decode,random_resized_crop(96),hflip,normalize(imagenet)",
        "--view",
        "val=decode,resize(80),center_crop(64),normalize(imagenet)",
    ]);
    let n = (classes * per_class).to_string();
    let stdout = run_client(
        "tf_view.py",
        &[
            t.m(".prepfs/views/train").as_os_str(),
            t.m(".prepfs/views/val").as_os_str(),
            n.as_ref(),
            "96".as_ref(),
            "64".as_ref(),
        ],
    );
    println!("{stdout}");
    assert!(stdout.contains("\"images\": 15"), "{stdout}");
    assert!(stdout.contains("\"identical\": 15"), "{stdout}");
    assert_eq!(t.stats()["views"]["train"]["errors"], 0);
    assert_eq!(t.stats()["views"]["val"]["errors"], 0);
}

/// Photo `seed` as a 4:2:0 JPEG at quality 90, as cameras and most datasets store photos (the
/// image crate's encoder writes 4:4:4 only), encoded by libjpeg-turbo.
fn photo_420(seed: u64) -> Vec<u8> {
    let jpeg = prepfs::synthetic::photo(seed).expect("jpeg");
    common::jpeg::encode_420(&image::load_from_memory(&jpeg).expect("decode").to_rgb8())
}

#[test]
fn views_match_torchvision_on_the_same_jpegs_within_decoder_differences() {
    let mut t = TestMount::new();
    // Two photos as generated (400-640 x 300-480, 4:4:4), one as 4:2:0, an odd-sized one
    // smaller than resize(256) (upsampled), an odd-sized portrait one, and one smaller than the
    // 224 crop (padding).
    let photos = [
        ("a.jpg", prepfs::synthetic::photo(11).expect("jpeg")),
        ("b.jpg", prepfs::synthetic::photo(12).expect("jpeg")),
        ("c420.jpg", photo_420(16)),
        ("odd.jpg", photo_cut(13, 333, 251)),
        ("portrait.jpg", photo_cut(14, 271, 299)),
        ("small.jpg", photo_cut(15, 197, 149)),
    ];
    for (name, jpeg) in &photos {
        std::fs::write(t.s(name), jpeg).expect("write");
    }
    let log = t.dir.path().join("prepfs.log");
    t.mount_logged(
        &[
            "--view",
            "raw=decode,uint8(hwc)",
            "--view",
            "val=decode,resize(256),center_crop(224),normalize(imagenet)",
            "--view",
            "train=decode,random_resized_crop(224),hflip,normalize(imagenet)",
            "--view",
            "u8=decode,resize(256),center_crop(224),uint8",
            "--view",
            "pad=decode,center_crop(224),uint8",
            "--view",
            "thumb=decode,random_resized_crop(64),hflip,normalize(imagenet)",
        ],
        "warn,fuser=error,prepfs=debug",
        &log,
    );
    let stdout = run_client(
        "torchvision_reference.py",
        &[
            t.src.as_os_str(),
            t.m(".prepfs/views").as_os_str(),
            log.as_os_str(),
        ],
    );
    println!("{stdout}");
    assert!(stdout.contains("\"thumb.pil\""), "{stdout}");
    for view in ["raw", "val", "train", "u8", "pad", "thumb"] {
        assert_eq!(t.stats()["views"][view]["errors"], 0, "{view}");
    }
}

#[test]
fn a_memmapped_shard_never_makes_other_processes_opens_of_it_fail() {
    let mut t = TestMount::new();
    // Incompressible ids (a compressible shard is never served by passthrough).
    let make = "import numpy as np, sys; \
                np.save(sys.argv[1], np.random.default_rng(7).integers(0, 2**31 - 1, 3 << 20, dtype=np.int32))";
    run_checked(
        Command::new(python())
            .args(["-c", make])
            .arg(t.s("shard.npy")),
    );
    t.mount(&[]);
    let stdout = run_client(
        "memmap_shards.py",
        &[
            t.m("shard.npy").as_os_str(),
            t.s("shard.npy").as_os_str(),
            "4".as_ref(),
        ],
    );
    assert!(stdout.contains("\"readers\": 4"), "{stdout}");
    let stats = t.stats();
    // As root the shard, cached whole while the first mapping lived, would have been offered to
    // the kernel by passthrough: the opens beside that mapping were served by the daemon.
    assert!(
        stats["cache"]["passthrough_declined_opens"].as_u64() >= Some(4),
        "the opens beside the mapping met the case: {}",
        stats["cache"]
    );
}

/// Runs `script` under bash with `$P` the Python, `$S` tests/clients/torch_jobs.py, `$V` the
/// view `train` of `t` and `$O` a fresh directory where job `j` prints to `$O/j`, calling `tick`
/// every 100 ms while it runs; then each job's epochs (`torch_jobs.py`'s JSON), jobs `1..=jobs`.
fn run_jobs(
    t: &TestMount,
    jobs: usize,
    script: &str,
    mut tick: impl FnMut(),
) -> Vec<serde_json::Value> {
    let out = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(format!("set -e\n{script}"))
        .env("P", python())
        .env("S", format!("{CLIENTS}/torch_jobs.py"))
        .env("V", t.m(".prepfs/views/train"))
        .env("O", out.path());
    let mut child = command.spawn().expect("bash");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(900);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the jobs did not finish within 900 s: {script}");
        }
        tick();
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(status.success(), "the jobs failed ({status}): {script}");
    (1..=jobs)
        .map(|j| {
            let text = std::fs::read_to_string(out.path().join(j.to_string())).expect("output");
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("job {j}: {e}: {text}"))
        })
        .collect()
}

/// Every job got the same tensor of every one of `files` files in each of `epochs` epochs, and
/// each file a fresh tensor in the second epoch.
fn assert_same_tensors_each_epoch(jobs: &[serde_json::Value], epochs: usize, files: usize) {
    for epoch in 0..epochs {
        let seen = jobs[0][epoch].as_object().expect("an epoch's files");
        assert_eq!(seen.len(), files);
        for (j, job) in jobs.iter().enumerate().skip(1) {
            assert_eq!(
                &job[epoch],
                &jobs[0][epoch],
                "epoch {epoch}: job {} got other tensors than job 1",
                j + 1
            );
        }
    }
    for (name, tensor) in jobs[0][0].as_object().expect("epoch 0") {
        assert_ne!(
            &jobs[0][1][name], tensor,
            "{name}: a fresh tensor in epoch 1"
        );
    }
}

/// Three training jobs started at once over one view (two from one shell script with `&`, sharing
/// its process group and session, one with `setsid`), each a DataLoader with 2 worker processes
/// shuffling in its own order: in each epoch, every file gives every job the same tensor, and
/// each job a fresh one in each epoch (docs/SEMANTICS.md, "Jobs").
#[test]
fn pytorch_jobs_reading_one_view_at_once_get_the_same_tensors_in_the_same_epoch() {
    let mut t = TestMount::new();
    class_folders(&t, 2, 6);
    t.mount(&["--view", "train=decode,random_resized_crop(64),hflip"]);
    let jobs = run_jobs(
        &t,
        3,
        "\"$P\" \"$S\" \"$V\" 2 1 > \"$O/1\" & A=$!\n\
         \"$P\" \"$S\" \"$V\" 2 2 > \"$O/2\" & B=$!\n\
         setsid -w \"$P\" \"$S\" \"$V\" 2 3 > \"$O/3\" & C=$!\n\
         wait $A && wait $B && wait $C",
        || {},
    );
    assert_same_tensors_each_epoch(&jobs, 2, 12);
    let view = &t.stats()["views"]["train"];
    assert_eq!(view["jobs_seen"], 3, "{view}");
    assert_eq!(view["errors"], 0, "{view}");
}

/// Drift: job 2 stops after its first epoch until job 1 has read two. Job 1 never waits for it
/// (were it held back, job 2 would wait forever and fail), and job 2's second epoch, read an
/// epoch behind job 1, gives it the tensors job 1 got in that epoch: sharing is an optimisation,
/// never a condition of correctness.
#[test]
fn a_job_an_epoch_behind_another_gets_the_same_tensors_and_never_holds_it_back() {
    let mut t = TestMount::new();
    class_folders(&t, 2, 6);
    t.mount(&["--view", "train=decode,random_resized_crop(64),hflip"]);
    let jobs = run_jobs(
        &t,
        2,
        "\"$P\" \"$S\" \"$V\" 2 1 --done \"$O/fast\" > \"$O/1\" & A=$!\n\
         \"$P\" \"$S\" \"$V\" 2 2 --wait-for \"$O/fast.1\" > \"$O/2\" & B=$!\n\
         wait $A && wait $B",
        || {},
    );
    assert_same_tensors_each_epoch(&jobs, 2, 12);
    let view = &t.stats()["views"]["train"];
    assert_eq!(view["jobs_seen"], 2, "{view}");
    assert_eq!(view["errors"], 0, "{view}");
}

/// Four jobs reading one view at different speeds, the daemon in a memory cgroup with room for
/// the 64 MiB headroom prepfs keeps beyond `--cache-mem`: the renders held between the jobs stay inside the memory
/// budget (sampled every 100 ms), no render is refused memory, nothing is OOM-killed, and every
/// job gets the same tensors in the same epoch.
#[test]
fn four_jobs_at_different_speeds_keep_the_daemon_inside_its_memory_budget() {
    let mut t = TestMount::new();
    class_folders(&t, 2, 8);
    let group = common::MemoryCgroup::new((48 + 96) << 20);
    // float32 224x224: 602 KB a render, held for the slower jobs.
    t.mount_confined(
        &[
            "--view",
            "train=decode,random_resized_crop(224),hflip",
            "--cache-mem",
            "48M",
        ],
        &group,
    );
    let budget = t.stats()["memory"]["budget_bytes"]
        .as_u64()
        .expect("budget");
    let (mut most_used, mut most_held) = (0, 0);
    let jobs = run_jobs(
        &t,
        4,
        "for j in 1 2 3 4; do\n\
           \"$P\" \"$S\" \"$V\" 2 $j --delay-ms $(( (j - 1) * 15 )) > \"$O/$j\" & pids+=($!)\n\
         done\n\
         for p in \"${pids[@]}\"; do wait $p; done",
        || {
            let stats = t.stats();
            let used: u64 = ["cache", "staging", "work"]
                .iter()
                .filter_map(|u| stats["memory"][u]["used_bytes"].as_u64())
                .sum();
            most_used = most_used.max(used);
            let held = stats["views"]["train"]["held_bytes"].as_u64().unwrap_or(0);
            most_held = most_held.max(held);
        },
    );
    assert_same_tensors_each_epoch(&jobs, 2, 16);
    assert!(
        most_used <= budget,
        "the daemon held {most_used} bytes of a {budget}-byte budget"
    );
    assert!(t.daemon_alive(), "the daemon exited");
    assert_eq!(group.oom_kills(), 0, "OOM kills in the daemon's cgroup");
    let stats = t.stats();
    let view = &stats["views"]["train"];
    assert_eq!(view["errors"], 0, "{view}");
    assert_eq!(view["jobs_seen"], 4, "{view}");
    assert!(
        view["shared_hits"].as_u64() > Some(0),
        "the jobs shared: {view}"
    );
    assert!(
        most_held > 0,
        "renders were held for the slower jobs: {view}"
    );
    assert_eq!(stats["memory"]["render_refusals"], 0, "{}", stats["memory"]);
}
