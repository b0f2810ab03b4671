//! Recovery and reconcile against a real kernel, inside a network namespace this test creates
//! (unshared by the test thread; it disappears with the thread): veths named like aliasnet's
//! with /32 and /128 routes become recovered leases (one per family under the veth's key); a
//! veth that goes away releases its leases; a veth without a route or lease is reported as an
//! orphan.

mod common;

use std::{net::IpAddr, sync::Arc, time::Duration};

use aliasnet_ipam::{
    reconcile::Reconciler,
    recover::{self, kernel_routes, Options},
    teardown::NetlinkRemover,
};
use aliasnet_ipam_proto::{Response, RECOVERED_NETWORK};
use common::*;

fn add_veth(name: &str, peer: &str, routes: &[IpAddr]) {
    run_ip(&["link", "add", name, "type", "veth", "peer", "name", peer]);
    for n in [name, peer] {
        run_ip(&["link", "set", n, "up"]);
    }
    for addr in routes {
        let dst = match addr {
            IpAddr::V4(_) => format!("{addr}/32"),
            IpAddr::V6(_) => format!("{addr}/128"),
        };
        run_ip(&["route", "add", &dst, "dev", name]);
    }
}

async fn scenario() {
    let remover = Arc::new(NetlinkRemover::new().expect("netlink socket"));
    let v1 = v("p1");
    let v2 = v("p2");
    let orphan = v("gone");
    // Dual-stack pods: a /32 and a /128 through each host veth.
    add_veth(&v1, "pod1", &[ip("10.240.0.11"), ip("fd00:240::b")]);
    add_veth(&v2, "pod2", &[ip("10.240.0.12"), ip("fd00:240::c")]);
    add_veth(&orphan, "pod3", &[]);
    // Not ours: ignored by recovery and reconcile alike.
    add_veth("other0", "other0p", &[ip("10.240.0.13"), ip("fd00:240::d")]);

    let routes = remover.with(|r| kernel_routes(r, "ali")).unwrap();
    assert_eq!(
        routes,
        vec![
            (ip("10.240.0.11"), v1.clone()),
            (ip("10.240.0.12"), v2.clone()),
            (ip("fd00:240::b"), v1.clone()),
            (ip("fd00:240::c"), v2.clone()),
        ]
    );

    let env = Env::new(
        "",
        "cidrs = [\"10.240.0.0/24\"]\n[[pool]]\nname = \"v6\"\nsource = \"static\"\n\
         cidrs = [\"fd00:240::/112\"]",
    );
    let rep = recover::recover(&env.config, routes, Options::default())
        .await
        .unwrap();
    assert_eq!(rep.leases.len(), 4, "{rep:?}");
    assert!(rep.skipped.is_empty(), "{rep:?}");
    assert!(rep.moved_aside.is_none(), "there was no state");

    let d = env.start(remover.clone()).await;
    let socket = env.socket();
    let leases = list(&socket).await;
    assert_eq!(leases.len(), 4);
    assert!(leases.iter().all(|l| l.key.network == RECOVERED_NETWORK));
    // Each veth's two leases share its key.
    let v1_leases: Vec<_> = leases.iter().filter(|l| l.key.container_id == v1).collect();
    assert_eq!(v1_leases.len(), 2, "{leases:?}");
    assert_eq!(v1_leases[0].key, v1_leases[1].key);
    assert_eq!(v1_leases[1].pool, "v6");

    let mut r = Reconciler::new(d.ipam().clone(), Duration::ZERO);
    let rep = r.pass().await.unwrap();
    assert!(rep.released.is_empty(), "{rep:?}");
    assert_eq!(rep.orphans, vec![orphan.clone()]);

    // The pod behind v1 vanished (its netns went, taking the veth pair with it).
    run_ip(&["link", "del", &v1]);
    let rep = r.pass().await.unwrap();
    let mut released = rep.released.clone();
    released.sort();
    assert_eq!(
        released,
        vec![
            (ip("10.240.0.11"), v1.clone()),
            (ip("fd00:240::b"), v1.clone())
        ]
    );

    // The plugin's DEL for p2: the key hashes to v2; the daemon deletes the veth.
    let resp = release(&socket, "p2", Some(v2.clone())).await;
    assert_eq!(
        resp,
        Response::Released {
            address: Some(ip("10.240.0.12"))
        }
    );
    eventually(5, "v2 to be deleted", || async {
        (!link_exists(&v2)).then_some(())
    })
    .await;
    assert!(list(&socket).await.is_empty());
    d.shutdown().await;
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn recover_and_reconcile_read_the_real_kernel() {
    in_own_netns(scenario);
}
