//! The shaping bench's node: the fabric's single-node topology with the datapath installed,
//! the configurations under test (aliasnet's limits, node policy and feature switches, the
//! reference bandwidth plugin) and one iperf3 measurement.

use std::{
    fs::File,
    io::Write as _,
    process::{Command, Output},
    time::Duration,
};

use aliasnet_ebpf::{
    abi, bench_datapath_object, maps, AttachedPod, Datapath, Limits, PodAttachment, PodIdentity,
};
use aliasnet_netns::NetNs;
use aliasnet_shaper::Policy;
use aliasnet_tests::{
    cni::{invoke, Invocation},
    single::{host_veth, pod_ip, pod_role, IperfOpts, Links, PingDuring, SingleNode},
    traffic::{netns_exec, parse_ping, Ping},
};
use anyhow::{anyhow, bail, Context, Result};
use aya::maps::{Array, Map, MapData, PerCpuArray};
use serde_json::{json, Value};

use super::{Cc, Config, BANDWIDTH_PLUGIN};

pub use aliasnet_tests::single::{INTERNAL, INTERNET, MIRROR, POD_IP};

/// The node policy every run starts from (and returns to).
pub const BASE_POLICY: &str = "internal_cidrs = [\"10.0.0.0/8\"]\n";

/// The container id of pod `i`.
fn container_id(i: usize) -> String {
    format!("5b5b5b5b{:056x}", i + 1)
}

/// Run a command; fails with its stderr unless it succeeds.
pub fn run_ok(cmd: &mut Command) -> Result<Output> {
    aliasnet_tests::netns::run(cmd)
}

/// The topology and the installed datapath; removed on drop.
pub struct Bench {
    // Field order is drop order: unpinning the links (removing the bpffs with the topology)
    // detaches the programs; the namespaces take their devices, qdiscs and the plugin's ifb
    // with them.
    dp: Option<Datapath>,
    pub net: SingleNode,
    /// The bandwidth plugin's ifb of pod 0, while the reference is attached with an egress
    /// limit.
    pub ifb: Option<String>,
    raw: Option<File>,
    tweaks: Vec<String>,
    /// Parallel iperf3 streams (`-P`) of the next runs.
    pub streams: u32,
}

/// One iperf3 run.
#[derive(Debug, Clone)]
pub struct Iperf {
    pub mbps: f64,
    pub seconds: f64,
    pub retransmits: f64,
    pub segments: f64,
    pub cc: String,
    /// The sender's smoothed RTT of the bulk flow (iperf3 mean_rtt), ms.
    pub flow_rtt: f64,
    pub intervals: Vec<(f64, f64)>,
    /// Mbit/s the receiver got in each second (the server's report: the client sends).
    pub receiver_intervals: Vec<f64>,
    /// Received Mbit/s of each parallel stream.
    pub stream_mbps: Vec<f64>,
    pub ping: Option<Ping>,
}

impl Iperf {
    pub fn retrans_pct(&self) -> f64 {
        if self.segments > 0.0 {
            100.0 * self.retransmits / self.segments
        } else {
            0.0
        }
    }
}

impl Bench {
    pub fn new(raw: Option<File>, tweaks: Vec<String>, mtu: u32, gro: bool) -> Result<Self> {
        let net = SingleNode::build(
            Links {
                uplink_mtu: mtu,
                pod_mtu: mtu,
                gro,
            },
            None,
        )?;
        let mut b = Self {
            dp: None,
            net,
            ifb: None,
            raw,
            tweaks,
            streams: 1,
        };
        let pin_root = b.net.pin_root();
        let dp = b.in_node(|_| -> Result<Datapath> {
            // The benchmarks' build: it obeys the switches `set_features` sets.
            let (mut dp, _) = Datapath::install_object(pin_root, bench_datapath_object()?)?;
            let policy = Policy::parse(BASE_POLICY).map_err(anyhow::Error::msg)?;
            dp.apply_policy(&policy)?;
            Ok(dp)
        })?;
        b.dp = Some(dp);
        Ok(b)
    }

    /// Runs `f` with this thread in the node namespace (the datapath's calls need it;
    /// commands for the other namespaces go through `ip netns exec`).
    pub fn in_node<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let ns = NetNs::open(self.net.ns_path("node")).expect("open the node netns");
        ns.enter(|| f(self)).expect("enter the node netns")
    }

    fn dp(&mut self) -> &mut Datapath {
        self.dp.as_mut().expect("datapath installed")
    }

    /// Runs a command in a namespace (`ip netns exec`; no bpffs needed there).
    pub fn exec(&self, role: &str, cmd: &[&str]) -> Result<Output> {
        self.net.run(role, cmd)
    }

    pub fn sysctl(&self, role: &str, kv: &str) -> Result<()> {
        self.exec(role, &["sysctl", "-qw", kv]).map(|_| ())
    }

    pub fn sysctl_get(&self, role: &str, k: &str) -> Result<String> {
        let out = self.exec(role, &["sysctl", "-n", k])?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// tcp_ecn in every namespace with TCP endpoints.
    pub fn set_cc_mode(&self, cc: Cc) -> Result<()> {
        let ecn = if cc.ecn() { "1" } else { "2" };
        for role in ["pod", "inet", "peer"] {
            self.sysctl(role, &format!("net.ipv4.tcp_ecn={ecn}"))?;
        }
        Ok(())
    }

    pub fn record(&mut self, v: &Value) {
        if let Some(f) = self.raw.as_mut() {
            let _ = writeln!(f, "{v}");
        }
    }

    // ---- configurations ------------------------------------------------------------------

    pub fn attach(&mut self, limits: Limits) -> Result<AttachedPod> {
        self.attach_pod(0, "bench", limits)
    }

    /// Attaches pod `i` (the topology gets it if it has not yet) as a pod of `namespace`.
    pub fn attach_pod(&mut self, i: usize, namespace: &str, limits: Limits) -> Result<AttachedPod> {
        self.net.add_pods(i + 1)?;
        let att = PodAttachment {
            host_ifname: host_veth(i),
            netns: self.net.ns_path(&pod_role(i)),
            identity: PodIdentity {
                namespace: namespace.to_owned(),
                name: format!("pod-{i}"),
                container_id: container_id(i),
                ifname: "eth0".to_owned(),
                ipv4: Some(pod_ip(i).parse()?),
                ipv6: None,
            },
            limits,
            pod_mac: None,
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

    pub fn detach(&mut self) -> Result<()> {
        self.detach_pod(0)
    }

    pub fn detach_pod(&mut self, i: usize) -> Result<()> {
        self.dp().detach_pod(&container_id(i), "eth0")?;
        Ok(())
    }

    /// Applies a node policy (`shaper.toml` text), as shaperd does on a change; pods attached
    /// after it get its limits.
    pub fn apply_policy(&mut self, text: &str) -> Result<()> {
        let policy = Policy::parse(text).map_err(anyhow::Error::msg)?;
        self.dp().apply_policy(&policy)?;
        Ok(())
    }

    /// What shaperd does when pods come and go: the aggregates' groups and each pod's own
    /// leaves in them.
    pub fn reconcile(&mut self) -> Result<()> {
        let r = self.dp().reconcile_aggregates()?;
        if !r.errors.is_empty() {
            bail!("reconcile the aggregates: {}", r.errors.join("; "));
        }
        Ok(())
    }

    fn config_map(&self) -> Result<Array<MapData, abi::Config>> {
        let data = MapData::from_pin(self.net.pin_root().join("maps").join(maps::CONFIG))?;
        Ok(Array::try_from(Map::Array(data))?)
    }

    /// Switches the queue model's signals and flow isolation on or off.
    pub fn set_features(&self, config: Option<Config>) -> Result<()> {
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

    /// CE marks and pod-side drops of the slot's class queues, and the packets its host veth
    /// policed above its egress limits.
    pub fn aqm_counters(&self, slot: u32) -> Result<(u64, u64, u64)> {
        let data = MapData::from_pin(self.net.pin_root().join("maps").join(maps::VQUEUE))?;
        let m: Array<MapData, abi::VQueue> = Array::try_from(Map::Array(data))?;
        let (mut ce, mut dropped) = (0, 0);
        for d in [abi::DIR_EGRESS, abi::DIR_INGRESS] {
            for kind in 0..abi::NR_KINDS {
                let q = m.get(&abi::vq_pod(slot, d, kind), 0)?;
                ce += q.ce_marked;
                dropped += q.dropped;
            }
        }
        let data = MapData::from_pin(self.net.pin_root().join("maps").join(maps::COUNTERS))?;
        let c: PerCpuArray<MapData, abi::PodCounters> =
            PerCpuArray::try_from(Map::PerCpuArray(data))?;
        let policed = c.get(&slot, 0)?.iter().map(|v| v.policed.packets).sum();
        Ok((ce, dropped, policed))
    }

    /// The reference plugin's `command` for pod `i` with an ingress and an egress rate.
    fn bandwidth_plugin(
        &self,
        command: &str,
        i: usize,
        ingress: Option<u64>,
        egress: Option<u64>,
    ) -> Result<Value> {
        // The plugin requires a burst with every rate. Kubelet/containerd pass 4294967295
        // bits when the pod sets none, which the plugin turns into a 512 MiB bucket that lets
        // a 10 s test through unshaped; use 10 ms of the rate instead, at least 64 KiB.
        let burst = |rate: u64| (rate / 100).max(64 * 1024 * 8);
        let mut bw = serde_json::Map::new();
        if let Some(r) = ingress {
            bw.insert("ingressRate".into(), r.into());
            bw.insert("ingressBurst".into(), burst(r).into());
        }
        if let Some(r) = egress {
            bw.insert("egressRate".into(), r.into());
            bw.insert("egressBurst".into(), burst(r).into());
        }
        let (host, role) = (host_veth(i), pod_role(i));
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "bandwidth",
            "runtimeConfig": { "bandwidth": bw },
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [
                    { "name": host, "mac": self.net.try_mac("node", &host)? },
                    { "name": "eth0", "mac": self.net.try_mac(&role, "eth0")?,
                      "sandbox": self.net.ns_path(&role) },
                ],
                "ips": [{ "address": format!("{}/32", pod_ip(i)), "interface": 1 }],
            },
        });
        let pod = self.net.ns_path(&role);
        let cid = container_id(i);
        let inv = Invocation {
            path: "/usr/lib/cni".to_owned(),
            ..Invocation::new(command, &cid, Some(&pod), "eth0")
        };
        let out = invoke(
            Some(netns_exec(&self.net.ns("node"), &[])),
            BANDWIDTH_PLUGIN.as_ref(),
            &inv,
            conf.to_string().as_bytes(),
        )
        .context("run the bandwidth plugin")?;
        if !out.ok() {
            bail!("bandwidth plugin {command}: {}{}", out.stdout, out.stderr);
        }
        Ok(out.json().unwrap_or(Value::Null))
    }

    pub fn bandwidth_add(&mut self, rate: u64) -> Result<()> {
        let res = self.bandwidth_plugin("ADD", 0, Some(rate), Some(rate))?;
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

    pub fn bandwidth_del(&mut self, rate: u64) -> Result<()> {
        self.bandwidth_plugin("DEL", 0, Some(rate), Some(rate))?;
        self.ifb = None;
        self.clear_veth(0);
        Ok(())
    }

    /// The reference plugin's ingress limit (a tbf on the host veth) on pod `i`.
    pub fn bandwidth_ingress_add(&mut self, i: usize, rate: u64) -> Result<()> {
        self.net.add_pods(i + 1)?;
        self.bandwidth_plugin("ADD", i, Some(rate), None).map(drop)
    }

    pub fn bandwidth_ingress_del(&mut self, i: usize, rate: u64) -> Result<()> {
        self.bandwidth_plugin("DEL", i, Some(rate), None)?;
        self.clear_veth(i);
        Ok(())
    }

    /// DEL removes the ifb only (the pod's veth would go with the pod): clear the veth.
    fn clear_veth(&self, i: usize) {
        for parent in ["root", "ingress"] {
            let _ = self.net.try_exec(
                "node",
                &["tc", "qdisc", "del", "dev", &host_veth(i), parent],
            );
        }
    }

    // ---- measurements --------------------------------------------------------------------

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
    pub fn iperf(
        &self,
        sender: &str,
        receiver: &str,
        dst: &str,
        bind: Option<&str>,
        secs: u32,
        cc: Option<&str>,
        ping_dst: Option<&str>,
    ) -> Result<Iperf> {
        let opts = IperfOpts {
            bind,
            cc,
            streams: self.streams,
            ping: ping_dst.map(|dst| PingDuring {
                dst,
                delay: Duration::from_millis(1500),
                margin: 3,
            }),
            client_port: None,
            server_output: true,
        };
        // Segments sent come from the sender's kernel: the handshake's MSS can be lowered
        // (a slow class on a jumbo-frame device), so bytes / MSS would not do.
        let segs_before = self.out_segs(sender)?;
        let (v, ping) = self.net.iperf_run(sender, receiver, dst, secs, &opts)?;
        let segments = (self.out_segs(sender)? - segs_before) as f64;
        let ping = ping.map(|p| parse_ping(p.as_bytes()));
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
            // Less than half a second: the tail after the client stopped.
            receiver_intervals: v["server_output_json"]["intervals"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|i| i["sum"]["seconds"].as_f64().unwrap_or(0.0) >= 0.5)
                        .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6)
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

    pub fn idle_rtt(&self, dst: &str) -> Result<Ping> {
        let out = self.exec(
            "pod",
            &["ping", "-n", "-q", "-c", "20", "-i", "0.02", "-W", "1", dst],
        )?;
        Ok(parse_ping(&out.stdout))
    }
}
