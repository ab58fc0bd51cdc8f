//! Work done ahead of the view opens prefetch predicts (`Views::ahead`): an image's pixels decoded
//! into the decoded-pixel cache with idle CPU, or, when the cache keeps no pixels (or none of
//! that image yet: they follow its encoded form), the render of the file's next open made and
//! held until that open takes it (`take_ahead`), at most `AHEAD_RENDERS` for `AHEAD_PATIENCE`. Must never let such work wait for memory or shed
//! anything to get it, nor run while a render for an open waits for a thread.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{AheadSlot, FillOnDrop, HeldRender, Need, Unrendered, ViewOpen, Views, encoded_size};
use crate::cache::{ReadBytes, Unpacked};
use crate::inode::Node;
use crate::prefetch::Ahead;
use crate::source::SourceFile;
use crate::view::render;

/// Renders made ahead of their opens that may wait to be taken at once: the planner's smallest
/// queue of predicted files (`prefetch::DEPTH_MIN`) twice over, so a correct prediction keeps
/// the next opens served while a wrong one holds little memory.
const AHEAD_RENDERS: usize = 8;
/// How long a render made ahead waits for its open; past it the prediction was wrong and the
/// render (and its memory) is dropped. `AHEAD_RENDERS` renders ahead of a reader that opens a
/// few files per second or more are taken well within it, and a wrong prediction (or a render
/// for a file whose open came first, now for its next one) holds its place no longer.
const AHEAD_PATIENCE: Duration = Duration::from_secs(2);

impl Views {
    /// Makes ready, while no render waits for a thread, what the next open of `source`'s image
    /// in view `view` will need: its decoded pixels when the cache keeps them and holds the
    /// image's encoded form (every later open of any view starts from them; only while the CPU
    /// is `idle`, since the pixels may never be used, and a file passed over is not asked for
    /// again), else that open's render itself,
    /// when the view file (`node()`) is known, with memory nobody else wants now (work that open
    /// would do anyway when the prediction is right; a wrong one wastes at most `AHEAD_RENDERS`
    /// renders per `AHEAD_PATIENCE`). Prefetch calls it for the files it predicts, and plans a
    /// file answered `NotNow` again.
    pub fn ahead(
        &self,
        view: u16,
        node: impl FnOnce() -> Option<Arc<Node>>,
        source: &dyn SourceFile,
        idle: bool,
    ) -> Ahead {
        if self.fetcher.derived().decoded_choice().1.keeps() {
            if !idle || self.renders_waiting() > 0 {
                return Ahead::Nothing;
            }
            match self.decode_ahead(source) {
                Some(true) => return Ahead::Done,
                Some(false) => return Ahead::Nothing,
                // Until the cache holds the image's encoded form, as without pixels.
                None => {}
            }
        }
        if self.renders_waiting() > 0 {
            return Ahead::NotNow;
        }
        match node() {
            Some(node) if node.view == Some(view) => self.render_ahead(&node),
            _ => Ahead::Nothing,
        }
    }

    /// Renders the next open of view file `node` now, unless one is made for it already or
    /// `AHEAD_RENDERS` are; kept until that open takes it, for at most `AHEAD_PATIENCE`. The
    /// slot is published before the render starts, so an open that comes meanwhile waits for
    /// it instead of rendering the same tensor again.
    fn render_ahead(&self, node: &Arc<Node>) -> Ahead {
        let Some(Ok(view)) = node.view.map(|v| self.get(v)) else {
            return Ahead::Nothing;
        };
        let slot = AheadSlot::default();
        let count = {
            let mut ahead = self.ahead.lock();
            ahead.retain(|a| a.started.elapsed() < AHEAD_PATIENCE);
            self.held.store(ahead.len(), Ordering::Release);
            if ahead.iter().any(|a| a.ino == node.ino) {
                return Ahead::Nothing;
            }
            if ahead.len() >= AHEAD_RENDERS {
                return Ahead::NotNow;
            }
            let count = self
                .sharing
                .next_count(node.view.unwrap_or_default(), &node.path);
            ahead.push_back(HeldRender {
                ino: node.ino,
                count,
                slot: slot.clone(),
                started: Instant::now(),
            });
            self.held.store(ahead.len(), Ordering::Release);
            count
        };
        // An open may wait on the slot: it is filled whatever happens, a failure with `None`.
        let filled = FillOnDrop(slot.clone());
        let open = ViewOpen {
            view: node.view.unwrap_or_default(),
            node: node.clone(),
            seed: self.seed_of(view, &node.path, count),
            rendered: OnceLock::new(),
            ahead: None,
            shared: None,
            publish: None,
        };
        let rendered = self.render_for(view, &open, Need::Ahead);
        // No room is a passing reason; a render that failed would fail its open too.
        let answer = match &rendered {
            Ok(_) => Ahead::Done,
            Err(Unrendered::NoRoom(_)) => Ahead::NotNow,
            Err(Unrendered::Failed(_)) => Ahead::Nothing,
        };
        let _ = slot.set(rendered.ok());
        drop(filled);
        if answer == Ahead::Done {
            view.metrics.rendered_ahead.inc();
        } else {
            let mut ahead = self.ahead.lock();
            ahead.retain(|a| !Arc::ptr_eq(&a.slot, &slot));
            self.held.store(ahead.len(), Ordering::Release);
        }
        answer
    }

    /// Decodes the image the open `source` holds into the decoded-pixel cache ahead of its
    /// open, unless the cache holds its pixels already or would not keep them now: whether it
    /// decoded and the cache kept them, or `None` while the cache does not hold the image's
    /// encoded form yet (pixels follow it: `Derived::pixels_may_follow`). It starts from the
    /// image's restart-marked copy when the cache holds one (the same pixels).
    fn decode_ahead(&self, source: &dyn SourceFile) -> Option<bool> {
        let identity = source.identity();
        let derived = self.fetcher.derived();
        if derived.has_decoded(&identity) || !derived.decoded_choice().1.keeps() {
            return Some(false);
        }
        let copy = derived.peek_marked(&identity, &Unpacked::default());
        let cached = derived.has_file(&identity);
        if copy.is_none() && !derived.pixels_may_follow(cached) {
            return None;
        }
        // Only with memory nobody else wants now: the encoded file, the pixels and their copy.
        let budget = self.fetcher.budget();
        let Some(_encoded_room) = encoded_size(source)
            .ok()
            .and_then(|size| budget.try_work(size))
        else {
            return Some(false);
        };
        let encoded = match copy {
            Some(copy) => copy,
            None => match self.read_image(source) {
                Ok(file) if derived.pixels_may_follow(self.held_as_file(&file, cached)) => {
                    ReadBytes::Owned(file)
                }
                Ok(_) => return None,
                Err(_) => return Some(false),
            },
        };
        let encoded = encoded.as_slice();
        let Ok((w, h)) = render::dimensions(encoded) else {
            return Some(false);
        };
        let overhead = render::decode_overhead(encoded, (w, h));
        let Some(_room) = budget.try_work(2 * u64::from(w) * u64::from(h) * 3 + overhead) else {
            return Some(false);
        };
        Some(
            self.decode_and_offer(encoded, identity)
                .is_ok_and(|decoded| decoded.is_some_and(|(_, _, kept)| kept)),
        )
    }

    /// The render made (or being made) ahead for the `count`th open of view file `ino`, if
    /// there is one; any other one for that file is for an open that went by, and is dropped.
    pub(super) fn take_ahead(&self, ino: u64, count: u64) -> Option<AheadSlot> {
        if self.held.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut ahead = self.ahead.lock();
        ahead.retain(|a| a.started.elapsed() < AHEAD_PATIENCE);
        let taken = ahead
            .iter()
            .position(|a| a.ino == ino)
            .and_then(|at| ahead.remove(at));
        self.held.store(ahead.len(), Ordering::Release);
        taken.filter(|a| a.count == count).map(|a| a.slot)
    }
}
