//! The kernel's requests, one `fuser::Filesystem` method each: which `Fs` call answers it and
//! whether it runs on the FUSE thread or goes to the request pool (`Adapter::off_thread`), by
//! the rules of the adapter's paragraph (`fuse`). Writes of every kind are refused (read-only).
//! Must never decide file-system semantics (the core does) nor call the source on a FUSE thread,
//! but for `Fs::open_at_once`'s stat of a local filesystem.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::{
    Adapter, CACHED_OPEN_PATIENCE, Shared, file_attr, file_type, send_attr, send_entry,
    send_opened, unanswered,
};
use crate::error::FsError;
use crate::fs::metrics::Op;
use crate::fs::{Ask, Fs, Intent, Opened};
use crate::renders::RENDER_WAIT;

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
        if let Some(ready) = self.ready.take() {
            let _ = ready.try_send(());
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
        let send = move |shared: &Shared, reply: Option<ReplyOpen>, opened: Opened| match reply {
            Some(reply) => send_opened(shared, reply, ino.0, opened),
            None => {
                let _ = shared.fs.release(opened.fh);
            }
        };
        let pid = req.pid();
        if intent == Intent::Write || !self.fs().needs_source(ino.0, Ask::Open) {
            // A view file's open by a process not seen before reads its memory through /proc,
            // which can wait on that process: on the pool (as a view's place, 0).
            if intent != Intent::Write && self.fs().open_looks_up_a_job(ino.0, pid) {
                let work = move |fs: &Fs| fs.open_by(ino.0, intent, pid);
                return self.off_thread(Op::Open, 0, reply, work, send);
            }
            return match self.done(Op::Open, self.fs().open_by(ino.0, intent, pid)) {
                Ok(opened) => send_opened(&self.shared, reply, ino.0, opened),
                Err(e) => reply.error(e),
            };
        }
        // A local source is checked on this thread: a stat there waits on nothing remote.
        if let Some(opened) = self.fs().open_at_once(ino.0, intent) {
            self.fs().metrics().record(Op::Open, false);
            return send_opened(&self.shared, reply, ino.0, opened);
        }
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
