//! `CacheDir`: the cache directory, checked, tightened and locked for one mount.
//!
//! Owns: creating the directory (0700), refusing one that another user owns or that others can
//! write to, the lock file that keeps a second mount out, and the `blocks/` and `tmp/`
//! subdirectories. Everything later is done relative to the directory's descriptor, so a
//! renamed or swapped path cannot redirect writes. Must never follow a symlink and never start
//! using a directory it could not lock.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, FlockOperation, Mode, OFlags};

/// Why a cache directory cannot be used. Each message is one line a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// It could not be created or opened.
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
    /// The lock file, held (flock) for as long as this lives.
    _lock: OwnedFd,
}

const DIR_MODE: u32 = 0o700;
/// Entry and lock files: readable by this user only (the cache holds plaintext dataset copies).
pub const FILE_MODE: u32 = 0o600;

impl CacheDir {
    /// Opens `path` as this mount's cache directory, creating it (0700) if missing.
    pub fn open(path: &Path) -> Result<CacheDir, DiskError> {
        let unusable = |why: String| DiskError::Unusable {
            path: path.to_owned(),
            why,
        };
        match std::fs::symlink_metadata(path) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(DIR_MODE)
                    .create(path)
                    .map_err(|e| unusable(format!("cannot create it: {e}")))?;
            }
            Err(e) => return Err(unusable(e.to_string())),
        }
        let fd = rfs::open(
            path,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| unusable(format!("not a directory this user can open ({e})")))?;
        let stat = rfs::fstat(&fd).map_err(|e| unusable(e.to_string()))?;
        let me = rustix::process::geteuid().as_raw();
        if stat.st_uid != me {
            return Err(DiskError::Owner {
                path: path.to_owned(),
                owner: stat.st_uid,
                me,
            });
        }
        let mode = stat.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(DiskError::Writable {
                path: path.to_owned(),
                mode,
            });
        }
        if mode & 0o077 != 0 {
            rfs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE))
                .map_err(|e| unusable(format!("cannot restrict it to 0700: {e}")))?;
            tracing::info!(path = %path.display(), "cache dir restricted to mode 0700");
        }
        let lock = rfs::openat(
            &fd,
            "lock",
            OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(FILE_MODE),
        )
        .map_err(|e| unusable(format!("cannot open its lock file: {e}")))?;
        if rfs::flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
            let mut holder = vec![0u8; 64];
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
        for sub in ["blocks", "tmp"] {
            match rfs::mkdirat(&fd, sub, Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(unusable(format!("cannot create {sub}/: {e}"))),
            }
        }
        Ok(CacheDir {
            path: path.to_owned(),
            fd,
            _lock: lock,
        })
    }
}
