//! `BPF_PROG_TEST_RUN` tests of IPv6 classification: longest-prefix match in the IPv6 trie,
//! the counters (the same cells as IPv4's), extension headers, fragments, the forged-source
//! check with the link-scoped traffic a pod needs (neighbour discovery, DAD), and the HTB
//! class the pod-side and uplink programs select.
//!
//! Needs root (loads BPF programs); touches no network state (see `common`).

mod common;

use aliasnet_ebpf::programs;
use common::*;

use aliasnet_ebpf::abi::{self, Class::*, Direction::*};

#[test]
fn pod_egress_internal_internet_blocked_by_longest_prefix() {
    let mut f = Fixture::with_policy();
    let internal = Ip::new(POD_IP6, ip6("fd00:240:1::9")).build();
    let internet = Ip::new(POD_IP6, ip6("2001:db8::10")).build();
    let metadata = Ip::new(POD_IP6, ip6("fd00:ec2::254")).build();
    let blocked = Ip::new(POD_IP6, ip6("fd00:99:1::1")).build();
    // fd00:99:7::/48 (internal) is inside fd00:99::/32 (blocked): the longer one wins.
    let carved_out = Ip::new(POD_IP6, ip6("fd00:99:7::1")).build();
    // 14 + 40 + 8 + 100.
    assert_eq!(internal.len(), 162);
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[
            (&internal, TC_ACT_UNSPEC),
            (&internet, TC_ACT_UNSPEC),
            (&internet, TC_ACT_UNSPEC),
            (&metadata, TC_ACT_SHOT),
            (&blocked, TC_ACT_SHOT),
            (&carved_out, TC_ACT_UNSPEC),
        ],
    );
    assert_eq!(
        f.counters(),
        expect(&[
            (Egress, Internal, c(2, 2 * 162)),
            (Egress, Internet, c(2, 2 * 162)),
            (Egress, Blocked, c(2, 2 * 162)),
        ])
    );
}

#[test]
fn pod_ingress_is_classed_on_the_source() {
    let mut f = Fixture::with_policy();
    let from_internal = Ip::new(ip6("fd00:100::2"), POD_IP6).build();
    let from_internet = Ip::new(ip6("2001:db8::10"), POD_IP6).build();
    let from_blocked = Ip::new(ip6("fd00:99::1"), POD_IP6).build();
    f.expect_verdicts(
        programs::HOST_EGRESS,
        &[
            (&from_internal, TC_ACT_UNSPEC),
            (&from_internet, TC_ACT_UNSPEC),
            (&from_blocked, TC_ACT_SHOT),
        ],
    );
    let n = from_internal.len();
    assert_eq!(
        f.counters(),
        expect(&[
            (Ingress, Internal, c(1, n)),
            (Ingress, Internet, c(1, n)),
            (Ingress, Blocked, c(1, n)),
        ])
    );
}

#[test]
fn the_families_do_not_mix() {
    let mut f = Fixture::with_policy();
    // ::ffff:10.1.2.3 is IPv6 outside fd00::/8, not the IPv4 10.0.0.0/8: internet.
    let mapped = Ip::new(POD_IP6, ip6("::ffff:10.1.2.3")).build();
    // An IPv6 prefix does not match an IPv4 address with the same leading bits (fd00::/8
    // vs 253.0.0.0).
    let v4 = Ip::new(POD_IP, ip("253.0.0.1")).build();
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[(&mapped, TC_ACT_UNSPEC), (&v4, TC_ACT_UNSPEC)],
    );
    assert_eq!(
        f.counters(),
        expect(&[(Egress, Internet, c(2, mapped.len() + v4.len()))])
    );
}

#[test]
fn extension_headers_are_walked_to_the_transport_header() {
    let mut f = Fixture::with_policy();
    // Hop-by-hop (8), routing (16), destination options (24) before TCP: a GSO skb of 3
    // segments counts the 14 + 40 + 48 + 32 header bytes on every segment, which it can
    // only do with the TCP header found behind the extensions.
    let pkt = Ip {
        ext: vec![
            ext_opts(NEXTHDR_HOP, 1),
            ext_opts(NEXTHDR_ROUTING, 2),
            ext_opts(NEXTHDR_DEST, 3),
        ],
        ..tcp(POD_IP6, ip6("2001:db8::10"), 3000)
    }
    .build();
    let hdrs = 14 + 40 + 48 + 32;
    assert_eq!(pkt.len(), hdrs + 3000);
    assert_eq!(
        f.run(programs::HOST_INGRESS, &pkt, Some(&gso_ctx(3, 1000)))
            .0,
        TC_ACT_UNSPEC
    );
    assert_eq!(
        f.counters(),
        expect(&[(Egress, Internet, c(3, 3 * (hdrs + 1000)))])
    );
}

#[test]
fn fragments_and_too_many_extensions_are_classed_by_address() {
    let mut f = Fixture::with_policy();
    let first = Ip {
        ext: vec![ext_frag(0, true)],
        ..tcp(POD_IP6, ip6("2001:db8::10"), 100)
    }
    .build();
    let later = Ip {
        ext: vec![ext_frag(185, false)],
        proto: 17,
        payload: vec![0xee; 60],
        ..Ip::new(POD_IP6, ip6("fd00:ec2::254"))
    }
    .build();
    // Seven destination-options headers: more than the walk takes. Still classed (and
    // blocked) by its addresses.
    let deep = Ip {
        ext: (0..7).map(|_| ext_opts(NEXTHDR_DEST, 1)).collect(),
        ..tcp(POD_IP6, ip6("fd00:99::1"), 10)
    }
    .build();
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[
            (&first, TC_ACT_UNSPEC),
            (&later, TC_ACT_SHOT),
            (&deep, TC_ACT_SHOT),
        ],
    );
    assert_eq!(
        f.counters(),
        expect(&[
            (Egress, Internet, c(1, first.len())),
            (Egress, Blocked, c(2, later.len() + deep.len())),
        ])
    );
}

#[test]
fn forged_ipv6_sources_are_dropped_and_neighbour_discovery_passes() {
    let mut f = Fixture::with_policy();
    let forged = Ip::new(ip6("fd00:240::6"), ip6("2001:db8::10")).build();
    // A link-local source is only for the link: to a routed destination it is forged.
    let ll_out = Ip::new(POD_LL, ip6("2001:db8::10")).build();
    let unspecified_out = Ip::new(ip6("::"), ip6("fd00:240:1::9")).build();
    let own = Ip::new(POD_IP6, ip6("2001:db8::10")).build();
    // What the pod needs to reach its gateway fe80::1: resolve it (multicast NS, unicast NS
    // for reachability), answer the gateway's NS, DAD from the unspecified address, and
    // resolution from its global address too.
    let ns_multicast = neighbour_solicitation(POD_LL, ip6("ff02::1:ff00:1"), GATEWAY_LL);
    let ns_unicast = neighbour_solicitation(POD_LL, GATEWAY_LL, GATEWAY_LL);
    let na = neighbour_advertisement(POD_LL, GATEWAY_LL, POD_LL);
    let dad = neighbour_solicitation(ip6("::"), ip6("ff02::1:ff00:5"), POD_LL);
    let ns_global = neighbour_solicitation(POD_IP6, ip6("ff02::1:ff00:1"), GATEWAY_LL);
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[
            (&forged, TC_ACT_SHOT),
            (&ll_out, TC_ACT_SHOT),
            (&unspecified_out, TC_ACT_SHOT),
            (&own, TC_ACT_UNSPEC),
            (&ns_multicast, TC_ACT_UNSPEC),
            (&ns_unicast, TC_ACT_UNSPEC),
            (&na, TC_ACT_UNSPEC),
            (&dad, TC_ACT_UNSPEC),
            (&ns_global, TC_ACT_UNSPEC),
        ],
    );
    // The gateway's NDP to the pod passes too (no source check towards the pod), also the
    // node's own DAD from the unspecified address, and an NS from a global source to the
    // pod's solicited-node group: all link-scoped, class other.
    let gw_ns = neighbour_solicitation(GATEWAY_LL, ip6("ff02::1:ff00:5"), POD_LL);
    let node_dad = neighbour_solicitation(ip6("::"), ip6("ff02::1:ff00:1"), GATEWAY_LL);
    let global_ns = neighbour_solicitation(ip6("fd00:100::1"), ip6("ff02::1:ff00:5"), POD_IP6);
    f.expect_verdicts(
        programs::HOST_EGRESS,
        &[
            (&gw_ns, TC_ACT_UNSPEC),
            (&node_dad, TC_ACT_UNSPEC),
            (&global_ns, TC_ACT_UNSPEC),
        ],
    );
    let to_pod = gw_ns.len() + node_dad.len() + global_ns.len();
    let ndp = ns_multicast.len() + ns_unicast.len() + na.len() + dad.len() + ns_global.len();
    let c_ = f.counters();
    assert_eq!(
        c_.spoofed,
        c(3, forged.len() + ll_out.len() + unspecified_out.len())
    );
    assert_eq!(
        c_,
        abi::PodCounters {
            spoofed: c_.spoofed,
            ..expect(&[
                (Egress, Internet, c(1, own.len())),
                // Link-scoped traffic is "other", as ARP is.
                (Egress, Other, c(5, ndp)),
                (Ingress, Other, c(3, to_pod)),
            ])
        }
    );
}

#[test]
fn pod_egress_and_uplink_select_the_htb_class() {
    // Flow isolation is switched off (the benchmarks' object): see queue_model.rs.
    let mut f = Fixture::bench_with_policy();
    f.set_limit(Egress, abi::KIND_TOTAL, Some(100 * SLOW));
    f.set_limit(Egress, abi::KIND_INTERNET, Some(SLOW));
    let ctx = prio_ctx(6);
    let cases = [
        (
            Ip::new(POD_IP6, ip6("2001:db8::10")).build(),
            pod_leaf(abi::KIND_INTERNET, abi::LEAF_SPARSE),
        ),
        (
            Ip::new(POD_IP6, ip6("fd00:240:1::9")).build(),
            pod_leaf(abi::KIND_TOTAL, abi::LEAF_SPARSE),
        ),
        // Link-scoped, from an address that does not name the pod: without the filter's
        // classid (a test run cannot set it) the pod is unknown, so unshaped.
        (
            neighbour_solicitation(POD_LL, ip6("ff02::1:ff00:1"), GATEWAY_LL),
            abi::CLASSID_DIRECT,
        ),
    ];
    for (pkt, want) in cases {
        let (ret, out) = f.run(programs::POD_EGRESS, &pkt, Some(&ctx));
        assert_eq!(ret, TC_ACT_UNSPEC, "the pod-side program never drops");
        assert_eq!(prio_of(&out), want, "{:x}", prio_of(&out));
    }
    let ctx = prio_ctx(3);
    f.set_node_limit(Egress, abi::KIND_INTERNET, Some(SLOW));
    f.update_config(|c| c.flags |= abi::CFG_FLOWS_OFF);
    let pod_internet = Ip::new(POD_IP6, ip6("2001:db8::10")).build();
    let shared = abi::classid(abi::node_group(abi::KIND_INTERNET) + abi::GROUP_SHARED);
    let cases = [
        (pod_internet.clone(), shared),
        (Ip::new(POD_IP6, ip6("fd00:240:1::9")).build(), 3),
        // Not a pod's address: the node's own traffic keeps its priority.
        (Ip::new(ip6("fd00:240::6"), ip6("2001:db8::10")).build(), 3),
    ];
    for (pkt, want) in cases {
        let (ret, out) = f.run(programs::UPLINK, &pkt, Some(&ctx));
        assert_eq!(ret, TC_ACT_UNSPEC);
        assert_eq!(prio_of(&out), want);
    }
    assert_eq!(f.node_counters()[abi::DIR_EGRESS], c(1, pod_internet.len()));
    assert_eq!(f.counters(), abi::PodCounters::default());
}
