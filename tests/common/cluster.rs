//! A real Redis Cluster on this one machine, for the cluster-tier tests: one Linux bridge in the
//! root network namespace and, per node, a network namespace joined to it by a shaped veth pair,
//! with one `redis-server` listening inside (port 7000 on the node's own 10.x address). It owns
//! those namespaces, links and processes and a temporary directory (configs, node logs, the
//! password file) and removes all of them on drop, panics included. It must never touch what it
//! did not create (leftovers of dead runs of this same naming scheme excepted), never use
//! 127.0.0.1 or a subnet the host already routes (Debian's own redis-server may listen on
//! 127.0.0.1:6379), and never put the password on a command line. Root only. Test code: it
//! panics, with the nodes' logs, on what a test cannot go on without.
//!
//! Addresses: each Cluster gets a /24 of its own, 10.(100+x).y.0/24, chosen under a lock file
//! among those no interface or route of the root namespace uses yet. Node i is 10.(100+x).y.(i+1)
//! and the bridge, the root namespace's side, is 10.(100+x).y.254, so the test process reaches
//! every node directly. Names carry this process's pid and a per-process counter: namespaces
//! `prepfs-cluster-PID-N-I`, bridge `pfbPIDHEX-NHEX`, root-side veths `pfvPIDHEX-NHEX-I` (the
//! namespace side is `eth0`), directory `$TMPDIR/prepfs-cluster-PID-N-*`.
//!
//! Links: each node's egress carries the link's delay and rate (netem), and its ingress (the
//! bridge side of its veth) the rate (tbf), so node-to-node traffic crosses one delay per
//! direction. A kernel without netem (as on the machine this was written on) gets tbf's rate
//! alone; `delayed` says which. A host whose firewall filters bridged traffic (br_netfilter with
//! a FORWARD policy of DROP, as Docker sets) drops node-to-node traffic: the nodes never agree.

#![allow(dead_code)]

use std::ffi::CString;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::{described, run_checked};

/// Every node's port (each listens on its own address, so they can share it).
pub const PORT: u16 = 7000;

/// Prefix of the namespaces and temporary directories: `prepfs-cluster-PID-...`.
const PREFIX: &str = "prepfs-cluster-";

/// Prefix of the bridges (`pfb`) and root-side veths (`pfv`), short for 15-byte interface names.
const LINK_PREFIXES: [&str; 2] = ["pfb", "pfv"];

/// Serialises subnet choice and leftover removal between processes (a root-only harness, so /run).
const LOCK_FILE: &str = "/run/prepfs-cluster.lock";

/// How many /24s the clusters draw from: 10.100.0.0 to 10.255.255.0, clear of the 10.0-10.99
/// ranges that VPNs and container runtimes commonly take.
const SUBNETS: u32 = 156 * 256;

/// How long a node may take to listen, and the nodes to agree on one cluster: generous for a
/// loaded 2-core machine, and only reached when something is broken.
const WAIT: Duration = Duration::from_secs(20);

/// One node's network link: what tc makes of each veth.
#[derive(Clone, Copy, Debug)]
pub struct Link {
    /// Bandwidth in each direction, Mbit/s.
    pub rate_mbit: u32,
    /// Delay added to every packet a node sends, microseconds (needs netem in the kernel).
    pub delay_us: u32,
}

impl Link {
    /// A data-centre LAN: 1 Gbit/s, 200 µs per direction.
    pub fn lan() -> Link {
        Link {
            rate_mbit: 1000,
            delay_us: 200,
        }
    }
}

/// A running Redis Cluster of `nodes` masters (no replicas), each in its own network namespace.
pub struct Cluster {
    dir: tempfile::TempDir,
    password: String,
    auth_file: PathBuf,
    bridge: String,
    host: Ipv4Addr,
    netns: Vec<String>,
    veths: Vec<String>,
    addrs: Vec<Ipv4Addr>,
    servers: Mutex<Vec<Option<Child>>>,
    delayed: bool,
}

impl Cluster {
    /// Starts `nodes` (3 to 9) redis-servers of `maxmemory` bytes each (noeviction), linked by
    /// `link`, forms them into one cluster and waits until every node says `cluster_state:ok`.
    pub fn start(nodes: usize, maxmemory: u64, link: Link) -> Cluster {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        assert!(
            (3..=9).contains(&nodes),
            "a Redis Cluster needs 3 masters; names allow up to 9 nodes"
        );
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{pid}-{n}-"))
            .tempdir()
            .expect("a temporary directory for the cluster");
        // Private: it holds the password (tempfile leaves the umask's mode, 0755 here).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod 0700 the cluster's directory");
        let password = random_hex(16);
        let auth_file = dir.path().join("auth");
        write_private(&auth_file, &format!("{password}\n"));
        let bridge = format!("{}{pid:x}-{n:x}", LINK_PREFIXES[0]);
        assert!(bridge.len() + 2 <= 15, "interface names too long: {bridge}");
        let mut cluster = Cluster {
            dir,
            password,
            auth_file,
            bridge: String::new(),
            host: Ipv4Addr::UNSPECIFIED,
            netns: Vec::new(),
            veths: Vec::new(),
            addrs: Vec::new(),
            servers: Mutex::new(Vec::new()),
            delayed: false,
        };
        // From here on a panic drops `cluster`, which removes whatever was made so far.
        let subnet = {
            let lock = std::fs::File::create(LOCK_FILE).expect("open the cluster lock file");
            lock.lock().expect("lock the cluster lock file");
            remove_leftovers();
            let subnet = free_subnet(pid.wrapping_mul(64).wrapping_add(n));
            ip(&["link", "add", &bridge, "type", "bridge"]);
            cluster.bridge = bridge.clone();
            cluster.host = with_host(subnet, 254);
            let cidr = format!("{}/24", cluster.host);
            ip(&["addr", "add", &cidr, "dev", &bridge]);
            ip(&["link", "set", &bridge, "up"]);
            subnet
        };
        for i in 0..nodes {
            cluster.add_node(pid, n, i, with_host(subnet, i as u8 + 1), link);
        }
        for i in 0..nodes {
            cluster.start_server(i, maxmemory);
        }
        for i in 0..nodes {
            cluster.wait_listening(i);
        }
        let mut create = cluster.redis_cli();
        create.args(["--cluster", "create"]);
        create.args(cluster.addrs.iter().map(|a| format!("{a}:{PORT}")));
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = create
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        if !out.status.success() {
            panic!("{}\n{}", described(&create, &out), cluster.logs());
        }
        cluster.wait_for("every node to say cluster_state:ok", |c| {
            (0..c.addrs.len()).all(|i| {
                c.try_cli(i, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.lines().any(|l| l.trim() == "cluster_state:ok"))
            })
        });
        cluster
    }

    /// The nodes as `prepfs mount --cluster` takes them: `redis://A1:7000,redis://A2:7000,...`.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self
            .addrs
            .iter()
            .map(|a| format!("redis://{a}:{PORT}"))
            .collect();
        urls.join(",")
    }

    /// The file holding the nodes' password: one line, mode 0600.
    pub fn auth_file(&self) -> &Path {
        &self.auth_file
    }

    /// Node `i`'s address (it listens on port `PORT`).
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        self.addrs[i]
    }

    /// The root namespace's address on the bridge: where the test process's connections to the
    /// nodes come from.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host
    }

    /// Node `i`'s network namespace, as `ip netns` names it (/run/netns/NAME).
    pub fn netns(&self, i: usize) -> &str {
        &self.netns[i]
    }

    /// The bridge joining the nodes, in the root network namespace.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The directory the cluster owns: node configs, `nodeI.log` logs, the password file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the links carry `Link::delay_us` (netem); false where the kernel has no netem
    /// and they are rate-limited only.
    pub fn delayed(&self) -> bool {
        self.delayed
    }

    /// Makes `command` run inside node `i`'s network namespace, and only that: it keeps this
    /// process's mount namespace, so a FUSE mount it makes is visible to the test. Its program
    /// and arguments stay as given, and it composes with `MemoryCgroup::confine`. End such a
    /// process before the Cluster drops: while it runs, its namespace and veth live on.
    pub fn in_node(&self, i: usize, command: &mut Command) {
        use std::os::unix::process::CommandExt;
        let path = CString::new(format!("/run/netns/{}", self.netns[i]))
            .expect("namespace path without NUL");
        // SAFETY: between fork and exec only async-signal-safe calls are made (open, setns,
        // close, reading errno) on a path prepared before the fork.
        unsafe {
            command.pre_exec(move || {
                let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let entered = libc::setns(fd, libc::CLONE_NEWNET);
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                if entered != 0 {
                    return Err(error);
                }
                Ok(())
            });
        }
    }

    /// Kills node `i`'s redis-server with SIGKILL and waits until it is gone. The other nodes
    /// mark it failed after cluster-node-timeout (2 s): `wait_until_failed` waits for that.
    pub fn kill_node(&self, i: usize) {
        let mut servers = self.servers.lock().expect("servers lock");
        if let Some(mut child) = servers[i].take() {
            let _ = child.kill();
            child.wait().expect("wait for the killed redis-server");
        }
    }

    /// Whether node `i`'s redis-server is still running.
    pub fn node_alive(&self, i: usize) -> bool {
        let mut servers = self.servers.lock().expect("servers lock");
        servers[i]
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Node `i`'s redis-server process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        let servers = self.servers.lock().expect("servers lock");
        servers[i].as_ref().map(Child::id)
    }

    /// Waits until every live node's `CLUSTER NODES` marks node `i` as failed.
    pub fn wait_until_failed(&self, i: usize) {
        let wanted = format!("{}:{PORT}@", self.addrs[i]);
        self.wait_for(&format!("the live nodes to mark node {i} failed"), |c| {
            (0..c.addrs.len())
                .filter(|&j| j != i && c.node_alive(j))
                .all(|j| {
                    c.try_cli(j, &["CLUSTER", "NODES"]).is_ok_and(|nodes| {
                        // "<id> <addr:port@bus> <flags> ...", flags as "master,fail".
                        nodes.lines().any(|l| {
                            let fields: Vec<&str> = l.split(' ').collect();
                            fields.len() > 2
                                && fields[1].starts_with(&wanted)
                                && fields[2].split(',').any(|f| f == "fail")
                        })
                    })
                })
        });
    }

    /// Runs `redis-cli ARGS` against node `i` alone (no redirects) and returns its stdout, where
    /// error replies appear too (`MOVED ...`, `OOM ...`). Panics if redis-cli fails (node down).
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        let mut command = self.node_cli(i);
        command.args(args);
        String::from_utf8_lossy(&run_checked(&mut command).stdout).into_owned()
    }

    /// Like `cli`, in cluster mode (`-c`) through the first live node, so it follows redirects.
    pub fn cli_cluster(&self, args: &[&str]) -> String {
        let first = (0..self.addrs.len())
            .find(|&i| self.node_alive(i))
            .expect("a live node");
        let mut command = self.node_cli(first);
        command.arg("-c").args(args);
        String::from_utf8_lossy(&run_checked(&mut command).stdout).into_owned()
    }

    /// Node `i`'s `used_memory` (INFO memory), bytes.
    pub fn used_memory(&self, i: usize) -> u64 {
        let info = self.cli(i, &["INFO", "memory"]);
        info.lines()
            .find_map(|l| l.trim().strip_prefix("used_memory:"))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no used_memory in node {i}'s INFO memory:\n{info}"))
    }

    /// Keys held by the live nodes together (their DBSIZEs summed).
    pub fn keys(&self) -> u64 {
        (0..self.addrs.len())
            .filter(|&i| self.node_alive(i))
            .map(|i| {
                let size = self.cli(i, &["DBSIZE"]);
                size.trim()
                    .parse::<u64>()
                    .unwrap_or_else(|_| panic!("node {i}'s DBSIZE: {size}"))
            })
            .sum()
    }

    /// The last lines of every node's log, each headed by its node, for a failure message.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for i in 0..self.netns.len() {
            for (what, file) in [("output", "out"), ("log", "log")] {
                let text = std::fs::read_to_string(self.dir().join(format!("node{i}.{file}")))
                    .unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(40)..];
                all += &format!("--- node {i} ({}) {what} ---\n", self.addrs[i]);
                for line in tail {
                    all += line;
                    all.push('\n');
                }
            }
        }
        all
    }

    /// Makes node `i`: its namespace, a veth pair from the bridge into it, its address, shaping.
    fn add_node(&mut self, pid: u32, n: u32, i: usize, addr: Ipv4Addr, link: Link) {
        let netns = format!("{PREFIX}{pid}-{n}-{i}");
        ip(&["netns", "add", &netns]);
        self.netns.push(netns.clone());
        let veth = format!("{}{pid:x}-{n:x}-{i}", LINK_PREFIXES[1]);
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ]);
        self.veths.push(veth.clone());
        self.addrs.push(addr);
        ip(&["link", "set", &veth, "master", &self.bridge, "up"]);
        let cidr = format!("{addr}/24");
        ip(&["-n", &netns, "addr", "add", &cidr, "dev", "eth0"]);
        ip(&["-n", &netns, "link", "set", "eth0", "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        // tbf: a burst of 1 ms at the rate (at least 64 KiB, one GSO packet), at most 50 ms queued.
        let rate = format!("{}mbit", link.rate_mbit);
        let burst = (u64::from(link.rate_mbit) * 1_000_000 / 8 / 1000).max(64 * 1024);
        let burst = burst.to_string();
        let tbf = ["tbf", "rate", &rate, "burst", &burst, "latency", "50ms"];
        let delay = format!("{}us", link.delay_us);
        let netem = ["netem", "delay", &delay, "rate", &rate, "limit", "10000"];
        set_qdisc(None, &veth, &tbf);
        self.delayed = link.delay_us > 0 && try_set_qdisc(Some(&netns), "eth0", &netem).is_ok();
        if !self.delayed {
            if link.delay_us > 0 && i == 0 {
                eprintln!(
                    "cluster: no netem qdisc in this kernel: links get {} Mbit/s without their {} µs delay",
                    link.rate_mbit, link.delay_us
                );
            }
            set_qdisc(Some(&netns), "eth0", &tbf);
        }
    }

    /// Writes node `i`'s config (0600) and starts its redis-server inside its namespace.
    fn start_server(&mut self, i: usize, maxmemory: u64) {
        let dir = self.dir.path();
        let config = dir.join(format!("node{i}.conf"));
        write_private(
            &config,
            &format!(
                "bind {addr}\n\
                 port {PORT}\n\
                 dir {dir}\n\
                 logfile {dir}/node{i}.log\n\
                 cluster-enabled yes\n\
                 cluster-config-file {dir}/nodes{i}.conf\n\
                 cluster-node-timeout 2000\n\
                 cluster-require-full-coverage no\n\
                 cluster-allow-reads-when-down yes\n\
                 maxmemory {maxmemory}\n\
                 maxmemory-policy noeviction\n\
                 save \"\"\n\
                 appendonly no\n\
                 daemonize no\n\
                 protected-mode no\n\
                 requirepass {password}\n\
                 masterauth {password}\n",
                addr = self.addrs[i],
                dir = dir.display(),
                password = self.password,
            ),
        );
        // What redis-server says before its logfile is open (a bad config line) lands here.
        let out = dir.join(format!("node{i}.out"));
        let out = std::fs::File::create(out).expect("create the node's output file");
        let mut command = Command::new("redis-server");
        command
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone node output"))
            .stderr(out);
        self.in_node(i, &mut command);
        let child = command.spawn().expect("spawn redis-server");
        self.servers.lock().expect("servers lock").push(Some(child));
    }

    /// Waits until node `i` accepts TCP connections.
    fn wait_listening(&self, i: usize) {
        let at = SocketAddr::from((self.addrs[i], PORT));
        self.wait_for(&format!("node {i} to listen on {at}"), |c| {
            assert!(
                c.node_alive(i),
                "node {i}'s redis-server exited\n{}",
                c.logs()
            );
            TcpStream::connect_timeout(&at, Duration::from_millis(200)).is_ok()
        });
    }

    /// Polls `done` until it holds; panics with the nodes' logs after `WAIT`.
    fn wait_for(&self, what: &str, mut done: impl FnMut(&Cluster) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done(self) {
            if Instant::now() > deadline {
                panic!(
                    "the cluster timed out waiting for {what} ({} s)\n{}",
                    WAIT.as_secs(),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// redis-cli with the password in its environment (never on its command line).
    fn redis_cli(&self) -> Command {
        let mut command = Command::new("redis-cli");
        command.env("REDISCLI_AUTH", &self.password);
        command
    }

    /// redis-cli aimed at node `i`.
    fn node_cli(&self, i: usize) -> Command {
        let mut command = self.redis_cli();
        command.args(["-h", &self.addrs[i].to_string(), "-p", &PORT.to_string()]);
        command
    }

    /// `cli` that reports a failed redis-cli instead of panicking.
    fn try_cli(&self, i: usize, args: &[&str]) -> Result<String, String> {
        let mut command = self.node_cli(i);
        command.args(args).stdin(Stdio::null());
        let out = command
            .output()
            .map_err(|e| format!("cannot run {command:?}: {e}"))?;
        if !out.status.success() {
            return Err(described(&command, &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        for child in servers.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        // Deleting the root-side veth deletes its pair even while a process keeps the
        // namespace alive; the namespaces' names go next, then the bridge.
        for veth in &self.veths {
            let _ = quiet("ip", &["link", "del", veth]);
        }
        for netns in &self.netns {
            let _ = quiet("ip", &["netns", "del", netns]);
        }
        if !self.bridge.is_empty() {
            let _ = quiet("ip", &["link", "del", &self.bridge]);
        }
    }
}

/// Removes what earlier runs of this scheme left behind when their process died without
/// dropping its Cluster (killed, or aborted): processes in their namespaces, the namespaces,
/// their links and temporary directories. Live processes' clusters are left alone.
fn remove_leftovers() {
    let dead = |pid: Option<u32>| pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists());
    let pid_of = |rest: &str, radix: u32| {
        rest.split('-')
            .next()
            .and_then(|p| u32::from_str_radix(p, radix).ok())
    };
    for entry in std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        if dead(pid_of(rest, 10)) {
            let pids = quiet("ip", &["netns", "pids", &name]).unwrap_or_default();
            for pid in pids
                .lines()
                .filter_map(|p| p.trim().parse::<libc::pid_t>().ok())
            {
                // SAFETY: kill(2) has no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = quiet("ip", &["netns", "del", &name]);
        }
    }
    let links = quiet("ip", &["-o", "link", "show"]).unwrap_or_default();
    for line in links.lines() {
        // "7: pfv1a2b-0-1@if2: <...": the name, without its "@peer".
        let Some(name) = line.split(": ").nth(1).and_then(|n| n.split('@').next()) else {
            continue;
        };
        let ours = LINK_PREFIXES
            .iter()
            .find_map(|prefix| name.strip_prefix(prefix));
        if ours.is_some_and(|rest| rest.contains('-') && dead(pid_of(rest, 16))) {
            let _ = quiet("ip", &["link", "del", name]);
        }
    }
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name
            .strip_prefix(PREFIX)
            .is_some_and(|rest| dead(pid_of(rest, 10)))
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The first 10.(100+x).y.0/24 from `seed` on that no address or route of the root namespace
/// overlaps (other clusters' bridges included), as its first three octets.
fn free_subnet(seed: u32) -> [u8; 3] {
    let routes = quiet("ip", &["-4", "-o", "route", "show", "table", "all"]).unwrap_or_default();
    let addrs = quiet("ip", &["-4", "-o", "addr", "show"]).unwrap_or_default();
    let route_nets = routes.lines().filter_map(|l| {
        let mut words = l.split_whitespace();
        let first = words.next()?;
        let dest = if first.parse::<Ipv4Addr>().is_ok() || first.contains('/') {
            first
        } else {
            words.next()? // a route type first: "local 127.0.0.1 dev lo ..."
        };
        parse_net(dest)
    });
    let addr_nets = addrs.lines().filter_map(|l| {
        let mut words = l.split_whitespace();
        words.find(|w| *w == "inet")?;
        parse_net(words.next()?)
    });
    let taken: Vec<(u32, u32)> = route_nets.chain(addr_nets).collect();
    (0..SUBNETS)
        .map(|k| (seed.wrapping_add(k)) % SUBNETS)
        .map(|s| [10, (100 + s / 256) as u8, (s % 256) as u8])
        .find(|o| {
            let net = u32::from_be_bytes([o[0], o[1], o[2], 0]);
            !taken.iter().any(|&(other, len)| {
                let mask = u32::MAX.checked_shl(32 - len.min(24)).unwrap_or(0);
                net & mask == other & mask
            })
        })
        .expect("a free /24 in 10.100.0.0-10.255.255.0")
}

/// "10.1.2.0/24" or "10.1.2.3" (a /32) as (address, prefix length); None for "default" and
/// anything else.
fn parse_net(text: &str) -> Option<(u32, u32)> {
    let (addr, len) = text.split_once('/').unwrap_or((text, "32"));
    let len: u32 = len.parse().ok().filter(|&l| (1..=32).contains(&l))?;
    Some((u32::from(addr.parse::<Ipv4Addr>().ok()?), len))
}

/// The address `host` within the /24 `subnet`.
fn with_host(subnet: [u8; 3], host: u8) -> Ipv4Addr {
    Ipv4Addr::new(subnet[0], subnet[1], subnet[2], host)
}

/// Runs `ip ARGS`, panicking with its output if it fails.
fn ip(args: &[&str]) {
    run_checked(Command::new("ip").args(args));
}

/// Makes `qdisc` the root qdisc of `dev` (in namespace `netns` if given), or panics.
fn set_qdisc(netns: Option<&str>, dev: &str, qdisc: &[&str]) {
    try_set_qdisc(netns, dev, qdisc).unwrap_or_else(|e| panic!("{e}"));
}

/// Makes `qdisc` the root qdisc of `dev` (in namespace `netns` if given); tc's complaint if it
/// refuses (an unknown qdisc kind, say).
fn try_set_qdisc(netns: Option<&str>, dev: &str, qdisc: &[&str]) -> Result<(), String> {
    let mut command = Command::new("tc");
    if let Some(netns) = netns {
        command.args(["-n", netns]);
    }
    command
        .args(["qdisc", "add", "dev", dev, "root"])
        .args(qdisc);
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if !out.status.success() {
        return Err(described(&command, &out));
    }
    Ok(())
}

/// Runs `program ARGS` and returns its stdout if it exited 0.
fn quiet(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `bytes` random bytes from the kernel, as hex.
fn random_hex(bytes: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("read /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates `path` with mode 0600 and writes `text` to it.
fn write_private(path: &Path, text: &str) {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}
