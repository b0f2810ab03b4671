//! The issue-4 shaping benchmarks, side by side in one run on one netns topology.
//!
//! Builds its own namespaces (node, pod, "internet", internal peer; the layout of
//! `shaper/tests/fabric`) and a private bpffs, installs the datapath from the pinned-object
//! API, and removes everything on exit; the root network namespace is never changed.
//! Sections (`--sections`):
//!
//! - `shaping`: iperf3 TCP (`--secs`, one stream) at each rate, both directions, with a ping
//!   from the pod through the shaped class, interleaved per repetition, for: aliasnet's
//!   per-pod total limits (`Limits { ingress_rate, egress_rate }`); the same with flow
//!   isolation off (every packet to the bulk leaf, as before the sparse leaves); aliasnet's
//!   internet-only egress limit (`internet_egress_rate`); and the reference CNI `bandwidth`
//!   plugin binary, invoked with a prevResult naming the host veth (tbf on the host veth,
//!   ifb + tbf for egress). Congestion control: the namespaces' default, cubic, cubic with
//!   ECN (`net.ipv4.tcp_ecn = 1` in the test namespaces).
//! - `internal`: pod -> internal peer throughput with nothing attached, with aliasnet
//!   attached and no limits, and with a 10 Mbit/s internet-egress limit.
//! - `overhead`: pod -> internet throughput with nothing, with aliasnet's programs
//!   (classification + counting, no limits), and with OpenAI's four iptables mangle rules in
//!   the node namespace.
//! - `cost`: ns per packet of `an_host_ingress` through `BPF_PROG_TEST_RUN` with 10, 1,000
//!   and 10,000 internal prefixes (and `an_host_egress` with the queue model), against a
//!   no-op program.
//!
//! The machine is shared: run it niced up so that other work disturbs it less.
//!
//! ```text
//! cargo build -p aliasnet-shaper --example shape-bench
//! sudo nice -n -10 target/debug/examples/shape-bench --reps 3 --secs 10 \
//!     --cc default,cubic,cubic-ecn --throughput-reps 7 --out shaping-bench.md
//! ```
#![allow(clippy::print_stdout, reason = "the report goes to stdout")]

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs::File,
    io::Write as _,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use aliasnet_ebpf::{
    abi, limits::parse_quantity, maps, programs, AttachedPod, Datapath, Limits, PodAttachment,
    PodIdentity, DATAPATH_OBJECT,
};
use aliasnet_shaper::Policy;
use anyhow::{anyhow, bail, Context, Result};
use aya::{
    maps::{lpm_trie::Key, Array, HashMap, LpmTrie, Map, MapData},
    programs::{SchedClassifier, TestRun, TestRunOptions},
    EbpfLoader,
};
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};

const POD_IP: &str = "10.20.0.5";
const INTERNET: &str = "203.0.113.10";
const INTERNAL: &str = "10.30.0.10";
const CONTAINER_ID: &str = "5b5b5b5b00000000000000000000000000000000000000000000000000000001";
const BANDWIDTH_PLUGIN: &str = "/usr/lib/cni/bandwidth";

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Section {
    Shaping,
    /// `--streams` parallel downloads (iperf3 -P) into the pod at the first rate, bbr, for
    /// aliasnet and the reference: retransmits and fairness with several connections.
    Parallel,
    Internal,
    Overhead,
    Cost,
    /// Exploration: attach the pod with the first rate as its internet-egress and ingress
    /// limit and wait for SIGINT (inspect the namespaces meanwhile).
    Hold,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Config {
    /// aliasnet, per-pod total limits (ingress_rate + egress_rate), ECN marking on.
    Aliasnet,
    /// The same with the queue model off (an_config.flags: no CE marks, no pod-side drops).
    AliasnetAqmOff,
    /// The same with flow isolation off (an_config.flags: every packet to the bulk leaf),
    /// for before/after in one run: the previous design (one leaf per class).
    AliasnetFlowsOff,
    /// The same with receive-window clamping off (an_config.flags).
    AliasnetClampOff,
    /// aliasnet, internet-egress limit only (internet_egress_rate), egress only.
    AliasnetInternet,
    /// The reference CNI bandwidth plugin binary.
    Bandwidth,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Aliasnet => "aliasnet",
            Config::AliasnetAqmOff => "aliasnet, AQM off",
            Config::AliasnetFlowsOff => "aliasnet, flow isolation off",
            Config::AliasnetClampOff => "aliasnet, window clamp off",
            Config::AliasnetInternet => "aliasnet internet-only",
            Config::Bandwidth => "bandwidth plugin (tbf)",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Dir {
    /// pod -> internet (sender in the pod)
    Egress,
    /// internet -> pod (sender in the internet namespace)
    Ingress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Cc {
    /// The namespaces' default congestion control, tcp_ecn = 2 (the kernel default).
    Default,
    /// cubic, tcp_ecn = 2.
    Cubic,
    /// cubic, tcp_ecn = 1 (ECN requested by the connecting side).
    CubicEcn,
}

impl Cc {
    fn iperf_cc(self) -> Option<&'static str> {
        match self {
            Cc::Default => None,
            Cc::Cubic | Cc::CubicEcn => Some("cubic"),
        }
    }
}

#[derive(Parser, Debug)]
#[command(about = "aliasnet shaping benchmarks (issue 4), side by side in one run")]
struct Args {
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "shaping,internal,overhead,cost"
    )]
    sections: Vec<Section>,
    /// Repetitions of every shaping and throughput measurement (medians are reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// iperf3 duration, seconds.
    #[arg(long, default_value_t = 10)]
    secs: u32,
    #[arg(long, value_delimiter = ',', default_value = "10M,100M,1G")]
    rates: Vec<String>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "default,cubic-ecn"
    )]
    cc: Vec<Cc>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "aliasnet,aliasnet-flows-off,aliasnet-internet,bandwidth"
    )]
    configs: Vec<Config>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "egress,ingress"
    )]
    dirs: Vec<Dir>,
    /// Parallel stream counts of the `parallel` section.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    streams: Vec<u32>,
    /// Repetitions of the `internal` and `overhead` throughput runs.
    #[arg(long, default_value_t = 5)]
    throughput_reps: usize,
    /// Exploration: `ns:tc args` run after every aliasnet attach, e.g.
    /// `node:qdisc replace dev vh1 parent 1:1 handle 101: pfifo limit 8`.
    #[arg(long)]
    tweak: Vec<String>,
    /// Exploration: `role:k=v` sysctls set at start (role: pod, inet, peer, node).
    #[arg(long)]
    sysctl: Vec<String>,
    /// MTU of every link of the topology (pod veth, uplink, internal peer): 1500 or a jumbo
    /// MTU such as 9000.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// GRO on the node's veths.
    #[arg(long)]
    gro: bool,
    /// Write the markdown report here too.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Append every raw sample as a JSON line here.
    #[arg(long)]
    raw: Option<PathBuf>,
}

// ---- commands --------------------------------------------------------------------------

fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("spawn {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args)).map(|_| ())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn check_stop() -> Result<()> {
    if STOP.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

// ---- the topology ------------------------------------------------------------------------

/// Namespaces, private bpffs and the installed datapath; removed on drop.
struct Bench {
    tag: String,
    bpffs: tempfile::TempDir,
    mounted: bool,
    dp: Option<Datapath>,
    /// The bandwidth plugin's ifb, while the reference is attached.
    ifb: Option<String>,
    raw: Option<File>,
    tweaks: Vec<String>,
    /// Parallel iperf3 streams (`-P`) of the next runs.
    streams: u32,
    mtu: u32,
    gro: bool,
}

impl Bench {
    fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.tag)
    }

    fn ns_path(&self, role: &str) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.ns(role)))
    }

    fn pin_root(&self) -> PathBuf {
        self.bpffs.path().join("aliasnet")
    }

    fn dp(&mut self) -> &mut Datapath {
        self.dp.as_mut().expect("datapath installed")
    }

    /// Runs a command in a namespace (`ip netns exec`; no bpffs needed there).
    fn exec(&self, role: &str, cmd: &[&str]) -> Result<Output> {
        run(Command::new("ip")
            .args(["netns", "exec", &self.ns(role)])
            .args(cmd))
    }

    fn new(raw: Option<File>, tweaks: Vec<String>, mtu: u32, gro: bool) -> Result<Self> {
        let tag = format!("asb{}", std::process::id() % 100_000);
        let bpffs = tempfile::Builder::new()
            .prefix("aliasnet-shape-bench-")
            .tempdir()?;
        let mut b = Self {
            tag,
            bpffs,
            mounted: false,
            dp: None,
            ifb: None,
            raw,
            tweaks,
            streams: 1,
            mtu,
            gro,
        };
        run(Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(b.bpffs.path()))?;
        b.mounted = true;
        b.build()?;
        // This thread (and everything it starts) now lives in the node namespace; commands
        // for the other namespaces go through `ip netns exec`.
        let f = File::open(b.ns_path("node"))?;
        nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        let (mut dp, _) = Datapath::install(b.pin_root())?;
        let policy =
            Policy::parse("internal_cidrs = [\"10.0.0.0/8\"]\n").map_err(anyhow::Error::msg)?;
        dp.apply_policy(&policy)?;
        b.dp = Some(dp);
        Ok(b)
    }

    fn build(&self) -> Result<()> {
        let (node, pod, inet, peer) = (
            self.ns("node"),
            self.ns("pod"),
            self.ns("inet"),
            self.ns("peer"),
        );
        for n in [&node, &pod, &inet, &peer] {
            ip(&["netns", "add", n])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        let mtu = self.mtu.to_string();
        ip(&[
            "-n", &node, "link", "add", "vh1", "mtu", &mtu, "type", "veth", "peer", "name", "eth0",
            "mtu", &mtu, "netns", &pod,
        ])?;
        ip(&[
            "-n", &node, "link", "add", "up0", "mtu", &mtu, "type", "veth", "peer", "name", "ext0",
            "mtu", &mtu, "netns", &inet,
        ])?;
        ip(&[
            "-n", &node, "link", "add", "vp0", "mtu", &mtu, "type", "veth", "peer", "name", "int0",
            "mtu", &mtu, "netns", &peer,
        ])?;
        self.exec("node", &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        if self.gro {
            for l in ["vh1", "up0", "vp0"] {
                self.exec("node", &["ethtool", "-K", l, "gro", "on"])?;
            }
        }
        for l in ["vh1", "up0", "vp0"] {
            ip(&["-n", &node, "link", "set", l, "up"])?;
        }
        ip(&["-n", &node, "addr", "add", "100.64.0.1/30", "dev", "up0"])?;
        ip(&["-n", &node, "addr", "add", "100.64.1.1/30", "dev", "vp0"])?;
        ip(&["-n", &node, "route", "add", "default", "via", "100.64.0.2"])?;
        ip(&[
            "-n",
            &node,
            "route",
            "add",
            "10.30.0.0/16",
            "via",
            "100.64.1.2",
        ])?;
        ip(&[
            "-n",
            &node,
            "route",
            "add",
            &format!("{POD_IP}/32"),
            "dev",
            "vh1",
        ])?;
        let mac = self.mac("node", "vh1")?;
        ip(&["-n", &pod, "link", "set", "eth0", "up"])?;
        ip(&[
            "-n",
            &pod,
            "addr",
            "add",
            &format!("{POD_IP}/32"),
            "dev",
            "eth0",
        ])?;
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
        ])?;
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
        ])?;
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
        ])?;
        ip(&["-n", &inet, "link", "set", "ext0", "up"])?;
        ip(&["-n", &inet, "addr", "add", "100.64.0.2/30", "dev", "ext0"])?;
        ip(&[
            "-n",
            &inet,
            "addr",
            "add",
            &format!("{INTERNET}/32"),
            "dev",
            "lo",
        ])?;
        ip(&[
            "-n",
            &inet,
            "route",
            "add",
            "10.20.0.0/16",
            "via",
            "100.64.0.1",
        ])?;
        ip(&["-n", &peer, "link", "set", "int0", "up"])?;
        ip(&["-n", &peer, "addr", "add", "100.64.1.2/30", "dev", "int0"])?;
        ip(&[
            "-n",
            &peer,
            "addr",
            "add",
            &format!("{INTERNAL}/32"),
            "dev",
            "lo",
        ])?;
        ip(&[
            "-n",
            &peer,
            "route",
            "add",
            "10.20.0.0/16",
            "via",
            "100.64.1.1",
        ])?;
        Ok(())
    }

    fn mac(&self, role: &str, dev: &str) -> Result<String> {
        let out = run(Command::new("ip").args(["-n", &self.ns(role), "-j", "link", "show", dev]))?;
        let v: Value = serde_json::from_slice(&out.stdout)?;
        Ok(v[0]["address"]
            .as_str()
            .context("no address in ip -j link")?
            .to_owned())
    }

    fn sysctl(&self, role: &str, kv: &str) -> Result<()> {
        self.exec(role, &["sysctl", "-qw", kv]).map(|_| ())
    }

    fn sysctl_get(&self, role: &str, k: &str) -> Result<String> {
        let out = self.exec(role, &["sysctl", "-n", k])?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// tcp_ecn in every namespace with TCP endpoints.
    fn set_cc_mode(&self, cc: Cc) -> Result<()> {
        let ecn = if cc == Cc::CubicEcn { "1" } else { "2" };
        for role in ["pod", "inet", "peer"] {
            self.sysctl(role, &format!("net.ipv4.tcp_ecn={ecn}"))?;
        }
        Ok(())
    }

    fn record(&mut self, v: &Value) {
        if let Some(f) = self.raw.as_mut() {
            let _ = writeln!(f, "{v}");
        }
    }

    // ---- configurations ------------------------------------------------------------------

    fn attach(&mut self, limits: Limits) -> Result<AttachedPod> {
        let att = PodAttachment {
            host_ifname: "vh1".to_owned(),
            netns: self.ns_path("pod"),
            identity: PodIdentity {
                namespace: "bench".to_owned(),
                name: "pod-0".to_owned(),
                container_id: CONTAINER_ID.to_owned(),
                ifname: "eth0".to_owned(),
                ip: POD_IP.parse()?,
            },
            limits,
        };
        let a = self.dp().attach_pod(&att)?;
        for t in self.tweaks.clone() {
            let (role, args) = t
                .split_once(':')
                .ok_or_else(|| anyhow!("--tweak {t:?}: expected ns:tc args"))?;
            let mut cmd = vec!["tc"];
            cmd.extend(args.split_whitespace());
            self.exec(role, &cmd)?;
        }
        Ok(a)
    }

    fn detach(&mut self) -> Result<()> {
        self.dp().detach_pod(CONTAINER_ID, "eth0")?;
        Ok(())
    }

    fn config_map(&self) -> Result<Array<MapData, abi::Config>> {
        let data = MapData::from_pin(self.pin_root().join("maps").join(maps::CONFIG))?;
        Ok(Array::try_from(Map::Array(data))?)
    }

    /// Switches the queue model's signals and flow isolation on or off.
    fn set_features(&self, config: Option<Config>) -> Result<()> {
        let mut m = self.config_map()?;
        let mut c = m.get(&0, 0)?;
        c.flags &= !(abi::CFG_AQM_OFF | abi::CFG_FLOWS_OFF | abi::CFG_CLAMP_OFF);
        c.flags |= match config {
            Some(Config::AliasnetAqmOff) => abi::CFG_AQM_OFF,
            Some(Config::AliasnetFlowsOff) => abi::CFG_FLOWS_OFF,
            Some(Config::AliasnetClampOff) => abi::CFG_CLAMP_OFF,
            _ => 0,
        };
        m.set(0, c, 0)?;
        Ok(())
    }

    /// CE marks and pod-side drops of the slot's class queues.
    fn aqm_counters(&self, slot: u32) -> Result<(u64, u64)> {
        let data = MapData::from_pin(self.pin_root().join("maps").join(maps::VQUEUE))?;
        let m: Array<MapData, abi::VQueue> = Array::try_from(Map::Array(data))?;
        let (mut ce, mut dropped) = (0, 0);
        for class in [abi::VQ_INGRESS, abi::VQ_EGRESS, abi::VQ_INTERNET] {
            let q = m.get(&abi::vq_index(slot, class), 0)?;
            ce += q.ce_marked;
            dropped += q.dropped;
        }
        Ok((ce, dropped))
    }

    fn bandwidth_plugin(&self, command: &str, rate: u64) -> Result<Value> {
        // The plugin requires a burst with every rate. Kubelet/containerd pass 4294967295
        // bits when the pod sets none, which the plugin turns into a 512 MiB bucket that lets
        // a 10 s test through unshaped; use the sizing of reference/ebpf.md instead:
        // 10 ms of the rate, at least 64 KiB.
        let burst = (rate / 100).max(64 * 1024 * 8);
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "bandwidth",
            "runtimeConfig": { "bandwidth": {
                "ingressRate": rate, "ingressBurst": burst,
                "egressRate": rate, "egressBurst": burst,
            }},
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [
                    { "name": "vh1", "mac": self.mac("node", "vh1")? },
                    { "name": "eth0", "mac": self.mac("pod", "eth0")?,
                      "sandbox": self.ns_path("pod") },
                ],
                "ips": [{ "address": format!("{POD_IP}/32"), "interface": 1 }],
            },
        });
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns("node"), BANDWIDTH_PLUGIN])
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", CONTAINER_ID)
            .env("CNI_NETNS", self.ns_path("pod"))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("run the bandwidth plugin")?;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(conf.to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "bandwidth plugin {command}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if out.stdout.is_empty() {
            return Ok(Value::Null);
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    fn bandwidth_add(&mut self, rate: u64) -> Result<()> {
        let res = self.bandwidth_plugin("ADD", rate)?;
        let ifb = res["interfaces"]
            .as_array()
            .and_then(|a| {
                a.iter()
                    .filter_map(|i| i["name"].as_str())
                    .find(|n| n.starts_with("bwp"))
            })
            .ok_or_else(|| anyhow!("bandwidth plugin result names no ifb: {res}"))?;
        self.ifb = Some(ifb.to_owned());
        Ok(())
    }

    fn bandwidth_del(&mut self, rate: u64) -> Result<()> {
        self.bandwidth_plugin("DEL", rate)?;
        self.ifb = None;
        // DEL removes the ifb only (the pod's veth would go with the pod): clear the veth.
        for parent in ["root", "ingress"] {
            let _ = Command::new("ip")
                .args(["netns", "exec", &self.ns("node")])
                .args(["tc", "qdisc", "del", "dev", "vh1", parent])
                .output();
        }
        Ok(())
    }

    /// `(rx, tx)` packets of a device (skbs, for veth).
    fn link_packets(&self, role: &str, dev: &str) -> Result<(u64, u64)> {
        let out = self.exec(role, &["ip", "-s", "-j", "link", "show", "dev", dev])?;
        let v: Value = serde_json::from_slice(&out.stdout)?;
        let st = &v[0]["stats64"];
        Ok((
            st["rx"]["packets"].as_u64().context("rx packets")?,
            st["tx"]["packets"].as_u64().context("tx packets")?,
        ))
    }

    /// Root qdisc `(bytes, drops)` of a device.
    fn qdisc_counters(&self, role: &str, dev: &str) -> Result<(u64, u64)> {
        let out = self.exec(role, &["tc", "-s", "-j", "qdisc", "show", "dev", dev])?;
        let v: Value = serde_json::from_slice(&out.stdout)?;
        let root = v
            .as_array()
            .and_then(|a| a.iter().find(|q| q["root"].as_bool() == Some(true)))
            .ok_or_else(|| anyhow!("no root qdisc on {dev}: {v}"))?;
        Ok((
            root["bytes"].as_u64().unwrap_or(0),
            root["drops"].as_u64().unwrap_or(0),
        ))
    }

    // ---- measurements --------------------------------------------------------------------

    fn iperf_server(&self, role: &str, addr: &str, port: u16) -> Result<Child> {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(role)])
            .args(["iperf3", "-s", "-1", "-B", addr, "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("iperf3 server")?;
        // Wait until it listens.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let out = self.exec(role, &["ss", "-Hltn", &format!("sport = :{port}")])?;
            if !out.stdout.is_empty() {
                return Ok(child);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("iperf3 server in {role} did not start");
    }

    /// TCP segments the kernel of namespace `role` has sent so far.
    fn out_segs(&self, role: &str) -> Result<u64> {
        let out = self.exec(role, &["nstat", "-az", "--json", "TcpOutSegs"])?;
        let v: Value = serde_json::from_slice(&out.stdout).context("nstat --json")?;
        v["kernel"]["TcpOutSegs"]
            .as_u64()
            .context("no TcpOutSegs in nstat output")
    }

    /// One iperf3 run from `sender` to `dst` (server in `receiver`), with an optional ping
    /// from the pod to `ping_dst` during the middle of the run.
    #[allow(clippy::too_many_arguments)]
    fn iperf(
        &self,
        sender: &str,
        receiver: &str,
        dst: &str,
        bind: Option<&str>,
        secs: u32,
        cc: Option<&str>,
        ping_dst: Option<&str>,
    ) -> Result<Iperf> {
        static PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
        let port = 5201 + PORT.fetch_add(1, Ordering::SeqCst) % 500;
        let mut server = self.iperf_server(receiver, dst, port)?;
        let ping = ping_dst.map(|d| {
            let ns = self.ns("pod");
            let d = d.to_owned();
            let w = secs.saturating_sub(3).max(1).to_string();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1500));
                Command::new("ip")
                    .args([
                        "netns", "exec", &ns, "ping", "-n", "-q", "-i", "0.1", "-w", &w, &d,
                    ])
                    .output()
            })
        });
        let port_s = port.to_string();
        let t = secs.to_string();
        let mut args = vec!["iperf3", "-J", "-c", dst, "-p", &port_s, "-t", &t];
        if let Some(b) = bind {
            args.extend(["-B", b]);
        }
        if let Some(c) = cc {
            args.extend(["-C", c]);
        }
        let streams = self.streams.to_string();
        if self.streams > 1 {
            args.extend(["-P", &streams]);
        }
        // Segments sent come from the sender's kernel: the handshake's MSS can be lowered
        // (a slow class on a jumbo-frame device), so bytes / MSS would not do.
        let segs_before = self.out_segs(sender)?;
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns(sender)])
            .args(&args)
            .output()
            .context("iperf3 client")?;
        let segments = (self.out_segs(sender)? - segs_before) as f64;
        let _ = server.kill();
        let _ = server.wait();
        let ping = match ping {
            Some(h) => Some(parse_ping(
                &h.join().map_err(|_| anyhow!("ping thread"))??.stdout,
            )?),
            None => None,
        };
        let v: Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "iperf3 output: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        if let Some(e) = v["error"].as_str() {
            bail!("iperf3: {e}");
        }
        let end = &v["end"];
        Ok(Iperf {
            mbps: end["sum_received"]["bits_per_second"]
                .as_f64()
                .context("no sum_received")?
                / 1e6,
            seconds: end["sum_received"]["seconds"].as_f64().unwrap_or(0.0),
            retransmits: end["sum_sent"]["retransmits"].as_f64().unwrap_or(0.0),
            segments,
            cc: end["sender_tcp_congestion"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            flow_rtt: end["streams"][0]["sender"]["mean_rtt"]
                .as_f64()
                .unwrap_or(f64::NAN)
                / 1e3,
            intervals: v["intervals"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|i| {
                            (
                                i["sum"]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6,
                                i["sum"]["retransmits"].as_f64().unwrap_or(0.0),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            stream_mbps: end["streams"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| s["receiver"]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6)
                        .collect()
                })
                .unwrap_or_default(),
            ping,
        })
    }

    fn idle_rtt(&self, dst: &str) -> Result<Ping> {
        let out = self.exec(
            "pod",
            &["ping", "-n", "-q", "-c", "20", "-i", "0.02", "-W", "1", dst],
        )?;
        parse_ping(&out.stdout)
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        // Unpinning the links (removing the bpffs) detaches the programs; namespaces take
        // their devices, qdiscs and the plugin's ifb with them.
        self.dp = None;
        for role in ["pod", "peer", "inet", "node"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(role)])
                .output();
        }
        if self.mounted {
            let _ = Command::new("umount").arg(self.bpffs.path()).output();
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Ping {
    sent: u32,
    received: u32,
    avg: f64,
    max: f64,
}

fn parse_ping(out: &[u8]) -> Result<Ping> {
    let text = String::from_utf8_lossy(out);
    let mut p = Ping::default();
    for l in text.lines() {
        if l.contains("packets transmitted") {
            let f: Vec<&str> = l.split(", ").collect();
            p.sent = f[0].split(' ').next().unwrap_or("0").parse().unwrap_or(0);
            p.received = f
                .get(1)
                .and_then(|s| s.split(' ').next())
                .unwrap_or("0")
                .parse()
                .unwrap_or(0);
        }
        if let Some(rest) = l.split(" = ").nth(1).filter(|_| l.starts_with("rtt")) {
            let nums: Vec<f64> = rest
                .split(" ms")
                .next()
                .unwrap_or("")
                .split('/')
                .filter_map(|x| x.parse().ok())
                .collect();
            if nums.len() == 4 {
                p.avg = nums[1];
                p.max = nums[2];
            }
        }
    }
    if p.received == 0 {
        // Every request lost (or refused locally: ENOBUFS from a full pod-side queue).
        p.avg = f64::NAN;
        p.max = f64::NAN;
    }
    Ok(p)
}

#[derive(Debug, Clone)]
struct Iperf {
    mbps: f64,
    seconds: f64,
    retransmits: f64,
    segments: f64,
    cc: String,
    /// The sender's smoothed RTT of the bulk flow (iperf3 mean_rtt), ms.
    flow_rtt: f64,
    intervals: Vec<(f64, f64)>,
    /// Received Mbit/s of each parallel stream.
    stream_mbps: Vec<f64>,
    ping: Option<Ping>,
}

impl Iperf {
    fn retrans_pct(&self) -> f64 {
        if self.segments > 0.0 {
            100.0 * self.retransmits / self.segments
        } else {
            0.0
        }
    }
}

// ---- shaping -------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct ShapeKey {
    cc: Cc,
    rate: u64,
    dir: Dir,
    config: Config,
}

/// One shaping run.
struct Sample {
    iperf: Iperf,
    /// L2 rate through the shaping qdisc (its byte counter), Mbit/s.
    l2_mbps: f64,
    /// Drops counted by the shaping qdisc (drop-tail).
    qdisc_drops: u64,
    /// CE marks and pod-side drops by the programs' queue model.
    ce: u64,
    aqm_drops: u64,
    idle: Ping,
}

#[derive(Debug, Clone, Default)]
struct ShapeStats {
    goodput_pct: Vec<f64>,
    l2_pct: Vec<f64>,
    retrans_pct: Vec<f64>,
    ping_avg: Vec<f64>,
    ping_max: Vec<f64>,
    ping_replies: Vec<f64>,
    ping_sent: Vec<f64>,
    flow_rtt: Vec<f64>,
    idle_avg: Vec<f64>,
    qdisc_drops: Vec<f64>,
    ce: Vec<f64>,
    aqm_drops: Vec<f64>,
    cc: String,
}

fn applies(config: Config, dir: Dir) -> bool {
    match config {
        Config::AliasnetInternet => dir == Dir::Egress,
        _ => true,
    }
}

/// Seconds the ping runs: every 0.1 s from 1.5 s to 1.5 s before the end.
fn pings_expected(secs: u32) -> u32 {
    secs.saturating_sub(3).max(1)
}

fn shaping_run(b: &mut Bench, key: ShapeKey, secs: u32) -> Result<Sample> {
    let rate = key.rate;
    let mut slot = None;
    match key.config {
        Config::Aliasnet
        | Config::AliasnetAqmOff
        | Config::AliasnetFlowsOff
        | Config::AliasnetClampOff => {
            b.set_features(Some(key.config))?;
            let a = b.attach(Limits {
                ingress_rate: Some(rate),
                egress_rate: Some(rate),
                ..Limits::default()
            })?;
            slot = Some(a.slot);
        }
        Config::AliasnetInternet => {
            b.set_features(None)?;
            let a = b.attach(Limits {
                internet_egress_rate: Some(rate),
                ..Limits::default()
            })?;
            slot = Some(a.slot);
        }
        Config::Bandwidth => b.bandwidth_add(rate)?,
    }
    let result = (|| {
        let (role, dev) = match (key.config, key.dir) {
            (Config::Bandwidth, Dir::Egress) => ("node", b.ifb.clone().expect("ifb")),
            (_, Dir::Egress) => ("pod", "eth0".to_owned()),
            (_, Dir::Ingress) => ("node", "vh1".to_owned()),
        };
        let idle = b.idle_rtt(INTERNET)?;
        let (bytes0, drops0) = b.qdisc_counters(role, &dev)?;
        let aqm0 = slot
            .map(|s| b.aqm_counters(s))
            .transpose()?
            .unwrap_or_default();
        let iperf = match key.dir {
            Dir::Egress => b.iperf(
                "pod",
                "inet",
                INTERNET,
                None,
                secs,
                key.cc.iperf_cc(),
                Some(INTERNET),
            )?,
            Dir::Ingress => b.iperf(
                "inet",
                "pod",
                POD_IP,
                Some(INTERNET),
                secs,
                key.cc.iperf_cc(),
                Some(INTERNET),
            )?,
        };
        let (bytes1, drops1) = b.qdisc_counters(role, &dev)?;
        let aqm1 = slot
            .map(|s| b.aqm_counters(s))
            .transpose()?
            .unwrap_or_default();
        Ok(Sample {
            l2_mbps: (bytes1 - bytes0) as f64 * 8.0 / iperf.seconds.max(1e-3) / 1e6,
            qdisc_drops: drops1 - drops0,
            ce: aqm1.0 - aqm0.0,
            aqm_drops: aqm1.1 - aqm0.1,
            iperf,
            idle,
        })
    })();
    match key.config {
        Config::Bandwidth => b.bandwidth_del(rate)?,
        _ => {
            b.detach()?;
            b.set_features(None)?;
        }
    }
    result
}

fn fmt_rate(r: u64) -> String {
    aliasnet_ebpf::limits::fmt_rate(r)
}

fn shaping(b: &mut Bench, args: &Args, rates: &[u64], report: &mut String) -> Result<()> {
    let mut stats: BTreeMap<ShapeKey, ShapeStats> = BTreeMap::new();
    let load0 = loadavg();
    let started = Instant::now();
    let expected = pings_expected(args.secs);
    for rep in 0..args.reps {
        for &rate in rates {
            for &cc in &args.cc {
                b.set_cc_mode(cc)?;
                for &config in &args.configs {
                    for &dir in &args.dirs {
                        if !applies(config, dir) {
                            continue;
                        }
                        check_stop()?;
                        let key = ShapeKey {
                            cc,
                            rate,
                            dir,
                            config,
                        };
                        let x =
                            shaping_run(b, key, args.secs).with_context(|| format!("{key:?}"))?;
                        let r = &x.iperf;
                        let conf = rate as f64 / 1e6;
                        let ping = r.ping.unwrap_or_default();
                        eprintln!(
                            "rep {rep} {:>9} {:?}/{:?} {:<26} goodput {:7.2} ({:5.1}%) L2 {:5.1}% retrans {:5.2}% ping {:6.2}/{:6.2} ms {:2}/{} flow rtt {:5.1} qdisc drops {} ce {} aqm drops {} [load {}]",
                            fmt_rate(rate),
                            cc,
                            dir,
                            config.name(),
                            r.mbps,
                            100.0 * r.mbps / conf,
                            100.0 * x.l2_mbps / conf,
                            r.retrans_pct(),
                            ping.avg,
                            ping.max,
                            ping.received,
                            ping.sent,
                            r.flow_rtt,
                            x.qdisc_drops,
                            x.ce,
                            x.aqm_drops,
                            loadavg()
                        );
                        b.record(&json!({
                            "section": "shaping", "rep": rep, "rate": rate,
                            "cc_mode": format!("{cc:?}"), "cc": r.cc, "dir": format!("{dir:?}"),
                            "config": config.name(), "goodput_mbps": r.mbps,
                            "l2_mbps": x.l2_mbps, "seconds": r.seconds,
                            "retransmits": r.retransmits, "segments": r.segments,
                            "ping_avg": ping.avg, "ping_max": ping.max,
                            "ping_received": ping.received, "ping_sent": ping.sent,
                            "idle_avg": x.idle.avg, "flow_rtt_ms": r.flow_rtt,
                            "qdisc_drops": x.qdisc_drops, "ce_marked": x.ce,
                            "aqm_drops": x.aqm_drops, "intervals": r.intervals,
                            "loadavg": loadavg(),
                        }));
                        let s = stats.entry(key).or_default();
                        s.goodput_pct.push(100.0 * r.mbps / conf);
                        s.l2_pct.push(100.0 * x.l2_mbps / conf);
                        s.retrans_pct.push(r.retrans_pct());
                        s.ping_avg.push(ping.avg);
                        s.ping_max.push(ping.max);
                        s.ping_replies.push(f64::from(ping.received));
                        s.ping_sent.push(f64::from(ping.sent));
                        s.flow_rtt.push(r.flow_rtt);
                        s.idle_avg.push(x.idle.avg);
                        s.qdisc_drops.push(x.qdisc_drops as f64);
                        s.ce.push(x.ce as f64);
                        s.aqm_drops.push(x.aqm_drops as f64);
                        s.cc.clone_from(&r.cc);
                    }
                }
            }
        }
    }
    let _ = writeln!(
        report,
        "\n### Shaping: iperf3 TCP {} s, one stream, medians of {} runs\n\nLoad average {} at the start, {} at the end; {:.0} min. Ping: every 0.1 s from the pod to the \
         remote host for {expected} s of the run (replies of the requests ping sent; a request refused locally with ENOBUFS is not sent); idle RTT {:.2} ms (median). \
         Flow RTT: the sender's mean smoothed RTT of the iperf3 flow.\n",
        args.secs,
        args.reps,
        load0,
        loadavg(),
        started.elapsed().as_secs_f64() / 60.0,
        median(&stats.values().flat_map(|s| s.idle_avg.iter().copied()).collect::<Vec<_>>()),
    );
    let _ = writeln!(
        report,
        "| CC | rate | direction | config | goodput / configured | L2 / configured | retransmits | ping avg / max ms | ping replies / sent | flow RTT ms | qdisc drops | CE marks | pod-side drops |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (k, s) in &stats {
        let cc = match k.cc {
            Cc::Default => format!("default ({})", s.cc),
            Cc::Cubic => "cubic".to_owned(),
            Cc::CubicEcn => "cubic + ECN".to_owned(),
        };
        let dir = match k.dir {
            Dir::Egress => "pod → internet",
            Dir::Ingress => "internet → pod",
        };
        let _ = writeln!(
            report,
            "| {cc} | {} | {dir} | {} | {:.1} % | {:.1} % | {:.2} % | {:.2} / {:.2} | {:.0} / {:.0} | {:.1} | {:.0} | {:.0} | {:.0} |",
            fmt_rate(k.rate),
            k.config.name(),
            median(&s.goodput_pct),
            median(&s.l2_pct),
            median(&s.retrans_pct),
            median(&s.ping_avg),
            median(&s.ping_max),
            median(&s.ping_replies),
            median(&s.ping_sent),
            median(&s.flow_rtt),
            median(&s.qdisc_drops),
            median(&s.ce),
            median(&s.aqm_drops),
        );
    }
    Ok(())
}

fn parallel(b: &mut Bench, args: &Args, rate: u64, report: &mut String) -> Result<()> {
    #[derive(Default)]
    struct Row {
        goodput_pct: Vec<f64>,
        retrans_pct: Vec<f64>,
        slowest_pct: Vec<f64>,
        fastest_pct: Vec<f64>,
        qdisc_drops: Vec<f64>,
        ping_avg: Vec<f64>,
    }
    let configs: Vec<Config> = [Config::Aliasnet, Config::Bandwidth]
        .into_iter()
        .filter(|c| args.configs.contains(c))
        .collect();
    let mut rows: BTreeMap<(u32, Config), Row> = BTreeMap::new();
    let load0 = loadavg();
    b.set_cc_mode(Cc::Default)?;
    for rep in 0..args.reps {
        for &n in &args.streams {
            for &config in &configs {
                check_stop()?;
                b.streams = n.max(1);
                let key = ShapeKey {
                    cc: Cc::Default,
                    rate,
                    dir: Dir::Ingress,
                    config,
                };
                let x = shaping_run(b, key, args.secs);
                b.streams = 1;
                let x = x.with_context(|| format!("{n} streams, {key:?}"))?;
                let r = &x.iperf;
                let conf = rate as f64 / 1e6;
                // Each stream against a fair share of the configured rate.
                let fair = conf / f64::from(n.max(1));
                let slowest = r.stream_mbps.iter().copied().fold(f64::INFINITY, f64::min);
                let fastest = r.stream_mbps.iter().copied().fold(0.0, f64::max);
                let ping = r.ping.unwrap_or_default();
                eprintln!(
                    "rep {rep} {n:>2} streams {:<24} goodput {:5.1}% retrans {:5.2}% streams {:5.1}-{:5.1}% of fair, qdisc drops {} ping {:.2} ms [load {}]",
                    config.name(),
                    100.0 * r.mbps / conf,
                    r.retrans_pct(),
                    100.0 * slowest / fair,
                    100.0 * fastest / fair,
                    x.qdisc_drops,
                    ping.avg,
                    loadavg()
                );
                b.record(&json!({
                    "section": "parallel", "rep": rep, "rate": rate, "streams": n,
                    "config": config.name(), "cc": r.cc, "goodput_mbps": r.mbps,
                    "retransmits": r.retransmits, "segments": r.segments,
                    "stream_mbps": r.stream_mbps, "qdisc_drops": x.qdisc_drops,
                    "ping_avg": ping.avg, "loadavg": loadavg(),
                }));
                let row = rows.entry((n, config)).or_default();
                row.goodput_pct.push(100.0 * r.mbps / conf);
                row.retrans_pct.push(r.retrans_pct());
                row.slowest_pct.push(100.0 * slowest / fair);
                row.fastest_pct.push(100.0 * fastest / fair);
                row.qdisc_drops.push(x.qdisc_drops as f64);
                row.ping_avg.push(ping.avg);
            }
        }
    }
    let _ = writeln!(
        report,
        "\n### Parallel downloads into the pod: iperf3 -P N, {} s, bbr, {} ingress limit, medians of {} runs\n\nLoad average {} at the start, {} at the end. Streams: the slowest and the fastest stream's goodput against a fair share (configured / N).\n\n| streams | config | goodput / configured | retransmits | slowest / fastest stream, % of fair | qdisc drops | ping avg ms |\n|---|---|---|---|---|---|---|",
        args.secs,
        fmt_rate(rate),
        args.reps,
        load0,
        loadavg()
    );
    for ((n, config), r) in &rows {
        let _ = writeln!(
            report,
            "| {n} | {} | {:.1} % | {:.2} % | {:.0} / {:.0} | {:.0} | {:.2} |",
            config.name(),
            median(&r.goodput_pct),
            median(&r.retrans_pct),
            median(&r.slowest_pct),
            median(&r.fastest_pct),
            median(&r.qdisc_drops),
            median(&r.ping_avg),
        );
    }
    Ok(())
}

// ---- internal and overhead ----------------------------------------------------------------

const IPTABLES_RULES: [[&str; 2]; 4] = [
    [
        "INPUT",
        "! -s 10.0.0.0/8 -m comment --comment iptables-exporter openai traffic=internet-in",
    ],
    [
        "FORWARD",
        "! -s 10.0.0.0/8 -m comment --comment iptables-exporter openai traffic=internet-in",
    ],
    [
        "OUTPUT",
        "! -d 10.0.0.0/8 -m comment --comment iptables-exporter openai traffic=internet-out",
    ],
    [
        "FORWARD",
        "! -d 10.0.0.0/8 -m comment --comment iptables-exporter openai traffic=internet-out",
    ],
];

fn iptables(b: &Bench, add: bool) -> Result<()> {
    if !add {
        b.exec("node", &["iptables", "-t", "mangle", "-F"])?;
        return Ok(());
    }
    for [chain, spec] in IPTABLES_RULES {
        let (before, comment) = spec.split_once("--comment ").expect("comment");
        let mut cmd = vec!["iptables", "-t", "mangle", "-A", chain];
        cmd.extend(before.split_whitespace());
        cmd.extend(["--comment", comment]);
        b.exec("node", &cmd)?;
    }
    Ok(())
}

/// Bytes the FORWARD internet-out rule counted (to check the rules saw the traffic).
fn iptables_forward_bytes(b: &Bench) -> Result<u64> {
    let out = b.exec(
        "node",
        &[
            "iptables", "-t", "mangle", "-L", "FORWARD", "-v", "-x", "-n",
        ],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter(|l| l.contains("internet-out"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum())
}

fn throughput_section(
    b: &mut Bench,
    args: &Args,
    title: &str,
    dst: &str,
    receiver: &str,
    variants: &[&str],
    report: &mut String,
) -> Result<()> {
    let load0 = loadavg();
    let mut res: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut skbs: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    b.set_cc_mode(Cc::Default)?;
    for rep in 0..args.throughput_reps {
        for &v in variants {
            check_stop()?;
            let mut check = String::new();
            match v {
                "nothing" => {}
                "aliasnet, no limits" => {
                    b.attach(Limits::default())?;
                }
                "aliasnet, internet egress 10 Mbit/s" => {
                    b.attach(Limits {
                        internet_egress_rate: Some(10_000_000),
                        ..Limits::default()
                    })?;
                }
                "iptables mangle (4 rules)" => iptables(b, true)?,
                other => bail!("unknown variant {other}"),
            }
            let link0 = b.link_packets("node", "vh1")?;
            let r = b.iperf("pod", receiver, dst, None, args.secs, None, None);
            let link1 = b.link_packets("node", "vh1")?;
            // skbs per second through the host veth's two hooks (veth counts skbs, not
            // segments): what the programs run on.
            let skb_rates = r.as_ref().map_or((0.0, 0.0), |r| {
                let s = r.seconds.max(1e-3);
                (
                    (link1.0 - link0.0) as f64 / s,
                    (link1.1 - link0.1) as f64 / s,
                )
            });
            skbs.entry(v).or_default().push(skb_rates);
            match v {
                "nothing" => {}
                "iptables mangle (4 rules)" => {
                    let n = iptables_forward_bytes(b)?;
                    check = format!(" (FORWARD internet-out rule counted {n} bytes)");
                    iptables(b, false)?;
                }
                _ => b.detach()?,
            }
            let r = r?;
            eprintln!(
                "rep {rep} {title}: {v:<36} {:8.1} Mbit/s{check}, host veth skbs/s in {:.0} out {:.0} [load {}]",
                r.mbps,
                skb_rates.0,
                skb_rates.1,
                loadavg()
            );
            b.record(&json!({
                "section": title, "rep": rep, "variant": v, "mbps": r.mbps, "cc": r.cc,
                "retransmits": r.retransmits, "loadavg": loadavg(),
            }));
            res.entry(v).or_default().push(r.mbps);
        }
    }
    let base = median(&res["nothing"]);
    let _ = writeln!(
        report,
        "\n### {title}\n\niperf3 TCP {} s, default congestion control, {} interleaved runs; load average {} at the start, {} at the end. \
         skbs/s: through the pod's host veth (veth counts skbs; a GSO skb is one), from the pod / to the pod.\n\n| variant | median Mbit/s | min - max | vs nothing | skbs/s from / to the pod |\n|---|---|---|---|---|",
        args.secs,
        args.throughput_reps,
        load0,
        loadavg()
    );
    for &v in variants {
        let s = &res[v];
        let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = s.iter().copied().fold(0.0, f64::max);
        let sk = &skbs[v];
        let _ = writeln!(
            report,
            "| {v} | {:.0} | {lo:.0} - {hi:.0} | {:.1} % | {:.0} / {:.0} |",
            median(s),
            100.0 * median(s) / base,
            median(&sk.iter().map(|x| x.0).collect::<Vec<_>>()),
            median(&sk.iter().map(|x| x.1).collect::<Vec<_>>()),
        );
    }
    Ok(())
}

// ---- classification cost ---------------------------------------------------------------------

/// A 64-byte IPv4/UDP frame from the pod to `dst`.
fn udp_frame(dst: [u8; 4]) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00];
    let total: u16 = 64 - 14;
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0, 1, 0, 0, 64, 17, 0, 0]);
    h.extend_from_slice(&[10, 20, 0, 5]);
    h.extend_from_slice(&dst);
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p.extend(h);
    p.extend_from_slice(&[0x9c, 0x40, 0x01, 0xbb, 0, 30, 0, 0]);
    p.resize(64, 0xab);
    p
}

/// xorshift64*: reproducible prefixes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;

/// A two-instruction SCHED_CLS program (`r0 = -1; exit`): the harness baseline.
fn load_noop() -> Result<OwnedFd> {
    // mov64 r0, -1 (BPF_ALU64 | BPF_MOV | BPF_K = 0xb7), exit (0x95)
    let insns: [u64; 2] = [0xffff_ffff_0000_00b7, 0x95];
    let license = c"GPL";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    // SAFETY: bpf(BPF_PROG_LOAD) with a zeroed attr of sufficient size whose pointers
    // reference live locals for the duration of the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            attr.as_mut_ptr(),
            attr.len() as u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("load no-op program");
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_PROG_TEST_RUN` repetitions per measurement, and measurements per point (`cost`).
const REPEAT: u32 = 1_000_000;
const RUNS: usize = 5;

/// `RUNS` measurements of `prog` on `pkt`: the average ns per run the kernel reports for each.
fn test_run_ns(prog: &SchedClassifier, pkt: &[u8]) -> Result<Vec<f64>> {
    let mut out = vec![0u8; pkt.len() + 256];
    (0..RUNS)
        .map(|_| {
            let r = prog.test_run(TestRunOptions {
                data_in: Some(pkt),
                data_out: Some(&mut out),
                repeat: REPEAT,
                ..TestRunOptions::new()
            })?;
            Ok(r.duration.as_nanos() as f64)
        })
        .collect()
}

/// Average ns per run the kernel reports for `repeat` runs.
fn test_run_raw(fd: &OwnedFd, pkt: &[u8], repeat: u32) -> Result<u32> {
    let mut out = vec![0u8; pkt.len() + 256];
    let mut attr = [0u8; 80];
    attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[8..12].copy_from_slice(&(pkt.len() as u32).to_ne_bytes());
    attr[12..16].copy_from_slice(&(out.len() as u32).to_ne_bytes());
    attr[16..24].copy_from_slice(&(pkt.as_ptr() as u64).to_ne_bytes());
    attr[24..32].copy_from_slice(&(out.as_mut_ptr() as u64).to_ne_bytes());
    attr[32..36].copy_from_slice(&repeat.to_ne_bytes());
    // SAFETY: bpf(BPF_PROG_TEST_RUN) on a program we own; buffers outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            attr.as_mut_ptr(),
            attr.len() as u32,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("BPF_PROG_TEST_RUN");
    }
    Ok(u32::from_ne_bytes(
        attr[36..40].try_into().expect("4 bytes"),
    ))
}

fn cost(report: &mut String) -> Result<()> {
    let load0 = loadavg();
    let hit_dst = [10, 77, 1, 2];
    let miss_dst = [203, 0, 113, 9];
    let noop = load_noop()?;
    let pkt = udp_frame(miss_dst);
    let noop_ns: Vec<f64> = (0..RUNS)
        .map(|_| test_run_raw(&noop, &pkt, REPEAT).map(f64::from))
        .collect::<Result<_>>()?;
    let _ = writeln!(
        report,
        "\n### Classification + counting cost (`BPF_PROG_TEST_RUN`)\n\n`an_host_ingress` on a 64-byte IPv4/UDP frame from a registered pod, repeat = {REPEAT}, {RUNS} runs; random /16-/32 internal prefixes. Load average {load0} at the start.\n\n| internal prefixes | hit: best / median ns | miss (internet): best / median ns | minus no-op (hit / miss, medians) |\n|---|---|---|---|"
    );
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let noop_med = median(&noop_ns);
    let mut model_row = String::new();
    for n in [10usize, 1_000, 10_000] {
        let mut ebpf = EbpfLoader::new().load(DATAPATH_OBJECT)?;
        for name in [programs::HOST_INGRESS, programs::HOST_EGRESS] {
            let prog: &mut SchedClassifier =
                ebpf.program_mut(name).context("program")?.try_into()?;
            prog.load()?;
        }
        {
            let mut cfg: Array<_, abi::Config> =
                Array::try_from(ebpf.map_mut(maps::CONFIG).context("config")?)?;
            cfg.set(
                0,
                abi::Config {
                    abi_version: abi::ABI_VERSION,
                    ..Default::default()
                },
                0,
            )?;
        }
        {
            let mut pods: HashMap<_, u32, abi::Pod> =
                HashMap::try_from(ebpf.map_mut(maps::PODS).context("pods")?)?;
            // skb->dev of a test run is the loopback device of this namespace.
            pods.insert(
                1,
                abi::Pod {
                    slot: 0,
                    ..Default::default()
                },
                0,
            )?;
        }
        {
            let mut trie: LpmTrie<_, abi::LpmKeyData, abi::LpmValue> =
                LpmTrie::try_from(ebpf.map_mut(maps::PREFIXES).context("prefixes")?)?;
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            trie.insert(
                &Key::new(32 + 16, abi::LpmKeyData::new(0, [10, 77, 0, 0].into())),
                abi::LpmValue::default(),
                0,
            )?;
            let mut inserted = 1;
            while inserted < n {
                let len = 16 + (rng.next() % 17) as u32;
                let addr = (rng.next() as u32) & (u32::MAX << (32 - len));
                // Keep the "miss" address outside every prefix.
                if addr >> 24 == 203 {
                    continue;
                }
                trie.insert(
                    &Key::new(32 + len, abi::LpmKeyData::new(0, addr.into())),
                    abi::LpmValue::default(),
                    0,
                )?;
                inserted += 1;
            }
        }
        let prog: &SchedClassifier = ebpf
            .program(programs::HOST_INGRESS)
            .context("program")?
            .try_into()?;
        let hit = test_run_ns(prog, &udp_frame(hit_dst))?;
        let miss = test_run_ns(prog, &udp_frame(miss_dst))?;
        eprintln!("cost {n} prefixes: hit {hit:?} miss {miss:?} noop {noop_ns:?}");
        if n == 10 {
            // The other direction of a pod with an ingress limit: classification, counting
            // and the queue model with a CE mark (the class is congested after the first
            // few runs, and stays so), on an ECT(0) TCP frame from the internet.
            let mut meta: Array<_, abi::PodMeta> =
                Array::try_from(ebpf.map_mut(maps::POD_META).context("meta")?)?;
            meta.set(
                0,
                abi::PodMeta {
                    ingress_rate: 10_000_000,
                    ..Default::default()
                },
                0,
            )?;
            let prog: &SchedClassifier = ebpf
                .program(programs::HOST_EGRESS)
                .context("program")?
                .try_into()?;
            let mut pkt = udp_frame([10, 20, 0, 5]);
            pkt[14 + 1] = 0x02; // ECT(0)
            pkt[14 + 9] = 6; // TCP
            pkt[14 + 12..14 + 16].copy_from_slice(&[203, 0, 113, 9]);
            let model = test_run_ns(prog, &pkt)?;
            eprintln!("cost an_host_egress with the queue model: {model:?}");
            model_row = format!(
                "| 10, `an_host_egress` of a pod with an ingress limit (queue model, CE mark) | {:.0} / {:.0} | | {:.0} |",
                best(&model),
                median(&model),
                median(&model) - noop_med
            );
        }
        let _ = writeln!(
            report,
            "| {n} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} |",
            best(&hit),
            median(&hit),
            best(&miss),
            median(&miss),
            median(&hit) - noop_med,
            median(&miss) - noop_med
        );
    }
    let _ = writeln!(report, "{model_row}");
    let _ = writeln!(
        report,
        "| no-op program (harness) | {:.0} / {:.0} | | |",
        best(&noop_ns),
        noop_med
    );
    Ok(())
}

// ---- main ----------------------------------------------------------------------------------

fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("shape-bench creates network namespaces and loads BPF programs: run it as root");
    }
    for tool in ["iperf3", "ping", "tc", "iptables"] {
        run(Command::new("sh").args(["-c", &format!("command -v {tool}")]))
            .with_context(|| format!("{tool} is not installed"))?;
    }
    if args.sections.contains(&Section::Shaping)
        && args.configs.contains(&Config::Bandwidth)
        && !Path::new(BANDWIDTH_PLUGIN).exists()
    {
        bail!("{BANDWIDTH_PLUGIN} is missing (apt-get install containernetworking-plugins)");
    }
    let rates: Vec<u64> = args
        .rates
        .iter()
        .map(|r| parse_quantity(r).map_err(|e| anyhow!("--rates {r}: {e}")))
        .collect::<Result<_>>()?;
    for sig in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
    ] {
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::Handler(on_signal))?;
        }
    }
    let raw = args
        .raw
        .as_ref()
        .map(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
        })
        .transpose()?;

    let mut b = Bench::new(raw, args.tweak.clone(), args.mtu, args.gro)?;
    for s in &args.sysctl {
        let (role, kv) = s
            .split_once(':')
            .ok_or_else(|| anyhow!("--sysctl {s:?}: expected role:k=v"))?;
        b.sysctl(role, kv)?;
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut report = format!(
        "## Shaping benchmark (shape-bench)\n\nKernel {}, {} CPUs, default congestion control in the test namespaces: {}; {}.\n",
        kernel.trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        b.sysctl_get("pod", "net.ipv4.tcp_congestion_control")?,
        String::from_utf8_lossy(&run(Command::new("date").arg("-u"))?.stdout).trim()
    );
    let result = (|| -> Result<()> {
        for s in &args.sections {
            match s {
                Section::Shaping => shaping(&mut b, &args, &rates, &mut report)?,
                Section::Parallel => parallel(&mut b, &args, rates[0], &mut report)?,
                Section::Internal => throughput_section(
                    &mut b,
                    &args,
                    "Internal traffic of a pod with an internet limit (pod → internal peer)",
                    INTERNAL,
                    "peer",
                    &[
                        "nothing",
                        "aliasnet, no limits",
                        "aliasnet, internet egress 10 Mbit/s",
                    ],
                    &mut report,
                )?,
                Section::Overhead => throughput_section(
                    &mut b,
                    &args,
                    "Classification overhead (pod → internet, unshaped)",
                    INTERNET,
                    "inet",
                    &[
                        "nothing",
                        "aliasnet, no limits",
                        "iptables mangle (4 rules)",
                    ],
                    &mut report,
                )?,
                Section::Cost => cost(&mut report)?,
                Section::Hold => {
                    let a = b.attach(Limits {
                        ingress_rate: Some(rates[0]),
                        internet_egress_rate: Some(rates[0]),
                        ..Limits::default()
                    })?;
                    eprintln!("holding {} (slot {}); SIGINT to clean up", b.tag, a.slot);
                    while !STOP.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            }
        }
        Ok(())
    })();
    println!("{report}");
    if let Some(out) = &args.out {
        std::fs::write(out, &report).with_context(|| format!("write {}", out.display()))?;
    }
    result
}
