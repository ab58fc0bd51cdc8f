//! `Hint`: the order a sampler publishes in an order file (`--order-file`), as a predictor.
//!
//! Owns: polling the order file for changes (on the planner thread, at most every `POLL`),
//! turning its lines into the names the planner keys files by, and predicting from that list as
//! `Replay` does from the last pass. The mount itself is read-only, so the file lives outside it
//! (e.g. in `/dev/shm`); a sampler that knows its order (NoPFS-style clairvoyance) writes the
//! upcoming paths there, one per line. Must never trust the file: lines naming nothing under the
//! mount, or with `..`, are ignored, it is read up to `MAX_BYTES`, and a file that cannot be read
//! keeps the last order. Must never do I/O except that poll.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::epoch::{EpochTracker, FileKey};
use super::predict::{Predictor, SCAN_PER_PREDICTION, take_unskipped};
use crate::inode::dataset_path;

/// How often the planner checks the order file for a change.
pub const POLL: Duration = Duration::from_millis(10);
/// Bytes of the order file read at most (about a million paths).
const MAX_BYTES: u64 = 64 << 20;

/// A published order: the paths, and where each first appears.
#[derive(Default)]
pub struct Order {
    paths: Vec<FileKey>,
    first: HashMap<FileKey, usize>,
}

impl Order {
    /// The order in `text` (one path per line), for a mount at `mountpoint`.
    fn parse(text: &str, mountpoint: &Path) -> Order {
        let mut order = Order::default();
        for line in text.lines() {
            let Some(key) = key_of(line.trim_end_matches('\r'), mountpoint) else {
                continue;
            };
            order.first.entry(key.clone()).or_insert(order.paths.len());
            order.paths.push(key);
        }
        order
    }

    /// Paths in the order.
    pub fn len(&self) -> usize {
        self.paths.len()
    }
}

/// The planner's key for a line of the order file (see `inode::dataset_path`); `None` for blank
/// lines, comments (`#`) and anything naming no dataset file.
fn key_of(line: &str, mountpoint: &Path) -> Option<FileKey> {
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let path = dataset_path(Path::new(line), mountpoint)?;
    if path.as_os_str().is_empty() {
        return None;
    }
    Some(Arc::from(path.as_path()))
}

/// The latest order, shared by every set's `Hint`.
pub type OrderSlot = Arc<Mutex<Arc<Order>>>;

/// The order file of a mount, re-read when it changes.
pub struct OrderFile {
    path: PathBuf,
    mountpoint: PathBuf,
    /// (inode, size, mtime seconds, mtime nanoseconds) when last read.
    seen: Option<(u64, u64, i64, i64)>,
    polled: Option<Instant>,
    slot: OrderSlot,
}

impl OrderFile {
    /// The order file at `path`, for a mount at `mountpoint`; nothing is read yet.
    pub fn new(path: PathBuf, mountpoint: PathBuf) -> OrderFile {
        OrderFile {
            path,
            mountpoint,
            seen: None,
            polled: None,
            slot: OrderSlot::default(),
        }
    }

    /// Where its order is published.
    pub fn slot(&self) -> OrderSlot {
        self.slot.clone()
    }

    /// Reads the file again if `POLL` has passed and it changed; true when a new order was
    /// published.
    pub fn poll(&mut self) -> bool {
        if self.polled.is_some_and(|t| t.elapsed() < POLL) {
            return false;
        }
        self.polled = Some(Instant::now());
        let Ok(meta) = std::fs::metadata(&self.path) else {
            return false;
        };
        let stamp = (meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec());
        if self.seen == Some(stamp) || !meta.is_file() {
            return false;
        }
        let mut text = String::new();
        let read = std::fs::File::open(&self.path)
            .and_then(|f| f.take(MAX_BYTES).read_to_string(&mut text));
        if let Err(e) = read {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot read the order file; keeping the last order");
            return false;
        }
        self.seen = Some(stamp);
        let order = Order::parse(&text, &self.mountpoint);
        tracing::debug!(paths = order.len(), "order file read");
        *self.slot.lock() = Arc::new(order);
        true
    }
}

/// Predicts the files after the last open in the published order.
pub struct Hint {
    slot: OrderSlot,
    /// Just past where the last open was found (orders may list a file once per epoch).
    cursor: usize,
}

impl Hint {
    /// A predictor following the order published in `slot`.
    pub fn new(slot: OrderSlot) -> Hint {
        Hint { slot, cursor: 0 }
    }
}

impl Predictor for Hint {
    fn name(&self) -> &'static str {
        "hint"
    }

    fn predict(
        &mut self,
        _tracker: &EpochTracker,
        last: &Path,
        n: usize,
        skip: &dyn Fn(&Path) -> bool,
        out: &mut Vec<FileKey>,
    ) {
        let order = self.slot.lock().clone();
        let paths = &order.paths;
        let near = paths[self.cursor.min(paths.len())..]
            .iter()
            .take(n * SCAN_PER_PREDICTION)
            .position(|p| &**p == last)
            .map(|i| self.cursor + i);
        let Some(at) = near.or_else(|| order.first.get(last).copied()) else {
            return;
        };
        self.cursor = at + 1;
        take_unskipped(&paths[at + 1..], n, skip, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(order: &Order) -> Vec<&str> {
        order
            .paths
            .iter()
            .map(|p| p.to_str().expect("utf-8"))
            .collect()
    }

    #[test]
    fn lines_become_the_names_the_planner_keys_files_by() {
        let text = "train/a.jpg\n/mnt/d/train/b.jpg\r\n./train/c.jpg\n\n# a comment\n\
                    /elsewhere/x.jpg\ntrain/../../etc/passwd\n.prepfs/stats.json\n\
                    /mnt/d/.prepfs/views/v/train/d.jpg.npy\n.prepfs/views/v/e.png.npy\n";
        let order = Order::parse(text, Path::new("/mnt/d"));
        assert_eq!(
            keys(&order),
            [
                "train/a.jpg",
                "train/b.jpg",
                "train/c.jpg",
                "train/d.jpg",
                "e.png"
            ]
        );
    }

    #[test]
    fn the_hint_predicts_what_follows_the_last_open_also_in_a_later_epoch() {
        let slot = OrderSlot::default();
        let text = "c\nb\na\nd\nc\nd\na\nb\n";
        *slot.lock() = Arc::new(Order::parse(text, Path::new("/m")));
        let mut hint = Hint::new(slot);
        let tracker = EpochTracker::default();
        let mut out = Vec::new();
        let never = |_: &Path| false;
        hint.predict(&tracker, Path::new("c"), 2, &never, &mut out);
        assert_eq!(out, [Arc::from(Path::new("b")), Arc::from(Path::new("a"))]);
        for last in ["b", "a", "d", "c"] {
            out.clear();
            hint.predict(&tracker, Path::new(last), 2, &never, &mut out);
        }
        // The second "c" is the one after the cursor: the second epoch's order follows.
        assert_eq!(out, [Arc::from(Path::new("d")), Arc::from(Path::new("a"))]);
        out.clear();
        hint.predict(&tracker, Path::new("zz"), 2, &never, &mut out);
        assert!(out.is_empty(), "a file not in the order predicts nothing");
    }

    #[test]
    fn an_order_file_is_read_again_only_when_it_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("order");
        let mut file = OrderFile::new(path.clone(), PathBuf::from("/m"));
        assert!(!file.poll(), "no file yet");
        std::fs::write(&path, "a\nb\n").expect("write");
        file.polled = None;
        assert!(file.poll());
        assert_eq!(file.slot().lock().len(), 2);
        file.polled = None;
        assert!(!file.poll(), "unchanged");
        std::fs::write(&path, "a\nb\nc\n").expect("write");
        file.polled = None;
        assert!(file.poll());
        assert_eq!(file.slot().lock().len(), 3);
    }
}
