//! Metrics: the vocabulary every module counts and shows its figures with.
//!
//! Owns: lock-free `Counter`, `Histogram` and `RateMeter`; `Metric`, the one definition of a
//! figure (its stats.json path, Prometheus name, kind and meaning), which the module that counts
//! the figure declares as a constant and which the stats files, `prepfs top`, `prepfs warm` and
//! the test of docs/STATS.md all read; `Samples`, the list a snapshot is built into; and the two
//! writings of it (JSON and Prometheus text), so `.prepfs/stats.json` and `.prepfs/metrics` cannot disagree. Must never
//! know any module's figures (each module owns its own) and never take a lock or block when
//! counting: request paths only add to atomics.

mod histogram;
mod rate;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

pub use histogram::{Histogram, quantile_us};
pub use rate::RateMeter;

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a figure's values mean over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows while the mount lives (Prometheus `counter`, name ending in `_total`).
    Counter,
    /// A value now.
    Gauge,
    /// A latency histogram, shown as its p50, p99 and count in microseconds.
    Latency,
}

/// The one definition of a figure a mount shows.
#[derive(Debug, PartialEq, Eq)]
pub struct Metric {
    /// Dotted path in stats.json (`cache.hits`); a `*` stands for the value of `label`
    /// (`ops.*.requests`). A latency's path is the prefix of its `.p50`, `.p99` and `.count`.
    pub path: &'static str,
    /// Prometheus name, without the common `prepfs_` prefix.
    pub prom: &'static str,
    /// Counter, gauge or latency.
    pub kind: Kind,
    /// The Prometheus label whose value is the `*` of `path`, if any.
    pub label: Option<&'static str>,
    /// One line: what the figure counts, and its unit.
    pub help: &'static str,
}

impl Metric {
    /// A counter at `path`.
    pub const fn counter(path: &'static str, prom: &'static str, help: &'static str) -> Metric {
        Metric {
            path,
            prom,
            kind: Kind::Counter,
            label: None,
            help,
        }
    }

    /// A gauge at `path`.
    pub const fn gauge(path: &'static str, prom: &'static str, help: &'static str) -> Metric {
        Metric {
            path,
            prom,
            kind: Kind::Gauge,
            label: None,
            help,
        }
    }

    /// A latency histogram under `path`.
    pub const fn latency(path: &'static str, prom: &'static str, help: &'static str) -> Metric {
        Metric {
            path,
            prom,
            kind: Kind::Latency,
            label: None,
            help,
        }
    }

    /// This figure once per value of `label`, which takes the place of the `*` in its path.
    pub const fn by(self, label: &'static str) -> Metric {
        Metric {
            label: Some(label),
            ..self
        }
    }

    /// The stats.json path of this figure for `value` of its label (the path itself without).
    pub fn path_for(&self, value: &str) -> String {
        self.path.replacen('*', value, 1)
    }
}

/// One value of one figure, as the stats files show it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The figure.
    pub metric: &'static Metric,
    /// Where it goes in stats.json (the metric's path, its `*` filled in).
    pub path: String,
    /// Prometheus labels.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: f64,
}

/// Every sample of one snapshot, in the order they are rendered.
#[derive(Debug, Default)]
pub struct Samples(Vec<Sample>);

impl Samples {
    /// Adds `metric`'s value.
    pub fn put(&mut self, metric: &'static Metric, value: f64) {
        self.put_labelled(metric, None, value);
    }

    /// Adds `metric`'s value for `label` (its `*`).
    pub fn put_for(&mut self, metric: &'static Metric, label: &str, value: f64) {
        self.put_labelled(metric, Some(label), value);
    }

    /// Adds a counter's value.
    pub fn count(&mut self, metric: &'static Metric, counter: &Counter) {
        self.put(metric, counter.get() as f64);
    }

    /// Adds a counter of nanoseconds, in seconds.
    pub fn seconds(&mut self, metric: &'static Metric, nanos: &Counter) {
        self.put(metric, nanos.get() as f64 / 1e9);
    }

    /// Adds 1 or 0.
    pub fn flag(&mut self, metric: &'static Metric, on: bool) {
        self.put(metric, f64::from(u8::from(on)));
    }

    /// Adds the p50, p99 and count of a latency histogram, in microseconds.
    pub fn latency(&mut self, metric: &'static Metric, h: &Histogram) {
        self.latency_labelled(metric, None, h);
    }

    /// `latency` for `label` (its `*`).
    pub fn latency_for(&mut self, metric: &'static Metric, label: &str, h: &Histogram) {
        self.latency_labelled(metric, Some(label), h);
    }

    /// The samples, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Sample> {
        self.0.iter()
    }

    fn labels(metric: &Metric, label: Option<&str>) -> (String, Vec<(&'static str, String)>) {
        match (metric.label, label) {
            (Some(name), Some(value)) => (metric.path_for(value), vec![(name, value.to_owned())]),
            _ => (metric.path.to_owned(), Vec::new()),
        }
    }

    fn put_labelled(&mut self, metric: &'static Metric, label: Option<&str>, value: f64) {
        let (path, labels) = Self::labels(metric, label);
        self.0.push(Sample {
            metric,
            path,
            labels,
            value,
        });
    }

    fn latency_labelled(&mut self, metric: &'static Metric, label: Option<&str>, h: &Histogram) {
        let (prefix, labels) = Self::labels(metric, label);
        let with = |quantile: String| {
            let mut l = labels.clone();
            l.push(("quantile", quantile));
            l
        };
        for (name, quantile, value) in [
            ("p50", "0.5", h.quantile_us(0.5)),
            ("p99", "0.99", h.quantile_us(0.99)),
            ("count", "count", h.count() as f64),
        ] {
            self.0.push(Sample {
                metric,
                path: format!("{prefix}.{name}"),
                labels: with(quantile.to_owned()),
                value,
            });
        }
    }
}

/// Writes samples as the nested JSON document of `.prepfs/stats.json`, plus `documents`: JSON
/// values placed whole at a dotted path (for keys that are data, such as file paths).
pub fn to_json_text(samples: &Samples, documents: Vec<(String, Value)>) -> String {
    let mut root = Map::new();
    for s in samples.iter() {
        let value = if s.value.fract() == 0.0 && s.value.abs() < 9.0e15 {
            Value::from(s.value as i64)
        } else {
            serde_json::Number::from_f64(s.value)
                .map(Value::Number)
                .unwrap_or(Value::Null)
        };
        insert_path(&mut root, &s.path, value);
    }
    for (path, value) in documents {
        insert_path(&mut root, &path, value);
    }
    let mut text =
        serde_json::to_string_pretty(&Value::Object(root)).unwrap_or_else(|_| "{}".into());
    text.push('\n');
    text
}

/// Inserts `value` at dotted `path`. A path through an existing leaf is skipped; the daemon's
/// test of a whole snapshot keeps the figures free of those.
fn insert_path(root: &mut Map<String, Value>, path: &str, value: Value) {
    let mut node = root;
    let mut parts = path.split('.').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            node.insert(part.to_owned(), value);
            return;
        }
        let entry = node
            .entry(part.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(map) = entry else { return };
        node = map;
    }
}

/// Writes samples in the Prometheus text exposition format of `.prepfs/metrics`.
pub fn to_prometheus_text(samples: &Samples) -> String {
    let mut out = String::new();
    let mut described = HashSet::new();
    for s in samples.iter() {
        let name = format!("prepfs_{}", s.metric.prom);
        if described.insert(name.clone()) {
            let kind = match s.metric.kind {
                Kind::Counter => "counter",
                Kind::Gauge | Kind::Latency => "gauge",
            };
            out.push_str(&format!(
                "# HELP {name} {}\n# TYPE {name} {kind}\n",
                s.metric.help
            ));
        }
        out.push_str(&name);
        if !s.labels.is_empty() {
            let labels: Vec<String> = s
                .labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{v}\""))
                .collect();
            out.push_str(&format!("{{{}}}", labels.join(",")));
        }
        out.push_str(&format!(" {}\n", s.value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HITS: Metric = Metric::counter("cache.hits", "cache_hits_total", "Hits.");
    const ERRORS: Metric =
        Metric::counter("ops.*.errors", "errors_total", "Errors, by op.").by("op");
    const LATENCY: Metric = Metric::latency(
        "read_latency_us",
        "read_latency_microseconds",
        "Read latency, us.",
    );

    #[test]
    fn one_definition_gives_both_texts() {
        let mut s = Samples::default();
        s.put(&HITS, 3.0);
        s.put_for(&ERRORS, "read", 1.0);
        s.put_for(&ERRORS, "open", 0.0);
        let h = Histogram::default();
        h.record(std::time::Duration::from_micros(100));
        s.latency(&LATENCY, &h);
        let json: Value = serde_json::from_str(&to_json_text(&s, Vec::new())).expect("json");
        assert_eq!(json["cache"]["hits"], 3);
        assert_eq!(json["ops"]["read"]["errors"], 1);
        assert_eq!(json["read_latency_us"]["count"], 1);
        let prom = to_prometheus_text(&s);
        assert!(prom.contains("prepfs_cache_hits_total 3\n"));
        assert!(prom.contains("prepfs_errors_total{op=\"read\"} 1\n"));
        assert!(prom.contains("prepfs_read_latency_microseconds{quantile=\"count\"} 1\n"));
        assert_eq!(
            prom.matches("# TYPE prepfs_errors_total counter").count(),
            1
        );
        assert_eq!(ERRORS.path_for("read"), "ops.read.errors");
    }
}
