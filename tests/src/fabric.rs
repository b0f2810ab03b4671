//! The simulated VNet: a router namespace, node namespaces each running its own
//! `aliasnet-ipamd`, pod namespaces wired by the real `aliasnet` binary, and an "internet"
//! namespace holding TEST-NET addresses.
//!
//! The fabric is dual-stack: every link also carries IPv6 (the router forwards both
//! families), whatever [`FabricOpts::stack`] says about the pods. IPv6 plan:
//!
//! | what                         | address                                 |
//! |------------------------------|-----------------------------------------|
//! | node `i` uplink link         | `fd00:100:<i>::/64` (router `::1`, node `::2`) |
//! | node `i` pod prefix          | `fd00:240:<i>::/112`, routed to the node's uplink |
//! | router to internet link      | `2001:db8::/64` (router `::1`)          |
//! | internet host                | [`INTERNET_IP6`], [`INTERNET_IP6_2`]    |

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    process::Command,
};

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
/// A third address of the internet host, on its link: a destination tests can put in a named
/// class of its own (`203.0.113.20/32`) while the rest of the link stays plain internet.
pub const MIRROR_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 20);
/// The internet host's IPv6 addresses (documentation prefix 2001:db8::/32): one on its link,
/// one behind it (as 198.51.100.10 is).
pub const INTERNET_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10);
pub const INTERNET_IP6_2: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10);
/// The fabric's VNet and cluster ranges: nodes 10.100.0.0/16, pods 10.240.0.0/16; in IPv6
/// uplinks fd00:100::/48 and pods fd00:240::/48, both inside the unique-local fd00::/8.
pub const DEFAULT_POLICY: &str = "internal_cidrs = [\"10.0.0.0/8\", \"fd00::/8\"]\n";

/// Node `i`'s uplink address on the VNet (`fd00:100:<i>::2/64`; the router is `::1`).
pub fn uplink_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x100, i as u16, 0, 0, 0, 0, 2)
}

/// The router's address on node `i`'s link.
pub fn router_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x100, i as u16, 0, 0, 0, 0, 1)
}

/// Node `i`'s IPv6 pod prefix, `fd00:240:<i>::/112`, which the VNet routes to the node.
pub fn pod_prefix6(i: usize) -> String {
    format!("fd00:240:{i:x}::/112")
}

/// Node `i`'s IPv4 pod range, `10.240.<i>.0/24`.
pub fn pod_range4(i: usize) -> String {
    format!("10.240.{i}.0/24")
}

/// Address families the nodes' pools serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    /// One IPv4 pool per node (the default).
    Ipv4,
    /// An IPv4 pool and an IPv6 pool per node.
    Dual,
    /// One IPv6 pool per node.
    Ipv6,
}

impl Stack {
    pub fn has_ipv4(self) -> bool {
        self != Stack::Ipv6
    }

    pub fn has_ipv6(self) -> bool {
        self != Stack::Ipv4
    }
}

/// Shape of a fabric.
#[derive(Debug, Clone)]
pub struct FabricOpts {
    pub nodes: usize,
    /// ipamd `cooldown` for every node.
    pub cooldown: String,
    /// Per-node pool body override; default `cidrs = ["10.240.<i>.0/24"]`.
    pub pool: Option<String>,
    /// Which families the node pools serve (default IPv4 only). With IPv6, node `i` gets a
    /// pool over [`pod_prefix6`]`(i)` (after the IPv4 pool, `pool` overriding that one).
    pub stack: Stack,
    /// Per-node IPv6 pool body override; default `cidrs = ["fd00:240:<i>::/112"]`.
    pub pool6: Option<String>,
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
            stack: Stack::Ipv4,
            pool6: None,
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
    pub uplink_ip6: Ipv6Addr,
    pub conflist: Value,
    pub shaper_paths: ShaperPaths,
    tag: String,
}

pub struct Pod {
    pub ns: Netns,
    pub name: String,
    pub container_id: String,
    pub ifname: String,
    /// The pod's IPv4 address; `0.0.0.0` for an IPv6-only pod.
    pub ip: Ipv4Addr,
    /// The pod's IPv6 address, if it has one.
    pub ip6: Option<Ipv6Addr>,
    pub result: Value,
}

impl FabricOpts {
    /// Two nodes with an IPv4 and an IPv6 pool each.
    pub fn dual_stack() -> Self {
        Self {
            stack: Stack::Dual,
            ..Self::default()
        }
    }

    /// Two nodes with only an IPv6 pool each.
    pub fn ipv6_only() -> Self {
        Self {
            stack: Stack::Ipv6,
            ..Self::default()
        }
    }
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
        // No duplicate address detection on the fabric's own links (links created from here
        // on): while a link's link-local address is tentative, the router delays the
        // neighbour solicitations of the packets it forwards out of it by 1-2 s.
        vnet.exec(
            "sysctl",
            &[
                "-qw",
                "net.ipv6.conf.all.forwarding=1",
                "net.ipv6.conf.default.accept_dad=0",
            ],
        )?;
        let internet = Netns::new(&format!("an{tag}-inet"))?;
        internet.exec("sysctl", &["-qw", "net.ipv6.conf.default.accept_dad=0"])?;

        // The internet: 203.0.113.0/24 link (.10 and .20), 198.51.100.10 behind it.
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
        internet.ip(&["addr", "add", &format!("{MIRROR_IP}/24"), "dev", "eth0"])?;
        internet.ip(&["addr", "add", "198.51.100.10/32", "dev", "lo"])?;
        internet.ip(&["link", "set", "eth0", "up"])?;
        internet.ip(&["route", "add", "default", "via", "203.0.113.1"])?;
        vnet.ip(&["route", "add", "198.51.100.0/24", "via", "203.0.113.10"])?;
        // The same in IPv6. Static addresses skip duplicate address detection (`nodad`):
        // nothing else is on these links, and a tentative address would not route for 1-2 s.
        vnet.ip(&["addr", "add", "2001:db8::1/64", "dev", "inet", "nodad"])?;
        internet.ip(&["addr", "add", "2001:db8::10/64", "dev", "eth0", "nodad"])?;
        internet.ip(&["addr", "add", "2001:db8:1::10/128", "dev", "lo"])?;
        internet.ip(&["-6", "route", "add", "default", "via", "2001:db8::1"])?;
        vnet.ip(&[
            "-6",
            "route",
            "add",
            "2001:db8:1::/64",
            "via",
            "2001:db8::10",
        ])?;

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
        // The node's uplink is ready at once, like a cloud NIC (see the router's accept_dad);
        // the node's other links (the plugin's veths) keep the kernel default.
        ns.exec("sysctl", &["-qw", "net.ipv6.conf.eth0.accept_dad=0"])?;
        vnet.ip(&["addr", "add", &format!("10.100.{i}.1/24"), "dev", &vnet_if])?;
        vnet.ip(&["link", "set", &vnet_if, "up"])?;
        ns.ip(&["addr", "add", &format!("10.100.{i}.2/24"), "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        ns.ip(&["route", "add", "default", "via", &format!("10.100.{i}.1")])?;
        // The fabric routes the node's alias range to the node, as a cloud VNet does.
        vnet.ip(&[
            "route",
            "add",
            &pod_range4(i),
            "via",
            &format!("10.100.{i}.2"),
        ])?;
        let (up6, router6) = (uplink_ip6(i).to_string(), router_ip6(i).to_string());
        vnet.ip(&[
            "addr",
            "add",
            &format!("{router6}/64"),
            "dev",
            &vnet_if,
            "nodad",
        ])?;
        ns.ip(&["addr", "add", &format!("{up6}/64"), "dev", "eth0", "nodad"])?;
        ns.ip(&["-6", "route", "add", "default", "via", &router6])?;
        vnet.ip(&["-6", "route", "add", &pod_prefix6(i), "via", &up6])?;

        let dir = scratch.join(format!("node{i}"));
        std::fs::create_dir_all(&dir)?;
        let ipamd_paths = IpamdPaths::under(&dir);
        let pool4 = o
            .pool
            .clone()
            .unwrap_or_else(|| format!("cidrs = [\"{}\"]", pod_range4(i)));
        let pool6 = o
            .pool6
            .clone()
            .unwrap_or_else(|| format!("cidrs = [\"{}\"]", pod_prefix6(i)));
        let pools = match o.stack {
            Stack::Ipv4 => vec![("secondary", pool4)],
            Stack::Dual => vec![("secondary", pool4), ("secondary6", pool6)],
            Stack::Ipv6 => vec![("secondary6", pool6)],
        };
        ipamd_paths.write_config_pools(&pools, &o.cooldown)?;
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
            uplink_ip6: uplink_ip6(i),
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
        Self::k8s_args_in(pod, cid, "test")
    }

    /// [`Self::k8s_args`] for a pod of Kubernetes namespace `namespace`.
    pub fn k8s_args_in(pod: &str, cid: &str, namespace: &str) -> String {
        format!(
            "K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid};IgnoreUnknown=1;K8S_POD_UID=uid-{pod};K8S_POD_NAMESPACE={namespace}"
        )
    }

    /// ADD a pod of Kubernetes namespace `namespace`, with a `runtimeConfig` if given.
    pub fn add_pod_in(
        &self,
        name: &str,
        namespace: &str,
        runtime_config: Option<&Value>,
    ) -> Result<Pod> {
        let ns = Netns::new(&format!("an{}-n{}-{name}", self.tag, self.index))?;
        let cid = format!("cid-{}-{name}", self.tag);
        let inv = Invocation::new("ADD", &cid, Some(&ns.path()), "eth0")
            .args(&Self::k8s_args_in(name, &cid, namespace));
        let out = self.cni(&inv, &self.plugin_config(None, runtime_config));
        let result = out
            .expect_ok(&format!("ADD {namespace}/{name}"))
            .context("ADD printed nothing")?;
        Pod::from_result(ns, name, cid, result)
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
        self.check_pod_with(pod, None)
    }

    /// CHECK a pod added with `runtime_config` (as [`Node::add_pod_with`]).
    pub fn check_pod_with(&self, pod: &Pod, runtime_config: Option<&Value>) -> Outcome {
        let inv = Invocation::new(
            "CHECK",
            &pod.container_id,
            Some(&pod.ns.path()),
            &pod.ifname,
        )
        .args(&Self::k8s_args(&pod.name, &pod.container_id));
        self.cni(&inv, &self.plugin_config(Some(&pod.result), runtime_config))
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

    /// Host routes to pod addresses (routes through our veths): IPv4 /32s and IPv6 /128s
    /// (not the link-local fe80::/64 the kernel gives every veth).
    pub fn pod_routes(&self) -> Vec<String> {
        let mut routes = self.ns.routes().expect("list routes");
        routes.extend(self.ns.routes6().expect("list IPv6 routes"));
        routes
            .into_iter()
            .filter(|r| r["dev"].as_str().is_some_and(|d| d.starts_with("ali")))
            .map(|r| r["dst"].as_str().unwrap_or("?").to_owned())
            .filter(|d| !d.starts_with("fe80:"))
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
    /// The pod an ADD result describes (its first IPv4 and first IPv6 address in `ips`).
    pub fn from_result(ns: Netns, name: &str, container_id: String, result: Value) -> Result<Pod> {
        let ips = result_ips(&result);
        let ip = ips.iter().find_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        });
        let ip6 = ips.iter().find_map(|a| match a {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        });
        if ip.is_none() && ip6.is_none() {
            anyhow::bail!("no address in ips of {result}");
        }
        Ok(Pod {
            ns,
            name: name.to_owned(),
            container_id,
            ifname: "eth0".into(),
            ip: ip.unwrap_or(Ipv4Addr::UNSPECIFIED),
            ip6,
            result,
        })
    }

    /// The pod's IPv6 address; panics when it has none.
    #[track_caller]
    pub fn v6(&self) -> Ipv6Addr {
        self.ip6
            .unwrap_or_else(|| panic!("pod {} has no IPv6 address: {}", self.name, self.result))
    }

    /// `ping -c COUNT [extra] DST` from inside the pod; true when every probe was answered.
    pub fn ping(&self, dst: impl Into<IpAddr>, extra: &[&str]) -> bool {
        let dst: IpAddr = dst.into();
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
    pub fn ping_summary(&self, dst: impl Into<IpAddr>, n: u32, size: u32, interval: &str) -> Ping {
        let dst: IpAddr = dst.into();
        let (n, size, dst) = (n.to_string(), size.to_string(), dst.to_string());
        let args = ["-c", &n, "-s", &size, "-i", interval, "-W", "1", "-q", &dst];
        let out = self.ns.exec_status("ping", &args).expect("run ping");
        parse_ping(&out.stdout)
    }
}

/// The addresses (without prefix length) in a CNI result's `ips`, in order.
pub fn result_ips(result: &Value) -> Vec<IpAddr> {
    result["ips"]
        .as_array()
        .map(|ips| {
            ips.iter()
                .filter_map(|e| e["address"].as_str())
                .filter_map(|a| a.split('/').next()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
