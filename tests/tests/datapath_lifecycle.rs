//! The plugin's datapath attachments over a pod's life, end to end on the namespace fabric:
//! the datapath modes and missing pins, pods added while `aliasnet-shaperd` is down, CHECK,
//! DEL and GC keeping the pinned maps in step, and a failed attach rolled back.

use std::time::{Duration, Instant};

use aliasnet_ebpf::abi::{Class, Direction};
use aliasnet_tests::{
    cni::Invocation,
    datapath::{echoes, ANNOTATIONS, INTERNET_EGRESS},
    fabric::{Fabric, Node, Pod, DEFAULT_POLICY, INTERNET_IP},
    require_root,
    traffic::ping_received,
};
use serde_json::{json, Value};

#[test]
fn datapath_modes_and_missing_pins() {
    require_root();
    let f = Fabric::with_limits(DEFAULT_POLICY, "1.1.0");
    let n = f.node(1);
    let missing = format!("{}-missing", n.shaper_paths.pin_root.display());
    let conf = |mode: &str, root: Option<&str>, rc: Option<&Value>| {
        let mut c = n.plugin_config(None, rc);
        c["datapath"] = json!(mode);
        if let Some(r) = root {
            c["bpfPinRoot"] = json!(r);
        }
        c
    };
    let limit = json!({ANNOTATIONS: {INTERNET_EGRESS: "10M"}});

    // required, pins missing: code 11, nothing allocated; STATUS says why (code 50).
    let Err((ns, out)) = n.add_pod_conf("req", &conf("required", Some(&missing), None)) else {
        panic!("ADD without pins succeeded");
    };
    out.expect_code(11, "required, pins missing");
    assert_eq!(
        out.error_msg(),
        format!(
            "aliasnet-shaperd has not initialised the datapath under {missing}; try again later"
        )
    );
    n.assert_nothing_left(&ns, "required, pins missing");
    let status = Invocation::new("STATUS", "", None, "");
    let out = n.cni(&status, &conf("required", Some(&missing), None));
    out.expect_code(50, "STATUS without pins");
    assert!(
        out.error_msg().contains("has not initialised"),
        "{}",
        out.error_msg()
    );
    n.cni(&status, &conf("required", None, None))
        .expect_ok("STATUS with pins");
    n.cni(&status, &conf("optional", Some(&missing), None))
        .expect_ok("STATUS optional without pins");

    // optional, pins missing, a limit requested: code 11 naming the limit.
    let Err((ns, out)) = n.add_pod_conf("optl", &conf("optional", Some(&missing), Some(&limit)))
    else {
        panic!("limited pod added without a datapath");
    };
    out.expect_code(11, "optional, pins missing, limit");
    assert!(
        out.error_msg().contains(INTERNET_EGRESS),
        "{}",
        out.error_msg()
    );
    n.assert_nothing_left(&ns, "optional, pins missing, limit");

    // off with a limit: code 7 naming it; we never silently ignore a limit.
    let Err((ns, out)) = n.add_pod_conf("offl", &conf("off", None, Some(&limit))) else {
        panic!("limited pod added with datapath off");
    };
    out.expect_code(7, "off with a limit");
    let msg = out.error_msg();
    assert!(
        msg.contains(INTERNET_EGRESS) && msg.contains("off"),
        "{msg}"
    );
    n.assert_nothing_left(&ns, "off with a limit");

    // optional without pins and off: the pod works, unattached; CHECK and DEL succeed.
    for (name, c) in [
        ("opt", conf("optional", Some(&missing), None)),
        ("off", conf("off", None, None)),
    ] {
        let p = match n.add_pod_conf(name, &c) {
            Ok(p) => p,
            Err((_, out)) => panic!("{name}: ADD failed: {}", out.stdout),
        };
        assert!(n.attached().is_empty(), "{name}: attached anyway");
        assert_eq!(
            ping_received(&p.ns, INTERNET_IP, 1, 56, &[]),
            1,
            "{name}: traffic"
        );
        let mut check = c.clone();
        check["prevResult"] = p.result.clone();
        let inv = |cmd| {
            Invocation::new(cmd, &p.container_id, Some(&p.ns.path()), "eth0")
                .args(&Node::k8s_args(name, &p.container_id))
        };
        n.cni(&inv("CHECK"), &check)
            .expect_ok(&format!("{name}: CHECK"));
        n.cni(&inv("DEL"), &check)
            .expect_ok(&format!("{name}: DEL"));
    }
    n.assert_clean();

    // Bad values of the two keys.
    for (k, v) in [
        ("datapath", json!("sometimes")),
        ("bpfPinRoot", json!("relative/dir")),
    ] {
        let mut c = n.plugin_config(None, None);
        c[k] = v;
        let Err((ns, out)) = n.add_pod_conf("badkey", &c) else {
            panic!("{k}: accepted");
        };
        out.expect_code(7, k);
        assert!(out.error_msg().contains(k), "{}", out.error_msg());
        n.assert_nothing_left(&ns, k);
    }
}

#[test]
fn pods_added_while_shaperd_is_down_are_attached_and_counters_survive_restarts() {
    require_root();
    let mut f = Fabric::with_limits(DEFAULT_POLICY, "1.0.0");
    let before = f.node(1).add_pod("before").unwrap();
    f.node_mut(1).shaperd.as_mut().unwrap().stop().unwrap();

    let n = f.node(1);
    let rc = json!({ANNOTATIONS: {INTERNET_EGRESS: "10M"}});
    let down = n.add_pod_with("down", Some(&rc)).unwrap();
    assert_eq!(n.record(&down).meta.internet_egress_rate(), 10_000_000);
    let qdiscs = down
        .ns
        .exec("tc", &["qdisc", "show", "dev", "eth0"])
        .unwrap();
    assert!(
        String::from_utf8_lossy(&qdiscs.stdout).contains("htb 1:"),
        "shaped from the pins alone: {}",
        String::from_utf8_lossy(&qdiscs.stdout)
    );
    assert_eq!(ping_received(&down.ns, INTERNET_IP, 4, 100, &[]), 4);
    assert_eq!(ping_received(&before.ns, INTERNET_IP, 2, 100, &[]), 2);
    let k = n.record(&down).counters;
    assert_eq!(k.get(Direction::Egress, Class::Internet), echoes(4, 100));

    // Restart and wait until the new daemon has reinstalled and applied the policy.
    let applied = |n: &Node| {
        n.shaperd
            .as_ref()
            .unwrap()
            .log()
            .matches("policy applied")
            .count()
    };
    let seen = applied(f.node(1));
    {
        let node = f.node_mut(1);
        node.shaperd.as_mut().unwrap().restart(&node.ns).unwrap();
    }
    let n = f.node(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while applied(n) <= seen {
        assert!(Instant::now() < deadline, "shaperd did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ping_received(&down.ns, INTERNET_IP, 3, 100, &[]), 3);
    assert_eq!(ping_received(&before.ns, INTERNET_IP, 1, 100, &[]), 1);
    let k = n.record(&down).counters;
    assert_eq!(
        k.get(Direction::Egress, Class::Internet),
        echoes(4 + 3, 100)
    );
    assert_eq!(
        k.get(Direction::Ingress, Class::Internet),
        echoes(4 + 3, 100)
    );
    let k = n.record(&before).counters;
    assert_eq!(
        k.get(Direction::Egress, Class::Internet),
        echoes(2 + 1, 100)
    );

    // DEL with shaperd down works from the pins.
    f.node_mut(1).shaperd.as_mut().unwrap().stop().unwrap();
    let n = f.node(1);
    n.del_pod(&down).expect_ok("DEL while shaperd is down");
    assert_eq!(n.attached(), std::slice::from_ref(&before.container_id));
    n.del_pod(&before).expect_ok("DEL");
    n.assert_clean();
    assert!(n.attached().is_empty());
}

#[test]
fn del_check_and_gc_keep_the_maps_in_step() {
    require_root();
    let f = Fabric::with_limits(DEFAULT_POLICY, "1.1.0");
    let n = f.node(1);
    let rc = json!({ANNOTATIONS: {INTERNET_EGRESS: "50M"}});
    let a = n.add_pod_with("a", Some(&rc)).unwrap();
    let b = n.add_pod("b").unwrap();
    let mut ids = n.attached();
    ids.sort();
    assert_eq!(ids, [a.container_id.clone(), b.container_id.clone()]);

    // CHECK passes with the same runtimeConfig, fails when the limits differ.
    let check = |p: &Pod, rc: Option<&Value>| {
        let inv = Invocation::new("CHECK", &p.container_id, Some(&p.ns.path()), "eth0")
            .args(&Node::k8s_args(&p.name, &p.container_id));
        n.cni(&inv, &n.plugin_config(Some(&p.result), rc))
    };
    check(&a, Some(&rc)).expect_ok("CHECK a");
    check(&b, None).expect_ok("CHECK b");
    let other = json!({ANNOTATIONS: {INTERNET_EGRESS: "20M"}});
    let out = check(&a, Some(&other));
    out.expect_code(107, "CHECK with another limit");
    assert!(
        out.error_msg().contains("internet-egress rate"),
        "{}",
        out.error_msg()
    );

    // The attachment removed behind the plugin's back: CHECK names it.
    let mut dp = n.datapath();
    let found = aliasnet_netns::run_in(n.ns.path(), || dp.detach_pod(&b.container_id, "eth0"))
        .unwrap()
        .unwrap();
    assert!(found);
    let out = check(&b, None);
    out.expect_code(107, "CHECK without an attachment");
    assert!(
        out.error_msg().contains("datapath attachment"),
        "{}",
        out.error_msg()
    );

    // DEL removes the pod's map entries; its filters and qdiscs go with the veth pair.
    n.del_pod(&a).expect_ok("DEL a");
    assert!(!n.attached().contains(&a.container_id));
    assert!(n.datapath().pod(&a.container_id, "eth0").unwrap().is_none());
    n.del_pod(&a).expect_ok("DEL a again");
    n.del_pod(&b).expect_ok("DEL b (already detached)");
    n.assert_clean();

    // GC: a pod whose netns vanished without DEL, and one the runtime no longer lists.
    let keep = n.add_pod("keep").unwrap();
    let gone = n.add_pod("gone").unwrap();
    let stale = n.add_pod("stale").unwrap();
    let gone_veth = gone.result["interfaces"][0]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    drop(gone.ns); // the veth pair goes with the netns; the attachment stays
                   // Netns teardown runs in a kernel workqueue: wait until the host veth is really gone.
    let t = std::time::Instant::now();
    while n.host_veths().contains(&gone_veth) && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(n.attached().len(), 3);
    let mut gc = n.plugin_config(None, None);
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": keep.container_id, "ifname": "eth0"},
        {"containerID": gone.container_id, "ifname": "eth0"},
    ]);
    n.cni(&Invocation::new("GC", "", None, ""), &gc)
        .expect_ok("GC");
    assert_eq!(n.attached(), std::slice::from_ref(&keep.container_id));
    assert!(!n.attached().contains(&stale.container_id));
    n.del_pod(&keep).expect_ok("DEL keep");
}

#[test]
fn a_failed_attach_rolls_back_everything() {
    require_root();
    let mut f = Fabric::with_limits(DEFAULT_POLICY, "1.0.0");
    // The plugin needs only the pins; a shaperd starting meanwhile would re-pin the program.
    f.node_mut(1).shaperd.as_mut().unwrap().stop().unwrap();
    let n = f.node(1);
    // Make the host-egress program unusable: a pinned map sits where its pin goes, so the
    // attach fails after the ingress filter (and the clsact qdisc) are in place.
    let prog = n.shaper_paths.pin_root.join("progs/an_host_egress");
    let saved = n.shaper_paths.pin_root.join("progs/an_host_egress_saved");
    // Pin the program a second time (bpffs names cannot contain dots), then take the
    // first pin away.
    let bpftool_pin = |what: &str, from: &std::path::Path, to: &std::path::Path| {
        let ok = std::process::Command::new("bpftool")
            .args([what, "pin", "pinned"])
            .arg(from)
            .arg(to)
            .status()
            .unwrap();
        assert!(ok.success(), "bpftool {what} pin {}", to.display());
    };
    bpftool_pin("prog", &prog, &saved);
    std::fs::remove_file(&prog).unwrap();
    let pinned = std::process::Command::new("bpftool")
        .args(["map", "pin", "pinned"])
        .arg(n.shaper_paths.pin_root.join("maps/an_config"))
        .arg(&prog)
        .status()
        .unwrap();
    assert!(pinned.success(), "bpftool map pin");

    let Err((ns, out)) = n.add_pod_conf("fail", &n.plugin_config(None, None)) else {
        panic!("ADD succeeded without a usable an_host_egress");
    };
    out.expect_code(110, "attach failure");
    assert!(
        out.error_msg().contains("attach the eBPF datapath"),
        "{}",
        out.error_msg()
    );
    // The plugin removed the veth and released the address; the library its map entries.
    let start = Instant::now();
    while !n.host_veths().is_empty() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    n.assert_nothing_left(&ns, "failed attach");

    std::fs::remove_file(&prog).unwrap();
    bpftool_pin("prog", &saved, &prog);
    std::fs::remove_file(&saved).unwrap();
    let p = n.add_pod("after").unwrap();
    assert_eq!(n.attached(), std::slice::from_ref(&p.container_id));
    n.del_pod(&p).expect_ok("DEL");
}
