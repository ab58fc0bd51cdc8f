//! Readers of the kernel's counters: /proc/stat (machine CPU), getrusage (prepfs's own CPU),
//! /proc/meminfo (memory), /proc/diskstats (the source's block device).
//!
//! Owns: parsing those files into cumulative counters. Each read costs tens of microseconds,
//! which is why prepfs reads them itself instead of through sysinfo (which also refuses CPU
//! refreshes closer than 200 ms apart). Must never fail loudly: an unreadable or odd file is
//! `None`, and the sampler keeps its last figures.

use std::time::Duration;

/// CPU time counters from the first line of /proc/stat: (idle incl. iowait, total), in ticks.
pub fn cpu_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already inside user).
    let total = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((idle, total))
}

/// CPU time this process used so far (user + system, all threads).
pub fn own_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole `rusage` into the pointer it is given and nothing else.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return Duration::ZERO;
    }
    // SAFETY: zero-initialised plain integers, filled in by a successful getrusage.
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Share of memory available (MemAvailable / MemTotal).
pub fn memory_available() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let (total, available) = (field("MemTotal:")?, field("MemAvailable:")?);
    (total > 0.0).then(|| available / total)
}

/// Read counters of one block device from /proc/diskstats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskCounters {
    /// Reads completed.
    pub reads: u64,
    /// Bytes read (sectors are always 512 bytes in this file).
    pub bytes: u64,
    /// Milliseconds spent on reads (summed over reads in flight).
    pub read_ms: u64,
}

/// The counters of device `major:minor`, or `None` (no such device: tmpfs, overlay, FUSE).
pub fn disk_counters(major: u32, minor: u32) -> Option<DiskCounters> {
    let text = std::fs::read_to_string("/proc/diskstats").ok()?;
    parse_diskstats(&text, major, minor)
}

fn parse_diskstats(text: &str, major: u32, minor: u32) -> Option<DiskCounters> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        (num(0)? == u64::from(major) && num(1)? == u64::from(minor)).then_some(())?;
        Some(DiskCounters {
            reads: num(3)?,
            bytes: num(5)? * 512,
            read_ms: num(6)?,
        })
    })
}

/// The block device (major, minor) holding `path`, if it is a real one (major != 0).
pub fn device_of(path: &std::path::Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    (major != 0).then_some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_counters_parse() {
        let (idle, total) = cpu_ticks().expect("/proc/stat");
        assert!(idle <= total && total > 0);
        let m = memory_available().expect("/proc/meminfo");
        assert!(m > 0.0 && m <= 1.0);
        let before = own_cpu();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1 && own_cpu() >= before);
        let text = "   7       0 loop0 120 0 2048 33 0 0 0 0 0 40 33 0 0 0 0 0 0\n 259 0 nvme0n1 5 1 80 9\n";
        assert_eq!(
            parse_diskstats(text, 7, 0),
            Some(DiskCounters {
                reads: 120,
                bytes: 2048 * 512,
                read_ms: 33
            })
        );
        assert_eq!(
            parse_diskstats(text, 259, 0).map(|d| d.bytes),
            Some(80 * 512)
        );
        assert_eq!(parse_diskstats(text, 8, 0), None);
    }
}
