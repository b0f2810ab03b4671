//! End-to-end tests of the alias-IP datapath through the real `aliasnet` binary and
//! `aliasnet-ipamd`, on the namespace fabric (see `aliasnet_tests::fabric`).

use std::{os::unix::fs::MetadataExt, time::Duration};

use aliasnet_tests::{
    cni::Invocation,
    fabric::{Fabric, FabricOpts, INTERNET_IP, INTERNET_IP2},
    netns::Netns,
    require_root, test_mtu,
    traffic::capture,
};
use serde_json::json;

fn fabric() -> Fabric {
    Fabric::new(FabricOpts::default()).expect("build fabric")
}

#[test]
fn pods_reach_each_other_and_the_internet_without_encapsulation() {
    require_root();
    let f = fabric();
    let (n1, n2) = (f.node(1), f.node(2));
    let a = n1.add_pod("a").unwrap();
    let b = n1.add_pod("b").unwrap();
    let c = n2.add_pod("c").unwrap();

    // Addresses come from each node's own secondary range.
    for (p, range) in [(&a, 1u8), (&b, 1), (&c, 2)] {
        assert_eq!(
            p.ip.octets()[..3],
            [10, 240, range],
            "{} got {}",
            p.name,
            p.ip
        );
    }
    assert_ne!(a.ip, b.ip);

    assert!(a.ping(b.ip, &[]), "pod↔pod on one node");
    assert!(b.ping(a.ip, &[]), "pod↔pod on one node (reverse)");
    assert!(a.ping(c.ip, &[]), "pod↔pod across nodes");
    assert!(c.ping(a.ip, &[]), "pod↔pod across nodes (reverse)");
    assert!(a.ping(INTERNET_IP, &[]), "pod→internet 203.0.113.10");
    assert!(c.ping(INTERNET_IP2, &[]), "pod→internet 198.51.100.10");

    // Capture on the fabric link of node1 while a crosses to c: the packets carry the pod
    // addresses themselves (no outer header), as plain ICMP.
    let out = capture(&f.vnet, "n1", 4, "icmp", || assert!(a.ping(c.ip, &[])));
    let want_req = format!("IP {} > {}: ICMP echo request", a.ip, c.ip);
    let want_rep = format!("IP {} > {}: ICMP echo reply", c.ip, a.ip);
    assert!(
        out.contains(&want_req) && out.contains(&want_rep),
        "capture on the fabric link should show pod addresses on the wire:\n{out}"
    );
    for tunnel in ["VXLAN", "GENEVE", "IPIP", "GRE", "UDP"] {
        assert!(!out.contains(tunnel), "encapsulation seen: {out}");
    }

    // A full-MTU packet with DF set crosses nodes unfragmented: pod MTU = uplink MTU,
    // ICMP payload = MTU - 20 (IP) - 8 (ICMP).
    let payload = (test_mtu() - 28).to_string();
    assert!(
        a.ping(c.ip, &["-M", "do", "-s", &payload]),
        "a {}-byte DF packet must cross nodes",
        test_mtu()
    );
    let too_big = (test_mtu() - 27).to_string();
    assert!(
        !a.ping(c.ip, &["-M", "do", "-s", &too_big]),
        "one byte more than the MTU must not pass with DF"
    );

    for (n, p) in [(n1, &a), (n1, &b), (n2, &c)] {
        n.del_pod(p).expect_ok("DEL");
    }
    n1.assert_clean();
    n2.assert_clean();
}

#[test]
fn add_wires_pod_and_host_exactly() {
    require_root();
    let f = fabric();
    let n = f.node(1);
    let p = n.add_pod("wired").unwrap();
    let r = &p.result;

    assert_eq!(r["cniVersion"], "1.0.0");
    let ifaces = r["interfaces"].as_array().unwrap();
    let pod_if = ifaces
        .iter()
        .position(|i| i["sandbox"].is_string())
        .expect("pod interface with sandbox");
    assert_eq!(ifaces[pod_if]["name"], "eth0");
    assert_eq!(ifaces[pod_if]["sandbox"], p.ns.path().display().to_string());
    assert_eq!(r["ips"][0]["interface"], pod_if);
    assert_eq!(r["ips"][0]["address"], format!("{}/32", p.ip));
    assert_eq!(r["ips"][0]["gateway"], "169.254.1.1");
    assert!(r["routes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|rt| rt["dst"] == "0.0.0.0/0"));
    let host_if = ifaces
        .iter()
        .find(|i| i["sandbox"].is_null())
        .expect("host interface");
    let host_veth = host_if["name"].as_str().unwrap();
    assert!(host_veth.starts_with("ali"));

    // Pod side: /32, MTU from the uplink, gateway route, permanent neighbour, default route.
    let link = &p.ns.ip_json(&["link", "show", "eth0"]).unwrap()[0];
    assert_eq!(link["mtu"], test_mtu(), "pod MTU = uplink MTU");
    assert_eq!(link["link_type"], "ether");
    let addrs = p.ns.ip_json(&["-4", "addr", "show", "eth0"]).unwrap();
    let ai = &addrs[0]["addr_info"][0];
    assert_eq!(ai["local"], p.ip.to_string());
    assert_eq!(ai["prefixlen"], 32);
    let routes = p.ns.routes().unwrap();
    assert!(
        routes
            .iter()
            .any(|rt| rt["dst"] == "default" && rt["gateway"] == "169.254.1.1"),
        "{routes:?}"
    );
    assert!(
        routes
            .iter()
            .any(|rt| rt["dst"] == "169.254.1.1" && rt["scope"] == "link"),
        "{routes:?}"
    );
    let host_mac = n.ns.ip_json(&["link", "show", host_veth]).unwrap()[0]["address"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(host_if["mac"], host_mac);
    let neigh = p.ns.ip_json(&["neigh", "show", "dev", "eth0"]).unwrap();
    assert!(
        neigh
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["dst"] == "169.254.1.1"
                && e["lladdr"] == host_mac
                && e["state"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|x| x == "PERMANENT"))),
        "permanent neighbour to the host veth MAC: {neigh}"
    );

    // Host side: /32 route via the veth, forwarding on, loose rp_filter on the veth.
    let hroutes = n.ns.routes().unwrap();
    assert!(
        hroutes
            .iter()
            .any(|rt| rt["dst"] == p.ip.to_string() && rt["dev"] == host_veth),
        "{hroutes:?}"
    );
    assert_eq!(n.ns.sysctl("net.ipv4.ip_forward").unwrap(), "1");
    assert_eq!(
        n.ns.sysctl(&format!("net.ipv4.conf.{host_veth}.rp_filter"))
            .unwrap(),
        "2"
    );
    assert_eq!(
        n.ns.ip_json(&["link", "show", host_veth]).unwrap()[0]["mtu"],
        test_mtu()
    );

    // The reservation carries the pod identity from CNI_ARGS.
    let leases = n.ipamd().leases();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].address, p.ip);
    assert_eq!(leases[0].pod.namespace.as_deref(), Some("test"));
    assert_eq!(leases[0].pod.name.as_deref(), Some("wired"));

    n.check_pod(&p).expect_ok("CHECK of a healthy pod");

    // ADD again for the same interface name in the same pod must fail and change nothing.
    let inv = Invocation::new("ADD", "other-container", Some(&p.ns.path()), "eth0");
    let out = n.cni(&inv, &n.plugin_config(None, None));
    assert!(!out.ok(), "ADD onto an existing eth0 must fail");
    assert!(
        out.error_msg().contains("eth0"),
        "error names the interface: {}",
        out.error_msg()
    );
    assert_eq!(
        n.ipamd().leases().len(),
        1,
        "failed ADD released its address"
    );
    assert_eq!(n.host_veths().len(), 1, "failed ADD left no veth");

    n.del_pod(&p).expect_ok("DEL");
    n.assert_clean();
}

#[test]
fn mtu_override_and_proc_netns_path() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        plugin_extra: json!({"mtu": 1400}),
        ..Default::default()
    })
    .unwrap();
    let n = f.node(1);
    // ctr passes /proc/<pid>/ns/net: hold the netns open with a sleeping process.
    let pod_ns = Netns::new(&format!("an{}-procns", f.tag)).unwrap();
    let mut holder = pod_ns
        .command("sleep")
        .arg("60")
        .spawn()
        .expect("sleep in pod netns");
    let proc_path = format!("/proc/{}/ns/net", holder.id());
    // nsenter enters the netns after the fork: until it has, /proc/<pid>/ns/net is the root
    // namespace, and an ADD there would touch the host. Wait for the pod's namespace.
    let want = std::fs::metadata(pod_ns.path()).unwrap().ino();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&proc_path).map(|m| m.ino()).ok() != Some(want) {
        assert!(
            std::time::Instant::now() < deadline,
            "the holder never entered the pod netns"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let inv = Invocation::new(
        "ADD",
        "ctr-proc",
        Some(std::path::Path::new(&proc_path)),
        "eth0",
    );
    let r = n
        .cni(&inv, &n.plugin_config(None, None))
        .expect_ok("ADD with /proc/<pid>/ns/net")
        .unwrap();
    let link = &pod_ns.ip_json(&["link", "show", "eth0"]).unwrap()[0];
    assert_eq!(link["mtu"], 1400, "configured mtu overrides the uplink's");
    assert_eq!(r["interfaces"][1]["sandbox"], proc_path);
    let del = Invocation::new(
        "DEL",
        "ctr-proc",
        Some(std::path::Path::new(&proc_path)),
        "eth0",
    );
    n.cni(&del, &n.plugin_config(Some(&r), None))
        .expect_ok("DEL");
    let _ = holder.kill();
    let _ = holder.wait();
    n.assert_clean();
}

#[test]
fn pod_routes_restrict_what_a_pod_can_reach() {
    require_root();
    // A pod allowed only the VNet (10/8): other pods yes, the internet no.
    let f = Fabric::new(FabricOpts {
        nodes: 2,
        plugin_extra: json!({"podRoutes": ["10.0.0.0/8"]}),
        ..Default::default()
    })
    .unwrap();
    let a = f.node(1).add_pod("vnet-only").unwrap();
    let b = f.node(2).add_pod("peer").unwrap();
    assert_eq!(
        a.result["routes"],
        json!([{"dst": "10.0.0.0/8", "gw": "169.254.1.1"}])
    );
    assert!(a.ping(b.ip, &[]), "VNet peer reachable");
    assert!(!a.ping(INTERNET_IP, &[]), "no route to the internet");
    f.node(1).check_pod(&a).expect_ok("CHECK with podRoutes");
    a.ns.ip(&["route", "del", "10.0.0.0/8"]).unwrap();
    let out = f.node(1).check_pod(&a);
    assert!(
        out.error_msg().contains("10.0.0.0/8"),
        "{}",
        out.error_msg()
    );
    f.node(1).del_pod(&a).expect_ok("DEL");
    f.node(2).del_pod(&b).expect_ok("DEL");
    f.node(1).assert_clean();
    f.node(2).assert_clean();
}
