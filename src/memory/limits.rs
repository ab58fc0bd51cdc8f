//! How much memory the daemon may use: the host's and its cgroup's limits and usage, the default
//! budget, and the check of a budget the user asked for.
//!
//! Owns: reading /proc/meminfo and the memory controller of the cgroup this process is in (v2's
//! `memory.max`/`memory.current`/`memory.stat`, or v1's `memory.limit_in_bytes`/
//! `memory.usage_in_bytes`/`memory.stat`; the tightest limit of the group and its ancestors), and
//! the rules: the default budget is min(half of the host's available memory, the cgroup's room)
//! minus `HEADROOM`, a budget that leaves less than `HEADROOM` under the cgroup's limit (or asks
//! for more than the machine has) is refused, and one close to it is warned about. Must never
//! fail because a file is missing or odd: what cannot be read is unknown, not an error.

use std::path::{Path, PathBuf};

/// Memory the daemon uses beyond its budget, at most: code, thread stacks, the kernel
/// connection's request buffers, reply assembly, statistics and per-file names. A budget must
/// leave this much under a cgroup's limit.
pub const HEADROOM: u64 = 64 << 20;
/// Share of the host's available memory the default budget takes: the training job needs the
/// rest.
const HOST_SHARE: f64 = 0.5;
/// A budget above this share of the room it has left is warned about (close to the limit).
const CLOSE_SHARE: f64 = 0.9;

/// The host's memory, from /proc/meminfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    /// MemTotal.
    pub total: u64,
    /// MemAvailable.
    pub available: u64,
}

/// Which interface a cgroup's memory controller speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// cgroup v1's memory controller.
    V1,
    /// cgroup v2.
    V2,
}

/// The memory cgroup this process is in, when it has a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    /// The group's directory.
    pub dir: PathBuf,
    /// Its interface.
    pub version: Version,
    /// The tightest limit of the group and its ancestors.
    pub limit: u64,
}

/// Memory use of a cgroup now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Everything charged to it.
    pub total: u64,
    /// What the kernel cannot reclaim (all but file pages: anonymous memory, shared memory such
    /// as prepfs's memfds, kernel objects).
    pub unreclaimable: u64,
}

/// The host's memory now.
pub fn host() -> Option<Host> {
    parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_meminfo(text: &str) -> Option<Host> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some(Host {
        total: field("MemTotal:")?,
        available: field("MemAvailable:")?,
    })
}

/// The memory cgroup of this process, if it (or an ancestor) has a limit.
pub fn cgroup() -> Option<Cgroup> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (dir, root, version) = locate(&own, &mounts)?;
    let limit = match version {
        Version::V2 => ancestors(&dir, &root)
            .filter_map(|d| read_number(&d.join("memory.max")))
            .min()?,
        Version::V1 => {
            let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
            stat_value(&stat, "hierarchical_memory_limit")
                .into_iter()
                .chain(read_number(&dir.join("memory.limit_in_bytes")))
                .min()?
        }
    };
    // v1 spells "no limit" as a page-rounded i64::MAX.
    (limit < 1 << 60).then_some(Cgroup {
        dir,
        version,
        limit,
    })
}

impl Cgroup {
    /// Its memory use now (`None` if the files cannot be read).
    pub fn usage(&self) -> Option<Usage> {
        let (current, stat) = match self.version {
            Version::V2 => ("memory.current", "memory.stat"),
            Version::V1 => ("memory.usage_in_bytes", "memory.stat"),
        };
        let total = read_number(&self.dir.join(current))?;
        let stat = std::fs::read_to_string(self.dir.join(stat)).ok()?;
        let file = match self.version {
            Version::V2 => {
                stat_value(&stat, "active_file").unwrap_or(0)
                    + stat_value(&stat, "inactive_file").unwrap_or(0)
            }
            Version::V1 => {
                stat_value(&stat, "total_active_file").unwrap_or(0)
                    + stat_value(&stat, "total_inactive_file").unwrap_or(0)
            }
        };
        Some(Usage {
            total,
            unreclaimable: total.saturating_sub(file),
        })
    }
}

/// (the group's directory, the controller's mount point, the interface) from /proc/self/cgroup
/// and /proc/self/mountinfo: v1's memory controller where it is mounted, else v2.
fn locate(own: &str, mountinfo: &str) -> Option<(PathBuf, PathBuf, Version)> {
    let mounts = crate::mountinfo::parse(mountinfo);
    let v1 = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_owned())
    });
    let (path, version) = match v1 {
        Some(path) => (path, Version::V1),
        None => (
            own.lines().find_map(|l| l.strip_prefix("0::"))?.to_owned(),
            Version::V2,
        ),
    };
    let mount = mounts.into_iter().find(|m| match version {
        Version::V1 => m.fstype == "cgroup" && m.options.split(',').any(|o| o == "memory"),
        Version::V2 => m.fstype == "cgroup2",
    })?;
    // The group's path is relative to the hierarchy's root; the mount shows `mount.root` of it
    // (inside a cgroup namespace the group itself, and the path reads "/").
    let path = Path::new(&path);
    let relative = path.strip_prefix(&mount.root).unwrap_or(path);
    let relative = relative.strip_prefix("/").unwrap_or(relative);
    Some((mount.point.join(relative), mount.point, version))
}

/// `dir` and its parents down to `root`.
fn ancestors<'a>(dir: &'a Path, root: &'a Path) -> impl Iterator<Item = &'a Path> {
    dir.ancestors().take_while(move |d| d.starts_with(root))
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// The room a budget has: the host's available memory, and under a cgroup limit what the group
/// has left; `None` when neither can be read.
fn room(host: Option<Host>, cgroup: Option<&Cgroup>) -> Option<u64> {
    let in_group = cgroup.map(|g| {
        let used = g.usage().map_or(0, |u| u.unreclaimable);
        g.limit.saturating_sub(used)
    });
    match (host.map(|h| h.available), in_group) {
        (Some(h), Some(g)) => Some(h.min(g)),
        (h, g) => h.or(g),
    }
}

/// Budget used when no memory figure can be read.
const FALLBACK: u64 = 1 << 30;

/// The default budget: min(half the host's available memory, the cgroup's room) minus
/// `HEADROOM` (never below zero).
pub fn default_budget(host: Option<Host>, cgroup: Option<&Cgroup>) -> u64 {
    let half_host = host.map(|h| (h.available as f64 * HOST_SHARE) as u64);
    let in_group = cgroup.and_then(|_| room(None, cgroup));
    let room = match (half_host, in_group) {
        (Some(h), Some(g)) => h.min(g),
        (h, g) => match h.or(g) {
            Some(r) => r,
            None => return FALLBACK,
        },
    };
    room.saturating_sub(HEADROOM)
}

/// `bytes` as the user would write it: whole MiB when it is a multiple of one, else bytes.
fn exact(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// Checks a budget the user asked for: an error line when it cannot work (more than the machine
/// has, or less than `HEADROOM` left under the cgroup's limit), a warning line when it is close
/// to what is available now, else nothing.
pub fn check_budget(
    budget: u64,
    host: Option<Host>,
    cgroup: Option<&Cgroup>,
) -> Result<Option<String>, String> {
    let mib = |b: u64| b >> 20;
    if let Some(h) = host
        && budget > h.total.saturating_sub(HEADROOM)
    {
        return Err(format!(
            "--cache-mem {} MiB is more than this machine's memory ({} MiB) less the daemon's \
             {} MiB headroom",
            mib(budget),
            mib(h.total),
            mib(HEADROOM)
        ));
    }
    if let Some(g) = cgroup
        && budget > g.limit.saturating_sub(HEADROOM)
    {
        let most = g.limit.saturating_sub(HEADROOM);
        return Err(format!(
            "--cache-mem {} leaves less than the daemon's {} MiB headroom under its cgroup's \
             memory limit of {} MiB ({}); use at most {}",
            exact(budget),
            mib(HEADROOM),
            mib(g.limit),
            g.dir.display(),
            exact(most)
        ));
    }
    let room = room(host, cgroup).map(|r| r.saturating_sub(HEADROOM));
    Ok(room
        .filter(|&r| budget as f64 > r as f64 * CLOSE_SHARE)
        .map(|r| {
            format!(
                "--cache-mem {} MiB is close to or above the memory available now ({} MiB after \
                 the daemon's {} MiB headroom): the training job and the page cache get little",
                mib(budget),
                mib(r),
                mib(HEADROOM)
            )
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn meminfo_parses_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree: 1 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some(Host {
                total: 24_576_000 * 1024,
                available: 20_480_000 * 1024
            })
        );
        assert!(host().is_some_and(|h| h.available <= h.total));
    }

    #[test]
    fn the_cgroup_is_found_for_v1_v2_and_namespaces() {
        let v1_mounts = "30 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                         31 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let own = "4:memory:/jobs/a\n0::/\n";
        assert_eq!(
            locate(own, v1_mounts),
            Some((
                PathBuf::from("/sys/fs/cgroup/memory/jobs/a"),
                PathBuf::from("/sys/fs/cgroup/memory"),
                Version::V1
            ))
        );
        let v2_mounts = "40 1 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            locate("0::/system.slice/train.service\n", v2_mounts).map(|l| l.0),
            Some(PathBuf::from("/sys/fs/cgroup/system.slice/train.service"))
        );
        // A container: its namespace's root is its own group, mounted at /sys/fs/cgroup.
        let ns_mounts = "40 1 0:30 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            locate("0::/\n", ns_mounts).map(|l| l.0),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
    }

    #[test]
    fn the_default_is_the_smaller_room_less_the_headroom() {
        let host = Some(Host {
            total: 24 << 30,
            available: 20 << 30,
        });
        assert_eq!(default_budget(host, None), (10 << 30) - HEADROOM);
        assert_eq!(default_budget(None, None), FALLBACK);
        let tiny = Some(Host {
            total: 100 * MIB,
            available: 100 * MIB,
        });
        assert_eq!(default_budget(tiny, None), 0, "never below zero");
    }

    #[test]
    fn budgets_beyond_the_machine_or_the_cgroup_headroom_are_refused() {
        let host = Some(Host {
            total: 24 << 30,
            available: 20 << 30,
        });
        let huge = check_budget(100_000u64 << 40, host, None).expect_err("more than the machine");
        assert!(huge.contains("more than this machine's memory"), "{huge}");
        assert_eq!(check_budget(1 << 30, host, None), Ok(None));
        let close = check_budget(19 << 30, host, None).expect("allowed");
        assert!(close.is_some_and(|w| w.contains("close to")));
        let group = Cgroup {
            dir: PathBuf::from("/nonexistent/cgroup"),
            version: Version::V2,
            limit: 256 * MIB,
        };
        let refused = check_budget(200 * MIB, host, Some(&group)).expect_err("no headroom");
        assert!(refused.contains("use at most 192 MiB"), "{refused}");
        assert!(check_budget(192 * MIB, host, Some(&group)).is_ok());
        assert_eq!(default_budget(host, Some(&group)), 192 * MIB);
    }
}
