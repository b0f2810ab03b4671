//! Recovery and reconcile against a real kernel, inside a network namespace this test creates
//! (unshared by the test thread; it disappears with the thread): veths named like aliasnet's
//! with /32 routes become recovered leases; a veth that goes away releases its lease; a veth
//! without a route or lease is reported as an orphan.

mod common;

use std::{net::Ipv4Addr, sync::Arc, time::Duration};

use aliasnet_ipam::{
    reconcile::Reconciler,
    recover::{self, kernel_routes, Options},
    teardown::{link_exists, NetlinkRemover},
};
use aliasnet_ipam_proto::{Response, RECOVERED_NETWORK};
use common::*;
use futures::TryStreamExt;
use rtnetlink::{LinkUnspec, LinkVeth, RouteMessageBuilder};

async fn add_veth(handle: &rtnetlink::Handle, name: &str, peer: &str, route: Option<Ipv4Addr>) {
    handle
        .link()
        .add(LinkVeth::new(name, peer).build())
        .execute()
        .await
        .unwrap_or_else(|e| panic!("creating veth {name}: {e}"));
    for n in [name, peer] {
        handle
            .link()
            .set(LinkUnspec::new_with_name(n).up().build())
            .execute()
            .await
            .unwrap();
    }
    if let Some(addr) = route {
        let idx = handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute()
            .try_next()
            .await
            .unwrap()
            .unwrap()
            .header
            .index;
        handle
            .route()
            .add(
                RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(addr, 32)
                    .output_interface(idx)
                    .build(),
            )
            .execute()
            .await
            .unwrap_or_else(|e| panic!("route {addr} dev {name}: {e}"));
    }
}

async fn scenario() {
    let remover = Arc::new(NetlinkRemover::new().expect("netlink socket"));
    let handle = remover.handle().clone();
    let v1 = v("p1");
    let v2 = v("p2");
    let orphan = v("gone");
    add_veth(&handle, &v1, "pod1", Some(Ipv4Addr::new(10, 240, 0, 11))).await;
    add_veth(&handle, &v2, "pod2", Some(Ipv4Addr::new(10, 240, 0, 12))).await;
    add_veth(&handle, &orphan, "pod3", None).await;
    // Not ours: ignored by recovery and reconcile alike.
    add_veth(
        &handle,
        "other0",
        "other0p",
        Some(Ipv4Addr::new(10, 240, 0, 13)),
    )
    .await;

    let routes = kernel_routes(&handle, "ali").await.unwrap();
    assert_eq!(
        routes,
        vec![
            (Ipv4Addr::new(10, 240, 0, 11), v1.clone()),
            (Ipv4Addr::new(10, 240, 0, 12), v2.clone())
        ]
    );

    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let rep = recover::recover(&env.config, routes, Options::default())
        .await
        .unwrap();
    assert_eq!(rep.leases.len(), 2);
    assert!(rep.moved_aside.is_none(), "there was no state");

    let d = env.start(remover.clone()).await;
    let socket = env.socket();
    let leases = list(&socket).await;
    assert_eq!(leases.len(), 2);
    assert!(leases.iter().all(|l| l.key.network == RECOVERED_NETWORK));

    let mut r = Reconciler::new(d.ipam().clone(), Duration::ZERO);
    let rep = r.pass().await.unwrap();
    assert!(rep.released.is_empty(), "{rep:?}");
    assert_eq!(rep.orphans, vec![orphan.clone()]);

    // The pod behind v1 vanished (its netns went, taking the veth pair with it).
    handle
        .link()
        .del(
            handle
                .link()
                .get()
                .match_name(v1.clone())
                .execute()
                .try_next()
                .await
                .unwrap()
                .unwrap()
                .header
                .index,
        )
        .execute()
        .await
        .unwrap();
    let rep = r.pass().await.unwrap();
    assert_eq!(
        rep.released,
        vec![(Ipv4Addr::new(10, 240, 0, 11).into(), v1.clone())]
    );

    // The plugin's DEL for p2: the key hashes to v2; the daemon deletes the veth.
    let resp = release(&socket, "p2", Some(v2.clone())).await;
    assert_eq!(
        resp,
        Response::Released {
            address: Some(Ipv4Addr::new(10, 240, 0, 12).into())
        }
    );
    eventually(5, "v2 to be deleted", || async {
        (!link_exists(&handle, &v2).await.unwrap()).then_some(())
    })
    .await;
    assert!(list(&socket).await.is_empty());
    d.shutdown().await;
}

#[test]
fn recover_and_reconcile_read_the_real_kernel() {
    in_own_netns(scenario);
}
