//! The allocator: pools, leases, cooldown and pending link teardowns, in memory.
//!
//! Pure and synchronous (time is a parameter), so it can be unit- and property-tested. The
//! daemon keeps it under a short mutex and never holds that across disk I/O: a change is made
//! here first as *pending* (the address is reserved so no other key can take it, but readers do
//! not see it), its record goes to the writer, and the writer then calls [`State::commit`] or
//! [`State::abort`].
//!
//! Address life cycle, the same in every pool of either family:
//! `Free -> Leased -> Cooling (FIFO, for the cooldown) -> Free`, with a detour through `Held`
//! when the cooldown ends while the old host veth is still being deleted (its /32 or /128
//! route still points at the old veth until then). How a pool keeps its free addresses
//! depends on its size ([`free`]: a bitmap for a static IPv4 pool, intervals for a delegated
//! IPv6 prefix that is never enumerated).
//!
//! Metadata pools (`azure-imds`) learn their addresses at run time ([`State::apply_metadata`]).
//! An address is *known* once first seen and stays known; it is *present* while the last good
//! read lists it. An address is in the free set exactly when it is free and present, so an
//! address that left the metadata is never handed out, whatever state it was in: a free one
//! leaves the pool at once, a leased one (reported as *missing*) stays with its pod and, once
//! released, cools down and then stays out until the metadata lists it again.

mod alloc;
mod free;
mod load;
mod metadata;
mod pool;
mod release;
mod report;
mod snapshot;
#[cfg(test)]
mod tests;

use std::{collections::HashMap, net::IpAddr, time::Duration};

use aliasnet_ipam_proto::{AttachmentKey, ErrorKind, Family, Lease, PodRef, RECOVERED_NETWORK};

use crate::{
    config::{Config, OnOnlyCooling},
    lease::addr_family,
    lease::{encode_key, Addr, LeaseEntry, LeaseState, LeaseTable},
    store::record::Record,
};

pub use load::LoadReport;
pub use metadata::{MetaPool, MetadataChange};
use pool::{locate_span, Pool};
pub use report::PoolCounts;

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

    fn bad(message: impl std::fmt::Display) -> Self {
        Self::new(ErrorKind::BadRequest, message.to_string())
    }
}

/// Allocate arguments.
#[derive(Debug, Clone, Copy)]
pub struct AllocRequest<'a> {
    pub key: &'a AttachmentKey,
    pub pod: &'a PodRef,
    pub pool: Option<&'a str>,
    pub host_veth: Option<&'a str>,
    /// The families wanted; `None`: every family a pool serves.
    pub families: Option<&'a [Family]>,
}

#[derive(Debug)]
pub enum AllocStep {
    /// The key already holds these leases (idempotent repeat), IPv4 first.
    Existing(Vec<Lease>),
    /// New reservations (IPv4 first): durable once `records` are committed, together.
    Fresh {
        leases: Vec<Lease>,
        records: Vec<Record>,
    },
    /// Something this request depends on is in flight; retry after the next change.
    Wait(WaitReason),
}

/// Why a request waits for another change before it can go on (shown in the refusal when
/// the wait times out).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitReason {
    #[error("a change to {key} is in flight")]
    InFlight { key: AttachmentKey },
    #[error("host veth {veth} of a previous attachment is still being deleted")]
    VethBeingDeleted { veth: String },
    #[error("the only reusable addresses wait for their old host veth to be deleted")]
    OnlyHeldAddresses,
}

#[derive(Debug)]
pub enum ReleaseStep {
    /// The key holds nothing. `teardown` is a link newly queued for deletion.
    NotFound {
        teardown: Option<Box<str>>,
    },
    /// The key's leases (IPv4 first) are being released: one record and pool name each.
    Fresh {
        records: Vec<Record>,
        /// The IPv4 address when there is one, else the IPv6 one.
        address: IpAddr,
        pools: Vec<String>,
    },
    Wait(WaitReason),
}

pub struct State {
    cooldown: Duration,
    gc_grace_ms: u64,
    policy: OnOnlyCooling,
    veth_prefix: String,
    /// The configured pools, the IPv4 ones first; a pool's index is its name's in `names`.
    pools: Vec<Pool>,
    /// (first, last, pool) of every static range of either family, by first address.
    spans: Vec<(Addr, Addr, usize)>,
    /// Pool names: the configured pools first, then names only old records mention.
    names: Vec<Box<str>>,
    leases: LeaseTable,
    orphans: usize,
    /// Address -> link whose deletion it waits for.
    holds: HashMap<Addr, Box<str>>,
    /// Link being deleted -> addresses held until it is gone.
    teardowns: HashMap<Box<str>, Vec<Addr>>,
    /// Pending allocations that took a cooling address (`reuse-oldest`): address -> release
    /// time, so an abort puts it back to cool instead of freeing it early.
    reused: HashMap<Addr, u64>,
    /// Released addresses in no pool yet (a metadata pool's, before its first read after a
    /// restart): address -> release time. They cool down when the metadata lists them again.
    unplaced_cooling: HashMap<Addr, u64>,
    /// Recovered leases (key unknown) by host veth -> lease ids (one per family, by address:
    /// IPv4 first).
    recovered: HashMap<Box<str>, Vec<u32>>,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl State {
    /// An empty state over the configured pools.
    pub fn new(config: &Config) -> Self {
        // IPv4 pools first: listings, stats and messages name them in that order.
        let (v4, v6): (Vec<_>, Vec<_>) = config
            .pools
            .iter()
            .cloned()
            .partition(|p| p.family == Family::Ipv4);
        let pools: Vec<Pool> = v4.into_iter().chain(v6).map(Pool::new).collect();
        let mut spans: Vec<(Addr, Addr, usize)> = pools
            .iter()
            .enumerate()
            .flat_map(|(p, pool)| pool.spec.address_ranges().map(move |(f, l)| (f, l, p)))
            .collect();
        spans.sort_unstable();
        Self {
            cooldown: config.cooldown,
            gc_grace_ms: ms(config.gc_grace),
            policy: config.on_only_cooling,
            veth_prefix: config.host_veth_prefix.clone(),
            names: pools.iter().map(|p| p.spec.name.as_str().into()).collect(),
            pools,
            spans,
            leases: LeaseTable::default(),
            orphans: 0,
            holds: HashMap::new(),
            teardowns: HashMap::new(),
            reused: HashMap::new(),
            unplaced_cooling: HashMap::new(),
            recovered: HashMap::new(),
        }
    }

    fn intern(&mut self, name: &str) -> u16 {
        if let Some(i) = self.names.iter().position(|n| &**n == name) {
            return i as u16;
        }
        self.names.push(name.into());
        // Bounded: MAX_POOLS configured names plus the few that old records mention.
        u16::try_from(self.names.len() - 1).unwrap_or(u16::MAX)
    }

    /// The pool of `addr`: a range of a static pool, or an address a metadata pool has seen.
    fn locate(&self, addr: Addr) -> Option<usize> {
        locate_span(&self.spans, addr).or_else(|| self.pools.iter().position(|p| p.knows(addr)))
    }

    fn pool_name(&self, e: &LeaseEntry) -> &str {
        self.names.get(e.pool_name as usize).map_or("", |n| &**n)
    }

    fn lease_of(&self, id: u32) -> Lease {
        let e = self.leases.get(id);
        let mut l = e.to_lease(self.pool_name(e));
        if let Some(p) = self.locate(e.addr) {
            let pool = &self.pools[p];
            l.missing = pool.dynamic() && pool.synced && !pool.is_present(e.addr);
        }
        l
    }

    /// Move every address whose cooldown is over out of its pool's FIFO.
    pub fn expire(&mut self, now_ms: u64) {
        let cd = ms(self.cooldown);
        for pool in &mut self.pools {
            while let Some(&(addr, at)) = pool.cooling.front() {
                if at.saturating_add(cd) > now_ms {
                    break;
                }
                pool.cooling.pop_front();
                if self.holds.contains_key(&addr) {
                    pool.held.insert(addr);
                } else {
                    pool.make_free(addr);
                }
            }
        }
        if !self.unplaced_cooling.is_empty() {
            self.unplaced_cooling
                .retain(|_, at| at.saturating_add(cd) > now_ms);
        }
    }

    /// A record is durable: make its change final. Returns a link to delete now, if any.
    pub fn commit(&mut self, rec: &Record) -> Option<Box<str>> {
        match rec {
            Record::Alloc(a) => {
                if let Some(id) = self.leases.find(a.key(), addr_family(a.addr)) {
                    self.leases.get_mut(id).state = LeaseState::Committed;
                }
                self.reused.remove(&a.addr);
                None
            }
            Record::Release(r) => {
                if let Some(id) = self.leases.find(&r.key, addr_family(r.addr)) {
                    let e = self.leases.remove(id);
                    if e.network_is(RECOVERED_NETWORK) {
                        if let Some(v) = e.host_veth() {
                            if let Some(ids) = self.recovered.get_mut(v.as_str()) {
                                ids.retain(|i| *i != id);
                                if ids.is_empty() {
                                    self.recovered.remove(v.as_str());
                                }
                            }
                        }
                    }
                }
                match self.locate(r.addr) {
                    Some(p) => {
                        let pool = &mut self.pools[p];
                        if !pool.is_present(r.addr) {
                            pool.missing -= 1;
                        }
                        pool.leased -= 1;
                        pool.push_cooling(r.addr, r.released_at_ms);
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
                let Some(id) = self.leases.find(a.key(), addr_family(a.addr)) else {
                    return;
                };
                self.leases.remove(id);
                if let Some(p) = self.locate(a.addr) {
                    let pool = &mut self.pools[p];
                    pool.leased -= 1;
                    match self.reused.remove(&a.addr) {
                        // Back into the FIFO at its place in time: the cooldown still runs.
                        Some(at) => pool.push_cooling(a.addr, at),
                        None => pool.make_free(a.addr),
                    }
                }
            }
            Record::Release(r) => {
                if let Some(id) = self.leases.find(&r.key, addr_family(r.addr)) {
                    self.leases.get_mut(id).state = LeaseState::Committed;
                }
            }
            Record::Cooling(_) | Record::End { .. } => {}
        }
    }

    /// True while the fresh allocation of `key` made at `allocated_at_ms` is committed and has
    /// not been handed to anyone else (an idempotent repeat) since.
    pub fn unseen_fresh(&self, key: &AttachmentKey, allocated_at_ms: u64) -> bool {
        let mut ids = self.leases.find_all(&encode_key(key)).peekable();
        ids.peek().is_some()
            && ids.all(|id| {
                let e = self.leases.get(id);
                e.state == LeaseState::Committed && !e.seen && e.allocated_at_ms == allocated_at_ms
            })
    }

    /// `link` is gone (or its deletion was given up): free what waited for it.
    pub fn teardown_done(&mut self, link: &str) {
        for addr in self.teardowns.remove(link).unwrap_or_default() {
            self.holds.remove(&addr);
            if let Some(p) = self.locate(addr) {
                let pool = &mut self.pools[p];
                if pool.held.remove(&addr) {
                    pool.make_free(addr);
                }
            }
        }
    }

    /// Whether a teardown of `link` is pending.
    pub fn teardown_pending(&self, link: &str) -> bool {
        self.teardowns.contains_key(link)
    }
}
