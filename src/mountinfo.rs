//! /proc/self/mountinfo: the mounts this process sees.
//!
//! Owns parsing the file's lines (fields, the ` - ` separator, `\ooo` escapes). Used to tell
//! whether a path is a mount point and where the cgroup controllers are mounted. Must never fail
//! loudly: an unreadable file or an odd line is simply not a mount.

use std::path::PathBuf;

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The filesystem's device (`major:minor`).
    pub device: String,
    /// The directory of the mounted filesystem that appears at `point` (`/` unless a bind or a
    /// namespace shows part of it).
    pub root: PathBuf,
    /// Where it is mounted.
    pub point: PathBuf,
    /// Filesystem type (`cgroup2`, `fuse.prepfs`, ...).
    pub fstype: String,
    /// Per-superblock options (`rw,memory` for a cgroup v1 memory hierarchy).
    pub options: String,
}

/// The mounts in `text` (the file's content), in its order (a later mount on the same point is
/// on top).
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let mut r = right.split(' ');
            let fstype = r.next()?.to_owned();
            let options = r.nth(1).unwrap_or("").to_owned();
            Some(Mount {
                device: (*l.get(2)?).to_owned(),
                root: unescape(l.get(3)?),
                point: unescape(l.get(4)?),
                fstype,
                options,
            })
        })
        .collect()
}

/// The mounts this process sees now (none if the file cannot be read).
pub fn mounts() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo").map_or_else(|_| Vec::new(), |t| parse(&t))
}

/// A path field with mountinfo's `\ooo` escapes (space, tab, newline, backslash) decoded, its
/// bytes kept as they are.
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let code =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_with_escapes_decoded() {
        assert_eq!(
            unescape("/mnt/with\\040space"),
            PathBuf::from("/mnt/with space")
        );
        assert_eq!(unescape("/plain"), PathBuf::from("/plain"));
        let mounts = parse(
            "36 25 0:32 / /mnt/with\\040space rw,nosuid shared:1 - fuse.prepfs prepfs:/d ro,user_id=0\n\
             30 25 0:27 /jobs /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
             garbage\n",
        );
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].point, PathBuf::from("/mnt/with space"));
        assert_eq!(mounts[0].fstype, "fuse.prepfs");
        assert_eq!(mounts[1].root, PathBuf::from("/jobs"));
        assert_eq!(mounts[1].device, "0:27");
        assert_eq!(mounts[1].options, "rw,memory");
    }
}
