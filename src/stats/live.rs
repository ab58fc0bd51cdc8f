//! The live views: `prepfs top MNT` and `prepfs stats MNT --watch`.
//!
//! Owns: reading a mount's stats.json at an interval, turning two consecutive snapshots into
//! rates (throughput, hit rate and stall over the interval), and drawing them: redrawn in place
//! when stdout is a terminal, one plain line (or table) per interval otherwise, so the output
//! reads well over SSH and in logs alike. Must never talk to the daemon other than through the
//! stats file, and never need more of a terminal than clearing the screen.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Duration;

use indicatif::HumanBytes;
use serde_json::Value;

use super::summary::{diagnoses, epochs};
use super::table::{self, number};
use crate::cache::metrics as cache;
use crate::fs::metrics as fs;
use crate::metrics::Metric;
use crate::prefetch::metrics as prefetch;
use crate::view::metrics as view;

/// Moves the cursor home and clears the screen (VT100, understood by every terminal in use).
const CLEAR: &str = "\x1b[H\x1b[2J";

/// How often and how long to show.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// Time between updates.
    pub interval: Duration,
    /// Updates to show before returning; `None`: until interrupted.
    pub count: Option<u64>,
}

/// `prepfs top`: the dashboard of the mount at `mountpoint`.
pub fn top(mountpoint: &Path, watch: Watch) -> Result<(), String> {
    let terminal = std::io::stdout().is_terminal();
    let mut previous: Option<Value> = None;
    each(watch, || {
        let now = table::read(mountpoint)?;
        let text = if terminal {
            format!(
                "{CLEAR}prepfs top: {} (every {:.1} s, Ctrl-C to quit)\n{}",
                mountpoint.display(),
                watch.interval.as_secs_f64(),
                dashboard(&now, previous.as_ref())
            )
        } else {
            format!("{}\n", line(&now, previous.as_ref()))
        };
        previous = Some(now);
        Ok(text)
    })
}

/// `prepfs stats --watch`: the summary (every field with `all`), redrawn each interval.
pub fn watch_table(mountpoint: &Path, watch: Watch, all: bool) -> Result<(), String> {
    let terminal = std::io::stdout().is_terminal();
    each(watch, || {
        let mut text = String::from(if terminal { CLEAR } else { "" });
        text.push_str(&super::render(&table::read(mountpoint)?, all));
        if !terminal {
            text.push('\n');
        }
        Ok(text)
    })
}

/// Writes what `frame` makes every `watch.interval`, `watch.count` times or until stdout closes.
fn each(watch: Watch, mut frame: impl FnMut() -> Result<String, String>) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    let mut shown = 0u64;
    loop {
        let text = frame()?;
        // A closed pipe (`| head`) ends the view quietly.
        if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(());
        }
        shown += 1;
        if watch.count.is_some_and(|c| shown >= c) {
            return Ok(());
        }
        std::thread::sleep(watch.interval);
    }
}

/// What changed between two snapshots, per second of the time between them; since the mount
/// started when there is no earlier snapshot.
struct Rates {
    served: f64,
    opens: f64,
    source: f64,
    fetch_stall: f64,
    prep_stall: f64,
    /// Hit rate of the interval; `None` when it had no cache lookups.
    hit_rate: Option<f64>,
}

impl Rates {
    fn between(now: &Value, before: Option<&Value>) -> Rates {
        let delta_at = |path: &str| number(now, path) - before.map_or(0.0, |b| number(b, path));
        let delta = |metric: &Metric| delta_at(metric.path);
        let seconds = delta(&fs::UPTIME).max(1e-3);
        let (hits, misses) = (delta(&cache::HITS), delta(&cache::MISSES));
        Rates {
            served: delta(&fs::BYTES_SERVED) / seconds,
            opens: delta_at(&fs::OP_REQUESTS.path_for("open")) / seconds,
            source: delta(&cache::SOURCE_BYTES) / seconds,
            fetch_stall: delta(&fs::FETCH_STALL) / seconds,
            prep_stall: delta(&fs::PREP_STALL) / seconds,
            hit_rate: (hits + misses > 0.0).then(|| hits / (hits + misses)),
        }
    }
}

fn percent(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.0}%", 100.0 * part / whole)
    } else {
        "-".to_owned()
    }
}

fn bytes(b: f64) -> HumanBytes {
    HumanBytes(b.max(0.0) as u64)
}

/// The dashboard drawn on a terminal.
fn dashboard(now: &Value, before: Option<&Value>) -> String {
    let r = Rates::between(now, before);
    let n = |metric: &Metric| number(now, metric.path);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "up {:.0} s\n\nthroughput  {}/s served, {:.0} opens/s, source {}/s",
        n(&fs::UPTIME),
        bytes(r.served),
        r.opens,
        bytes(r.source)
    );
    let _ = writeln!(
        out,
        "hit rate    {} now, {} since mount",
        r.hit_rate
            .map_or("-".to_owned(), |h| format!("{:.1}%", 100.0 * h)),
        percent(n(&cache::HITS), n(&cache::HITS) + n(&cache::MISSES))
    );
    let _ = writeln!(
        out,
        "stall       fetch {:.2} s/s, prep {:.2} s/s (reader time waiting, per second)",
        r.fetch_stall, r.prep_stall
    );
    let _ = writeln!(
        out,
        "cache RAM   {} of {} ({}), holds {} of content (x{:.2}), {} files whole",
        bytes(n(&cache::BYTES)),
        bytes(n(&cache::BUDGET_BYTES)),
        percent(n(&cache::BYTES), n(&cache::BUDGET_BYTES)),
        bytes(n(&cache::LOGICAL_BYTES)),
        n(&cache::CAPACITY_RATIO),
        n(&cache::COMPLETE_FILES)
    );
    if now.get("disk").is_some() {
        let _ = writeln!(
            out,
            "cache disk  {} of {} ({}), x{:.2}",
            bytes(n(&cache::DISK_BYTES)),
            bytes(n(&cache::DISK_BUDGET_BYTES)),
            percent(n(&cache::DISK_BYTES), n(&cache::DISK_BUDGET_BYTES)),
            n(&cache::DISK_CAPACITY_RATIO)
        );
    }
    if let Some(line) = cluster_line(now) {
        out.push_str(&line);
        out.push('\n');
    }
    let codec = &now["cache"]["codec"];
    let _ = write!(
        out,
        "policy      codec {} ({})",
        codec["choice"].as_str().unwrap_or("-"),
        codec["reason"].as_str().unwrap_or("-"),
    );
    // Decoded pixels are a views matter.
    if now.get("views").is_some() {
        let decoded = &now["cache"]["decoded"]["policy"];
        let kept = decoded["keeping"].as_bool() == Some(true);
        let _ = write!(
            out,
            ", decoded pixels {} ({})",
            if kept { "kept" } else { "not kept" },
            decoded["reason"].as_str().unwrap_or("-")
        );
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "prefetch    depth {}, useful {} of {} issued ({}), staged {} of {}",
        n(&prefetch::DEPTH),
        n(&prefetch::USEFUL),
        n(&prefetch::ISSUED),
        percent(n(&prefetch::USEFUL), n(&prefetch::ISSUED)),
        bytes(n(&cache::STAGED_BYTES)),
        bytes(n(&cache::STAGED_BUDGET_BYTES))
    );
    let _ = writeln!(out, "epochs      {}", epochs(now).join("; "));
    for line in views(now) {
        let _ = writeln!(out, "{line}");
    }
    for diagnosis in diagnoses(now) {
        let _ = writeln!(out, "diagnosis   {diagnosis}");
    }
    out
}

/// A line per view: its renders, the jobs reading it and what they share.
fn views(now: &Value) -> Vec<String> {
    let Some(views) = now.get("views").and_then(Value::as_object) else {
        return Vec::new();
    };
    views
        .keys()
        .map(|name| {
            let n = |metric: &Metric| number(now, &metric.path_for(name));
            format!(
                "view {name:<6} {:.0} images/s, {} renders, {} jobs now ({} seen), {} shared hits, \
                 held {} ({}), {} evicted",
                n(&view::IMAGES_PER_S),
                n(&view::RENDERS),
                n(&view::JOBS),
                n(&view::JOBS_SEEN),
                n(&view::SHARED_HITS),
                n(&view::HELD_RENDERS),
                bytes(n(&view::HELD_BYTES)),
                n(&view::HELD_EVICTED)
            )
        })
        .collect()
}

/// One plain line per interval, for logs and pipes: `key=value` fields with no spaces inside a
/// value, then each set's epoch.
fn line(now: &Value, before: Option<&Value>) -> String {
    let r = Rates::between(now, before);
    let n = |metric: &Metric| number(now, metric.path);
    let bytes = |b: f64| bytes(b).to_string().replace(' ', "");
    format!(
        "uptime={:.1}s served={}/s opens={:.0}/s source={}/s hit_rate={} fetch_stall={:.2}s/s \
         prep_stall={:.2}s/s ram={} disk={} {}",
        n(&fs::UPTIME),
        bytes(r.served),
        r.opens,
        bytes(r.source),
        r.hit_rate
            .map_or("-".to_owned(), |h| format!("{:.1}%", 100.0 * h)),
        r.fetch_stall,
        r.prep_stall,
        percent(n(&cache::BYTES), n(&cache::BUDGET_BYTES)),
        percent(n(&cache::DISK_BYTES), n(&cache::DISK_BUDGET_BYTES)),
        epochs(now).join(" ")
    )
}

/// The cluster tier's line, with `--cluster`: what the cluster answered since the mount, and how
/// its nodes are.
fn cluster_line(now: &Value) -> Option<String> {
    use crate::cache::cluster::metrics as c;
    now.get("cluster")?;
    let n = |metric: &Metric| number(now, metric.path);
    let (hits, misses) = (n(&c::HITS), n(&c::MISSES));
    Some(format!(
        "cluster     {} hits of {} lookups ({}), {} timed out, {} errors, {} damaged; \
         in {} out {}; lookup p50 {:.0} p99 {:.0} us; {} of {} nodes down, {} refused full",
        hits,
        hits + misses,
        percent(hits, hits + misses),
        n(&c::TIMEOUTS),
        n(&c::ERRORS),
        n(&c::CORRUPT),
        bytes(n(&c::BYTES_IN)),
        bytes(n(&c::BYTES_OUT)),
        number(now, &format!("{}.p50", c::LATENCY.path)),
        number(now, &format!("{}.p99", c::LATENCY.path)),
        n(&c::NODES_DOWN),
        n(&c::NODES),
        n(&c::REFUSED),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_of_the_interval_and_hit_rate_is_the_interval_s() {
        let before = serde_json::json!({
            "uptime_seconds": 10.0, "bytes_served": 1000, "cache": {"hits": 10, "misses": 10},
            "stall": {"fetch_seconds": 1.0},
        });
        let now = serde_json::json!({
            "uptime_seconds": 12.0, "bytes_served": 5000, "cache": {"hits": 19, "misses": 11},
            "stall": {"fetch_seconds": 2.0},
        });
        let r = Rates::between(&now, Some(&before));
        assert_eq!(r.served, 2000.0);
        assert_eq!(r.fetch_stall, 0.5);
        assert_eq!(r.hit_rate, Some(0.9));
        let since_mount = Rates::between(&now, None);
        assert_eq!(since_mount.served, 5000.0 / 12.0);
    }

    #[test]
    fn top_shows_the_cluster_tier_only_with_one() {
        assert_eq!(
            cluster_line(&serde_json::json!({"cache": {"hits": 1}})),
            None
        );
        let now = serde_json::json!({"cluster": {
            "hits": 90, "misses": 10, "timeouts": 2, "errors": 3, "corrupt": 1,
            "bytes_in": 94_371_840, "bytes_out": 1_048_576, "refused": 4,
            "latency_us": {"p50": 850.0, "p99": 4100.0, "count": 100},
            "nodes": 3, "nodes_down": 1,
        }});
        let line = cluster_line(&now).expect("a cluster line");
        for part in [
            "90 hits of 100 lookups (90%)",
            "2 timed out, 3 errors, 1 damaged",
            "in 90.00 MiB out 1.00 MiB",
            "p50 850 p99 4100 us",
            "1 of 3 nodes down, 4 refused full",
        ] {
            assert!(line.contains(part), "{part}: {line}");
        }
    }

    #[test]
    fn top_shows_each_views_jobs_and_what_they_share() {
        let now = serde_json::json!({"views": {"train": {
            "images_per_s": 310.0, "renders": 1200, "jobs": 3, "jobs_seen": 4,
            "shared_hits": 2400, "held_renders": 12, "held_bytes": 1_806_336, "held_evicted": 2,
        }}});
        let lines = views(&now);
        assert_eq!(lines.len(), 1);
        for part in [
            "view train",
            "310 images/s",
            "1200 renders",
            "3 jobs now (4 seen)",
            "2400 shared hits",
            "held 12 (1.72 MiB)",
            "2 evicted",
        ] {
            assert!(lines[0].contains(part), "{part}: {}", lines[0]);
        }
    }
}
