//! The FUSE adapter: the only module that knows fuser.
//!
//! Owns: translating kernel requests into `fs::Fs` calls and results into replies, the kernel
//! connection settings (1 MiB requests, direct I/O, mmap on direct-I/O files, passthrough), the
//! passthrough backing ids and each inode's I/O mode (`iomode`), counting requests per op, and
//! where each request runs (`dispatch`: one method per kernel request; here the adapter, the hop
//! to the request pool and the replies). A request the core says needs no source (`Fs::needs_source`: the
//! control tree, view roots' attributes, opens of view files by processes whose job is known
//! (`Fs::open_looks_up_a_job`: a new one's is read from its memory through /proc, which may wait
//! on that process, so that open goes to the pool), every xattr but prepfs's own), cache
//! hits, listings of an opened directory, releases and forgets are answered on the FUSE thread,
//! and so is the open of a file the cache holds whole when its source is a local filesystem
//! (`Fs::open_at_once`: its stat waits on nothing remote). Everything else (lookups and
//! attributes of dataset and view entries, opens, directory opens, reads that miss, statfs,
//! `user.prepfs.cached`) runs on the `RequestPool` with a deadline (`--source-timeout`): a hung
//! source holds up only the requests that touch it, and each is answered EIO at its deadline at
//! the latest. An open of a file the cache holds whole is answered from the cache if the source
//! does not answer within `CACHED_OPEN_PATIENCE`. Must never hold file-system semantics of its own
//! (every decision is the core's) and never call the source from a FUSE thread, but for
//! `Fs::open_at_once`'s stat of a local filesystem.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyAttr,
    ReplyData, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr,
};

mod dispatch;
mod forget;
mod iomode;

use crate::error::FsError;
use crate::fs::metrics::Op;
use crate::fs::{Attr, Fs, Opened, Serve};
use crate::requests::{self, Expiry, Once, Place, RequestPool};
use crate::source::Kind;
use iomode::{IoModes, Mode, Why};

mod mount;

pub use forget::Forgetter;
pub use fuser::{Config, MountOption, Session, SessionACL};
pub use mount::{Unmount, mount};

/// Requests that may wait on the source run on this many threads by default: enough parallel
/// source reads to keep network or slow storage busy.
pub const DEFAULT_IO_THREADS: usize = 16;
/// Default longest wait on the source: a network filesystem's own retries (NFS retransmits over
/// tens of seconds) fit inside it, and a reader of a dead source gets EIO, not a hang.
pub const DEFAULT_SOURCE_TIMEOUT: Duration = Duration::from_secs(30);

/// The kernel connection's configuration (`--fuse-threads`, `--io-threads`, `--source-timeout`,
/// `--no-passthrough`, `--allow-other`).
#[derive(Debug, Clone, PartialEq)]
pub struct FuseConfig {
    /// Threads receiving kernel requests.
    pub threads: usize,
    /// Threads serving requests that may wait on the source.
    pub io_threads: usize,
    /// Longest a request may wait on the source before it is answered EIO.
    pub source_timeout: Duration,
    /// Offer kernel passthrough for fully cached files (needs root and Linux >= 6.9).
    pub passthrough: bool,
    /// Let other users access the mount.
    pub allow_other: bool,
}

impl Default for FuseConfig {
    fn default() -> FuseConfig {
        FuseConfig {
            // One per core, at least two.
            threads: std::thread::available_parallelism().map_or(2, |n| n.get().max(2)),
            io_threads: DEFAULT_IO_THREADS,
            source_timeout: DEFAULT_SOURCE_TIMEOUT,
            passthrough: rustix::process::geteuid().is_root(),
            allow_other: false,
        }
    }
}

/// How long an open of a file the cache holds whole waits for the source's answer before it is
/// served from the cache as the version seen last: long next to a healthy source's stat
/// (microseconds to milliseconds), short enough that a training job rides out an outage.
const CACHED_OPEN_PATIENCE: Duration = Duration::from_secs(1);

/// What the requests running off the FUSE threads share.
struct Shared {
    fs: Arc<Fs>,
    passthrough: AtomicBool,
    /// How the kernel serves each inode's live opens.
    modes: IoModes<BackingId>,
}

/// The `fuser::Filesystem` over one `Fs`.
pub struct Adapter {
    shared: Arc<Shared>,
    requests: Arc<RequestPool>,
    /// Longest a request may wait on the source before it is answered EIO.
    patience: Duration,
    /// Told once, when the kernel's INIT arrives: from then on the mount answers.
    ready: Option<mpsc::SyncSender<()>>,
}

/// A reply that can carry an error: every kind the pool's requests answer with.
trait Answer: Send + 'static {
    fn fail(self, errno: Errno);
}

macro_rules! answers {
    ($($reply:ty),*) => {$(
        impl Answer for $reply {
            fn fail(self, errno: Errno) {
                self.error(errno);
            }
        }
    )*};
}
answers!(
    ReplyEntry,
    ReplyAttr,
    ReplyData,
    ReplyOpen,
    ReplyStatfs,
    ReplyXattr,
    ReplyEmpty
);

fn errno(e: FsError) -> Errno {
    Errno::from_i32(e.errno())
}

impl Adapter {
    /// Wraps `fs`; requests that may wait on the source run on `requests`, each answered within
    /// `patience`.
    pub fn new(
        fs: Arc<Fs>,
        requests: Arc<RequestPool>,
        passthrough: bool,
        patience: Duration,
        ready: mpsc::SyncSender<()>,
    ) -> Adapter {
        Adapter {
            shared: Arc::new(Shared {
                fs,
                passthrough: AtomicBool::new(passthrough),
                modes: IoModes::default(),
            }),
            requests,
            patience,
            ready: Some(ready),
        }
    }

    fn fs(&self) -> &Fs {
        &self.shared.fs
    }

    fn done<T>(&self, op: Op, result: Result<T, FsError>) -> Result<T, Errno> {
        self.fs().metrics().record(op, result.is_err());
        result.map_err(errno)
    }

    /// Runs `work` on the request pool and answers with `send`, or EIO (counted) if the work
    /// does not finish within the adapter's patience. `send` gets `None` when the deadline
    /// answered first (to undo what the work did, such as a lookup's count).
    fn off_thread<R: Answer, T: Send + 'static>(
        &self,
        op: Op,
        place: Place,
        reply: R,
        work: impl FnOnce(&Fs) -> Result<T, FsError> + Send + 'static,
        send: impl FnOnce(&Shared, Option<R>, T) + Send + 'static,
    ) {
        self.off_thread_or(op, place, reply, self.patience, work, send, unanswered);
    }

    /// Like `off_thread`, with `patience`, and `expired` answering at the deadline (or at once
    /// when the queue is full).
    #[allow(clippy::too_many_arguments)]
    fn off_thread_or<R: Answer, T: Send + 'static>(
        &self,
        op: Op,
        place: Place,
        reply: R,
        patience: Duration,
        work: impl FnOnce(&Fs) -> Result<T, FsError> + Send + 'static,
        send: impl FnOnce(&Shared, Option<R>, T) + Send + 'static,
        expired: impl FnOnce(&Shared, R, Expiry) -> bool + Send + 'static,
    ) {
        let reply = Once::new(reply);
        let (shared, late) = (self.shared.clone(), self.shared.clone());
        let cell = reply.clone();
        let run = move || {
            let result = work(&shared.fs);
            let reply = reply.take();
            if reply.is_some() {
                shared.fs.metrics().record(op, result.is_err());
            }
            match result {
                Ok(value) => send(&shared, reply, value),
                Err(e) => {
                    if let Some(reply) = reply {
                        reply.fail(errno(e));
                    }
                }
            }
        };
        let expire = move |why: Expiry| {
            if let Some(reply) = cell.take() {
                let answered = expired(&late, reply, why);
                late.fs.metrics().record(op, !answered);
            }
        };
        self.requests
            .submit(requests::Request::new(patience, place, run, expire));
    }
}

/// Answers a request its work did not answer in time (or could not start): EIO, counted.
/// Returns false: the request failed.
fn unanswered<R: Answer>(shared: &Shared, reply: R, why: Expiry) -> bool {
    let metrics = shared.fs.metrics();
    match why {
        Expiry::Deadline => metrics.requests_expired.inc(),
        Expiry::Refused => metrics.requests_refused.inc(),
    }
    reply.fail(Errno::EIO);
    false
}

fn system_time(ns: i64) -> SystemTime {
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Directory => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        // Devices, fifos and sockets are listed but cannot be opened through the mount.
        Kind::Other => FileType::NamedPipe,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime_ns),
        mtime: system_time(a.mtime_ns),
        ctime: system_time(a.ctime_ns),
        crtime: system_time(a.ctime_ns),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: a.io_block,
        flags: 0,
    }
}

/// Reads are served whole by the daemon (direct I/O), so no copy lands in the page cache; close
/// needs no FLUSH round trip on a read-only file.
const DAEMON_OPEN: FopenFlags = FopenFlags::FOPEN_DIRECT_IO.union(FopenFlags::FOPEN_NOFLUSH);

/// Answers the open of `ino`: by kernel passthrough to the cached bytes when the core offers it,
/// the kernel takes it and the inode's other live opens allow it (`IoModes`), else served by the
/// daemon.
fn send_opened(shared: &Shared, reply: ReplyOpen, ino: u64, opened: Opened) {
    let cached = match &opened.serve {
        Serve::Passthrough(cached) if shared.passthrough.load(Ordering::Relaxed) => Some(cached),
        _ => None,
    };
    let offer = cached.map(|c| || c.passthrough_backing(|fd| reply.open_backing(fd)));
    let (mode, why, refused) = shared.modes.open(ino, opened.fh, offer);
    if let Some(e) = refused {
        tracing::warn!(error = %e, "passthrough refused by the kernel; serving reads from the daemon");
        shared.passthrough.store(false, Ordering::Relaxed);
    }
    let metrics = shared.fs.metrics();
    match why {
        Why::Own => {}
        Why::Pinned => metrics.passthrough_pinned.inc(),
        Why::BesideDaemon => metrics.passthrough_declined.inc(),
    }
    match mode {
        Mode::Passthrough(backing) => {
            metrics.passthrough_opens.inc();
            if let Some(cached) = cached.filter(|_| why == Why::Own) {
                cached.count_passthrough_open();
            }
            reply.opened_passthrough(FileHandle(opened.fh), FopenFlags::FOPEN_NOFLUSH, &backing);
        }
        Mode::Daemon => reply.opened(FileHandle(opened.fh), DAEMON_OPEN),
    }
}

fn send_entry(shared: &Shared, reply: Option<ReplyEntry>, attr: Attr) {
    match reply {
        Some(reply) => reply.entry(&attr.valid_for, &file_attr(&attr), Generation(0)),
        // The kernel never got this answer: it holds no lookup of the node.
        None => shared.fs.forget(attr.ino, 1),
    }
}

fn send_attr(_: &Shared, reply: Option<ReplyAttr>, attr: Attr) {
    if let Some(reply) = reply {
        reply.attr(&attr.valid_for, &file_attr(&attr));
    }
}

impl Adapter {
    fn refuse(&self) -> Errno {
        self.fs().metrics().record(Op::Modify, true);
        Errno::from_i32(FsError::ReadOnly.errno())
    }
}
