//! Metadata (`azure-imds`) pools: applying a read, slots for new addresses.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aliasnet_ipam_proto::{Family, Lease, MetadataStatus};

use crate::{
    config::{reserved, MAX_METADATA_ADDRESSES},
    lease::Addr,
};

use super::State;

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

/// A metadata pool and the family of the secondaries it takes from a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaPool {
    pub index: usize,
    pub family: Family,
}

impl MetadataChange {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

impl State {
    /// Index of the pool named `name` if it is a metadata pool.
    pub fn metadata_pool(&self, name: &str) -> Option<usize> {
        self.pools
            .iter()
            .position(|p| p.dynamic() && p.spec.name == name)
    }

    /// The metadata pool named `name`, of either family.
    pub fn metadata_target(&self, name: &str) -> Option<MetaPool> {
        self.metadata_pool(name).map(|index| MetaPool {
            index,
            family: self.pools[index].spec.family,
        })
    }

    /// Record the outcome of a metadata attempt (for Stats).
    pub fn set_metadata_status(&mut self, pool: MetaPool, f: impl FnOnce(&mut MetadataStatus)) {
        if let Some(m) = self
            .pools
            .get_mut(pool.index)
            .and_then(|p| p.metadata.as_mut())
        {
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
        match pool.family {
            Family::Ipv4 => self.apply_metadata(pool.index, v4, now_ms),
            Family::Ipv6 => self.apply_metadata(pool.index, v6, now_ms),
        }
    }

    /// Apply a complete, successful metadata read of pool `p`: `addrs` are the secondary
    /// addresses it lists (primaries already removed). An address newly listed becomes free
    /// (unless leased, cooling or held); one no longer listed leaves the free set, and a
    /// leased one is reported missing and stays with its pod. Addresses inside a static pool,
    /// held by another metadata pool, excluded by the pool's config or reserved (loopback,
    /// link-local, multicast, ...: see `config::reserved`) are refused.
    pub fn apply_metadata<A: Copy + Into<IpAddr>>(
        &mut self,
        p: usize,
        addrs: &[A],
        now_ms: u64,
    ) -> MetadataChange {
        self.expire(now_ms);
        let mut change = MetadataChange::default();
        let mut listed: HashSet<Addr> = HashSet::with_capacity(addrs.len());
        // Cooling addresses are not free when they appear: they finish their cooldown first.
        let mut cooling: HashSet<Addr> = self.pools[p].cooling.iter().map(|(a, _)| *a).collect();
        for ip in addrs {
            let ip: IpAddr = (*ip).into();
            let a = match ip {
                IpAddr::V4(v4) => Addr::from(u32::from(v4)),
                IpAddr::V6(v6) => Addr::from(v6),
            };
            if self.pools[p].spec.is_excluded(a) || !listed.insert(a) {
                continue;
            }
            // Also every address an allocator value cannot name (IPv6 `::/96`).
            if let Some(why) = reserved(ip) {
                listed.remove(&a);
                change.refused.push((ip, why.to_owned()));
                continue;
            }
            match self.locate(a) {
                Some(r) if r == p => {}
                Some(r) => {
                    listed.remove(&a);
                    let why = format!("already in pool '{}'", self.pools[r].spec.name);
                    change.refused.push((ip, why));
                    continue;
                }
                None => {
                    if !self.pools[p].learn(a, MAX_METADATA_ADDRESSES) {
                        listed.remove(&a);
                        let why =
                            format!("the pool tracks {MAX_METADATA_ADDRESSES} addresses at most");
                        change.refused.push((ip, why));
                        continue;
                    }
                    if self.place_new(p, a) {
                        cooling.insert(a);
                    }
                }
            }
            let leased = self.leases.by_addr(a).is_some();
            let pool = &mut self.pools[p];
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
                pool.free.put(a);
                change.added.push(ip);
            }
        }
        let gone: Vec<Addr> = self.pools[p]
            .known
            .iter()
            .flatten()
            .filter(|(a, present)| **present && !listed.contains(*a))
            .map(|(a, _)| *a)
            .collect();
        for a in gone {
            let pool = &mut self.pools[p];
            if let Some(present) = pool.known.as_mut().and_then(|k| k.get_mut(&a)) {
                *present = false;
            }
            pool.present_count -= 1;
            change.removed.push(crate::lease::addr_ip(a));
            if !pool.free.take(a) {
                if let Some(id) = self.leases.by_addr(a) {
                    self.pools[p].missing += 1;
                    change.missing.push(self.lease_of(id));
                }
            }
        }
        self.pools[p].synced = true;
        change
    }

    /// Metadata pool `p` has just learnt `a` (absent until the caller marks it): leased if an
    /// orphaned lease holds it (a lease recorded before the pool knew it), cooling if it was
    /// released before a restart (then true).
    fn place_new(&mut self, p: usize, a: Addr) -> bool {
        let lease = self.leases.by_addr(a);
        if let Some(id) = lease {
            self.orphans -= 1;
            self.leases.get_mut(id).pool_name = p as u16;
        }
        let cooled = self.unplaced_cooling.remove(&a);
        let pool = &mut self.pools[p];
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
}
