//! The eBPF datapath wired into the plugin, end to end: the real `aliasnet`, `aliasnet-ipamd`
//! and `aliasnet-shaperd` on the namespace fabric. Counters are read from the pinned maps by
//! this process (maps are readable from any netns).

use std::{
    net::Ipv4Addr,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use aliasnet_ebpf::{
    abi::{Class, Counter, Direction, PodCounters},
    Datapath, PodRecord,
};
use aliasnet_tests::{
    cni::{Invocation, Outcome},
    fabric::{Fabric, FabricOpts, Node, Pod, DEFAULT_POLICY, INTERNET_IP, INTERNET_IP2},
    netns::Netns,
    require_root,
};
use serde_json::{json, Value};

const INTERNET_EGRESS: &str = "aliasnet.io/internet-egress-bandwidth";
const ANNOTATIONS: &str = "io.kubernetes.cri.pod-annotations";

/// One node whose plugin entry declares the two capabilities, so runtimeConfig reaches it.
fn fabric_with(policy: &str, cni_version: &str) -> Fabric {
    Fabric::new(FabricOpts {
        nodes: 1,
        shaper_policy: policy.into(),
        cni_version: cni_version.into(),
        plugin_extra: json!({"capabilities": {"bandwidth": true, ANNOTATIONS: true}}),
        ..Default::default()
    })
    .expect("build fabric")
}

fn open(node: &Node) -> Datapath {
    Datapath::open(&node.shaper_paths.pin_root).expect("open the node's pinned datapath")
}

fn record(node: &Node, pod: &Pod) -> PodRecord {
    open(node)
        .pod(&pod.container_id, &pod.ifname)
        .expect("read the datapath")
        .unwrap_or_else(|| panic!("{} is not attached", pod.name))
}

fn attached(node: &Node) -> Vec<String> {
    open(node)
        .pods()
        .expect("list attachments")
        .iter()
        .map(PodRecord::container_id)
        .collect()
}

/// ADD a pod named `name` with `conf`; the pod on success, else the outcome and its netns.
fn add_with(f: &Fabric, node: &Node, name: &str, conf: &Value) -> Result<Pod, (Outcome, Netns)> {
    let ns = Netns::new(&format!("an{}-d{name}", f.tag)).expect("pod netns");
    let cid = format!("cid-{}-{name}", f.tag);
    let inv =
        Invocation::new("ADD", &cid, Some(&ns.path()), "eth0").args(&Node::k8s_args(name, &cid));
    let out = node.cni(&inv, conf);
    if !out.ok() {
        return Err((out, ns));
    }
    let result = out.json().expect("ADD printed a result");
    let ip = result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no ips[0].address in {result}"));
    Ok(Pod {
        ns,
        name: name.to_owned(),
        container_id: cid,
        ifname: "eth0".into(),
        ip,
        result,
    })
}

#[track_caller]
fn add_ok(f: &Fabric, node: &Node, name: &str, rc: Option<&Value>) -> Pod {
    match add_with(f, node, name, &node.plugin_config(None, rc)) {
        Ok(p) => p,
        Err((out, _)) => panic!(
            "ADD {name}: exit {} stdout={} stderr={}",
            out.exit_code, out.stdout, out.stderr
        ),
    }
}

/// `count` pings of `size` data bytes; returns how many were answered.
fn ping(ns: &Netns, dst: Ipv4Addr, count: u32, size: u32, extra: &[&str]) -> u32 {
    let (c, s) = (count.to_string(), size.to_string());
    let dst = dst.to_string();
    let mut args = vec!["-c", &c, "-s", &s, "-i", "0.05", "-W", "2", "-q"];
    args.extend_from_slice(extra);
    args.push(&dst);
    let out = ns.exec_status("ping", &args).expect("run ping");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(',')
        .find_map(|p| p.trim().strip_suffix(" received").map(str::to_owned))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ping summary in {text:?}"))
}

/// `n` ICMP echoes of `size` data bytes as counted at L2: 14 + 20 + 8 + size each.
fn echoes(n: u64, size: u64) -> Counter {
    Counter {
        packets: n,
        bytes: n * (42 + size),
    }
}

fn get(c: &PodCounters, d: Direction, k: Class) -> Counter {
    c.get(d, k)
}

/// `iperf3 -s -1` in `ns`, killed on drop if the test ends early.
struct Server(Child);

impl Server {
    fn start(ns: &Netns, port: u16) -> Self {
        let child = ns
            .command("iperf3")
            .args(["-s", "-1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start iperf3 -s");
        Self(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// TCP goodput in bit/s of a 3 s iperf3 run from `ns` to `dst:port` (server started here).
fn iperf(client: &Netns, server: &Netns, dst: Ipv4Addr, port: u16) -> f64 {
    let _srv = Server::start(server, port);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = client
            .exec_status(
                "iperf3",
                &[
                    "-c",
                    &dst.to_string(),
                    "-p",
                    &port.to_string(),
                    "-t",
                    "3",
                    "-J",
                ],
            )
            .expect("run iperf3 -c");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if let Some(bps) = v["end"]["sum_received"]["bits_per_second"].as_f64() {
            return bps;
        }
        // The server may not listen yet.
        assert!(
            Instant::now() < deadline,
            "iperf3 to {dst}:{port} failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Nothing of an attempted pod may remain: no link in its netns, no host veth, no lease, no
/// datapath attachment.
#[track_caller]
fn assert_nothing_left(node: &Node, pod_ns: &Netns, what: &str) {
    assert_eq!(pod_ns.link_names().unwrap(), ["lo"], "{what}: pod links");
    assert!(
        node.host_veths().is_empty(),
        "{what}: host veths {:?}",
        node.host_veths()
    );
    let leases = node.ipamd().leases();
    assert!(leases.is_empty(), "{what}: leases {leases:?}");
    assert!(
        attached(node).is_empty(),
        "{what}: attachments {:?}",
        attached(node)
    );
}

#[test]
fn counters_match_known_traffic_per_pod_direction_and_class() {
    require_root();
    let f = fabric_with(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let a = n.add_pod("a").unwrap();
    let b = n.add_pod("b").unwrap();

    let rec = record(n, &a);
    assert_eq!(rec.namespace(), "test");
    assert_eq!(rec.name(), "a");
    assert_eq!(rec.ip(), a.ip);
    assert_eq!(
        rec.host_ifname(),
        a.result["interfaces"][0]["name"].as_str().unwrap()
    );

    assert_eq!(ping(&a.ns, b.ip, 5, 200, &[]), 5, "a → b (internal)");
    assert_eq!(ping(&a.ns, INTERNET_IP, 7, 300, &[]), 7, "a → internet");
    assert_eq!(ping(&b.ns, INTERNET_IP2, 3, 100, &[]), 3, "b → internet");
    assert_eq!(ping(&f.internet, b.ip, 4, 50, &[]), 4, "internet → b");

    let ka = record(n, &a).counters;
    let kb = record(n, &b).counters;
    use Class::*;
    use Direction::*;
    let zero = Counter::default();
    // a: 5 requests out and 5 replies in to b; 7 each way with the internet.
    assert_eq!(get(&ka, Egress, Internal), echoes(5, 200));
    assert_eq!(get(&ka, Ingress, Internal), echoes(5, 200));
    assert_eq!(get(&ka, Egress, Internet), echoes(7, 300));
    assert_eq!(get(&ka, Ingress, Internet), echoes(7, 300));
    // b: the mirror image of a's internal traffic, plus its own internet pings both ways.
    assert_eq!(get(&kb, Ingress, Internal), echoes(5, 200));
    assert_eq!(get(&kb, Egress, Internal), echoes(5, 200));
    let inet_b = Counter {
        packets: 3 + 4,
        bytes: 3 * 142 + 4 * 92,
    };
    assert_eq!(get(&kb, Egress, Internet), inet_b);
    assert_eq!(get(&kb, Ingress, Internet), inet_b);
    for k in [&ka, &kb] {
        assert_eq!(get(k, Egress, Blocked), zero);
        assert_eq!(get(k, Ingress, Blocked), zero);
    }
}

#[test]
fn blocked_destinations_are_unreachable_and_counted() {
    require_root();
    let policy = format!("{DEFAULT_POLICY}blocked_cidrs = [\"198.51.100.0/24\"]\n");
    let f = fabric_with(&policy, "1.0.0");
    let n = f.node(1);
    let p = n.add_pod("p").unwrap();

    assert_eq!(
        ping(&p.ns, INTERNET_IP2, 3, 100, &[]),
        0,
        "blocked destination"
    );
    // From a blocked source towards the pod: dropped on the way in.
    let src = INTERNET_IP2.to_string();
    assert_eq!(
        ping(&f.internet, p.ip, 4, 60, &["-I", &src]),
        0,
        "blocked source"
    );
    assert_eq!(
        ping(&p.ns, INTERNET_IP, 2, 100, &[]),
        2,
        "other internet hosts"
    );

    let k = record(n, &p).counters;
    assert_eq!(get(&k, Direction::Egress, Class::Blocked), echoes(3, 100));
    assert_eq!(get(&k, Direction::Ingress, Class::Blocked), echoes(4, 60));
    assert_eq!(get(&k, Direction::Egress, Class::Internet), echoes(2, 100));
    assert_eq!(get(&k, Direction::Ingress, Class::Internet), echoes(2, 100));
}

#[test]
fn internet_egress_is_shaped_while_internal_traffic_is_not() {
    require_root();
    let f = fabric_with(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let peer = n.add_pod("peer").unwrap();
    let rc = json!({ANNOTATIONS: {INTERNET_EGRESS: "10M", "team": "vision"}});
    let s = add_ok(&f, n, "shaped", Some(&rc));
    let m = record(n, &s).meta;
    assert_eq!(
        (m.internet_egress_rate, m.egress_rate, m.ingress_rate),
        (10_000_000, 0, 0)
    );

    let internet = iperf(&s.ns, &f.internet, INTERNET_IP, 5201);
    let internal = iperf(&s.ns, &peer.ns, peer.ip, 5202);
    eprintln!(
        "10M internet limit: internet {:.2} Mbit/s, internal peer {:.1} Mbit/s",
        internet / 1e6,
        internal / 1e6
    );
    assert!(
        (5e6..=11e6).contains(&internet),
        "internet goodput {internet} bit/s, want ≤ 11 Mbit/s (and flowing)"
    );
    assert!(
        internal >= 10.0 * 11e6 && internal >= 10.0 * internet,
        "internal goodput {internal} bit/s, want ≥ 10× the internet limit"
    );

    // containerd-style: Go field names, unset burst 4294967295, 0/0 for the unset direction.
    let rc = json!({"bandwidth": {"IngressRate": 0, "IngressBurst": 0,
                                  "EgressRate": 20_000_000u64, "EgressBurst": 4_294_967_295u64}});
    let t = add_ok(&f, n, "total", Some(&rc));
    let m = record(n, &t).meta;
    assert_eq!((m.egress_rate, m.ingress_rate), (20_000_000, 0));
    let to_peer = iperf(&t.ns, &peer.ns, peer.ip, 5203);
    let to_internet = iperf(&t.ns, &f.internet, INTERNET_IP, 5204);
    eprintln!(
        "20M total egress limit: internal {:.2} Mbit/s, internet {:.2} Mbit/s",
        to_peer / 1e6,
        to_internet / 1e6
    );
    for (what, bps) in [("internal", to_peer), ("internet", to_internet)] {
        assert!(
            (10e6..=22e6).contains(&bps),
            "{what} goodput {bps} bit/s under a 20 Mbit/s egress limit"
        );
    }
}

#[test]
fn bad_bandwidth_is_code_7_naming_the_field_and_leaves_nothing() {
    require_root();
    let f = fabric_with(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let cases = [
        (
            json!({"bandwidth": {"egressRate": 0}}),
            "runtimeConfig.bandwidth.egressRate",
        ),
        (
            json!({"bandwidth": {"IngressRate": 500, "IngressBurst": 4_294_967_295u64}}),
            "runtimeConfig.bandwidth.ingressRate",
        ),
        (
            json!({"bandwidth": {"EgressRate": 2_000_000_000_000_000u64, "EgressBurst": 4_294_967_295u64}}),
            "runtimeConfig.bandwidth.egressRate",
        ),
        (
            json!({ANNOTATIONS: {INTERNET_EGRESS: "fast"}}),
            INTERNET_EGRESS,
        ),
        (
            json!({ANNOTATIONS: {"kubernetes.io/ingress-bandwidth": "0"}}),
            "kubernetes.io/ingress-bandwidth",
        ),
        (
            json!({ANNOTATIONS: {"kubernetes.io/egress-bandwidth": "2P"}}),
            "kubernetes.io/egress-bandwidth",
        ),
    ];
    for (i, (rc, field)) in cases.iter().enumerate() {
        let what = format!("runtimeConfig {rc}");
        let Err((out, ns)) = add_with(&f, n, &format!("bad{i}"), &n.plugin_config(None, Some(rc)))
        else {
            panic!("{what}: ADD succeeded");
        };
        out.expect_code(7, &what);
        assert!(
            out.error_msg().contains(field),
            "{what}: {}",
            out.error_msg()
        );
        assert_nothing_left(n, &ns, &what);
    }
}

#[test]
fn datapath_modes_and_missing_pins() {
    require_root();
    let f = fabric_with(DEFAULT_POLICY, "1.1.0");
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
    let Err((out, ns)) = add_with(&f, n, "req", &conf("required", Some(&missing), None)) else {
        panic!("ADD without pins succeeded");
    };
    out.expect_code(11, "required, pins missing");
    assert_eq!(
        out.error_msg(),
        format!(
            "aliasnet-shaperd has not initialised the datapath under {missing}; try again later"
        )
    );
    assert_nothing_left(n, &ns, "required, pins missing");
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
    let Err((out, ns)) = add_with(
        &f,
        n,
        "optl",
        &conf("optional", Some(&missing), Some(&limit)),
    ) else {
        panic!("limited pod added without a datapath");
    };
    out.expect_code(11, "optional, pins missing, limit");
    assert!(
        out.error_msg().contains(INTERNET_EGRESS),
        "{}",
        out.error_msg()
    );
    assert_nothing_left(n, &ns, "optional, pins missing, limit");

    // off with a limit: code 7 naming it; we never silently ignore a limit.
    let Err((out, ns)) = add_with(&f, n, "offl", &conf("off", None, Some(&limit))) else {
        panic!("limited pod added with datapath off");
    };
    out.expect_code(7, "off with a limit");
    let msg = out.error_msg();
    assert!(
        msg.contains(INTERNET_EGRESS) && msg.contains("off"),
        "{msg}"
    );
    assert_nothing_left(n, &ns, "off with a limit");

    // optional without pins and off: the pod works, unattached; CHECK and DEL succeed.
    for (name, c) in [
        ("opt", conf("optional", Some(&missing), None)),
        ("off", conf("off", None, None)),
    ] {
        let p = match add_with(&f, n, name, &c) {
            Ok(p) => p,
            Err((out, _)) => panic!("{name}: ADD failed: {}", out.stdout),
        };
        assert!(attached(n).is_empty(), "{name}: attached anyway");
        assert_eq!(ping(&p.ns, INTERNET_IP, 1, 56, &[]), 1, "{name}: traffic");
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
        let Err((out, ns)) = add_with(&f, n, "badkey", &c) else {
            panic!("{k}: accepted");
        };
        out.expect_code(7, k);
        assert!(out.error_msg().contains(k), "{}", out.error_msg());
        assert_nothing_left(n, &ns, k);
    }
}

#[test]
fn pods_added_while_shaperd_is_down_are_attached_and_counters_survive_restarts() {
    require_root();
    let mut f = fabric_with(DEFAULT_POLICY, "1.0.0");
    let before = f.node(1).add_pod("before").unwrap();
    f.node_mut(1).shaperd.as_mut().unwrap().stop().unwrap();

    let n = f.node(1);
    let rc = json!({ANNOTATIONS: {INTERNET_EGRESS: "10M"}});
    let down = add_ok(&f, n, "down", Some(&rc));
    assert_eq!(record(n, &down).meta.internet_egress_rate, 10_000_000);
    let qdiscs = down
        .ns
        .exec("tc", &["qdisc", "show", "dev", "eth0"])
        .unwrap();
    assert!(
        String::from_utf8_lossy(&qdiscs.stdout).contains("htb 1:"),
        "shaped from the pins alone: {}",
        String::from_utf8_lossy(&qdiscs.stdout)
    );
    assert_eq!(ping(&down.ns, INTERNET_IP, 4, 100, &[]), 4);
    assert_eq!(ping(&before.ns, INTERNET_IP, 2, 100, &[]), 2);
    let k = record(n, &down).counters;
    assert_eq!(get(&k, Direction::Egress, Class::Internet), echoes(4, 100));

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
    assert_eq!(ping(&down.ns, INTERNET_IP, 3, 100, &[]), 3);
    assert_eq!(ping(&before.ns, INTERNET_IP, 1, 100, &[]), 1);
    let k = record(n, &down).counters;
    assert_eq!(
        get(&k, Direction::Egress, Class::Internet),
        echoes(4 + 3, 100)
    );
    assert_eq!(
        get(&k, Direction::Ingress, Class::Internet),
        echoes(4 + 3, 100)
    );
    let k = record(n, &before).counters;
    assert_eq!(
        get(&k, Direction::Egress, Class::Internet),
        echoes(2 + 1, 100)
    );

    // DEL with shaperd down works from the pins.
    f.node_mut(1).shaperd.as_mut().unwrap().stop().unwrap();
    let n = f.node(1);
    n.del_pod(&down).expect_ok("DEL while shaperd is down");
    assert_eq!(attached(n), std::slice::from_ref(&before.container_id));
    n.del_pod(&before).expect_ok("DEL");
    n.assert_clean();
    assert!(attached(n).is_empty());
}

#[test]
fn del_check_and_gc_keep_the_maps_in_step() {
    require_root();
    let f = fabric_with(DEFAULT_POLICY, "1.1.0");
    let n = f.node(1);
    let rc = json!({ANNOTATIONS: {INTERNET_EGRESS: "50M"}});
    let a = add_ok(&f, n, "a", Some(&rc));
    let b = add_ok(&f, n, "b", None);
    let mut ids = attached(n);
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
    let mut dp = open(n);
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
    assert!(!attached(n).contains(&a.container_id));
    assert!(open(n).pod(&a.container_id, "eth0").unwrap().is_none());
    n.del_pod(&a).expect_ok("DEL a again");
    n.del_pod(&b).expect_ok("DEL b (already detached)");
    n.assert_clean();

    // GC: a pod whose netns vanished without DEL, and one the runtime no longer lists.
    let keep = add_ok(&f, n, "keep", None);
    let gone = add_ok(&f, n, "gone", None);
    let stale = add_ok(&f, n, "stale", None);
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
    assert_eq!(attached(n).len(), 3);
    let mut gc = n.plugin_config(None, None);
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": keep.container_id, "ifname": "eth0"},
        {"containerID": gone.container_id, "ifname": "eth0"},
    ]);
    n.cni(&Invocation::new("GC", "", None, ""), &gc)
        .expect_ok("GC");
    assert_eq!(attached(n), std::slice::from_ref(&keep.container_id));
    assert!(!attached(n).contains(&stale.container_id));
    n.del_pod(&keep).expect_ok("DEL keep");
}

#[test]
fn a_failed_attach_rolls_back_everything() {
    require_root();
    let mut f = fabric_with(DEFAULT_POLICY, "1.0.0");
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

    let Err((out, ns)) = add_with(&f, n, "fail", &n.plugin_config(None, None)) else {
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
    assert_nothing_left(n, &ns, "failed attach");

    std::fs::remove_file(&prog).unwrap();
    bpftool_pin("prog", &saved, &prog);
    std::fs::remove_file(&saved).unwrap();
    let p = add_ok(&f, n, "after", None);
    assert_eq!(attached(n), std::slice::from_ref(&p.container_id));
    n.del_pod(&p).expect_ok("DEL");
}

/// ICMP echo requests the namespace has received (`Icmp: InEchos` of /proc/net/snmp).
fn echo_requests_received(ns: &Netns) -> u64 {
    let out = ns.exec("cat", &["/proc/net/snmp"]).expect("read snmp");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut icmp = text.lines().filter(|l| l.starts_with("Icmp:"));
    let (names, values) = (
        icmp.next().expect("Icmp names"),
        icmp.next().expect("Icmp values"),
    );
    let at = names
        .split_whitespace()
        .position(|n| n == "InEchos")
        .expect("InEchos");
    values
        .split_whitespace()
        .nth(at)
        .expect("value")
        .parse()
        .expect("number")
}

/// A pod that sends from an address not its own (another pod's, or any) is dropped on its
/// host veth and counted as spoofed there, with the node's reverse-path filter off; the
/// other pod's counters do not move.
#[test]
fn a_pod_cannot_send_from_a_forged_address() {
    require_root();
    let f = fabric_with(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let a = n.add_pod("a").unwrap();
    let b = n.add_pod("b").unwrap();
    n.ns.exec(
        "sh",
        &[
            "-c",
            "for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done",
        ],
    )
    .expect("rp_filter off on the node");
    assert_eq!(ping(&a.ns, INTERNET_IP, 1, 100, &[]), 1, "a's own address");
    let received = echo_requests_received(&f.internet);
    let b_before = record(n, &b).counters;
    for forged in [b.ip, Ipv4Addr::new(192, 0, 2, 77)] {
        let addr = format!("{forged}/32");
        a.ns.exec("ip", &["addr", "add", &addr, "dev", &a.ifname])
            .expect("second address in the pod");
        let src = forged.to_string();
        assert_eq!(
            ping(&a.ns, INTERNET_IP, 3, 100, &["-I", &src]),
            0,
            "from {forged}"
        );
        a.ns.exec("ip", &["addr", "del", &addr, "dev", &a.ifname])
            .expect("remove the second address");
    }
    assert_eq!(
        echo_requests_received(&f.internet),
        received,
        "no forged request arrived"
    );
    let k = record(n, &a).counters;
    assert_eq!(k.spoofed, echoes(6, 100));
    assert_eq!(get(&k, Direction::Egress, Class::Internet), echoes(1, 100));
    // b's IPv4 counters (its ARP and IPv6 neighbour traffic, class other, go on).
    let b_after = record(n, &b).counters;
    assert_eq!(b_after.spoofed, b_before.spoofed);
    for d in [Direction::Egress, Direction::Ingress] {
        for c in [Class::Internal, Class::Internet, Class::Blocked] {
            assert_eq!(get(&b_after, d, c), get(&b_before, d, c), "b {d:?} {c:?}");
        }
    }
}

/// The pod-side program finds its pod by the filter it runs in (the classid carries the
/// slot), not by the source address: packets a pod forges with another pod's address move
/// only its own egress queue model, never the other pod's, before the host veth drops them.
#[test]
fn a_forged_address_does_not_reach_another_pods_egress_model() {
    require_root();
    let f = fabric_with(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let rc = json!({"bandwidth": {"EgressRate": 10_000_000u64, "EgressBurst": 4_294_967_295u64}});
    let a = add_ok(&f, n, "a", Some(&rc));
    let b = add_ok(&f, n, "b", Some(&rc));
    let (ra, rb) = (record(n, &a), record(n, &b));
    let dp = open(n);
    for r in [&ra, &rb] {
        let hooks = dp.hooks_of(r);
        assert!(hooks.pod_egress.is_ok(), "{:?}", hooks.problems(r));
    }
    let model = |slot| {
        use aliasnet_ebpf::abi::{VQ_EGRESS, VQ_INTERNET};
        [VQ_EGRESS, VQ_INTERNET].map(|c| dp.vqueue_of(slot, c).expect("an_vqueue"))
    };
    // b sends no IPv4 (its ARP and IPv6 neighbour traffic is not modelled).
    let b_before = model(rb.slot);
    let a_before = model(ra.slot);
    let addr = format!("{}/32", b.ip);
    a.ns.exec("ip", &["addr", "add", &addr, "dev", &a.ifname])
        .expect("b's address in a");
    let src = b.ip.to_string();
    assert_eq!(
        ping(&a.ns, INTERNET_IP, 20, 1400, &["-I", &src]),
        0,
        "nothing forged arrives"
    );
    assert_eq!(model(rb.slot), b_before, "b's egress model moved");
    let a_after = model(ra.slot);
    assert!(
        a_after[0].t_empty > a_before[0].t_empty,
        "a's egress model took its forged packets: {a_before:?} -> {a_after:?}"
    );
    assert_eq!(record(n, &a).counters.spoofed, echoes(20, 1400));
}
