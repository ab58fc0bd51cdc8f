//! The FUSE adapter: the only module that knows fuser.
//!
//! Owns: translating kernel requests into `fs::Fs` calls and results into replies, the kernel
//! connection settings (1 MiB requests, direct I/O, mmap on direct-I/O files, passthrough), the
//! passthrough backing ids and each inode's I/O mode (`iomode`), counting requests per op, and
//! where each request runs. A request the core says needs no source (`Fs::needs_source`: the
//! control tree, view roots' attributes, opens of view files, every xattr but prepfs's own), cache
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

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

mod forget;
mod iomode;

use crate::error::FsError;
use crate::fs::metrics::Op;
use crate::fs::{Ask, Attr, Fs, Intent, Opened, Serve};
use crate::renders::RENDER_WAIT;
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
    ) -> Adapter {
        Adapter {
            shared: Arc::new(Shared {
                fs,
                passthrough: AtomicBool::new(passthrough),
                modes: IoModes::default(),
            }),
            requests,
            patience,
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

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // mmap (numpy memmap, safetensors) must keep working on direct-I/O files (Linux >= 6.6).
        if config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_err()
        {
            tracing::warn!(
                "kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP: mmap of files through the mount may fail"
            );
        }
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        if self.shared.passthrough.load(Ordering::Relaxed) {
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if !ok {
                tracing::info!(
                    "kernel passthrough unavailable; every read is served by the daemon"
                );
                self.shared.passthrough.store(false, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if !self.fs().needs_source(parent.0, Ask::Lookup(name)) {
            return match self.done(Op::Lookup, self.fs().lookup(parent.0, name)) {
                Ok(a) => reply.entry(&a.valid_for, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(e),
            };
        }
        let name = name.to_owned();
        self.off_thread(
            Op::Lookup,
            self.fs().place(parent.0),
            reply,
            move |fs| fs.lookup(parent.0, &name),
            send_entry,
        );
    }

    // fuser's default `batch_forget` calls this once per inode.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if !self.fs().needs_source(ino.0, Ask::Getattr) {
            return match self.done(Op::Getattr, self.fs().getattr(ino.0)) {
                Ok(a) => reply.attr(&a.valid_for, &file_attr(&a)),
                Err(e) => reply.error(e),
            };
        }
        self.off_thread(
            Op::Getattr,
            self.fs().place(ino.0),
            reply,
            move |fs| fs.getattr(ino.0),
            send_attr,
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        use std::os::unix::ffi::OsStrExt;
        self.off_thread(
            Op::Readlink,
            self.fs().place(ino.0),
            reply,
            move |fs| fs.readlink(ino.0),
            |_, reply, target| {
                if let Some(reply) = reply {
                    reply.data(target.as_bytes());
                }
            },
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let intent = if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            Intent::Write
        } else if flags.0 & libc::O_NOATIME != 0 {
            Intent::Quiet
        } else {
            Intent::Read
        };
        if intent == Intent::Write || !self.fs().needs_source(ino.0, Ask::Open) {
            return match self.done(Op::Open, self.fs().open_by(ino.0, intent, req.pid())) {
                Ok(opened) => send_opened(&self.shared, reply, ino.0, opened),
                Err(e) => reply.error(e),
            };
        }
        // A local source is checked on this thread: a stat there waits on nothing remote.
        if let Some(opened) = self.fs().open_at_once(ino.0, intent) {
            self.fs().metrics().record(Op::Open, false);
            return send_opened(&self.shared, reply, ino.0, opened);
        }
        let send = move |shared: &Shared, reply: Option<ReplyOpen>, opened: Opened| match reply {
            Some(reply) => send_opened(shared, reply, ino.0, opened),
            None => {
                let _ = shared.fs.release(opened.fh);
            }
        };
        let work = move |fs: &Fs| fs.open(ino.0, intent);
        if self.fs().has_cached_version(ino.0) {
            // The cache holds this file whole: if the source does not answer in time, serve the
            // version the last open saw rather than hold the reader up.
            let patience = CACHED_OPEN_PATIENCE.min(self.patience);
            self.off_thread_or(
                Op::Open,
                self.fs().place(ino.0),
                reply,
                patience,
                work,
                send,
                move |shared, reply, why| match shared.fs.open_cached(ino.0) {
                    Ok(opened) => {
                        send_opened(shared, reply, ino.0, opened);
                        true
                    }
                    Err(_) => unanswered(shared, reply, why),
                },
            );
        } else {
            self.off_thread(Op::Open, self.fs().place(ino.0), reply, work, send);
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let started = Instant::now();
        let count = move |fs: &Fs, bytes: &crate::cache::ReadBytes| {
            let metrics = fs.metrics();
            metrics.bytes_served.add(bytes.as_slice().len() as u64);
            metrics.read_latency.record(started.elapsed());
        };
        if let Some(result) = self.fs().read_cached(fh.0, offset, size) {
            return match self.done(Op::Read, result) {
                Ok(bytes) => {
                    count(self.fs(), &bytes);
                    reply.data(bytes.as_slice());
                }
                Err(e) => reply.error(e),
            };
        }
        // A view file's read may first wait for a render turn and memory: not the source.
        let patience = if self.fs().is_view_handle(fh.0) {
            self.patience.saturating_add(RENDER_WAIT)
        } else {
            self.patience
        };
        self.off_thread_or(
            Op::Read,
            self.fs().read_place(fh.0),
            reply,
            patience,
            move |fs| fs.read(fh.0, offset, size),
            move |shared, reply, bytes| {
                if let Some(reply) = reply {
                    count(&shared.fs, &bytes);
                    reply.data(bytes.as_slice());
                }
            },
            unanswered,
        );
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.modes.closed(ino.0, fh.0);
        match self.done(Op::Release, self.fs().release(fh.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || !self.fs().needs_source(ino.0, Ask::Opendir)
        {
            let result = if flags.acc_mode() != OpenAccMode::O_RDONLY {
                Err(FsError::ReadOnly)
            } else {
                self.fs().opendir(ino.0)
            };
            return match self.done(Op::Opendir, result) {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(e),
            };
        }
        self.off_thread(
            Op::Opendir,
            self.fs().place(ino.0),
            reply,
            move |fs| fs.opendir(ino.0),
            |shared, reply, fh| match reply {
                Some(reply) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                None => {
                    let _ = shared.fs.release(fh);
                }
            },
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // A snapshot taken at opendir: no source access.
        let result = self.fs().readdir(fh.0, offset, |next, item| {
            reply.add(INodeNo(item.ino), next, file_type(item.kind), &item.name)
        });
        match self.done(Op::Readdir, result) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        match self.done(Op::Releasedir, self.fs().release(fh.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.off_thread(
            Op::Statfs,
            self.fs().place(crate::inode::ROOT),
            reply,
            |fs| fs.statfs(),
            |_, reply, s| {
                if let Some(reply) = reply {
                    reply.statfs(
                        s.blocks,
                        s.blocks_free,
                        s.blocks_available,
                        s.files,
                        s.files_free,
                        s.block_size,
                        s.name_max,
                        s.block_size,
                    );
                }
            },
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if !self.fs().needs_source(ino.0, Ask::Xattr(name)) {
            return match self.done(Op::Xattr, self.fs().xattr(ino.0, name)) {
                Ok(value) if size == 0 => reply.size(value.len() as u32),
                Ok(value) if value.len() <= size as usize => reply.data(&value),
                Ok(_) => reply.error(Errno::from_i32(libc::ERANGE)),
                Err(e) => reply.error(e),
            };
        }
        let name = name.to_owned();
        self.off_thread(
            Op::Xattr,
            self.fs().place(ino.0),
            reply,
            move |fs| fs.xattr(ino.0, &name),
            move |_, reply, value| match reply {
                Some(reply) if size == 0 => reply.size(value.len() as u32),
                Some(reply) if value.len() <= size as usize => reply.data(&value),
                Some(reply) => reply.error(Errno::from_i32(libc::ERANGE)),
                None => {}
            },
        );
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.fs().metrics().record(Op::Xattr, false);
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if mask.contains(AccessFlags::W_OK) || !self.fs().needs_source(ino.0, Ask::Getattr) {
            let result = if mask.contains(AccessFlags::W_OK) {
                Err(FsError::ReadOnly)
            } else {
                self.fs().getattr(ino.0).map(|_| ())
            };
            return match self.done(Op::Getattr, result) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        self.off_thread(
            Op::Getattr,
            self.fs().place(ino.0),
            reply,
            move |fs| fs.getattr(ino.0),
            |_, reply, _| {
                if let Some(reply) = reply {
                    reply.ok();
                }
            },
        );
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // No file of the mount is a terminal or a device: ENOTTY, as any regular file answers.
        // Python's open() asks every file whether it is a terminal (TCGETS), so this is answered
        // quietly: fuser's default logs a warning per request.
        reply.error(Errno::ENOTTY);
    }

    // Every modification is refused: the mount is read-only (the kernel usually refuses first,
    // because the mount carries MS_RDONLY).

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(self.refuse());
    }
    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse());
    }
    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse());
    }
    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refuse());
    }
    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refuse());
    }
    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse());
    }
    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(self.refuse());
    }
    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(self.refuse());
    }
    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(self.refuse());
    }
    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(self.refuse());
    }
    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(self.refuse());
    }
    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refuse());
    }
    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(self.refuse());
    }
}

impl Adapter {
    fn refuse(&self) -> Errno {
        self.fs().metrics().record(Op::Modify, true);
        Errno::from_i32(FsError::ReadOnly.errno())
    }
}
