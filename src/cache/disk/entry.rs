//! The on-disk entry format: one file per cached block, self-describing and checksummed.
//!
//! Owns: encoding and decoding of entries, and every bound checked before trusting their bytes.
//! Layout (little endian), version 2:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `PREPFSC\0` |
//! | 8 | 2 | format version |
//! | 10 | 1 | codec tag (see `codec`) |
//! | 11 | 1 | reserved, 0 |
//! | 12 | 4 | logical length (<= block size) |
//! | 16 | 4 | payload length (<= block size) |
//! | 20 | 4 | path length (<= 4096) |
//! | 24 | 40 | source identity: dev, ino, size, mtime_ns, ctime_ns |
//! | 64 | 8 | block index |
//! | 72 | 8 | xxh3 of the logical bytes |
//! | 80 | 4 | the file's image row length (0: none known; see `cache::rows`) |
//! | 84 | 4 | reserved, 0 |
//! | 88 | 8 | xxh3 of bytes 0..88 and the path |
//! | 96 | path length | source path, relative to the source root |
//! | .. | payload length | payload: the logical bytes, or with a codec, the logical bytes after the row filter at the row length (none at 0), compressed |
//!
//! Version 1 (written before the row length was kept) had no bytes 80..88: its header checksum
//! sits at 80 over bytes 0..80, and its path at 88. Its entries are still read, as unfiltered.
//! Must never allocate from a length it has not bounded, and never return bytes that were not
//! verified against the logical checksum. Changing the layout means bumping `FORMAT_VERSION`.

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::cache::codec::{Codec, CodecError};
use crate::cache::{BLOCK_SIZE, rows};
use crate::source::Identity;

/// Version of the layout above; entries of any other version but 1 are misses.
pub const FORMAT_VERSION: u16 = 2;
/// Bytes before the path.
pub const HEADER_LEN: usize = 96;
/// Bytes before the path in version 1.
const HEADER_LEN_V1: usize = 88;
/// Longest source path an entry records (PATH_MAX).
pub const MAX_PATH: usize = 4096;
/// Largest entry file there can be.
pub const MAX_ENTRY: usize = HEADER_LEN + MAX_PATH + BLOCK_SIZE as usize;
const MAGIC: [u8; 8] = *b"PREPFSC\0";

/// Why an entry cannot be used (it is then a miss, counted and removed).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EntryError {
    /// Shorter than its header or its recorded lengths.
    #[error("truncated entry")]
    Truncated,
    /// Not a prepfs entry.
    #[error("bad magic")]
    BadMagic,
    /// Written by another format version.
    #[error("format version {0}, expected 1 or {FORMAT_VERSION}")]
    Version(u16),
    /// The header's own checksum does not match.
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// A recorded length is beyond any valid entry.
    #[error("absurd {0}")]
    Absurd(&'static str),
    /// It holds another file version or block.
    #[error("entry of another file version or block")]
    WrongIdentity,
    /// Longer than its recorded lengths.
    #[error("trailing bytes after the payload")]
    Trailing,
    /// The payload does not decompress.
    #[error("{0}")]
    Codec(#[from] CodecError),
    /// The decompressed bytes do not match their checksum.
    #[error("data checksum mismatch")]
    Checksum,
}

/// What an entry's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// File version the block belongs to.
    pub identity: Identity,
    /// Block index within the file.
    pub index: u64,
    /// How the payload is compressed.
    pub codec: Codec,
    /// Length of the logical bytes.
    pub len: usize,
    /// Length of the payload.
    pub payload_len: usize,
    /// xxh3 of the logical bytes.
    pub sum: u64,
    /// The file's image row length (0: none known); a compressed payload was filtered at it.
    pub rows: usize,
    /// Source path relative to the root.
    pub path: Vec<u8>,
    /// Where the payload starts.
    start: usize,
}

impl Header {
    /// Bytes of the whole entry: header, path and payload.
    pub fn entry_len(&self) -> usize {
        self.start + self.payload_len
    }
}

/// An entry for block `index` of `identity`, whose bytes are `logical`, stored as `payload`:
/// the logical bytes themselves with `Codec::None`, else compressed with `codec` after the row
/// filter at `rows` (the file's row length, 0 for none).
pub fn encode(
    identity: Identity,
    index: u64,
    path: &[u8],
    (codec, rows): (Codec, usize),
    logical: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let path = &path[..path.len().min(MAX_PATH)];
    let mut out = Vec::with_capacity(HEADER_LEN + path.len() + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.push(codec.tag());
    out.push(0);
    out.extend_from_slice(&(logical.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&(path.len() as u32).to_le_bytes());
    for field in [identity.dev, identity.ino, identity.size] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    out.extend_from_slice(&identity.mtime_ns.to_le_bytes());
    out.extend_from_slice(&identity.ctime_ns.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&xxh3_64(logical).to_le_bytes());
    out.extend_from_slice(&(rows.min(BLOCK_SIZE as usize) as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    let mut sum = Xxh3::new();
    sum.update(&out);
    sum.update(path);
    out.extend_from_slice(&sum.digest().to_le_bytes());
    out.extend_from_slice(path);
    out.extend_from_slice(payload);
    out
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// The header at the start of `bytes` (which may stop after the path), checked for magic,
/// version, bounds and its own checksum.
pub fn decode_header(bytes: &[u8]) -> Result<Header, EntryError> {
    if bytes.len() < HEADER_LEN {
        return Err(EntryError::Truncated);
    }
    if bytes[..8] != MAGIC {
        return Err(EntryError::BadMagic);
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    let (header_len, rows) = match version {
        1 => (HEADER_LEN_V1, 0),
        FORMAT_VERSION => (HEADER_LEN, u32_at(bytes, 80)),
        _ => return Err(EntryError::Version(version)),
    };
    let (len, payload_len, path_len) = (u32_at(bytes, 12), u32_at(bytes, 16), u32_at(bytes, 20));
    if len > BLOCK_SIZE as usize {
        return Err(EntryError::Absurd("logical length"));
    }
    if payload_len > BLOCK_SIZE as usize {
        return Err(EntryError::Absurd("payload length"));
    }
    if path_len > MAX_PATH {
        return Err(EntryError::Absurd("path length"));
    }
    if rows > BLOCK_SIZE as usize {
        return Err(EntryError::Absurd("row length"));
    }
    let path = bytes
        .get(header_len..header_len + path_len)
        .ok_or(EntryError::Truncated)?;
    let mut sum = Xxh3::new();
    sum.update(&bytes[..header_len - 8]);
    sum.update(path);
    if sum.digest() != u64_at(bytes, header_len - 8) {
        return Err(EntryError::HeaderChecksum);
    }
    Ok(Header {
        identity: Identity {
            dev: u64_at(bytes, 24),
            ino: u64_at(bytes, 32),
            size: u64_at(bytes, 40),
            mtime_ns: u64_at(bytes, 48) as i64,
            ctime_ns: u64_at(bytes, 56) as i64,
        },
        index: u64_at(bytes, 64),
        codec: Codec::from_tag(bytes[10])?,
        len,
        payload_len,
        sum: u64_at(bytes, 72),
        rows,
        path: path.to_vec(),
        start: header_len + path_len,
    })
}

/// The verified logical bytes of the entry `bytes`, which must hold block `index` of `identity`.
pub fn decode(bytes: &[u8], identity: &Identity, index: u64) -> Result<Vec<u8>, EntryError> {
    let header = decode_header(bytes)?;
    if header.identity != *identity || header.index != index {
        return Err(EntryError::WrongIdentity);
    }
    let payload = bytes
        .get(header.start..header.entry_len())
        .ok_or(EntryError::Truncated)?;
    if bytes.len() != header.entry_len() {
        return Err(EntryError::Trailing);
    }
    let mut logical = header.codec.decompress(payload, header.len)?;
    if header.codec != Codec::None {
        rows::undelta(&mut logical, header.rows);
    }
    if xxh3_64(&logical) != header.sum {
        return Err(EntryError::Checksum);
    }
    Ok(logical)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            dev: 0x0801,
            ino: 42,
            size: 11,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: -5,
        }
    }

    /// Frozen bytes of one version-2 entry. If this test fails, the on-disk format changed:
    /// bump `FORMAT_VERSION` (old caches then become misses instead of being misread) and
    /// update these bytes.
    const GOLDEN_V2: &str = concat!(
        "5052455046534300020000000b0000000b00000005000000",
        "01080000000000002a000000000000000b00000000000000",
        "15cd853dfe9c9717fbffffffffffffff0300000000000000",
        "8b98e640eab147d40500000000000000b613dde6655a70fa",
        "612f622e7868656c6c6f20776f726c64",
    );

    /// Frozen bytes of one version-1 entry (written by prepfs before the row length was kept):
    /// still read.
    const GOLDEN_V1: &str = concat!(
        "5052455046534300010000000b0000000b00000005000000",
        "01080000000000002a000000000000000b00000000000000",
        "15cd853dfe9c9717fbffffffffffffff0300000000000000",
        "8b98e640eab147d42c30d17758a9d6bd612f622e7868656c",
        "6c6f20776f726c64",
    );

    #[test]
    fn the_format_matches_its_golden_bytes_and_version_1_is_still_read() {
        let logical = b"hello world";
        let entry = encode(identity(), 3, b"a/b.x", (Codec::None, 5), logical, logical);
        let hex: String = entry.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex, GOLDEN_V2,
            "the on-disk entry format changed: bump FORMAT_VERSION in cache/disk/entry.rs and \
             update GOLDEN_V2"
        );
        assert_eq!(decode(&entry, &identity(), 3).as_deref(), Ok(&logical[..]));
        assert_eq!(decode_header(&entry).map(|h| h.rows), Ok(5));
        let v1: Vec<u8> = (0..GOLDEN_V1.len() / 2)
            .map(|i| u8::from_str_radix(&GOLDEN_V1[2 * i..2 * i + 2], 16).expect("hex"))
            .collect();
        assert_eq!(decode(&v1, &identity(), 3).as_deref(), Ok(&logical[..]));
        assert_eq!(decode_header(&v1).map(|h| h.rows), Ok(0));
    }

    /// Image rows are stored filtered, so they compress as in the RAM tier; the filter is undone
    /// on the way out.
    #[test]
    fn rows_are_filtered_before_compressing_and_restored_exactly() {
        // A smooth 200-pixel-wide RGB gradient: rows alike, bytes within a row all different.
        let row = 600;
        let logical: Vec<u8> = (0..row * 400)
            .map(|i| ((i % row) * 7 + (i / row) / 3) as u8)
            .collect();
        let plain = Codec::Zstd(3).compress(&logical).expect("compressible");
        let filtered = Codec::Zstd(3)
            .compress(&rows::delta(&logical, row))
            .expect("compressible");
        assert!(
            filtered.len() < plain.len(),
            "{} vs {}",
            filtered.len(),
            plain.len()
        );
        let entry = encode(
            identity(),
            0,
            b"px.npy",
            (Codec::Zstd(3), row),
            &logical,
            &filtered,
        );
        assert_eq!(decode(&entry, &identity(), 0), Ok(logical.clone()));
        // Raw entries are never filtered, whatever the row length says.
        let raw = encode(
            identity(),
            0,
            b"px.npy",
            (Codec::None, row),
            &logical,
            &logical,
        );
        assert_eq!(decode(&raw, &identity(), 0), Ok(logical));
    }

    #[test]
    fn damaged_entries_are_rejected_with_their_reason() {
        let logical: Vec<u8> = (0..50_000).map(|i| (i / 10) as u8).collect();
        let payload = Codec::Lz4.compress(&logical).expect("compressible");
        let good = encode(
            identity(),
            7,
            b"train/x.npy",
            (Codec::Lz4, 0),
            &logical,
            &payload,
        );
        assert_eq!(decode(&good, &identity(), 7), Ok(logical.clone()));

        let truncated = &good[..good.len() - 1];
        assert_eq!(
            decode(truncated, &identity(), 7),
            Err(EntryError::Truncated)
        );
        assert_eq!(
            decode(&good[..40], &identity(), 7),
            Err(EntryError::Truncated)
        );
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(decode(&longer, &identity(), 7), Err(EntryError::Trailing));

        let mut version = good.clone();
        version[8] = 3;
        assert_eq!(
            decode(&version, &identity(), 7),
            Err(EntryError::Version(3))
        );
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(decode(&magic, &identity(), 7), Err(EntryError::BadMagic));
        let mut header = good.clone();
        header[30] ^= 1;
        assert_eq!(
            decode(&header, &identity(), 7),
            Err(EntryError::HeaderChecksum)
        );
        let mut absurd = good.clone();
        absurd[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode(&absurd, &identity(), 7),
            Err(EntryError::Absurd("payload length"))
        );

        let mut rows = good.clone();
        rows[80..84].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode(&rows, &identity(), 7),
            Err(EntryError::Absurd("row length"))
        );

        let other = Identity {
            mtime_ns: 1,
            ..identity()
        };
        assert_eq!(decode(&good, &other, 7), Err(EntryError::WrongIdentity));
        assert_eq!(
            decode(&good, &identity(), 8),
            Err(EntryError::WrongIdentity)
        );

        let mut payload_bit = good.clone();
        let last = payload_bit.len() - 1;
        payload_bit[last] ^= 0x10;
        assert!(matches!(
            decode(&payload_bit, &identity(), 7),
            Err(EntryError::Checksum | EntryError::Codec(_))
        ));
    }
}
