//! Shaping in network namespaces with iperf3: a pod's internet traffic is limited while its
//! internal traffic is not; ingress and total egress limits; the node-wide internet cap.
//! Root only. Rates are checked within a band (HTB shapes L2 bytes, iperf3 reports TCP
//! goodput, and the machine is shared), not for benchmark-grade accuracy.

mod fabric;

use aliasnet_shaper::Limits;
use fabric::*;

const SECS: u32 = 3;

fn assert_near(what: &str, got_mbit: f64, limit_mbit: f64) {
    eprintln!("{what}: {got_mbit:.2} Mbit/s (limit {limit_mbit})");
    assert!(
        got_mbit >= 0.80 * limit_mbit && got_mbit <= 1.05 * limit_mbit,
        "{what}: {got_mbit:.2} Mbit/s, limit {limit_mbit} Mbit/s"
    );
}

fn assert_unshaped(what: &str, got_mbit: f64, limit_mbit: f64) {
    eprintln!("{what}: {got_mbit:.1} Mbit/s (unshaped)");
    // Unshaped veth forwarding does several Gbit/s here; ten times the limit is unambiguous.
    assert!(
        got_mbit > 10.0 * limit_mbit,
        "{what}: only {got_mbit:.1} Mbit/s, looks shaped"
    );
}

fn installed(policy: &str) -> Fabric {
    let f = Fabric::new();
    let path = f.write_policy(policy);
    let out = f.shaperd_once(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    f
}

#[test]
fn internet_is_limited_while_internal_is_not() {
    if !require_root() {
        return;
    }
    // The limit comes from node policy; nothing is set on the pod.
    let f = installed(
        r#"
        internal_cidrs = ["10.0.0.0/8"]
        pod_internet_egress_rate = "20M"
        "#,
    );
    let mut dp = f.open();
    let att = f.attachment(Limits::default());
    let a = f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert!(a.internet_from_policy);
    assert_eq!(a.internet_egress.map(|s| s.rate), Some(20_000_000));
    assert_eq!(a.egress, None, "no total egress limit");

    assert_near(
        "pod -> internet",
        f.iperf("inet", INTERNET, SECS, false),
        20.0,
    );
    assert_unshaped(
        "pod -> internal",
        f.iperf("peer", INTERNAL, SECS, false),
        20.0,
    );
    // Downloads are not limited by an egress limit.
    assert_unshaped(
        "internet -> pod",
        f.iperf("inet", INTERNET, SECS, true),
        20.0,
    );

    let rec = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap();
    let stats = f.in_node(|| dp.shaping_stats(&rec)).expect("stats");
    let internet = stats.internet_egress.expect("internet class leaf");
    assert!(
        internet.packets > 1000,
        "internet leaf saw the traffic: {internet:?}"
    );
    assert!(stats.other_egress.is_none() && stats.ingress.is_none());
}

#[test]
fn ingress_and_total_egress_limits() {
    if !require_root() {
        return;
    }
    let f = installed(r#"internal_cidrs = ["10.0.0.0/8"]"#);
    let mut dp = f.open();
    let att = f.attachment(Limits {
        ingress_rate: Some(30_000_000),
        // containerd's "unset" burst must not let traffic through unshaped.
        ingress_burst: Some(u64::from(u32::MAX)),
        egress_rate: Some(50_000_000),
        egress_burst: Some(u64::from(u32::MAX)),
        internet_egress_rate: Some(10_000_000),
    });
    let a = f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert!(!a.internet_from_policy);
    assert_eq!(
        a.ingress.map(|s| s.burst_bytes),
        Some(37_500),
        "10 ms of 30 Mbit/s"
    );

    assert_near(
        "internet -> pod (ingress limit)",
        f.iperf("inet", INTERNET, SECS, true),
        30.0,
    );
    assert_near(
        "internal -> pod (ingress limit)",
        f.iperf("peer", INTERNAL, SECS, true),
        30.0,
    );
    assert_near(
        "pod -> internet (internet limit)",
        f.iperf("inet", INTERNET, SECS, false),
        10.0,
    );
    assert_near(
        "pod -> internal (total egress limit)",
        f.iperf("peer", INTERNAL, SECS, false),
        50.0,
    );
}

#[test]
fn node_cap_limits_all_pods_internet_egress() {
    if !require_root() {
        return;
    }
    // No per-pod limit; the uplink comes from the node's default route.
    let f = installed(
        r#"
        internal_cidrs = ["10.0.0.0/8", "100.64.0.0/16"]
        node_internet_egress_cap = "15M"
        "#,
    );
    let dp_cfg = f.open().config().unwrap();
    assert_eq!(dp_cfg.node_internet_cap, 15_000_000);
    assert_ne!(dp_cfg.uplink_ifindex, 0);
    assert_eq!(f.tc_json("node", "qdisc", "up0")[0]["kind"], "htb");

    let mut dp = f.open();
    let att = f.attachment(Limits::default());
    let a = f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert_eq!(a.internet_egress, None, "the pod itself is unlimited");

    assert_near(
        "pod -> internet (node cap)",
        f.iperf("inet", INTERNET, SECS, false),
        15.0,
    );
    assert_unshaped(
        "pod -> internal",
        f.iperf("peer", INTERNAL, SECS, false),
        15.0,
    );
    let capped = dp.node_counters().unwrap();
    assert!(
        capped.packets > 1000,
        "uplink program classed the pod's internet traffic: {capped:?}"
    );
    // Traffic the node itself sends to the internet is not the pods' and is not capped.
    assert_eq!(f.ping("node", INTERNET, 3, 100, &[]), 3);
    assert_eq!(dp.node_counters().unwrap().packets, capped.packets);
}
