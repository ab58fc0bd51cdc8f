//! `FaultySource`: a test double that wraps a real source and injects failures.
//!
//! Owns: the fault plan (EIO on the Nth read, short reads, a vanished tree, slow reads,
//! counting reads).
//! Exists so that the core's error paths are exercised without a misbehaving disk. Must never be
//! compiled into the product (test builds only).

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{DirEntries, Identity, Meta, Source, SourceFile, SpaceStats};

/// What to break, shared between the test and every file the double opens.
#[derive(Debug, Default)]
pub struct FaultPlan {
    /// 1-based index of the read call that fails with EIO (0: none).
    pub fail_read_number: AtomicU64,
    /// Return at most half of each requested read.
    pub short_reads: AtomicBool,
    /// Every call fails with ENOENT, as if the source tree was deleted.
    pub vanished: AtomicBool,
    /// Read calls seen so far.
    pub reads: AtomicU64,
    /// Microseconds each read waits before it runs, as on slow or remote storage.
    pub read_delay_us: AtomicU64,
}

/// A `Source` that forwards to `inner` and applies `plan`.
pub struct FaultySource {
    inner: Arc<dyn Source>,
    plan: Arc<FaultPlan>,
}

impl FaultySource {
    /// Wraps `inner`; the returned plan controls the faults.
    pub fn new(inner: Arc<dyn Source>) -> (FaultySource, Arc<FaultPlan>) {
        let plan = Arc::new(FaultPlan::default());
        (
            FaultySource {
                inner,
                plan: plan.clone(),
            },
            plan,
        )
    }

    fn check(&self) -> io::Result<()> {
        if self.plan.vanished.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(())
    }
}

impl Source for FaultySource {
    fn stat(&self, path: &Path) -> io::Result<Meta> {
        self.check()?;
        self.inner.stat(path)
    }
    fn list(&self, path: &Path) -> io::Result<DirEntries> {
        self.check()?;
        self.inner.list(path)
    }
    fn read_link(&self, path: &Path) -> io::Result<OsString> {
        self.check()?;
        self.inner.read_link(path)
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn SourceFile>> {
        self.check()?;
        let inner = self.inner.open(path)?;
        Ok(Arc::new(FaultyFile {
            inner,
            plan: self.plan.clone(),
        }))
    }
    fn space(&self) -> io::Result<SpaceStats> {
        self.check()?;
        self.inner.space()
    }
}

struct FaultyFile {
    inner: Arc<dyn SourceFile>,
    plan: Arc<FaultPlan>,
}

impl SourceFile for FaultyFile {
    fn identity(&self) -> Identity {
        self.inner.identity()
    }

    fn path(&self) -> &Arc<Path> {
        self.inner.path()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.plan.reads.fetch_add(1, Ordering::SeqCst) + 1;
        let delay = self.plan.read_delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        if self.plan.vanished.load(Ordering::SeqCst)
            || self.plan.fail_read_number.load(Ordering::SeqCst) == n
        {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let len = if self.plan.short_reads.load(Ordering::SeqCst) {
            buf.len().div_ceil(2)
        } else {
            buf.len()
        };
        self.inner.read_at(&mut buf[..len], offset)
    }

    fn current_identity(&self) -> io::Result<Identity> {
        if self.plan.vanished.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        self.inner.current_identity()
    }

    fn settled(&self, read_start: std::time::SystemTime) -> bool {
        self.inner.settled(read_start)
    }
}
