//! The simulated VNet: a router namespace, node namespaces each running its own
//! `aliasnet-ipamd`, pod namespaces wired by the real `aliasnet` binary, and an "internet"
//! namespace holding TEST-NET addresses.

use std::{net::Ipv4Addr, path::PathBuf, process::Command};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::{
    cni::{self, Invocation, Outcome},
    ipamd::{Ipamd, IpamdPaths},
    netns::Netns,
    shaperd::{ShaperPaths, Shaperd},
    traffic::{parse_ping, Ping},
    unique_tag,
};

/// The internet host's addresses (TEST-NET-3 and TEST-NET-2).
pub const INTERNET_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
pub const INTERNET_IP2: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// The fabric's VNet and cluster ranges: nodes 10.100.0.0/16, pods 10.240.0.0/16.
pub const DEFAULT_POLICY: &str = "internal_cidrs = [\"10.0.0.0/8\"]\n";

/// Shape of a fabric.
#[derive(Debug, Clone)]
pub struct FabricOpts {
    pub nodes: usize,
    /// ipamd `cooldown` for every node.
    pub cooldown: String,
    /// Per-node pool body override; default `cidrs = ["10.240.<i>.0/24"]`.
    pub pool: Option<String>,
    /// Start the daemons.
    pub start_ipamd: bool,
    /// Extra keys merged into the plugin's conflist entry.
    pub plugin_extra: Value,
    /// Run `aliasnet-shaperd` on every node (the plugin then attaches the eBPF datapath).
    pub shaper: bool,
    /// Node policy (`shaper.toml` contents).
    pub shaper_policy: String,
    pub cni_version: String,
}

impl Default for FabricOpts {
    fn default() -> Self {
        Self {
            nodes: 2,
            cooldown: "0s".into(),
            pool: None,
            start_ipamd: true,
            plugin_extra: json!({}),
            shaper: true,
            shaper_policy: DEFAULT_POLICY.into(),
            cni_version: "1.0.0".into(),
        }
    }
}

pub struct Fabric {
    pub tag: String,
    // Field order is drop order: nodes (and their daemons) go before the router.
    pub nodes: Vec<Node>,
    pub internet: Netns,
    pub vnet: Netns,
    _scratch: tempfile::TempDir,
}

pub struct Node {
    pub index: usize,
    pub ns: Netns,
    pub dir: PathBuf,
    pub ipamd_paths: IpamdPaths,
    pub ipamd: Option<Ipamd>,
    pub shaperd: Option<Shaperd>,
    pub uplink_ip: Ipv4Addr,
    pub conflist: Value,
    pub shaper_paths: ShaperPaths,
    tag: String,
}

pub struct Pod {
    pub ns: Netns,
    pub name: String,
    pub container_id: String,
    pub ifname: String,
    pub ip: Ipv4Addr,
    pub result: Value,
}

impl Fabric {
    pub fn new(opts: FabricOpts) -> Result<Self> {
        let tag = unique_tag();
        let scratch = tempfile::Builder::new()
            .prefix("aliasnet-fabric-")
            .tempdir()
            .context("scratch dir")?;
        let vnet = Netns::new(&format!("an{tag}-vnet"))?;
        vnet.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        let internet = Netns::new(&format!("an{tag}-inet"))?;

        // The internet: 203.0.113.0/24 link, 198.51.100.10 behind it.
        vnet.ip(&[
            "link",
            "add",
            "inet",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &internet.name,
        ])?;
        vnet.ip(&["addr", "add", "203.0.113.1/24", "dev", "inet"])?;
        vnet.ip(&["link", "set", "inet", "up"])?;
        internet.ip(&["addr", "add", "203.0.113.10/24", "dev", "eth0"])?;
        internet.ip(&["addr", "add", "198.51.100.10/32", "dev", "lo"])?;
        internet.ip(&["link", "set", "eth0", "up"])?;
        internet.ip(&["route", "add", "default", "via", "203.0.113.1"])?;
        vnet.ip(&["route", "add", "198.51.100.0/24", "via", "203.0.113.10"])?;

        let mut nodes = Vec::new();
        for i in 1..=opts.nodes {
            nodes.push(Node::new(&tag, i, &vnet, scratch.path(), &opts)?);
        }
        Ok(Self {
            tag,
            nodes,
            internet,
            vnet,
            _scratch: scratch,
        })
    }

    /// A fabric of one node with every other option at its default; panics when it cannot
    /// be built.
    pub fn one_node() -> Fabric {
        Fabric::new(FabricOpts {
            nodes: 1,
            ..FabricOpts::default()
        })
        .expect("build a one-node fabric")
    }

    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i - 1]
    }

    pub fn node_mut(&mut self, i: usize) -> &mut Node {
        &mut self.nodes[i - 1]
    }
}

impl Node {
    fn new(
        tag: &str,
        i: usize,
        vnet: &Netns,
        scratch: &std::path::Path,
        o: &FabricOpts,
    ) -> Result<Self> {
        let ns = Netns::new(&format!("an{tag}-node{i}"))?;
        let vnet_if = format!("n{i}");
        // The VNet links (nodes' uplinks) have the test MTU.
        let mtu = crate::test_mtu().to_string();
        vnet.ip(&[
            "link", "add", &vnet_if, "mtu", &mtu, "type", "veth", "peer", "name", "eth0", "mtu",
            &mtu, "netns", &ns.name,
        ])?;
        vnet.ip(&["addr", "add", &format!("10.100.{i}.1/24"), "dev", &vnet_if])?;
        vnet.ip(&["link", "set", &vnet_if, "up"])?;
        ns.ip(&["addr", "add", &format!("10.100.{i}.2/24"), "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        ns.ip(&["route", "add", "default", "via", &format!("10.100.{i}.1")])?;
        // The fabric routes the node's alias range to the node, as a cloud VNet does.
        vnet.ip(&[
            "route",
            "add",
            &format!("10.240.{i}.0/24"),
            "via",
            &format!("10.100.{i}.2"),
        ])?;

        let dir = scratch.join(format!("node{i}"));
        std::fs::create_dir_all(&dir)?;
        let ipamd_paths = IpamdPaths::under(&dir);
        let pool = o
            .pool
            .clone()
            .unwrap_or_else(|| format!("cidrs = [\"10.240.{i}.0/24\"]"));
        ipamd_paths.write_config(&pool, &o.cooldown)?;
        let shaper = ShaperPaths {
            config: dir.join("shaper.toml"),
            pin_root: PathBuf::from(format!("/sys/fs/bpf/aliasnet-t{tag}-n{i}")),
            log: dir.join("shaperd.log"),
        };
        std::fs::write(&shaper.config, &o.shaper_policy)?;
        let mut plugin = json!({
            "type": "aliasnet",
            "ipamSocket": ipamd_paths.socket,
            "spoolDir": ipamd_paths.spool_dir,
            "logFile": dir.join("cni.log"),
            "logLevel": "debug",
            "bpfPinRoot": shaper.pin_root,
            "datapath": if o.shaper { "required" } else { "off" },
        });
        if let (Some(p), Some(extra)) = (plugin.as_object_mut(), o.plugin_extra.as_object()) {
            for (k, v) in extra {
                p.insert(k.clone(), v.clone());
            }
        }
        let conflist = json!({
            "cniVersion": o.cni_version,
            "name": "aliasnet",
            "plugins": [plugin],
        });
        let mut node = Self {
            index: i,
            ns,
            dir,
            ipamd_paths,
            ipamd: None,
            shaperd: None,
            shaper_paths: shaper,
            uplink_ip: Ipv4Addr::new(10, 100, i as u8, 2),
            conflist,
            tag: tag.to_owned(),
        };
        if o.start_ipamd {
            node.start_ipamd()?;
        }
        if o.shaper {
            node.start_shaperd()?;
        }
        Ok(node)
    }

    /// Install the datapath (`--once`, so pins exist when this returns), then keep the daemon
    /// running for policy reloads and GC.
    pub fn start_shaperd(&mut self) -> Result<()> {
        self.shaperd = Some(Shaperd::start(&self.ns, self.shaper_paths.clone())?);
        Ok(())
    }

    pub fn start_ipamd(&mut self) -> Result<()> {
        self.ipamd = Some(Ipamd::start(&self.ns, self.ipamd_paths.clone())?);
        Ok(())
    }

    pub fn ipamd(&self) -> &Ipamd {
        self.ipamd.as_ref().expect("ipamd running")
    }

    /// The config the plugin gets (single-plugin conflist).
    pub fn plugin_config(&self, prev: Option<&Value>, runtime_config: Option<&Value>) -> Value {
        cni::plugin_config(&self.conflist, 0, prev, runtime_config)
    }

    /// Run the real `aliasnet` binary inside this node's netns (nsenter keeps bpffs visible).
    pub fn cni(&self, inv: &Invocation, config: &Value) -> Outcome {
        let stdin = serde_json::to_vec(config).expect("config serialises");
        self.cni_raw(inv, &stdin)
    }

    pub fn cni_raw(&self, inv: &Invocation, stdin: &[u8]) -> Outcome {
        let mut runner = Command::new("nsenter");
        runner
            .arg(format!("--net={}", self.ns.path().display()))
            .arg("--");
        cni::invoke(Some(runner), &crate::bin("aliasnet"), inv, stdin).expect("run plugin")
    }

    /// kubelet-style `CNI_ARGS` for a pod, in a scrambled order as containerd sends them.
    pub fn k8s_args(pod: &str, cid: &str) -> String {
        format!(
            "K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid};IgnoreUnknown=1;K8S_POD_UID=uid-{pod};K8S_POD_NAMESPACE=test"
        )
    }

    /// Create a pod netns and ADD it.
    pub fn add_pod(&self, name: &str) -> Result<Pod> {
        self.add_pod_with(name, None)
    }

    /// ADD with a `runtimeConfig` (bandwidth, pod annotations) as a runtime sends it.
    pub fn add_pod_with(&self, name: &str, runtime_config: Option<&Value>) -> Result<Pod> {
        let ns = Netns::new(&format!("an{}-n{}-{name}", self.tag, self.index))?;
        let cid = format!("cid-{}-{name}", self.tag);
        let inv = Invocation::new("ADD", &cid, Some(&ns.path()), "eth0")
            .args(&Self::k8s_args(name, &cid));
        let out = self.cni(&inv, &self.plugin_config(None, runtime_config));
        let result = out
            .expect_ok(&format!("ADD {name}"))
            .context("ADD printed nothing")?;
        Pod::from_result(ns, name, cid, result)
    }

    /// ADD a pod that may legitimately fail (a full pool): `Err` carries the pod's netns and
    /// the failed outcome, after a DEL that undoes whatever the failed ADD may have left.
    pub fn try_add_pod(&self, name: &str) -> std::result::Result<Pod, (Netns, Outcome)> {
        let conf = self.plugin_config(None, None);
        self.add_pod_conf(name, &conf).map_err(|(ns, out)| {
            let cid = format!("cid-{}-{name}", self.tag);
            let del = Invocation::new("DEL", &cid, Some(&ns.path()), "eth0")
                .args(&Self::k8s_args(name, &cid));
            let _ = self.cni(&del, &conf);
            (ns, out)
        })
    }

    /// ADD a pod with the plugin config `conf`. `Err` carries the pod's netns and the failed
    /// outcome, with nothing undone: what a failed ADD leaves is the caller's to check.
    pub fn add_pod_conf(
        &self,
        name: &str,
        conf: &Value,
    ) -> std::result::Result<Pod, (Netns, Outcome)> {
        let ns = Netns::new(&format!("an{}-n{}-{name}", self.tag, self.index)).expect("pod netns");
        let cid = format!("cid-{}-{name}", self.tag);
        let inv = Invocation::new("ADD", &cid, Some(&ns.path()), "eth0")
            .args(&Self::k8s_args(name, &cid));
        let out = self.cni(&inv, conf);
        if !out.ok() {
            return Err((ns, out));
        }
        let result = out.json().expect("ADD result");
        Ok(Pod::from_result(ns, name, cid, result).expect("ips[0].address"))
    }

    /// DEL a pod the way a runtime does after a normal stop (netns present, prevResult).
    pub fn del_pod(&self, pod: &Pod) -> Outcome {
        let inv = Invocation::new("DEL", &pod.container_id, Some(&pod.ns.path()), &pod.ifname)
            .args(&Self::k8s_args(&pod.name, &pod.container_id));
        self.cni(&inv, &self.plugin_config(Some(&pod.result), None))
    }

    /// CHECK a pod.
    pub fn check_pod(&self, pod: &Pod) -> Outcome {
        let inv = Invocation::new(
            "CHECK",
            &pod.container_id,
            Some(&pod.ns.path()),
            &pod.ifname,
        )
        .args(&Self::k8s_args(&pod.name, &pod.container_id));
        self.cni(&inv, &self.plugin_config(Some(&pod.result), None))
    }

    /// Host-side veths of ours (`ali*`) currently in the node.
    pub fn host_veths(&self) -> Vec<String> {
        self.ns
            .link_names()
            .expect("list links")
            .into_iter()
            .filter(|n| n.starts_with("ali"))
            .collect()
    }

    /// /32 host routes to pod addresses (routes through our veths).
    pub fn pod_routes(&self) -> Vec<String> {
        self.ns
            .routes()
            .expect("list routes")
            .into_iter()
            .filter(|r| r["dev"].as_str().is_some_and(|d| d.starts_with("ali")))
            .map(|r| r["dst"].as_str().unwrap_or("?").to_owned())
            .collect()
    }

    /// Wait (bounded) until the node holds no veth, route or lease of ours: host veths are
    /// deleted asynchronously by the daemon after DEL replies.
    #[track_caller]
    pub fn assert_clean(&self) {
        let start = std::time::Instant::now();
        loop {
            let veths = self.host_veths();
            let routes = self.pod_routes();
            let leases = self.ipamd.as_ref().map(|d| d.leases()).unwrap_or_default();
            if veths.is_empty() && routes.is_empty() && leases.is_empty() {
                return;
            }
            if start.elapsed() > std::time::Duration::from_secs(5) {
                panic!(
                    "node{} not clean: veths={veths:?} routes={routes:?} leases={leases:?}",
                    self.index
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Pod {
    /// The pod an ADD result describes.
    pub fn from_result(ns: Netns, name: &str, container_id: String, result: Value) -> Result<Pod> {
        let ip: Ipv4Addr = result["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("no ips[0].address in {result}"))?;
        Ok(Pod {
            ns,
            name: name.to_owned(),
            container_id,
            ifname: "eth0".into(),
            ip,
            result,
        })
    }

    /// `ping -c COUNT [extra] DST` from inside the pod; true when every probe was answered.
    pub fn ping(&self, dst: Ipv4Addr, extra: &[&str]) -> bool {
        let dst = dst.to_string();
        let mut args = vec!["-c", "2", "-i", "0.05", "-W", "2", "-q"];
        args.extend_from_slice(extra);
        args.push(&dst);
        self.ns
            .exec_status("ping", &args)
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// `ping -c n -s size -i interval -W 1 -q dst` from inside the pod: its summary.
    pub fn ping_summary(&self, dst: Ipv4Addr, n: u32, size: u32, interval: &str) -> Ping {
        let (n, size, dst) = (n.to_string(), size.to_string(), dst.to_string());
        let args = ["-c", &n, "-s", &size, "-i", interval, "-W", "1", "-q", &dst];
        let out = self.ns.exec_status("ping", &args).expect("run ping");
        parse_ping(&out.stdout)
    }
}
