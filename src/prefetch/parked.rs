//! `Parked`: source files the prefetcher opened ahead of their readers, waiting for the open
//! that asks for them.
//!
//! Owns: a bounded set of open source files keyed by path, the oldest closed first when it is
//! full. When neither the cache nor the staging buffer has room for a predicted file's bytes,
//! prefetch can still take the open's round trip (milliseconds on network storage) off the
//! reader's path, at the cost of a descriptor and no memory. Its capacity comes from the
//! process's open-file limit (a quarter of it, at most `MAX_CAPACITY`). Must never hand a reader
//! a file of another version than the one its open saw (`take` compares identities and closes a
//! mismatch), and never hold more than its capacity of descriptors.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::files::FileKey;
use crate::source::{Identity, SourceFile};

/// Descriptors held at most, whatever the open-file limit: enough for the uncached rest of a
/// pass over a few thousand files.
pub const MAX_CAPACITY: usize = 4096;

#[derive(Default)]
struct Slots {
    files: foldhash::HashMap<FileKey, (u64, Arc<dyn SourceFile>)>,
    /// Parking order, oldest first: (generation, path); entries whose file was taken or parked
    /// again since are skipped.
    order: VecDeque<(u64, FileKey)>,
    generation: u64,
}

/// The parked files of one mount.
pub struct Parked {
    capacity: usize,
    slots: Mutex<Slots>,
}

impl Parked {
    /// Room for `capacity` descriptors.
    pub fn new(capacity: usize) -> Parked {
        Parked {
            capacity,
            slots: Mutex::default(),
        }
    }

    /// Room for a quarter of the descriptors the process may open (the cache, the FUSE
    /// connection and the readers' handles need the rest), at most `MAX_CAPACITY`.
    pub fn for_open_file_limit() -> Parked {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        Parked::new((limit / 4).min(MAX_CAPACITY as u64) as usize)
    }

    /// Parks `file`, opened at `path`, closing the oldest parked files when full; returns the
    /// paths of those it closed.
    pub fn park(&self, path: FileKey, file: Arc<dyn SourceFile>) -> Vec<FileKey> {
        let mut closed = Vec::new();
        let mut s = self.slots.lock();
        s.generation += 1;
        let generation = s.generation;
        s.files.insert(path.clone(), (generation, file));
        s.order.push_back((generation, path));
        while s.files.len() > self.capacity {
            let Some((generation, path)) = s.order.pop_front() else {
                break;
            };
            if s.files.get(&path).is_some_and(|(g, _)| *g == generation) {
                s.files.remove(&path);
                closed.push(path);
            }
        }
        if s.order.len() > 2 * self.capacity.max(1) {
            let Slots { files, order, .. } = &mut *s;
            order.retain(|(g, p)| files.get(p).is_some_and(|(fg, _)| fg == g));
        }
        closed
    }

    /// Whether parking another file would close one.
    pub fn is_full(&self) -> bool {
        self.slots.lock().files.len() >= self.capacity
    }

    /// The file parked for `path`, if it is at version `identity` (any version when `None`).
    pub fn take(&self, path: &Path, identity: Option<Identity>) -> Option<Arc<dyn SourceFile>> {
        let (_, file) = self.slots.lock().files.remove(path.as_os_str())?;
        match identity {
            Some(id) if id != file.identity() => None,
            _ => Some(file),
        }
    }

    /// Files parked now.
    pub fn len(&self) -> usize {
        self.slots.lock().files.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    struct Fake(Identity, Arc<Path>);

    impl SourceFile for Fake {
        fn identity(&self) -> Identity {
            self.0
        }
        fn path(&self) -> &Arc<Path> {
            &self.1
        }
        fn read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<usize> {
            Ok(0)
        }
        fn current_identity(&self) -> io::Result<Identity> {
            Ok(self.0)
        }
        fn settled(&self, _read_start: std::time::SystemTime) -> bool {
            true
        }
    }

    fn id(n: u64) -> Identity {
        Identity {
            dev: 1,
            ino: n,
            size: 10,
            mtime_ns: 5,
            ctime_ns: 5,
        }
    }

    fn key(n: usize) -> FileKey {
        FileKey::from(Path::new(&format!("f{n}")))
    }

    #[test]
    fn a_parked_file_is_taken_once_and_only_at_its_version() {
        let parked = Parked::new(4);
        parked.park(key(1), Arc::new(Fake(id(1), Arc::from(Path::new("f")))));
        assert!(
            parked.take(&key(1), Some(id(2))).is_none(),
            "another version"
        );
        assert!(
            parked.take(&key(1), Some(id(1))).is_none(),
            "a mismatch closes it"
        );
        parked.park(key(1), Arc::new(Fake(id(1), Arc::from(Path::new("f")))));
        assert_eq!(
            parked.take(&key(1), Some(id(1))).map(|f| f.identity()),
            Some(id(1))
        );
        assert!(parked.take(&key(1), None).is_none(), "taken already");
    }

    #[test]
    fn the_oldest_parked_files_close_first_when_full() {
        const CAPACITY: usize = 128;
        let parked = Parked::new(CAPACITY);
        let mut closed = Vec::new();
        for n in 0..CAPACITY + 10 {
            assert_eq!(parked.is_full(), n >= CAPACITY);
            closed.extend(parked.park(
                key(n),
                Arc::new(Fake(id(n as u64), Arc::from(Path::new("f")))),
            ));
        }
        assert_eq!(closed, (0..10).map(key).collect::<Vec<_>>());
        assert_eq!(parked.len(), CAPACITY);
        assert!(parked.take(&key(0), None).is_none());
        assert!(parked.take(&key(9), None).is_none());
        assert!(parked.take(&key(10), None).is_some());
        assert!(parked.take(&key(CAPACITY + 9), None).is_some());
        // Parking again and taking many times keeps the order list bounded.
        for round in 0..10 {
            for n in 0..CAPACITY {
                parked.park(key(n), Arc::new(Fake(id(round), Arc::from(Path::new("f")))));
            }
        }
        assert_eq!(parked.len(), CAPACITY);
        assert!(parked.slots.lock().order.len() <= 2 * CAPACITY);
    }

    #[test]
    fn capacity_follows_the_open_file_limit() {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        let expected = (limit / 4).min(MAX_CAPACITY as u64) as usize;
        assert_eq!(Parked::for_open_file_limit().capacity, expected);
    }
}
