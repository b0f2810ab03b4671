//! Model-based property test of the allocator + store against a plain reference model.
//!
//! Random sequences of allocate, release, GC, metadata reads of an `azure-imds` pool, time
//! passing, injected write failures and restarts (reload from disk, compaction by merge on
//! disk included) run against the real `State` + `Store` and against `Model`, a few maps with
//! the obvious semantics. After every step the leases, the free and cooling counts, the
//! missing count and the internal invariants must agree.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    path::Path,
    sync::atomic::Ordering,
};

use aliasnet_ipam_proto::{Attachment, AttachmentKey, ErrorKind, PodRef};
use proptest::prelude::*;

fn v4(a: IpAddr) -> Ipv4Addr {
    match a {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => panic!("{a} in an IPv4 pool"),
    }
}

use crate::{
    config::{Config, OnOnlyCooling},
    state::{AllocRequest, AllocStep, ReleaseStep, State},
    store::{self, record::Record, Store},
};

const COOLDOWN_MS: u64 = 1_000;
const KEYS: u8 = 12;
/// Candidate addresses of the metadata pool "nic": 10.0.5.1 to 10.0.5.4.
const NIC: [u32; 4] = [0x0a00_0501, 0x0a00_0502, 0x0a00_0503, 0x0a00_0504];

#[derive(Debug, Clone)]
enum Op {
    Alloc(u8),
    Release(u8),
    Gc(Vec<u8>),
    /// A metadata read listing the NIC addresses whose bit is set.
    Meta(u8),
    Advance(u64),
    FailNextWrite,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS).prop_map(Op::Alloc),
        4 => (0..KEYS).prop_map(Op::Release),
        1 => proptest::collection::vec(0..KEYS, 0..6).prop_map(Op::Gc),
        2 => (0u8..16).prop_map(Op::Meta),
        3 => (0u64..1_500).prop_map(Op::Advance),
        1 => Just(Op::FailNextWrite),
        1 => Just(Op::Restart),
    ]
}

fn key(k: u8) -> AttachmentKey {
    AttachmentKey::new("net", &format!("c{k}"), "eth0")
}

struct Model {
    /// Addresses of the static pools.
    fixed: BTreeSet<u32>,
    /// NIC addresses in the last metadata read since the last restart.
    present: BTreeSet<u32>,
    /// NIC addresses the daemon has a slot for since the last restart.
    placed: BTreeSet<u32>,
    synced: bool,
    leases: BTreeMap<u8, u32>,
    /// address -> release time
    cooling: BTreeMap<u32, u64>,
    policy: OnOnlyCooling,
}

impl Model {
    fn usable(&self, a: u32) -> bool {
        self.fixed.contains(&a) || self.present.contains(&a)
    }

    fn cooling_now(&self, now: u64) -> BTreeMap<u32, u64> {
        self.cooling
            .iter()
            .filter(|(_, t)| **t + COOLDOWN_MS > now)
            .map(|(a, t)| (*a, *t))
            .collect()
    }

    fn free(&self, now: u64) -> BTreeSet<u32> {
        let cooling = self.cooling_now(now);
        let leased: BTreeSet<u32> = self.leases.values().copied().collect();
        self.fixed
            .iter()
            .chain(&self.present)
            .filter(|a| !leased.contains(a) && !cooling.contains_key(a))
            .copied()
            .collect()
    }

    fn release(&mut self, k: u8, now: u64) -> Option<u32> {
        let a = self.leases.remove(&k)?;
        self.cooling.insert(a, now);
        Some(a)
    }

    fn missing(&self) -> usize {
        if !self.synced {
            return 0;
        }
        self.leases
            .values()
            .filter(|a| NIC.contains(a) && !self.present.contains(a))
            .count()
    }

    fn restart(&mut self) {
        self.present.clear();
        self.synced = false;
        self.placed = self
            .leases
            .values()
            .filter(|a| NIC.contains(a))
            .copied()
            .collect();
    }
}

struct Sut {
    dir: tempfile::TempDir,
    config: Config,
    store: Option<Store>,
    state: Option<State>,
}

impl Sut {
    fn open(&mut self, now: u64) {
        self.store = None;
        self.state = None;
        let (store, loaded) = Store::open(self.dir.path()).expect("store reloads");
        let (state, _) = State::from_loaded(&self.config, loaded, now);
        // Compact often, so restarts also go through snapshots and log chains.
        let mut store = store;
        store.set_compact_min_bytes(512);
        self.store = Some(store);
        self.state = Some(state);
    }

    fn st(&mut self) -> &mut State {
        self.state.as_mut().expect("open")
    }

    /// Write `records` like the writer thread does; false if the write failed (rolled back).
    fn apply(&mut self, records: &[Record], now: u64) -> bool {
        let store = self.store.as_mut().expect("open");
        let ok = store.append(&store::encode_records(records)).is_ok();
        let st = self.state.as_mut().expect("open");
        for r in records {
            if ok {
                if let Some(link) = st.commit(r) {
                    st.teardown_done(&link);
                }
            } else {
                st.abort(r);
            }
        }
        if ok && store.should_compact() {
            let g = store.rotate().expect("rotate");
            let len = store
                .compaction(g, now, COOLDOWN_MS)
                .run()
                .expect("compaction");
            store.snapshot_done(g, len);
        }
        ok
    }
}

fn run(ops: Vec<Op>, policy: OnOnlyCooling) -> Result<(), TestCaseError> {
    let config = Config::parse(
        &format!(
            "cooldown = \"{COOLDOWN_MS}ms\"\ngc_grace = \"0s\"\non_only_cooling = \"{}\"\n\
             [[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/29\"]\nexclude=[\"10.0.0.3\"]\n\
             [[pool]]\nname=\"b\"\nsource=\"prefixes\"\nprefixes=[\"10.0.2.8/31\"]\n\
             [[pool]]\nname=\"nic\"\nsource=\"azure-imds\"\nurl=\"http://127.0.0.1:9/x\"\n",
            match policy {
                OnOnlyCooling::Fail => "fail",
                OnOnlyCooling::ReuseOldest => "reuse-oldest",
            }
        ),
        Path::new("/model.toml"),
    )
    .unwrap();
    let fixed: BTreeSet<u32> = config
        .pools
        .iter()
        .flat_map(|p| p.ranges.iter())
        .flat_map(|r| {
            let (first, last) = r.bounds();
            u32::try_from(first).unwrap()..=u32::try_from(last).unwrap()
        })
        .collect();
    let mut model = Model {
        fixed,
        present: BTreeSet::new(),
        placed: BTreeSet::new(),
        synced: false,
        leases: BTreeMap::new(),
        cooling: BTreeMap::new(),
        policy,
    };
    let mut sut = Sut {
        dir: tempfile::tempdir().unwrap(),
        config,
        store: None,
        state: None,
    };
    let mut now: u64 = 1_000_000;
    let mut fail_armed = false;
    sut.open(now);
    let nic = sut.st().metadata_pool("nic").expect("metadata pool");
    let pod = PodRef::default();

    for op in ops {
        match op {
            Op::Alloc(k) => {
                let kk = key(k);
                let req = AllocRequest {
                    key: &kk,
                    pod: &pod,
                    pool: None,
                    host_veth: None,
                    families: None,
                };
                let step = sut.st().begin_allocate(req, now);
                if let Some(&addr) = model.leases.get(&k) {
                    match step {
                        Ok(AllocStep::Existing(l)) => {
                            prop_assert_eq!(l.len(), 1);
                            prop_assert_eq!(l[0].address, Ipv4Addr::from(addr))
                        }
                        other => prop_assert!(false, "repeat allocate of {k}: {other:?}"),
                    }
                    continue;
                }
                let free = model.free(now);
                let cooling = model.cooling_now(now);
                let reusable: BTreeMap<u32, u64> = cooling
                    .iter()
                    .filter(|(a, _)| model.usable(**a))
                    .map(|(a, t)| (*a, *t))
                    .collect();
                match step {
                    Ok(AllocStep::Fresh { leases, records }) => {
                        prop_assert_eq!(leases.len(), 1);
                        let lease = &leases[0];
                        let a = u32::from(v4(lease.address));
                        if free.is_empty() {
                            prop_assert_eq!(model.policy, OnOnlyCooling::ReuseOldest);
                            let oldest = reusable.values().min().copied();
                            prop_assert_eq!(reusable.get(&a).copied(), oldest, "not the oldest");
                        } else {
                            prop_assert!(free.contains(&a), "{} is not free", lease.address);
                        }
                        if sut.apply(&records, now) {
                            prop_assert!(!fail_armed, "an injected failure was not reported");
                            model.leases.insert(k, a);
                            model.cooling.remove(&a);
                        } else {
                            prop_assert!(fail_armed, "write failed without injection");
                            fail_armed = false;
                            prop_assert_eq!(sut.st().check(&kk).unwrap(), vec![]);
                        }
                    }
                    Err(e) => {
                        prop_assert!(free.is_empty(), "refused with free addresses: {e}");
                        if model.policy == OnOnlyCooling::ReuseOldest {
                            prop_assert!(reusable.is_empty(), "refused with reusable: {e}");
                        }
                        // Cooling addresses the daemon has a slot for count for OnlyCooling.
                        let counted = cooling
                            .keys()
                            .any(|a| model.fixed.contains(a) || model.placed.contains(a));
                        let want = if !model.synced {
                            ErrorKind::Unavailable
                        } else if counted {
                            ErrorKind::OnlyCooling
                        } else {
                            ErrorKind::PoolExhausted
                        };
                        prop_assert_eq!(e.kind, want, "{}", e.message);
                    }
                    other => prop_assert!(false, "allocate {k}: {other:?}"),
                }
            }
            Op::Release(k) => match sut.st().begin_release(&key(k), None, None, now).unwrap() {
                ReleaseStep::Fresh {
                    records, address, ..
                } => {
                    prop_assert_eq!(model.leases.get(&k).copied(), Some(u32::from(v4(address))));
                    if sut.apply(&records, now) {
                        prop_assert!(!fail_armed);
                        model.release(k, now);
                    } else {
                        prop_assert!(fail_armed);
                        fail_armed = false;
                        prop_assert!(!sut.st().check(&key(k)).unwrap().is_empty());
                    }
                }
                ReleaseStep::NotFound { .. } => prop_assert!(!model.leases.contains_key(&k)),
                ReleaseStep::Wait(w) => prop_assert!(false, "release waits: {w}"),
            },
            Op::Gc(valid) => {
                let att: Vec<Attachment> = valid
                    .iter()
                    .map(|k| Attachment {
                        container_id: format!("c{k}"),
                        ifname: "eth0".into(),
                    })
                    .collect();
                let out = sut.st().begin_gc("net", &att, now, &|_| false).unwrap();
                let stale: Vec<u8> = model
                    .leases
                    .keys()
                    .filter(|k| !valid.contains(k))
                    .copied()
                    .collect();
                prop_assert_eq!(out.len(), stale.len());
                if out.is_empty() {
                    continue;
                }
                let records: Vec<Record> = out.into_iter().map(|(r, _)| r).collect();
                if sut.apply(&records, now) {
                    prop_assert!(!fail_armed);
                    for k in stale {
                        model.release(k, now);
                    }
                } else {
                    prop_assert!(fail_armed);
                    fail_armed = false;
                }
            }
            Op::Meta(mask) => {
                let listed: Vec<Ipv4Addr> = NIC
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, a)| Ipv4Addr::from(*a))
                    .collect();
                sut.st().apply_metadata(nic, &listed, now);
                model.present = listed.iter().map(|a| u32::from(*a)).collect();
                model.placed.extend(model.present.iter().copied());
                model.synced = true;
            }
            Op::Advance(ms) => now += ms,
            Op::FailNextWrite => {
                if !fail_armed {
                    sut.store
                        .as_ref()
                        .unwrap()
                        .fail_appends
                        .store(1, Ordering::SeqCst);
                    fail_armed = true;
                }
            }
            Op::Restart => {
                sut.open(now);
                model.restart();
                fail_armed = false;
            }
        }

        // Compare the full picture after every step.
        let st = sut.state.as_mut().unwrap();
        st.check_invariants();
        let got: BTreeMap<String, Ipv4Addr> = st
            .list()
            .into_iter()
            .map(|l| (l.key.container_id, v4(l.address)))
            .collect();
        let want: BTreeMap<String, Ipv4Addr> = model
            .leases
            .iter()
            .map(|(k, a)| (format!("c{k}"), Ipv4Addr::from(*a)))
            .collect();
        prop_assert_eq!(got, want);
        let stats = st.stats(now);
        let fixed_cooling: u64 = stats
            .iter()
            .filter(|p| p.name != "nic")
            .map(|p| p.cooling)
            .sum();
        let model_fixed_cooling = model
            .cooling_now(now)
            .keys()
            .filter(|a| model.fixed.contains(a))
            .count() as u64;
        prop_assert_eq!(fixed_cooling, model_fixed_cooling);
        let free: u64 = stats.iter().map(|p| p.free).sum();
        prop_assert_eq!(free, model.free(now).len() as u64);
        let nic_stats = stats.iter().find(|p| p.name == "nic").unwrap();
        prop_assert_eq!(nic_stats.missing, model.missing() as u64);
        prop_assert_eq!(nic_stats.total, model.present.len() as u64);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn allocator_and_store_match_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops, OnOnlyCooling::Fail)?;
    }

    #[test]
    fn reuse_oldest_matches_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops, OnOnlyCooling::ReuseOldest)?;
    }
}
