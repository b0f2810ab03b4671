//! Rust mirrors of `ebpf/include/aliasnet_abi.h`: the layout of every pinned map.
//!
//! Each struct repeats the C layout field by field and asserts the same size as the
//! header's `_Static_assert`, so a drift on either side fails the build; `tests/btf_abi.rs`
//! compares every field offset with the compiled object's BTF, and [`MAPS`] with its map
//! definitions. `tests/headers.rs` checks the constants and sizes against the header text.
//!
//! [`ABI_VERSION`] covers everything here: the structs, [`MAPS`], [`POD_KEYS`] and
//! [`CLASS_BASE`], the values
//! stored in them and the HTB class ids. Tuning constants live in [`crate::tuning`] and are
//! not covered.

use std::net::{Ipv4Addr, Ipv6Addr};

use aya::maps::MapType;

use crate::maps;

/// Bumped whenever a layout below changes; pinned maps of another version are not reused.
pub const ABI_VERSION: u32 = 8;

pub const MAX_PODS: u32 = 1024;
pub const MAX_PREFIXES: u32 = 65536;
pub const LPM_MAX_ENTRIES: u32 = 131_072;
/// Per-namespace entries of the policy (`an_policy`), besides the default one.
pub const MAX_NAMESPACES: u32 = 4096;
/// Aggregates shaped at once: the node ([`NODE_ENTITY`]) and namespaces with pods here.
pub const MAX_ENTITIES: u32 = 1024;
pub const NODE_ENTITY: u32 = 0;
/// Named destination classes (`[classes.<name>]` of the policy).
pub const MAX_NAMED: usize = 32;

pub const CLASS_INTERNAL: u32 = 0;
pub const CLASS_INTERNET: u32 = 1;
pub const CLASS_BLOCKED: u32 = 2;
pub const CLASS_OTHER: u32 = 3;
/// Named class `k` is `CLASS_NAMED + k`.
pub const CLASS_NAMED: u32 = 4;
pub const NR_CLASSES: usize = CLASS_NAMED as usize + MAX_NAMED;

/// Limit kinds: a pod's total, the internet (named classes included), named class `k` at
/// `KIND_NAMED + k`.
pub const KIND_TOTAL: usize = 0;
pub const KIND_INTERNET: usize = 1;
pub const KIND_NAMED: usize = 2;
pub const NR_KINDS: usize = KIND_NAMED + MAX_NAMED;

pub const DIR_EGRESS: usize = 0;
pub const DIR_INGRESS: usize = 1;
pub const NR_DIRS: usize = 2;

pub const HTB_MAJOR: u16 = 1;
/// `skb->priority` naming the HTB qdisc itself: its unshaped direct queue.
pub const CLASSID_DIRECT: u32 = 0x0001_0000;
/// Minor offsets of a limit's two leaves (see `an_flows` in the header).
pub const LEAF_SPARSE: u32 = 1;
pub const LEAF_BULK: u32 = 2;

/// The minor of the limit of `kind` on a pod's device (`AN_POD_CLASS`).
pub const fn pod_class(kind: usize) -> u32 {
    match kind {
        KIND_TOTAL => 0x1,
        KIND_INTERNET => 0x10,
        k => 0x100 + 0x10 * (k - KIND_NAMED) as u32,
    }
}

/// `1:minor`.
pub const fn classid(minor: u32) -> u32 {
    ((HTB_MAJOR as u32) << 16) | (minor & 0xffff)
}

/// Aggregate devices: the pod at `slot`'s own bulk leaf under its group of `kind`.
pub const fn agg_leaf(kind: usize, slot: u32) -> u32 {
    1 + (kind - KIND_INTERNET) as u32 * MAX_PODS + slot
}
/// Group minors (inner class; + [`GROUP_SPARSE`], + [`GROUP_SHARED`] its leaves).
pub const AGG_GROUP_MIN: u32 = 0x8410;
pub const AGG_GROUP_MAX: u32 = 0xfff0;
pub const GROUP_SPARSE: u32 = 1;
pub const GROUP_SHARED: u32 = 2;
/// The node's group of `kind` on its aggregate devices.
pub const fn node_group(kind: usize) -> u32 {
    AGG_GROUP_MIN + 3 * kind as u32
}
const _: () = assert!(agg_leaf(NR_KINDS - 1, MAX_PODS - 1) < AGG_GROUP_MIN);
const _: () = assert!(node_group(NR_KINDS - 1) + GROUP_SHARED <= AGG_GROUP_MAX);

/// The pod-side filter's classid is this plus the pod's slot (0 would be "none").
pub const POD_FILTER_CLASSID_BASE: u32 = 1;

/// The classid (`TCA_BPF_CLASSID`) of slot `slot`'s pod-side filter: how `an_pod_egress`
/// knows its pod without trusting the packet's source address.
pub const fn pod_filter_classid(slot: u32) -> u32 {
    POD_FILTER_CLASSID_BASE + slot
}

/// `skb->cb[0]` of traffic to a pod that its namespace's download limits shape.
pub const CB_NS_STAGE: u32 = 0x616e_7332;
/// The HTB major of the namespaces' download device (the pod's own leaf in `skb->priority`,
/// 1:x, must name none of its classes).
pub const NS_IN_MAJOR: u16 = 0xfff8;
const _: () = assert!(AGG_GROUP_MAX + GROUP_SHARED + 1 < NS_IN_MAJOR as u32);

pub const META_IN_USE: u32 = 1;
/// The host veth carries `an_ns_gate` (userspace only).
pub const META_NS_GATE: u32 = 2;
pub const ENTITY_IN_USE: u32 = 1;

/// `an_conns`: TCP connections whose windows are clamped, and the states of their handshake.
pub const MAX_CONNS: u32 = 262_144;
/// A pod's share of `an_conns` is the table over the number of pods, at least this many.
pub const CONN_SHARE_MIN: u32 = 64;
pub const CONN_SHARE_DEFAULT: u32 = MAX_CONNS / CONN_SHARE_MIN;
pub const CONN_SYN_SENT: u8 = 1;
pub const CONN_SYNACK_SENT: u8 = 2;
pub const CONN_ESTABLISHED: u8 = 3;
pub const CONN_SYN_RCVD: u8 = 4;
/// `Conn::flags`.
pub const CONN_F_FIN_POD: u8 = 1;
pub const CONN_F_FIN_REMOTE: u8 = 2;
pub const CONN_F_RELEARNT: u8 = 4;
/// Idle times after which the sweep removes an entry, in units of 2^30 ns.
pub const CONN_HANDSHAKE_TTL_S: u32 = 10;
pub const CONN_CLOSED_TTL_S: u32 = 4;
pub const CONN_IDLE_TTL_S: u32 = 120;
pub const CONN_TIME_SHIFT: u32 = 30;

/// Link-scoped IPv6 from a pod: packets a second, and the burst.
pub const ND_PPS: u64 = 20;
pub const ND_BURST: u64 = 40;

/// The share of `an_conns` each of `pods` pods may hold.
pub const fn conn_share(pods: u32) -> u32 {
    MAX_CONNS
        / if pods > CONN_SHARE_MIN {
            pods
        } else {
            CONN_SHARE_MIN
        }
}

/// Drop reasons of `PodCounters::dropped`.
pub const DROP_ND: usize = 0;
pub const DROP_GATEWAY: usize = 1;
pub const NR_DROPS: usize = 4;

/// `an_flows`: flow buckets per flow table (one bit each in `an_vqueue`'s bitmaps).
pub const FLOW_BUCKETS: u32 = 64;
/// A pod's flow table for `dir`.
pub const fn flows_pod(slot: u32, dir: usize) -> u32 {
    slot * NR_DIRS as u32 + dir as u32
}
/// An aggregate's flow table for `dir`.
pub const fn flows_agg(entity: u32, dir: usize) -> u32 {
    MAX_PODS * NR_DIRS as u32 + entity * NR_DIRS as u32 + dir as u32
}
pub const FLOW_TABLES: u32 = (MAX_PODS + MAX_ENTITIES) * NR_DIRS as u32;
pub const FLOW_ENTRIES: u32 = FLOW_TABLES * FLOW_BUCKETS;

/// The `an_flows` bucket the programs give a packet (`flow_bucket()` in the programs): its
/// addresses (IPv6 folded into 32 bits), protocol and, for unfragmented TCP and UDP, its
/// (source, destination) ports. Flows that share a bucket share its state, as in fq_codel:
/// what a user can read here is which of their flows would.
pub fn flow_bucket(
    src: std::net::IpAddr,
    dst: std::net::IpAddr,
    proto: u8,
    ports: Option<(u16, u16)>,
) -> u32 {
    // As the programs read them: words in wire order, loaded on this host.
    let word = |a: std::net::IpAddr| match a {
        std::net::IpAddr::V4(a) => u32::from_ne_bytes(a.octets()),
        std::net::IpAddr::V6(a) => a
            .octets()
            .chunks_exact(4)
            .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
            .fold(0, |x, w| x ^ w),
    };
    let ports = ports.map_or(0, |(s, d)| {
        let (s, d) = (s.to_be_bytes(), d.to_be_bytes());
        u32::from_ne_bytes([s[0], s[1], d[0], d[1]])
    });
    let mut h = word(src)
        ^ word(dst).wrapping_mul(0x9e37_79b1)
        ^ ports.wrapping_mul(0x85eb_ca6b)
        ^ u32::from(proto);
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h & (FLOW_BUCKETS - 1)
}

/// `an_vqueue`: a pod's models by direction, and its backstop's ([`VQ_POLICE`]).
pub const VQ_POLICE: usize = 2;
/// The `an_vqueue` index of the pod at `slot`'s limit of `kind` in `d` (a direction or
/// [`VQ_POLICE`]).
pub const fn vq_pod(slot: u32, d: usize, kind: usize) -> u32 {
    (slot * 3 + d as u32) * NR_KINDS as u32 + kind as u32
}
pub const VQ_AGG_BASE: u32 = MAX_PODS * 3 * NR_KINDS as u32;
/// The `an_vqueue` index of an aggregate's limit of `kind` in `dir`.
pub const fn vq_agg(entity: u32, dir: usize, kind: usize) -> u32 {
    VQ_AGG_BASE + (entity * NR_DIRS as u32 + dir as u32) * NR_KINDS as u32 + kind as u32
}
pub const VQ_ENTRIES: u32 = VQ_AGG_BASE + MAX_ENTITIES * NR_DIRS as u32 * NR_KINDS as u32;

// The tuning constants used to live here; they stay reachable as `abi::*` for existing users.
pub use crate::tuning::{
    ecn_mark_ns, frame_of_mtu, seg_frame, CFG_AQM_OFF, CFG_CLAMP_OFF, CFG_FLOWS_OFF,
    DEFAULT_BURST_FRAMES, DEFAULT_BURST_NS, ECN_MARK_FRAMES, ECN_MARK_MAX_NS, ECN_MARK_MIN_NS,
    ECN_MARK_REF_RATE, ETH_HLEN, FLOW_BURST_FRAMES, FLOW_EPOCH_NS, FLOW_GUARD_FRAMES,
    FLOW_RATE_DIV, LEAF_BURST_FRAMES, LEAF_BURST_NS, LEAF_QUEUE_FRAMES, LEAF_QUEUE_NS, MIN_FRAME,
    SEG_NS, SPARSE_RATE_DIV, WND_MIN_FLOW_FRAMES, WND_MIN_FRAMES, WND_QUEUE_NS,
};

/// Traffic class of a packet, decided on its remote address, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    Internal,
    /// Internet traffic in no named class.
    Internet,
    Blocked,
    /// Not IP (ARP, malformed IPv4 or IPv6): passed and counted here.
    Other,
    /// Named class `k` (`< MAX_NAMED`): a part of the internet.
    Named(u8),
}

impl Class {
    /// The classes that are not named.
    pub const FIXED: [Class; 4] = [
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
            Class::Named(k) => CLASS_NAMED as usize + k as usize,
        }
    }

    /// The class counted at `index` (`< NR_CLASSES`).
    pub const fn from_index(index: usize) -> Class {
        match index {
            0 => Class::Internal,
            1 => Class::Internet,
            2 => Class::Blocked,
            3 => Class::Other,
            i => Class::Named((i - CLASS_NAMED as usize) as u8),
        }
    }

    /// The name of a class that is not named; `None` for a named class (its name is in
    /// `an_classes`).
    pub const fn fixed_name(self) -> Option<&'static str> {
        match self {
            Class::Internal => Some("internal"),
            Class::Internet => Some("internet"),
            Class::Blocked => Some("blocked"),
            Class::Other => Some("other"),
            Class::Named(_) => None,
        }
    }

    /// Internet traffic (plain, or of a named class).
    pub const fn is_internet(self) -> bool {
        matches!(self, Class::Internet | Class::Named(_))
    }
}

/// Direction seen from the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// Data part of `struct an_lpm6_key` (`an_prefixes6`); aya's `lpm_trie::Key<Lpm6KeyData>`
/// adds the leading `prefixlen` (= 32 + IPv6 prefix length).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lpm6KeyData {
    pub gen: u32,
    /// IPv6 octets in network order.
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<aya::maps::lpm_trie::Key<Lpm6KeyData>>() == 24);

impl Lpm6KeyData {
    pub fn new(gen: u32, addr: Ipv6Addr) -> Self {
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
    /// Bumped on every attach and detach.
    pub pods_epoch: u64,
    pub uplink_ifindex: u32,
    pub flags: u32,
    /// The uplink's largest frame (MTU + Ethernet header), bytes.
    pub uplink_frame: u32,
    /// The uplink's largest GSO/GRO aggregate, bytes.
    pub uplink_gso_max: u32,
    /// The namespaces' download device (IFB), 0 = not in use.
    pub ns_in_ifindex: u32,
    /// The namespaces' upload device (IFB), 0 = not in use.
    pub ns_out_ifindex: u32,
    /// The node's download device (IFB), 0 = not in use.
    pub node_in_ifindex: u32,
    /// 1 = the node's upload limits are on the uplink.
    pub node_out: u32,
    /// The classifier's prefixes as last applied (userspace only).
    pub prefix_hash: u64,
    /// `an_conns` entries one pod may hold, 0 = [`CONN_SHARE_DEFAULT`].
    pub conn_share: u32,
    pub reserved32: u32,
    pub reserved: u64,
}
const _: () = assert!(core::mem::size_of::<Config>() == 80);

/// `struct an_pod`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pod {
    pub slot: u32,
    pub flags: u32,
    /// IPv4 octets in network order, all zero = none.
    pub ipv4: [u8; 4],
    pub reserved: u32,
    /// IPv6 octets in network order, all zero = none.
    pub ipv6: [u8; 16],
    /// The pod interface's link-local address, all zero = unknown: its only link-local
    /// source.
    pub ipv6_ll: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<Pod>() == 48);

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

/// `struct an_pod_counters`: `dir[direction][class]`, what the pod sent that the host veth
/// dropped as not from its own address (`spoofed`, in no class), what it dropped above the
/// pod's egress limits (`policed`, also counted in its class), and other drops by reason
/// (`dropped[DROP_*]`, in no class).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCounters {
    pub dir: [[Counter; NR_CLASSES]; NR_DIRS],
    pub spoofed: Counter,
    pub policed: Counter,
    pub dropped: [Counter; NR_DROPS],
}
const _: () = assert!(core::mem::size_of::<PodCounters>() == 1248);

impl Default for PodCounters {
    fn default() -> Self {
        zeroed()
    }
}

impl PodCounters {
    pub fn get(&self, dir: Direction, class: Class) -> Counter {
        self.dir[dir.index()][class.index()]
    }

    /// All internet traffic of `dir`: plain internet and every named class.
    pub fn internet(&self, dir: Direction) -> Counter {
        let mut c = self.get(dir, Class::Internet);
        for k in 0..MAX_NAMED {
            c += self.get(dir, Class::Named(k as u8));
        }
        c
    }
}

impl core::ops::AddAssign for PodCounters {
    fn add_assign(&mut self, rhs: Self) {
        for (a, b) in self.dir.iter_mut().zip(rhs.dir.iter()) {
            for (x, y) in a.iter_mut().zip(b.iter()) {
                *x += *y;
            }
        }
        self.spoofed += rhs.spoofed;
        self.policed += rhs.policed;
        for (x, y) in self.dropped.iter_mut().zip(rhs.dropped.iter()) {
            *x += *y;
        }
    }
}

/// `struct an_node_counters`: what the uplink programs put into the node's limits, by
/// direction.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCounters {
    pub staged: [Counter; NR_DIRS],
    pub reserved: [u64; 4],
}
const _: () = assert!(core::mem::size_of::<NodeCounters>() == 64);

/// `struct an_rates`: a level's limits, bit/s by direction and kind, 0 = none.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rates {
    pub rate: [[u64; NR_KINDS]; NR_DIRS],
}
const _: () = assert!(core::mem::size_of::<Rates>() == 544);

impl Default for Rates {
    fn default() -> Self {
        zeroed()
    }
}

impl Rates {
    /// The limit of `kind` in `dir`, `None` for none.
    pub fn get(&self, dir: Direction, kind: usize) -> Option<u64> {
        Some(self.rate[dir.index()][kind]).filter(|r| *r != 0)
    }

    pub fn set(&mut self, dir: Direction, kind: usize, rate: Option<u64>) {
        self.rate[dir.index()][kind] = rate.unwrap_or(0);
    }

    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.rate.iter().flatten().any(|r| *r != 0)
    }

    /// Whether any limit of `dir` is set.
    pub fn any_in(&self, dir: Direction) -> bool {
        self.rate[dir.index()].iter().any(|r| *r != 0)
    }
}

/// `struct an_pod_meta`. Strings are NUL-padded bytes.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PodMeta {
    pub flags: u32,
    pub host_ifindex: u32,
    pub ipv4: [u8; 4],
    pub pod_ifindex: u32,
    /// The pod's namespace in `an_entities`, 0 = none.
    pub entity: u32,
    /// The pod veth's largest frame (MTU + Ethernet header), bytes.
    pub frame: u32,
    /// The pod veth's largest GSO/GRO aggregate, bytes.
    pub gso_max: u32,
    pub reserved0: u32,
    /// Effective limits: the pod's own and the policy's, the policy a ceiling.
    pub limits: Rates,
    /// Effective bursts of the total limits, bytes, by direction.
    pub burst: [u64; NR_DIRS],
    /// The pod's own total limits (runtimeConfig, kubelet annotations), 0 = none.
    pub own_total: [u64; NR_DIRS],
    /// The pod's internet annotations, 0 = none.
    pub own_internet: [u64; NR_DIRS],
    /// Bursts (bits) as the runtime gave them, 0 = unset.
    pub own_burst: [u64; NR_DIRS],
    /// `[level][dir]`, level 0 the namespace, 1 the node: bit K set when the pod has its own
    /// bulk leaf under the group of kind K on that aggregate device.
    pub agg_leaves: [[u64; NR_DIRS]; 2],
    pub attached_unix_ns: u64,
    /// The pod's network namespace as opened on attach.
    pub netns_dev: u64,
    pub netns_ino: u64,
    pub k8s_namespace: [u8; 64],
    pub k8s_name: [u8; 256],
    pub container_id: [u8; 128],
    pub ifname: [u8; 16],
    pub host_ifname: [u8; 16],
    pub netns: [u8; 256],
    /// IPv6 octets in network order, all zero = none.
    pub ipv6: [u8; 16],
    /// The pod interface's link-local address, all zero = unknown.
    pub ipv6_ll: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<PodMeta>() == 1464);

impl Default for PodMeta {
    fn default() -> Self {
        zeroed()
    }
}

impl PodMeta {
    /// The pod's effective limit of `kind` in `dir`, `None` for none.
    pub fn limit(&self, dir: Direction, kind: usize) -> Option<u64> {
        self.limits.get(dir, kind)
    }

    /// The total ingress limit (traffic to the pod), bit/s, 0 = none.
    pub fn ingress_rate(&self) -> u64 {
        self.limits.rate[DIR_INGRESS][KIND_TOTAL]
    }

    /// The total egress limit, bit/s, 0 = none.
    pub fn egress_rate(&self) -> u64 {
        self.limits.rate[DIR_EGRESS][KIND_TOTAL]
    }

    /// The internet-egress limit, bit/s, 0 = none.
    pub fn internet_egress_rate(&self) -> u64 {
        self.limits.rate[DIR_EGRESS][KIND_INTERNET]
    }

    /// The internet-ingress (download) limit, bit/s, 0 = none.
    pub fn internet_ingress_rate(&self) -> u64 {
        self.limits.rate[DIR_INGRESS][KIND_INTERNET]
    }
}

impl core::fmt::Debug for PodMeta {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let limits: Vec<(&str, usize, u64)> = Direction::ALL
            .iter()
            .flat_map(|d| {
                (0..NR_KINDS).filter_map(move |k| self.limit(*d, k).map(|r| (d.name(), k, r)))
            })
            .collect();
        f.debug_struct("PodMeta")
            .field("flags", &self.flags)
            .field("host_ifindex", &self.host_ifindex)
            .field("ipv4", &Ipv4Addr::from(self.ipv4))
            .field("pod_ifindex", &self.pod_ifindex)
            .field("entity", &self.entity)
            .field("limits", &limits)
            .field("burst", &self.burst)
            .field("own_total", &self.own_total)
            .field("own_internet", &self.own_internet)
            .field("agg_leaves", &self.agg_leaves)
            .field("k8s_namespace", &cstr(&self.k8s_namespace))
            .field("k8s_name", &cstr(&self.k8s_name))
            .field("container_id", &cstr(&self.container_id))
            .field("ifname", &cstr(&self.ifname))
            .field("host_ifname", &cstr(&self.host_ifname))
            .field("netns", &cstr(&self.netns))
            .field("frame", &self.frame)
            .field("gso_max", &self.gso_max)
            .field("ipv6", &Ipv6Addr::from(self.ipv6))
            .field("ipv6_ll", &Ipv6Addr::from(self.ipv6_ll))
            .finish()
    }
}

/// `struct an_pod_key`: the attachment-key index's key, (container ID, ifname) NUL padded
/// as in [`PodMeta`]. Userspace only; the index maps it to a slot.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PodKey {
    pub container_id: [u8; 128],
    pub ifname: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<PodKey>() == 144);

impl core::fmt::Debug for PodKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PodKey")
            .field("container_id", &cstr(&self.container_id))
            .field("ifname", &cstr(&self.ifname))
            .finish()
    }
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

/// `struct an_conn_key`: a pod's TCP connection (addresses and ports in network byte order;
/// IPv4 addresses as IPv4-mapped IPv6, see [`conn_addr`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ConnKey {
    pub pod_addr: [u8; 16],
    pub remote_addr: [u8; 16],
    pub pod_port: [u8; 2],
    pub remote_port: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<ConnKey>() == 36);

/// An address as `an_conns` keys it: IPv6 as is, IPv4 as IPv4-mapped IPv6.
pub fn conn_addr(addr: std::net::IpAddr) -> [u8; 16] {
    match addr {
        std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(a) => a.octets(),
    }
}

/// `struct an_conn`: what the handshake told about a connection.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Conn {
    pub t_handshake: u64,
    pub rtt_ns: u32,
    pub wscale: u8,
    pub state: u8,
    pub remote_wscale: u8,
    /// `CONN_F_*`.
    pub flags: u8,
    /// The pod whose share holds the entry, and its attachment (`PodMeta::conn_gen`).
    pub slot: u32,
    pub gen: u32,
    /// `bpf_ktime_get_ns() >> CONN_TIME_SHIFT` of the last packet.
    pub t_last: u32,
    pub reserved: u32,
}
const _: () = assert!(core::mem::size_of::<Conn>() == 32);

/// `struct an_pod_rt`: what the programs keep of a pod between packets.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodRt {
    pub nd_tat: u64,
    /// `an_conns` entries this attachment holds.
    pub conns: i64,
    /// Connections not learnt because the pod's share was full.
    pub conns_refused: u64,
    /// Connections learnt again mid-way after their entry went.
    pub conns_relearnt: u64,
    pub tcp_rtt_ns: u32,
    pub tcp_wscale: u8,
    pub tcp_known: u8,
    pub reserved: u16,
    pub reserved2: u64,
}
const _: () = assert!(core::mem::size_of::<PodRt>() == 48);

/// `struct an_ns_key`: a namespace name, NUL padded ("" in `an_policy`: the default).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NsKey {
    pub name: [u8; 64],
}
const _: () = assert!(core::mem::size_of::<NsKey>() == 64);

/// `struct an_ns_policy`: the policy's pod-level and namespace-level limits for a namespace.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NsPolicy {
    pub pod: Rates,
    pub ns: Rates,
}
const _: () = assert!(core::mem::size_of::<NsPolicy>() == 1088);

/// `struct an_entity`: an aggregate shaped on this node (the node at [`NODE_ENTITY`], or a
/// namespace with pods here): its limits and the HTB groups of each limited kind on the
/// level's device of each direction.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Entity {
    pub flags: u32,
    pub pods: u32,
    pub limits: Rates,
    pub groups: [[u16; NR_KINDS]; NR_DIRS],
    pub name: [u8; 64],
}
const _: () = assert!(core::mem::size_of::<Entity>() == 752);

impl Default for Entity {
    fn default() -> Self {
        zeroed()
    }
}

impl core::fmt::Debug for Entity {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Entity")
            .field("flags", &self.flags)
            .field("pods", &self.pods)
            .field("name", &cstr(&self.name))
            .field("limits", &self.limits)
            .field("groups", &self.groups)
            .finish()
    }
}

/// `struct an_class_name`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassName {
    pub name: [u8; 64],
}
const _: () = assert!(core::mem::size_of::<ClassName>() == 64);

impl Default for ClassName {
    fn default() -> Self {
        zeroed()
    }
}

/// What a pod had counted in each named class, by direction, when the class's index last
/// passed to another class: the counters of the class now at that index are the pod's minus
/// these (`an_class_base`, userspace only).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassBase {
    pub dir: [[Counter; MAX_NAMED]; NR_DIRS],
}
const _: () = assert!(core::mem::size_of::<ClassBase>() == 1024);

impl Default for ClassBase {
    fn default() -> Self {
        zeroed()
    }
}

/// A zeroed value of a map type (every field an integer or byte array: all zero is valid).
fn zeroed<T: aya::Pod>() -> T {
    // SAFETY: `aya::Pod` types are plain old data, for which all-zero bytes are a valid value.
    unsafe { core::mem::zeroed() }
}

// SAFETY: all of these are `#[repr(C)]`, made only of integers and byte arrays, with no
// implicit padding (sizes asserted above equal the sum of their fields), so every bit
// pattern is valid and they can be copied to and from map memory.
unsafe impl aya::Pod for LpmKeyData {}
unsafe impl aya::Pod for Lpm6KeyData {}
unsafe impl aya::Pod for LpmValue {}
unsafe impl aya::Pod for Config {}
unsafe impl aya::Pod for Pod {}
unsafe impl aya::Pod for Counter {}
unsafe impl aya::Pod for PodCounters {}
unsafe impl aya::Pod for NodeCounters {}
unsafe impl aya::Pod for PodMeta {}
unsafe impl aya::Pod for PodKey {}
unsafe impl aya::Pod for NsKey {}
unsafe impl aya::Pod for NsPolicy {}
unsafe impl aya::Pod for Rates {}
unsafe impl aya::Pod for Entity {}
unsafe impl aya::Pod for ClassName {}
unsafe impl aya::Pod for ClassBase {}
unsafe impl aya::Pod for VQueue {}
unsafe impl aya::Pod for Flow {}
unsafe impl aya::Pod for ConnKey {}
unsafe impl aya::Pod for Conn {}
unsafe impl aya::Pod for PodRt {}

/// `BPF_F_NO_PREALLOC`: entries are allocated on insert (the prefix tries, `an_policy`).
pub const BPF_F_NO_PREALLOC: u32 = 1;

/// The definition of one pinned map: what the object declares (or, for [`POD_KEYS`], what
/// userspace creates) and what a pin must match to be reused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MapDef {
    /// Map and pin file name.
    pub name: &'static str,
    pub kind: MapType,
    /// Key size, bytes.
    pub key: u32,
    /// Value size, bytes (per CPU for per-CPU maps).
    pub value: u32,
    pub max_entries: u32,
    /// `BPF_F_*` creation flags.
    pub flags: u32,
}

const fn def<K, V>(name: &'static str, kind: MapType, max_entries: u32, flags: u32) -> MapDef {
    MapDef {
        name,
        kind,
        key: core::mem::size_of::<K>() as u32,
        value: core::mem::size_of::<V>() as u32,
        max_entries,
        flags,
    }
}

/// Every map of the datapath object, in [`crate::maps::ALL`] order: the one place their
/// types, sizes and capacities are written down on the Rust side (the header's
/// `ebpf/lib/maps.h` on the C side; `tests/btf_abi.rs` compares the two).
pub const MAPS: [MapDef; 17] = [
    def::<aya::maps::lpm_trie::Key<LpmKeyData>, LpmValue>(
        maps::PREFIXES,
        MapType::LpmTrie,
        LPM_MAX_ENTRIES,
        BPF_F_NO_PREALLOC,
    ),
    def::<u32, Config>(maps::CONFIG, MapType::Array, 1, 0),
    def::<u32, Pod>(maps::PODS, MapType::Hash, MAX_PODS, 0),
    def::<u32, u32>(maps::POD_IPS, MapType::Hash, MAX_PODS, 0),
    def::<u32, PodCounters>(maps::COUNTERS, MapType::PerCpuArray, MAX_PODS, 0),
    def::<u32, NodeCounters>(maps::NODE_COUNTERS, MapType::PerCpuArray, 1, 0),
    def::<u32, PodMeta>(maps::POD_META, MapType::Array, MAX_PODS, 0),
    // ECN marking state; the programs own it, userspace only reads it and resets a slot's
    // or an aggregate's entries when a new pod or namespace takes it.
    def::<u32, VQueue>(maps::VQUEUE, MapType::Array, VQ_ENTRIES, 0),
    // Flow isolation state; the programs own it (stale entries lie in the past, so a slot's
    // next pod needs no reset).
    def::<u32, Flow>(maps::FLOWS, MapType::Array, FLOW_ENTRIES, 0),
    // The window clamp's connections; the programs own it.
    def::<ConnKey, Conn>(maps::CONNS, MapType::Hash, MAX_CONNS, BPF_F_NO_PREALLOC),
    def::<aya::maps::lpm_trie::Key<Lpm6KeyData>, LpmValue>(
        maps::PREFIXES6,
        MapType::LpmTrie,
        LPM_MAX_ENTRIES,
        BPF_F_NO_PREALLOC,
    ),
    def::<[u8; 16], u32>(maps::POD_IPS6, MapType::Hash, MAX_PODS, 0),
    def::<NsKey, NsPolicy>(
        maps::POLICY,
        MapType::Hash,
        MAX_NAMESPACES + 1,
        BPF_F_NO_PREALLOC,
    ),
    def::<u32, Entity>(maps::ENTITIES, MapType::Array, MAX_ENTITIES, 0),
    def::<NsKey, u32>(maps::ENTITY_IDS, MapType::Hash, MAX_ENTITIES, 0),
    def::<u32, ClassName>(maps::CLASSES, MapType::Array, MAX_NAMED as u32, 0),
    // The programs own it; userspace zeroes a slot's entry when a pod takes the slot.
    def::<u32, PodRt>(maps::POD_RT, MapType::Array, MAX_PODS, 0),
];

/// The attachment-key index [`PodKey`] -> slot: userspace creates and pins it next to
/// [`MAPS`]; the programs never read it.
pub const POD_KEYS: MapDef = def::<PodKey, u32>("an_pod_keys", MapType::Hash, MAX_PODS, 0);

/// Slot -> [`ClassBase`] of the pods attached when a named class's index was reused:
/// userspace creates and pins it next to [`MAPS`]; the programs never read it.
pub const CLASS_BASE: MapDef = def::<u32, ClassBase>("an_class_base", MapType::Hash, MAX_PODS, 0);

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

    /// `an_policy`'s key of the default: every namespace without an entry of its own.
    pub const DEFAULT: NsKey = NsKey { name: [0; 64] };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_table_follows_the_map_names() {
        let names: Vec<&str> = MAPS.iter().map(|m| m.name).collect();
        assert_eq!(names, maps::ALL);
        assert!(!maps::ALL.contains(&POD_KEYS.name));
        assert!(!maps::ALL.contains(&CLASS_BASE.name));
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
