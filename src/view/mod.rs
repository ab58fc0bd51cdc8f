//! Tensor views: images of the dataset served as preprocessed .npy files.
//!
//! Owns what a view is (`spec`), how one file is rendered (`render`, CPU), the .npy container
//! (`npy`), and the placement seam: an `Executor` runs renders on one device, so the GPU backend
//! and the scheduler add executors instead of changing view code. Must never serve a partial
//! file: a render either completes or fails the read with EIO.

pub mod fused;
pub mod gpu;
pub mod jpeg;
pub mod limits;
pub mod metrics;
pub mod npy;
pub mod plan;
pub mod render;
pub mod segments;
pub mod spec;

pub use limits::RenderError;
pub use plan::Plan;
pub use render::{Rendered, Rgb};
pub use spec::{Output, SpecError, ViewSpec};

/// The views' configuration (`--view`, `--seed`, `--render-threads`, and the GPU backend's).
#[derive(Debug, Clone, PartialEq)]
pub struct ViewsConfig {
    /// The views under `.prepfs/views/` (at most `inode::MAX_VIEWS`, names unique).
    pub specs: Vec<ViewSpec>,
    /// Seed of every view's random augmentation.
    pub seed: u64,
    /// Threads of the render pool (started only when there are views).
    pub render_threads: usize,
    /// Whether renders keep restart-marked copies of JPEGs (off: `--no-view-copies`).
    pub copies: bool,
    /// Whether jobs reading a view at once share its renders (off: `--share-renders off`).
    pub share: bool,
    /// The GPU backend (`--gpu`, `--gpu-mem`, `--nvjpeg`, `--nvrtc`).
    pub gpu: gpu::GpuOptions,
}

impl Default for ViewsConfig {
    fn default() -> ViewsConfig {
        ViewsConfig {
            specs: Vec::new(),
            seed: 0,
            // Renders are pure CPU: more threads than cores only add switching, fewer leave
            // cores idle while loaders wait.
            render_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            copies: true,
            share: true,
            gpu: gpu::GpuOptions::default(),
        }
    }
}

impl ViewsConfig {
    /// Render threads that run (none without views).
    pub fn renderers(&self) -> usize {
        if self.specs.is_empty() {
            0
        } else {
            self.render_threads
        }
    }
}

/// Where renders run, in two steps so each can be placed (and the decoded pixels cached) apart.
pub trait Executor: Send + Sync {
    /// Short name for logs and stats ("cpu").
    fn name(&self) -> &'static str;
    /// Decodes `encoded` into RGB pixels.
    fn decode(&self, encoded: &[u8]) -> Result<Rgb, RenderError>;
    /// `decode`, when its pixels are what every part a render decodes would have, so a cache
    /// of pixels may keep them and renders start from them (`render::decode_as_parts_do`);
    /// `None` otherwise. By default, `decode`'s.
    fn decode_as_parts_do(&self, encoded: &[u8]) -> Result<Option<Rgb>, RenderError> {
        self.decode(encoded).map(Some)
    }
    /// The complete .npy file of `spec` over the decoded `image`, as `plan` (drawn over the
    /// image's size) says.
    fn transform(&self, spec: &ViewSpec, image: &Rgb, plan: &Plan)
    -> Result<Rendered, RenderError>;
    /// The complete .npy file of `spec` over the encoded image, as `plan` (drawn over its
    /// header's size) says, when its decoded pixels are not wanted beyond this render: an
    /// executor may decode only what the render reads. By default, `decode` then `transform`.
    fn render(
        &self,
        spec: &ViewSpec,
        encoded: &[u8],
        plan: &Plan,
    ) -> Result<Rendered, RenderError> {
        decoded_then_transformed(self, spec, encoded, plan)
    }
}

/// A render by `executor` of the whole decoded image: `decode`, then `transform`, timed apart.
fn decoded_then_transformed<E: Executor + ?Sized>(
    executor: &E,
    spec: &ViewSpec,
    encoded: &[u8],
    plan: &Plan,
) -> Result<Rendered, RenderError> {
    let started = std::time::Instant::now();
    let image = executor.decode(encoded)?;
    let decode = started.elapsed();
    let mut rendered = executor.transform(spec, &image, plan)?;
    rendered.decode = decode;
    Ok(rendered)
}

/// Renders on the calling thread's CPU.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu;

impl Executor for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn decode(&self, encoded: &[u8]) -> Result<Rgb, RenderError> {
        render::decode(encoded)
    }

    fn decode_as_parts_do(&self, encoded: &[u8]) -> Result<Option<Rgb>, RenderError> {
        render::decode_as_parts_do(encoded)
    }

    fn transform(
        &self,
        spec: &ViewSpec,
        image: &Rgb,
        plan: &Plan,
    ) -> Result<Rendered, RenderError> {
        render::transform_planned(spec, image, plan)
    }

    fn render(
        &self,
        spec: &ViewSpec,
        encoded: &[u8],
        plan: &Plan,
    ) -> Result<Rendered, RenderError> {
        render::render_planned(spec, encoded, plan)
    }
}
