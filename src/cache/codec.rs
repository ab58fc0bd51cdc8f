//! Codecs applied to cached bytes: compression, decompression and the stored tag of each
//! `control::codec::Codec`, plus the compressibility probe.
//!
//! Owns: the codec's one-byte encoding (shared by the RAM and disk tiers), bounded compression
//! and decompression, and the cheap test that decides whether bytes are worth compressing at
//! all. Decompression always writes into a buffer of the recorded length and fails unless it
//! fills it exactly, so a corrupt payload can neither grow memory nor yield short data. Must never
//! choose a codec (that is the policy's job) and never verify checksums (the caller checks the
//! decompressed bytes against the checksum it stored).

// The type these operations belong to, under the name the cache's modules use for it.
pub use crate::control::codec::Codec;
use crate::control::codec::MAX_ZSTD_LEVEL;

/// A payload that does not decompress to the recorded length, or a tag that names no codec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// The stored tag is unknown (a newer format, or corruption).
    #[error("unknown codec tag {0:#04x}")]
    UnknownTag(u8),
    /// The payload is corrupt or does not match its recorded length.
    #[error("payload does not decompress to its recorded length")]
    Corrupt,
}

impl Codec {
    /// Its one-byte tag in stored entries: 0 none, 1 lz4, 0x10 + level zstd.
    pub fn tag(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Lz4 => 1,
            Codec::Zstd(level) => 0x10 + level,
        }
    }

    /// The codec a stored tag names.
    pub fn from_tag(tag: u8) -> Result<Codec, CodecError> {
        match tag {
            0 => Ok(Codec::None),
            1 => Ok(Codec::Lz4),
            t if (0x11..=0x10 + MAX_ZSTD_LEVEL).contains(&t) => Ok(Codec::Zstd(t - 0x10)),
            t => Err(CodecError::UnknownTag(t)),
        }
    }

    /// `bytes` compressed with this codec, or `None` when that would not make them smaller (the
    /// caller then keeps them raw).
    pub fn compress(self, bytes: &[u8]) -> Option<Vec<u8>> {
        let out = match self {
            Codec::None => return None,
            Codec::Lz4 => lz4_flex::block::compress(bytes),
            Codec::Zstd(level) => zstd::bulk::compress(bytes, i32::from(level)).ok()?,
        };
        (out.len() < bytes.len()).then_some(out)
    }

    /// Decompresses `payload` into exactly `len` bytes.
    pub fn decompress(self, payload: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
        let mut out = vec![0u8; len];
        let written = match self {
            Codec::None => {
                if payload.len() != len {
                    return Err(CodecError::Corrupt);
                }
                out.copy_from_slice(payload);
                len
            }
            Codec::Lz4 => lz4_flex::block::decompress_into(payload, &mut out)
                .map_err(|_| CodecError::Corrupt)?,
            Codec::Zstd(_) => zstd::bulk::decompress_to_buffer(payload, &mut out)
                .map_err(|_| CodecError::Corrupt)?,
        };
        if written != len {
            return Err(CodecError::Corrupt);
        }
        Ok(out)
    }
}

/// Bytes compressed by lz4 in the probe: a few microseconds of CPU.
const PROBE_SAMPLE: usize = 16 << 10;
/// A sample must shrink by this factor under lz4 to call its bytes compressible. JPEG and PNG
/// measure ~1.01; uint8 pixels ~1.4 and up.
const COMPRESSIBLE_RATIO: f64 = 1.1;
/// Or its bytes' order-0 entropy must be below this many bits per byte: data that lz4 cannot
/// shrink (noisy pixels, token ids) still gains 10-30% from zstd's entropy coding, which this
/// estimates. Compressed formats measure 7.9-8.0.
const COMPRESSIBLE_ENTROPY: f64 = 7.5;

/// Leading bytes of formats that are already compressed; checked before any trial compression.
const COMPRESSED_MAGICS: &[&[u8]] = &[
    b"\xff\xd8\xff",             // JPEG
    b"\x89PNG\r\n\x1a\n",        // PNG
    b"\x28\xb5\x2f\xfd",         // zstd frame
    b"\x1f\x8b",                 // gzip
    b"\xfd7zXZ\x00",             // xz
    b"BZh",                      // bzip2
    b"\x04\x22\x4d\x18",         // lz4 frame
    b"GIF8",                     // GIF
    b"\x00\x00\x00\x0cjP  \r\n", // JPEG 2000
    b"\xff\x4f\xff\x51",         // JPEG 2000 codestream
];

/// Whether `bytes` (the first cached block of a file, or any block of it) look worth
/// compressing: not a known compressed format, and a sample from their middle shrinks under lz4.
pub fn is_compressible(bytes: &[u8]) -> bool {
    if bytes.len() < 64 || COMPRESSED_MAGICS.iter().any(|m| bytes.starts_with(m)) {
        return false;
    }
    if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        return false;
    }
    let start = bytes.len().saturating_sub(PROBE_SAMPLE) / 2;
    let sample = &bytes[start..(start + PROBE_SAMPLE).min(bytes.len())];
    let packed = lz4_flex::block::compress(sample);
    sample.len() as f64 >= packed.len() as f64 * COMPRESSIBLE_RATIO
        || entropy_bits(sample) < COMPRESSIBLE_ENTROPY
}

/// Order-0 entropy of `bytes`, in bits per byte (0..=8).
fn entropy_bits(bytes: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let n = bytes.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::BLOCK_SIZE;

    fn codecs() -> [Codec; 5] {
        [
            Codec::None,
            Codec::Lz4,
            Codec::Zstd(1),
            Codec::Zstd(3),
            Codec::Zstd(MAX_ZSTD_LEVEL),
        ]
    }

    fn compressible(len: usize) -> Vec<u8> {
        (0..len).map(|i| ((i / 7) % 13) as u8).collect()
    }

    fn incompressible(len: usize) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(7);
        (0..len).map(|_| rng.u8(..)).collect()
    }

    #[test]
    fn every_codec_round_trips_at_block_edges() {
        let block = BLOCK_SIZE as usize;
        for len in [0, 1, block - 1, block, block + 1] {
            for bytes in [compressible(len), incompressible(len)] {
                for codec in codecs() {
                    let stored = codec.compress(&bytes);
                    let (tag, payload) = match &stored {
                        Some(p) => (codec, p.as_slice()),
                        None => (Codec::None, bytes.as_slice()),
                    };
                    let back = tag.decompress(payload, bytes.len());
                    assert_eq!(back.as_deref(), Ok(bytes.as_slice()), "{codec} at {len}");
                }
            }
        }
    }

    #[test]
    fn compressible_bytes_shrink_and_random_bytes_stay_raw() {
        let bytes = compressible(BLOCK_SIZE as usize);
        for codec in [Codec::Lz4, Codec::Zstd(1), Codec::Zstd(3)] {
            let packed = codec.compress(&bytes).expect("compressible");
            assert!(packed.len() * 4 < bytes.len(), "{codec}: {}", packed.len());
        }
        let random = incompressible(BLOCK_SIZE as usize);
        assert_eq!(Codec::Lz4.compress(&random), None);
        assert_eq!(Codec::Zstd(3).compress(&random), None);
    }

    #[test]
    fn corrupt_or_mislabelled_payloads_fail_cleanly() {
        let bytes = compressible(100_000);
        let packed = Codec::Zstd(3).compress(&bytes).expect("compressible");
        assert_eq!(
            Codec::Zstd(3).decompress(&packed, bytes.len() + 1),
            Err(CodecError::Corrupt),
            "longer recorded length"
        );
        assert_eq!(
            Codec::Zstd(3).decompress(&packed, bytes.len() - 1),
            Err(CodecError::Corrupt),
            "shorter recorded length"
        );
        assert_eq!(
            Codec::Lz4.decompress(&packed, bytes.len()),
            Err(CodecError::Corrupt),
            "zstd bytes read as lz4"
        );
        let mut flipped = Codec::Lz4.compress(&bytes).expect("compressible");
        flipped.truncate(flipped.len() / 2);
        assert_eq!(
            Codec::Lz4.decompress(&flipped, bytes.len()),
            Err(CodecError::Corrupt),
            "truncated"
        );
        assert_eq!(
            Codec::None.decompress(&bytes[1..], bytes.len()),
            Err(CodecError::Corrupt)
        );
    }

    #[test]
    fn tags_round_trip() {
        for codec in codecs() {
            assert_eq!(Codec::from_tag(codec.tag()), Ok(codec));
        }
        for bad in [2u8, 0x10, 0x11 + MAX_ZSTD_LEVEL, 0xff] {
            assert_eq!(Codec::from_tag(bad), Err(CodecError::UnknownTag(bad)));
        }
    }

    #[test]
    fn probe_skips_compressed_formats_and_random_bytes() {
        let mut jpeg = compressible(200_000);
        jpeg[..3].copy_from_slice(b"\xff\xd8\xff");
        assert!(!is_compressible(&jpeg), "JPEG magic");
        let mut gzip = compressible(200_000);
        gzip[..2].copy_from_slice(b"\x1f\x8b");
        assert!(!is_compressible(&gzip), "gzip magic");
        assert!(!is_compressible(&incompressible(200_000)));
        assert!(is_compressible(&compressible(200_000)));
        assert!(!is_compressible(b"tiny"), "too small to be worth it");
        // Token ids that lz4 cannot shrink but whose byte entropy zstd exploits.
        let mut rng = fastrand::Rng::with_seed(3);
        let tokens: Vec<u8> = (0..100_000)
            .flat_map(|_| ((50_000f64.powf(rng.f64())) as u16).to_le_bytes())
            .collect();
        assert!(is_compressible(&tokens));
        let packed = Codec::Zstd(3).compress(&tokens).expect("zstd shrinks them");
        assert!(packed.len() * 10 < tokens.len() * 9, "{}", packed.len());
    }
}
