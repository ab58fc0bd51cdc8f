//! Metrics of one tensor view: opens, renders, images per second, decode / transform / total
//! latency, errors, bytes out, and which files failed.
//!
//! Owns: these figures' definitions (path, Prometheus name, meaning) and their counters. Counting
//! is lock-free except `FailedFiles`, which takes its lock only when a render fails and when a
//! stats file is rendered, never on a successful request.

use std::collections::BTreeMap;

use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::metrics::{Counter, Histogram, Metric, RateMeter, Samples};

/// Files remembered per view with their failures; more are counted in `errors` only.
pub const MAX_FAILED_FILES: usize = 256;
/// Files whose renders failed: path -> (failures, last error), at most `MAX_FAILED_FILES`.
#[derive(Debug, Default)]
pub struct FailedFiles(Mutex<BTreeMap<String, (u64, String)>>);

impl FailedFiles {
    /// Records one failure of `path`.
    pub fn record(&self, path: &str, error: &str) {
        let mut files = self.0.lock();
        if let Some((count, last)) = files.get_mut(path) {
            *count += 1;
            *last = error.to_owned();
        } else if files.len() < MAX_FAILED_FILES {
            files.insert(path.to_owned(), (1, error.to_owned()));
        }
    }

    /// `{path: {"errors": n, "last_error": "..."}}`.
    pub fn to_json(&self) -> Value {
        Value::Object(
            self.0
                .lock()
                .iter()
                .map(|(path, (count, error))| {
                    (path.clone(), json!({"errors": count, "last_error": error}))
                })
                .collect(),
        )
    }
}

/// Counters of one tensor view.
#[derive(Debug, Default)]
pub struct ViewMetrics {
    /// Opens of the view's files.
    pub opens: Counter,
    /// Files rendered (one per open that was read).
    pub renders: Counter,
    /// Renders per second, recently.
    pub render_rate: RateMeter,
    /// Renders that failed (corrupt, truncated, not an image, too large): EIO.
    pub errors: Counter,
    /// Which files failed, and why.
    pub failed_files: FailedFiles,
    /// Bytes of .npy files produced.
    pub bytes_out: Counter,
    /// Encoded bytes of the images rendered (their files' sizes), summed over renders.
    pub image_bytes: Counter,
    /// Bytes the images rendered take decoded (width x height x 3), summed over renders.
    pub pixel_bytes: Counter,
    /// Time to decode one image.
    pub decode_latency: Histogram,
    /// Time to run the ops and write the output of one image (crop, resize, flip, normalize).
    pub transform_latency: Histogram,
    /// Time to render one file: read through the cache, decode, ops, encode.
    pub render_latency: Histogram,
    /// Renders made ahead of their opens, for files prefetch predicted.
    pub rendered_ahead: Counter,
    /// Opens that found their render made ahead (no render waited for).
    pub ahead_used: Counter,
    /// Entries left out of listings: images whose view name would be too long to open, and
    /// directories an image's view file hides.
    pub unlisted_names: Counter,
    /// Jobs that opened a file of the view, in all (`crate::jobs`).
    pub jobs_seen: Counter,
    /// Renders made for an open and held for the other jobs reading the view.
    pub shared_renders: Counter,
    /// Opens served by another job's render of the same file and epoch: renders saved.
    pub shared_hits: Counter,
}

/// The jobs reading a view and the renders held between them (`renders::sharing`), at one
/// moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct JobFigures {
    /// Jobs that opened a file of the view in the last 30 s.
    pub jobs: usize,
    /// Renders held for other jobs to take (finished or running).
    pub held_renders: usize,
    /// Bytes of the finished ones.
    pub held_bytes: u64,
    /// Held renders dropped before every job took them: each costs a render again.
    pub evicted: u64,
}

/// Opens of a view's files.
pub const OPENS: Metric = Metric::counter(
    "views.*.opens",
    "view_opens_total",
    "Opens of a view's files.",
)
.by("view");
/// Files rendered.
pub const RENDERS: Metric = Metric::counter(
    "views.*.renders",
    "view_renders_total",
    "View files rendered.",
)
.by("view");
/// Renders per second.
pub const IMAGES_PER_S: Metric = Metric::gauge(
    "views.*.images_per_s",
    "view_images_per_second",
    "View files rendered per second, mean of the last 5 whole seconds.",
)
.by("view");
/// Failed renders.
pub const ERRORS: Metric = Metric::counter(
    "views.*.errors",
    "view_errors_total",
    "Renders that failed (answered EIO).",
)
.by("view");
/// Bytes rendered.
pub const BYTES_OUT: Metric = Metric::counter(
    "views.*.bytes_out",
    "view_bytes_out_total",
    "Bytes of .npy files rendered.",
)
.by("view");
/// Encoded bytes of the images rendered.
pub const IMAGE_BYTES: Metric = Metric::counter(
    "views.*.image_bytes",
    "view_image_bytes_total",
    "Encoded bytes of the images rendered (each image's file size, once per render).",
)
.by("view");
/// Decoded bytes of the images rendered.
pub const PIXEL_BYTES: Metric = Metric::counter(
    "views.*.pixel_bytes",
    "view_pixel_bytes_total",
    "Bytes the images rendered take as decoded pixels (width x height x 3, once per render): what keeping their pixels would cost.",
)
.by("view");
/// Decode time.
pub const DECODE_LATENCY: Metric = Metric::latency(
    "views.*.decode_latency_us",
    "view_decode_latency_microseconds",
    "Time to decode one image, or the part of it a render reads, microseconds.",
)
.by("view");
/// Transform time.
pub const TRANSFORM_LATENCY: Metric = Metric::latency(
    "views.*.transform_latency_us",
    "view_transform_latency_microseconds",
    "Time to crop, resize, flip, normalize and lay out one image, microseconds.",
)
.by("view");
/// Render time.
pub const RENDER_LATENCY: Metric = Metric::latency(
    "views.*.render_latency_us",
    "view_render_latency_microseconds",
    "Time to render one view file (read, decode, ops, encode), microseconds.",
)
.by("view");

/// Renders made ahead.
pub const RENDERED_AHEAD: Metric = Metric::counter(
    "views.*.rendered_ahead",
    "view_rendered_ahead_total",
    "Renders made ahead of their opens, for files prefetch predicted, with spare memory while no render waited.",
)
.by("view");
/// Opens served by a render made ahead.
pub const AHEAD_USED: Metric = Metric::counter(
    "views.*.ahead_used",
    "view_ahead_used_total",
    "Opens that found their render made ahead (rendered_ahead minus these: predictions that missed).",
)
.by("view");
/// Images left out of listings.
pub const UNLISTED_NAMES: Metric = Metric::counter(
    "views.*.unlisted_names",
    "view_unlisted_names_total",
    "Entries left out of a listing of the view: images whose name plus .npy would pass 255 bytes, and directories an image's view file hides (once per listing).",
)
.by("view");

/// Jobs reading the view now.
pub const JOBS: Metric = Metric::gauge(
    "views.*.jobs",
    "view_jobs",
    "Jobs that opened a file of the view in the last 30 s (each counts its own epochs; see SEMANTICS.md, Jobs).",
)
.by("view");
/// Jobs seen.
pub const JOBS_SEEN: Metric = Metric::counter(
    "views.*.jobs_seen",
    "view_jobs_seen_total",
    "Jobs that opened a file of the view since the mount started.",
)
.by("view");
/// Renders held for other jobs.
pub const SHARED_RENDERS: Metric = Metric::counter(
    "views.*.shared_renders",
    "view_shared_renders_total",
    "Renders made for an open while other jobs read the view, held for them to take.",
)
.by("view");
/// Renders held for other jobs now.
pub const HELD_RENDERS: Metric = Metric::gauge(
    "views.*.held_renders",
    "view_held_renders",
    "Renders held now for other jobs reading the view to take (finished or running).",
)
.by("view");
/// Their bytes.
pub const HELD_BYTES: Metric = Metric::gauge(
    "views.*.held_bytes",
    "view_held_bytes",
    "Bytes of the finished renders held for other jobs (charged to the memory budget's work share).",
)
.by("view");
/// Held renders dropped before all jobs took them.
pub const HELD_EVICTED: Metric = Metric::counter(
    "views.*.held_evicted",
    "view_held_evicted_total",
    "Held renders dropped before every job reading the view took them (held 60 s, 4096 held, or the memory budget needed the room): each costs a render again, never a different tensor.",
)
.by("view");
/// Opens served by another job's render.
pub const SHARED_HITS: Metric = Metric::counter(
    "views.*.shared_hits",
    "view_shared_hits_total",
    "Opens served by the render another job made of the same file for the same epoch: renders saved.",
)
.by("view");

impl ViewMetrics {
    /// An image's mean encoded and decoded bytes over the renders so far (`None` before one).
    pub fn image_sizes(&self) -> Option<(f64, f64)> {
        let renders = self.renders.get();
        (renders > 0).then(|| {
            let per = |total: u64| total as f64 / renders as f64;
            (per(self.image_bytes.get()), per(self.pixel_bytes.get()))
        })
    }

    /// The samples of view `name`, with its jobs and held renders now (`jobs`): under `views.<name>.` in
    /// stats.json, labelled `view` in metrics.
    pub fn samples(&self, name: &str, jobs: &JobFigures, out: &mut Samples) {
        out.put_for(&OPENS, name, self.opens.get() as f64);
        out.put_for(&RENDERS, name, self.renders.get() as f64);
        out.put_for(&IMAGES_PER_S, name, self.render_rate.per_second());
        out.put_for(&ERRORS, name, self.errors.get() as f64);
        out.put_for(&BYTES_OUT, name, self.bytes_out.get() as f64);
        out.put_for(&IMAGE_BYTES, name, self.image_bytes.get() as f64);
        out.put_for(&PIXEL_BYTES, name, self.pixel_bytes.get() as f64);
        out.latency_for(&DECODE_LATENCY, name, &self.decode_latency);
        out.latency_for(&TRANSFORM_LATENCY, name, &self.transform_latency);
        out.latency_for(&RENDER_LATENCY, name, &self.render_latency);
        out.put_for(&RENDERED_AHEAD, name, self.rendered_ahead.get() as f64);
        out.put_for(&AHEAD_USED, name, self.ahead_used.get() as f64);
        out.put_for(&UNLISTED_NAMES, name, self.unlisted_names.get() as f64);
        out.put_for(&JOBS, name, jobs.jobs as f64);
        out.put_for(&JOBS_SEEN, name, self.jobs_seen.get() as f64);
        out.put_for(&SHARED_RENDERS, name, self.shared_renders.get() as f64);
        out.put_for(&SHARED_HITS, name, self.shared_hits.get() as f64);
        out.put_for(&HELD_RENDERS, name, jobs.held_renders as f64);
        out.put_for(&HELD_BYTES, name, jobs.held_bytes as f64);
        out.put_for(&HELD_EVICTED, name, jobs.evicted as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_files_are_counted_by_path_and_bounded() {
        let failed = FailedFiles::default();
        failed.record("a/b.jpg", "cannot decode: x");
        failed.record("a/b.jpg", "cannot decode: y");
        for i in 0..MAX_FAILED_FILES + 10 {
            failed.record(&format!("f{i}.jpg"), "not an image");
        }
        let json = failed.to_json();
        assert_eq!(json["a/b.jpg"]["errors"], 2);
        assert_eq!(json["a/b.jpg"]["last_error"], "cannot decode: y");
        assert_eq!(json.as_object().map(|o| o.len()), Some(MAX_FAILED_FILES));
    }
}
