//! The CNI verbs through the real `aliasnet` binary and `aliasnet-ipamd` on the namespace
//! fabric: every DEL variant, CHECK, GC, a daemon that is down, parallel ADDs, the result per
//! cniVersion, VERSION and runtime quirks.

use std::net::Ipv4Addr;

use aliasnet_tests::{
    cni::Invocation,
    fabric::{Fabric, FabricOpts, Node},
    netns::Netns,
    require_root,
};
use serde_json::{json, Value};

#[test]
fn every_del_variant_succeeds_and_releases() {
    require_root();
    let f = Fabric::one_node();
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
    let f = Fabric::one_node();
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
