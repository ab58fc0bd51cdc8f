//! The one error type of the filesystem core, and its single mapping to an errno.
//!
//! Owns: `FsError` and `FsError::errno`. Every core call returns `Result<_, FsError>`; the FUSE
//! adapter turns the error into the errno the kernel sees, in exactly one place. Must never grow a
//! catch-all arm: a new failure gets its own variant and its own, deliberate errno.

use std::io;

/// Why a filesystem call failed, in the terms the caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// The name or inode does not exist (or no longer exists in the source).
    #[error("no such file or directory")]
    NotFound,
    /// A directory operation on something that is not a directory.
    #[error("not a directory")]
    NotDirectory,
    /// A file operation on a directory.
    #[error("is a directory")]
    IsDirectory,
    /// Any attempt to modify the mount.
    #[error("read-only file system")]
    ReadOnly,
    /// A file handle the core never issued, or already released.
    #[error("bad file handle")]
    BadHandle,
    /// A name longer than the kernel's NAME_MAX.
    #[error("file name too long")]
    NameTooLong,
    /// A name that cannot name a child (empty, `.`, `..`, contains `/` or NUL).
    #[error("invalid name")]
    InvalidName,
    /// The operation exists in FUSE but prepfs does not implement it.
    #[error("operation not supported")]
    Unsupported,
    /// The extended attribute does not exist (prepfs exposes none).
    #[error("no such attribute")]
    NoAttribute,
    /// The extended attribute's namespace is not supported (every namespace but `user.`):
    /// `EOPNOTSUPP`, which tools such as `ls -l` remember per file system, so they stop asking.
    #[error("attribute namespace not supported")]
    NoAttributeNamespace,
    /// A read could not be answered with bytes of one consistent file version, or the source
    /// failed mid-read: the caller gets EIO for this call only.
    #[error("input/output error")]
    Io,
    /// The source refused access (permissions, or a path that would leave the source root).
    #[error("permission denied")]
    AccessDenied,
}

impl FsError {
    /// The errno the kernel should return to the application.
    pub fn errno(self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::NotDirectory => libc::ENOTDIR,
            FsError::IsDirectory => libc::EISDIR,
            FsError::ReadOnly => libc::EROFS,
            FsError::BadHandle => libc::EBADF,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::InvalidName => libc::EINVAL,
            FsError::Unsupported => libc::ENOSYS,
            FsError::NoAttribute => libc::ENODATA,
            FsError::NoAttributeNamespace => libc::EOPNOTSUPP,
            FsError::Io => libc::EIO,
            FsError::AccessDenied => libc::EACCES,
        }
    }

    /// Classifies a source-side I/O error for metadata operations (lookup, list, readlink).
    /// Reads use [`FsError::Io`] for every source failure instead: see `fs`.
    pub fn from_source(err: &io::Error) -> FsError {
        match err.raw_os_error() {
            Some(libc::ENOENT) => FsError::NotFound,
            Some(libc::ENOTDIR) => FsError::NotDirectory,
            Some(libc::EISDIR) => FsError::IsDirectory,
            Some(libc::ENAMETOOLONG) => FsError::NameTooLong,
            // EXDEV/ELOOP: openat2 refused to resolve beyond the root or through a symlink.
            Some(libc::EACCES | libc::EPERM | libc::EXDEV | libc::ELOOP) => FsError::AccessDenied,
            _ => FsError::Io,
        }
    }
}
