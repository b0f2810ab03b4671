//! ADD: record the pod in the maps under a free slot, put the programs on its host veth,
//! and its shaping classes on the host veth and (for egress limits) on its interface.

use std::{
    os::fd::AsFd,
    time::{SystemTime, UNIX_EPOCH},
};

use aya::maps::PerCpuValues;
use tracing::{info, warn};

use super::{fixed, ifindex, AttachedPod, PodAttachment, Teardown};
use crate::{
    abi,
    abi::PodKey,
    datapath::{index, pins::PinPaths, Datapath},
    error::DatapathError,
    htb::{host_ingress_classes, install_htb, pod_egress_classes, Sender, HTB_MAJOR},
    maps,
    netlink::{
        clsact::{self, FilterMode, Hook},
        handle, Rtnl,
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

/// Pod side, run inside the pod netns: egress qdisc and class-selecting program, or their
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

/// Undoes the pod side inside the pod netns (full teardown of a veth that stays).
pub(super) fn remove_pod_side(pod_ifindex: u32) -> Result<(), DatapathError> {
    let mut rt = Rtnl::new()?;
    rt.detach_filters(pod_ifindex, &[Hook::Egress])?;
    rt.delete_root_htb(pod_ifindex, HTB_MAJOR)?;
    Ok(())
}

impl Datapath {
    /// Attaches the datapath to a pod (CNI ADD). Idempotent per (container ID, ifname): an
    /// existing attachment with that key, or on the same host veth, is torn down first. On
    /// failure everything done is undone. Blocking; call from a plain thread (or
    /// `spawn_blocking`) in the node's network namespace with bpffs visible.
    pub fn attach_pod(&mut self, req: &PodAttachment) -> Result<AttachedPod, DatapathError> {
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
    ) -> Result<AttachedPod, DatapathError> {
        // The index entry goes in before the metadata it points to (see `crate::index`).
        self.index
            .insert(key, slot, 0)
            .map_err(|e| DatapathError::map(index::NAME, e))?;
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| DatapathError::io("read", what, e))?;
        let zero = PerCpuValues::try_from(vec![abi::PodCounters::default(); cpus])
            .map_err(|e| DatapathError::io("build counters", "", e))?;
        self.counters
            .set(slot, zero, 0)
            .map_err(|e| DatapathError::map(maps::COUNTERS, e))?;
        // The previous occupant's modelled queue (a drain time up to a leaf's depth ahead, its
        // CE and drop counts) must not carry over to this pod.
        for class in 0..abi::VQ_PER_POD {
            self.vqueue
                .set(slot * abi::VQ_PER_POD + class, abi::VQueue::default(), 0)
                .map_err(|e| DatapathError::map(maps::VQUEUE, e))?;
        }
        self.meta
            .set(slot, *meta, 0)
            .map_err(|e| DatapathError::map(maps::POD_META, e))?;
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
                    ipv6: meta.ipv6,
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

        // Host veth: classify, count and drop blocked traffic in both directions.
        let mut rt = Rtnl::new()?;
        rt.ensure_clsact(meta.host_ifindex)?;
        attach_filter(
            &mut rt,
            &self.pins,
            meta.host_ifindex,
            Hook::Ingress,
            programs::HOST_INGRESS,
            None,
        )?;
        attach_filter(
            &mut rt,
            &self.pins,
            meta.host_ifindex,
            Hook::Egress,
            programs::HOST_EGRESS,
            None,
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
            meta.pod_ifindex = netns::run_in(&req.netns, || {
                reconcile_pod_side(&pins, slot, &pod_meta, true)
            })??;
            self.meta
                .set(slot, *meta, 0)
                .map_err(|e| DatapathError::map(maps::POD_META, e))?;
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
}
