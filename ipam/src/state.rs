//! The allocator: pools, leases, cooldown and pending link teardowns, in memory.
//!
//! Pure and synchronous (time is a parameter), so it can be unit- and property-tested. The
//! daemon keeps it under a short mutex and never holds that across disk I/O: a change is made
//! here first as *pending* (the address is reserved so no other key can take it, but readers do
//! not see it), its record goes to the writer, and the writer then calls [`State::commit`] or
//! [`State::abort`].
//!
//! Address life cycle per slot:
//! `Free -> Leased -> Cooling (FIFO, for the cooldown) -> Free`, with a detour through `Held`
//! when the cooldown ends while the old host veth is still being deleted (its /32 route still
//! points at the old veth until then).
//!
//! Metadata pools (`azure-imds`) learn their addresses at run time ([`State::apply_metadata`]).
//! Each address gets a slot when first seen and keeps it; a slot is *present* while the last
//! good read lists it. A slot is in the free bitmap exactly when it is `Free` and present, so
//! an address that left the metadata is never handed out, whatever state it was in: a free
//! one leaves the pool at once, a leased one (reported as *missing*) stays with its pod and,
//! once released, cools down and then stays out until the metadata lists it again.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fmt::Write as _,
    net::Ipv4Addr,
    time::Duration,
};

use aliasnet_ipam_proto::{
    host_veth_name, Attachment, AttachmentKey, ErrorKind, Lease, MetadataStatus, PodRef, PoolStats,
    RECOVERED_NETWORK,
};

use crate::{
    bitmap::FreeBitmap,
    config::{Config, OnOnlyCooling, PoolSpec, MAX_METADATA_ADDRESSES},
    lease::{
        encode_data, encode_key, validate_ifname, validate_key, validate_pod, LeaseEntry,
        LeaseState, LeaseTable,
    },
    reconcile::is_ours,
    store::{
        record::{AllocRec, CoolRec, Record, ReleaseRec},
        Loaded, SnapshotWriter,
    },
};

/// A request the allocator turns down; maps 1:1 to a protocol error reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub kind: ErrorKind,
    pub message: String,
}

impl Refusal {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    fn bad(message: String) -> Self {
        Self::new(ErrorKind::BadRequest, message)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Leased,
    Cooling,
    /// Cooldown over, but a host link that routed this address is still being deleted.
    Held,
}

struct Pool {
    spec: PoolSpec,
    /// Static pools: pool-local index of the first address of each range in `spec.ranges`.
    bases: Vec<u32>,
    /// Metadata pools: slot -> address (slots are appended as addresses appear).
    addrs: Vec<u32>,
    /// Metadata pools: whether the slot's address is in the last good read.
    present: Vec<bool>,
    free: FreeBitmap,
    slots: Vec<Slot>,
    /// (slot, release time in ms), oldest first.
    cooling: VecDeque<(u32, u64)>,
    held: usize,
    leased: usize,
    /// Leased slots that are not present (metadata pools).
    missing: usize,
    /// Present slots (metadata pools).
    present_count: usize,
    /// A metadata read has been applied (metadata pools); until then the pool has no address.
    synced: bool,
    metadata: Option<MetadataStatus>,
}

impl Pool {
    fn new(spec: PoolSpec) -> Self {
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

    fn dynamic(&self) -> bool {
        self.spec.source.is_dynamic()
    }

    fn addr_of(&self, idx: u32) -> u32 {
        if self.dynamic() {
            return self.addrs[idx as usize];
        }
        let k = self.bases.partition_point(|b| *b <= idx) - 1;
        self.spec.ranges[k].first + (idx - self.bases[k])
    }

    fn is_present(&self, idx: u32) -> bool {
        !self.dynamic() || self.present[idx as usize]
    }

    /// Put a slot back to `Free` (in the bitmap only while present).
    fn make_free(&mut self, idx: u32) {
        self.slots[idx as usize] = Slot::Free;
        if self.is_present(idx) {
            self.free.set_free(idx as usize);
        }
    }

    /// Insert a cooling entry at its place in time.
    fn push_cooling(&mut self, idx: u32, at: u64) {
        if self.cooling.back().is_none_or(|(_, t)| *t <= at) {
            self.cooling.push_back((idx, at));
        } else {
            let pos = self.cooling.partition_point(|(_, t)| *t <= at);
            self.cooling.insert(pos, (idx, at));
        }
    }

    fn size(&self) -> u64 {
        if self.dynamic() {
            self.present_count as u64
        } else {
            self.spec.size
        }
    }

    /// Leased addresses gone from the metadata, as reported: before the first read after a
    /// restart nothing is known to be gone.
    fn reported_missing(&self) -> usize {
        if self.synced {
            self.missing
        } else {
            0
        }
    }

    /// Cooling addresses that are not reusable yet (including held ones).
    fn cooling_count(&self) -> usize {
        self.cooling.len() + self.held
    }

    fn usage(&self, cooldown: Duration, now_ms: u64) -> String {
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
        if self.held > 0 {
            let _ = write!(s, ", {} waiting for their old host veth to go", self.held);
        }
        if self.reported_missing() > 0 {
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
struct Span {
    first: u32,
    last: u32,
    pool: usize,
    base: u32,
}

/// Allocate arguments.
#[derive(Debug, Clone, Copy)]
pub struct AllocRequest<'a> {
    pub key: &'a AttachmentKey,
    pub pod: &'a PodRef,
    pub pool: Option<&'a str>,
    pub host_veth: Option<&'a str>,
}

#[derive(Debug)]
pub enum AllocStep {
    /// The key already holds this lease (idempotent repeat).
    Existing(Lease),
    /// A new reservation: durable once `record` is committed.
    Fresh { lease: Lease, record: Record },
    /// Something this request depends on is in flight; retry after the next change.
    Wait(String),
}

#[derive(Debug)]
pub enum ReleaseStep {
    /// The key holds nothing. `teardown` is a link newly queued for deletion.
    NotFound {
        teardown: Option<Box<str>>,
    },
    Fresh {
        record: Record,
        address: Ipv4Addr,
        pool: String,
    },
    Wait(String),
}

/// What loading found, for the start-up log.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub leases: usize,
    pub cooling: usize,
    /// Leases whose address is in no configured pool (kept, never handed out again).
    pub orphans: Vec<Lease>,
    /// Links whose deletion a crash interrupted; queue them again.
    pub teardowns: Vec<Box<str>>,
    /// Leases rebuilt by `recover` (key unknown).
    pub recovered: usize,
}

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

pub struct State {
    cooldown: Duration,
    gc_grace_ms: u64,
    policy: OnOnlyCooling,
    veth_prefix: String,
    pools: Vec<Pool>,
    spans: Vec<Span>,
    /// Addresses of metadata pools -> (pool, slot).
    dynamic: HashMap<u32, (usize, u32)>,
    /// Pool names: the configured pools first, then names only old records mention.
    names: Vec<Box<str>>,
    leases: LeaseTable,
    orphans: usize,
    /// Address -> link whose deletion it waits for.
    holds: HashMap<u32, Box<str>>,
    /// Link being deleted -> addresses held until it is gone.
    teardowns: HashMap<Box<str>, Vec<u32>>,
    /// Pending allocations that took a cooling address (`reuse-oldest`): address -> release
    /// time, so an abort puts it back to cool instead of freeing it early.
    reused: HashMap<u32, u64>,
    /// Released addresses in no pool yet (a metadata pool's, before its first read after a
    /// restart): address -> release time. They cool down when the metadata lists them again.
    unplaced_cooling: HashMap<u32, u64>,
    /// Recovered leases (key unknown) by host veth -> lease id.
    recovered: HashMap<Box<str>, u32>,
}

/// Pool and pool-local slot of `addr` in a static pool.
fn locate_span(spans: &[Span], addr: u32) -> Option<(usize, u32)> {
    let i = spans.partition_point(|s| s.first <= addr);
    let s = spans.get(i.checked_sub(1)?)?;
    (addr <= s.last).then(|| (s.pool, s.base + (addr - s.first)))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl State {
    /// An empty state over the configured pools.
    pub fn new(config: &Config) -> Self {
        let pools: Vec<Pool> = config.pools.iter().cloned().map(Pool::new).collect();
        let mut spans: Vec<Span> = pools
            .iter()
            .enumerate()
            .flat_map(|(p, pool)| {
                pool.spec
                    .ranges
                    .iter()
                    .zip(&pool.bases)
                    .map(move |(r, b)| Span {
                        first: r.first,
                        last: r.last,
                        pool: p,
                        base: *b,
                    })
            })
            .collect();
        spans.sort_by_key(|s| s.first);
        Self {
            cooldown: config.cooldown,
            gc_grace_ms: ms(config.gc_grace),
            policy: config.on_only_cooling,
            veth_prefix: config.host_veth_prefix.clone(),
            names: pools.iter().map(|p| p.spec.name.as_str().into()).collect(),
            pools,
            spans,
            dynamic: HashMap::new(),
            leases: LeaseTable::default(),
            orphans: 0,
            holds: HashMap::new(),
            teardowns: HashMap::new(),
            reused: HashMap::new(),
            unplaced_cooling: HashMap::new(),
            recovered: HashMap::new(),
        }
    }

    /// Lay the state loaded from disk over the configured pools.
    pub fn from_loaded(config: &Config, loaded: Loaded, now_ms: u64) -> (Self, LoadReport) {
        let mut st = Self::new(config);
        let mut report = LoadReport::default();
        let Loaded {
            names,
            leases,
            cooling,
            ..
        } = loaded;
        // Map the loaded pool-name table onto ours once, not per lease.
        let name_map: Vec<u16> = names.iter().map(|n| st.intern(n)).collect();
        // Take the loaded table as is: re-inserting 200,000 leases would double the load time.
        st.leases = leases;
        let mut orphan_ids = Vec::new();
        let ids: Vec<u32> = st.leases.iter().map(|(id, _)| id).collect();
        for id in ids {
            let e = st.leases.get_mut(id);
            let recorded = name_map
                .get(usize::from(e.pool_name))
                .copied()
                .unwrap_or(u16::MAX);
            let addr = e.addr;
            let placed = match locate_span(&st.spans, addr) {
                Some(found) => Some(found),
                None => {
                    // A metadata pool's lease: its slot exists from now on, absent until the
                    // pool's first read lists the address.
                    let p = usize::from(recorded);
                    if st.pools.get(p).is_some_and(Pool::dynamic) {
                        st.dyn_slot(p, addr)
                    } else {
                        None
                    }
                }
            };
            let e = st.leases.get_mut(id);
            match placed {
                Some((p, idx)) => {
                    e.pool_name = p as u16;
                    let pool = &mut st.pools[p];
                    pool.free.take(idx as usize);
                    pool.slots[idx as usize] = Slot::Leased;
                    pool.leased += 1;
                    if !pool.is_present(idx) {
                        pool.missing += 1;
                    }
                }
                None => {
                    e.pool_name = recorded;
                    st.orphans += 1;
                    orphan_ids.push(id);
                }
            }
            if e.network_is(RECOVERED_NETWORK) {
                if let Some(v) = e.host_veth() {
                    st.recovered.insert(v.into(), id);
                    report.recovered += 1;
                }
            }
        }
        for id in orphan_ids {
            report.orphans.push(st.lease_of(id));
        }
        report.leases = st.leases.len();

        // Links still to delete that a live lease uses again (deleted and re-created since):
        // a scan of the leases against the few pending links, no string per lease.
        let pending: HashSet<&str> = cooling.values().filter_map(|(_, l)| l.as_deref()).collect();
        let mut live_veths: HashSet<String> = HashSet::new();
        if !pending.is_empty() {
            for (_, e) in st.leases.iter() {
                match e.host_veth_field() {
                    Some(crate::lease::Field::Raw(name)) if pending.contains(name) => {
                        live_veths.insert(name.to_owned());
                    }
                    Some(crate::lease::Field::Raw(_)) | None => {}
                    Some(other) => {
                        let name = other.to_string_lossless();
                        if pending.contains(name.as_str()) {
                            live_veths.insert(name);
                        }
                    }
                }
            }
        }
        let mut cooling: Vec<(u32, u64, Option<Box<str>>)> =
            cooling.into_iter().map(|(a, (t, l))| (a, t, l)).collect();
        cooling.sort_by_key(|(a, t, _)| (*t, *a));
        let mut holds = Vec::new();
        for (addr, at, link) in cooling {
            // A link a live lease uses again was already deleted and re-created: keep it.
            // A name that is not ours (written by an older daemon that deleted whatever a
            // request named) is never deleted.
            let link = link.filter(|l| !live_veths.contains(&**l) && is_ours(l, &st.veth_prefix));
            // A clock that went backwards must not stretch the cooldown without bound.
            let at = at.min(now_ms);
            match st.locate(addr) {
                Some((p, idx)) => {
                    let pool = &mut st.pools[p];
                    if pool.slots[idx as usize] == Slot::Free {
                        pool.free.take(idx as usize);
                        pool.slots[idx as usize] = Slot::Cooling;
                        pool.cooling.push_back((idx, at));
                        report.cooling += 1;
                        if let Some(l) = &link {
                            holds.push((addr, l.clone()));
                        }
                    }
                }
                None => {
                    if at.saturating_add(ms(st.cooldown)) > now_ms {
                        st.unplaced_cooling.insert(addr, at);
                        report.cooling += 1;
                    }
                }
            }
            if let Some(l) = link {
                st.teardowns.entry(l).or_default();
            }
        }
        for (addr, l) in holds {
            st.holds.insert(addr, l.clone());
            st.teardowns.entry(l).or_default().push(addr);
        }
        report.teardowns = st.teardowns.keys().cloned().collect();
        st.expire(now_ms);
        (st, report)
    }

    fn intern(&mut self, name: &str) -> u16 {
        if let Some(i) = self.names.iter().position(|n| &**n == name) {
            return i as u16;
        }
        self.names.push(name.into());
        // Bounded: MAX_POOLS configured names plus the few that old records mention.
        u16::try_from(self.names.len() - 1).unwrap_or(u16::MAX)
    }

    /// A new (absent, free) slot for `addr` in metadata pool `p`.
    fn dyn_slot(&mut self, p: usize, addr: u32) -> Option<(usize, u32)> {
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

    fn locate(&self, addr: u32) -> Option<(usize, u32)> {
        locate_span(&self.spans, addr).or_else(|| self.dynamic.get(&addr).copied())
    }

    fn pool_name(&self, e: &LeaseEntry) -> &str {
        self.names.get(e.pool_name as usize).map_or("", |n| &**n)
    }

    fn lease_of(&self, id: u32) -> Lease {
        let e = self.leases.get(id);
        let mut l = e.to_lease(self.pool_name(e));
        if let Some((p, idx)) = self.locate(e.addr) {
            let pool = &self.pools[p];
            l.missing = pool.dynamic() && pool.synced && !pool.is_present(idx);
        }
        l
    }

    /// Move every address whose cooldown is over out of its pool's FIFO.
    pub fn expire(&mut self, now_ms: u64) {
        let cd = ms(self.cooldown);
        for pool in &mut self.pools {
            while let Some(&(idx, at)) = pool.cooling.front() {
                if at.saturating_add(cd) > now_ms {
                    break;
                }
                pool.cooling.pop_front();
                let addr = pool.addr_of(idx);
                if self.holds.contains_key(&addr) {
                    pool.slots[idx as usize] = Slot::Held;
                    pool.held += 1;
                } else {
                    pool.make_free(idx);
                }
            }
        }
        if !self.unplaced_cooling.is_empty() {
            self.unplaced_cooling
                .retain(|_, at| at.saturating_add(cd) > now_ms);
        }
    }

    fn eligible(&self, pool: Option<&str>) -> Result<Vec<usize>, Refusal> {
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
    fn recovered_for(&self, key: &AttachmentKey, link: Option<&str>) -> Option<u32> {
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

    fn exhausted(&self, eligible: &[usize], now_ms: u64) -> Refusal {
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

    /// Start releasing `key`. `teardown` is a host link to delete once the release is durable.
    /// With `not_after` (a spool entry's time), a lease allocated later than that is newer than
    /// the DEL that spooled it and is left alone. A key that holds nothing releases the
    /// recovered lease (see [`RECOVERED_NETWORK`]) of its host veth, if there is one.
    pub fn begin_release(
        &mut self,
        key: &AttachmentKey,
        teardown: Option<&str>,
        not_after: Option<u64>,
        now_ms: u64,
    ) -> Result<ReleaseStep, Refusal> {
        self.begin_release_of(key, teardown, not_after, None, now_ms)
    }

    /// [`State::begin_release`] of the lease `lease` (address, allocation time) only: if `key`
    /// now holds another lease (released and allocated again since), nothing is released.
    pub fn begin_release_of(
        &mut self,
        key: &AttachmentKey,
        teardown: Option<&str>,
        not_after: Option<u64>,
        lease: Option<(u32, u64)>,
        now_ms: u64,
    ) -> Result<ReleaseStep, Refusal> {
        validate_key(key).map_err(Refusal::bad)?;
        if let Some(v) = teardown {
            validate_ifname("teardown_link", v).map_err(Refusal::bad)?;
        }
        let released_at_ms = not_after.map_or(now_ms, |t| t.min(now_ms));
        let found = match self.leases.find(&encode_key(key)) {
            Some(id) => {
                if not_after.is_some_and(|t| self.leases.get(id).allocated_at_ms > t) {
                    return Ok(ReleaseStep::NotFound { teardown: None });
                }
                Some(id)
            }
            // A recovered lease is the attachment as it was when the kernel was read: a DEL
            // naming its veth is about it, whenever it was spooled.
            None => self.recovered_for(key, teardown),
        };
        // No lease, no link deleted: the name alone proves nothing about whose link it is.
        let Some(id) = found else {
            return Ok(ReleaseStep::NotFound { teardown: None });
        };
        if let Some((addr, at)) = lease {
            let e = self.leases.get(id);
            if (e.addr, e.allocated_at_ms) != (addr, at) {
                return Ok(ReleaseStep::NotFound { teardown: None });
            }
        }
        if let Some(l) = teardown {
            if !self.link_is_leases(id, l) {
                return Err(Refusal::bad(format!(
                    "teardown_link {l} is not the host veth recorded for {key}'s lease{}; \
                     nothing was released or deleted",
                    match self.leases.get(id).host_veth() {
                        Some(v) => format!(" ({v})"),
                        None => String::new(),
                    }
                )));
            }
        }
        self.release_id(id, teardown, released_at_ms, key)
    }

    /// Whether `link` is lease `id`'s own host veth: named like ours, and the one recorded for
    /// it (or, for a lease recorded without one, the name its key hashes to).
    fn link_is_leases(&self, id: u32, link: &str) -> bool {
        if !is_ours(link, &self.veth_prefix) {
            return false;
        }
        let e = self.leases.get(id);
        match e.host_veth() {
            Some(v) => v == link,
            None => host_veth_name(&self.veth_prefix, &e.attachment_key()) == link,
        }
    }

    fn release_id(
        &mut self,
        id: u32,
        teardown: Option<&str>,
        released_at_ms: u64,
        key: &AttachmentKey,
    ) -> Result<ReleaseStep, Refusal> {
        let pool = self.pool_name(self.leases.get(id)).to_owned();
        let e = self.leases.get_mut(id);
        if e.state != LeaseState::Committed {
            return Ok(ReleaseStep::Wait(format!("a change to {key} is in flight")));
        }
        e.state = LeaseState::PendingRelease;
        // A recovered lease's own veth is the link to delete when the caller names none.
        let prefix = &self.veth_prefix;
        let teardown = teardown.map(Box::<str>::from).or_else(|| {
            e.network_is(RECOVERED_NETWORK)
                .then(|| e.host_veth().filter(|v| is_ours(v, prefix)).map(Into::into))
                .flatten()
        });
        Ok(ReleaseStep::Fresh {
            address: Ipv4Addr::from(e.addr),
            record: Record::Release(ReleaseRec {
                key: e.key().into(),
                addr: e.addr,
                released_at_ms,
                teardown,
            }),
            pool,
        })
    }

    /// Start releasing the lease at `addr` if it is still the one allocated at
    /// `allocated_at_ms` (reconcile: its veth is gone). `None` if it changed meanwhile.
    pub fn begin_release_stale(
        &mut self,
        addr: u32,
        allocated_at_ms: u64,
        now_ms: u64,
    ) -> Option<ReleaseStep> {
        let id = self.leases.by_addr(addr)?;
        let e = self.leases.get(id);
        if e.allocated_at_ms != allocated_at_ms || e.state != LeaseState::Committed {
            return None;
        }
        let key = e.attachment_key();
        self.release_id(id, None, now_ms, &key).ok()
    }

    /// Start releasing every committed lease of `network` not in `valid`. Their host veths
    /// are deleted once the releases are durable. Recovered leases (network unknown) are
    /// released too when no valid attachment hashes to their veth and `veth_gone` says the
    /// veth no longer exists (with several networks on a node, a recovered lease may belong
    /// to another one: its veth is the only safe evidence).
    pub fn begin_gc(
        &mut self,
        network: &str,
        valid: &[Attachment],
        now_ms: u64,
        veth_gone: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<(Record, Lease)>, Refusal> {
        if network.is_empty() {
            return Err(Refusal::bad("gc: network must not be empty".into()));
        }
        if network == RECOVERED_NETWORK {
            return Err(Refusal::bad(format!(
                "gc of the internal network {RECOVERED_NETWORK} is refused: its leases are \
                 released by the DEL of their real key, or once their veth is gone"
            )));
        }
        // A lease this young may belong to an ADD still running (or just done) that the
        // runtime's list does not name yet.
        let settled = |at: u64| now_ms.saturating_sub(at) >= self.gc_grace_ms;
        let valid_set: HashSet<(&str, &str)> = valid
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        let mut stale: Vec<u32> = Vec::new();
        for (id, e) in self.leases.iter() {
            if e.state != LeaseState::Committed
                || !e.network_is(network)
                || !settled(e.allocated_at_ms)
            {
                continue;
            }
            let k = e.attachment_key();
            if !valid_set.contains(&(k.container_id.as_str(), k.ifname.as_str())) {
                stale.push(id);
            }
        }
        if !self.recovered.is_empty() {
            let valid_veths: HashSet<String> = valid
                .iter()
                .map(|a| {
                    host_veth_name(
                        &self.veth_prefix,
                        &AttachmentKey::new(network, &a.container_id, &a.ifname),
                    )
                })
                .collect();
            for (veth, id) in &self.recovered {
                if self.leases.get(*id).state == LeaseState::Committed
                    && settled(self.leases.get(*id).allocated_at_ms)
                    && !valid_veths.contains(&**veth)
                    && veth_gone(veth)
                {
                    stale.push(*id);
                }
            }
        }
        let mut out = Vec::with_capacity(stale.len());
        for id in stale {
            let lease = self.lease_of(id);
            let e = self.leases.get_mut(id);
            e.state = LeaseState::PendingRelease;
            let record = Record::Release(ReleaseRec {
                key: e.key().into(),
                addr: e.addr,
                released_at_ms: now_ms,
                teardown: e
                    .host_veth()
                    .filter(|v| is_ours(v, &self.veth_prefix))
                    .map(Into::into),
            });
            out.push((record, lease));
        }
        Ok(out)
    }

    /// A record is durable: make its change final. Returns a link to delete now, if any.
    pub fn commit(&mut self, rec: &Record) -> Option<Box<str>> {
        match rec {
            Record::Alloc(a) => {
                if let Some(id) = self.leases.find(a.key()) {
                    self.leases.get_mut(id).state = LeaseState::Committed;
                }
                self.reused.remove(&a.addr);
                None
            }
            Record::Release(r) => {
                if let Some(id) = self.leases.find(&r.key) {
                    let e = self.leases.remove(id);
                    if e.network_is(RECOVERED_NETWORK) {
                        if let Some(v) = e.host_veth() {
                            self.recovered.remove(v.as_str());
                        }
                    }
                }
                match self.locate(r.addr) {
                    Some((p, idx)) => {
                        let pool = &mut self.pools[p];
                        if !pool.is_present(idx) {
                            pool.missing -= 1;
                        }
                        pool.slots[idx as usize] = Slot::Cooling;
                        pool.leased -= 1;
                        pool.push_cooling(idx, r.released_at_ms);
                    }
                    None => {
                        self.orphans -= 1;
                        self.unplaced_cooling.insert(r.addr, r.released_at_ms);
                    }
                }
                let link = r.teardown.as_ref()?;
                let fresh = !self.teardowns.contains_key(link);
                let in_pool = self.locate(r.addr).is_some();
                let held = self.teardowns.entry(link.clone()).or_default();
                if in_pool {
                    held.push(r.addr);
                    self.holds.insert(r.addr, link.clone());
                }
                fresh.then(|| link.clone())
            }
            Record::Cooling(_) | Record::End { .. } => None,
        }
    }

    /// A record could not be made durable: undo its in-memory reservation.
    pub fn abort(&mut self, rec: &Record) {
        match rec {
            Record::Alloc(a) => {
                let Some(id) = self.leases.find(a.key()) else {
                    return;
                };
                self.leases.remove(id);
                if let Some((p, idx)) = self.locate(a.addr) {
                    let pool = &mut self.pools[p];
                    pool.leased -= 1;
                    if let Some(at) = self.reused.remove(&a.addr) {
                        // Back into the FIFO at its place in time: the cooldown still runs.
                        pool.slots[idx as usize] = Slot::Cooling;
                        pool.push_cooling(idx, at);
                    } else {
                        pool.make_free(idx);
                    }
                }
            }
            Record::Release(r) => {
                if let Some(id) = self.leases.find(&r.key) {
                    self.leases.get_mut(id).state = LeaseState::Committed;
                }
            }
            Record::Cooling(_) | Record::End { .. } => {}
        }
    }

    /// True while the fresh allocation of `key` made at `allocated_at_ms` is committed and has
    /// not been handed to anyone else (an idempotent repeat) since.
    pub fn unseen_fresh(&self, key: &AttachmentKey, allocated_at_ms: u64) -> bool {
        self.leases.find(&encode_key(key)).is_some_and(|id| {
            let e = self.leases.get(id);
            e.state == LeaseState::Committed && !e.seen && e.allocated_at_ms == allocated_at_ms
        })
    }

    /// `link` is gone (or its deletion was given up): free what waited for it.
    pub fn teardown_done(&mut self, link: &str) {
        for addr in self.teardowns.remove(link).unwrap_or_default() {
            self.holds.remove(&addr);
            if let Some((p, idx)) = self.locate(addr) {
                let pool = &mut self.pools[p];
                if pool.slots[idx as usize] == Slot::Held {
                    pool.held -= 1;
                    pool.make_free(idx);
                }
            }
        }
    }

    /// Whether a teardown of `link` is pending.
    pub fn teardown_pending(&self, link: &str) -> bool {
        self.teardowns.contains_key(link)
    }

    /// The acknowledged lease of `key`, if any (or the recovered lease of its host veth). A
    /// change still in flight is not visible.
    pub fn check(&self, key: &AttachmentKey) -> Result<Option<Lease>, Refusal> {
        validate_key(key).map_err(Refusal::bad)?;
        let id = self
            .leases
            .find(&encode_key(key))
            .or_else(|| self.recovered_for(key, None));
        Ok(id
            .filter(|id| self.leases.get(*id).state != LeaseState::PendingAlloc)
            .map(|id| self.lease_of(id)))
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
        after: Option<u32>,
        limit: usize,
        max_bytes: usize,
    ) -> (Vec<Lease>, Option<u32>) {
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
        after: Option<u32>,
        limit: usize,
        mut f: impl FnMut(u32, &LeaseEntry),
    ) -> Option<u32> {
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
                source: p.spec.source.to_string(),
                total: p.size(),
                allocated: p.leased as u64,
                cooling: p.cooling_count() as u64,
                free: p.free.free_count() as u64,
                pending_teardown: p.held as u64,
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
                pending_teardown: p.held as u64,
                free: p.free.free_count() as u64,
                missing: p.reported_missing() as u64,
            })
            .collect()
    }

    /// Could an Allocate (restricted to `pool`) succeed now? (ready, free, reason)
    pub fn status(
        &mut self,
        pool: Option<&str>,
        now_ms: u64,
    ) -> Result<(bool, u64, Option<String>), Refusal> {
        let eligible = self.eligible(pool)?;
        self.expire(now_ms);
        let free: u64 = eligible
            .iter()
            .map(|&p| self.pools[p].free.free_count() as u64)
            .sum();
        let soon = eligible.iter().any(|&p| {
            let pl = &self.pools[p];
            pl.held > 0
                || (self.policy == OnOnlyCooling::ReuseOldest
                    && pl.cooling.iter().any(|(i, _)| pl.is_present(*i)))
        });
        if free > 0 || soon {
            Ok((true, free, None))
        } else {
            Ok((false, 0, Some(self.exhausted(&eligible, now_ms).message)))
        }
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
            let slot = match self.locate(a) {
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
                    if let Some(id) = self.leases.by_addr(a) {
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
        if let Some(id) = self.leases.by_addr(a) {
            self.orphans -= 1;
            self.leases.get_mut(id).pool_name = p as u16;
            let pool = &mut self.pools[p];
            pool.slots[idx as usize] = Slot::Leased;
            pool.leased += 1;
            // Not present until the caller marks it.
            pool.missing += 1;
        } else if let Some(at) = self.unplaced_cooling.remove(&a) {
            let pool = &mut self.pools[p];
            pool.slots[idx as usize] = Slot::Cooling;
            pool.push_cooling(idx, at);
        }
    }

    /// Encode a snapshot of every acknowledged fact (pending allocations excluded, pending
    /// releases still live) as generation `generation`. The daemon compacts on disk instead
    /// ([`crate::store::compact`]); this is for `recover` and tests.
    pub fn snapshot(&self, generation: u64) -> Vec<u8> {
        let mut w = SnapshotWriter::new(generation, self.leases.len() * 140 + 4096);
        for (_, e) in self.leases.iter() {
            if e.state == LeaseState::PendingAlloc {
                continue;
            }
            w.lease(&AllocRec {
                data: e.data.clone(),
                key_len: e.key_len,
                addr: e.addr,
                allocated_at_ms: e.allocated_at_ms,
                pool: self.pool_name(e).into(),
            });
        }
        for pool in &self.pools {
            for &(idx, at) in &pool.cooling {
                let addr = pool.addr_of(idx);
                w.cooling(CoolRec {
                    addr,
                    released_at_ms: at,
                    teardown: self.holds.get(&addr).cloned(),
                });
            }
        }
        for (addr, at) in &self.unplaced_cooling {
            w.cooling(CoolRec {
                addr: *addr,
                released_at_ms: *at,
                teardown: None,
            });
        }
        for (addr, link) in &self.holds {
            if let Some((p, idx)) = self.locate(*addr) {
                if self.pools[p].slots[idx as usize] == Slot::Held {
                    // Cooldown is over; only the teardown is left to redo after a crash.
                    w.cooling(CoolRec {
                        addr: *addr,
                        released_at_ms: 0,
                        teardown: Some(link.clone()),
                    });
                }
            }
        }
        w.finish()
    }

    /// Internal consistency check (tests and debug builds).
    pub fn check_invariants(&self) {
        let mut leased_per_pool = vec![0usize; self.pools.len()];
        let mut missing_per_pool = vec![0usize; self.pools.len()];
        let mut orphans = 0;
        let mut n = 0;
        for (id, e) in self.leases.iter() {
            n += 1;
            assert_eq!(self.leases.by_addr(e.addr), Some(id), "address index");
            assert_eq!(self.leases.find(e.key()), Some(id), "key index");
            match self.locate(e.addr) {
                Some((p, idx)) => {
                    assert_eq!(self.pools[p].slots[idx as usize], Slot::Leased);
                    leased_per_pool[p] += 1;
                    if !self.pools[p].is_present(idx) {
                        missing_per_pool[p] += 1;
                    }
                }
                None => orphans += 1,
            }
        }
        assert_eq!(n, self.leases.len());
        assert_eq!(orphans, self.orphans);
        for (veth, id) in &self.recovered {
            assert!(self.leases.get(*id).host_veth_is(veth));
        }
        for (p, pool) in self.pools.iter().enumerate() {
            assert_eq!(pool.leased, leased_per_pool[p], "pool {}", pool.spec.name);
            assert_eq!(pool.missing, missing_per_pool[p], "pool {}", pool.spec.name);
            let count = |s: Slot| pool.slots.iter().filter(|x| **x == s).count();
            assert_eq!(count(Slot::Cooling), pool.cooling.len());
            assert_eq!(count(Slot::Held), pool.held);
            let mut free = 0;
            for (i, s) in pool.slots.iter().enumerate() {
                let usable = *s == Slot::Free && pool.is_present(i as u32);
                assert_eq!(
                    usable,
                    pool.free.is_free(i),
                    "slot {i} of {}",
                    pool.spec.name
                );
                free += usize::from(usable);
            }
            assert_eq!(free, pool.free.free_count());
            if pool.dynamic() {
                assert_eq!(
                    pool.present.iter().filter(|x| **x).count(),
                    pool.present_count
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(pool_body: &str, extra: &str) -> Config {
        Config::parse(
            &format!("{extra}\n[[pool]]\nname=\"p\"\nsource=\"static\"\n{pool_body}\n"),
            Path::new("/test.toml"),
        )
        .unwrap()
    }

    fn key(c: &str) -> AttachmentKey {
        AttachmentKey::new("net", c, "eth0")
    }

    fn alloc(st: &mut State, c: &str, now: u64) -> Result<Lease, Refusal> {
        let k = key(c);
        let pod = PodRef::default();
        match st.begin_allocate(
            AllocRequest {
                key: &k,
                pod: &pod,
                pool: None,
                host_veth: None,
            },
            now,
        )? {
            AllocStep::Fresh { lease, record } => {
                st.commit(&record);
                Ok(lease)
            }
            AllocStep::Existing(l) => Ok(l),
            AllocStep::Wait(w) => panic!("wait: {w}"),
        }
    }

    fn release(st: &mut State, c: &str, now: u64) -> Option<Ipv4Addr> {
        match st.begin_release(&key(c), None, None, now).unwrap() {
            ReleaseStep::Fresh {
                record, address, ..
            } => {
                st.commit(&record);
                Some(address)
            }
            ReleaseStep::NotFound { .. } => None,
            ReleaseStep::Wait(w) => panic!("wait: {w}"),
        }
    }

    #[test]
    fn allocate_is_idempotent_and_round_robin() {
        let mut st = State::new(&config("cidrs=[\"10.0.0.0/30\"]", "cooldown=\"0s\""));
        let a = alloc(&mut st, "a", 1).unwrap();
        assert_eq!(a.address, Ipv4Addr::new(10, 0, 0, 0));
        assert_eq!(alloc(&mut st, "a", 2).unwrap(), a);
        let b = alloc(&mut st, "b", 3).unwrap();
        assert_eq!(b.address, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(release(&mut st, "a", 4), Some(a.address));
        // Even with no cooldown the freed address is not the next one handed out.
        assert_eq!(
            alloc(&mut st, "c", 5).unwrap().address,
            Ipv4Addr::new(10, 0, 0, 2)
        );
        assert_eq!(release(&mut st, "zzz", 6), None);
        st.check_invariants();
    }

    #[test]
    fn exhaustion_message_is_actionable() {
        let mut st = State::new(&config("cidrs=[\"10.240.1.0/30\"]", "cooldown=\"130s\""));
        for c in ["a", "b", "c", "d"] {
            alloc(&mut st, c, 0).unwrap();
        }
        let e = alloc(&mut st, "e", 0).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PoolExhausted);
        assert!(
            e.message.contains(
                "pool 'p' (10.240.1.0/30, 4 addresses) has no free address: 4 allocated, 0 cooling"
            ),
            "{}",
            e.message
        );
        release(&mut st, "a", 1_000);
        let e = alloc(&mut st, "e", 2_000).unwrap_err();
        assert_eq!(e.kind, ErrorKind::OnlyCooling);
        assert!(
            e.message.contains("3 allocated, 1 cooling"),
            "{}",
            e.message
        );
        assert!(e.message.contains("reusable in 129s"), "{}", e.message);
        assert!(e.message.contains("reuse-oldest"), "{}", e.message);
        let (ready, free, reason) = st.status(None, 2_000).unwrap();
        assert!(!ready);
        assert_eq!(free, 0);
        assert!(reason.unwrap().contains("1 cooling"));
        // After the cooldown the address is free again.
        let l = alloc(&mut st, "e", 131_000).unwrap();
        assert_eq!(l.address, Ipv4Addr::new(10, 240, 1, 0));
        st.check_invariants();
    }

    #[test]
    fn reuse_oldest_takes_the_longest_released() {
        let mut st = State::new(&config(
            "cidrs=[\"10.0.0.0/30\"]",
            "cooldown=\"130s\"\non_only_cooling=\"reuse-oldest\"",
        ));
        for c in ["a", "b", "c", "d"] {
            alloc(&mut st, c, 0).unwrap();
        }
        release(&mut st, "c", 10);
        release(&mut st, "a", 20);
        assert!(st.status(None, 30).unwrap().0);
        assert_eq!(
            alloc(&mut st, "e", 30).unwrap().address,
            Ipv4Addr::new(10, 0, 0, 2)
        );
        assert_eq!(
            alloc(&mut st, "f", 30).unwrap().address,
            Ipv4Addr::new(10, 0, 0, 0)
        );
        assert_eq!(
            alloc(&mut st, "g", 30).unwrap_err().kind,
            ErrorKind::PoolExhausted
        );
        st.check_invariants();
    }

    #[test]
    fn aborted_allocation_frees_the_slot_and_hides_the_lease() {
        let mut st = State::new(&config("ips=[\"10.0.0.1\"]", ""));
        let k = key("a");
        let pod = PodRef::default();
        let req = AllocRequest {
            key: &k,
            pod: &pod,
            pool: None,
            host_veth: None,
        };
        let AllocStep::Fresh { record, .. } = st.begin_allocate(req, 0).unwrap() else {
            panic!()
        };
        // Pending: invisible, and a repeat waits for it.
        assert_eq!(st.check(&k).unwrap(), None);
        assert!(matches!(
            st.begin_allocate(req, 0).unwrap(),
            AllocStep::Wait(_)
        ));
        assert!(matches!(
            st.begin_release(&k, None, None, 0).unwrap(),
            ReleaseStep::Wait(_)
        ));
        st.abort(&record);
        st.check_invariants();
        assert_eq!(st.check(&k).unwrap(), None);
        assert!(matches!(
            st.begin_allocate(req, 0).unwrap(),
            AllocStep::Fresh { .. }
        ));
    }

    #[test]
    fn held_address_waits_for_teardown() {
        let mut st = State::new(&config("ips=[\"10.0.0.1\"]", "cooldown=\"0s\""));
        let k = key("a");
        let old = host_veth_name("ali", &k);
        let pod = PodRef::default();
        let req = AllocRequest {
            key: &k,
            pod: &pod,
            pool: None,
            host_veth: Some(&old),
        };
        let AllocStep::Fresh { record, .. } = st.begin_allocate(req, 0).unwrap() else {
            panic!()
        };
        st.commit(&record);
        let ReleaseStep::Fresh { record, .. } = st.begin_release(&k, Some(&old), None, 1).unwrap()
        else {
            panic!()
        };
        assert_eq!(st.commit(&record).as_deref(), Some(old.as_str()));
        // The same veth name waits; so does anyone needing the held address.
        assert!(matches!(
            st.begin_allocate(req, 2).unwrap(),
            AllocStep::Wait(_)
        ));
        let k2 = key("b");
        let req2 = AllocRequest {
            key: &k2,
            host_veth: None,
            ..req
        };
        assert!(matches!(
            st.begin_allocate(req2, 2).unwrap(),
            AllocStep::Wait(_)
        ));
        let snap_has_teardown = st.snapshot(1);
        st.teardown_done(&old);
        st.check_invariants();
        assert!(matches!(
            st.begin_allocate(req2, 3).unwrap(),
            AllocStep::Fresh { .. }
        ));
        assert!(!snap_has_teardown.is_empty());
    }

    #[test]
    fn gc_releases_only_stale_leases_of_the_network() {
        let mut st = State::new(&config("cidrs=[\"10.0.0.0/28\"]", "gc_grace=\"0s\""));
        for c in ["a", "b", "c"] {
            alloc(&mut st, c, 0).unwrap();
        }
        let other = AttachmentKey::new("other", "x", "eth0");
        let pod = PodRef::default();
        let AllocStep::Fresh { record, .. } = st
            .begin_allocate(
                AllocRequest {
                    key: &other,
                    pod: &pod,
                    pool: None,
                    host_veth: None,
                },
                0,
            )
            .unwrap()
        else {
            panic!()
        };
        st.commit(&record);
        let valid = vec![Attachment {
            container_id: "b".into(),
            ifname: "eth0".into(),
        }];
        let out = st.begin_gc("net", &valid, 5, &|_| false).unwrap();
        let mut gone: Vec<String> = out
            .iter()
            .map(|(_, l)| l.key.container_id.clone())
            .collect();
        gone.sort();
        assert_eq!(gone, ["a", "c"]);
        for (r, _) in &out {
            st.commit(r);
        }
        assert_eq!(st.lease_count(), 2);
        st.check_invariants();
    }

    #[test]
    fn bad_requests_are_refused() {
        let mut st = State::new(&config("ips=[\"10.0.0.1\"]", ""));
        let pod = PodRef::default();
        let bad = AttachmentKey::new("net", "", "eth0");
        let e = st
            .begin_allocate(
                AllocRequest {
                    key: &bad,
                    pod: &pod,
                    pool: None,
                    host_veth: None,
                },
                0,
            )
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadRequest);
        let k = key("a");
        let e = st
            .begin_allocate(
                AllocRequest {
                    key: &k,
                    pod: &pod,
                    pool: Some("nope"),
                    host_veth: None,
                },
                0,
            )
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownPool);
        assert!(e.message.contains("'p'"));
        let e = st
            .begin_allocate(
                AllocRequest {
                    key: &k,
                    pod: &pod,
                    pool: None,
                    host_veth: Some("far-too-long-interface"),
                },
                0,
            )
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadRequest);
        assert_eq!(
            st.status(Some("nope"), 0).unwrap_err().kind,
            ErrorKind::UnknownPool
        );
    }

    #[test]
    fn allocation_stays_fast_when_nearly_full() {
        // A /14 at 100% occupancy minus a few scattered holes: every allocation must still be
        // found through the summary level, not a linear scan.
        let mut st = State::new(&config("cidrs=[\"10.64.0.0/14\"]", "cooldown=\"0s\""));
        let n = 1usize << 18;
        let pod = PodRef::default();
        for i in 0..n {
            let k = AttachmentKey::new("net", &format!("c{i}"), "eth0");
            let AllocStep::Fresh { record, .. } = st
                .begin_allocate(
                    AllocRequest {
                        key: &k,
                        pod: &pod,
                        pool: None,
                        host_veth: None,
                    },
                    0,
                )
                .unwrap()
            else {
                panic!()
            };
            st.commit(&record);
        }
        assert_eq!(st.stats(0)[0].free, 0);
        let start = std::time::Instant::now();
        for round in 0..2000 {
            let victim = (round * 7919) % n;
            release(&mut st, &format!("c{victim}"), 1);
            alloc(&mut st, &format!("c{victim}"), 1).unwrap();
        }
        let per_op = start.elapsed() / 4000;
        // Generous bound for a shared debug build; a linear scan would take ~100x longer.
        assert!(per_op < std::time::Duration::from_micros(200), "{per_op:?}");
        st.check_invariants();
    }
}
