//! CHECK and inspection: whether a pod's programs are where they should be, and its shaping
//! queues' statistics.

use std::path::PathBuf;

use super::{ifindex, HookState, PodHooks, PodRecord, QdiscState, ShapingStats};
use crate::{
    abi,
    datapath::{sum_counters, Datapath},
    error::DatapathError,
    htb::{leaves_stats, pod_egress_classes},
    maps,
    netlink::{Hook, Rtnl},
    netns, programs,
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

impl Datapath {
    /// Whether each of the pod's programs is attached where it should be: the host veth
    /// (in the calling thread's netns) and, for a pod with egress limits, its interface in
    /// the pod netns.
    pub fn hooks_of(&self, rec: &PodRecord) -> PodHooks {
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
                        hook_state(&mut rt, ifx, Hook::Ingress, programs::HOST_INGRESS, 0),
                        hook_state(&mut rt, ifx, Hook::Egress, programs::HOST_EGRESS, 0),
                    )
                }
                Err(e) => (
                    HookState::Unknown(e.to_string()),
                    HookState::Unknown(e.to_string()),
                ),
            }
        };
        let unknown = |why: String| (HookState::Unknown(why.clone()), QdiscState::Unknown(why));
        let (pod_egress, pod_htb) = if pod_egress_classes(&rec.meta).is_none() {
            (HookState::NotNeeded, QdiscState::NotNeeded)
        } else {
            let ns = PathBuf::from(abi::cstr(&rec.meta.netns));
            let ifname = rec.ifname();
            let total = rec.meta.egress_rate != 0;
            match netns::run_in(&ns, || {
                let i = ifindex(&ifname)?;
                let mut rt = Rtnl::new()?;
                let hook = hook_state(
                    &mut rt,
                    i,
                    Hook::Egress,
                    programs::POD_EGRESS,
                    abi::pod_filter_classid(rec.slot),
                );
                // The internet class is always there; the other class with a total limit.
                let htb = match rt.qdisc_stats(i) {
                    Ok(q)
                        if leaves_stats(&q, abi::CLASSID_POD_INTERNET).is_some()
                            && (!total || leaves_stats(&q, abi::CLASSID_POD_OTHER).is_some()) =>
                    {
                        QdiscState::Present
                    }
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
            pod_egress,
            pod_htb,
        }
    }

    /// Counters of a slot, summed over CPUs.
    pub fn counters_of(&self, slot: u32) -> Result<abi::PodCounters, DatapathError> {
        let v = self
            .counters
            .get(&slot, 0)
            .map_err(|e| DatapathError::map(maps::COUNTERS, e))?;
        Ok(sum_counters(&v))
    }

    /// The modelled queue of `slot`'s class queue `class` (`abi::VQ_INGRESS`, `VQ_EGRESS`,
    /// `VQ_INTERNET`).
    pub fn vqueue_of(&self, slot: u32, class: u32) -> Result<abi::VQueue, DatapathError> {
        self.vqueue
            .get(&abi::vq_index(slot, class), 0)
            .map_err(|e| DatapathError::map(maps::VQUEUE, e))
    }

    /// Queue statistics of a pod's shaping qdiscs; enters the pod netns for the egress side.
    pub fn shaping_stats(&self, rec: &PodRecord) -> Result<ShapingStats, DatapathError> {
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
}
