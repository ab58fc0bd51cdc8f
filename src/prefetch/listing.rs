//! `Listing`: one directory's files and subdirectories as a tree walk reads them (sorted by name
//! or in listing order), indexed so that a walk finds where to go on after a name in one lookup,
//! whatever the directory's size. Made on the planner's helper thread (`Chores`), since listing,
//! sorting and indexing a million-entry directory takes about a second. Must never be made on
//! the planner thread.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::source::{Kind, Source};

/// Names of one kind in a directory, in walk order, with where each stands (a prediction after a
/// file finds it in one lookup, whatever the directory's size). The names lie one after another
/// in one buffer: a name costs its bytes and 4 more, not a heap string of its own (the two tree
/// walks each keep a listing of every directory they walk, a million names for a flat dataset).
#[derive(Default)]
pub(super) struct Names {
    bytes: Vec<u8>,
    /// Where each name ends in `bytes`.
    ends: Vec<u32>,
    /// Position of each name by the xxh3 of its bytes (a colliding name keeps the first one's
    /// slot and is then not found: one prediction missed, never a wrong one).
    at: foldhash::HashMap<u64, u32>,
}

impl Names {
    /// `names`, indexed; `None` when their bytes pass what `ends` can address (4 GiB).
    fn index(names: Vec<OsString>) -> Option<Names> {
        let total: usize = names.iter().map(|n| n.len()).sum();
        u32::try_from(total).ok()?;
        let mut packed = Names {
            bytes: Vec::with_capacity(total),
            ends: Vec::with_capacity(names.len()),
            at: foldhash::HashMap::with_capacity_and_hasher(names.len(), Default::default()),
        };
        for (i, n) in names.iter().enumerate() {
            packed.bytes.extend_from_slice(n.as_bytes());
            packed.ends.push(packed.bytes.len() as u32);
            packed.at.entry(name_hash(n)).or_insert(i as u32);
        }
        Some(packed)
    }

    /// Where the names after `name` start (0 when `None`; the end when `name` is not there).
    pub(super) fn start_after(&self, name: Option<&OsStr>) -> usize {
        match name {
            Some(name) => self
                .at
                .get(&name_hash(name))
                .map(|&i| i as usize)
                .filter(|&i| self.get(i) == Some(name))
                .map_or(self.len(), |i| i + 1),
            None => 0,
        }
    }

    /// The names after `name` (all of them when `None`; none when `name` is not there).
    pub(super) fn after(&self, name: Option<&OsStr>) -> impl Iterator<Item = &OsStr> {
        (self.start_after(name)..self.len()).filter_map(|i| self.get(i))
    }

    /// The name at `i`.
    pub(super) fn get(&self, i: usize) -> Option<&OsStr> {
        let end = *self.ends.get(i)? as usize;
        let start = i.checked_sub(1).map_or(0, |p| self.ends[p] as usize);
        Some(OsStr::from_bytes(&self.bytes[start..end]))
    }

    /// How many names.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }
}

fn name_hash(name: &OsStr) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_encoded_bytes())
}

/// A directory's files and subdirectories, in walk order.
pub(super) struct Listing {
    pub(super) files: Names,
    pub(super) dirs: Names,
}

impl Listing {
    /// Lists `dir` of `source`, sorted by name or in listing order (on the helper thread: a
    /// million-entry directory takes about a second); `None` when the source cannot list it (or
    /// its names pass 4 GiB).
    pub(super) fn of(source: &dyn Source, dir: &Path, sorted: bool) -> Option<Listing> {
        let at = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let entries = source.list(at).ok()?;
        let (mut files, mut dirs) = (Vec::new(), Vec::new());
        for e in entries {
            match e.kind {
                Kind::File => files.push(e.name),
                Kind::Directory => dirs.push(e.name),
                Kind::Symlink | Kind::Other => {}
            }
        }
        if sorted {
            files.sort_unstable();
            dirs.sort_unstable();
        }
        Some(Listing {
            files: Names::index(files)?,
            dirs: Names::index(dirs)?,
        })
    }
}
