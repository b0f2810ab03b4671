//! Test fabric: network namespaces for a node, a pod, an "internet" host and an internal
//! peer, plus a private bpffs instance for the pins. Everything is created per test and
//! removed on drop; the root namespace is never touched.
//!
//! ```text
//!  pod (10.20.0.5/32)                    node                           inet
//!   eth0 ──────────────────── vh1   [forwarding]   up0 100.64.0.1 ─── ext0 100.64.0.2
//!   default via 169.254.1.1                                              lo 203.0.113.10 (internet)
//!   (permanent neighbour                                                 lo 198.51.100.7 (blocked)
//!    = vh1's MAC)                                                        lo 169.254.169.254 (metadata)
//!                                        vp0 100.64.1.1 ─── int0 100.64.1.2 (peer)
//!                                                                   lo 10.30.0.10 (internal)
//! ```

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the fabric"
)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use aliasnet_ebpf::{Datapath, Limits, PodAttachment, PodIdentity};
use aliasnet_netns as netns;

pub const POD_IP: &str = "10.20.0.5";
pub const INTERNET: &str = "203.0.113.10";
pub const BLOCKED: &str = "198.51.100.7";
pub const METADATA: &str = "169.254.169.254";
pub const INTERNAL: &str = "10.30.0.10";
pub const CONTAINER_ID: &str = "c0ffee0000000000000000000000000000000000000000000000000000000001";

/// Serialises tests: they measure throughput and share two CPUs with other work.
static SERIAL: Mutex<()> = Mutex::new(());
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The fabric's link sizes. Nodes users run have jumbo frames (AWS 9001, Azure 9000, GCP up
/// to 8896) or 1500; the default is 9000, or `ALIASNET_TEST_MTU`, and the suite also runs at
/// 1500 (tests/run.sh).
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
        let mtu = std::env::var("ALIASNET_TEST_MTU")
            .ok()
            .map(|v| v.parse().expect("ALIASNET_TEST_MTU is a number"))
            .unwrap_or(9000);
        Self {
            uplink_mtu: mtu,
            pod_mtu: mtu,
            gro: false,
        }
    }

    pub fn mtu(mtu: u32) -> Self {
        Self {
            uplink_mtu: mtu,
            pod_mtu: mtu,
            gro: false,
        }
    }
}

pub fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "netns tests must run as root in CI"
    );
    eprintln!("skipping: netns tests need root");
    false
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

pub struct Fabric {
    _serial: Option<MutexGuard<'static, ()>>,
    pub links: Links,
    pub prefix: String,
    pub bpffs: tempfile::TempDir,
    pub shaperd_log: PathBuf,
    shaperd: Option<Child>,
}

impl Fabric {
    pub fn new() -> Self {
        Self::with_links(Links::from_env())
    }

    /// A fabric with `links`, one test at a time.
    pub fn with_links(links: Links) -> Self {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        Self::build_with(links, Some(serial))
    }

    /// Holds off the other tests of this binary: for a test that runs several concurrent
    /// fabrics of its own.
    pub fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fabric that runs beside others (for tests that measure several at once on purpose).
    pub fn concurrent(links: Links) -> Self {
        Self::build_with(links, None)
    }

    fn build_with(links: Links, serial: Option<MutexGuard<'static, ()>>) -> Self {
        let prefix = format!(
            "ant{}x{}",
            std::process::id() % 100_000,
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let bpffs = tempfile::Builder::new()
            .prefix("aliasnet-bpffs-")
            .tempdir()
            .expect("tempdir");
        // A private bpffs instance: pins of different tests cannot collide.
        run(Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(bpffs.path()));
        let shaperd_log = bpffs.path().with_extension("log");
        let f = Self {
            _serial: serial,
            links,
            prefix,
            bpffs,
            shaperd_log,
            shaperd: None,
        };
        f.build();
        f
    }

    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    pub fn ns_path(&self, role: &str) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.ns(role)))
    }

    pub fn pin_root(&self) -> PathBuf {
        self.bpffs.path().join("aliasnet")
    }

    fn build(&self) {
        let (node, pod, inet, peer) = (
            self.ns("node"),
            self.ns("pod"),
            self.ns("inet"),
            self.ns("peer"),
        );
        for n in [&node, &pod, &inet, &peer] {
            ip(&["netns", "add", n]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        let (up, pm) = (
            self.links.uplink_mtu.to_string(),
            self.links.pod_mtu.to_string(),
        );
        ip(&[
            "-n", &node, "link", "add", "vh1", "mtu", &pm, "type", "veth", "peer", "name", "eth0",
            "mtu", &pm, "netns", &pod,
        ]);
        ip(&[
            "-n", &node, "link", "add", "up0", "mtu", &up, "type", "veth", "peer", "name", "ext0",
            "mtu", &up, "netns", &inet,
        ]);
        ip(&[
            "-n", &node, "link", "add", "vp0", "mtu", &up, "type", "veth", "peer", "name", "int0",
            "mtu", &up, "netns", &peer,
        ]);
        if self.links.gro {
            for l in ["vh1", "up0", "vp0"] {
                self.exec("node", &["ethtool", "-K", l, "gro", "on"]);
            }
        }
        self.exec("node", &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        for l in ["vh1", "up0", "vp0"] {
            ip(&["-n", &node, "link", "set", l, "up"]);
        }
        ip(&["-n", &node, "addr", "add", "100.64.0.1/30", "dev", "up0"]);
        ip(&["-n", &node, "addr", "add", "100.64.1.1/30", "dev", "vp0"]);
        ip(&["-n", &node, "route", "add", "default", "via", "100.64.0.2"]);
        ip(&[
            "-n",
            &node,
            "route",
            "add",
            "10.30.0.0/16",
            "via",
            "100.64.1.2",
        ]);
        ip(&[
            "-n",
            &node,
            "route",
            "add",
            &format!("{POD_IP}/32"),
            "dev",
            "vh1",
        ]);
        let mac = self.mac("node", "vh1");
        ip(&["-n", &pod, "link", "set", "eth0", "up"]);
        ip(&[
            "-n",
            &pod,
            "addr",
            "add",
            &format!("{POD_IP}/32"),
            "dev",
            "eth0",
        ]);
        ip(&[
            "-n",
            &pod,
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ]);
        ip(&[
            "-n",
            &pod,
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ]);
        ip(&[
            "-n",
            &pod,
            "neigh",
            "add",
            "169.254.1.1",
            "lladdr",
            &mac,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ]);
        ip(&["-n", &inet, "link", "set", "ext0", "up"]);
        ip(&["-n", &inet, "addr", "add", "100.64.0.2/30", "dev", "ext0"]);
        for a in [INTERNET, BLOCKED, METADATA] {
            ip(&["-n", &inet, "addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        ip(&[
            "-n",
            &inet,
            "route",
            "add",
            "10.20.0.0/16",
            "via",
            "100.64.0.1",
        ]);
        ip(&["-n", &peer, "link", "set", "int0", "up"]);
        ip(&["-n", &peer, "addr", "add", "100.64.1.2/30", "dev", "int0"]);
        ip(&[
            "-n",
            &peer,
            "addr",
            "add",
            &format!("{INTERNAL}/32"),
            "dev",
            "lo",
        ]);
        ip(&[
            "-n",
            &peer,
            "route",
            "add",
            "10.20.0.0/16",
            "via",
            "100.64.1.1",
        ]);
    }

    pub fn mac(&self, role: &str, dev: &str) -> String {
        let out = run(Command::new("ip").args(["-n", &self.ns(role), "-j", "link", "show", dev]));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j");
        v[0]["address"].as_str().expect("address").to_owned()
    }

    /// Runs a command in a namespace (through `ip netns exec`: no bpffs needed there).
    pub fn exec(&self, role: &str, cmd: &[&str]) -> Output {
        run(Command::new("ip")
            .args(["netns", "exec", &self.ns(role)])
            .args(cmd))
    }

    pub fn try_exec(&self, role: &str, cmd: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ns(role)])
            .args(cmd)
            .output()
            .expect("spawn")
    }

    /// `ping -c n -s size`; returns how many replies came back.
    pub fn ping(&self, from: &str, dst: &str, n: u32, size: u32, extra: &[&str]) -> u32 {
        let (c, s) = (n.to_string(), size.to_string());
        let mut args = vec![
            "ping", "-q", "-n", "-c", &c, "-s", &s, "-i", "0.05", "-W", "1",
        ];
        args.extend_from_slice(extra);
        args.push(dst);
        let out = self.try_exec(from, &args);
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(", ").collect();
                (f.len() >= 2 && f[1].ends_with("received"))
                    .then(|| f[1].split(' ').next()?.parse().ok())?
            })
            .unwrap_or(0)
    }

    /// Runs `f` on a thread inside the node's network namespace (bpffs stays visible).
    pub fn in_node<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        netns::run_in(self.ns_path("node"), f).expect("enter node netns")
    }

    pub fn open(&self) -> Datapath {
        let root = self.pin_root();
        self.in_node(|| Datapath::open(root))
            .expect("open datapath")
    }

    pub fn write_policy(&self, text: &str) -> PathBuf {
        let path = self.bpffs.path().with_extension("toml");
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write policy");
        std::fs::rename(&tmp, &path).expect("rename policy");
        path
    }

    fn shaperd_cmd(&self, policy: &Path, extra: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.ns_path("node").display()))
            .arg(env!("CARGO_BIN_EXE_aliasnet-shaperd"))
            .arg("--config")
            .arg(policy)
            .arg("--pin-root")
            .arg(self.pin_root())
            .args(extra)
            .env("RUST_LOG", "info");
        c
    }

    /// `aliasnet-shaperd --once`: install and apply, then exit.
    pub fn shaperd_once(&self, policy: &Path) -> Output {
        self.shaperd_cmd(policy, &["--once"])
            .output()
            .expect("run shaperd")
    }

    /// Starts shaperd in the background and waits until it runs its loop.
    pub fn start_shaperd(&mut self, policy: &Path) {
        self.start_shaperd_with(policy, &["--poll-interval", "1"]);
    }

    pub fn start_shaperd_with(&mut self, policy: &Path, args: &[&str]) {
        assert!(self.shaperd.is_none(), "shaperd already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.shaperd_log)
            .expect("log file");
        let before = self.log().matches("running;").count();
        let child = self
            .shaperd_cmd(policy, args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn shaperd");
        self.shaperd = Some(child);
        self.wait_log(|l| l.matches("running;").count() > before, "shaperd start");
    }

    pub fn signal_shaperd(&self, sig: nix::sys::signal::Signal) {
        let child = self.shaperd.as_ref().expect("shaperd running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).expect("signal");
    }

    /// SIGTERM and wait.
    pub fn stop_shaperd(&mut self) {
        self.signal_shaperd(nix::sys::signal::Signal::SIGTERM);
        let mut child = self.shaperd.take().expect("shaperd running");
        let status = child.wait().expect("wait shaperd");
        assert!(
            status.success(),
            "shaperd exited with {status}\n{}",
            self.log()
        );
    }

    pub fn shaperd_alive(&mut self) -> bool {
        self.shaperd
            .as_mut()
            .is_some_and(|c| c.try_wait().expect("try_wait").is_none())
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

    pub fn attachment(&self, limits: Limits) -> PodAttachment {
        PodAttachment {
            host_ifname: "vh1".to_owned(),
            netns: self.ns_path("pod"),
            identity: PodIdentity {
                namespace: "team-a".to_owned(),
                name: "trainer-0".to_owned(),
                container_id: CONTAINER_ID.to_owned(),
                ifname: "eth0".to_owned(),
                ip: POD_IP.parse().expect("pod ip"),
            },
            limits,
        }
    }

    /// iperf3 server in `role` on `addr`, client in the pod; returns received Mbit/s.
    pub fn iperf(&self, role: &str, addr: &str, secs: u32, reverse: bool) -> f64 {
        let port = (5201 + COUNTER.fetch_add(1, Ordering::SeqCst) % 1000).to_string();
        let mut server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns(role),
                "iperf3",
                "-s",
                "-1",
                "-B",
                addr,
                "-p",
                &port,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("iperf3 server");
        std::thread::sleep(Duration::from_millis(300));
        let t = secs.to_string();
        let mut args = vec!["iperf3", "-J", "-c", addr, "-p", &port, "-t", &t];
        if reverse {
            args.push("-R");
        }
        let out = self.try_exec("pod", &args);
        let _ = server.kill();
        let _ = server.wait();
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

    /// A one-shot iperf3 server in `role` on `addr`, on a port of its own.
    fn iperf_server(&self, role: &str, addr: &str) -> (String, Child) {
        let port = (5201 + COUNTER.fetch_add(1, Ordering::SeqCst) % 1000).to_string();
        let server = Command::new("ip")
            .args(["netns", "exec", &self.ns(role)])
            .args(["iperf3", "-s", "-1", "-B", addr, "-p", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("iperf3 server");
        (port, server)
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
        let (port, mut server) = self.iperf_server(sender, addr);
        // The client retries until the server listens.
        let t = secs.to_string();
        let args = ["iperf3", "-J", "-R", "-c", addr, "-p", &port, "-t", &t];
        let mut out = self.try_exec(receiver, &args);
        for _ in 0..50 {
            if !String::from_utf8_lossy(&out.stdout).contains("Connection refused") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            out = self.try_exec(receiver, &args);
        }
        let _ = server.kill();
        let _ = server.wait();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "iperf3 output: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        assert!(v["error"].is_null(), "iperf3: {}", v["error"]);
        v
    }

    /// iperf3 from `sender` to a server in `receiver` on `dst` (client bound to `bind`),
    /// with congestion control `cc`, and `ping`s from the pod to `dst_ping` every 0.1 s
    /// meanwhile; returns the client's JSON report and the ping output.
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
        let (port, mut server) = self.iperf_server(receiver, dst);
        std::thread::sleep(Duration::from_millis(300));
        let ping_ns = self.ns("pod");
        let ping_dst = ping_dst.to_owned();
        let w = secs.saturating_sub(2).max(1).to_string();
        let ping = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            Command::new("ip")
                .args(["netns", "exec", &ping_ns])
                .args(["ping", "-n", "-q", "-i", "0.1", "-w", &w, &ping_dst])
                .output()
                .expect("ping")
        });
        let t = secs.to_string();
        let mut args = vec!["iperf3", "-J", "-c", dst, "-p", &port, "-t", &t];
        if let Some(b) = bind {
            args.extend(["-B", b]);
        }
        if let Some(c) = cc {
            args.extend(["-C", c]);
        }
        let out = self.try_exec(sender, &args);
        let _ = server.kill();
        let _ = server.wait();
        let ping = ping.join().expect("ping thread");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "iperf3 output: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        assert!(v["error"].is_null(), "iperf3: {}", v["error"]);
        (v, String::from_utf8_lossy(&ping.stdout).into_owned())
    }

    /// The programs' queue model of one class (`an_vqueue`), read from the pins.
    pub fn vqueue(&self, idx: u32) -> aliasnet_ebpf::abi::VQueue {
        use aya::maps::{Array, Map, MapData};
        let path = self
            .pin_root()
            .join("maps")
            .join(aliasnet_ebpf::maps::VQUEUE);
        let m: Array<MapData, aliasnet_ebpf::abi::VQueue> = Array::try_from(Map::Array(
            MapData::from_pin(path).expect("open an_vqueue pin"),
        ))
        .expect("an_vqueue");
        m.get(&idx, 0).expect("read an_vqueue")
    }

    /// `tc -s -j class show` parsed.
    pub fn tc_json(&self, role: &str, what: &str, dev: &str) -> serde_json::Value {
        let out = self.exec(role, &["tc", "-s", "-j", what, "show", "dev", dev]);
        serde_json::from_slice(&out.stdout).expect("tc -j")
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        if let Some(mut c) = self.shaperd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for role in ["pod", "peer", "inet", "node"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(role)])
                .output();
        }
        // Pinned links of deleted devices are inert; unmounting the private bpffs frees all.
        let _ = Command::new("umount").arg(self.bpffs.path()).output();
        let _ = std::fs::remove_file(&self.shaperd_log);
        let _ = std::fs::remove_file(self.bpffs.path().with_extension("toml"));
    }
}
