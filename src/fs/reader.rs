//! `FileReader`: what one open handle of a dataset file reads through.
//!
//! Owns the handle's state: the source file at the version the open saw, that version's RAM
//! tier entry, the last block it decompressed (so small sequential reads of a packed block
//! decompress it once), and its sequential readahead. Reads go one way: the RAM tier, then
//! `BlockFetcher`, which owns everything below. Must never read the source itself and never
//! serve bytes of another version than the one it was opened at.

use std::sync::Arc;

use crate::cache::{BlockFetcher, RamFile, ReadBytes, Unpacked};
use crate::error::FsError;
use crate::prefetch::{Prefetcher, Readahead};
use crate::source::SourceFile;

/// The reading state of one open handle.
pub struct FileReader {
    source: Arc<dyn SourceFile>,
    entry: Arc<RamFile>,
    memo: Unpacked,
    readahead: Readahead,
}

impl FileReader {
    /// A reader of `entry`'s version through `source` (opened at that version).
    pub fn new(source: Arc<dyn SourceFile>, entry: Arc<RamFile>) -> FileReader {
        FileReader {
            source,
            entry,
            memo: Unpacked::default(),
            readahead: Readahead::default(),
        }
    }

    /// The RAM tier's entry of the file version this reads.
    pub fn entry(&self) -> &Arc<RamFile> {
        &self.entry
    }

    /// Answers a read from the RAM tier alone; `None` means `read` is needed (it may wait).
    pub fn read_cached(&self, offset: u64, len: u32) -> Option<ReadBytes> {
        self.entry.read_cached(offset, len, &self.memo)
    }

    /// Answers a read, fetching what the RAM tier misses through `fetcher`. May wait on the
    /// source: never on a FUSE thread.
    pub fn read(
        &self,
        fetcher: &BlockFetcher,
        offset: u64,
        len: u32,
    ) -> Result<ReadBytes, FsError> {
        fetcher.read(&self.entry, self.source.as_ref(), offset, len, &self.memo)
    }

    /// After a read of `len` bytes at `offset`: lets `prefetcher` fetch ahead of a sequential
    /// reader.
    pub fn read_ahead(&self, prefetcher: &Prefetcher, offset: u64, len: u64) {
        prefetcher.readahead(&self.readahead, &self.entry, &self.source, offset, len);
    }
}
