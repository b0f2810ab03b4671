//! Nodes that serve both families: one address per family in one commit, all or nothing,
//! status per family, releases and aborts of both, a /64 that is never enumerated, and dual-stack
//! state across a restart and a compaction.

use std::path::Path;

use super::*;
use crate::{
    lease::{encode_key, Addr},
    store::{encode_records, log_name, record, Store},
};

const DUAL: &str = "[[pool]]\nname=\"v4\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/29\"]\n\
                    [[pool]]\nname=\"v6\"\nsource=\"static\"\ncidrs=[\"fd00:240::/126\"]\n";

per_family!(
    a_small_pool_exhausts_and_dual_stack_is_all_or_nothing,
    status_with_families_asks_only_about_those,
);

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().unwrap())
}

/// The test pool of `family` on a dual-stack node: "v4" or "v6".
fn pool_name(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "v4",
        Family::Ipv6 => "v6",
    }
}

/// A dual-stack node whose pool of `small` has 3 addresses, the other's 256.
fn small_and_large(small: Family) -> String {
    let body = |f: Family| {
        let n = if f == small { 3 } else { 256 };
        format!(
            "[[pool]]\nname=\"{}\"\nsource=\"static\"\nranges=[\"{}\"]\n",
            pool_name(f),
            range(f, n)
        )
    };
    format!("{}{}", body(Family::Ipv4), body(Family::Ipv6))
}

#[test]
fn dual_stack_allocates_one_address_per_family_in_one_commit() {
    let mut st = State::new(&config_of("cooldown=\"0s\"", DUAL));
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
    let mut st = State::new(&config_of("cooldown=\"0s\"", DUAL));
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

fn a_small_pool_exhausts_and_dual_stack_is_all_or_nothing(small: Family) {
    let large = other(small);
    let mut st = State::new(&config_of("cooldown=\"0s\"", &small_and_large(small)));
    for c in ["a", "b", "c"] {
        assert_eq!(alloc(&mut st, c, None, 1).unwrap().len(), 2);
    }
    let large_free = free(&mut st, pool_name(large));
    let e = alloc(&mut st, "d", None, 2).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PoolExhausted);
    let want = format!("family {small}: pool '{}'", pool_name(small));
    assert!(e.message.starts_with(&want), "{}", e.message);
    // Nothing was taken from the other family's pool, and nothing is leased to d.
    assert_eq!(free(&mut st, pool_name(large)), large_free);
    assert_eq!(st.check(&key("d")).unwrap(), vec![]);
    // The other family alone still works.
    assert_eq!(alloc(&mut st, "d", Some(&[large]), 2).unwrap().len(), 1);
    st.check_invariants();
    // A node of one family refuses the other naming it.
    let mut single = State::new(&config(&format!("ips=[\"{}\"]", addr(large, 1)), ""));
    let e = alloc(&mut single, "x", Some(&[Family::Ipv4, Family::Ipv6]), 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PoolExhausted);
    assert!(e.message.contains(small.as_str()), "{}", e.message);
    assert_eq!(alloc(&mut single, "x", None, 1).unwrap().len(), 1);
    let e = alloc(&mut single, "y", Some(&[]), 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadRequest);
}

fn status_with_families_asks_only_about_those(full: Family) {
    let ready_family = other(full);
    let mut st = State::new(&config_of("cooldown=\"0s\"", &small_and_large(full)));
    for c in ["a", "b", "c"] {
        alloc(&mut st, c, Some(&[full]), 1).unwrap();
    }
    let full_only = [full];
    let ready_only = [ready_family];
    // The pool of `full` is full: not ready for both families or for it alone, ready for the
    // other, which has 256 free addresses.
    assert!(!st.status(None, None, 2).unwrap().0);
    let (ready, _, reason) = st.status(None, Some(&full_only), 2).unwrap();
    let reason = reason.unwrap();
    assert!(!ready);
    assert!(
        reason.contains(&format!("pool '{}'", pool_name(full))),
        "{reason}"
    );
    assert_eq!(
        reason.starts_with("family ipv6"),
        full == Family::Ipv6,
        "{reason}"
    );
    assert_eq!(
        st.status(None, Some(&ready_only), 2).unwrap(),
        (true, 256, None)
    );
    // A named pool restricts its own family only, as in an Allocate.
    let named = Some(pool_name(full));
    assert!(st.status(named, Some(&ready_only), 2).unwrap().0);
    assert!(!st.status(named, Some(&full_only), 2).unwrap().0);
    // A family no pool serves is never ready; a malformed list is refused.
    let mut single = State::new(&config(&format!("ips=[\"{}\"]", addr(ready_family, 1)), ""));
    let (ready, _, reason) = single.status(None, Some(&full_only), 2).unwrap();
    assert!(!ready && reason.unwrap().contains("no pool of this node serves"));
    assert_eq!(
        single.status(None, Some(&[]), 2).unwrap_err().kind,
        ErrorKind::BadRequest
    );
}

#[test]
fn an_aborted_dual_stack_allocation_puts_both_addresses_back() {
    let mut st = State::new(&config_of("cooldown=\"0s\"", DUAL));
    let k = key("a");
    let pod = PodRef::default();
    let AllocStep::Fresh { records, .. } = st.begin_allocate(request(&k, &pod, None), 0).unwrap()
    else {
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
    let mut st = State::new(&config_of("cooldown=\"0s\"", pools));
    let n = 100_000usize;
    let pod = PodRef::default();
    for i in 0..n {
        let k = AttachmentKey::new("net", &format!("c{i}"), "eth0");
        let AllocStep::Fresh { records, .. } =
            st.begin_allocate(request(&k, &pod, None), 0).unwrap()
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
        st.pools[0].free.fragments() <= n / 2 + 1,
        "{}",
        st.pools[0].free.fragments()
    );
    assert_eq!(st.pools[0].leased, n / 2);
    let s = &st.stats(2)[0];
    assert_eq!((s.total, s.allocated), (u64::MAX, (n / 2) as u64));
    st.check_invariants();
}

/// A state directory written before IPv6 existed (format version 2) loads, takes IPv6
/// records, compacts and reloads with every lease and cooling address in place.
#[test]
fn old_state_loads_and_dual_stack_leases_survive_restart_and_compaction() {
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

    let cfg = config_of("cooldown=\"100s\"", DUAL);
    let (mut store, loaded) = Store::open(&state).unwrap();
    let (mut st, report) = State::from_loaded(&cfg, loaded, 10);
    assert_eq!(report.leases, 2);
    // Dual-stack traffic on top, written as the daemon writes it.
    let mut recs = Vec::new();
    for c in ["a", "b"] {
        let k = key(c);
        let AllocStep::Fresh { records, .. } =
            st.begin_allocate(request(&k, &pod, None), 20).unwrap()
        else {
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
    assert_eq!(st2.pools[1].cooling.len(), 1);
    assert_eq!(st2.pools[1].leased, 1);
    assert_eq!(free(&mut st2, "v6"), 1);

    let g = store.rotate().unwrap();
    let len = store.compaction(g, 45, 100_000).run().unwrap();
    store.snapshot_done(g, len);
    drop(store);
    let (_, mut st3) = reload(&state);
    assert_eq!(st3.list(), before);
    assert_eq!(st3.pools[1].cooling.len(), 1);
    assert_eq!(free(&mut st3, "v6"), 1);
    st3.check_invariants();
    // The keys are as they were: b's leases are found by key and family.
    let kb = encode_key(&key("b"));
    assert_eq!(st3.leases.find_all(&kb).count(), 2);
}
