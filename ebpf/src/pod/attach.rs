//! ADD: record the pod in the maps under a free slot, put the programs on its host veth,
//! and its own limits' classes on the host veth and (for egress limits) on its interface.

use std::{
    os::{fd::AsFd, unix::fs::MetadataExt},
    time::{SystemTime, UNIX_EPOCH},
};

use aya::maps::PerCpuValues;
use tracing::{info, warn};

use super::{effective, fixed, ifindex, AttachHints, AttachedPod, PodAttachment, Teardown};
use crate::{
    abi::{self, Direction, PodKey},
    datapath::{index, pins::PinPaths, Datapath},
    error::DatapathError,
    htb::{install_htb, pod_classes, Sender, HTB_MAJOR},
    maps,
    netlink::{
        clsact::{self, FilterMode, Hook},
        link_sizes, Rtnl,
    },
    netns, programs,
    shape::Shape,
};

/// Puts the pinned program `name` on `hook` of `ifindex` (the clsact qdisc must exist), with
/// `classid` if given; the filter takes its own reference to the program.
fn attach_filter(
    rt: &mut Rtnl,
    pins: &PinPaths,
    ifindex: u32,
    hook: Hook,
    name: &str,
    classid: Option<u32>,
) -> Result<(), DatapathError> {
    let path = pins.prog(name);
    let prog = clsact::open_pinned(&path).map_err(|e| DatapathError::io("open", &path, e))?;
    rt.set_bpf_filter(
        ifindex,
        hook,
        prog.as_fd(),
        name,
        classid,
        FilterMode::CreateOrReplace,
    )?;
    Ok(())
}

/// Puts the gate to the namespaces' download device (`target`) on the host veth's egress,
/// after `an_host_egress` (see `an_ns_gate`).
pub(crate) fn attach_gate(
    rt: &mut Rtnl,
    pins: &PinPaths,
    ifindex: u32,
    target: u32,
) -> Result<(), DatapathError> {
    let path = pins.prog(programs::NS_GATE);
    let prog = clsact::open_pinned(&path).map_err(|e| DatapathError::io("open", &path, e))?;
    rt.set_gate_filter(
        ifindex,
        Hook::Egress,
        prog.as_fd(),
        programs::NS_GATE,
        target,
    )?;
    Ok(())
}

/// The leaf unclassified traffic takes on a pod's device: the bulk leaf of its total limit,
/// else HTB's direct queue.
fn default_leaf(meta: &abi::PodMeta, dir: Direction) -> u16 {
    match meta.limit(dir, abi::KIND_TOTAL) {
        Some(_) => (abi::pod_class(abi::KIND_TOTAL) + abi::LEAF_BULK) as u16,
        None => 0,
    }
}

/// Pod side, run inside the pod netns: egress qdisc and leaf-selecting program, or their
/// removal when the pod has no egress limit. Returns the pod interface's ifindex, 0 when
/// nothing is installed on it. The program's filter carries `slot` in its classid: in the
/// pod netns that is how the program knows its pod (never by the source address).
pub(crate) fn reconcile_pod_side(
    pins: &PinPaths,
    slot: u32,
    meta: &abi::PodMeta,
    fresh: bool,
) -> Result<u32, DatapathError> {
    let ifname = abi::cstr(&meta.ifname);
    let pod_ifindex = ifindex(&ifname)?;
    let mut rt = Rtnl::new()?;
    match pod_classes(meta, Direction::Egress) {
        None => {
            rt.detach_filters(pod_ifindex, &[Hook::Egress])?;
            rt.delete_root_htb(pod_ifindex, HTB_MAJOR)?;
            Ok(0)
        }
        Some(classes) => {
            let defcls = default_leaf(meta, Direction::Egress);
            let mut apply = || {
                install_htb(
                    &mut rt,
                    pod_ifindex,
                    HTB_MAJOR,
                    defcls,
                    &classes,
                    fresh,
                    Sender::Local,
                )?;
                rt.ensure_clsact(pod_ifindex)?;
                attach_filter(
                    &mut rt,
                    pins,
                    pod_ifindex,
                    Hook::Egress,
                    programs::POD_EGRESS,
                    Some(abi::pod_filter_classid(slot)),
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

/// Host side of a pod's own download limits: the classes on its host veth, or none.
pub(crate) fn reconcile_host_side(
    rt: &mut Rtnl,
    meta: &abi::PodMeta,
    fresh: bool,
) -> Result<(), DatapathError> {
    match pod_classes(meta, Direction::Ingress) {
        Some(classes) => install_htb(
            rt,
            meta.host_ifindex,
            HTB_MAJOR,
            default_leaf(meta, Direction::Ingress),
            &classes,
            fresh,
            Sender::Forwarded,
        ),
        None => {
            rt.delete_root_htb(meta.host_ifindex, HTB_MAJOR)?;
            Ok(())
        }
    }
}

/// Undoes the pod side inside the pod netns (full teardown of a veth that stays).
pub(super) fn remove_pod_side(pod_ifindex: u32) -> Result<(), DatapathError> {
    let mut rt = Rtnl::new()?;
    rt.detach_filters(pod_ifindex, &[Hook::Egress])?;
    rt.delete_root_htb(pod_ifindex, HTB_MAJOR)?;
    Ok(())
}

/// Where an attach wires the pod: its netns (open, or by path) and whether its host veth was
/// created for this attach (then it has nothing of an earlier one on it).
struct Devices<'a> {
    netns_path: &'a std::path::Path,
    netns: Option<&'a netns::NetNs>,
    new_veth: bool,
}

impl Datapath {
    /// Attaches the datapath to a pod (CNI ADD). Idempotent per (container ID, ifname): an
    /// existing attachment with that key, or on the same host veth, is torn down first. On
    /// failure everything done is undone. Blocking; call from a plain thread (or
    /// `spawn_blocking`) in the node's network namespace with bpffs visible.
    pub fn attach_pod(&mut self, req: &PodAttachment) -> Result<AttachedPod, DatapathError> {
        self.attach_pod_with(req, AttachHints::default())
    }

    /// [`Datapath::attach_pod`] with what the caller already holds of the pod (the host
    /// veth's creation echo, the open pod netns): what it gives is not looked up again.
    pub fn attach_pod_with(
        &mut self,
        req: &PodAttachment,
        hints: AttachHints<'_>,
    ) -> Result<AttachedPod, DatapathError> {
        let id = &req.identity;
        req.limits.validate()?;
        if id.container_id.is_empty() {
            return Err(DatapathError::InvalidArgument {
                field: "container_id",
                reason: "must not be empty".to_owned(),
            });
        }
        if id.ipv4.is_none_or(|a| a.is_unspecified()) && id.ipv6.is_none_or(|a| a.is_unspecified())
        {
            return Err(DatapathError::InvalidArgument {
                field: "ip",
                reason: "the pod needs an IPv4 or an IPv6 address".to_owned(),
            });
        }
        let mut meta = abi::PodMeta {
            flags: abi::META_IN_USE,
            ipv4: id.ipv4.map_or([0; 4], |a| a.octets()),
            ipv6: id.ipv6.map_or([0; 16], |a| a.octets()),
            k8s_namespace: fixed("namespace", &id.namespace)?,
            k8s_name: fixed("name", &id.name)?,
            container_id: fixed("container_id", &id.container_id)?,
            ifname: fixed("ifname", &id.ifname)?,
            host_ifname: fixed("host_ifname", &req.host_ifname)?,
            netns: fixed(
                "netns",
                req.netns
                    .to_str()
                    .ok_or_else(|| DatapathError::InvalidArgument {
                        field: "netns",
                        reason: "path is not UTF-8".to_owned(),
                    })?,
            )?,
            ..Default::default()
        };
        if id.ifname.is_empty() || req.host_ifname.is_empty() {
            return Err(DatapathError::InvalidArgument {
                field: "ifname",
                reason: "interface names must not be empty".to_owned(),
            });
        }
        // The namespace as it is now: later visits check that the path still names it.
        let netns_id = match hints.netns {
            Some(ns) => ns.identity().ok(),
            None => std::fs::metadata(&req.netns)
                .ok()
                .map(|st| (st.dev(), st.ino())),
        };
        if let Some((dev, ino)) = netns_id {
            meta.netns_dev = dev;
            meta.netns_ino = ino;
        }
        if let Some(mac) = req.pod_mac {
            meta.ipv6_ll = super::eui64_link_local(mac).octets();
        }
        let mut rt = Rtnl::new()?;
        // Every size of the pod's shaping points derives from its veth's frame (the plugin
        // gives both ends the same MTU).
        let echoed = hints
            .host_veth
            .filter(|l| l.name == req.host_ifname)
            .and_then(|l| Some((l.index, link_sizes(l)?)));
        let (host_ifindex, sizes) = match echoed {
            Some(known) => known,
            None => {
                let i = ifindex(&req.host_ifname)?;
                (i, rt.link_sizes(i)?)
            }
        };
        meta.host_ifindex = host_ifindex;
        meta.frame = u32::try_from(sizes.frame()).unwrap_or(u32::MAX);
        meta.gso_max = u32::try_from(sizes.aggregate_max()).unwrap_or(u32::MAX);
        let key = PodKey::of(&meta);
        effective::record_own(&mut meta, &req.limits);
        meta.attached_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);

        let _lock = self.lock()?;
        // Under the lock: the policy and the namespace's aggregate as shaperd last wrote them.
        let policy = self.ns_policy(&id.namespace)?;
        effective::apply(&mut meta, &policy.pod);
        meta.entity = self.entity_of(&id.namespace)?.unwrap_or(0);
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
        let devices = Devices {
            netns_path: &req.netns,
            netns: hints.netns,
            new_veth: echoed.is_some(),
        };
        match self.attach_slot(slot, &key, &mut meta, &mut rt, devices) {
            Ok(attached) => {
                self.bump_pods_epoch()?;
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
        rt: &mut Rtnl,
        devices: Devices<'_>,
    ) -> Result<AttachedPod, DatapathError> {
        // The index entry goes in before the metadata it points to (see `crate::index`).
        self.index
            .insert(key, slot, 0)
            .map_err(|e| DatapathError::map(index::NAME, e))?;
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| DatapathError::io("read", what, e))?;
        self.forget_baseline(slot)?;
        let zero = PerCpuValues::try_from(vec![abi::PodCounters::default(); cpus])
            .map_err(|e| DatapathError::io("build counters", "", e))?;
        self.counters
            .set(slot, zero, 0)
            .map_err(|e| DatapathError::map(maps::COUNTERS, e))?;
        // The previous occupant's modelled queues (a drain time up to a leaf's depth ahead,
        // CE and drop counts) must not carry over to this pod's limits.
        for dir in Direction::ALL {
            for kind in (0..abi::NR_KINDS).filter(|k| meta.limit(dir, *k).is_some()) {
                let mut idx = vec![abi::vq_pod(slot, dir.index(), kind)];
                if dir == Direction::Egress {
                    idx.push(abi::vq_pod(slot, abi::VQ_POLICE, kind));
                }
                for i in idx {
                    self.vqueue
                        .set(i, abi::VQueue::default(), 0)
                        .map_err(|e| DatapathError::map(maps::VQUEUE, e))?;
                }
            }
        }
        // The link-scoped IPv6 budget and the connection table share start afresh.
        self.pod_rt
            .set(slot, abi::PodRt::default(), 0)
            .map_err(|e| DatapathError::map(maps::POD_RT, e))?;
        let ns_in = self.config()?.ns_in_ifindex;
        if ns_in != 0 {
            meta.flags |= abi::META_NS_GATE;
        }
        self.meta
            .set(slot, *meta, 0)
            .map_err(|e| DatapathError::map(maps::POD_META, e))?;
        self.pods
            .insert(
                meta.host_ifindex,
                abi::Pod {
                    slot,
                    flags: 0,
                    ipv4: meta.ipv4,
                    reserved: 0,
                    ipv6: meta.ipv6,
                    ipv6_ll: meta.ipv6_ll,
                },
                0,
            )
            .map_err(|e| DatapathError::map(maps::PODS, e))?;
        if meta.ipv4 != [0; 4] {
            self.pod_ips
                .insert(meta.ipv4, slot, 0)
                .map_err(|e| DatapathError::map(maps::POD_IPS, e))?;
        }
        if meta.ipv6 != [0; 16] {
            self.pod_ips6
                .insert(meta.ipv6, slot, 0)
                .map_err(|e| DatapathError::map(maps::POD_IPS6, e))?;
        }

        // Host veth: classify, count and drop blocked traffic in both directions. The clsact
        // qdisc and the filters go in one batch: the kernel takes them in order.
        let i = meta.host_ifindex;
        let open = |name: &str| {
            let path = self.pins.prog(name);
            clsact::open_pinned(&path).map_err(|e| DatapathError::io("open", &path, e))
        };
        let (ingress, egress) = (open(programs::HOST_INGRESS)?, open(programs::HOST_EGRESS)?);
        let gate = (ns_in != 0).then(|| open(programs::NS_GATE)).transpose()?;
        let mut batch = rt.batch();
        batch.add(clsact::add_clsact(i), clsact::add_clsact_op(i));
        for (hook, name, prog) in [
            (Hook::Ingress, programs::HOST_INGRESS, &ingress),
            (Hook::Egress, programs::HOST_EGRESS, &egress),
        ] {
            batch.add(
                clsact::bpf_filter(
                    i,
                    hook,
                    prog.as_fd(),
                    name,
                    None,
                    FilterMode::CreateOrReplace,
                ),
                clsact::bpf_filter_op(i, hook, name),
            );
        }
        if let Some(g) = &gate {
            let (hook, name) = (Hook::Egress, programs::NS_GATE);
            batch.add(
                clsact::gate_filter(i, hook, g.as_fd(), name, ns_in),
                clsact::gate_filter_op(i, hook, name, ns_in),
            );
        }
        let mut replies = batch.replies()?.into_iter();
        clsact::clsact_added(replies.next().unwrap_or(Ok(Vec::new())))?;
        for r in replies {
            r?;
        }
        drop((ingress, egress, gate));
        // A veth created for this attach has no qdisc of an earlier one to remove.
        if !devices.new_veth || pod_classes(meta, Direction::Ingress).is_some() {
            reconcile_host_side(rt, meta, true)?;
        }

        // Pod side, only for egress limits: entering the netns is the costliest step left.
        if pod_classes(meta, Direction::Egress).is_some() {
            let pins = self.pins.clone();
            let pod_meta = *meta;
            let pod_side = || reconcile_pod_side(&pins, slot, &pod_meta, true);
            meta.pod_ifindex = match devices.netns {
                Some(ns) => ns.run(pod_side)??,
                None => netns::run_in(devices.netns_path, pod_side)??,
            };
            self.meta
                .set(slot, *meta, 0)
                .map_err(|e| DatapathError::map(maps::POD_META, e))?;
        }
        Ok(attached(slot, meta))
    }
}

/// What `meta` has applied for the pod at `slot`.
pub(crate) fn attached(slot: u32, meta: &abi::PodMeta) -> AttachedPod {
    let frame = crate::htb::meta_frame(meta);
    let shape = |dir: Direction, kind: usize| {
        meta.limit(dir, kind).map(|r| {
            let burst = (kind == abi::KIND_TOTAL)
                .then(|| meta.burst[dir.index()].saturating_mul(8))
                .filter(|b| *b != 0);
            Shape::new(r, burst, frame)
        })
    };
    AttachedPod {
        slot,
        host_ifindex: meta.host_ifindex,
        pod_ifindex: meta.pod_ifindex,
        ingress: shape(Direction::Ingress, abi::KIND_TOTAL),
        egress: shape(Direction::Egress, abi::KIND_TOTAL),
        internet_egress: shape(Direction::Egress, abi::KIND_INTERNET),
        internet_ingress: shape(Direction::Ingress, abi::KIND_INTERNET),
        limits: meta.limits,
        entity: meta.entity,
    }
}
