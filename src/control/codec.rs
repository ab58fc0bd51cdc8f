//! Which codec cached bytes are stored with: none, lz4, or zstd at a level.
//!
//! Owns: the codec as a choice (the enum, the valid zstd levels, its names as `--codec` and the
//! stats spell them), so the user, the cache's policy and the scheduler's codec knob name codecs
//! the same way. Must never compress or decompress, nor encode a codec into stored bytes:
//! `cache::codec` adds those to this type.

use std::fmt;

/// The highest zstd level prepfs accepts: beyond 19 zstd needs far more memory per context.
pub const MAX_ZSTD_LEVEL: u8 = 19;

/// How one block of cached bytes is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// The bytes as they are.
    None,
    /// lz4 block format (lz4_flex): cheapest to decompress (~4 GB/s).
    Lz4,
    /// zstd at a level in 1..=MAX_ZSTD_LEVEL.
    Zstd(u8),
}

impl Codec {
    /// Parses `none`, `lz4`, `zstd` (level 3) or `zstd-N`.
    pub fn parse(text: &str) -> Option<Codec> {
        match text {
            "none" => Some(Codec::None),
            "lz4" => Some(Codec::Lz4),
            "zstd" => Some(Codec::Zstd(3)),
            _ => text
                .strip_prefix("zstd-")
                .and_then(|l| l.parse::<u8>().ok())
                .filter(|l| (1..=MAX_ZSTD_LEVEL).contains(l))
                .map(Codec::Zstd),
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Lz4 => f.write_str("lz4"),
            Codec::Zstd(level) => write!(f, "zstd-{level}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for codec in [
            Codec::None,
            Codec::Lz4,
            Codec::Zstd(1),
            Codec::Zstd(3),
            Codec::Zstd(MAX_ZSTD_LEVEL),
        ] {
            assert_eq!(Codec::parse(&codec.to_string()), Some(codec));
        }
        assert_eq!(Codec::parse("zstd"), Some(Codec::Zstd(3)));
        for bad in ["zstd-0", "zstd-20", "gzip", ""] {
            assert_eq!(Codec::parse(bad), None, "{bad}");
        }
    }
}
