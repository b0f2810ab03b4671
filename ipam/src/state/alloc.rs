//! Allocation: eligible pools, reserving an address, and the exhaustion message.

use std::fmt::Write as _;

use aliasnet_ipam_proto::{host_veth_name, AttachmentKey, ErrorKind, Family};

use crate::{
    config::OnOnlyCooling,
    lease::{
        encode_data, encode_key, validate_ifname, validate_key, validate_pod, LeaseEntry,
        LeaseState,
    },
    store::record::{AllocRec, Record},
};

use super::{pool::Slot, AllocRequest, AllocStep, Refusal, State};

/// A family list must be non-empty and name each family once; only IPv4 pools exist.
fn check_families(families: Option<&[Family]>) -> Result<(), Refusal> {
    let Some(list) = families else {
        return Ok(());
    };
    if list.is_empty() {
        return Err(Refusal::bad("families must not be empty".into()));
    }
    for (i, f) in list.iter().enumerate() {
        if list[..i].contains(f) {
            return Err(Refusal::bad(format!("families names {f} twice")));
        }
    }
    if list.contains(&Family::Ipv6) {
        return Err(Refusal::new(
            ErrorKind::PoolExhausted,
            "family ipv6: no pool of this node serves ipv6 addresses",
        ));
    }
    Ok(())
}

impl State {
    pub(super) fn eligible(&self, pool: Option<&str>) -> Result<Vec<usize>, Refusal> {
        match pool {
            None => Ok((0..self.pools.len()).collect()),
            Some(name) => self
                .pools
                .iter()
                .position(|p| p.spec.name == name)
                .map(|i| vec![i])
                .ok_or_else(|| {
                    Refusal::new(
                        ErrorKind::UnknownPool,
                        format!(
                            "no pool named '{name}'; configured pools: {}",
                            self.pools
                                .iter()
                                .map(|p| format!("'{}'", p.spec.name))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                }),
        }
    }

    /// The recovered lease (key unknown) of host veth `veth`, if any.
    fn recovered_of(&self, veth: &str) -> Option<u32> {
        self.recovered.get(veth).copied()
    }

    /// The recovered lease `key` stands for: through `link` (what the plugin names), or the
    /// host veth name the key hashes to.
    pub(super) fn recovered_for(&self, key: &AttachmentKey, link: Option<&str>) -> Option<u32> {
        if self.recovered.is_empty() {
            return None;
        }
        link.and_then(|l| self.recovered_of(l))
            .or_else(|| self.recovered_of(&host_veth_name(&self.veth_prefix, key)))
    }

    /// Reserve an address for `req.key` (pending until committed).
    pub fn begin_allocate(
        &mut self,
        req: AllocRequest<'_>,
        now_ms: u64,
    ) -> Result<AllocStep, Refusal> {
        validate_key(req.key).map_err(Refusal::bad)?;
        validate_pod(req.pod).map_err(Refusal::bad)?;
        if let Some(v) = req.host_veth {
            validate_ifname("host_veth", v).map_err(Refusal::bad)?;
            // The only link this lease may ever have deleted: the plugin's name for the key.
            let own = host_veth_name(&self.veth_prefix, req.key);
            if v != own {
                return Err(Refusal::bad(format!(
                    "host_veth {v} is not the host veth of {} (expected {own}: host_veth_prefix \
                     \"{}\" + a hash of the key; do the plugin's hostVethPrefix and the daemon's \
                     host_veth_prefix match?)",
                    req.key, self.veth_prefix
                )));
            }
        }
        check_families(req.families)?;
        let eligible = self.eligible(req.pool)?;
        let key = encode_key(req.key);
        if let Some(id) = self.leases.find(&key) {
            let e = self.leases.get_mut(id);
            if e.state != LeaseState::Committed {
                return Ok(AllocStep::Wait(format!(
                    "a change to {} is in flight",
                    req.key
                )));
            }
            e.seen = true;
            return Ok(AllocStep::Existing(self.lease_of(id)));
        }
        if let Some(v) = req.host_veth {
            if self.teardowns.contains_key(v) {
                return Ok(AllocStep::Wait(format!(
                    "host veth {v} of a previous attachment is still being deleted"
                )));
            }
        }
        self.expire(now_ms);

        let mut chosen = None;
        for &p in &eligible {
            if let Some(idx) = self.pools[p].free.take_next() {
                chosen = Some((p, idx as u32));
                break;
            }
        }
        if chosen.is_none() {
            if eligible.iter().any(|&p| self.pools[p].held > 0) {
                // These become free as soon as their old veth is gone: milliseconds.
                return Ok(AllocStep::Wait(
                    "the only reusable addresses wait for their old host veth to be deleted".into(),
                ));
            }
            if self.policy == OnOnlyCooling::ReuseOldest {
                chosen = self.take_oldest_cooling(&eligible);
            }
        }
        let Some((p, idx)) = chosen else {
            return Err(self.exhausted(&eligible, now_ms));
        };

        let pool = &mut self.pools[p];
        pool.slots[idx as usize] = Slot::Leased;
        pool.leased += 1;
        let addr = pool.addr_of(idx);
        let (data, key_len) = encode_data(req.key, req.pod, req.host_veth);
        let entry = LeaseEntry {
            data: data.clone(),
            allocated_at_ms: now_ms,
            addr,
            key_len,
            pool_name: p as u16,
            state: LeaseState::PendingAlloc,
            seen: false,
        };
        let pool_name: Box<str> = pool.spec.name.as_str().into();
        let lease = entry.to_lease(&pool_name);
        let record = Record::Alloc(AllocRec {
            data,
            key_len,
            addr,
            allocated_at_ms: now_ms,
            pool: pool_name,
        });
        self.leases
            .insert(entry)
            .expect("the key holds no lease and the address was free");
        Ok(AllocStep::Fresh { lease, record })
    }

    /// `reuse-oldest`: the cooling address released longest ago among `eligible` (not held,
    /// still present).
    fn take_oldest_cooling(&mut self, eligible: &[usize]) -> Option<(usize, u32)> {
        let mut best: Option<(u64, usize, usize)> = None;
        for &p in eligible {
            let pool = &self.pools[p];
            // Held links are deleted within milliseconds, so a held entry is rarely far in.
            if let Some((pos, &(_, at))) = pool.cooling.iter().enumerate().find(|(_, (idx, _))| {
                pool.is_present(*idx) && !self.holds.contains_key(&pool.addr_of(*idx))
            }) {
                if best.is_none_or(|(t, _, _)| at < t) {
                    best = Some((at, p, pos));
                }
            }
        }
        let (_, p, pos) = best?;
        let (idx, at) = self.pools[p].cooling.remove(pos)?;
        self.reused.insert(self.pools[p].addr_of(idx), at);
        Some((p, idx))
    }

    pub(super) fn exhausted(&self, eligible: &[usize], now_ms: u64) -> Refusal {
        let cooling: usize = eligible
            .iter()
            .map(|&p| self.pools[p].cooling_count())
            .sum();
        let unsynced = eligible
            .iter()
            .any(|&p| self.pools[p].dynamic() && !self.pools[p].synced);
        let mut msg = eligible
            .iter()
            .map(|&p| self.pools[p].usage(self.cooldown, now_ms))
            .collect::<Vec<_>>()
            .join("; ");
        if unsynced {
            msg.push_str(". Retry once the metadata has been read");
            // A pool still waiting for its first read may have addresses any moment.
            Refusal::new(ErrorKind::Unavailable, msg)
        } else if cooling > 0 {
            let _ = write!(
                msg,
                ". The {cooling} cooling addresses were released less than {}s ago and are kept \
                 unused so no stale connection reaches a new pod (on_only_cooling = \"fail\"); \
                 set on_only_cooling = \"reuse-oldest\" to reuse them early, or add addresses",
                self.cooldown.as_secs()
            );
            Refusal::new(ErrorKind::OnlyCooling, msg)
        } else {
            msg.push_str(". Release unused attachments (GC) or add addresses to the pool");
            Refusal::new(ErrorKind::PoolExhausted, msg)
        }
    }
}
