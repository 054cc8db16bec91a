//! Hosts for tests: each a network, pid and mount namespace of its own (sysfs and /proc
//! mounted anew, so the plugin sees that host's interfaces only), joined to the others by
//! veth pairs: one pair between two hosts, a bridge in a namespace of its own for more.
//! Each host has one interface, `eth0` (a veth), with an IPv4 and an IPv6 address on that link and
//! no route anywhere else, and `lo` up beside it, as a real host has.
//!
//! A host lives as long as its holder process (`unshare … cat`, pid 1 of the host's pid
//! namespace), which reads a pipe from the test: whatever ends the test, even SIGKILL,
//! closes the pipe, the holder exits, the kernel kills every process of the host and
//! deletes its namespace and its interfaces. Nothing is named in /run/netns, so nothing can
//! be left behind. Ranks run inside a host through `nsenter`, with a parent-death signal so
//! that killing the rank's `nsenter` kills the rank.

use super::*;
use nccl_net_fabric::nccl::NET_HANDLE_MAXSIZE;
use nccl_net_host::{handle_from_hex, handle_to_hex, PluginLib, Ptr};
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};

/// The interface every host has towards the others: a veth, named as containers name theirs
/// (the plugin leaves `veth*` out by default: those are the host-side ends of containers).
pub const IFACE: &str = "eth0";

/// A TCP connection of a host: its ports here and at the other end, and what it sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    pub local: u16,
    pub remote: u16,
    pub bytes_sent: u64,
}

/// One host: its holder process and the address of its `eth0`.
pub struct Host {
    holder: Child,
    /// The holder's pid as this (the root) pid namespace sees it.
    pid: u32,
    pub addr: Ipv4Addr,
    pub index: usize,
}

/// Whether this machine can make hosts: root, with `unshare`, `nsenter` and `ip`.
pub fn available() -> Result<(), String> {
    for tool in ["unshare", "nsenter", "ip", "setpriv"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Err(format!(
                "{tool} not found (scripts/setup-debian.sh installs it)"
            ));
        }
    }
    let ok = Command::new("unshare")
        .args(["--net", "--pid", "--mount", "--fork", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Err("unshare --net --pid --mount is not permitted (run as root)".into());
    }
    Ok(())
}

/// Runs `ip` (or another command) in `pid`'s network namespace; panics with its output if
/// it fails.
fn in_netns(pid: u32, args: &[&str]) {
    let out = run_command(
        Command::new("nsenter")
            .args(["--target", &pid.to_string(), "--net", "--"])
            .args(args),
        Duration::from_secs(10),
    );
    assert!(
        out.status.success(),
        "{args:?} in the namespace of {pid} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts a holder in new network, pid and mount namespaces; returns it and its pid.
fn holder() -> (Child, u32) {
    let mut child = Command::new("unshare")
        .args([
            "--net",
            "--pid",
            "--mount",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--propagation",
            "private",
            "sh",
            "-c",
            // sysfs of this network namespace, so /sys/class/net shows this host's interfaces.
            "mount -t sysfs sysfs /sys && echo ready && exec cat >/dev/null",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn unshare");
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().expect("holder stdout"));
    let _ = out.read_line(&mut line);
    assert_eq!(line.trim(), "ready", "the host's holder did not start");
    // unshare forked the holder: its only child.
    let outer = child.id();
    let children = format!("/proc/{outer}/task/{outer}/children");
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(p) = text.split_whitespace().next().and_then(|p| p.parse().ok()) {
            break p;
        }
        assert!(Instant::now() < deadline, "no holder under unshare {outer}");
        std::thread::sleep(Duration::from_millis(10));
    };
    (child, pid)
}

/// Addresses of test hosts: 198.18.0.0/15 is set aside for benchmarking networks
/// (RFC 2544) and reaches nothing real; each set of hosts takes a /24 of its own.
fn subnet() -> u8 {
    (nccl_net_fabric::random::u64() % 250) as u8 + 1
}

/// Hosts joined into one network, removed on drop.
pub struct Hosts {
    pub hosts: Vec<Host>,
    /// The bridge's namespace, for more than two hosts.
    switch: Option<(Child, u32)>,
}

impl Hosts {
    /// `n` hosts: two joined by one veth pair, more through a bridge.
    pub fn new(n: usize) -> Self {
        Self::build(n, n > 2)
    }

    /// `n` hosts on a bridge, even for two: a host that vanishes takes only its own link.
    pub fn switched(n: usize) -> Self {
        Self::build(n, true)
    }

    fn build(n: usize, bridge: bool) -> Self {
        assert!(n >= 2);
        let net = subnet();
        let mut hosts: Vec<Host> = (0..n)
            .map(|index| {
                let (holder, pid) = holder();
                Host {
                    holder,
                    pid,
                    addr: Ipv4Addr::new(198, 18, net, index as u8 + 1),
                    index,
                }
            })
            .collect();
        let switch = bridge.then(holder);
        match &switch {
            None => {
                let peer = hosts[1].pid.to_string();
                in_netns(
                    hosts[0].pid,
                    &[
                        "ip", "link", "add", IFACE, "type", "veth", "peer", "name", IFACE, "netns",
                        &peer,
                    ],
                );
            }
            Some((_, sw)) => {
                let sw_s = sw.to_string();
                in_netns(*sw, &["ip", "link", "add", "br0", "type", "bridge"]);
                in_netns(*sw, &["ip", "link", "set", "br0", "up"]);
                for h in &hosts {
                    let port = format!("port{}", h.index);
                    in_netns(
                        h.pid,
                        &[
                            "ip", "link", "add", IFACE, "type", "veth", "peer", "name", &port,
                            "netns", &sw_s,
                        ],
                    );
                    in_netns(*sw, &["ip", "link", "set", &port, "master", "br0"]);
                    in_netns(*sw, &["ip", "link", "set", &port, "up"]);
                }
            }
        }
        for h in &mut hosts {
            let v4 = format!("{}/24", h.addr);
            let v6 = format!("fd00:198:18:{net}::{}/64", h.index + 1);
            in_netns(h.pid, &["ip", "link", "set", "lo", "up"]);
            in_netns(h.pid, &["ip", "addr", "add", &v4, "dev", IFACE]);
            in_netns(
                h.pid,
                &["ip", "-6", "addr", "add", &v6, "dev", IFACE, "nodad"],
            );
            in_netns(h.pid, &["ip", "link", "set", IFACE, "up"]);
        }
        let hosts = Hosts { hosts, switch };
        hosts.wait_reachable();
        hosts
    }

    /// Two hosts joined by `links` veth pairs, `eth0`, `eth1`, …: hosts with that many NICs,
    /// each link a subnet of its own (no route between them), as rails are.
    pub fn with_links(links: usize) -> Self {
        let hosts = Self::build(2, false);
        let net0 = hosts.hosts[0].addr.octets()[2];
        let pids = [hosts.hosts[0].pid, hosts.hosts[1].pid];
        for k in 1..links {
            let name = format!("eth{k}");
            let net = ((net0 as usize + k - 1) % 250 + 1) as u8;
            let peer = pids[1].to_string();
            in_netns(
                pids[0],
                &[
                    "ip", "link", "add", &name, "type", "veth", "peer", "name", &name, "netns",
                    &peer,
                ],
            );
            for (i, &pid) in pids.iter().enumerate() {
                let v4 = format!("{}/24", Ipv4Addr::new(198, 18, net, i as u8 + 1));
                in_netns(pid, &["ip", "addr", "add", &v4, "dev", &name]);
                in_netns(pid, &["ip", "link", "set", &name, "up"]);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            for i in 0..2 {
                while hosts.read_net_file(i, &format!("{name}/operstate")) != "up" {
                    assert!(Instant::now() < deadline, "host {i}'s {name} is not up");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        hosts
    }

    /// Bytes host `i` sent on its interface `iface` (its kernel's count).
    pub fn tx_bytes(&self, i: usize, iface: &str) -> u64 {
        self.read_net_file(i, &format!("{iface}/statistics/tx_bytes"))
            .parse()
            .unwrap_or(0)
    }

    /// A file of `/sys/class/net/` as host `i` sees it, trimmed.
    fn read_net_file(&self, i: usize, path: &str) -> String {
        let out = run_command(
            Command::new("nsenter")
                .args([
                    "--target",
                    &self.hosts[i].pid.to_string(),
                    "--net",
                    "--mount",
                    "--",
                ])
                .args(["cat", &format!("/sys/class/net/{path}")]),
            Duration::from_secs(10),
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Waits until every host's link is up (a veth reports its carrier a moment later).
    fn wait_reachable(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for h in &self.hosts {
            loop {
                let state = self.operstate(h.index);
                if state == "up" {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "host {}'s {IFACE} is {state}",
                    h.index
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// `eth0`'s operational state on host `i`, as that host's kernel reports it.
    pub fn operstate(&self, i: usize) -> String {
        self.read_net_file(i, &format!("{IFACE}/operstate"))
    }

    /// The wrapper that runs a child inside host `i`.
    pub fn wrapper(&self, i: usize) -> Vec<String> {
        [
            "nsenter",
            "--target",
            &self.hosts[i].pid.to_string(),
            "--net",
            "--pid",
            "--mount",
            "--",
            "setpriv",
            "--pdeathsig",
            "KILL",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Starts child test `name` as a rank on host `i`.
    pub fn spawn(
        &self,
        i: usize,
        name: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> ChildTest {
        let wrapper = self.wrapper(i);
        let w: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let mut env = env.to_vec();
        env.push(("NFAB_HOST".into(), i.to_string()));
        spawn_child_in(name, &env, timeout, &w)
    }

    /// Takes host `i`'s link down (`up`: false) or up again.
    pub fn set_link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        in_netns(self.hosts[i].pid, &["ip", "link", "set", IFACE, state]);
    }

    /// Host `i` vanishes: its holder is killed, and with it every process of the host, its
    /// namespace and its link.
    pub fn vanish(&mut self, i: usize) {
        let h = &mut self.hosts[i];
        let _ = h.holder.kill();
        let _ = h.holder.wait();
        let gone = Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{}", h.pid)).exists() {
            assert!(Instant::now() < gone, "host {i}'s holder is still there");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The established TCP connections of host `i`, as its kernel counts them.
    pub fn connections(&self, i: usize) -> Vec<Connection> {
        let out = run_command(
            Command::new("nsenter")
                .args(["--target", &self.hosts[i].pid.to_string(), "--net", "--"])
                .args(["ss", "-Htin", "state", "established"]),
            Duration::from_secs(10),
        );
        assert!(
            out.status.success(),
            "ss on host {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = |a: &str| a.rsplit(':').next().and_then(|p| p.parse().ok());
        let mut found: Vec<Connection> = Vec::new();
        // A connection's line (queues and both addresses), then a line of its details.
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match (words.len(), words.first().map(|w| w.parse::<u64>().is_ok())) {
                (4, Some(true)) => {
                    if let (Some(local), Some(remote)) = (port(words[2]), port(words[3])) {
                        found.push(Connection {
                            local,
                            remote,
                            bytes_sent: 0,
                        });
                    }
                }
                _ => {
                    let sent = words
                        .iter()
                        .find_map(|w| w.strip_prefix("bytes_sent:")?.parse().ok());
                    if let (Some(c), Some(sent)) = (found.last_mut(), sent) {
                        c.bytes_sent = sent;
                    }
                }
            }
        }
        found
    }

    /// Caps what host `i` sends on each of `flows` (its connections) at `mbit[k % mbit.len()]`
    /// Mbit/s for the k-th, as a cloud caps each 5-tuple: an HTB class per connection, chosen
    /// by a u32 filter on both ports (IPv4 and IPv6); all other traffic goes unshaped. Removed
    /// with the host.
    pub fn cap_flows(&self, i: usize, flows: &[Connection], mbit: &[u32]) {
        let pid = self.hosts[i].pid;
        let tc = |args: &[&str]| {
            let mut all = vec!["tc"];
            all.extend_from_slice(args);
            in_netns(pid, &all);
        };
        tc(&[
            "qdisc", "add", "dev", IFACE, "root", "handle", "1:", "htb", "default", "1",
        ]);
        tc(&[
            "class", "add", "dev", IFACE, "parent", "1:", "classid", "1:1", "htb", "rate",
            "10gbit", "quantum", "60000",
        ]);
        for (k, flow) in flows.iter().enumerate() {
            let class = format!("1:{:x}", 0x10 + k);
            let rate = format!("{}mbit", mbit[k % mbit.len()]);
            tc(&[
                "class", "add", "dev", IFACE, "parent", "1:", "classid", &class, "htb", "rate",
                &rate, "ceil", &rate, "quantum", "1514",
            ]);
            let (sport, dport) = (flow.local.to_string(), flow.remote.to_string());
            // A priority per protocol (the kernel keeps one protocol per priority).
            for (proto, field, prio) in [("ip", "ip", "1"), ("ipv6", "ip6", "2")] {
                tc(&[
                    "filter", "add", "dev", IFACE, "parent", "1:", "protocol", proto, "prio", prio,
                    "u32", "match", field, "sport", &sport, "0xffff", "match", field, "dport",
                    &dport, "0xffff", "flowid", &class,
                ]);
            }
        }
    }

    /// Takes the caps of [`Hosts::cap_flows`] off host `i` again.
    pub fn uncap(&self, i: usize) {
        in_netns(
            self.hosts[i].pid,
            &["tc", "qdisc", "del", "dev", IFACE, "root"],
        );
    }

    /// Cuts the k-th flow [`Hosts::cap_flows`] shaped on host `i`: everything host `i` sends
    /// to that port is dropped from now on, while its other flows go on.
    pub fn cut_flow(&self, i: usize, k: usize) {
        let class = format!("1:{:x}", 0x10 + k);
        let handle = format!("{:x}:", 0x100 + k);
        in_netns(
            self.hosts[i].pid,
            &[
                "tc",
                "qdisc",
                "add",
                "dev",
                IFACE,
                "parent",
                &class,
                "handle",
                &handle,
                "blackhole",
            ],
        );
    }

    /// The pids of every holder: namespaces that must be gone once this is dropped.
    pub fn holders(&self) -> Vec<u32> {
        self.hosts
            .iter()
            .map(|h| h.pid)
            .chain(self.switch.as_ref().map(|s| s.1))
            .collect()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for h in &mut self.hosts {
            let _ = h.holder.kill();
            let _ = h.holder.wait();
        }
        if let Some((c, _)) = &mut self.switch {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The two-host exchange of handles: starts `name` on hosts 0 and 1, hands each the other's
/// `RESULT handle=`, and returns both.
pub fn pair_on_hosts(
    hosts: &Hosts,
    name: &str,
    env: &[(String, String)],
    timeout: Duration,
) -> (ChildTest, ChildTest) {
    let mut a = hosts.spawn(0, name, env, timeout);
    let mut b = hosts.spawn(1, name, env, timeout);
    let ha = a.read_result("handle");
    let hb = b.read_result("handle");
    a.send_line(&hb);
    b.send_line(&ha);
    (a, b)
}

/// The exchange of handles between every pair of hosts: starts `name` on every host (with
/// `NFAB_HOSTS` set to their number); each prints `RESULT handle=` with a listen handle per
/// host, comma-separated (`-` for itself), and is handed, per host, the handle that host made
/// for it. Returns the ranks, host 0's first.
pub fn all_to_all_on_hosts(
    hosts: &Hosts,
    name: &str,
    env: &[(String, String)],
    timeout: Duration,
) -> Vec<ChildTest> {
    let mut env = env.to_vec();
    env.push(("NFAB_HOSTS".into(), hosts.hosts.len().to_string()));
    let mut ranks: Vec<ChildTest> = (0..hosts.hosts.len())
        .map(|i| hosts.spawn(i, name, &env, timeout))
        .collect();
    let made: Vec<Vec<String>> = ranks
        .iter_mut()
        .map(|r| {
            r.read_result("handle")
                .split(',')
                .map(str::to_string)
                .collect()
        })
        .collect();
    for (k, r) in ranks.iter_mut().enumerate() {
        let for_k: Vec<&str> = made.iter().map(|m| m[k].as_str()).collect();
        r.send_line(&for_k.join(","));
    }
    ranks
}

/// A peer host and the handle it made for this rank.
pub type PeerHandle = (usize, [u8; NET_HANDLE_MAXSIZE]);

/// A rank's side of [`all_to_all_on_hosts`], host `me` of `hosts`: a listen comm per peer
/// (as NCCL's, each accepts one), their handles printed, and per peer the handle that peer
/// made for this rank, read within `timeout`. Returns the listen comms (none for itself) and
/// the peers with their handles.
pub fn handles_of_all(
    lib: &PluginLib,
    me: usize,
    hosts: usize,
    timeout: Duration,
) -> (Vec<Option<Ptr>>, Vec<PeerHandle>) {
    let listens: Vec<Option<([u8; NET_HANDLE_MAXSIZE], Ptr)>> = (0..hosts)
        .map(|j| (j != me).then(|| lib.listen(0).expect("listen")))
        .collect();
    let mine: Vec<String> = listens
        .iter()
        .map(|l| l.as_ref().map_or("-".into(), |(h, _)| handle_to_hex(h)))
        .collect();
    println!("RESULT handle={}", mine.join(","));
    let line = read_stdin_line(timeout);
    let peers = line
        .trim()
        .split(',')
        .enumerate()
        .filter(|(j, _)| *j != me)
        .map(|(j, h)| (j, handle_from_hex(h).expect("handle")))
        .collect();
    (
        listens.into_iter().map(|l| l.map(|(_, c)| c)).collect(),
        peers,
    )
}

/// Connects to every peer of [`handles_of_all`] and accepts from each on its listen comm,
/// all at once, each called in turn without blocking; returns the send and receive comms,
/// in the order of `peers`.
pub fn connect_to_all(
    lib: &PluginLib,
    listens: &[Option<Ptr>],
    peers: &mut [PeerHandle],
    deadline: Instant,
) -> (Vec<Ptr>, Vec<Ptr>) {
    let mut sends: Vec<Option<Ptr>> = vec![None; peers.len()];
    let mut recvs: Vec<Option<Ptr>> = vec![None; peers.len()];
    while sends.iter().chain(&recvs).any(Option::is_none) {
        for (k, (j, h)) in peers.iter_mut().enumerate() {
            if sends[k].is_none() {
                sends[k] = lib.connect(0, h).expect("connect");
            }
            if recvs[k].is_none() {
                recvs[k] = lib.accept(listens[*j].unwrap()).expect("accept");
            }
        }
        assert!(Instant::now() < deadline, "all-to-all connections in time");
        std::thread::sleep(Duration::from_micros(200));
    }
    (
        sends.into_iter().map(Option::unwrap).collect(),
        recvs.into_iter().map(Option::unwrap).collect(),
    )
}

/// Connect to `peer` on `dev` and accept on `listen` at once, calling each in turn without
/// blocking, as NCCL's proxy does.
pub fn connect_and_accept(
    lib: &PluginLib,
    dev: i32,
    peer: &mut [u8; NET_HANDLE_MAXSIZE],
    listen: Ptr,
    deadline: Instant,
) -> (Ptr, Ptr) {
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = lib
                .connect(dev, peer)
                .unwrap_or_else(|e| panic!("connect on dev {dev}: {e}"));
        }
        if recv.is_none() {
            recv = lib
                .accept(listen)
                .unwrap_or_else(|e| panic!("accept on dev {dev}: {e}"));
        }
        assert!(
            Instant::now() < deadline,
            "dev {dev}: no connection between the hosts in time"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    (send.unwrap(), recv.unwrap())
}

/// Providers that reach other hosts: `tcp;ofi_rxm`, and native `tcp` where libfabric has it
/// (>= 1.18).
pub fn providers() -> Vec<&'static str> {
    let mut p = vec!["tcp;ofi_rxm"];
    if libfabric_version() >= (1, 18) {
        p.push("tcp");
    }
    p
}

/// A rank's environment on a host: the provider, no domain filter (what a real host gets),
/// warnings only, plus `extra`.
pub fn host_env(provider: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("NCCL_FABRIC_PROVIDER", provider),
        ("NCCL_FABRIC_LOG", "warn"),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if provider == "tcp" {
        env.push(("NCCL_FABRIC_ALLOW_NATIVE_TCP".into(), "yes".into()));
    }
    env
}

/// Whether hosts can be made here; where not, says why and the test returns early, except
/// in CI (which runs as root), where it fails.
pub fn hosts_or_skip() -> bool {
    match available() {
        Ok(()) => true,
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("hosts cannot be made in CI: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            false
        }
    }
}

/// This rank's host (0, 1, …), from the test that started it ([`Hosts::spawn`]).
pub fn my_host() -> usize {
    std::env::var("NFAB_HOST")
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("NFAB_HOST")
}

/// Whether this process is a rank started inside a host.
pub fn on_a_host() -> bool {
    std::env::var_os("NFAB_HOST").is_some()
}
