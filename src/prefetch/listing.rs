//! `Listing`: one directory's files and subdirectories as a tree walk reads them (sorted by name
//! or in listing order), indexed so that a walk finds where to go on after a name in one lookup,
//! whatever the directory's size. Made on the planner's helper thread (`Chores`), since listing,
//! sorting and indexing a million-entry directory takes about a second. Must never be made on
//! the planner thread.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use hashbrown::HashTable;

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
    /// Each name's position, hashed by the xxh3 of its bytes and compared through `bytes`: 4
    /// bytes a name, not a hash and a position beside it.
    at: HashTable<u32>,
}

impl Names {
    /// `names`, indexed; `None` when their bytes pass what `ends` can address (4 GiB).
    fn index(names: &[&OsStr]) -> Option<Names> {
        let total: usize = names.iter().map(|n| n.len()).sum();
        u32::try_from(total).ok()?;
        let mut packed = Names {
            bytes: Vec::with_capacity(total),
            ends: Vec::with_capacity(names.len()),
            at: HashTable::with_capacity(names.len()),
        };
        for n in names {
            packed.bytes.extend_from_slice(n.as_bytes());
            packed.ends.push(packed.bytes.len() as u32);
        }
        // Names of one directory are distinct: each goes in once.
        for (i, n) in names.iter().enumerate() {
            let Names { bytes, ends, at } = &mut packed;
            let rehash = |&j: &u32| name_hash(name_at(bytes, ends, j as usize).unwrap_or_default());
            at.insert_unique(name_hash(n), i as u32, rehash);
        }
        Some(packed)
    }

    /// Where the names after `name` start (0 when `None`; the end when `name` is not there).
    pub(super) fn start_after(&self, name: Option<&OsStr>) -> usize {
        match name {
            Some(name) => self
                .at
                .find(name_hash(name), |&i| self.get(i as usize) == Some(name))
                .map_or(self.len(), |&i| i as usize + 1),
            None => 0,
        }
    }

    /// The name at `i`.
    pub(super) fn get(&self, i: usize) -> Option<&OsStr> {
        name_at(&self.bytes, &self.ends, i)
    }

    /// How many names.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }
}

/// The name at `i` of names packed in `bytes`, each ending where `ends` says.
fn name_at<'a>(bytes: &'a [u8], ends: &[u32], i: usize) -> Option<&'a OsStr> {
    let end = *ends.get(i)? as usize;
    let start = i.checked_sub(1).map_or(0, |p| ends[p] as usize);
    Some(OsStr::from_bytes(&bytes[start..end]))
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
        // Borrowed from the source's packed entries: the only copy made is the one kept.
        let (mut files, mut dirs) = (Vec::new(), Vec::new());
        for (name, kind) in entries.iter() {
            match kind {
                Kind::File => files.push(name),
                Kind::Directory => dirs.push(name),
                Kind::Symlink | Kind::Other => {}
            }
        }
        if sorted {
            files.sort_unstable();
            dirs.sort_unstable();
        }
        Some(Listing {
            files: Names::index(&files)?,
            dirs: Names::index(&dirs)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    #[test]
    fn every_name_is_found_where_it_stands() {
        let names: Vec<OsString> = (0..5_000)
            .map(|i| OsString::from(format!("f{i:05}.jpg")))
            .collect();
        let borrowed: Vec<&OsStr> = names.iter().map(OsString::as_os_str).collect();
        let packed = Names::index(&borrowed).expect("fits");
        assert_eq!(packed.len(), names.len());
        for (i, n) in names.iter().enumerate() {
            assert_eq!(packed.get(i), Some(n.as_os_str()));
            assert_eq!(packed.start_after(Some(n)), i + 1);
        }
        assert_eq!(packed.start_after(None), 0);
        assert_eq!(packed.start_after(Some(OsStr::new("absent"))), packed.len());
        let at = packed.start_after(Some(OsStr::new("f04997.jpg")));
        let after: Vec<&OsStr> = (at..packed.len()).filter_map(|i| packed.get(i)).collect();
        assert_eq!(after, ["f04998.jpg", "f04999.jpg"]);
    }
}
