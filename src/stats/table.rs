//! `prepfs stats`: a mount's stats.json as an aligned, readable table.
//!
//! Owns: reading the stats file of a mount and flattening it for people. Must never talk to the
//! daemon any other way than through the file, so it works for any user who can read the mount.

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::inode::CONTROL_DIR_NAME;

/// Prints the stats of the mount at `mountpoint` (raw JSON if `json`).
pub fn print(mountpoint: &Path, json: bool) -> Result<(), String> {
    let path = mountpoint.join(CONTROL_DIR_NAME).join("stats.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "cannot read {}: {e} (is it a prepfs mount?)",
            path.display()
        )
    })?;
    // Write errors (a closed pipe, as with `| head`) end the output quietly instead of panicking.
    let mut out = std::io::stdout().lock();
    if json {
        let _ = out.write_all(text.as_bytes());
        return Ok(());
    }
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
    let mut rows = Vec::new();
    flatten("", &value, &mut rows);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in rows {
        if writeln!(out, "{key:<width$}  {value}").is_err() {
            break;
        }
    }
    Ok(())
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
