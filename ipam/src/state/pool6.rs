//! An IPv6 pool: free addresses kept as intervals, so a /64 costs what its leases cost.
//!
//! An IPv4 pool has a slot per address (a bitmap and a state byte); a delegated IPv6 prefix
//! has up to 2^64 addresses and is never enumerated. Its free addresses are a set of disjoint
//! intervals, first the configured ranges minus exclusions; an allocation splits an interval,
//! an address whose cooldown ended is merged back. Memory is bounded by the leased and cooling
//! addresses (each can split one interval), every operation is O(log n), and a restart lays
//! the loaded leases and cooling addresses over the ranges in O(n log n) without a scan of the
//! prefix. Addresses are handed out round-robin from a moving start, as IPv4 slots are, so a
//! released address is reused as late as possible.
//!
//! An IPv6 metadata pool (`azure-imds` with `family = "ipv6"`) has no ranges: it knows each
//! address it has seen listed and whether the last good read lists it (*present*). As in an
//! IPv4 metadata pool, an address is in the free set exactly when it is free and present.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    net::Ipv6Addr,
    time::Duration,
};

use aliasnet_ipam_proto::MetadataStatus;

use super::pool::Usage;
use crate::config::PoolSpec;

pub(super) struct Pool6 {
    pub(super) spec: PoolSpec,
    /// Free, reusable addresses: first -> last of disjoint, non-adjacent intervals.
    free: BTreeMap<u128, u128>,
    /// Addresses in `free` (saturating).
    free_count: u128,
    /// Where the search for the next address starts.
    next: u128,
    /// (address, release time in ms), oldest first.
    pub(super) cooling: VecDeque<(u128, u64)>,
    /// Cooldown over, but a host link that routed the address is still being deleted.
    pub(super) held: HashSet<u128>,
    pub(super) leased: usize,
    /// Metadata pools: every address seen listed -> whether the last good read lists it.
    pub(super) known: Option<BTreeMap<u128, bool>>,
    /// Present addresses (metadata pools).
    pub(super) present_count: usize,
    /// Leased addresses that are not present (metadata pools).
    pub(super) missing: usize,
    /// A metadata read has been applied (metadata pools); until then the pool has no address.
    pub(super) synced: bool,
    pub(super) metadata: Option<MetadataStatus>,
}

impl Pool6 {
    pub(super) fn new(spec: PoolSpec) -> Self {
        let free: BTreeMap<u128, u128> = spec.ranges6.iter().map(|r| (r.first, r.last)).collect();
        let free_count = spec
            .ranges6
            .iter()
            .fold(0u128, |n, r| n.saturating_add(r.len()));
        let next = spec.ranges6.first().map_or(0, |r| r.first);
        let dynamic = spec.source.is_dynamic();
        let metadata = spec.imds.as_ref().map(|i| MetadataStatus {
            url: i.url.clone(),
            ..MetadataStatus::default()
        });
        Self {
            spec,
            free,
            free_count,
            next,
            cooling: VecDeque::new(),
            held: HashSet::new(),
            leased: 0,
            known: dynamic.then(BTreeMap::new),
            present_count: 0,
            missing: 0,
            synced: false,
            metadata,
        }
    }

    pub(super) fn dynamic(&self) -> bool {
        self.known.is_some()
    }

    /// Whether a metadata pool has seen `addr` listed (present or not).
    pub(super) fn knows(&self, addr: u128) -> bool {
        self.known.as_ref().is_some_and(|k| k.contains_key(&addr))
    }

    /// Whether `addr` may be in the free set: always in a static pool, while the last good
    /// read lists it in a metadata pool.
    pub(super) fn is_present(&self, addr: u128) -> bool {
        self.known
            .as_ref()
            .is_none_or(|k| k.get(&addr).copied().unwrap_or(false))
    }

    /// An address (not free) becomes free: into the free set only while present.
    pub(super) fn make_free(&mut self, addr: u128) {
        if self.is_present(addr) {
            self.put(addr);
        }
    }

    /// Addresses the pool counts: its ranges, or what the metadata lists now.
    pub(super) fn size(&self) -> u64 {
        if self.dynamic() {
            self.present_count as u64
        } else {
            self.spec.size
        }
    }

    /// Leased addresses gone from the metadata, as reported: none before the first read.
    pub(super) fn reported_missing(&self) -> usize {
        if self.synced {
            self.missing
        } else {
            0
        }
    }

    /// Whether `addr` is one of the pool's usable addresses (exclusions are not; in a
    /// metadata pool, the present ones).
    pub(super) fn contains(&self, addr: u128) -> bool {
        if let Some(k) = &self.known {
            return k.get(&addr).copied().unwrap_or(false);
        }
        let r = &self.spec.ranges6;
        let i = r.partition_point(|r| r.first <= addr);
        i > 0 && addr <= r[i - 1].last
    }

    /// The interval of `free` holding `addr`, if any.
    fn interval_of(&self, addr: u128) -> Option<(u128, u128)> {
        let (&first, &last) = self.free.range(..=addr).next_back()?;
        (addr <= last).then_some((first, last))
    }

    /// Take the next free address at or after the moving start, wrapping around.
    pub(super) fn take_next(&mut self) -> Option<u128> {
        let addr = match self.interval_of(self.next) {
            Some(_) => self.next,
            None => match self.free.range(self.next..).next() {
                Some((&first, _)) => first,
                None => *self.free.keys().next()?,
            },
        };
        self.take(addr);
        self.next = addr.wrapping_add(1);
        Some(addr)
    }

    /// Remove `addr` from the free set; false if it was not free.
    pub(super) fn take(&mut self, addr: u128) -> bool {
        let Some((first, last)) = self.interval_of(addr) else {
            return false;
        };
        self.free.remove(&first);
        if first < addr {
            self.free.insert(first, addr - 1);
        }
        if addr < last {
            self.free.insert(addr + 1, last);
        }
        self.free_count -= 1;
        true
    }

    /// Put `addr` (not free) back into the free set, merging it with its neighbours.
    pub(super) fn put(&mut self, addr: u128) {
        debug_assert!(self.interval_of(addr).is_none(), "{addr} is already free");
        let mut first = addr;
        let mut last = addr;
        if let Some(prev) = addr.checked_sub(1) {
            if let Some((f, _)) = self.interval_of(prev) {
                self.free.remove(&f);
                first = f;
            }
        }
        if let Some(succ) = addr.checked_add(1) {
            if let Some(l) = self.free.remove(&succ) {
                last = l;
            }
        }
        self.free.insert(first, last);
        self.free_count += 1;
    }

    pub(super) fn is_free(&self, addr: u128) -> bool {
        self.interval_of(addr).is_some()
    }

    /// Start the round-robin search after `addr` (restart: after the newest known address).
    pub(super) fn start_after(&mut self, addr: u128) {
        self.next = self.next.max(addr.wrapping_add(1));
    }

    /// Insert a cooling entry at its place in time.
    pub(super) fn push_cooling(&mut self, addr: u128, at: u64) {
        if self.cooling.back().is_none_or(|(_, t)| *t <= at) {
            self.cooling.push_back((addr, at));
        } else {
            let pos = self.cooling.partition_point(|(_, t)| *t <= at);
            self.cooling.insert(pos, (addr, at));
        }
    }

    /// Free addresses, saturating at `u64::MAX`.
    pub(super) fn free_count(&self) -> u64 {
        u64::try_from(self.free_count).unwrap_or(u64::MAX)
    }

    /// Intervals the free set is split into (memory accounting in tests).
    #[cfg(test)]
    pub(super) fn fragments(&self) -> usize {
        self.free.len()
    }

    pub(super) fn cooling_count(&self) -> usize {
        self.cooling.len() + self.held.len()
    }

    pub(super) fn usage(&self, cooldown: Duration, now_ms: u64) -> String {
        Usage {
            spec: &self.spec,
            metadata: self.metadata.as_ref(),
            unsynced: self.dynamic() && !self.synced,
            size: self.size(),
            leased: self.leased,
            cooling: self.cooling_count(),
            held: self.held.len(),
            oldest_release_ms: self.cooling.front().map(|(_, t)| *t),
            missing: self.reported_missing(),
        }
        .message(cooldown, now_ms)
    }

    /// Check the free set against the pool's ranges (tests).
    pub(super) fn check(&self) {
        let mut n = 0u128;
        let mut prev: Option<u128> = None;
        for (&f, &l) in &self.free {
            assert!(f <= l);
            assert!(
                self.contains(f) && self.contains(l),
                "{}",
                Ipv6Addr::from(f)
            );
            if let Some(k) = &self.known {
                // Every address of a metadata pool's free interval is present.
                let present = k.range(f..=l).filter(|(_, p)| **p).count() as u128;
                assert_eq!(present, l - f + 1, "absent address free");
            }
            if let Some(p) = prev {
                assert!(
                    p.checked_add(1).is_some_and(|s| s < f),
                    "adjacent intervals"
                );
            }
            prev = Some(l);
            n = n.saturating_add(l - f + 1);
        }
        assert_eq!(n, self.free_count);
        if let Some(k) = &self.known {
            assert_eq!(k.values().filter(|p| **p).count(), self.present_count);
        }
    }
}
