//! aliasnet's eBPF datapath as a library: the C tc programs (compiled by `build.rs` with
//! clang-19 and embedded here), the `#[repr(C)]` mirrors of their shared ABI header, and
//! everything user space does with them: install and open the pinned objects, attach and
//! detach pods, the HTB class layout, clsact and cls_bpf filters, limits, and the
//! synchronous netlink client. The CNI plugin, aliasnetctl and aliasnet-shaperd link it.
//!
//! The CNI plugin, in the node's network namespace with bpffs visible:
//!
//! ```no_run
//! use aliasnet_ebpf::{
//!     Datapath, Limits, PodAttachment, PodIdentity, Teardown, DEFAULT_PIN_ROOT,
//! };
//! # fn main() -> Result<(), aliasnet_ebpf::DatapathError> {
//! let mut dp = Datapath::open(DEFAULT_PIN_ROOT)?; // fails with NotInitialised before shaperd ran once
//! dp.attach_pod(&PodAttachment {
//!     host_ifname: "veth1234abcd".into(),
//!     netns: "/var/run/netns/cni-1234".into(),
//!     identity: PodIdentity {
//!         namespace: "default".into(),
//!         name: "trainer-0".into(),
//!         container_id: "1234abcd".into(),
//!         ifname: "eth0".into(),
//!         ipv4: Some("10.20.0.5".parse().unwrap()),
//!         ipv6: Some("fd00:240::5".parse().unwrap()),
//!     },
//!     limits: Limits::default(),
//!     pod_mac: Some([0x0a, 0x58, 0x0a, 0x14, 0x00, 0x05]),
//! })?;
//! // ... on DEL, when the host veth is deleted right after (the pod's filters and qdiscs go
//! // with it; `detach_pod` removes them too, for a veth that stays):
//! dp.detach_pod_with("1234abcd", "eth0", Teardown::MapsOnly)?;
//! # Ok(()) }
//! ```
//!
//! Per-pod programs are cls_bpf filters (clsact), not TCX links: a TCX attach waits for an
//! RCU grace period under RTNL; see [`netlink::clsact`].
//!
//! Modules depend in one direction: `netlink`, `limits` and `shape` know nothing of the
//! maps; `htb` lays out classes over `netlink`; `datapath` owns the pinned maps; `pod` and
//! `policy` act on a `Datapath`.

pub mod abi;
pub mod aggregate;
mod conns;
pub mod datapath;
mod error;
pub mod htb;
pub mod limits;
pub mod netlink;
mod object;
pub mod pod;
pub mod policy;
pub mod shadow;
pub mod shape;
pub mod tuning;

pub use aggregate::AggregateReport;
pub use datapath::{
    install::InstallReport,
    pins::{ensure_bpffs, PinPaths, DEFAULT_PIN_ROOT, PIN_LOCK_TIMEOUT},
    Datapath,
};
pub use error::{DatapathError, MultiError};
pub use limits::{LimitError, Limits};
pub use object::{bench_datapath_object, datapath_object, MissingObject, BENCH_DATAPATH_OBJECT};
pub use pod::{
    eui64_link_local, run_in_pod, AttachHints, AttachedPod, HookState, PodAttachment, PodHooks,
    PodIdentity, PodRecord, QdiscState, ShapingStats, Teardown,
};
pub use policy::{
    resolve_uplink, Dest, LevelLimits, NamespaceLimits, NodePolicy, PolicyReport, INTERNET,
};
pub use shape::{DeviceSizes, Shape};

// Pods' namespaces are entered through `aliasnet-netns` only.
use aliasnet_netns as netns;

/// The compiled `datapath.bpf.o` (all programs and maps, BTF included), 8-byte aligned as
/// aya's ELF parser requires.
pub static DATAPATH_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/datapath.bpf.o"));

/// Program names (ELF symbols) in [`DATAPATH_OBJECT`].
pub mod programs {
    /// Host veth ingress = pod egress: count, drop blocked.
    pub const HOST_INGRESS: &str = "an_host_ingress";
    /// Host veth egress = pod ingress: count, drop blocked.
    pub const HOST_EGRESS: &str = "an_host_egress";
    /// Pod eth0 egress: pick the HTB class (internet or other) of the pod's egress qdisc.
    pub const POD_EGRESS: &str = "an_pod_egress";
    /// Node uplink egress: the leaf of the node's upload limits.
    pub const UPLINK: &str = "an_uplink";
    /// Node uplink ingress: the leaf of the node's download limits, and to their device.
    pub const UPLINK_IN: &str = "an_uplink_in";
    /// Host veth egress, after [`HOST_EGRESS`], classic cls_bpf with a mirred action: to the
    /// namespaces' download device.
    pub const NS_GATE: &str = "an_ns_gate";
    /// The HTB of the namespaces' download device: the leaf [`HOST_EGRESS`] chose.
    pub const NS_CLASSIFY: &str = "an_ns_classify";
    /// Attached nowhere: shaperd runs it to sweep `an_conns` (returns the entries removed).
    pub const CONNS_SWEEP: &str = "an_conns_sweep";
    /// The programs packets go through, in a stable order.
    pub const PACKET: [&str; 7] = [
        HOST_INGRESS,
        HOST_EGRESS,
        POD_EGRESS,
        UPLINK,
        UPLINK_IN,
        NS_GATE,
        NS_CLASSIFY,
    ];
    /// Every program, in a stable order: the packet programs, then the sweep.
    pub const ALL: [&str; 8] = {
        let mut all = [CONNS_SWEEP; 8];
        let mut i = 0;
        while i < PACKET.len() {
            all[i] = PACKET[i];
            i += 1;
        }
        all
    };
}

/// Map names in [`DATAPATH_OBJECT`] (also their pin file names).
pub mod maps {
    /// LPM trie [`crate::abi::LpmKeyData`] -> [`crate::abi::LpmValue`].
    pub const PREFIXES: &str = "an_prefixes";
    /// Array\[1\] of [`crate::abi::Config`].
    pub const CONFIG: &str = "an_config";
    /// Hash host ifindex -> [`crate::abi::Pod`].
    pub const PODS: &str = "an_pods";
    /// Hash pod IPv4 (network order) -> slot.
    pub const POD_IPS: &str = "an_pod_ips";
    /// Per-CPU array slot -> [`crate::abi::PodCounters`].
    pub const COUNTERS: &str = "an_counters";
    /// Per-CPU array\[1\] of [`crate::abi::NodeCounters`].
    pub const NODE_COUNTERS: &str = "an_node_ctrs";
    /// Array slot -> [`crate::abi::PodMeta`] (userspace only).
    pub const POD_META: &str = "an_pod_meta";
    /// Array ([`crate::abi::vq_pod`], [`crate::abi::vq_agg`]) -> [`crate::abi::VQueue`]:
    /// the queue models.
    pub const VQUEUE: &str = "an_vqueue";
    /// Array (flow table x flow bucket) -> [`crate::abi::Flow`]: flow isolation state.
    pub const FLOWS: &str = "an_flows";
    /// LRU hash [`crate::abi::ConnKey`] -> [`crate::abi::Conn`]: the window clamp's connections.
    pub const CONNS: &str = "an_conns";
    /// LPM trie [`crate::abi::Lpm6KeyData`] -> [`crate::abi::LpmValue`]: the IPv6 prefixes.
    pub const PREFIXES6: &str = "an_prefixes6";
    /// Hash pod IPv6 (network order) -> slot.
    pub const POD_IPS6: &str = "an_pod_ips6";
    /// Hash [`crate::abi::NsKey`] -> [`crate::abi::NsPolicy`] (userspace only).
    pub const POLICY: &str = "an_policy";
    /// Array entity -> [`crate::abi::Entity`]: the node's and namespaces' aggregates.
    pub const ENTITIES: &str = "an_entities";
    /// Hash [`crate::abi::NsKey`] -> entity (userspace only).
    pub const ENTITY_IDS: &str = "an_entity_ids";
    /// Array named class -> [`crate::abi::ClassName`] (userspace only).
    pub const CLASSES: &str = "an_classes";
    /// Array slot -> [`crate::abi::PodRt`]: the link-scoped IPv6 budget and the connection
    /// table share of each pod.
    pub const POD_RT: &str = "an_pod_rt";
    /// Every map, in a stable order.
    pub const ALL: [&str; 17] = [
        PREFIXES,
        CONFIG,
        PODS,
        POD_IPS,
        COUNTERS,
        NODE_COUNTERS,
        POD_META,
        VQUEUE,
        FLOWS,
        CONNS,
        PREFIXES6,
        POD_IPS6,
        POLICY,
        ENTITIES,
        ENTITY_IDS,
        CLASSES,
        POD_RT,
    ];
}
