//! One kernel I/O mode per inode while its opens live.
//!
//! Owns: which live opens of each inode the kernel serves by passthrough, from which backing
//! file, and which the daemon serves. The kernel binds one backing file to an inode while any
//! passthrough open of it lives; it answers EIO to a passthrough open beside a daemon-served
//! open that may be mmapped (numpy memmaps, safetensors), to a daemon-served open beside
//! passthrough ones, and to a passthrough open with another backing file. So the first open of
//! an idle inode chooses its mode and every open while any lives follows it: an open never fails
//! because of how another open of the same file is served. Must never block: one short shard
//! lock per open and release, and no source access.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// Shards of the table: opens of different inodes rarely share a lock.
const SHARDS: usize = 64;

/// How the kernel serves one open.
pub enum Mode<B> {
    /// Every read comes to the daemon.
    Daemon,
    /// The kernel reads this backing file itself.
    Passthrough(Arc<B>),
}

/// The live opens of one inode, all served one way.
struct Live<B> {
    /// Handles the daemon serves.
    daemon: Vec<u64>,
    /// Handles the kernel serves from `backing`.
    passthrough: Vec<u64>,
    /// The backing file every passthrough open of the inode shares while any lives.
    backing: Option<Arc<B>>,
}

/// One shard of the table: inode -> its live opens.
type Shard<B> = Mutex<HashMap<u64, Live<B>>>;

/// The I/O mode of every inode with live opens.
pub struct IoModes<B> {
    shards: Box<[Shard<B>]>,
}

impl<B> Default for IoModes<B> {
    fn default() -> Self {
        IoModes {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

/// What `IoModes::open` decided beyond the mode, for the caller's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The mode this open would have had alone.
    Own,
    /// Passthrough was on offer, but a daemon-served open of the inode lives.
    BesideDaemon,
    /// Passthrough to the backing file of the inode's live passthrough opens, which may hold an
    /// earlier version than this open would have had.
    Pinned,
}

impl<B> IoModes<B> {
    fn shard(&self, ino: u64) -> &Shard<B> {
        &self.shards[(ino as usize) % SHARDS]
    }

    /// Chooses how the kernel serves the new open `fh` of `ino` and records it. `offer`, when
    /// the open's version is cached whole, registers its backing file (or hands back the one
    /// registered before); a registration the kernel refuses is returned as the error, and the
    /// open is then served by the daemon.
    pub fn open(
        &self,
        ino: u64,
        fh: u64,
        offer: Option<impl FnOnce() -> std::io::Result<Arc<B>>>,
    ) -> (Mode<B>, Why, Option<std::io::Error>) {
        let mut shard = self.shard(ino).lock();
        let live = shard.entry(ino).or_insert_with(|| Live {
            daemon: Vec::new(),
            passthrough: Vec::new(),
            backing: None,
        });
        if !live.daemon.is_empty() {
            live.daemon.push(fh);
            let why = if offer.is_some() {
                Why::BesideDaemon
            } else {
                Why::Own
            };
            return (Mode::Daemon, why, None);
        }
        if let Some(backing) = live.backing.clone() {
            live.passthrough.push(fh);
            return (Mode::Passthrough(backing), Why::Pinned, None);
        }
        let mut refused = None;
        if let Some(register) = offer {
            match register() {
                Ok(backing) => {
                    live.backing = Some(backing.clone());
                    live.passthrough.push(fh);
                    return (Mode::Passthrough(backing), Why::Own, None);
                }
                Err(e) => refused = Some(e),
            }
        }
        live.daemon.push(fh);
        (Mode::Daemon, Why::Own, refused)
    }

    /// Forgets the open `fh` of `ino` (its release, or an open the kernel never got). The
    /// inode's mode is free again once its last open is gone.
    pub fn closed(&self, ino: u64, fh: u64) {
        let mut shard = self.shard(ino).lock();
        let Some(live) = shard.get_mut(&ino) else {
            return;
        };
        if let Some(i) = live.daemon.iter().position(|h| *h == fh) {
            live.daemon.swap_remove(i);
        } else if let Some(i) = live.passthrough.iter().position(|h| *h == fh) {
            live.passthrough.swap_remove(i);
        }
        if live.passthrough.is_empty() {
            live.backing = None;
        }
        if live.daemon.is_empty() && live.passthrough.is_empty() {
            shard.remove(&ino);
        }
    }

    /// Inodes with live opens (tests).
    #[cfg(test)]
    fn inodes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Offer = fn() -> std::io::Result<Arc<u32>>;

    fn offer(id: u32) -> Option<impl FnOnce() -> std::io::Result<Arc<u32>>> {
        Some(move || Ok(Arc::new(id)))
    }

    fn backing(mode: &Mode<u32>) -> Option<u32> {
        match mode {
            Mode::Daemon => None,
            Mode::Passthrough(b) => Some(**b),
        }
    }

    #[test]
    fn an_open_beside_a_daemon_served_open_is_served_by_the_daemon() {
        let modes = IoModes::<u32>::default();
        let (first, ..) = modes.open(7, 1, None::<Offer>);
        assert!(backing(&first).is_none());
        let (second, why, _) = modes.open(7, 2, offer(9));
        assert!(backing(&second).is_none(), "no passthrough beside a mmap");
        assert_eq!(why, Why::BesideDaemon);
        modes.closed(7, 1);
        modes.closed(7, 2);
        let (third, why, _) = modes.open(7, 3, offer(9));
        assert_eq!(backing(&third), Some(9), "idle again: passthrough");
        assert_eq!(why, Why::Own);
    }

    #[test]
    fn opens_beside_passthrough_share_its_backing_even_uncached_or_changed() {
        let modes = IoModes::<u32>::default();
        let (first, ..) = modes.open(7, 1, offer(9));
        assert_eq!(backing(&first), Some(9));
        let (uncached, why, _) = modes.open(7, 2, None::<Offer>);
        assert_eq!(
            backing(&uncached),
            Some(9),
            "never daemon-served beside passthrough"
        );
        assert_eq!(why, Why::Pinned);
        let (changed, ..) = modes.open(7, 3, offer(10));
        assert_eq!(backing(&changed), Some(9), "one backing file per inode");
        modes.closed(7, 1);
        modes.closed(7, 2);
        modes.closed(7, 3);
        assert_eq!(modes.inodes(), 0, "released inodes leave the table");
        let (fresh, ..) = modes.open(7, 4, offer(10));
        assert_eq!(
            backing(&fresh),
            Some(10),
            "the new version once the old opens are gone"
        );
    }

    #[test]
    fn a_refused_registration_is_served_by_the_daemon_and_reported() {
        let modes = IoModes::<u32>::default();
        let refuse = Some(|| Err(std::io::Error::other("no passthrough")));
        let (mode, _, refused) = modes.open(7, 1, refuse);
        assert!(backing(&mode).is_none());
        assert!(refused.is_some());
        let (other, ..) = modes.open(8, 2, offer(3));
        assert_eq!(backing(&other), Some(3), "other inodes are unaffected");
    }
}
