//! Typed mount configuration, its defaults, and validation of user input.
//!
//! Owns: `MountConfig`, size parsing, and every check that turns bad input into one readable
//! line before anything is mounted (source, mountpoint and whether the source reaches it,
//! /dev/fuse, sizes). Must never mount, spawn or change anything: it only reads and decides.

use crate::cache::CacheConfig;
use crate::cache::policy::DecodedCaching;
use crate::control::codec::{Codec, MAX_ZSTD_LEVEL};
use crate::fuse::FuseConfig;
use crate::memory::limits;
use crate::memory::{MemoryPlan, Staging, WORK_PER_RENDER};
use crate::mountinfo::Mount;
use crate::prefetch::PrefetchConfig;
use crate::scheduler::runtime::SchedulerOptions;
use crate::scheduler::state::RewardWeights;
use crate::view::ViewSpec;
use crate::view::ViewsConfig;
use crate::view::gpu::{DEFAULT_GPU_MEMORY, GpuMode, GpuOptions, MIN_GPU_MEMORY};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a configuration cannot be used. Each message is one line a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A size string that does not parse.
    #[error(
        "invalid size {0:?}: use a number with an optional K, M, G or T suffix (powers of 1024), e.g. 8G"
    )]
    BadSize(String),
    /// The source directory is unusable.
    #[error("source {path}: {why}")]
    Source {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The mountpoint is unusable.
    #[error("mountpoint {path}: {why}")]
    Mountpoint {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The FUSE device cannot be used.
    #[error("{0}")]
    Fuse(String),
    /// A `--view` definition is invalid.
    #[error("{0}")]
    View(String),
    /// Another option's value is invalid.
    #[error("{0}")]
    Invalid(String),
}

/// Everything a mount needs: where, how it runs, and each component's own configuration.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Dataset directory (canonical).
    pub source: PathBuf,
    /// Where the mount appears (canonical).
    pub mountpoint: PathBuf,
    /// Stay attached to the terminal instead of becoming a daemon.
    pub foreground: bool,
    /// Where a daemon writes its log (none: discarded).
    pub log_file: Option<PathBuf>,
    /// The kernel connection.
    pub fuse: FuseConfig,
    /// The cache tiers and the memory budget.
    pub cache: CacheConfig,
    /// Epoch inference and prefetch.
    pub prefetch: PrefetchConfig,
    /// Tensor views.
    pub views: ViewsConfig,
    /// Who sets the knobs, and how it learns (`None`: nobody; each module's own rule decides).
    pub scheduler: Option<SchedulerOptions>,
}

impl MountConfig {
    /// A mount of `source` at `mountpoint` with every component's defaults.
    pub fn new(source: PathBuf, mountpoint: PathBuf) -> MountConfig {
        MountConfig {
            source,
            mountpoint,
            foreground: false,
            log_file: None,
            fuse: FuseConfig::default(),
            cache: CacheConfig::default(),
            prefetch: PrefetchConfig::default(),
            views: ViewsConfig::default(),
            scheduler: Some(SchedulerOptions::default()),
        }
    }

    /// Checks what the parts of the configuration must satisfy together and against the
    /// machine (its memory and cgroup); the warnings a user should see (close to the limits).
    /// Never touches SOURCE or MOUNTPOINT (see `check_source`, `check_mountpoint`).
    pub fn validate(&self) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        let invalid = ConfigError::Invalid;
        if self.fuse.threads == 0 || self.fuse.io_threads == 0 {
            return Err(invalid(
                "--fuse-threads and --io-threads must be at least 1".into(),
            ));
        }
        if !(MIN_SOURCE_TIMEOUT..=MAX_SOURCE_TIMEOUT).contains(&self.fuse.source_timeout) {
            return Err(invalid(format!(
                "--source-timeout {:?}: use 100ms to 60m",
                self.fuse.source_timeout
            )));
        }
        if self.views.render_threads == 0 || self.prefetch.threads == 0 {
            return Err(invalid(
                "--render-threads and --prefetch-threads must be at least 1".into(),
            ));
        }
        check_views(&self.views.specs)?;
        check_gpu_memory(self.views.gpu.memory)?;
        if let Some(disk) = &self.cache.disk {
            check_percent(disk.min_free * 100.0)?;
        }
        if let Some(w) = self.scheduler.as_ref().map(|s| &s.reward) {
            check_reward(w.alpha, w.beta, w.stall)?;
        }
        let (host, cgroup) = (limits::host(), limits::cgroup());
        if let Some(warning) = limits::check_budget(self.cache.budget, host, cgroup.as_ref())
            .map_err(ConfigError::Invalid)?
        {
            warnings.push(warning);
        }
        let plan = self.memory_plan();
        let for_renders = plan.work + plan.staging;
        if !self.views.specs.is_empty() && for_renders < WORK_PER_RENDER {
            // The never-evict cache keeps its share: past it, renders get only these.
            warnings.push(format!(
                "--cache-mem {} MiB leaves {:.1} MiB for view renders once the cache is full, \
                 and a render of a photo takes 2-8 MiB (more for larger images): renders that \
                 find no room answer EIO; give a mount with views at least {} MiB",
                self.cache.budget >> 20,
                for_renders as f64 / (1u64 << 20) as f64,
                (4 * WORK_PER_RENDER) >> 20
            ));
        }
        Ok(warnings)
    }

    /// How the memory budget is split: the staging buffer prefetch asks for (none without
    /// prefetch), and room for a read in flight per I/O, prefetch and render thread and for the
    /// renders (render threads run only with views).
    pub fn memory_plan(&self) -> MemoryPlan {
        let staging = match (self.prefetch.enabled, self.prefetch.buffer) {
            (false, _) => Staging::None,
            (true, None) => Staging::Default(crate::prefetch::DEFAULT_BUFFER),
            (true, Some(bytes)) => Staging::Asked(bytes),
        };
        let renders = self.views.renderers();
        let readers = self.fuse.io_threads + self.prefetch.readers() + renders;
        MemoryPlan::split(self.cache.budget, staging, readers, renders)
    }
}

/// Shortest and longest `--source-timeout`: below 100 ms a busy disk would fail reads; past an
/// hour a reader might as well hang.
const MIN_SOURCE_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_SOURCE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Parses and checks the GPU options: `--gpu` (auto, on, off) and `--gpu-mem` (a size, at
/// least `MIN_GPU_MEMORY`); the library paths, when given, must exist.
pub fn parse_gpu(
    mode: &str,
    memory: Option<&str>,
    nvjpeg: Option<PathBuf>,
    nvrtc: Option<PathBuf>,
) -> Result<GpuOptions, ConfigError> {
    let mode = GpuMode::parse(mode)
        .ok_or_else(|| ConfigError::Invalid(format!("--gpu {mode}: expected auto, on or off")))?;
    let memory = match memory {
        Some(text) => parse_size(text)?,
        None => DEFAULT_GPU_MEMORY,
    };
    check_gpu_memory(memory)?;
    for (flag, path) in [("--nvjpeg", &nvjpeg), ("--nvrtc", &nvrtc)] {
        if let Some(p) = path
            && !p.exists()
        {
            return Err(ConfigError::Invalid(format!(
                "{flag} {}: no such file or directory",
                p.display()
            )));
        }
    }
    let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    Ok(GpuOptions {
        mode,
        memory,
        nvjpeg: nvjpeg.map(absolute),
        nvrtc: nvrtc.map(absolute),
    })
}

/// Checks `--gpu-mem`: at least `MIN_GPU_MEMORY`.
fn check_gpu_memory(bytes: u64) -> Result<(), ConfigError> {
    if bytes < MIN_GPU_MEMORY {
        return Err(ConfigError::Invalid(format!(
            "--gpu-mem {bytes}: at least {}M (a launch must hold a useful batch)",
            MIN_GPU_MEMORY >> 20
        )));
    }
    Ok(())
}

/// Parses `--codec`: `auto` (adaptive: `None`) or a fixed codec.
pub fn parse_codec(text: &str) -> Result<Option<Codec>, ConfigError> {
    if text == "auto" {
        return Ok(None);
    }
    Codec::parse(text).map(Some).ok_or_else(|| {
        ConfigError::Invalid(format!(
            "invalid codec {text:?}: use auto, none, lz4, zstd or zstd-N with N in 1..={MAX_ZSTD_LEVEL}"
        ))
    })
}

/// Parses `--decoded-cache`: `auto`, `on` or `off`.
pub fn parse_decoded_caching(text: &str) -> Result<DecodedCaching, ConfigError> {
    [
        DecodedCaching::Auto,
        DecodedCaching::On,
        DecodedCaching::Off,
    ]
    .into_iter()
    .find(|mode| mode.name() == text)
    .ok_or_else(|| {
        ConfigError::Invalid(format!(
            "invalid --decoded-cache {text:?}: use auto, on or off"
        ))
    })
}

/// Parses an `on|off` option such as `--share-renders`.
pub fn parse_on_off(option: &str, text: &str) -> Result<bool, ConfigError> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(ConfigError::Invalid(format!(
            "invalid {option} {text:?}: use on or off"
        ))),
    }
}

/// Checks a percentage in 0..100 and returns it as a share (0..1).
pub fn check_percent(pct: f64) -> Result<f64, ConfigError> {
    if (0.0..100.0).contains(&pct) {
        Ok(pct / 100.0)
    } else {
        Err(ConfigError::Invalid(format!(
            "invalid percentage {pct}: use a number from 0 up to (not including) 100"
        )))
    }
}

/// Checks the reward weights: finite and not negative (a negative weight would reward latency).
pub fn check_reward(alpha: f64, beta: f64, stall: f64) -> Result<RewardWeights, ConfigError> {
    for (name, w) in [
        ("reward-alpha", alpha),
        ("reward-beta", beta),
        ("stall-penalty", stall),
    ] {
        if !(w.is_finite() && w >= 0.0) {
            return Err(ConfigError::Invalid(format!(
                "invalid --{name} {w}: use a finite number >= 0"
            )));
        }
    }
    Ok(RewardWeights { alpha, beta, stall })
}

/// Parses `--view NAME=PIPELINE` definitions, checked together as `check_views` does.
pub fn parse_views(definitions: &[String]) -> Result<Vec<ViewSpec>, ConfigError> {
    let views = definitions
        .iter()
        .map(|d| ViewSpec::parse(d).map_err(|e| ConfigError::View(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    check_views(&views)?;
    Ok(views)
}

/// Checks a mount's views: names unique, at most `inode::MAX_VIEWS`.
fn check_views(views: &[ViewSpec]) -> Result<(), ConfigError> {
    if views.len() > crate::inode::MAX_VIEWS {
        return Err(ConfigError::View(format!(
            "{} views given; at most {} per mount",
            views.len(),
            crate::inode::MAX_VIEWS
        )));
    }
    for (i, v) in views.iter().enumerate() {
        if views[..i].iter().any(|w| w.name == v.name) {
            return Err(ConfigError::View(format!(
                "view {} is defined twice",
                v.name
            )));
        }
    }
    Ok(())
}

/// Parses a duration: `30s`, `500ms`, `2m`, or a number of seconds (`1.5`); between 100 ms and
/// one hour (`--source-timeout`).
pub fn parse_duration(text: &str) -> Result<Duration, ConfigError> {
    parse_duration_in(text, MIN_SOURCE_TIMEOUT..=MAX_SOURCE_TIMEOUT)
}

/// Like `parse_duration`, within `range`.
pub fn parse_duration_in(
    text: &str,
    range: std::ops::RangeInclusive<Duration>,
) -> Result<Duration, ConfigError> {
    let bad = || {
        ConfigError::Invalid(format!(
            "invalid duration {text:?}: use seconds (30, 1.5), or a number with ms, s or m, \
             between {:?} and {:?}",
            range.start(),
            range.end()
        ))
    };
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let seconds = number.trim().parse::<f64>().map_err(|_| bad())? * scale;
    let duration = Duration::try_from_secs_f64(seconds).map_err(|_| bad())?;
    if !range.contains(&duration) {
        return Err(bad());
    }
    Ok(duration)
}

/// The cluster tier's configuration from `--cluster URLS` (each a comma-separated list; the flag
/// may repeat) and its companions; `None` without `--cluster`. The dataset id defaults to the source's path (the same on nodes that mount one
/// shared store at one path). The credentials file is checked now, so a bad one is one line at
/// mount time.
pub fn parse_cluster(
    urls: &[String],
    auth: Option<PathBuf>,
    timeout: &str,
    dataset: Option<String>,
    keep_hits: &str,
    source: &Path,
) -> Result<Option<crate::cache::ClusterConfig>, ConfigError> {
    if urls.is_empty() {
        return Ok(None);
    }
    let urls: Vec<String> = urls
        .iter()
        .flat_map(|list| list.split(','))
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .collect();
    if urls.is_empty() {
        return Err(ConfigError::Invalid(
            "--cluster: give one or more nodes, e.g. redis://node1:7000,redis://node2:7000".into(),
        ));
    }
    if let Some(bad) = urls
        .iter()
        .find(|u| !u.starts_with("redis://") && !u.starts_with("rediss://"))
    {
        return Err(ConfigError::Invalid(format!(
            "--cluster {bad:?}: a node is redis://HOST:PORT (or rediss:// for TLS)"
        )));
    }
    if urls.iter().any(|u| u.contains('@')) {
        return Err(ConfigError::Invalid(
            "--cluster: no credentials in the address (they would show in the process list); \
             put them in a file and give --cluster-auth FILE"
                .into(),
        ));
    }
    if let Some(path) = &auth {
        crate::cache::cluster::Credentials::read(path).map_err(ConfigError::Invalid)?;
    }
    let timeout = parse_duration_in(timeout, crate::cache::cluster::TIMEOUT_RANGE)
        .map_err(|e| ConfigError::Invalid(format!("--cluster-timeout: {e}")))?;
    let dataset = dataset.unwrap_or_else(|| source.to_string_lossy().into_owned());
    if dataset.is_empty() {
        return Err(ConfigError::Invalid("--cluster-dataset: empty".into()));
    }
    Ok(Some(crate::cache::ClusterConfig {
        urls,
        auth,
        timeout,
        dataset,
        keep_hits: parse_on_off("--cluster-keep-hits", keep_hits)?,
    }))
}

/// Parses `8G`, `512M`, `1.5G`, `4096`, `64KiB` (binary multiples).
pub fn parse_size(text: &str) -> Result<u64, ConfigError> {
    let bad = || ConfigError::BadSize(text.to_owned());
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| bad())?;
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Canonical source directory, or why it cannot be used.
pub fn check_source(path: &Path) -> Result<PathBuf, ConfigError> {
    let fail = |why: String| ConfigError::Source {
        path: path.to_owned(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_dir() {
        return Err(fail("not a directory".into()));
    }
    std::fs::read_dir(path).map_err(|e| fail(format!("cannot be listed: {e}")))?;
    path.canonicalize().map_err(|e| fail(e.to_string()))
}

/// Canonical mountpoint, or why it cannot be used: an empty directory that is not already a
/// mount point and that the source (`source`, canonical) does not reach.
pub fn check_mountpoint(path: &Path, source: &Path) -> Result<PathBuf, ConfigError> {
    let fail = |why: String| ConfigError::Mountpoint {
        path: path.to_owned(),
        why,
    };
    let dead =
        || fail("a dead FUSE mount is still attached here; run `prepfs umount` on it first".into());
    let io = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ENOTCONN) => dead(),
        _ => fail(e.to_string()),
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_dir() {
        return Err(fail("not a directory".into()));
    }
    let canonical = path.canonicalize().map_err(io)?;
    let mounts = crate::mountinfo::mounts();
    if canonical == source {
        return Err(fail("is the source directory; mount elsewhere".into()));
    }
    if within_source(&canonical, source, &mounts) {
        return Err(fail(format!(
            "is inside the source {} (the daemon would read its own mount and hang); mount outside it",
            source.display()
        )));
    }
    if mounts.iter().any(|m| m.point == canonical) {
        // A dead FUSE mount's root can still stat from attributes the kernel cached; statfs
        // always asks the daemon.
        if rustix::fs::statfs(&canonical).is_err_and(|e| e == rustix::io::Errno::NOTCONN) {
            return Err(dead());
        }
        return Err(fail("already a mount point".into()));
    }
    let mut entries = std::fs::read_dir(&canonical).map_err(io)?;
    if entries.next().is_some() {
        return Err(fail("not empty".into()));
    }
    Ok(canonical)
}

/// Where a directory lives: its filesystem's device and its path from that filesystem's root.
#[derive(Debug, PartialEq)]
struct Place<'a> {
    device: &'a str,
    path: PathBuf,
}

/// The place of `path` (canonical): below the topmost of the mounts nearest to it.
fn place<'a>(path: &Path, mounts: &'a [Mount]) -> Option<Place<'a>> {
    let holder = mounts
        .iter()
        .filter(|m| path.starts_with(&m.point))
        .max_by_key(|m| m.point.components().count())?;
    let below = path.strip_prefix(&holder.point).ok()?;
    Some(Place {
        device: &holder.device,
        path: holder.root.join(below),
    })
}

/// Whether `mountpoint` lies in the tree the source serves: beneath the source by path, or the
/// same directories reached another way (a bind mount of the source or of a directory in it,
/// or a filesystem mounted inside the source, which source access crosses). A FUSE mount there
/// would make the daemon's own source reads come back to the mount: a thread waiting on itself
/// hangs every reader for good.
fn within_source(mountpoint: &Path, source: &Path, mounts: &[Mount]) -> bool {
    if mountpoint.starts_with(source) {
        return true;
    }
    let Some(target) = place(mountpoint, mounts) else {
        return false;
    };
    let inner = mounts
        .iter()
        .filter(|m| m.point.starts_with(source))
        .map(|m| Place {
            device: &m.device,
            path: m.root.clone(),
        });
    place(source, mounts)
        .into_iter()
        .chain(inner)
        .any(|reached| reached.device == target.device && target.path.starts_with(&reached.path))
}

/// Checks that the FUSE device exists and that this user can use it (directly or via
/// fusermount3).
pub fn check_fuse_device() -> Result<(), ConfigError> {
    if !Path::new("/dev/fuse").exists() {
        return Err(ConfigError::Fuse("/dev/fuse does not exist: load the fuse module (modprobe fuse) or run where FUSE is available".into()));
    }
    if rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let has_fusermount = std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p)
            .any(|d| d.join("fusermount3").exists() || d.join("fusermount").exists())
    });
    if !has_fusermount {
        return Err(ConfigError::Fuse("mounting as a normal user needs fusermount3 (Debian/Ubuntu: apt install fuse3), or run as root".into()));
    }
    // fuser opens /dev/fuse itself before it falls back to fusermount3, so the device must be
    // usable by everyone, as the fuse3 package's udev rule makes it (mode 0666).
    if rustix::fs::access(
        "/dev/fuse",
        rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
    )
    .is_err()
    {
        return Err(ConfigError::Fuse("/dev/fuse is not accessible to this user: give it mode 0666 as the fuse3 udev rule does (chmod 0666 /dev/fuse), or run as root".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_options_are_checked() {
        let default = parse_gpu("auto", None, None, None).expect("valid");
        assert_eq!(default.memory, DEFAULT_GPU_MEMORY);
        assert_eq!(
            parse_gpu("on", Some("2G"), None, None)
                .expect("valid")
                .memory,
            2 << 30
        );
        for (mode, mem, needle) in [
            ("sometimes", None, "expected auto, on or off"),
            ("auto", Some("1M"), "at least 64M"),
            ("auto", Some("lots"), "invalid size"),
        ] {
            let e = parse_gpu(mode, mem, None, None)
                .expect_err(mode)
                .to_string();
            assert!(e.contains(needle), "{e}");
        }
        let missing = parse_gpu("auto", None, Some("/nonexistent/libnvjpeg.so".into()), None)
            .expect_err("missing")
            .to_string();
        assert!(missing.contains("--nvjpeg"), "{missing}");
    }

    #[test]
    fn durations_parse_with_units_and_bounds() {
        use std::time::Duration;
        assert_eq!(parse_duration("30").ok(), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("2s").ok(), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_duration("500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("2m").ok(), Some(Duration::from_secs(120)));
        for bad in ["", "0", "10ms", "2h", "-1", "fast", "61m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert_eq!(parse_size("8G").ok(), Some(8 << 30));
        assert_eq!(parse_size("512m").ok(), Some(512 << 20));
        assert_eq!(parse_size("64KiB").ok(), Some(64 << 10));
        assert_eq!(parse_size("1.5G").ok(), Some(3 << 29));
        for bad in ["", "G", "12X", "-1G", "1..2G", "8 GB extra"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    /// `/` on 8:1 holds /data (the source); /alias shows /data/sub again (a bind mount);
    /// /disk2 is another disk, shown inside the source at /data/shards too; /scratch is a third.
    const MOUNTINFO: &str = "\
27 1 8:1 / / rw - ext4 /dev/sda1 rw
40 27 8:1 /data/sub /alias rw - ext4 /dev/sda1 rw
41 27 8:17 / /disk2 rw - ext4 /dev/sdb1 rw
42 27 8:17 /shards /data/shards rw - ext4 /dev/sdb1 rw
43 27 0:50 / /scratch rw - tmpfs tmpfs rw
44 27 0:51 / /data/with\\040space rw - tmpfs tmpfs rw
";

    #[test]
    fn a_mountpoint_the_source_reaches_by_any_way_is_inside_it() {
        let mounts = crate::mountinfo::parse(MOUNTINFO);
        let source = Path::new("/data");
        for (mountpoint, inside) in [
            ("/data", true),
            ("/data/sub/mnt", true),
            ("/data/with space/mnt", true),
            ("/alias/mnt", true),
            ("/alias", true),
            ("/disk2/shards/x/mnt", true),
            ("/disk2/other/mnt", false),
            ("/scratch/mnt", false),
            ("/database/mnt", false),
            ("/mnt", false),
        ] {
            assert_eq!(
                within_source(Path::new(mountpoint), source, &mounts),
                inside,
                "{mountpoint}"
            );
        }
        assert!(
            within_source(Path::new("/anything"), Path::new("/"), &mounts),
            "a source at / reaches everything"
        );
    }
}
