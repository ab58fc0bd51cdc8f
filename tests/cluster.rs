//! The Redis Cluster tier against a real cluster: three redis-servers, each in a network
//! namespace of its own on one bridge, made by tests/common/cluster.rs. Root only (namespaces,
//! veths, tc), with redis-server and redis-cli installed (./test.sh installs them). First the
//! harness itself: that it makes a working cluster, and leaves nothing behind.

mod common;

use std::process::Command;

use common::cluster::{Cluster, Link};
use common::run_checked;

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
