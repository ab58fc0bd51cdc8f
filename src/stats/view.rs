//! Metrics of one tensor view: opens, renders, images per second, decode / transform / total
//! latency, errors, bytes out, and which files failed.
//!
//! Owns the view samples' names and meaning. Counting is lock-free except `FailedFiles`, which
//! takes its lock only when a render fails and when a stats file is rendered, never on a
//! successful request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde_json::{Value, json};

use super::{Counter, Histogram, Sample, SampleKind, histogram_samples};

/// Files remembered per view with their failures; more are counted in `errors` only.
pub const MAX_FAILED_FILES: usize = 256;
/// Seconds averaged by `RateMeter::per_second` (the current, partial second is left out).
const RATE_WINDOW: u64 = 5;
/// Per-second buckets kept: the window plus the second being filled.
const RATE_BUCKETS: usize = RATE_WINDOW as usize + 1;

/// Events per second over the last few whole seconds, lock-free.
#[derive(Debug, Default)]
pub struct RateMeter {
    /// (second since the epoch, events in that second), one bucket per second modulo the ring.
    buckets: [(AtomicU64, AtomicU64); RATE_BUCKETS],
}

fn now_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl RateMeter {
    /// Counts one event now.
    pub fn tick(&self) {
        let second = now_second();
        let (stamp, count) = &self.buckets[(second % RATE_BUCKETS as u64) as usize];
        let seen = stamp.load(Ordering::Acquire);
        if seen != second
            && stamp
                .compare_exchange(seen, second, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // This thread turned the bucket over; events racing the reset may be lost (stats).
            count.store(0, Ordering::Release);
        }
        count.fetch_add(1, Ordering::AcqRel);
    }

    /// Mean events per second over the last `RATE_WINDOW` whole seconds.
    pub fn per_second(&self) -> f64 {
        let now = now_second();
        let total: u64 = self
            .buckets
            .iter()
            .filter(|(stamp, _)| {
                let s = stamp.load(Ordering::Acquire);
                s < now && now - s <= RATE_WINDOW
            })
            .map(|(_, count)| count.load(Ordering::Acquire))
            .sum();
        total as f64 / RATE_WINDOW as f64
    }
}

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
    /// Time to decode one image.
    pub decode_latency: Histogram,
    /// Time to run the ops and write the output of one image (crop, resize, flip, normalize).
    pub transform_latency: Histogram,
    /// Time to render one file: read through the cache, decode, ops, encode.
    pub render_latency: Histogram,
}

/// The samples of view `name`: under `views.<name>.` in stats.json, labelled `view` in metrics.
pub fn view_samples(name: &str, m: &ViewMetrics, out: &mut Vec<Sample>) {
    let label = vec![("view", name.to_owned())];
    for (what, prom, help, kind, value) in [
        (
            "opens",
            "view_opens_total",
            "Opens of a view's files.",
            SampleKind::Counter,
            m.opens.get() as f64,
        ),
        (
            "renders",
            "view_renders_total",
            "View files rendered.",
            SampleKind::Counter,
            m.renders.get() as f64,
        ),
        (
            "images_per_s",
            "view_images_per_second",
            "View files rendered per second, mean of the last 5 whole seconds.",
            SampleKind::Gauge,
            m.render_rate.per_second(),
        ),
        (
            "errors",
            "view_errors_total",
            "Renders that failed (answered EIO).",
            SampleKind::Counter,
            m.errors.get() as f64,
        ),
        (
            "bytes_out",
            "view_bytes_out_total",
            "Bytes of .npy files rendered.",
            SampleKind::Counter,
            m.bytes_out.get() as f64,
        ),
    ] {
        out.push(Sample {
            json_path: format!("views.{name}.{what}"),
            prom_name: prom,
            labels: label.clone(),
            kind,
            help,
            value,
        });
    }
    for (what, prom, help, h) in [
        (
            "decode_latency_us",
            "view_decode_latency_microseconds",
            "Time to decode one image, microseconds.",
            &m.decode_latency,
        ),
        (
            "transform_latency_us",
            "view_transform_latency_microseconds",
            "Time to crop, resize, flip, normalize and lay out one image, microseconds.",
            &m.transform_latency,
        ),
        (
            "render_latency_us",
            "view_render_latency_microseconds",
            "Time to render one view file (read, decode, ops, encode), microseconds.",
            &m.render_latency,
        ),
    ] {
        histogram_samples(out, &format!("views.{name}.{what}"), prom, help, h, &label);
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

    #[test]
    fn rate_meter_counts_only_whole_recent_seconds() {
        let meter = RateMeter::default();
        for _ in 0..10 {
            meter.tick();
        }
        // Events of the current second are not in the window yet.
        let now = now_second();
        assert!(meter.per_second() <= 10.0 / RATE_WINDOW as f64);
        let (stamp, count) = &meter.buckets[((now - 1) % RATE_BUCKETS as u64) as usize];
        stamp.store(now - 1, Ordering::Release);
        count.store(25, Ordering::Release);
        assert!(meter.per_second() >= 25.0 / RATE_WINDOW as f64);
    }
}
