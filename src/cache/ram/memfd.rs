//! `MemfdBody`: the bytes of one cached file, in a sealed-size memfd; `MemfdAllowance`: how many
//! single-block files may have one.
//!
//! Owns: the memfd and a read-only shared mapping of it, and the count of memfds that files of
//! one block may hold (each costs a descriptor and a mapping, which the process has few of). Holding a whole file in a memfd lets the
//! kernel serve it by FUSE passthrough once complete (no daemon round trip, no second copy in the
//! page cache), and lets the daemon answer reads straight from the mapping. The size is sealed at
//! creation, so the mapping can never shrink under a reader (no SIGBUS). Must never write a region
//! after it was published to readers: blocks are written once, then published by the caller.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// Where the kernel's limit on mappings per process is read (`vm.max_map_count`).
const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";
/// The kernel's default `vm.max_map_count`, assumed when it cannot be read.
const DEFAULT_MAX_MAP_COUNT: u64 = 65_530;

/// How many files may keep their bytes in a memfd (so that passthrough can serve them) rather
/// than on the heap. Each memfd holds a descriptor and a mapping for as long as its file is
/// cached, and an ImageNet-sized dataset has over a million files: past the allowance they stay
/// on the heap, served by the daemon, instead of exhausting the descriptors or mappings every
/// other part of the mount needs (source opens, parked files, the FUSE connection).
#[derive(Debug)]
pub struct MemfdAllowance {
    left: AtomicUsize,
}

impl MemfdAllowance {
    /// Room for `count` memfds.
    pub fn new(count: usize) -> MemfdAllowance {
        MemfdAllowance {
            left: AtomicUsize::new(count),
        }
    }

    /// How many memfds cached files may hold in this process: half the descriptors it may open
    /// (prefetch parks a quarter, and the FUSE connection, source files and readers' handles need
    /// the rest) or a quarter of the mappings it may make (the heap, libraries and thread stacks
    /// map too), whichever is smaller.
    pub fn process_share() -> usize {
        let files = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        let maps = std::fs::read_to_string(MAX_MAP_COUNT)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_MAX_MAP_COUNT);
        usize::try_from((files / 2).min(maps / 4)).unwrap_or(usize::MAX)
    }

    /// Takes room for one memfd; false when none is left.
    pub fn take(&self) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Sets the room left to `count` (tests of running out).
    #[cfg(test)]
    pub fn limit_for_test(&self, count: usize) {
        self.left.store(count, Ordering::Release);
    }

    /// Gives back the room one memfd took.
    pub fn give_back(&self) {
        self.left.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_runs_out_and_refills_as_memfds_are_given_back() {
        assert!(!MemfdAllowance::new(0).take(), "nothing granted");
        let allowance = MemfdAllowance::new(2);
        assert!(allowance.take());
        assert!(allowance.take());
        assert!(!allowance.take(), "a third memfd past an allowance of two");
        allowance.give_back();
        assert!(allowance.take());
        assert!(!allowance.take());
    }

    #[test]
    fn the_share_of_this_process_leaves_most_descriptors_and_mappings_free() {
        let files = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        let maps: u64 = std::fs::read_to_string(MAX_MAP_COUNT)
            .map_or(DEFAULT_MAX_MAP_COUNT, |s| s.trim().parse().unwrap());
        let count = MemfdAllowance::process_share() as u64;
        assert!(count > 0 && count <= files / 2 && count <= maps / 4);
    }
}
