//! Finding a mount's prepfs daemon, for the benchmarks that read its CPU time and memory.
//!
//! Owns the one rule: the daemon is the process whose arguments hold `--daemon-child` and the
//! mountpoint. Must never signal or change the process it finds.

use std::path::Path;

/// The pid of the daemon serving `mountpoint`, if one runs.
pub fn daemon_of(mountpoint: &Path) -> Option<u32> {
    let mnt = mountpoint.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let mut args = cmd.split(|&b| b == 0);
        let ours = args.clone().any(|a| a == b"--daemon-child") && args.any(|a| a == mnt);
        ours.then_some(pid)
    })
}
