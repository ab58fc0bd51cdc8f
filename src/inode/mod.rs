//! The inode table: stable inode numbers for source paths, created lazily on lookup.
//!
//! Owns: the mapping inode number <-> (parent, name) <-> relative source path, the reserved
//! numbers of the virtual control files, and name validation. Nothing is walked at mount: an
//! inode exists once the kernel (or a readdir) has asked for its name. Numbers are never reused
//! for the life of the mount. Must never touch the source: it only names things.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::{Mutex, RwLock};

use crate::error::FsError;
use crate::source::{Identity, Kind};

/// Inode of the mount root (the FUSE protocol fixes it at 1).
pub const ROOT: u64 = 1;
/// Inode of the hidden control directory `.prepfs`.
pub const CONTROL_DIR: u64 = 2;
/// Inode of `.prepfs/stats.json`.
pub const STATS_FILE: u64 = 3;
/// Inode of `.prepfs/metrics` (Prometheus text).
pub const METRICS_FILE: u64 = 4;
/// Inode of `.prepfs/views`, the parent of every view's tree.
pub const VIEWS_DIR: u64 = 5;
/// Inode of the first view's root (`.prepfs/views/<name>`); view `i` has `FIRST_VIEW_ROOT + i`.
pub const FIRST_VIEW_ROOT: u64 = 16;
/// Most views one mount can define (their roots fill the numbers up to the first source inode).
pub const MAX_VIEWS: usize = (FIRST_SOURCE_INODE - FIRST_VIEW_ROOT) as usize;
/// First inode handed to a source entry; the gap leaves room for more virtual files.
const FIRST_SOURCE_INODE: u64 = 64;

/// Name of the control directory in the mount root (reachable, never listed).
pub const CONTROL_DIR_NAME: &str = ".prepfs";

/// The dataset path, relative to the source root, that `path` names in a mount at `mountpoint`:
/// `path` is relative to the mount root or absolute under `mountpoint`, and a path inside a view
/// (`.prepfs/views/NAME/x.jpg.npy`, or a directory of one) stands for its source
/// (`x.jpg`); a view's root stands for the dataset root, the empty path. `None` for paths outside
/// the mount, with `..`, or naming the control files. Names only: nothing is checked to exist.
pub fn dataset_path(path: &Path, mountpoint: &Path) -> Option<PathBuf> {
    let relative = if path.is_absolute() {
        path.strip_prefix(mountpoint).ok()?
    } else {
        path
    };
    let mut parts = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            _ => return None,
        }
    }
    if parts.first().is_some_and(|p| *p == CONTROL_DIR_NAME) {
        if parts.len() < 3 || parts[1] != "views" {
            return None;
        }
        let mut path: PathBuf = parts[3..].iter().collect();
        let source = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".npy"))
            .map(str::to_owned);
        if let Some(source) = source {
            path.set_file_name(source);
        }
        return Some(path);
    }
    Some(parts.into_iter().collect())
}

/// Longest accepted name component, as Linux NAME_MAX.
const NAME_MAX: usize = 255;

/// A source entry known to the mount.
#[derive(Debug)]
pub struct Node {
    /// This node's inode number.
    pub ino: u64,
    /// The parent directory's inode number (the root is its own parent).
    pub parent: u64,
    /// Path relative to the source root (`.` for the root).
    pub path: PathBuf,
    /// Kind when the node was created; a kind change in the source makes a new node.
    pub kind: Kind,
    /// The identity seen by the most recent open, to detect a changed source file.
    pub last_identity: Mutex<Option<Identity>>,
    /// The view this node belongs to (`None`: the source tree itself). A view's file node names
    /// its source image: `path` is the image's, the name in the view adds `.npy`.
    pub view: Option<u16>,
    /// Opens so far (view files: the open count seeds each open's augmentation).
    pub opens: AtomicU64,
}

#[derive(Default)]
struct Tables {
    by_ino: HashMap<u64, Arc<Node>>,
    by_name: HashMap<(u64, OsString), u64>,
    next: u64,
}

impl Tables {
    /// The node already named `key`, if it still has `kind`.
    fn existing(&self, key: &(u64, OsString), kind: Kind) -> Option<Arc<Node>> {
        self.by_name
            .get(key)
            .and_then(|ino| self.by_ino.get(ino))
            .filter(|node| node.kind == kind)
            .cloned()
    }
}

/// All nodes of one mount.
pub struct InodeTable {
    tables: RwLock<Tables>,
}

impl Default for InodeTable {
    fn default() -> Self {
        InodeTable::with_views(0)
    }
}

fn new_node(ino: u64, parent: u64, path: PathBuf, kind: Kind, view: Option<u16>) -> Arc<Node> {
    Arc::new(Node {
        ino,
        parent,
        path,
        kind,
        last_identity: Mutex::new(None),
        view,
        opens: AtomicU64::new(0),
    })
}

impl InodeTable {
    /// A table with the root and the roots of `views` views (at most `MAX_VIEWS`), each of
    /// which mirrors the source root.
    pub fn with_views(views: usize) -> InodeTable {
        let mut tables = Tables {
            next: FIRST_SOURCE_INODE,
            ..Tables::default()
        };
        let root = new_node(ROOT, ROOT, PathBuf::from("."), Kind::Directory, None);
        tables.by_ino.insert(ROOT, root);
        for index in 0..views.min(MAX_VIEWS) {
            let ino = FIRST_VIEW_ROOT + index as u64;
            let node = new_node(
                ino,
                VIEWS_DIR,
                PathBuf::from("."),
                Kind::Directory,
                Some(index as u16),
            );
            tables.by_ino.insert(ino, node);
        }
        InodeTable {
            tables: RwLock::new(tables),
        }
    }
}

impl InodeTable {
    /// The node with inode number `ino`.
    pub fn get(&self, ino: u64) -> Option<Arc<Node>> {
        self.tables.read().by_ino.get(&ino).cloned()
    }

    /// The node for `name` in `parent`, created with a fresh number if new or if its kind changed.
    pub fn intern(&self, parent: &Node, name: &OsStr, kind: Kind) -> Arc<Node> {
        self.intern_as(parent, name, name, kind)
    }

    /// Like `intern`, for an entry whose source path ends in `source_name` rather than `name`
    /// (a view's `x.jpg.npy` stands for `x.jpg`). The node belongs to its parent's view.
    pub fn intern_as(
        &self,
        parent: &Node,
        name: &OsStr,
        source_name: &OsStr,
        kind: Kind,
    ) -> Arc<Node> {
        let key = (parent.ino, name.to_owned());
        if let Some(node) = self.tables.read().existing(&key, kind) {
            return node;
        }
        let mut tables = self.tables.write();
        if let Some(node) = tables.existing(&key, kind) {
            return node;
        }
        let ino = tables.next;
        tables.next += 1;
        let path = if parent.path == Path::new(".") {
            PathBuf::from(source_name)
        } else {
            parent.path.join(source_name)
        };
        let node = new_node(ino, parent.ino, path, kind, parent.view);
        tables.by_ino.insert(ino, node.clone());
        tables.by_name.insert(key, ino);
        node
    }

    /// Number of source nodes known (the root included).
    pub fn len(&self) -> usize {
        self.tables.read().by_ino.len()
    }

    /// Whether only the root is known.
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }
}

/// Checks that `name` is a single, ordinary path component.
pub fn validate_name(name: &OsStr) -> Result<&Path, FsError> {
    let bytes = name.as_bytes();
    if bytes.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if bytes.is_empty()
        || bytes == b"."
        || bytes == b".."
        || bytes.contains(&b'/')
        || bytes.contains(&0)
    {
        return Err(FsError::InvalidName);
    }
    Ok(Path::new(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_escape_or_are_empty_are_rejected() {
        for bad in ["", ".", "..", "a/b", "/etc", "a\0b"] {
            assert_eq!(
                validate_name(OsStr::new(bad)).err(),
                Some(FsError::InvalidName),
                "{bad:?}"
            );
        }
        assert_eq!(
            validate_name(OsStr::new(&"x".repeat(256))).err(),
            Some(FsError::NameTooLong)
        );
        assert!(validate_name(OsStr::new("ünïcode ✓.jpg")).is_ok());
    }

    #[test]
    fn inode_numbers_are_stable_and_change_with_kind() {
        let table = InodeTable::default();
        let root = table.get(ROOT).expect("root exists");
        let a = table.intern(&root, OsStr::new("a"), Kind::Directory);
        let again = table.intern(&root, OsStr::new("a"), Kind::Directory);
        assert_eq!(a.ino, again.ino);
        let file = table.intern(&a, OsStr::new("f"), Kind::File);
        assert_eq!(file.path, Path::new("a/f"));
        let replaced = table.intern(&root, OsStr::new("a"), Kind::File);
        assert_ne!(
            replaced.ino, a.ino,
            "a kind change must not reuse the old inode"
        );
        assert_eq!(
            table.get(a.ino).map(|n| n.ino),
            Some(a.ino),
            "old number stays valid"
        );
    }

    #[test]
    fn paths_in_a_mount_name_their_dataset_files_and_views_stand_for_their_sources() {
        let mnt = Path::new("/mnt/d");
        let cases = [
            ("a/b.jpg", Some("a/b.jpg")),
            ("./a/b.jpg", Some("a/b.jpg")),
            ("/mnt/d/a/b.jpg", Some("a/b.jpg")),
            ("/mnt/d", Some("")),
            (".prepfs/views/v/train/c.jpg.npy", Some("train/c.jpg")),
            ("/mnt/d/.prepfs/views/v/train", Some("train")),
            (".prepfs/views/v", Some("")),
            (".prepfs/views", None),
            (".prepfs/stats.json", None),
            ("/elsewhere/a.jpg", None),
            ("a/../../etc/passwd", None),
        ];
        for (path, want) in cases {
            assert_eq!(
                dataset_path(Path::new(path), mnt),
                want.map(PathBuf::from),
                "{path}"
            );
        }
    }
}
