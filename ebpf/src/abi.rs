//! Rust mirrors of `ebpf/include/aliasnet_abi.h`.
//!
//! Each struct repeats the C layout field by field and asserts the same size as the
//! header's `_Static_assert`, so a drift on either side fails the build. Constants are
//! checked against the header text by a unit test below.

use std::net::Ipv4Addr;

/// Bumped whenever a layout below changes; pinned maps of another version are not reused.
pub const ABI_VERSION: u32 = 3;

pub const MAX_PODS: u32 = 1024;
pub const MAX_PREFIXES: u32 = 65536;
pub const LPM_MAX_ENTRIES: u32 = 131_072;
pub const MAX_NAMESPACES: u32 = 4096;

pub const CLASS_INTERNAL: u32 = 0;
pub const CLASS_INTERNET: u32 = 1;
pub const CLASS_BLOCKED: u32 = 2;
pub const CLASS_OTHER: u32 = 3;
pub const NR_CLASSES: usize = 4;

pub const DIR_EGRESS: usize = 0;
pub const DIR_INGRESS: usize = 1;
pub const NR_DIRS: usize = 2;

pub const HTB_MAJOR: u16 = 1;
pub const CLASSID_POD_INGRESS: u32 = 0x0001_0001;
pub const CLASSID_POD_INTERNET: u32 = 0x0001_0010;
pub const CLASSID_POD_OTHER: u32 = 0x0001_0020;
pub const CLASSID_NODE_CAP: u32 = 0x0001_0010;
/// Minor offsets of a shaped class's two leaves (see `an_flows` in the header).
pub const LEAF_SPARSE: u32 = 1;
pub const LEAF_BULK: u32 = 2;

pub const META_IN_USE: u32 = 1;
pub const META_INTERNET_FROM_POLICY: u32 = 2;

/// `an_config.flags`: switch the queue model off (no CE marks, no pod-side drops).
pub const CFG_AQM_OFF: u32 = 1;
/// `an_config.flags`: switch flow isolation off (every packet to the bulk leaf).
pub const CFG_FLOWS_OFF: u32 = 2;
/// `an_config.flags`: switch receive-window clamping off (see `an_conns` in the header).
pub const CFG_CLAMP_OFF: u32 = 4;
/// `an_pod.flags`: the pod has an ingress limit; its TCP windows are clamped.
pub const POD_INGRESS_LIMIT: u32 = 1;

/// `an_conns`: TCP connections of ingress-limited pods, and the window clamp's sizes.
pub const MAX_CONNS: u32 = 65536;
/// Segments TCP is asked for in a shaped class: at most this long at its rate (see the header).
pub const SEG_NS: u64 = 1_000_000;

/// The largest frame TCP is asked to send into a class at `rate` bit/s on a device whose
/// frame is `frame` bytes (what the programs' `seg_frame()` computes).
pub fn seg_frame(rate: u64, frame: u64) -> u64 {
    (rate / 8 / (1_000_000_000 / SEG_NS))
        .max(MIN_FRAME)
        .min(frame)
}
pub const WND_QUEUE_NS: u64 = 16_000_000;
pub const WND_MIN_FRAMES: u64 = 4;
pub const WND_MIN_FLOW_FRAMES: u64 = 2;
/// Epoch of the bulk-flow bitmaps in `an_vqueue`.
pub const FLOW_EPOCH_NS: u64 = 100_000_000;
pub const CONN_SYN_SENT: u8 = 1;
pub const CONN_SYNACK_SENT: u8 = 2;
pub const CONN_ESTABLISHED: u8 = 3;
pub const CONN_SYN_RCVD: u8 = 4;

/// `an_flows`: flow buckets per shaped class, and the sparse-leaf rules (see the header).
pub const FLOW_BUCKETS: u32 = 64;
pub const FLOW_ENTRIES: u32 = VQ_ENTRIES * FLOW_BUCKETS;
pub const FLOW_BURST_FRAMES: u64 = 2;
pub const FLOW_RATE_DIV: u64 = 16;
pub const FLOW_GUARD_FRAMES: u64 = 1;
/// The sparse leaf is guaranteed this fraction (1/N) of its class's rate.
pub const SPARSE_RATE_DIV: u64 = 4;

/// `an_vqueue` index: `slot * VQ_PER_POD + VQ_{INGRESS,EGRESS,INTERNET}`, or `VQ_NODE_CAP`.
pub const VQ_PER_POD: u32 = 3;
pub const VQ_INGRESS: u32 = 0;
pub const VQ_EGRESS: u32 = 1;
pub const VQ_INTERNET: u32 = 2;
pub const VQ_NODE_CAP: u32 = 3072;
pub const VQ_ENTRIES: u32 = 3073;
/// Marking threshold (modelled queueing delay): `ECN_MARK_MIN_NS` up to `ECN_MARK_REF_RATE`
/// bit/s, growing with the rate up to `ECN_MARK_MAX_NS`, at least `ECN_MARK_FRAMES` frames.
pub const ECN_MARK_MIN_NS: u64 = 2_000_000;
pub const ECN_MARK_MAX_NS: u64 = 10_000_000;
pub const ECN_MARK_REF_RATE: u64 = 10_000_000;
pub const ECN_MARK_FRAMES: u64 = 2;

/// The marking threshold of a class at `rate` bit/s on a device whose largest frame is
/// `frame` bytes, in ns (what the programs compute).
pub fn ecn_mark_ns(rate: u64, frame: u64) -> u64 {
    let t = if rate < ECN_MARK_REF_RATE * (ECN_MARK_MAX_NS / ECN_MARK_MIN_NS) {
        ECN_MARK_MIN_NS * (rate / 1000) / (ECN_MARK_REF_RATE / 1000)
    } else {
        ECN_MARK_MAX_NS
    };
    let frames = u128::from(ECN_MARK_FRAMES * frame) * 8 * 1_000_000_000 / u128::from(rate.max(1));
    let frames = frames.min(u128::from(u64::MAX)) as u64;
    t.max(ECN_MARK_MIN_NS).max(frames)
}
/// HTB class burst when the pod sets none: 10 ms of the rate, at least 4 of the class's
/// segments ([`seg_frame`]) and one frame.
pub const DEFAULT_BURST_NS: u64 = 10_000_000;
pub const DEFAULT_BURST_FRAMES: u64 = 4;
/// Leaf bucket: 1 ms of the rate, at least 2 frames (a GSO aggregate above it is segmented).
pub const LEAF_BURST_NS: u64 = 1_000_000;
pub const LEAF_BURST_FRAMES: u64 = 2;
/// Forwarded-traffic leaf queue: 25 ms of the rate, at least 6 frames (the window clamp's
/// floor plus the bucket).
pub const LEAF_QUEUE_NS: u64 = 25_000_000;
pub const LEAF_QUEUE_FRAMES: u64 = 6;
const _: () = assert!(LEAF_QUEUE_FRAMES >= WND_MIN_FRAMES + LEAF_BURST_FRAMES);
/// Ethernet header bytes that HTB and tbf count on top of the MTU (no FCS).
pub const ETH_HLEN: u64 = 14;
/// The largest frame assumed for a record that carries none (a 1500-byte MTU). Every size
/// "in frames" is otherwise in frames of the device's own MTU (`PodMeta::frame`,
/// `Config::uplink_frame`).
pub const MIN_FRAME: u64 = 1514;

/// The largest frame of a device with `mtu`, as HTB and tbf count it.
pub const fn frame_of_mtu(mtu: u32) -> u64 {
    mtu as u64 + ETH_HLEN
}

/// Traffic class of a packet, decided on its remote address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Internal,
    Internet,
    Blocked,
    /// Not IPv4 (ARP, IPv6): passed and counted here.
    Other,
}

impl Class {
    pub const ALL: [Class; NR_CLASSES] = [
        Class::Internal,
        Class::Internet,
        Class::Blocked,
        Class::Other,
    ];

    pub const fn index(self) -> usize {
        match self {
            Class::Internal => CLASS_INTERNAL as usize,
            Class::Internet => CLASS_INTERNET as usize,
            Class::Blocked => CLASS_BLOCKED as usize,
            Class::Other => CLASS_OTHER as usize,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Class::Internal => "internal",
            Class::Internet => "internet",
            Class::Blocked => "blocked",
            Class::Other => "other",
        }
    }
}

/// Direction seen from the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the pod (host veth ingress).
    Egress,
    /// To the pod (host veth egress).
    Ingress,
}

impl Direction {
    pub const ALL: [Direction; NR_DIRS] = [Direction::Egress, Direction::Ingress];

    pub const fn index(self) -> usize {
        match self {
            Direction::Egress => DIR_EGRESS,
            Direction::Ingress => DIR_INGRESS,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}

/// Data part of `struct an_lpm_key`; aya's `lpm_trie::Key<LpmKeyData>` adds the
/// leading `prefixlen` (= 32 + IPv4 prefix length).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LpmKeyData {
    pub gen: u32,
    /// IPv4 octets in network order.
    pub addr: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<aya::maps::lpm_trie::Key<LpmKeyData>>() == 12);

impl LpmKeyData {
    pub fn new(gen: u32, addr: Ipv4Addr) -> Self {
        Self {
            gen,
            addr: addr.octets(),
        }
    }
}

/// `struct an_lpm_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LpmValue {
    pub class: u32,
    pub reserved: u32,
}
const _: () = assert!(core::mem::size_of::<LpmValue>() == 8);

/// `struct an_config`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Config {
    pub abi_version: u32,
    pub active_gen: u32,
    pub policy_epoch: u64,
    pub default_internet_rate: u64,
    pub node_internet_cap: u64,
    pub uplink_ifindex: u32,
    pub flags: u32,
    /// The uplink's largest frame (MTU + Ethernet header), bytes.
    pub uplink_frame: u32,
    /// The uplink's largest GSO/GRO aggregate, bytes.
    pub uplink_gso_max: u32,
    pub reserved: [u64; 2],
}
const _: () = assert!(core::mem::size_of::<Config>() == 64);

/// `struct an_pod`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pod {
    pub slot: u32,
    pub flags: u32,
    /// IPv4 octets in network order.
    pub ipv4: [u8; 4],
    pub reserved: u32,
}
const _: () = assert!(core::mem::size_of::<Pod>() == 16);

/// `struct an_counter`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<Counter>() == 16);

impl core::ops::AddAssign for Counter {
    fn add_assign(&mut self, rhs: Self) {
        self.packets = self.packets.wrapping_add(rhs.packets);
        self.bytes = self.bytes.wrapping_add(rhs.bytes);
    }
}

/// `struct an_pod_counters`: `dir[direction][class]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCounters {
    pub dir: [[Counter; NR_CLASSES]; NR_DIRS],
}
const _: () = assert!(core::mem::size_of::<PodCounters>() == 128);

impl PodCounters {
    pub fn get(&self, dir: Direction, class: Class) -> Counter {
        self.dir[dir.index()][class.index()]
    }
}

impl core::ops::AddAssign for PodCounters {
    fn add_assign(&mut self, rhs: Self) {
        for (a, b) in self.dir.iter_mut().zip(rhs.dir.iter()) {
            for (x, y) in a.iter_mut().zip(b.iter()) {
                *x += *y;
            }
        }
    }
}

/// `struct an_node_counters`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCounters {
    pub capped: Counter,
    pub reserved: [u64; 2],
}
const _: () = assert!(core::mem::size_of::<NodeCounters>() == 32);

/// `struct an_pod_meta`. Strings are NUL-padded bytes.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PodMeta {
    pub flags: u32,
    pub host_ifindex: u32,
    pub ipv4: [u8; 4],
    pub pod_ifindex: u32,
    pub ingress_rate: u64,
    pub ingress_burst: u64,
    pub egress_rate: u64,
    pub egress_burst: u64,
    pub internet_egress_rate: u64,
    pub attached_unix_ns: u64,
    pub k8s_namespace: [u8; 64],
    pub k8s_name: [u8; 256],
    pub container_id: [u8; 128],
    pub ifname: [u8; 16],
    pub host_ifname: [u8; 16],
    pub netns: [u8; 256],
    /// The pod veth's largest frame (MTU + Ethernet header), bytes.
    pub frame: u32,
    /// The pod veth's largest GSO/GRO aggregate, bytes.
    pub gso_max: u32,
}
const _: () = assert!(core::mem::size_of::<PodMeta>() == 808);
const _: () = assert!(core::mem::offset_of!(PodMeta, k8s_namespace) == 64);

impl Default for PodMeta {
    fn default() -> Self {
        Self {
            flags: 0,
            host_ifindex: 0,
            ipv4: [0; 4],
            pod_ifindex: 0,
            ingress_rate: 0,
            ingress_burst: 0,
            egress_rate: 0,
            egress_burst: 0,
            internet_egress_rate: 0,
            attached_unix_ns: 0,
            k8s_namespace: [0; 64],
            k8s_name: [0; 256],
            container_id: [0; 128],
            ifname: [0; 16],
            host_ifname: [0; 16],
            netns: [0; 256],
            frame: 0,
            gso_max: 0,
        }
    }
}

impl core::fmt::Debug for PodMeta {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PodMeta")
            .field("flags", &self.flags)
            .field("host_ifindex", &self.host_ifindex)
            .field("ipv4", &Ipv4Addr::from(self.ipv4))
            .field("pod_ifindex", &self.pod_ifindex)
            .field("ingress_rate", &self.ingress_rate)
            .field("ingress_burst", &self.ingress_burst)
            .field("egress_rate", &self.egress_rate)
            .field("egress_burst", &self.egress_burst)
            .field("internet_egress_rate", &self.internet_egress_rate)
            .field("k8s_namespace", &cstr(&self.k8s_namespace))
            .field("k8s_name", &cstr(&self.k8s_name))
            .field("container_id", &cstr(&self.container_id))
            .field("ifname", &cstr(&self.ifname))
            .field("host_ifname", &cstr(&self.host_ifname))
            .field("netns", &cstr(&self.netns))
            .field("frame", &self.frame)
            .field("gso_max", &self.gso_max)
            .finish()
    }
}

/// The `an_vqueue` index of a pod's class queue (`VQ_INGRESS`, `VQ_EGRESS`, `VQ_INTERNET`).
pub const fn vq_index(slot: u32, class: u32) -> u32 {
    slot * VQ_PER_POD + class
}

/// `struct an_vqueue`: the modelled queue of one shaped class (see the header).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VQueue {
    /// `bpf_ktime_get_ns()` at which the modelled queue drains.
    pub t_empty: u64,
    /// Wire packets CE-marked.
    pub ce_marked: u64,
    /// Wire packets of local TCP dropped as a congestion signal (pod side).
    pub dropped: u64,
    /// Buckets of the flows with a backlog in the bulk leaf, this epoch and the last.
    pub flows_cur: u64,
    pub flows_prev: u64,
    pub t_epoch: u64,
}
const _: () = assert!(core::mem::size_of::<VQueue>() == 48);

/// `struct an_flow`: one flow bucket of a shaped class (see the header).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flow {
    /// Modelled departure of the flow's last packet sent to the bulk leaf.
    pub t_bulk: u64,
    /// The flow's sparse budget, a virtual clock.
    pub t_sparse: u64,
}
const _: () = assert!(core::mem::size_of::<Flow>() == 16);

/// `struct an_conn_key`: a pod's TCP connection (addresses and ports in network byte order).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ConnKey {
    pub pod_addr: [u8; 4],
    pub remote_addr: [u8; 4],
    pub pod_port: [u8; 2],
    pub remote_port: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<ConnKey>() == 12);

/// `struct an_conn`: what the handshake told about a connection.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Conn {
    pub t_handshake: u64,
    pub rtt_ns: u32,
    pub wscale: u8,
    pub state: u8,
    pub remote_wscale: u8,
    pub reserved: u8,
}
const _: () = assert!(core::mem::size_of::<Conn>() == 16);

/// `struct an_ns_key`: a namespace name, NUL padded.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NsKey {
    pub name: [u8; 64],
}
const _: () = assert!(core::mem::size_of::<NsKey>() == 64);

/// `struct an_ns_rate`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NsRate {
    pub internet_rate: u64,
}
const _: () = assert!(core::mem::size_of::<NsRate>() == 8);

// SAFETY: all of these are `#[repr(C)]`, made only of integers and byte arrays, with no
// implicit padding (sizes asserted above equal the sum of their fields), so every bit
// pattern is valid and they can be copied to and from map memory.
unsafe impl aya::Pod for LpmKeyData {}
unsafe impl aya::Pod for LpmValue {}
unsafe impl aya::Pod for Config {}
unsafe impl aya::Pod for Pod {}
unsafe impl aya::Pod for Counter {}
unsafe impl aya::Pod for PodCounters {}
unsafe impl aya::Pod for NodeCounters {}
unsafe impl aya::Pod for PodMeta {}
unsafe impl aya::Pod for NsKey {}
unsafe impl aya::Pod for NsRate {}
unsafe impl aya::Pod for VQueue {}
unsafe impl aya::Pod for Flow {}
unsafe impl aya::Pod for ConnKey {}
unsafe impl aya::Pod for Conn {}

/// Copies `s` into a NUL-padded fixed buffer; `None` if it does not fit with a trailing NUL.
pub fn fixed_str<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() >= N || b.contains(&0) {
        return None;
    }
    let mut out = [0u8; N];
    out[..b.len()].copy_from_slice(b);
    Some(out)
}

/// The string in a NUL-padded buffer (lossy on invalid UTF-8, which we never write).
pub fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl NsKey {
    pub fn new(name: &str) -> Option<Self> {
        fixed_str::<64>(name).map(|name| Self { name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = include_str!("../include/aliasnet_abi.h");

    fn define(name: &str) -> u64 {
        let line = HEADER
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name) && l.starts_with("#define"))
            .unwrap_or_else(|| panic!("#define {name} not in aliasnet_abi.h"));
        let v = line.split_whitespace().nth(2).expect("value");
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).expect("hex"),
            None => v.parse().expect("decimal"),
        }
    }

    #[test]
    fn constants_match_header() {
        let pairs: &[(&str, u64)] = &[
            ("AN_ABI_VERSION", ABI_VERSION.into()),
            ("AN_MAX_PODS", MAX_PODS.into()),
            ("AN_MAX_PREFIXES", MAX_PREFIXES.into()),
            ("AN_LPM_MAX_ENTRIES", LPM_MAX_ENTRIES.into()),
            ("AN_MAX_NAMESPACES", MAX_NAMESPACES.into()),
            ("AN_CLASS_INTERNAL", CLASS_INTERNAL.into()),
            ("AN_CLASS_INTERNET", CLASS_INTERNET.into()),
            ("AN_CLASS_BLOCKED", CLASS_BLOCKED.into()),
            ("AN_CLASS_OTHER", CLASS_OTHER.into()),
            ("AN_NR_CLASSES", NR_CLASSES as u64),
            ("AN_DIR_EGRESS", DIR_EGRESS as u64),
            ("AN_DIR_INGRESS", DIR_INGRESS as u64),
            ("AN_NR_DIRS", NR_DIRS as u64),
            ("AN_HTB_MAJOR", HTB_MAJOR.into()),
            ("AN_CLASSID_POD_INTERNET", CLASSID_POD_INTERNET.into()),
            ("AN_CLASSID_POD_OTHER", CLASSID_POD_OTHER.into()),
            ("AN_CLASSID_NODE_CAP", CLASSID_NODE_CAP.into()),
            ("AN_CLASSID_POD_INGRESS", CLASSID_POD_INGRESS.into()),
            ("AN_LEAF_SPARSE", LEAF_SPARSE.into()),
            ("AN_LEAF_BULK", LEAF_BULK.into()),
            ("AN_CFG_FLOWS_OFF", CFG_FLOWS_OFF.into()),
            ("AN_FLOW_BUCKETS", FLOW_BUCKETS.into()),
            ("AN_FLOW_BURST_FRAMES", FLOW_BURST_FRAMES),
            ("AN_FLOW_RATE_DIV", FLOW_RATE_DIV),
            ("AN_FLOW_GUARD_FRAMES", FLOW_GUARD_FRAMES),
            ("AN_SPARSE_RATE_DIV", SPARSE_RATE_DIV),
            ("AN_CFG_CLAMP_OFF", CFG_CLAMP_OFF.into()),
            ("AN_POD_INGRESS_LIMIT", POD_INGRESS_LIMIT.into()),
            ("AN_MAX_CONNS", MAX_CONNS.into()),
            ("AN_SEG_NS", SEG_NS),
            ("AN_WND_QUEUE_NS", WND_QUEUE_NS),
            ("AN_WND_MIN_FRAMES", WND_MIN_FRAMES),
            ("AN_WND_MIN_FLOW_FRAMES", WND_MIN_FLOW_FRAMES),
            ("AN_FLOW_EPOCH_NS", FLOW_EPOCH_NS),
            ("AN_CONN_SYN_SENT", CONN_SYN_SENT.into()),
            ("AN_CONN_SYNACK_SENT", CONN_SYNACK_SENT.into()),
            ("AN_CONN_ESTABLISHED", CONN_ESTABLISHED.into()),
            ("AN_CONN_SYN_RCVD", CONN_SYN_RCVD.into()),
            ("AN_META_IN_USE", META_IN_USE.into()),
            (
                "AN_META_INTERNET_FROM_POLICY",
                META_INTERNET_FROM_POLICY.into(),
            ),
            ("AN_CFG_AQM_OFF", CFG_AQM_OFF.into()),
            ("AN_VQ_PER_POD", VQ_PER_POD.into()),
            ("AN_VQ_INGRESS", VQ_INGRESS.into()),
            ("AN_VQ_EGRESS", VQ_EGRESS.into()),
            ("AN_VQ_INTERNET", VQ_INTERNET.into()),
            ("AN_VQ_NODE_CAP", VQ_NODE_CAP.into()),
            ("AN_VQ_ENTRIES", VQ_ENTRIES.into()),
            ("AN_ECN_MARK_MIN_NS", ECN_MARK_MIN_NS),
            ("AN_ECN_MARK_MAX_NS", ECN_MARK_MAX_NS),
            ("AN_ECN_MARK_REF_RATE", ECN_MARK_REF_RATE),
            ("AN_ECN_MARK_FRAMES", ECN_MARK_FRAMES),
            ("AN_DEFAULT_BURST_NS", DEFAULT_BURST_NS),
            ("AN_DEFAULT_BURST_FRAMES", DEFAULT_BURST_FRAMES),
            ("AN_LEAF_BURST_NS", LEAF_BURST_NS),
            ("AN_LEAF_BURST_FRAMES", LEAF_BURST_FRAMES),
            ("AN_LEAF_QUEUE_NS", LEAF_QUEUE_NS),
            ("AN_LEAF_QUEUE_FRAMES", LEAF_QUEUE_FRAMES),
            ("AN_MIN_FRAME", MIN_FRAME),
        ];
        for (name, rust) in pairs {
            assert_eq!(
                define(name),
                *rust,
                "{name} differs between aliasnet_abi.h and abi.rs"
            );
        }
    }

    #[test]
    fn struct_sizes_match_header() {
        // The header asserts these numbers with _Static_assert; compare the text so both
        // sides are tied to the same literal.
        let sizes: &[(&str, usize)] = &[
            (
                "an_lpm_key",
                core::mem::size_of::<aya::maps::lpm_trie::Key<LpmKeyData>>(),
            ),
            ("an_lpm_value", core::mem::size_of::<LpmValue>()),
            ("an_config", core::mem::size_of::<Config>()),
            ("an_pod", core::mem::size_of::<Pod>()),
            ("an_counter", core::mem::size_of::<Counter>()),
            ("an_pod_counters", core::mem::size_of::<PodCounters>()),
            ("an_node_counters", core::mem::size_of::<NodeCounters>()),
            ("an_pod_meta", core::mem::size_of::<PodMeta>()),
            ("an_ns_key", core::mem::size_of::<NsKey>()),
            ("an_ns_rate", core::mem::size_of::<NsRate>()),
            ("an_vqueue", core::mem::size_of::<VQueue>()),
            ("an_flow", core::mem::size_of::<Flow>()),
            ("an_conn_key", core::mem::size_of::<ConnKey>()),
            ("an_conn", core::mem::size_of::<Conn>()),
        ];
        for (name, size) in sizes {
            let needle = format!("_Static_assert(sizeof(struct {name}) == {size},");
            assert!(HEADER.contains(&needle), "missing or different: {needle}");
        }
    }

    #[test]
    fn marking_threshold_grows_with_the_rate() {
        // 2 frames at 1 Mbit/s are longer than 2 ms.
        assert_eq!(ecn_mark_ns(1_000_000, 1514), 2 * 1514 * 8 * 1000);
        assert_eq!(ecn_mark_ns(10_000_000, 1514), 2_422_400);
        assert_eq!(ecn_mark_ns(20_000_000, 1514), 4_000_000);
        assert_eq!(ecn_mark_ns(50_000_000, 1514), 10_000_000);
        assert_eq!(ecn_mark_ns(1_000_000_000, 1514), 10_000_000);
        assert_eq!(ecn_mark_ns(1_000_000_000_000_000, 1514), 10_000_000);
        // Jumbo frames: never below two of the device's frames.
        assert_eq!(ecn_mark_ns(10_000_000, 9014), 2 * 9014 * 8 * 100);
        assert_eq!(ecn_mark_ns(1_000_000_000, 9014), 10_000_000);
    }

    #[test]
    fn fixed_strings() {
        assert_eq!(cstr(&fixed_str::<8>("abc").unwrap()), "abc");
        assert!(fixed_str::<4>("abcd").is_none(), "needs room for the NUL");
        assert!(fixed_str::<8>("a\0b").is_none());
        assert_eq!(
            NsKey::new("kube-system").map(|k| cstr(&k.name)).as_deref(),
            Some("kube-system")
        );
    }
}
