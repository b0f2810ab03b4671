//! Release, GC and cooldown over the daemon's unix socket: a link is torn down before its
//! address is reused, GC releases stale leases, exhaustion and cooling are reported and
//! survive restarts, and a stale release frees nothing.

mod common;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{Attachment, ClientError, ErrorKind, Request, Response};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_tears_down_the_link_before_the_address_is_reused() {
    // One address and no cooldown: only the pending teardown keeps it from being reused.
    let env = Env::new("cooldown = \"0s\"", "ips = [\"10.240.0.7\"]");
    let rec = Arc::new(Recorder {
        delay: Duration::from_millis(1000),
        ..Recorder::default()
    });
    let d = env.start(rec.clone()).await;
    let socket = env.socket();
    match call(&socket, alloc_req("old", Some(&v("old")))).await {
        Ok(Response::Allocated { .. }) => {}
        other => panic!("{other:?}"),
    }
    let t0 = Instant::now();
    let r = release(&socket, "old", Some(v("old"))).await;
    assert!(
        matches!(r, Response::Released { address: Some(_) }),
        "{r:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(800),
        "release waited for the teardown"
    );
    // Another key wants the only address: it must wait for the old veth to be gone.
    let new = allocate(&socket, "new").await;
    let done = Instant::now();
    let removed = rec.removed.lock().unwrap().clone();
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].0, v("old"));
    assert!(
        removed[0].1 <= done,
        "address handed out before its old veth was deleted"
    );
    assert_eq!(new.address.to_string(), "10.240.0.7");

    // Same again, this time the new attachment reuses the veth name being deleted.
    release(&socket, "new", Some(v("new"))).await;
    match call(&socket, alloc_req("new", Some(&v("new")))).await {
        Ok(Response::Allocated { .. }) => {}
        other => panic!("{other:?}"),
    }
    let removed = rec.removed.lock().unwrap().clone();
    assert_eq!(
        removed.len(),
        2,
        "allocate did not wait for the teardown of its veth name"
    );
    // A release of a key without a lease deletes nothing, not even its own veth name.
    let r = release(&socket, "never", Some(v("never"))).await;
    assert_eq!(r, Response::Released { address: None });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !rec.names().contains(&v("never")),
        "an unowned link was deleted"
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_releases_stale_leases_and_tears_down_their_veths() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let rec = Arc::new(Recorder::default());
    let d = env.start(rec.clone()).await;
    let socket = env.socket();
    for c in ["keep", "stale1", "stale2"] {
        call(&socket, alloc_req(c, Some(&v(c)))).await.unwrap();
    }
    let r = call(
        &socket,
        Request::Gc {
            network: "net".into(),
            valid: vec![Attachment {
                container_id: "keep".into(),
                ifname: "eth0".into(),
            }],
        },
    )
    .await
    .unwrap();
    let Response::GcDone { released } = r else {
        panic!("{r:?}")
    };
    let mut gone: Vec<_> = released
        .iter()
        .map(|l| l.key.container_id.clone())
        .collect();
    gone.sort();
    assert_eq!(gone, ["stale1", "stale2"]);
    let left = list(&socket).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].key.container_id, "keep");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rec.names().len() < 2 {
        assert!(Instant::now() < deadline, "gc did not delete the veths");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut names = rec.names();
    names.sort();
    let mut want = [v("stale1"), v("stale2")];
    want.sort();
    assert_eq!(names, want);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_stats_report_exhaustion_and_cooling() {
    let env = Env::new("cooldown = \"130s\"", "cidrs = [\"10.240.1.0/30\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    assert_eq!(
        call(
            &socket,
            Request::Status {
                pool: None,
                families: None,
            }
        )
        .await
        .unwrap(),
        Response::Status {
            ready: true,
            free: 4,
            reason: None
        }
    );
    for c in ["a", "b", "c", "d"] {
        allocate(&socket, c).await;
    }
    release(&socket, "a", None).await;
    match call(
        &socket,
        Request::Status {
            pool: None,
            families: None,
        },
    )
    .await
    .unwrap()
    {
        Response::Status {
            ready: false,
            free: 0,
            reason: Some(r),
        } => assert!(r.contains("3 allocated, 1 cooling"), "{r}"),
        other => panic!("{other:?}"),
    }
    match call(&socket, alloc_req("e", None)).await {
        Err(ClientError::Refused { kind, message }) => {
            assert_eq!(kind, ErrorKind::OnlyCooling);
            assert!(
                message.contains("pool 'secondary' (10.240.1.0/30, 4 addresses) has no free address: 3 allocated, 1 cooling"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    match call(&socket, Request::Stats).await.unwrap() {
        Response::Stats { pools, .. } => {
            assert_eq!(pools.len(), 1);
            let p = &pools[0];
            assert_eq!(
                (p.total, p.allocated, p.cooling, p.free),
                (4, 3, 1, 0),
                "{p:?}"
            );
            assert_eq!(p.source, "static");
        }
        other => panic!("{other:?}"),
    }
    match call(
        &socket,
        Request::Status {
            pool: Some("nope".into()),
            families: None,
        },
    )
    .await
    {
        Err(ClientError::Refused { kind, .. }) => assert_eq!(kind, ErrorKind::UnknownPool),
        other => panic!("{other:?}"),
    }
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooldown_survives_restarts_and_compaction() {
    let env = Env::new("cooldown = \"130s\"", "cidrs = [\"10.240.0.0/30\"]");
    let socket = env.socket();
    let d = env.start(Arc::new(Recorder::default())).await;
    for c in ["a", "b", "c", "d"] {
        allocate(&socket, c).await;
    }
    release(&socket, "a", None).await;
    d.shutdown().await;
    for round in 0..2 {
        if round == 1 {
            // A compaction in between (merge on disk) keeps the cooling entry too.
            let (mut store, _) = aliasnet_ipam::store::Store::open(env.state_dir()).unwrap();
            let g = store.rotate().unwrap();
            let len = store
                .compaction(g, aliasnet_ipam::service::now_ms(), 130_000)
                .run()
                .unwrap();
            store.snapshot_done(g, len);
        }
        let d = env.start(Arc::new(Recorder::default())).await;
        let Response::Stats { pools, .. } = call(&socket, Request::Stats).await.unwrap() else {
            panic!()
        };
        assert_eq!(
            (pools[0].allocated, pools[0].cooling, pools[0].free),
            (3, 1, 0)
        );
        match call(&socket, alloc_req("e", None)).await {
            Err(ClientError::Refused { kind, message }) => {
                assert_eq!(kind, ErrorKind::OnlyCooling);
                assert!(message.contains("1 cooling"), "{message}");
            }
            other => panic!("round {round}: {other:?}"),
        }
        d.shutdown().await;
    }
}

/// A Release that names its lease (ReleaseLease) and arrives late, after the key was released
/// and allocated again (its DEL timed out; a later ADD of the same key got a new lease),
/// releases and deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_cannot_free_the_keys_next_lease() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let rec = Arc::new(Recorder::default());
    let d = env.start(rec.clone()).await;
    let socket = env.socket();
    let first = allocate_with_veth(&socket, "k").await;
    let stale = Request::ReleaseLease {
        key: key("k"),
        teardown_link: Some(v("k")),
        lease: (&first).into(),
    };
    // The first DEL's release goes through (by another path: the spool, a retry).
    let r = release(&socket, "k", Some(v("k"))).await;
    assert!(
        matches!(r, Response::Released { address: Some(_) }),
        "{r:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while rec.names().is_empty() {
        assert!(Instant::now() < deadline, "veth never deleted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = allocate_with_veth(&socket, "k").await;
    // The stale one arrives now.
    assert_eq!(
        call(&socket, stale).await.unwrap(),
        Response::Released { address: None }
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        rec.names().len(),
        1,
        "the new attachment's veth was deleted"
    );
    assert_eq!(list(&socket).await, vec![second.clone()]);
    // Naming the current lease releases it.
    let r = call(
        &socket,
        Request::ReleaseLease {
            key: key("k"),
            teardown_link: Some(v("k")),
            lease: (&second).into(),
        },
    )
    .await
    .unwrap();
    assert_eq!(
        r,
        Response::Released {
            address: Some(second.address)
        }
    );
    d.shutdown().await;
}
