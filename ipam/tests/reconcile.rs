//! Reconcile against the kernel's links (played by the recording link remover), and the
//! leases `recover` rebuilds (key unknown) being released by DEL, GC and reconcile.

mod common;

use std::{net::Ipv4Addr, sync::Arc, time::Duration};

use aliasnet_ipam::{
    daemon::Daemon,
    reconcile::Reconciler,
    recover::{self, Options, RecoverError},
};
use aliasnet_ipam_proto::{
    Attachment, AttachmentKey, PodRef, Request, Response, RECOVERED_NETWORK,
};
use common::*;

use common::v as veth;

fn alloc_with_veth(c: &str, v: Option<&str>) -> Request {
    Request::Allocate {
        key: key(c),
        pod: PodRef::default(),
        pool: None,
        host_veth: v.map(str::to_owned),
        families: None,
    }
}

async fn allocate_veth(socket: &std::path::Path, c: &str) -> Ipv4Addr {
    match call(socket, alloc_with_veth(c, Some(&veth(c)))).await {
        Ok(Response::Allocated { lease, .. }) => match lease.address {
            std::net::IpAddr::V4(a) => a,
            other => panic!("{other}"),
        },
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_without_veth_are_released_after_the_grace_and_orphans_reported() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let orphan = veth("nobody");
    let kernel = Arc::new(Recorder::with_links(&[&veth("a"), &orphan]));
    let d = env.start(kernel.clone()).await;
    let socket = env.socket();
    allocate_veth(&socket, "a").await;
    let b = allocate_veth(&socket, "b").await;
    // No veth recorded: cannot be checked, never released by the reconcile.
    call(&socket, alloc_with_veth("c", None)).await.unwrap();

    // A long grace: b's veth is missing, but nothing is released yet.
    let mut r = Reconciler::new(d.ipam().clone(), Duration::from_secs(3600));
    let rep = r.pass().await.unwrap();
    assert!(rep.released.is_empty(), "{rep:?}");
    assert_eq!(rep.missing, 1);
    assert_eq!(rep.orphans, vec![orphan.clone()]);
    let (_, rs) = stats(&socket).await;
    assert_eq!(
        (
            rs.orphan_veth_count,
            rs.veth_missing,
            rs.orphan_veths.clone()
        ),
        (1, 1, vec![orphan.clone()])
    );
    let text = scrape(d.metrics_address().unwrap());
    assert_eq!(sample(&text, "aliasnet_ipam_orphan_veths"), Some(1.0));

    // The grace is over (zero): b is released; a (veth present) and c (no veth) stay.
    let mut r = Reconciler::new(d.ipam().clone(), Duration::ZERO);
    let rep = r.pass().await.unwrap();
    assert_eq!(rep.released, vec![(b.into(), veth("b"))]);
    let keys: Vec<String> = list(&socket)
        .await
        .into_iter()
        .map(|l| l.key.container_id)
        .collect();
    assert_eq!(keys, ["a", "c"]);
    let (_, rs) = stats(&socket).await;
    assert_eq!(rs.released, 1);
    let text = scrape(d.metrics_address().unwrap());
    assert_eq!(
        sample(&text, "aliasnet_ipam_reconcile_released_total"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "aliasnet_ipam_releases_total{pool=\"secondary\"}"),
        Some(1.0)
    );

    // The orphan gets a lease (its pod was added meanwhile): no longer an orphan.
    allocate_veth(&socket, "nobody").await;
    let rep = r.pass().await.unwrap();
    assert!(rep.orphans.is_empty() && rep.released.is_empty(), "{rep:?}");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_young_lease_or_a_veth_just_gone_is_not_released() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let kernel = Arc::new(Recorder::with_links(&[]));
    let d = env.start(kernel.clone()).await;
    let socket = env.socket();
    let grace = Duration::from_millis(800);
    let mut r = Reconciler::new(d.ipam().clone(), grace);

    // An ADD in progress: the lease exists, its veth not yet.
    allocate_veth(&socket, "young").await;
    assert!(r.pass().await.unwrap().released.is_empty());
    kernel.set_links(&[&veth("young")]);
    tokio::time::sleep(grace + Duration::from_millis(100)).await;
    let rep = r.pass().await.unwrap();
    assert!(rep.released.is_empty() && rep.missing == 0, "{rep:?}");

    // Old enough now, but its veth has only just gone: released only after a further grace.
    kernel.set_links(&[]);
    assert!(r.pass().await.unwrap().released.is_empty());
    tokio::time::sleep(grace + Duration::from_millis(100)).await;
    assert_eq!(r.pass().await.unwrap().released.len(), 1);
    assert!(list(&socket).await.is_empty());
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_leases_are_released_by_del_gc_and_reconcile() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let socket = env.socket();
    let d = env.start(Arc::new(Recorder::default())).await;
    for c in ["old1", "old2"] {
        allocate(&socket, c).await;
    }
    d.shutdown().await;
    // The state is damaged: the daemon refuses, naming the file and the way out.
    let log = env.state_dir().join(aliasnet_ipam::store::log_name(0));
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[aliasnet_ipam::store::record::HEADER_LEN + 12] ^= 0x40;
    std::fs::write(&log, &bytes).unwrap();
    let e = match Daemon::start(&env.config, Arc::new(Recorder::default())).await {
        Ok(_) => panic!("started on a corrupt state"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(&log.display().to_string()) && e.contains("aliasnet-ipamd recover"),
        "{e}"
    );

    // What the kernel shows: three pods, one outside every pool, and a second route through
    // an already seen veth.
    let routes = vec![
        (Ipv4Addr::new(10, 240, 0, 7).into(), veth("x")),
        (Ipv4Addr::new(10, 240, 0, 9).into(), veth("y")),
        (Ipv4Addr::new(10, 240, 0, 10).into(), veth("y")),
        (Ipv4Addr::new(10, 99, 0, 1).into(), veth("z")),
    ];
    let rep = recover::recover(&env.config, routes.clone(), Options::default())
        .await
        .unwrap();
    assert_eq!(rep.leases.len(), 3, "{rep:?}");
    assert_eq!(rep.skipped.len(), 1, "{rep:?}");
    assert_eq!(rep.cooling, 256 - 2);
    assert!(rep.old_state_error.unwrap().contains("corrupt"));
    let aside = rep.moved_aside.unwrap();
    assert!(
        aside.join(aliasnet_ipam::store::log_name(0)).exists(),
        "old state kept"
    );

    let kernel = Arc::new(Recorder::with_links(&[&veth("x"), &veth("y"), &veth("z")]));
    let d = env.start(kernel.clone()).await;
    // The healthy state is not rebuilt without --force, and not while the daemon runs.
    assert!(matches!(
        recover::recover(&env.config, routes.clone(), Options::default()).await,
        Err(RecoverError::Running(_))
    ));
    let leases = list(&socket).await;
    assert_eq!(leases.len(), 3);
    assert!(leases.iter().all(|l| l.key.network == RECOVERED_NETWORK
        && l.host_veth.as_deref() == Some(l.key.container_id.as_str())));
    let (pools, _) = stats(&socket).await;
    assert_eq!(
        (pools[0].allocated, pools[0].cooling),
        (2, 254),
        "{pools:?}"
    );

    // CHECK of the real key finds the lease through the veth the key hashes to.
    let Response::Lease { lease: Some(l), .. } = call(&socket, Request::Check { key: key("x") })
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(l.address, Ipv4Addr::new(10, 240, 0, 7));
    // DEL with the veth as teardown link.
    assert_eq!(
        release(&socket, "x", Some(veth("x"))).await,
        Response::Released {
            address: Some(Ipv4Addr::new(10, 240, 0, 7).into())
        }
    );
    // DEL without a link: the key's hash names the veth.
    assert_eq!(
        release(&socket, "y", None).await,
        Response::Released {
            address: Some(Ipv4Addr::new(10, 240, 0, 9).into())
        }
    );
    eventually(5, "the recovered veths to be deleted", || async {
        let n = kernel.names();
        (n.contains(&veth("x")) && n.contains(&veth("y"))).then_some(())
    })
    .await;
    // GC of any network leaves a recovered lease alone while its veth exists...
    let gc = Request::Gc {
        network: "net".into(),
        valid: vec![Attachment {
            container_id: "keep".into(),
            ifname: "eth0".into(),
        }],
    };
    assert_eq!(
        call(&socket, gc.clone()).await.unwrap(),
        Response::GcDone { released: vec![] }
    );
    // ...and releases it once the veth is gone.
    kernel.set_links(&[]);
    let Response::GcDone { released } = call(&socket, gc).await.unwrap() else {
        panic!()
    };
    assert_eq!(released.len(), 1);
    assert_eq!(
        released[0].key,
        AttachmentKey::new(RECOVERED_NETWORK, &veth("z"), "-")
    );
    assert!(list(&socket).await.is_empty());
    d.shutdown().await;

    // Healthy now: recover refuses without --force, and with it rebuilds (moving it aside).
    match recover::recover(&env.config, vec![], Options::default()).await {
        Err(RecoverError::Healthy { leases, .. }) => assert_eq!(leases, 0),
        other => panic!("{other:?}"),
    }
    let rep = recover::recover(
        &env.config,
        routes[..1].to_vec(),
        Options {
            force: true,
            no_cooldown: true,
        },
    )
    .await
    .unwrap();
    assert_eq!((rep.leases.len(), rep.cooling), (1, 0));
    assert!(rep.old_state_error.is_none() && rep.moved_aside.is_some());
}

/// A dual-stack pod's /32 and /128 through one veth: two recovered leases under the veth's
/// key, both answered by a CHECK of the real key, both kept over a restart, both released by
/// one DEL (or by a GC once the veth is gone); the IPv6 address is not handed out while
/// leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_veth_holds_one_lease_per_family() {
    let env = Env::new(
        "cooldown = \"0s\"",
        "cidrs = [\"10.240.0.0/30\"]\n[[pool]]\nname = \"v6\"\nsource = \"static\"\n\
         cidrs = [\"fd00:240::/127\"]",
    );
    let socket = env.socket();
    let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    let routes = vec![
        (ip("10.240.0.1"), veth("x")),
        (ip("fd00:240::"), veth("x")),
        (ip("fd00:240::1"), veth("x")),
        (ip("::1"), veth("y")),
        (ip("10.240.0.2"), veth("w")),
        (ip("fd00:240::1"), veth("w")),
    ];
    let rep = recover::recover(&env.config, routes, Options::default())
        .await
        .unwrap();
    assert_eq!(rep.leases.len(), 4, "{rep:?}");
    assert_eq!(rep.leases[1], (ip("fd00:240::"), veth("x"), "v6".into()));
    // A second /128 through the same veth, and an address no pool can hold.
    assert_eq!(rep.skipped.len(), 2, "{rep:?}");
    // IPv4 addresses cool; an IPv6 range is not enumerated.
    assert_eq!(rep.cooling, 2);

    // A GC once w's veth is gone releases both of its leases.
    let d = env
        .start(Arc::new(Recorder::with_links(&[&veth("x")])))
        .await;
    let gc = Request::Gc {
        network: "net".into(),
        valid: vec![],
    };
    let Response::GcDone { mut released } = call(&socket, gc).await.unwrap() else {
        panic!()
    };
    released.sort_by_key(|l| l.address);
    assert_eq!(
        released.iter().map(|l| l.address).collect::<Vec<_>>(),
        vec![ip("10.240.0.2"), ip("fd00:240::1")]
    );
    assert!(released
        .iter()
        .all(|l| l.key == AttachmentKey::new(RECOVERED_NETWORK, &veth("w"), "-")));
    d.shutdown().await;

    for restart in [false, true] {
        let d = env
            .start(Arc::new(Recorder::with_links(&[&veth("x")])))
            .await;
        let Response::Lease {
            lease: Some(l),
            more,
        } = call(&socket, Request::Check { key: key("x") })
            .await
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(l.address, ip("10.240.0.1"), "restart {restart}");
        assert_eq!(more.len(), 1);
        assert_eq!(more[0].address, ip("fd00:240::"));
        assert_eq!(
            more[0].key,
            AttachmentKey::new(RECOVERED_NETWORK, &veth("x"), "-")
        );
        d.shutdown().await;
    }

    let d = env
        .start(Arc::new(Recorder::with_links(&[&veth("x")])))
        .await;
    // The recovered IPv6 address is not handed out: the pool's other address is.
    let Response::Allocated { lease, more } =
        call(&socket, alloc_with_veth("new", None)).await.unwrap()
    else {
        panic!()
    };
    assert_ne!(lease.address, ip("10.240.0.1"));
    assert_eq!(more[0].address, ip("fd00:240::1"));
    assert_eq!(
        release(&socket, "x", None).await,
        Response::Released {
            address: Some(ip("10.240.0.1"))
        }
    );
    let left = list(&socket).await;
    assert!(
        left.iter().all(|l| l.key == key("new")) && left.len() == 2,
        "{left:?}"
    );
    d.shutdown().await;
}

/// `recover` on a dual-stack node: the unleased addresses of an IPv6 /112 cool down as an
/// IPv4 pool's do, and in a delegated /64 the 65,536 the round-robin reaches next do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_cools_unleased_ipv6_addresses() {
    use std::net::{IpAddr, Ipv6Addr};
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let env = Env::new(
        "",
        "cidrs = [\"10.240.0.0/30\"]\n[[pool]]\nname = \"v6\"\nsource = \"static\"\n\
         cidrs = [\"fd00:240::/112\"]\n[[pool]]\nname = \"blocks6\"\nsource = \"prefixes\"\n\
         prefixes = [\"2001:db8:1:2::/64\"]",
    );
    // x is dual-stack; y routes a second /128 (skipped, so cooled); z is in the /64.
    let routes = vec![
        (ip("10.240.0.1"), veth("x")),
        (ip("fd00:240::7"), veth("x")),
        (ip("fd00:240::9"), veth("y")),
        (ip("fd00:240::a"), veth("y")),
        (ip("2001:db8:1:2::5"), veth("z")),
    ];
    let rep = recover::recover(&env.config, routes, Options::default())
        .await
        .unwrap();
    assert_eq!((rep.leases.len(), rep.skipped.len()), (4, 1), "{rep:?}");
    // The /112's subnet-router anycast address is not a pool address.
    assert_eq!(rep.cooling, 3 + (65_535 - 2) + 65_536);

    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let (pools, _) = stats(&socket).await;
    let counts: Vec<_> = pools
        .iter()
        .map(|p| (p.name.as_str(), p.allocated, p.cooling, p.free))
        .collect();
    assert_eq!(
        counts,
        [
            ("secondary", 1, 3, 0),
            ("v6", 2, 65_533, 0),
            ("blocks6", 1, 65_536, u64::MAX - 65_536)
        ]
    );
    // The /112 only cools; the /64 hands out the first address past the cooled window.
    let req = Request::Allocate {
        key: key("new"),
        pod: PodRef::default(),
        pool: None,
        host_veth: None,
        families: Some(vec![aliasnet_ipam_proto::Family::Ipv6]),
    };
    let Ok(Response::Allocated { lease, .. }) = call(&socket, req).await else {
        panic!()
    };
    let window_end = u128::from("2001:db8:1:2::5".parse::<Ipv6Addr>().unwrap()) + 65_536;
    assert_eq!(lease.address, IpAddr::V6(Ipv6Addr::from(window_end + 1)));
    d.shutdown().await;
}
