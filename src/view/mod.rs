//! Tensor views: images of the dataset served as preprocessed .npy files.
//!
//! Owns what a view is (`spec`), how one file is rendered (`render`, CPU), the .npy container
//! (`npy`), and the placement seam: an `Executor` runs renders on one device, so the GPU backend
//! and the scheduler add executors instead of changing view code. Must never serve a partial
//! file: a render either completes or fails the read with EIO.

pub mod npy;
pub mod render;
pub mod spec;

pub use render::{RenderError, Rendered};
pub use spec::{Output, SpecError, ViewSpec};

/// Where renders run.
pub trait Executor: Send + Sync {
    /// Short name for logs and stats ("cpu").
    fn name(&self) -> &'static str;
    /// The complete .npy file of `spec` over `encoded`, random draws from `seed`.
    fn render(&self, spec: &ViewSpec, encoded: &[u8], seed: u64) -> Result<Rendered, RenderError>;
}

/// Renders on the calling thread's CPU.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu;

impl Executor for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn render(&self, spec: &ViewSpec, encoded: &[u8], seed: u64) -> Result<Rendered, RenderError> {
        render::render(spec, encoded, seed)
    }
}
