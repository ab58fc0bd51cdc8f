//! The mount's three trees, told apart once per request: the dataset (the source tree, from the
//! mount's root), the control tree (`.prepfs`, its snapshot files and `.prepfs/views`) and the
//! view trees (each view's root and everything under it).
//!
//! Owns which tree an inode is in (`Tree`, chosen from its number and node) and, in one place
//! (`Tree::needs_source`), which requests about it may wait on the source: the adapter asks that
//! before it runs a request on a kernel thread, and every request of the file system dispatches on
//! the same `Tree`. Must never touch the source itself.

use std::ffi::OsStr;
use std::sync::Arc;

use super::{CACHED_XATTR, Fs};
use crate::error::FsError;
use crate::inode::{
    CONTROL_DIR, CONTROL_DIR_NAME, FIRST_SOURCE_INODE, FIRST_VIEW_ROOT, METRICS_FILE, Node, ROOT,
    STATS_FILE, VIEWS_DIR,
};

/// Which tree an inode is in, with what the requests about it use.
pub(super) enum Tree {
    /// `.prepfs` or one of its snapshot files: the mount's own state, never the source.
    Control(Control),
    /// `.prepfs/views`, the list of the views (only when there are views).
    ViewsDir,
    /// A view's root directory: the source's root seen through view `index`.
    ViewRoot(Arc<Node>),
    /// A directory or `.npy` file inside a view.
    View(Arc<Node>),
    /// The dataset: the mount's root and every source entry looked up under it.
    Source(Arc<Node>),
}

/// The nodes of the control tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Control {
    /// `.prepfs` itself.
    Dir,
    /// `.prepfs/stats.json`.
    Stats,
    /// `.prepfs/metrics`.
    Metrics,
}

impl Control {
    /// Its inode number.
    pub(super) fn ino(self) -> u64 {
        match self {
            Control::Dir => CONTROL_DIR,
            Control::Stats => STATS_FILE,
            Control::Metrics => METRICS_FILE,
        }
    }
}

/// A request the adapter asks about before it runs it (`Fs::needs_source`).
#[derive(Debug, Clone, Copy)]
pub enum Ask<'a> {
    /// Resolving this name in the directory.
    Lookup(&'a OsStr),
    /// Attributes (and `access`, answered from them).
    Getattr,
    /// Opening the file.
    Open,
    /// Opening the directory (its listing is taken then).
    Opendir,
    /// Reading this extended attribute.
    Xattr(&'a OsStr),
}

impl Tree {
    /// Whether answering `ask` about this node may wait on the source: the one place that says
    /// so for every tree.
    pub(super) fn needs_source(&self, ask: Ask) -> bool {
        match (self, ask) {
            (Tree::Control(_) | Tree::ViewsDir, _) => false,
            // Its attributes are the mount's; its names and listing are the source root's.
            (Tree::ViewRoot(_), Ask::Getattr | Ask::Open | Ask::Xattr(_)) => false,
            (Tree::ViewRoot(_), Ask::Lookup(_) | Ask::Opendir) => true,
            // An open queues a render (which reads the source later, off the kernel's thread);
            // no view file has an extended attribute.
            (Tree::View(_), Ask::Open | Ask::Xattr(_)) => false,
            (Tree::View(_), Ask::Lookup(_) | Ask::Getattr | Ask::Opendir) => true,
            (Tree::Source(node), Ask::Lookup(name)) => {
                !(node.ino == ROOT && name == CONTROL_DIR_NAME)
            }
            // Only the cache state of a dataset file needs a stat of its source.
            (Tree::Source(_), Ask::Xattr(name)) => name == CACHED_XATTR,
            (Tree::Source(_), Ask::Getattr | Ask::Open | Ask::Opendir) => true,
        }
    }
}

impl Fs {
    /// The tree `ino` is in; `NotFound` for a number no node has (now).
    pub(super) fn tree(&self, ino: u64) -> Result<Tree, FsError> {
        match ino {
            CONTROL_DIR => return Ok(Tree::Control(Control::Dir)),
            STATS_FILE => return Ok(Tree::Control(Control::Stats)),
            METRICS_FILE => return Ok(Tree::Control(Control::Metrics)),
            VIEWS_DIR if !self.views.is_empty() => return Ok(Tree::ViewsDir),
            _ => {}
        }
        let roots = FIRST_VIEW_ROOT..FIRST_VIEW_ROOT + self.views.len() as u64;
        if ino != ROOT && ino < FIRST_SOURCE_INODE && !roots.contains(&ino) {
            return Err(FsError::NotFound);
        }
        let node = self.node(ino)?;
        Ok(match node.view {
            Some(_) if roots.contains(&ino) => Tree::ViewRoot(node),
            Some(_) => Tree::View(node),
            None => Tree::Source(node),
        })
    }

    /// Whether answering `ask` about `ino` may wait on the source (`Tree::needs_source`); a
    /// number no node has is answered at once (`NotFound`), so it needs nothing.
    pub fn needs_source(&self, ino: u64, ask: Ask) -> bool {
        self.tree(ino).is_ok_and(|tree| tree.needs_source(ask))
    }
}
