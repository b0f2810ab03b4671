//! Encoding the acknowledged state as a snapshot, and the invariant check.

use crate::{
    lease::LeaseState,
    store::{
        record::{AllocRec, CoolRec},
        SnapshotWriter,
    },
};

use super::State;

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
            if let Some(p) = self.locate(*addr) {
                if self.pools[p].held.contains(addr) {
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
        let mut leased = vec![0usize; self.pools.len()];
        let mut missing = vec![0usize; self.pools.len()];
        let mut orphans = 0;
        let mut n = 0;
        for (id, e) in self.leases.iter() {
            n += 1;
            assert_eq!(self.leases.by_addr(e.addr), Some(id), "address index");
            assert_eq!(self.leases.find(e.key(), e.family()), Some(id), "key index");
            match self.locate(e.addr) {
                Some(p) => {
                    let pool = &self.pools[p];
                    leased[p] += 1;
                    missing[p] += usize::from(!pool.is_present(e.addr));
                    assert!(!pool.free.is_free(e.addr), "leased and free");
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
        for (p, pool) in self.pools.iter().enumerate() {
            let name = &pool.spec.name;
            assert_eq!(pool.leased, leased[p], "pool {name}");
            assert_eq!(pool.missing, missing[p], "pool {name}");
            pool.check();
            let mut waiting = 0u64;
            for a in pool.cooling.iter().map(|(a, _)| a).chain(&pool.held) {
                assert!(!pool.free.is_free(*a) && self.leases.by_addr(*a).is_none());
                waiting += u64::from(pool.is_present(*a));
            }
            assert_eq!(
                pool.cooling.len() + pool.held.len(),
                pool.cooling
                    .iter()
                    .map(|(a, _)| *a)
                    .chain(pool.held.iter().copied())
                    .collect::<std::collections::HashSet<_>>()
                    .len(),
                "an address both cooling and held in pool {name}"
            );
            // Every present address is in exactly one state: nothing free is lost.
            let present = if pool.dynamic() {
                pool.present_count as u64
            } else {
                pool.spec.size
            };
            if present < u64::MAX {
                let leased_present = (pool.leased - pool.missing) as u64;
                assert_eq!(
                    leased_present + waiting + pool.free.count(),
                    present,
                    "pool {name}: leased + cooling + held + free"
                );
            }
        }
    }
}
