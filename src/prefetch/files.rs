//! `Files`: one record per file of a set, the planner's table of what it has seen.
//!
//! Owns: each file's key (its path, shared with the inode that named it), the identity its
//! latest open saw, and a compact number (`FileId`) that every pass and position of the set uses
//! instead of the path, so a file's name lives once however many passes and maps hold it (a
//! pass costs 8 bytes per file, not a hashed copy of its key). Numbers are never reused while the
//! set lives. The index stores a 32-bit hash beside each number, so growing it at a million
//! files rehashes numbers, never paths (a rehash that read every path once dropped opens on the
//! planner thread). Must never do I/O: it is plain data owned by the planner thread.

use std::ffi::OsStr;
use std::hash::BuildHasher;
use std::path::Path;
use std::sync::Arc;

use hashbrown::HashTable;

use crate::source::{Identity, LastSeen};

/// A file of the set, by its path relative to the source root. Hashed and compared as the bytes
/// of its name (`OsStr`), not by `Path`'s component-wise rules: the planner hashes and compares
/// keys on every open, and `Path::hash` parsing components was a third of its CPU at 100,000
/// files. The paths come from the mount's own names, so two spellings of one file never meet.
/// Maps keyed by it are looked up with `path.as_os_str()`. The path is shared: a key made from an
/// inode's path (`From<&Arc<Path>>`) holds that node's allocation, not a copy.
#[derive(Clone)]
pub struct FileKey(Arc<Path>);

impl PartialEq for FileKey {
    fn eq(&self, other: &FileKey) -> bool {
        self.0.as_os_str() == other.0.as_os_str()
    }
}

impl Eq for FileKey {}

impl std::hash::Hash for FileKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.as_os_str().hash(state);
    }
}

impl PartialOrd for FileKey {
    fn partial_cmp(&self, other: &FileKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FileKey {
    fn cmp(&self, other: &FileKey) -> std::cmp::Ordering {
        self.0.as_os_str().cmp(other.0.as_os_str())
    }
}

impl std::fmt::Debug for FileKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl From<&Path> for FileKey {
    fn from(path: &Path) -> FileKey {
        FileKey(Arc::from(path))
    }
}

impl From<&Arc<Path>> for FileKey {
    fn from(path: &Arc<Path>) -> FileKey {
        FileKey(path.clone())
    }
}

impl FileKey {
    /// The path, shared.
    pub fn shared(&self) -> &Arc<Path> {
        &self.0
    }
}

impl std::ops::Deref for FileKey {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for FileKey {
    fn as_ref(&self) -> &Path {
        self
    }
}

impl std::borrow::Borrow<OsStr> for FileKey {
    fn borrow(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

/// A file's number in its set's `Files`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId(u32);

impl FileId {
    /// Its place in the table's columns (and in a pass's positions).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One index entry: a file's number and the low half of its key's hash.
#[derive(Clone, Copy)]
struct Slot {
    id: u32,
    hash: u32,
}

/// The table's hash of a slot, spread from its stored 32 bits over the 64 that `HashTable`
/// takes its bucket and tag bits from (an odd multiplier is a bijection on the low bits).
fn spread(hash: u32) -> u64 {
    u64::from(hash).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The files of one set, each once, by number.
#[derive(Clone, Default)]
pub struct Files {
    keys: Vec<FileKey>,
    /// 40 bytes a file (`LastSeen`), not an `Option`'s 48.
    identities: Vec<LastSeen>,
    index: HashTable<Slot>,
    hasher: foldhash::fast::RandomState,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files").field("len", &self.len()).finish()
    }
}

impl Files {
    fn hash(&self, name: &OsStr) -> u32 {
        self.hasher.hash_one(name.as_encoded_bytes()) as u32
    }

    /// The number of `path`, if the set has seen it.
    pub fn id(&self, path: &Path) -> Option<FileId> {
        let name = path.as_os_str();
        let hash = self.hash(name);
        let keys = &self.keys;
        self.index
            .find(spread(hash), |s| {
                s.hash == hash && keys[s.id as usize].as_os_str() == name
            })
            .map(|s| FileId(s.id))
    }

    /// The number of `file`, made when it is new; `identity`, when given, replaces what the set
    /// knew of it. The key is kept only for a new file (an existing one keeps its first key).
    /// `None` once the set has 2^32 - 1 files and `file` is not one of them.
    pub fn intern(&mut self, file: FileKey, identity: Option<Identity>) -> Option<FileId> {
        let hash = self.hash(file.as_os_str());
        let keys = &self.keys;
        let found = self.index.find(spread(hash), |s| {
            s.hash == hash && keys[s.id as usize] == file
        });
        let id = match found {
            Some(slot) => slot.id,
            None => {
                let id = u32::try_from(self.keys.len())
                    .ok()
                    .filter(|&id| id < u32::MAX)?;
                self.index
                    .insert_unique(spread(hash), Slot { id, hash }, |s| spread(s.hash));
                self.keys.push(file);
                self.identities.push(LastSeen::NONE);
                id
            }
        };
        if identity.is_some()
            && let Some(known) = self.identities.get_mut(id as usize)
        {
            *known = LastSeen::from(identity);
        }
        Some(FileId(id))
    }

    /// The key of `id`.
    pub fn key(&self, id: FileId) -> &FileKey {
        &self.keys[id.index()]
    }

    /// The identity the latest open of `id` saw (`None` for files no open identified, such as a
    /// view's).
    pub fn identity(&self, id: FileId) -> Option<Identity> {
        self.identities.get(id.index())?.get()
    }

    /// The identity the latest open of `path` saw.
    pub fn identity_of(&self, path: &Path) -> Option<Identity> {
        self.identity(self.id(path)?)
    }

    /// Files seen.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether none was seen.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> FileKey {
        FileKey::from(Path::new(name))
    }

    fn identity(size: u64) -> Identity {
        Identity {
            dev: 1,
            ino: size + 100,
            size,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }

    #[test]
    fn a_file_keeps_its_number_and_its_latest_identity() {
        let mut files = Files::default();
        let a = files.intern(key("a/x.jpg"), None).expect("numbered");
        let b = files
            .intern(key("a/y.jpg"), Some(identity(7)))
            .expect("numbered");
        assert_ne!(a, b);
        assert_eq!(files.intern(key("a/x.jpg"), None), Some(a));
        assert_eq!(files.identity(a), None, "no open identified it");
        assert_eq!(files.intern(key("a/x.jpg"), Some(identity(3))), Some(a));
        // An open without an identity does not forget the one known.
        assert_eq!(files.intern(key("a/x.jpg"), None), Some(a));
        assert_eq!(files.identity(a).map(|i| i.size), Some(3));
        assert_eq!(
            files.identity_of(Path::new("a/y.jpg")).map(|i| i.size),
            Some(7)
        );
        assert_eq!(files.id(Path::new("a/z.jpg")), None);
        assert_eq!(files.key(b), &key("a/y.jpg"));
        assert_eq!(files.len(), 2);
    }

    #[test]
    fn every_file_is_found_by_its_path_through_the_index_growing() {
        let mut files = Files::default();
        let names: Vec<String> = (0..50_000)
            .map(|i| format!("c{}/f{i:06}.jpg", i % 13))
            .collect();
        let ids: Vec<FileId> = (names.iter())
            .map(|n| files.intern(key(n), None).expect("numbered"))
            .collect();
        assert_eq!(files.len(), names.len());
        for (n, id) in names.iter().zip(&ids) {
            assert_eq!(files.id(Path::new(n)), Some(*id), "{n}");
            assert_eq!(files.key(*id).as_os_str(), n.as_str());
        }
    }
}
