//! A directory's names as an opendir saw them, packed: one buffer of names and 8 bytes an entry,
//! where a vector of strings took ~85 bytes an entry (a 300k-entry directory held open cost
//! 25 MiB). Owns the packing only; the snapshot that holds it is charged to the memory budget
//! for as long as the directory is open. Must never touch the source.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::source::Kind;

/// Names, kinds, and for virtual directories each entry's fixed inode number.
#[derive(Default)]
pub struct Listing {
    names: Vec<u8>,
    /// End of each name in `names`, and its kind.
    entries: Vec<(u32, Kind)>,
    /// Inode numbers of a virtual directory's entries (empty for source directories).
    fixed: Vec<u64>,
}

impl Listing {
    /// The listing of `entries` (name, kind), names of at most 255 bytes each.
    pub fn of(entries: impl IntoIterator<Item = (impl AsRef<OsStr>, Kind)>) -> Listing {
        let mut listing = Listing::default();
        for (name, kind) in entries {
            listing.names.extend_from_slice(name.as_ref().as_bytes());
            // A listing of 4 GiB of names is beyond any directory a kernel lists.
            let end = u32::try_from(listing.names.len()).unwrap_or(u32::MAX);
            listing.entries.push((end, kind));
        }
        listing.names.shrink_to_fit();
        listing.entries.shrink_to_fit();
        listing
    }

    /// The listing of a virtual directory: entries with fixed inode numbers.
    pub fn fixed(entries: impl IntoIterator<Item = (impl AsRef<OsStr>, Kind, u64)>) -> Listing {
        let (pairs, inos): (Vec<_>, Vec<_>) = entries
            .into_iter()
            .map(|(name, kind, ino)| ((name.as_ref().to_owned(), kind), ino))
            .unzip();
        Listing {
            fixed: inos,
            ..Listing::of(pairs)
        }
    }

    /// Entries listed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entry `i`: its name, kind, and fixed inode number if it has one.
    pub fn get(&self, i: usize) -> Option<(&OsStr, Kind, Option<u64>)> {
        let &(end, kind) = self.entries.get(i)?;
        let start = match i {
            0 => 0,
            _ => self.entries[i - 1].0,
        };
        let name = self.names.get(start as usize..end as usize)?;
        Some((OsStr::from_bytes(name), kind, self.fixed.get(i).copied()))
    }

    /// Bytes it holds, as charged to the memory budget.
    pub fn bytes(&self) -> u64 {
        (self.names.capacity()
            + self.entries.capacity() * std::mem::size_of::<(u32, Kind)>()
            + self.fixed.capacity() * 8) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_back_in_order_with_their_kinds_in_a_fraction_of_the_memory() {
        let names: Vec<String> = (0..1000).map(|i| format!("n{i:06}.jpg")).collect();
        let listing = Listing::of(names.iter().map(|n| (n.as_str(), Kind::File)));
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
