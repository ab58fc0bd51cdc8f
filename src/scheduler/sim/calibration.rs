//! What the simulator's work costs: per-item CPU times, codec speeds and ratios, and the source,
//! as measured on a machine (`prepfs policy calibrate`) or taken from DESIGN.md's facts.
//!
//! Owns: the calibration figures and how they are jittered for random scenarios. Must never
//! measure anything itself (`scheduler::calibrate` does) nor model time (the engine does).

use crate::scheduler::rng::Rng;

/// CPU time of the read path itself per request (FUSE round trip, lookup, copy), seconds.
pub(super) const REQUEST_CPU_S: f64 = 50e-6;

/// Speeds and ratio of one codec (one core).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CodecCost {
    /// Compression speed, bytes of input per second.
    pub compress_bytes_per_s: f64,
    /// Decompression speed, bytes of output per second.
    pub decompress_bytes_per_s: f64,
    /// Compression ratio on decoded uint8 pixels.
    pub pixel_ratio: f64,
    /// Compression ratio on encoded image files (JPEG: about 1).
    pub encoded_ratio: f64,
}

/// Per-item costs measured on a machine (`prepfs policy calibrate`); the simulator randomises
/// around them. `Default` is the DESIGN.md facts for 500x375 JPEGs on one core.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// CPU seconds to decode one image on one core (~1,600 img/s).
    pub decode_s: f64,
    /// CPU seconds to augment one decoded image (crop, resize, flip, normalise) on one core.
    pub augment_s: f64,
    /// Encoded size of an image, bytes.
    pub image_bytes: f64,
    /// Decoded size of an image (uint8 pixels), bytes.
    pub pixel_bytes: f64,
    /// lz4.
    pub lz4: CodecCost,
    /// zstd level 1.
    pub zstd1: CodecCost,
    /// zstd level 3.
    pub zstd3: CodecCost,
    /// Bandwidth of the dataset's source, bytes per second.
    pub source_bytes_per_s: f64,
    /// Latency of one source fetch before bytes flow, seconds.
    pub source_latency_s: f64,
}

impl Default for Calibration {
    fn default() -> Calibration {
        Calibration {
            decode_s: 0.6e-3,
            augment_s: 0.3e-3,
            image_bytes: 110e3,
            pixel_bytes: 500.0 * 375.0 * 3.0,
            lz4: CodecCost {
                compress_bytes_per_s: 1e9,
                decompress_bytes_per_s: 4e9,
                pixel_ratio: 1.5,
                encoded_ratio: 1.01,
            },
            zstd1: CodecCost {
                compress_bytes_per_s: 0.6e9,
                decompress_bytes_per_s: 1.5e9,
                pixel_ratio: 1.8,
                encoded_ratio: 1.01,
            },
            zstd3: CodecCost {
                compress_bytes_per_s: 0.35e9,
                decompress_bytes_per_s: 1.4e9,
                pixel_ratio: 1.9,
                encoded_ratio: 1.01,
            },
            source_bytes_per_s: 200e6,
            source_latency_s: 2e-3,
        }
    }
}

impl Calibration {
    /// The cost of codec option `i` (`control::action::CODECS` order); `None` for no codec.
    pub(super) fn codec(&self, i: u8) -> Option<&CodecCost> {
        match i {
            1 => Some(&self.lz4),
            2 => Some(&self.zstd1),
            3 => Some(&self.zstd3),
            _ => None,
        }
    }

    /// Every cost multiplied by a factor drawn from `lo..hi` (log-uniform, one per cost).
    pub(super) fn jittered(&self, rng: &mut Rng, lo: f64, hi: f64) -> Calibration {
        let mut c = self.clone();
        c.decode_s *= rng.log_range(lo, hi);
        c.augment_s *= rng.log_range(lo, hi);
        for codec in [&mut c.lz4, &mut c.zstd1, &mut c.zstd3] {
            codec.compress_bytes_per_s *= rng.log_range(lo, hi);
            codec.decompress_bytes_per_s *= rng.log_range(lo, hi);
        }
        c
    }
}
