//! Metadata (`azure-imds`) pools: applying a read, slots for new addresses.

use std::{collections::HashSet, net::Ipv4Addr};

use aliasnet_ipam_proto::{Lease, MetadataStatus};

use crate::config::MAX_METADATA_ADDRESSES;

use super::{pool::Slot, State};
use crate::lease::Addr;

/// What a metadata read changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MetadataChange {
    /// Addresses that became usable.
    pub added: Vec<Ipv4Addr>,
    /// Addresses that left the metadata (free ones left the pool).
    pub removed: Vec<Ipv4Addr>,
    /// Leases whose address left the metadata with this read.
    pub missing: Vec<Lease>,
    /// Addresses listed but refused: (address, why).
    pub refused: Vec<(Ipv4Addr, String)>,
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

    /// Record the outcome of a metadata attempt (for Stats).
    pub fn set_metadata_status(&mut self, pool: usize, f: impl FnOnce(&mut MetadataStatus)) {
        if let Some(m) = self.pools.get_mut(pool).and_then(|p| p.metadata.as_mut()) {
            f(m);
        }
    }

    /// Apply a complete, successful metadata read of pool `p`: `addrs` are the secondary
    /// addresses it lists (primaries already removed). Addresses inside a static pool, held
    /// by another metadata pool or excluded by the pool's config are refused.
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
            let slot = match self.locate(Addr::from(a)) {
                Some((q, idx)) if q == p => Some(idx),
                Some((q, _)) => {
                    change.refused.push((
                        *ip,
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
                            *ip,
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
                        change.added.push(*ip);
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
            change.removed.push(Ipv4Addr::from(a));
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
