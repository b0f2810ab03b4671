//! IPv6 and dual-stack pods end to end through the real `aliasnet` binary and
//! `aliasnet-ipamd` on the dual-stack fabric: the addresses ADD hands out, pods reaching each
//! other and the internet over IPv6 with no encapsulation, full-MTU packets and path MTU
//! discovery (IPv6 routers never fragment), and a pod usable the moment ADD returns (no
//! duplicate address detection delay).

use std::net::Ipv6Addr;

use aliasnet_tests::{
    fabric::{Fabric, FabricOpts, Node, Pod, INTERNET_IP, INTERNET_IP6, INTERNET_IP6_2},
    require_root, test_mtu,
    traffic::capture,
};
use serde_json::{json, Value};

/// Asserts `p`'s ADD result: one address per wanted family, each with the `interface` index
/// of the pod's own interface, from node `node`'s ranges (10.240.<node>.0/24 as a /32,
/// fd00:240:<node>::/112 as a /128).
#[track_caller]
fn assert_ips(p: &Pod, node: usize, v4: bool, v6: bool) {
    let r = &p.result;
    let ips = r["ips"].as_array().expect("ips");
    assert_eq!(ips.len(), usize::from(v4) + usize::from(v6), "{r}");
    let sandbox = p.ns.path().display().to_string();
    for e in ips {
        let i = e["interface"]
            .as_u64()
            .unwrap_or_else(|| panic!("no interface in {e}"));
        assert_eq!(
            r["interfaces"][i as usize]["sandbox"].as_str(),
            Some(sandbox.as_str()),
            "ips[].interface {i} must be the pod's interface: {r}"
        );
    }
    let has = |pre: &str, len: &str| {
        ips.iter().any(|e| {
            e["address"]
                .as_str()
                .is_some_and(|a| a.starts_with(pre) && a.ends_with(len))
        })
    };
    assert_eq!(
        has(&format!("10.240.{node}."), "/32"),
        v4,
        "IPv4 address: {r}"
    );
    assert_eq!(
        has(&format!("fd00:240:{node:x}::"), "/128"),
        v6,
        "IPv6 address: {r}"
    );
    if let Some(a) = p.ip6 {
        let s = a.segments();
        assert_eq!(
            s[..3],
            [0xfd00, 0x240, node as u16],
            "{a} in fd00:240:{node}::/112"
        );
        assert_eq!(s[3..6], [0, 0, 0], "{a} in fd00:240:{node}::/112");
    }
}

/// The pod's IPv6 address is usable as ADD returns it: not tentative (DAD off for it).
#[track_caller]
fn assert_not_tentative(p: &Pod) {
    let out = p.ns.ip(&["-6", "addr", "show", "dev", "eth0"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let a = p.v6().to_string();
    let line = text
        .lines()
        .find(|l| l.contains(&format!("inet6 {a}/128")))
        .unwrap_or_else(|| panic!("no {a}/128 on the pod's eth0:\n{text}"));
    assert!(
        !line.contains("tentative") && !line.contains("dadfailed"),
        "{line}"
    );
}

/// One probe, one second: the first packet after ADD must not wait for anything.
fn ping_once(p: &Pod, dst: Ipv6Addr) -> bool {
    p.ns.exec_status("ping", &["-c", "1", "-W", "1", "-q", &dst.to_string()])
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `ping` from `p` with the given payload, PMTU discovery on (never fragment locally): its
/// exit status and output.
fn ping_size(p: &Pod, dst: Ipv6Addr, payload: u32) -> (bool, String) {
    let out =
        p.ns.exec_status(
            "ping",
            &[
                "-c",
                "2",
                "-i",
                "0.2",
                "-W",
                "2",
                "-M",
                "do",
                "-s",
                &payload.to_string(),
                &dst.to_string(),
            ],
        )
        .expect("run ping");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn dual_stack_pods_reach_each_other_and_the_internet_without_encapsulation() {
    require_root();
    let f = Fabric::new(FabricOpts::dual_stack()).expect("build a dual-stack fabric");
    let (n1, n2) = (f.node(1), f.node(2));
    let a = n1.add_pod("a").unwrap();
    assert_not_tentative(&a);
    let b = n1.add_pod("b").unwrap();
    assert_not_tentative(&b);
    // The first packets to and from a pod that ADD has just wired cross at once, across
    // nodes and on one node.
    assert!(ping_once(&b, a.v6()), "first packet b -> a, one node");
    let c = n2.add_pod("c").unwrap();
    assert_not_tentative(&c);
    assert!(ping_once(&c, a.v6()), "first packet c -> a, across nodes");
    assert!(ping_once(&a, c.v6()), "first packet a -> c, across nodes");

    for (p, i) in [(&a, 1), (&b, 1), (&c, 2)] {
        assert_ips(p, i, true, true);
    }
    assert_ne!(a.v6(), b.v6());
    assert!(a.ping(b.v6(), &[]), "pod -> pod over IPv6 on one node");
    assert!(
        b.ping(a.v6(), &[]),
        "pod -> pod over IPv6 on one node (reverse)"
    );
    assert!(a.ping(c.v6(), &[]), "pod -> pod over IPv6 across nodes");
    assert!(
        c.ping(a.v6(), &[]),
        "pod -> pod over IPv6 across nodes (reverse)"
    );
    assert!(a.ping(INTERNET_IP6, &[]), "pod -> internet {INTERNET_IP6}");
    assert!(
        c.ping(INTERNET_IP6_2, &[]),
        "pod -> internet {INTERNET_IP6_2}"
    );
    // IPv4 still works next to it.
    assert!(a.ping(c.ip, &[]), "pod -> pod over IPv4 across nodes");
    assert!(c.ping(INTERNET_IP, &[]), "pod -> internet over IPv4");

    // Capture on node1's fabric link while a pings c: the packets carry the pod addresses
    // themselves (no outer header), as plain ICMPv6 (echo request 128, reply 129).
    let filter = "icmp6 and (ip6[40] == 128 or ip6[40] == 129)";
    let out = capture(&f.vnet, "n1", 4, filter, || assert!(a.ping(c.v6(), &[])));
    let want_req = format!("IP6 {} > {}: ICMP6, echo request", a.v6(), c.v6());
    let want_rep = format!("IP6 {} > {}: ICMP6, echo reply", c.v6(), a.v6());
    assert!(
        out.contains(&want_req) && out.contains(&want_rep),
        "capture on the fabric link should show pod addresses on the wire:\n{out}"
    );
    for tunnel in ["VXLAN", "GENEVE", "IPIP", "GRE", "UDP", "IP 10."] {
        assert!(!out.contains(tunnel), "encapsulation seen: {out}");
    }

    // A full-MTU IPv6 packet crosses nodes (pod MTU = uplink MTU; payload = MTU - 40 IPv6 -
    // 8 ICMPv6); one byte more is refused at the source, never fragmented.
    let full = test_mtu() - 48;
    let (ok, text) = ping_size(&a, c.v6(), full);
    assert!(
        ok,
        "a {}-byte IPv6 packet must cross nodes:\n{text}",
        test_mtu()
    );
    let (ok, text) = ping_size(&a, c.v6(), full + 1);
    assert!(!ok, "one byte over the MTU must not pass:\n{text}");

    // Path MTU: the internet link is narrower than the pods' links (1500 bytes, or IPv6's
    // minimum of 1280 on 1500-byte nodes). A packet that fits the pod's link but not the
    // internet link gets an ICMPv6 Packet Too Big from the router, which reaches the pod
    // through the node and its datapath; the pod then sends at the path's MTU.
    let path = if test_mtu() > 1500 { 1500 } else { 1280 };
    let path_mtu = path.to_string();
    f.vnet
        .ip(&["link", "set", "inet", "mtu", &path_mtu])
        .unwrap();
    f.internet
        .ip(&["link", "set", "eth0", "mtu", &path_mtu])
        .unwrap();
    let (ok, text) = ping_size(&a, INTERNET_IP6, path - 48);
    assert!(ok, "a {path}-byte IPv6 packet to the internet:\n{text}");
    let (ok, text) = ping_size(&a, INTERNET_IP6, path - 47);
    assert!(
        !ok,
        "{} bytes must not reach the internet:\n{text}",
        path + 1
    );
    let route =
        a.ns.ip(&["-6", "route", "get", &INTERNET_IP6.to_string()])
            .unwrap();
    let route = String::from_utf8_lossy(&route.stdout).into_owned();
    assert!(
        route.contains(&format!("mtu {path}")),
        "the pod learned the path MTU from a Packet Too Big ({text}):\n{route}"
    );
    let (ok, text) = ping_size(&a, INTERNET_IP6, path - 48);
    assert!(ok, "{path} bytes after the Packet Too Big:\n{text}");

    for (n, p) in [(n1, &a), (n1, &b), (n2, &c)] {
        n.del_pod(p).expect_ok("DEL");
    }
    n1.assert_clean();
    n2.assert_clean();
}

/// ADD a pod on `n` with `ipFamilies` set to `families`.
fn add_with_families(n: &Node, name: &str, families: Value) -> Pod {
    let mut conf = n.plugin_config(None, None);
    conf["ipFamilies"] = families;
    n.add_pod_conf(name, &conf)
        .unwrap_or_else(|(_, out)| panic!("ADD {name}: {} {}", out.stdout, out.stderr))
}

#[test]
fn ip_families_and_ipv6_only_nodes_give_ipv6_only_pods() {
    require_root();
    // A dual-stack node: ipFamilies picks the pod's families.
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        ..FabricOpts::dual_stack()
    })
    .unwrap();
    let n = f.node(1);
    let six = add_with_families(n, "six", json!(["ipv6"]));
    assert_ips(&six, 1, false, true);
    let four = add_with_families(n, "four", json!(["ipv4"]));
    assert_ips(&four, 1, true, false);
    let both = n.add_pod("both").unwrap();
    assert_ips(&both, 1, true, true);
    let leases = n.ipamd().leases();
    assert_eq!(leases.len(), 4, "one lease per family per pod: {leases:?}");
    let inet4 = six.ns.ip(&["-4", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(
        !String::from_utf8_lossy(&inet4.stdout).contains("inet "),
        "an IPv6-only pod has no IPv4 address"
    );
    assert!(six.ping(INTERNET_IP6, &[]), "IPv6-only pod -> internet");
    assert!(six.ping(both.v6(), &[]), "IPv6-only pod -> dual-stack pod");
    assert!(four.ping(both.ip, &[]), "IPv4-only pod -> dual-stack pod");
    for p in [&six, &four, &both] {
        n.check_pod(p).expect_ok("CHECK");
        n.del_pod(p).expect_ok("DEL");
    }
    n.assert_clean();
    drop(f);

    // An IPv6-only node: pods get IPv6 only without any ipFamilies.
    let f = Fabric::new(FabricOpts::ipv6_only()).unwrap();
    let (n1, n2) = (f.node(1), f.node(2));
    let a = n1.add_pod("a").unwrap();
    let c = n2.add_pod("c").unwrap();
    assert_ips(&a, 1, false, true);
    assert_ips(&c, 2, false, true);
    assert_not_tentative(&a);
    assert!(a.ping(c.v6(), &[]), "IPv6-only pods across nodes");
    assert!(c.ping(INTERNET_IP6_2, &[]), "IPv6-only pod -> internet");
    // Asking for IPv4 where no pool serves it fails, naming the family, and leaves nothing.
    let mut conf = n1.plugin_config(None, None);
    conf["ipFamilies"] = json!(["ipv4", "ipv6"]);
    let (ns, out) = match n1.add_pod_conf("no4", &conf) {
        Ok(p) => panic!("ADD of an IPv4 address on an IPv6-only node: {}", p.result),
        Err(e) => e,
    };
    assert!(!out.ok());
    assert!(
        out.error_msg().to_lowercase().contains("ipv4"),
        "names the family: {}",
        out.stdout
    );
    assert_eq!(ns.link_names().unwrap(), ["lo"]);
    assert_eq!(n1.ipamd().leases().len(), 1, "nothing allocated for no4");
    n1.del_pod(&a).expect_ok("DEL");
    n2.del_pod(&c).expect_ok("DEL");
    n1.assert_clean();
    n2.assert_clean();
}
