//! Every example in examples/ against a real mount, in the Python environment of the client
//! tests: each must exit 0 (the examples check what they read) and report the items it read.

mod common;

use std::path::Path;
use std::process::Command;

use common::{TestMount, described, python, run_checked};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
const CLASSES: usize = 3;
const PER_CLASS: usize = 8;

/// Runs one example for two epochs and returns its result line, parsed.
fn run(python: &Path, t: &TestMount, example: &str) -> serde_json::Value {
    let mut command = Command::new(python);
    command
        .arg(format!("{EXAMPLES}/{example}/run.py"))
        .arg("--mount")
        .arg(&t.mnt)
        .arg("--source")
        .arg(&t.src)
        .env("TF_CPP_MIN_LOG_LEVEL", "3");
    let out = run_checked(&mut command);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let result: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "{example}: no result line ({e}): {}",
            described(&command, &out)
        )
    });
    assert_eq!(result["example"], example, "{result}");
    assert!(result["items_per_s"].as_f64() > Some(0.0), "{result}");
    assert!(result["hit_rate"].is_number(), "{result}");
    result
}

#[test]
fn every_example_runs_against_a_real_mount() {
    let mut t = TestMount::new();
    for c in 0..CLASSES {
        let dir = t.s(&format!("images/class_{c}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for i in 0..PER_CLASS {
            let jpeg = prepfs::synthetic::photo((c * 100 + i) as u64).expect("jpeg");
            std::fs::write(dir.join(format!("{i}.jpg")), jpeg).expect("write");
        }
    }
    t.mount(&[
        "--view",
        "train=decode,random_resized_crop(64),hflip,normalize(imagenet)",
        "--view",
        "train_u8=decode,random_resized_crop(64),hflip,uint8(hwc)",
        "--view",
        "val_u8=decode,resize(80),center_crop(64),uint8(hwc)",
        "--view",
        "val=decode,resize(80),center_crop(64),normalize(imagenet)",
    ]);
    let python = python();
    let images = (CLASSES * PER_CLASS) as u64;
    let expected = [
        ("pytorch_imagefolder", 2 * images),
        ("pytorch_view", 2 * images),
        ("pytorch_uint8", 2 * images),
        ("webdataset", 2 * images),
        // Two epochs of the Arrow file, then the Parquet file once.
        ("hf_datasets", 3 * 20_000),
        // Two pipelines (raw, view), two epochs each.
        ("tf_data", 4 * images),
        ("numpy_memmap", 2 * 512),
    ];
    for (example, items) in expected {
        let result = run(&python, &t, example);
        assert_eq!(result["items"], items, "{result}");
    }
    let stats = t.stats();
    for view in ["train", "train_u8", "val_u8", "val"] {
        assert_eq!(stats["views"][view]["errors"], 0, "{view}: {stats}");
    }
    assert!(stats["cache"]["hits"].as_u64() > Some(0), "{stats}");
}
