//! The CNI verbs for IPv6-only and dual-stack pods through the real `aliasnet` binary and
//! `aliasnet-ipamd`: every DEL variant (each releases every family's lease and host route),
//! the spool when the daemon is down, CHECK, GC, STATUS, the result per cniVersion, and an
//! exhausted IPv6 pool.

use std::net::IpAddr;

use aliasnet_tests::{
    cni::Invocation,
    fabric::{Fabric, FabricOpts, Node, Pod, Stack},
    netns::Netns,
    require_root,
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
    let mut want = vec![format!("{}", p.v6())];
    if !p.ip.is_unspecified() {
        want.push(p.ip.to_string());
    }
    for w in want {
        assert!(
            routes.iter().any(|r| r == &w || r == &format!("{w}/128")),
            "host route to {w}: {routes:?}"
        );
    }
}

#[test]
fn every_del_variant_releases_both_families() {
    require_root();
    let f = one_node(Stack::Dual, "1.0.0");
    let n = f.node(1);

    // 1. Normal DEL (asynchronous host teardown), then two more without netns or prevResult.
    let p = n.add_pod("d1").unwrap();
    assert_host_routes(n, &p);
    assert_eq!(n.ipamd().leases().len(), 2, "one lease per family");
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

    // 4. DEL after the pod netns is gone.
    let p = n.add_pod("d4").unwrap();
    let (gone, cid, result) = (p.ns.path(), p.container_id.clone(), p.result.clone());
    drop(p);
    let inv = Invocation::new("DEL", &cid, Some(&gone), "eth0");
    n.cni(&inv, &n.plugin_config(Some(&result), None))
        .expect_ok("DEL with vanished netns");
    n.assert_clean();

    // 5. DEL with an empty netns first, prevResult present.
    let p = n.add_pod("d5").unwrap();
    let inv = Invocation::new("DEL", &p.container_id, None, "eth0");
    n.cni(&inv, &n.plugin_config(Some(&p.result), None))
        .expect_ok("DEL with empty netns");
    n.assert_clean();
}

#[test]
fn daemon_down_del_is_spooled_for_both_families() {
    require_root();
    let mut f = one_node(Stack::Dual, "1.1.0");
    let p = f.node(1).add_pod("spooled").unwrap();
    f.node_mut(1).ipamd.as_mut().unwrap().stop().unwrap();
    let n = f.node(1);
    n.del_pod(&p).expect_ok("DEL with the daemon down");
    assert!(n.host_veths().is_empty(), "DEL tore down the host veth");
    assert!(n.pod_routes().is_empty(), "{:?}", n.pod_routes());
    let spooled = std::fs::read_dir(&n.ipamd_paths.spool_dir).unwrap().count();
    assert_eq!(spooled, 1, "one durable release record");
    // The daemon applies it when it starts again: both leases go.
    f.node_mut(1).start_ipamd().unwrap();
    f.node(1).assert_clean();
}

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
/// CHECK (0.4.0 on), GC and STATUS, on one node whose pools serve `stack`.
fn verbs(stack: Stack) {
    let f = one_node(stack, "1.1.0");
    let n = f.node(1);
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let mut conf = n.plugin_config(None, None);
        conf["cniVersion"] = json!(version);
        let p = n
            .add_pod_conf(&format!("v{}", version.replace('.', "")), &conf)
            .unwrap_or_else(|(_, o)| panic!("ADD {version}: {}", o.stdout));
        assert_eq!(p.result["cniVersion"], version);
        let ips = ips_of(&p.result);
        assert_eq!(
            ips.len(),
            if stack == Stack::Dual { 2 } else { 1 },
            "{}",
            p.result
        );
        // IPv4 first, as the result lists them.
        assert!(ips.last().unwrap().0.is_ipv6(), "{}", p.result);
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

        // CHECK names a missing IPv6 host route.
        let v6 = format!("{}/128", p.v6());
        n.ns.ip(&["-6", "route", "del", &v6]).unwrap();
        let out = n.cni(&check, &with_prev);
        assert!(!out.ok(), "CHECK without the IPv6 host route must fail");
        assert!(
            out.error_msg().contains(&p.v6().to_string()),
            "CHECK names the address: {}",
            out.stdout
        );
        n.cni(&del, &with_prev).expect_ok("DEL");
        n.assert_clean();
    }

    // GC: the stale pod's leases (every family) go, the valid pod's stay.
    let keep = n.add_pod("keep").unwrap();
    let stale = n.add_pod("stale").unwrap();
    let per_pod = if stack == Stack::Dual { 2 } else { 1 };
    assert_eq!(n.ipamd().leases().len(), 2 * per_pod);
    drop(stale);
    let mut conf = n.plugin_config(None, None);
    conf["cni.dev/valid-attachments"] =
        json!([{"containerID": keep.container_id, "ifname": "eth0"}]);
    n.cni(&Invocation::new("GC", "", None, ""), &conf)
        .expect_ok("GC");
    let leases = n.ipamd().leases();
    assert_eq!(leases.len(), per_pod, "{leases:?}");
    assert!(leases
        .iter()
        .all(|l| l.key.container_id == keep.container_id));
    assert!(leases.iter().any(|l| l.address == IpAddr::V6(keep.v6())));
    n.check_pod(&keep).expect_ok("GC left the valid pod intact");

    let status = n.cni(
        &Invocation::new("STATUS", "", None, ""),
        &n.plugin_config(None, None),
    );
    assert!(status.ok(), "STATUS: {}", status.stdout);
    n.del_pod(&keep).expect_ok("DEL");
    n.assert_clean();
}

#[test]
fn cni_verbs_in_an_ipv6_only_config() {
    require_root();
    verbs(Stack::Ipv6);
}

#[test]
fn cni_verbs_in_a_dual_stack_config() {
    require_root();
    verbs(Stack::Dual);
}

#[test]
fn exhausted_ipv6_pool_fails_add_and_leaves_nothing() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        pool6: Some(r#"ips = ["fd00:240:1::10"]"#.into()),
        cni_version: "1.1.0".into(),
        ..FabricOpts::dual_stack()
    })
    .unwrap();
    let n = f.node(1);
    let a = n.add_pod("x1").unwrap();
    assert_eq!(a.v6().to_string(), "fd00:240:1::10");
    let status = n.cni(
        &Invocation::new("STATUS", "", None, ""),
        &n.plugin_config(None, None),
    );
    status.expect_code(50, "STATUS with the IPv6 pool exhausted");
    // With ipFamilies only the listed families count.
    for (families, ready) in [(json!(["ipv4"]), true), (json!(["ipv6"]), false)] {
        let mut conf = n.plugin_config(None, None);
        conf["ipFamilies"] = families.clone();
        let st = n.cni(&Invocation::new("STATUS", "", None, ""), &conf);
        if ready {
            assert!(st.ok(), "STATUS {families}: {}", st.stdout);
        } else {
            st.expect_code(50, "STATUS for the exhausted IPv6 family");
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
        msg.contains("ipv6") || msg.contains("secondary6"),
        "names the family or pool: {msg}"
    );
    // All or nothing: no IPv4 lease was taken for x2 either.
    assert_eq!(pod_ns.link_names().unwrap(), ["lo"]);
    assert_eq!(n.host_veths().len(), 1);
    assert_eq!(n.ipamd().leases().len(), 2, "only x1's two leases");
    // An IPv4-only pod still gets its address.
    let mut conf = n.plugin_config(None, None);
    conf["ipFamilies"] = json!(["ipv4"]);
    let b = n
        .add_pod_conf("x3", &conf)
        .unwrap_or_else(|(_, o)| panic!("IPv4-only ADD: {}", o.stdout));
    assert!(b.ip6.is_none());

    n.del_pod(&a).expect_ok("DEL");
    n.del_pod(&b).expect_ok("DEL");
    n.assert_clean();
}
