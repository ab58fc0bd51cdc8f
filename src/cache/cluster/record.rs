//! What the cluster tier stores: a block's key, portable between nodes, and its value format.
//!
//! Owns: the key (a hash of the dataset id, the file's path relative to the source root, its size
//! and mtime, and the block index: never dev/ino, which differ between nodes, and never the path
//! in clear), the value (a header with the codec, the logical length, a checksum of the logical
//! bytes and one of the key, then the payload), and how a value too large for one of Redis's
//! allocation classes is split in two keys under one hash tag (`split`). Decoding checks every
//! field against what the reader expects before it allocates, and decompresses into a buffer of
//! the expected length only. Must never accept a value whose checks fail, and never size an
//! allocation by a length the value claims.

use std::path::Path;

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::cache::BlockKey;
use crate::cache::block::Packed;
use crate::cache::codec::Codec;

/// The value's first bytes: format 1 of prepfs's cluster records.
const MAGIC: &[u8; 4] = b"PFC1";
/// magic, codec tag, 3 reserved bytes, logical length (u32), sum of the bytes, sum of the key.
/// A value is at most a header and the raw block (a compressed payload is stored only when
/// smaller), so a lookup reads no more than that.
pub const HEADER: usize = 4 + 1 + 3 + 4 + 8 + 8;

/// Bytes Redis adds around a string value inside its allocation (sds header, terminator),
/// rounded up; and what a second key costs (its entry, object and name), rounded up.
const VALUE_OVERHEAD: usize = 64;
const KEY_COST: usize = 256;

/// The allocation Redis's allocator (jemalloc, Debian's build) gives `n` bytes: from 16 KiB up,
/// size classes four per doubling (`MEMORY USAGE` on Redis 7.0: a 1,048,604 B value takes
/// 1,310,776 B, a 1,048,560 B one 1,048,632 B); below, `n` (close enough for what it decides).
fn allocation(n: usize) -> usize {
    if n <= 16 << 10 {
        return n;
    }
    let base = 1 << (usize::BITS - 1 - (n - 1).leading_zeros());
    let step = base / 4;
    base + (n - base).div_ceil(step) * step
}

/// The largest size class that is not above `n` (for `n` from 16 KiB up).
fn class_below(n: usize) -> usize {
    let base = 1 << (usize::BITS - 1 - n.leading_zeros());
    let step = base / 4;
    base + (n - base) / step * step
}

/// `value` as stored: the part under its key and the part under `tail_key` (empty when it is
/// stored whole). A value just above a size class (a full block's: 1 MiB and a header) would
/// waste up to a quarter of its allocation; it is stored as the largest class below it under its
/// key and the few bytes left under the tail key (both in one hash slot, written together by
/// MSETNX and read together), whenever that takes less memory than storing it whole.
pub fn split(value: &[u8]) -> (&[u8], &[u8]) {
    let len = value.len();
    if len <= 16 << 10 {
        return (value, &[]);
    }
    let head = class_below(len) - VALUE_OVERHEAD;
    let split =
        allocation(head + VALUE_OVERHEAD) + allocation(len - head + VALUE_OVERHEAD) + KEY_COST;
    if split < allocation(len + VALUE_OVERHEAD) {
        value.split_at(head)
    } else {
        (value, &[])
    }
}

/// The cluster key of block `key` of the file at `path` (relative to the source root) in the
/// dataset whose id hashes to `dataset`: `prepfs:{<hash>}`, the braces a hash tag, so that its
/// tail key lands in the same slot.
pub fn key_for(dataset: u64, path: &Path, key: &BlockKey) -> String {
    let mut h = Xxh3::new();
    h.update(&dataset.to_le_bytes());
    h.update(path.as_os_str().as_encoded_bytes());
    h.update(&[0]);
    h.update(&key.identity.size.to_le_bytes());
    h.update(&key.identity.mtime_ns.to_le_bytes());
    h.update(&(key.index as u64).to_le_bytes());
    format!("prepfs:{{{:032x}}}", h.digest128())
}

/// The key holding the rest of a value stored at `key` in two parts (see `split`).
pub fn tail_key(key: &str) -> String {
    format!("{key}:t")
}

/// The id of a dataset, hashed once.
pub fn dataset_id(name: &str) -> u64 {
    xxh3_64(name.as_bytes())
}

/// The value storing `data` under `key`, compressed with `codec` when that makes it smaller.
pub fn encode(key: &str, data: &[u8], codec: Codec) -> Vec<u8> {
    let packed = Packed::pack(codec, 0, data);
    let (tag, payload) = match &packed {
        Some(p) => (p.codec.tag(), &p.payload[..]),
        None => (Codec::None.tag(), data),
    };
    let mut value = Vec::with_capacity(HEADER + payload.len());
    value.extend_from_slice(MAGIC);
    value.push(tag);
    value.extend_from_slice(&[0; 3]);
    value.extend_from_slice(&(data.len() as u32).to_le_bytes());
    value.extend_from_slice(&xxh3_64(data).to_le_bytes());
    value.extend_from_slice(&xxh3_64(key.as_bytes()).to_le_bytes());
    value.extend_from_slice(payload);
    value
}

/// Why a value was not accepted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    /// Shorter than a header, or not a prepfs record.
    #[error("not a prepfs record")]
    Foreign,
    /// Stored under another key, or for a block of another length.
    #[error("record of another block")]
    Misplaced,
    /// The payload does not decode to bytes with the recorded checksum.
    #[error("payload damaged")]
    Corrupt,
}

/// The logical bytes of `value`, read under `key` for a block of `len` bytes, if every check
/// holds.
pub fn decode(key: &str, value: &[u8], len: usize) -> Result<Vec<u8>, Damage> {
    if value.len() < HEADER || &value[..4] != MAGIC {
        return Err(Damage::Foreign);
    }
    let word = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().unwrap_or_default());
    let stored_len = u32::from_le_bytes(value[8..12].try_into().unwrap_or_default()) as usize;
    if stored_len != len || word(20) != xxh3_64(key.as_bytes()) {
        return Err(Damage::Misplaced);
    }
    let codec = Codec::from_tag(value[4]).map_err(|_| Damage::Corrupt)?;
    let bytes = codec
        .decompress(&value[HEADER..], len)
        .map_err(|_| Damage::Corrupt)?;
    if xxh3_64(&bytes) != word(12) {
        return Err(Damage::Corrupt);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Identity;

    fn block(index: usize, mtime_ns: i64) -> BlockKey {
        BlockKey {
            identity: Identity {
                dev: 1,
                ino: 2,
                size: 5 << 20,
                mtime_ns,
                ctime_ns: 7,
            },
            index,
        }
    }

    #[test]
    fn keys_name_the_file_version_and_block_but_not_the_node() {
        let ds = dataset_id("imagenet");
        let a = key_for(ds, Path::new("train/a.jpg"), &block(0, 10));
        let mut other_node = block(0, 10);
        other_node.identity.dev = 99;
        other_node.identity.ino = 98;
        other_node.identity.ctime_ns = 97;
        assert_eq!(a, key_for(ds, Path::new("train/a.jpg"), &other_node));
        assert_ne!(a, key_for(ds, Path::new("train/a.jpg"), &block(1, 10)));
        assert_ne!(a, key_for(ds, Path::new("train/a.jpg"), &block(0, 11)));
        assert_ne!(a, key_for(ds, Path::new("train/b.jpg"), &block(0, 10)));
        assert_ne!(
            a,
            key_for(dataset_id("other"), Path::new("train/a.jpg"), &block(0, 10))
        );
        assert!(!a.contains("train"), "the path is never stored in clear");
        assert!(
            a.starts_with("prepfs:{") && a.ends_with('}'),
            "{a}: one hash tag"
        );
        assert_eq!(tail_key(&a), format!("{a}:t"));
    }

    #[test]
    fn values_just_above_an_allocation_class_are_split_and_others_kept_whole() {
        // Sizes measured with MEMORY USAGE on Redis 7.0 (see `allocation`).
        assert_eq!(allocation(1_048_604), 1_310_720);
        // A string's own header and terminator: 10 bytes (sdshdr32).
        assert_eq!(allocation(1_048_560 + 10), 1 << 20);
        assert_eq!(allocation(655_360 + 10), 786_432);
        assert_eq!(allocation(655_296 + 10), 655_360);
        let sizes = |len: usize| {
            let value = vec![0u8; len];
            let (head, tail) = split(&value);
            (head.len(), tail.len())
        };
        assert_eq!(
            sizes(HEADER + (1 << 20)),
            ((1 << 20) - 64, HEADER + 64),
            "a full block"
        );
        assert_eq!(
            sizes(HEADER + (1 << 19)),
            ((1 << 19) - 64, HEADER + 64),
            "half a block"
        );
        assert_eq!(sizes(655_296), (655_296, 0), "just under a class: whole");
        assert_eq!(sizes(1000), (1000, 0), "small: whole");
        let (head, tail) = sizes(700 << 10);
        assert_eq!(head + tail, 700 << 10);
        assert!(
            allocation(head + 64) + allocation(tail + 64) < allocation((700 << 10) + 64),
            "split only where it saves memory"
        );
    }

    #[test]
    fn a_value_decodes_only_when_whole_and_under_its_own_key() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i / 1000) as u8).collect();
        for codec in [Codec::None, Codec::Lz4, Codec::Zstd(3)] {
            let value = encode("k1", &data, codec);
            assert!(value.len() <= HEADER + data.len());
            assert_eq!(decode("k1", &value, data.len()).as_deref(), Ok(&data[..]));
            assert_eq!(decode("k2", &value, data.len()), Err(Damage::Misplaced));
            assert_eq!(decode("k1", &value, data.len() - 1), Err(Damage::Misplaced));
            assert_eq!(
                decode("k1", &value[..value.len() - 1], data.len()),
                Err(Damage::Corrupt),
                "truncated"
            );
            let mut flipped = value.clone();
            let last = flipped.len() - 1;
            flipped[last] ^= 0x10;
            assert_eq!(decode("k1", &flipped, data.len()), Err(Damage::Corrupt));
            assert_eq!(decode("k1", &value[..10], data.len()), Err(Damage::Foreign));
            assert_eq!(
                decode("k1", b"garbage written by someone else", 9),
                Err(Damage::Foreign)
            );
        }
        // A full block's value is split below its size class; the two parts make it whole.
        let full: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 256) as u8).collect();
        let value = encode("k", &full, Codec::None);
        let (head, tail) = split(&value);
        assert_eq!((head.len(), tail.len()), ((1 << 20) - 64, HEADER + 64));
        assert_eq!(
            decode("k", &[head, tail].concat(), full.len()).as_deref(),
            Ok(&full[..])
        );
        assert_eq!(
            decode("k", head, full.len()),
            Err(Damage::Corrupt),
            "tail lost"
        );
        assert_eq!(split(b"short"), (&b"short"[..], &b""[..]));
        let mut rng = fastrand::Rng::with_seed(7);
        let random: Vec<u8> = (0..4096).map(|_| rng.u8(..)).collect();
        let value = encode("k", &random, Codec::Zstd(3));
        assert_eq!(
            value.len(),
            HEADER + random.len(),
            "incompressible bytes are stored raw"
        );
        assert_eq!(
            decode("k", &value, random.len()).as_deref(),
            Ok(&random[..])
        );
    }
}
