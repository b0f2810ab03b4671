//! Read-only views: checks, lease listings, per-pool stats, counts and status.

use aliasnet_ipam_proto::{AttachmentKey, ErrorKind, Family, Lease, PoolStats};

use crate::{
    config::OnOnlyCooling,
    lease::{encode_key, validate_key, Addr, LeaseEntry, LeaseState},
};

use super::{ms, Refusal, State};

/// Per-pool numbers for metrics, all read in one pass under the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCounts {
    pub name: String,
    pub size: u64,
    /// Leased and present.
    pub allocated: u64,
    /// Cooling, not counting `pending_teardown`.
    pub cooling: u64,
    pub pending_teardown: u64,
    pub free: u64,
    pub missing: u64,
}

impl State {
    /// The acknowledged leases of `key`, IPv4 first (or the recovered lease of its host
    /// veth). A change still in flight is not visible.
    pub fn check(&self, key: &AttachmentKey) -> Result<Vec<Lease>, Refusal> {
        validate_key(key).map_err(Refusal::bad)?;
        let mut ids: Vec<u32> = self.leases.find_all(&encode_key(key)).collect();
        if ids.is_empty() {
            ids.extend(self.recovered_for(key, None));
        }
        Ok(ids
            .into_iter()
            .filter(|id| self.leases.get(*id).state != LeaseState::PendingAlloc)
            .map(|id| self.lease_of(id))
            .collect())
    }

    /// Every acknowledged lease, by address.
    pub fn list(&self) -> Vec<Lease> {
        self.leases
            .after_addr(None)
            .filter(|(_, id)| self.leases.get(*id).state != LeaseState::PendingAlloc)
            .map(|(_, id)| self.lease_of(id))
            .collect()
    }

    /// Acknowledged leases with an address above `after`, at most `limit` and at most about
    /// `max_bytes` of JSON; and the address to continue after, if more may follow.
    pub fn list_page(
        &self,
        after: Option<Addr>,
        limit: usize,
        max_bytes: usize,
    ) -> (Vec<Lease>, Option<Addr>) {
        let mut out = Vec::with_capacity(limit.min(self.leases.len()));
        let mut bytes = 0;
        let mut last = None;
        for (addr, id) in self.leases.after_addr(after) {
            let e = self.leases.get(id);
            if e.state == LeaseState::PendingAlloc {
                continue;
            }
            let size = e.json_size_hint();
            if out.len() >= limit || (bytes + size > max_bytes && !out.is_empty()) {
                return (out, last);
            }
            bytes += size;
            out.push(self.lease_of(id));
            last = Some(addr);
        }
        (out, None)
    }

    /// Visit acknowledged leases by address above `after`, at most `limit` of them (bounded
    /// work under the lock); returns where to continue, `None` at the end.
    pub fn scan_leases(
        &self,
        after: Option<Addr>,
        limit: usize,
        mut f: impl FnMut(Addr, &LeaseEntry),
    ) -> Option<Addr> {
        let mut last = None;
        for (scanned, (addr, id)) in self.leases.after_addr(after).enumerate() {
            if scanned >= limit {
                return last;
            }
            last = Some(addr);
            let e = self.leases.get(id);
            if e.state != LeaseState::PendingAlloc {
                f(addr, e);
            }
        }
        None
    }

    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// Names of the configured pools (only the metadata ones with `metadata_only`).
    pub fn pool_names(&self, metadata_only: bool) -> Vec<String> {
        self.pools
            .iter()
            .filter(|p| !metadata_only || p.dynamic())
            .map(|p| p.spec.name.clone())
            .collect()
    }

    pub fn cooldown_ms(&self) -> u64 {
        ms(self.cooldown)
    }

    /// Whether any lease was rebuilt by `recover` (key unknown).
    pub fn has_recovered(&self) -> bool {
        !self.recovered.is_empty()
    }

    pub fn orphan_count(&self) -> usize {
        self.orphans
    }

    pub fn veth_prefix(&self) -> &str {
        &self.veth_prefix
    }

    /// Links waiting to be deleted.
    pub fn pending_teardowns(&self) -> Vec<Box<str>> {
        self.teardowns.keys().cloned().collect()
    }

    pub fn stats(&mut self, now_ms: u64) -> Vec<PoolStats> {
        self.expire(now_ms);
        self.pools
            .iter()
            .map(|p| PoolStats {
                name: p.spec.name.clone(),
                family: p.spec.family,
                source: p.spec.source.to_string(),
                total: p.size(),
                allocated: p.leased as u64,
                cooling: p.cooling_count() as u64,
                free: p.free.count(),
                pending_teardown: p.held.len() as u64,
                missing: p.reported_missing() as u64,
                metadata: p.metadata.clone(),
            })
            .collect()
    }

    /// Disjoint per-state counts of every pool (metrics).
    pub fn counts(&mut self, now_ms: u64) -> Vec<PoolCounts> {
        self.expire(now_ms);
        self.pools
            .iter()
            .map(|p| PoolCounts {
                name: p.spec.name.clone(),
                size: p.size(),
                allocated: (p.leased - p.reported_missing()) as u64,
                cooling: p.cooling.len() as u64,
                pending_teardown: p.held.len() as u64,
                free: p.free.count(),
                missing: p.reported_missing() as u64,
            })
            .collect()
    }

    /// Could an Allocate (restricted to `pool`, asking for `families`) succeed now?
    /// (ready, free, reason)
    pub fn status(
        &mut self,
        pool: Option<&str>,
        families: Option<&[Family]>,
        now_ms: u64,
    ) -> Result<(bool, u64, Option<String>), Refusal> {
        // Without a family list every family served must be able to give an address (what an
        // Allocate without one asks for); with one, exactly the listed families, each from the
        // pools an Allocate would use. `free` is the smallest per-family count.
        let eligible: [Option<Vec<usize>>; 2] = match families {
            None => {
                let e4 = self.eligible(pool, Family::Ipv4)?;
                let e6 = self.eligible(pool, Family::Ipv6)?;
                [
                    (!e4.is_empty() || e6.is_empty()).then_some(e4),
                    (!e6.is_empty()).then_some(e6),
                ]
            }
            Some(list) => {
                let wanted = match self.wanted(Some(list)) {
                    Ok(w) => w,
                    // A family no pool serves: never ready, as Allocate would refuse.
                    Err(r) if r.kind == ErrorKind::PoolExhausted => {
                        return Ok((false, 0, Some(r.message)))
                    }
                    Err(r) => return Err(r),
                };
                let pick = |f: Family| -> Result<Option<Vec<usize>>, Refusal> {
                    if wanted.contains(&f) {
                        self.eligible_in(pool, f).map(Some)
                    } else {
                        Ok(None)
                    }
                };
                [pick(Family::Ipv4)?, pick(Family::Ipv6)?]
            }
        };
        self.expire(now_ms);
        let reuse = self.policy == OnOnlyCooling::ReuseOldest;
        let mut families: Vec<(u64, bool, Refusal)> = Vec::with_capacity(2);
        for (family, eligible) in Family::ALL.into_iter().zip(eligible) {
            let Some(eligible) = eligible else { continue };
            let free = eligible
                .iter()
                .fold(0u64, |n, &p| n.saturating_add(self.pools[p].free.count()));
            let soon = eligible.iter().any(|&p| {
                let pl = &self.pools[p];
                !pl.held.is_empty() || (reuse && pl.cooling.iter().any(|(a, _)| pl.is_present(*a)))
            });
            let mut r = self.exhausted(&eligible, now_ms);
            if family == Family::Ipv6 {
                r.message = format!("family ipv6: {}", r.message);
            }
            families.push((free, soon, r));
        }
        let free = families.iter().map(|(f, _, _)| *f).min().unwrap_or(0);
        match families.into_iter().find(|(f, soon, _)| *f == 0 && !soon) {
            None => Ok((true, free, None)),
            Some((_, _, r)) => Ok((false, 0, Some(r.message))),
        }
    }
}
