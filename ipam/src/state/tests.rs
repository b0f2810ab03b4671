use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use aliasnet_ipam_proto::{host_veth_name, Attachment};

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
            families: None,
        },
        now,
    )? {
        AllocStep::Fresh {
            mut leases,
            records,
        } => {
            for r in &records {
                st.commit(r);
            }
            Ok(leases.remove(0))
        }
        AllocStep::Existing(mut l) => Ok(l.remove(0)),
        AllocStep::Wait(w) => panic!("wait: {w}"),
    }
}

fn release(st: &mut State, c: &str, now: u64) -> Option<IpAddr> {
    match st.begin_release(&key(c), None, None, now).unwrap() {
        ReleaseStep::Fresh {
            records, address, ..
        } => {
            for r in &records {
                st.commit(r);
            }
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
    let (ready, free, reason) = st.status(None, None, 2_000).unwrap();
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
    assert!(st.status(None, None, 30).unwrap().0);
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
        families: None,
    };
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
        families: None,
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
    let req2 = AllocRequest {
        key: &k2,
        host_veth: None,
        families: None,
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
    let AllocStep::Fresh { mut records, .. } = st
        .begin_allocate(
            AllocRequest {
                key: &other,
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
                families: None,
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
                families: None,
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
                families: None,
            },
            0,
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert_eq!(
        st.status(Some("nope"), None, 0).unwrap_err().kind,
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
        let AllocStep::Fresh { mut records, .. } = st
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
        let record = records.remove(0);
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
    let v6: Vec<std::net::Ipv6Addr> = ["fd00:8::6", "::", "::1", "fe80::1", "febf::9", "ff02::1"]
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
