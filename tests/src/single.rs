//! One node with pods wired by hand (as the plugin would), an "internet" host and an
//! internal peer, plus a private bpffs for the pins: the datapath tests, the rate matrix and
//! the shaping benchmarks. Everything is created per instance and removed on drop.
//!
//! ```text
//!  pod (10.20.0.5/32)                    node                           inet
//!   eth0 ──────────────────── vh1   [forwarding]   up0 100.64.0.1 ─── ext0 100.64.0.2
//!   default via 169.254.1.1                                              lo 203.0.113.10 (internet)
//!   (permanent neighbour                                                 lo 198.51.100.7 (blocked)
//!    = vh1's MAC)                                                        lo 169.254.169.254 (metadata)
//!                                                                        lo 198.51.100.20 (a named class)
//!                                        vp0 100.64.1.1 ─── int0 100.64.1.2 (peer)
//!                                                                   lo 10.30.0.10 (internal)
//! ```
//!
//! More pods ([`SingleNode::add_pods`]) are wired the same way: pod `i` (role `pod<i>`,
//! [`pod_role`]) has address [`pod_ip`]`(i)` on host veth [`host_veth`]`(i)`; pod 0 is the
//! one above.

use std::{
    path::{Path, PathBuf},
    process::Output,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};

use crate::{
    bpffs::Bpffs,
    netns::{ip, run, Netns},
    shaperd::{ShaperPaths, Shaperd},
    traffic::{iperf_report, netns_exec, parse_ping, IperfServer},
};

pub const POD_IP: &str = "10.20.0.5";
pub const INTERNET: &str = "203.0.113.10";
pub const BLOCKED: &str = "198.51.100.7";
pub const METADATA: &str = "169.254.169.254";
pub const INTERNAL: &str = "10.30.0.10";
/// A second internet address, for a named destination class (`cidrs = ["198.51.100.20/32"]`).
pub const MIRROR: &str = "198.51.100.20";

/// The role of pod `i`: `pod` for the first, `pod<i>` for the others.
pub fn pod_role(i: usize) -> String {
    if i == 0 {
        "pod".to_owned()
    } else {
        format!("pod{i}")
    }
}

/// The address of pod `i` (pod 0's is [`POD_IP`]).
pub fn pod_ip(i: usize) -> String {
    format!("10.20.0.{}", 5 + i)
}

/// The host veth of pod `i` in the node (pod 0's is `vh1`).
pub fn host_veth(i: usize) -> String {
    format!("vh{}", i + 1)
}

/// Pods a topology can have (their addresses stay in 10.20.0.0/24).
pub const MAX_PODS: usize = 250;

/// Serialises the instances of one process that ask for it: they measure throughput and
/// share the CPUs with other work.
static SERIAL: Mutex<()> = Mutex::new(());

/// The topology's link sizes. Nodes users run have jumbo frames (AWS 9001, Azure 9000, GCP
/// up to 8896) or 1500; the default is [`crate::test_mtu`] (9000, or `ALIASNET_TEST_MTU`), and
/// the suite also runs at 1500 (tests/run.sh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Links {
    /// The node's uplink and the internal peer's link.
    pub uplink_mtu: u32,
    /// The pod's veth pair (the plugin's default: the uplink's MTU).
    pub pod_mtu: u32,
    /// GRO on the node's veths (as several CNIs set it), so aggregates of up to 64 KiB reach
    /// the shaping points from both sides.
    pub gro: bool,
}

impl Links {
    pub fn from_env() -> Self {
        Self::mtu(crate::test_mtu())
    }

    pub fn mtu(mtu: u32) -> Self {
        Self {
            uplink_mtu: mtu,
            pod_mtu: mtu,
            gro: false,
        }
    }
}

/// The namespaces (roles `node`, `pod`, `inet`, `peer`), the private bpffs and, when
/// started, an `aliasnet-shaperd` in the node.
pub struct SingleNode {
    // Field order is drop order: the daemon, the namespaces, the bpffs, then the turn.
    shaperd: Option<Shaperd>,
    pub links: Links,
    pub prefix: String,
    /// The `aliasnet-shaperd` binary [`Self::start_shaperd`] runs.
    pub shaperd_bin: PathBuf,
    pub shaperd_log: PathBuf,
    pod: Netns,
    /// Pods 1.. ([`Self::add_pods`]).
    pods: Vec<Netns>,
    peer: Netns,
    inet: Netns,
    node: Netns,
    pub bpffs: Bpffs,
    _serial: Option<MutexGuard<'static, ()>>,
}

impl SingleNode {
    /// Links from the environment, one instance at a time.
    pub fn new() -> Self {
        Self::with_links(Links::from_env())
    }

    /// An instance with `links`, one at a time.
    pub fn with_links(links: Links) -> Self {
        let serial = Self::serial();
        Self::build(links, Some(serial)).expect("build the single-node topology")
    }

    /// Holds off the serialised instances: for a test that runs several concurrent ones of
    /// its own.
    pub fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An instance that runs beside others (for tests that measure several at once on
    /// purpose).
    pub fn concurrent(links: Links) -> Self {
        Self::build(links, None).expect("build the single-node topology")
    }

    pub fn build(links: Links, serial: Option<MutexGuard<'static, ()>>) -> Result<Self> {
        let prefix = format!("ant{}", crate::unique_tag());
        let bpffs = Bpffs::mount("aliasnet-bpffs-")?;
        let shaperd_log = bpffs.path().with_extension("log");
        let ns = |role: &str| Netns::new(&format!("{prefix}-{role}"));
        let (node, pod, inet, peer) = (ns("node")?, ns("pod")?, ns("inet")?, ns("peer")?);
        let f = Self {
            shaperd: None,
            _serial: serial,
            links,
            prefix,
            shaperd_bin: crate::bin_dir().join("aliasnet-shaperd"),
            shaperd_log,
            pod,
            pods: Vec::new(),
            peer,
            inet,
            node,
            bpffs,
        };
        f.wire()?;
        Ok(f)
    }

    /// The namespace of `role` (`node`, `pod`, `pod<i>`, `inet`, `peer`).
    pub fn netns(&self, role: &str) -> &Netns {
        match role {
            "node" => &self.node,
            "pod" => &self.pod,
            "inet" => &self.inet,
            "peer" => &self.peer,
            other => other
                .strip_prefix("pod")
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| self.pods.get(i.checked_sub(1)?))
                .unwrap_or_else(|| panic!("no namespace role {other:?}")),
        }
    }

    /// Pods in the topology (pod 0 and those [`Self::add_pods`] added).
    pub fn pod_count(&self) -> usize {
        1 + self.pods.len()
    }

    /// Adds pods until the topology has `n`, each wired as pod 0 is.
    pub fn add_pods(&mut self, n: usize) -> Result<()> {
        anyhow::ensure!(n <= MAX_PODS, "at most {MAX_PODS} pods");
        while self.pod_count() < n {
            let i = self.pod_count();
            self.pods
                .push(Netns::new(&format!("{}-{}", self.prefix, pod_role(i)))?);
            self.wire_pod(i)?;
        }
        Ok(())
    }

    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    pub fn ns_path(&self, role: &str) -> PathBuf {
        self.netns(role).path()
    }

    pub fn pin_root(&self) -> PathBuf {
        self.bpffs.pin_root()
    }

    /// Runs `f` on a thread inside the node's network namespace (bpffs stays visible).
    pub fn in_node<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.node.run(f).expect("enter node netns")
    }

    fn wire(&self) -> Result<()> {
        let (node, inet, peer) = (self.ns("node"), self.ns("inet"), self.ns("peer"));
        let up = self.links.uplink_mtu.to_string();
        for (host, mtu, peer_name, ns) in [("up0", &up, "ext0", &inet), ("vp0", &up, "int0", &peer)]
        {
            ip(&[
                "-n", &node, "link", "add", host, "mtu", mtu, "type", "veth", "peer", "name",
                peer_name, "mtu", mtu, "netns", ns,
            ])?;
        }
        if self.links.gro {
            for l in ["up0", "vp0"] {
                self.run("node", &["ethtool", "-K", l, "gro", "on"])?;
            }
        }
        self.run("node", &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        let n = |args: &[&str]| self.node.ip(args).map(drop);
        for l in ["up0", "vp0"] {
            n(&["link", "set", l, "up"])?;
        }
        n(&["addr", "add", "100.64.0.1/30", "dev", "up0"])?;
        n(&["addr", "add", "100.64.1.1/30", "dev", "vp0"])?;
        n(&["route", "add", "default", "via", "100.64.0.2"])?;
        n(&["route", "add", "10.30.0.0/16", "via", "100.64.1.2"])?;
        self.wire_pod(0)?;

        let i = |args: &[&str]| self.inet.ip(args).map(drop);
        i(&["link", "set", "ext0", "up"])?;
        i(&["addr", "add", "100.64.0.2/30", "dev", "ext0"])?;
        for a in [INTERNET, BLOCKED, METADATA, MIRROR] {
            i(&["addr", "add", &format!("{a}/32"), "dev", "lo"])?;
        }
        i(&["route", "add", "10.20.0.0/16", "via", "100.64.0.1"])?;

        let q = |args: &[&str]| self.peer.ip(args).map(drop);
        q(&["link", "set", "int0", "up"])?;
        q(&["addr", "add", "100.64.1.2/30", "dev", "int0"])?;
        q(&["addr", "add", &format!("{INTERNAL}/32"), "dev", "lo"])?;
        q(&["route", "add", "10.20.0.0/16", "via", "100.64.1.1"])?;
        Ok(())
    }

    /// Pod `i`'s veth pair, address, routes and gateway, as the plugin sets them up.
    fn wire_pod(&self, i: usize) -> Result<()> {
        let (role, host, ip_addr) = (pod_role(i), host_veth(i), pod_ip(i));
        let (pod, pm) = (self.ns(&role), self.links.pod_mtu.to_string());
        ip(&[
            "-n",
            &self.ns("node"),
            "link",
            "add",
            &host,
            "mtu",
            &pm,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "mtu",
            &pm,
            "netns",
            &pod,
        ])?;
        if self.links.gro {
            self.run("node", &["ethtool", "-K", &host, "gro", "on"])?;
        }
        let n = |args: &[&str]| self.node.ip(args).map(drop);
        n(&["link", "set", &host, "up"])?;
        n(&["route", "add", &format!("{ip_addr}/32"), "dev", &host])?;

        let mac = self.try_mac("node", &host)?;
        let p = |args: &[&str]| self.netns(&role).ip(args).map(drop);
        p(&["link", "set", "eth0", "up"])?;
        p(&["addr", "add", &format!("{ip_addr}/32"), "dev", "eth0"])?;
        p(&[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ])?;
        self.wire_gateway(&role, "169.254.1.1", &mac)
    }

    /// The default route of pod `role` through gateway `gw` (an address of either family),
    /// whose permanent neighbour entry is the host veth's `mac`, as the plugin sets them.
    pub fn wire_gateway(&self, role: &str, gw: &str, mac: &str) -> Result<()> {
        let p = |args: &[&str]| self.netns(role).ip(args).map(drop);
        p(&["route", "add", "default", "via", gw, "dev", "eth0"])?;
        p(&[
            "neigh",
            "add",
            gw,
            "lladdr",
            mac,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ])
    }

    pub fn try_mac(&self, role: &str, dev: &str) -> Result<String> {
        let v = self.netns(role).ip_json(&["link", "show", dev])?;
        Ok(v[0]["address"]
            .as_str()
            .context("no address in ip -j link")?
            .to_owned())
    }

    pub fn mac(&self, role: &str, dev: &str) -> String {
        self.try_mac(role, dev).expect("link address")
    }

    /// Runs a command in a namespace through `ip netns exec`; fails unless it succeeds.
    pub fn run(&self, role: &str, cmd: &[&str]) -> Result<Output> {
        run(&mut netns_exec(&self.ns(role), cmd))
    }

    /// [`Self::run`] for tests: panics with the command's stderr on failure.
    #[track_caller]
    pub fn exec(&self, role: &str, cmd: &[&str]) -> Output {
        self.run(role, cmd).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Runs a command in a namespace, whatever its exit status.
    pub fn try_exec(&self, role: &str, cmd: &[&str]) -> Output {
        netns_exec(&self.ns(role), cmd).output().expect("spawn")
    }

    /// `ping -c n -s size`; returns how many replies came back.
    pub fn ping(&self, from: &str, dst: &str, n: u32, size: u32, extra: &[&str]) -> u32 {
        let (c, s) = (n.to_string(), size.to_string());
        let mut args = vec![
            "ping", "-q", "-n", "-c", &c, "-s", &s, "-i", "0.05", "-W", "1",
        ];
        args.extend_from_slice(extra);
        args.push(dst);
        parse_ping(&self.try_exec(from, &args).stdout).received
    }

    /// Writes the node policy atomically (a running shaperd sees the old or the new file).
    pub fn write_policy(&self, text: &str) -> PathBuf {
        let path = self.bpffs.path().with_extension("toml");
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write policy");
        std::fs::rename(&tmp, &path).expect("rename policy");
        path
    }

    fn shaper_paths(&self, policy: &Path) -> ShaperPaths {
        ShaperPaths {
            config: policy.to_path_buf(),
            pin_root: self.pin_root(),
            log: self.shaperd_log.clone(),
        }
    }

    /// `aliasnet-shaperd --once` in the node: install and apply, then exit.
    pub fn shaperd_once(&self, policy: &Path) -> Output {
        Shaperd::command(
            &self.shaperd_bin,
            &self.ns_path("node"),
            &self.shaper_paths(policy),
            &["--once"],
        )
        .output()
        .expect("run shaperd")
    }

    /// Starts shaperd in the background and waits until it runs its loop.
    pub fn start_shaperd(&mut self, policy: &Path) {
        self.start_shaperd_with(policy, &["--poll-interval", "1"]);
    }

    pub fn start_shaperd_with(&mut self, policy: &Path, args: &[&str]) {
        assert!(self.shaperd.is_none(), "shaperd already running");
        let before = self.log().matches("running;").count();
        let d = Shaperd::spawn(
            &self.shaperd_bin,
            &self.ns_path("node"),
            self.shaper_paths(policy),
            args,
        )
        .expect("spawn shaperd");
        self.shaperd = Some(d);
        self.wait_log(|l| l.matches("running;").count() > before, "shaperd start");
    }

    pub fn signal_shaperd(&self, sig: nix::sys::signal::Signal) {
        self.shaperd
            .as_ref()
            .expect("shaperd running")
            .signal(sig)
            .expect("signal");
    }

    /// SIGTERM and wait; the daemon must exit successfully.
    pub fn stop_shaperd(&mut self) {
        let mut d = self.shaperd.take().expect("shaperd running");
        let status = d.stop().expect("stop shaperd");
        assert!(
            status.is_none_or(|s| s.success()),
            "shaperd exited with {status:?}\n{}",
            self.log()
        );
    }

    pub fn shaperd_alive(&mut self) -> bool {
        self.shaperd.as_mut().is_some_and(Shaperd::is_running)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.shaperd_log).unwrap_or_default()
    }

    pub fn wait_log(&self, pred: impl Fn(&str) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if pred(&self.log()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("timed out waiting for {what}; log:\n{}", self.log());
    }

    /// iperf3 server in `role` on `addr`, client in the pod; returns received Mbit/s.
    pub fn iperf(&self, role: &str, addr: &str, secs: u32, reverse: bool) -> f64 {
        let server = IperfServer::start(&self.ns(role), addr).expect("iperf3 server");
        let (port, t) = (server.port.to_string(), secs.to_string());
        let mut args = vec!["iperf3", "-J", "-c", addr, "-p", &port, "-t", &t];
        if reverse {
            args.push("-R");
        }
        let out = self.try_exec("pod", &args);
        drop(server);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "iperf3 output: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or_else(|| panic!("iperf3 result: {v}"))
            / 1e6
    }

    /// A `secs` TCP transfer to `receiver` from a server in `sender` on `addr`, measured by
    /// the receiver (iperf3 client with -R); returns the client's JSON report, which carries
    /// the sender's retransmits too.
    pub fn iperf_received(
        &self,
        receiver: &str,
        sender: &str,
        addr: &str,
        secs: u32,
    ) -> serde_json::Value {
        let server = IperfServer::start(&self.ns(sender), addr).expect("iperf3 server");
        let (port, t) = (server.port.to_string(), secs.to_string());
        let args = ["iperf3", "-J", "-R", "-c", addr, "-p", &port, "-t", &t];
        let mut out = self.try_exec(receiver, &args);
        // The client retries until the server listens.
        for _ in 0..50 {
            if !String::from_utf8_lossy(&out.stdout).contains("Connection refused") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            out = self.try_exec(receiver, &args);
        }
        drop(server);
        iperf_report(&out).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// iperf3 from `sender` to a server in `receiver` on `dst` (client bound to `bind`),
    /// with congestion control `cc`, and `ping`s from the pod to `ping_dst` every 0.1 s
    /// meanwhile (from 1 s in until 2 s before the end); returns the client's JSON report
    /// and the ping output.
    #[allow(
        clippy::too_many_arguments,
        reason = "a test helper mirroring iperf3's options"
    )]
    pub fn iperf_json(
        &self,
        sender: &str,
        receiver: &str,
        dst: &str,
        bind: Option<&str>,
        secs: u32,
        cc: Option<&str>,
        ping_dst: &str,
    ) -> (serde_json::Value, String) {
        let opts = IperfOpts {
            bind,
            cc,
            streams: 1,
            ping: Some(PingDuring {
                dst: ping_dst,
                delay: Duration::from_secs(1),
                margin: 2,
            }),
            client_port: None,
            server_output: false,
        };
        let (v, ping) = self
            .iperf_run(sender, receiver, dst, secs, &opts)
            .unwrap_or_else(|e| panic!("{e:#}"));
        (v, ping.unwrap_or_default())
    }

    /// A `secs` iperf3 run from `sender` to a server in `receiver` on `dst`, with the pod's
    /// pings of `o.ping` meanwhile; returns the client's JSON report and the ping output.
    pub fn iperf_run(
        &self,
        sender: &str,
        receiver: &str,
        dst: &str,
        secs: u32,
        o: &IperfOpts,
    ) -> Result<(serde_json::Value, Option<String>)> {
        let server = IperfServer::start(&self.ns(receiver), dst)?;
        let ping = o.ping.map(|p| {
            let ping_ns = self.ns("pod");
            let ping_dst = p.dst.to_owned();
            let w = secs.saturating_sub(p.margin).max(1).to_string();
            std::thread::spawn(move || {
                std::thread::sleep(p.delay);
                netns_exec(
                    &ping_ns,
                    &["ping", "-n", "-q", "-i", "0.1", "-w", &w, &ping_dst],
                )
                .output()
            })
        });
        let (port, t) = (server.port.to_string(), secs.to_string());
        let mut args = vec!["iperf3", "-J", "-c", dst, "-p", &port, "-t", &t];
        if let Some(b) = o.bind {
            args.extend(["-B", b]);
        }
        if let Some(c) = o.cc {
            args.extend(["-C", c]);
        }
        let streams = o.streams.to_string();
        if o.streams > 1 {
            args.extend(["-P", &streams]);
        }
        let cport = o.client_port.map(|pick| pick(server.port).to_string());
        if let Some(c) = &cport {
            args.extend(["--cport", c]);
        }
        if o.server_output {
            args.push("--get-server-output");
        }
        let out = netns_exec(&self.ns(sender), &args)
            .output()
            .context("iperf3 client")?;
        drop(server);
        let ping = match ping {
            Some(h) => {
                let out = h.join().map_err(|_| anyhow!("ping thread"))??;
                Some(String::from_utf8_lossy(&out.stdout).into_owned())
            }
            None => None,
        };
        Ok((iperf_report(&out)?, ping))
    }

    /// `tc -s -j WHAT show dev DEV` in `role`, parsed.
    pub fn tc_json(&self, role: &str, what: &str, dev: &str) -> serde_json::Value {
        let out = self.exec(role, &["tc", "-s", "-j", what, "show", "dev", dev]);
        serde_json::from_slice(&out.stdout).expect("tc -j")
    }

    /// `(rx, tx)` packets of a device (skbs, for veth).
    pub fn link_packets(&self, role: &str, dev: &str) -> Result<(u64, u64)> {
        let v = self
            .netns(role)
            .ip_json(&["-s", "link", "show", "dev", dev])?;
        let st = &v[0]["stats64"];
        Ok((
            st["rx"]["packets"].as_u64().context("rx packets")?,
            st["tx"]["packets"].as_u64().context("tx packets")?,
        ))
    }

    /// Root qdisc `(bytes, drops)` of a device.
    pub fn qdisc_counters(&self, role: &str, dev: &str) -> Result<(u64, u64)> {
        let out = self.run(role, &["tc", "-s", "-j", "qdisc", "show", "dev", dev])?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let root = v
            .as_array()
            .and_then(|a| a.iter().find(|q| q["root"].as_bool() == Some(true)))
            .ok_or_else(|| anyhow!("no root qdisc on {dev}: {v}"))?;
        Ok((
            root["bytes"].as_u64().unwrap_or(0),
            root["drops"].as_u64().unwrap_or(0),
        ))
    }
}

impl Default for SingleNode {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SingleNode {
    fn drop(&mut self) {
        if let Some(mut d) = self.shaperd.take() {
            d.kill();
        }
        let _ = std::fs::remove_file(&self.shaperd_log);
        let _ = std::fs::remove_file(self.bpffs.path().with_extension("toml"));
    }
}

/// Pings from the pod during an iperf3 run: every 0.1 s to `dst`, starting `delay` after
/// the run, for the run's length less `margin` seconds (at least 1 s).
#[derive(Debug, Clone, Copy)]
pub struct PingDuring<'a> {
    pub dst: &'a str,
    pub delay: Duration,
    pub margin: u32,
}

/// Options of [`SingleNode::iperf_run`].
#[derive(Debug, Clone, Copy)]
pub struct IperfOpts<'a> {
    /// The client's source address (`-B`).
    pub bind: Option<&'a str>,
    /// Congestion control (`-C`).
    pub cc: Option<&'a str>,
    /// Parallel streams (`-P` when above 1).
    pub streams: u32,
    pub ping: Option<PingDuring<'a>>,
    /// The data stream's client port (`--cport`) for the server's port; `None` = ephemeral.
    pub client_port: Option<fn(u16) -> u16>,
    /// `--get-server-output`: the report also carries the server's own (`server_output_json`),
    /// the receiver's view of each second when the client sends.
    pub server_output: bool,
}
