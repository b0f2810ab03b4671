//! The eBPF datapath wired into the plugin, end to end: the real `aliasnet`, `aliasnet-ipamd`
//! and `aliasnet-shaperd` on the namespace fabric. Classification and counters of known
//! traffic, limits from the runtime and their shaping, and bad limits refused. Counters are
//! read from the pinned maps by this process (maps are readable from any netns).

use std::net::Ipv4Addr;

use aliasnet_ebpf::abi::{Class, Counter, Direction};
use aliasnet_tests::{
    ctl::{ctl_json, findings},
    datapath::{echoes, ANNOTATIONS, INTERNET_EGRESS},
    fabric::{Fabric, DEFAULT_POLICY, INTERNET_IP, INTERNET_IP2},
    netns::Netns,
    require_root,
    traffic::{iperf_report, ping_received, IperfServer},
};
use serde_json::json;

/// TCP goodput in bit/s of a 3 s iperf3 run from `client` to a server in `server` on `dst`.
fn iperf(client: &Netns, server: &Netns, dst: Ipv4Addr) -> f64 {
    let dst = dst.to_string();
    let srv = IperfServer::start(&server.name, &dst).expect("start iperf3 -s");
    let port = srv.port.to_string();
    let out = client
        .exec_status("iperf3", &["-c", &dst, "-p", &port, "-t", "3", "-J"])
        .expect("run iperf3 -c");
    let v = iperf_report(&out).unwrap_or_else(|e| panic!("iperf3 to {dst}:{port}: {e:#}"));
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("iperf3 to {dst}:{port}: no goodput in {v}"))
}

#[test]
fn counters_match_known_traffic_per_pod_direction_and_class() {
    require_root();
    let f = Fabric::with_limits(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let a = n.add_pod("a").unwrap();
    let b = n.add_pod("b").unwrap();

    let rec = n.record(&a);
    assert_eq!(rec.namespace(), "test");
    assert_eq!(rec.name(), "a");
    assert_eq!(rec.ipv4(), Some(a.ip));
    assert_eq!(
        rec.host_ifname(),
        a.result["interfaces"][0]["name"].as_str().unwrap()
    );

    assert_eq!(
        ping_received(&a.ns, b.ip, 5, 200, &[]),
        5,
        "a → b (internal)"
    );
    assert_eq!(
        ping_received(&a.ns, INTERNET_IP, 7, 300, &[]),
        7,
        "a → internet"
    );
    assert_eq!(
        ping_received(&b.ns, INTERNET_IP2, 3, 100, &[]),
        3,
        "b → internet"
    );
    assert_eq!(
        ping_received(&f.internet, b.ip, 4, 50, &[]),
        4,
        "internet → b"
    );

    let ka = n.record(&a).counters;
    let kb = n.record(&b).counters;
    use Class::*;
    use Direction::*;
    let zero = Counter::default();
    // a: 5 requests out and 5 replies in to b; 7 each way with the internet.
    assert_eq!(ka.get(Egress, Internal), echoes(5, 200));
    assert_eq!(ka.get(Ingress, Internal), echoes(5, 200));
    assert_eq!(ka.get(Egress, Internet), echoes(7, 300));
    assert_eq!(ka.get(Ingress, Internet), echoes(7, 300));
    // b: the mirror image of a's internal traffic, plus its own internet pings both ways.
    assert_eq!(kb.get(Ingress, Internal), echoes(5, 200));
    assert_eq!(kb.get(Egress, Internal), echoes(5, 200));
    let inet_b = Counter {
        packets: 3 + 4,
        bytes: 3 * 142 + 4 * 92,
    };
    assert_eq!(kb.get(Egress, Internet), inet_b);
    assert_eq!(kb.get(Ingress, Internet), inet_b);
    for k in [&ka, &kb] {
        assert_eq!(k.get(Egress, Blocked), zero);
        assert_eq!(k.get(Ingress, Blocked), zero);
    }
}

#[test]
fn blocked_destinations_are_unreachable_and_counted() {
    require_root();
    let policy = format!("{DEFAULT_POLICY}blocked_cidrs = [\"198.51.100.0/24\"]\n");
    let f = Fabric::with_limits(&policy, "1.0.0");
    let n = f.node(1);
    let p = n.add_pod("p").unwrap();

    assert_eq!(
        ping_received(&p.ns, INTERNET_IP2, 3, 100, &[]),
        0,
        "blocked destination"
    );
    // From a blocked source towards the pod: dropped on the way in.
    let src = INTERNET_IP2.to_string();
    assert_eq!(
        ping_received(&f.internet, p.ip, 4, 60, &["-I", &src]),
        0,
        "blocked source"
    );
    assert_eq!(
        ping_received(&p.ns, INTERNET_IP, 2, 100, &[]),
        2,
        "other internet hosts"
    );

    let k = n.record(&p).counters;
    assert_eq!(k.get(Direction::Egress, Class::Blocked), echoes(3, 100));
    assert_eq!(k.get(Direction::Ingress, Class::Blocked), echoes(4, 60));
    assert_eq!(k.get(Direction::Egress, Class::Internet), echoes(2, 100));
    assert_eq!(k.get(Direction::Ingress, Class::Internet), echoes(2, 100));
}

#[test]
fn internet_egress_is_shaped_while_internal_traffic_is_not() {
    require_root();
    let f = Fabric::with_limits(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let peer = n.add_pod("peer").unwrap();
    let rc = json!({ANNOTATIONS: {INTERNET_EGRESS: "10M", "team": "vision"}});
    let s = n.add_pod_with("shaped", Some(&rc)).unwrap();
    let m = n.record(&s).meta;
    assert_eq!(
        (m.internet_egress_rate(), m.egress_rate(), m.ingress_rate()),
        (10_000_000, 0, 0)
    );

    let internet = iperf(&s.ns, &f.internet, INTERNET_IP);
    let internal = iperf(&s.ns, &peer.ns, peer.ip);
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
    let t = n.add_pod_with("total", Some(&rc)).unwrap();
    let m = n.record(&t).meta;
    assert_eq!((m.egress_rate(), m.ingress_rate()), (20_000_000, 0));
    let to_peer = iperf(&t.ns, &peer.ns, peer.ip);
    let to_internet = iperf(&t.ns, &f.internet, INTERNET_IP);
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
    // The pods' own HTB shaped all of it: the host veth's backstop dropped nothing.
    for p in [&s, &t] {
        assert_eq!(
            n.record(p).counters.policed,
            Counter::default(),
            "{}",
            p.name
        );
    }
}

/// A pod holding CAP_NET_ADMIN in its namespace deletes its own HTB and the filter that
/// feeds it: its egress limit still holds, enforced by the host veth it cannot touch, the
/// drops are counted as policed, and CHECK reports the missing HTB and filter.
#[test]
fn a_pod_that_removes_its_own_shaping_stays_within_its_egress_limit() {
    require_root();
    let f = Fabric::with_limits(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let peer = n.add_pod("peer").unwrap();
    let rc = json!({"bandwidth": {"egressRate": 20_000_000u64, "egressBurst": 4_294_967_295u64}});
    let t = n.add_pod_with("tamper", Some(&rc)).unwrap();
    let before = n.check_pod_with(&t, Some(&rc));
    assert!(before.ok(), "CHECK before: {}", before.error_msg());
    for qdisc in ["root", "clsact"] {
        t.ns.exec("tc", &["qdisc", "del", "dev", &t.ifname, qdisc])
            .unwrap_or_else(|e| panic!("the pod deletes its {qdisc} qdisc: {e:#}"));
        // The HTB first (the filter still classifies), then the filter: CHECK names each.
        let check = n.check_pod_with(&t, Some(&rc));
        let want = if qdisc == "root" {
            "HTB"
        } else {
            "an_pod_egress"
        };
        assert!(
            !check.ok() && check.error_msg().contains(want),
            "CHECK without the pod's {qdisc} qdisc: {}",
            check.error_msg()
        );
        // So does `aliasnetctl doctor`, with the pod to recreate.
        let report = ctl_json(n, &["doctor", "--grace", "0"], 1);
        assert!(
            findings(&report)
                .iter()
                .any(|f| f["check"] == "program_missing"
                    && f["subject"] == "test/tamper"
                    && f["problem"].as_str().is_some_and(|p| p.contains(want))),
            "doctor without the pod's {qdisc} qdisc: {report:#}"
        );
    }
    let left =
        t.ns.exec("tc", &["qdisc", "show", "dev", &t.ifname])
            .unwrap();
    let left = String::from_utf8_lossy(&left.stdout).into_owned();
    assert!(
        !left.contains("htb") && !left.contains("clsact"),
        "the pod's shaping is still there: {left}"
    );
    let to_peer = iperf(&t.ns, &peer.ns, peer.ip);
    let to_internet = iperf(&t.ns, &f.internet, INTERNET_IP);
    let policed = n.record(&t).counters.policed;
    eprintln!(
        "20M egress limit without the pod's HTB: internal {:.2} Mbit/s, internet {:.2} Mbit/s, policed {policed:?}",
        to_peer / 1e6,
        to_internet / 1e6
    );
    // The backstop drains at 110 % of the limit, after a burst of ~0.12 s of it.
    for (what, bps) in [("internal", to_peer), ("internet", to_internet)] {
        assert!(
            (5e6..=24e6).contains(&bps),
            "{what} goodput {bps} bit/s without the pod's HTB, limit 20 Mbit/s"
        );
    }
    assert!(policed.packets > 0, "nothing counted as policed");
}

#[test]
fn bad_bandwidth_is_code_7_naming_the_field_and_leaves_nothing() {
    require_root();
    let f = Fabric::with_limits(DEFAULT_POLICY, "1.0.0");
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
        let Err((ns, out)) = n.add_pod_conf(&format!("bad{i}"), &n.plugin_config(None, Some(rc)))
        else {
            panic!("{what}: ADD succeeded");
        };
        out.expect_code(7, &what);
        assert!(
            out.error_msg().contains(field),
            "{what}: {}",
            out.error_msg()
        );
        n.assert_nothing_left(&ns, &what);
    }
}
