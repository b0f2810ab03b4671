//! The CNI verbs through the real `aliasnet` binary and `aliasnet-ipamd` on the namespace
//! fabric, on IPv4, IPv6-only and dual-stack nodes: every DEL variant (each releases every
//! family's lease and host route), CHECK, GC, STATUS, a daemon that is down (the spool), the
//! result per cniVersion, an exhausted pool of one family, parallel ADDs, VERSION and
//! runtime quirks.

use std::net::{IpAddr, Ipv4Addr};

use aliasnet_tests::{
    cni::Invocation,
    fabric::{Fabric, FabricOpts, Node, Pod, Stack},
    family::Family,
    netns::Netns,
    per_family, require_root,
};
use serde_json::{json, Value};

fn one_node(stack: Stack, cni_version: &str) -> Fabric {
    Fabric::new(FabricOpts {
        nodes: 1,
        stack,
        cni_version: cni_version.into(),
        ..FabricOpts::default()
    })
    .expect("build fabric")
}

/// DEL with no netns and no prevResult, as CRI sends its repeated DELs.
fn bare_del(n: &Node, name: &str, cid: &str) {
    let inv = Invocation::new("DEL", cid, None, "eth0").args(&Node::k8s_args(name, cid));
    n.cni(&inv, &n.plugin_config(None, None))
        .expect_ok(&format!("DEL {name} without netns and prevResult"));
}

/// The pod's host routes (a /32 and a /128 for a dual-stack pod) are in the node.
#[track_caller]
fn assert_host_routes(n: &Node, p: &Pod) {
    let routes = n.pod_routes();
    for a in p.addrs() {
        let w = a.to_string();
        let len = Family::of(a).host_prefix();
        assert!(
            routes.iter().any(|r| r == &w || r == &format!("{w}/{len}")),
            "host route to {w}: {routes:?}"
        );
    }
}

/// Every DEL a runtime may send succeeds and releases every family's lease and host route.
fn every_del_variant_releases_every_family(stack: Stack) {
    let f = one_node(stack, "1.0.0");
    let n = f.node(1);
    let per_pod = stack.families().len();

    // 1. Normal DEL (asynchronous host teardown), then the CRI pattern: two more DELs with
    // empty netns and no prevResult.
    let p = n.add_pod("d1").unwrap();
    assert_host_routes(n, &p);
    assert_eq!(n.ipamd().leases().len(), per_pod, "one lease per family");
    n.del_pod(&p).expect_ok("DEL 1");
    bare_del(n, "d1", &p.container_id);
    bare_del(n, "d1", &p.container_id);
    n.assert_clean();

    // 2. Synchronous teardown: the host side is gone when DEL returns.
    let mut sync = n.plugin_config(None, None);
    sync["asyncTeardown"] = json!(false);
    let p = n
        .add_pod_conf("d2", &sync)
        .unwrap_or_else(|(_, o)| panic!("ADD d2: {}", o.stdout));
    let inv = Invocation::new("DEL", &p.container_id, Some(&p.ns.path()), "eth0")
        .args(&Node::k8s_args("d2", &p.container_id));
    sync["prevResult"] = p.result.clone();
    n.cni(&inv, &sync).expect_ok("sync DEL");
    assert!(n.host_veths().is_empty(), "sync DEL removed the veth");
    assert!(n.pod_routes().is_empty(), "{:?}", n.pod_routes());
    n.assert_clean();

    // 3. DEL without prevResult, netns still there.
    let p = n.add_pod("d3").unwrap();
    let inv = Invocation::new("DEL", &p.container_id, Some(&p.ns.path()), "eth0")
        .args(&Node::k8s_args("d3", &p.container_id));
    n.cni(&inv, &n.plugin_config(None, None))
        .expect_ok("DEL without prevResult");
    n.assert_clean();

    // 4. DEL with a netns path that no longer exists (pod netns already destroyed).
    let p = n.add_pod("d4").unwrap();
    let (gone, cid, result) = (p.ns.path(), p.container_id.clone(), p.result.clone());
    drop(p); // deletes the netns, and with it the pod end of the veth
    let inv = Invocation::new("DEL", &cid, Some(&gone), "eth0");
    n.cni(&inv, &n.plugin_config(Some(&result), None))
        .expect_ok("DEL with vanished netns");
    n.assert_clean();

    // 5. DEL with empty netns first (ctr run --rm), prevResult present.
    let p = n.add_pod("d5").unwrap();
    let inv = Invocation::new("DEL", &p.container_id, None, "eth0");
    n.cni(&inv, &n.plugin_config(Some(&p.result), None))
        .expect_ok("DEL with empty netns");
    n.assert_clean();

    // 6. DEL of a container never seen.
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

per_family!(every_del_variant_releases_every_family:
    every_del_variant_releases_ipv4 => Stack::Ipv4,
    every_del_variant_releases_both_families => Stack::Dual,
);

/// CHECK of a pod whose family-`fam` wiring was broken by hand names what is missing: the
/// host route, the pod's default route, the gateway's neighbour entry, the reservation.
fn check_names_what_is_broken(fam: Family) {
    let f = one_node(fam.stack(), "1.0.0");
    let n = f.node(1);
    let p = n.add_pod("chk").unwrap();
    n.check_pod(&p).expect_ok("CHECK healthy");
    let (af, addr) = (fam.ip_flag(), p.addr(fam));
    let gw = match fam {
        Family::V4 => "169.254.1.1",
        Family::V6 => "fe80::1",
    };

    // Host route deleted by hand.
    let host = format!("{addr}/{}", fam.host_prefix());
    n.ns.ip(&[af, "route", "del", &host]).unwrap();
    let out = n.check_pod(&p);
    assert!(!out.ok(), "CHECK must fail without the host route");
    let msg = out.error_msg();
    assert!(
        msg.contains("route") && msg.contains(&addr.to_string()),
        "CHECK error names the missing host route: {msg}"
    );
    let host_veth = p.result["interfaces"][0]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    n.ns.ip(&[af, "route", "add", &host, "dev", &host_veth])
        .unwrap();
    n.check_pod(&p).expect_ok("CHECK after repair");

    // Pod default route deleted by hand.
    p.ns.ip(&[af, "route", "del", "default"]).unwrap();
    let out = n.check_pod(&p);
    assert!(!out.ok(), "CHECK must fail without the default route");
    assert!(
        out.error_msg().contains("default"),
        "CHECK error names the default route: {}",
        out.error_msg()
    );
    p.ns.ip(&[af, "route", "add", "default", "via", gw, "dev", "eth0"])
        .unwrap();
    n.check_pod(&p).expect_ok("CHECK after repair");

    // Neighbour entry deleted.
    p.ns.ip(&[af, "neigh", "del", gw, "dev", "eth0"]).unwrap();
    let out = n.check_pod(&p);
    assert!(!out.ok(), "CHECK must fail without the neighbour entry");
    assert!(out.error_msg().contains("neighbour"), "{}", out.error_msg());

    // Reservation gone (released behind the plugin's back).
    n.del_pod(&p).expect_ok("DEL");
    n.assert_clean();
    let out = n.check_pod(&p);
    assert!(!out.ok(), "CHECK after DEL must fail");
}

per_family!(check_names_what_is_broken:
    check_names_what_is_broken_ipv4 => Family::V4,
    check_names_what_is_broken_ipv6 => Family::V6,
);

/// With the daemon down, ADD fails cleanly (try again later) and DEL tears the host side down
/// at once and spools the release of every family's lease, which the daemon applies when it
/// starts again.
fn daemon_down_add_fails_cleanly_and_del_is_spooled(stack: Stack) {
    let mut f = one_node(stack, "1.1.0");
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
    assert!(n.pod_routes().is_empty(), "{:?}", n.pod_routes());
    let spooled: Vec<_> = std::fs::read_dir(&n.ipamd_paths.spool_dir)
        .unwrap()
        .filter_map(Result::ok)
        .collect();
    assert_eq!(spooled.len(), 1, "one durable release record");

    // The daemon applies the spool when it starts again: every family's lease goes.
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

per_family!(daemon_down_add_fails_cleanly_and_del_is_spooled:
    daemon_down_add_fails_cleanly_and_del_is_spooled_ipv4 => Stack::Ipv4,
    daemon_down_del_is_spooled_for_both_families => Stack::Dual,
);

/// The addresses of `ips` and their `version` keys.
fn ips_of(result: &Value) -> Vec<(IpAddr, Option<String>)> {
    result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .map(|e| {
            let a = e["address"].as_str().expect("address");
            let ip = a.split('/').next().unwrap().parse().expect("an address");
            (ip, e["version"].as_str().map(str::to_owned))
        })
        .collect()
}

/// The result format for every cniVersion the plugin accepts (`ips[].version` up to 0.4.0),
/// CHECK (0.4.0 on) naming a missing host route of each family, GC (both keys; the stale
/// pod's leases of every family go, the valid pod's stay) and STATUS, on one node whose
/// pools serve `stack`.
fn verbs(stack: Stack) {
    let f = one_node(stack, "1.1.0");
    let n = f.node(1);
    let per_pod = stack.families().len();
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let mut conf = n.plugin_config(None, None);
        conf["cniVersion"] = json!(version);
        let p = n
            .add_pod_conf(&format!("v{}", version.replace('.', "")), &conf)
            .unwrap_or_else(|(_, o)| panic!("ADD {version}: {}", o.stdout));
        assert_eq!(p.result["cniVersion"], version);
        let ips = ips_of(&p.result);
        // One per family, IPv4 first, as the result lists them.
        let fams: Vec<_> = ips.iter().map(|(ip, _)| Family::of(*ip)).collect();
        assert_eq!(fams, stack.families(), "{}", p.result);
        for (ip, v) in &ips {
            let want = if version.starts_with("0.") {
                Some(if ip.is_ipv4() { "4" } else { "6" }.to_owned())
            } else {
                None
            };
            assert_eq!(v, &want, "ips[].version for {ip} in {version}");
        }
        let mut with_prev = conf.clone();
        with_prev["prevResult"] = p.result.clone();
        let del = Invocation::new("DEL", &p.container_id, Some(&p.ns.path()), "eth0")
            .args(&Node::k8s_args(&p.name, &p.container_id));
        if version.starts_with("0.3.") {
            // CHECK came with 0.4.0.
            n.cni(&del, &with_prev).expect_ok("DEL");
            n.assert_clean();
            continue;
        }
        let check = Invocation::new("CHECK", &p.container_id, Some(&p.ns.path()), "eth0")
            .args(&Node::k8s_args(&p.name, &p.container_id));
        n.cni(&check, &with_prev).expect_ok("CHECK");

        // CHECK names each missing host route.
        for a in p.addrs() {
            let fam = Family::of(a);
            let host = format!("{a}/{}", fam.host_prefix());
            n.ns.ip(&[fam.ip_flag(), "route", "del", &host]).unwrap();
        }
        let out = n.cni(&check, &with_prev);
        assert!(!out.ok(), "CHECK without the host routes must fail");
        for a in p.addrs() {
            assert!(
                out.error_msg().contains(&a.to_string()),
                "CHECK names the address {a}: {}",
                out.stdout
            );
        }
        n.cni(&del, &with_prev).expect_ok("DEL");
        n.assert_clean();
    }

    // GC: the stale pod's leases (every family) go, the valid pod's stay. `ctr run -d` never
    // sends DEL: the netns goes away, the reservation stays.
    let keep = n.add_pod("keep").unwrap();
    let stale = n.add_pod("stale").unwrap();
    assert_eq!(n.ipamd().leases().len(), 2 * per_pod);
    let stale_ips = stale.addrs();
    drop(stale);
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        let mut conf = n.plugin_config(None, None);
        conf[key] = json!([{"containerID": keep.container_id, "ifname": "eth0"}]);
        let out = n.cni(&Invocation::new("GC", "", None, ""), &conf);
        assert!(out.ok(), "GC ({key}) failed: {} {}", out.stdout, out.stderr);
        assert!(out.stdout.trim().is_empty(), "GC prints nothing on success");
    }
    let leases = n.ipamd().leases();
    assert_eq!(leases.len(), per_pod, "{leases:?}");
    assert!(leases
        .iter()
        .all(|l| l.key.container_id == keep.container_id));
    for a in keep.addrs() {
        assert!(leases.iter().any(|l| l.address == a), "{a}: {leases:?}");
    }
    assert!(leases.iter().all(|l| !stale_ips.contains(&l.address)));
    n.check_pod(&keep).expect_ok("GC left the valid pod intact");

    let status = n.cni(
        &Invocation::new("STATUS", "", None, ""),
        &n.plugin_config(None, None),
    );
    assert!(status.ok(), "STATUS: {}", status.stdout);
    n.del_pod(&keep).expect_ok("DEL");
    n.assert_clean();
}

per_family!(verbs:
    cni_verbs_in_an_ipv4_config => Stack::Ipv4,
    cni_verbs_in_an_ipv6_only_config => Stack::Ipv6,
    cni_verbs_in_a_dual_stack_config => Stack::Dual,
);

/// On a dual-stack node whose pool of family `fam` holds one address: STATUS reports it
/// (only for the families asked), a second dual-stack ADD fails naming the family or pool
/// and takes nothing of the other family, and a pod of the other family alone still gets
/// its address.
fn exhausted_pool_fails_add_and_leaves_nothing(fam: Family) {
    let (pool, pool6, only, name, other) = match fam {
        Family::V4 => (
            Some(r#"ips = ["10.240.1.10"]"#.to_owned()),
            None,
            "10.240.1.10",
            ["ipv4", "secondary"],
            "ipv6",
        ),
        Family::V6 => (
            None,
            Some(r#"ips = ["fd00:240:1::10"]"#.to_owned()),
            "fd00:240:1::10",
            ["ipv6", "secondary6"],
            "ipv4",
        ),
    };
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        pool,
        pool6,
        cni_version: "1.1.0".into(),
        ..FabricOpts::dual_stack()
    })
    .unwrap();
    let n = f.node(1);
    let a = n.add_pod("x1").unwrap();
    assert_eq!(a.addr(fam).to_string(), only);
    let status = n.cni(
        &Invocation::new("STATUS", "", None, ""),
        &n.plugin_config(None, None),
    );
    status.expect_code(50, &format!("STATUS with the {fam} pool exhausted"));
    // With ipFamilies only the listed families count.
    for (families, ready) in [(json!([other]), true), (json!([name[0]]), false)] {
        let mut conf = n.plugin_config(None, None);
        conf["ipFamilies"] = families.clone();
        let st = n.cni(&Invocation::new("STATUS", "", None, ""), &conf);
        if ready {
            assert!(st.ok(), "STATUS {families}: {}", st.stdout);
        } else {
            st.expect_code(50, &format!("STATUS for the exhausted {fam} family"));
        }
    }

    let pod_ns = Netns::new(&format!("an{}-x2", f.tag)).unwrap();
    let inv = Invocation::new("ADD", "x2", Some(&pod_ns.path()), "eth0");
    let out = n.cni(&inv, &n.plugin_config(None, None));
    let code = out.error_code().expect("ADD must fail");
    assert!(
        code >= 100,
        "plugin-specific code for exhaustion: {}",
        out.stdout
    );
    let msg = out.error_msg().to_lowercase();
    assert!(
        name.iter().any(|w| msg.contains(w)),
        "names the family or pool: {msg}"
    );
    // All or nothing: no lease of the other family was taken for x2 either.
    assert_eq!(pod_ns.link_names().unwrap(), ["lo"]);
    assert_eq!(n.host_veths().len(), 1);
    assert_eq!(n.ipamd().leases().len(), 2, "only x1's two leases");
    // A pod of the other family alone still gets its address.
    let mut conf = n.plugin_config(None, None);
    conf["ipFamilies"] = json!([other]);
    let b = n
        .add_pod_conf("x3", &conf)
        .unwrap_or_else(|(_, o)| panic!("{other}-only ADD: {}", o.stdout));
    assert_eq!(b.addrs().len(), 1, "{}", b.result);
    assert_ne!(Family::of(b.addrs()[0]), fam, "{}", b.result);

    n.del_pod(&a).expect_ok("DEL");
    n.del_pod(&b).expect_ok("DEL");
    n.assert_clean();
}

per_family!(exhausted_pool_fails_add_and_leaves_nothing:
    exhausted_ipv4_pool_fails_add_and_leaves_nothing => Family::V4,
    exhausted_ipv6_pool_fails_add_and_leaves_nothing => Family::V6,
);

#[test]
fn parallel_adds_get_distinct_addresses() {
    require_root();
    let f = Fabric::one_node();
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
    let f = Fabric::one_node();
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
