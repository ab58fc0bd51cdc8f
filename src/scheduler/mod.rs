//! The scheduler: a learned policy (PPO) that sets the pipeline's knobs together, with each
//! module's heuristic as the fallback.
//!
//! Owns: the state and action schema (`state`, `action`), the network's inference (`network`),
//! the heuristic restated as an action (`heuristic`), and, for training, the simulator (`sim`)
//! and PPO (`ppo`, `train`). It only advises: it sets knobs the cache, prefetcher and views
//! read, and must never sit on a read path.

pub mod action;
pub mod artifact;
pub mod calibrate;
pub mod commands;
pub mod heuristic;
pub mod knobs;
pub mod network;
pub mod online;
pub mod ppo;
pub mod runtime;
pub mod sim;
pub mod state;
pub mod train;
