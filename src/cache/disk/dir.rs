//! `CacheDir`: the cache directory, prepfs's own, and every access to what lies inside it.
//!
//! Owns: deciding whether a directory may be used (one created here, an empty one, which is
//! adopted, or one carrying the `PREPFS-CACHE` marker that prepfs writes into both; anything
//! else is refused untouched), the lock file that keeps a second mount out, the `blocks/` and
//! `tmp/` subdirectories, the names of entries (`blocks/<2 hex>/<32 hex>`) and temporary files
//! (`tmp/<16 hex>`), and the only ways to open, list, publish and remove them: relative to
//! checked directory descriptors, `O_NOFOLLOW | O_NONBLOCK`, and used only when `fstat` shows a
//! regular file this user owns. Must never follow a symlink, never chmod anything, never block
//! on or remove what prepfs did not create (a FIFO, socket, device, directory, foreign file or
//! foreign name is left in place and counted), and never start using a directory it could not
//! lock.

use std::fmt;
use std::io;
use std::ops::ControlFlow;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, FlockOperation, Mode, OFlags, Stat};
use rustix::io::Errno;
use xxhash_rust::xxh3::xxh3_128;

use crate::source::Identity;

/// Why a cache directory cannot be used. Each message is one line a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// It could not be created or opened, or something inside it is not what prepfs made.
    #[error("cache dir {path}: {why}")]
    Unusable {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// It is owned by another user.
    #[error(
        "cache dir {path} is owned by uid {owner}, not by this user ({me}): refusing to use it"
    )]
    Owner {
        /// The path given.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's effective uid.
        me: u32,
    },
    /// Others can write into it.
    #[error(
        "cache dir {path} is writable by group or others (mode {mode:o}): refusing to use it; chmod 0700 it"
    )]
    Writable {
        /// The path given.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It holds something and prepfs did not make it.
    #[error(
        "cache dir {path} is not empty and has no {MARKER} marker, so prepfs did not create it: refusing to use it (nothing in it was changed); give --cache-dir a new or empty directory"
    )]
    Foreign {
        /// The path given.
        path: PathBuf,
    },
    /// Its marker is not one this prepfs wrote.
    #[error(
        "cache dir {path}: its {MARKER} marker {why}: refusing to use it (nothing in it was changed); give --cache-dir a new or empty directory"
    )]
    Marker {
        /// The path given.
        path: PathBuf,
        /// What is wrong with the marker.
        why: String,
    },
    /// Another mount holds it.
    #[error(
        "cache dir {path} is in use by another prepfs mount ({holder}); give each mount its own"
    )]
    InUse {
        /// The path given.
        path: PathBuf,
        /// What the lock file says about its holder.
        holder: String,
    },
}

/// An open, checked and locked cache directory.
#[derive(Debug)]
pub struct CacheDir {
    /// The path given (for messages).
    pub path: PathBuf,
    /// The directory itself.
    pub fd: OwnedFd,
    /// `blocks/`, checked to be this user's private directory.
    blocks: OwnedFd,
    /// `tmp/`, checked likewise.
    tmp: OwnedFd,
    /// This process's effective uid: the owner of everything prepfs uses inside.
    uid: u32,
    /// The lock file, held (flock) for as long as this lives.
    _lock: OwnedFd,
}

/// The file that makes a directory a prepfs cache (`marker_line()`, mode 0600).
const MARKER: &str = "PREPFS-CACHE";
/// Version of the directory's layout (marker, lock, `blocks/<2 hex>/<32 hex>`, `tmp/<16 hex>`): a
/// marker of another layout is refused, so no prepfs removes what another layout keeps.
const LAYOUT: u32 = 1;
/// Bytes of a marker read at most: the valid line is 22.
const MARKER_MAX: usize = 64;
/// The root of a freshly made filesystem holds this and nothing else; such a root still counts
/// as empty (a dedicated cache disk is the common case). prepfs never touches it.
const LOST_FOUND: &str = "lost+found";
/// Directories prepfs makes: this user's only.
const DIR_MODE: u32 = 0o700;
/// Entry, marker and lock files: readable by this user only (entries hold plaintext dataset
/// copies).
const FILE_MODE: u32 = 0o600;
/// Opening a directory inside: never through a symlink.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
/// Opening a file inside: never through a symlink, and never waiting at open for a FIFO's
/// writer or a device; its type is checked with fstat before any read.
const FILE_FLAGS: OFlags = OFlags::NOFOLLOW
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);

fn marker_line() -> String {
    format!("prepfs-cache layout {LAYOUT}\n")
}

/// Where one block's entry lives: `blocks/<shard>/<file>`, the file name the xxh3-128 hash (32
/// hex digits) of the source file's identity and the block index, the shard its first two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryName(u128);

impl EntryName {
    /// The shard it is in, as a number (`shard` is its name).
    pub fn shard_index(&self) -> u8 {
        (self.0 >> 120) as u8
    }

    /// The name of block `index` of the file version `identity`.
    pub fn of(identity: &Identity, index: usize) -> EntryName {
        let mut key = Vec::with_capacity(48);
        for v in [identity.dev, identity.ino, identity.size] {
            key.extend_from_slice(&v.to_le_bytes());
        }
        key.extend_from_slice(&identity.mtime_ns.to_le_bytes());
        key.extend_from_slice(&identity.ctime_ns.to_le_bytes());
        key.extend_from_slice(&(index as u64).to_le_bytes());
        EntryName(xxh3_128(&key))
    }

    /// The name `file` in shard `shard`, when both are exactly what prepfs would write.
    fn parse(shard: &str, file: &str) -> Option<EntryName> {
        let name = EntryName(u128::from_str_radix(file, 16).ok()?);
        (name.file() == file && name.shard() == shard).then_some(name)
    }

    fn shard(&self) -> String {
        format!("{:02x}", self.0 >> 120)
    }

    fn file(&self) -> String {
        format!("{:032x}", self.0)
    }
}

impl fmt::Display for EntryName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "blocks/{}/{}", self.shard(), self.file())
    }
}

/// Whether `name` is one prepfs gives a shard directory in `blocks/`.
fn is_shard_name(name: &str) -> bool {
    name.len() == 2 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `name` is one prepfs gives a temporary file in `tmp/`.
fn is_tmp_name(name: &str) -> bool {
    u64::from_str_radix(name, 16).is_ok_and(|n| format!("{n:016x}") == name)
}

/// An entry file opened for reading: a regular file of this user.
#[derive(Debug)]
pub struct EntryFile {
    /// The open file.
    pub fd: OwnedFd,
    /// Its length in bytes (as the file system reports it: bound it before allocating).
    pub len: u64,
}

/// What is at an entry's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Nothing: an entry may be written there.
    Free,
    /// An entry file of this user, this many bytes long.
    Entry(u64),
    /// Something prepfs did not write (or a shard it cannot use): never read, written over or
    /// removed.
    Taken,
}

/// One `blocks/<2 hex>/` directory, opened without following a symlink and checked to be this
/// user's and writable by no one else.
pub struct Shard {
    fd: OwnedFd,
    uid: u32,
}

impl Shard {
    /// Opens entry `name` of this shard for reading; `Ok(None)` when there is none. Anything but
    /// a regular file of this user there is an error (and left in place).
    pub fn open(&self, name: &EntryName) -> io::Result<Option<EntryFile>> {
        let fd = match rfs::openat(
            &self.fd,
            name.file(),
            OFlags::RDONLY | FILE_FLAGS,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(io::Error::other(format!("{name}: {e}"))),
        };
        let stat = rfs::fstat(&fd)?;
        if !own_file(&stat, self.uid) {
            return Err(io::Error::other(format!(
                "{name} is not a regular file of this user; left in place"
            )));
        }
        Ok(Some(EntryFile {
            fd,
            len: stat.st_size.max(0) as u64,
        }))
    }

    /// What is at `name` in this shard.
    fn slot(&self, name: &EntryName) -> Slot {
        match rfs::statat(&self.fd, name.file(), AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => Slot::Free,
            Ok(stat) if own_file(&stat, self.uid) => Slot::Entry(stat.st_size.max(0) as u64),
            _ => Slot::Taken,
        }
    }

    /// Removes entry `name` if it is an entry file of this user; its length when it was.
    pub fn remove(&self, name: &EntryName) -> Option<u64> {
        let Slot::Entry(len) = self.slot(name) else {
            return None;
        };
        rfs::unlinkat(&self.fd, name.file(), AtFlags::empty()).ok()?;
        Some(len)
    }
}

impl CacheDir {
    /// Opens `path` as this mount's cache directory: creates it (0700) if missing, adopts it if
    /// empty (writing the marker), accepts it if it carries a valid marker, and refuses it
    /// otherwise without changing anything in it. Then locks it.
    pub fn open(path: &Path) -> Result<CacheDir, DiskError> {
        let unusable = |why: String| DiskError::Unusable {
            path: path.to_owned(),
            why,
        };
        match std::fs::symlink_metadata(path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(DIR_MODE)
                    .create(path)
                    .map_err(|e| unusable(format!("cannot create it: {e}")))?;
            }
            Err(e) => return Err(unusable(e.to_string())),
        }
        let fd = rfs::open(path, DIR_FLAGS, Mode::empty())
            .map_err(|e| unusable(format!("not a directory this user can open ({e})")))?;
        let stat = rfs::fstat(&fd).map_err(|e| unusable(e.to_string()))?;
        let uid = rustix::process::geteuid().as_raw();
        if stat.st_uid != uid {
            return Err(DiskError::Owner {
                path: path.to_owned(),
                owner: stat.st_uid,
                me: uid,
            });
        }
        let mode = stat.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(DiskError::Writable {
                path: path.to_owned(),
                mode,
            });
        }
        claim(&fd, path, uid)?;
        let lock = lock(&fd, path, uid)?;
        let blocks = subdir(&fd, "blocks", uid).map_err(unusable)?;
        let tmp = subdir(&fd, "tmp", uid).map_err(unusable)?;
        Ok(CacheDir {
            path: path.to_owned(),
            fd,
            blocks,
            tmp,
            uid,
            _lock: lock,
        })
    }

    /// The shard of `name`, if it exists and is usable (an unusable one is an error).
    fn shard(&self, name: &EntryName) -> io::Result<Option<Shard>> {
        self.open_shard(&name.shard())
    }

    fn open_shard(&self, shard: &str) -> io::Result<Option<Shard>> {
        let fd = match rfs::openat(&self.blocks, shard, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(io::Error::other(format!("blocks/{shard}/: {e}"))),
        };
        private_dir(&rfs::fstat(&fd)?, self.uid)
            .map_err(|why| io::Error::other(format!("blocks/{shard}/ {why}")))?;
        Ok(Some(Shard { fd, uid: self.uid }))
    }

    /// Opens entry `name` for reading; `Ok(None)` when there is none. Anything but a regular
    /// file of this user at its name (or an unusable shard) is an error, and left in place.
    pub fn open_entry(&self, name: &EntryName) -> io::Result<Option<EntryFile>> {
        match self.shard(name)? {
            Some(shard) => shard.open(name),
            None => Ok(None),
        }
    }

    /// What is at `name`.
    pub fn slot(&self, name: &EntryName) -> Slot {
        match self.shard(name) {
            Ok(Some(shard)) => shard.slot(name),
            Ok(None) => Slot::Free,
            Err(_) => Slot::Taken,
        }
    }

    /// Removes entry `name` if it is an entry file of this user; its length when it was.
    pub fn remove_entry(&self, name: &EntryName) -> Option<u64> {
        self.shard(name).ok()??.remove(name)
    }

    /// Writes `bytes` to a new file in `tmp/` and renames it to `name`: readers see all or
    /// nothing. The caller has checked that `name` is `Slot::Free`.
    pub fn publish(&self, name: &EntryName, bytes: &[u8]) -> io::Result<()> {
        let tmp = format!("{:016x}", fastrand::u64(..));
        let fd = rfs::openat(
            &self.tmp,
            &tmp,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | FILE_FLAGS,
            Mode::from_raw_mode(FILE_MODE),
        )?;
        let written = (|| -> io::Result<()> {
            let mut done = 0;
            while done < bytes.len() {
                done += rustix::io::pwrite(&fd, &bytes[done..], done as u64)?;
            }
            match rfs::mkdirat(&self.blocks, name.shard(), Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            let shard = self.shard(name)?.ok_or(io::ErrorKind::NotFound)?;
            rfs::renameat(&self.tmp, &tmp, &shard.fd, name.file())?;
            Ok(())
        })();
        if written.is_err() {
            let _ = rfs::unlinkat(&self.tmp, &tmp, AtFlags::empty());
        }
        written
    }

    /// Removes what interrupted writes left in `tmp/` (files named as prepfs names them, regular
    /// and this user's); returns how many other things were left in place.
    pub fn clear_tmp(&self) -> u64 {
        let mut foreign = 0;
        let _ = for_each_name(&self.tmp, |name| {
            let ours = is_tmp_name(name)
                && rfs::statat(&self.tmp, name, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|s| own_file(&s, self.uid));
            if !(ours && rfs::unlinkat(&self.tmp, name, AtFlags::empty()).is_ok()) {
                foreign += 1;
            }
            ControlFlow::Continue(())
        });
        foreign
    }

    /// Calls `visit` with every entry file under `blocks/` (named as prepfs names them, regular
    /// and this user's) until it breaks; returns how many other things were left in place.
    pub fn visit_entries(
        &self,
        mut visit: impl FnMut(&Shard, &EntryName, EntryFile) -> ControlFlow<()>,
    ) -> u64 {
        let mut foreign = 0;
        let _ = for_each_name(&self.blocks, |shard_name| {
            let shard = match is_shard_name(shard_name).then(|| self.open_shard(shard_name)) {
                Some(Ok(Some(shard))) => shard,
                _ => {
                    foreign += 1;
                    return ControlFlow::Continue(());
                }
            };
            for_each_name(&shard.fd, |file| {
                let Some(name) = EntryName::parse(shard_name, file) else {
                    foreign += 1;
                    return ControlFlow::Continue(());
                };
                match shard.open(&name) {
                    Ok(Some(entry)) => visit(&shard, &name, entry),
                    Ok(None) => ControlFlow::Continue(()),
                    Err(_) => {
                        foreign += 1;
                        ControlFlow::Continue(())
                    }
                }
            })
        });
        foreign
    }
}

/// Whether `stat` is a regular file owned by `uid`.
fn own_file(stat: &Stat, uid: u32) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile && stat.st_uid == uid
}

/// Why a directory's `stat` is not one prepfs may use: another owner, or others may write to it.
fn private_dir(stat: &Stat, uid: u32) -> Result<(), String> {
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Err("is not a directory".into());
    }
    if stat.st_uid != uid {
        return Err(format!(
            "is owned by uid {}, not by this user ({uid})",
            stat.st_uid
        ));
    }
    let mode = stat.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!("is writable by group or others (mode {mode:o})"));
    }
    Ok(())
}

/// What a cache directory's marker says.
enum Marker {
    /// This layout's, written by prepfs.
    Valid,
    /// There is none.
    Absent,
    /// Something else is there; why it is refused.
    Invalid(String),
}

fn read_marker(dir: &OwnedFd, uid: u32) -> Marker {
    let fd = match rfs::openat(dir, MARKER, OFlags::RDONLY | FILE_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Marker::Absent,
        Err(e) => return Marker::Invalid(format!("cannot be opened ({e})")),
    };
    if !rfs::fstat(&fd).is_ok_and(|s| own_file(&s, uid)) {
        return Marker::Invalid("is not a regular file of this user".into());
    }
    let mut buf = [0u8; MARKER_MAX];
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pread(&fd, &mut buf[done..], done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) => return Marker::Invalid(format!("cannot be read ({e})")),
        }
    }
    let text = String::from_utf8_lossy(&buf[..done]);
    if text == marker_line() {
        return Marker::Valid;
    }
    match text
        .strip_prefix("prepfs-cache layout ")
        .and_then(|rest| rest.trim_end().parse::<u32>().ok())
    {
        Some(layout) => Marker::Invalid(format!(
            "is for cache layout {layout}, and this prepfs uses layout {LAYOUT}"
        )),
        None => Marker::Invalid("is not one prepfs wrote".into()),
    }
}

/// Accepts `dir` as prepfs's own: it carries a valid marker, or it is empty and gets one now.
fn claim(dir: &OwnedFd, path: &Path, uid: u32) -> Result<(), DiskError> {
    match read_marker(dir, uid) {
        Marker::Valid => return Ok(()),
        Marker::Invalid(why) => {
            return Err(DiskError::Marker {
                path: path.to_owned(),
                why,
            });
        }
        Marker::Absent => {}
    }
    let empty = match rfs::Dir::read_from(dir) {
        // A name that cannot be read counts as something there.
        Ok(mut entries) => entries.all(|e| {
            e.is_ok_and(|e| {
                let name = e.file_name().to_bytes();
                name == b"." || name == b".." || name == LOST_FOUND.as_bytes()
            })
        }),
        Err(e) => {
            return Err(DiskError::Unusable {
                path: path.to_owned(),
                why: format!("cannot list it: {e}"),
            });
        }
    };
    if !empty {
        return Err(DiskError::Foreign {
            path: path.to_owned(),
        });
    }
    let fd = match rfs::openat(
        dir,
        MARKER,
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | FILE_FLAGS,
        Mode::from_raw_mode(FILE_MODE),
    ) {
        Ok(fd) => fd,
        // Another mount adopted it at the same moment: its marker decides.
        Err(Errno::EXIST) => {
            return match read_marker(dir, uid) {
                Marker::Valid => Ok(()),
                Marker::Absent | Marker::Invalid(_) => Err(DiskError::Foreign {
                    path: path.to_owned(),
                }),
            };
        }
        Err(e) => {
            return Err(DiskError::Unusable {
                path: path.to_owned(),
                why: format!("cannot write its {MARKER} marker: {e}"),
            });
        }
    };
    let line = marker_line();
    let mut done = 0;
    while done < line.len() {
        match rustix::io::pwrite(&fd, &line.as_bytes()[done..], done as u64) {
            Ok(n) => done += n,
            Err(e) => {
                let _ = rfs::unlinkat(dir, MARKER, AtFlags::empty());
                return Err(DiskError::Unusable {
                    path: path.to_owned(),
                    why: format!("cannot write its {MARKER} marker: {e}"),
                });
            }
        }
    }
    tracing::info!(path = %path.display(), "empty directory adopted as a prepfs cache dir");
    Ok(())
}

/// Opens and takes the lock file, writing this process's pid into it.
fn lock(dir: &OwnedFd, path: &Path, uid: u32) -> Result<OwnedFd, DiskError> {
    let unusable = |why: String| DiskError::Unusable {
        path: path.to_owned(),
        why,
    };
    let lock = rfs::openat(
        dir,
        "lock",
        OFlags::CREATE | OFlags::RDWR | FILE_FLAGS,
        Mode::from_raw_mode(FILE_MODE),
    )
    .map_err(|e| unusable(format!("cannot open its lock file: {e}")))?;
    if !rfs::fstat(&lock).is_ok_and(|s| own_file(&s, uid)) {
        return Err(unusable(
            "its lock file is not a regular file of this user: refusing to use it".into(),
        ));
    }
    if rfs::flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
        let mut holder = [0u8; 64];
        let n = rustix::io::pread(&lock, &mut holder, 0).unwrap_or(0);
        let holder = String::from_utf8_lossy(&holder[..n]).trim().to_owned();
        return Err(DiskError::InUse {
            path: path.to_owned(),
            holder: if holder.is_empty() {
                "unknown holder".into()
            } else {
                holder
            },
        });
    }
    let pid = format!("pid {}\n", std::process::id());
    let _ = rfs::ftruncate(&lock, 0);
    let _ = rustix::io::pwrite(&lock, pid.as_bytes(), 0);
    Ok(lock)
}

/// Creates (0700) or opens subdirectory `name` of the cache dir, refusing a symlink, a
/// non-directory, or one another user owns or others can write to.
fn subdir(dir: &OwnedFd, name: &str, uid: u32) -> Result<OwnedFd, String> {
    match rfs::mkdirat(dir, name, Mode::from_raw_mode(DIR_MODE)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(format!("cannot create {name}/: {e}")),
    }
    let fd = rfs::openat(dir, name, DIR_FLAGS, Mode::empty()).map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR => {
            format!("{name}/ is a symlink or not a directory: refusing to use it")
        }
        e => format!("cannot open {name}/: {e}"),
    })?;
    let stat = rfs::fstat(&fd).map_err(|e| format!("cannot stat {name}/: {e}"))?;
    private_dir(&stat, uid).map_err(|why| format!("{name}/ {why}: refusing to use it"))?;
    Ok(fd)
}

/// Calls `each` with every name in directory `dir` but `.` and `..`, as the directory is read
/// (nothing is collected, however many names it holds), until `each` breaks. A directory that
/// cannot be read has no names.
fn for_each_name(dir: &OwnedFd, mut each: impl FnMut(&str) -> ControlFlow<()>) -> ControlFlow<()> {
    let Ok(entries) = rfs::Dir::read_from(dir) else {
        return ControlFlow::Continue(());
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy();
        if name != "." && name != ".." {
            each(&name)?;
        }
    }
    ControlFlow::Continue(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_parse_only_as_prepfs_writes_them() {
        let name = EntryName(0xab00_0000_0000_0000_0000_0000_0000_00cd);
        assert_eq!(
            name.to_string(),
            "blocks/ab/ab0000000000000000000000000000cd"
        );
        assert_eq!(EntryName::parse("ab", &name.file()), Some(name));
        for (shard, file) in [
            ("ac", "ab0000000000000000000000000000cd"),
            ("AB", "AB0000000000000000000000000000CD"),
            ("ab", "ab000000000000000000000000000cd"),
            ("ab", "+ab000000000000000000000000000cd"),
            ("ab", "ab0000000000000000000000000000cd.tmp"),
            ("ab", "y"),
        ] {
            assert_eq!(EntryName::parse(shard, file), None, "{shard}/{file}");
        }
        assert!(is_tmp_name("0123456789abcdef"));
        for bad in [
            "x",
            "0123456789ABCDEF",
            "0123456789abcde",
            "+123456789abcdef",
        ] {
            assert!(!is_tmp_name(bad), "{bad}");
        }
    }

    #[test]
    fn an_empty_directory_is_adopted_and_then_recognised() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join(LOST_FOUND)).expect("mkdir");
        let dir = CacheDir::open(root.path()).expect("adopted");
        drop(dir);
        let marker = std::fs::read(root.path().join(MARKER)).expect("marker");
        assert_eq!(marker, marker_line().as_bytes());
        CacheDir::open(root.path()).expect("recognised");
    }

    #[test]
    fn a_directory_without_the_marker_or_with_another_one_is_refused_untouched() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(root.path().join("notes"), b"mine").expect("write");
        let err = CacheDir::open(root.path()).expect_err("refused");
        assert!(matches!(err, DiskError::Foreign { .. }), "{err}");
        let names: Vec<_> = std::fs::read_dir(root.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["notes"]);

        for (marker, why) in [
            ("prepfs-cache layout 9\n", "layout 9"),
            ("hello\n", "not one prepfs wrote"),
        ] {
            std::fs::write(root.path().join(MARKER), marker).expect("write");
            let err = CacheDir::open(root.path())
                .expect_err("refused")
                .to_string();
            assert!(err.contains(why), "{err}");
        }
        assert!(!root.path().join("lock").exists());
    }
}
