//! Allocation: eligible pools, reserving an address, and the exhaustion message.

use std::fmt::Write as _;

use aliasnet_ipam_proto::{host_veth_name, AttachmentKey, ErrorKind, Family};

use crate::{
    config::OnOnlyCooling,
    lease::{
        encode_data, encode_key, validate_ifname, validate_key, validate_pod, Addr, LeaseEntry,
        LeaseState,
    },
    store::record::{AllocRec, Record},
};

use super::{AllocRequest, AllocStep, Refusal, State, WaitReason};

/// A family list must be non-empty and name each family once.
fn check_families(families: Option<&[Family]>) -> Result<(), Refusal> {
    let Some(list) = families else {
        return Ok(());
    };
    if list.is_empty() {
        return Err(Refusal::bad("families must not be empty"));
    }
    for (i, f) in list.iter().enumerate() {
        if list[..i].contains(f) {
            return Err(Refusal::bad(format!("families names {f} twice")));
        }
    }
    Ok(())
}

/// An address reserved for one family, to undo it if another family fails.
#[derive(Debug, Clone, Copy)]
struct Taken {
    pool: usize,
    addr: Addr,
    /// The release time of a cooling address reused early (`reuse-oldest`).
    reused: Option<u64>,
}

impl State {
    /// Pools of `family` an Allocate may use: a named pool restricts its own family only.
    pub(super) fn eligible_in(
        &self,
        pool: Option<&str>,
        family: Family,
    ) -> Result<Vec<usize>, Refusal> {
        if let Some(name) = pool {
            let Some(p) = self.pools.iter().position(|p| p.spec.name == name) else {
                return Err(self.unknown_pool(name));
            };
            if self.pools[p].spec.family == family {
                return Ok(vec![p]);
            }
        }
        Ok(self.of_family(family).collect())
    }

    /// Indices of the pools of `family`.
    fn of_family(&self, family: Family) -> impl Iterator<Item = usize> + '_ {
        (0..self.pools.len()).filter(move |p| self.pools[*p].spec.family == family)
    }

    fn unknown_pool(&self, name: &str) -> Refusal {
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
    }

    /// Pools of `family` a Status may count (`pool` restricts to that pool; a pool of the
    /// other family leaves none).
    pub(super) fn eligible(
        &self,
        pool: Option<&str>,
        family: Family,
    ) -> Result<Vec<usize>, Refusal> {
        match pool {
            Some(name)
                if self
                    .pools
                    .iter()
                    .any(|p| p.spec.name == name && p.spec.family != family) =>
            {
                Ok(Vec::new())
            }
            _ => self.eligible_in(pool, family),
        }
    }

    /// The families an Allocate wants: the listed ones, or every family a pool serves.
    pub(super) fn wanted(&self, families: Option<&[Family]>) -> Result<Vec<Family>, Refusal> {
        check_families(families)?;
        let served = |f: Family| self.of_family(f).next().is_some();
        match families {
            None => Ok(Family::ALL.into_iter().filter(|f| served(*f)).collect()),
            Some(list) => {
                if let Some(f) = list.iter().find(|f| !served(**f)) {
                    return Err(Refusal::new(
                        ErrorKind::PoolExhausted,
                        format!("family {f}: no pool of this node serves {f} addresses"),
                    ));
                }
                let mut v = list.to_vec();
                v.sort();
                Ok(v)
            }
        }
    }

    /// The recovered leases (key unknown, one per family) of host veth `veth`, if any.
    fn recovered_of(&self, veth: &str) -> Option<&[u32]> {
        self.recovered.get(veth).map(Vec::as_slice)
    }

    /// The recovered leases `key` stands for (IPv4 first): through `link` (what the plugin
    /// names), or the host veth name the key hashes to.
    pub(super) fn recovered_for(&self, key: &AttachmentKey, link: Option<&str>) -> Vec<u32> {
        if self.recovered.is_empty() {
            return Vec::new();
        }
        link.and_then(|l| self.recovered_of(l))
            .or_else(|| self.recovered_of(&host_veth_name(&self.veth_prefix, key)))
            .map(<[u32]>::to_vec)
            .unwrap_or_default()
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
        let wanted = self.wanted(req.families)?;
        let eligible: Vec<Vec<usize>> = wanted
            .iter()
            .map(|f| self.eligible_in(req.pool, *f))
            .collect::<Result<_, _>>()?;
        let key = encode_key(req.key);
        let held: Vec<u32> = self.leases.find_all(&key).collect();
        if !held.is_empty() {
            if held
                .iter()
                .any(|id| self.leases.get(*id).state != LeaseState::Committed)
            {
                return Ok(AllocStep::Wait(WaitReason::InFlight {
                    key: req.key.clone(),
                }));
            }
            // An idempotent repeat: the leases the key holds (of the families asked for,
            // when they are listed).
            let listed = req.families.is_some();
            let ids: Vec<u32> = held
                .into_iter()
                .filter(|id| !listed || wanted.contains(&self.leases.get(*id).family()))
                .collect();
            let has = |f: Family| ids.iter().any(|id| self.leases.get(*id).family() == f);
            if let Some(f) = wanted.iter().find(|f| listed && !has(**f)) {
                return Err(Refusal::bad(format!(
                    "{} already holds leases without {f}; release them before allocating {}",
                    req.key,
                    wanted
                        .iter()
                        .map(|f| f.as_str())
                        .collect::<Vec<_>>()
                        .join("+")
                )));
            }
            for &id in &ids {
                self.leases.get_mut(id).seen = true;
            }
            return Ok(AllocStep::Existing(
                ids.into_iter().map(|id| self.lease_of(id)).collect(),
            ));
        }
        if let Some(v) = req.host_veth {
            if self.teardowns.contains_key(v) {
                return Ok(AllocStep::Wait(WaitReason::VethBeingDeleted {
                    veth: v.to_owned(),
                }));
            }
        }
        self.expire(now_ms);

        // Reserve one address per family; a failure puts back what was taken.
        let mut taken: Vec<Taken> = Vec::with_capacity(wanted.len());
        for (f, el) in wanted.iter().zip(&eligible) {
            let failed = match self.take(el, now_ms) {
                Ok(Ok(t)) => {
                    taken.push(t);
                    continue;
                }
                Ok(Err(why)) => Ok(AllocStep::Wait(why)),
                Err(mut r) => {
                    if wanted.len() > 1 || *f == Family::Ipv6 {
                        r.message = format!("family {f}: {}", r.message);
                    }
                    Err(r)
                }
            };
            for t in taken.into_iter().rev() {
                self.untake(t);
            }
            return failed;
        }

        let (data, key_len) = encode_data(req.key, req.pod, req.host_veth);
        let mut leases = Vec::with_capacity(taken.len());
        let mut records = Vec::with_capacity(taken.len());
        for Taken { pool, addr, .. } in taken {
            let pool_name = pool as u16;
            let entry = LeaseEntry {
                data: data.clone(),
                allocated_at_ms: now_ms,
                addr,
                key_len,
                pool_name,
                state: LeaseState::PendingAlloc,
                seen: false,
            };
            let name: Box<str> = self.names[usize::from(pool_name)].clone();
            leases.push(entry.to_lease(&name));
            records.push(Record::Alloc(AllocRec {
                data: data.clone(),
                key_len,
                addr,
                allocated_at_ms: now_ms,
                pool: name,
            }));
            self.leases
                .insert(entry)
                .expect("the key holds no lease and the address was free");
        }
        Ok(AllocStep::Fresh { leases, records })
    }

    /// Reserve an address in one of `eligible` (pools of one family); `Ok(Err(why))`: wait
    /// and retry.
    fn take(
        &mut self,
        eligible: &[usize],
        now_ms: u64,
    ) -> Result<Result<Taken, WaitReason>, Refusal> {
        for &p in eligible {
            if let Some(addr) = self.pools[p].free.take_next() {
                self.pools[p].leased += 1;
                return Ok(Ok(Taken {
                    pool: p,
                    addr,
                    reused: None,
                }));
            }
        }
        if eligible.iter().any(|&p| !self.pools[p].held.is_empty()) {
            // These become free as soon as their old veth is gone: milliseconds.
            return Ok(Err(WaitReason::OnlyHeldAddresses));
        }
        if self.policy == OnOnlyCooling::ReuseOldest {
            if let Some(t) = self.take_oldest_cooling(eligible) {
                return Ok(Ok(t));
            }
        }
        Err(self.exhausted(eligible, now_ms))
    }

    /// Put back an address reserved by [`State::take`].
    fn untake(&mut self, t: Taken) {
        let pool = &mut self.pools[t.pool];
        pool.leased -= 1;
        match t.reused {
            Some(at) => {
                self.reused.remove(&t.addr);
                pool.push_cooling(t.addr, at);
            }
            None => pool.make_free(t.addr),
        }
    }

    /// `reuse-oldest`: the cooling address released longest ago among `eligible` (not held,
    /// still present).
    fn take_oldest_cooling(&mut self, eligible: &[usize]) -> Option<Taken> {
        let mut best: Option<(u64, usize, usize)> = None;
        for &p in eligible {
            let pool = &self.pools[p];
            // Held links are deleted within milliseconds, so a held entry is rarely far in.
            if let Some((pos, &(_, at))) = pool
                .cooling
                .iter()
                .enumerate()
                .find(|(_, (a, _))| pool.is_present(*a) && !self.holds.contains_key(a))
            {
                if best.is_none_or(|(t, _, _)| at < t) {
                    best = Some((at, p, pos));
                }
            }
        }
        let (_, p, pos) = best?;
        let (addr, at) = self.pools[p].cooling.remove(pos)?;
        self.pools[p].leased += 1;
        self.reused.insert(addr, at);
        Some(Taken {
            pool: p,
            addr,
            reused: Some(at),
        })
    }

    /// The refusal when none of `eligible` (pools of one family) has a free address.
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
