//! `Listing`: one directory's files and subdirectories as a tree walk reads them (sorted by name
//! or in listing order), indexed so that a walk finds where to go on after a name in one lookup,
//! whatever the directory's size. Made on the planner's helper thread (`Chores`), since listing,
//! sorting and indexing a million-entry directory takes about a second. Must never be made on
//! the planner thread.

use std::ffi::OsString;
use std::path::Path;

use crate::source::{Kind, Source};

/// Names of one kind in a directory, in walk order, with where each stands (a prediction after a
/// file finds it in one lookup, whatever the directory's size).
#[derive(Default)]
pub(super) struct Names {
    names: Vec<OsString>,
    /// Position of each name by the xxh3 of its bytes (a colliding name keeps the first one's
    /// slot and is then not found: one prediction missed, never a wrong one).
    at: foldhash::HashMap<u64, u32>,
}

impl Names {
    fn index(names: Vec<OsString>) -> Names {
        let mut at = foldhash::HashMap::with_capacity_and_hasher(names.len(), Default::default());
        for (i, n) in names.iter().enumerate() {
            at.entry(name_hash(n)).or_insert(i as u32);
        }
        Names { names, at }
    }

    /// Where the names after `name` start (0 when `None`; the end when `name` is not there).
    pub(super) fn start_after(&self, name: Option<&std::ffi::OsStr>) -> usize {
        match name {
            Some(name) => self
                .at
                .get(&name_hash(name))
                .map(|&i| i as usize)
                .filter(|&i| self.names.get(i).is_some_and(|n| n == name))
                .map_or(self.names.len(), |i| i + 1),
            None => 0,
        }
    }

    /// The names after `name` (all of them when `None`; none when `name` is not there).
    pub(super) fn after(&self, name: Option<&std::ffi::OsStr>) -> &[OsString] {
        &self.names[self.start_after(name)..]
    }

    /// The name at `i`.
    pub(super) fn get(&self, i: usize) -> Option<&OsString> {
        self.names.get(i)
    }

    /// How many names.
    pub(super) fn len(&self) -> usize {
        self.names.len()
    }
}

fn name_hash(name: &std::ffi::OsStr) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_encoded_bytes())
}

/// A directory's files and subdirectories, in walk order.
pub(super) struct Listing {
    pub(super) files: Names,
    pub(super) dirs: Names,
}

impl Listing {
    /// Lists `dir` of `source`, sorted by name or in listing order (on the helper thread: a
    /// million-entry directory takes about a second).
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
            files: Names::index(files),
            dirs: Names::index(dirs),
        })
    }
}
