//! What the simulator's work costs: per-item CPU times, codec speeds and ratios, and the source,
//! as measured on a machine (`prepfs policy calibrate`) or taken from DESIGN.md's facts.
//!
//! Owns: the calibration figures and how they are jittered for random scenarios. Must never
//! measure anything itself (`scheduler::calibrate` does) nor model time (the engine does).

use crate::scheduler::rng::Rng;

/// CPU time of the read path itself per request (FUSE round trip, lookup, copy), seconds.
pub(crate) const REQUEST_CPU_S: f64 = 50e-6;

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
    /// CPU seconds of a render that keeps no pixels, on one core: the view's crop-aware decode
    /// (only the part the crop reads, at a smaller scale when it shrinks) and its ops. `None`
    /// (calibrations before it was measured, and the built-in figures): a whole decode and an
    /// augmentation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub render_s: Option<f64>,
    /// CPU seconds of the read path per image, outside the render workers: the open and release,
    /// and the rendered tensor's bytes copied through the kernel into the reader. `None`
    /// (calibrations before it was measured, and the built-in figures): the `REQUEST_CPU_S` round
    /// trip alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_s: Option<f64>,
    /// Bytes per second a RAM-tier hit takes out on one core: its checksums verified and its bytes
    /// copied into the render's buffer, before any decompression. `None`: free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_bytes_per_s: Option<f64>,
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
    /// CPU seconds the machine spends per byte read from the source (its filesystem's and block
    /// device's kernel work, the copy). `None`: free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_cpu_s_per_byte: Option<f64>,
}

impl Default for Calibration {
    fn default() -> Calibration {
        Calibration {
            decode_s: 0.6e-3,
            augment_s: 0.3e-3,
            render_s: None,
            deliver_s: None,
            cache_read_bytes_per_s: None,
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
            source_cpu_s_per_byte: None,
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

    /// CPU seconds of a render that keeps no pixels (`render_s`, or a whole decode and an
    /// augmentation).
    pub(super) fn render(&self) -> f64 {
        self.render_s.unwrap_or(self.decode_s + self.augment_s)
    }

    /// CPU seconds of the read path per image (`deliver_s`, or the `REQUEST_CPU_S` round trip).
    pub(super) fn deliver(&self) -> f64 {
        self.deliver_s.unwrap_or(REQUEST_CPU_S)
    }

    /// CPU seconds a hit of `bytes` stored bytes costs before its decompression.
    pub(super) fn cache_read(&self, bytes: f64) -> f64 {
        self.cache_read_bytes_per_s
            .map_or(0.0, |speed| bytes / speed)
    }

    /// Every cost multiplied by a factor drawn from `lo..hi` (log-uniform, one per cost present).
    pub(super) fn jittered(&self, rng: &mut Rng, lo: f64, hi: f64) -> Calibration {
        let mut c = self.clone();
        c.decode_s *= rng.log_range(lo, hi);
        c.augment_s *= rng.log_range(lo, hi);
        let measured = [
            &mut c.render_s,
            &mut c.deliver_s,
            &mut c.cache_read_bytes_per_s,
            &mut c.source_cpu_s_per_byte,
        ];
        for cost in measured.into_iter().flatten() {
            *cost *= rng.log_range(lo, hi);
        }
        for codec in [&mut c.lz4, &mut c.zstd1, &mut c.zstd3] {
            codec.compress_bytes_per_s *= rng.log_range(lo, hi);
            codec.decompress_bytes_per_s *= rng.log_range(lo, hi);
        }
        c
    }
}
