//! `Block`: up to `BLOCK_SIZE` bytes of one file with a checksum per segment.
//!
//! Owns: the checksum format (xxh3-64 per 64 KiB segment) and verification. Segmenting keeps the
//! cost of "verify on every hit" proportional to the bytes asked for: a 4 KiB read verifies 64 KiB,
//! not the whole block. Must never hand out bytes that failed verification.

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
}
