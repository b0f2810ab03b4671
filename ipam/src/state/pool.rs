//! One pool's slots: address per slot, free bitmap, cooling FIFO and counters.

use std::{collections::VecDeque, fmt::Write as _, time::Duration};

use aliasnet_ipam_proto::MetadataStatus;

use crate::{bitmap::FreeBitmap, config::PoolSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    Free,
    Leased,
    Cooling,
    /// Cooldown over, but a host link that routed this address is still being deleted.
    Held,
}

pub(super) struct Pool {
    pub(super) spec: PoolSpec,
    /// Static pools: pool-local index of the first address of each range in `spec.ranges`.
    pub(super) bases: Vec<u32>,
    /// Metadata pools: slot -> address (slots are appended as addresses appear).
    pub(super) addrs: Vec<u32>,
    /// Metadata pools: whether the slot's address is in the last good read.
    pub(super) present: Vec<bool>,
    pub(super) free: FreeBitmap,
    pub(super) slots: Vec<Slot>,
    /// (slot, release time in ms), oldest first.
    pub(super) cooling: VecDeque<(u32, u64)>,
    pub(super) held: usize,
    pub(super) leased: usize,
    /// Leased slots that are not present (metadata pools).
    pub(super) missing: usize,
    /// Present slots (metadata pools).
    pub(super) present_count: usize,
    /// A metadata read has been applied (metadata pools); until then the pool has no address.
    pub(super) synced: bool,
    pub(super) metadata: Option<MetadataStatus>,
}

impl Pool {
    pub(super) fn new(spec: PoolSpec) -> Self {
        let mut bases = Vec::with_capacity(spec.ranges.len());
        let mut n = 0u32;
        for r in &spec.ranges {
            bases.push(n);
            n += r.len() as u32;
        }
        let metadata = spec.imds.as_ref().map(|i| MetadataStatus {
            url: i.url.clone(),
            ..MetadataStatus::default()
        });
        Self {
            free: FreeBitmap::new_free(n as usize),
            slots: vec![Slot::Free; n as usize],
            spec,
            bases,
            addrs: Vec::new(),
            present: Vec::new(),
            cooling: VecDeque::new(),
            held: 0,
            leased: 0,
            missing: 0,
            present_count: 0,
            synced: false,
            metadata,
        }
    }

    pub(super) fn dynamic(&self) -> bool {
        self.spec.source.is_dynamic()
    }

    pub(super) fn addr_of(&self, idx: u32) -> u32 {
        if self.dynamic() {
            return self.addrs[idx as usize];
        }
        let k = self.bases.partition_point(|b| *b <= idx) - 1;
        self.spec.ranges[k].first + (idx - self.bases[k])
    }

    pub(super) fn is_present(&self, idx: u32) -> bool {
        !self.dynamic() || self.present[idx as usize]
    }

    /// Put a slot back to `Free` (in the bitmap only while present).
    pub(super) fn make_free(&mut self, idx: u32) {
        self.slots[idx as usize] = Slot::Free;
        if self.is_present(idx) {
            self.free.set_free(idx as usize);
        }
    }

    /// Insert a cooling entry at its place in time.
    pub(super) fn push_cooling(&mut self, idx: u32, at: u64) {
        if self.cooling.back().is_none_or(|(_, t)| *t <= at) {
            self.cooling.push_back((idx, at));
        } else {
            let pos = self.cooling.partition_point(|(_, t)| *t <= at);
            self.cooling.insert(pos, (idx, at));
        }
    }

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
        self.cooling.len() + self.held
    }

    pub(super) fn usage(&self, cooldown: Duration, now_ms: u64) -> String {
        Usage {
            spec: &self.spec,
            metadata: self.metadata.as_ref(),
            unsynced: self.dynamic() && !self.synced,
            size: self.size(),
            leased: self.leased,
            cooling: self.cooling_count(),
            held: self.held,
            oldest_release_ms: self.cooling.front().map(|(_, t)| *t),
            missing: self.reported_missing(),
        }
        .message(cooldown, now_ms)
    }
}

/// What a pool of either family tells about itself when it has no free address.
pub(super) struct Usage<'a> {
    pub(super) spec: &'a PoolSpec,
    pub(super) metadata: Option<&'a MetadataStatus>,
    /// A metadata pool no read has filled yet.
    pub(super) unsynced: bool,
    pub(super) size: u64,
    pub(super) leased: usize,
    /// Cooling addresses, held ones included.
    pub(super) cooling: usize,
    /// Cooled down, but waiting for their old host veth to go.
    pub(super) held: usize,
    /// Release time of the address that leaves cooldown next.
    pub(super) oldest_release_ms: Option<u64>,
    /// Leased addresses gone from the metadata, as reported.
    pub(super) missing: usize,
}

impl Usage<'_> {
    pub(super) fn message(&self, cooldown: Duration, now_ms: u64) -> String {
        if self.unsynced {
            let why = self
                .metadata
                .and_then(|m| m.last_error.clone())
                .unwrap_or_else(|| "no answer yet".into());
            return format!(
                "pool '{}' ({}) has no addresses yet: no metadata read has succeeded ({why})",
                self.spec.name, self.spec.description
            );
        }
        let mut s = format!(
            "pool '{}' ({}, {} addresses) has no free address: {} allocated, {} cooling",
            self.spec.name, self.spec.description, self.size, self.leased, self.cooling
        );
        if let Some(t) = self.oldest_release_ms {
            let free_at = t.saturating_add(cooldown.as_millis() as u64);
            let _ = write!(
                s,
                " (the next is reusable in {}s)",
                free_at.saturating_sub(now_ms).div_ceil(1000)
            );
        }
        if self.held > 0 {
            let _ = write!(s, ", {} waiting for their old host veth to go", self.held);
        }
        if self.missing > 0 {
            let _ = write!(
                s,
                ", {} leased addresses gone from the metadata",
                self.missing
            );
        }
        s
    }
}

/// Where an address lives: pool index and pool-local slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) first: u32,
    pub(super) last: u32,
    pub(super) pool: usize,
    pub(super) base: u32,
}

/// Pool and pool-local slot of `addr` in a static pool.
pub(super) fn locate_span(spans: &[Span], addr: u32) -> Option<(usize, u32)> {
    let i = spans.partition_point(|s| s.first <= addr);
    let s = spans.get(i.checked_sub(1)?)?;
    (addr <= s.last).then(|| (s.pool, s.base + (addr - s.first)))
}
