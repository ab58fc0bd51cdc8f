//! The `.prepfs/views/<name>/` trees: each mirrors the source's directories and shows every image
//! `x.jpg` as `x.jpg.npy`, rendered by the view's pipeline when an open is first read.
//!
//! Owns view lookups, listings and attributes (their sizes from the render service, `renders`),
//! and opening view files, which the render service renders. Must never render, or wait for a
//! render, itself.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::listing::Listing;
use super::tree::Tree;
use super::{Attr, DirSnapshot, Fs, Handle, Intent, SOURCE_TTL};
use crate::error::FsError;
use crate::inode::{self, FIRST_VIEW_ROOT, Node};
use crate::renders::is_image;
use crate::source::{DirEntries, Kind, Meta};

/// Suffix of view files.
const NPY: &str = ".npy";
/// st_blksize of view files: their .npy header's length. Python's `open()` buffers st_blksize
/// bytes, and `np.load` reads the magic and header through that buffer, then the array through a
/// second descriptor with C stdio, which also buffers st_blksize bytes. A block of exactly the
/// header makes the first read the header alone and lets stdio, its position block-aligned, read
/// the array straight into numpy's buffer: 2 reads per load (measured with strace), where one
/// page made 5 (the page again, a 128-byte re-read, the page again, the array, the tail) and a
/// 1 MiB block made each load transfer the whole file twice.
const VIEW_IO_BLOCK: u32 = crate::view::npy::HEADER_LEN as u32;

impl Fs {
    /// Resolves `name` in `.prepfs/views`.
    pub(super) fn lookup_view_root(&self, name: &OsStr) -> Result<Attr, FsError> {
        let index = self
            .views
            .iter()
            .position(|v| OsStr::new(&v.spec.name) == name)
            .ok_or(FsError::NotFound)?;
        Ok(self.virtual_dir_attr(FIRST_VIEW_ROOT + index as u64))
    }

    /// Resolves `name` in a directory of view `view`: the view file of image `X` when `name` is
    /// `X.npy` and the source has that image, else the source's subdirectory `name` (which may
    /// end in `.npy` too; one named like an image's view file is hidden by it, as listed).
    pub(super) fn lookup_in_view(&self, parent: &Arc<Node>, name: &OsStr) -> Result<Attr, FsError> {
        inode::validate_name(name)?;
        let bytes = name.as_bytes();
        if let Some(image) = bytes.strip_suffix(NPY.as_bytes()) {
            let image = OsStr::from_bytes(image);
            if is_image(image) {
                match self.stat_source(&parent.path.join(image)) {
                    Ok(meta) if meta.kind == Kind::File => {
                        let node = self.inodes.intern_as(parent, name, image, Kind::File);
                        let attr = self.view_file_attr(&node, &meta)?;
                        self.inodes.remember(&node);
                        return Ok(attr);
                    }
                    Ok(_) | Err(FsError::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let meta = self.stat_source(&parent.path.join(name))?;
        if meta.kind != Kind::Directory {
            return Err(FsError::NotFound);
        }
        let node = self.inodes.intern_as(parent, name, name, Kind::Directory);
        self.inodes.remember(&node);
        Ok(Self::source_attr(node.ino, &meta))
    }

    fn stat_source(&self, path: &std::path::Path) -> Result<Meta, FsError> {
        self.source.stat(path).map_err(|e| FsError::from_source(&e))
    }

    /// Attributes of a node inside a view.
    pub(super) fn view_attr(&self, node: &Arc<Node>) -> Result<Attr, FsError> {
        let meta = self.stat_node(node)?;
        match node.kind {
            Kind::File => self.view_file_attr(node, &meta),
            _ => Ok(Self::source_attr(node.ino, &meta)),
        }
    }

    /// A view file's attributes: its image's owner, group and read bits (no write, execute or
    /// special bits), so `default_permissions` lets in whoever may read the image, and nobody
    /// else.
    fn view_file_attr(&self, node: &Arc<Node>, meta: &Meta) -> Result<Attr, FsError> {
        let view = self.views.get(node.view.ok_or(FsError::NotFound)?)?;
        let size = self.views.file_size(&view.spec, node)?;
        Ok(Attr {
            size,
            blocks: size.div_ceil(512),
            perm: meta.perm & 0o444,
            nlink: 1,
            io_block: VIEW_IO_BLOCK,
            valid_for: SOURCE_TTL,
            ..Self::source_attr(node.ino, meta)
        })
    }

    /// Names of `.prepfs/views`.
    pub(super) fn list_views(&self) -> Listing {
        Listing::fixed(self.views.iter().enumerate().map(|(i, v)| {
            (
                v.spec.name.as_str(),
                Kind::Directory,
                FIRST_VIEW_ROOT + i as u64,
            )
        }))
    }

    /// Opens a directory of a view: the source directory's subdirectories and images. An image
    /// whose view name (`<name>.npy`) would pass `NAME_MAX` is left out and counted: no path
    /// could open it; so is a subdirectory named as an image's view file (`a.jpg.npy` beside
    /// `a.jpg`), which a lookup of the name would not find.
    pub(super) fn opendir_in_view(&self, node: Arc<Node>) -> Result<DirSnapshot, FsError> {
        let view = self.views.get(node.view.ok_or(FsError::NotFound)?)?;
        let entries = self
            .source
            .list(&node.path)
            .map_err(|e| FsError::from_source(&e))?;
        // Subdirectories an image's view file hides (rare: a scan of the listing for each).
        let hidden = |dir: &OsStr| {
            dir.as_bytes()
                .strip_suffix(NPY.as_bytes())
                .map(OsStr::from_bytes)
                .is_some_and(|image| {
                    is_image(image) && entries.iter().any(|(n, k)| k == Kind::File && n == image)
                })
        };
        let mut shown = Vec::new();
        let mut names = DirEntries::default();
        for (name, kind) in entries.iter() {
            let name = match kind {
                Kind::Directory if hidden(name) => {
                    view.metrics.unlisted_names.inc();
                    continue;
                }
                Kind::Directory => name,
                Kind::File if is_image(name) => {
                    if name.len() + NPY.len() > inode::NAME_MAX {
                        view.metrics.unlisted_names.inc();
                        continue;
                    }
                    shown.clear();
                    shown.extend_from_slice(name.as_bytes());
                    shown.extend_from_slice(NPY.as_bytes());
                    OsStr::from_bytes(&shown)
                }
                _ => continue,
            };
            // Names past 4 GiB: the rest of a directory no kernel lists is left out.
            if names.push(name, kind).is_err() {
                break;
            }
        }
        let names = Listing::from(names);
        let dots = (node.ino, node.parent);
        Ok(self.listing_of(node, dots, names))
    }

    /// Whether opening `ino` for `pid` may wait on another process: a view file opened by a
    /// process whose job is not known yet, which is looked up in its memory through /proc
    /// (`Jobs::knows`). Such an open belongs on the request pool, not a FUSE thread.
    pub fn open_looks_up_a_job(&self, ino: u64, pid: u32) -> bool {
        matches!(self.tree(ino), Ok(Tree::View(_))) && !self.views.knows_job(pid)
    }

    /// Opens a view file for the process (or thread) `pid` (the render service fixes its seed and
    /// queues or finds its render).
    pub(super) fn open_view_file(
        &self,
        node: Arc<Node>,
        intent: Intent,
        pid: u32,
    ) -> Result<Handle, FsError> {
        let index = node.view.ok_or(FsError::NotFound)?;
        if intent == Intent::Read {
            self.prefetcher
                .opened(1 + usize::from(index), &node.path, None);
        }
        Ok(Handle::View(self.views.open(index, node, pid)?))
    }
}
