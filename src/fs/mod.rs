//! The filesystem core: read-only semantics of the mount, free of any FUSE type.
//!
//! Owns: lookup/getattr/readlink/open/read/release/opendir/readdir/statfs, file and directory
//! handles, the hidden control directory `.prepfs` with its snapshot files, and the staleness rule
//! (a changed source file is a new cache key; the old entry is dropped on the next open). Each
//! request dispatches once on the tree its inode is in (`tree`: dataset, control, views), which
//! also says whether it may wait on the source (`Fs::needs_source`). Tests
//! drive it directly; the `fuse` adapter only translates. Reaches data only through `Source` and
//! the cache. Must never block a caller of `read_cached` on the source, and never serve bytes of
//! two versions of one file through one handle.

mod listing;
pub mod metrics;
mod reader;
#[cfg(test)]
mod tests;
mod tree;
mod views;

pub use reader::FileReader;

pub use crate::renders::{View, Views};
pub use metrics::{Figures, FsMetrics};
pub use tree::Ask;

use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cache::{BLOCK_SIZE, BlockFetcher, RamFile, ReadBytes};
use crate::error::FsError;
use crate::inode::{
    self, CONTROL_DIR, CONTROL_DIR_NAME, InodeTable, METRICS_FILE, Node, ROOT, STATS_FILE,
    VIEWS_DIR,
};
use crate::memory::{MemoryBudget, Work};
use crate::metrics::{Samples, to_json_text, to_prometheus_text};
use crate::prefetch::Prefetcher;
use crate::requests::Place;
use crate::shards::ShardedMap;
use crate::source::{Deferred, Kind, Meta, Source, SourceFile, SpaceStats};
use listing::Listing;
use tree::{Control, Tree};

/// How long the kernel may trust names and attributes of source entries. The tree is read-only
/// through the mount; changes made in the source are picked up on open (see `open`).
const SOURCE_TTL: Duration = Duration::from_secs(3600);

/// What file-system semantics take from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct FsOptions {
    /// Offer kernel passthrough for fully cached files (needs root and Linux >= 6.9).
    pub passthrough: bool,
    /// Owner shown for the virtual control files.
    pub owner: (u32, u32),
}

/// Attributes of one node, with how long the kernel may cache them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Node kind.
    pub kind: Kind,
    /// Size in bytes.
    pub size: u64,
    /// Allocated 512-byte blocks.
    pub blocks: u64,
    /// Permission bits.
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// Preferred I/O size (st_blksize): what buffered readers read at once.
    pub io_block: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Access time, ns since the epoch.
    pub atime_ns: i64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
    /// Status change time, ns since the epoch.
    pub ctime_ns: i64,
    /// How long the kernel may cache this answer.
    pub valid_for: Duration,
}

/// How the kernel should serve an opened file's reads.
pub enum Serve {
    /// Every read comes to the daemon (direct I/O: the page cache does not keep a second copy).
    Daemon,
    /// The kernel reads the fully cached bytes itself from this entry's memfd.
    Passthrough(Arc<RamFile>),
}

/// Extended attribute of each dataset file telling how much of it the cache tiers hold (see
/// `Fs::xattr`); the only one the mount has.
pub const CACHED_XATTR: &str = "user.prepfs.cached";

/// The one extended-attribute namespace the mount supports (it holds `CACHED_XATTR`).
const USER_XATTR_NAMESPACE: &[u8] = b"user.";

/// What an open is for, as its flags say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Any write, truncate or append intent: refused, the mount is read-only.
    Write,
    /// A reader's open: an access the epoch tracker and the predictors learn from.
    Read,
    /// An open with `O_NOATIME`, as `prepfs warm` makes: served like `Read` but not counted as an
    /// access, so warming the cache does not look like an epoch of training.
    Quiet,
}

/// A successful open.
pub struct Opened {
    /// The handle for later reads and the release.
    pub fh: u64,
    /// How reads are served.
    pub serve: Serve,
}

/// One directory entry as listed.
#[derive(Debug, Clone)]
pub struct DirItem {
    /// Inode number of the entry.
    pub ino: u64,
    /// Kind of the entry.
    pub kind: Kind,
    /// Name of the entry.
    pub name: OsString,
}

enum Handle {
    File(FileReader),
    Snapshot(Arc<Vec<u8>>),
    View(Arc<crate::renders::ViewOpen>),
    Dir(DirSnapshot),
}

impl Handle {
    /// Whether it is an item a loader fetches (a source file or a view tensor), not a control
    /// file or a directory: what telemetry counts as requests and load latency.
    fn is_item(&self) -> bool {
        matches!(self, Handle::File(_) | Handle::View(_))
    }
}

/// An open handle and when it was opened: an item's load latency runs from its open to its
/// release.
struct Open {
    handle: Handle,
    since: Instant,
}

/// The names of a directory as seen at opendir.
struct DirSnapshot {
    /// The directory itself (interns children); the root stands in for the control directory.
    node: Arc<Node>,
    /// Inode numbers shown for `.` and `..`.
    dots: (u64, u64),
    /// Names, kinds, and fixed inode numbers for virtual entries.
    names: Listing,
    /// The listing's charge to the memory budget, while the directory is open.
    _charge: Work,
}

/// The state of one mount.
pub struct Fs {
    source: Arc<dyn Source>,
    options: FsOptions,
    inodes: Arc<InodeTable>,
    /// The cache tiers' fetch chain: what a file handle reads through.
    fetcher: Arc<BlockFetcher>,
    /// Infers epochs from opens and fetches ahead of the readers.
    prefetcher: Arc<Prefetcher>,
    /// The tensor views and their renders.
    views: Arc<Views>,
    /// What the control files show (and the pieces of the mount that run in the background).
    board: Box<dyn Report>,
    handles: ShardedMap<u64, Arc<Open>>,
    next_fh: AtomicU64,
    metrics: Arc<FsMetrics>,
}

/// What `crate::daemon::build` hands a file system: the pieces its semantics use.
pub struct Parts {
    /// The mount's nodes (shared with render-ahead, which finds the view files prefetch
    /// predicts).
    pub inodes: Arc<InodeTable>,
    /// The dataset.
    pub source: Arc<dyn Source>,
    /// The fetch chain of the cache tiers.
    pub fetcher: Arc<BlockFetcher>,
    /// Epoch inference and prefetch.
    pub prefetcher: Arc<Prefetcher>,
    /// The view service.
    pub views: Arc<Views>,
    /// The file system's counters.
    pub metrics: Arc<FsMetrics>,
    /// What the control files show.
    pub board: Box<dyn Report>,
}

/// What the control files show, gathered from the pieces of the mount (see `crate::daemon`):
/// `stats.json` renders the samples and the documents, `metrics` the samples alone.
pub trait Report: Send + Sync {
    /// Every figure of the mount now; `fs` holds the file system's own gauges.
    fn samples(&self, fs: Figures) -> Samples;
    /// What `stats.json` shows beside the samples that is not a number, each at its path.
    fn documents(&self) -> Vec<(String, serde_json::Value)>;
}

impl Fs {
    /// The file system over the pieces `crate::daemon::build` wired for it.
    pub fn new(options: FsOptions, parts: Parts) -> Fs {
        Fs {
            inodes: parts.inodes,
            source: parts.source,
            fetcher: parts.fetcher,
            prefetcher: parts.prefetcher,
            views: parts.views,
            board: parts.board,
            metrics: parts.metrics,
            options,
            handles: ShardedMap::default(),
            next_fh: AtomicU64::new(1),
        }
    }

    /// The file system's counters.
    pub fn metrics(&self) -> &FsMetrics {
        &self.metrics
    }

    /// Dataset files' names the kernel may be asked to forget when metadata outgrows the
    /// memory budget, as (parent, name): see `InodeTable::forgettable`.
    pub fn forgettable(&self) -> Vec<(u64, OsString)> {
        self.inodes.forgettable()
    }

    /// The mount's memory budget.
    pub fn memory(&self) -> &Arc<MemoryBudget> {
        self.fetcher.ram().budget()
    }

    fn node(&self, ino: u64) -> Result<Arc<Node>, FsError> {
        self.inodes.get(ino).ok_or(FsError::NotFound)
    }

    fn stat_node(&self, node: &Node) -> Result<Meta, FsError> {
        let meta = self
            .source
            .stat(&node.path)
            .map_err(|e| FsError::from_source(&e));
        match meta {
            // The name now refers to something else, or nothing: this inode is gone, and so is
            // the version the cache held for it.
            Ok(meta) if meta.kind == node.kind => {
                node.device.store(meta.identity.dev, Ordering::Relaxed);
                Ok(meta)
            }
            Ok(_) | Err(FsError::NotFound) => {
                if let Some(old) = node.take_last_identity() {
                    self.fetcher.forget(&old);
                }
                Err(FsError::NotFound)
            }
            Err(e) => Err(e),
        }
    }

    fn source_attr(ino: u64, meta: &Meta) -> Attr {
        Attr {
            ino,
            kind: meta.kind,
            size: meta.identity.size,
            blocks: meta.blocks,
            perm: meta.perm,
            nlink: meta.nlink,
            io_block: BLOCK_SIZE as u32,
            uid: meta.uid,
            gid: meta.gid,
            atime_ns: meta.atime_ns,
            mtime_ns: meta.identity.mtime_ns,
            ctime_ns: meta.identity.ctime_ns,
            valid_for: SOURCE_TTL,
        }
    }

    /// Attributes of a node of the control tree.
    fn control_attr(&self, control: Control) -> Attr {
        match control {
            Control::Dir => self.virtual_dir_attr(CONTROL_DIR),
            Control::Stats | Control::Metrics => {
                let size = self.snapshot(control).len() as u64;
                self.make_virtual_attr(control.ino(), Kind::File, 0o444, size)
            }
        }
    }

    /// The control directories never change during a mount, so the kernel may keep them as long
    /// as source entries: every path into a view passes three of them (`.prepfs/views/NAME`).
    fn virtual_dir_attr(&self, ino: u64) -> Attr {
        Attr {
            valid_for: SOURCE_TTL,
            ..self.make_virtual_attr(ino, Kind::Directory, 0o555, 0)
        }
    }

    fn make_virtual_attr(&self, ino: u64, kind: Kind, perm: u16, size: u64) -> Attr {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        Attr {
            ino,
            kind,
            size,
            blocks: size.div_ceil(512),
            perm,
            nlink: if kind == Kind::Directory { 2 } else { 1 },
            io_block: BLOCK_SIZE as u32,
            uid: self.options.owner.0,
            gid: self.options.owner.1,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            valid_for: Duration::ZERO,
        }
    }

    /// The current content of a control file (the directory has none).
    fn snapshot(&self, control: Control) -> Vec<u8> {
        let text = match control {
            Control::Stats => {
                to_json_text(&self.board.samples(self.figures()), self.board.documents())
            }
            Control::Metrics => to_prometheus_text(&self.board.samples(self.figures())),
            Control::Dir => String::new(),
        };
        text.into_bytes()
    }

    fn figures(&self) -> Figures {
        Figures {
            open_handles: self.handles.len() as u64,
            inodes: self.inodes.len() as u64,
        }
    }

    /// Resolves `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr, FsError> {
        match self.tree(parent)? {
            Tree::Control(Control::Dir) => {
                let ino = match name.to_str() {
                    Some("stats.json") => STATS_FILE,
                    Some("metrics") => METRICS_FILE,
                    Some("views") => VIEWS_DIR,
                    _ => return Err(FsError::NotFound),
                };
                self.getattr(ino)
            }
            Tree::Control(_) => Err(FsError::NotDirectory),
            Tree::ViewsDir => self.lookup_view_root(name),
            Tree::ViewRoot(dir) | Tree::View(dir) => self.lookup_in_view(&directory(dir)?, name),
            Tree::Source(dir) if dir.ino == ROOT && name == CONTROL_DIR_NAME => {
                self.getattr(CONTROL_DIR)
            }
            Tree::Source(dir) => self.lookup_in_source(&directory(dir)?, name),
        }
    }

    /// Resolves `name` in the dataset's directory `parent`.
    fn lookup_in_source(&self, parent: &Arc<Node>, name: &OsStr) -> Result<Attr, FsError> {
        let path = inode::validate_name(name)?;
        let child_path = if parent.ino == ROOT {
            path.to_path_buf()
        } else {
            parent.path.join(path)
        };
        let meta = self
            .source
            .stat(&child_path)
            .map_err(|e| FsError::from_source(&e))?;
        let node = self.inodes.intern(parent, name, meta.kind);
        node.device.store(meta.identity.dev, Ordering::Relaxed);
        self.inodes.remember(&node);
        Ok(Self::source_attr(node.ino, &meta))
    }

    /// Where a request about `ino` waits if the source hangs: the device its entry was last
    /// seen on (a lookup's is its parent directory's). Never touches the source.
    pub fn place(&self, ino: u64) -> Place {
        self.inodes
            .get(ino)
            .map_or(0, |node| node.device.load(Ordering::Relaxed))
    }

    /// Where a read of handle `fh` waits if the source hangs: the device of its file version.
    pub fn read_place(&self, fh: u64) -> Place {
        match self.handles.get(&fh).as_deref().map(|o| &o.handle) {
            Some(Handle::File(reader)) => reader.entry().identity().dev,
            _ => 0,
        }
    }

    /// The kernel dropped `nlookup` lookups of `ino` (its inode left the kernel's caches).
    pub fn forget(&self, ino: u64, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
    }

    /// Attributes of inode `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        match self.tree(ino)? {
            Tree::Control(control) => Ok(self.control_attr(control)),
            Tree::ViewsDir | Tree::ViewRoot(_) => Ok(self.virtual_dir_attr(ino)),
            Tree::View(node) => self.view_attr(&node),
            Tree::Source(node) => Ok(Self::source_attr(ino, &self.stat_node(&node)?)),
        }
    }

    /// The value of extended attribute `name` of `ino`. Only `CACHED_XATTR` exists, on dataset
    /// files: `ram=R disk=D blocks=N`, the 1 MiB blocks of the source file's current version
    /// that the RAM tier and the disk tier hold, out of its `N`. Only the `user.` namespace is
    /// supported: a name outside it (`security.selinux` and `system.posix_acl_access`, which
    /// `ls -l` asks of every file) is `EOPNOTSUPP`, which coreutils remembers per file system
    /// and stops asking, where `ENODATA` would leave it asking again for each file.
    pub fn xattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>, FsError> {
        if !name.as_encoded_bytes().starts_with(USER_XATTR_NAMESPACE) {
            return Err(FsError::NoAttributeNamespace);
        }
        let node = match self.tree(ino)? {
            Tree::Source(node) if name == CACHED_XATTR && node.kind == Kind::File => node,
            _ => return Err(FsError::NoAttribute),
        };
        let identity = self.stat_node(&node)?.identity;
        let blocks = identity.size.div_ceil(BLOCK_SIZE);
        let (ram, disk) = self.fetcher.held(&identity);
        Ok(format!("ram={ram} disk={disk} blocks={blocks}").into_bytes())
    }

    /// The stored target of symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<OsString, FsError> {
        let node = self.node(ino)?;
        if node.kind != Kind::Symlink {
            return Err(FsError::InvalidName);
        }
        self.source
            .read_link(&node.path)
            .map_err(|e| FsError::from_source(&e))
    }

    /// Opens `ino` for reading; `Intent::Write` is refused.
    pub fn open(&self, ino: u64, intent: Intent) -> Result<Opened, FsError> {
        self.open_by(ino, intent, 0)
    }

    /// Like `open`, for the process (or thread) `pid` the kernel names in the request (0: none):
    /// an open of a view file counts in that process's job (`crate::jobs`).
    pub fn open_by(&self, ino: u64, intent: Intent, pid: u32) -> Result<Opened, FsError> {
        if intent == Intent::Write {
            return Err(FsError::ReadOnly);
        }
        let handle = match self.tree(ino)? {
            Tree::Control(Control::Dir) | Tree::ViewsDir | Tree::ViewRoot(_) => {
                return Err(FsError::IsDirectory);
            }
            // A control file's snapshot is taken only here, when one is opened.
            Tree::Control(control) => Handle::Snapshot(Arc::new(self.snapshot(control))),
            Tree::View(node) => self.open_view_file(regular_file(node)?, intent, pid)?,
            Tree::Source(node) => {
                let node = regular_file(node)?;
                let source = self.open_source(&node)?;
                return Ok(self.open_file(&node, source, intent));
            }
        };
        Ok(Opened {
            fh: self.add_handle(handle),
            serve: Serve::Daemon,
        })
    }

    /// Opens `ino` without waiting on the source, when that needs no more than a stat of a
    /// local filesystem (`Source::stat_at_once`): a dataset file whose version seen by the last
    /// open the cache holds whole, and the stat shows that version still. `None` when any of that
    /// does not hold: ask `open`, where waiting is allowed. Counted in `source.opens_at_once`.
    pub fn open_at_once(&self, ino: u64, intent: Intent) -> Option<Opened> {
        if intent == Intent::Write {
            return None;
        }
        let (node, cached) = self.cached_version(ino)?;
        let meta = self.source.stat_at_once(&node.path)?.ok()?;
        if meta.kind != Kind::File
            || meta.identity != cached.identity()
            || !self.fetcher.is_available(&cached)
        {
            return None;
        }
        self.metrics.opens_at_once.inc();
        let source = Arc::new(Deferred::new(
            self.source.clone(),
            &node.path,
            meta.identity,
        ));
        Some(self.open_file(&node, source, intent))
    }

    /// A handle reading `source` (the version of `node` an open just saw), remembered as the
    /// node's last version; an older cached version is dropped.
    fn open_file(&self, node: &Node, source: Arc<dyn SourceFile>, intent: Intent) -> Opened {
        let identity = source.identity();
        node.saw(identity, |old| {
            self.fetcher.drop_stale(&old);
            tracing::info!(path = %node.path.display(), "source file changed; old cache entry dropped");
        });
        let cached = self.fetcher.ram().file(identity);
        if intent == Intent::Read {
            self.prefetcher.opened(0, &node.path, Some(identity));
        }
        let serve = if self.options.passthrough && cached.passthrough_fd().is_some() {
            Serve::Passthrough(cached.clone())
        } else {
            Serve::Daemon
        };
        let fh = self.add_handle(Handle::File(FileReader::new(source, cached)));
        Opened { fh, serve }
    }

    /// Whether `open_cached` can answer for `ino`: a dataset file whose version seen by the last
    /// open the cache holds whole. Asks nothing of the source.
    pub fn has_cached_version(&self, ino: u64) -> bool {
        self.cached_version(ino).is_some()
    }

    fn cached_version(&self, ino: u64) -> Option<(Arc<Node>, Arc<RamFile>)> {
        let node = match self.tree(ino).ok()? {
            Tree::Source(node) if node.kind == Kind::File => node,
            _ => return None,
        };
        let identity = node.last_identity()?;
        let cached = self
            .fetcher
            .ram()
            .get(&identity)
            .filter(|c| c.is_complete())?;
        Some((node, cached))
    }

    /// Opens `ino` from the cache alone, as the version the last open saw, without asking the
    /// source: for when the source does not answer an open in time (a hung network filesystem).
    /// Counted in `source.unanswered_opens`.
    pub fn open_cached(&self, ino: u64) -> Result<Opened, FsError> {
        let (node, cached) = self.cached_version(ino).ok_or(FsError::Io)?;
        self.metrics.unanswered_opens.inc();
        let source: Arc<dyn SourceFile> = Arc::new(Deferred::new(
            self.source.clone(),
            &node.path,
            cached.identity(),
        ));
        let serve = if self.options.passthrough && cached.passthrough_fd().is_some() {
            Serve::Passthrough(cached.clone())
        } else {
            Serve::Daemon
        };
        let fh = self.add_handle(Handle::File(FileReader::new(source, cached)));
        Ok(Opened { fh, serve })
    }

    /// The source file behind an open of `node`. A version whose every block the cache or the
    /// staging buffer holds is identified by a stat and opened only if a read comes to need it
    /// (an open is a round trip on network storage); any other is the file prefetch opened
    /// ahead at this version, else opened now, so reads of it keep that descriptor's version.
    fn open_source(&self, node: &Node) -> Result<Arc<dyn SourceFile>, FsError> {
        let meta = self.stat_node(node)?;
        if self
            .fetcher
            .ram()
            .get(&meta.identity)
            .is_some_and(|c| self.fetcher.is_available(&c))
        {
            return Ok(Arc::new(Deferred::new(
                self.source.clone(),
                &node.path,
                meta.identity,
            )));
        }
        if let Some(file) = self.prefetcher.take_opened(&node.path, meta.identity) {
            return Ok(file);
        }
        self.source
            .open(&node.path)
            .map_err(|e| FsError::from_source(&e))
    }

    fn add_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if handle.is_item() {
            self.metrics.item_opens.inc();
        }
        let since = Instant::now();
        self.handles.insert(fh, Arc::new(Open { handle, since }));
        fh
    }

    fn handle(&self, fh: u64) -> Result<Arc<Open>, FsError> {
        self.handles.get(&fh).ok_or(FsError::BadHandle)
    }

    /// Answers a read without waiting on the source: `None` when it needs [`Fs::read`].
    pub fn read_cached(
        &self,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Option<Result<ReadBytes, FsError>> {
        let handle = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return Some(Err(e)),
        };
        match &handle.handle {
            Handle::File(reader) => {
                let bytes = reader.read_cached(offset, size)?;
                reader.read_ahead(&self.prefetcher, offset, u64::from(size));
                Some(Ok(bytes))
            }
            Handle::Snapshot(content) => Some(Ok(snapshot_range(content, offset, size))),
            Handle::View(open) => open
                .ready()
                .map(|r| r.map(|bytes| snapshot_range(&bytes, offset, size))),
            Handle::Dir(_) => Some(Err(FsError::IsDirectory)),
        }
    }

    /// Whether `fh` is an open view file: a read of it may wait for a render turn and the
    /// render's memory (`RENDER_WAIT`) before any wait on the source.
    pub fn is_view_handle(&self, fh: u64) -> bool {
        self.handle(fh)
            .is_ok_and(|h| matches!(h.handle, Handle::View(_)))
    }

    /// Answers a read, fetching from the source where the cache misses. May block.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<ReadBytes, FsError> {
        match &self.handle(fh)?.handle {
            Handle::File(reader) => {
                let waited = Instant::now();
                let bytes = {
                    let _demand = self.prefetcher.demand();
                    reader.read(&self.fetcher, offset, size)
                };
                self.metrics
                    .fetch_stall_ns
                    .add(waited.elapsed().as_nanos() as u64);
                reader.read_ahead(&self.prefetcher, offset, u64::from(size));
                bytes
            }
            Handle::Snapshot(content) => Ok(snapshot_range(content, offset, size)),
            Handle::View(open) => {
                let waited = Instant::now();
                let rendered = self.views.rendered(open);
                self.metrics
                    .prep_stall_ns
                    .add(waited.elapsed().as_nanos() as u64);
                Ok(snapshot_range(&rendered?, offset, size))
            }
            Handle::Dir(_) => Err(FsError::IsDirectory),
        }
    }

    /// Forgets a file or directory handle (and a cache entry it leaves holding nothing).
    pub fn release(&self, fh: u64) -> Result<(), FsError> {
        let open = self.handles.remove(&fh).ok_or(FsError::BadHandle)?;
        if open.handle.is_item() {
            self.metrics.load_latency.record(open.since.elapsed());
        }
        if let Handle::File(reader) = &open.handle {
            self.fetcher.ram().settle(reader.entry());
        }
        Ok(())
    }

    /// Opens directory `ino`, taking a snapshot of its names.
    pub fn opendir(&self, ino: u64) -> Result<u64, FsError> {
        let snapshot = match self.tree(ino)? {
            Tree::Control(Control::Dir) => {
                let mut names = vec![
                    ("stats.json", Kind::File, STATS_FILE),
                    ("metrics", Kind::File, METRICS_FILE),
                ];
                if !self.views.is_empty() {
                    names.push(("views", Kind::Directory, VIEWS_DIR));
                }
                let node = self.node(ROOT)?;
                self.listing_of(node, (CONTROL_DIR, ROOT), Listing::fixed(names))
            }
            Tree::Control(_) => return Err(FsError::NotDirectory),
            Tree::ViewsDir => {
                let node = self.node(ROOT)?;
                self.listing_of(node, (VIEWS_DIR, CONTROL_DIR), self.list_views())
            }
            Tree::ViewRoot(node) | Tree::View(node) => self.opendir_in_view(directory(node)?)?,
            Tree::Source(node) => self.opendir_in_source(directory(node)?)?,
        };
        Ok(self.add_handle(Handle::Dir(snapshot)))
    }

    /// The listing of the dataset's directory `node`.
    fn opendir_in_source(&self, node: Arc<Node>) -> Result<DirSnapshot, FsError> {
        let ino = node.ino;
        let entries = self
            .source
            .list(&node.path)
            .map_err(|e| FsError::from_source(&e))?;
        let names = Listing::of(
            entries
                .iter()
                // `.prepfs` is reachable but never listed: loaders such as torchvision's
                // ImageFolder treat every listed directory as a class.
                .filter(|(name, _)| !(ino == ROOT && *name == CONTROL_DIR_NAME)),
        );
        let dots = (node.ino, node.parent);
        Ok(self.listing_of(node, dots, names))
    }

    /// The open directory `node` listing `names`, charged to the memory budget while open
    /// (bounded by the open directories the kernel holds).
    fn listing_of(&self, node: Arc<Node>, dots: (u64, u64), names: Listing) -> DirSnapshot {
        let charge = self.memory().in_flight(names.bytes());
        DirSnapshot {
            node,
            dots,
            names,
            _charge: charge,
        }
    }

    /// Entries of an open directory from position `offset` on (`.` and `..` first), handed to
    /// `take` with the offset that resumes after each; `take` returns true to stop.
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        mut take: impl FnMut(u64, DirItem) -> bool,
    ) -> Result<(), FsError> {
        let open = self.handle(fh)?;
        let Handle::Dir(dir) = &open.handle else {
            return Err(FsError::NotDirectory);
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for position in start..dir.names.len().saturating_add(2) {
            let item = match position {
                0 => DirItem {
                    ino: dir.dots.0,
                    kind: Kind::Directory,
                    name: ".".into(),
                },
                1 => DirItem {
                    ino: dir.dots.1,
                    kind: Kind::Directory,
                    name: "..".into(),
                },
                _ => {
                    let Some((name, kind, fixed)) = dir.names.get(position - 2) else {
                        break;
                    };
                    // A listing creates no node (only a lookup does, which the kernel forgets):
                    // names not looked up yet show a number of their own, derived from the name.
                    let ino = fixed
                        .or_else(|| self.inodes.find(dir.node.ino, name))
                        .unwrap_or_else(|| inode::listed_only(dir.node.ino, name));
                    DirItem {
                        ino,
                        kind,
                        name: name.to_owned(),
                    }
                }
            };
            if take(position as u64 + 1, item) {
                break;
            }
        }
        Ok(())
    }

    /// Capacity of the filesystem holding the source.
    pub fn statfs(&self) -> Result<SpaceStats, FsError> {
        self.source.space().map_err(|e| FsError::from_source(&e))
    }
}

/// `node`, a directory; else `NotDirectory`.
fn directory(node: Arc<Node>) -> Result<Arc<Node>, FsError> {
    match node.kind {
        Kind::Directory => Ok(node),
        _ => Err(FsError::NotDirectory),
    }
}

/// `node`, a regular file; else the error an open of it gets.
fn regular_file(node: Arc<Node>) -> Result<Arc<Node>, FsError> {
    match node.kind {
        Kind::File => Ok(node),
        Kind::Directory => Err(FsError::IsDirectory),
        Kind::Symlink | Kind::Other => Err(FsError::AccessDenied),
    }
}

fn snapshot_range(content: &Arc<Vec<u8>>, offset: u64, size: u32) -> ReadBytes {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(content.len());
    let end = start.saturating_add(size as usize).min(content.len());
    ReadBytes::Whole(content.clone(), start..end)
}
