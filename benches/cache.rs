//! Cache codecs and the disk tier, measured through real mounts on a throttled source.
//!
//! 1. Effective capacity (logical / stored bytes) per data kind and codec, and with `auto`, of
//!    the disk tier too (written as the reads go, then left 5 s to upgrade). Kinds: uint8 pixel
//!    arrays (.npy HWC) decoded from the synthetic photos (`pixels-synthetic`) and, with
//!    `--photos DIR`, from real photos (`pixels-photos`: random crops and flips of each photo
//!    after a JPEG q90 round trip); u16 token shards, i.i.d. Zipf ids (`tokens-iid`) and, with
//!    `--text DIR`, real text (`tokens-text`: the HTML/Markdown/text files under DIR, split into
//!    word pieces with hashed ids in a 50,257-id vocabulary, as a BPE tokenizer's output); JPEGs.
//! 2. Three epochs in a fresh random order over the realistic compressible kinds together, with a
//!    RAM budget of half their size: misses and epoch time with `--codec none`, `zstd-3` and
//!    `auto`.
//! 3. The first epoch after a remount with a warm disk tier vs a cold one.
//!
//! Run as root: `cargo bench --bench cache -- [--quick] [--throttle-mb 50] [--photos DIR]
//! [--text DIR]`. Reads are done by this process with 2 threads, whole files, so the numbers
//! isolate the cache from any loader.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use prepfs::sandbox::{self, Cgroup, Guard, Limits, SlowDisk};
use serde_json::Value;

const PREPFS: &str = env!("CARGO_BIN_EXE_prepfs");

fn main() {
    if let Err(e) = run() {
        eprintln!("cache bench: {e}");
        sandbox::exit(1);
    }
}

struct Opts {
    workdir: PathBuf,
    images: usize,
    shards: usize,
    throttle: u64,
    photos: Option<PathBuf>,
    text: Option<PathBuf>,
}

impl Opts {
    /// The data kinds of this run.
    fn kinds(&self) -> Vec<&'static str> {
        let mut kinds = vec!["pixels-synthetic"];
        kinds.extend(self.photos.as_ref().map(|_| "pixels-photos"));
        kinds.push("tokens-iid");
        kinds.extend(self.text.as_ref().map(|_| "tokens-text"));
        kinds.push("jpeg");
        kinds
    }

    /// The compressible kinds closest to real data, for the epochs comparison.
    fn realistic(&self) -> [&'static str; 2] {
        [
            if self.photos.is_some() {
                "pixels-photos"
            } else {
                "pixels-synthetic"
            },
            if self.text.is_some() {
                "tokens-text"
            } else {
                "tokens-iid"
            },
        ]
    }
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let quick = args.iter().any(|a| a == "--quick");
    let path = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .map(PathBuf::from)
    };
    Opts {
        photos: path("--photos"),
        text: path("--text"),
        workdir: PathBuf::from("/tmp/prepfs-cache-bench"),
        images: if quick { 40 } else { 300 },
        shards: if quick { 2 } else { 8 },
        throttle: value("--throttle-mb").unwrap_or(50) << 20,
    }
}

fn run() -> Result<(), String> {
    let o = opts();
    sandbox::install_signal_teardown()?;
    sandbox::clear_leftovers(&o.workdir);
    let _ = std::fs::remove_dir_all(&o.workdir);
    std::fs::create_dir_all(&o.workdir).map_err(|e| e.to_string())?;
    let image = build(&o)?;
    let disk = SlowDisk::attach(&image, &o.workdir.join("disk"), false)?;
    let group = Cgroup::create(
        "cache",
        &Limits {
            memory: None,
            throttle: Some((disk.devnum.clone(), o.throttle, 1_000_000)),
        },
    )?;
    let size = |kind: &str| dir_bytes(&disk.mountpoint.join(kind));
    println!(
        "# cache bench: {} images, {} token shards, source throttled to {} MB/s\n",
        o.images,
        o.shards,
        o.throttle >> 20
    );

    println!("## Effective capacity (logical / stored) after one pass, RAM budget > data\n");
    println!("| kind | MB | codec | capacity | disk tier capacity | compress CPU s | RAM MB |");
    println!("|---|---|---|---|---|---|---|");
    for kind in o.kinds() {
        for codec in ["none", "lz4", "zstd-3", "auto"] {
            let tier = o.workdir.join(format!("disk-{kind}"));
            let tier = tier.display().to_string();
            let mut args = vec!["--codec", codec, "--cache-mem", "4G"];
            if codec == "auto" {
                args.extend(["--cache-dir", &tier, "--cache-disk", "4G"]);
            }
            let m = Mount::start(&group, &o, &disk, &args)?;
            read_epoch(&m.path.join(kind), 1)?;
            let mut s = m.settle();
            let disk_ratio = if codec == "auto" {
                // The writer's queue drains and, the CPU idle now, it upgrades what it wrote
                // with a weaker codec.
                std::thread::sleep(Duration::from_secs(5));
                s = m.stats();
                format!("{:.2}x", num(&s, "disk.capacity_ratio"))
            } else {
                "-".into()
            };
            println!(
                "| {kind} | {:.0} | {codec} | {:.2}x | {disk_ratio} | {:.2} | {:.0} |",
                size(kind) as f64 / 1e6,
                num(&s, "cache.capacity_ratio"),
                num(&s, "cache.compress_cpu_seconds"),
                num(&s, "cache.bytes") / 1e6
            );
        }
    }

    let realistic = o.realistic();
    let data: u64 = realistic.iter().map(|k| size(k)).sum();
    let budget = data / 2;
    println!(
        "\n## Three epochs, random order, {} ({:.0} MB), RAM budget {:.0} MB\n",
        realistic.join(" + "),
        data as f64 / 1e6,
        budget as f64 / 1e6
    );
    println!("| codec | epoch | seconds | source MB (misses) | capacity |");
    println!("|---|---|---|---|---|");
    for codec in ["none", "zstd-3", "auto"] {
        let budget = budget.to_string();
        let m = Mount::start(
            &group,
            &o,
            &disk,
            &["--codec", codec, "--cache-mem", &budget],
        )?;
        let mut last = 0.0;
        for epoch in 1..=3 {
            sandbox::drop_caches()?;
            let took = read_epochs_of(&m, &realistic, epoch)?;
            let s = m.stats();
            let source = num(&s, "source.bytes_read");
            println!(
                "| {codec} | {epoch} | {took:.2} | {:.0} | {:.2}x |",
                (source - last) / 1e6,
                num(&s, "cache.capacity_ratio")
            );
            last = source;
            // Between epochs the loader would be busy training; give the packer that time.
            m.settle();
        }
    }

    println!("\n## First epoch after a remount: warm disk tier vs cold (all kinds)\n");
    println!(
        "| run | seconds | source MB | disk hits | RAM ratio | disk ratio | disk recompressions |"
    );
    println!("|---|---|---|---|---|---|---|");
    let cache_dir = o.workdir.join("disk-tier");
    let dir = cache_dir.display().to_string();
    let args = [
        "--cache-dir",
        &dir,
        "--cache-disk",
        "4G",
        "--cache-mem",
        "64M",
    ];
    let mut times = Vec::new();
    for run in ["cold", "warm"] {
        let m = Mount::start(&group, &o, &disk, &args)?;
        sandbox::drop_caches()?;
        let started = Instant::now();
        for kind in o.kinds() {
            read_epoch(&m.path.join(kind), 1)?;
        }
        let took = started.elapsed().as_secs_f64();
        let read = m.stats();
        // Let the writer finish (and, with the CPU idle now, the packer and the disk writer
        // upgrade what they wrote raw) before the ratios and the clean unmount.
        m.wait_for(|s| num(s, "disk.writes") + num(s, "disk.admission_rejected") > 0.0);
        m.settle();
        std::thread::sleep(Duration::from_secs(5));
        let s = m.stats();
        println!(
            "| {run} | {took:.2} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} |",
            num(&read, "source.bytes_read") / 1e6,
            num(&read, "disk.hits"),
            num(&s, "cache.capacity_ratio"),
            num(&s, "disk.capacity_ratio"),
            num(&s, "disk.recompressions"),
        );
        times.push(took);
        drop(m);
    }
    println!("\nwarm / cold = {:.3}", times[1] / times[0]);
    Ok(())
}

fn num(stats: &Value, path: &str) -> f64 {
    path.split('.')
        .fold(stats, |v, k| &v[k])
        .as_f64()
        .unwrap_or(0.0)
}

fn dir_bytes(dir: &Path) -> u64 {
    files(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// Reads every file of `dir` once, in an order shuffled by `seed`, on 2 threads.
fn read_epoch(dir: &Path, seed: u64) -> Result<(), String> {
    read_files(files(dir), seed)
}

/// Reads `all` once, in an order shuffled by `seed`, on 2 threads.
fn read_files(mut all: Vec<PathBuf>, seed: u64) -> Result<(), String> {
    fastrand::Rng::with_seed(seed).shuffle(&mut all);
    let half = all.len() / 2;
    std::thread::scope(|s| {
        let parts = [&all[..half], &all[half..]];
        let workers: Vec<_> = parts
            .into_iter()
            .map(|part| {
                s.spawn(move || {
                    for p in part {
                        std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|_| Err("reader panicked".into())))
    })
}

/// One epoch over the files of `kinds` together, shuffled; returns its seconds.
fn read_epochs_of(m: &Mount, kinds: &[&str], epoch: u64) -> Result<f64, String> {
    let all = kinds.iter().flat_map(|k| files(&m.path.join(k))).collect();
    let started = Instant::now();
    read_files(all, epoch)?;
    Ok(started.elapsed().as_secs_f64())
}

/// Builds the dataset image: the kinds of `o.kinds()`, each in its own directory.
fn build(o: &Opts) -> Result<PathBuf, String> {
    let image = o.workdir.join("dataset.img");
    let shard = 16u64 << 20;
    let size = 2 * (o.images as u64 * 1_000_000 + o.shards as u64 * shard) + (128 << 20);
    File::create(&image)
        .and_then(|f| f.set_len(size))
        .map_err(|e| e.to_string())?;
    sandbox::must(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?;
    let disk = SlowDisk::attach(&image, &o.workdir.join("build"), true)?;
    let root = &disk.mountpoint;
    for kind in o.kinds() {
        std::fs::create_dir_all(root.join(kind)).map_err(|e| e.to_string())?;
    }
    let write = |rel: String, bytes: &[u8]| {
        std::fs::write(root.join(&rel), bytes).map_err(|e| format!("{rel}: {e}"))
    };
    for i in 0..o.images {
        let jpeg = prepfs::synthetic::photo(2026 + i as u64)?;
        write(format!("jpeg/{i:05}.jpg"), &jpeg)?;
        let pixels = decode(&jpeg)?;
        write(format!("pixels-synthetic/{i:05}.npy"), &npy(&pixels))?;
    }
    if let Some(dir) = &o.photos {
        let photos = real_photos(dir)?;
        let mut rng = fastrand::Rng::with_seed(11);
        for i in 0..o.images {
            let photo = &photos[i % photos.len()];
            let (w, h) = photo.dimensions();
            let (cw, ch) = (w / 2 + rng.u32(0..=w / 2), h / 2 + rng.u32(0..=h / 2));
            let (x, y) = (rng.u32(0..=w - cw), rng.u32(0..=h - ch));
            let mut crop = image::imageops::crop_imm(photo, x, y, cw, ch).to_image();
            if rng.bool() {
                image::imageops::flip_horizontal_in_place(&mut crop);
            }
            write(format!("pixels-photos/{i:05}.npy"), &npy(&crop))?;
        }
    }
    // Token ids with a Zipf-like law over a 50k vocabulary, drawn independently.
    let mut rng = fastrand::Rng::with_seed(7);
    for s in 0..o.shards {
        let mut bytes = Vec::with_capacity(shard as usize);
        while (bytes.len() as u64) < shard {
            let id = ((50_000f64).powf(rng.f64()) as u16).saturating_sub(1);
            bytes.extend_from_slice(&id.to_le_bytes());
        }
        write(format!("tokens-iid/shard-{s:03}.bin"), &bytes)?;
    }
    if let Some(dir) = &o.text {
        let tokens = text_tokens(dir)?;
        let per_shard = (shard / 2) as usize;
        for s in 0..o.shards {
            // Contiguous stretches of the corpus, each shard starting elsewhere.
            let start = s * tokens.len() / o.shards;
            let bytes: Vec<u8> = tokens
                .iter()
                .cycle()
                .skip(start)
                .take(per_shard)
                .flat_map(|id| id.to_le_bytes())
                .collect();
            write(format!("tokens-text/shard-{s:03}.bin"), &bytes)?;
        }
    }
    drop(disk);
    Ok(image)
}

fn decode(encoded: &[u8]) -> Result<image::RgbImage, String> {
    Ok(image::load_from_memory(encoded)
        .map_err(|e| e.to_string())?
        .to_rgb8())
}

/// A uint8 HWC .npy file of `pixels`.
fn npy(pixels: &image::RgbImage) -> Vec<u8> {
    let (w, h) = pixels.dimensions();
    let header = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({h}, {w}, 3), }}");
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    let pad = 128 - 10 - header.len() - 1;
    npy.extend_from_slice(&(118u16).to_le_bytes());
    npy.extend_from_slice(header.as_bytes());
    npy.extend(std::iter::repeat_n(b' ', pad));
    npy.push(b'\n');
    npy.extend_from_slice(pixels.as_raw());
    npy
}

/// The photos (JPEG, PNG) in `dir`, each after a JPEG q90 round trip, as a dataset stores them.
fn real_photos(dir: &Path) -> Result<Vec<image::RgbImage>, String> {
    let mut photos = Vec::new();
    for path in files(dir) {
        let Ok(img) = image::open(&path) else {
            continue;
        };
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&img.to_rgb8())
            .map_err(|e| e.to_string())?;
        photos.push(decode(&jpeg)?);
    }
    if photos.is_empty() {
        return Err(format!("no photos in {}", dir.display()));
    }
    println!("{} real photos from {}", photos.len(), dir.display());
    Ok(photos)
}

/// Token ids of the text under `dir` (.html with tags removed, .md, .txt): word pieces (a word
/// with its leading space, a number, or one other character), each id a hash of the piece in a
/// GPT-2-sized vocabulary, so ids carry no frequency order a real BPE vocabulary would not.
fn text_tokens(dir: &Path) -> Result<Vec<u16>, String> {
    const VOCAB: u64 = 50_257;
    let mut tokens = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for path in files(&d) {
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !["html", "md", "txt"].contains(&ext) {
                continue;
            }
            let Ok(raw) = std::fs::read_to_string(&path) else {
                continue;
            };
            let text = if ext == "html" { strip_tags(&raw) } else { raw };
            let mut piece = String::new();
            let mut flush = |piece: &mut String| {
                if !piece.is_empty() {
                    let id = xxhash_rust::xxh3::xxh3_64(piece.as_bytes()) % VOCAB;
                    tokens.push(id as u16);
                    piece.clear();
                }
            };
            for c in text.chars() {
                let joins = match piece.chars().last() {
                    Some(last) => {
                        (c.is_alphabetic() && (last.is_alphabetic() || last == ' '))
                            || (c.is_ascii_digit() && (last.is_ascii_digit() || last == ' '))
                    }
                    None => false,
                };
                if !joins {
                    flush(&mut piece);
                }
                piece.push(c);
            }
            flush(&mut piece);
        }
    }
    if tokens.len() < 1 << 20 {
        return Err(format!(
            "too little text under {} ({} tokens)",
            dir.display(),
            tokens.len()
        ));
    }
    println!("{} tokens of text from {}", tokens.len(), dir.display());
    Ok(tokens)
}

/// `html` without its tags, scripts and styles, whitespace runs folded to one space.
fn strip_tags(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let skip_to = ["<script", "<style"]
            .iter()
            .find(|t| tag.starts_with(*t))
            .map(|t| format!("</{}>", &t[1..]));
        let end = match skip_to {
            Some(close) => tag.find(&close).map(|e| e + close.len()),
            None => tag.find('>').map(|e| e + 1),
        };
        rest = end.map_or("", |e| &tag[e..]);
        out.push(' ');
    }
    out.push_str(rest);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A prepfs mount of the dataset; dropping it stops the daemon and reaps it.
struct Mount {
    path: PathBuf,
    child: Child,
    stop_daemon: Option<Guard>,
    _unmount: Guard,
}

impl Mount {
    fn start(group: &Cgroup, o: &Opts, disk: &SlowDisk, extra: &[&str]) -> Result<Mount, String> {
        let path = o.workdir.join("mnt");
        let mut args = vec![
            "mount".to_owned(),
            disk.mountpoint.display().to_string(),
            path.display().to_string(),
            "--foreground".to_owned(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let log = o.workdir.join("prepfs.log");
        let (child, stop_daemon, unmount) =
            sandbox::start_prepfs(group, Path::new(PREPFS), &args, &path, &log)?;
        Ok(Mount {
            path,
            child,
            stop_daemon: Some(stop_daemon),
            _unmount: unmount,
        })
    }

    fn stats(&self) -> Value {
        sandbox::read_stats(&self.path)
    }

    fn wait_for(&self, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.stats();
            if done(&s) || Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (up to 30 s) until the packer has nothing left to do.
    fn settle(&self) -> Value {
        self.wait_for(|s| num(s, "cache.pack_queue") == 0.0 && num(s, "cache.repack_queue") == 0.0)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        drop(self.stop_daemon.take());
        let _ = self.child.wait();
    }
}
