//! `EpochTracker`: infers epochs of one file set from the opens it sees, with no loader hooks.
//!
//! Owns: the set's files (`Files`: each once, by number), the current pass (files opened, in
//! first-open order), the last complete pass and which of its files the current pass has not
//! opened yet (a `Positions` set, so that walks over what remains cost no more per open at a
//! million files than at a thousand), and the rule that ends a pass. A pass ends when a file it
//! already opened is opened again and either the pass has covered the previous pass's files
//! (`COVERED`), or such repeats of files opened long ago keep coming (`RESTART_REPEATS`: the
//! loader started over on a different subset, or this is the first pass and there is nothing to
//! cover). Repeats of files opened moments ago are double opens of one sample, not a new pass.
//! While a new pass is young, files the previous pass never opened are its stragglers (another
//! worker finishing it), not members of the new one. Must never do I/O or block: it is plain
//! data driven by the prefetch planner.

use std::cell::Cell;
use std::collections::VecDeque;
use std::path::Path;

use super::files::{FileId, FileKey, Files};
use crate::source::Identity;

/// Fraction of the previous pass's files after which a repeat ends the pass.
const COVERED: f64 = 0.95;
/// Repeats of files opened long ago that end a pass which has not covered the previous one.
/// More than one, so that a single sample read twice never splits an epoch.
const RESTART_REPEATS: usize = 2;
/// A repeat of one of the most recent `max(RECENT_MIN, len / RECENT_DIVISOR)` first opens is a
/// double open (a loader reading one sample twice), not the start of a new pass.
const RECENT_MIN: usize = 8;
const RECENT_DIVISOR: usize = 16;
/// Opens after which a repeat of a long-ago file that no other followed stops counting: a new
/// pass repeats file after file, interleaved only with stragglers of the old one.
const LONE_REPEAT: u64 = 64;
/// Repeats remembered as candidate first opens of a new pass (bounded for loaders that open
/// every sample twice, whose repeats never start one).
const REPEATS_KEPT: usize = 1024;
/// A new pass is young, and accepts stragglers of the previous one, until it has opened
/// `max(YOUNG_MIN, previous / YOUNG_DIVISOR)` files: readers sharing a mount (data-parallel
/// ranks, loader workers) rarely drift further apart.
const YOUNG_MIN: usize = 64;
const YOUNG_DIVISOR: usize = 10;

/// What one open meant to the tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// The first open of this file in the current pass.
    First,
    /// A file the current pass already opened (no new pass yet).
    Repeat,
    /// A late first open of a file belonging to the previous pass.
    Straggler,
    /// This open started a new pass (epoch).
    NewEpoch,
}

/// Files opened by one pass, in first-open order, by their numbers in the set's `Files`.
#[derive(Debug, Default, Clone)]
pub struct Pass {
    order: Vec<FileId>,
    /// By file number: 1 + where the file was first opened in this pass, 0 when it was not. Made
    /// zeroed at once for the set's files (4 bytes each: no hashing, no per-file copy), grown as
    /// new files come.
    position: Vec<u32>,
}

impl Pass {
    /// An empty pass with room for `files` without growing (a million-entry order grown as the
    /// pass goes is copied at once on the planner thread), and positions for the set's `known`
    /// files.
    fn with_capacity(files: usize, known: usize) -> Pass {
        Pass {
            order: Vec::with_capacity(files),
            position: vec![0; known],
        }
    }

    fn add(&mut self, file: FileId) -> bool {
        if self.contains(file) {
            return false;
        }
        let i = file.index();
        if i >= self.position.len() {
            self.position.resize(i + 1, 0);
        }
        self.order.push(file);
        self.position[i] = self.order.len() as u32;
        true
    }

    /// Files in first-open order.
    pub fn order(&self) -> &[FileId] {
        &self.order
    }

    /// Where `file` was first opened in this pass.
    pub fn position(&self, file: FileId) -> Option<usize> {
        match self.position.get(file.index()) {
            Some(&p) if p > 0 => Some(p as usize - 1),
            _ => None,
        }
    }

    /// Whether this pass opened `file`.
    pub fn contains(&self, file: FileId) -> bool {
        self.position(file).is_some()
    }

    /// Files opened.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether nothing was opened.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// A set of positions `0..len` that only shrinks (until it is made anew): removing one costs
/// O(1), and finding the first member at or after any position costs amortized O(1) (a
/// disjoint-set "next member" array with path halving). The epoch tracker keeps the previous
/// pass's files the current one has not opened in one, and the planner the files it has not
/// settled, so that no walk steps over opened or settled files one by one, whatever the pass's
/// size.
#[derive(Debug, Clone)]
pub struct Positions {
    /// `next[i]`: `i` itself while a member, else a position at most as far as the next member;
    /// the last entry is the end (`len`).
    next: Vec<Cell<u32>>,
}

impl Positions {
    /// Every position of `0..len`.
    pub fn all(len: usize) -> Positions {
        Positions {
            next: (0..=len as u32).map(Cell::new).collect(),
        }
    }

    /// The positions' range end.
    pub fn len(&self) -> usize {
        self.next.len() - 1
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first member at or after `i` (`len` when none).
    pub fn find(&self, i: usize) -> usize {
        let mut i = i.min(self.len());
        loop {
            let next = self.next[i].get() as usize;
            if next == i {
                return i;
            }
            let after = self.next[next].get();
            self.next[i].set(after);
            i = after as usize;
        }
    }

    /// Whether `i` is a member.
    pub fn contains(&self, i: usize) -> bool {
        i < self.len() && self.find(i) == i
    }

    /// Removes `i`.
    pub fn remove(&mut self, i: usize) {
        if i < self.len() {
            self.next[i].set(i as u32 + 1);
        }
    }

    /// One more member, at the end of the range.
    pub fn push(&mut self) {
        let end = self.next.len() as u32;
        self.next.push(Cell::new(end));
    }

    /// The first member at or after `from`, wrapping around to the start once: the walk of a
    /// cursor over a set that shrinks as it goes.
    pub fn next_from(&self, from: usize) -> Option<usize> {
        let i = self.find(from);
        if i < self.len() {
            return Some(i);
        }
        let i = self.find(0);
        (i < self.len()).then_some(i)
    }
}

/// The epoch state of one file set.
#[derive(Debug, Clone)]
pub struct EpochTracker {
    /// Every file of the set the passes have seen; passes hold their numbers.
    files: Files,
    epoch: u64,
    current: Pass,
    previous: Option<Pass>,
    /// Positions in `previous` the current pass has not opened.
    unopened: Positions,
    /// Files of `previous` the current pass has opened (for coverage).
    covered: usize,
    /// Opens seen, all passes together.
    opens: u64,
    /// Recent repeats with their open number: the first opens of a possible new pass.
    repeats: VecDeque<(u64, FileId)>,
    /// Open number of the first repeat of a long-ago file in this pass, and how many followed.
    old_repeats: Option<(u64, usize)>,
    /// The pass before `previous`, once a new pass replaced it, for its owner to free
    /// (`take_retired`: a million-file pass takes milliseconds to free).
    retired: Option<Pass>,
}

impl Default for EpochTracker {
    fn default() -> Self {
        EpochTracker {
            files: Files::default(),
            epoch: 1,
            current: Pass::default(),
            previous: None,
            unopened: Positions::all(0),
            covered: 0,
            opens: 0,
            repeats: VecDeque::new(),
            old_repeats: None,
            retired: None,
        }
    }
}

impl EpochTracker {
    /// Records an open of `file`, with the identity the open saw if any (`None` once the set
    /// holds as many files as a `FileId` can number).
    pub fn open(&mut self, file: FileKey, identity: Option<Identity>) -> Option<(FileId, Opened)> {
        let id = self.files.intern(file, identity)?;
        Some((id, self.open_id(id)))
    }

    fn open_id(&mut self, file: FileId) -> Opened {
        self.opens += 1;
        if let Some(first) = self.current.position(file) {
            return self.repeat(file, first);
        }
        if let Some(previous) = self.previous.as_mut()
            && self.current.len() < YOUNG_MIN.max(previous.len() / YOUNG_DIVISOR)
            && !previous.contains(file)
        {
            previous.add(file);
            self.unopened.push();
            return Opened::Straggler;
        }
        // A lone repeat long before the next ones was a sample read again, not a new pass.
        if self
            .old_repeats
            .is_some_and(|(since, _)| self.opens - since > LONE_REPEAT)
        {
            self.old_repeats = None;
        }
        self.current.add(file);
        if let Some(at) = self.previous.as_ref().and_then(|p| p.position(file)) {
            self.unopened.remove(at);
            self.covered += 1;
        }
        Opened::First
    }

    fn repeat(&mut self, file: FileId, first: usize) -> Opened {
        if self.repeats.len() == REPEATS_KEPT {
            self.repeats.pop_front();
        }
        self.repeats.push_back((self.opens, file));
        // At most half the pass, so that tiny sets still see their epochs.
        let recent = RECENT_MIN
            .max(self.current.len() / RECENT_DIVISOR)
            .min(self.current.len() / 2);
        if first + recent >= self.current.len() {
            return Opened::Repeat;
        }
        let (since, count) = self.old_repeats.get_or_insert((self.opens, 0));
        *count += 1;
        let (since, count) = (*since, *count);
        let covered = self
            .previous
            .as_ref()
            .is_some_and(|p| !p.is_empty() && self.covered as f64 >= COVERED * p.len() as f64);
        if !covered && count < RESTART_REPEATS {
            return Opened::Repeat;
        }
        // The new pass began with the old repeats, and with any double-open-looking repeat just
        // before them (its first file may have been among the last ones of this pass).
        let from = since.saturating_sub(RECENT_MIN as u64);
        // The next pass most likely opens the same files.
        let mut next = Pass::with_capacity(self.current.len(), self.files.len());
        for (_, f) in self.repeats.drain(..).filter(|(n, _)| *n >= from) {
            next.add(f);
        }
        self.old_repeats = None;
        let ended = std::mem::replace(&mut self.current, next);
        self.unopened = Positions::all(ended.len());
        self.covered = 0;
        for &f in &self.current.order {
            if let Some(at) = ended.position(f) {
                self.unopened.remove(at);
                self.covered += 1;
            }
        }
        self.retired = self.previous.replace(ended);
        self.epoch += 1;
        Opened::NewEpoch
    }

    /// The pass a new pass retired (the one before the pass that ended), once.
    pub fn take_retired(&mut self) -> Option<Pass> {
        self.retired.take()
    }

    /// The current epoch, from 1.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The files the passes have seen.
    pub fn files(&self) -> &Files {
        &self.files
    }

    /// The key of `file`.
    pub fn key(&self, file: FileId) -> &FileKey {
        self.files.key(file)
    }

    /// Whether the current pass opened `path`.
    pub fn opened(&self, path: &Path) -> bool {
        self.files
            .id(path)
            .is_some_and(|f| self.current.contains(f))
    }

    /// Where the last complete pass first opened `path`.
    pub fn previous_position(&self, path: &Path) -> Option<usize> {
        let previous = self.previous.as_ref()?;
        previous.position(self.files.id(path)?)
    }

    /// The file at `position` of the last complete pass.
    pub fn previous_file(&self, position: usize) -> Option<&FileKey> {
        let file = *self.previous.as_ref()?.order.get(position)?;
        Some(self.files.key(file))
    }

    /// The pass in progress.
    pub fn current(&self) -> &Pass {
        &self.current
    }

    /// The last complete pass, once there is one.
    pub fn previous(&self) -> Option<&Pass> {
        self.previous.as_ref()
    }

    /// Fraction of the previous pass's files the current pass has opened (`None` in epoch 1).
    pub fn progress(&self) -> Option<f64> {
        let previous = self.previous.as_ref().filter(|p| !p.is_empty())?;
        Some((self.covered as f64 / previous.len() as f64).min(1.0))
    }

    /// Files of the previous pass not opened yet in this one: what is still to come this epoch.
    pub fn remaining(&self) -> impl Iterator<Item = &FileKey> {
        self.unopened_from(0).map(|(_, f)| f)
    }

    /// The previous pass's files this pass has not opened, from position `at` of that pass on,
    /// with their positions: each step costs amortized O(1), however many were opened between.
    pub fn unopened_from(&self, at: usize) -> impl Iterator<Item = (usize, &FileKey)> {
        let order = self.previous.as_ref().map_or(&[][..], |p| &p.order[..]);
        let mut next = at;
        std::iter::from_fn(move || {
            let i = self.unopened.find(next);
            next = i + 1;
            order.get(i).map(|&f| (i, self.files.key(f)))
        })
    }

    /// Whether the file at position `at` of the previous pass is still to come in this one.
    pub fn is_unopened(&self, at: usize) -> bool {
        self.unopened.contains(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<FileKey> {
        (0..n)
            .map(|i| FileKey::from(Path::new(&format!("c{}/f{i:05}.jpg", i % 7))))
            .collect()
    }

    fn shuffled(files: &[FileKey], seed: u64) -> Vec<FileKey> {
        let mut out = files.to_vec();
        fastrand::Rng::with_seed(seed).shuffle(&mut out);
        out
    }

    /// Records an open of `f` without an identity.
    fn open(t: &mut EpochTracker, f: &FileKey) -> Opened {
        t.open(f.clone(), None).expect("a number for the file").1
    }

    /// Feeds `order` and returns the epoch after each open.
    fn feed(t: &mut EpochTracker, order: &[FileKey]) -> Vec<u64> {
        order
            .iter()
            .map(|f| {
                open(t, f);
                t.epoch()
            })
            .collect()
    }

    #[test]
    fn each_shuffled_pass_is_one_epoch() {
        let files = keys(500);
        let mut t = EpochTracker::default();
        for epoch in 1..=4 {
            let order = shuffled(&files, epoch);
            let epochs = feed(&mut t, &order);
            // The boundary is seen within the first few repeats of the new pass.
            assert!(epochs[3..].iter().all(|&e| e == epoch), "epoch {epoch}");
            assert_eq!(t.epoch(), epoch);
        }
        assert_eq!(t.progress(), Some(1.0));
        assert_eq!(t.previous().map(Pass::len), Some(500));
    }

    #[test]
    fn replayed_order_starts_a_new_epoch_at_its_first_file() {
        let files = keys(100);
        let mut t = EpochTracker::default();
        feed(&mut t, &files);
        assert_eq!(open(&mut t, &files[0]), Opened::Repeat);
        assert_eq!(open(&mut t, &files[1]), Opened::NewEpoch);
        let begun: Vec<&FileKey> = t.current().order().iter().map(|&f| t.key(f)).collect();
        assert_eq!(begun, [&files[0], &files[1]]);
        feed(&mut t, &files[2..]);
        // Epoch 2 covered epoch 1: the very first repeat starts epoch 3.
        assert_eq!(open(&mut t, &files[0]), Opened::NewEpoch);
        assert_eq!(t.epoch(), 3);
    }

    #[test]
    fn interleaved_workers_with_stragglers_keep_one_epoch_per_pass() {
        let files = keys(400);
        let mut t = EpochTracker::default();
        feed(&mut t, &files[..390]);
        // Worker A starts epoch 2 while worker B still opens the last ten files of epoch 1.
        let next = shuffled(&files, 9);
        let mut mixed = Vec::new();
        for i in 0..10 {
            mixed.push(next[2 * i].clone());
            mixed.push(files[390 + i].clone());
            mixed.push(next[2 * i + 1].clone());
        }
        mixed.extend(next[20..].iter().cloned());
        feed(&mut t, &mixed);
        assert_eq!(t.epoch(), 2);
        assert_eq!(
            t.previous().map(Pass::len),
            Some(400),
            "stragglers belong to epoch 1"
        );
        assert_eq!(t.current().len(), 400);
        assert_eq!(t.progress(), Some(1.0));
    }

    #[test]
    fn a_sample_opened_twice_does_not_split_an_epoch() {
        let files = keys(200);
        let mut t = EpochTracker::default();
        for f in &files {
            open(&mut t, f);
            open(&mut t, f);
        }
        assert_eq!(t.epoch(), 1);
        assert_eq!(t.current().len(), 200);
    }

    #[test]
    fn a_loader_reading_a_subset_sees_epochs_over_that_subset() {
        let files = keys(1000);
        let subset: Vec<FileKey> = files.iter().step_by(3).cloned().collect();
        let mut t = EpochTracker::default();
        for epoch in 1..=3 {
            feed(&mut t, &shuffled(&subset, epoch));
        }
        assert_eq!(t.epoch(), 3);
        assert_eq!(t.previous().map(Pass::len), Some(subset.len()));
        // A different random half each epoch still ends each pass once repeats come.
        let mut t = EpochTracker::default();
        for epoch in 1..=3u64 {
            let half: Vec<FileKey> = shuffled(&files, epoch)[..500].to_vec();
            let epochs = feed(&mut t, &half);
            assert_eq!(*epochs.last().unwrap(), epoch, "epoch {epoch}");
        }
    }

    #[test]
    fn remaining_is_what_the_previous_pass_read_and_this_one_has_not() {
        let files = keys(50);
        let mut t = EpochTracker::default();
        feed(&mut t, &files);
        feed(&mut t, &files[..10]);
        assert_eq!(t.epoch(), 2);
        let remaining: Vec<&FileKey> = t.remaining().collect();
        assert_eq!(remaining.len(), 40);
        assert!(remaining.iter().all(|f| !t.opened(f)));
        assert_eq!(t.progress(), Some(0.2));
    }
}
