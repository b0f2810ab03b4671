//! The shaper tests' view of the test fabric: `aliasnet_tests::single` (node, pod, internet,
//! internal peer, a private bpffs; see its picture) running this package's
//! `aliasnet-shaperd`, plus what needs the datapath library: opening the pins, the pod's
//! attachment request and the queue model's state; IPv6 on the fabric's links, so that a
//! test written once runs in each address family.

#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses a different part of the fabric"
)]

use std::ops::{Deref, DerefMut};

use aliasnet_ebpf::{abi, maps, AttachedPod, Datapath, Limits, PodAttachment, PodIdentity};
pub use aliasnet_tests::{
    family::Family,
    per_family, require_root,
    single::{
        host_veth, pod_ip, pod_role, IperfOpts, Links, PingDuring, SingleNode, BLOCKED, INTERNAL,
        INTERNET, METADATA, MIRROR, POD_IP,
    },
};

/// The IPv6 addresses [`Fabric::installed`] adds: the pod's, the internet host's, one it
/// blocks (in `2001:db8:bad::/48`), the cloud metadata endpoint (AWS's), and the internal
/// peer's (in `fd00::/8`).
pub const POD_IP6: &str = "fd00:240::5";
pub const INTERNET6: &str = "2001:db8::10";
pub const BLOCKED6: &str = "2001:db8:bad::7";
pub const METADATA6: &str = "fd00:ec2::254";
pub const INTERNAL6: &str = "fd00:30::10";

/// The fabric's addresses in each family.
pub trait Addrs {
    fn pod_ip(self) -> &'static str;
    fn internet_ip(self) -> &'static str;
    fn blocked(self) -> &'static str;
    fn metadata(self) -> &'static str;
    fn internal(self) -> &'static str;
    /// An ICMP echo with `data` bytes as counted at L2 (Ethernet, IP, ICMP headers).
    fn echo_frame(self, data: u64) -> u64;
}

impl Addrs for Family {
    fn pod_ip(self) -> &'static str {
        match self {
            Family::V4 => POD_IP,
            Family::V6 => POD_IP6,
        }
    }

    fn internet_ip(self) -> &'static str {
        match self {
            Family::V4 => INTERNET,
            Family::V6 => INTERNET6,
        }
    }

    fn blocked(self) -> &'static str {
        match self {
            Family::V4 => BLOCKED,
            Family::V6 => BLOCKED6,
        }
    }

    fn metadata(self) -> &'static str {
        match self {
            Family::V4 => METADATA,
            Family::V6 => METADATA6,
        }
    }

    fn internal(self) -> &'static str {
        match self {
            Family::V4 => INTERNAL,
            Family::V6 => INTERNAL6,
        }
    }

    fn echo_frame(self, data: u64) -> u64 {
        14 + u64::from(self.icmp_overhead()) + data
    }
}

pub const CONTAINER_ID: &str = "c0ffee0000000000000000000000000000000000000000000000000000000001";

/// `ip ARGS...`, panicking with its stderr on failure.
#[track_caller]
pub fn ip(args: &[&str]) {
    aliasnet_tests::netns::ip(args).unwrap_or_else(|e| panic!("{e:#}"));
}

/// A single-node topology whose shaperd is this package's binary.
pub struct Fabric(SingleNode);

impl Deref for Fabric {
    type Target = SingleNode;
    fn deref(&self) -> &SingleNode {
        &self.0
    }
}

impl DerefMut for Fabric {
    fn deref_mut(&mut self) -> &mut SingleNode {
        &mut self.0
    }
}

impl Fabric {
    fn with(mut net: SingleNode) -> Self {
        net.shaperd_bin = env!("CARGO_BIN_EXE_aliasnet-shaperd").into();
        Self(net)
    }

    /// Links from the environment, one test at a time.
    pub fn new() -> Self {
        Self::with(SingleNode::new())
    }

    /// A fabric whose datapath is installed under `policy` (`shaperd --once`), with IPv6 on
    /// every link when `fam` is IPv6.
    pub fn installed(fam: Family, policy: &str) -> Self {
        let f = Self::new();
        if fam == Family::V6 {
            f.wire_ipv6();
        }
        let path = f.write_policy(policy);
        let out = f.shaperd_once(&path);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        f
    }

    /// IPv6 beside IPv4 on pod 0 (wired as the plugin wires a dual-stack pod: a /128 on its
    /// eth0 without DAD, gateway fe80::1 with a permanent neighbour, a host /128 route), the
    /// uplink (fd00:100::1/64 to the internet host's fd00:100::2, which holds the internet,
    /// blocked and metadata addresses on its loopback) and the peer's link (fd00:101::1/64 to
    /// fd00:101::2, [`INTERNAL6`] on the peer's loopback).
    pub fn wire_ipv6(&self) {
        let (node, pod, inet, peer) = (
            self.ns("node"),
            self.ns("pod"),
            self.ns("inet"),
            self.ns("peer"),
        );
        self.exec("node", &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
        self.exec("node", &["sysctl", "-qw", "net.ipv6.conf.vh1.accept_dad=0"]);
        self.exec("pod", &["sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0"]);
        self.exec("pod", &["sysctl", "-qw", "net.ipv6.conf.eth0.accept_ra=0"]);
        for (ns, a, dev) in [
            (&node, "fd00:100::1/64", "up0"),
            (&node, "fd00:101::1/64", "vp0"),
            (&inet, "fd00:100::2/64", "ext0"),
            (&peer, "fd00:101::2/64", "int0"),
        ] {
            ip(&["-n", ns, "addr", "add", a, "dev", dev, "nodad"]);
        }
        ip(&[
            "-n",
            &node,
            "-6",
            "route",
            "add",
            "default",
            "via",
            "fd00:100::2",
        ]);
        ip(&[
            "-n",
            &node,
            "route",
            "add",
            "fd00:30::/64",
            "via",
            "fd00:101::2",
        ]);
        ip(&[
            "-n",
            &node,
            "route",
            "add",
            &format!("{POD_IP6}/128"),
            "dev",
            "vh1",
        ]);
        for a in [INTERNET6, BLOCKED6, METADATA6] {
            ip(&["-n", &inet, "addr", "add", &format!("{a}/128"), "dev", "lo"]);
        }
        ip(&[
            "-n",
            &peer,
            "addr",
            "add",
            &format!("{INTERNAL6}/128"),
            "dev",
            "lo",
        ]);
        for (ns, via) in [(&inet, "fd00:100::1"), (&peer, "fd00:101::1")] {
            ip(&["-n", ns, "route", "add", "fd00:240::/112", "via", via]);
        }
        let mac = self.mac("node", "vh1");
        ip(&[
            "-n",
            &pod,
            "addr",
            "add",
            &format!("{POD_IP6}/128"),
            "dev",
            "eth0",
            "nodad",
        ]);
        self.wire_gateway("pod", "fe80::1", &mac)
            .expect("the pod's IPv6 gateway");
        self.wait_path(Family::V6);
    }

    /// Waits until the pod reaches the internet host in `fam`: in IPv6 the node first
    /// resolves the pod (neighbour discovery, through the programs once attached).
    pub fn wait_path(&self, fam: Family) {
        let up = (0..30).any(|_| self.ping("pod", fam.internet_ip(), 1, 56, &["-W", "1"]) == 1);
        assert!(up, "no {fam} path between the pod and the internet host");
    }

    /// Attaches pod 0 with `limits` and its addresses: IPv4, and IPv6 beside it when `fam` is
    /// IPv6 (a dual-stack pod); then waits for the pod's path in `fam`.
    pub fn attach_in(&self, fam: Family, dp: &mut Datapath, limits: Limits) -> AttachedPod {
        let mut att = self.attachment(limits);
        if fam == Family::V6 {
            att.identity.ipv6 = Some(POD_IP6.parse().expect("pod IPv6 address"));
        }
        let a = self.in_node(|| dp.attach_pod(&att)).expect("attach");
        self.wait_path(fam);
        a
    }

    /// A fabric with `links`, one test at a time.
    pub fn with_links(links: Links) -> Self {
        Self::with(SingleNode::with_links(links))
    }

    /// Holds off the other tests of this binary: for a test that runs several concurrent
    /// fabrics of its own.
    pub fn serial() -> std::sync::MutexGuard<'static, ()> {
        SingleNode::serial()
    }

    /// A fabric that runs beside others (for tests that measure several at once on purpose).
    pub fn concurrent(links: Links) -> Self {
        Self::with(SingleNode::concurrent(links))
    }

    pub fn open(&self) -> Datapath {
        let root = self.pin_root();
        self.in_node(|| Datapath::open(root))
            .expect("open datapath")
    }

    pub fn attachment(&self, limits: Limits) -> PodAttachment {
        self.attachment_of(0, "team-a", limits)
    }

    /// The attachment of pod `i` ([`SingleNode::add_pods`]) as a pod of `namespace`.
    pub fn attachment_of(&self, i: usize, namespace: &str, limits: Limits) -> PodAttachment {
        // Pod 0's is CONTAINER_ID.
        let container_id = format!("{}{:04x}", &CONTAINER_ID[..CONTAINER_ID.len() - 4], i + 1);
        PodAttachment {
            host_ifname: host_veth(i),
            netns: self.ns_path(&pod_role(i)),
            identity: PodIdentity {
                namespace: namespace.to_owned(),
                name: format!("trainer-{i}"),
                container_id,
                ifname: "eth0".to_owned(),
                ipv4: Some(pod_ip(i).parse().expect("pod ip")),
                ipv6: None,
            },
            limits,
            pod_mac: Some(self.pod_mac(i)),
        }
    }

    /// The MAC address of pod `i`'s `eth0`, as the plugin passes it at ADD (its link-local
    /// address derives from it).
    pub fn pod_mac(&self, i: usize) -> [u8; 6] {
        let out = self.exec(&pod_role(i), &["cat", "/sys/class/net/eth0/address"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let mut mac = [0u8; 6];
        let mut parts = text.trim().split(':');
        for b in &mut mac {
            *b = u8::from_str_radix(parts.next().expect("MAC octet"), 16).expect("hex octet");
        }
        mac
    }

    /// The programs' queue model of one class (`an_vqueue`), read from the pins.
    pub fn vqueue(&self, idx: u32) -> abi::VQueue {
        use aya::maps::{Array, Map, MapData};
        let path = self.pin_root().join("maps").join(maps::VQUEUE);
        let m: Array<MapData, abi::VQueue> = Array::try_from(Map::Array(
            MapData::from_pin(path).expect("open an_vqueue pin"),
        ))
        .expect("an_vqueue");
        m.get(&idx, 0).expect("read an_vqueue")
    }
}
