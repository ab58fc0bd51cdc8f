//! The pixel limits of a render and its one error type: what every image a render holds must
//! respect (the decoded image or part, and every op's output), and why a file could not be
//! rendered.
//!
//! Owns the limits and the check, so the spec (announced sizes), the plan (each step's output)
//! and the render (each decode) apply the same numbers. Must never touch pixels.

/// Largest width or height of any image a render holds: larger ones are refused before their
/// pixels are allocated.
pub const MAX_SIDE: u32 = 16_384;
/// Largest buffer of pixels a render holds, decoded or produced by an op: 128 MiB (about 44
/// Mpixel of RGB), refused beyond (decompression bombs, resizes of extreme aspect ratios).
pub const MAX_DECODE_BYTES: u64 = 128 << 20;
/// Largest encoded image a render reads: twice `MAX_DECODE_BYTES`. Compressed pixel data that
/// decodes within the limits is at most about as large as those pixels (a PNG's stored deflate
/// blocks add 5 bytes per 64 KiB and a filter byte per row; a JPEG's entropy coding of noise at
/// the highest quality can pass its pixels somewhat), and metadata (EXIF, ICC, thumbnails) comes
/// on top: the factor of 2 holds both, and a larger file is refused unread.
pub const MAX_ENCODED_BYTES: u64 = 2 * MAX_DECODE_BYTES;

/// Why a file could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// Not a format the decoder knows.
    #[error("not an image: {0}")]
    NotAnImage(String),
    /// Truncated or corrupt data.
    #[error("cannot decode: {0}")]
    Corrupt(String),
    /// Over the pixel limit.
    #[error("image too large: {0}")]
    TooLarge(String),
    /// A resize the resizer refused (should not happen with validated specs).
    #[error("resize failed: {0}")]
    Resize(String),
}

/// Whether an RGB image of `width` x `height` is within the pixel limits: every side at most
/// `MAX_SIDE`, its pixels at most `MAX_DECODE_BYTES`.
pub fn within_limits(width: u32, height: u32) -> bool {
    width <= MAX_SIDE
        && height <= MAX_SIDE
        && u64::from(width) * u64::from(height) * 3 <= MAX_DECODE_BYTES
}

/// The refusal of an image of `width` x `height` pixels that `within_limits` refuses, as `what`.
pub fn too_large(what: &str, width: u32, height: u32) -> RenderError {
    RenderError::TooLarge(format!(
        "{what} {width}x{height} pixels (limits: {MAX_SIDE} per side, {} MiB of RGB)",
        MAX_DECODE_BYTES >> 20
    ))
}
