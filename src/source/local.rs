//! `LocalSource`: a local directory tree, every access resolved beneath one root descriptor.
//!
//! Owns: the root directory handle and the syscalls that reach the dataset. Every path is resolved
//! with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS), so neither `..`,
//! an absolute symlink, nor a directory swapped for a link mid-flight can lead outside the root.
//! Mounts inside the root are crossed (no RESOLVE_NO_XDEV), on purpose: a dataset often spans
//! filesystems (shards on another disk, a tmpfs of hot files, a network share), and a mount
//! there, bind mounts included, is placed by someone allowed to mount, who could as well mount
//! over the root itself; the tree served is the one the source path shows. A file's identity
//! carries its device, so equal inode numbers on two filesystems never share cached bytes, and
//! `config` refuses a mountpoint the root reaches through such a mount. `stat_at_once` answers
//! only when the root's filesystem is local (by its statfs type) and the walk crosses no mount
//! (RESOLVE_NO_XDEV), so it never waits on a network or a FUSE daemon. Must never use `std::fs`
//! on a user-influenced path and never follow a symlink.

use std::ffi::{OsStr, OsString};
use std::io;
use std::num::NonZeroU64;
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustix::fs::{Advice, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};

use super::{DirEntries, Identity, Kind, Meta, Source, SourceFile, SpaceStats};

/// openat2 resolution rules for every source path: stay beneath the root, follow no link (mounts
/// inside the root are crossed: see the module doc).
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// The same rules, also refusing (`EXDEV`) to cross any mount: a walk that stays on the root's
/// filesystem never reaches another one, such as a FUSE or network mount inside the tree.
const RESOLVE_ON_ROOT_FS: ResolveFlags = RESOLVE.union(ResolveFlags::NO_XDEV);

/// Filesystem types (statfs `f_type`) whose metadata lives in memory or on a local disk: a stat
/// there cannot wait on a network, a server or a daemon. ext2/3/4, XFS, Btrfs, tmpfs, ramfs,
/// overlayfs, F2FS, ZFS, bcachefs, EROFS, SquashFS. Any other type (NFS, CIFS/SMB, FUSE, Ceph,
/// Lustre, 9p, ...) is treated as one that can hang.
const LOCAL_FILESYSTEMS: [u32; 11] = [
    0xEF53,      // ext2, ext3, ext4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0x0102_1994, // tmpfs
    0x8584_58F6, // ramfs
    0x794C_7630, // overlayfs
    0xF2F5_2010, // f2fs
    0x2FC1_2FC1, // zfs
    0xCA45_1A4E, // bcachefs
    0xE0F5_E1E2, // erofs
    0x7371_7368, // squashfs
];

/// A dataset directory on a local (or network, or slow) filesystem.
#[derive(Debug)]
pub struct LocalSource {
    root: OwnedFd,
    /// How long after a modification a version may still be being written (`super::SETTLE`).
    settle: Duration,
    /// Whether the root's filesystem is one of `LOCAL_FILESYSTEMS`.
    local: bool,
}

impl LocalSource {
    /// Opens `root` (which must be a directory) as the resolution anchor.
    pub fn open(root: &Path) -> io::Result<LocalSource> {
        let fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // Probe openat2 once so an old kernel fails at mount time with a clear error.
        openat2_beneath(&fd, Path::new("."), OFlags::PATH, RESOLVE).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("openat2 beneath the source root failed: {e}"),
            )
        })?;
        let local = rustix::fs::fstatfs(&fd)
            .is_ok_and(|st| LOCAL_FILESYSTEMS.contains(&(st.f_type as u32)));
        Ok(LocalSource {
            root: fd,
            settle: super::SETTLE,
            local,
        })
    }

    /// Treats every version as settled, however recent (unit tests over files just written; the
    /// tests of the binary date their files back instead).
    #[cfg(test)]
    pub fn settled_at_once(self) -> LocalSource {
        LocalSource {
            settle: Duration::ZERO,
            ..self
        }
    }

    fn open_path(&self, path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        openat2_beneath(&self.root, path, flags, RESOLVE)
    }
}

fn openat2_beneath(
    root: &OwnedFd,
    path: &Path,
    flags: OFlags,
    resolve: ResolveFlags,
) -> io::Result<OwnedFd> {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    loop {
        match rustix::fs::openat2(root, path, flags, Mode::empty(), resolve) {
            // openat2 returns EAGAIN when a concurrent rename raced the resolution: retry.
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => continue,
            other => return other.map_err(io::Error::from),
        }
    }
}

fn kind_of(file_type: FileType) -> Kind {
    match file_type {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Directory,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

fn ns(secs: i64, nsec: u64) -> i64 {
    secs.saturating_mul(1_000_000_000)
        .saturating_add(nsec as i64)
}

fn identity_of(st: &Stat) -> Identity {
    Identity {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size.max(0) as u64,
        mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
        ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
    }
}

fn meta_of(st: &Stat) -> Meta {
    Meta {
        kind: kind_of(FileType::from_raw_mode(st.st_mode)),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        blocks: st.st_blocks.max(0) as u64,
        atime_ns: ns(st.st_atime, st.st_atime_nsec),
        identity: identity_of(st),
    }
}

impl Source for LocalSource {
    fn stat(&self, path: &Path) -> io::Result<Meta> {
        let fd = self.open_path(path, OFlags::PATH)?;
        Ok(meta_of(&rustix::fs::fstat(&fd)?))
    }

    fn stat_at_once(&self, path: &Path) -> Option<io::Result<Meta>> {
        if !self.local {
            return None;
        }
        match openat2_beneath(&self.root, path, OFlags::PATH, RESOLVE_ON_ROOT_FS) {
            Ok(fd) => Some(
                rustix::fs::fstat(&fd)
                    .map(|st| meta_of(&st))
                    .map_err(Into::into),
            ),
            // The path crosses a mount: what lies beyond may be remote.
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => None,
            Err(e) => Some(Err(e)),
        }
    }

    fn list(&self, path: &Path) -> io::Result<DirEntries> {
        let fd = self.open_path(path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let mut dir = Dir::read_from(&fd)?;
        let mut out = DirEntries::default();
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = match entry.file_type() {
                // Some filesystems do not fill d_type: ask, without following links.
                FileType::Unknown => {
                    let st = rustix::fs::statat(
                        &fd,
                        entry.file_name(),
                        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                    )?;
                    kind_of(FileType::from_raw_mode(st.st_mode))
                }
                other => kind_of(other),
            };
            out.push(OsStr::from_bytes(name), kind)?;
        }
        Ok(out)
    }

    fn read_link(&self, path: &Path) -> io::Result<OsString> {
        let fd = self.open_path(path, OFlags::PATH)?;
        let target = rustix::fs::readlinkat(&fd, c"", Vec::new())?;
        Ok(OsString::from_vec(target.into_bytes()))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn SourceFile>> {
        // NONBLOCK: should a fifo be swapped in for a file, open must not hang a FUSE thread.
        let fd = self.open_path(path, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(Arc::new(LocalFile {
            fd,
            identity: identity_of(&st),
            path: Arc::from(path),
            settle: self.settle,
        }))
    }

    fn space(&self) -> io::Result<SpaceStats> {
        let st = rustix::fs::fstatvfs(&self.root)?;
        Ok(SpaceStats {
            blocks: st.f_blocks,
            blocks_free: st.f_bfree,
            blocks_available: st.f_bavail,
            files: st.f_files,
            files_free: st.f_ffree,
            block_size: st.f_frsize as u32,
            name_max: st.f_namemax as u32,
        })
    }
}

/// An open regular file of a `LocalSource`.
#[derive(Debug)]
struct LocalFile {
    fd: OwnedFd,
    identity: Identity,
    path: Arc<Path>,
    settle: Duration,
}

impl SourceFile for LocalFile {
    fn identity(&self) -> Identity {
        self.identity
    }

    fn path(&self) -> &Arc<Path> {
        &self.path
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        Ok(rustix::io::pread(&self.fd, buf, offset)?)
    }

    fn current_identity(&self) -> io::Result<Identity> {
        Ok(identity_of(&rustix::fs::fstat(&self.fd)?))
    }

    fn settled(&self, read_start: SystemTime) -> bool {
        self.identity.settled_at(read_start, self.settle)
    }

    fn drop_page_cache(&self, range: Range<u64>) {
        if let Some(len) = NonZeroU64::new(range.end.saturating_sub(range.start)) {
            let _ = rustix::fs::fadvise(&self.fd, range.start, Some(len), Advice::DontNeed);
        }
    }
}
