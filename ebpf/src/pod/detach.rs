//! DEL and GC: undo an attachment, completely or only in the maps.

use std::path::PathBuf;

use tracing::{debug, info, warn};

use super::{attach::remove_pod_side, PodRecord, Teardown};
use crate::{
    abi::{self, PodKey},
    datapath::{index, is_not_found, Datapath},
    error::DatapathError,
    htb::HTB_MAJOR,
    maps,
    netlink::{Hook, Rtnl},
    netns,
};

impl Datapath {
    /// Detaches a pod completely (filters, qdiscs, map entries): [`Teardown::Full`]. Best
    /// effort and idempotent: succeeds when nothing is attached under the key, when the host
    /// veth or the pod netns are already gone, and when repeated. Returns whether an
    /// attachment was found.
    pub fn detach_pod(&mut self, container_id: &str, ifname: &str) -> Result<bool, DatapathError> {
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
    ) -> Result<bool, DatapathError> {
        // A key too long for the maps was never attached.
        let Some(key) = PodKey::new(container_id, ifname) else {
            return Ok(false);
        };
        let _lock = self.lock()?;
        let Some((slot, meta)) = self.find(&key)? else {
            return Ok(false);
        };
        self.teardown(slot, &meta, how)?;
        self.bump_pods_epoch()?;
        info!(slot, container = container_id, ?how, "pod detached");
        Ok(true)
    }

    /// Removes attachments whose host veth no longer exists (a pod deleted without a CNI
    /// DEL), and repairs the key index. Returns the removed records.
    pub fn gc(&mut self) -> Result<Vec<PodRecord>, DatapathError> {
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
        if !removed.is_empty() {
            self.bump_pods_epoch()?;
        }
        Ok(removed)
    }

    /// Undoes an attachment, continuing past failures and reporting them all. Device state
    /// first (with [`Teardown::Full`]), then the map entries, the metadata before the index
    /// entry (see `crate::datapath::index`).
    pub(crate) fn teardown(
        &mut self,
        slot: u32,
        meta: &abi::PodMeta,
        how: Teardown,
    ) -> Result<(), DatapathError> {
        let mut errors = Vec::new();
        if how == Teardown::Full {
            // The host veth may be gone already (pod netns deleted first); so are its filters
            // and qdiscs then.
            let host = abi::cstr(&meta.host_ifname);
            if nix::net::if_::if_nametoindex(host.as_str()).is_ok_and(|i| i == meta.host_ifindex) {
                let ifx = meta.host_ifindex;
                if let Err(e) = Rtnl::new().and_then(|mut rt| {
                    rt.delete_gate_filter(ifx, Hook::Egress)?;
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
                match super::run_in_pod(meta, || remove_pod_side(pod_ifindex)) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => debug!(slot, error = %e, "pod-side filter or qdisc not removed"),
                    Err(e @ netns::NetnsError::Replaced { .. }) => {
                        warn!(slot, error = %e, "pod netns not entered")
                    }
                    Err(e) => debug!(slot, error = %e, "pod netns not entered"),
                }
            }
        }
        match self.pods.get(&meta.host_ifindex, 0) {
            Ok(p) if p.slot == slot => {
                if let Err(e) = self.pods.remove(&meta.host_ifindex) {
                    if !is_not_found(&e) {
                        errors.push(DatapathError::map(maps::PODS, e));
                    }
                }
            }
            _ => {}
        }
        if let Ok(s) = self.pod_ips.get(&meta.ipv4, 0) {
            if s == slot {
                if let Err(e) = self.pod_ips.remove(&meta.ipv4) {
                    if !is_not_found(&e) {
                        errors.push(DatapathError::map(maps::POD_IPS, e));
                    }
                }
            }
        }
        if let Ok(s) = self.pod_ips6.get(&meta.ipv6, 0) {
            if s == slot {
                if let Err(e) = self.pod_ips6.remove(&meta.ipv6) {
                    if !is_not_found(&e) {
                        errors.push(DatapathError::map(maps::POD_IPS6, e));
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
                            errors.push(DatapathError::map(index::NAME, e));
                        }
                    }
                }
            }
            // The slot stays recorded: keep the index entry that finds it.
            Err(e) => errors.push(DatapathError::map(maps::POD_META, e)),
        }
        DatapathError::collect(errors)
    }
}
