//! `prepfs stats`: a mount's stats.json as an aligned, readable table.
//!
//! Owns: reading the stats file of a mount and flattening it for people (`--all`). Must never talk to the
//! daemon any other way than through the file, so it works for any user who can read the mount.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::inode::CONTROL_DIR_NAME;

/// The text of the stats file of the mount at `mountpoint`.
pub fn read_text(mountpoint: &Path) -> Result<String, String> {
    let path = mountpoint.join(CONTROL_DIR_NAME).join("stats.json");
    std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "cannot read {}: {e} (is it a prepfs mount?)",
            path.display()
        )
    })
}

/// The parsed stats file of the mount at `mountpoint`.
pub fn read(mountpoint: &Path) -> Result<Value, String> {
    let text = read_text(mountpoint)?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}/{CONTROL_DIR_NAME}/stats.json is not valid JSON: {e}",
            mountpoint.display()
        )
    })
}

/// The number at dotted `path` (`cache.bytes`) of a stats document; 0 when absent.
pub fn number(stats: &Value, path: &str) -> f64 {
    path.split('.')
        .try_fold(stats, |v, key| v.get(key))
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
}

/// Every field of a stats document, one `dotted.key  value` line each, in document order.
pub fn render_all(stats: &Value) -> String {
    let mut rows = Vec::new();
    flatten("", stats, &mut rows);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut text = String::new();
    for (key, value) in rows {
        let _ = writeln!(text, "{key:<width$}  {value}");
    }
    text
}

/// Dotted key/value rows of a JSON document, in document order.
pub fn flatten(prefix: &str, value: &Value, rows: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, rows);
            }
        }
        Value::Number(n) if n.is_f64() => rows.push((
            prefix.to_owned(),
            format!("{:.3}", n.as_f64().unwrap_or(0.0)),
        )),
        other => rows.push((prefix.to_owned(), other.to_string())),
    }
}
