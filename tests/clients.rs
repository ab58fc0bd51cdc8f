//! The real clients over real mounts: PyTorch (torchvision DatasetFolder + DataLoader with two
//! workers) reading a tensor view. The Python environment comes from `python/ensure-env`, which
//! installs it on first use; a missing environment fails the test, it is never skipped.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::TestMount;

const ENSURE_ENV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/ensure-env");
const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");

fn python() -> PathBuf {
    let out = Command::new(ENSURE_ENV)
        .output()
        .expect("run python/ensure-env");
    assert!(
        out.status.success(),
        "python/ensure-env failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn pytorch_dataloader_reads_a_view_epoch_with_shapes_dtypes_and_labels() {
    let mut t = TestMount::new();
    let (classes, per_class) = (3, 5);
    for c in 0..classes {
        let dir = t.s(&format!("class_{c}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for i in 0..per_class {
            let jpeg = prepfs::synthetic::photo((c * 100 + i) as u64).expect("jpeg");
            std::fs::write(dir.join(format!("{i}.jpg")), jpeg).expect("write");
        }
    }
    t.mount(&[
        "--view",
        "train=decode,random_resized_crop(96),hflip,normalize(imagenet)",
    ]);
    let out = Command::new(python())
        .arg(format!("{CLIENTS}/torch_view.py"))
        .arg(t.m(".prepfs/views/train"))
        .arg((classes * per_class).to_string())
        .arg(classes.to_string())
        .arg("96")
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "torch client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"images\": 15"), "{stdout}");
    assert_eq!(t.stats()["views"]["train"]["errors"], 0);
}
