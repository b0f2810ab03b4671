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

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fmt::Write as _,
    net::Ipv4Addr,
    time::Duration,
};

use aliasnet_ipam_proto::{Attachment, AttachmentKey, ErrorKind, Lease, PodRef, PoolStats};

use crate::{
    bitmap::FreeBitmap,
    config::{Config, OnOnlyCooling, PoolSpec},
    lease::{
        key_parts, pack_extra, pack_key, validate_ifname, validate_key, validate_pod, LeaseEntry,
        LeaseState,
    },
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
    /// Pool-local index of the first address of each range in `spec.ranges`.
    bases: Vec<u32>,
    free: FreeBitmap,
    slots: Vec<Slot>,
    /// (slot, release time in ms), oldest first.
    cooling: VecDeque<(u32, u64)>,
    held: usize,
    leased: usize,
}

impl Pool {
    fn new(spec: PoolSpec) -> Self {
        let mut bases = Vec::with_capacity(spec.ranges.len());
        let mut n = 0u32;
        for r in &spec.ranges {
            bases.push(n);
            n += r.len() as u32;
        }
        Self {
            free: FreeBitmap::new_free(n as usize),
            slots: vec![Slot::Free; n as usize],
            spec,
            bases,
            cooling: VecDeque::new(),
            held: 0,
            leased: 0,
        }
    }

    fn addr_of(&self, idx: u32) -> u32 {
        let k = self.bases.partition_point(|b| *b <= idx) - 1;
        self.spec.ranges[k].first + (idx - self.bases[k])
    }

    /// Cooling addresses that are not reusable yet (including held ones).
    fn cooling_count(&self) -> usize {
        self.cooling.len() + self.held
    }

    fn usage(&self, cooldown: Duration, now_ms: u64) -> String {
        let mut s = format!(
            "pool '{}' ({}, {} addresses) has no free address: {} allocated, {} cooling",
            self.spec.name,
            self.spec.description,
            self.spec.size,
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
}

pub struct State {
    cooldown: Duration,
    policy: OnOnlyCooling,
    pools: Vec<Pool>,
    spans: Vec<Span>,
    /// Pool names: the configured pools first, then names only old records mention.
    names: Vec<Box<str>>,
    leases: HashMap<Box<str>, LeaseEntry>,
    orphans: usize,
    /// Address -> link whose deletion it waits for.
    holds: HashMap<u32, Box<str>>,
    /// Link being deleted -> addresses held until it is gone.
    teardowns: HashMap<Box<str>, Vec<u32>>,
    /// Pending allocations that took a cooling address (`reuse-oldest`): address -> release
    /// time, so an abort puts it back to cool instead of freeing it early.
    reused: HashMap<u32, u64>,
}

/// Pool and pool-local slot of `addr`.
fn locate(spans: &[Span], addr: u32) -> Option<(usize, u32)> {
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
            policy: config.on_only_cooling,
            names: pools.iter().map(|p| p.spec.name.as_str().into()).collect(),
            pools,
            spans,
            leases: HashMap::new(),
            orphans: 0,
            holds: HashMap::new(),
            teardowns: HashMap::new(),
            reused: HashMap::new(),
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
        // Take the loaded map as is: re-inserting 200,000 leases would double the load time.
        st.leases = leases;
        let mut orphan_names: Vec<(Box<str>, u16)> = Vec::new();
        for (key, e) in &mut st.leases {
            match locate(&st.spans, e.addr) {
                Some((p, idx)) => {
                    let pool = &mut st.pools[p];
                    pool.free.take(idx as usize);
                    pool.slots[idx as usize] = Slot::Leased;
                    pool.leased += 1;
                    e.pool_name = p as u16;
                }
                None => {
                    st.orphans += 1;
                    orphan_names.push((key.clone(), e.pool_name));
                }
            }
        }
        for (key, loaded_name) in orphan_names {
            let idx = st.intern(&names[loaded_name as usize]);
            let e = st.leases.get_mut(&key).expect("listed above");
            e.pool_name = idx;
            let e = &st.leases[&key];
            report.orphans.push(st.lease_of(&key, e));
        }
        report.leases = st.leases.len();

        let live_veths: HashSet<&str> = if cooling.values().any(|(_, t)| t.is_some()) {
            st.leases
                .values()
                .filter_map(LeaseEntry::host_veth)
                .collect()
        } else {
            HashSet::new()
        };
        let mut cooling: Vec<(u32, u64, Option<Box<str>>)> =
            cooling.into_iter().map(|(a, (t, l))| (a, t, l)).collect();
        cooling.sort_by_key(|(a, t, _)| (*t, *a));
        let mut holds = Vec::new();
        for (addr, at, link) in cooling {
            // A link a live lease uses again was already deleted and re-created: keep it.
            let link = link.filter(|l| !live_veths.contains(&**l));
            if let Some((p, idx)) = st.locate(addr) {
                let pool = &mut st.pools[p];
                if pool.slots[idx as usize] == Slot::Free {
                    pool.free.take(idx as usize);
                    pool.slots[idx as usize] = Slot::Cooling;
                    // A clock that went backwards must not stretch the cooldown without bound.
                    pool.cooling.push_back((idx, at.min(now_ms)));
                    report.cooling += 1;
                    if let Some(l) = &link {
                        holds.push((addr, l.clone()));
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
        // Bounded: MAX_POOLS configured names plus at most one per orphaned lease's pool.
        u16::try_from(self.names.len() - 1).unwrap_or(u16::MAX)
    }

    fn locate(&self, addr: u32) -> Option<(usize, u32)> {
        locate(&self.spans, addr)
    }

    fn pool_name(&self, e: &LeaseEntry) -> &str {
        self.names.get(e.pool_name as usize).map_or("", |n| &**n)
    }

    fn lease_of(&self, key: &str, e: &LeaseEntry) -> Lease {
        e.to_lease(key, self.pool_name(e))
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
                    pool.slots[idx as usize] = Slot::Free;
                    pool.free.set_free(idx as usize);
                }
            }
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
        }
        let eligible = self.eligible(req.pool)?;
        let key = pack_key(req.key);
        if let Some(e) = self.leases.get_mut(&key) {
            if e.state != LeaseState::Committed {
                return Ok(AllocStep::Wait(format!(
                    "a change to {} is in flight",
                    req.key
                )));
            }
            e.seen = true;
            let e = &self.leases[&key];
            return Ok(AllocStep::Existing(self.lease_of(&key, e)));
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
        let (extra, present) = pack_extra(req.pod, req.host_veth);
        let entry = LeaseEntry {
            extra: extra.clone(),
            present,
            state: LeaseState::PendingAlloc,
            seen: false,
            pool_name: p as u16,
            addr,
            allocated_at_ms: now_ms,
        };
        let lease = entry.to_lease(&key, &pool.spec.name);
        let record = Record::Alloc(AllocRec {
            key: key.clone(),
            addr,
            allocated_at_ms: now_ms,
            pool: pool.spec.name.as_str().into(),
            extra,
            present,
        });
        self.leases.insert(key, entry);
        Ok(AllocStep::Fresh { lease, record })
    }

    /// `reuse-oldest`: the cooling address released longest ago among `eligible` (not held).
    fn take_oldest_cooling(&mut self, eligible: &[usize]) -> Option<(usize, u32)> {
        let mut best: Option<(u64, usize, usize)> = None;
        for &p in eligible {
            let pool = &self.pools[p];
            // Held links are deleted within milliseconds, so a held entry is rarely far in.
            if let Some((pos, &(_, at))) = pool
                .cooling
                .iter()
                .enumerate()
                .find(|(_, (idx, _))| !self.holds.contains_key(&pool.addr_of(*idx)))
            {
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
        let mut msg = eligible
            .iter()
            .map(|&p| self.pools[p].usage(self.cooldown, now_ms))
            .collect::<Vec<_>>()
            .join("; ");
        if cooling > 0 {
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
    /// the DEL that spooled it and is left alone.
    pub fn begin_release(
        &mut self,
        key: &AttachmentKey,
        teardown: Option<&str>,
        not_after: Option<u64>,
        now_ms: u64,
    ) -> Result<ReleaseStep, Refusal> {
        validate_key(key).map_err(Refusal::bad)?;
        if let Some(v) = teardown {
            validate_ifname("teardown_link", v).map_err(Refusal::bad)?;
        }
        let packed = pack_key(key);
        let released_at_ms = not_after.map_or(now_ms, |t| t.min(now_ms));
        let Some(e) = self.leases.get_mut(&packed) else {
            return Ok(ReleaseStep::NotFound {
                teardown: teardown.and_then(|l| self.queue_unowned_teardown(l)),
            });
        };
        if e.state != LeaseState::Committed {
            return Ok(ReleaseStep::Wait(format!("a change to {key} is in flight")));
        }
        if not_after.is_some_and(|t| e.allocated_at_ms > t) {
            return Ok(ReleaseStep::NotFound { teardown: None });
        }
        e.state = LeaseState::PendingRelease;
        Ok(ReleaseStep::Fresh {
            address: Ipv4Addr::from(e.addr),
            record: Record::Release(ReleaseRec {
                key: packed,
                addr: e.addr,
                released_at_ms,
                teardown: teardown.map(Into::into),
            }),
        })
    }

    /// Register a link with no lease behind it for deletion; `Some` if newly queued.
    fn queue_unowned_teardown(&mut self, link: &str) -> Option<Box<str>> {
        if self.teardowns.contains_key(link) {
            return None;
        }
        self.teardowns.insert(link.into(), Vec::new());
        Some(link.into())
    }

    /// Start releasing every committed lease of `network` not in `valid`. Their host veths
    /// are deleted once the releases are durable.
    pub fn begin_gc(
        &mut self,
        network: &str,
        valid: &[Attachment],
        now_ms: u64,
    ) -> Result<Vec<(Record, Lease)>, Refusal> {
        if network.is_empty() {
            return Err(Refusal::bad("gc: network must not be empty".into()));
        }
        let valid: HashSet<(&str, &str)> = valid
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        let stale: Vec<Box<str>> = self
            .leases
            .iter()
            .filter(|(k, e)| {
                let (n, c, i) = key_parts(k);
                e.state == LeaseState::Committed && n == network && !valid.contains(&(c, i))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::with_capacity(stale.len());
        for key in stale {
            let lease = self.lease_of(&key, &self.leases[&key]);
            let e = self.leases.get_mut(&key).expect("just listed");
            e.state = LeaseState::PendingRelease;
            let record = Record::Release(ReleaseRec {
                key,
                addr: e.addr,
                released_at_ms: now_ms,
                teardown: e.host_veth().map(Into::into),
            });
            out.push((record, lease));
        }
        Ok(out)
    }

    /// A record is durable: make its change final. Returns a link to delete now, if any.
    pub fn commit(&mut self, rec: &Record) -> Option<Box<str>> {
        match rec {
            Record::Alloc(a) => {
                if let Some(e) = self.leases.get_mut(&a.key) {
                    e.state = LeaseState::Committed;
                }
                self.reused.remove(&a.addr);
                None
            }
            Record::Release(r) => {
                self.leases.remove(&r.key);
                match self.locate(r.addr) {
                    Some((p, idx)) => {
                        let pool = &mut self.pools[p];
                        pool.slots[idx as usize] = Slot::Cooling;
                        pool.leased -= 1;
                        let at = r.released_at_ms;
                        if pool.cooling.back().is_none_or(|(_, t)| *t <= at) {
                            pool.cooling.push_back((idx, at));
                        } else {
                            // A spooled release carries the older time of its DEL.
                            let pos = pool.cooling.partition_point(|(_, t)| *t <= at);
                            pool.cooling.insert(pos, (idx, at));
                        }
                    }
                    None => self.orphans -= 1,
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
                if self.leases.remove(&a.key).is_some() {
                    if let Some((p, idx)) = self.locate(a.addr) {
                        let pool = &mut self.pools[p];
                        pool.leased -= 1;
                        if let Some(at) = self.reused.remove(&a.addr) {
                            // Back into the FIFO at its place in time: the cooldown still runs.
                            pool.slots[idx as usize] = Slot::Cooling;
                            let pos = pool.cooling.partition_point(|(_, t)| *t <= at);
                            pool.cooling.insert(pos, (idx, at));
                        } else {
                            pool.slots[idx as usize] = Slot::Free;
                            pool.free.set_free(idx as usize);
                        }
                    }
                }
            }
            Record::Release(r) => {
                if let Some(e) = self.leases.get_mut(&r.key) {
                    e.state = LeaseState::Committed;
                }
            }
            Record::Cooling(_) | Record::End { .. } => {}
        }
    }

    /// True while the fresh allocation of `key` made at `allocated_at_ms` is committed and has
    /// not been handed to anyone else (an idempotent repeat) since.
    pub fn unseen_fresh(&self, key: &AttachmentKey, allocated_at_ms: u64) -> bool {
        self.leases.get(&pack_key(key)).is_some_and(|e| {
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
                    pool.slots[idx as usize] = Slot::Free;
                    pool.held -= 1;
                    pool.free.set_free(idx as usize);
                }
            }
        }
    }

    /// Whether a teardown of `link` is pending.
    pub fn teardown_pending(&self, link: &str) -> bool {
        self.teardowns.contains_key(link)
    }

    /// The acknowledged lease of `key`, if any. A change still in flight is not visible.
    pub fn check(&self, key: &AttachmentKey) -> Result<Option<Lease>, Refusal> {
        validate_key(key).map_err(Refusal::bad)?;
        let packed = pack_key(key);
        Ok(self
            .leases
            .get(&packed)
            .filter(|e| e.state != LeaseState::PendingAlloc)
            .map(|e| self.lease_of(&packed, e)))
    }

    /// Every acknowledged lease.
    pub fn list(&self) -> Vec<Lease> {
        let mut v: Vec<Lease> = self
            .leases
            .iter()
            .filter(|(_, e)| e.state != LeaseState::PendingAlloc)
            .map(|(k, e)| self.lease_of(k, e))
            .collect();
        v.sort_by_key(|l| l.address);
        v
    }

    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    pub fn orphan_count(&self) -> usize {
        self.orphans
    }

    pub fn stats(&mut self, now_ms: u64) -> Vec<PoolStats> {
        self.expire(now_ms);
        self.pools
            .iter()
            .map(|p| PoolStats {
                name: p.spec.name.clone(),
                source: p.spec.source.to_string(),
                total: p.spec.size,
                allocated: p.leased as u64,
                cooling: p.cooling_count() as u64,
                free: p.free.free_count() as u64,
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
            pl.held > 0 || (self.policy == OnOnlyCooling::ReuseOldest && !pl.cooling.is_empty())
        });
        if free > 0 || soon {
            Ok((true, free, None))
        } else {
            Ok((false, 0, Some(self.exhausted(&eligible, now_ms).message)))
        }
    }

    /// Encode a snapshot of every acknowledged fact (pending allocations excluded, pending
    /// releases still live) as generation `generation`.
    pub fn snapshot(&self, generation: u64) -> Vec<u8> {
        let mut w = SnapshotWriter::new(generation, self.leases.len() * 160 + 4096);
        for (k, e) in &self.leases {
            if e.state == LeaseState::PendingAlloc {
                continue;
            }
            w.lease(&AllocRec {
                key: k.clone(),
                addr: e.addr,
                allocated_at_ms: e.allocated_at_ms,
                pool: self.pool_name(e).into(),
                extra: e.extra.clone(),
                present: e.present,
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
        let mut seen = HashSet::new();
        let mut orphans = 0;
        for e in self.leases.values() {
            assert!(
                seen.insert(e.addr),
                "address {} leased twice",
                Ipv4Addr::from(e.addr)
            );
            match self.locate(e.addr) {
                Some((p, idx)) => {
                    assert_eq!(self.pools[p].slots[idx as usize], Slot::Leased);
                    leased_per_pool[p] += 1;
                }
                None => orphans += 1,
            }
        }
        assert_eq!(orphans, self.orphans);
        for (p, pool) in self.pools.iter().enumerate() {
            assert_eq!(pool.leased, leased_per_pool[p], "pool {}", pool.spec.name);
            let count = |s: Slot| pool.slots.iter().filter(|x| **x == s).count();
            assert_eq!(count(Slot::Free), pool.free.free_count());
            assert_eq!(count(Slot::Cooling), pool.cooling.len());
            assert_eq!(count(Slot::Held), pool.held);
            for (i, s) in pool.slots.iter().enumerate() {
                assert_eq!(*s == Slot::Free, pool.free.is_free(i));
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
            ReleaseStep::Fresh { record, address } => {
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
        let pod = PodRef::default();
        let req = AllocRequest {
            key: &k,
            pod: &pod,
            pool: None,
            host_veth: Some("aliold"),
        };
        let AllocStep::Fresh { record, .. } = st.begin_allocate(req, 0).unwrap() else {
            panic!()
        };
        st.commit(&record);
        let ReleaseStep::Fresh { record, .. } =
            st.begin_release(&k, Some("aliold"), None, 1).unwrap()
        else {
            panic!()
        };
        assert_eq!(st.commit(&record).as_deref(), Some("aliold"));
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
        st.teardown_done("aliold");
        st.check_invariants();
        assert!(matches!(
            st.begin_allocate(req2, 3).unwrap(),
            AllocStep::Fresh { .. }
        ));
        assert!(!snap_has_teardown.is_empty());
    }

    #[test]
    fn gc_releases_only_stale_leases_of_the_network() {
        let mut st = State::new(&config("cidrs=[\"10.0.0.0/28\"]", ""));
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
        let out = st.begin_gc("net", &valid, 5).unwrap();
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
