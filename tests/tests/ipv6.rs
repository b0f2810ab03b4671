//! IPv6 on the namespace fabric: the fabric's own dual-stack plumbing (the VNet routes each
//! node's IPv6 pod prefix to its uplink, the internet host has documentation addresses).

use aliasnet_tests::{
    fabric::{
        pod_prefix6, router_ip6, uplink_ip6, Fabric, FabricOpts, INTERNET_IP6, INTERNET_IP6_2,
    },
    netns::Netns,
    require_root, test_mtu,
};

/// `ping` from `ns`; true when every probe was answered.
fn ping(ns: &Netns, dst: impl ToString, extra: &[&str]) -> bool {
    let dst = dst.to_string();
    let mut args = vec!["-c", "2", "-i", "0.05", "-W", "2", "-q"];
    args.extend_from_slice(extra);
    args.push(&dst);
    ns.exec_status("ping", &args)
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn fabric_routes_ipv6_between_nodes_and_to_the_internet() {
    require_root();
    let f = Fabric::new(FabricOpts {
        start_ipamd: false,
        shaper: false,
        ..FabricOpts::default()
    })
    .expect("build fabric");
    let (n1, n2) = (f.node(1), f.node(2));

    assert!(ping(&n1.ns, n2.uplink_ip6, &[]), "node1 -> node2 over IPv6");
    assert!(ping(&n2.ns, n1.uplink_ip6, &[]), "node2 -> node1 over IPv6");
    assert!(ping(&n1.ns, INTERNET_IP6, &[]), "node1 -> {INTERNET_IP6}");
    assert!(
        ping(&n2.ns, INTERNET_IP6_2, &[]),
        "node2 -> {INTERNET_IP6_2}"
    );

    // Each node's pod prefix is routed to that node's uplink, as the IPv4 range is.
    for i in 1..=2 {
        let prefix = pod_prefix6(i);
        let probe = prefix.replace("::/112", "::5");
        let route = f.vnet.ip_json(&["-6", "route", "get", &probe]).unwrap();
        assert_eq!(
            route[0]["gateway"].as_str(),
            Some(uplink_ip6(i).to_string().as_str()),
            "{prefix} -> node{i}: {route}"
        );
        assert_eq!(route[0]["dev"].as_str(), Some(format!("n{i}").as_str()));
        let up = n1.ns.ip_json(&["-6", "route", "get", &probe]).unwrap();
        assert_eq!(
            up[0]["gateway"].as_str(),
            Some(router_ip6(1).to_string().as_str()),
            "node1 sends {probe} to the router: {up}"
        );
    }

    // A full-MTU IPv6 packet crosses the router (IPv6 header 40 + ICMPv6 8).
    let payload = (test_mtu() - 48).to_string();
    assert!(
        ping(&n1.ns, n2.uplink_ip6, &["-M", "do", "-s", &payload]),
        "a {}-byte IPv6 packet crosses the VNet",
        test_mtu()
    );
}
