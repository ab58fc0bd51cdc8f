//! The everyday commands on a real mount: `prepfs warm`, and the cache state each dataset file
//! shows in its `user.prepfs.cached` extended attribute.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::process::Output;

use common::{TestMount, pattern};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cached_xattr(path: &std::path::Path) -> String {
    let mut value = [0u8; 96];
    let len = rustix::fs::getxattr(path, "user.prepfs.cached", &mut value[..]).expect("getxattr");
    String::from_utf8_lossy(&value[..len]).into_owned()
}

#[test]
fn warm_fills_the_cache_without_counting_an_epoch_and_reports_what_did_not_fit() {
    let mut t = TestMount::new();
    fs::create_dir(t.s("small")).expect("mkdir");
    fs::create_dir(t.s("large")).expect("mkdir");
    for i in 0..12 {
        fs::write(t.s(&format!("small/{i:02}")), pattern(256 * KIB, i)).expect("write");
    }
    for i in 0..4 {
        fs::write(t.s(&format!("large/{i}")), pattern(3 * MIB, 100 + i)).expect("write");
    }
    // 8 MiB, 6 of them the cache's slice (2 are work room): one large file and all but one of
    // the small ones fit, not all of the 15 MiB.
    t.mount(&[
        "--cache-mem",
        "8M",
        "--codec",
        "none",
        "--prefetch-buffer",
        "0",
    ]);
    assert_eq!(
        cached_xattr(&t.m("small/00")),
        "ram=0 disk=0 blocks=1",
        "nothing is cached before the warm-up"
    );
    // What `ls -l` asks of every file: a namespace the mount does not support; another name
    // of prepfs's own namespace: no such attribute (both answered without the source).
    for (name, answer) in [
        ("security.selinux", rustix::io::Errno::NOTSUP),
        ("system.posix_acl_access", rustix::io::Errno::NOTSUP),
        ("user.other", rustix::io::Errno::NODATA),
    ] {
        let mut value = [0u8; 96];
        for path in [t.m("small/00"), t.m("small")] {
            assert_eq!(
                rustix::fs::getxattr(&path, name, &mut value[..]),
                Err(answer),
                "{name} of {}",
                path.display()
            );
        }
    }

    let out = common::run(&["warm".as_ref(), t.mnt.as_os_str()]);
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("warmed "), "{text}");
    assert!(text.contains("did not fit: "), "{text}");
    let stats = t.stats();
    let complete = stats["cache"]["complete_files"]
        .as_u64()
        .expect("complete_files");
    assert!(
        text.starts_with(&format!("warmed {complete} files, ")),
        "the report counts the files the cache holds whole ({complete}): {text}"
    );
    // First fit: the large files are read first (name order) and one fits; the small ones after
    // them still fill the rest of the budget.
    assert!((4..16).contains(&complete), "{stats}");
    // What is read fits whole: never-evict is not left holding parts of files.
    assert_eq!(
        stats["cache"]["files"], stats["cache"]["complete_files"],
        "{text}{stats}"
    );
    let unfit: u64 = text
        .split("did not fit: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a count of files that did not fit");
    assert_eq!(complete + unfit, 16, "{text}");
    assert!(
        stats["cache"]["bytes"].as_u64() <= stats["cache"]["budget_bytes"].as_u64(),
        "{stats}"
    );
    // Warm reads open with O_NOATIME: served, but not accesses of a training pass.
    assert_eq!(stats["epochs"]["files"]["epoch"], 1, "{stats}");
    assert_eq!(stats["epochs"]["files"]["files_this_epoch"], 0, "{stats}");
    let cached: Vec<String> = ["small/00", "small/01"]
        .iter()
        .map(|f| cached_xattr(&t.m(f)))
        .collect();
    let held: Vec<bool> = cached
        .iter()
        .map(|c| c == "ram=1 disk=0 blocks=1")
        .collect();
    assert!(
        held[0],
        "the first small file fits after the large ones: {cached:?}, {text}"
    );

    // A list, in the order-file form: absolute under the mount, relative, a comment, a stranger.
    let list = t.dir.path().join("list");
    fs::write(
        &list,
        format!(
            "# warm these first\n{}\nsmall/01\n/elsewhere/x\n",
            t.m("small/00").display()
        ),
    )
    .expect("write list");
    let out = common::run(&[
        "warm".as_ref(),
        t.mnt.as_os_str(),
        "--from-list".as_ref(),
        list.as_os_str(),
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    if held[1] {
        assert!(text.starts_with("warmed 0 files, "), "{text}");
        assert!(
            text.contains("already cached: 2 files, 512.00 KiB"),
            "{text}"
        );
    } else {
        assert!(
            text.contains("already cached: 1 files, 256.00 KiB"),
            "{text}"
        );
        assert!(text.contains("did not fit: 1 files"), "{text}");
    }
    assert!(text.contains("ignored: \"/elsewhere/x\""), "{text}");

    // Reads through the mount still return the source's bytes.
    for i in 0..4 {
        assert_eq!(
            fs::read(t.m(&format!("large/{i}"))).expect("read"),
            pattern(3 * MIB, 100 + i)
        );
    }
}

#[test]
fn warm_outside_a_prepfs_mount_fails_with_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = common::run(&["warm".as_ref(), dir.path().as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is it a prepfs mount?"), "{err}");
}

#[test]
fn top_and_stats_watch_print_plain_updates_when_not_on_a_terminal() {
    let mut t = TestMount::new();
    for i in 0..8 {
        fs::write(t.s(&format!("{i}")), pattern(64 * KIB, i)).expect("write");
    }
    t.mount(&[]);
    for _ in 0..3 {
        for i in 0..8 {
            fs::read(t.m(&format!("{i}"))).expect("read");
        }
    }
    // The planner publishes the epochs document at most every 100 ms.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let live = |command: &str, extra: &[&str]| {
        let mut args: Vec<&OsStr> = vec![command.as_ref(), t.mnt.as_os_str()];
        args.extend(extra.iter().map(OsStr::new));
        args.extend(["--count", "2", "--interval", "0.1"].map(OsStr::new));
        common::run(&args)
    };
    let out = live("top", &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for line in &lines {
        assert!(line.starts_with("uptime="), "{line}");
        assert!(line.contains(" hit_rate="), "{line}");
        assert!(line.contains(" files: epoch 3"), "{line}");
    }
    let out = live("stats", &["--watch", "--all"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("\ncache.hits ").count(), 2, "{text}");
    assert!(text.contains("epochs.files.diagnosis.verdict "), "{text}");
    let out = live("stats", &["--watch"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("\ncache.hit_rate ").count(), 2, "{text}");
}

#[test]
fn stats_shows_a_one_screen_summary_and_every_field_with_all() {
    let mut t = TestMount::new();
    for i in 0..8 {
        fs::write(t.s(&format!("{i}")), pattern(64 * KIB, i)).expect("write");
    }
    let view = "train=decode,resize(8),float32";
    t.mount(&["--view", view, "--view", "val=decode,resize(8),uint8"]);
    for _ in 0..2 {
        for i in 0..8 {
            fs::read(t.m(&format!("{i}"))).expect("read");
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let stats = |extra: &[&str]| {
        let mut args: Vec<&OsStr> = vec!["stats".as_ref(), t.mnt.as_os_str()];
        args.extend(extra.iter().map(OsStr::new));
        let out = common::run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout(&out)
    };
    let summary = stats(&[]);
    // One screen, two views and all: the figures by the paths stats.json and STATS.md use.
    assert!(summary.lines().count() <= 25, "{summary}");
    for path in [
        "cache.hit_rate ",
        "source.bytes_read ",
        "stall.fetch_seconds ",
        "views.train.images_per_s ",
        "views.val.errors ",
    ] {
        assert!(summary.contains(path), "{path} in\n{summary}");
    }
    assert!(summary.contains("files: epoch 2"), "{summary}");
    assert!(summary.contains("prepfs stats --all"), "{summary}");
    let all = stats(&["--all"]);
    assert!(all.lines().count() > 100, "{all}");
    assert!(all.contains("\ncache.hits "), "{all}");
    assert!(all.contains("\nviews.train.opens "), "{all}");
}

#[test]
fn the_fuse_mount_helper_form_takes_options_from_o_and_a_config_file() {
    let t = TestMount::new();
    fs::write(t.s("f"), pattern(300 * KIB, 7)).expect("write");
    let config = t.dir.path().join("prepfs.toml");
    fs::write(&config, "cache_mem = \"32M\"\ncodec = \"lz4\"\n").expect("write config");
    // `mount -t fuse.prepfs SRC MNT -o OPTS` runs fuse3's helper, which runs
    // `prepfs SRC MNT -o OPTS` from PATH; generic options (nofail, rw) reach prepfs too.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_prepfs"))
        .parent()
        .expect("bin dir")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("mount.fuse3")
        .arg(&t.src)
        .arg(&t.mnt)
        .args(["-t", "fuse.prepfs", "-o"])
        .arg(format!(
            "nofail,rw,cache_mem=48M,config={}",
            config.display()
        ))
        .env("PATH", path)
        .output()
        .expect("run mount.fuse3 (package fuse3)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats = t.stats();
    let fstype = common::mount_type(&t.mnt).map(|(fstype, _)| fstype);
    let _ = common::run(&["umount".as_ref(), t.mnt.as_os_str()]);
    assert_eq!(fstype.as_deref(), Some("fuse.prepfs"));
    // -o overrides the file; the file's other options hold; the mount is read-only regardless.
    // (--cache-mem is the whole memory budget; the RAM tier gets a slice of it.)
    assert_eq!(stats["memory"]["budget_bytes"], 48 * MIB, "{stats}");
    assert_eq!(stats["cache"]["codec"]["choice"], "lz4", "{stats}");

    for (args, origin) in [
        (vec!["-o", "cache_mem=8M,bogus=1"], "-o"),
        (
            vec!["--config", config.to_str().expect("utf-8")],
            "prepfs.toml",
        ),
    ] {
        fs::write(&config, "cache_mem = \"32M\"\nbogus = true\n").expect("write config");
        let mut all = vec![t.src.as_os_str(), t.mnt.as_os_str()];
        all.extend(args.iter().map(OsStr::new));
        let out = common::run(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("unknown mount option 'bogus' in ") && err.contains(origin),
            "{err}"
        );
    }
    assert!(!common::is_mounted(&t.mnt));
}
