//! The prepfs binary a benchmark runs.
//!
//! Owns the one rule: cargo's build of this bench, unless `PREPFS_BENCH_BIN` names another (an
//! earlier build, to compare before and after in one session, interleaved). Must never build.

use std::path::PathBuf;

/// The binary under test.
pub fn prepfs() -> PathBuf {
    std::env::var_os("PREPFS_BENCH_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_prepfs")),
        PathBuf::from,
    )
}
