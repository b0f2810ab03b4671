//! A pool's life cycle, the same for both families: allocation order, exhaustion and cooldown,
//! `reuse-oldest`, aborts, held addresses, GC, bad requests, restarts and a nearly full pool.

use aliasnet_ipam_proto::{host_veth_name, Attachment};

use super::*;
use crate::store::{encode_records, Store};

per_family!(
    allocate_is_idempotent_and_round_robin,
    a_restart_continues_after_the_highest_address_in_use,
    exhaustion_message_is_actionable,
    reuse_oldest_takes_the_longest_released,
    aborted_allocation_frees_the_address_and_hides_the_lease,
    held_address_waits_for_teardown,
    gc_releases_only_stale_leases_of_the_network,
    bad_requests_are_refused,
    allocation_stays_fast_when_nearly_full,
);

/// One static pool "p" of `family`'s first `n` test addresses.
fn block(family: Family, n: u32, extra: &str) -> State {
    State::new(&config(
        &format!("ranges=[\"{}\"]", range(family, n)),
        extra,
    ))
}

fn allocate_is_idempotent_and_round_robin(f: Family) {
    let mut st = block(f, 4, "cooldown=\"0s\"");
    let a = alloc_one(&mut st, "a", 1).unwrap();
    assert_eq!(a.address, addr(f, 0));
    assert_eq!(alloc_one(&mut st, "a", 2).unwrap(), a);
    let b = alloc_one(&mut st, "b", 3).unwrap();
    assert_eq!(b.address, addr(f, 1));
    assert_eq!(release(&mut st, "a", 4), Some((a.address, 1)));
    // Even with no cooldown the freed address is not the next one handed out.
    assert_eq!(alloc_one(&mut st, "c", 5).unwrap().address, addr(f, 2));
    assert_eq!(release(&mut st, "zzz", 6), None);
    st.check_invariants();
}

fn a_restart_continues_after_the_highest_address_in_use(f: Family) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&format!("ranges=[\"{}\"]", range(f, 8)), "cooldown=\"0s\"");
    let (mut store, loaded) = Store::open(dir.path()).unwrap();
    let (mut st, _) = State::from_loaded(&cfg, loaded, 0);
    let (pod, mut records) = (PodRef::default(), Vec::new());
    for c in ["a", "b", "c"] {
        let k = key(c);
        let AllocStep::Fresh { records: r, .. } =
            st.begin_allocate(request(&k, &pod, None), 1).unwrap()
        else {
            panic!()
        };
        st.commit(&r[0]);
        records.extend(r);
    }
    let ReleaseStep::Fresh { records: r, .. } = st.begin_release(&key("a"), None, None, 2).unwrap()
    else {
        panic!()
    };
    records.extend(r);
    store.append(&encode_records(records.iter())).unwrap();
    drop(store);
    let (_, loaded) = Store::open(dir.path()).unwrap();
    let (mut st, report) = State::from_loaded(&cfg, loaded, 3);
    // a's address (the lowest) has cooled down (no cooldown) and is free again, but the next
    // address handed out follows c's.
    assert_eq!((report.leases, report.cooling), (2, 1));
    assert_eq!(alloc_one(&mut st, "d", 4).unwrap().address, addr(f, 3));
    st.check_invariants();
}

fn exhaustion_message_is_actionable(f: Family) {
    let r = range(f, 4);
    let mut st = block(f, 4, "cooldown=\"130s\"");
    for c in ["a", "b", "c", "d"] {
        alloc_one(&mut st, c, 0).unwrap();
    }
    let e = alloc_one(&mut st, "e", 0).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PoolExhausted);
    let usage = format!("pool 'p' ({r}, 4 addresses) has no free address: 4 allocated, 0 cooling");
    // An IPv6 refusal names its family, as on a dual-stack node.
    let want = match f {
        Family::Ipv4 => usage,
        Family::Ipv6 => format!("family ipv6: {usage}"),
    };
    assert!(e.message.starts_with(&want), "{}", e.message);
    release(&mut st, "a", 1_000);
    let e = alloc_one(&mut st, "e", 2_000).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OnlyCooling);
    assert!(
        e.message.contains("3 allocated, 1 cooling"),
        "{}",
        e.message
    );
    assert!(e.message.contains("reusable in 129s"), "{}", e.message);
    assert!(e.message.contains("reuse-oldest"), "{}", e.message);
    let (ready, free, reason) = st.status(None, None, 2_000).unwrap();
    assert!(!ready);
    assert_eq!(free, 0);
    let reason = reason.unwrap();
    assert!(reason.contains("1 cooling"), "{reason}");
    assert_eq!(
        reason.starts_with("family ipv6"),
        f == Family::Ipv6,
        "{reason}"
    );
    // After the cooldown the address is free again.
    let l = alloc_one(&mut st, "e", 131_000).unwrap();
    assert_eq!(l.address, addr(f, 0));
    st.check_invariants();
}

fn reuse_oldest_takes_the_longest_released(f: Family) {
    let mut st = block(f, 4, "cooldown=\"130s\"\non_only_cooling=\"reuse-oldest\"");
    for c in ["a", "b", "c", "d"] {
        alloc_one(&mut st, c, 0).unwrap();
    }
    release(&mut st, "c", 10);
    release(&mut st, "a", 20);
    assert!(st.status(None, None, 30).unwrap().0);
    assert_eq!(alloc_one(&mut st, "e", 30).unwrap().address, addr(f, 2));
    assert_eq!(alloc_one(&mut st, "f", 30).unwrap().address, addr(f, 0));
    assert_eq!(
        alloc_one(&mut st, "g", 30).unwrap_err().kind,
        ErrorKind::PoolExhausted
    );
    st.check_invariants();
}

fn aborted_allocation_frees_the_address_and_hides_the_lease(f: Family) {
    let mut st = State::new(&config(&format!("ips=[\"{}\"]", addr(f, 1)), ""));
    let (k, pod) = (key("a"), PodRef::default());
    let req = request(&k, &pod, None);
    let AllocStep::Fresh { mut records, .. } = st.begin_allocate(req, 0).unwrap() else {
        panic!()
    };
    let record = records.remove(0);
    // Pending: invisible, and a repeat waits for it.
    assert_eq!(st.check(&k).unwrap(), vec![]);
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
    assert_eq!(st.check(&k).unwrap(), vec![]);
    assert!(matches!(
        st.begin_allocate(req, 0).unwrap(),
        AllocStep::Fresh { .. }
    ));
}

fn held_address_waits_for_teardown(f: Family) {
    let mut st = State::new(&config(
        &format!("ips=[\"{}\"]", addr(f, 1)),
        "cooldown=\"0s\"",
    ));
    let (k, pod) = (key("a"), PodRef::default());
    let old = host_veth_name("ali", &k);
    let req = AllocRequest {
        host_veth: Some(&old),
        ..request(&k, &pod, None)
    };
    let AllocStep::Fresh { mut records, .. } = st.begin_allocate(req, 0).unwrap() else {
        panic!()
    };
    let record = records.remove(0);
    st.commit(&record);
    let ReleaseStep::Fresh { mut records, .. } = st.begin_release(&k, Some(&old), None, 1).unwrap()
    else {
        panic!()
    };
    let record = records.remove(0);
    assert_eq!(st.commit(&record).as_deref(), Some(old.as_str()));
    // The same veth name waits; so does anyone needing the held address.
    assert!(matches!(
        st.begin_allocate(req, 2).unwrap(),
        AllocStep::Wait(_)
    ));
    let k2 = key("b");
    let req2 = request(&k2, &pod, None);
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

fn gc_releases_only_stale_leases_of_the_network(f: Family) {
    let mut st = block(f, 16, "gc_grace=\"0s\"");
    for c in ["a", "b", "c"] {
        alloc_one(&mut st, c, 0).unwrap();
    }
    let other = AttachmentKey::new("other", "x", "eth0");
    let pod = PodRef::default();
    let AllocStep::Fresh { mut records, .. } =
        st.begin_allocate(request(&other, &pod, None), 0).unwrap()
    else {
        panic!()
    };
    let record = records.remove(0);
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

fn bad_requests_are_refused(f: Family) {
    let mut st = State::new(&config(&format!("ips=[\"{}\"]", addr(f, 1)), ""));
    let pod = PodRef::default();
    let bad = AttachmentKey::new("net", "", "eth0");
    let e = st.begin_allocate(request(&bad, &pod, None), 0).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadRequest);
    let k = key("a");
    let named = AllocRequest {
        pool: Some("nope"),
        ..request(&k, &pod, None)
    };
    let e = st.begin_allocate(named, 0).unwrap_err();
    assert_eq!(e.kind, ErrorKind::UnknownPool);
    assert!(e.message.contains("'p'"));
    let long_veth = AllocRequest {
        host_veth: Some("far-too-long-interface"),
        ..request(&k, &pod, None)
    };
    let e = st.begin_allocate(long_veth, 0).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert_eq!(
        st.status(Some("nope"), None, 0).unwrap_err().kind,
        ErrorKind::UnknownPool
    );
}

fn allocation_stays_fast_when_nearly_full(f: Family) {
    // As large as an IPv4 /14, at 100% occupancy minus a few scattered holes: every
    // allocation must still be found without a linear scan (the bitmap's summary level, the
    // interval tree).
    let n = 1u32 << 18;
    let mut st = block(f, n, "cooldown=\"0s\"");
    let pod = PodRef::default();
    for i in 0..n {
        let k = AttachmentKey::new("net", &format!("c{i}"), "eth0");
        let AllocStep::Fresh { mut records, .. } =
            st.begin_allocate(request(&k, &pod, None), 0).unwrap()
        else {
            panic!()
        };
        let record = records.remove(0);
        st.commit(&record);
    }
    assert_eq!(st.stats(0)[0].free, 0);
    let start = std::time::Instant::now();
    for round in 0..2000 {
        let victim = (round * 7919) % n;
        release(&mut st, &format!("c{victim}"), 1);
        alloc_one(&mut st, &format!("c{victim}"), 1).unwrap();
    }
    let per_op = start.elapsed() / 4000;
    // Generous bound for a shared debug build; a linear scan would take ~100x longer.
    assert!(per_op < std::time::Duration::from_micros(200), "{per_op:?}");
    st.check_invariants();
}

#[test]
fn reserved_metadata_addresses_are_refused_naming_why() {
    let cfg = Config::parse(
        "[[pool]]\nname=\"nic\"\nsource=\"azure-imds\"\n\
         [[pool]]\nname=\"nic6\"\nsource=\"azure-imds\"\nfamily=\"ipv6\"\n",
        Path::new("/test.toml"),
    )
    .unwrap();
    let mut st = State::new(&cfg);
    let v4: Vec<Ipv4Addr> = [
        "10.0.8.6",
        "0.0.0.0",
        "127.0.0.5",
        "169.254.1.1",
        "169.254.169.254",
        "224.0.0.1",
        "239.1.2.3",
        "255.255.255.255",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let v6: Vec<Ipv6Addr> = ["fd00:8::6", "::", "::1", "fe80::1", "febf::9", "ff02::1"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let nic = st.metadata_target("nic").unwrap();
    let nic6 = st.metadata_target("nic6").unwrap();
    for (pool, good, bad) in [
        (
            nic,
            IpAddr::from(v4[0]),
            v4[1..].iter().map(|a| IpAddr::from(*a)).collect::<Vec<_>>(),
        ),
        (
            nic6,
            IpAddr::from(v6[0]),
            v6[1..].iter().map(|a| IpAddr::from(*a)).collect(),
        ),
    ] {
        let change = st.apply_metadata_read(pool, &v4, &v6, 1_000);
        assert_eq!(change.added, [good]);
        let refused: Vec<IpAddr> = change.refused.iter().map(|(a, _)| *a).collect();
        assert_eq!(refused, bad, "{:?}", change.refused);
        for (a, why) in &change.refused {
            let expect = match a {
                IpAddr::V4(a) if a.is_loopback() || a.is_unspecified() || a.is_broadcast() => {
                    ["loopback", "this network", "broadcast"].to_vec()
                }
                IpAddr::V4(a) if a.is_link_local() => ["link-local"].to_vec(),
                IpAddr::V6(a) if a.is_loopback() || a.is_unspecified() => {
                    ["loopback", "unspecified"].to_vec()
                }
                IpAddr::V6(a) if a.is_multicast() => ["multicast"].to_vec(),
                IpAddr::V6(_) => ["link-local"].to_vec(),
                IpAddr::V4(_) => ["multicast"].to_vec(),
            };
            assert!(expect.iter().any(|w| why.contains(w)), "{a}: {why}");
        }
    }
    let stats = st.stats(1_000);
    assert!(stats.iter().all(|s| s.total == 1), "{stats:?}");
}
