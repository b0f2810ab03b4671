//! Per-pod attach and detach: the API the CNI plugin calls on ADD and DEL.
//!
//! Per pod, from the pinned objects only (shaperd need not run):
//! - the pod is recorded in the maps (identity, IP, limits) under a free slot, counters zeroed,
//!   and its key in the key index (`crate::datapath::index`), so ADD, DEL and CHECK find it in O(1);
//! - `an_host_ingress` / `an_host_egress` run on the host veth as cls_bpf direct-action
//!   filters in a clsact qdisc (not TCX: see `crate::netlink::clsact`); the device holds them, nothing
//!   is pinned per pod;
//! - the pod's own limits to it (total, internet, named classes): HTB root on the host veth
//!   ([`crate::htb::pod_classes`]), the program choosing the leaf per packet;
//! - its own limits from it: HTB root on the pod's eth0 (inside the pod netns) with
//!   `an_pod_egress` (cls_bpf, clsact egress) choosing the leaf per packet. Its filter's
//!   classid names the pod's slot ([`crate::abi::pod_filter_classid`]): in the pod netns
//!   that, not the packet's source address, is how the program knows its pod. Traffic no
//!   limit applies to (internal traffic of a pod with internet limits) takes HTB's unshaped
//!   direct queue: it stays at line rate. A pod without egress limits gets nothing on its
//!   eth0 (and the pod netns is not entered at all);
//! - every limit has a sparse and a bulk leaf, bounded queues both, and the programs choose
//!   the leaf per packet (`an_flows` in the ABI header): a bulk download does not delay the
//!   pod's pings, DNS and ACKs in the same class;
//! - its namespace's and the node's limits (aggregates) are shaped on devices all pods share
//!   (`crate::aggregate`); the pod's record names its namespace's aggregate, and a second
//!   filter on the host veth's egress sends traffic to the pod through its namespace's
//!   download device when one is in use.
//!
//! Shaping on the pod's own eth0 means the pod's TCP sees local backpressure (TCP small
//! queues) instead of drops, which keeps retransmits and queueing delay low. A pod with
//! CAP_NET_ADMIN could remove that qdisc; classification, counting and blocking happen on
//! the host side and cannot be bypassed from the pod.

mod attach;
mod check;
mod detach;
pub(crate) mod effective;
mod record;

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use crate::{
    abi, error::DatapathError, htb::meta_frame, limits::Limits, netlink::TcStats, programs,
    shape::Shape,
};

pub(crate) use attach::{attach_gate, reconcile_host_side, reconcile_pod_side};

/// Who the pod is. Strings are stored in the pinned maps (fixed-size fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// Kubernetes namespace (`K8S_POD_NAMESPACE`), at most 63 bytes.
    pub namespace: String,
    /// Pod name (`K8S_POD_NAME`), at most 255 bytes.
    pub name: String,
    /// `CNI_CONTAINERID`, at most 127 bytes. With `ifname`, the attachment key.
    pub container_id: String,
    /// `CNI_IFNAME`: the pod-side interface.
    pub ifname: String,
    /// The pod's IPv4 address, if it has one.
    pub ipv4: Option<Ipv4Addr>,
    /// The pod's IPv6 address, if it has one. A pod has at least one of the two.
    pub ipv6: Option<Ipv6Addr>,
}

/// Everything `attach_pod` needs.
#[derive(Debug, Clone)]
pub struct PodAttachment {
    /// Host-side veth name, in the calling thread's network namespace (the node).
    pub host_ifname: String,
    /// `CNI_NETNS`: the pod's network namespace (`/proc/<pid>/ns/net`, `/run/netns/<x>`).
    pub netns: PathBuf,
    pub identity: PodIdentity,
    pub limits: Limits,
    /// The MAC address of the pod's interface. Its IPv6 link-local address (EUI-64, what the
    /// kernel gives a new interface) is the only link-local source the pod may use; without
    /// it the pod may send link-scoped IPv6 only from the unspecified address.
    pub pod_mac: Option<[u8; 6]>,
}

/// The IPv6 link-local address the kernel gives an interface with `mac` (modified EUI-64,
/// RFC 4291 appendix A; `addr_gen_mode` 0, the default in a new network namespace).
pub fn eui64_link_local(mac: [u8; 6]) -> Ipv6Addr {
    let [a, b, c, d, e, f] = mac;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        a ^ 0x02,
        b,
        c,
        0xff,
        0xfe,
        d,
        e,
        f,
    ])
}

/// What the caller of [`crate::Datapath::attach_pod_with`] already holds of the pod, so that
/// the attach does not look it up again. Each is optional: what is missing is looked up.
#[derive(Debug, Default, Clone, Copy)]
pub struct AttachHints<'a> {
    /// The host veth as the kernel described it when it was created for this attach (the
    /// veth's echo): its index and packet sizes, and nothing of an earlier attach on it to
    /// remove. Ignored unless its name is [`PodAttachment::host_ifname`].
    pub host_veth: Option<&'a crate::netlink::Link>,
    /// The pod's network namespace, already open (and checked) at [`PodAttachment::netns`]:
    /// its identity is read from it, and the pod side is wired in it, without opening the
    /// path again.
    pub netns: Option<&'a crate::netns::NetNs>,
}

/// What was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedPod {
    pub slot: u32,
    pub host_ifindex: u32,
    /// The pod's interface, if anything was installed on it (egress limits); else 0.
    pub pod_ifindex: u32,
    /// All traffic to the pod (host veth qdisc).
    pub ingress: Option<Shape>,
    /// All traffic from the pod (pod eth0 qdisc).
    pub egress: Option<Shape>,
    /// Internet traffic from the pod.
    pub internet_egress: Option<Shape>,
    /// Internet traffic to the pod (downloads).
    pub internet_ingress: Option<Shape>,
    /// The pod's effective limits (its own and the policy's, the policy a ceiling).
    pub limits: abi::Rates,
    /// The pod's namespace aggregate on this node (`an_entities`), 0 = none.
    pub entity: u32,
}

/// One attached pod as recorded in the maps, with its counters.
#[derive(Debug, Clone)]
pub struct PodRecord {
    pub slot: u32,
    pub meta: abi::PodMeta,
    pub counters: abi::PodCounters,
}

/// Runs `f` on a fresh thread inside the pod's network namespace as recorded when it was
/// attached: the stored path must still name that namespace (same nsfs device and inode).
/// A path that names another one (the pod's namespace is gone and the name reused, or
/// something mounted over it) is refused, so no filter or qdisc of another namespace is
/// ever touched for this pod.
pub fn run_in_pod<T: Send>(
    meta: &abi::PodMeta,
    f: impl FnOnce() -> T + Send,
) -> Result<T, crate::netns::NetnsError> {
    let path = PathBuf::from(abi::cstr(&meta.netns));
    crate::netns::NetNs::open_recorded(path, meta.netns_dev, meta.netns_ino)?.run(f)
}

impl PodRecord {
    pub fn namespace(&self) -> String {
        abi::cstr(&self.meta.k8s_namespace)
    }
    pub fn name(&self) -> String {
        abi::cstr(&self.meta.k8s_name)
    }
    pub fn container_id(&self) -> String {
        abi::cstr(&self.meta.container_id)
    }
    pub fn ifname(&self) -> String {
        abi::cstr(&self.meta.ifname)
    }
    pub fn host_ifname(&self) -> String {
        abi::cstr(&self.meta.host_ifname)
    }
    /// The pod's IPv4 address, if it has one.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        Some(Ipv4Addr::from(self.meta.ipv4)).filter(|a| !a.is_unspecified())
    }
    /// The pod's IPv6 address, if it has one.
    pub fn ipv6(&self) -> Option<Ipv6Addr> {
        Some(Ipv6Addr::from(self.meta.ipv6)).filter(|a| !a.is_unspecified())
    }
    /// The pod's addresses for display, IPv4 first, comma-separated (`10.0.0.5,fd00::5`).
    pub fn addresses(&self) -> String {
        let v4 = self.ipv4().map(|a| a.to_string());
        let v6 = self.ipv6().map(|a| a.to_string());
        v4.into_iter().chain(v6).collect::<Vec<_>>().join(",")
    }
    /// The largest frame of the pod's veth, bytes: what its shaping sizes derive from.
    pub fn frame(&self) -> u64 {
        meta_frame(&self.meta)
    }
}

/// Queue statistics of a pod's own shaping qdiscs (drops here are the "rate" drops): the
/// two leaves of each of its limits, by direction and kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShapingStats {
    pub leaves: Vec<(abi::Direction, usize, TcStats)>,
}

impl ShapingStats {
    /// The leaves of the limit of `kind` in `dir`, if it has any.
    pub fn of(&self, dir: abi::Direction, kind: usize) -> Option<TcStats> {
        self.leaves
            .iter()
            .find(|(d, k, _)| *d == dir && *k == kind)
            .map(|x| x.2)
    }

    /// Drops of every limit of `dir` together.
    pub fn drops(&self, dir: abi::Direction) -> u64 {
        self.leaves
            .iter()
            .filter(|(d, _, _)| *d == dir)
            .map(|x| x.2.drops)
            .sum()
    }
}

pub(crate) fn fixed<const N: usize>(
    field: &'static str,
    s: &str,
) -> Result<[u8; N], DatapathError> {
    abi::fixed_str::<N>(s).ok_or_else(|| DatapathError::InvalidArgument {
        field,
        reason: format!("{s:?} is longer than {} bytes or contains NUL", N - 1),
    })
}

pub(crate) fn ifindex(name: &str) -> Result<u32, DatapathError> {
    nix::net::if_::if_nametoindex(name).map_err(|source| DatapathError::Interface {
        name: name.to_owned(),
        source,
    })
}

/// How much of an attachment [`Datapath::detach_pod_with`] removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Teardown {
    /// Everything: the filters and the clsact and HTB qdiscs on the host veth and on the
    /// pod's interface, then the map entries. For callers whose veth stays.
    Full,
    /// Only the map entries and the key index entry (no netlink, no netns switch). For a caller
    /// that deletes the host veth right after (CNI DEL) or whose veth is gone (GC): the
    /// filters and qdiscs go with the veth, the pod-side ones with its peer. Until the veth is
    /// deleted its filters keep classifying and dropping blocked traffic without counting it
    /// for the pod.
    MapsOnly,
}

/// Whether one of a pod's programs runs where it should.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookState {
    /// Our cls_bpf filter is on the hook, running program `prog_id`.
    Attached { prog_id: u32 },
    /// No filter of ours on the hook.
    Missing,
    /// Our filter is there with a classid other than the pod's (the pod-side program takes
    /// its slot from it, see [`crate::abi::pod_filter_classid`]).
    WrongClassid { found: u32, wanted: u32 },
    /// The pod has no egress limit, so its interface carries no program (or the node no
    /// namespace download limits, so its host veth no gate).
    NotNeeded,
    /// Could not be checked (device or netns gone, netlink refused).
    Unknown(String),
}

impl HookState {
    pub fn is_ok(&self) -> bool {
        matches!(self, HookState::Attached { .. } | HookState::NotNeeded)
    }
}

/// Whether the HTB of a pod's egress limits is on its interface, with the leaves the limits
/// need. A process with CAP_NET_ADMIN in the pod's namespace can delete or replace it; the
/// host veth then only polices the limits (see `ebpf/lib/police.h`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QdiscState {
    Present,
    Missing,
    /// The pod has no egress limit, so its interface carries no HTB.
    NotNeeded,
    /// Could not be checked (device or netns gone, netlink refused).
    Unknown(String),
}

impl QdiscState {
    pub fn is_ok(&self) -> bool {
        matches!(self, QdiscState::Present | QdiscState::NotNeeded)
    }
}

/// The state of a pod's program hooks ([`Datapath::hooks_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodHooks {
    /// `an_host_ingress` on the host veth's ingress.
    pub host_ingress: HookState,
    /// `an_host_egress` on the host veth's egress.
    pub host_egress: HookState,
    /// `an_ns_gate` on the host veth's egress, while namespaces' download limits are in use.
    pub ns_gate: HookState,
    /// `an_pod_egress` on the pod interface's egress (in the pod netns).
    pub pod_egress: HookState,
    /// The HTB of the pod's egress limits on the same interface.
    pub pod_htb: QdiscState,
}

impl PodHooks {
    /// One line per hook that is not as it should be, naming program and device.
    pub fn problems(&self, rec: &PodRecord) -> Vec<String> {
        let host = rec.host_ifname();
        let pod = rec.ifname();
        [
            (&self.host_ingress, programs::HOST_INGRESS, &host, "ingress"),
            (&self.host_egress, programs::HOST_EGRESS, &host, "egress"),
            (&self.ns_gate, programs::NS_GATE, &host, "egress"),
            (&self.pod_egress, programs::POD_EGRESS, &pod, "egress"),
        ]
        .into_iter()
        .filter_map(|(state, prog, dev, hook)| match state {
            HookState::Missing => Some(format!(
                "datapath program {prog} is not attached to {dev} {hook} (slot {})",
                rec.slot
            )),
            HookState::WrongClassid { found, wanted } => Some(format!(
                "datapath program {prog} on {dev} {hook} (slot {}) has classid {found:#x}, not \
                 the slot's {wanted:#x}",
                rec.slot
            )),
            HookState::Unknown(why) => Some(format!(
                "datapath program {prog} on {dev} {hook} (slot {}) cannot be checked: {why}",
                rec.slot
            )),
            _ => None,
        })
        .chain(match &self.pod_htb {
            QdiscState::Missing => Some(format!(
                "the HTB of the pod's egress limits is missing from {pod} (slot {}): they are \
                 only policed on the host veth",
                rec.slot
            )),
            QdiscState::Unknown(why) => Some(format!(
                "the HTB of the pod's egress limits on {pod} (slot {}) cannot be checked: {why}",
                rec.slot
            )),
            _ => None,
        })
        .collect()
    }
}
