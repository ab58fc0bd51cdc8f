//! The command line: clap types and their conversion into configuration.
//!
//! Owns: subcommands `mount`, `umount`, `stats`, `top`, `warm`, `demo`, their flags and help,
//! spelling out `-o` lists and `--config` files as flags, logging set-up and the exit code. The
//! only module that knows clap. Must never hold logic beyond parsing and dispatch: each
//! subcommand calls one function elsewhere.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::cache::{CacheConfig, DiskConfig};
use crate::config::{self, MountConfig};
use crate::fuse::FuseConfig;
use crate::memory::limits;
use crate::options;
use crate::prefetch::{self, PrefetchConfig};
use crate::run::{self, RunError};
use crate::scheduler::state::RewardWeights;
use crate::scheduler::{
    self,
    runtime::{Mode, SchedulerOptions},
};
use crate::stats::Shown;
use crate::stats::live::{self, Watch};
use crate::view::ViewsConfig;
use crate::warm::WarmRequest;

/// prepfs: a read-only FUSE mount for training data, with a never-evict cache.
#[derive(Debug, Parser)]
// A flag given twice (in a config file, then on the command line) takes its last value.
#[command(name = "prepfs", version, about, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Mount SOURCE read-only at MOUNTPOINT, served from a never-evict RAM (and disk) cache.
    Mount(Box<MountArgs>),
    /// Unmount a prepfs mount (the daemon then exits cleanly).
    Umount {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Detach now even if busy; the mount disappears once no process uses it.
        #[arg(long, short = 'l')]
        lazy: bool,
    },
    /// Print a summary of a mount's statistics (every field with --all, raw JSON with --json).
    Stats {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Print every field of stats.json, one `dotted.key  value` line each.
        #[arg(long, conflicts_with = "json")]
        all: bool,
        /// Print stats.json as is.
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// Print the summary (or, with --all, every field) again every --interval seconds
        /// (redrawn in place on a terminal).
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Show a mount's throughput, hit rate, stall, cache fill, prefetch and epochs live.
    Top {
        /// The mountpoint.
        mountpoint: PathBuf,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Read files through a mount into its cache before training, with a progress bar.
    Warm {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Files or directories in the mount (relative to its root, or absolute under it; a view
        /// path stands for its source file). None and no --from-list: the whole mount.
        paths: Vec<PathBuf>,
        /// Also warm the paths listed in FILE, one per line (`-`: standard input), in order.
        #[arg(long, value_name = "FILE")]
        from_list: Option<PathBuf>,
        /// Files read at once.
        #[arg(long, default_value_t = 4, value_name = "N")]
        jobs: usize,
    },
    /// The scheduler's policy: measure this machine, train in the simulator, inspect a file.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Why prepfs: epochs on slow storage against the page cache with the same memory, and a
    /// tensor view against decoding in the loader, in a one-screen summary; then cleans up.
    Demo {
        /// Number of distinct images to generate.
        #[arg(long, default_value_t = 300)]
        files: usize,
        /// Memory of the slow-storage comparison (reader and cache together), in MiB; its
        /// dataset is twice as large (copies of the images).
        #[arg(long, default_value_t = 160, value_name = "MIB")]
        memory: u64,
        /// Also print the mount's full stats.
        #[arg(long)]
        stats: bool,
        /// Internal: read the files listed on stdin under DIR, one line out per file (the
        /// demo's reader process, inside its cgroup).
        #[arg(long, hide = true, value_name = "DIR")]
        read_listed: Option<PathBuf>,
    },
}

/// `prepfs policy ...`.
#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Measure decode, augmentation and codec costs (and a dataset's read speed) for the
    /// simulator; writes a calibration file.
    Calibrate {
        /// A dataset directory: its JPEGs are measured and its files read for the source speed
        /// (default: synthetic photos and the built-in source figures).
        #[arg(long, value_name = "DIR")]
        dataset: Option<PathBuf>,
        /// Where to write the calibration.
        #[arg(long, value_name = "FILE", default_value = "calibration.json")]
        out: PathBuf,
    },
    /// Train a policy with PPO in the simulator (randomised machines and loads around the
    /// calibration); writes the policy file and its learning curve (.curve.csv, .curve.svg).
    Train {
        /// Calibration file from `prepfs policy calibrate` (default: built-in figures).
        #[arg(long, value_name = "FILE")]
        calibration: Option<PathBuf>,
        /// PPO updates (512 simulated decisions each).
        #[arg(long, value_name = "N", default_value_t = 1000)]
        updates: usize,
        /// Seed of the simulator and the network: the same seed gives the same policy.
        #[arg(long, value_name = "N", default_value_t = 0)]
        seed: u64,
        /// Policy file to write (use it with `prepfs mount --policy FILE`).
        #[arg(long, value_name = "FILE", default_value = "policy.json")]
        out: PathBuf,
    },
    /// Check a policy file (default: the shipped policy) and print how it was trained.
    Show {
        /// The policy file.
        file: Option<PathBuf>,
    },
}

/// How often and how long a live view updates.
#[derive(Debug, Args)]
struct LiveArgs {
    /// Seconds between updates.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    interval: f64,
    /// Stop after N updates (default: until interrupted).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
}

impl LiveArgs {
    fn watch(&self) -> Result<Watch, RunError> {
        if !(self.interval.is_finite() && self.interval >= 0.1 && self.interval <= 86_400.0) {
            return Err(RunError::Other(format!(
                "--interval must be between 0.1 and 86400 seconds, not {}",
                self.interval
            )));
        }
        Ok(Watch {
            interval: std::time::Duration::from_secs_f64(self.interval),
            count: self.count,
        })
    }
}

/// Options of `prepfs mount`.
#[derive(Debug, Args)]
struct MountArgs {
    /// Dataset directory.
    source: PathBuf,
    /// Empty directory where the mount appears.
    mountpoint: PathBuf,
    /// Hard memory budget of everything the mount holds for data (cache, prefetch staging,
    /// reads and renders in flight), e.g. 8G (default: half of the memory available now, within
    /// the cgroup's limit, less 64M of headroom).
    #[arg(long, value_name = "SIZE")]
    cache_mem: Option<String>,
    /// Stay in the foreground (logs to stderr) instead of returning once ready.
    #[arg(long, short = 'f')]
    foreground: bool,
    /// Never use kernel passthrough (every read goes through the daemon).
    #[arg(long)]
    no_passthrough: bool,
    /// Threads receiving FUSE requests (default: one per core, at least 2).
    #[arg(long, value_name = "N")]
    fuse_threads: Option<usize>,
    /// Threads serving requests that may wait on the source (lookups, opens, cache misses).
    #[arg(long, value_name = "N", default_value_t = crate::fuse::DEFAULT_IO_THREADS)]
    io_threads: usize,
    /// Longest a request may wait on the source before it is answered EIO, e.g. 30s, 500ms
    /// (a hung network filesystem then fails the calls that touch it instead of hanging them).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    source_timeout: String,
    /// Threads rendering view files (default: one per core).
    #[arg(long, value_name = "N")]
    render_threads: Option<usize>,
    /// Keep no restart-marked copies of view images (for data read once: a copy costs about a
    /// decode in a file's first render and saves about a quarter of each later one's).
    #[arg(long)]
    no_view_copies: bool,
    /// Share renders between training jobs reading a view at once (the k-th open of a file by
    /// each job gets the same tensor, rendered once): on, off (every job renders its own).
    #[arg(long, value_name = "MODE", default_value = "on")]
    share_renders: String,
    /// Let other users read the mount (off by default; needs user_allow_other for non-root).
    #[arg(long)]
    allow_other: bool,
    /// Append the daemon's log to this file (default: discarded unless --foreground).
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    /// A tensor view under .prepfs/views/NAME, e.g.
    /// train='decode,random_resized_crop(224),hflip,normalize(imagenet)' (repeatable).
    #[arg(long = "view", value_name = "NAME=PIPELINE")]
    views: Vec<String>,
    /// Seed of the views' random augmentation (each open of a file draws anew from it).
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// Codec of cached data: auto (chosen from CPU load and source speed), none, lz4, zstd
    /// or zstd-N (1..19).
    #[arg(long, value_name = "CODEC", default_value = "auto")]
    codec: String,
    /// Keep view images' decoded pixels in the cache, so later renders skip fetch and decode:
    /// auto (when decoding costs more than fetching the pixels' size from the source), on, off.
    #[arg(long, value_name = "MODE", default_value = "auto")]
    decoded_cache: String,
    /// Never fetch ahead of the readers (epochs are still tracked and shown).
    #[arg(long)]
    no_prefetch: bool,
    /// Threads fetching files ahead of the readers.
    #[arg(long, value_name = "N", default_value_t = prefetch::DEFAULT_THREADS)]
    prefetch_threads: usize,
    /// Staging buffer for prefetched data the cache has no room for, e.g. 64M (part of
    /// --cache-mem, at most half of it; 0: prefetch only into the cache). Default 64M, at most an
    /// eighth of --cache-mem.
    #[arg(long, value_name = "SIZE")]
    prefetch_buffer: Option<String>,
    /// A file outside the mount where a sampler writes the upcoming paths, one per line
    /// (relative to the mount or absolute under it); prefetch follows it while it is right.
    #[arg(long, value_name = "FILE")]
    order_file: Option<PathBuf>,
    /// Directory of the persistent disk tier: a new or empty one (prepfs marks it as its own)
    /// or one prepfs made; anything else is refused untouched. One mount at a time.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Disk tier budget, e.g. 100G (default: half of the free space in --cache-dir).
    #[arg(long, value_name = "SIZE", requires = "cache_dir")]
    cache_disk: Option<String>,
    /// Share of the cache dir's filesystem kept free, in percent; admission stops below it.
    #[arg(
        long,
        value_name = "PCT",
        default_value_t = 5.0,
        requires = "cache_dir"
    )]
    disk_min_free: f64,
    /// Share the cache with the other nodes of a job through a Redis Cluster: one or more of its
    /// nodes, comma-separated (redis://HOST:PORT, rediss:// for TLS). Each block lives on one
    /// node of the cluster, so N nodes read the source once between them; the cluster is best
    /// effort (a node down, slow or full costs misses, never a failed read). See
    /// docs/CONFIGURATION.md for starting one. Repeatable (`-o cluster=A,cluster=B`, or a list
    /// in a config file).
    #[arg(long, value_name = "URLS")]
    cluster: Vec<String>,
    /// File with the cluster's password (one line), or its ACL user and password (two lines);
    /// mode 0600. Never put credentials on the command line.
    #[arg(long, value_name = "FILE", requires = "cluster")]
    cluster_auth: Option<PathBuf>,
    /// Longest wait for a cluster lookup before reading the source instead, e.g. 50ms.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "50ms",
        requires = "cluster"
    )]
    cluster_timeout: String,
    /// What names this dataset in the cluster; every node that shares it must give the same
    /// (default: the source's path, the same where nodes mount one store at one path).
    #[arg(long, value_name = "ID", requires = "cluster")]
    cluster_dataset: Option<String>,
    /// Whether this node's RAM tier keeps a copy of the blocks the cluster hands it (on: later
    /// reads of them are local; off: the RAM tier keeps only what this node read from the
    /// source, and the rest of its room for other data).
    #[arg(long, value_name = "MODE", default_value = "on", requires = "cluster")]
    cluster_keep_hits: String,
    /// Who sets the pipeline's knobs (codec, prefetch depth, decode workers, decoded caching):
    /// heuristic (each module's own rule), policy (the learned PPO policy), random (stress).
    #[arg(long, value_name = "MODE", default_value = "heuristic")]
    scheduler: String,
    /// A policy file (from `prepfs policy train`) instead of the shipped one.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Keep training the policy while mounted (small learning rate).
    #[arg(long)]
    learn: bool,
    /// With --learn: write the tuned policy here at unmount.
    #[arg(long, value_name = "FILE", requires = "learn")]
    save_policy: Option<PathBuf>,
    /// With --scheduler policy: hand the knobs to the heuristics while the policy's recent
    /// reward trails theirs (on), or let the policy act whatever it earns (off).
    #[arg(long, value_name = "MODE", default_value = "on")]
    policy_guard: String,
    /// Reward weight per millisecond of median load latency.
    #[arg(long, value_name = "W", default_value_t = RewardWeights::default().alpha)]
    reward_alpha: f64,
    /// Reward weight of CPU-GPU imbalance |u_gpu - u_cpu| (with a GPU).
    #[arg(long, value_name = "W", default_value_t = RewardWeights::default().beta)]
    reward_beta: f64,
    /// Reward penalty per unit of stall (seconds readers waited per second).
    #[arg(long, value_name = "W", default_value_t = RewardWeights::default().stall)]
    stall_penalty: f64,
    /// Views on the GPU: auto (where a usable GPU exists, placed per batch by the scheduler),
    /// on (every render the GPU can do), off. Needs a build with `--features cuda`.
    #[arg(long, value_name = "MODE", default_value = "auto")]
    gpu: String,
    /// Hard cap on the GPU memory prepfs allocates, e.g. 1G (training owns the rest).
    #[arg(long, value_name = "SIZE")]
    gpu_mem: Option<String>,
    /// nvJPEG library (file or directory) to try first; see docs/CONFIGURATION.md for the
    /// search order.
    #[arg(long, value_name = "PATH")]
    nvjpeg: Option<PathBuf>,
    /// NVRTC library (file or directory) to try first, for compiling the GPU kernel.
    #[arg(long, value_name = "PATH")]
    nvrtc: Option<PathBuf>,
    /// Read options from a TOML file first (`cache_mem = "8G"`; flags on the command line and
    /// in -o override it).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Options as mount(8) and fstab spell them: -o cache_mem=8G,allow_other,config=FILE.
    #[arg(short = 'o', value_name = "OPT[=VALUE],...")]
    mount_options: Vec<String>,
    /// Internal: this process is the daemon started by `prepfs mount`.
    #[arg(long, hide = true)]
    daemon_child: bool,
}

/// Parses the command line, runs it, and maps failure to one line on stderr and exit code 1.
pub fn main() -> ExitCode {
    let args = match expand(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("prepfs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(args);
    // A mount logs its lifecycle at INFO; one-shot commands only warn.
    let mount = matches!(cli.command, Command::Mount(_));
    init_logging(if mount {
        "warn,prepfs=info,fuser=error"
    } else {
        "warn,fuser=error"
    });
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::Interrupted) => ExitCode::from(130),
        Err(e) => {
            eprintln!("prepfs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `prepfs warm`: the report on stdout; failure when a file could not be read.
fn warm(request: &WarmRequest) -> Result<(), RunError> {
    let report = crate::warm::warm(request).map_err(RunError::Other)?;
    for line in report.lines() {
        println!("{line}");
    }
    if report.interrupted {
        Err(RunError::Interrupted)
    } else if !report.failed.is_empty() {
        Err(RunError::Other(format!(
            "{} files could not be read",
            report.failed.len()
        )))
    } else {
        Ok(())
    }
}

/// The command line with the mount helper's form (`prepfs SOURCE MOUNTPOINT -o OPTIONS`, as
/// `mount -t fuse.prepfs` runs it through fuse3's mount.fuse3) made `prepfs mount ...`, and a
/// mount's `-o` lists and `--config` files spelled out as the flags they mean (see
/// `options::spell_out`; the known names are `mount`'s long flags).
fn expand(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let command = <Cli as clap::CommandFactory>::command();
    let mut args = args.into_iter();
    let program = args.next().unwrap_or_else(|| "prepfs".into());
    let mut rest: Vec<OsString> = args.collect();
    if let Some(first) = rest.first().and_then(|a| a.to_str())
        && !first.starts_with('-')
        && first != "help"
        && command.find_subcommand(first).is_none()
    {
        rest.insert(0, "mount".into());
    }
    let Some(mount) = command
        .find_subcommand("mount")
        .filter(|_| rest.first().is_some_and(|a| a == "mount"))
    else {
        return Ok(std::iter::once(program).chain(rest).collect());
    };
    let known: Vec<&str> = mount
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .collect();
    let words = options::spell_out(rest.into_iter().skip(1), &known)?;
    Ok([program, "mount".into()].into_iter().chain(words).collect())
}

/// `path` made absolute against the current directory (as given if that fails).
fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: the daemon's stderr becomes its log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

fn dispatch(command: Command) -> Result<(), RunError> {
    match command {
        Command::Mount(args) => {
            let MountArgs {
                source,
                mountpoint,
                cache_mem,
                foreground,
                no_passthrough,
                fuse_threads,
                io_threads,
                source_timeout,
                render_threads,
                no_view_copies,
                share_renders,
                allow_other,
                log_file,
                views,
                seed,
                codec,
                decoded_cache,
                no_prefetch,
                prefetch_threads,
                prefetch_buffer,
                order_file,
                cache_dir,
                cache_disk,
                disk_min_free,
                cluster,
                cluster_auth,
                cluster_timeout,
                cluster_dataset,
                cluster_keep_hits,
                scheduler,
                policy,
                learn,
                save_policy,
                policy_guard,
                reward_alpha,
                reward_beta,
                stall_penalty,
                gpu,
                gpu_mem,
                nvjpeg,
                nvrtc,
                daemon_child,
                // Spelled out as flags by `expand` before parsing.
                config: _,
                mount_options: _,
            } = *args;
            let decoded = config::parse_decoded_caching(&decoded_cache)?;
            let views = config::parse_views(&views)?;
            let codec = config::parse_codec(&codec)?;
            let cache_disk = cache_disk.map(|s| config::parse_size(&s)).transpose()?;
            let disk_min_free = config::check_percent(disk_min_free)?;
            let cache_mem = cache_mem.map(|s| config::parse_size(&s)).transpose()?;
            let prefetch_buffer = prefetch_buffer
                .map(|s| config::parse_size(&s))
                .transpose()?;
            let source_timeout = config::parse_duration(&source_timeout)?;
            let scheduler = SchedulerOptions {
                mode: Mode::parse(&scheduler).ok_or_else(|| {
                    RunError::Other(format!(
                        "--scheduler {scheduler}: expected policy, heuristic or random"
                    ))
                })?,
                policy: policy.map(absolute),
                learn,
                save: save_policy.map(absolute),
                guard: config::parse_on_off("--policy-guard", &policy_guard)?,
                reward: config::check_reward(reward_alpha, reward_beta, stall_penalty)?,
                seed,
            };
            scheduler.validate().map_err(RunError::Other)?;
            let gpu = config::parse_gpu(&gpu, gpu_mem.as_deref(), nvjpeg, nvrtc)?;
            let mut cfg = MountConfig::new(source, mountpoint);
            cfg.foreground = foreground;
            cfg.log_file = log_file.map(absolute);
            cfg.fuse = FuseConfig {
                threads: fuse_threads.map_or(cfg.fuse.threads, |n| n.max(1)),
                io_threads: io_threads.max(1),
                source_timeout,
                passthrough: !no_passthrough && rustix::process::geteuid().is_root(),
                allow_other,
            };
            cfg.cache = CacheConfig {
                budget: cache_mem.unwrap_or_else(|| {
                    limits::default_budget(limits::host(), limits::cgroup().as_ref())
                }),
                codec,
                decoded,
                disk: cache_dir.map(|dir| DiskConfig {
                    dir: absolute(dir),
                    budget: cache_disk,
                    min_free: disk_min_free,
                }),
                cluster: None,
            };
            cfg.prefetch = PrefetchConfig {
                enabled: !no_prefetch,
                threads: prefetch_threads.max(1),
                buffer: prefetch_buffer,
                order_file: order_file.map(absolute),
            };
            cfg.views = ViewsConfig {
                specs: views,
                seed,
                render_threads: render_threads.map_or(cfg.views.render_threads, |n| n.max(1)),
                copies: !no_view_copies,
                share: config::parse_on_off("--share-renders", &share_renders)?,
                gpu,
            };
            cfg.scheduler = Some(scheduler);
            // Said once, by the command the user ran (the daemon child runs this too).
            for warning in cfg.validate()?.iter().filter(|_| !daemon_child) {
                eprintln!("prepfs: warning: {warning}");
            }
            config::check_fuse_device()?;
            cfg.source = config::check_source(&cfg.source)?;
            cfg.cache.cluster = config::parse_cluster(
                &cluster,
                cluster_auth.map(absolute),
                &cluster_timeout,
                cluster_dataset,
                &cluster_keep_hits,
                &cfg.source,
            )?;
            cfg.mountpoint = config::check_mountpoint(&cfg.mountpoint, &cfg.source)?;
            run::mount(&cfg, daemon_child)
        }
        Command::Umount { mountpoint, lazy } => run::unmount_path(&mountpoint, lazy),
        Command::Stats {
            mountpoint,
            all,
            json: _,
            watch: true,
            live,
        } => live::watch_table(&mountpoint, live.watch()?, all).map_err(RunError::Other),
        Command::Stats {
            mountpoint,
            all,
            json,
            ..
        } => {
            let shown = match (all, json) {
                (_, true) => Shown::Json,
                (true, false) => Shown::All,
                (false, false) => Shown::Summary,
            };
            crate::stats::print(&mountpoint, shown).map_err(RunError::Other)
        }
        Command::Top { mountpoint, live } => {
            live::top(&mountpoint, live.watch()?).map_err(RunError::Other)
        }
        Command::Warm {
            mountpoint,
            paths,
            from_list,
            jobs,
        } => warm(&WarmRequest {
            mountpoint,
            paths,
            from_list,
            jobs,
        }),
        Command::Policy(PolicyCommand::Calibrate { dataset, out }) => {
            scheduler::commands::run_calibrate(dataset.as_deref(), &out).map_err(RunError::Other)
        }
        Command::Policy(PolicyCommand::Train {
            calibration,
            updates,
            seed,
            out,
        }) => {
            let command = std::iter::once("prepfs".to_owned())
                .chain(std::env::args().skip(1))
                .collect::<Vec<_>>()
                .join(" ");
            scheduler::commands::run_train(&scheduler::commands::TrainRequest {
                calibration,
                updates: updates.max(1),
                seed,
                out,
                command,
            })
            .map_err(RunError::Other)
        }
        Command::Policy(PolicyCommand::Show { file }) => {
            scheduler::commands::run_show(file.as_deref()).map_err(RunError::Other)
        }
        Command::Demo {
            read_listed: Some(root),
            ..
        } => crate::demo::read_listed(&root).map_err(RunError::Other),
        Command::Demo {
            files,
            memory,
            stats,
            read_listed: None,
        } => crate::demo::run(&crate::demo::DemoOptions {
            files,
            memory: memory << 20,
            full_stats: stats,
        })
        .map_err(RunError::Other),
    }
}
