//! Releases: by key, by lease, stale (reconcile) and GC.

use std::collections::HashSet;

use aliasnet_ipam_proto::{
    host_veth_name, is_host_veth_name, Attachment, AttachmentKey, Lease, RECOVERED_NETWORK,
};

use crate::{
    lease::{addr_ip, encode_key, validate_ifname, validate_key, Addr, LeaseState},
    store::record::{Record, ReleaseRec},
};

use super::{Refusal, ReleaseStep, State, WaitReason};

impl State {
    /// Start releasing `key`. `teardown` is a host link to delete once the release is durable.
    /// With `not_after` (a spool entry's time), a lease allocated later than that is newer than
    /// the DEL that spooled it and is left alone. A key that holds nothing releases the
    /// recovered lease (see [`RECOVERED_NETWORK`]) of its host veth, if there is one.
    pub fn begin_release(
        &mut self,
        key: &AttachmentKey,
        teardown: Option<&str>,
        not_after: Option<u64>,
        now_ms: u64,
    ) -> Result<ReleaseStep, Refusal> {
        self.begin_release_of(key, teardown, not_after, None, now_ms)
    }

    /// [`State::begin_release`] of the lease `lease` (address, allocation time) only: if `key`
    /// now holds another lease (released and allocated again since), nothing is released.
    pub fn begin_release_of(
        &mut self,
        key: &AttachmentKey,
        teardown: Option<&str>,
        not_after: Option<u64>,
        lease: Option<(Addr, u64)>,
        now_ms: u64,
    ) -> Result<ReleaseStep, Refusal> {
        validate_key(key).map_err(Refusal::bad)?;
        if let Some(v) = teardown {
            validate_ifname("teardown_link", v).map_err(Refusal::bad)?;
        }
        let released_at_ms = not_after.map_or(now_ms, |t| t.min(now_ms));
        let mut ids: Vec<u32> = self.leases.find_all(&encode_key(key)).collect();
        if ids.is_empty() {
            // A recovered lease is the attachment as it was when the kernel was read: a DEL
            // naming its veth is about it, whenever it was spooled.
            ids.extend(self.recovered_for(key, teardown));
        } else if let Some(t) = not_after {
            ids.retain(|id| self.leases.get(*id).allocated_at_ms <= t);
        }
        if let Some((addr, at)) = lease {
            // The leases of that Allocate, if the address is one of them.
            if !ids.iter().any(|id| {
                let e = self.leases.get(*id);
                (e.addr, e.allocated_at_ms) == (addr, at)
            }) {
                return Ok(ReleaseStep::NotFound { teardown: None });
            }
            ids.retain(|id| self.leases.get(*id).allocated_at_ms == at);
        }
        // No lease, no link deleted: the name alone proves nothing about whose link it is.
        if ids.is_empty() {
            return Ok(ReleaseStep::NotFound { teardown: None });
        }
        if let Some(id) = ids
            .iter()
            .copied()
            .find(|id| self.leases.get(*id).state != LeaseState::Committed)
        {
            let _ = id;
            return Ok(ReleaseStep::Wait(WaitReason::InFlight { key: key.clone() }));
        }
        for &id in &ids {
            let Some(l) = teardown else { break };
            if !self.link_is_leases(id, l) {
                return Err(Refusal::bad(format!(
                    "teardown_link {l} is not the host veth recorded for {key}'s lease{}; \
                     nothing was released or deleted",
                    match self.leases.get(id).host_veth() {
                        Some(v) => format!(" ({v})"),
                        None => String::new(),
                    }
                )));
            }
        }
        let mut records = Vec::with_capacity(ids.len());
        let mut pools = Vec::with_capacity(ids.len());
        let mut address = None;
        for id in ids {
            let ReleaseStep::Fresh {
                records: r,
                address: a,
                pools: p,
            } = self.release_id(id, teardown, released_at_ms, key)?
            else {
                unreachable!("every lease was checked to be committed");
            };
            address.get_or_insert(a);
            records.extend(r);
            pools.extend(p);
        }
        Ok(ReleaseStep::Fresh {
            records,
            address: address.expect("at least one lease"),
            pools,
        })
    }

    /// Whether `link` is lease `id`'s own host veth: named like ours, and the one recorded for
    /// it (or, for a lease recorded without one, the name its key hashes to).
    fn link_is_leases(&self, id: u32, link: &str) -> bool {
        if !is_host_veth_name(link, &self.veth_prefix) {
            return false;
        }
        let e = self.leases.get(id);
        match e.host_veth() {
            Some(v) => v == link,
            None => host_veth_name(&self.veth_prefix, &e.attachment_key()) == link,
        }
    }

    fn release_id(
        &mut self,
        id: u32,
        teardown: Option<&str>,
        released_at_ms: u64,
        key: &AttachmentKey,
    ) -> Result<ReleaseStep, Refusal> {
        let pool = self.pool_name(self.leases.get(id)).to_owned();
        let e = self.leases.get_mut(id);
        if e.state != LeaseState::Committed {
            return Ok(ReleaseStep::Wait(WaitReason::InFlight { key: key.clone() }));
        }
        e.state = LeaseState::PendingRelease;
        // A recovered lease's own veth is the link to delete when the caller names none.
        let prefix = &self.veth_prefix;
        let teardown = teardown.map(Box::<str>::from).or_else(|| {
            e.network_is(RECOVERED_NETWORK)
                .then(|| {
                    e.host_veth()
                        .filter(|v| is_host_veth_name(v, prefix))
                        .map(Into::into)
                })
                .flatten()
        });
        Ok(ReleaseStep::Fresh {
            address: addr_ip(e.addr),
            records: vec![Record::Release(ReleaseRec {
                key: e.key().into(),
                addr: e.addr,
                released_at_ms,
                teardown,
            })],
            pools: vec![pool],
        })
    }

    /// Start releasing the lease at `addr` if it is still the one allocated at
    /// `allocated_at_ms` (reconcile: its veth is gone). `None` if it changed meanwhile.
    pub fn begin_release_stale(
        &mut self,
        addr: Addr,
        allocated_at_ms: u64,
        now_ms: u64,
    ) -> Option<ReleaseStep> {
        let id = self.leases.by_addr(addr)?;
        let e = self.leases.get(id);
        if e.allocated_at_ms != allocated_at_ms || e.state != LeaseState::Committed {
            return None;
        }
        let key = e.attachment_key();
        self.release_id(id, None, now_ms, &key).ok()
    }

    /// Start releasing every committed lease of `network` not in `valid`. Their host veths
    /// are deleted once the releases are durable. Recovered leases (network unknown) are
    /// released too when no valid attachment hashes to their veth and `veth_gone` says the
    /// veth no longer exists (with several networks on a node, a recovered lease may belong
    /// to another one: its veth is the only safe evidence).
    pub fn begin_gc(
        &mut self,
        network: &str,
        valid: &[Attachment],
        now_ms: u64,
        veth_gone: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<(Record, Lease)>, Refusal> {
        if network.is_empty() {
            return Err(Refusal::bad("gc: network must not be empty"));
        }
        if network == RECOVERED_NETWORK {
            return Err(Refusal::bad(format!(
                "gc of the internal network {RECOVERED_NETWORK} is refused: its leases are \
                 released by the DEL of their real key, or once their veth is gone"
            )));
        }
        // A lease this young may belong to an ADD still running (or just done) that the
        // runtime's list does not name yet.
        let settled = |at: u64| now_ms.saturating_sub(at) >= self.gc_grace_ms;
        let valid_set: HashSet<(&str, &str)> = valid
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        let mut stale: Vec<u32> = Vec::new();
        for (id, e) in self.leases.iter() {
            if e.state != LeaseState::Committed
                || !e.network_is(network)
                || !settled(e.allocated_at_ms)
            {
                continue;
            }
            let k = e.attachment_key();
            if !valid_set.contains(&(k.container_id.as_str(), k.ifname.as_str())) {
                stale.push(id);
            }
        }
        if !self.recovered.is_empty() {
            let valid_veths: HashSet<String> = valid
                .iter()
                .map(|a| {
                    host_veth_name(
                        &self.veth_prefix,
                        &AttachmentKey::new(network, &a.container_id, &a.ifname),
                    )
                })
                .collect();
            for (veth, ids) in &self.recovered {
                for id in ids {
                    if self.leases.get(*id).state == LeaseState::Committed
                        && settled(self.leases.get(*id).allocated_at_ms)
                        && !valid_veths.contains(&**veth)
                        && veth_gone(veth)
                    {
                        stale.push(*id);
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(stale.len());
        for id in stale {
            let lease = self.lease_of(id);
            let e = self.leases.get_mut(id);
            e.state = LeaseState::PendingRelease;
            let record = Record::Release(ReleaseRec {
                key: e.key().into(),
                addr: e.addr,
                released_at_ms: now_ms,
                teardown: e
                    .host_veth()
                    .filter(|v| is_host_veth_name(v, &self.veth_prefix))
                    .map(Into::into),
            });
            out.push((record, lease));
        }
        Ok(out)
    }
}
