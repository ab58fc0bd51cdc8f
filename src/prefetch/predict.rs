//! Order predictors and their scores: which files a set's readers will open next.
//!
//! Owns: the predictors (`Replay`: the last pass's order again; `Tree`: a walk of the source
//! tree in sorted or in listing order, as `os.walk` loaders, `ImageFolder` and sorted shard
//! lists read; `remaining`: any file the last pass read and this one has not, for shuffled
//! epochs) and `Score`, which measures each predictor's precision and recall online: a
//! prediction is right when the file is opened within `HORIZON` opens of it. Must never predict
//! a file the current pass already opened, never do I/O (`Tree`'s listings are made, sorted and
//! indexed by the planner's helper, `Chores`, and kept for the pass), and never do work per open
//! that grows with the number of files (each walk is capped by `SCAN_PER_PREDICTION`, finds its
//! starting place by a lookup, not a search, and steps over each file the pass opened once; a
//! plan's walk steps over each file the planner settled once, and over a directory with nothing
//! left in it not at all).

use std::collections::VecDeque;
use std::collections::hash_map::Entry;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

use super::chores::Chores;
use super::epoch::{EpochTracker, Positions};
use super::files::FileKey;
use super::listing::{LISTINGS_KEPT, Listing, Shelf};
use crate::source::Source;

/// Opens within which a prediction must come true to count as right.
pub const HORIZON: u64 = 16;
/// How a predictor is scored: after every `SCORED`th open it predicts the next `SCORED` files.
/// Its predictions then tile the opens (an order that is followed is right for every open) for
/// one walk per `SCORED` opens instead of one per open: scoring every predictor after each open
/// was most of the planner's CPU at 100,000 files.
pub const SCORED: u64 = HORIZON / 2;
/// Weight of the latest open in a predictor's recent recall (an average over ~20 opens).
const RECENT_WEIGHT: f64 = 0.05;
/// Recent recall and precision a predictor needs before its order is followed.
const TRUSTED: f64 = 0.5;
/// Directories a walk may ask listings of for one prediction (bounds the helper's I/O on sparse
/// trees).
const LISTINGS_PER_PREDICTION: usize = 16;
/// Listings a walk may wait for at once (a hung source's listings stop there).
const LISTINGS_ASKED: usize = 64;
/// Candidates a predictor may look at per file it predicts: late in a pass most candidates were
/// opened already, and the planner runs on every open (bounds its CPU).
pub const SCAN_PER_PREDICTION: usize = 16;

/// A predictor of the next opens of one file set.
pub trait Predictor: Send {
    /// Name in the stats.
    fn name(&self) -> &'static str;
    /// Appends up to `n` files expected after `last`, in order, that `skip` does not exclude.
    fn predict(
        &mut self,
        tracker: &EpochTracker,
        last: &Path,
        n: usize,
        skip: &dyn Fn(&Path) -> bool,
        out: &mut Vec<FileKey>,
    );
    /// As `predict`, for a plan: appends up to `n` files after `last` that `judge` takes. A
    /// predictor may pass over the files `judge` settles for the rest of the pass (their
    /// verdict cannot change in it); by default it asks again on every plan.
    fn plan(
        &mut self,
        tracker: &EpochTracker,
        last: &Path,
        n: usize,
        judge: &dyn Fn(&Path) -> Verdict,
        out: &mut Vec<FileKey>,
    ) {
        self.predict(tracker, last, n, &|p| judge(p) != Verdict::Take, out);
    }
    /// Drops what it cached about the tree (a new pass may see a changed one).
    fn forget_listings(&mut self) {}
    /// Items it examined beyond the candidates `skip` was asked about (directories walked and
    /// names looked up) since the last call: the planner's work counter.
    fn take_work(&mut self) -> u64 {
        0
    }
}

/// The last pass's order again (fixed seed, no shuffle, sorted lists).
#[derive(Default)]
pub struct Replay;

impl Predictor for Replay {
    fn name(&self) -> &'static str {
        "replay"
    }

    fn predict(
        &mut self,
        tracker: &EpochTracker,
        last: &Path,
        n: usize,
        skip: &dyn Fn(&Path) -> bool,
        out: &mut Vec<FileKey>,
    ) {
        let Some(at) = tracker.previous_position(last) else {
            return;
        };
        take_unskipped(tracker.unopened_from(at + 1).map(|(_, f)| f), n, skip, out);
    }
}

/// A file a list predictor offers: a path that becomes a key only once it is predicted.
pub trait Candidate: AsRef<Path> {
    /// The planner's key for it.
    fn key(self) -> FileKey;
}

impl Candidate for &FileKey {
    fn key(self) -> FileKey {
        self.clone()
    }
}

impl Candidate for &Path {
    fn key(self) -> FileKey {
        FileKey::from(self)
    }
}

/// Appends the first `n` of `candidates` that `skip` does not exclude, looking at no more than
/// `n * SCAN_PER_PREDICTION` of them (predictors that follow a list of files).
pub fn take_unskipped<C: Candidate>(
    candidates: impl IntoIterator<Item = C>,
    n: usize,
    skip: &dyn Fn(&Path) -> bool,
    out: &mut Vec<FileKey>,
) {
    let wanted = out.len() + n;
    for f in candidates.into_iter().take(n * SCAN_PER_PREDICTION) {
        if out.len() == wanted {
            break;
        }
        if !skip(f.as_ref()) {
            out.push(f.key());
        }
    }
}

/// A listing made by the helper: the pass it was asked in, the directory, and the listing
/// (`None` when the source could not list it).
type Listed = (u64, OsString, Option<Walked>);

/// A directory's listing as this pass's walks see it: with its files not yet found opened, so
/// that a walk late in a shuffled pass steps over each opened file once in the pass, not once per
/// prediction (as `Replay` steps over the tracker's unopened positions); and, for plans, its
/// files not yet found settled, so that a plan steps over each file fetched ahead of the readers
/// once, not on every open until they reach it (ahead of a sorted pass that was most of a plan's
/// work: up to the scan cap of fetched files per plan).
struct Walked {
    listing: Arc<Listing>,
    /// What scoring walks have not found opened yet this pass.
    unopened: Left,
    /// What plans have not found settled yet this pass.
    unsettled: Left,
}

impl Walked {
    fn of(listing: Listing) -> Walked {
        Walked {
            unopened: Left::all(&listing),
            unsettled: Left::all(&listing),
            listing: Arc::new(listing),
        }
    }

    fn left(&mut self, walk: Walk) -> &mut Left {
        match walk {
            Walk::Score => &mut self.unopened,
            Walk::Plan => &mut self.unsettled,
        }
    }
}

/// The positions of a listing's files and subdirectories a walk has not passed over for good:
/// a file once it is opened (or settled), a subdirectory once nothing is left in it, so that a
/// plan far ahead of a sorted pass steps over neither the files nor the directories fetched
/// already.
struct Left {
    files: Positions,
    dirs: Positions,
}

impl Left {
    fn all(listing: &Listing) -> Left {
        Left {
            files: Positions::all(listing.files.len()),
            dirs: Positions::all(listing.dirs.len()),
        }
    }

    fn is_empty(&self) -> bool {
        self.files.find(0) == self.files.len() && self.dirs.find(0) == self.dirs.len()
    }
}

/// Which walk a `Tree` makes: to be scored (the files this pass opened leave the listing's
/// `unopened` positions) or to plan (the files the planner settles leave its `unsettled` ones).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    Score,
    Plan,
}

/// A depth-first walk of the source tree as `os.walk` yields it: a directory's files, then each
/// subdirectory's walk; names sorted, or in the order the directory lists them.
pub struct Tree {
    source: Arc<dyn Source>,
    sorted: bool,
    chores: Chores,
    /// By the directory's path as bytes (`FileKey`'s reason: `Path` hashes component by component).
    listings: foldhash::HashMap<OsString, Walked>,
    /// Where the other walk of a pass finds the names this one listed, and this one the other's.
    shelf: Arc<Shelf>,
    /// Directories asked of the helper and not answered yet; answers come through `listed`, and
    /// those asked before `forget_listings` (an older `pass`) are dropped.
    asked: foldhash::HashSet<OsString>,
    pass: u64,
    answer: Sender<Listed>,
    listed: Receiver<Listed>,
    budget: usize,
    scan: usize,
    /// Directories walked and names looked up since `take_work`.
    work: u64,
    /// The file a walk is looking at, built in place: a walk looks at up to
    /// `SCAN_PER_PREDICTION` names per file it predicts, without an allocation each.
    candidate: PathBuf,
}

impl Tree {
    /// A walk of `source` in sorted name order, or in listing order, its listings made by
    /// `chores`.
    pub fn new(source: Arc<dyn Source>, sorted: bool, chores: Chores) -> Tree {
        let (answer, listed) = channel();
        Tree {
            source,
            sorted,
            chores,
            listings: Default::default(),
            shelf: Arc::default(),
            asked: Default::default(),
            pass: 0,
            answer,
            listed,
            budget: 0,
            scan: 0,
            work: 0,
            candidate: PathBuf::new(),
        }
    }

    /// This walk, sharing the names it lists with the other walks on `shelf` (those of one set:
    /// they walk the same tree, pass for pass).
    pub(super) fn sharing(mut self, shelf: Arc<Shelf>) -> Tree {
        self.shelf = shelf;
        self
    }

    /// `dir`'s listing once the helper has made it; until then it is asked for (within the
    /// prediction's budget) and the walk goes without.
    fn listing(&mut self, dir: &Path) -> Option<Arc<Listing>> {
        self.take_answers();
        if let Some(l) = self.listings.get(dir.as_os_str()) {
            return Some(l.listing.clone());
        }
        let key = dir.as_os_str();
        if self.budget == 0 || self.asked.contains(key) || self.asked.len() >= LISTINGS_ASKED {
            return None;
        }
        self.budget -= 1;
        let (source, sorted, answer, pass, shelf) = (
            self.source.clone(),
            self.sorted,
            self.answer.clone(),
            self.pass,
            self.shelf.clone(),
        );
        let dir = dir.to_path_buf();
        let asked = self.chores.run(Box::new(move || {
            let walked = Listing::of(&*source, &dir, sorted, &shelf, pass).map(Walked::of);
            let _ = answer.send((pass, dir.into_os_string(), walked));
        }));
        if asked.is_ok() {
            self.asked.insert(key.to_os_string());
        }
        // Chores run in place answer at once.
        self.take_answers();
        self.listings.get(key).map(|l| l.listing.clone())
    }

    /// Keeps the listings the helper has made for this pass.
    fn take_answers(&mut self) {
        while let Ok((pass, dir, listing)) = self.listed.try_recv() {
            if pass != self.pass {
                self.chores.dispose(listing);
                continue;
            }
            self.asked.remove(&dir);
            // A directory the source could not list is asked again by a later prediction.
            let Some(listing) = listing else { continue };
            if self.listings.len() >= LISTINGS_KEPT {
                self.chores.dispose(std::mem::take(&mut self.listings));
            }
            self.listings.insert(dir, listing);
        }
    }

    /// Files of `dir` after `after` (all when `None`) that `judge` takes, then the walks of its
    /// subdirectories after `after_dir`; the files it settles leave `walk`'s positions, and so
    /// do the subdirectories with nothing left. Returns whether `dir` has nothing left.
    #[allow(clippy::too_many_arguments)]
    fn walk(
        &mut self,
        walk: Walk,
        dir: &Path,
        after: Option<&std::ffi::OsStr>,
        after_dir: Option<&std::ffi::OsStr>,
        want: usize,
        judge: &dyn Fn(&Path) -> Verdict,
        out: &mut Vec<FileKey>,
    ) -> bool {
        let Some(listing) = self.listing(dir) else {
            return false;
        };
        self.work += 1;
        if after_dir.is_none()
            && let Some(walked) = self.listings.get_mut(dir.as_os_str())
        {
            let files = &mut walked.left(walk).files;
            let mut i = listing.files.start_after(after);
            while out.len() < want && self.scan > 0 {
                let next = files.find(i);
                if walk == Walk::Plan {
                    // Files settled for good still count toward how far ahead a plan looks
                    // (the scan cap bounds how far prefetch runs ahead of the readers), without
                    // a look each.
                    self.scan = self.scan.saturating_sub(next - i);
                    if self.scan == 0 {
                        break;
                    }
                }
                i = next;
                let Some(name) = listing.files.get(i) else {
                    break;
                };
                self.scan -= 1;
                // `dir.join(name)`, as the bytes of the mount's names (no component parsing).
                let path = self.candidate.as_mut_os_string();
                path.clear();
                if !dir.as_os_str().is_empty() {
                    path.push(dir.as_os_str());
                    path.push("/");
                }
                path.push(name);
                match judge(&self.candidate) {
                    Verdict::Take => out.push(FileKey::from(self.candidate.as_path())),
                    Verdict::Settled => files.remove(i),
                    Verdict::Later => {}
                }
                i += 1;
            }
        }
        let mut j = listing.dirs.start_after(after_dir);
        while out.len() < want && self.budget > 0 && self.scan > 0 {
            let Some(walked) = self.listings.get_mut(dir.as_os_str()) else {
                break;
            };
            let next = walked.left(walk).dirs.find(j);
            if walk == Walk::Plan {
                // So do the files of the directories with nothing left (within the cap: a
                // lookup each).
                for passed in j..next {
                    let Some(name) = listing.dirs.get(passed) else {
                        break;
                    };
                    let files = self.listings.get(dir.join(name).as_os_str());
                    let files = files.map_or(0, |w| w.listing.files.len());
                    self.scan = self.scan.saturating_sub(files + 1);
                    if self.scan == 0 {
                        return false;
                    }
                }
            }
            j = next;
            let Some(name) = listing.dirs.get(j) else {
                break;
            };
            // A directory passed costs a candidate too: a walk over many empty (cached)
            // directories stays bounded.
            self.scan -= 1;
            if self.walk(walk, &dir.join(name), None, None, want, judge, out)
                && let Some(walked) = self.listings.get_mut(dir.as_os_str())
            {
                walked.left(walk).dirs.remove(j);
            }
            j += 1;
        }
        self.listings
            .get_mut(dir.as_os_str())
            .is_some_and(|walked| walked.left(walk).is_empty())
    }
}

impl Predictor for Tree {
    fn name(&self) -> &'static str {
        if self.sorted { "sorted" } else { "listed" }
    }

    fn forget_listings(&mut self) {
        self.chores.dispose(std::mem::take(&mut self.listings));
        self.asked.clear();
        self.pass += 1;
    }

    fn take_work(&mut self) -> u64 {
        std::mem::take(&mut self.work)
    }

    fn predict(
        &mut self,
        tracker: &EpochTracker,
        last: &Path,
        n: usize,
        skip: &dyn Fn(&Path) -> bool,
        out: &mut Vec<FileKey>,
    ) {
        // A file the pass opened is passed over for the rest of the pass.
        let judge = |p: &Path| match (skip(p), tracker.opened(p)) {
            (false, _) => Verdict::Take,
            (true, true) => Verdict::Settled,
            (true, false) => Verdict::Later,
        };
        self.walk_from(Walk::Score, last, n, &judge, out);
    }

    fn plan(
        &mut self,
        _tracker: &EpochTracker,
        last: &Path,
        n: usize,
        judge: &dyn Fn(&Path) -> Verdict,
        out: &mut Vec<FileKey>,
    ) {
        self.walk_from(Walk::Plan, last, n, judge, out);
    }
}

impl Tree {
    /// The `walk` from `last`: the rest of its directory, then up the tree (the parent's
    /// subdirectories after this one, and so on to the root), within this prediction's budgets.
    fn walk_from(
        &mut self,
        walk: Walk,
        last: &Path,
        n: usize,
        judge: &dyn Fn(&Path) -> Verdict,
        out: &mut Vec<FileKey>,
    ) {
        let want = out.len() + n;
        self.budget = LISTINGS_PER_PREDICTION;
        self.scan = n * SCAN_PER_PREDICTION;
        let mut dir = last.parent().unwrap_or(Path::new("")).to_path_buf();
        self.walk(walk, &dir, last.file_name(), None, want, judge, out);
        while out.len() < want && self.budget > 0 && self.scan > 0 {
            let Some(name) = dir.file_name().map(std::ffi::OsStr::to_os_string) else {
                break;
            };
            let parent = dir.parent().unwrap_or(Path::new("")).to_path_buf();
            self.walk(walk, &parent, None, Some(&name), want, judge, out);
            dir = parent;
        }
    }
}

/// What the planner makes of a file of the remaining set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Worth a prefetch now.
    Take,
    /// Not now (in flight, taken already, or no room yet): looked at again on a later walk.
    Later,
    /// Nothing more to do for it in this pass (fetched, held whole, failed): never looked at
    /// again until the pass ends.
    Settled,
}

/// Walks `members` (positions of a cursor's order, `len` of them) from after `cursor`, wrapping
/// around once, until `visit` says stop or `budget` members were visited; returns the cursor
/// (the last member `visit` passed; the one it stopped at is visited again by the next walk).
/// `visit` gets a member and may remove it from `members`.
fn walk(
    members: &mut Positions,
    cursor: usize,
    budget: usize,
    mut visit: impl FnMut(&mut Positions, usize) -> bool,
) -> usize {
    let start = if cursor + 1 >= members.len() {
        0
    } else {
        cursor + 1
    };
    let (mut at, mut from, mut wrapped) = (cursor, start, false);
    for _ in 0..budget {
        let Some(i) = members.next_from(from) else {
            break;
        };
        wrapped |= i < from;
        if wrapped && i >= start {
            break;
        }
        if !visit(members, i) {
            break;
        }
        at = i;
        from = i + 1;
    }
    at
}

/// Appends up to `n` files the last pass read and this one has not, in the last pass's order,
/// starting after position `cursor` of it (so that successive calls spread over the set, and a
/// call that finds few continues where the last one stopped); returns the new cursor.
/// `unplanned` holds the positions not settled yet: files found opened or `Settled` leave it,
/// so no walk steps over them again this pass.
pub fn remaining(
    tracker: &EpochTracker,
    unplanned: &mut Positions,
    cursor: usize,
    n: usize,
    judge: &dyn Fn(&Path) -> Verdict,
    out: &mut Vec<FileKey>,
) -> usize {
    if tracker.previous().is_none() {
        return cursor;
    }
    let wanted = out.len() + n;
    walk(unplanned, cursor, n * SCAN_PER_PREDICTION, |members, i| {
        if out.len() >= wanted {
            return false;
        }
        let Some(f) = tracker.previous_file(i) else {
            return false;
        };
        if !tracker.is_unopened(i) {
            members.remove(i);
            return true;
        }
        match judge(f) {
            Verdict::Take => out.push(f.clone()),
            Verdict::Later => {}
            Verdict::Settled => members.remove(i),
        }
        true
    })
}

/// Appends up to `n` files of `by_size` (positions in the last pass, `smallest_first`) after
/// `cursor` that this pass has not read and `judge` takes, stopping at the first that `fits`
/// refuses (those after it are larger); returns the new cursor (the last file taken or passed).
/// `unfetched` holds the indexes of `by_size` not settled yet, as `remaining`'s `unplanned`.
#[allow(clippy::too_many_arguments)]
pub fn smallest_remaining(
    tracker: &EpochTracker,
    by_size: &[u32],
    unfetched: &mut Positions,
    cursor: usize,
    n: usize,
    judge: &dyn Fn(&Path) -> Verdict,
    fits: &dyn Fn(&Path) -> bool,
    out: &mut Vec<FileKey>,
) -> usize {
    if tracker.previous().is_none() {
        return cursor;
    }
    let wanted = out.len() + n;
    walk(unfetched, cursor, n * SCAN_PER_PREDICTION, |members, i| {
        if out.len() >= wanted {
            return false;
        }
        let position = by_size.get(i).map_or(usize::MAX, |&p| p as usize);
        let Some(f) = tracker.previous_file(position) else {
            return false;
        };
        if !tracker.is_unopened(position) {
            members.remove(i);
            return true;
        }
        match judge(f) {
            Verdict::Take if !fits(f) => return false,
            Verdict::Take => out.push(f.clone()),
            Verdict::Later => {}
            Verdict::Settled => members.remove(i),
        }
        true
    })
}

/// Size classes: class 0 holds empty files, class k files of 2^(k-1)..2^k bytes, the last
/// files of unknown size.
const CLASSES: usize = 66;

/// The size class of a file of `size` bytes (`None`: not known), all a pass keeps of its size:
/// one byte a file.
pub fn size_class(size: Option<u64>) -> u8 {
    size.map_or(CLASSES - 1, |s| (u64::BITS - s.leading_zeros()) as usize) as u8
}

/// The positions of a pass's files (of size `classes`, `size_class`) smallest first (unknown sizes
/// last, the order kept within a class): the order in which the remaining set is staged. In a
/// shuffled pass every remaining file is equally likely next, and a miss costs a round trip
/// whatever its size, so the same staging bytes hide the most misses when they hold the smallest
/// files. Linear in the files (a counting sort over 66 classes), so that closing a pass of
/// millions costs no sort.
pub fn smallest_first(classes: &[u8]) -> Vec<u32> {
    let mut starts = [0usize; CLASSES + 1];
    for &c in classes {
        starts[c as usize + 1] += 1;
    }
    for c in 0..CLASSES {
        starts[c + 1] += starts[c];
    }
    let mut positions = vec![0u32; classes.len()];
    for (i, &c) in classes.iter().enumerate() {
        positions[starts[c as usize]] = i as u32;
        starts[c as usize] += 1;
    }
    positions
}

/// The online record of one predictor: what it predicted, what came true.
#[derive(Debug, Default)]
pub struct Score {
    /// Predicted files not yet opened, with the open count by which they must be.
    outstanding: foldhash::HashMap<FileKey, u64>,
    deadlines: VecDeque<(u64, FileKey)>,
    /// Predictions that came true.
    pub hits: u64,
    /// Predictions that expired unopened.
    pub expired: u64,
    /// Opens scored.
    pub opens: u64,
    /// Recall over the last few dozen opens.
    pub recent: f64,
    /// Precision over the last few dozen settled predictions.
    pub recent_precision: f64,
}

impl Score {
    /// Whether the predictor predicts after the `now`th open (`SCORED`; the first open counts
    /// as 1): after the first, so that a pass's second open is predicted already.
    pub fn predicts_after(now: u64) -> bool {
        now.saturating_sub(1).is_multiple_of(SCORED)
    }

    /// Scores an open of `file` (the `now`th open), before the next predictions are added.
    pub fn opened(&mut self, file: &Path, now: u64) {
        self.opens += 1;
        let hit = self.outstanding.remove(file.as_os_str()).is_some();
        if hit {
            self.hits += 1;
            self.recent_precision += RECENT_WEIGHT * (1.0 - self.recent_precision);
        }
        self.recent += RECENT_WEIGHT * (f64::from(u8::from(hit)) - self.recent);
        while let Some((deadline, _)) = self.deadlines.front()
            && *deadline < now
        {
            let Some((deadline, f)) = self.deadlines.pop_front() else {
                break;
            };
            if self.outstanding.get(&f) == Some(&deadline) {
                self.outstanding.remove(&f);
                self.expired += 1;
                self.recent_precision -= RECENT_WEIGHT * self.recent_precision;
            }
        }
    }

    /// Records predictions made after the `now`th open.
    pub fn predicted(&mut self, files: &[FileKey], now: u64) {
        for f in files {
            if let Entry::Vacant(slot) = self.outstanding.entry(f.clone()) {
                let deadline = now + HORIZON;
                slot.insert(deadline);
                self.deadlines.push_back((deadline, f.clone()));
            }
        }
    }

    /// Whether its recent predictions came true often enough to follow its order: most of them
    /// (precision), and for most opens (recall). Towards the end of a shuffled pass any
    /// predictor of unopened files gains recall; only an order that is really followed keeps
    /// precision too.
    pub fn trusted(&self) -> bool {
        self.recent >= TRUSTED && self.recent_precision >= TRUSTED
    }

    /// A new pass begins: recent precision falls to the lifetime one if that is lower. Near the
    /// end of a shuffled pass a walk that skips opened files predicts the few left and looks
    /// right; it must not be followed into the next pass on that alone. An order really
    /// followed (replay, sorted) keeps its trust, its lifetime precision being as high.
    pub fn new_pass(&mut self) {
        self.recent_precision = self.recent_precision.min(self.precision());
    }

    /// Right predictions / settled predictions (0 before any settled).
    pub fn precision(&self) -> f64 {
        let settled = self.hits + self.expired;
        if settled == 0 {
            0.0
        } else {
            self.hits as f64 / settled as f64
        }
    }

    /// Opens that were predicted / opens (each hit is one predicted open).
    pub fn recall(&self) -> f64 {
        if self.opens == 0 {
            0.0
        } else {
            self.hits as f64 / self.opens as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{Kind, LocalSource};

    /// Scores `predictor` over `trace` (after `history` passes fed to the tracker first),
    /// predicting `SCORED` files after every `SCORED`th open as the planner does.
    fn score(predictor: &mut dyn Predictor, history: &[Vec<FileKey>], trace: &[FileKey]) -> Score {
        let mut tracker = EpochTracker::default();
        for pass in history {
            for f in pass {
                tracker.open(f.clone(), None);
            }
        }
        let mut score = Score::default();
        for (i, f) in trace.iter().enumerate() {
            let now = i as u64 + 1;
            tracker.open(f.clone(), None);
            score.opened(f, now);
            if !Score::predicts_after(now) {
                continue;
            }
            let mut out = Vec::new();
            predictor.predict(
                &tracker,
                f,
                SCORED as usize,
                &|p| tracker.opened(p),
                &mut out,
            );
            score.predicted(&out, now);
        }
        score
    }

    /// A tree of `dirs` class folders with `per_dir` files each, and its paths in sorted walk
    /// order.
    fn tree(dirs: usize, per_dir: usize) -> (tempfile::TempDir, Vec<FileKey>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut paths = Vec::new();
        for d in 0..dirs {
            std::fs::create_dir(dir.path().join(format!("class{d:02}"))).expect("mkdir");
            for f in 0..per_dir {
                let rel = format!("class{d:02}/img{f:03}.jpg");
                std::fs::write(dir.path().join(&rel), b"x").expect("write");
                paths.push(FileKey::from(Path::new(&rel)));
            }
        }
        (dir, paths)
    }

    fn source(dir: &tempfile::TempDir) -> Arc<dyn Source> {
        Arc::new(
            LocalSource::open(dir.path())
                .expect("source")
                .settled_at_once(),
        )
    }

    /// On a shuffled pass, predicting unopened files comes true more and more often towards
    /// the end, when few remain: any predictor scores this much there.
    const SHUFFLED_BOUND: f64 = 0.3;

    #[test]
    fn a_walk_right_only_at_the_end_of_a_shuffled_pass_is_not_trusted_into_the_next() {
        let (dir, files) = tree(2, 200);
        let mut order = files.clone();
        fastrand::Rng::with_seed(5).shuffle(&mut order);
        let mut walk = score(
            &mut Tree::new(source(&dir), true, Chores::inline()),
            &[],
            &order,
        );
        assert!(walk.precision() < 0.5, "{walk:?}");
        // Whatever the end of the pass made of its recent precision, a new pass starts from
        // the lifetime one.
        walk.recent_precision = 1.0;
        walk.recent = 1.0;
        walk.new_pass();
        assert!(!walk.trusted(), "{walk:?}");
        let mut replayed = score(&mut Replay, &[order.clone()], &order);
        replayed.new_pass();
        assert!(
            replayed.trusted(),
            "an order really followed keeps its trust: {replayed:?}"
        );
    }

    #[test]
    fn replay_is_precise_on_a_replayed_order_and_useless_on_a_shuffled_one() {
        let (_dir, files) = tree(4, 250);
        let mut order = files.clone();
        fastrand::Rng::with_seed(3).shuffle(&mut order);
        let replayed = score(&mut Replay, &[order.clone()], &order);
        assert!(replayed.precision() > 0.95, "{replayed:?}");
        assert!(replayed.recall() > 0.95, "{replayed:?}");
        let mut other = files.clone();
        fastrand::Rng::with_seed(4).shuffle(&mut other);
        let shuffled = score(&mut Replay, &[order], &other);
        assert!(shuffled.precision() < SHUFFLED_BOUND, "{shuffled:?}");
        assert!(shuffled.recall() < SHUFFLED_BOUND, "{shuffled:?}");
    }

    #[test]
    fn sorted_walk_predicts_an_image_folder_pass_across_class_folders() {
        let (dir, files) = tree(5, 200);
        let mut sorted = Tree::new(source(&dir), true, Chores::inline());
        let s = score(&mut sorted, &[], &files);
        assert!(s.precision() > 0.95, "{s:?}");
        assert!(s.recall() > 0.95, "{s:?}");
        let mut order = files.clone();
        fastrand::Rng::with_seed(5).shuffle(&mut order);
        let mut sorted = Tree::new(source(&dir), true, Chores::inline());
        let s = score(&mut sorted, &[], &order);
        assert!(s.precision() < SHUFFLED_BOUND, "{s:?}");
    }

    #[test]
    fn plans_ahead_of_a_sorted_pass_step_over_each_fetched_file_once() {
        // A sorted pass whose every plan is fetched at once, as small cached files are: the
        // files settled ahead of the readers grow by a depth per open.
        let (dir, files) = tree(4, 500);
        let mut sorted = Tree::new(source(&dir), true, Chores::inline());
        let mut tracker = EpochTracker::default();
        let fetched = std::cell::RefCell::new(std::collections::HashSet::<FileKey>::new());
        let (looked, depth) = (std::cell::Cell::new(0usize), 8);
        for f in &files {
            tracker.open(f.clone(), None);
            let judge = |p: &Path| {
                looked.set(looked.get() + 1);
                if tracker.opened(p) || fetched.borrow().contains(p.as_os_str()) {
                    Verdict::Settled
                } else {
                    Verdict::Take
                }
            };
            let mut taken = Vec::new();
            sorted.plan(&tracker, f, depth, &judge, &mut taken);
            // The plan follows the pass: the next files not fetched yet, in order, none further
            // ahead of the reader than the scan cap (less a position per directory entered).
            let at = files
                .iter()
                .position(|g| g == f)
                .expect("a file of the pass");
            let ahead = |g: &FileKey| files.iter().position(|h| h == g).expect("one") - at;
            let unfetched: Vec<&FileKey> = (files[at + 1..].iter())
                .filter(|g| !fetched.borrow().contains(*g))
                .collect();
            let window = depth * SCAN_PER_PREDICTION;
            assert!(
                taken.iter().zip(&unfetched).all(|(t, u)| t == *u),
                "after {f:?}"
            );
            assert!(taken.iter().all(|t| ahead(t) <= window), "after {f:?}");
            let within = unfetched
                .iter()
                .take(depth)
                .filter(|u| ahead(u) + 4 <= window);
            assert!(taken.len() >= within.count(), "after {f:?}");
            fetched.borrow_mut().extend(taken);
        }
        // Each file is judged once settled and once taken, and at most a few times more at the
        // ends of a directory: walking every fetched file again on each open (up to the scan cap,
        // `depth * SCAN_PER_PREDICTION`) was ~16 times that.
        let per_open = looked.get() as f64 / files.len() as f64;
        assert!(
            per_open <= (2 * depth + 2) as f64,
            "{per_open:.1} files judged per open"
        );
    }

    #[test]
    fn listed_walk_follows_the_directory_listing_order() {
        let (dir, _) = tree(3, 40);
        let src = source(&dir);
        // The order os.walk without sorting would give.
        let mut listed = Vec::new();
        let top = src.list(Path::new(".")).expect("list");
        for (d, _) in top.iter().filter(|(_, kind)| *kind == Kind::Directory) {
            for (name, _) in src.list(Path::new(d)).expect("list").iter() {
                listed.push(FileKey::from(Path::new(d).join(name).as_path()));
            }
        }
        let s = score(&mut Tree::new(src, false, Chores::inline()), &[], &listed);
        assert!(s.precision() > 0.95, "{s:?}");
    }

    #[test]
    fn shards_read_in_sorted_order_are_predicted_one_shard_ahead() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut shards = Vec::new();
        for i in 0..40 {
            let rel = format!("train-{i:05}.tar");
            std::fs::write(dir.path().join(&rel), b"x").expect("write");
            shards.push(FileKey::from(Path::new(&rel)));
        }
        let s = score(
            &mut Tree::new(source(&dir), true, Chores::inline()),
            &[],
            &shards,
        );
        assert!(s.recall() > 0.95, "{s:?}");
    }

    #[test]
    fn remaining_covers_exactly_the_unread_rest_of_the_set() {
        let (_dir, files) = tree(2, 30);
        let mut t = EpochTracker::default();
        for f in &files {
            t.open(f.clone(), None);
        }
        let mut order = files.clone();
        fastrand::Rng::with_seed(8).shuffle(&mut order);
        for f in &order[..20] {
            t.open(f.clone(), None);
        }
        let mut first = Vec::new();
        let mut unplanned = Positions::all(files.len());
        let cursor = remaining(&t, &mut unplanned, 0, 25, &|_| Verdict::Take, &mut first);
        let mut rest = Vec::new();
        let judge = |p: &Path| {
            if first.iter().any(|f| &**f == p) {
                Verdict::Settled
            } else {
                Verdict::Take
            }
        };
        remaining(&t, &mut unplanned, cursor, 100, &judge, &mut rest);
        // Settled and opened files left the set: a third walk finds only the rest's.
        let mut again = Vec::new();
        remaining(&t, &mut unplanned, 0, 100, &judge, &mut again);
        assert_eq!(again.len(), 40 - first.len());
        let mut got: Vec<FileKey> = first.into_iter().chain(rest).collect();
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 40);
        assert!(got.iter().all(|f| !order[..20].contains(f)));
    }

    /// Items the planner examines per open, on average over three passes (sorted, then two
    /// shuffled) of `n` files in one directory: every predictor scored after each open and
    /// followed to the largest depth, and the remaining-set walk, as `SetState::opened` does.
    fn planner_work_per_open(n: usize) -> f64 {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut files = Vec::new();
        for i in 0..n {
            let rel = format!("img{i:07}.jpg");
            std::fs::File::create(dir.path().join(&rel)).expect("create");
            files.push(FileKey::from(Path::new(&rel)));
        }
        let src = source(&dir);
        let mut predictors: Vec<Box<dyn Predictor>> = vec![
            Box::new(Replay),
            Box::new(Tree::new(src.clone(), true, Chores::inline())),
            Box::new(Tree::new(src, false, Chores::inline())),
        ];
        let mut tracker = EpochTracker::default();
        let (mut work, mut opens, mut cursor) = (0u64, 0u64, 0usize);
        let mut unplanned = Positions::all(0);
        let mut settled: std::collections::HashSet<FileKey> = Default::default();
        let passes = [files.clone(), shuffled(&files, 1), shuffled(&files, 2)];
        for pass in &passes {
            for p in &mut predictors {
                p.forget_listings();
            }
            for f in pass {
                let opened = tracker.open(f.clone(), None).map(|(_, o)| o);
                if opened == Some(super::super::epoch::Opened::NewEpoch) {
                    unplanned = Positions::all(tracker.previous().map_or(0, |p| p.len()));
                    settled.clear();
                }
                opens += 1;
                let looked = std::cell::Cell::new(0u64);
                let skip = |p: &Path| {
                    looked.set(looked.get() + 1);
                    tracker.opened(p)
                };
                for p in &mut predictors {
                    if Score::predicts_after(opens) {
                        p.predict(&tracker, f, SCORED as usize, &skip, &mut Vec::new());
                    }
                    p.predict(&tracker, f, PLANNED_DEPTH, &skip, &mut Vec::new());
                    work += p.take_work();
                }
                // Each file taken is settled (fetched) by the next open.
                let judge = |p: &Path| {
                    if skip(p) || settled.contains(p.as_os_str()) {
                        Verdict::Settled
                    } else {
                        Verdict::Take
                    }
                };
                let mut taken = Vec::new();
                cursor = remaining(
                    &tracker,
                    &mut unplanned,
                    cursor,
                    PLANNED_DEPTH,
                    &judge,
                    &mut taken,
                );
                settled.extend(taken);
                work += looked.get();
            }
        }
        work as f64 / opens as f64
    }

    /// A depth the planner follows predictions to (a few times `DEPTH_MIN`).
    const PLANNED_DEPTH: usize = 16;

    fn shuffled(files: &[FileKey], seed: u64) -> Vec<FileKey> {
        let mut out = files.to_vec();
        fastrand::Rng::with_seed(seed).shuffle(&mut out);
        out
    }

    #[test]
    fn planner_work_per_open_does_not_grow_with_the_file_count() {
        // Both sets larger than any one scan cap, so that neither is bounded by its own size.
        let small = planner_work_per_open(600);
        let large = planner_work_per_open(6_000);
        eprintln!("planner work per open: {small:.1} items (600 files), {large:.1} (6,000)");
        // Bounded by the scan caps (a few candidates per file predicted, one lookup per walk,
        // each directory listed once per pass): ten times the files, about the same work.
        assert!(
            large <= small * 1.25 + 8.0,
            "{small:.0} -> {large:.0} items per open"
        );
        // About one candidate per file predicted by each of the four walks (three predictors
        // and the remaining set): late in a shuffled pass each file the pass opened is stepped
        // over once per walk, not once per prediction (it was 177 items per open at 6,000 files
        // before the tree walks kept their listings' unopened files).
        let cap = (4 * (SCORED as usize + PLANNED_DEPTH)) as f64;
        assert!(large <= cap, "{large:.0} items per open");
    }

    #[test]
    fn smallest_first_orders_by_size_with_unknown_sizes_last() {
        let files: Vec<FileKey> = ["a", "b", "c", "d"]
            .map(|n| FileKey::from(Path::new(n)))
            .into();
        let size = |p: &Path| match p.to_str() {
            Some("a") => Some(300),
            Some("b") => None,
            Some("c") => Some(100),
            _ => Some(200),
        };
        let classes: Vec<u8> = files.iter().map(|f| size_class(size(f))).collect();
        let sorted = smallest_first(&classes);
        let got: Vec<&str> = sorted
            .iter()
            .map(|&i| files[i as usize].to_str().unwrap_or(""))
            .collect();
        assert_eq!(got, ["c", "d", "a", "b"]);
    }

    #[test]
    fn smallest_remaining_takes_unread_files_in_size_order_while_they_fit() {
        let (_dir, files) = tree(2, 30);
        let mut t = EpochTracker::default();
        for f in &files {
            t.open(f.clone(), None);
        }
        // Epoch 2 has read files 0-9 and 58; file 59 is held already; file 56 does not fit.
        for f in files[..10].iter().chain([&files[58]]) {
            t.open(f.clone(), None);
        }
        let by_size: Vec<u32> = (0..files.len() as u32).rev().collect();
        let mut unfetched = Positions::all(by_size.len());
        let judge = |p: &Path| {
            if *p == *files[59] {
                Verdict::Settled
            } else {
                Verdict::Take
            }
        };
        let mut out = Vec::new();
        let cursor = smallest_remaining(
            &t,
            &by_size,
            &mut unfetched,
            by_size.len() - 1,
            4,
            &judge,
            &|p: &Path| *p != *files[56],
            &mut out,
        );
        assert_eq!(
            out,
            [files[57].clone()],
            "stops at the first that does not fit"
        );
        let mut more = Vec::new();
        smallest_remaining(
            &t,
            &by_size,
            &mut unfetched,
            cursor,
            2,
            &judge,
            &|_| true,
            &mut more,
        );
        assert_eq!(
            more,
            [files[56].clone(), files[55].clone()],
            "goes on from there"
        );
    }
}
