//! Metadata (`azure-imds`) pools: applying a read, slots for new addresses.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aliasnet_ipam_proto::{Lease, MetadataStatus};

use crate::config::{reserved4, reserved6, MAX_METADATA_ADDRESSES};

use super::{pool::Slot, State};
use crate::lease::Addr;

/// What a metadata read changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MetadataChange {
    /// Addresses that became usable.
    pub added: Vec<IpAddr>,
    /// Addresses that left the metadata (free ones left the pool).
    pub removed: Vec<IpAddr>,
    /// Leases whose address left the metadata with this read.
    pub missing: Vec<Lease>,
    /// Addresses listed but refused: (address, why).
    pub refused: Vec<(IpAddr, String)>,
}

/// A metadata pool of either family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaPool {
    V4(usize),
    V6(usize),
}

impl MetadataChange {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

impl State {
    /// A new (absent, free) slot for `addr` in metadata pool `p`.
    pub(super) fn dyn_slot(&mut self, p: usize, addr: u32) -> Option<(usize, u32)> {
        if let Some(found) = self.dynamic.get(&addr) {
            return Some(*found);
        }
        let pool = &mut self.pools[p];
        if pool.addrs.len() >= MAX_METADATA_ADDRESSES {
            return None;
        }
        let idx = pool.addrs.len() as u32;
        pool.addrs.push(addr);
        pool.present.push(false);
        pool.slots.push(Slot::Free);
        pool.free.grow(pool.addrs.len());
        self.dynamic.insert(addr, (p, idx));
        Some((p, idx))
    }

    /// Index of the pool named `name` if it is a metadata pool.
    pub fn metadata_pool(&self, name: &str) -> Option<usize> {
        self.pools
            .iter()
            .position(|p| p.dynamic() && p.spec.name == name)
    }

    /// Index of the IPv6 pool named `name` if it is a metadata pool.
    pub fn metadata_pool6(&self, name: &str) -> Option<usize> {
        self.pools6
            .iter()
            .position(|p| p.dynamic() && p.spec.name == name)
    }

    /// The metadata pool named `name`, of either family.
    pub fn metadata_target(&self, name: &str) -> Option<MetaPool> {
        self.metadata_pool(name)
            .map(MetaPool::V4)
            .or_else(|| self.metadata_pool6(name).map(MetaPool::V6))
    }

    /// Record the outcome of a metadata attempt (for Stats).
    pub fn set_metadata_status(&mut self, pool: MetaPool, f: impl FnOnce(&mut MetadataStatus)) {
        let m = match pool {
            MetaPool::V4(p) => self.pools.get_mut(p).and_then(|p| p.metadata.as_mut()),
            MetaPool::V6(q) => self.pools6.get_mut(q).and_then(|p| p.metadata.as_mut()),
        };
        if let Some(m) = m {
            f(m);
        }
    }

    /// Apply a complete, successful read to metadata pool `pool`: the secondaries of its
    /// family are taken from `v4` or `v6`.
    pub fn apply_metadata_read(
        &mut self,
        pool: MetaPool,
        v4: &[Ipv4Addr],
        v6: &[Ipv6Addr],
        now_ms: u64,
    ) -> MetadataChange {
        match pool {
            MetaPool::V4(p) => self.apply_metadata(p, v4, now_ms),
            MetaPool::V6(q) => self.apply_metadata6(q, v6, now_ms),
        }
    }

    /// [`State::apply_metadata`] for IPv6 metadata pool `q`: an address newly listed becomes
    /// free (unless leased, cooling or held); one no longer listed leaves the free set, and a
    /// leased one is reported missing and stays with its pod.
    pub fn apply_metadata6(&mut self, q: usize, addrs: &[Ipv6Addr], now_ms: u64) -> MetadataChange {
        self.expire(now_ms);
        let mut change = MetadataChange::default();
        let mut listed: HashSet<u128> = HashSet::with_capacity(addrs.len());
        // Cooling addresses are not free when they appear: they finish their cooldown first.
        let mut cooling: HashSet<u128> = self.pools6[q].cooling.iter().map(|(a, _)| *a).collect();
        for ip in addrs {
            let a = u128::from(*ip);
            if self.pools6[q].spec.is_excluded6(a) || !listed.insert(a) {
                continue;
            }
            if let Some(why) = reserved6(*ip) {
                listed.remove(&a);
                change.refused.push(((*ip).into(), why.to_owned()));
                continue;
            }
            match self.locate6(a) {
                Some(r) if r == q => {}
                Some(r) => {
                    listed.remove(&a);
                    change.refused.push((
                        (*ip).into(),
                        format!("already in pool '{}'", self.pools6[r].spec.name),
                    ));
                    continue;
                }
                None => {
                    let k = self.pools6[q].known.as_ref().map_or(0, |k| k.len());
                    if k >= MAX_METADATA_ADDRESSES {
                        listed.remove(&a);
                        change.refused.push((
                            (*ip).into(),
                            format!("the pool tracks {MAX_METADATA_ADDRESSES} addresses at most"),
                        ));
                        continue;
                    }
                    if self.place_new6(q, a) {
                        cooling.insert(a);
                    }
                }
            }
            let leased = self.leases.by_addr(a).is_some();
            let pool = &mut self.pools6[q];
            let Some(present) = pool.known.as_mut().and_then(|k| k.get_mut(&a)) else {
                continue;
            };
            if *present {
                continue;
            }
            *present = true;
            pool.present_count += 1;
            if leased {
                pool.missing -= 1;
            } else if !cooling.contains(&a) && !pool.held.contains(&a) {
                pool.put(a);
                change.added.push((*ip).into());
            }
        }
        let gone: Vec<u128> = self.pools6[q]
            .known
            .iter()
            .flatten()
            .filter(|(a, p)| **p && !listed.contains(*a))
            .map(|(a, _)| *a)
            .collect();
        for a in gone {
            let pool = &mut self.pools6[q];
            if let Some(p) = pool.known.as_mut().and_then(|k| k.get_mut(&a)) {
                *p = false;
            }
            pool.present_count -= 1;
            change.removed.push(Ipv6Addr::from(a).into());
            if pool.is_free(a) {
                pool.take(a);
            } else if let Some(id) = self.leases.by_addr(a) {
                self.pools6[q].missing += 1;
                change.missing.push(self.lease_of(id));
            }
        }
        self.pools6[q].synced = true;
        change
    }

    /// IPv6 metadata pool `q` learns `a` (absent until the caller marks it): leased if an
    /// orphaned lease holds it, cooling if it was released before a restart (then true).
    fn place_new6(&mut self, q: usize, a: u128) -> bool {
        let name = self.name6(q);
        let lease = self.leases.by_addr(a);
        if let Some(id) = lease {
            self.orphans -= 1;
            self.leases.get_mut(id).pool_name = name;
        }
        let cooled = self.unplaced_cooling.remove(&a);
        let pool = &mut self.pools6[q];
        if let Some(k) = pool.known.as_mut() {
            k.insert(a, false);
        }
        if lease.is_some() {
            pool.leased += 1;
            // Not present until the caller marks it.
            pool.missing += 1;
        } else if let Some(at) = cooled {
            pool.push_cooling(a, at);
            return true;
        }
        false
    }

    /// Apply a complete, successful metadata read of pool `p`: `addrs` are the secondary
    /// addresses it lists (primaries already removed). Addresses inside a static pool, held
    /// by another metadata pool, excluded by the pool's config or reserved (loopback,
    /// link-local, multicast, ...: see `config::reserved`) are refused.
    pub fn apply_metadata(&mut self, p: usize, addrs: &[Ipv4Addr], now_ms: u64) -> MetadataChange {
        self.expire(now_ms);
        let mut change = MetadataChange::default();
        let mut listed: HashSet<u32> = HashSet::with_capacity(addrs.len());
        for ip in addrs {
            let a = u32::from(*ip);
            if !listed.insert(a) {
                continue;
            }
            if self.pools[p].spec.is_excluded(a) {
                listed.remove(&a);
                continue;
            }
            if let Some(why) = reserved4(*ip) {
                listed.remove(&a);
                change.refused.push(((*ip).into(), why.to_owned()));
                continue;
            }
            let slot = match self.locate(Addr::from(a)) {
                Some((q, idx)) if q == p => Some(idx),
                Some((q, _)) => {
                    change.refused.push((
                        (*ip).into(),
                        format!("already in pool '{}'", self.pools[q].spec.name),
                    ));
                    None
                }
                None => match self.dyn_slot(p, a) {
                    Some((_, idx)) => {
                        self.place_new(p, idx, a);
                        Some(idx)
                    }
                    None => {
                        change.refused.push((
                            (*ip).into(),
                            format!("the pool tracks {MAX_METADATA_ADDRESSES} addresses at most"),
                        ));
                        None
                    }
                },
            };
            let Some(idx) = slot else {
                listed.remove(&a);
                continue;
            };
            let pool = &mut self.pools[p];
            if !pool.present[idx as usize] {
                pool.present[idx as usize] = true;
                pool.present_count += 1;
                match pool.slots[idx as usize] {
                    Slot::Free => {
                        pool.free.set_free(idx as usize);
                        change.added.push((*ip).into());
                    }
                    Slot::Leased => pool.missing -= 1,
                    Slot::Cooling | Slot::Held => {}
                }
            }
        }
        for idx in 0..self.pools[p].addrs.len() as u32 {
            let pool = &mut self.pools[p];
            let a = pool.addrs[idx as usize];
            if !pool.present[idx as usize] || listed.contains(&a) {
                continue;
            }
            pool.present[idx as usize] = false;
            pool.present_count -= 1;
            change.removed.push(Ipv4Addr::from(a).into());
            match pool.slots[idx as usize] {
                Slot::Free => {
                    pool.free.take(idx as usize);
                }
                Slot::Leased => {
                    pool.missing += 1;
                    if let Some(id) = self.leases.by_addr(Addr::from(a)) {
                        change.missing.push(self.lease_of(id));
                    }
                }
                Slot::Cooling | Slot::Held => {}
            }
        }
        self.pools[p].synced = true;
        change
    }

    /// A metadata pool's new slot `idx` for `a`: leased if an orphaned lease holds the address
    /// (a lease recorded before the pool knew it), cooling if it was released before a restart.
    fn place_new(&mut self, p: usize, idx: u32, a: u32) {
        if let Some(id) = self.leases.by_addr(Addr::from(a)) {
            self.orphans -= 1;
            self.leases.get_mut(id).pool_name = p as u16;
            let pool = &mut self.pools[p];
            pool.slots[idx as usize] = Slot::Leased;
            pool.leased += 1;
            // Not present until the caller marks it.
            pool.missing += 1;
        } else if let Some(at) = self.unplaced_cooling.remove(&Addr::from(a)) {
            let pool = &mut self.pools[p];
            pool.slots[idx as usize] = Slot::Cooling;
            pool.push_cooling(idx, at);
        }
    }
}
