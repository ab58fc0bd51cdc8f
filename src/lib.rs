//! prepfs: a read-only FUSE filesystem for deep-learning training data.
//!
//! The mount serves a dataset directory from a never-evict RAM cache and shows its statistics in
//! `.prepfs/` inside the mount. `fs` holds the semantics and never sees FUSE; `fuse` is the only
//! module that does. See DESIGN in the repository's shared notes for the map.

pub mod cache;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod demo;
pub mod error;
pub mod fs;
pub mod fuse;
pub mod inode;
pub mod jobs;
pub mod memory;
pub mod metrics;
pub mod mountinfo;
pub mod options;
pub mod prefetch;
pub mod renders;
pub mod requests;
pub mod run;
pub mod sandbox;
pub mod scheduler;
pub mod shards;
pub mod source;
pub mod stats;
pub mod synthetic;
pub mod telemetry;
pub mod view;
pub mod warm;
pub mod workers;
