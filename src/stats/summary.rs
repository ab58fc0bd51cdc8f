//! `prepfs stats MNT`: the figures a person looks at first, on one screen.
//!
//! Owns: which figures the summary shows and how they read (bytes in binary units, each with the
//! one-line meaning its definition gives). Figures are the definitions of the modules that count
//! them, never names spelled here, and `prepfs stats --all` shows every field. Must stay within
//! `MAX_LINES` for a mount with a view or two, so it fits a terminal without scrolling.

use std::fmt::Write as _;

use indicatif::HumanBytes;
use serde_json::Value;

use super::table::number;
use crate::cache::metrics as cache;
use crate::fs::metrics as fs;
use crate::memory::metrics as memory;
use crate::metrics::Metric;
use crate::prefetch::metrics as prefetch;
use crate::view::metrics as view;

/// Lines of a summary of a mount with up to two views and two file sets: a screen of a terminal.
pub const MAX_LINES: usize = 25;

/// The mount's figures the summary shows, in order.
const FIGURES: [&Metric; 14] = [
    &fs::UPTIME,
    &fs::BYTES_SERVED,
    &cache::HIT_RATE,
    &cache::SOURCE_BYTES,
    &fs::FETCH_STALL,
    &fs::PREP_STALL,
    &memory::BUDGET_BYTES,
    &cache::BYTES,
    &cache::BUDGET_BYTES,
    &cache::LOGICAL_BYTES,
    &cache::COMPLETE_FILES,
    &cache::ADMISSION_REJECTED,
    &prefetch::ISSUED,
    &prefetch::USEFUL,
];

/// Each view's figures, shown once per view.
const VIEW_FIGURES: [&Metric; 2] = [&view::IMAGES_PER_S, &view::ERRORS];

/// The summary of a stats document: one `path  value  meaning` line per figure, a line with each
/// file set's epoch, a line per stall diagnosis, and where to find the rest.
pub fn render(stats: &Value) -> String {
    let mut rows: Vec<(String, String, &str)> = FIGURES
        .iter()
        .map(|m| (m.path.to_owned(), value(stats, m.path), m.help))
        .collect();
    if let Some(views) = stats.get("views").and_then(Value::as_object) {
        for name in views.keys() {
            for m in VIEW_FIGURES {
                let path = m.path_for(name);
                let shown = value(stats, &path);
                rows.push((path, shown, m.help));
            }
        }
    }
    let key = rows.iter().map(|(k, _, _)| k.len()).max().unwrap_or(0);
    let val = rows.iter().map(|(_, v, _)| v.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v, help) in &rows {
        let _ = writeln!(out, "{k:<key$}  {v:>val$}  {help}");
    }
    let sets = epochs(stats);
    if !sets.is_empty() {
        let _ = writeln!(out, "epochs      {}", sets.join("; "));
    }
    for diagnosis in diagnoses(stats) {
        let _ = writeln!(out, "diagnosis   {diagnosis}");
    }
    out.push_str("every field: prepfs stats --all MNT (or --json); their meaning: docs/STATS.md\n");
    out
}

/// Each file set's epoch, progress and predictor: `files: epoch 3, 45% (replay)`.
pub(super) fn epochs(stats: &Value) -> Vec<String> {
    let Some(sets) = stats.get("epochs").and_then(Value::as_object) else {
        return Vec::new();
    };
    sets.iter()
        .map(|(name, set)| {
            let progress = set["progress"]
                .as_f64()
                .map_or(String::new(), |p| format!(", {:.0}%", 100.0 * p.min(1.0)));
            format!(
                "{name}: epoch {}{progress} ({})",
                set["epoch"],
                set["predictor"].as_str().unwrap_or("-")
            )
        })
        .collect()
}

/// Each file set's last stall diagnosis: `files, epoch 2: cache: <advice>`.
pub(super) fn diagnoses(stats: &Value) -> Vec<String> {
    let Some(sets) = stats.get("epochs").and_then(Value::as_object) else {
        return Vec::new();
    };
    sets.iter()
        .filter_map(|(name, set)| {
            let d = &set["diagnosis"];
            let (verdict, advice) = (d["verdict"].as_str()?, d["advice"].as_str()?);
            Some(format!("{name}, epoch {}: {verdict}: {advice}", d["epoch"]))
        })
        .collect()
}

/// A figure's value as people read it: bytes in binary units, ratios and seconds with two
/// decimals, counts whole; `-` when the document does not have it.
fn value(stats: &Value, path: &str) -> String {
    let found = path
        .split('.')
        .try_fold(stats, |v, key| v.get(key))
        .is_some();
    if !found {
        return "-".to_owned();
    }
    let n = number(stats, path);
    let name = path.rsplit('.').next().unwrap_or(path);
    if name.split('_').any(|word| word == "bytes") {
        HumanBytes(n.max(0.0) as u64).to_string()
    } else if n.fract() != 0.0 {
        format!("{n:.2}")
    } else {
        format!("{n:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_shows_each_figure_by_its_definition_with_its_meaning() {
        let stats = serde_json::json!({
            "uptime_seconds": 12.5, "bytes_served": 3 << 20,
            "cache": {"hit_rate": 0.75, "bytes": 1024},
            "views": {"train": {"images_per_s": 300.0, "errors": 0}},
            "epochs": {"files": {"epoch": 2, "progress": 0.5, "predictor": "replay"}},
        });
        let text = render(&stats);
        let line = |path: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{path} ")))
                .unwrap_or_else(|| panic!("no {path} in\n{text}"))
                .to_owned()
        };
        assert!(line(fs::BYTES_SERVED.path).contains("3.00 MiB"), "{text}");
        assert!(line(cache::HIT_RATE.path).contains(" 0.75  "), "{text}");
        assert!(
            line(cache::HIT_RATE.path).ends_with(cache::HIT_RATE.help),
            "{text}"
        );
        assert!(line(cache::SOURCE_BYTES.path).contains(" -  "), "{text}");
        assert!(line(cache::BYTES.path).contains("1.00 KiB"), "{text}");
        assert!(line("views.train.images_per_s").contains(" 300 "), "{text}");
        assert!(text.contains("files: epoch 2, 50% (replay)"), "{text}");
        assert!(text.lines().count() <= MAX_LINES, "{text}");
    }

    #[test]
    fn epochs_show_each_set_with_its_progress_and_predictor() {
        let stats = serde_json::json!({"epochs": {
            "files": {"epoch": 3, "progress": 0.456, "predictor": "replay"},
            "view:train": {"epoch": 1, "progress": null, "predictor": "none"},
        }});
        assert_eq!(
            epochs(&stats),
            ["files: epoch 3, 46% (replay)", "view:train: epoch 1 (none)"]
        );
    }
}
