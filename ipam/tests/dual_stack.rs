//! A dual-stack daemon over its unix socket: one address per family in one Allocate, Check,
//! paging across families, one teardown for a key's two leases, restart.

mod common;

use std::{net::IpAddr, sync::Arc};

use aliasnet_ipam_proto::{Client, ErrorKind, Family, LeaseRef, PodRef, Request, Response};
use common::*;

// Four addresses from fd00:240:: (a `cidrs` /126 would leave out its subnet-router anycast
// address, fd00:240::).
const V6_POOL: &str =
    "[[pool]]\nname = \"v6\"\nsource = \"static\"\nranges = [\"fd00:240::-fd00:240::3\"]";

fn env() -> Env {
    Env::new(
        "cooldown = \"0s\"",
        &format!("cidrs = [\"10.240.0.0/30\"]\n{V6_POOL}"),
    )
}

fn alloc_families(c: &str, families: Option<Vec<Family>>) -> Request {
    Request::Allocate {
        key: key(c),
        pod: PodRef::default(),
        pool: None,
        host_veth: Some(v(c)),
        families,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_key_gets_one_address_per_family() {
    let env = env();
    let rec = Arc::new(Recorder::default());
    let d = env.start(rec.clone()).await;
    let socket = env.socket();

    let Ok(Response::Allocated { lease, more }) = call(&socket, alloc_families("a", None)).await
    else {
        panic!()
    };
    assert_eq!(lease.address, ip("10.240.0.0"));
    assert_eq!(more.len(), 1);
    assert_eq!(more[0].address, ip("fd00:240::"));
    assert_eq!(more[0].pool, "v6");
    assert_eq!(more[0].allocated_at_ms, lease.allocated_at_ms);
    assert_eq!(more[0].host_veth, lease.host_veth);
    // An IPv6-only key.
    let Ok(Response::Allocated {
        lease: b,
        more: none,
    }) = call(&socket, alloc_families("b", Some(vec![Family::Ipv6]))).await
    else {
        panic!()
    };
    assert_eq!((b.address, none.len()), (ip("fd00:240::1"), 0));
    // Check answers both, IPv4 first.
    let Ok(Response::Lease {
        lease: Some(l),
        more: m,
    }) = call(&socket, Request::Check { key: key("a") }).await
    else {
        panic!()
    };
    assert_eq!((l.address, m[0].address), (lease.address, more[0].address));

    // Paging one lease at a time crosses from IPv4 into IPv6.
    let s = socket.clone();
    let seen = tokio::task::spawn_blocking(move || {
        let mut c = Client::connect(&s, std::time::Duration::from_secs(5)).unwrap();
        let mut after = None;
        let mut seen = Vec::new();
        loop {
            let (page, next) = c.list_page(after, Some(1)).unwrap();
            seen.extend(page.into_iter().map(|l| l.address));
            match next {
                Some(n) => after = Some(n),
                None => return seen,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(
        seen,
        vec![ip("10.240.0.0"), ip("fd00:240::"), ip("fd00:240::1")]
    );

    let (pools, _) = stats(&socket).await;
    let v6 = pools.iter().find(|p| p.name == "v6").unwrap();
    assert_eq!((v6.family, v6.total, v6.allocated), (Family::Ipv6, 4, 2));
    assert_eq!(pools[0].family, Family::Ipv4);
    let Ok(Response::Status { ready: true, .. }) = call(
        &socket,
        Request::Status {
            pool: None,
            families: None,
        },
    )
    .await
    else {
        panic!()
    };

    // A late ReleaseLease naming the IPv6 address of another allocation time: nothing.
    let stale = Request::ReleaseLease {
        key: key("a"),
        teardown_link: Some(v("a")),
        lease: LeaseRef {
            address: more[0].address,
            allocated_at_ms: lease.allocated_at_ms + 1,
        },
    };
    assert_eq!(
        call(&socket, stale).await.unwrap(),
        Response::Released { address: None }
    );
    // The right one releases both leases and deletes the shared veth once.
    let ok = Request::ReleaseLease {
        key: key("a"),
        teardown_link: Some(v("a")),
        lease: LeaseRef::from(&more[0]),
    };
    assert_eq!(
        call(&socket, ok).await.unwrap(),
        Response::Released {
            address: Some(lease.address)
        }
    );
    eventually(5, "the veth to be deleted", || async {
        (rec.names() == vec![v("a")]).then_some(())
    })
    .await;
    let Ok(Response::Lease { lease: None, more }) =
        call(&socket, Request::Check { key: key("a") }).await
    else {
        panic!()
    };
    assert!(more.is_empty());

    // Restart: b's IPv6 lease is still there.
    let before = list(&socket).await;
    d.shutdown().await;
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&socket).await, before);
    // Three IPv6-only keys fill the IPv6 pool (a's address is free again: no cooldown); a
    // dual-stack key then gets nothing at all.
    for c in ["c", "d", "f"] {
        assert!(matches!(
            call(&socket, alloc_families(c, Some(vec![Family::Ipv6]))).await,
            Ok(Response::Allocated { .. })
        ));
    }
    let (pools, _) = stats(&socket).await;
    let v4_free = pools[0].free;
    let e = call(&socket, alloc_families("e", None)).await.unwrap_err();
    let aliasnet_ipam_proto::ClientError::Refused { kind, message } = e else {
        panic!("{e}")
    };
    assert_eq!(kind, ErrorKind::PoolExhausted);
    assert!(message.starts_with("family ipv6"), "{message}");
    let (pools, _) = stats(&socket).await;
    assert_eq!(pools[0].free, v4_free, "the IPv4 address was put back");
    d.shutdown().await;
}
