//! The control plane's vocabulary: the knobs the data plane reads, the actions that set them
//! together, the observations telemetry fills, and the codec a knob can name.
//!
//! Owns: those plain types and nothing else. It sits at the bottom of the house so that the data
//! plane (cache, prefetch, views, telemetry) and the scheduler above it can share them with every
//! import pointing down: the modules read knobs and fill observations, the scheduler reads
//! observations and writes knobs. Must never import the data plane or the scheduler, and never
//! decide a knob's value: each module's own rule and the scheduler's policy do that.

pub mod action;
pub mod codec;
pub mod knobs;
pub mod observation;
