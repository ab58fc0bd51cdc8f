//! Where dataset bytes come from: the `Source` seam and its file identity.
//!
//! Owns: the `Source`/`SourceFile` traits, `Identity` (what makes two reads "the same file
//! version") and `Meta`. The real implementation (`local`) resolves every path beneath one root
//! directory handle; the test double (`faulty`) injects failures. Must never hand out a path or
//! descriptor that resolves outside the source root, and never cache anything itself.

pub mod deferred;
pub mod local;

#[cfg(test)]
pub mod faulty;

use std::ffi::{OsStr, OsString};
use std::io;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use deferred::Deferred;
pub use local::LocalSource;

/// The version of a source file: bytes cached under one identity are never served for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Device of the source file.
    pub dev: u64,
    /// Inode of the source file on that device.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Status change time, nanoseconds since the epoch.
    pub ctime_ns: i64,
}

/// The identity a file was last seen at, or none yet, in the 40 bytes of one identity (an
/// `Option` takes 48): no file lives on device 0 on Linux (block devices have a major number,
/// anonymous ones start at minor 1), so the identity on device 0 stands for none. For what keeps
/// one per file (the inode table's nodes, the planner's files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastSeen(Identity);

impl LastSeen {
    /// None seen yet.
    pub const NONE: LastSeen = LastSeen(Identity {
        dev: 0,
        ino: 0,
        size: 0,
        mtime_ns: 0,
        ctime_ns: 0,
    });

    /// The identity, if one was seen.
    pub fn get(self) -> Option<Identity> {
        (self.0.dev != 0).then_some(self.0)
    }
}

impl From<Option<Identity>> for LastSeen {
    fn from(identity: Option<Identity>) -> LastSeen {
        identity.map_or(LastSeen::NONE, LastSeen)
    }
}

/// How long after its last modification a file version may still be being written: bytes read
/// from it before then are served but never cached (see `Identity::settled_at`). A write stamps
/// the file's mtime when it starts, then copies its data, so an open during one big write sees
/// the version that write will leave, while its reads may return bytes of both versions; and two
/// writes within one tick of the filesystem's clock leave the same identity. Two seconds covers
/// the coarsest common timestamp granularity (FAT's 2 s; ext3, HFS+ and some NFS servers keep
/// whole seconds) and a single write of gigabytes into the page cache.
pub const SETTLE: Duration = Duration::from_secs(2);

impl Identity {
    /// Whether bytes read at or after `read_start` from a file still at this identity are all of
    /// this version, given that a write finishes within `settle` of stamping the mtime: the
    /// version was last modified at least `settle` before the read started. (The mtime only:
    /// the ctime of a file whose times were set back is recent although its writes are done.)
    pub fn settled_at(&self, read_start: SystemTime, settle: Duration) -> bool {
        let start_ns = match read_start.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            Err(_) => return false,
        };
        let settle_ns = i64::try_from(settle.as_nanos()).unwrap_or(i64::MAX);
        self.mtime_ns.saturating_add(settle_ns) <= start_ns
    }
}

/// The kind of a source entry, as the namespace exposes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (shown, never followed by prepfs).
    Symlink,
    /// Anything else (fifo, socket, device): listed, never opened.
    Other,
}

/// Metadata of one source entry (lstat semantics: links are not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Entry kind.
    pub kind: Kind,
    /// Permission bits (mode & 0o7777).
    pub perm: u16,
    /// Hard link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Allocated 512-byte blocks.
    pub blocks: u64,
    /// Access time, nanoseconds since the epoch.
    pub atime_ns: i64,
    /// File identity (carries size, mtime and ctime).
    pub identity: Identity,
}

/// A directory's entries as the source listed them, in listing order: the names lie one after
/// another in one buffer, with 8 bytes an entry beside them, in a few large allocations. A
/// vector of heap strings took about 64 bytes an entry, one small allocation each (heaptrack,
/// 100,000 files in one directory: 6.4 MB at the daemon's peak while the planner's helper
/// listed it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirEntries {
    names: Vec<u8>,
    /// Where each name ends in `names`, and its kind.
    ends: Vec<(u32, Kind)>,
}

impl DirEntries {
    /// Adds `name` (a single path component) of `kind`; an error once the names pass 4 GiB,
    /// which no directory a kernel lists reaches.
    pub fn push(&mut self, name: &OsStr, kind: Kind) -> io::Result<()> {
        let end = u32::try_from(self.names.len() + name.len())
            .map_err(|_| io::Error::other("a directory's names pass 4 GiB"))?;
        self.names.extend_from_slice(name.as_bytes());
        self.ends.push((end, kind));
        Ok(())
    }

    /// Entries listed.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether none was listed.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Entry `i`: its name and kind.
    pub fn get(&self, i: usize) -> Option<(&OsStr, Kind)> {
        let &(end, kind) = self.ends.get(i)?;
        let start = i.checked_sub(1).map_or(0, |p| self.ends[p].0);
        let name = self.names.get(start as usize..end as usize)?;
        Some((OsStr::from_bytes(name), kind))
    }

    /// Every entry, in listing order.
    pub fn iter(&self) -> impl Iterator<Item = (&OsStr, Kind)> {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// Gives back capacity beyond what the entries take (for a listing kept while a directory
    /// is open).
    pub fn shrink_to_fit(&mut self) {
        self.names.shrink_to_fit();
        self.ends.shrink_to_fit();
    }

    /// Bytes it holds (its buffers' capacity).
    pub fn bytes(&self) -> u64 {
        (self.names.capacity() + self.ends.capacity() * std::mem::size_of::<(u32, Kind)>()) as u64
    }
}

/// Capacity figures of the filesystem holding the source.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpaceStats {
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks.
    pub blocks_free: u64,
    /// Blocks available to unprivileged users.
    pub blocks_available: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub files_free: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Longest name.
    pub name_max: u32,
}

/// A dataset directory that prepfs serves read-only. Paths are relative to its root; `.` is
/// the root itself.
pub trait Source: Send + Sync + 'static {
    /// Metadata of `path`, without following a final symlink.
    fn stat(&self, path: &Path) -> io::Result<Meta>;
    /// Like `stat`, when the answer cannot wait on anything slower than memory or a local disk
    /// (so a FUSE thread may ask): `None` when it could (a network or FUSE filesystem, or a path
    /// that crosses into another mount), and the caller must ask `stat` where waiting is allowed.
    fn stat_at_once(&self, _path: &Path) -> Option<io::Result<Meta>> {
        None
    }
    /// The entries of directory `path`, without `.` and `..`.
    fn list(&self, path: &Path) -> io::Result<DirEntries>;
    /// The target of symlink `path`, as stored (never resolved).
    fn read_link(&self, path: &Path) -> io::Result<OsString>;
    /// Opens regular file `path` for reading.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn SourceFile>>;
    /// Capacity of the filesystem holding the source.
    fn space(&self) -> io::Result<SpaceStats>;
}

/// An open source file. Reads are positional, so one handle serves concurrent readers.
pub trait SourceFile: Send + Sync {
    /// The identity observed when the file was opened.
    fn identity(&self) -> Identity;
    /// Its path relative to the source root, as it was opened (what tiers below the RAM tier
    /// record beside its blocks).
    fn path(&self) -> &Arc<Path>;
    /// Reads at `offset` into `buf`; returns the number of bytes read (0 at end of file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// The identity of the open file now (to detect changes made during a read).
    fn current_identity(&self) -> io::Result<Identity>;
    /// Whether bytes read from `identity()` by a read that started at `read_start` may be cached
    /// (`Identity::settled_at` with the source's settle time), provided the identity still held
    /// once the read ended.
    fn settled(&self, read_start: SystemTime) -> bool;
    /// Tells the kernel that `range` is cached elsewhere and its page-cache copy can go; a hint,
    /// so failures are ignored.
    fn drop_page_cache(&self, _range: Range<u64>) {}
}

/// Fills `buf` from `offset`, retrying short reads; returns how many bytes were read before end
/// of file.
pub fn read_full(file: &dyn SourceFile, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
