//! The scheduler: a learned policy (PPO) that sets the pipeline's knobs together, with each
//! module's heuristic as the fallback.
//!
//! Owns: what the policy sees and how it is scored (`state`), the network's inference
//! (`network`) and the pick from its logits (`logits`), the heuristic restated as an action
//! (`heuristic`), and, for training, the simulator (`sim`), its randomness (`rng`) and PPO
//! (`ppo`, `train`). The knobs, actions and observations it shares with the data plane are
//! `control`'s. It only advises: it writes knobs the cache, prefetcher and views read, and must
//! never sit on a read path.

pub mod artifact;
pub mod calibrate;
pub mod commands;
pub mod heuristic;
pub mod logits;
pub mod network;
pub mod online;
pub mod ppo;
pub mod rng;
pub mod runtime;
pub mod sim;
pub mod state;
pub mod train;
