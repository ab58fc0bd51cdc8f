//! Mount lifecycle: start, daemonize with readiness, signals, clean unmount.
//!
//! Owns: turning a validated `MountConfig` into a live mount (`Mounted`), the daemon protocol
//! (the parent returns only once the mount answers, or prints the child's error), SIGTERM/SIGINT/
//! SIGHUP handling, and `umount`. Must never leave a mount behind on an error path, and never do
//! work proportional to the dataset or cache size before the mount is ready.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::cache::{CacheDir, DiskOptions, DiskSetup};
use crate::config::{ConfigError, MountConfig};
use crate::fs::Fs;
use crate::fuse::{Adapter, Config, Forgetter, MountOption, SessionACL, Unmount};
use crate::memory::pressure::PressureWatch;
use crate::memory::{Shed, Use};
use crate::source::{LocalSource, Source};

/// Line a daemon child prints on stdout once its mount answers.
const READY_LINE: &str = "prepfs-ready";
/// How long a new mount may take to answer its first request.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A failure of a lifecycle command, printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad user input.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The mount could not be established.
    #[error("cannot mount on {mountpoint}: {why}")]
    Mount {
        /// Where.
        mountpoint: PathBuf,
        /// Why.
        why: String,
    },
    /// Unmounting failed.
    #[error("cannot unmount {mountpoint}: {why}")]
    Unmount {
        /// Where.
        mountpoint: PathBuf,
        /// Why.
        why: String,
    },
    /// The disk tier's directory cannot be used.
    #[error(transparent)]
    CacheDir(#[from] crate::cache::DiskError),
    /// Stopped by SIGINT or SIGTERM before its work was done (exit status 130).
    #[error("interrupted")]
    Interrupted,
    /// Anything else, already phrased for the user.
    #[error("{0}")]
    Other(String),
}

/// A live mount served by background threads.
pub struct Mounted {
    unmounter: Unmounter,
    session: JoinHandle<std::io::Result<()>>,
    fs: Arc<Fs>,
    /// Gives memory back before the kernel's OOM killer would take the daemon.
    _pressure: PressureWatch,
    /// Asks the kernel to forget names when metadata outgrows the budget.
    _forgetter: Arc<Forgetter>,
}

/// Unmounts one mount; cheap to clone, usable from any thread (signal handling).
#[derive(Clone)]
pub struct Unmounter {
    mountpoint: PathBuf,
    inner: Arc<Mutex<Unmount>>,
}

impl Unmounter {
    /// Unmounts; if the mount is busy, detaches it lazily so it disappears once released.
    pub fn unmount(&self) -> Result<(), RunError> {
        match self.inner.lock().unmount() {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::info!(error = %e, "unmount refused; detaching lazily");
                unmount_path(&self.mountpoint, true)
            }
        }
    }
}

impl Mounted {
    /// The mount's core (for in-process callers such as the demo).
    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    /// A handle that unmounts from another thread.
    pub fn unmounter(&self) -> Unmounter {
        self.unmounter.clone()
    }

    /// Waits until the mount is gone (unmounted by anyone) and the session threads have exited.
    pub fn wait(self) -> Result<(), RunError> {
        let result = self
            .session
            .join()
            .map_err(|_| RunError::Other("FUSE session thread panicked".into()))?;
        result.map_err(|e| RunError::Other(format!("FUSE session ended with an error: {e}")))
    }

    /// Unmounts and waits for the session to end.
    pub fn unmount(self) -> Result<(), RunError> {
        self.unmounter.unmount()?;
        self.wait()
    }
}

/// Mounts `cfg` and serves it from background threads; returns once the mount answers.
pub fn start(cfg: &MountConfig) -> Result<Mounted, RunError> {
    cap_malloc_arenas();
    raise_open_file_limit();
    let mount_error = |why: String| RunError::Mount {
        mountpoint: cfg.mountpoint.clone(),
        why,
    };
    let source = LocalSource::open(&cfg.source)
        .map_err(|e| mount_error(format!("source {}: {e}", cfg.source.display())))?;
    let source = Arc::new(source);
    let disk = disk_setup(cfg, source.clone())?;
    let daemon = crate::daemon::build(source, cfg, cfg.memory_plan(), disk)
        .map_err(|e| mount_error(format!("cannot start I/O threads: {e}")))?;
    let (fs, requests) = (Arc::new(daemon.fs), daemon.requests);
    let fuse = &cfg.fuse;
    let (ready, answering) = mpsc::sync_channel(1);
    let adapter = Adapter::new(
        fs.clone(),
        requests,
        fuse.passthrough,
        fuse.source_timeout,
        ready,
    );

    let options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
        MountOption::FSName(format!("prepfs:{}", cfg.source.display())),
        MountOption::Subtype("prepfs".into()),
    ];
    let mut config = Config::default();
    config.mount_options = options;
    // The ACL sets allow_other on the mount when, and only when, the user asked for it.
    config.acl = if fuse.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(fuse.threads.max(1));
    config.clone_fd = true;

    let (session, unmount) = crate::fuse::mount(adapter, &cfg.mountpoint, &config)
        .map_err(|e| mount_error(explain_mount_error(&e)))?;
    let unmounter = Unmounter {
        mountpoint: cfg.mountpoint.clone(),
        inner: Arc::new(Mutex::new(unmount)),
    };
    // Metadata beyond the budget: the kernel is asked to forget dataset files' names.
    let forgetter = Forgetter::start(session.notifier(), Arc::downgrade(&fs)).map_err(|e| {
        let _ = unmounter.unmount();
        mount_error(format!("cannot start the forget thread: {e}"))
    })?;
    fs.memory().add_shed(
        Use::Cache,
        Arc::downgrade(&(forgetter.clone() as Arc<dyn Shed>)),
    );
    let session = std::thread::Builder::new()
        .name("prepfs-session".into())
        .spawn(move || session.run())
        .map_err(|e| {
            // Nothing serves the mount: take it down rather than leave it hanging its readers.
            let _ = unmounter.unmount();
            mount_error(format!("cannot start the session thread: {e}"))
        })?;
    let pressure = PressureWatch::start(fs.memory().clone());
    let mounted = Mounted {
        unmounter,
        session,
        fs,
        _pressure: pressure,
        _forgetter: forgetter,
    };
    if let Err(e) = wait_until_answering(&answering) {
        let _ = mounted.unmount();
        return Err(mount_error(e));
    }
    let plan = mounted.fs.memory().plan();
    tracing::info!(source = %cfg.source.display(), mountpoint = %cfg.mountpoint.display(), cache_mem = cfg.cache.budget, cache = plan.cache, staging = plan.staging, work = plan.work, "mounted");
    Ok(mounted)
}

/// Opens and locks the disk tier's directory, if one was asked for. Its old entries are checked
/// against `source` in the background.
fn disk_setup(cfg: &MountConfig, source: Arc<LocalSource>) -> Result<Option<DiskSetup>, RunError> {
    let Some(disk) = &cfg.cache.disk else {
        return Ok(None);
    };
    let dir = CacheDir::open(&disk.dir)?;
    let budget = disk.budget.unwrap_or_else(|| {
        rustix::fs::fstatvfs(&dir.fd).map_or(0, |s| s.f_bavail.saturating_mul(s.f_frsize) / 2)
    });
    tracing::info!(path = %disk.dir.display(), budget, "disk tier");
    Ok(Some(DiskSetup {
        dir,
        options: DiskOptions {
            budget,
            min_free: disk.min_free,
        },
        validate: Box::new(move |p| source.stat(p).ok().map(|m| m.identity)),
    }))
}

fn explain_mount_error(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            format!("{e} (mounting needs root, or fusermount3 and a mountpoint you own)")
        }
        Some(libc::ENOENT) if !rustix::process::geteuid().is_root() => {
            format!("{e} (is fusermount3 installed? apt install fuse3)")
        }
        _ => e.to_string(),
    }
}

/// Waits for the kernel's INIT to reach the session: from then on the mount answers. The daemon
/// never asks its own mount (a stat there would be a request it must answer itself: killed
/// while it waited, it would hang in the kernel, unkillable, holding the mount).
fn wait_until_answering(answering: &mpsc::Receiver<()>) -> Result<(), String> {
    match answering.recv_timeout(READY_TIMEOUT) {
        Ok(()) => Ok(()),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "the kernel did not start the mount within {READY_TIMEOUT:?}"
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err("the FUSE session ended before the mount started".into())
        }
    }
}

/// `prepfs mount`: daemonizes unless `cfg.foreground`; returns once the mount is ready (daemon)
/// or once it has been unmounted (foreground).
pub fn mount(cfg: &MountConfig, daemon_child: bool) -> Result<(), RunError> {
    if !cfg.foreground && !daemon_child {
        return spawn_daemon();
    }
    // Signals first: a SIGTERM during start-up must still end in a clean unmount.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| RunError::Other(format!("cannot install signal handlers: {e}")))?;
    // Opened before mounting: a log file that cannot be opened is an error, not a dead mount.
    let log = cfg.log_file.as_deref().map(open_log).transpose()?;
    let mounted = start(cfg)?;
    if daemon_child {
        detach_from_parent(log)?;
    } else if let Some(log) = &log {
        // In the foreground too, once mounted, the log goes where the user asked.
        let _ = rustix::stdio::dup2_stderr(log);
    }
    let unmounter = mounted.unmounter();
    let handle = signals.handle();
    let watcher = std::thread::Builder::new()
        .name("prepfs-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                tracing::info!(signal, "signal received; unmounting");
                if let Err(e) = unmounter.unmount() {
                    tracing::error!(error = %e, "unmount on signal failed");
                }
            }
        })
        .map_err(|e| RunError::Other(format!("cannot start the signal thread: {e}")))?;
    let result = mounted.wait();
    handle.close();
    let _ = watcher.join();
    tracing::info!("unmounted; exiting");
    result
}

/// Re-runs this command as a detached child with `--daemon-child`, relays its readiness or its
/// error, and exits accordingly.
fn spawn_daemon() -> Result<(), RunError> {
    let exe = std::env::current_exe()
        .map_err(|e| RunError::Other(format!("cannot find the prepfs binary: {e}")))?;
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .arg("--daemon-child")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| RunError::Other(format!("cannot start the daemon: {e}")))?;
    let mut ready = false;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            if line.map(|l| l.trim() == READY_LINE).unwrap_or(false) {
                ready = true;
                break;
            }
        }
    }
    if ready {
        return Ok(());
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = child.wait();
    let line = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("the daemon exited before the mount was ready");
    Err(RunError::Other(
        line.trim_start_matches("prepfs: ").to_owned(),
    ))
}

/// In the daemon child, once mounted: new session, report readiness, and let go of the parent's
/// pipes (stdout/stderr become the `log` file or /dev/null).
fn detach_from_parent(log: Option<std::fs::File>) -> Result<(), RunError> {
    let _ = rustix::process::setsid();
    println!("{READY_LINE}");
    let sink = match log {
        Some(file) => file,
        None => std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map_err(|e| RunError::Other(format!("cannot open /dev/null: {e}")))?,
    };
    let _ = rustix::stdio::dup2_stdout(&sink);
    let _ = rustix::stdio::dup2_stderr(&sink);
    Ok(())
}

/// The log file, opened for appending.
fn open_log(path: &Path) -> Result<std::fs::File, RunError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| RunError::Other(format!("cannot open the log file {}: {e}", path.display())))
}

/// `prepfs umount`: unmounts `mountpoint` (root: umount2, lazily if busy; users: fusermount3).
pub fn unmount_path(mountpoint: &Path, lazy: bool) -> Result<(), RunError> {
    let fail = |why: String| RunError::Unmount {
        mountpoint: mountpoint.to_owned(),
        why,
    };
    if rustix::process::geteuid().is_root() {
        let flags = if lazy {
            rustix::mount::UnmountFlags::DETACH
        } else {
            rustix::mount::UnmountFlags::empty()
        };
        return match rustix::mount::unmount(mountpoint, flags) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::INVAL) => Err(fail("not a mount point".into())),
            Err(rustix::io::Errno::BUSY) => Err(fail(
                "busy (a process uses it); retry, or use --lazy".into(),
            )),
            Err(e) => Err(fail(e.to_string())),
        };
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg(mountpoint)
        .output()
        .map_err(|e| fail(format!("cannot run fusermount3: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(String::from_utf8_lossy(&out.stderr).trim().to_owned()))
    }
}

/// Arenas glibc's malloc may create. By default each busy thread (FUSE and I/O threads, ~20)
/// gets its own, and each keeps the 1 MiB reply buffers it freed: 19 MB resident was measured
/// with an empty cache, memory the cache budget then cannot use.
const MALLOC_ARENAS: libc::c_int = 2;

/// Raises the soft limit on open files to the hard one, as servers do: prefetch holds
/// descriptors of files opened ahead (a quarter of the limit at most), and the common soft
/// default of 1024 would leave it few. A failure leaves the limit as it was.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!(error = %e, "cannot raise the open-file limit");
        }
    }
}

fn cap_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator tuning; it is called before the mount's threads
    // start, and a failure (0) leaves the default behaviour.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}
