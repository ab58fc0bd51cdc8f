//! The FUSE adapter: the only module that knows fuser.
//!
//! Owns: translating kernel requests into `fs::Fs` calls and results into replies, the kernel
//! connection settings (1 MiB requests, direct I/O, mmap on direct-I/O files, passthrough), the
//! passthrough backing ids, counting requests per op, and moving cache misses onto `WorkerPool`.
//! Cache hits are answered on the FUSE thread; anything that may wait on the source is not. Must
//! never hold file-system semantics of its own: every decision is the core's.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::error::FsError;
use crate::fs::{Attr, Fs, Intent, Serve};
use crate::source::Kind;
use crate::stats::Op;
use crate::workers::WorkerPool;

pub use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};

/// The `fuser::Filesystem` over one `Fs`.
pub struct Adapter {
    fs: Arc<Fs>,
    workers: WorkerPool,
    passthrough: AtomicBool,
}

impl Adapter {
    /// Wraps `fs`; cache misses run on `workers`.
    pub fn new(fs: Arc<Fs>, workers: WorkerPool, passthrough: bool) -> Adapter {
        Adapter {
            fs,
            workers,
            passthrough: AtomicBool::new(passthrough),
        }
    }

    fn done<T>(&self, op: Op, result: Result<T, FsError>) -> Result<T, Errno> {
        self.fs.metrics().record(op, result.is_err());
        result.map_err(|e| Errno::from_i32(e.errno()))
    }
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
        if self.passthrough.load(Ordering::Relaxed) {
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if !ok {
                tracing::info!(
                    "kernel passthrough unavailable; every read is served by the daemon"
                );
                self.passthrough.store(false, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.done(Op::Lookup, self.fs.lookup(parent.0, name)) {
            Ok(a) => reply.entry(&a.valid_for, &file_attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.done(Op::Getattr, self.fs.getattr(ino.0)) {
            Ok(a) => reply.attr(&a.valid_for, &file_attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        use std::os::unix::ffi::OsStrExt;
        match self.done(Op::Readlink, self.fs.readlink(ino.0)) {
            Ok(target) => reply.data(target.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let intent = if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            Intent::Write
        } else if flags.0 & libc::O_NOATIME != 0 {
            Intent::Quiet
        } else {
            Intent::Read
        };
        let opened = match self.done(Op::Open, self.fs.open(ino.0, intent)) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        if let Serve::Passthrough(cached) = &opened.serve
            && self.passthrough.load(Ordering::Relaxed)
        {
            match cached.passthrough_backing(|fd| reply.open_backing(fd)) {
                Ok(backing) => {
                    self.fs.metrics().passthrough_opens.inc();
                    return reply.opened_passthrough(
                        FileHandle(opened.fh),
                        FopenFlags::FOPEN_NOFLUSH,
                        &backing,
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "passthrough refused by the kernel; serving reads from the daemon");
                    self.passthrough.store(false, Ordering::Relaxed);
                }
            }
        }
        reply.opened(FileHandle(opened.fh), DAEMON_OPEN);
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
        let answer = move |fs: &Fs, result: Result<crate::cache::ReadBytes, FsError>| {
            let metrics = fs.metrics();
            metrics.record(Op::Read, result.is_err());
            match result {
                Ok(bytes) => {
                    metrics.bytes_served.add(bytes.as_slice().len() as u64);
                    reply.data(bytes.as_slice());
                }
                Err(e) => reply.error(Errno::from_i32(e.errno())),
            }
            metrics.read_latency.record(started.elapsed());
        };
        match self.fs.read_cached(fh.0, offset, size) {
            Some(result) => answer(&self.fs, result),
            None => {
                let fs = self.fs.clone();
                self.workers.submit(move || {
                    let result = fs.read(fh.0, offset, size);
                    answer(&fs, result);
                });
            }
        }
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
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        match self.done(Op::Release, self.fs.release(fh.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let result = if flags.acc_mode() != OpenAccMode::O_RDONLY {
            Err(FsError::ReadOnly)
        } else {
            self.fs.opendir(ino.0)
        };
        match self.done(Op::Opendir, result) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.fs.readdir(fh.0, offset, |next, item| {
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
        match self.done(Op::Releasedir, self.fs.release(fh.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.done(Op::Statfs, self.fs.statfs()) {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.done(Op::Xattr, self.fs.xattr(ino.0, name)) {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() <= size as usize => reply.data(&value),
            Ok(_) => reply.error(Errno::from_i32(libc::ERANGE)),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.fs.metrics().record(Op::Xattr, false);
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let result = if mask.contains(AccessFlags::W_OK) {
            Err(FsError::ReadOnly)
        } else {
            self.fs.getattr(ino.0).map(|_| ())
        };
        match self.done(Op::Getattr, result) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
        self.fs.metrics().record(Op::Modify, true);
        Errno::from_i32(FsError::ReadOnly.errno())
    }
}
