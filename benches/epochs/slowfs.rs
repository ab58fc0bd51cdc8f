//! A slow, network-like filesystem for the prefetch benchmark: a read-only passthrough FUSE mount
//! of a directory whose every open and every read waits a fixed latency, and whose bytes pass one
//! strict bandwidth cap (a shared timeline: no bursts, concurrent requests queue for it). The
//! kernel page cache stays on (kept across opens, 1 MiB readahead), as over NFS. The blkio
//! throttle alone only caps average bandwidth, which a reader that computes between reads already
//! hides; per-request latency is what prefetch must hide.
//!
//! It runs as `epochs --serve-slowfs DIR MNT OPEN_MS READ_MS MBPS` in its own process, which the
//! harness starts and stops like the prepfs daemon. Bench tooling: it uses fuser directly, outside
//! prepfs's adapter, and is never part of prepfs.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, Request, Session,
};

/// How long the kernel may trust names and attributes (the tree does not change in a run).
const TTL: Duration = Duration::from_secs(600);

/// The slowness of the storage.
#[derive(Debug, Clone, Copy)]
pub struct Slowness {
    pub open: Duration,
    pub read: Duration,
    pub bytes_per_s: f64,
    /// No kernel page cache (direct I/O): every read crosses the link, as for the nodes of a
    /// cluster, which share the storage but not a page cache.
    pub direct: bool,
}

struct SlowFs {
    root: PathBuf,
    slowness: Slowness,
    /// Path of inode n at index n - 1 (root first), and the reverse.
    inodes: Mutex<(Vec<PathBuf>, HashMap<PathBuf, u64>)>,
    handles: Mutex<HashMap<u64, std::sync::Arc<File>>>,
    next_fh: AtomicU64,
    /// When the link is next free: transfers queue on it one after the other.
    link_free: Mutex<Instant>,
}

impl SlowFs {
    fn path(&self, ino: INodeNo) -> Option<PathBuf> {
        let inodes = self.inodes.lock().ok()?;
        inodes.0.get((ino.0 as usize).checked_sub(1)?).cloned()
    }

    fn intern(&self, path: PathBuf) -> u64 {
        let Ok(mut inodes) = self.inodes.lock() else {
            return 1;
        };
        if let Some(&ino) = inodes.1.get(&path) {
            return ino;
        }
        inodes.0.push(path.clone());
        let ino = inodes.0.len() as u64;
        inodes.1.insert(path, ino);
        ino
    }

    fn attr(&self, ino: u64, path: &Path) -> Result<FileAttr, Errno> {
        let m = std::fs::symlink_metadata(self.root.join(path))
            .map_err(|e| Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let time = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: SystemTime::UNIX_EPOCH,
            kind: if m.is_dir() {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        })
    }

    /// Waits for `len` bytes to cross the link, after the request latency.
    fn transfer(&self, len: usize) {
        let started = Instant::now();
        let took = Duration::from_secs_f64(len as f64 / self.slowness.bytes_per_s);
        let done = match self.link_free.lock() {
            Ok(mut free) => {
                let start = (*free).max(started + self.slowness.read);
                *free = start + took;
                *free
            }
            Err(_) => started + self.slowness.read + took,
        };
        std::thread::sleep(done.saturating_duration_since(Instant::now()));
    }
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

impl Filesystem for SlowFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(dir) = self.path(parent) else {
            return reply.error(Errno::from_i32(libc::ENOENT));
        };
        let path = dir.join(name);
        let ino = self.intern(path.clone());
        match self.attr(ino, &path) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.path(ino).map(|p| self.attr(ino.0, &p)) {
            Some(Ok(a)) => reply.attr(&TTL, &a),
            Some(Err(e)) => reply.error(e),
            None => reply.error(Errno::from_i32(libc::ENOENT)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        std::thread::sleep(self.slowness.open);
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::from_i32(libc::ENOENT));
        };
        match File::open(self.root.join(path)) {
            Ok(f) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut h) = self.handles.lock() {
                    h.insert(fh, std::sync::Arc::new(f));
                }
                let flags = if self.slowness.direct {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::FOPEN_KEEP_CACHE
                };
                reply.opened(FileHandle(fh), flags);
            }
            Err(e) => reply.error(errno(&e)),
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
        let file = self.handles.lock().ok().and_then(|h| h.get(&fh.0).cloned());
        let Some(file) = file else {
            return reply.error(Errno::from_i32(libc::EBADF));
        };
        let mut buf = vec![0u8; size as usize];
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        self.transfer(done);
        reply.data(&buf[..done]);
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
        if let Ok(mut h) = self.handles.lock() {
            h.remove(&fh.0);
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(dir) = self.path(ino) else {
            return reply.error(Errno::from_i32(libc::ENOENT));
        };
        let entries = match std::fs::read_dir(self.root.join(&dir)) {
            Ok(rd) => rd.filter_map(Result::ok).collect::<Vec<_>>(),
            Err(e) => return reply.error(errno(&e)),
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => FileType::Directory,
                _ => FileType::RegularFile,
            };
            let child = self.intern(dir.join(e.file_name()));
            if reply.add(INodeNo(child), i as u64 + 1, kind, e.file_name()) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }
}

/// Serves `root` at `mountpoint` until unmounted (the harness unmounts it, or kills this).
pub fn serve(root: &Path, mountpoint: &Path, slowness: Slowness) -> Result<(), String> {
    let fs = SlowFs {
        root: root.to_path_buf(),
        slowness,
        inodes: Mutex::new((vec![PathBuf::new()], HashMap::from([(PathBuf::new(), 1)]))),
        handles: Mutex::new(HashMap::new()),
        next_fh: AtomicU64::new(1),
        link_free: Mutex::new(Instant::now()),
    };
    let mut config = Config::default();
    config.mount_options = vec![MountOption::RO, MountOption::FSName("slowfs".into())];
    // Like an NFS client: several requests in flight at once, each waiting its latency.
    config.n_threads = Some(16);
    let session =
        Session::new(fs, mountpoint, &config).map_err(|e| format!("slowfs mount: {e}"))?;
    session.run().map_err(|e| format!("slowfs: {e}"))
}

/// Parses `DIR MNT OPEN_MS READ_MS MBPS [direct]` after `--serve-slowfs`.
pub fn main_from_args(args: &[String]) -> Result<(), String> {
    let (direct, args) = match args {
        [rest @ .., last] if last == "direct" => (true, rest),
        _ => (false, args),
    };
    let [dir, mnt, open_ms, read_ms, mbps] = args else {
        return Err("usage: --serve-slowfs DIR MNT OPEN_MS READ_MS MBPS [direct]".into());
    };
    let number = |s: &str| s.parse::<f64>().map_err(|_| format!("bad number {s}"));
    serve(
        Path::new(dir),
        Path::new(mnt),
        Slowness {
            open: Duration::from_secs_f64(number(open_ms)? / 1e3),
            read: Duration::from_secs_f64(number(read_ms)? / 1e3),
            bytes_per_s: number(mbps)? * 1e6,
            direct,
        },
    )
}
