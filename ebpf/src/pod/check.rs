//! CHECK and inspection: whether a pod's programs are where they should be, and its shaping
//! queues' statistics.

use super::{ifindex, HookState, PodHooks, PodRecord, QdiscState, ShapingStats};
use crate::{
    abi::{self, Direction},
    datapath::{sum_counters, Datapath},
    error::DatapathError,
    htb::{leaves_stats, pod_classes},
    maps,
    netlink::{clsact::GATE_PRIO, Hook, Rtnl},
    programs,
};

/// Our filter's state on `hook` of `ifindex` (in the calling thread's netns); `classid` is
/// the one it must carry (0: none).
fn hook_state(rt: &mut Rtnl, ifindex: u32, hook: Hook, prog: &str, classid: u32) -> HookState {
    match rt.our_filter(ifindex, hook) {
        Ok(Some(f)) if f.name == prog && f.direct_action && f.classid != classid => {
            HookState::WrongClassid {
                found: f.classid,
                wanted: classid,
            }
        }
        Ok(Some(f)) if f.name == prog && f.direct_action => {
            HookState::Attached { prog_id: f.prog_id }
        }
        Ok(_) => HookState::Missing,
        Err(e) => HookState::Unknown(e.to_string()),
    }
}

/// The gate's state on the host veth's egress of `ifindex` (a classic filter: not direct
/// action).
fn gate_state(rt: &mut Rtnl, ifindex: u32) -> HookState {
    match rt.filters(ifindex, Hook::Egress) {
        Ok(f) => match f
            .iter()
            .find(|f| f.prio == GATE_PRIO && f.name == programs::NS_GATE)
        {
            Some(f) => HookState::Attached { prog_id: f.prog_id },
            None => HookState::Missing,
        },
        Err(e) => HookState::Unknown(e.to_string()),
    }
}

/// Whether the HTB of the limits `meta` records for `dir` is on a device whose qdisc
/// statistics are `q`: the two leaves of every limit.
fn has_limits(meta: &abi::PodMeta, dir: Direction, q: &[crate::netlink::TcStats]) -> bool {
    (0..abi::NR_KINDS)
        .filter(|k| meta.limit(dir, *k).is_some())
        .all(|k| leaves_stats(q, abi::classid(abi::pod_class(k))).is_some())
}

impl Datapath {
    /// Whether each of the pod's programs is attached where it should be: the host veth
    /// (in the calling thread's netns) and, for a pod with egress limits, its interface in
    /// the pod netns.
    pub fn hooks_of(&self, rec: &PodRecord) -> PodHooks {
        let host = rec.host_ifname();
        let host_alive =
            nix::net::if_::if_nametoindex(host.as_str()).is_ok_and(|i| i == rec.meta.host_ifindex);
        let gated = rec.meta.flags & abi::META_NS_GATE != 0;
        let (host_ingress, host_egress, ns_gate) = if !host_alive {
            let gone = HookState::Unknown(format!(
                "host veth {host} (ifindex {}) is gone",
                rec.meta.host_ifindex
            ));
            (gone.clone(), gone.clone(), gone)
        } else {
            match Rtnl::new() {
                Ok(mut rt) => {
                    let ifx = rec.meta.host_ifindex;
                    (
                        hook_state(&mut rt, ifx, Hook::Ingress, programs::HOST_INGRESS, 0),
                        hook_state(&mut rt, ifx, Hook::Egress, programs::HOST_EGRESS, 0),
                        if gated {
                            gate_state(&mut rt, ifx)
                        } else {
                            HookState::NotNeeded
                        },
                    )
                }
                Err(e) => (
                    HookState::Unknown(e.to_string()),
                    HookState::Unknown(e.to_string()),
                    HookState::Unknown(e.to_string()),
                ),
            }
        };
        let unknown = |why: String| (HookState::Unknown(why.clone()), QdiscState::Unknown(why));
        let (pod_egress, pod_htb) = if pod_classes(&rec.meta, Direction::Egress).is_none() {
            (HookState::NotNeeded, QdiscState::NotNeeded)
        } else {
            let ifname = rec.ifname();
            let meta = rec.meta;
            match super::run_in_pod(&rec.meta, || {
                let i = ifindex(&ifname)?;
                let mut rt = Rtnl::new()?;
                let hook = hook_state(
                    &mut rt,
                    i,
                    Hook::Egress,
                    programs::POD_EGRESS,
                    abi::pod_filter_classid(rec.slot),
                );
                let htb = match rt.qdisc_stats(i) {
                    Ok(q) if has_limits(&meta, Direction::Egress, &q) => QdiscState::Present,
                    Ok(_) => QdiscState::Missing,
                    Err(e) => QdiscState::Unknown(e.to_string()),
                };
                Ok::<_, DatapathError>((hook, htb))
            }) {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => unknown(e.to_string()),
                Err(e) => unknown(e.to_string()),
            }
        };
        PodHooks {
            host_ingress,
            host_egress,
            ns_gate,
            pod_egress,
            pod_htb,
        }
    }

    /// Counters of a slot, summed over CPUs; a named class's from when it got its index.
    pub fn counters_of(&self, slot: u32) -> Result<abi::PodCounters, DatapathError> {
        let v = self
            .counters
            .get(&slot, 0)
            .map_err(|e| DatapathError::map(maps::COUNTERS, e))?;
        let mut c = sum_counters(&v);
        self.rebase(slot, &mut c)?;
        Ok(c)
    }

    /// The modelled queue of `slot`'s limit of `kind` in `d` (a direction's index or
    /// `abi::VQ_POLICE`).
    pub fn vqueue_of(
        &self,
        slot: u32,
        d: usize,
        kind: usize,
    ) -> Result<abi::VQueue, DatapathError> {
        self.vqueue
            .get(&abi::vq_pod(slot, d, kind), 0)
            .map_err(|e| DatapathError::map(maps::VQUEUE, e))
    }

    /// The modelled queue of an aggregate's limit of `kind` in `dir`.
    pub fn agg_vqueue(
        &self,
        entity: u32,
        dir: Direction,
        kind: usize,
    ) -> Result<abi::VQueue, DatapathError> {
        self.vqueue
            .get(&abi::vq_agg(entity, dir.index(), kind), 0)
            .map_err(|e| DatapathError::map(maps::VQUEUE, e))
    }

    /// Queue statistics of a pod's own shaping qdiscs; enters the pod netns for the egress
    /// side.
    pub fn shaping_stats(&self, rec: &PodRecord) -> Result<ShapingStats, DatapathError> {
        let mut out = ShapingStats::default();
        let mut add = |dir: Direction, q: &[crate::netlink::TcStats]| {
            for k in (0..abi::NR_KINDS).filter(|k| rec.meta.limit(dir, *k).is_some()) {
                if let Some(s) = leaves_stats(q, abi::classid(abi::pod_class(k))) {
                    out.leaves.push((dir, k, s));
                }
            }
        };
        if pod_classes(&rec.meta, Direction::Ingress).is_some() {
            let q = Rtnl::new()?.qdisc_stats(rec.meta.host_ifindex)?;
            add(Direction::Ingress, &q);
        }
        if pod_classes(&rec.meta, Direction::Egress).is_some() {
            let pod_ifindex = rec.meta.pod_ifindex;
            let q = super::run_in_pod(&rec.meta, || {
                Rtnl::new().and_then(|mut rt| rt.qdisc_stats(pod_ifindex))
            })??;
            add(Direction::Egress, &q);
        }
        Ok(out)
    }
}
