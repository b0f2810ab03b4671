//! Encoding the acknowledged state as a snapshot, and the invariant check.

use crate::{
    lease::{Addr, LeaseState},
    store::{
        record::{AllocRec, CoolRec},
        SnapshotWriter,
    },
};

use super::{pool::Slot, State};

impl State {
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
                let addr = Addr::from(pool.addr_of(idx));
                w.cooling(CoolRec {
                    addr,
                    released_at_ms: at,
                    teardown: self.holds.get(&addr).cloned(),
                });
            }
        }
        for pool in &self.pools6 {
            for &(addr, at) in &pool.cooling {
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
            if let Some(q) = self.locate6(*addr) {
                if self.pools6[q].held.contains(addr) {
                    w.cooling(CoolRec {
                        addr: *addr,
                        released_at_ms: 0,
                        teardown: Some(link.clone()),
                    });
                }
            }
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
        let mut leased6 = vec![0usize; self.pools6.len()];
        let mut missing6 = vec![0usize; self.pools6.len()];
        let mut orphans = 0;
        let mut n = 0;
        for (id, e) in self.leases.iter() {
            n += 1;
            assert_eq!(self.leases.by_addr(e.addr), Some(id), "address index");
            assert_eq!(self.leases.find(e.key(), e.family()), Some(id), "key index");
            if let Some(q) = self.locate6(e.addr) {
                leased6[q] += 1;
                missing6[q] += usize::from(!self.pools6[q].is_present(e.addr));
                assert!(!self.pools6[q].is_free(e.addr), "leased and free");
                continue;
            }
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
        for (veth, ids) in &self.recovered {
            assert!(!ids.is_empty() && ids.len() <= 2, "{veth}");
            assert!(ids.is_sorted_by_key(|id| self.leases.get(*id).addr));
            for id in ids {
                assert!(self.leases.get(*id).host_veth_is(veth));
            }
        }
        for (q, pool) in self.pools6.iter().enumerate() {
            assert_eq!(pool.leased, leased6[q], "pool {}", pool.spec.name);
            assert_eq!(pool.missing, missing6[q], "pool {}", pool.spec.name);
            pool.check();
            for (a, _) in &pool.cooling {
                assert!(!pool.is_free(*a) && self.leases.by_addr(*a).is_none());
            }
            for a in &pool.held {
                assert!(!pool.is_free(*a) && self.leases.by_addr(*a).is_none());
            }
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
