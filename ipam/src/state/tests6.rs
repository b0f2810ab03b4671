//! IPv6 and dual-stack pools: allocation, exhaustion, cooldown, all-or-nothing, restart.

use std::{
    net::{IpAddr, Ipv6Addr},
    path::Path,
};

use aliasnet_ipam_proto::{AttachmentKey, ErrorKind, Family, Lease, PodRef};

use super::*;
use crate::{
    lease::{encode_key, Addr},
    store::{encode_records, log_name, record, Store},
};

const DUAL: &str = "[[pool]]\nname=\"v4\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/29\"]\n\
                    [[pool]]\nname=\"v6\"\nsource=\"static\"\ncidrs=[\"fd00:240::/126\"]\n";

fn config(extra: &str, pools: &str) -> Config {
    Config::parse(&format!("{extra}\n{pools}"), Path::new("/test.toml")).unwrap()
}

fn key(c: &str) -> AttachmentKey {
    AttachmentKey::new("net", c, "eth0")
}

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().unwrap())
}

/// Allocate for `c` and commit; the leases (IPv4 first).
fn alloc(
    st: &mut State,
    c: &str,
    families: Option<&[Family]>,
    now: u64,
) -> Result<Vec<Lease>, Refusal> {
    let k = key(c);
    let pod = PodRef::default();
    let req = AllocRequest {
        key: &k,
        pod: &pod,
        pool: None,
        host_veth: None,
        families,
    };
    match st.begin_allocate(req, now)? {
        AllocStep::Fresh { leases, records } => {
            assert_eq!(records.len(), leases.len());
            for r in &records {
                st.commit(r);
            }
            Ok(leases)
        }
        AllocStep::Existing(l) => Ok(l),
        AllocStep::Wait(w) => panic!("wait: {w}"),
    }
}

fn release(st: &mut State, c: &str, now: u64) -> Option<(IpAddr, usize)> {
    match st.begin_release(&key(c), None, None, now).unwrap() {
        ReleaseStep::Fresh {
            records, address, ..
        } => {
            for r in &records {
                st.commit(r);
            }
            Some((address, records.len()))
        }
        ReleaseStep::NotFound { .. } => None,
        ReleaseStep::Wait(w) => panic!("wait: {w}"),
    }
}

fn free(st: &mut State, pool: &str) -> u64 {
    st.stats(0)
        .into_iter()
        .find(|p| p.name == pool)
        .unwrap()
        .free
}

#[test]
fn config_accepts_ipv6_pools_and_refuses_mixing() {
    let c = config(
        "",
        "[[pool]]\nname=\"p6\"\nsource=\"static\"\ncidrs=[\"fd00:240::/112\"]\n\
         ranges=[\"fd00:241::10-fd00:241::1f\"]\nips=[\"fd00:242::1\"]\n\
         exclude=[\"fd00:240::/120\", \"fd00:241::10\", \"10.0.0.1\"]\n\
         [[pool]]\nname=\"aws\"\nsource=\"prefixes\"\nprefixes=[\"2001:db8:1:2:3::/80\"]\n",
    );
    assert_eq!(c.pools[0].family, Family::Ipv6);
    assert_eq!(c.pools[0].size, 65536 - 256 + 16 - 1 + 1);
    assert_eq!(c.pools[1].size, 1 << 48);
    assert!(
        c.warnings.iter().any(|w| w.contains("exclude[2]")),
        "{:?}",
        c.warnings
    );
    let e = Config::parse(
        "[[pool]]\nname=\"mixed\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/30\", \"fd00::/126\"]\n",
        Path::new("/t.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("pool 'mixed'") && e.contains("mixes IPv4"),
        "{e}"
    );
    let e = Config::parse(
        "[[pool]]\nname=\"low\"\nsource=\"static\"\ncidrs=[\"::/64\"]\n",
        Path::new("/t.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("::/96"), "{e}");
    let e = Config::parse(
        "[[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"fd00::/120\"]\n\
         [[pool]]\nname=\"b\"\nsource=\"static\"\nips=[\"fd00::7\"]\n",
        Path::new("/t.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("overlap"), "{e}");
    // A /64 is accepted: it is never enumerated.
    let c = config(
        "",
        "[[pool]]\nname=\"big\"\nsource=\"static\"\ncidrs=[\"fd00:1::/64\"]\n",
    );
    assert_eq!(c.pools[0].size, u64::MAX);
}

#[test]
fn dual_stack_allocates_one_address_per_family_in_one_commit() {
    let mut st = State::new(&config("cooldown=\"0s\"", DUAL));
    let l = alloc(&mut st, "a", None, 5).unwrap();
    assert_eq!(l.len(), 2);
    assert_eq!(l[0].address, IpAddr::from([10, 0, 0, 0]));
    // The subnet-router anycast address fd00:240:: is never handed out.
    assert_eq!(l[1].address, v6("fd00:240::1"));
    assert_eq!(l[1].pool, "v6");
    assert_eq!(l[0].allocated_at_ms, l[1].allocated_at_ms);
    // Idempotent: the same leases back.
    assert_eq!(alloc(&mut st, "a", None, 6).unwrap(), l);
    assert_eq!(
        alloc(&mut st, "a", Some(&[Family::Ipv6]), 6).unwrap(),
        vec![l[1].clone()]
    );
    assert_eq!(st.check(&key("a")).unwrap(), l);
    // One family only.
    let b = alloc(&mut st, "b", Some(&[Family::Ipv6]), 7).unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].address, v6("fd00:240::2"));
    let c = alloc(&mut st, "c", Some(&[Family::Ipv4]), 7).unwrap();
    assert_eq!(c[0].address, IpAddr::from([10, 0, 0, 1]));
    // A key holding one family cannot silently grow another.
    let e = alloc(&mut st, "c", Some(&[Family::Ipv4, Family::Ipv6]), 8).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadRequest);
    // Listing: IPv4 first, then IPv6.
    let all: Vec<IpAddr> = st.list().into_iter().map(|l| l.address).collect();
    assert_eq!(
        all,
        vec![
            IpAddr::from([10, 0, 0, 0]),
            IpAddr::from([10, 0, 0, 1]),
            v6("fd00:240::1"),
            v6("fd00:240::2")
        ]
    );
    let (page, next) = st.list_page(Some(Addr::from(0x0a00_0001u32)), 1, usize::MAX);
    assert_eq!(page[0].address, v6("fd00:240::1"));
    assert_eq!(
        next,
        Some(u128::from("fd00:240::1".parse::<Ipv6Addr>().unwrap()))
    );
    // Release frees both, reporting the IPv4 address.
    assert_eq!(
        release(&mut st, "a", 9),
        Some((IpAddr::from([10, 0, 0, 0]), 2))
    );
    assert_eq!(st.check(&key("a")).unwrap(), vec![]);
    assert_eq!(release(&mut st, "b", 9), Some((v6("fd00:240::2"), 1)));
    st.check_invariants();
    let stats = st.stats(10);
    let s6 = stats.iter().find(|p| p.name == "v6").unwrap();
    assert_eq!(
        (s6.family, s6.total, s6.allocated, s6.free),
        (Family::Ipv6, 3, 0, 3)
    );
}

#[test]
fn release_lease_matches_either_address_of_the_allocation() {
    let mut st = State::new(&config("cooldown=\"0s\"", DUAL));
    let l = alloc(&mut st, "a", None, 5).unwrap();
    let v6a = crate::lease::ip_addr(l[1].address).unwrap();
    // Another allocation time: nothing.
    assert!(matches!(
        st.begin_release_of(&key("a"), None, None, Some((v6a, 4)), 6)
            .unwrap(),
        ReleaseStep::NotFound { .. }
    ));
    let ReleaseStep::Fresh {
        records, address, ..
    } = st
        .begin_release_of(&key("a"), None, None, Some((v6a, 5)), 6)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((records.len(), address), (2, l[0].address));
}

#[test]
fn a_small_ipv6_pool_exhausts_and_dual_stack_is_all_or_nothing() {
    let pools = "[[pool]]\nname=\"v4\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/24\"]\n\
                 [[pool]]\nname=\"v6\"\nsource=\"static\"\ncidrs=[\"fd00:240::/126\"]\n\
                 exclude=[\"fd00:240::\"]\n";
    let mut st = State::new(&config("cooldown=\"0s\"", pools));
    for c in ["a", "b", "c"] {
        assert_eq!(alloc(&mut st, c, None, 1).unwrap().len(), 2);
    }
    let v4_free = free(&mut st, "v4");
    let e = alloc(&mut st, "d", None, 2).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PoolExhausted);
    assert!(
        e.message.starts_with("family ipv6: pool 'v6'"),
        "{}",
        e.message
    );
    // Nothing was taken from the IPv4 pool, and nothing is leased to d.
    assert_eq!(free(&mut st, "v4"), v4_free);
    assert_eq!(st.check(&key("d")).unwrap(), vec![]);
    // IPv4 alone still works.
    assert_eq!(
        alloc(&mut st, "d", Some(&[Family::Ipv4]), 2).unwrap().len(),
        1
    );
    st.check_invariants();
    // An IPv4-only node refuses ipv6 naming the family.
    let mut v4only = State::new(&config(
        "",
        "[[pool]]\nname=\"p\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/30\"]\n",
    ));
    let e = alloc(&mut v4only, "x", Some(&[Family::Ipv4, Family::Ipv6]), 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PoolExhausted);
    assert!(e.message.contains("ipv6"), "{}", e.message);
    assert_eq!(alloc(&mut v4only, "x", None, 1).unwrap().len(), 1);
    let e = alloc(&mut v4only, "y", Some(&[]), 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadRequest);
}

#[test]
fn status_with_families_asks_only_about_those() {
    let mut st = State::new(&config("cooldown=\"0s\"", DUAL));
    for c in ["a", "b", "c"] {
        alloc(&mut st, c, Some(&[Family::Ipv6]), 1).unwrap();
    }
    let v4 = [Family::Ipv4];
    let v6 = [Family::Ipv6];
    // The IPv6 pool is full: not ready for both families or IPv6 alone, ready for IPv4.
    assert!(!st.status(None, None, 2).unwrap().0);
    let (ready, _, reason) = st.status(None, Some(&v6), 2).unwrap();
    assert!(!ready && reason.unwrap().starts_with("family ipv6"));
    assert_eq!(st.status(None, Some(&v4), 2).unwrap(), (true, 8, None));
    // A named IPv6 pool restricts its own family only, as in an Allocate.
    assert!(st.status(Some("v6"), Some(&v4), 2).unwrap().0);
    assert!(!st.status(Some("v6"), Some(&v6), 2).unwrap().0);
    // A family no pool serves is never ready; a malformed list is refused.
    let only4 = "[[pool]]\nname=\"v4\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/29\"]\n";
    let mut st4 = State::new(&config("", only4));
    let (ready, _, reason) = st4.status(None, Some(&v6), 2).unwrap();
    assert!(!ready && reason.unwrap().contains("no pool of this node serves"));
    assert_eq!(
        st4.status(None, Some(&[]), 2).unwrap_err().kind,
        ErrorKind::BadRequest
    );
}

#[test]
fn ipv6_addresses_cool_down_before_reuse() {
    let pools = "[[pool]]\nname=\"v6\"\nsource=\"static\"\ncidrs=[\"fd00:240::/127\"]\n";
    let mut st = State::new(&config("cooldown=\"10s\"", pools));
    let a = alloc(&mut st, "a", None, 0).unwrap();
    alloc(&mut st, "b", None, 0).unwrap();
    release(&mut st, "a", 1_000).unwrap();
    let e = alloc(&mut st, "c", None, 5_000).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OnlyCooling, "{}", e.message);
    let (ready, _, reason) = st.status(None, None, 5_000).unwrap();
    assert!(!ready && reason.unwrap().contains("family ipv6"));
    // After the cooldown the address comes back.
    assert_eq!(
        alloc(&mut st, "c", None, 11_000).unwrap()[0].address,
        a[0].address
    );
    st.check_invariants();

    // reuse-oldest hands out the address released longest ago.
    let mut st = State::new(&config(
        "cooldown=\"10s\"\non_only_cooling=\"reuse-oldest\"",
        pools,
    ));
    alloc(&mut st, "a", None, 0).unwrap();
    let b = alloc(&mut st, "b", None, 0).unwrap();
    release(&mut st, "b", 1).unwrap();
    release(&mut st, "a", 2).unwrap();
    assert_eq!(
        alloc(&mut st, "c", None, 3).unwrap()[0].address,
        b[0].address
    );
    st.check_invariants();
}

#[test]
fn an_aborted_dual_stack_allocation_puts_both_addresses_back() {
    let mut st = State::new(&config("cooldown=\"0s\"", DUAL));
    let k = key("a");
    let pod = PodRef::default();
    let req = AllocRequest {
        key: &k,
        pod: &pod,
        pool: None,
        host_veth: None,
        families: None,
    };
    let AllocStep::Fresh { records, .. } = st.begin_allocate(req, 0).unwrap() else {
        panic!()
    };
    assert_eq!(st.check(&k).unwrap(), vec![]);
    for r in &records {
        st.abort(r);
    }
    st.check_invariants();
    assert_eq!((free(&mut st, "v4"), free(&mut st, "v6")), (8, 3));
}

#[test]
fn a_64_is_never_enumerated() {
    let pools = "[[pool]]\nname=\"big\"\nsource=\"prefixes\"\nprefixes=[\"fd00:1::/64\"]\n";
    let mut st = State::new(&config("cooldown=\"0s\"", pools));
    let n = 100_000usize;
    let pod = PodRef::default();
    for i in 0..n {
        let k = AttachmentKey::new("net", &format!("c{i}"), "eth0");
        let AllocStep::Fresh { records, .. } = st
            .begin_allocate(
                AllocRequest {
                    key: &k,
                    pod: &pod,
                    pool: None,
                    host_veth: None,
                    families: None,
                },
                0,
            )
            .unwrap()
        else {
            panic!()
        };
        st.commit(&records[0]);
    }
    // Every other lease released: the free set is split once per remaining lease at most.
    for i in (0..n).step_by(2) {
        let k = AttachmentKey::new("net", &format!("c{i}"), "eth0");
        let ReleaseStep::Fresh { records, .. } = st.begin_release(&k, None, None, 1).unwrap()
        else {
            panic!()
        };
        st.commit(&records[0]);
    }
    st.expire(2);
    assert!(
        st.pools6[0].fragments() <= n / 2 + 1,
        "{}",
        st.pools6[0].fragments()
    );
    assert_eq!(st.pools6[0].leased, n / 2);
    let s = &st.stats(2)[0];
    assert_eq!((s.total, s.allocated), (u64::MAX, (n / 2) as u64));
    st.check_invariants();
}

/// A state directory written before IPv6 existed (format version 2) loads, takes IPv6
/// records, compacts and reloads with every lease and cooling address in place.
#[test]
fn old_state_loads_and_ipv6_leases_survive_restart_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let pod = PodRef::default();
    let v4rec = |c: &str, addr: u32| {
        let (data, key_len) = crate::lease::encode_data(&key(c), &pod, None);
        record::Record::Alloc(record::AllocRec {
            data,
            key_len,
            addr: Addr::from(addr),
            allocated_at_ms: 1,
            pool: "v4".into(),
        })
    };
    let mut log = Vec::new();
    record::encode_header_version(&mut log, record::LOG_MAGIC, 0, 2);
    log.extend_from_slice(&encode_records([
        &v4rec("old1", 0x0a00_0001),
        &v4rec("old2", 0x0a00_0002),
    ]));
    std::fs::write(state.join(log_name(0)), &log).unwrap();

    let cfg = config("cooldown=\"100s\"", DUAL);
    let (mut store, loaded) = Store::open(&state).unwrap();
    let (mut st, report) = State::from_loaded(&cfg, loaded, 10);
    assert_eq!(report.leases, 2);
    // Dual-stack traffic on top, written as the daemon writes it.
    let mut recs = Vec::new();
    for c in ["a", "b"] {
        let k = key(c);
        let req = AllocRequest {
            key: &k,
            pod: &pod,
            pool: None,
            host_veth: None,
            families: None,
        };
        let AllocStep::Fresh { records, .. } = st.begin_allocate(req, 20).unwrap() else {
            panic!()
        };
        for r in &records {
            st.commit(r);
        }
        recs.extend(records);
    }
    let ReleaseStep::Fresh { records, .. } = st.begin_release(&key("a"), None, None, 30).unwrap()
    else {
        panic!()
    };
    for r in &records {
        st.commit(r);
    }
    recs.extend(records);
    store.append(&encode_records(recs.iter())).unwrap();
    let before = st.list();
    assert_eq!(before.len(), 4);

    let reload = |st_dir: &Path| {
        let (store, loaded) = Store::open(st_dir).unwrap();
        let (st, _) = State::from_loaded(&cfg, loaded, 40);
        (store, st)
    };
    drop(store);
    let (mut store, mut st2) = reload(&state);
    assert_eq!(st2.list(), before);
    st2.check_invariants();
    // a's IPv6 address still cools down; b's is leased.
    assert_eq!(st2.pools6[0].cooling.len(), 1);
    assert_eq!(st2.pools6[0].leased, 1);
    assert_eq!(free(&mut st2, "v6"), 1);

    let g = store.rotate().unwrap();
    let len = store.compaction(g, 45, 100_000).run().unwrap();
    store.snapshot_done(g, len);
    drop(store);
    let (_, mut st3) = reload(&state);
    assert_eq!(st3.list(), before);
    assert_eq!(st3.pools6[0].cooling.len(), 1);
    assert_eq!(free(&mut st3, "v6"), 1);
    st3.check_invariants();
    // The keys are as they were: b's leases are found by key and family.
    let kb = encode_key(&key("b"));
    assert_eq!(st3.leases.find_all(&kb).count(), 2);
}

mod model {
    //! The interval free set against a plain set of addresses.

    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::super::pool6::Pool6;
    use super::config;

    #[derive(Debug, Clone)]
    enum Op {
        TakeNext,
        /// Put back the n-th taken address (modulo).
        Put(usize),
        /// Take a given offset from the prefix start, free or not.
        Take(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::TakeNext),
            2 => any::<usize>().prop_map(Op::Put),
            1 => any::<u8>().prop_map(Op::Take),
        ]
    }

    proptest! {
        #[test]
        fn intervals_behave_like_a_set(ops in proptest::collection::vec(op(), 1..200)) {
            // fd00::/123 (32 addresses) in two ranges, minus scattered exclusions.
            let c = config(
                "",
                "[[pool]]\nname=\"m\"\nsource=\"static\"\n\
                 cidrs=[\"fd00::100/124\", \"fd00::120/125\"]\nips=[\"fd00::12a\"]\n\
                 exclude=[\"fd00::100\", \"fd00::107\", \"fd00::10f\", \"fd00::122\"]\n",
            );
            let spec = c.pools[0].clone();
            let base: u128 = "fd00::100".parse::<std::net::Ipv6Addr>().unwrap().into();
            let mut free: BTreeSet<u128> = spec
                .ranges6
                .iter()
                .flat_map(|r| r.first..=r.last)
                .collect();
            let mut pool = Pool6::new(spec);
            let mut taken: Vec<u128> = Vec::new();
            let mut next = base;
            for op in ops {
                match op {
                    Op::TakeNext => {
                        let want = free
                            .range(next..)
                            .next()
                            .or_else(|| free.iter().next())
                            .copied();
                        let got = pool.take_next();
                        prop_assert_eq!(got, want);
                        if let Some(a) = got {
                            free.remove(&a);
                            taken.push(a);
                            next = a + 1;
                        }
                    }
                    Op::Put(n) if !taken.is_empty() => {
                        let a = taken.swap_remove(n % taken.len());
                        pool.put(a);
                        free.insert(a);
                    }
                    Op::Put(_) => {}
                    Op::Take(off) => {
                        let a = base + u128::from(off % 48);
                        let was = free.remove(&a);
                        prop_assert_eq!(pool.take(a), was);
                        if was {
                            taken.push(a);
                        }
                    }
                }
                pool.check();
                prop_assert_eq!(pool.free_count(), free.len() as u64);
                for a in base..base + 48 {
                    prop_assert_eq!(pool.is_free(a), free.contains(&a), "{}", a - base);
                }
            }
        }
    }
}
