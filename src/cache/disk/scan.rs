//! The disk tier's start-up scan: what an earlier mount left in the cache dir, counted against
//! the budget, with the entries of changed or deleted source files and the leftovers of
//! interrupted writes removed; admission opens when it ends.
//!
//! Owns: the walk over the entries, each one's check against its source file, and what it has
//! counted so far (`ScanProgress`, which a removal during the scan asks). Must never
//! block lookups (it runs on its own thread while the mount serves) and never remove what prepfs
//! did not write (counted and left in place).

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::dir::{EntryFile, EntryName};
use super::{Inner, Validate, read_header};

/// What the start-up scan has put on the tally so far, so that an entry removed while it runs
/// comes off the tally only if the scan counted it: one it has not reached yet, it will not find.
/// The scan visits the shards one at a time.
pub(super) struct ScanProgress {
    /// Shards (`EntryName::shard_index`) the scan is done with.
    done: [bool; 256],
    /// The shard it is in, and the entries of it counted so far (a 256th of the cache).
    current: Option<u8>,
    counted: HashSet<EntryName>,
}

impl Default for ScanProgress {
    fn default() -> ScanProgress {
        ScanProgress {
            done: [false; 256],
            current: None,
            counted: HashSet::new(),
        }
    }
}

impl ScanProgress {
    /// Whether the scan has counted entry `name`.
    pub(super) fn has_counted(&self, name: &EntryName) -> bool {
        let shard = name.shard_index();
        self.done[usize::from(shard)]
            || (self.current == Some(shard) && self.counted.contains(name))
    }

    /// Records that the scan counted entry `name`.
    fn count(&mut self, name: EntryName) {
        let shard = name.shard_index();
        if self.current != Some(shard) {
            if let Some(before) = self.current {
                self.done[usize::from(before)] = true;
            }
            self.current = Some(shard);
            self.counted.clear();
        }
        self.counted.insert(name);
    }
}

impl Inner {
    /// Counts the entries an earlier mount left, removing leftovers of interrupted writes and
    /// entries whose source file changed or vanished; then opens admission. What prepfs did not
    /// write is left in place, counted in the log.
    pub(super) fn scan(&self, validate: &Validate) {
        let started = Instant::now();
        let (mut kept, mut dropped) = (0u64, 0u64);
        let mut foreign = self.dir.clear_tmp();
        foreign += self.dir.visit_entries(|shard, name, file| {
            if self.stop.load(Ordering::Acquire) {
                return ControlFlow::Break(());
            }
            match self.check_entry(name, &file, validate) {
                Some(logical) => {
                    // Counted under the scan's lock, unless a removal unlinked it meanwhile
                    // (a read that found it damaged): `Inner::remove` then did not count it off.
                    let mut scan = self.scan.lock();
                    let linked = rustix::fs::fstat(&file.fd).is_ok_and(|st| st.st_nlink > 0);
                    if linked {
                        self.used.fetch_add(file.len, Ordering::Relaxed);
                        self.logical.fetch_add(logical, Ordering::Relaxed);
                        self.entries.fetch_add(1, Ordering::Relaxed);
                        scan.count(*name);
                        kept += 1;
                    }
                }
                None => {
                    drop(file);
                    shard.remove(name);
                    self.metrics.disk_stale_dropped.inc();
                    dropped += 1;
                }
            }
            ControlFlow::Continue(())
        });
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        if foreign > 0 {
            tracing::warn!(
                path = %self.dir.path.display(),
                foreign,
                "the cache dir holds things prepfs did not write under blocks/ or tmp/; left in place"
            );
        }
        let mut scan = self.scan.lock();
        self.scanned.store(true, Ordering::Release);
        // Its figures are of no use once every removal counts off.
        *scan = ScanProgress::default();
        drop(scan);
        tracing::info!(
            kept,
            dropped,
            foreign,
            bytes = self.used.load(Ordering::Relaxed),
            took_ms = started.elapsed().as_millis() as u64,
            "disk cache scanned"
        );
    }

    /// The logical bytes of entry `name`, open as `file`, when its header is intact and its
    /// source file is still the version it was written for; `None` for anything else.
    fn check_entry(&self, name: &EntryName, file: &EntryFile, validate: &Validate) -> Option<u64> {
        let header = read_header(file)?;
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(&header.path));
        let current = validate(path)?;
        (current == header.identity
            && header.entry_len() as u64 == file.len
            && EntryName::of(&header.identity, header.index as usize) == *name)
            .then_some(header.len as u64)
    }
}
