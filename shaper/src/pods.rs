//! Per-pod attach and detach: the API the CNI plugin calls on ADD and DEL.
//!
//! Per pod, from the pinned objects only (shaperd need not run):
//! - the pod is recorded in the maps (identity, IP, limits) under a free slot, counters zeroed,
//!   and its key in the key index (`crate::index`), so ADD, DEL and CHECK find it in O(1);
//! - `an_host_ingress` / `an_host_egress` run on the host veth as cls_bpf direct-action
//!   filters in a clsact qdisc (not TCX: see `crate::clsact`); the device holds them, nothing
//!   is pinned per pod;
//! - ingress limit: HTB root on the host veth, one class (1:1) at the rate;
//! - internet-egress and/or total egress limit: HTB root on the pod's eth0 (inside the pod
//!   netns) with `an_pod_egress` (cls_bpf, clsact egress) choosing the class per packet: 1:10
//!   internet, 1:20 the rest. Without a total egress limit there is no 1:20, so non-internet
//!   traffic falls through to HTB's unshaped direct queue: internal traffic stays at line
//!   rate. A pod without egress limits gets nothing on its eth0 (and the pod netns is not
//!   entered at all).
//! - every shaped class has a sparse and a bulk leaf, bounded queues both, and the programs
//!   choose the leaf per packet ([`crate::datapath::with_leaves`], `an_flows` in the ABI
//!   header): a bulk download does not delay the pod's pings, DNS and ACKs in the same class.
//!
//! Shaping on the pod's own eth0 means the pod's TCP sees local backpressure (TCP small
//! queues) instead of drops, which keeps retransmits and queueing delay low. A pod with
//! CAP_NET_ADMIN could remove that qdisc; classification, counting and blocking happen on
//! the host side and cannot be bypassed from the pod.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use std::os::fd::AsFd;

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::PerCpuValues;
use tracing::{debug, info, warn};

use crate::{
    clsact::{self, FilterMode, Hook},
    datapath::{
        is_not_found, is_sparse_leaf, leaf_handle, leaves_stats, scan_meta, sum_counters,
        with_leaves, Datapath, PinPaths, DIRECT_QLEN, HTB_MAJOR,
    },
    error::ShaperError,
    index::{self, PodKey},
    limits::{Limits, Shape},
    netns,
    policy::Policy,
    tc::{handle, HtbClass, Rtnl, TcStats},
};

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
    /// The pod's IPv4 address.
    pub ip: Ipv4Addr,
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
}

/// What was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedPod {
    pub slot: u32,
    pub host_ifindex: u32,
    /// The pod's interface, if anything was installed on it (egress limits); else 0.
    pub pod_ifindex: u32,
    /// Traffic to the pod (host veth qdisc).
    pub ingress: Option<Shape>,
    /// All traffic from the pod (pod eth0 qdisc, class 1:1).
    pub egress: Option<Shape>,
    /// Internet-bound traffic from the pod (pod eth0 qdisc, class 1:10).
    pub internet_egress: Option<Shape>,
    /// The internet limit came from node policy (and follows policy reloads).
    pub internet_from_policy: bool,
}

/// One attached pod as recorded in the maps, with its counters.
#[derive(Debug, Clone)]
pub struct PodRecord {
    pub slot: u32,
    pub meta: abi::PodMeta,
    pub counters: abi::PodCounters,
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
    pub fn ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.meta.ipv4)
    }
    /// The largest frame of the pod's veth, bytes: what its shaping sizes derive from.
    pub fn frame(&self) -> u64 {
        meta_frame(&self.meta)
    }
}

/// Queue statistics of a pod's shaping qdiscs (drops here are the "rate" drops).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShapingStats {
    /// Leaf FIFO of the ingress limit (host veth).
    pub ingress: Option<TcStats>,
    /// Leaf FIFO of the internet class (pod eth0).
    pub internet_egress: Option<TcStats>,
    /// Leaf FIFO of the non-internet class, present with a total egress limit (pod eth0).
    pub other_egress: Option<TcStats>,
}

fn fixed<const N: usize>(field: &'static str, s: &str) -> Result<[u8; N], ShaperError> {
    abi::fixed_str::<N>(s).ok_or_else(|| ShaperError::InvalidArgument {
        field,
        reason: format!("{s:?} is longer than {} bytes or contains NUL", N - 1),
    })
}

fn ifindex(name: &str) -> Result<u32, ShaperError> {
    nix::net::if_::if_nametoindex(name).map_err(|source| ShaperError::Interface {
        name: name.to_owned(),
        source,
    })
}

/// The largest frame of a pod's veth as recorded on attach.
fn meta_frame(meta: &abi::PodMeta) -> u64 {
    match meta.frame {
        0 => abi::MIN_FRAME,
        f => u64::from(f),
    }
}

fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
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
    /// A TCX link pinned by an earlier build (`pods/<slot>/`) holds the program.
    AttachedLegacy,
    /// No filter of ours on the hook.
    Missing,
    /// The pod has no egress limit, so its interface carries no program.
    NotNeeded,
    /// Could not be checked (device or netns gone, netlink refused).
    Unknown(String),
}

impl HookState {
    pub fn is_ok(&self) -> bool {
        matches!(
            self,
            HookState::Attached { .. } | HookState::AttachedLegacy | HookState::NotNeeded
        )
    }
}

/// The state of a pod's three program hooks ([`Datapath::hooks_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodHooks {
    /// `an_host_ingress` on the host veth's ingress.
    pub host_ingress: HookState,
    /// `an_host_egress` on the host veth's egress.
    pub host_egress: HookState,
    /// `an_pod_egress` on the pod interface's egress (in the pod netns).
    pub pod_egress: HookState,
}

impl PodHooks {
    /// One line per hook that is not as it should be, naming program and device.
    pub fn problems(&self, rec: &PodRecord) -> Vec<String> {
        let host = rec.host_ifname();
        let pod = rec.ifname();
        [
            (&self.host_ingress, programs::HOST_INGRESS, &host, "ingress"),
            (&self.host_egress, programs::HOST_EGRESS, &host, "egress"),
            (&self.pod_egress, programs::POD_EGRESS, &pod, "egress"),
        ]
        .into_iter()
        .filter_map(|(state, prog, dev, hook)| match state {
            HookState::Missing => Some(format!(
                "datapath program {prog} is not attached to {dev} {hook} (slot {})",
                rec.slot
            )),
            HookState::Unknown(why) => Some(format!(
                "datapath program {prog} on {dev} {hook} (slot {}) cannot be checked: {why}",
                rec.slot
            )),
            _ => None,
        })
        .collect()
    }
}

/// HTB classes on the pod's eth0 for a pod's recorded limits, leaves included; `None` = no
/// egress shaping.
pub(crate) fn pod_egress_classes(meta: &abi::PodMeta) -> Option<Vec<HtbClass>> {
    let root = handle(HTB_MAJOR, 0);
    let frame = meta_frame(meta);
    let internet = nonzero(meta.internet_egress_rate);
    match nonzero(meta.egress_rate) {
        None => {
            let i = Shape::new(internet?, None, frame);
            Some(
                with_leaves(HtbClass {
                    classid: abi::CLASSID_POD_INTERNET,
                    parent: root,
                    rate: i,
                    ceil: i,
                    prio: 0,
                })
                .to_vec(),
            )
        }
        Some(e) => {
            // Children's guaranteed rates sum to the parent's, so the total holds; each may
            // borrow up to its ceiling when the other is idle.
            let total = Shape::new(e, Some(meta.egress_burst.saturating_mul(8)), frame);
            let i = internet.unwrap_or(e).min(e);
            let parent = handle(HTB_MAJOR, 1);
            let mut classes = vec![HtbClass {
                classid: parent,
                parent: root,
                rate: total,
                ceil: total,
                prio: 0,
            }];
            classes.extend(with_leaves(HtbClass {
                classid: abi::CLASSID_POD_INTERNET,
                parent,
                rate: Shape::new((i / 2).max(1), None, frame),
                ceil: Shape::new(i, None, frame),
                prio: 0,
            }));
            classes.extend(with_leaves(HtbClass {
                classid: abi::CLASSID_POD_OTHER,
                parent,
                rate: Shape::new((e - i / 2).max(1), None, frame),
                ceil: total,
                prio: 0,
            }));
            Some(classes)
        }
    }
}

/// HTB classes on the host veth for the pod's ingress limit (the class and its leaves).
fn host_ingress_classes(meta: &abi::PodMeta) -> Option<[HtbClass; 3]> {
    let r = nonzero(meta.ingress_rate)?;
    let s = Shape::new(
        r,
        Some(meta.ingress_burst.saturating_mul(8)),
        meta_frame(meta),
    );
    Some(with_leaves(HtbClass {
        classid: abi::CLASSID_POD_INGRESS,
        parent: handle(HTB_MAJOR, 0),
        rate: s,
        ceil: s,
        prio: 0,
    }))
}

/// Who sends the traffic a qdisc shapes (see [`Shape`] for why the leaves differ).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sender {
    /// Sockets in the same network namespace: pod egress on the pod's eth0.
    Local,
    /// Forwarded traffic: the pod's ingress on the host veth.
    Forwarded,
}

/// Installs `classes` under a fresh or existing HTB root, each leaf with a bounded queue.
pub(crate) fn install_htb(
    rt: &mut Rtnl,
    ifindex: u32,
    defcls: u16,
    classes: &[HtbClass],
    fresh: bool,
    sender: Sender,
) -> Result<(), ShaperError> {
    if fresh {
        rt.delete_root_htb(ifindex, HTB_MAJOR)?;
    }
    rt.ensure_root_htb(ifindex, HTB_MAJOR, defcls, DIRECT_QLEN)?;
    for c in classes {
        rt.set_htb_class(ifindex, c)?;
    }
    for c in classes {
        let is_parent = classes.iter().any(|o| o.parent == c.classid);
        if !is_parent {
            // Leaf queue sized by the class ceiling: the rate it drains at when borrowing.
            let leaf = leaf_handle(c.classid);
            match sender {
                Sender::Forwarded if !is_sparse_leaf(c) => {
                    rt.set_tbf(ifindex, c.classid, leaf, &c.ceil)?
                }
                _ => rt.set_pfifo(ifindex, c.classid, leaf, c.ceil.queue_packets)?,
            }
        }
    }
    Ok(())
}

fn unpin(path: &Path) -> Result<(), ShaperError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ShaperError::io("unpin", path, e)),
    }
}

/// Puts the pinned program `name` on `hook` of `ifindex` (the clsact qdisc must exist); the
/// filter takes its own reference to the program.
fn attach_filter(
    rt: &mut Rtnl,
    pins: &PinPaths,
    ifindex: u32,
    hook: Hook,
    name: &str,
) -> Result<(), ShaperError> {
    let path = pins.prog(name);
    let prog = clsact::open_pinned(&path).map_err(|e| ShaperError::io("open", &path, e))?;
    rt.set_bpf_filter(
        ifindex,
        hook,
        prog.as_fd(),
        name,
        FilterMode::CreateOrReplace,
    )?;
    Ok(())
}

/// Pod side, run inside the pod netns: egress qdisc and class-selecting program, or their
/// removal when the pod has no egress limit. Returns the pod interface's ifindex, 0 when
/// nothing is installed on it.
fn reconcile_pod_side(
    pins: &PinPaths,
    meta: &abi::PodMeta,
    fresh: bool,
) -> Result<u32, ShaperError> {
    let ifname = abi::cstr(&meta.ifname);
    let pod_ifindex = ifindex(&ifname)?;
    let mut rt = Rtnl::new()?;
    match pod_egress_classes(meta) {
        None => {
            rt.detach_filters(pod_ifindex, &[Hook::Egress])?;
            rt.delete_root_htb(pod_ifindex, HTB_MAJOR)?;
            Ok(0)
        }
        Some(classes) => {
            let mut apply = || {
                install_htb(&mut rt, pod_ifindex, 0, &classes, fresh, Sender::Local)?;
                rt.ensure_clsact(pod_ifindex)?;
                attach_filter(
                    &mut rt,
                    pins,
                    pod_ifindex,
                    Hook::Egress,
                    programs::POD_EGRESS,
                )
            };
            match apply() {
                Ok(()) => Ok(pod_ifindex),
                Err(e) => {
                    // A failed attach records no pod_ifindex, so its rollback cannot find
                    // this side: undo it here. (A policy update keeps what it had.)
                    if fresh {
                        if let Err(undo) = remove_pod_side(pod_ifindex) {
                            warn!(error = %undo, "rollback of the pod side after a failed attach");
                        }
                    }
                    Err(e)
                }
            }
        }
    }
}

/// Undoes the pod side inside the pod netns (full teardown of a veth that stays).
fn remove_pod_side(pod_ifindex: u32) -> Result<(), ShaperError> {
    let mut rt = Rtnl::new()?;
    rt.detach_filters(pod_ifindex, &[Hook::Egress])?;
    rt.delete_root_htb(pod_ifindex, HTB_MAJOR)?;
    Ok(())
}

/// Our filter's state on `hook` of `ifindex` (in the calling thread's netns).
fn hook_state(rt: &mut Rtnl, ifindex: u32, hook: Hook, prog: &str) -> HookState {
    match rt.our_filter(ifindex, hook) {
        Ok(Some(f)) if f.name == prog && f.direct_action => {
            HookState::Attached { prog_id: f.prog_id }
        }
        Ok(_) => HookState::Missing,
        Err(e) => HookState::Unknown(e.to_string()),
    }
}

impl Datapath {
    /// Attaches the datapath to a pod (CNI ADD). Idempotent per (container ID, ifname): an
    /// existing attachment with that key, or on the same host veth, is torn down first. On
    /// failure everything done is undone. Blocking; call from a plain thread (or
    /// `spawn_blocking`) in the node's network namespace with bpffs visible.
    pub fn attach_pod(&mut self, req: &PodAttachment) -> Result<AttachedPod, ShaperError> {
        let id = &req.identity;
        req.limits.validate()?;
        if id.container_id.is_empty() {
            return Err(ShaperError::InvalidArgument {
                field: "container_id",
                reason: "must not be empty".to_owned(),
            });
        }
        let mut meta = abi::PodMeta {
            flags: abi::META_IN_USE,
            ipv4: id.ip.octets(),
            k8s_namespace: fixed("namespace", &id.namespace)?,
            k8s_name: fixed("name", &id.name)?,
            container_id: fixed("container_id", &id.container_id)?,
            ifname: fixed("ifname", &id.ifname)?,
            host_ifname: fixed("host_ifname", &req.host_ifname)?,
            netns: fixed(
                "netns",
                req.netns
                    .to_str()
                    .ok_or_else(|| ShaperError::InvalidArgument {
                        field: "netns",
                        reason: "path is not UTF-8".to_owned(),
                    })?,
            )?,
            ..Default::default()
        };
        if id.ifname.is_empty() || req.host_ifname.is_empty() {
            return Err(ShaperError::InvalidArgument {
                field: "ifname",
                reason: "interface names must not be empty".to_owned(),
            });
        }
        let host_ifindex = ifindex(&req.host_ifname)?;
        meta.host_ifindex = host_ifindex;
        // Every size of the pod's shaping points derives from its veth's frame (the plugin
        // gives both ends the same MTU).
        let sizes = Rtnl::new()?.link_sizes(host_ifindex)?;
        meta.frame = u32::try_from(sizes.frame()).unwrap_or(u32::MAX);
        meta.gso_max = u32::try_from(sizes.aggregate_max()).unwrap_or(u32::MAX);
        let frame = sizes.frame();
        let key = PodKey::of(&meta);

        let lim = &req.limits;
        if let Some(r) = lim.ingress_rate {
            meta.ingress_rate = r;
            meta.ingress_burst = Shape::new(r, lim.ingress_burst, frame).burst_bytes;
        }
        if let Some(r) = lim.egress_rate {
            meta.egress_rate = r;
            meta.egress_burst = Shape::new(r, lim.egress_burst, frame).burst_bytes;
        }
        let internet = match lim.internet_egress_rate {
            Some(r) => Some(r),
            None => {
                meta.flags |= abi::META_INTERNET_FROM_POLICY;
                self.policy_internet_rate(&id.namespace)?
            }
        };
        meta.internet_egress_rate = match (internet, lim.egress_rate) {
            (Some(i), Some(e)) => i.min(e),
            (i, _) => i.unwrap_or(0),
        };
        meta.attached_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);

        let _lock = self.lock()?;
        let mut previous = Vec::new();
        if let Some(p) = self.find(&key)? {
            previous.push(p);
        }
        if let Some(p) = self.on_host(host_ifindex)? {
            if previous.iter().all(|(slot, _)| *slot != p.0) {
                previous.push(p);
            }
        }
        for (slot, old) in previous {
            info!(slot, container = %abi::cstr(&old.container_id), "replacing previous attachment");
            self.teardown(slot, &old, Teardown::Full)?;
        }
        let slot = self.free_slot(&key)?;
        match self.attach_slot(slot, &key, &mut meta, req) {
            Ok(attached) => {
                info!(
                    slot,
                    pod = %format!("{}/{}", id.namespace, id.name),
                    host = %req.host_ifname,
                    "pod attached"
                );
                Ok(attached)
            }
            Err(e) => {
                if let Err(undo) = self.teardown(slot, &meta, Teardown::Full) {
                    warn!(slot, error = %undo, "rollback after a failed attach");
                }
                Err(e)
            }
        }
    }

    fn attach_slot(
        &mut self,
        slot: u32,
        key: &PodKey,
        meta: &mut abi::PodMeta,
        req: &PodAttachment,
    ) -> Result<AttachedPod, ShaperError> {
        // Pins of a TCX-era attachment interrupted in this slot must not outlive it.
        self.remove_legacy_pins(slot)?;
        // The index entry goes in before the metadata it points to (see `crate::index`).
        self.index
            .insert(key, slot, 0)
            .map_err(|e| ShaperError::map(index::NAME, e))?;
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| ShaperError::io("read", what, e))?;
        let zero = PerCpuValues::try_from(vec![abi::PodCounters::default(); cpus])
            .map_err(|e| ShaperError::io("build counters", "", e))?;
        self.counters
            .set(slot, zero, 0)
            .map_err(|e| ShaperError::map(maps::COUNTERS, e))?;
        // The previous occupant's modelled queue (a drain time up to a leaf's depth ahead, its
        // CE and drop counts) must not carry over to this pod.
        for class in 0..abi::VQ_PER_POD {
            self.vqueue
                .set(slot * abi::VQ_PER_POD + class, abi::VQueue::default(), 0)
                .map_err(|e| ShaperError::map(maps::VQUEUE, e))?;
        }
        self.meta
            .set(slot, *meta, 0)
            .map_err(|e| ShaperError::map(maps::POD_META, e))?;
        self.pods
            .insert(
                meta.host_ifindex,
                abi::Pod {
                    slot,
                    flags: if meta.ingress_rate != 0 {
                        abi::POD_INGRESS_LIMIT
                    } else {
                        0
                    },
                    ipv4: meta.ipv4,
                    reserved: 0,
                },
                0,
            )
            .map_err(|e| ShaperError::map(maps::PODS, e))?;
        self.pod_ips
            .insert(meta.ipv4, slot, 0)
            .map_err(|e| ShaperError::map(maps::POD_IPS, e))?;

        // Host veth: classify, count and drop blocked traffic in both directions.
        let mut rt = Rtnl::new()?;
        rt.ensure_clsact(meta.host_ifindex)?;
        attach_filter(
            &mut rt,
            &self.pins,
            meta.host_ifindex,
            Hook::Ingress,
            programs::HOST_INGRESS,
        )?;
        attach_filter(
            &mut rt,
            &self.pins,
            meta.host_ifindex,
            Hook::Egress,
            programs::HOST_EGRESS,
        )?;
        if let Some(classes) = host_ingress_classes(meta) {
            // Without the program's choice (not attached yet) traffic takes the bulk leaf.
            let defcls = (abi::CLASSID_POD_INGRESS + abi::LEAF_BULK) as u16;
            install_htb(
                &mut rt,
                meta.host_ifindex,
                defcls,
                &classes,
                true,
                Sender::Forwarded,
            )?;
        } else {
            rt.delete_root_htb(meta.host_ifindex, HTB_MAJOR)?;
        }

        // Pod side, only for egress limits: entering the netns is the costliest step left.
        if pod_egress_classes(meta).is_some() {
            let pins = self.pins.clone();
            let pod_meta = *meta;
            meta.pod_ifindex =
                netns::run_in(&req.netns, || reconcile_pod_side(&pins, &pod_meta, true))??;
            self.meta
                .set(slot, *meta, 0)
                .map_err(|e| ShaperError::map(maps::POD_META, e))?;
        }

        let classes = pod_egress_classes(meta);
        let internet_egress = classes
            .as_ref()
            .and_then(|c| c.iter().find(|c| c.classid == abi::CLASSID_POD_INTERNET))
            .map(|c| c.ceil);
        let egress = classes
            .as_ref()
            .and_then(|c| c.iter().find(|c| c.classid == handle(HTB_MAJOR, 1)))
            .map(|c| c.ceil);
        Ok(AttachedPod {
            slot,
            host_ifindex: meta.host_ifindex,
            pod_ifindex: meta.pod_ifindex,
            ingress: host_ingress_classes(meta).map(|c| c[0].ceil),
            egress,
            internet_egress,
            internet_from_policy: meta.flags & abi::META_INTERNET_FROM_POLICY != 0,
        })
    }

    /// Detaches a pod completely (filters, qdiscs, map entries): [`Teardown::Full`]. Best
    /// effort and idempotent: succeeds when nothing is attached under the key, when the host
    /// veth or the pod netns are already gone, and when repeated. Returns whether an
    /// attachment was found.
    pub fn detach_pod(&mut self, container_id: &str, ifname: &str) -> Result<bool, ShaperError> {
        self.detach_pod_with(container_id, ifname, Teardown::Full)
    }

    /// [`Datapath::detach_pod`] with a choice of how much to undo: a CNI DEL that deletes the
    /// host veth right afterwards passes [`Teardown::MapsOnly`] and costs a few map
    /// operations.
    pub fn detach_pod_with(
        &mut self,
        container_id: &str,
        ifname: &str,
        how: Teardown,
    ) -> Result<bool, ShaperError> {
        // A key too long for the maps was never attached.
        let Some(key) = PodKey::new(container_id, ifname) else {
            return Ok(false);
        };
        let _lock = self.lock()?;
        let Some((slot, meta)) = self.find(&key)? else {
            return Ok(false);
        };
        self.teardown(slot, &meta, how)?;
        info!(slot, container = container_id, ?how, "pod detached");
        Ok(true)
    }

    /// Removes attachments whose host veth no longer exists (a pod deleted without a CNI
    /// DEL), and repairs the key index. Returns the removed records.
    pub fn gc(&mut self) -> Result<Vec<PodRecord>, ShaperError> {
        let _lock = self.lock()?;
        let mut removed = Vec::new();
        let mut live = Vec::new();
        for rec in self.records()? {
            let alive = nix::net::if_::if_nametoindex(rec.host_ifname().as_str())
                .is_ok_and(|i| i == rec.meta.host_ifindex);
            if alive {
                live.push((rec.slot, rec.meta));
                continue;
            }
            // The veth pair is gone, and with it every filter and qdisc of the pod.
            self.teardown(rec.slot, &rec.meta, Teardown::MapsOnly)?;
            info!(slot = rec.slot, container = %rec.container_id(), "stale pod attachment removed");
            removed.push(rec);
        }
        let fixed = index::reconcile(&mut self.index, &live)?;
        if fixed > 0 {
            info!(fixed, "attachment-key index repaired");
        }
        Ok(removed)
    }

    /// Every attached pod with its counters.
    pub fn pods(&self) -> Result<Vec<PodRecord>, ShaperError> {
        self.records()
    }

    /// The attached pod with this key.
    pub fn pod(&self, container_id: &str, ifname: &str) -> Result<Option<PodRecord>, ShaperError> {
        let Some(key) = PodKey::new(container_id, ifname) else {
            return Ok(None);
        };
        match self.find(&key)? {
            Some((slot, meta)) => Ok(Some(PodRecord {
                slot,
                meta,
                counters: self.counters_of(slot)?,
            })),
            None => Ok(None),
        }
    }

    /// Whether each of the pod's programs is attached where it should be: the host veth
    /// (in the calling thread's netns) and, for a pod with egress limits, its interface in
    /// the pod netns.
    pub fn hooks_of(&self, rec: &PodRecord) -> PodHooks {
        let legacy = self.pins.legacy_pod_dir(rec.slot);
        let host = rec.host_ifname();
        let host_alive =
            nix::net::if_::if_nametoindex(host.as_str()).is_ok_and(|i| i == rec.meta.host_ifindex);
        let (host_ingress, host_egress) = if !host_alive {
            let gone = HookState::Unknown(format!(
                "host veth {host} (ifindex {}) is gone",
                rec.meta.host_ifindex
            ));
            (gone.clone(), gone)
        } else {
            match Rtnl::new() {
                Ok(mut rt) => {
                    let ifx = rec.meta.host_ifindex;
                    (
                        hook_state(&mut rt, ifx, Hook::Ingress, programs::HOST_INGRESS),
                        hook_state(&mut rt, ifx, Hook::Egress, programs::HOST_EGRESS),
                    )
                }
                Err(e) => (
                    HookState::Unknown(e.to_string()),
                    HookState::Unknown(e.to_string()),
                ),
            }
        };
        let pod_egress = if pod_egress_classes(&rec.meta).is_none() {
            HookState::NotNeeded
        } else {
            let ns = PathBuf::from(abi::cstr(&rec.meta.netns));
            let ifname = rec.ifname();
            match netns::run_in(&ns, || {
                let i = ifindex(&ifname)?;
                Ok::<_, ShaperError>(hook_state(
                    &mut Rtnl::new()?,
                    i,
                    Hook::Egress,
                    programs::POD_EGRESS,
                ))
            }) {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => HookState::Unknown(e.to_string()),
                Err(e) => HookState::Unknown(e.to_string()),
            }
        };
        let legacy_or = |state: HookState, link: &str| match state {
            HookState::Missing if legacy.join(link).exists() => HookState::AttachedLegacy,
            s => s,
        };
        PodHooks {
            host_ingress: legacy_or(host_ingress, "host_ingress"),
            host_egress: legacy_or(host_egress, "host_egress"),
            pod_egress: legacy_or(pod_egress, "pod_egress"),
        }
    }

    /// Counters of a slot, summed over CPUs.
    pub fn counters_of(&self, slot: u32) -> Result<abi::PodCounters, ShaperError> {
        let v = self
            .counters
            .get(&slot, 0)
            .map_err(|e| ShaperError::map(maps::COUNTERS, e))?;
        Ok(sum_counters(&v))
    }

    /// Queue statistics of a pod's shaping qdiscs; enters the pod netns for the egress side.
    pub fn shaping_stats(&self, rec: &PodRecord) -> Result<ShapingStats, ShaperError> {
        let mut out = ShapingStats::default();
        if rec.meta.ingress_rate != 0 {
            let q = Rtnl::new()?.qdisc_stats(rec.meta.host_ifindex)?;
            out.ingress = leaves_stats(&q, abi::CLASSID_POD_INGRESS);
        }
        if pod_egress_classes(&rec.meta).is_some() {
            let netns = PathBuf::from(abi::cstr(&rec.meta.netns));
            let pod_ifindex = rec.meta.pod_ifindex;
            let q = netns::run_in(&netns, || {
                Rtnl::new().and_then(|mut rt| rt.qdisc_stats(pod_ifindex))
            })??;
            out.internet_egress = leaves_stats(&q, abi::CLASSID_POD_INTERNET);
            out.other_egress = leaves_stats(&q, abi::CLASSID_POD_OTHER);
        }
        Ok(out)
    }

    /// Every slot in use, from the metadata (a full scan: daemon and tools, not CNI calls).
    pub(crate) fn scan(&self) -> Result<Vec<(u32, abi::PodMeta)>, ShaperError> {
        scan_meta(&self.meta)
    }

    pub(crate) fn records(&self) -> Result<Vec<PodRecord>, ShaperError> {
        self.scan()?
            .into_iter()
            .map(|(slot, meta)| {
                Ok(PodRecord {
                    slot,
                    meta,
                    counters: self.counters_of(slot)?,
                })
            })
            .collect()
    }

    fn meta_at(&self, slot: u32) -> Result<abi::PodMeta, ShaperError> {
        self.meta
            .get(&slot, 0)
            .map_err(|e| ShaperError::map(maps::POD_META, e))
    }

    /// The live attachment with `key`: one index lookup, confirmed by the slot's metadata.
    fn find(&self, key: &PodKey) -> Result<Option<(u32, abi::PodMeta)>, ShaperError> {
        let slot = match self.index.get(key, 0) {
            Ok(s) => s,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(ShaperError::map(index::NAME, e)),
        };
        if slot >= abi::MAX_PODS {
            return Ok(None);
        }
        let meta = self.meta_at(slot)?;
        Ok(key.matches(&meta).then_some((slot, meta)))
    }

    /// The live attachment on host veth `ifindex`, through the programs' own `an_pods` map.
    fn on_host(&self, ifindex: u32) -> Result<Option<(u32, abi::PodMeta)>, ShaperError> {
        let slot = match self.pods.get(&ifindex, 0) {
            Ok(p) => p.slot,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(ShaperError::map(maps::PODS, e)),
        };
        if slot >= abi::MAX_PODS {
            return Ok(None);
        }
        let meta = self.meta_at(slot)?;
        Ok(
            (meta.flags & abi::META_IN_USE != 0 && meta.host_ifindex == ifindex)
                .then_some((slot, meta)),
        )
    }

    /// A free slot, probing from the key's home slot: about one read while the node is not
    /// nearly full (the metadata is the truth, nothing else to keep in step).
    fn free_slot(&self, key: &PodKey) -> Result<u32, ShaperError> {
        let home = key.home();
        for i in 0..abi::MAX_PODS {
            let slot = (home + i) % abi::MAX_PODS;
            if self.meta_at(slot)?.flags & abi::META_IN_USE == 0 {
                return Ok(slot);
            }
        }
        Err(ShaperError::Full { max: abi::MAX_PODS })
    }

    /// Unpins TCX links a build before the cls_bpf switch pinned for `slot` (which detaches
    /// them) and removes their directory. One `stat` when there are none.
    fn remove_legacy_pins(&self, slot: u32) -> Result<(), ShaperError> {
        let dir = self.pins.legacy_pod_dir(slot);
        let entries = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ShaperError::io("read", &dir, e)),
        };
        for f in entries {
            let f = f.map_err(|e| ShaperError::io("read", &dir, e))?;
            unpin(&f.path())?;
        }
        match std::fs::remove_dir(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ShaperError::io("remove", &dir, e)),
        }
    }

    /// Undoes an attachment, continuing past failures and reporting them all. Device state
    /// first (with [`Teardown::Full`]), then the map entries, the metadata before the index
    /// entry (see `crate::index`).
    fn teardown(
        &mut self,
        slot: u32,
        meta: &abi::PodMeta,
        how: Teardown,
    ) -> Result<(), ShaperError> {
        let mut errors = Vec::new();
        if how == Teardown::Full {
            // The host veth may be gone already (pod netns deleted first); so are its filters
            // and qdiscs then.
            let host = abi::cstr(&meta.host_ifname);
            if nix::net::if_::if_nametoindex(host.as_str()).is_ok_and(|i| i == meta.host_ifindex) {
                let ifx = meta.host_ifindex;
                if let Err(e) = Rtnl::new().and_then(|mut rt| {
                    rt.detach_filters(ifx, &[Hook::Ingress, Hook::Egress])?;
                    rt.delete_root_htb(ifx, HTB_MAJOR).map(|_| ())
                }) {
                    errors.push(e.into());
                }
            }
            // Pod side: only if something was installed and the namespace still exists (a
            // netns kept across DEL and ADD).
            let netns_path = PathBuf::from(abi::cstr(&meta.netns));
            if meta.pod_ifindex != 0 && netns_path.exists() {
                let pod_ifindex = meta.pod_ifindex;
                match netns::run_in(&netns_path, || remove_pod_side(pod_ifindex)) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => debug!(slot, error = %e, "pod-side filter or qdisc not removed"),
                    Err(e) => debug!(slot, error = %e, "pod netns not entered"),
                }
            }
        }
        if let Err(e) = self.remove_legacy_pins(slot) {
            errors.push(e);
        }
        match self.pods.get(&meta.host_ifindex, 0) {
            Ok(p) if p.slot == slot => {
                if let Err(e) = self.pods.remove(&meta.host_ifindex) {
                    if !is_not_found(&e) {
                        errors.push(ShaperError::map(maps::PODS, e));
                    }
                }
            }
            _ => {}
        }
        if let Ok(s) = self.pod_ips.get(&meta.ipv4, 0) {
            if s == slot {
                if let Err(e) = self.pod_ips.remove(&meta.ipv4) {
                    if !is_not_found(&e) {
                        errors.push(ShaperError::map(maps::POD_IPS, e));
                    }
                }
            }
        }
        match self.meta.set(slot, abi::PodMeta::default(), 0) {
            Ok(()) => {
                let key = PodKey::of(meta);
                if self.index.get(&key, 0).is_ok_and(|s| s == slot) {
                    if let Err(e) = self.index.remove(&key) {
                        if !is_not_found(&e) {
                            errors.push(ShaperError::map(index::NAME, e));
                        }
                    }
                }
            }
            // The slot stays recorded: keep the index entry that finds it.
            Err(e) => errors.push(ShaperError::map(maps::POD_META, e)),
        }
        ShaperError::collect(errors)
    }

    /// Moves pods whose internet-egress limit comes from node policy to the policy's current
    /// rate. Pods whose netns cannot be entered are reported, not fatal.
    pub(crate) fn follow_policy(
        &mut self,
        policy: &Policy,
    ) -> Result<(usize, Vec<String>), ShaperError> {
        let mut updated = 0;
        let mut errors = Vec::new();
        for rec in self.records()? {
            if rec.meta.flags & abi::META_INTERNET_FROM_POLICY == 0 {
                continue;
            }
            let mut meta = rec.meta;
            let wanted = policy.internet_rate_for(&rec.namespace());
            meta.internet_egress_rate = match (wanted, nonzero(meta.egress_rate)) {
                (Some(i), Some(e)) => i.min(e),
                (i, _) => i.unwrap_or(0),
            };
            if meta.internet_egress_rate == rec.meta.internet_egress_rate {
                continue;
            }
            let netns_path = PathBuf::from(abi::cstr(&meta.netns));
            let pins = self.pins.clone();
            let res = netns::run_in(&netns_path, || reconcile_pod_side(&pins, &meta, false))
                .map_err(ShaperError::from)
                .and_then(|r| r);
            match res {
                Ok(pod_ifindex) => {
                    meta.pod_ifindex = pod_ifindex;
                    self.meta
                        .set(rec.slot, meta, 0)
                        .map_err(|e| ShaperError::map(maps::POD_META, e))?;
                    updated += 1;
                }
                Err(e) => {
                    let msg = format!(
                        "{}/{} (slot {}): {e}",
                        rec.namespace(),
                        rec.name(),
                        rec.slot
                    );
                    warn!("{msg}");
                    errors.push(msg);
                }
            }
        }
        Ok((updated, errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ingress: u64, egress: u64, internet: u64) -> abi::PodMeta {
        abi::PodMeta {
            ingress_rate: ingress,
            egress_rate: egress,
            internet_egress_rate: internet,
            ..Default::default()
        }
    }

    /// `(classid, parent, rate, ceil, prio)` of each class, for compact comparisons.
    fn layout(classes: &[HtbClass]) -> Vec<(u32, u32, u64, u64, u32)> {
        classes
            .iter()
            .map(|c| (c.classid, c.parent, c.rate.rate, c.ceil.rate, c.prio))
            .collect()
    }

    #[test]
    fn every_shaped_class_gets_a_sparse_and_a_bulk_leaf() {
        let root = handle(HTB_MAJOR, 0);
        let ingress = host_ingress_classes(&meta(8_000_000, 0, 0)).expect("ingress limit");
        assert_eq!(
            layout(&ingress),
            [
                (0x1_0001, root, 8_000_000, 8_000_000, 0),
                // Sparse: a quarter of the rate guaranteed, served first, may borrow it all.
                (0x1_0002, 0x1_0001, 2_000_000, 8_000_000, 0),
                (0x1_0003, 0x1_0001, 6_000_000, 8_000_000, 1),
            ]
        );
        assert!(is_sparse_leaf(&ingress[1]) && !is_sparse_leaf(&ingress[2]));
        assert!(host_ingress_classes(&meta(0, 0, 0)).is_none());

        let internet_only = pod_egress_classes(&meta(0, 0, 4_000_000)).expect("internet limit");
        assert_eq!(
            layout(&internet_only),
            [
                (0x1_0010, root, 4_000_000, 4_000_000, 0),
                (0x1_0011, 0x1_0010, 1_000_000, 4_000_000, 0),
                (0x1_0012, 0x1_0010, 3_000_000, 4_000_000, 1),
            ]
        );
        // A total limit: 1:1 over the internet (1:10) and other (1:20) classes, each split.
        let total = pod_egress_classes(&meta(0, 20_000_000, 4_000_000)).expect("total");
        assert_eq!(
            layout(&total),
            [
                (0x1_0001, root, 20_000_000, 20_000_000, 0),
                (0x1_0010, 0x1_0001, 2_000_000, 4_000_000, 0),
                (0x1_0011, 0x1_0010, 500_000, 4_000_000, 0),
                (0x1_0012, 0x1_0010, 1_500_000, 4_000_000, 1),
                (0x1_0020, 0x1_0001, 18_000_000, 20_000_000, 0),
                (0x1_0021, 0x1_0020, 4_500_000, 20_000_000, 0),
                (0x1_0022, 0x1_0020, 13_500_000, 20_000_000, 1),
            ]
        );
        // The leaves are the classes nothing else hangs from.
        let leaves: Vec<u32> = total
            .iter()
            .filter(|c| !total.iter().any(|o| o.parent == c.classid))
            .map(|c| c.classid)
            .collect();
        assert_eq!(leaves, [0x1_0011, 0x1_0012, 0x1_0021, 0x1_0022]);
    }

    #[test]
    fn leaf_stats_add_up_both_leaves() {
        let q = |minor: u16, packets: u64, drops: u64| TcStats {
            handle: leaf_handle(handle(HTB_MAJOR, minor)),
            packets,
            drops,
            ..TcStats::default()
        };
        let stats = [q(0x11, 5, 0), q(0x12, 100, 3), q(0x21, 7, 1)];
        let s = leaves_stats(&stats, abi::CLASSID_POD_INTERNET).expect("internet leaves");
        assert_eq!((s.packets, s.drops), (105, 3));
        let s = leaves_stats(&stats, abi::CLASSID_POD_OTHER).expect("one leaf is enough");
        assert_eq!((s.packets, s.drops), (7, 1));
        assert!(leaves_stats(&stats, abi::CLASSID_POD_INGRESS).is_none());
    }
}
