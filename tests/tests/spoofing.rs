//! Pods that forge their source address, end to end on the namespace fabric: dropped and
//! counted on their host veth, and never charged to another pod's counters or queue model.

use std::net::Ipv4Addr;

use aliasnet_ebpf::abi::{Class, Direction};
use aliasnet_tests::{
    datapath::echoes,
    fabric::{Fabric, DEFAULT_POLICY, INTERNET_IP},
    netns::Netns,
    require_root,
    traffic::ping_received,
};
use serde_json::json;

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
    let f = Fabric::with_limits(DEFAULT_POLICY, "1.0.0");
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
    assert_eq!(
        ping_received(&a.ns, INTERNET_IP, 1, 100, &[]),
        1,
        "a's own address"
    );
    let received = echo_requests_received(&f.internet);
    let b_before = n.record(&b).counters;
    for forged in [b.ip, Ipv4Addr::new(192, 0, 2, 77)] {
        let addr = format!("{forged}/32");
        a.ns.exec("ip", &["addr", "add", &addr, "dev", &a.ifname])
            .expect("second address in the pod");
        let src = forged.to_string();
        assert_eq!(
            ping_received(&a.ns, INTERNET_IP, 3, 100, &["-I", &src]),
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
    let k = n.record(&a).counters;
    assert_eq!(k.spoofed, echoes(6, 100));
    assert_eq!(k.get(Direction::Egress, Class::Internet), echoes(1, 100));
    // b's IPv4 counters (its ARP and IPv6 neighbour traffic, class other, go on).
    let b_after = n.record(&b).counters;
    assert_eq!(b_after.spoofed, b_before.spoofed);
    for d in [Direction::Egress, Direction::Ingress] {
        for c in [Class::Internal, Class::Internet, Class::Blocked] {
            assert_eq!(b_after.get(d, c), b_before.get(d, c), "b {d:?} {c:?}");
        }
    }
}

/// The pod-side program finds its pod by the filter it runs in (the classid carries the
/// slot), not by the source address: packets a pod forges with another pod's address move
/// only its own egress queue model, never the other pod's, before the host veth drops them.
#[test]
fn a_forged_address_does_not_reach_another_pods_egress_model() {
    require_root();
    let f = Fabric::with_limits(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let rc = json!({"bandwidth": {"EgressRate": 10_000_000u64, "EgressBurst": 4_294_967_295u64}});
    let a = n.add_pod_with("a", Some(&rc)).unwrap();
    let b = n.add_pod_with("b", Some(&rc)).unwrap();
    let (ra, rb) = (n.record(&a), n.record(&b));
    let dp = n.datapath();
    for r in [&ra, &rb] {
        let hooks = dp.hooks_of(r);
        assert!(hooks.pod_egress.is_ok(), "{:?}", hooks.problems(r));
    }
    let model = |slot| {
        use aliasnet_ebpf::abi::{DIR_EGRESS, KIND_INTERNET, KIND_TOTAL};
        [KIND_TOTAL, KIND_INTERNET].map(|k| dp.vqueue_of(slot, DIR_EGRESS, k).expect("an_vqueue"))
    };
    // b sends no IPv4 (its ARP and IPv6 neighbour traffic is not modelled).
    let b_before = model(rb.slot);
    let a_before = model(ra.slot);
    let addr = format!("{}/32", b.ip);
    a.ns.exec("ip", &["addr", "add", &addr, "dev", &a.ifname])
        .expect("b's address in a");
    let src = b.ip.to_string();
    assert_eq!(
        ping_received(&a.ns, INTERNET_IP, 20, 1400, &["-I", &src]),
        0,
        "nothing forged arrives"
    );
    assert_eq!(model(rb.slot), b_before, "b's egress model moved");
    let a_after = model(ra.slot);
    assert!(
        a_after[0].t_empty > a_before[0].t_empty,
        "a's egress model took its forged packets: {a_before:?} -> {a_after:?}"
    );
    assert_eq!(n.record(&a).counters.spoofed, echoes(20, 1400));
}
