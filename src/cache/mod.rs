//! The cache: tiers that keep blocks of source file versions, and the one way they are filled.
//!
//! Owns: the block (1 MiB of one file version, with checksums) and its codecs, and the chain a
//! block is fetched through, in order: the never-evict RAM tier (`ram`), the prefetch staging
//! buffer (`staging`), the disk tier (`disk`), the cluster tier shared by a job's nodes
//! (`cluster`), then the source. `BlockFetcher` owns that order,
//! single-flight fetching and admission; the tiers below RAM share the `Tier` seam, each with a
//! fault-injecting double for tests. Cache failures (no room, a damaged entry, a checksum
//! mismatch) become misses and counters, never errors for the reader. Must never evict a cached
//! block to make room, never serve bytes that failed their checksum, and never serve bytes of
//! another file version.

pub(crate) mod block;
pub mod cluster;
pub mod codec;
pub mod disk;
mod fetcher;
pub mod metrics;
pub mod policy;
pub mod ram;
pub(crate) mod rows;
pub mod staging;
pub mod tier;

pub use block::Block;
pub use cluster::{ClusterConfig, ClusterTier};
pub use disk::{CacheDir, DiskConfig, DiskError, DiskOptions, DiskSetup, DiskTier};
pub use fetcher::{BlockFetcher, Prefetched};
pub use policy::{Choice, DecodedCaching, DecodedReason};
pub use ram::{Packer, RamFile, RamTier, ReadBytes, Unpacked};
pub use staging::Staging;
pub use tier::{BlockKey, Tier};

/// The cache's configuration (`--cache-mem`, `--codec`, `--decoded-cache`, and the disk tier's).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// The hard memory budget of everything the mount holds for data.
    pub budget: u64,
    /// Codec of cached data; `None`: chosen adaptively.
    pub codec: Option<codec::Codec>,
    /// Whether view renders keep decoded pixels in the RAM tier.
    pub decoded: DecodedCaching,
    /// The persistent disk tier, if any.
    pub disk: Option<disk::DiskConfig>,
    /// The cluster tier, if any.
    pub cluster: Option<ClusterConfig>,
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        CacheConfig {
            budget: 1 << 30,
            codec: None,
            decoded: DecodedCaching::Auto,
            disk: None,
            cluster: None,
        }
    }
}

/// Cache block size. Equal to the largest FUSE read (256 pages), so an aligned request touches
/// one block and an unaligned one at most two.
pub const BLOCK_SIZE: u64 = 1 << 20;

/// CPU time this thread has used, in nanoseconds (for the codec CPU counters).
pub(crate) fn thread_cpu() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}
