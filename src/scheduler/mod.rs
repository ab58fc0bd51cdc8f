//! The scheduler: a learned policy (PPO) that sets the pipeline's knobs together, with each
//! module's heuristic as the fallback.
//!
//! Owns: what the policy sees and how it is scored (`state`), the network's inference
//! (`network`) and the pick from its logits (`logits`), policy files (`artifact`), the heuristic
//! restated as an action (`heuristic`), the mounted decision loop (`runtime`), who acts in it
//! while a policy runs (`guard`) and `prepfs policy` (`commands`). With the `train` cargo
//! feature it also owns training: the simulator (`sim`), its randomness (`rng`), PPO with burn
//! (`ppo`, `train`), measuring this machine for the simulator (`calibrate`) and online
//! fine-tuning (`online`); a build without it loads and runs the shipped policy all the same.
//! The knobs, actions and observations it shares with the data plane are `control`'s. It only
//! advises: it writes knobs the cache, prefetcher and views read, and must never sit on a read
//! path.

pub mod artifact;
#[cfg(feature = "train")]
pub mod calibrate;
pub mod commands;
pub mod guard;
pub mod heuristic;
pub mod logits;
pub mod network;
#[cfg(feature = "train")]
pub mod online;
#[cfg(feature = "train")]
pub mod ppo;
#[cfg(feature = "train")]
pub mod rng;
pub mod runtime;
#[cfg(feature = "train")]
pub mod sim;
pub mod state;
#[cfg(feature = "train")]
pub mod train;

/// What a build without the `train` feature answers to `prepfs policy train|calibrate` and
/// `--learn`.
pub const WITHOUT_TRAIN: &str =
    "this prepfs was built without the `train` feature: cargo build --features train";
