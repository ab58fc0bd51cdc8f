//! The inode table: stable inode numbers for source paths, created lazily on lookup.
//!
//! Owns: the mapping inode number <-> (parent, name) <-> relative source path, the reserved
//! numbers of the virtual control files, the kernel's lookup count of each node, and name
//! validation. Nothing is walked at mount: an inode exists once the kernel has looked its name
//! up, and it is dropped once the kernel forgets it (`remember`/`forget`), so the table holds
//! what the kernel's caches hold, not every name ever seen. Numbers are never reused for the
//! life of the mount. Every node is charged to the memory budget while it lives (the cache
//! slice, so a growing table leaves the RAM tier less room), and under memory pressure the
//! dataset files' nodes are what the mount can ask the kernel to forget (`forgettable`): a later
//! lookup makes them again. Must never touch the source: it only names things.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;
use parking_lot::{Mutex, RwLock};

use crate::error::FsError;
use crate::memory::{MemoryBudget, Use};
use crate::source::{Identity, Kind, LastSeen};

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
pub const FIRST_SOURCE_INODE: u64 = 64;
/// Bit set in the number a listing shows for a name not looked up yet: never a node's number.
const LISTED_ONLY: u64 = 1 << 63;

/// The inode number a directory listing shows for `name` in `parent` before any lookup made it a
/// node: stable for the name, and never the number of a node (nodes count up from
/// `FIRST_SOURCE_INODE`). `stat` of the name then shows the node's own number.
pub fn listed_only(parent: u64, name: &OsStr) -> u64 {
    let mut key = parent.to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    xxhash_rust::xxh3::xxh3_64(&key) | LISTED_ONLY
}

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

/// Names `InodeTable::forgettable` copies per hold of the table's read lock.
const NAMES_PER_LOCK: usize = 4096;
/// Longest accepted name component, as Linux NAME_MAX.
pub const NAME_MAX: usize = 255;
/// Bytes a node holds beside its path's name bytes, as charged to the memory budget: the node
/// with its `Arc` (120, the allocator's 128-byte chunk), its entries in both maps (24) and its
/// path's `Arc` header and rounding (24): heaptrack of a daemon's peak at 100,000 looked-up files
/// (`benches/memory/heap.sh`; 320 was measured while the name index kept each name a second
/// time and the node took a 144-byte chunk).
const NODE_BYTES: u64 = 168;

/// A source entry known to the mount.
#[derive(Debug)]
pub struct Node {
    /// This node's inode number.
    pub ino: u64,
    /// The parent directory's inode number (the root is its own parent).
    pub parent: u64,
    /// Path relative to the source root (`.` for the root); shared with what keeps the path
    /// beyond the node (the RAM tier's entry, prefetch's keys), so it is stored once.
    pub path: Arc<Path>,
    /// Kind when the node was created; a kind change in the source makes a new node.
    pub kind: Kind,
    /// The identity seen by the most recent open, to detect a changed source file (`LastSeen`:
    /// 8 bytes less than an `Option`, which with its `Arc` took the node past the allocator's
    /// 128-byte chunk).
    last_identity: Mutex<LastSeen>,
    /// The view this node belongs to (`None`: the source tree itself). A view's file node names
    /// its source image: `path` is the image's, the name in the view adds `.npy`.
    pub view: Option<u16>,
    /// Lookups the kernel holds (answered and not yet forgotten).
    lookups: AtomicU64,
    /// The device the source entry was last seen on (0: not yet): where requests about it
    /// wait if the source hangs (`requests::Place`).
    pub device: AtomicU64,
}

impl Node {
    /// The identity the most recent open saw.
    pub fn last_identity(&self) -> Option<Identity> {
        self.last_identity.lock().get()
    }

    /// Forgets the identity the most recent open saw, returning it.
    pub fn take_last_identity(&self) -> Option<Identity> {
        std::mem::replace(&mut *self.last_identity.lock(), LastSeen::NONE).get()
    }

    /// Records `identity` as the one the most recent open saw; `changed` runs with the one before
    /// it when that differs, while the record is held, so two opens of a changing file drop its
    /// old versions in the order they saw them.
    pub fn saw(&self, identity: Identity, changed: impl FnOnce(Identity)) {
        let mut last = self.last_identity.lock();
        if let Some(old) = last.get()
            && old != identity
        {
            changed(old);
        }
        *last = LastSeen::from(Some(identity));
    }

    /// The name it has in its parent, in two parts: the source's name and the suffix a view adds
    /// (a view's image `x.jpg` is `x.jpg.npy` there).
    fn name_parts(&self) -> (&[u8], &[u8]) {
        let name = self.path.file_name().unwrap_or_default().as_bytes();
        let suffix: &[u8] = if self.view.is_some() && self.kind == Kind::File {
            b".npy"
        } else {
            b""
        };
        (name, suffix)
    }

    /// The name it has in its parent.
    fn name_in_parent(&self) -> OsString {
        let (name, suffix) = self.name_parts();
        OsStr::from_bytes(&[name, suffix].concat()).to_owned()
    }

    /// The hash of its name in its parent, as `Names` files it.
    fn name_hash(&self) -> u64 {
        let (name, suffix) = self.name_parts();
        name_hash(self.parent, &[name, suffix])
    }

    /// Whether it is `name` in `parent`.
    fn is_named(&self, parent: u64, name: &[u8]) -> bool {
        let (own, suffix) = self.name_parts();
        self.parent == parent
            && name.len() == own.len() + suffix.len()
            && name.starts_with(own)
            && name.ends_with(suffix)
    }
}

/// The hash of `name` (given in parts) in `parent`, the same however the name is split.
fn name_hash(parent: u64, name: &[&[u8]]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    hasher.update(&parent.to_le_bytes());
    for part in name {
        hasher.update(part);
    }
    hasher.digest()
}

/// (parent, name) -> inode number, storing only the number: a name lives once, in its node's
/// path, and lookups hash and compare through the node in `by_ino` (which holds every number
/// stored here).
#[derive(Default)]
struct Names(HashTable<u64>);

impl Names {
    fn get(&self, by_ino: &Nodes, parent: u64, name: &[u8]) -> Option<u64> {
        let named = |ino: &u64| by_ino.get(ino).is_some_and(|n| n.is_named(parent, name));
        self.0.find(name_hash(parent, &[name]), named).copied()
    }

    /// Points `node`'s name at it; `replace`: also when the name points at another node now.
    fn insert(&mut self, by_ino: &Nodes, node: &Node, replace: bool) {
        let (name, suffix) = node.name_parts();
        let full = [name, suffix].concat();
        let named = |ino: &u64| {
            by_ino
                .get(ino)
                .is_some_and(|n| n.is_named(node.parent, &full))
        };
        let rehash = |ino: &u64| by_ino.get(ino).map_or(0, |n| n.name_hash());
        match self.0.entry(node.name_hash(), named, rehash) {
            hashbrown::hash_table::Entry::Occupied(mut slot) if replace => {
                *slot.get_mut() = node.ino
            }
            hashbrown::hash_table::Entry::Occupied(_) => {}
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(node.ino);
            }
        }
    }

    /// Drops `node`'s name if it points at `node`.
    fn remove(&mut self, node: &Node) {
        if let Ok(slot) = self.0.find_entry(node.name_hash(), |ino| *ino == node.ino) {
            slot.remove();
        }
    }
}

/// The hash of an inode number. The numbers are the mount's own, counted up: a multiplicative
/// hash spreads them over the table's buckets (low bits) and tags (top bits).
fn ino_hash(ino: u64) -> u64 {
    ino.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// inode number -> node, storing only the node (its number lives in it).
#[derive(Default)]
struct Nodes(HashTable<Arc<Node>>);

impl Nodes {
    fn get(&self, ino: &u64) -> Option<&Arc<Node>> {
        self.0.find(ino_hash(*ino), |n| n.ino == *ino)
    }

    /// Adds `node` unless a node has its number; true when it did.
    fn insert(&mut self, node: Arc<Node>) -> bool {
        let ino = node.ino;
        match self
            .0
            .entry(ino_hash(ino), |n| n.ino == ino, |n| ino_hash(n.ino))
        {
            hashbrown::hash_table::Entry::Occupied(_) => false,
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(node);
                true
            }
        }
    }

    fn remove(&mut self, ino: u64) {
        if let Ok(found) = self.0.find_entry(ino_hash(ino), |n| n.ino == ino) {
            found.remove();
        }
    }

    fn values(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.0.iter()
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

#[derive(Default)]
struct Tables {
    by_ino: Nodes,
    by_name: Names,
    next: u64,
}

impl Tables {
    /// The node already named `name` in `parent`, if it still has `kind`.
    fn existing(&self, parent: u64, name: &OsStr, kind: Kind) -> Option<Arc<Node>> {
        self.by_name
            .get(&self.by_ino, parent, name.as_bytes())
            .and_then(|ino| self.by_ino.get(&ino))
            .filter(|node| node.kind == kind)
            .cloned()
    }

    /// Points `node`'s name at it (`Names::insert`).
    fn name(&mut self, node: &Node, replace: bool) {
        self.by_name.insert(&self.by_ino, node, replace);
    }
}

/// All nodes of one mount.
pub struct InodeTable {
    tables: RwLock<Tables>,
    /// Where the nodes are charged (none in unit tests of other modules).
    budget: Option<Arc<MemoryBudget>>,
}

/// Bytes `node` is charged: `NODE_BYTES` and its path.
fn charge_of(node: &Node) -> u64 {
    NODE_BYTES + node.path.as_os_str().len() as u64
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
        path: Arc::from(path),
        kind,
        last_identity: Mutex::new(LastSeen::NONE),
        view,
        lookups: AtomicU64::new(0),
        device: AtomicU64::new(0),
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
        tables.by_ino.insert(root);
        for index in 0..views.min(MAX_VIEWS) {
            let ino = FIRST_VIEW_ROOT + index as u64;
            let node = new_node(
                ino,
                VIEWS_DIR,
                PathBuf::from("."),
                Kind::Directory,
                Some(index as u16),
            );
            tables.by_ino.insert(node);
        }
        InodeTable {
            tables: RwLock::new(tables),
            budget: None,
        }
    }

    /// This table, charging its nodes to `budget`.
    pub fn charged_to(mut self, budget: Arc<MemoryBudget>) -> InodeTable {
        self.budget = Some(budget);
        self
    }

    fn charge(&self, node: &Node) {
        if let Some(budget) = &self.budget {
            budget.charge(Use::Cache, charge_of(node));
        }
    }

    fn release(&self, node: &Node) {
        if let Some(budget) = &self.budget {
            budget.release(Use::Cache, charge_of(node));
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
        if let Some(node) = self.tables.read().existing(parent.ino, name, kind) {
            return node;
        }
        let mut tables = self.tables.write();
        if let Some(node) = tables.existing(parent.ino, name, kind) {
            return node;
        }
        let ino = tables.next;
        tables.next += 1;
        let path = if *parent.path == *Path::new(".") {
            PathBuf::from(source_name)
        } else {
            parent.path.join(source_name)
        };
        let node = new_node(ino, parent.ino, path, kind, parent.view);
        self.charge(&node);
        tables.by_ino.insert(node.clone());
        tables.name(&node, true);
        node
    }

    /// The inode number `name` has in `parent` now, if the table knows it (creates nothing).
    pub fn find(&self, parent: u64, name: &OsStr) -> Option<u64> {
        let tables = self.tables.read();
        tables.by_name.get(&tables.by_ino, parent, name.as_bytes())
    }

    /// The node of view `view`'s file for the source image `image` (its path relative to the
    /// source root), if the table knows every directory on the way and the file (creates
    /// nothing).
    pub fn view_file(&self, view: u16, image: &Path) -> Option<Arc<Node>> {
        let tables = self.tables.read();
        let mut parent = FIRST_VIEW_ROOT + u64::from(view);
        let mut names = image.components().peekable();
        while let Some(component) = names.next() {
            let mut name = component.as_os_str().to_owned();
            if names.peek().is_none() {
                name.push(".npy");
            }
            parent = tables
                .by_name
                .get(&tables.by_ino, parent, name.as_bytes())?;
        }
        tables
            .by_ino
            .get(&parent)
            .filter(|node| node.kind == Kind::File && node.view == Some(view))
            .cloned()
    }

    /// Counts one lookup of `node` answered to the kernel (which now holds its number until it
    /// forgets it); puts the node back in the table if a `forget` raced it out.
    pub fn remember(&self, node: &Arc<Node>) {
        if node.lookups.fetch_add(1, Ordering::AcqRel) > 0 || node.ino < FIRST_SOURCE_INODE {
            return;
        }
        let mut tables = self.tables.write();
        if tables.by_ino.insert(node.clone()) {
            self.charge(node);
        }
        tables.name(node, false);
    }

    /// The kernel forgot `nlookup` lookups of `ino`; once none is left the node leaves the table
    /// (open handles keep their own reference). The root and virtual nodes always stay.
    pub fn forget(&self, ino: u64, nlookup: u64) {
        if ino < FIRST_SOURCE_INODE {
            return;
        }
        let Some(node) = self.get(ino) else { return };
        let left = node
            .lookups
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(nlookup))
            })
            .map_or(0, |n| n.saturating_sub(nlookup));
        if left > 0 {
            return;
        }
        let mut tables = self.tables.write();
        // A lookup may have been answered since: it counted under the read of `lookups`.
        if node.lookups.load(Ordering::Acquire) > 0 {
            return;
        }
        if tables
            .by_ino
            .get(&ino)
            .is_some_and(|n| Arc::ptr_eq(n, &node))
        {
            tables.by_ino.remove(ino);
            self.release(&node);
        }
        tables.by_name.remove(&node);
    }

    /// Up to half of the dataset files' nodes, the oldest first, as (parent, name in parent):
    /// what the mount may ask the kernel to forget under memory pressure (a lookup makes them
    /// again). Directories stay (their children name them), and so do views' files, whose
    /// renders made ahead and held for other jobs are found by inode number. Only the numbers
    /// are gathered under the table's lock (a forget or a lookup on a FUSE thread waits for it
    /// meanwhile), the names after it, `NAMES_PER_LOCK` at a time.
    pub fn forgettable(&self) -> Vec<(u64, OsString)> {
        let mut files: Vec<u64> = self
            .tables
            .read()
            .by_ino
            .values()
            .filter(|n| n.kind == Kind::File && n.view.is_none() && n.ino >= FIRST_SOURCE_INODE)
            .map(|n| n.ino)
            .collect();
        let half = files.len() / 2;
        if half == 0 {
            return Vec::new();
        }
        files.select_nth_unstable(half - 1);
        files.truncate(half);
        let mut names = Vec::with_capacity(half);
        for chunk in files.chunks(NAMES_PER_LOCK) {
            let tables = self.tables.read();
            // A node forgotten since is left out.
            names.extend(
                chunk
                    .iter()
                    .filter_map(|ino| tables.by_ino.get(ino))
                    .map(|n| (n.parent, n.name_in_parent())),
            );
        }
        names
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

    /// A node is made per file the kernel looks up: with its `Arc` header it fits the
    /// allocator's 128-byte chunk (a field widened past it costs 16 bytes per file).
    #[test]
    fn a_node_fits_a_128_byte_chunk() {
        let size = std::mem::size_of::<Node>();
        assert!(size + 16 <= 120, "Node is {size} bytes");
    }

    #[test]
    fn the_oldest_half_of_the_dataset_files_may_be_forgotten_by_name() {
        let table = InodeTable::with_views(1);
        let root = table.get(ROOT).expect("root");
        let dir = table.intern(&root, OsStr::new("d"), Kind::Directory);
        let files: Vec<Arc<Node>> = (0..10_000)
            .map(|i| table.intern(&dir, OsStr::new(&format!("f{i}")), Kind::File))
            .collect();
        let view_root = table.get(FIRST_VIEW_ROOT).expect("view root");
        table.intern_as(
            &view_root,
            OsStr::new("v.jpg.npy"),
            OsStr::new("v.jpg"),
            Kind::File,
        );
        let mut names = table.forgettable();
        names.sort();
        let mut oldest: Vec<(u64, OsString)> = files[..5_000]
            .iter()
            .map(|f| (dir.ino, f.name_in_parent()))
            .collect();
        oldest.sort();
        assert_eq!(
            names, oldest,
            "files only, the oldest half, by parent and name"
        );
    }

    #[test]
    fn a_node_keeps_the_latest_identity_and_says_which_it_replaced() {
        let node = new_node(
            FIRST_SOURCE_INODE,
            ROOT,
            PathBuf::from("a"),
            Kind::File,
            None,
        );
        let seen = |size| Identity {
            dev: 1,
            ino: 9,
            size,
            mtime_ns: 0,
            ctime_ns: 0,
        };
        assert_eq!(node.last_identity(), None);
        let mut replaced = Vec::new();
        node.saw(seen(1), |old| replaced.push(old.size));
        node.saw(seen(1), |old| replaced.push(old.size));
        node.saw(seen(2), |old| replaced.push(old.size));
        assert_eq!(replaced, [1], "only a change is reported");
        assert_eq!(node.last_identity(), Some(seen(2)));
        assert_eq!(node.take_last_identity(), Some(seen(2)));
        assert_eq!(node.last_identity(), None);
    }

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
        assert_eq!(*file.path, *Path::new("a/f"));
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
    fn forgotten_nodes_leave_the_table_and_numbers_are_never_reused() {
        let table = InodeTable::with_views(1);
        let root = table.get(ROOT).expect("root");
        let a = table.intern(&root, OsStr::new("a"), Kind::File);
        table.remember(&a);
        table.remember(&a);
        table.forget(a.ino, 1);
        assert!(table.get(a.ino).is_some(), "one lookup still held");
        table.forget(a.ino, 1);
        assert!(table.get(a.ino).is_none(), "forgotten");
        assert_eq!(table.find(ROOT, OsStr::new("a")), None);
        let again = table.intern(&root, OsStr::new("a"), Kind::File);
        assert!(again.ino > a.ino, "a new number, never the old one");
        // A lookup answered after the forget began puts the node back.
        table.remember(&a);
        assert!(table.get(a.ino).is_some());
        let view_root = FIRST_VIEW_ROOT;
        table.forget(view_root, 5);
        table.forget(ROOT, 5);
        assert!(table.get(view_root).is_some() && table.get(ROOT).is_some());
        let npy = table.intern_as(
            &table.get(view_root).expect("view root"),
            OsStr::new("x.jpg.npy"),
            OsStr::new("x.jpg"),
            Kind::File,
        );
        table.remember(&npy);
        assert_eq!(
            table.find(view_root, OsStr::new("x.jpg.npy")),
            Some(npy.ino)
        );
        table.forget(npy.ino, 1);
        assert_eq!(table.find(view_root, OsStr::new("x.jpg.npy")), None);
    }

    #[test]
    fn the_name_index_finds_every_node_through_growth_forgets_and_replacements() {
        let table = InodeTable::with_views(1);
        let root = table.get(ROOT).expect("root");
        let view_root = table.get(FIRST_VIEW_ROOT).expect("view root");
        let dirs: Vec<Arc<Node>> = (0..4)
            .map(|d| table.intern(&root, OsStr::new(&format!("d{d}")), Kind::Directory))
            .collect();
        let mut files = Vec::new();
        for i in 0..10_000 {
            let name = format!("f{i}.jpg");
            let file = table.intern(&dirs[i % 4], OsStr::new(&name), Kind::File);
            table.remember(&file);
            files.push((dirs[i % 4].ino, name, file));
        }
        let npy = table.intern_as(
            &view_root,
            OsStr::new("f1.jpg.npy"),
            OsStr::new("f1.jpg"),
            Kind::File,
        );
        for (parent, name, file) in &files {
            assert_eq!(table.find(*parent, OsStr::new(name)), Some(file.ino));
        }
        assert_eq!(
            table.find(FIRST_VIEW_ROOT, OsStr::new("f1.jpg.npy")),
            Some(npy.ino)
        );
        assert_eq!(table.find(FIRST_VIEW_ROOT, OsStr::new("f1.jpg")), None);
        assert_eq!(table.find(dirs[1].ino, OsStr::new("f1.jpg.npy")), None);
        for (_, _, file) in files.iter().step_by(2) {
            table.forget(file.ino, 1);
        }
        for (i, (parent, name, file)) in files.iter().enumerate() {
            let want = (i % 2 == 1).then_some(file.ino);
            assert_eq!(table.find(*parent, OsStr::new(name)), want, "{name}");
        }
        // A kind change points the name at the new node; forgetting the old one keeps it.
        let (parent, name, old) = &files[1];
        let dir = table.intern(&dirs[1], OsStr::new(name), Kind::Directory);
        assert_eq!(table.find(*parent, OsStr::new(name)), Some(dir.ino));
        table.forget(old.ino, 1);
        assert_eq!(table.find(*parent, OsStr::new(name)), Some(dir.ino));
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
