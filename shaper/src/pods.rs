//! Per-pod attach and detach: the API the CNI plugin calls on ADD and DEL.
//!
//! Per pod, from the pinned objects only (shaperd need not run):
//! - the pod is recorded in the maps (identity, IP, limits) under a free slot, counters zeroed;
//! - `an_host_ingress` / `an_host_egress` are attached with TCX to the host veth and pinned;
//! - ingress limit: HTB root on the host veth, one class at the rate, bounded FIFO leaf;
//! - internet-egress and/or total egress limit: HTB root on the pod's eth0 (inside the pod
//!   netns) with `an_pod_egress` choosing the class per packet: 1:10 internet, 1:20 the rest.
//!   Without a total egress limit there is no 1:20, so non-internet traffic falls through
//!   to HTB's unshaped direct queue: internal traffic stays at line rate.
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

use aliasnet_ebpf::{abi, maps, programs};
use aya::{maps::PerCpuValues, programs::TcAttachType};
use tracing::{debug, info, warn};

use crate::{
    datapath::{
        attach_pinned, is_not_found, leaf_handle, sum_counters, Datapath, PinPaths, DIRECT_QLEN,
        HTB_MAJOR,
    },
    error::ShaperError,
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

fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

/// HTB classes on the pod's eth0 for a pod's recorded limits; `None` = no egress shaping.
fn pod_egress_classes(meta: &abi::PodMeta) -> Option<Vec<HtbClass>> {
    let root = handle(HTB_MAJOR, 0);
    let internet = nonzero(meta.internet_egress_rate);
    match nonzero(meta.egress_rate) {
        None => {
            let i = Shape::new(internet?, None);
            Some(vec![HtbClass {
                classid: abi::CLASSID_POD_INTERNET,
                parent: root,
                rate: i,
                ceil: i,
            }])
        }
        Some(e) => {
            // Children's guaranteed rates sum to the parent's, so the total holds; each may
            // borrow up to its ceiling when the other is idle.
            let total = Shape::new(e, Some(meta.egress_burst.saturating_mul(8)));
            let i = internet.unwrap_or(e).min(e);
            let parent = handle(HTB_MAJOR, 1);
            Some(vec![
                HtbClass {
                    classid: parent,
                    parent: root,
                    rate: total,
                    ceil: total,
                },
                HtbClass {
                    classid: abi::CLASSID_POD_INTERNET,
                    parent,
                    rate: Shape::new((i / 2).max(1), None),
                    ceil: Shape::new(i, None),
                },
                HtbClass {
                    classid: abi::CLASSID_POD_OTHER,
                    parent,
                    rate: Shape::new((e - i / 2).max(1), None),
                    ceil: total,
                },
            ])
        }
    }
}

/// HTB class on the host veth for the pod's ingress limit.
fn host_ingress_class(meta: &abi::PodMeta) -> Option<HtbClass> {
    let r = nonzero(meta.ingress_rate)?;
    let s = Shape::new(r, Some(meta.ingress_burst.saturating_mul(8)));
    Some(HtbClass {
        classid: handle(HTB_MAJOR, 1),
        parent: handle(HTB_MAJOR, 0),
        rate: s,
        ceil: s,
    })
}

/// Who sends the traffic a qdisc shapes (see [`Shape`] for why the leaves differ).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sender {
    /// Sockets in the same network namespace: pod egress on the pod's eth0.
    Local,
    /// Forwarded traffic: the pod's ingress on the host veth.
    Forwarded,
}

/// Installs `classes` under a fresh or existing HTB root, each leaf with a bounded queue.
fn install_htb(
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
                Sender::Local => rt.set_pfifo(ifindex, c.classid, leaf, c.ceil.queue_packets)?,
                Sender::Forwarded => rt.set_tbf(ifindex, c.classid, leaf, &c.ceil)?,
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

/// Pod side, run inside the pod netns: egress qdisc and class-selecting program.
fn reconcile_pod_side(
    pins: &PinPaths,
    slot: u32,
    meta: &abi::PodMeta,
    fresh: bool,
) -> Result<u32, ShaperError> {
    let ifname = abi::cstr(&meta.ifname);
    let link = pins.pod_dir(slot).join("pod_egress");
    let pod_ifindex = ifindex(&ifname)?;
    let mut rt = Rtnl::new()?;
    match pod_egress_classes(meta) {
        None => {
            unpin(&link)?;
            rt.delete_root_htb(pod_ifindex, HTB_MAJOR)?;
        }
        Some(classes) => {
            install_htb(&mut rt, pod_ifindex, 0, &classes, fresh, Sender::Local)?;
            if !link.exists() {
                attach_pinned(
                    pins,
                    programs::POD_EGRESS,
                    &ifname,
                    TcAttachType::Egress,
                    &link,
                )?;
            }
        }
    }
    Ok(pod_ifindex)
}

impl Datapath {
    /// Attaches the datapath to a pod (CNI ADD). Idempotent per (container ID, ifname): an
    /// existing attachment with that key is torn down first. On failure everything done is
    /// undone. Blocking; call from a plain thread (or `spawn_blocking`) in the node's network
    /// namespace with bpffs visible.
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

        let lim = &req.limits;
        if let Some(r) = lim.ingress_rate {
            meta.ingress_rate = r;
            meta.ingress_burst = Shape::new(r, lim.ingress_burst).burst_bytes;
        }
        if let Some(r) = lim.egress_rate {
            meta.egress_rate = r;
            meta.egress_burst = Shape::new(r, lim.egress_burst).burst_bytes;
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
        for rec in self.records()? {
            let same_key = rec.container_id() == id.container_id && rec.ifname() == id.ifname;
            if same_key || rec.meta.host_ifindex == host_ifindex {
                info!(slot = rec.slot, container = %rec.container_id(), "replacing previous attachment");
                self.teardown(rec.slot, &rec.meta)?;
            }
        }
        let slot = self.free_slot()?;
        match self.attach_slot(slot, &mut meta, req) {
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
                if let Err(undo) = self.teardown(slot, &meta) {
                    warn!(slot, error = %undo, "rollback after a failed attach");
                }
                Err(e)
            }
        }
    }

    fn attach_slot(
        &mut self,
        slot: u32,
        meta: &mut abi::PodMeta,
        req: &PodAttachment,
    ) -> Result<AttachedPod, ShaperError> {
        let dir = self.pins.pod_dir(slot);
        // Leftovers of an interrupted teardown must not survive into a new pod.
        if dir.exists() {
            for f in std::fs::read_dir(&dir).map_err(|e| ShaperError::io("read", &dir, e))? {
                let f = f.map_err(|e| ShaperError::io("read", &dir, e))?;
                unpin(&f.path())?;
            }
        } else {
            std::fs::create_dir(&dir).map_err(|e| ShaperError::io("create", &dir, e))?;
        }
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| ShaperError::io("read", what, e))?;
        let zero = PerCpuValues::try_from(vec![abi::PodCounters::default(); cpus])
            .map_err(|e| ShaperError::io("build counters", "", e))?;
        self.counters
            .set(slot, zero, 0)
            .map_err(|e| ShaperError::map(maps::COUNTERS, e))?;
        self.meta
            .set(slot, *meta, 0)
            .map_err(|e| ShaperError::map(maps::POD_META, e))?;
        self.pods
            .insert(
                meta.host_ifindex,
                abi::Pod {
                    slot,
                    flags: 0,
                    ipv4: meta.ipv4,
                    reserved: 0,
                },
                0,
            )
            .map_err(|e| ShaperError::map(maps::PODS, e))?;
        self.pod_ips
            .insert(meta.ipv4, slot, 0)
            .map_err(|e| ShaperError::map(maps::POD_IPS, e))?;

        attach_pinned(
            &self.pins,
            programs::HOST_INGRESS,
            &req.host_ifname,
            TcAttachType::Ingress,
            &dir.join("host_ingress"),
        )?;
        attach_pinned(
            &self.pins,
            programs::HOST_EGRESS,
            &req.host_ifname,
            TcAttachType::Egress,
            &dir.join("host_egress"),
        )?;

        let mut rt = Rtnl::new()?;
        if let Some(class) = host_ingress_class(meta) {
            install_htb(
                &mut rt,
                meta.host_ifindex,
                1,
                &[class],
                true,
                Sender::Forwarded,
            )?;
        } else {
            rt.delete_root_htb(meta.host_ifindex, HTB_MAJOR)?;
        }

        let pins = self.pins.clone();
        let pod_meta = *meta;
        meta.pod_ifindex = netns::run_in(&req.netns, || {
            reconcile_pod_side(&pins, slot, &pod_meta, true)
        })??;
        self.meta
            .set(slot, *meta, 0)
            .map_err(|e| ShaperError::map(maps::POD_META, e))?;

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
            ingress: host_ingress_class(meta).map(|c| c.ceil),
            egress,
            internet_egress,
            internet_from_policy: meta.flags & abi::META_INTERNET_FROM_POLICY != 0,
        })
    }

    /// Detaches a pod (CNI DEL). Best effort and idempotent: succeeds when nothing is
    /// attached under the key, when the host veth or the pod netns are already gone, and when
    /// repeated. Returns whether an attachment was found.
    pub fn detach_pod(&mut self, container_id: &str, ifname: &str) -> Result<bool, ShaperError> {
        let _lock = self.lock()?;
        let mut found = false;
        for rec in self.records()? {
            if rec.container_id() == container_id && rec.ifname() == ifname {
                found = true;
                self.teardown(rec.slot, &rec.meta)?;
                info!(slot = rec.slot, container = container_id, "pod detached");
            }
        }
        Ok(found)
    }

    /// Removes attachments whose host veth no longer exists (a pod deleted without a CNI
    /// DEL). Returns the removed records.
    pub fn gc(&mut self) -> Result<Vec<PodRecord>, ShaperError> {
        let _lock = self.lock()?;
        let mut removed = Vec::new();
        for rec in self.records()? {
            let alive = nix::net::if_::if_nametoindex(rec.host_ifname().as_str())
                .is_ok_and(|i| i == rec.meta.host_ifindex);
            if !alive {
                self.teardown(rec.slot, &rec.meta)?;
                info!(slot = rec.slot, container = %rec.container_id(), "stale pod attachment removed");
                removed.push(rec);
            }
        }
        Ok(removed)
    }

    /// Every attached pod with its counters.
    pub fn pods(&self) -> Result<Vec<PodRecord>, ShaperError> {
        self.records()
    }

    /// The attached pod with this key.
    pub fn pod(&self, container_id: &str, ifname: &str) -> Result<Option<PodRecord>, ShaperError> {
        Ok(self
            .records()?
            .into_iter()
            .find(|r| r.container_id() == container_id && r.ifname() == ifname))
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
        let leaf = |stats: &[TcStats], classid: u32| {
            stats
                .iter()
                .copied()
                .find(|s| s.handle == leaf_handle(classid))
        };
        if rec.meta.ingress_rate != 0 {
            let q = Rtnl::new()?.qdisc_stats(rec.meta.host_ifindex)?;
            out.ingress = leaf(&q, handle(HTB_MAJOR, 1));
        }
        if pod_egress_classes(&rec.meta).is_some() {
            let netns = PathBuf::from(abi::cstr(&rec.meta.netns));
            let pod_ifindex = rec.meta.pod_ifindex;
            let q = netns::run_in(&netns, || {
                Rtnl::new().and_then(|mut rt| rt.qdisc_stats(pod_ifindex))
            })??;
            out.internet_egress = leaf(&q, abi::CLASSID_POD_INTERNET);
            out.other_egress = leaf(&q, abi::CLASSID_POD_OTHER);
        }
        Ok(out)
    }

    pub(crate) fn records(&self) -> Result<Vec<PodRecord>, ShaperError> {
        let mut out = Vec::new();
        for slot in 0..abi::MAX_PODS {
            let meta = self
                .meta
                .get(&slot, 0)
                .map_err(|e| ShaperError::map(maps::POD_META, e))?;
            if meta.flags & abi::META_IN_USE == 0 {
                continue;
            }
            out.push(PodRecord {
                slot,
                meta,
                counters: self.counters_of(slot)?,
            });
        }
        Ok(out)
    }

    fn free_slot(&self) -> Result<u32, ShaperError> {
        for slot in 0..abi::MAX_PODS {
            let meta = self
                .meta
                .get(&slot, 0)
                .map_err(|e| ShaperError::map(maps::POD_META, e))?;
            if meta.flags & abi::META_IN_USE == 0 {
                return Ok(slot);
            }
        }
        Err(ShaperError::Full { max: abi::MAX_PODS })
    }

    /// Undoes an attachment, continuing past failures and reporting them all.
    fn teardown(&mut self, slot: u32, meta: &abi::PodMeta) -> Result<(), ShaperError> {
        let mut errors = Vec::new();
        let dir = self.pins.pod_dir(slot);
        // Unpinning drops the last reference to each link, which detaches the program.
        for name in ["host_ingress", "host_egress", "pod_egress"] {
            if let Err(e) = unpin(&dir.join(name)) {
                errors.push(e);
            }
        }
        if let Err(e) = std::fs::remove_dir(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                errors.push(ShaperError::io("remove", &dir, e));
            }
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
        // The host veth may be gone already (pod netns deleted first); so is its qdisc then.
        let host = abi::cstr(&meta.host_ifname);
        if nix::net::if_::if_nametoindex(host.as_str()).is_ok_and(|i| i == meta.host_ifindex) {
            if let Err(e) =
                Rtnl::new().and_then(|mut rt| rt.delete_root_htb(meta.host_ifindex, HTB_MAJOR))
            {
                errors.push(e.into());
            }
        }
        // Pod side: only if the namespace still exists (a netns kept across DEL and ADD).
        let netns_path = PathBuf::from(abi::cstr(&meta.netns));
        if meta.pod_ifindex != 0 && netns_path.exists() {
            let pod_ifindex = meta.pod_ifindex;
            match netns::run_in(&netns_path, || {
                Rtnl::new().and_then(|mut rt| rt.delete_root_htb(pod_ifindex, HTB_MAJOR))
            }) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => debug!(slot, error = %e, "pod-side qdisc not removed"),
                Err(e) => debug!(slot, error = %e, "pod netns not entered"),
            }
        }
        if let Err(e) = self.meta.set(slot, abi::PodMeta::default(), 0) {
            errors.push(ShaperError::map(maps::POD_META, e));
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
            let slot = rec.slot;
            let res = netns::run_in(&netns_path, || {
                reconcile_pod_side(&pins, slot, &meta, false)
            })
            .map_err(ShaperError::from)
            .and_then(|r| r);
            match res {
                Ok(_) => {
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
