//! Prefetch's jobs, as the I/O pool's background lane runs them: fetch a planned file's first
//! blocks into the cache (else the staging buffer, else open and park it), or a readahead range
//! of a file being read.
//!
//! Owns the fetching of one planned file or range, and handing the pool the next job. Must never
//! plan (the planner decides what is queued), never decide when a job runs (the pool does: after
//! every queued request, at most `--prefetch-threads` at once, half while a demand read needs
//! the source), and never fetch past the cache's or the staging buffer's room.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::files::FileKey;
use super::{Ahead, EWMA, FILE_BLOCKS, Job, Outcome, SetId, Shared};
use crate::cache::{Prefetched, RamFile};
use crate::requests;
use crate::source::{Identity, SourceFile};

/// The next queued job, as the pool runs it; none once prefetch stops.
pub(super) fn next(shared: &Arc<Shared>) -> Option<requests::Job> {
    if shared.stop.load(Ordering::Acquire) {
        return None;
    }
    let job = shared.jobs.lock().queue.pop_front()?;
    let shared = shared.clone();
    Some(Box::new(move || run(&shared, job)))
}

fn run(shared: &Shared, job: Job) {
    match job {
        Job::File {
            set,
            file,
            identity,
        } => fetch_file(shared, set, &file, identity),
        Job::Blocks {
            entry,
            source,
            blocks,
        } => {
            for index in blocks {
                if shared.stop.load(Ordering::Acquire) {
                    break;
                }
                match shared.fetcher.prefetch(&entry, index, source.as_ref()) {
                    Ok(Prefetched::Fetched | Prefetched::Staged) => {
                        shared.metrics.blocks.inc();
                    }
                    Ok(Prefetched::Present | Prefetched::Late) => {}
                    Ok(Prefetched::NoRoom) | Err(_) => break,
                }
            }
        }
    }
}

/// Fetches the first blocks of `file` ahead of its open, and for a view set has it prepared
/// (`WorkAhead`: decoded or rendered); one prepared "not now" is left to be planned again. When
/// there is no room for the bytes, the opened file is parked
/// instead, so that the reader's open at least makes no round trip (and a later try, once room
/// frees, makes none either).
fn fetch_file(shared: &Shared, set: SetId, file: &FileKey, known: Option<Identity>) {
    if set > 0
        && shared
            .work_ahead
            .as_ref()
            .is_some_and(|w| !w.shows(set, file) || !w.worth_planning(set))
    {
        return;
    }
    if let Some(entry) = known.and_then(|id| shared.fetcher.ram().get(&id))
        && entry.is_complete()
    {
        return;
    }
    {
        let mut outcomes = shared.outcomes[set].lock();
        if matches!(
            outcomes.get(file),
            Some(Outcome::InFlight | Outcome::Done | Outcome::Settled)
        ) {
            return;
        }
        outcomes.insert(file.clone(), Outcome::InFlight);
    }
    let started = Instant::now();
    let mut fetched = false;
    let mut took = 0.0;
    let mut decoded = false;
    // Prepared nothing for a passing reason: planned again rather than settled.
    let mut later = false;
    let mut parked_now = false;
    let parked = shared.parked.take(file, None);
    let opened_now = parked.is_none();
    match parked.map_or_else(|| shared.source.open(file), Ok) {
        Ok(source) => {
            // A view's render of an image whose restart-marked copy is cached starts from the
            // copy: the file's own bytes would take the image's room a second time.
            let ram = shared.fetcher.ram();
            let mut no_room = false;
            if !(set > 0 && ram.derived().has_marked(&source.identity())) {
                let entry = ram.file(source.identity());
                (fetched, no_room) = fetch_first_blocks(shared, &entry, source.as_ref());
                ram.settle(&entry);
                // Let go before the work ahead, whose copy takes the place of an entry that
                // nobody holds.
            }
            took = started.elapsed().as_secs_f64();
            // A file whose open came meanwhile (its outcome taken) needs no work ahead now.
            let unopened = || shared.outcomes[set].lock().get(file) == Some(&Outcome::InFlight);
            if set > 0
                && !no_room
                && unopened()
                && let Some(prepare) = &shared.work_ahead
            {
                match prepare.prepare(set, file, source.as_ref()) {
                    Ahead::Done => {
                        shared.metrics.decoded_ahead.inc();
                        decoded = true;
                    }
                    Ahead::NotNow => later = !fetched,
                    Ahead::Nothing => {}
                }
            }
            if no_room {
                if opened_now {
                    shared.metrics.opened_ahead.inc();
                }
                parked_now = true;
                for closed in shared.parked.park(file.clone(), source) {
                    for outcomes in &shared.outcomes {
                        let mut outcomes = outcomes.lock();
                        if outcomes.get(&closed) == Some(&Outcome::Parked) {
                            outcomes.remove(&closed);
                        }
                    }
                }
            }
        }
        Err(e) => {
            tracing::debug!(path = %file.display(), error = %e, "prefetch could not open a file");
            shared.metrics.failed.inc();
        }
    }
    let mut outcomes = shared.outcomes[set].lock();
    // The reader may have opened it meanwhile (counted late, entry gone): leave that be.
    if outcomes.get(file) == Some(&Outcome::InFlight) {
        if fetched || decoded {
            outcomes.insert(file.clone(), Outcome::Done);
        } else if parked_now {
            outcomes.insert(file.clone(), Outcome::Parked);
        } else if later {
            outcomes.remove(file.as_os_str());
        } else {
            outcomes.insert(file.clone(), Outcome::Settled);
        }
    }
    drop(outcomes);
    if fetched || decoded {
        shared.metrics.issued.inc();
    }
    if fetched {
        let old = f64::from_bits(shared.file_seconds.load(Ordering::Relaxed));
        let new = if old == 0.0 {
            took
        } else {
            old + EWMA * (took - old)
        };
        shared.file_seconds.store(new.to_bits(), Ordering::Relaxed);
    }
}

/// Fetches the first `FILE_BLOCKS` blocks of `entry` from `source` into the cache: whether any
/// came from the source, and whether the first had no room.
fn fetch_first_blocks(
    shared: &Shared,
    entry: &Arc<RamFile>,
    source: &dyn SourceFile,
) -> (bool, bool) {
    let mut fetched = false;
    for index in 0..entry.blocks().min(FILE_BLOCKS) {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        match shared.fetcher.prefetch(entry, index, source) {
            Ok(Prefetched::Fetched | Prefetched::Staged) => {
                shared.metrics.blocks.inc();
                fetched = true;
            }
            Ok(Prefetched::Present | Prefetched::Late) => {}
            Ok(Prefetched::NoRoom) => return (fetched, index == 0),
            Err(_) => {
                shared.metrics.failed.inc();
                break;
            }
        }
    }
    (fetched, false)
}
