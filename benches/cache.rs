//! Cache codecs and the disk tier, measured through real mounts on a throttled source.
//!
//! 1. Effective capacity (logical / stored bytes) per data kind and codec: uint8 pixel arrays
//!    (.npy, decoded from the synthetic photos), token-id shards (Zipf-distributed u16), JPEGs.
//! 2. Three epochs in a fresh random order over the compressible kinds with a RAM budget of half
//!    their size: misses and epoch time with `--codec none`, `zstd-3` and `auto`.
//! 3. The first epoch after a remount with a warm disk tier vs a cold one.
//!
//! Run as root: `cargo bench --bench cache [-- --quick] [--throttle-mb 50]`. Reads are done by
//! this process with 2 threads, whole files, so the numbers isolate the cache from any loader.

#[path = "epochs/sandbox.rs"]
#[allow(dead_code)]
mod sandbox;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use sandbox::{Cgroup, Guard, Limits, SlowDisk};
use serde_json::Value;

const PREPFS: &str = env!("CARGO_BIN_EXE_prepfs");
const KINDS: [&str; 3] = ["pixels", "tokens", "jpeg"];

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
    Opts {
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
    println!("| kind | MB | codec | capacity | compress CPU s | RAM MB |");
    println!("|---|---|---|---|---|---|");
    for kind in KINDS {
        for codec in ["none", "lz4", "zstd-3", "auto"] {
            let m = Mount::start(&group, &o, &disk, &["--codec", codec, "--cache-mem", "4G"])?;
            read_epoch(&m.path.join(kind), 1)?;
            let s = m.settle();
            println!(
                "| {kind} | {:.0} | {codec} | {:.2}x | {:.2} | {:.0} |",
                size(kind) as f64 / 1e6,
                num(&s, "cache.capacity_ratio"),
                num(&s, "cache.compress_cpu_seconds"),
                num(&s, "cache.bytes") / 1e6
            );
        }
    }

    let data = size("pixels") + size("tokens");
    let budget = data / 2;
    println!(
        "\n## Three epochs, random order, compressible kinds ({:.0} MB), RAM budget {:.0} MB\n",
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
            let took = read_epochs_of(&m, epoch)?;
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
    println!("| run | seconds | source MB | disk hits |");
    println!("|---|---|---|---|");
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
        for kind in KINDS {
            read_epoch(&m.path.join(kind), 1)?;
        }
        let took = started.elapsed().as_secs_f64();
        let s = m.stats();
        println!(
            "| {run} | {took:.2} | {:.0} | {:.0} |",
            num(&s, "source.bytes_read") / 1e6,
            num(&s, "disk.hits")
        );
        times.push(took);
        // Let the writer finish before the clean unmount.
        m.wait_for(|s| num(s, "disk.writes") + num(s, "disk.admission_rejected") > 0.0);
        std::thread::sleep(Duration::from_secs(2));
        m.stop();
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
    let mut all = files(dir);
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

fn read_epochs_of(m: &Mount, epoch: u64) -> Result<f64, String> {
    let started = Instant::now();
    read_epoch(&m.path.join("pixels"), epoch)?;
    read_epoch(&m.path.join("tokens"), epoch)?;
    Ok(started.elapsed().as_secs_f64())
}

/// Builds the dataset image once: pixels (.npy uint8 HWC), tokens (u16 shards), jpeg.
fn build(o: &Opts) -> Result<PathBuf, String> {
    let image = o.workdir.join("dataset.img");
    let shard = 16u64 << 20;
    let size = o.images as u64 * 900_000 + o.shards as u64 * shard + (128 << 20);
    File::create(&image)
        .and_then(|f| f.set_len(size))
        .map_err(|e| e.to_string())?;
    sandbox::must(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?;
    let disk = SlowDisk::attach(&image, &o.workdir.join("build"), true)?;
    let root = &disk.mountpoint;
    for kind in KINDS {
        std::fs::create_dir_all(root.join(kind)).map_err(|e| e.to_string())?;
    }
    for i in 0..o.images {
        let jpeg = prepfs::synthetic::photo(2026 + i as u64)?;
        let pixels = image::load_from_memory(&jpeg)
            .map_err(|e| e.to_string())?
            .to_rgb8();
        let (w, h) = pixels.dimensions();
        let header =
            format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({h}, {w}, 3), }}");
        let mut npy = b"\x93NUMPY\x01\x00".to_vec();
        let pad = 128 - 10 - header.len() - 1;
        npy.extend_from_slice(&(118u16).to_le_bytes());
        npy.extend_from_slice(header.as_bytes());
        npy.extend(std::iter::repeat_n(b' ', pad));
        npy.push(b'\n');
        npy.extend_from_slice(pixels.as_raw());
        std::fs::write(root.join(format!("jpeg/{i:05}.jpg")), &jpeg).map_err(|e| e.to_string())?;
        std::fs::write(root.join(format!("pixels/{i:05}.npy")), &npy).map_err(|e| e.to_string())?;
    }
    // Token ids with a Zipf-like law over a 50k vocabulary, as a tokenizer's output has.
    let mut rng = fastrand::Rng::with_seed(7);
    for s in 0..o.shards {
        let mut bytes = Vec::with_capacity(shard as usize);
        while (bytes.len() as u64) < shard {
            let id = ((50_000f64).powf(rng.f64()) as u16).saturating_sub(1);
            bytes.extend_from_slice(&id.to_le_bytes());
        }
        std::fs::write(root.join(format!("tokens/shard-{s:03}.bin")), &bytes)
            .map_err(|e| e.to_string())?;
    }
    drop(disk);
    Ok(image)
}

struct Mount {
    path: PathBuf,
    child: Child,
    stop_daemon: Guard,
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
            stop_daemon,
            _unmount: unmount,
        })
    }

    fn stats(&self) -> Value {
        std::fs::read(self.path.join(".prepfs/stats.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null)
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

    fn stop(mut self) {
        drop(self.stop_daemon);
        let _ = self.child.wait();
    }
}
