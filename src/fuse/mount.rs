//! Establishing the kernel mount, with the filesystem type `fuse.<subtype>`.
//!
//! Owns: the mount(2) call a root daemon makes itself, so that /proc/mounts, `findmnt -t` and
//! `umount -t` see `fuse.prepfs` as libfuse and fusermount3 would show it (fuser's own mount(2)
//! call always says `fuse`), and unmounting what it mounted. A normal user's mount, and anything
//! this module does not translate, goes through fuser (fusermount3 sets the subtype itself).
//! Must never leave a mount behind when the session cannot start.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use fuser::{Config, Filesystem, MountOption, Session, SessionACL, SessionUnmounter};
use rustix::mount::{MountFlags, UnmountFlags};

/// Undoes a mount, whichever way it was made.
pub enum Unmount {
    /// Made by fuser (fusermount3 for normal users).
    Fuser(SessionUnmounter),
    /// Made here with mount(2); the path until it has been unmounted.
    Kernel(Option<PathBuf>),
}

impl Unmount {
    /// Unmounts; a mount that is already gone counts as unmounted.
    pub fn unmount(&mut self) -> io::Result<()> {
        match self {
            Unmount::Fuser(inner) => inner.unmount(),
            Unmount::Kernel(path) => {
                let Some(at) = path.as_deref() else {
                    return Ok(());
                };
                match rustix::mount::unmount(at, UnmountFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::INVAL) => {
                        *path = None;
                        Ok(())
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

/// Mounts `filesystem` at `mountpoint` with `config`'s options and returns its session (not yet
/// running) and how to unmount it.
pub fn mount<FS: Filesystem>(
    filesystem: FS,
    mountpoint: &Path,
    config: &Config,
) -> io::Result<(Session<FS>, Unmount)> {
    if rustix::process::geteuid().is_root()
        && let Some(kernel) = KernelMount::from_options(&config.mount_options, config.acl)
    {
        let fd = rustix::fs::open(
            "/dev/fuse",
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        match kernel.mount(mountpoint, &fd) {
            // Root without CAP_SYS_ADMIN (a user namespace): fusermount3 may still mount.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            Err(e) => return Err(e),
            Ok(()) => {
                return match Session::from_fd(filesystem, fd, config.acl, config.clone()) {
                    Ok(session) => Ok((session, Unmount::Kernel(Some(mountpoint.to_owned())))),
                    Err(e) => {
                        let _ = rustix::mount::unmount(mountpoint, UnmountFlags::DETACH);
                        Err(e)
                    }
                };
            }
        }
    }
    let mut session = Session::new(filesystem, mountpoint, config)?;
    let unmount = Unmount::Fuser(session.unmount_callable());
    Ok((session, unmount))
}

/// A mount(2) call's arguments, translated from fuser's options.
struct KernelMount {
    /// Shown as the mount's source (`prepfs:/data`).
    source: String,
    /// `fuse.<subtype>`, or `fuse`.
    fstype: String,
    flags: MountFlags,
    /// Options the FUSE kernel module reads, after `fd`, `rootmode`, `user_id` and `group_id`.
    options: Vec<&'static str>,
}

impl KernelMount {
    /// None for an option this module does not translate (fuser mounts those).
    fn from_options(options: &[MountOption], acl: SessionACL) -> Option<KernelMount> {
        let mut kernel = KernelMount {
            source: "/dev/fuse".into(),
            fstype: "fuse".into(),
            // As fuser and fusermount3: nodev and nosuid unless asked otherwise.
            flags: MountFlags::NODEV | MountFlags::NOSUID,
            options: Vec::new(),
        };
        for option in options {
            match option {
                MountOption::FSName(name) => kernel.source = name.clone(),
                MountOption::Subtype(subtype) => kernel.fstype = format!("fuse.{subtype}"),
                MountOption::RO => kernel.flags |= MountFlags::RDONLY,
                MountOption::NoSuid => kernel.flags |= MountFlags::NOSUID,
                MountOption::NoDev => kernel.flags |= MountFlags::NODEV,
                MountOption::NoAtime => kernel.flags |= MountFlags::NOATIME,
                MountOption::NoExec => kernel.flags |= MountFlags::NOEXEC,
                MountOption::DefaultPermissions => kernel.options.push("default_permissions"),
                _ => return None,
            }
        }
        if acl != SessionACL::Owner {
            kernel.options.push("allow_other");
        }
        Some(kernel)
    }

    fn mount(&self, mountpoint: &Path, fd: &rustix::fd::OwnedFd) -> io::Result<()> {
        use rustix::fd::AsRawFd;
        let root = rustix::fs::stat(mountpoint)?;
        let mut data = format!(
            "fd={},rootmode={:o},user_id={},group_id={}",
            fd.as_raw_fd(),
            root.st_mode & libc::S_IFMT,
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw()
        );
        for option in &self.options {
            data.push(',');
            data.push_str(option);
        }
        let data = CString::new(data).map_err(io::Error::other)?;
        let target = CString::new(mountpoint.as_os_str().as_bytes()).map_err(io::Error::other)?;
        rustix::mount::mount(
            self.source.as_str(),
            target.as_c_str(),
            self.fstype.as_str(),
            self.flags,
            data.as_c_str(),
        )?;
        Ok(())
    }
}
