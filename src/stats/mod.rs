//! `prepfs stats` and `prepfs top`: a mount's statistics read through its stats file.
//!
//! Owns: reading `.prepfs/stats.json` of a mount and showing it to people, as a flat table
//! (`table`: every field, or the `summary` of the figures people look at first) or a live
//! dashboard (`live`). Figures are found by their definitions in the modules
//! that count them (`crate::cache::metrics::HITS.path`), never by a name spelled here. Must never
//! talk to the daemon any other way than through the file, so it works for any user who can read
//! the mount.

pub mod live;
pub mod summary;
pub mod table;

use std::io::Write;
use std::path::Path;

use serde_json::Value;

/// What `prepfs stats` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// The summary (`summary::render`).
    Summary,
    /// Every field, one `dotted.key  value` line each (`--all`).
    All,
    /// stats.json unchanged (`--json`).
    Json,
}

/// Prints the stats of the mount at `mountpoint` as `shown`.
pub fn print(mountpoint: &Path, shown: Shown) -> Result<(), String> {
    let text = match shown {
        Shown::Json => table::read_text(mountpoint)?,
        Shown::Summary | Shown::All => render(&table::read(mountpoint)?, shown == Shown::All),
    };
    // Write errors (a closed pipe, as with `| head`) end the output quietly instead of panicking.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

/// A stats document as text: every field (`all`) or the summary.
pub fn render(stats: &Value, all: bool) -> String {
    if all {
        table::render_all(stats)
    } else {
        summary::render(stats)
    }
}
