//! Tensor views through real mounts of the binary: the tree, exact sizes, .npy headers, fresh
//! augmentation per open, bad images failing alone (also those a render could not hold in bounded
//! memory), bad specs refused at mount.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::FileExt;

use common::TestMount;

const TRAIN: &str = "train=decode,random_resized_crop(64),hflip,normalize(imagenet)";
const VAL: &str = "val=decode,resize(80),center_crop(64),uint8(hwc)";

fn dataset(t: &TestMount) {
    for (i, class) in ["cat", "dog"].iter().enumerate() {
        fs::create_dir_all(t.s(class)).expect("mkdir");
        for j in 0..2u64 {
            let jpeg = prepfs::synthetic::photo(i as u64 * 10 + j).expect("jpeg");
            fs::write(t.s(&format!("{class}/img{j}.jpg")), jpeg).expect("write");
        }
    }
    fs::create_dir_all(t.s("cat/nested")).expect("mkdir");
    fs::write(t.s("cat/notes.txt"), b"not an image").expect("write");
}

/// (header dict, payload) of an .npy file.
fn npy(bytes: &[u8]) -> (String, &[u8]) {
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "npy v1.0 magic");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let dict = String::from_utf8(bytes[10..10 + len].to_vec()).expect("ascii header");
    (dict, &bytes[10 + len..])
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut n: Vec<String> = fs::read_dir(dir)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

#[test]
fn views_mirror_images_as_npy_with_exact_sizes_and_fresh_augmentation() {
    let mut t = TestMount::new();
    dataset(&t);
    t.mount(&["--view", TRAIN, "--view", VAL, "--seed", "7"]);
    assert_eq!(names(&t.m(".prepfs/views")), ["train", "val"]);
    assert_eq!(names(&t.m(".prepfs/views/train")), ["cat", "dog"]);
    assert_eq!(
        names(&t.m(".prepfs/views/train/cat")),
        ["img0.jpg.npy", "img1.jpg.npy", "nested"],
        "only images (as .npy) and directories are listed"
    );
    assert!(fs::metadata(t.m(".prepfs/views/train/cat/notes.txt.npy")).is_err());
    for (view, descr, shape, element) in [
        ("train", "'<f4'", "(3, 64, 64)", 4),
        ("val", "'|u1'", "(64, 64, 3)", 1),
    ] {
        let path = t.m(&format!(".prepfs/views/{view}/dog/img1.jpg.npy"));
        let size = fs::metadata(&path).expect("stat").len();
        let bytes = fs::read(&path).expect("read");
        assert_eq!(
            bytes.len() as u64,
            size,
            "{view}: stat size is the real size"
        );
        assert_eq!(
            bytes.len(),
            128 + 64 * 64 * 3 * element,
            "{view}: 128-byte header"
        );
        let (dict, _) = npy(&bytes);
        assert!(
            dict.contains(descr) && dict.contains(shape),
            "{view}: {dict}"
        );
    }
    // One open reads the same bytes twice; another open draws a new augmentation (train only).
    let path = t.m(".prepfs/views/train/cat/img0.jpg.npy");
    let file = fs::File::open(&path).expect("open");
    let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
    file.read_exact_at(&mut a, 1000).expect("read");
    file.read_exact_at(&mut b, 1000).expect("read again");
    assert_eq!(a, b, "same open, same bytes");
    let opens: Vec<Vec<u8>> = (0..3).map(|_| fs::read(&path).expect("read")).collect();
    assert!(
        opens[0] != opens[1] || opens[1] != opens[2],
        "train augments afresh per open"
    );
    let val = t.m(".prepfs/views/val/cat/img0.jpg.npy");
    assert_eq!(
        fs::read(&val).expect("read"),
        fs::read(&val).expect("read"),
        "val is deterministic"
    );
    let stats = t.stats();
    assert!(
        stats["views"]["train"]["opens"].as_u64().unwrap_or(0) >= 4,
        "{stats}"
    );
    assert_eq!(stats["views"]["train"]["errors"], 0);
}

#[test]
fn renders_made_ahead_of_predicted_opens_are_the_tensors_those_opens_would_render() {
    // Two mounts of the same photos with the same seed: one prefetching (it learns the walk and
    // renders the next files ahead), one not. Every open must read the same tensor on both.
    let mounts: Vec<TestMount> = [&["--decoded-cache", "off"][..], &["--no-prefetch"][..]]
        .iter()
        .map(|extra| {
            let mut t = TestMount::new();
            fs::create_dir(t.s("a")).expect("mkdir");
            for i in 0..16u64 {
                let jpeg = prepfs::synthetic::photo(i).expect("jpeg");
                fs::write(t.s(&format!("a/{i:02}.jpg")), jpeg).expect("write");
            }
            let mut args = vec!["--view", TRAIN, "--seed", "7"];
            args.extend_from_slice(extra);
            t.mount(&args);
            t
        })
        .collect();
    let mut tensors = std::collections::HashSet::new();
    for pass in 0..3 {
        for i in 0..16 {
            let name = format!(".prepfs/views/train/a/{i:02}.jpg.npy");
            let ahead = fs::read(mounts[0].m(&name)).expect("read");
            let own = fs::read(mounts[1].m(&name)).expect("read");
            assert!(
                ahead == own,
                "pass {pass}, {name}: not the tensor of that open"
            );
            tensors.insert(ahead);
            // A training step between samples: time for prefetch to work ahead.
            std::thread::sleep(std::time::Duration::from_millis(40));
        }
    }
    assert_eq!(tensors.len(), 48, "a fresh augmentation per open");
    let stats = mounts[0].stats();
    let train = &stats["views"]["train"];
    let used = train["ahead_used"].as_u64().unwrap_or(0);
    assert!(used > 0, "no open found its render made ahead: {train}");
    assert!(
        used <= train["rendered_ahead"].as_u64().unwrap_or(0),
        "{train}"
    );
    assert_eq!(train["errors"], 0);
    assert_eq!(mounts[1].stats()["views"]["train"]["rendered_ahead"], 0);
}

#[test]
fn an_image_replaced_after_its_render_ahead_renders_anew_on_its_next_open() {
    // Prefetch learns the walk and renders the next files ahead; then each image is replaced
    // (in place or by rename) just before its open. A deterministic view makes a render a
    // function of the image alone: image i now holds what image i+1 held, so its open must
    // read what i+1's read before, never the render made ahead of the image it replaced.
    const IMAGES: usize = 8;
    let mut t = TestMount::new();
    fs::create_dir(t.s("a")).expect("mkdir");
    let photos: Vec<Vec<u8>> = (0..IMAGES as u64)
        .map(|i| prepfs::synthetic::photo(i).expect("jpeg"))
        .collect();
    for (i, jpeg) in photos.iter().enumerate() {
        fs::write(t.s(&format!("a/{i:02}.jpg")), jpeg).expect("write");
    }
    t.mount(&["--view", VAL, "--decoded-cache", "off"]);
    let view = |i: usize| t.m(&format!(".prepfs/views/val/a/{i:02}.jpg.npy"));
    let mut before = Vec::new();
    for pass in 0..2 {
        for i in 0..IMAGES {
            let bytes = fs::read(view(i)).expect("read");
            if pass == 0 {
                before.push(bytes);
            } else {
                assert!(bytes == before[i], "{i:02}: val is deterministic");
            }
            // A training step between samples: time for prefetch to work ahead.
            std::thread::sleep(std::time::Duration::from_millis(40));
        }
    }
    let ahead = t.stats()["views"]["val"]["rendered_ahead"].as_u64();
    assert!(ahead.unwrap_or(0) > 0, "no render was made ahead");
    for i in 0..IMAGES {
        let source = t.s(&format!("a/{i:02}.jpg"));
        let new = &photos[(i + 1) % IMAGES];
        if i % 2 == 0 {
            fs::write(&source, new).expect("rewrite in place");
        } else {
            let temporary = t.s(&format!("a/.{i:02}.tmp"));
            fs::write(&temporary, new).expect("write");
            fs::rename(&temporary, &source).expect("replace by rename");
        }
        let bytes = fs::read(view(i)).expect("read");
        assert!(
            bytes == before[(i + 1) % IMAGES],
            "{i:02}: the render of the image it replaced"
        );
        std::thread::sleep(std::time::Duration::from_millis(40));
    }
    assert_eq!(t.stats()["views"]["val"]["errors"], 0);
}

#[test]
fn directories_named_like_view_files_are_listed_as_they_can_be_opened() {
    let mut t = TestMount::new();
    dataset(&t);
    // A directory whose name ends in .npy, and one named as an image's view file beside it.
    fs::create_dir_all(t.s("cat/arrays.npy")).expect("mkdir");
    let jpeg = prepfs::synthetic::photo(5).expect("jpeg");
    fs::write(t.s("cat/arrays.npy/inner.jpg"), jpeg).expect("write");
    fs::create_dir_all(t.s("cat/img0.jpg.npy")).expect("mkdir");
    t.mount(&["--view", VAL]);
    let dir = t.m(".prepfs/views/val/cat");
    assert_eq!(
        names(&dir),
        ["arrays.npy", "img0.jpg.npy", "img1.jpg.npy", "nested"],
        "each name once"
    );
    let arrays = fs::metadata(dir.join("arrays.npy")).expect("the directory is found");
    assert!(arrays.is_dir());
    assert_eq!(names(&dir.join("arrays.npy")), ["inner.jpg.npy"]);
    let tensor = fs::read(dir.join("arrays.npy/inner.jpg.npy")).expect("read");
    assert_eq!(tensor.len(), 128 + 64 * 64 * 3);
    let hidden = fs::metadata(dir.join("img0.jpg.npy")).expect("the view file");
    assert!(hidden.is_file(), "the image's tensor, not the directory");
    assert_eq!(hidden.len(), 128 + 64 * 64 * 3);
    let stats = t.stats();
    assert_eq!(stats["views"]["val"]["unlisted_names"], 1, "{stats}");
}

#[test]
fn an_image_whose_view_name_would_be_too_long_is_left_out_and_counted() {
    // 251 bytes + ".npy" is the longest name a view file can have; 255 bytes + ".npy" is not
    // a name any path can open.
    let longest = format!("{}.jpg", "m".repeat(247));
    let too_long = format!("{}.jpg", "n".repeat(251));
    assert_eq!((longest.len(), too_long.len()), (251, 255));
    let mut t = TestMount::new();
    fs::create_dir(t.s("d")).expect("mkdir");
    for (i, name) in [&longest, &too_long].into_iter().enumerate() {
        let jpeg = prepfs::synthetic::photo(i as u64).expect("jpeg");
        fs::write(t.s(&format!("d/{name}")), jpeg).expect("write");
    }
    t.mount(&["--view", VAL]);
    assert_eq!(
        names(&t.m("d")),
        [longest.clone(), too_long.clone()],
        "the source tree shows both"
    );
    let listed = names(&t.m(".prepfs/views/val/d"));
    assert_eq!(listed, [format!("{longest}.npy")], "only names that open");
    for name in &listed {
        let bytes = fs::read(t.m(&format!(".prepfs/views/val/d/{name}"))).expect("opens");
        assert_eq!(bytes.len(), 128 + 64 * 64 * 3);
    }
    let stats = t.stats();
    assert_eq!(stats["views"]["val"]["unlisted_names"], 1, "{stats}");
}

#[test]
fn with_allow_other_stats_name_no_failed_file_that_others_could_not_list() {
    use std::os::unix::fs::PermissionsExt;
    let mut t = TestMount::new();
    for (dir, mode) in [("public", 0o755), ("private", 0o700)] {
        fs::create_dir(t.s(dir)).expect("mkdir");
        fs::write(t.s(&format!("{dir}/bad.jpg")), b"not an image").expect("write");
        fs::set_permissions(t.s(dir), fs::Permissions::from_mode(mode)).expect("chmod");
    }
    t.mount(&["--allow-other", "--view", VAL]);
    for dir in ["public", "private"] {
        let err = fs::read(t.m(&format!(".prepfs/views/val/{dir}/bad.jpg.npy"))).expect_err(dir);
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{dir}: {err}");
    }
    let stats = t.stats();
    let val = &stats["views"]["val"];
    assert_eq!(val["errors"], 2, "both failures are counted");
    let failed = val["failed_files"].as_object().expect("an object");
    assert!(failed.contains_key("public/bad.jpg"), "{val}");
    assert_eq!(
        failed.len(),
        1,
        "no name from inside the 0700 directory: {val}"
    );
}

#[test]
fn broken_images_fail_alone_with_eio() {
    let mut t = TestMount::new();
    dataset(&t);
    let jpeg = fs::read(t.s("cat/img0.jpg")).expect("read");
    fs::write(t.s("cat/truncated.jpg"), &jpeg[..jpeg.len() / 2]).expect("write");
    fs::write(t.s("cat/text.jpg"), b"plain text named like an image").expect("write");
    t.mount(&["--view", TRAIN]);
    for bad in ["truncated", "text"] {
        let path = t.m(&format!(".prepfs/views/train/cat/{bad}.jpg.npy"));
        let err = fs::read(&path).expect_err(bad);
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{bad}: {err}");
    }
    let good = fs::read(t.m(".prepfs/views/train/cat/img1.jpg.npy")).expect("others still work");
    assert_eq!(good.len(), 128 + 3 * 64 * 64 * 4);
    assert_eq!(
        fs::read(t.m("cat/truncated.jpg")).expect("the source file itself is served"),
        &jpeg[..jpeg.len() / 2]
    );
    let stats = t.stats();
    let train = &stats["views"]["train"];
    assert_eq!(train["errors"], 2);
    let failed = &train["failed_files"];
    assert_eq!(failed["cat/truncated.jpg"]["errors"], 1, "{train}");
    assert!(
        failed["cat/text.jpg"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("not an image")),
        "{train}"
    );
    assert_eq!(failed.as_object().map(|f| f.len()), Some(2), "{train}");
}

#[test]
fn view_files_carry_their_images_owner_and_read_bits_so_others_are_kept_out_alike() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut t = TestMount::new();
    // Another user must reach the mount: the test's directory is private to root.
    fs::set_permissions(t.dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::create_dir(t.s("private")).expect("mkdir");
    // name -> (owner uid/gid, source mode)
    let images = [
        ("secret.jpg", 0, 0o600),
        ("open.jpg", 0, 0o644),
        ("theirs.jpg", 4242, 0o640),
        ("odd.jpg", 0, 0o4775),
        ("private/hidden.jpg", 0, 0o644),
    ];
    for (i, (name, owner, mode)) in images.iter().enumerate() {
        let path = t.s(name);
        fs::write(&path, prepfs::synthetic::photo(i as u64).expect("jpeg")).expect("write");
        std::os::unix::fs::chown(&path, Some(*owner), Some(*owner)).expect("chown");
        fs::set_permissions(&path, fs::Permissions::from_mode(*mode)).expect("chmod");
    }
    fs::set_permissions(t.s("private"), fs::Permissions::from_mode(0o750)).expect("chmod");
    t.mount(&["--allow-other", "--view", VAL]);
    let view = |name: &str| t.m(&format!(".prepfs/views/val/{name}.npy"));
    for (name, owner, mode) in images {
        let meta = fs::metadata(view(name)).expect("stat as root");
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (owner, owner, mode & 0o444),
            "{name}: the image's owner and read bits, nothing else"
        );
    }
    let dir = fs::metadata(t.m(".prepfs/views/val/private")).expect("stat");
    assert_eq!(
        dir.mode() & 0o7777,
        0o750,
        "a view directory is its source's"
    );
    let as_nobody = |path: &std::path::Path| {
        std::process::Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg("/bin/cat")
            .arg(path)
            .output()
            .expect("setpriv")
    };
    for (path, readable) in [
        (view("open.jpg"), true),
        (t.m("open.jpg"), true),
        (view("secret.jpg"), false),
        (t.m("secret.jpg"), false),
        (view("theirs.jpg"), false),
        (view("private/hidden.jpg"), false),
    ] {
        let out = as_nobody(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if readable {
            assert!(out.status.success(), "{}: {stderr}", path.display());
            assert_eq!(
                out.stdout,
                fs::read(&path).expect("root reads"),
                "{}",
                path.display()
            );
        } else {
            assert!(
                !out.status.success() && stderr.contains("Permission denied"),
                "{}: another user must get EACCES: {stderr}",
                path.display()
            );
        }
    }
}

#[test]
fn bad_view_specs_are_refused_at_mount_with_one_line() {
    let t = TestMount::new();
    for (spec, needle) in [
        ("t=decode,rotate(3)", "rotate"),
        ("t=resize(3)", "decode"),
        ("t=decode,hflip", ""),
    ] {
        let view = OsStr::new("--view");
        let mut args = vec![
            OsStr::new("mount"),
            t.src.as_os_str(),
            t.mnt.as_os_str(),
            view,
            OsStr::new(spec),
        ];
        if needle.is_empty() {
            // A duplicate name is refused too.
            args.extend([view, OsStr::new(spec)]);
        }
        let out = common::run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{spec}: {stderr}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{spec}: one line: {stderr}"
        );
        assert!(
            stderr.contains(if needle.is_empty() { "twice" } else { needle }),
            "{spec}: {stderr}"
        );
        assert!(!common::is_mounted(&t.mnt));
    }
}

#[test]
fn decoded_pixels_cached_serve_later_epochs_without_fetching_or_decoding() {
    let mut t = TestMount::new();
    dataset(&t);
    // Pipelines whose first resize never shrinks these 300-480-row photos by 2: a render that
    // does reads its JPEG DCT-scaled, never from cached pixels (so its bytes never depend on
    // them), and is tested in src/fs/tests.rs.
    t.mount(&[
        "--view",
        "val=decode,resize(256),center_crop(64),uint8(hwc)",
        "--view",
        "train=decode,random_resized_crop(256),hflip,normalize(imagenet)",
        "--decoded-cache",
        "on",
        "--codec",
        "zstd-3",
    ]);
    let files = [
        "cat/img0.jpg.npy",
        "cat/img1.jpg.npy",
        "dog/img0.jpg.npy",
        "dog/img1.jpg.npy",
    ];
    let epoch = |view: &str| -> Vec<Vec<u8>> {
        files
            .iter()
            .map(|f| fs::read(t.m(&format!(".prepfs/views/{view}/{f}"))).expect("read view"))
            .collect()
    };
    let first = epoch("val");
    let source_bytes = t.stats()["source"]["bytes_read"].as_u64();
    assert_eq!(
        epoch("val"),
        first,
        "a deterministic view renders the same from cached pixels"
    );
    let train = epoch("train");
    assert!(train.iter().all(|npy| npy.len() == 128 + 3 * 256 * 256 * 4));
    let stats = t.stats();
    let decoded = &stats["cache"]["decoded"];
    assert_eq!(
        stats["source"]["bytes_read"].as_u64(),
        source_bytes,
        "{stats}"
    );
    assert_eq!(decoded["misses"], 4, "{stats}");
    assert_eq!(decoded["hits"], 8, "{stats}");
    assert_eq!(decoded["entries"], 4, "{stats}");
    assert_eq!(decoded["policy"]["mode"], "on");
    assert_eq!(decoded["policy"]["reason"], "on");
    assert_eq!(stats["views"]["train"]["errors"], 0);
}

#[test]
fn a_damaged_jpeg_renders_the_same_bytes_whatever_the_cache_holds() {
    // Junk between a JPEG's last scan and its end (ImageNet's "extraneous bytes before marker
    // 0xd9"): libjpeg-turbo warns only when it reads to the end, so a crop above the last rows
    // decodes with it, and a whole decode (for the decoded-pixel cache) fell back to another
    // decoder whose pixels differ (4:2:0: its chroma upsampling is not libjpeg-turbo's). Each
    // open must read the same tensor with pixels cached or not.
    let photo = prepfs::synthetic::photo(3).expect("jpeg");
    let clean =
        common::jpeg::encode_420(&image::load_from_memory(&photo).expect("decode").to_rgb8());
    let eoi = clean.len() - 2;
    assert_eq!(&clean[eoi..], [0xFF, 0xD9]);
    let mut damaged = clean[..eoi].to_vec();
    damaged.extend_from_slice(&[0x12; 7]);
    damaged.extend_from_slice(&clean[eoi..]);
    let view = "t=decode,random_resized_crop(224, scale=(0.05, 0.2)),uint8(hwc)";
    let opens = |cache: &str| {
        let mut t = TestMount::new();
        fs::write(t.s("damaged.jpg"), &damaged).expect("write");
        fs::write(t.s("clean.jpg"), &clean).expect("write");
        // No restart-marked copies: making one rewrites the file without its junk.
        let flags = ["--view", view, "--seed", "7", "--decoded-cache", cache];
        t.mount(&[&flags[..], &["--no-view-copies"]].concat());
        let read =
            |name: &str| fs::read(t.m(&format!(".prepfs/views/t/{name}.npy"))).expect("read");
        let tensors: Vec<(Vec<u8>, Vec<u8>)> = (0..8)
            .map(|_| (read("damaged.jpg"), read("clean.jpg")))
            .collect();
        (tensors, t.stats())
    };
    let (kept, stats) = opens("on");
    assert!(
        stats["cache"]["decoded"]["hits"].as_u64() >= Some(1),
        "later opens render from cached pixels: {stats}"
    );
    let (not_kept, _) = opens("off");
    for (n, (with, without)) in kept.iter().zip(&not_kept).enumerate() {
        assert!(with.0 == without.0, "open {n} of the damaged JPEG");
        assert!(with.1 == without.1, "open {n} of the clean JPEG");
    }
}

/// The `ls -l` size column of each entry of `dir` that `ls` could stat, by name.
fn ls_sizes(dir: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    let out = std::process::Command::new("ls")
        .arg("-l")
        .arg(dir)
        .env("LC_ALL", "C")
        .output()
        .expect("run ls");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let size = fields.get(4)?.parse().ok()?;
            Some((fields.last()?.to_string(), size))
        })
        .collect()
}

/// Whether the daemon of `t` is still running.
#[test]
fn a_sparse_terabyte_image_fails_alone_and_is_never_read() {
    let mut t = TestMount::new();
    dataset(&t);
    // 1 TiB of holes named like a JPEG: nothing a decode could use, nothing to read whole.
    fs::File::create(t.s("cat/x.jpg"))
        .and_then(|f| f.set_len(1 << 40))
        .expect("sparse file");
    const FREE: &str = "free=decode,resize(48),uint8(hwc)";
    let group = common::MemoryCgroup::new(256 << 20);
    t.mount_confined(
        &["--view", TRAIN, "--view", FREE, "--cache-mem", "64M"],
        &group,
    );
    let npy_len = 128 + 3 * 64 * 64 * 4;
    // A fixed-size view announces every size without reading; the size of an image-sized
    // view comes from the header, which the sparse file does not have.
    let train = ls_sizes(&t.m(".prepfs/views/train/cat"));
    for name in ["img0.jpg.npy", "img1.jpg.npy", "x.jpg.npy"] {
        assert_eq!(train.get(name), Some(&npy_len), "train {name}: {train:?}");
    }
    let free = ls_sizes(&t.m(".prepfs/views/free/cat"));
    for name in ["img0.jpg.npy", "img1.jpg.npy"] {
        let real = fs::read(t.m(&format!(".prepfs/views/free/cat/{name}"))).expect("render");
        assert_eq!(
            free.get(name),
            Some(&(real.len() as u64)),
            "free {name}: {free:?}"
        );
    }
    assert_eq!(free.get("x.jpg.npy"), None, "{free:?}");
    let err = fs::metadata(t.m(".prepfs/views/free/cat/x.jpg.npy")).expect_err("no header");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let err = fs::read(t.m(".prepfs/views/train/cat/x.jpg.npy")).expect_err("not rendered");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // The daemon is up, within its memory, and serves the other files.
    for view in ["train", "free"] {
        for class in ["cat", "dog"] {
            let path = t.m(&format!(".prepfs/views/{view}/{class}/img1.jpg.npy"));
            assert!(
                fs::read(&path).is_ok_and(|b| b.len() > 128),
                "{view}/{class}"
            );
        }
    }
    assert!(t.daemon_alive(), "the daemon exited");
    assert_eq!(group.oom_kills(), 0, "OOM kills in a 256 MiB cgroup");
    let stats = t.stats();
    let failed = &stats["views"]["train"]["failed_files"]["cat/x.jpg"];
    assert!(
        failed["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("image too large") && e.contains("1099511627776")),
        "{stats}"
    );
    assert!(
        stats["source"]["bytes_read"].as_u64() < Some(64 << 20),
        "{stats}"
    );
}

#[test]
fn an_image_whose_resize_would_pass_the_pixel_limits_fails_alone_in_bounded_memory() {
    use image::codecs::png::{CompressionType, FilterType, PngEncoder};
    let mut t = TestMount::new();
    dataset(&t);
    // A black 1x16384 PNG of a few hundred bytes: the guide's val pipeline (docs/GUIDE.md)
    // resizes it to 256 x 4194304 (3 GiB of pixels) before its center crop.
    let mut png = Vec::new();
    image::RgbImage::new(1, 16384)
        .write_with_encoder(PngEncoder::new_with_quality(
            &mut png,
            CompressionType::Best,
            FilterType::NoFilter,
        ))
        .expect("encode");
    fs::write(t.s("cat/tall.png"), &png).expect("write");
    const GUIDE_VAL: &str = "val=decode,resize(256),center_crop(224),normalize(imagenet)";
    let group = common::MemoryCgroup::new(512 << 20);
    t.mount_confined(&["--view", GUIDE_VAL, "--cache-mem", "64M"], &group);
    let tall = t.m(".prepfs/views/val/cat/tall.png.npy");
    let err = fs::read(&tall).expect_err("over the pixel limits");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(t.daemon_alive(), "the daemon exited");
    assert_eq!(group.oom_kills(), 0, "OOM kills in a 512 MiB cgroup");
    let good = fs::read(t.m(".prepfs/views/val/dog/img0.jpg.npy")).expect("the mount answers");
    assert_eq!(good.len(), 128 + 3 * 224 * 224 * 4);
    let stats = t.stats();
    let val = &stats["views"]["val"];
    assert_eq!(val["errors"], 1, "{val}");
    assert!(
        val["failed_files"]["cat/tall.png"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("image too large") && e.contains("256x4194304")),
        "{val}"
    );
}

/// Jobs (docs/SEMANTICS.md, "Jobs"): each job counts its own opens of a file, so the kth open of
/// a file by any job gets the same tensor (and each job a fresh one every epoch); a process of
/// another program is a job of its own, and processes naming one `PREPFS_JOB` are one job; while
/// several jobs read the view, a render one job makes is taken by another instead of rendered
/// again.
#[test]
fn each_job_counts_its_own_epochs_and_jobs_reading_together_share_renders() {
    let mut t = TestMount::new();
    dataset(&t);
    t.mount(&["--view", TRAIN]);
    let file = t.m(".prepfs/views/train/cat/img0.jpg.npy");
    let other = t.m(".prepfs/views/train/dog/img1.jpg.npy");
    // `cat` in a process of its own: a job of its own, or of `name`.
    let cat = |name: Option<&str>, path: &std::path::Path| {
        let mut cat = std::process::Command::new("cat");
        cat.arg(path);
        match name {
            Some(name) => cat.env("PREPFS_JOB", name),
            None => cat.env_remove("PREPFS_JOB"),
        };
        common::run_checked(&mut cat).stdout
    };
    let first = cat(None, &file);
    assert_eq!(
        cat(None, &file),
        first,
        "a new job's first open is its epoch 0"
    );
    let named = [cat(Some("search-1"), &file), cat(Some("search-1"), &file)];
    assert_eq!(
        named[0], first,
        "a named job across processes: its epoch 0..."
    );
    assert_ne!(
        named[1], first,
        "... then its epoch 1, a fresh augmentation"
    );
    // This test's process is one more job, with the same epochs.
    assert_eq!(fs::read(&file).expect("read"), first);
    assert_eq!(fs::read(&file).expect("read"), named[1]);
    let stats = |key: &str| t.stats()["views"]["train"][key].as_u64().expect(key);
    // Renders made for opens (prefetch may render ahead meanwhile; those are counted apart).
    let for_opens = || stats("renders") - stats("rendered_ahead");
    // Job "a" reads the view; job "b" opens the file and renders it; "a", in the same epoch of
    // the file, takes b's render.
    cat(Some("a"), &other);
    let b = cat(Some("b"), &file);
    let (renders, hits) = (for_opens(), stats("shared_hits"));
    assert_eq!(cat(Some("a"), &file), b);
    assert_eq!(b, first);
    assert_eq!(
        for_opens(),
        renders,
        "a took b's render instead of rendering"
    );
    assert_eq!(stats("shared_hits"), hits + 1);
    assert_eq!(stats("jobs_seen"), 6);
    // "a" and "b" at least read the view now (the others too, unless this test took 30 s).
    assert!(stats("jobs") >= 2);
    assert_eq!(stats("errors"), 0);
}

/// One job gets the tensors prepfs rendered before jobs counted their own opens (issue 35): with
/// `--seed 7`, the first three opens of one image by one process give, byte for byte, what the
/// build of 07b0f7a (before coordinated prep) gave for the same image, view and seed: the xxh3
/// digests below, read from that build's mount over `synthetic::photo(3)`.
#[test]
fn one_job_gets_the_tensors_it_got_before_jobs_were_told_apart() {
    const BEFORE: [u64; 3] = [0x4045a063d8801107, 0x622e8d6a1960d463, 0xe4da594b82a36098];
    let mut t = TestMount::new();
    fs::create_dir_all(t.s("cat")).expect("mkdir");
    let jpeg = prepfs::synthetic::photo(3).expect("jpeg");
    fs::write(t.s("cat/img.jpg"), jpeg).expect("write");
    t.mount(&[
        "--seed",
        "7",
        "--view",
        "g=decode,random_resized_crop(64),hflip,uint8",
    ]);
    let file = t.m(".prepfs/views/g/cat/img.jpg.npy");
    let digests: Vec<u64> = (0..3)
        .map(|_| xxhash_rust::xxh3::xxh3_64(&fs::read(&file).expect("read")))
        .collect();
    assert_eq!(digests, BEFORE);
}

/// A budget whose work and staging shares cannot hold a typical render once the never-evict
/// cache holds its own share: the mount says so when it starts.
#[test]
fn a_budget_too_small_for_renders_is_named_at_mount() {
    // What a mount of the dataset with `--cache-mem budget` says when it starts.
    let said = |budget: &str| {
        let mut t = TestMount::new();
        dataset(&t);
        let log = t.dir.path().join("mount.log");
        t.mount_logged(
            &["--view", VAL, "--cache-mem", budget],
            "warn,fuser=error",
            &log,
        );
        fs::read_to_string(&log).expect("log")
    };
    let text = said("6M");
    assert!(
        text.contains("--cache-mem 6 MiB leaves") && text.contains("for view renders"),
        "{text}"
    );
    let text = said("64M");
    assert!(!text.contains("for view renders"), "{text}");
}
