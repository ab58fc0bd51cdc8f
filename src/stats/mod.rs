//! `prepfs stats` and `prepfs top`: a mount's statistics read through its stats file.
//!
//! Owns: reading `.prepfs/stats.json` of a mount and showing it to people, as a flat table
//! (`table`) or a live dashboard (`live`). Figures are found by their definitions in the modules
//! that count them (`crate::cache::metrics::HITS.path`), never by a name spelled here. Must never
//! talk to the daemon any other way than through the file, so it works for any user who can read
//! the mount.

pub mod live;
pub mod table;
