//! A directory's names as an opendir saw them, packed (`DirEntries`: one buffer of names and
//! 8 bytes an entry, where a vector of strings took ~85 bytes an entry; a 300k-entry directory
//! held open cost 25 MiB). Owns what a snapshot adds to the source's entries (the fixed inode
//! numbers of virtual directories); the snapshot that holds it is charged to the memory budget
//! for as long as the directory is open. Must never touch the source.

use std::ffi::OsStr;

use crate::source::{DirEntries, Kind};

/// Names, kinds, and for virtual directories each entry's fixed inode number.
#[derive(Default)]
pub struct Listing {
    entries: DirEntries,
    /// Inode numbers of a virtual directory's entries (empty for source directories).
    fixed: Vec<u64>,
}

/// The listing of `entries` as they are.
impl From<DirEntries> for Listing {
    fn from(mut entries: DirEntries) -> Listing {
        entries.shrink_to_fit();
        Listing {
            entries,
            fixed: Vec::new(),
        }
    }
}

impl Listing {
    /// The listing of `entries` (name, kind), names of at most 255 bytes each.
    pub fn of<'a>(entries: impl IntoIterator<Item = (&'a OsStr, Kind)>) -> Listing {
        let mut packed = DirEntries::default();
        for (name, kind) in entries {
            // 4 GiB of names is beyond any directory a kernel lists: the rest is left out.
            if packed.push(name, kind).is_err() {
                break;
            }
        }
        Listing::from(packed)
    }

    /// The listing of a virtual directory: entries with fixed inode numbers.
    pub fn fixed<'a>(entries: impl IntoIterator<Item = (&'a str, Kind, u64)>) -> Listing {
        let mut fixed = Vec::new();
        let mut listing = Listing::of(entries.into_iter().map(|(name, kind, ino)| {
            fixed.push(ino);
            (OsStr::new(name), kind)
        }));
        listing.fixed = fixed;
        listing
    }

    /// Entries listed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entry `i`: its name, kind, and fixed inode number if it has one.
    pub fn get(&self, i: usize) -> Option<(&OsStr, Kind, Option<u64>)> {
        let (name, kind) = self.entries.get(i)?;
        Some((name, kind, self.fixed.get(i).copied()))
    }

    /// Bytes it holds, as charged to the memory budget.
    pub fn bytes(&self) -> u64 {
        self.entries.bytes() + (self.fixed.capacity() * 8) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_back_in_order_with_their_kinds_in_a_fraction_of_the_memory() {
        let names: Vec<String> = (0..1000).map(|i| format!("n{i:06}.jpg")).collect();
        let listing = Listing::of(names.iter().map(|n| (OsStr::new(n), Kind::File)));
        assert_eq!(listing.len(), 1000);
        for (i, n) in names.iter().enumerate() {
            assert_eq!(listing.get(i), Some((OsStr::new(n), Kind::File, None)));
        }
        assert_eq!(listing.get(1000), None);
        assert!(listing.bytes() <= 1000 * (11 + 8), "{}", listing.bytes());
        let virt = Listing::fixed([("stats.json", Kind::File, 3), ("views", Kind::Directory, 5)]);
        assert_eq!(
            virt.get(1),
            Some((OsStr::new("views"), Kind::Directory, Some(5)))
        );
    }
}
