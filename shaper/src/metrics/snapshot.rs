//! One consistent read of every attached pod: identity, counters, limits, and the drops of
//! its shaping queues.

use std::path::PathBuf;

use aliasnet_ebpf::{
    abi::{self, Direction, PodCounters},
    Datapath, DatapathError,
};
use aliasnet_netlink::{Rtnl, TcStats};
use aliasnet_netns::NetNs;

/// A pod's own effective limits in bit/s, by direction and kind (0 = unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodLimits(pub abi::Rates);

impl PodLimits {
    /// Whether packets of `dir` pass one of the pod's own shaping queues (and can be
    /// dropped by it).
    pub fn shaped(&self, dir: Direction) -> bool {
        self.0.any_in(dir)
    }

    /// The limited kinds of `dir`.
    pub fn kinds(&self, dir: Direction) -> impl Iterator<Item = usize> + '_ {
        (0..abi::NR_KINDS).filter(move |k| self.0.get(dir, *k).is_some())
    }
}

/// One attached pod as read at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSample {
    pub slot: u32,
    /// With `slot`, identifies one attachment: a re-ADD in the same slot is a new pod.
    pub attached_unix_ns: u64,
    pub namespace: String,
    /// The pod name, or the container ID when the runtime passed no `K8S_POD_NAME`.
    pub pod: String,
    pub ip: std::net::Ipv4Addr,
    pub host_ifindex: u32,
    pub pod_ifindex: u32,
    pub netns: PathBuf,
    pub counters: PodCounters,
    pub limits: PodLimits,
    /// Packets dropped by the shaping queue, per direction index; `None` where the pod is not
    /// shaped or its queue could not be read this time.
    pub rate_drops: [Option<u64>; abi::NR_DIRS],
    /// Its connections in the window clamp's table (held, refused, learnt again), from its
    /// attachment on.
    pub conns: abi::PodRt,
}

impl PodSample {
    pub(super) fn key(&self) -> (u32, u64) {
        (self.slot, self.attached_unix_ns)
    }
}

/// Every attached pod, read consistently pod by pod, and the node's and namespaces' limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub pods: Vec<PodSample>,
    /// The named classes by index (`None`: unused).
    pub class_names: Vec<Option<String>>,
    /// The node's aggregate limits.
    pub node_limits: abi::Rates,
    /// The namespaces with aggregate limits on this node, with them.
    pub namespace_limits: Vec<(String, abi::Rates)>,
    /// The connection-table entries each pod may hold.
    pub conn_share: u32,
}

/// Same attachment in both reads: the identity did not change while counters were read.
fn same_attachment(a: &abi::PodMeta, b: &abi::PodMeta) -> bool {
    b.flags & abi::META_IN_USE != 0
        && a.attached_unix_ns == b.attached_unix_ns
        && a.container_id == b.container_id
        && a.ifname == b.ifname
}

impl Snapshot {
    /// Reads the maps. A pod attached or detached during the read is either complete in the
    /// snapshot or absent (its metadata is read before and after its counters and must
    /// match), never mixed with another pod's counters. With `qdiscs`, the shaping queues'
    /// drop counters are read too (one netns switch per pod with egress limits).
    pub fn read(dp: &Datapath, qdiscs: bool) -> Result<Self, DatapathError> {
        // A class named during the read may have been counted under its index's previous
        // class: it is left unnamed (unexported) this time.
        let mut class_names = dp.class_names()?;
        let mut pods = Vec::new();
        for slot in 0..abi::MAX_PODS {
            let meta = dp.meta_at(slot)?;
            if meta.flags & abi::META_IN_USE == 0 {
                continue;
            }
            let counters = dp.counters_of(slot)?;
            let conns = dp.pod_rt(slot)?;
            let after = dp.meta_at(slot)?;
            if !same_attachment(&meta, &after) {
                continue;
            }
            let name = abi::cstr(&after.k8s_name);
            pods.push(PodSample {
                slot,
                attached_unix_ns: after.attached_unix_ns,
                namespace: abi::cstr(&after.k8s_namespace),
                pod: if name.is_empty() {
                    abi::cstr(&after.container_id)
                } else {
                    name
                },
                ip: std::net::Ipv4Addr::from(after.ipv4),
                host_ifindex: after.host_ifindex,
                pod_ifindex: after.pod_ifindex,
                netns: PathBuf::from(abi::cstr(&after.netns)),
                counters,
                limits: PodLimits(after.limits),
                rate_drops: [None; abi::NR_DIRS],
                conns,
            });
        }
        for (n, after) in class_names.iter_mut().zip(dp.class_names()?) {
            if *n != after {
                *n = None;
            }
        }
        let mut entities: Vec<u32> = pods_entities(dp, &pods)?;
        entities.sort_unstable();
        entities.dedup();
        let mut namespace_limits = Vec::new();
        for e in entities {
            let rec = dp.entity(e)?;
            if rec.flags & abi::ENTITY_IN_USE != 0 {
                namespace_limits.push((abi::cstr(&rec.name), rec.limits));
            }
        }
        let mut snap = Self {
            pods,
            class_names,
            node_limits: dp.entity(abi::NODE_ENTITY)?.limits,
            namespace_limits,
            conn_share: match dp.config()?.conn_share {
                0 => abi::CONN_SHARE_DEFAULT,
                n => n,
            },
        };
        if qdiscs {
            snap.read_rate_drops();
        }
        Ok(snap)
    }

    /// Fills `rate_drops` from the HTB classes of the pods' limits: a class counts the
    /// packets its leaf queue refused, and, unlike qdiscs, classes are dumped per device (a
    /// qdisc dump walks every device of the namespace, quadratic over a node's veths).
    /// Failures (a pod netns or veth that just went away) leave `None`: the exporter then
    /// repeats the last value.
    fn read_rate_drops(&mut self) {
        // Egress classes live in the pods' netns: worker threads visit them in turn (entering
        // one changes only the worker's namespace), while this thread reads the ingress
        // classes of the node's netns.
        let wanted: Vec<(usize, PathBuf, u32, Vec<u32>)> = self
            .pods
            .iter()
            .enumerate()
            .filter(|(_, p)| p.limits.shaped(Direction::Egress) && p.pod_ifindex != 0)
            .map(|(i, p)| {
                let leaves = leaves_of(&p.limits, Direction::Egress);
                (i, p.netns.clone(), p.pod_ifindex, leaves)
            })
            .collect();
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_NETNS_WORKERS);
        let chunk = wanted.len().div_ceil(workers).max(1);
        let pods = &mut self.pods;
        let found: Vec<(usize, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = wanted
                .chunks(chunk)
                .map(|part| s.spawn(move || egress_class_drops(part)))
                .collect();
            if pods.iter().any(|p| p.limits.shaped(Direction::Ingress)) {
                if let Ok(mut rt) = Rtnl::new() {
                    for p in pods.iter_mut() {
                        if p.limits.shaped(Direction::Ingress) {
                            let leaves = leaves_of(&p.limits, Direction::Ingress);
                            p.rate_drops[Direction::Ingress.index()] = rt
                                .class_stats(p.host_ifindex)
                                .ok()
                                .map(|c| class_drops(&c, &leaves));
                        }
                    }
                }
            }
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
        for (i, drops) in found {
            self.pods[i].rate_drops[Direction::Egress.index()] = Some(drops);
        }
    }
}

/// The namespace aggregates of the pods read.
fn pods_entities(dp: &Datapath, pods: &[PodSample]) -> Result<Vec<u32>, DatapathError> {
    let mut out = Vec::new();
    for p in pods {
        if let Some(e) = dp.entity_of(&p.namespace)? {
            out.push(e);
        }
    }
    Ok(out)
}

/// Threads reading pods' egress classes in parallel during a scrape.
const MAX_NETNS_WORKERS: usize = 4;

/// The leaf classes of a pod's own limits of `dir`.
fn leaves_of(limits: &PodLimits, dir: Direction) -> Vec<u32> {
    limits
        .kinds(dir)
        .flat_map(|k| {
            let c = abi::classid(abi::pod_class(k));
            [c + abi::LEAF_SPARSE, c + abi::LEAF_BULK]
        })
        .collect()
}

/// Packets the listed leaf classes dropped (HTB counts drops on the leaves).
fn class_drops(stats: &[TcStats], leaves: &[u32]) -> u64 {
    leaves
        .iter()
        .filter_map(|c| stats.iter().find(|s| s.handle == *c))
        .map(|s| s.drops)
        .sum()
}

/// Runs on its own thread: enters each pod's netns in turn and reads its egress classes'
/// drops.
fn egress_class_drops(pods: &[(usize, PathBuf, u32, Vec<u32>)]) -> Vec<(usize, u64)> {
    let mut out = Vec::with_capacity(pods.len());
    for (i, path, ifindex, leaves) in pods {
        let Ok(ns) = NetNs::open(path) else { continue };
        // The socket binds to the namespace current at creation.
        let stats = ns.enter(|| Rtnl::new().and_then(|mut rt| rt.class_stats(*ifindex)));
        if let Ok(Ok(c)) = stats {
            out.push((*i, class_drops(&c, leaves)));
        }
    }
    out
}
