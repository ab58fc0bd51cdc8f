//! `MemfdBody`: the bytes of one multi-block cached file, in a sealed-size memfd.
//!
//! Owns: the memfd and a read-only shared mapping of it. Holding a whole file in a memfd lets the
//! kernel serve it by FUSE passthrough once complete (no daemon round trip, no second copy in the
//! page cache), and lets the daemon answer reads straight from the mapping. The size is sealed at
//! creation, so the mapping can never shrink under a reader (no SIGBUS). Must never write a region
//! after it was published to readers: blocks are written once, then published by the caller.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// A memfd of fixed size `len` and its read-only mapping.
#[derive(Debug)]
pub struct MemfdBody {
    fd: OwnedFd,
    map: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only in this process and lives as long as the struct; the bytes a
// reader sees are written (through the fd) before they are published, and never again after.
unsafe impl Send for MemfdBody {}
// SAFETY: as above; shared access only ever reads.
unsafe impl Sync for MemfdBody {}

impl MemfdBody {
    /// Creates an empty (sparse) memfd of `len` bytes, its size sealed, and maps it.
    pub fn create(len: usize) -> std::io::Result<MemfdBody> {
        let fd = rustix::fs::memfd_create(
            "prepfs-cache",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        // SAFETY: a fresh shared read-only mapping of a memfd whose size is sealed at `len`.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let map = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(MemfdBody { fd, map, len })
    }

    /// Writes `data` at `offset` (a region not yet published to readers).
    pub fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        let mut done = 0;
        while done < data.len() {
            done += rustix::io::pwrite(&self.fd, &data[done..], offset + done as u64)?;
        }
        Ok(())
    }

    /// The whole mapped file. Callers read only published regions.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `map` points to `len` mapped, readable bytes for the life of `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.len) }
    }

    /// The memfd, for registering it as a passthrough backing file.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for MemfdBody {
    fn drop(&mut self) {
        // SAFETY: unmapping the region mapped in `create`; no borrow of it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.map.as_ptr().cast(), self.len) };
    }
}
