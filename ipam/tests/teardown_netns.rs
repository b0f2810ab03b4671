//! Host veth teardown through real netlink, inside a network namespace this test creates (an
//! anonymous one, unshared by the test thread; it disappears with the thread).

mod common;

use std::{sync::Arc, time::Duration};

use aliasnet_ipam::teardown::NetlinkRemover;
use aliasnet_ipam_proto::{Attachment, ClientError, ErrorKind, Request, Response};
use common::*;

/// The peer of host veth `name` (15 characters at most, like every link name).
fn peer(name: &str) -> String {
    format!("pe{}", &name[name.len().saturating_sub(12)..])
}

fn add_veth(name: &str) {
    run_ip(&[
        "link",
        "add",
        name,
        "type",
        "veth",
        "peer",
        "name",
        &peer(name),
    ]);
    assert!(link_exists(name));
}

async fn scenario() {
    let remover = Arc::new(NetlinkRemover::new().expect("netlink socket"));
    let (old, gc0) = (v("old"), v("gc1"));
    add_veth(&old);

    // One address, no cooldown: only the teardown stands between release and reuse.
    let env = Env::new("cooldown = \"0s\"", "ips = [\"10.240.0.7\"]");
    let d = env.start(remover.clone()).await;
    let socket = env.socket();

    let r = call(&socket, alloc_req("old", Some(&old))).await.unwrap();
    assert!(matches!(r, Response::Allocated { .. }), "{r:?}");
    let r = release(&socket, "old", Some(old.clone())).await;
    assert!(
        matches!(r, Response::Released { address: Some(_) }),
        "{r:?}"
    );
    // The address is handed out again only once the old veth is really gone.
    let new = allocate(&socket, "new").await;
    assert_eq!(new.address.to_string(), "10.240.0.7");
    assert!(
        !link_exists(&old),
        "address reused while its old veth still existed"
    );
    assert!(!link_exists(&peer(&old)), "peer gone too");

    // A link that does not exist is fine.
    let r = release(&socket, "new", Some(v("new"))).await;
    assert!(
        matches!(r, Response::Released { address: Some(_) }),
        "{r:?}"
    );

    // GC tears down the host veth of what it releases.
    add_veth(&gc0);
    let r = call(&socket, alloc_req("gc1", Some(&gc0))).await.unwrap();
    assert!(matches!(r, Response::Allocated { .. }), "{r:?}");
    let r = call(
        &socket,
        Request::Gc {
            network: "net".into(),
            valid: Vec::<Attachment>::new(),
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(r, Response::GcDone { ref released } if released.len() == 1),
        "{r:?}"
    );
    allocate(&socket, "after").await;
    assert!(!link_exists(&gc0));

    d.shutdown().await;
}

fn add_bridge(name: &str) {
    run_ip(&["link", "add", name, "type", "bridge"]);
}

fn refused(r: Result<Response, ClientError>, what: &str) -> String {
    match r {
        Err(ClientError::Refused {
            kind: ErrorKind::BadRequest,
            message,
        }) => message,
        other => panic!("{what}: {other:?}"),
    }
}

/// Only ever our own links: a veth, named with the prefix, recorded for the lease's key. A
/// request naming another pod's veth, eth0, a bridge or kube-ipvs0 is refused and changes
/// nothing; a Release of a key without a lease deletes nothing; a non-veth link carrying a
/// lease's own name is released but kept.
async fn attacks() {
    let remover = Arc::new(NetlinkRemover::new().expect("netlink socket"));
    for c in ["mine", "other", "nolease"] {
        add_veth(&v(c));
    }
    add_bridge("eth0");
    add_bridge("kube-ipvs0");
    add_bridge("cni0");
    // Links of other kinds that were given a pod's veth name.
    add_bridge(&v("bridged"));
    add_bridge(&v("gcd"));
    let foreign = [
        "eth0".to_owned(),
        "kube-ipvs0".into(),
        "cni0".into(),
        v("other"),
    ];

    let env = Env::new(
        "cooldown = \"0s\"\nreconcile_interval = \"0s\"",
        "cidrs = [\"10.240.0.0/28\"]",
    );
    let d = env.start(remover.clone()).await;
    let socket = env.socket();
    for c in ["mine", "other", "bridged", "gcd"] {
        let r = call(&socket, alloc_req(c, Some(&v(c)))).await.unwrap();
        assert!(matches!(r, Response::Allocated { .. }), "{r:?}");
    }
    for bad in &foreign {
        let m = refused(
            call(&socket, alloc_req("intruder", Some(bad))).await,
            &format!("allocate naming {bad}"),
        );
        assert!(m.contains(bad.as_str()), "{m}");
    }
    for bad in foreign.iter().chain([&v("bridged")]) {
        let m = refused(
            call(
                &socket,
                Request::Release {
                    key: key("mine"),
                    teardown_link: Some(bad.clone()),
                },
            )
            .await,
            &format!("release naming {bad}"),
        );
        assert!(
            m.contains(bad.as_str()) && m.contains("nothing was released"),
            "{m}"
        );
    }
    let r = release(&socket, "nolease", Some(v("nolease"))).await;
    assert_eq!(r, Response::Released { address: None });
    // Nothing was persisted by the refused requests.
    d.shutdown().await;
    let d = env.start(remover.clone()).await;
    let mut held: Vec<String> = list(&socket)
        .await
        .into_iter()
        .map(|l| l.key.container_id)
        .collect();
    held.sort();
    assert_eq!(held, ["bridged", "gcd", "mine", "other"]);

    // Their own names: the veth goes, the bridge is released but stays.
    for c in ["mine", "bridged"] {
        let r = release(&socket, c, Some(v(c))).await;
        assert!(
            matches!(r, Response::Released { address: Some(_) }),
            "{r:?}"
        );
    }
    // GC releases "gcd" (not valid) but does not delete its bridge.
    let r = call(
        &socket,
        Request::Gc {
            network: "net".into(),
            valid: vec![Attachment {
                container_id: "other".into(),
                ifname: "eth0".into(),
            }],
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(r, Response::GcDone { ref released } if released.len() == 1),
        "{r:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while link_exists(&v("mine")) {
        assert!(
            std::time::Instant::now() < deadline,
            "own veth never deleted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for l in foreign
        .iter()
        .chain([&v("bridged"), &v("gcd"), &v("nolease")])
    {
        assert!(link_exists(l), "{l} was deleted");
    }
    d.shutdown().await;
}

#[test]
fn only_our_own_veths_are_ever_deleted() {
    in_own_netns(attacks);
}

#[test]
fn release_and_gc_delete_host_veths_before_reuse() {
    in_own_netns(scenario);
}
