//! End-to-end tests of the alias-IP datapath through the real `aliasnet` binary and
//! `aliasnet-ipamd`, on the namespace fabric (see `aliasnet_tests::fabric`), in each address
//! family: the fabric's own routing, the addresses ADD hands out, pods reaching each other
//! and the internet with no encapsulation, full-MTU packets and (IPv6 routers never
//! fragment) path MTU discovery, a pod usable the moment ADD returns (no duplicate address
//! detection delay), `ipFamilies` and IPv6-only nodes.

use std::{net::IpAddr, os::unix::fs::MetadataExt, time::Duration};

use aliasnet_tests::{
    cni::Invocation,
    fabric::{Fabric, FabricOpts, Node, Pod, Stack, INTERNET_IP, INTERNET_IP6, INTERNET_IP6_2},
    family::Family,
    netns::Netns,
    per_family, require_root, test_mtu,
    traffic::capture,
};
use serde_json::{json, Value};

fn fabric() -> Fabric {
    Fabric::new(FabricOpts::default()).expect("build fabric")
}

/// `ping` from `ns`; true when every probe was answered.
fn ping_from(ns: &Netns, dst: IpAddr, extra: &[&str]) -> bool {
    let dst = dst.to_string();
    let mut args = vec!["-c", "2", "-i", "0.05", "-W", "2", "-q"];
    args.extend_from_slice(extra);
    args.push(&dst);
    ns.exec_status("ping", &args)
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// One probe, one second: the first packet after ADD must not wait for anything.
fn ping_once(p: &Pod, dst: IpAddr) -> bool {
    p.ns.exec_status("ping", &["-c", "1", "-W", "1", "-q", &dst.to_string()])
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `ping` from `p` with the given payload, PMTU discovery on (never fragment locally): its
/// exit status and output.
fn ping_size(p: &Pod, dst: IpAddr, payload: u32) -> (bool, String) {
    let (payload, dst) = (payload.to_string(), dst.to_string());
    let args = [
        "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", &payload, &dst,
    ];
    let out = p.ns.exec_status("ping", &args).expect("run ping");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

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
    if v4 {
        assert_eq!(p.ip.octets()[..3], [10, 240, node as u8], "{}", p.name);
    }
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

/// The fabric alone, in each family: nodes reach each other and the internet, each node's pod
/// range is routed to that node's uplink, and a full-MTU packet crosses the router.
#[test]
fn fabric_routes_both_families_between_nodes_and_to_the_internet() {
    require_root();
    let f = Fabric::new(FabricOpts {
        start_ipamd: false,
        shaper: false,
        ..FabricOpts::default()
    })
    .expect("build fabric");
    let (n1, n2) = (f.node(1), f.node(2));
    for fam in Family::ALL {
        let [inet, inet2] = fam.internet();
        assert!(
            ping_from(&n1.ns, n2.uplink(fam), &[]),
            "{fam} node1 -> node2"
        );
        assert!(
            ping_from(&n2.ns, n1.uplink(fam), &[]),
            "{fam} node2 -> node1"
        );
        assert!(ping_from(&n1.ns, inet, &[]), "node1 -> {inet}");
        assert!(ping_from(&n2.ns, inet2, &[]), "node2 -> {inet2}");

        for i in 1..=2 {
            let (range, probe) = (fam.pod_range(i), fam.pod_range_probe(i));
            let route_get = |ns: &Netns| {
                ns.ip_json(&[fam.ip_flag(), "route", "get", &probe])
                    .unwrap()
            };
            let route = route_get(&f.vnet);
            assert_eq!(
                route[0]["gateway"].as_str(),
                Some(fam.uplink_ip(i).to_string().as_str()),
                "{range} -> node{i}: {route}"
            );
            assert_eq!(route[0]["dev"].as_str(), Some(format!("n{i}").as_str()));
            let up = route_get(&n1.ns);
            assert_eq!(
                up[0]["gateway"].as_str(),
                Some(fam.router_ip(1).to_string().as_str()),
                "node1 sends {probe} to the router: {up}"
            );
        }

        let payload = (test_mtu() - fam.icmp_overhead()).to_string();
        assert!(
            ping_from(&n1.ns, n2.uplink(fam), &["-M", "do", "-s", &payload]),
            "a {}-byte {fam} packet crosses the VNet",
            test_mtu()
        );
    }
}

/// Pods on the nodes of `stack` reach each other and the internet in every family the pools
/// serve, usable as ADD returns, with their own addresses on the wire and full-MTU packets;
/// in IPv6, path MTU discovery through the node and its datapath.
fn pods_reach_each_other_and_the_internet_without_encapsulation(stack: Stack) {
    let f = Fabric::new(FabricOpts {
        stack,
        ..FabricOpts::default()
    })
    .expect("build fabric");
    let fams = stack.families();
    let (n1, n2) = (f.node(1), f.node(2));
    let a = n1.add_pod("a").unwrap();
    let b = n1.add_pod("b").unwrap();
    if stack.has_ipv6() {
        assert_not_tentative(&a);
        assert_not_tentative(&b);
    }
    // The first packets to and from a pod that ADD has just wired cross at once, across
    // nodes and on one node.
    for &fam in &fams {
        assert!(
            ping_once(&b, a.addr(fam)),
            "first {fam} packet b -> a, one node"
        );
    }
    let c = n2.add_pod("c").unwrap();
    if stack.has_ipv6() {
        assert_not_tentative(&c);
    }
    for &fam in &fams {
        assert!(
            ping_once(&c, a.addr(fam)),
            "first {fam} packet c -> a, across nodes"
        );
        assert!(
            ping_once(&a, c.addr(fam)),
            "first {fam} packet a -> c, across nodes"
        );
    }

    // Addresses come from each node's own ranges.
    for (p, i) in [(&a, 1), (&b, 1), (&c, 2)] {
        assert_ips(p, i, stack.has_ipv4(), stack.has_ipv6());
    }
    assert_ne!(a.addrs(), b.addrs());

    for &fam in &fams {
        let [inet, inet2] = fam.internet();
        let (pa, pb, pc) = (a.addr(fam), b.addr(fam), c.addr(fam));
        assert!(a.ping(pb, &[]), "pod -> pod over {fam} on one node");
        assert!(
            b.ping(pa, &[]),
            "pod -> pod over {fam} on one node (reverse)"
        );
        assert!(a.ping(pc, &[]), "pod -> pod over {fam} across nodes");
        assert!(
            c.ping(pa, &[]),
            "pod -> pod over {fam} across nodes (reverse)"
        );
        assert!(a.ping(inet, &[]), "pod -> internet {inet}");
        assert!(c.ping(inet2, &[]), "pod -> internet {inet2}");

        // Capture on node1's fabric link while a pings c: the packets carry the pod addresses
        // themselves (no outer header), as plain ICMP (ICMPv6 echo request 128, reply 129).
        let (filter, ip, icmp) = match fam {
            Family::V4 => ("icmp", "IP", "ICMP"),
            Family::V6 => (
                "icmp6 and (ip6[40] == 128 or ip6[40] == 129)",
                "IP6",
                "ICMP6,",
            ),
        };
        let out = capture(&f.vnet, "n1", 4, filter, || assert!(a.ping(pc, &[])));
        let want_req = format!("{ip} {pa} > {pc}: {icmp} echo request");
        let want_rep = format!("{ip} {pc} > {pa}: {icmp} echo reply");
        assert!(
            out.contains(&want_req) && out.contains(&want_rep),
            "capture on the fabric link should show pod addresses on the wire:\n{out}"
        );
        let outer_v4 = (fam == Family::V6).then_some("IP 10.");
        for tunnel in ["VXLAN", "GENEVE", "IPIP", "GRE", "UDP"]
            .into_iter()
            .chain(outer_v4)
        {
            assert!(!out.contains(tunnel), "encapsulation seen: {out}");
        }

        // A full-MTU packet crosses nodes unfragmented (pod MTU = uplink MTU); one byte more
        // is refused at the source, never fragmented.
        let full = test_mtu() - fam.icmp_overhead();
        let (ok, text) = ping_size(&a, pc, full);
        assert!(
            ok,
            "a {}-byte {fam} packet must cross nodes:\n{text}",
            test_mtu()
        );
        let (ok, text) = ping_size(&a, pc, full + 1);
        assert!(!ok, "one byte over the MTU must not pass:\n{text}");
    }

    if stack.has_ipv6() {
        // Path MTU: the internet link is narrower than the pods' links (1500 bytes, or
        // IPv6's minimum of 1280 on 1500-byte nodes). A packet that fits the pod's link but
        // not the internet link gets an ICMPv6 Packet Too Big from the router, which reaches
        // the pod through the node and its datapath; the pod then sends at the path's MTU.
        let path = if test_mtu() > 1500 { 1500 } else { 1280 };
        let path_mtu = path.to_string();
        f.vnet
            .ip(&["link", "set", "inet", "mtu", &path_mtu])
            .unwrap();
        f.internet
            .ip(&["link", "set", "eth0", "mtu", &path_mtu])
            .unwrap();
        let inet = IpAddr::from(INTERNET_IP6);
        let (ok, text) = ping_size(&a, inet, path - 48);
        assert!(ok, "a {path}-byte IPv6 packet to the internet:\n{text}");
        let (ok, text) = ping_size(&a, inet, path - 47);
        assert!(
            !ok,
            "{} bytes must not reach the internet:\n{text}",
            path + 1
        );
        let route = a.ns.ip(&["-6", "route", "get", &inet.to_string()]).unwrap();
        let route = String::from_utf8_lossy(&route.stdout).into_owned();
        assert!(
            route.contains(&format!("mtu {path}")),
            "the pod learned the path MTU from a Packet Too Big ({text}):\n{route}"
        );
        let (ok, text) = ping_size(&a, inet, path - 48);
        assert!(ok, "{path} bytes after the Packet Too Big:\n{text}");
    }

    for (n, p) in [(n1, &a), (n1, &b), (n2, &c)] {
        n.del_pod(p).expect_ok("DEL");
    }
    n1.assert_clean();
    n2.assert_clean();
}

per_family!(pods_reach_each_other_and_the_internet_without_encapsulation:
    ipv4_pods_reach_each_other_and_the_internet_without_encapsulation => Stack::Ipv4,
    dual_stack_pods_reach_each_other_and_the_internet_without_encapsulation => Stack::Dual,
);

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
