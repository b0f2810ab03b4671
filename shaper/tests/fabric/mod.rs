//! The shaper tests' view of the test fabric: `aliasnet_tests::single` (node, pod, internet,
//! internal peer, a private bpffs; see its picture) running this package's
//! `aliasnet-shaperd`, plus what needs the datapath library: opening the pins, the pod's
//! attachment request and the queue model's state.

#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses a different part of the fabric"
)]

use std::ops::{Deref, DerefMut};

use aliasnet_ebpf::{abi, maps, Datapath, Limits, PodAttachment, PodIdentity};
pub use aliasnet_tests::{
    require_root,
    single::{
        host_veth, pod_ip, pod_role, IperfOpts, Links, PingDuring, SingleNode, BLOCKED, INTERNAL,
        INTERNET, METADATA, MIRROR, POD_IP,
    },
};

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
