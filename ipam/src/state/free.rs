//! A pool's free addresses, kept as its size calls for.
//!
//! A static IPv4 pool has at most [`crate::config::MAX_TOTAL_ADDRESSES`] addresses: a bit
//! each ([`FreeBitmap`]: a /14 in 32 KiB), the next free one found in O(1) at any occupancy,
//! a loaded lease a bit cleared. A delegated IPv6 prefix has up to 2^64 addresses and is never
//! enumerated, and a metadata pool learns its addresses at run time: their free addresses are
//! a set of disjoint intervals ([`Intervals`]), first the configured ranges minus exclusions;
//! an allocation splits an interval, an address whose cooldown ended is merged back. Memory is
//! bounded by the leased and cooling addresses (each can split one interval), every operation
//! is O(log n), and a restart lays the loaded leases and cooling addresses over the ranges in
//! O(n log n) without a scan of the prefix.
//!
//! Both hand addresses out round-robin from a moving start, so a released address is reused as
//! late as possible; a restart continues after the highest address in use.

use std::collections::BTreeMap;

use crate::{bitmap::FreeBitmap, config::PoolSpec, lease::Addr};

/// The free addresses of one pool; every address is an allocator value ([`Addr`]).
pub(super) enum FreeSet {
    Slots(Slots),
    Intervals(Intervals),
}

impl FreeSet {
    /// Every usable address of a static pool free; none yet in a metadata pool.
    pub(super) fn new(spec: &PoolSpec) -> Self {
        if spec.family == aliasnet_ipam_proto::Family::Ipv4 && !spec.source.is_dynamic() {
            Self::Slots(Slots::new(spec))
        } else {
            Self::Intervals(Intervals::new(spec))
        }
    }

    /// Take the next free address at or after the moving start, wrapping around.
    pub(super) fn take_next(&mut self) -> Option<Addr> {
        match self {
            Self::Slots(s) => s.take_next(),
            Self::Intervals(i) => i.take_next(),
        }
    }

    /// Remove `addr` from the free set; false if it was not free.
    pub(super) fn take(&mut self, addr: Addr) -> bool {
        match self {
            Self::Slots(s) => s.slot(addr).is_some_and(|i| s.bits.take(i)),
            Self::Intervals(i) => i.take(addr),
        }
    }

    /// Put `addr` (one of the pool's, not free) into the free set.
    pub(super) fn put(&mut self, addr: Addr) {
        match self {
            Self::Slots(s) => {
                let i = s.slot(addr).expect("an address of the pool");
                let fresh = s.bits.set_free(i);
                debug_assert!(fresh, "{addr} is already free");
            }
            Self::Intervals(i) => i.put(addr),
        }
    }

    pub(super) fn is_free(&self, addr: Addr) -> bool {
        match self {
            Self::Slots(s) => s.slot(addr).is_some_and(|i| s.bits.is_free(i)),
            Self::Intervals(i) => i.interval_of(addr).is_some(),
        }
    }

    /// Free addresses, saturating at `u64::MAX`.
    pub(super) fn count(&self) -> u64 {
        match self {
            Self::Slots(s) => s.bits.free_count() as u64,
            Self::Intervals(i) => u64::try_from(i.count).unwrap_or(u64::MAX),
        }
    }

    /// Start the round-robin search after `addr` (restart: after the newest known address).
    pub(super) fn start_after(&mut self, addr: Addr) {
        match self {
            Self::Slots(s) => {
                if let Some(i) = s.slot(addr) {
                    s.bits.start_after(i);
                }
            }
            Self::Intervals(i) => i.next = i.next.max(addr.wrapping_add(1)),
        }
    }

    /// The free addresses as disjoint ranges, by address (consistency checks: every address
    /// of a bitmap is visited).
    pub(super) fn ranges(&self) -> Vec<(Addr, Addr)> {
        match self {
            Self::Slots(s) => {
                let mut out: Vec<(Addr, Addr)> = Vec::new();
                for (first, last, base) in &s.ranges {
                    for a in *first..=*last {
                        if !s.bits.is_free((base + (a - first)) as usize) {
                            continue;
                        }
                        match out.last_mut() {
                            Some(r) if r.1 + 1 == Addr::from(a) => r.1 += 1,
                            _ => out.push((a.into(), a.into())),
                        }
                    }
                }
                out
            }
            Self::Intervals(i) => i.free.iter().map(|(f, l)| (*f, *l)).collect(),
        }
    }

    /// Pieces the free set is split into (memory accounting in tests).
    #[cfg(test)]
    pub(super) fn fragments(&self) -> usize {
        match self {
            Self::Slots(_) => self.ranges().len(),
            Self::Intervals(i) => i.free.len(),
        }
    }
}

/// A static IPv4 pool: a slot per usable address, numbered through its ranges in order.
pub(super) struct Slots {
    bits: FreeBitmap,
    /// (first address, last address, slot of the first) of each range, by address.
    ranges: Vec<(u32, u32, u32)>,
}

impl Slots {
    fn new(spec: &PoolSpec) -> Self {
        let mut ranges = Vec::with_capacity(spec.ranges.len());
        let mut n = 0u32;
        for r in &spec.ranges {
            let (first, last) = r.bounds();
            let v4 = |a: u128| u32::try_from(a).expect("a slot pool is IPv4");
            ranges.push((v4(first), v4(last), n));
            n += r.len() as u32;
        }
        Self {
            bits: FreeBitmap::new_free(n as usize),
            ranges,
        }
    }

    fn slot(&self, addr: Addr) -> Option<usize> {
        let a = u32::try_from(addr).ok()?;
        let k = self.ranges.partition_point(|r| r.0 <= a).checked_sub(1)?;
        let (first, last, base) = self.ranges[k];
        (a <= last).then(|| (base + (a - first)) as usize)
    }

    fn addr(&self, slot: usize) -> Addr {
        let slot = slot as u32;
        let k = self.ranges.partition_point(|r| r.2 <= slot) - 1;
        let (first, _, base) = self.ranges[k];
        Addr::from(first + (slot - base))
    }

    fn take_next(&mut self) -> Option<Addr> {
        let i = self.bits.take_next()?;
        Some(self.addr(i))
    }
}

/// Free addresses as disjoint, non-adjacent intervals.
pub(super) struct Intervals {
    /// first -> last.
    free: BTreeMap<Addr, Addr>,
    /// Addresses in `free` (saturating).
    count: u128,
    /// Where the search for the next address starts.
    next: Addr,
}

impl Intervals {
    fn new(spec: &PoolSpec) -> Self {
        let free: BTreeMap<Addr, Addr> = spec.address_ranges().collect();
        let count = free.iter().fold(0u128, |n, (f, l)| {
            n.saturating_add((l - f).saturating_add(1))
        });
        let next = free.keys().next().copied().unwrap_or(0);
        Self { free, count, next }
    }

    /// The interval holding `addr`, if it is free.
    fn interval_of(&self, addr: Addr) -> Option<(Addr, Addr)> {
        let (&first, &last) = self.free.range(..=addr).next_back()?;
        (addr <= last).then_some((first, last))
    }

    fn take_next(&mut self) -> Option<Addr> {
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

    fn take(&mut self, addr: Addr) -> bool {
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
        self.count -= 1;
        true
    }

    /// Merges `addr` with its free neighbours.
    fn put(&mut self, addr: Addr) {
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
        self.count += 1;
    }
}
