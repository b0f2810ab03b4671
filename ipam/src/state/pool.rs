//! One pool of either family: its free addresses, cooling FIFO, held addresses and counters.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    fmt::Write as _,
    time::Duration,
};

use aliasnet_ipam_proto::MetadataStatus;

use super::free::FreeSet;
use crate::{config::PoolSpec, lease::Addr};

pub(super) struct Pool {
    pub(super) spec: PoolSpec,
    /// Free, reusable addresses (present ones only, in a metadata pool).
    pub(super) free: FreeSet,
    /// (address, release time in ms), oldest first.
    pub(super) cooling: VecDeque<(Addr, u64)>,
    /// Cooldown over, but a host link that routed the address is still being deleted.
    pub(super) held: HashSet<Addr>,
    pub(super) leased: usize,
    /// Metadata pools: every address seen listed -> whether the last good read lists it.
    pub(super) known: Option<BTreeMap<Addr, bool>>,
    /// Present addresses (metadata pools).
    pub(super) present_count: usize,
    /// Leased addresses that are not present (metadata pools).
    pub(super) missing: usize,
    /// A metadata read has been applied (metadata pools); until then the pool has no address.
    pub(super) synced: bool,
    pub(super) metadata: Option<MetadataStatus>,
}

impl Pool {
    pub(super) fn new(spec: PoolSpec) -> Self {
        let dynamic = spec.source.is_dynamic();
        let metadata = spec.imds.as_ref().map(|i| MetadataStatus {
            url: i.url.clone(),
            ..MetadataStatus::default()
        });
        Self {
            free: FreeSet::new(&spec),
            spec,
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
    pub(super) fn knows(&self, addr: Addr) -> bool {
        self.known.as_ref().is_some_and(|k| k.contains_key(&addr))
    }

    /// A metadata pool learns `addr`, absent until a read lists it; false when it tracks
    /// `limit` addresses already.
    pub(super) fn learn(&mut self, addr: Addr, limit: usize) -> bool {
        match self.known.as_mut() {
            Some(k) if k.len() < limit => {
                k.insert(addr, false);
                true
            }
            _ => false,
        }
    }

    /// Whether `addr` may be in the free set: always in a static pool, while the last good
    /// read lists it in a metadata pool.
    pub(super) fn is_present(&self, addr: Addr) -> bool {
        self.known
            .as_ref()
            .is_none_or(|k| k.get(&addr).copied().unwrap_or(false))
    }

    /// An address (not free) becomes free: into the free set only while present.
    pub(super) fn make_free(&mut self, addr: Addr) {
        if self.is_present(addr) {
            self.free.put(addr);
        }
    }

    /// Insert a cooling entry at its place in time.
    pub(super) fn push_cooling(&mut self, addr: Addr, at: u64) {
        if self.cooling.back().is_none_or(|(_, t)| *t <= at) {
            self.cooling.push_back((addr, at));
        } else {
            let pos = self.cooling.partition_point(|(_, t)| *t <= at);
            self.cooling.insert(pos, (addr, at));
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

    /// Leased addresses gone from the metadata, as reported: before the first read after a
    /// restart nothing is known to be gone.
    pub(super) fn reported_missing(&self) -> usize {
        if self.synced {
            self.missing
        } else {
            0
        }
    }

    /// Cooling addresses that are not reusable yet (including held ones).
    pub(super) fn cooling_count(&self) -> usize {
        self.cooling.len() + self.held.len()
    }

    /// Why the pool has no free address, with what would change that.
    pub(super) fn usage(&self, cooldown: Duration, now_ms: u64) -> String {
        if self.dynamic() && !self.synced {
            let why = self
                .metadata
                .as_ref()
                .and_then(|m| m.last_error.clone())
                .unwrap_or_else(|| "no answer yet".into());
            return format!(
                "pool '{}' ({}) has no addresses yet: no metadata read has succeeded ({why})",
                self.spec.name, self.spec.description
            );
        }
        let mut s = format!(
            "pool '{}' ({}, {} addresses) has no free address: {} allocated, {} cooling",
            self.spec.name,
            self.spec.description,
            self.size(),
            self.leased,
            self.cooling_count()
        );
        if let Some((_, t)) = self.cooling.front() {
            let free_at = t.saturating_add(cooldown.as_millis() as u64);
            let _ = write!(
                s,
                " (the next is reusable in {}s)",
                free_at.saturating_sub(now_ms).div_ceil(1000)
            );
        }
        if !self.held.is_empty() {
            let _ = write!(
                s,
                ", {} waiting for their old host veth to go",
                self.held.len()
            );
        }
        let missing = self.reported_missing();
        if missing > 0 {
            let _ = write!(s, ", {missing} leased addresses gone from the metadata");
        }
        s
    }

    /// Whether `addr` is one of the pool's usable addresses (exclusions are not; in a
    /// metadata pool, the present ones).
    pub(super) fn contains(&self, addr: Addr) -> bool {
        if let Some(k) = &self.known {
            return k.get(&addr).copied().unwrap_or(false);
        }
        self.spec
            .address_ranges()
            .any(|(first, last)| first <= addr && addr <= last)
    }

    /// Check the free set against the pool's addresses ([`super::State::check_invariants`]):
    /// every free address is one of the pool's and present, and the count is right.
    pub(super) fn check(&self) {
        let mut n = 0u128;
        let mut prev: Option<Addr> = None;
        for (f, l) in self.free.ranges() {
            assert!(f <= l);
            assert!(
                self.contains(f) && self.contains(l),
                "{}",
                crate::lease::addr_ip(f)
            );
            if let Some(k) = &self.known {
                // Every address of a metadata pool's free interval is present.
                let present = k.range(f..=l).filter(|(_, p)| **p).count() as u128;
                assert_eq!(present, l - f + 1, "absent address free");
            }
            if let Some(p) = prev {
                assert!(p.checked_add(1).is_some_and(|s| s < f), "adjacent ranges");
            }
            prev = Some(l);
            n = n.saturating_add(l - f + 1);
        }
        assert_eq!(u64::try_from(n).unwrap_or(u64::MAX), self.free.count());
        if let Some(k) = &self.known {
            assert_eq!(k.values().filter(|p| **p).count(), self.present_count);
        }
    }
}

/// Where an address lives: (first, last, pool) of every static range of either family, by
/// first address.
pub(super) fn locate_span(spans: &[(Addr, Addr, usize)], addr: Addr) -> Option<usize> {
    let i = spans.partition_point(|s| s.0 <= addr);
    let &(_, last, pool) = spans.get(i.checked_sub(1)?)?;
    (addr <= last).then_some(pool)
}
