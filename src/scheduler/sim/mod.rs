//! A discrete-event model of the prepfs pipeline, for training and comparing scheduler policies.
//!
//! Owns, one module each: the per-item costs it is calibrated with (`calibration`), the
//! machines, sources and workloads it runs (`scenario`), the baseline policies (`baselines`) and
//! the event engine that steps a scenario one decision interval at a time (`engine`). Its
//! randomness is the trainer's seeded `scheduler::rng`, so a run is deterministic for a seed.
//! Must never touch the machine or the real cache.

pub mod baselines;
pub mod calibration;
pub mod engine;
pub mod scenario;
