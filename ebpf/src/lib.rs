//! aliasnet's eBPF datapath: the C tc programs (compiled by `build.rs` with clang-19 and
//! embedded here) and the `#[repr(C)]` mirrors of their shared ABI header.
//!
//! Loading, pinning and attaching live in `aliasnet-shaper`; this crate only owns the kernel
//! ABI so that every user of the maps agrees on it at compile time.

pub mod abi;

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
    /// Node uplink egress: put pods' internet traffic into the node-wide cap class.
    pub const UPLINK: &str = "an_uplink";
    /// Every program, in a stable order.
    pub const ALL: [&str; 4] = [HOST_INGRESS, HOST_EGRESS, POD_EGRESS, UPLINK];
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
    /// Hash [`crate::abi::NsKey`] -> [`crate::abi::NsRate`].
    pub const NS_RATES: &str = "an_ns_rates";
    /// Array slot (or [`crate::abi::VQ_NODE_CAP`]) -> [`crate::abi::VQueue`]: ECN marking state.
    pub const VQUEUE: &str = "an_vqueue";
    /// Array (`an_vqueue` index x flow bucket) -> [`crate::abi::Flow`]: flow isolation state.
    pub const FLOWS: &str = "an_flows";
    /// LRU hash [`crate::abi::ConnKey`] -> [`crate::abi::Conn`]: the window clamp's connections.
    pub const CONNS: &str = "an_conns";
    /// Every map, in a stable order.
    pub const ALL: [&str; 11] = [
        PREFIXES,
        CONFIG,
        PODS,
        POD_IPS,
        COUNTERS,
        NODE_COUNTERS,
        POD_META,
        NS_RATES,
        VQUEUE,
        FLOWS,
        CONNS,
    ];
}
