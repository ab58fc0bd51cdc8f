//! `Block` and `Packed`: up to `BLOCK_SIZE` bytes of one file, raw or compressed, with checksums.
//!
//! Owns: the checksum format (xxh3-64 per 64 KiB segment of a raw block, one xxh3-64 over the
//! whole logical bytes of a packed one) and verification. Segmenting keeps the cost of "verify on
//! every hit" of a raw block proportional to the bytes asked for: a 4 KiB read verifies 64 KiB,
//! not the whole block. A packed block is decompressed whole anyway, so one sum covers it. Must
//! never hand out bytes that failed verification.

use super::codec::Codec;
use super::rows;
use xxhash_rust::xxh3::xxh3_64;

/// Checksum granularity inside a block.
pub const SEGMENT_SIZE: usize = 64 << 10;

/// Bytes fetched from the source, with their checksums.
#[derive(Debug)]
pub struct Block {
    /// The bytes.
    pub data: Box<[u8]>,
    /// xxh3 of each `SEGMENT_SIZE` slice of `data` (the last may be shorter).
    pub sums: Box<[u64]>,
}

impl Block {
    /// Wraps freshly fetched bytes, computing their checksums.
    pub fn new(data: Vec<u8>) -> Block {
        let sums = checksums(&data);
        Block {
            data: data.into_boxed_slice(),
            sums,
        }
    }
}

/// A block stored compressed: decompressed and verified whole on every hit.
#[derive(Debug)]
pub struct Packed {
    /// How `payload` was compressed.
    pub codec: Codec,
    /// Lag of the row filter applied before compressing (0: none; see `rows`).
    pub lag: usize,
    /// The compressed bytes.
    pub payload: Box<[u8]>,
    /// Length of the logical (decompressed) bytes.
    pub len: usize,
    /// xxh3 of the logical bytes.
    pub sum: u64,
}

impl Packed {
    /// `data` compressed with `codec` after the row filter at `lag` (0: none), or `None` when
    /// that does not make it smaller.
    pub fn pack(codec: Codec, lag: usize, data: &[u8]) -> Option<Packed> {
        let payload = compress_rows(codec, lag, data)?;
        Some(Packed {
            codec,
            lag,
            payload: payload.into_boxed_slice(),
            len: data.len(),
            sum: xxh3_64(data),
        })
    }

    /// The logical bytes, or `None` if the payload is corrupt or does not match its checksum.
    pub fn unpack(&self) -> Option<Vec<u8>> {
        let mut bytes = self.codec.decompress(&self.payload, self.len).ok()?;
        rows::undelta(&mut bytes, self.lag);
        (xxh3_64(&bytes) == self.sum).then_some(bytes)
    }
}

/// `data` compressed with `codec` after the row filter at `lag` (0: none; see `rows`), or
/// `None` when that does not make it smaller (always with `Codec::None`).
pub fn compress_rows(codec: Codec, lag: usize, data: &[u8]) -> Option<Vec<u8>> {
    if lag > 0 && codec != Codec::None {
        codec.compress(&rows::delta(data, lag))
    } else {
        codec.compress(data)
    }
}

/// The segment checksums of `data`.
pub fn checksums(data: &[u8]) -> Box<[u64]> {
    data.chunks(SEGMENT_SIZE).map(xxh3_64).collect()
}

/// Whether the segments of `data` (a whole block) that overlap `range` match `sums`.
pub fn verify(data: &[u8], sums: &[u64], range: std::ops::Range<usize>) -> bool {
    if range.is_empty() {
        return true;
    }
    let first = range.start / SEGMENT_SIZE;
    let last = (range.end - 1) / SEGMENT_SIZE;
    (first..=last).all(|seg| {
        let start = seg * SEGMENT_SIZE;
        let end = (start + SEGMENT_SIZE).min(data.len());
        sums.get(seg)
            .is_some_and(|&sum| end <= data.len() && xxh3_64(&data[start..end]) == sum)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verification_checks_only_touched_segments() {
        let mut data: Vec<u8> = (0..3 * SEGMENT_SIZE + 10).map(|i| (i * 7) as u8).collect();
        let sums = checksums(&data);
        assert_eq!(sums.len(), 4);
        assert!(verify(&data, &sums, 0..data.len()));
        data[SEGMENT_SIZE + 5] ^= 1;
        assert!(!verify(&data, &sums, 0..data.len()));
        assert!(
            verify(&data, &sums, 0..SEGMENT_SIZE),
            "untouched segment still verifies"
        );
        assert!(!verify(&data, &sums, SEGMENT_SIZE..SEGMENT_SIZE + 1));
        assert!(verify(
            &data,
            &sums,
            3 * SEGMENT_SIZE..3 * SEGMENT_SIZE + 10
        ));
        assert!(verify(&data, &sums, 7..7), "empty range");
    }

    #[test]
    fn a_packed_block_unpacks_only_when_intact() {
        let data: Vec<u8> = (0..200_000).map(|i| (i / 100) as u8).collect();
        let packed = Packed::pack(Codec::Lz4, 0, &data).expect("compressible");
        assert_eq!(packed.unpack().as_deref(), Some(data.as_slice()));
        let filtered = Packed::pack(Codec::Zstd(1), 1000, &data).expect("compressible");
        assert_eq!(filtered.unpack().as_deref(), Some(data.as_slice()));
        let mut payload = packed.payload.to_vec();
        let last = payload.len() - 1;
        payload[last] ^= 0x40;
        let corrupt = Packed {
            payload: payload.into_boxed_slice(),
            ..packed
        };
        assert_eq!(corrupt.unpack(), None);
        let wrong_sum = Packed {
            sum: 1,
            ..Packed::pack(Codec::Zstd(1), 0, &data).expect("compressible")
        };
        assert_eq!(wrong_sum.unpack(), None);
    }
}
