//! The Redis Cluster tier against a real cluster: three redis-servers, each in a network
//! namespace of its own on one bridge, made by tests/common/cluster.rs. Root only (namespaces,
//! veths, tc), with redis-server and redis-cli installed (./test.sh installs them). First the
//! harness itself: that it makes a working cluster, and leaves nothing behind. Then prepfs's
//! cluster tier (`--cluster`): three mounts, one per node, each in its node's namespace and its
//! own memory cgroup, over one shared source, each reading its DistributedSampler share of a
//! reshuffled dataset per epoch; a Redis node killed mid-epoch, damaged values, a full cluster.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Link};
use common::job::{self, run_epoch, total};
use common::{MemoryCgroup, TestMount, run_checked};

#[test]
fn the_harness_runs_a_three_node_cluster_in_namespaces_and_leaves_nothing_behind() {
    let cluster = Cluster::start(3, 16 << 20, Link::lan());

    // The password is in a private one-line file, and on no node's command line.
    let mode = |path: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
    };
    assert_eq!(mode(cluster.auth_file()), 0o600);
    assert_eq!(mode(cluster.dir()), 0o700);
    let password = std::fs::read_to_string(cluster.auth_file()).expect("read the auth file");
    assert_eq!(password.lines().count(), 1);
    for i in 0..3 {
        let pid = cluster.pid(i).expect("node running");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("read cmdline");
        assert!(!String::from_utf8_lossy(&cmdline).contains(password.trim()));
    }

    // Keys spread over the nodes by hash slot, written through redirects.
    for k in 0..300 {
        let reply = cluster.cli_cluster(&["SET", &format!("key:{k}"), &format!("value-{k}")]);
        assert_eq!(reply.trim(), "OK", "SET key:{k}");
    }
    assert_eq!(cluster.keys(), 300);
    for i in 0..3 {
        let size = cluster.cli(i, &["DBSIZE"]);
        assert!(
            size.trim().parse::<u64>().expect("DBSIZE") > 0,
            "node {i} holds no key"
        );
    }

    // A process put in node 0 has node 0's network, and still this process's mounts.
    let mut addrs = Command::new("ip");
    addrs.args(["-4", "-o", "addr", "show"]);
    cluster.in_node(0, &mut addrs);
    let addrs = String::from_utf8_lossy(&run_checked(&mut addrs).stdout).into_owned();
    assert!(
        addrs.contains(&format!("inet {}/24", cluster.addr(0))),
        "{addrs}"
    );
    assert!(
        !addrs.contains(&format!("inet {}/", cluster.addr(1))),
        "{addrs}"
    );
    let mut namespaces = Command::new("readlink");
    namespaces.args(["/proc/self/ns/mnt", "/proc/self/ns/net"]);
    cluster.in_node(0, &mut namespaces);
    let inside = String::from_utf8_lossy(&run_checked(&mut namespaces).stdout).into_owned();
    let own = |ns: &str| std::fs::read_link(format!("/proc/self/ns/{ns}")).expect("readlink");
    let inside: Vec<&str> = inside.lines().collect();
    assert_eq!(
        inside[0],
        own("mnt").to_string_lossy(),
        "same mount namespace"
    );
    assert_ne!(
        inside[1],
        own("net").to_string_lossy(),
        "another network namespace"
    );

    // Never evict: once a node is full, writes fail with OOM and reads go on. SETRANGE makes a
    // 1 MiB value from a short command line (one argument may not exceed 128 KiB).
    let full = (0..64).find_map(|k| {
        let reply = cluster.cli_cluster(&["SETRANGE", &format!("{{fill}}:{k}"), "1048575", "x"]);
        reply.starts_with("OOM").then_some(reply)
    });
    assert!(full.is_some(), "16 MiB nodes took 64 MiB of values");
    assert_eq!(cluster.cli_cluster(&["GET", "key:7"]).trim(), "value-7");

    // Node 0 goes on serving its own slots once node 1 is dead and marked failed.
    let own_keys = cluster.cli(0, &["KEYS", "key:*"]);
    let key = own_keys.lines().next().expect("node 0 holds a key:* key");
    let value = cluster.cli(0, &["GET", key]);
    cluster.kill_node(1);
    assert!(!cluster.node_alive(1) && cluster.node_alive(0));
    cluster.wait_until_failed(1);
    assert_eq!(cluster.cli(0, &["GET", key]), value);
    assert!(
        cluster.keys() < 300 + 64,
        "node 1's keys are no longer counted"
    );

    // Dropped, it leaves no namespace, link, process or directory.
    let names: Vec<String> = (0..3).map(|i| cluster.netns(i).to_owned()).collect();
    let bridge = cluster.bridge().to_owned();
    let pids: Vec<u32> = [0, 2].iter().filter_map(|&i| cluster.pid(i)).collect();
    let dir = cluster.dir().to_owned();
    assert_eq!(pids.len(), 2);
    drop(cluster);
    let netns =
        String::from_utf8_lossy(&run_checked(Command::new("ip").arg("netns")).stdout).into_owned();
    for name in &names {
        assert!(
            !netns.lines().any(|l| l.split(' ').next() == Some(name)),
            "{name} left: {netns}"
        );
    }
    let links =
        String::from_utf8_lossy(&run_checked(Command::new("ip").args(["-o", "link"])).stdout)
            .into_owned();
    let veth_prefix = bridge.replacen("pfb", "pfv", 1) + "-";
    assert!(
        !links.contains(&format!(" {bridge}:")),
        "bridge left: {links}"
    );
    assert!(!links.contains(&veth_prefix), "veth left: {links}");
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "redis-server {pid} left"
        );
    }
    assert!(!dir.exists(), "{} left", dir.display());
}

/// The dataset of the prepfs tests: 48 files of 1.5 MiB (two blocks each, 72 MiB in all), more
/// than a node's RAM tier holds (`--cache-mem 64M` leaves it 48 MiB): after a reshuffle each node
/// reads files it has not cached.
const FILES: usize = 48;
const FILE_LEN: usize = 3 << 19;

fn dataset(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    job::dataset(dir, FILES, FILE_LEN)
}

/// A mount of `src` on node `i` of `cluster`: in the node's network namespace (so it reaches the
/// cluster over the node's link) and its own memory cgroup, with a RAM tier smaller than the
/// dataset (`--cache-mem 64M`, unless `extra` gives another). Lookups may
/// take a second (not the default 50 ms): on this shared 2-core machine a busy moment would
/// otherwise turn hits into timeouts and make the counts below vary.
fn node_mount(
    cluster: &Cluster,
    i: usize,
    src: &Path,
    group: &MemoryCgroup,
    extra: &[&str],
) -> TestMount {
    let mut mount = TestMount::new();
    mount.src = src.to_owned();
    mount.keep_times = true;
    let urls = cluster.urls();
    let auth = cluster.auth_file().to_string_lossy().into_owned();
    let flags = [
        "--cluster",
        &urls,
        "--cluster-auth",
        &auth,
        "--cluster-timeout",
        "1s",
    ];
    let default_mem = ["--cache-mem", "64M"];
    let mem = if extra.contains(&"--cache-mem") {
        &[][..]
    } else {
        &default_mem[..]
    };
    let flags: Vec<&str> = flags.iter().chain(mem).chain(extra).copied().collect();
    mount.mount_prepared(&flags, |command| {
        cluster.in_node(i, command);
        group.confine(command);
    });
    mount
}

/// The blocks' values the live nodes hold, by their keys (a value too large for one of Redis's
/// allocation classes has a second key, `<key>:t`, not counted).
fn value_keys(cluster: &Cluster, nodes: &[usize]) -> Vec<String> {
    nodes
        .iter()
        .flat_map(|&i| {
            let listed = cluster.cli(i, &["--scan", "--pattern", "prepfs:*"]);
            listed
                .lines()
                .filter(|k| !k.ends_with(":t"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn values(cluster: &Cluster) -> u64 {
    value_keys(cluster, &[0, 1, 2]).len() as u64
}

/// Waits until the cluster holds `keys` values (the mounts' writers send offers in the
/// background, after the reads that fetched them).
fn wait_for_values(cluster: &Cluster, keys: u64, mounts: &[TestMount]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while values(cluster) < keys {
        assert!(
            Instant::now() < deadline,
            "the cluster holds {} values, not {keys}; the mounts' figures: {:?}",
            values(cluster),
            mounts
                .iter()
                .map(|m| (m.stats()["cluster"].clone(), m.stats()["memory"].clone()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The number of values the cluster holds once the mounts' writers are idle (unchanged for 1 s).
fn settled_values(cluster: &Cluster) -> u64 {
    let mut last = (values(cluster), Instant::now());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let keys = values(cluster);
        if keys != last.0 {
            last = (keys, Instant::now());
        } else if last.1.elapsed() >= Duration::from_secs(1) {
            return keys;
        }
        assert!(Instant::now() < deadline, "the writers never went idle");
    }
}

#[test]
fn three_nodes_read_the_source_once_between_them_and_a_dead_redis_node_costs_only_misses() {
    let cluster = Cluster::start(3, 64 << 20, Link::lan());
    let source = tempfile::tempdir().expect("tempdir");
    let files = dataset(source.path());
    let groups: Vec<MemoryCgroup> = (0..3).map(|_| MemoryCgroup::new(256 << 20)).collect();
    let mounts: Vec<TestMount> = (0..3)
        .map(|i| node_mount(&cluster, i, source.path(), &groups[i], &[]))
        .collect();
    let dataset_bytes = (FILES * FILE_LEN) as u64;
    let blocks = 2 * FILES as u64;
    let read = AtomicUsize::new(0);

    // Epoch 1: every block comes from the source once, and is offered to the cluster.
    let first = run_epoch(&mounts, &files, 1, &read);
    assert_eq!(first.failures, Vec::<String>::new());
    assert!(total(&mounts, "source.bytes_read") >= dataset_bytes);
    wait_for_values(&cluster, blocks, &mounts);
    assert_eq!(
        total(&mounts, "cluster.writes"),
        blocks,
        "each block stored once"
    );

    // Epoch 2, reshuffled: each node reads mostly other files than in epoch 1, which its own RAM
    // tier lacks; the cluster holds them all, so the source is read no more.
    let before = total(&mounts, "source.bytes_read");
    let second = run_epoch(&mounts, &files, 2, &read);
    assert_eq!(second.failures, Vec::<String>::new());
    assert_eq!(
        total(&mounts, "source.bytes_read") - before,
        0,
        "with the whole dataset in the cluster, no source reads after epoch 1"
    );
    assert!(total(&mounts, "cluster.hits") > 0);
    assert_eq!(total(&mounts, "cluster.corrupt"), 0);

    // Epoch 3: one Redis node is killed a third of the way in. Its blocks come from the source
    // again; no read fails or returns other bytes, none waits past the timeout plus a source
    // read (bounded here by seconds: a hang would take the test's whole time).
    let before = total(&mounts, "source.bytes_read");
    read.store(0, Ordering::SeqCst);
    let third = std::thread::scope(|s| {
        let readers = s.spawn(|| run_epoch(&mounts, &files, 3, &read));
        while read.load(Ordering::SeqCst) < FILES / 3 && !readers.is_finished() {
            std::thread::sleep(Duration::from_millis(1));
        }
        cluster.kill_node(1);
        readers.join().expect("readers")
    });
    assert_eq!(third.failures, Vec::<String>::new());
    assert!(
        third.slowest < Duration::from_secs(5),
        "a read took {:?}",
        third.slowest
    );
    let mut all_alive = true;
    let mut mounts = mounts;
    for m in &mut mounts {
        all_alive &= m.daemon_alive();
    }
    assert!(all_alive, "every mount still serves");
    let failed = total(&mounts, "cluster.errors") + total(&mounts, "cluster.timeouts");
    assert!(failed > 0, "the dead node was asked and failed");
    assert!(
        total(&mounts, "source.bytes_read") > before,
        "the dead node's blocks came from the source"
    );
    // And the epoch after: still every byte right, the dead node backing off.
    let fourth = run_epoch(&mounts, &files, 4, &read);
    assert_eq!(fourth.failures, Vec::<String>::new());
    for g in &groups {
        assert_eq!(g.oom_kills(), 0);
    }
}

#[test]
fn damaged_cluster_values_are_refetched_and_replaced() {
    let cluster = Cluster::start(3, 64 << 20, Link::lan());
    let source = tempfile::tempdir().expect("tempdir");
    let files = dataset(source.path());
    let groups: Vec<MemoryCgroup> = (0..3).map(|_| MemoryCgroup::new(384 << 20)).collect();
    let read = AtomicUsize::new(0);
    // Node 0 reads everything alone. Its offers queue for two writers while a local disk serves
    // the reads far faster than a Redis node takes them, so some are dropped (counted): the
    // cluster holds what was stored.
    let first = [node_mount(&cluster, 0, source.path(), &groups[0], &[])];
    assert_eq!(
        run_epoch(&first, &files, 1, &read).failures,
        Vec::<String>::new()
    );
    let stored = settled_values(&cluster);
    assert!(stored >= 3, "{stored} values stored");
    assert_eq!(stored, total(&first, "cluster.writes"));

    // Three values damaged three ways: a flipped payload byte, another program's value, and a
    // value cut short.
    let keys = value_keys(&cluster, &[0, 1, 2]);
    assert_eq!(keys.len() as u64, stored, "{keys:?}");
    cluster.cli_cluster(&["SETRANGE", &keys[0], "100", "XXXX"]);
    cluster.cli_cluster(&["SET", &keys[1], "not a prepfs value"]);
    cluster.cli_cluster(&[
        "EVAL",
        "return redis.call('SET', KEYS[1], string.sub(redis.call('GET', KEYS[1]), 1, 1000))",
        "1",
        &keys[2],
    ]);

    // A node with an empty RAM tier large enough for the dataset reads everything (without
    // prefetch, so each block is looked up once): the damaged values are caught and their blocks
    // read from the source, as are the blocks the cluster lacks; every byte is right.
    let second = [node_mount(
        &cluster,
        1,
        source.path(),
        &groups[1],
        &["--no-prefetch", "--cache-mem", "160M"],
    )];
    assert_eq!(
        run_epoch(&second, &files, 2, &read).failures,
        Vec::<String>::new()
    );
    let blocks = 2 * FILES as u64;
    assert_eq!(total(&second, "cluster.corrupt"), 3);
    assert_eq!(total(&second, "cluster.hits"), stored - 3);
    assert_eq!(
        total(&second, "source.reads"),
        blocks - (stored - 3),
        "the source read only what the cluster lacked or had damaged"
    );

    // Their next offer replaced the damaged values: a third node finds every value intact.
    let stored = settled_values(&cluster);
    let third = [node_mount(
        &cluster,
        2,
        source.path(),
        &groups[2],
        &["--no-prefetch", "--cache-mem", "160M"],
    )];
    assert_eq!(
        run_epoch(&third, &files, 3, &read).failures,
        Vec::<String>::new()
    );
    assert_eq!(total(&third, "cluster.corrupt"), 0);
    assert_eq!(
        total(&third, "cluster.hits"),
        stored,
        "{:?}",
        third[0].stats()["cache"]
    );
}

#[test]
fn a_full_cluster_refuses_blocks_and_never_fails_a_read() {
    // 6 MiB nodes: about a third of the dataset fits; Redis refuses the rest (noeviction).
    let cluster = Cluster::start(3, 6 << 20, Link::lan());
    let source = tempfile::tempdir().expect("tempdir");
    let files = dataset(source.path());
    let group = MemoryCgroup::new(256 << 20);
    let read = AtomicUsize::new(0);
    // Node 0 reads everything first: the cluster takes what fits and refuses the rest.
    let first = [node_mount(&cluster, 0, source.path(), &group, &[])];
    assert_eq!(
        run_epoch(&first, &files, 1, &read).failures,
        Vec::<String>::new()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while total(&first, "cluster.refused") == 0 {
        assert!(
            Instant::now() < deadline,
            "the full cluster never refused a block"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Node 1 reads it for three epochs: what the cluster holds is used, the rest comes from the
    // source, no read fails.
    let second = [node_mount(&cluster, 1, source.path(), &group, &[])];
    for epoch in 2..=4 {
        assert_eq!(
            run_epoch(&second, &files, epoch, &read).failures,
            Vec::<String>::new()
        );
    }
    assert!(total(&second, "cluster.hits") > 0, "what it holds is used");
    assert!(
        total(&second, "source.bytes_read") > 0,
        "what it refused is not"
    );
    assert_eq!(
        total(&first, "cluster.errors") + total(&second, "cluster.errors"),
        0
    );
    assert!(values(&cluster) < 2 * FILES as u64);
}

#[test]
fn cluster_options_are_checked_before_mounting_and_an_unreachable_cluster_costs_nothing() {
    let mut mount = TestMount::new();
    let files = dataset(&mount.src);
    let auth = mount.dir.path().join("auth");
    std::fs::write(&auth, "secret\n").expect("write auth");
    let refused = |flags: &[&str], says: &str| {
        let out = common::prepfs()
            .arg("mount")
            .arg(&mount.src)
            .arg(&mount.mnt)
            .args(flags)
            .output()
            .expect("run prepfs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    };
    refused(&["--cluster", "node1:7000"], "a node is redis://HOST:PORT");
    refused(
        &["--cluster", "redis://user:secret@10.0.0.1:7000"],
        "no credentials in the address",
    );
    refused(
        &[
            "--cluster",
            "redis://10.0.0.1:7000",
            "--cluster-timeout",
            "1ms",
        ],
        "--cluster-timeout",
    );
    let auth_text = auth.to_string_lossy().into_owned();
    refused(
        &[
            "--cluster",
            "redis://10.0.0.1:7000",
            "--cluster-auth",
            &auth_text,
        ],
        "chmod 600",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    // Nothing listens at either address (two -o entries make one list): the mount serves every
    // byte from the source, and counts what the cluster could not do.
    mount.mount(&[
        "-o",
        "cluster=redis://127.0.0.1:1,cluster=redis://127.0.0.1:2",
        "--cluster-auth",
        &auth_text,
    ]);
    let read = AtomicUsize::new(0);
    let mounts = [mount];
    for epoch in 1..=2 {
        assert_eq!(
            run_epoch(&mounts, &files, epoch, &read).failures,
            Vec::<String>::new()
        );
    }
    let stats = mounts[0].stats();
    assert_eq!(stats["cluster"]["hits"], 0);
    assert_eq!(stats["cluster"]["nodes"], 0, "no slot map was ever read");
    let failed = total(&mounts, "cluster.errors") + total(&mounts, "cluster.skipped");
    assert!(failed > 0, "{:?}", stats["cluster"]);
}
