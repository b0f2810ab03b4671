//! End-to-end tests of the alias-IP datapath through the real `aliasnet` binary and
//! `aliasnet-ipamd`, on the namespace fabric (see `aliasnet_tests::fabric`).

use std::{net::Ipv4Addr, os::unix::fs::MetadataExt, process::Stdio, time::Duration};

use aliasnet_tests::{
    cni::Invocation,
    fabric::{Fabric, FabricOpts, Node, INTERNET_IP, INTERNET_IP2},
    netns::Netns,
    require_root, test_mtu,
};
use serde_json::{json, Value};

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
    let mut dump = f
        .vnet
        .command("tcpdump")
        .args(["-l", "-n", "-i", "n1", "-c", "4", "icmp"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(a.ping(c.ip, &[]));
    let out = wait_output(&mut dump, Duration::from_secs(10));
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

/// Kill `child` after `timeout` and return its stdout.
fn wait_output(child: &mut std::process::Child, timeout: Duration) -> String {
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > timeout {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut s = String::new();
    use std::io::Read;
    child.stdout.take().unwrap().read_to_string(&mut s).unwrap();
    s
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
fn every_del_variant_succeeds_and_releases() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        ..Default::default()
    })
    .unwrap();
    let n = f.node(1);

    // 1. Normal DEL, then the CRI pattern: two more DELs with empty netns and no prevResult.
    let p = n.add_pod("d1").unwrap();
    n.del_pod(&p).expect_ok("DEL 1");
    for i in 2..=3 {
        let inv = Invocation::new("DEL", &p.container_id, None, "eth0")
            .args(&Node::k8s_args("d1", &p.container_id));
        n.cni(&inv, &n.plugin_config(None, None))
            .expect_ok(&format!("DEL {i} with empty netns, no prevResult"));
    }
    n.assert_clean();

    // 2. DEL with a netns path that no longer exists (pod netns already destroyed).
    let p = n.add_pod("d2").unwrap();
    let gone = p.ns.path();
    let cid = p.container_id.clone();
    let result = p.result.clone();
    drop(p); // deletes the netns, and with it the pod end of the veth
    let inv = Invocation::new("DEL", &cid, Some(&gone), "eth0");
    n.cni(&inv, &n.plugin_config(Some(&result), None))
        .expect_ok("DEL with vanished netns");
    n.assert_clean();

    // 3. DEL with empty netns first (ctr run --rm), prevResult present.
    let p = n.add_pod("d3").unwrap();
    let inv = Invocation::new("DEL", &p.container_id, None, "eth0");
    n.cni(&inv, &n.plugin_config(Some(&p.result), None))
        .expect_ok("DEL with empty netns");
    n.assert_clean();

    // 4. DEL of a container never seen.
    let inv = Invocation::new("DEL", "never-seen", None, "eth0");
    n.cni(&inv, &n.plugin_config(None, None))
        .expect_ok("DEL of unknown container");
    let inv = Invocation::new(
        "DEL",
        "never-seen",
        Some(std::path::Path::new("/run/netns/none")),
        "eth0",
    );
    n.cni(&inv, &n.plugin_config(None, None))
        .expect_ok("DEL of unknown container with bogus netns");
    n.assert_clean();
}

#[test]
fn check_names_what_is_broken() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        ..Default::default()
    })
    .unwrap();
    let n = f.node(1);
    let p = n.add_pod("chk").unwrap();
    n.check_pod(&p).expect_ok("CHECK healthy");

    // Host route deleted by hand.
    let ip32 = format!("{}/32", p.ip);
    n.ns.ip(&["route", "del", &ip32]).unwrap();
    let out = n.check_pod(&p);
    assert!(!out.ok(), "CHECK must fail without the host route");
    let msg = out.error_msg();
    assert!(
        msg.contains("route") && msg.contains(&p.ip.to_string()),
        "CHECK error names the missing host route: {msg}"
    );
    let host_veth = p.result["interfaces"][0]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    n.ns.ip(&["route", "add", &ip32, "dev", &host_veth])
        .unwrap();
    n.check_pod(&p).expect_ok("CHECK after repair");

    // Pod default route deleted by hand.
    p.ns.ip(&["route", "del", "default"]).unwrap();
    let out = n.check_pod(&p);
    assert!(!out.ok(), "CHECK must fail without the default route");
    assert!(
        out.error_msg().contains("default"),
        "CHECK error names the default route: {}",
        out.error_msg()
    );
    p.ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        "169.254.1.1",
        "dev",
        "eth0",
    ])
    .unwrap();
    n.check_pod(&p).expect_ok("CHECK after repair");

    // Neighbour entry deleted.
    p.ns.ip(&["neigh", "del", "169.254.1.1", "dev", "eth0"])
        .unwrap();
    let out = n.check_pod(&p);
    assert!(!out.ok(), "CHECK must fail without the neighbour entry");
    assert!(out.error_msg().contains("neighbour"), "{}", out.error_msg());

    // Reservation gone (released behind the plugin's back).
    n.del_pod(&p).expect_ok("DEL");
    n.assert_clean();
    let out = n.check_pod(&p);
    assert!(!out.ok(), "CHECK after DEL must fail");
}

#[test]
fn gc_releases_stale_reservations_only() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        cni_version: "1.1.0".into(),
        ..Default::default()
    })
    .unwrap();
    let n = f.node(1);
    let keep = n.add_pod("keep").unwrap();
    let stale = n.add_pod("stale").unwrap();
    assert_eq!(n.ipamd().leases().len(), 2);

    // `ctr run -d` never sends DEL: the netns goes away, the reservation stays.
    let stale_ip = stale.ip;
    drop(stale);

    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        let mut conf = n.plugin_config(None, None);
        conf[key] = json!([{"containerID": keep.container_id, "ifname": "eth0"}]);
        let inv = Invocation::new("GC", "", None, "");
        let out = n.cni(&inv, &conf);
        assert!(out.ok(), "GC ({key}) failed: {} {}", out.stdout, out.stderr);
        assert!(out.stdout.trim().is_empty(), "GC prints nothing on success");
    }
    let leases = n.ipamd().leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].address, keep.ip);
    assert_ne!(leases[0].address, stale_ip);
    n.check_pod(&keep).expect_ok("GC left the valid pod intact");
    n.del_pod(&keep).expect_ok("DEL");
    n.assert_clean();
}

#[test]
fn daemon_down_add_fails_cleanly_and_del_is_spooled() {
    require_root();
    let mut f = Fabric::new(FabricOpts {
        nodes: 1,
        cni_version: "1.1.0".into(),
        ..Default::default()
    })
    .unwrap();
    let p = f.node(1).add_pod("spooled").unwrap();
    f.node_mut(1).ipamd.as_mut().unwrap().stop().unwrap();
    let n = f.node(1);

    // STATUS reports the daemon as unavailable.
    let out = n.cni(
        &Invocation::new("STATUS", "", None, ""),
        &n.plugin_config(None, None),
    );
    out.expect_code(50, "STATUS with the daemon down");

    // ADD: try again later (11), nothing left behind.
    let pod_ns = Netns::new(&format!("an{}-down", f.tag)).unwrap();
    let inv = Invocation::new("ADD", "down-cid", Some(&pod_ns.path()), "eth0");
    let out = n.cni(&inv, &n.plugin_config(None, None));
    out.expect_code(11, "ADD with the daemon down");
    assert!(
        pod_ns.link_names().unwrap() == vec!["lo".to_string()],
        "no pod interface left"
    );
    assert_eq!(n.host_veths().len(), 1, "only the live pod's veth remains");

    // DEL succeeds anyway, tears down the host side at once and spools the release.
    n.del_pod(&p).expect_ok("DEL with the daemon down");
    assert!(
        n.host_veths().is_empty(),
        "DEL tore down the host veth itself"
    );
    assert!(n.pod_routes().is_empty());
    let spooled: Vec<_> = std::fs::read_dir(&n.ipamd_paths.spool_dir)
        .unwrap()
        .filter_map(Result::ok)
        .collect();
    assert_eq!(spooled.len(), 1, "one durable release record");

    // The daemon applies the spool when it starts again.
    f.node_mut(1).start_ipamd().unwrap();
    let n = f.node(1);
    n.assert_clean();
    let left: Vec<_> = std::fs::read_dir(&n.ipamd_paths.spool_dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .collect();
    assert!(left.is_empty(), "spool drained: {left:?}");
    let out = n.cni(
        &Invocation::new("STATUS", "", None, ""),
        &n.plugin_config(None, None),
    );
    assert!(out.ok(), "STATUS with the daemon up: {}", out.stdout);
}

#[test]
fn parallel_adds_get_distinct_addresses() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        ..Default::default()
    })
    .unwrap();
    let n = f.node(1);
    let pods: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..12)
            .map(|i| s.spawn(move || n.add_pod(&format!("par{i}")).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ips: Vec<Ipv4Addr> = pods.iter().map(|p| p.ip).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 12, "distinct addresses");
    assert_eq!(n.ipamd().leases().len(), 12);
    assert!(pods[0].ping(pods[11].ip, &[]));
    std::thread::scope(|s| {
        for p in &pods {
            s.spawn(move || n.del_pod(p).expect_ok("DEL"));
        }
    });
    n.assert_clean();
}

#[test]
fn results_follow_the_config_version() {
    require_root();
    for version in ["0.4.0", "1.0.0", "1.1.0"] {
        let f = Fabric::new(FabricOpts {
            nodes: 1,
            cni_version: version.into(),
            ..Default::default()
        })
        .unwrap();
        let n = f.node(1);
        let p = n.add_pod("v").unwrap();
        assert_eq!(p.result["cniVersion"], version);
        let ip0 = &p.result["ips"][0];
        if version == "0.4.0" {
            assert_eq!(ip0["version"], "4", "0.4.0 results carry ips[].version");
        } else {
            assert!(
                ip0.get("version").is_none(),
                "1.x results have no ips[].version"
            );
        }
        n.check_pod(&p).expect_ok("CHECK");
        n.del_pod(&p).expect_ok("DEL");
        n.assert_clean();
    }
}

#[test]
fn version_lists_supported_versions() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        start_ipamd: false,
        ..Default::default()
    })
    .unwrap();
    let n = f.node(1);
    // podman sends "dummy" for these.
    let inv = Invocation::new("VERSION", "", Some(std::path::Path::new("dummy")), "dummy");
    let out = n.cni_raw(&inv, br#"{"cniVersion":"1.0.0"}"#);
    let v = out.expect_ok("VERSION").unwrap();
    let sv: Vec<&str> = v["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in ["0.4.0", "1.0.0", "1.1.0"] {
        assert!(sv.contains(&want), "{sv:?} lacks {want}");
    }
}

#[test]
fn runtime_quirks_are_accepted() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        ..Default::default()
    })
    .unwrap();
    let n = f.node(1);
    let pod_ns = Netns::new(&format!("an{}-quirk", f.tag)).unwrap();
    // containerd 1.6: Go-style capitalised runtimeConfig keys, capabilities injected, unknown
    // CNI_ARGS keys with IgnoreUnknown, reordered.
    let mut conf = n.plugin_config(None, None);
    conf["capabilities"] =
        json!({"bandwidth": true, "portMappings": true, "io.kubernetes.cri.pod-annotations": true});
    conf["runtimeConfig"] = json!({
        "bandwidth": {"IngressRate": 10000000u64, "IngressBurst": 4294967295u64, "EgressRate": 20000000u64, "EgressBurst": 4294967295u64},
        "portMappings": [{"HostPort": 18082, "ContainerPort": 80, "Protocol": "tcp", "HostIP": "127.0.0.1"}],
        "io.kubernetes.cri.pod-annotations": {"demo/note": "hello"},
        "ips": ["10.240.1.7", "10.240.1.7"]
    });
    let inv = Invocation::new("ADD", "quirky", Some(&pod_ns.path()), "eth0").args(
        "MAC=02:42:0a:d5:00:99;K8S_POD_NAME=q;IgnoreUnknown=1;IP=1.2.3.4;K8S_POD_NAMESPACE=ns",
    );
    let r = n
        .cni(&inv, &conf)
        .expect_ok("ADD with runtime quirks")
        .unwrap();
    let leases = n.ipamd().leases();
    assert_eq!(leases[0].pod.name.as_deref(), Some("q"));
    let inv = Invocation::new("DEL", "quirky", Some(&pod_ns.path()), "eth0")
        .args("K8S_POD_NAMESPACE=ns;IgnoreUnknown=1;K8S_POD_NAME=q");
    conf["prevResult"] = r;
    n.cni(&inv, &conf).expect_ok("DEL");
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
