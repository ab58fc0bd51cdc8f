//! `Listing`: one directory's files and subdirectories as a tree walk reads them (sorted by name
//! or in listing order), indexed so that a walk finds where to go on after a name in one lookup,
//! whatever the directory's size. The names are packed once per directory and pass, sorted, and
//! shared by both walks (`Shelf`): the sorted walk reads them in place, the listed one through
//! the listing's order (8 bytes a name instead of a second packed copy and its index, ~33). Made
//! on the planner's helper thread (`Chores`), since listing, sorting and indexing a
//! million-entry directory takes about a second. Must never be made on the planner thread.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Weak};

use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::source::{Kind, Source};

/// Names of one kind in a directory, sorted by their bytes, with where each stands (a prediction
/// after a file finds it in one lookup, whatever the directory's size) and the order the
/// directory listed them in. The names lie one after another in one buffer: a name costs its
/// bytes and 16 more (its end, its slot in the index, and its place in the other order both
/// ways), not a heap string of its own. Sorted, because the sorted walk is the one loaders
/// follow most (ImageFolder sorts) and reads them in place; the listed walk reads them through
/// `listed`.
#[derive(Default)]
struct Packed {
    bytes: Vec<u8>,
    /// Where each name ends in `bytes`.
    ends: Vec<u32>,
    /// Each name's position, hashed by the xxh3 of its bytes and compared through `bytes`: 4
    /// bytes a name, not a hash and a position beside it.
    at: HashTable<u32>,
    /// `listed[i]`: the sorted position of the name listed `i`th.
    listed: Vec<u32>,
    /// `listed_at[k]`: where the `k`th name in sorted order stands in the listing.
    listed_at: Vec<u32>,
}

impl Packed {
    /// `names` in listing order, sorted and indexed; `None` when their bytes pass what `ends`
    /// can address (4 GiB).
    fn index(names: &[&OsStr]) -> Option<Packed> {
        let total: usize = names.iter().map(|n| n.len()).sum();
        u32::try_from(total).ok()?;
        let mut listed_at: Vec<u32> = (0..names.len() as u32).collect();
        listed_at.sort_unstable_by_key(|&i| names[i as usize]);
        let mut listed = vec![0; names.len()];
        for (k, &i) in listed_at.iter().enumerate() {
            listed[i as usize] = k as u32;
        }
        let mut packed = Packed {
            bytes: Vec::with_capacity(total),
            ends: Vec::with_capacity(names.len()),
            at: HashTable::with_capacity(names.len()),
            listed,
            listed_at,
        };
        for &i in &packed.listed_at {
            packed.bytes.extend_from_slice(names[i as usize].as_bytes());
            packed.ends.push(packed.bytes.len() as u32);
        }
        // Names of one directory are distinct: each goes in once.
        for k in 0..packed.ends.len() {
            let Packed {
                bytes, ends, at, ..
            } = &mut packed;
            let name = name_at(bytes, ends, k).unwrap_or_default();
            let rehash = |&j: &u32| name_hash(name_at(bytes, ends, j as usize).unwrap_or_default());
            at.insert_unique(name_hash(name), k as u32, rehash);
        }
        Some(packed)
    }

    /// Where `name` stands in sorted order.
    fn find(&self, name: &OsStr) -> Option<usize> {
        self.at
            .find(name_hash(name), |&k| self.get(k as usize) == Some(name))
            .map(|&k| k as usize)
    }

    /// The name at sorted position `k`.
    fn get(&self, k: usize) -> Option<&OsStr> {
        name_at(&self.bytes, &self.ends, k)
    }

    fn len(&self) -> usize {
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

/// Names of one kind in a directory, in walk order: the packed names as they lie (sorted), or
/// in the order the directory listed them.
pub(super) struct Names {
    packed: Arc<Packed>,
    sorted: bool,
}

impl Names {
    /// Where the names after `name` start (0 when `None`; the end when `name` is not there).
    pub(super) fn start_after(&self, name: Option<&OsStr>) -> usize {
        let Some(name) = name else { return 0 };
        match self.packed.find(name) {
            None => self.len(),
            Some(k) if self.sorted => k + 1,
            Some(k) => self.packed.listed_at[k] as usize + 1,
        }
    }

    /// The name at `i`.
    pub(super) fn get(&self, i: usize) -> Option<&OsStr> {
        if self.sorted {
            self.packed.get(i)
        } else {
            self.packed.get(*self.packed.listed.get(i)? as usize)
        }
    }

    /// How many names.
    pub(super) fn len(&self) -> usize {
        self.packed.len()
    }
}

/// A directory's files and subdirectories, in walk order.
pub(super) struct Listing {
    pub(super) files: Names,
    pub(super) dirs: Names,
}

/// A directory's packed names as one pass listed them.
struct Shelved {
    pass: u64,
    files: Weak<Packed>,
    dirs: Weak<Packed>,
}

/// The packed names of the directories the walks of a pass listed, while a walk keeps them: the
/// second walk to ask for a directory in a pass reads the first one's names instead of listing
/// and packing the directory again. Only the helper thread uses it.
#[derive(Default)]
pub(super) struct Shelf(Mutex<HashMap<OsString, Shelved>>);

/// Listings kept per tree walk before the walk clears its cache (bounds memory on huge trees).
pub(super) const LISTINGS_KEPT: usize = 4096;

/// Directories the shelf remembers before it forgets those no walk keeps any more (two walks'
/// kept listings).
const SHELVED: usize = 2 * LISTINGS_KEPT;

impl Shelf {
    /// `dir`'s packed (files, dirs) as pass `pass` listed them, while a walk keeps them.
    fn take(&self, pass: u64, dir: &Path) -> Option<(Arc<Packed>, Arc<Packed>)> {
        let shelf = self.0.lock();
        let shelved = shelf.get(dir.as_os_str()).filter(|s| s.pass == pass)?;
        Some((shelved.files.upgrade()?, shelved.dirs.upgrade()?))
    }

    fn put(&self, pass: u64, dir: &Path, files: &Arc<Packed>, dirs: &Arc<Packed>) {
        let mut shelf = self.0.lock();
        if shelf.len() >= SHELVED {
            shelf.retain(|_, s| s.pass == pass && s.files.strong_count() > 0);
        }
        shelf.insert(
            dir.as_os_str().to_owned(),
            Shelved {
                pass,
                files: Arc::downgrade(files),
                dirs: Arc::downgrade(dirs),
            },
        );
    }
}

impl Listing {
    /// `dir` of `source`, sorted by name or in listing order, as pass `pass` lists it: from the
    /// names `shelf` holds for that pass, else listed now (on the helper thread: a
    /// million-entry directory takes about a second); `None` when the source cannot list it (or
    /// its names pass 4 GiB).
    pub(super) fn of(
        source: &dyn Source,
        dir: &Path,
        sorted: bool,
        shelf: &Shelf,
        pass: u64,
    ) -> Option<Listing> {
        let (files, dirs) = match shelf.take(pass, dir) {
            Some(packed) => packed,
            None => {
                let (files, dirs) = Listing::packed(source, dir)?;
                let (files, dirs) = (Arc::new(files), Arc::new(dirs));
                shelf.put(pass, dir, &files, &dirs);
                (files, dirs)
            }
        };
        Some(Listing {
            files: Names {
                packed: files,
                sorted,
            },
            dirs: Names {
                packed: dirs,
                sorted,
            },
        })
    }

    /// The files and subdirectories of `dir`, packed in listing order.
    fn packed(source: &dyn Source, dir: &Path) -> Option<(Packed, Packed)> {
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
        Some((Packed::index(&files)?, Packed::index(&dirs)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<OsString> {
        (0..n)
            .map(|i| OsString::from(format!("f{:05}.jpg", (i * 7919) % n)))
            .collect()
    }

    #[test]
    fn every_name_is_found_where_it_stands_in_either_order() {
        let names = names(5_000);
        let borrowed: Vec<&OsStr> = names.iter().map(OsString::as_os_str).collect();
        let packed = Arc::new(Packed::index(&borrowed).expect("fits"));
        let mut sorted_names = borrowed.clone();
        sorted_names.sort_unstable();
        for (sorted, order) in [(false, &borrowed), (true, &sorted_names)] {
            let walk = Names {
                packed: packed.clone(),
                sorted,
            };
            assert_eq!(walk.len(), names.len());
            for (i, n) in order.iter().enumerate() {
                assert_eq!(walk.get(i), Some(*n), "sorted {sorted}");
                assert_eq!(walk.start_after(Some(n)), i + 1, "sorted {sorted}");
            }
            assert_eq!(walk.get(names.len()), None);
            assert_eq!(walk.start_after(None), 0);
            assert_eq!(walk.start_after(Some(OsStr::new("absent"))), walk.len());
        }
        let sorted = Names {
            packed,
            sorted: true,
        };
        let at = sorted.start_after(Some(OsStr::new("f04997.jpg")));
        let after: Vec<&OsStr> = (at..sorted.len()).filter_map(|i| sorted.get(i)).collect();
        assert_eq!(after, ["f04998.jpg", "f04999.jpg"]);
    }

    #[test]
    fn the_second_walk_of_a_pass_shares_the_first_ones_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        for n in ["b.jpg", "a.jpg", "c.jpg"] {
            std::fs::write(dir.path().join(n), b"x").expect("write");
        }
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        let source = crate::source::LocalSource::open(dir.path()).expect("source");
        let shelf = Shelf::default();
        let listed = Listing::of(&source, Path::new(""), false, &shelf, 1).expect("listed");
        let sorted = Listing::of(&source, Path::new(""), true, &shelf, 1).expect("listed");
        assert!(Arc::ptr_eq(&listed.files.packed, &sorted.files.packed));
        assert!(Arc::ptr_eq(&listed.dirs.packed, &sorted.dirs.packed));
        let in_order: Vec<&OsStr> = (0..3).filter_map(|i| sorted.files.get(i)).collect();
        assert_eq!(in_order, ["a.jpg", "b.jpg", "c.jpg"]);
        assert_eq!(sorted.dirs.get(0), Some(OsStr::new("sub")));
        // Another pass lists the directory again: it may have changed since.
        std::fs::write(dir.path().join("d.jpg"), b"x").expect("write");
        let next = Listing::of(&source, Path::new(""), true, &shelf, 2).expect("listed");
        assert_eq!(next.files.len(), 4);
        assert!(!Arc::ptr_eq(&next.files.packed, &listed.files.packed));
        // Once no walk keeps a directory's names, they are listed again too.
        drop((listed, sorted, next));
        let again = Listing::of(&source, Path::new(""), false, &shelf, 2).expect("listed");
        assert_eq!(again.files.len(), 4);
    }
}
