//! `Deferred`: a source file version that is opened only if a read needs the source.
//!
//! Owns: opening the path on first use and checking that it is still the version the mount's
//! open saw. An open whose every block the cache (or the staging buffer) already holds takes its
//! identity from a stat and never opens the source file: on network storage an open is a round
//! trip, and prefetch is there to take those off the reader's path. Must never read bytes of
//! another version: if the path names another version by the time it is opened, reads fail.

use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;

use super::{Identity, Source, SourceFile};

/// A source file of a known identity, opened on first use.
pub struct Deferred {
    source: Arc<dyn Source>,
    path: Arc<Path>,
    identity: Identity,
    file: Mutex<Option<Arc<dyn SourceFile>>>,
}

impl Deferred {
    /// `path` of `source`, expected at version `identity`.
    pub fn new(source: Arc<dyn Source>, path: &Arc<Path>, identity: Identity) -> Deferred {
        Deferred {
            source,
            path: path.clone(),
            identity,
            file: Mutex::new(None),
        }
    }

    fn file(&self) -> io::Result<Arc<dyn SourceFile>> {
        let mut slot = self.file.lock();
        if let Some(f) = slot.as_ref() {
            return Ok(f.clone());
        }
        let f = self.source.open(&self.path)?;
        if f.identity() != self.identity {
            return Err(io::Error::other(
                "the source file changed since it was opened",
            ));
        }
        *slot = Some(f.clone());
        Ok(f)
    }
}

impl SourceFile for Deferred {
    fn identity(&self) -> Identity {
        self.identity
    }

    fn path(&self) -> &Arc<Path> {
        &self.path
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file()?.read_at(buf, offset)
    }

    fn current_identity(&self) -> io::Result<Identity> {
        self.file()?.current_identity()
    }

    fn settled(&self, read_start: SystemTime) -> bool {
        self.file().is_ok_and(|f| f.settled(read_start))
    }

    fn drop_page_cache(&self, range: Range<u64>) {
        if let Some(f) = self.file.lock().as_ref() {
            f.drop_page_cache(range);
        }
    }
}
