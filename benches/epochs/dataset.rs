//! The benchmark dataset: photograph-like JPEGs in class folders (`images/`) and the same samples
//! packed in WebDataset-style tar shards (`shards/`), built once into an ext4 image and reused.
//!
//! Owns the image file and its manifest (`<image>.json`, written last, so an image without one is
//! incomplete and rebuilt). Must never write to an image that a run has attached read-only.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use prepfs::sandbox::{self, SlowDisk};

/// Classes (folders) of the image variant, as ImageFolder sees them.
const CLASSES: usize = 100;
/// Bump when the content or layout changes, so old images are not reused.
const VERSION: u32 = 1;

/// What was built, read back from the manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub files: usize,
    pub file_bytes: u64,
    pub shards: usize,
    pub shard_bytes: u64,
    pub shard_target_bytes: u64,
}

/// The image holding `files` samples (and their shards of about `shard_bytes`), built under
/// `workdir` unless an identical one is there already.
pub fn prepare(
    workdir: &Path,
    files: usize,
    shard_bytes: u64,
) -> Result<(PathBuf, Manifest), String> {
    let image = workdir.join(format!(
        "dataset-v{VERSION}-{files}files-{}MiB-shards.img",
        shard_bytes >> 20
    ));
    let manifest_path = image.with_extension("json");
    if let Some(manifest) = std::fs::read(&manifest_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
        .filter(|_| image.exists())
    {
        eprintln!("epochs: reusing {}", image.display());
        return Ok((image, manifest));
    }
    let _ = std::fs::remove_file(&manifest_path);
    // Generous: ~130 KB per sample at most, twice (files and shards), plus ext4's own overhead.
    let size = files as u64 * 130_000 * 2 * 12 / 10 + (128 << 20);
    eprintln!(
        "epochs: building {files} images and their shards in {}",
        image.display()
    );
    let file = File::create(&image).map_err(|e| format!("{}: {e}", image.display()))?;
    file.set_len(size)
        .map_err(|e| format!("{}: {e}", image.display()))?;
    drop(file);
    sandbox::must(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
            .arg(&image),
    )?;
    let disk = SlowDisk::attach(&image, &workdir.join("build"), true)?;
    let samples = prepfs::synthetic::layout(files, CLASSES, 2026);
    let images = disk.mountpoint.join("images");
    let progress = ProgressBar::new(files as u64).with_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress.set_message("images");
    let file_bytes = prepfs::synthetic::write_all(&images, &samples, &|| {
        progress.inc(1);
        true
    })?;
    progress.finish_and_clear();
    let (shards, shard_total) = write_shards(
        &images,
        &samples,
        &disk.mountpoint.join("shards"),
        shard_bytes,
    )?;
    drop(disk);
    let manifest = Manifest {
        files,
        file_bytes,
        shards,
        shard_bytes: shard_total,
        shard_target_bytes: shard_bytes,
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| e.to_string())?;
    std::fs::write(&manifest_path, json)
        .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    Ok((image, manifest))
}

/// Packs the samples, in a seeded shuffled order, into tar shards of about `target` bytes, each
/// sample as `<key>.jpg` and `<key>.cls` (WebDataset layout). Returns (shards, total bytes).
fn write_shards(
    images: &Path,
    samples: &[prepfs::synthetic::Sample],
    dir: &Path,
    target: u64,
) -> Result<(usize, u64), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut order: Vec<usize> = (0..samples.len()).collect();
    fastrand::Rng::with_seed(99).shuffle(&mut order);
    let mut shards: Vec<PathBuf> = Vec::new();
    let mut builder: Option<tar::Builder<BufWriter<File>>> = None;
    let mut in_shard = 0u64;
    for index in order {
        let sample = &samples[index];
        let jpeg = std::fs::read(images.join(&sample.path)).map_err(|e| e.to_string())?;
        if builder.is_none() || in_shard + jpeg.len() as u64 > target {
            if let Some(done) = builder.take() {
                finish(done)?;
            }
            let path = dir.join(format!("shard-{:05}.tar", shards.len()));
            let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            builder = Some(tar::Builder::new(BufWriter::new(file)));
            shards.push(path);
            in_shard = 0;
        }
        let Some(tar) = builder.as_mut() else {
            continue;
        };
        let key = format!("sample{index:06}");
        let class = sample
            .path
            .parent()
            .and_then(|p| p.to_str())
            .and_then(|p| p.strip_prefix("class_"))
            .unwrap_or("0")
            .to_owned();
        for (name, data) in [
            (format!("{key}.jpg"), jpeg.as_slice()),
            (format!("{key}.cls"), class.as_bytes()),
        ] {
            let mut header = tar::Header::new_ustar();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_cksum();
            tar.append_data(&mut header, name, data)
                .map_err(|e| e.to_string())?;
        }
        in_shard += jpeg.len() as u64 + 2048;
    }
    if let Some(done) = builder.take() {
        finish(done)?;
    }
    let total = shards
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    Ok((shards.len(), total))
}

fn finish(tar: tar::Builder<BufWriter<File>>) -> Result<(), String> {
    let file = tar.into_inner().map_err(|e| e.to_string())?;
    file.into_inner()
        .map_err(|e| e.to_string())?
        .sync_all()
        .map_err(|e| e.to_string())
}
