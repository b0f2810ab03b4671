//! Model-based property test of the allocator + store against a plain reference model.
//!
//! Random sequences of allocate, release, GC, time passing, injected write failures and
//! restarts (reload from disk) run against the real `State` + `Store` and against `Model`, a
//! few maps with the obvious semantics. After every step the leases, the cooling counts and the
//! internal invariants must agree.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::Path,
    sync::atomic::Ordering,
};

use aliasnet_ipam_proto::{Attachment, AttachmentKey, ErrorKind, PodRef};
use proptest::prelude::*;

use crate::{
    config::{Config, OnOnlyCooling},
    state::{AllocRequest, AllocStep, ReleaseStep, State},
    store::{self, record::Record, Store},
};

const COOLDOWN_MS: u64 = 1_000;
const KEYS: u8 = 12;

#[derive(Debug, Clone)]
enum Op {
    Alloc(u8),
    Release(u8),
    Gc(Vec<u8>),
    Advance(u64),
    FailNextWrite,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS).prop_map(Op::Alloc),
        4 => (0..KEYS).prop_map(Op::Release),
        1 => proptest::collection::vec(0..KEYS, 0..6).prop_map(Op::Gc),
        3 => (0u64..1_500).prop_map(Op::Advance),
        1 => Just(Op::FailNextWrite),
        1 => Just(Op::Restart),
    ]
}

fn key(k: u8) -> AttachmentKey {
    AttachmentKey::new("net", &format!("c{k}"), "eth0")
}

struct Model {
    all: BTreeSet<u32>,
    leases: BTreeMap<u8, u32>,
    /// address -> release time
    cooling: BTreeMap<u32, u64>,
    policy: OnOnlyCooling,
}

impl Model {
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
        self.all
            .iter()
            .filter(|a| !leased.contains(a) && !cooling.contains_key(a))
            .copied()
            .collect()
    }

    fn release(&mut self, k: u8, now: u64) -> Option<u32> {
        let a = self.leases.remove(&k)?;
        self.cooling.insert(a, now);
        Some(a)
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
    fn apply(&mut self, records: &[Record]) -> bool {
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
            let bytes = st.snapshot(g);
            store::write_snapshot(self.dir.path(), &bytes).expect("snapshot");
            store.snapshot_done(g, bytes.len() as u64);
        }
        ok
    }
}

fn run(ops: Vec<Op>, policy: OnOnlyCooling) -> Result<(), TestCaseError> {
    let config = Config::parse(
        &format!(
            "cooldown = \"{COOLDOWN_MS}ms\"\non_only_cooling = \"{}\"\n\
             [[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/29\"]\nexclude=[\"10.0.0.3\"]\n\
             [[pool]]\nname=\"b\"\nsource=\"static\"\nips=[\"10.0.2.9\"]\n",
            match policy {
                OnOnlyCooling::Fail => "fail",
                OnOnlyCooling::ReuseOldest => "reuse-oldest",
            }
        ),
        Path::new("/model.toml"),
    )
    .unwrap();
    let all: BTreeSet<u32> = config
        .pools
        .iter()
        .flat_map(|p| p.ranges.iter().flat_map(|r| r.first..=r.last))
        .collect();
    let mut model = Model {
        all,
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
                };
                let step = sut.st().begin_allocate(req, now);
                if let Some(&addr) = model.leases.get(&k) {
                    match step {
                        Ok(AllocStep::Existing(l)) => {
                            prop_assert_eq!(l.address, Ipv4Addr::from(addr))
                        }
                        other => prop_assert!(false, "repeat allocate of {k}: {other:?}"),
                    }
                    continue;
                }
                let free = model.free(now);
                let cooling = model.cooling_now(now);
                match step {
                    Ok(AllocStep::Fresh { lease, record }) => {
                        let a = u32::from(lease.address);
                        if free.is_empty() {
                            prop_assert_eq!(model.policy, OnOnlyCooling::ReuseOldest);
                            let oldest = cooling.values().min().copied();
                            prop_assert_eq!(cooling.get(&a).copied(), oldest, "not the oldest");
                        } else {
                            prop_assert!(free.contains(&a), "{} is not free", lease.address);
                        }
                        if sut.apply(&[record]) {
                            prop_assert!(!fail_armed, "an injected failure was not reported");
                            model.leases.insert(k, a);
                            model.cooling.remove(&a);
                        } else {
                            prop_assert!(fail_armed, "write failed without injection");
                            fail_armed = false;
                            prop_assert_eq!(sut.st().check(&kk).unwrap(), None);
                        }
                    }
                    Err(e) => {
                        prop_assert!(free.is_empty(), "refused with free addresses: {e}");
                        let want = if cooling.is_empty() {
                            ErrorKind::PoolExhausted
                        } else {
                            prop_assert_eq!(model.policy, OnOnlyCooling::Fail);
                            ErrorKind::OnlyCooling
                        };
                        prop_assert_eq!(e.kind, want);
                    }
                    other => prop_assert!(false, "allocate {k}: {other:?}"),
                }
            }
            Op::Release(k) => match sut.st().begin_release(&key(k), None, None, now).unwrap() {
                ReleaseStep::Fresh { record, address } => {
                    prop_assert_eq!(model.leases.get(&k).copied(), Some(u32::from(address)));
                    if sut.apply(&[record]) {
                        prop_assert!(!fail_armed);
                        model.release(k, now);
                    } else {
                        prop_assert!(fail_armed);
                        fail_armed = false;
                        prop_assert!(sut.st().check(&key(k)).unwrap().is_some());
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
                let out = sut.st().begin_gc("net", &att, now).unwrap();
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
                if sut.apply(&records) {
                    prop_assert!(!fail_armed);
                    for k in stale {
                        model.release(k, now);
                    }
                } else {
                    prop_assert!(fail_armed);
                    fail_armed = false;
                }
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
                fail_armed = false;
            }
        }

        // Compare the full picture after every step.
        let st = sut.state.as_mut().unwrap();
        st.check_invariants();
        let got: BTreeMap<String, Ipv4Addr> = st
            .list()
            .into_iter()
            .map(|l| (l.key.container_id, l.address))
            .collect();
        let want: BTreeMap<String, Ipv4Addr> = model
            .leases
            .iter()
            .map(|(k, a)| (format!("c{k}"), Ipv4Addr::from(*a)))
            .collect();
        prop_assert_eq!(got, want);
        let stats = st.stats(now);
        let cooling: u64 = stats.iter().map(|p| p.cooling).sum();
        prop_assert_eq!(cooling, model.cooling_now(now).len() as u64);
        let free: u64 = stats.iter().map(|p| p.free).sum();
        prop_assert_eq!(free, model.free(now).len() as u64);
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
