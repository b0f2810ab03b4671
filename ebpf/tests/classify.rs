//! `BPF_PROG_TEST_RUN` tests of classification: the class each program gives a packet by
//! the node policy (longest-prefix match in the trie of its family), the verdict, the
//! per-pod counters (the same cells for both families), fragments, and the HTB class the
//! pod-side and uplink programs select. Each test runs for IPv4 and IPv6 (`name::ipv4`,
//! `name::ipv6`); what one family has alone (IPv4 options, IPv6 extension headers and
//! link-scoped traffic) is tested at the end.
//!
//! Needs root (loads BPF programs); touches no network state (see `common`).

mod common;

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::HashMap;
use common::*;

use abi::{Class::*, Direction::*};

// Each runs for both families: `name::ipv4`, `name::ipv6`.
per_family!(
    pod_egress_internal_internet_blocked,
    pod_ingress_is_classed_on_the_source,
    most_specific_prefix_wins,
    fragments_are_classed_by_address,
    gso_packets_count_every_segment,
    policy_generation_switch_is_atomic,
    unregistered_device_is_enforced_but_not_counted,
    pod_egress_selects_the_htb_class,
    uplink_shapes_only_pod_internet_traffic_with_node_limits,
);

fn pod_egress_internal_internet_blocked(fam: Family) {
    let mut f = Fixture::with_policy();
    let to = |v4, v6| Ip::new(fam.pod(), fam.addr(v4, v6)).build();
    let internal = to("10.1.2.3", "fd00:240:1::9");
    let internet = to("203.0.113.9", "2001:db8::10");
    let metadata = to("169.254.169.254", "fd00:ec2::254");
    let blocked = to("10.99.1.1", "fd00:99:1::1");
    // 10.99.7/24 (internal) is inside 10.99/16 (blocked): the longer one wins.
    let carved_out = to("10.99.7.200", "fd00:99:7::1");
    // 14 + 20 + 8 + 100; IPv6's header is 40 bytes.
    let n = fam.pick(142, 162);
    assert_eq!(internal.len(), n);
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[
            (&internal, TC_ACT_UNSPEC),
            (&internal, TC_ACT_UNSPEC),
            (&internal, TC_ACT_UNSPEC),
            (&internet, TC_ACT_UNSPEC),
            (&internet, TC_ACT_UNSPEC),
            (&metadata, TC_ACT_SHOT),
            (&metadata, TC_ACT_SHOT),
            (&blocked, TC_ACT_SHOT),
            (&carved_out, TC_ACT_UNSPEC),
        ],
    );
    assert_eq!(
        f.counters(),
        expect(&[
            (Egress, Internal, c(4, 4 * n)),
            (Egress, Internet, c(2, 2 * n)),
            (Egress, Blocked, c(3, 3 * n)),
        ])
    );
}

fn pod_ingress_is_classed_on_the_source(fam: Family) {
    let mut f = Fixture::with_policy();
    // Destination is the pod; the remote end is the source.
    let from = |v4, v6| Ip::new(fam.addr(v4, v6), fam.pod()).build();
    let from_internal = from("10.3.3.3", "fd00:100::2");
    let from_internet = from("198.51.100.7", "2001:db8::10");
    let from_blocked = from("10.99.1.1", "fd00:99::1");
    // A packet *to* a blocked address seen on the ingress path is classed by its source.
    let to_blocked_from_internet = Ip::new(
        fam.addr("198.51.100.7", "2001:db8::10"),
        fam.addr("169.254.169.254", "fd00:ec2::254"),
    )
    .build();
    f.expect_verdicts(
        programs::HOST_EGRESS,
        &[
            (&from_internal, TC_ACT_UNSPEC),
            (&from_internet, TC_ACT_UNSPEC),
            (&from_blocked, TC_ACT_SHOT),
            (&to_blocked_from_internet, TC_ACT_UNSPEC),
        ],
    );
    let n = from_internal.len();
    assert_eq!(
        f.counters(),
        expect(&[
            (Ingress, Internal, c(1, n)),
            (Ingress, Internet, c(2, 2 * n)),
            (Ingress, Blocked, c(1, n)),
        ])
    );
}

fn most_specific_prefix_wins(fam: Family) {
    let mut f = Fixture::with_policy();
    // 10/8 internal, 10.99/16 blocked inside it, 10.99.7/24 internal inside that (in
    // IPv6 fd00::/8, fd00:99::/32, fd00:99:7::/48).
    let cases = [
        ("10.98.0.1", "fd00:98::1", TC_ACT_UNSPEC, Internal),
        ("10.99.0.1", "fd00:99::1", TC_ACT_SHOT, Blocked),
        ("10.99.7.200", "fd00:99:7::c8", TC_ACT_UNSPEC, Internal),
        ("10.99.8.1", "fd00:99:8::1", TC_ACT_SHOT, Blocked),
        ("11.0.0.1", "fc00::1", TC_ACT_UNSPEC, Internet),
        // Next to the metadata endpoint: outside 10/8 in IPv4, inside fd00::/8 in IPv6.
        (
            "169.254.169.253",
            "fd00:ec2::255",
            TC_ACT_UNSPEC,
            fam.pick(Internet, Internal),
        ),
    ];
    let mut want = abi::PodCounters::default();
    for (v4, v6, verdict, class) in cases {
        let dst = fam.addr(v4, v6);
        let pkt = Ip::new(fam.pod(), dst).build();
        assert_eq!(
            f.run(programs::HOST_INGRESS, &pkt, None).0,
            verdict,
            "dst {dst}"
        );
        want.dir[Egress.index()][class.index()] += c(1, pkt.len());
    }
    assert_eq!(f.counters(), want);
}

fn fragments_are_classed_by_address(fam: Family) {
    let mut f = Fixture::with_policy();
    let internet = fam.addr("203.0.113.5", "2001:db8::10");
    // First fragments (MF, offset 0) and a later one (offset 185*8 bytes) whose payload
    // is mid-datagram data, not an L4 header.
    let first = Ip {
        frag: (true, 0),
        ..Ip::new(fam.pod(), internet)
    }
    .build();
    let first_tcp = Ip {
        frag: (true, 0),
        ..tcp(fam.pod(), internet, 100)
    }
    .build();
    let later = Ip {
        frag: (false, 185),
        proto: 17,
        payload: vec![0xee; 60],
        ..Ip::new(fam.pod(), internet)
    }
    .build();
    let later_blocked = Ip {
        frag: (true, 370),
        proto: 17,
        payload: vec![0xee; 16],
        ..Ip::new(fam.pod(), fam.addr("10.99.200.1", "fd00:ec2::254"))
    }
    .build();
    let later_internal = Ip {
        frag: (false, 1),
        proto: 6,
        payload: vec![0x01; 8],
        ..Ip::new(fam.pod(), fam.addr("10.4.0.1", "fd00:4::1"))
    }
    .build();
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[
            (&first, TC_ACT_UNSPEC),
            (&first_tcp, TC_ACT_UNSPEC),
            (&later, TC_ACT_UNSPEC),
            (&later_blocked, TC_ACT_SHOT),
            (&later_internal, TC_ACT_UNSPEC),
        ],
    );
    assert_eq!(
        f.counters(),
        expect(&[
            (
                Egress,
                Internet,
                c(3, first.len() + first_tcp.len() + later.len())
            ),
            (Egress, Blocked, c(1, later_blocked.len())),
            (Egress, Internal, c(1, later_internal.len())),
        ])
    );
}

fn gso_packets_count_every_segment(fam: Family) {
    let mut f = Fixture::with_policy();
    // One skb carrying 3 segments of 1000 bytes: eth 14 + ip 20 (40) + tcp 32 header
    // bytes repeated on each wire packet.
    let hdrs = ETH_HLEN + fam.ip_hlen() + 32;
    let pkt = tcp(fam.pod(), fam.addr("203.0.113.1", "2001:db8::1"), 3000).build();
    assert_eq!(
        f.run(programs::HOST_INGRESS, &pkt, Some(&gso_ctx(3, 1000)))
            .0,
        TC_ACT_UNSPEC
    );
    assert_eq!(pkt.len(), hdrs + 3000);
    assert_eq!(
        f.counters(),
        expect(&[(Egress, Internet, c(3, 3 * (hdrs + 1000)))])
    );
}

fn policy_generation_switch_is_atomic(fam: Family) {
    let mut f = Fixture::new();
    let net = (fam.addr("203.0.113.0", "2001:db8:113::"), fam.pick(24, 48));
    f.prefix(0, net, abi::CLASS_INTERNAL);
    f.prefix(1, net, abi::CLASS_BLOCKED);
    let pkt = Ip::new(fam.pod(), fam.addr("203.0.113.10", "2001:db8:113::10")).build();
    f.expect_verdicts(programs::HOST_INGRESS, &[(&pkt, TC_ACT_UNSPEC)]);
    f.set_config(1);
    f.expect_verdicts(programs::HOST_INGRESS, &[(&pkt, TC_ACT_SHOT)]);
    assert_eq!(
        f.counters(),
        expect(&[
            (Egress, Internal, c(1, pkt.len())),
            (Egress, Blocked, c(1, pkt.len())),
        ])
    );
}

fn unregistered_device_is_enforced_but_not_counted(fam: Family) {
    let mut f = Fixture::with_policy();
    let mut pods: HashMap<_, u32, abi::Pod> = f.map(maps::PODS);
    pods.remove(&TEST_IFINDEX).expect("unregister");
    let blocked = Ip::new(fam.pod(), fam.addr("169.254.169.254", "fd00:ec2::254")).build();
    let internet = Ip::new(fam.pod(), fam.addr("203.0.113.9", "2001:db8::10")).build();
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[(&blocked, TC_ACT_SHOT), (&internet, TC_ACT_UNSPEC)],
    );
    assert_eq!(f.counters(), abi::PodCounters::default());
}

fn pod_egress_selects_the_htb_class(fam: Family) {
    let mut f = Fixture::with_policy();
    f.prefix(
        0,
        (fam.addr("203.0.113.128", "2001:db8:1::"), fam.pick(25, 48)),
        abi::CLASS_NAMED,
    );
    let ctx = prio_ctx(6);
    let to = |v4, v6| Ip::new(fam.pod(), fam.addr(v4, v6)).build();
    let internet = to("203.0.113.1", "2001:db8::10");
    let internal = to("10.1.1.1", "fd00:240:1::9");
    let blocked = to("169.254.169.254", "fd00:ec2::254");
    let named = to("203.0.113.200", "2001:db8:1::200");
    // No limit in the pod's record: everything leaves unshaped (HTB's direct queue).
    for pkt in [&internet, &internal, &blocked, &named] {
        let (ret, out) = f.run(programs::POD_EGRESS, pkt, Some(&ctx));
        assert_eq!(ret, TC_ACT_UNSPEC, "the pod-side program never drops");
        assert_eq!(prio_of(&out), abi::CLASSID_DIRECT);
    }
    // An internet limit only: internal traffic stays unshaped, a named class is internet.
    f.set_limit(Egress, abi::KIND_INTERNET, Some(SLOW));
    let cases = [
        (&internet, pod_leaf(abi::KIND_INTERNET, abi::LEAF_SPARSE)),
        (&internal, abi::CLASSID_DIRECT),
        (&named, pod_leaf(abi::KIND_INTERNET, abi::LEAF_SPARSE)),
    ];
    for (pkt, want) in cases {
        let (_, out) = f.run(programs::POD_EGRESS, pkt, Some(&ctx));
        assert_eq!(prio_of(&out), want, "{:x}", prio_of(&out));
    }
    // Total > internet > named: each packet takes its most specific limit's leaf, blocked
    // traffic the total's (the host veth drops it). (What is not IP takes the total's bulk
    // leaf too, but a test run cannot give the filter the classid it finds its pod by.)
    f.set_limit(Egress, abi::KIND_TOTAL, Some(100 * SLOW));
    f.set_limit(Egress, abi::KIND_NAMED, Some(SLOW / 2));
    let cases = [
        (&internet, pod_leaf(abi::KIND_INTERNET, abi::LEAF_SPARSE)),
        (&internal, pod_leaf(abi::KIND_TOTAL, abi::LEAF_SPARSE)),
        (&blocked, pod_leaf(abi::KIND_TOTAL, abi::LEAF_SPARSE)),
        (&named, pod_leaf(abi::KIND_NAMED, abi::LEAF_SPARSE)),
    ];
    for (pkt, want) in cases {
        let (_, out) = f.run(programs::POD_EGRESS, pkt, Some(&ctx));
        assert_eq!(prio_of(&out), want, "{:x}", prio_of(&out));
    }
    // It only selects; counting happens once, on the host side.
    assert_eq!(f.counters(), abi::PodCounters::default());
}

fn uplink_shapes_only_pod_internet_traffic_with_node_limits(fam: Family) {
    // Flow isolation is switched off (the benchmarks' object): see queue_model.rs.
    let mut f = Fixture::bench_with_policy();
    f.prefix(
        0,
        (fam.addr("203.0.113.128", "2001:db8:1::"), fam.pick(25, 48)),
        abi::CLASS_NAMED + 3,
    );
    let ctx = prio_ctx(3);
    let pod_internet = Ip::new(fam.pod(), fam.addr("203.0.113.1", "2001:db8::10")).build();
    let pod_named = Ip::new(fam.pod(), fam.addr("203.0.113.200", "2001:db8:1::200")).build();
    let others = [
        // Internal traffic of a pod and anything the node itself sends (not a pod's
        // address) keep their priority.
        Ip::new(fam.pod(), fam.addr("10.1.1.1", "fd00:240:1::9")).build(),
        Ip::new(
            fam.addr("10.20.0.6", "fd00:240::6"),
            fam.addr("203.0.113.1", "2001:db8::10"),
        )
        .build(),
        arp_request(),
    ];
    // No node limits: nothing is touched.
    for pkt in others.iter().chain([&pod_internet, &pod_named]) {
        let (ret, out) = f.run(programs::UPLINK, pkt, Some(&ctx));
        assert_eq!(ret, TC_ACT_UNSPEC);
        assert_eq!(prio_of(&out), 3);
    }
    assert_eq!(f.node_counters()[abi::DIR_EGRESS], c(0, 0));
    // A node internet limit: the pod's internet traffic takes the group's shared bulk leaf
    // until the pod has its own; named classes are internet too.
    f.set_node_limit(Egress, abi::KIND_INTERNET, Some(SLOW));
    let group = abi::node_group(abi::KIND_INTERNET);
    // Every packet to the bulk leaves (flow isolation is tested in queue_model.rs).
    f.update_config(|c| c.flags |= abi::CFG_FLOWS_OFF);
    for (pkt, want) in [
        (&pod_internet, abi::classid(group + abi::GROUP_SHARED)),
        (&pod_named, abi::classid(group + abi::GROUP_SHARED)),
    ] {
        let (ret, out) = f.run(programs::UPLINK, pkt, Some(&ctx));
        assert_eq!(ret, TC_ACT_UNSPEC);
        assert_eq!(prio_of(&out), want, "{:x}", prio_of(&out));
    }
    assert_eq!(
        f.node_counters()[abi::DIR_EGRESS],
        c(2, pod_internet.len() + pod_named.len())
    );
    for pkt in &others {
        let (ret, out) = f.run(programs::UPLINK, pkt, Some(&ctx));
        assert_eq!(ret, TC_ACT_UNSPEC);
        assert_eq!(prio_of(&out), 3);
    }
    // With its own leaf, and a named class's group nested in the internet's.
    f.update_meta(|m| m.agg_leaves[1][abi::DIR_EGRESS] = 1 << abi::KIND_INTERNET);
    f.set_node_limit(Egress, abi::KIND_NAMED + 3, Some(SLOW / 2));
    let (_, out) = f.run(programs::UPLINK, &pod_internet, Some(&ctx));
    assert_eq!(
        prio_of(&out),
        abi::classid(abi::agg_leaf(abi::KIND_INTERNET, SLOT))
    );
    let (_, out) = f.run(programs::UPLINK, &pod_named, Some(&ctx));
    assert_eq!(
        prio_of(&out),
        abi::classid(abi::node_group(abi::KIND_NAMED + 3) + abi::GROUP_SHARED)
    );
    assert_eq!(f.node_counters()[abi::DIR_EGRESS].packets, 4);
    // The uplink counts the node's limits only, never the pod's own cells.
    assert_eq!(f.counters(), abi::PodCounters::default());
}

// ---- both families in one packet stream ---------------------------------------------------

#[test]
fn non_ip_passes_and_is_counted_as_other() {
    let mut f = Fixture::with_policy();
    let arp = arp_request();
    // Ethertype says IPv6 but the version is 4: ipv6_rcv drops it, we pass it unclassified.
    let mut v6 = Ip::new(ip6("fd00:99::1"), ip6("fd00:ec2::254")).build();
    v6[ETH_HLEN] = 0x40;
    // Ethertype says IPv4 but the header is bad (IHL 3): the stack drops it, we pass it.
    let mut bad = Ip::new(POD_IP, ip("169.254.169.254")).build();
    bad[ETH_HLEN] = 0x43;
    f.expect_verdicts(programs::HOST_INGRESS, &[(&arp, TC_ACT_UNSPEC)]);
    f.expect_verdicts(programs::HOST_EGRESS, &[(&arp, TC_ACT_UNSPEC)]);
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[(&v6, TC_ACT_UNSPEC), (&bad, TC_ACT_UNSPEC)],
    );
    assert_eq!(
        f.counters(),
        expect(&[
            (Egress, Other, c(3, arp.len() + v6.len() + bad.len())),
            (Ingress, Other, c(1, arp.len())),
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

// ---- IPv4 only: options ------------------------------------------------------------------

#[test]
fn ipv4_options_do_not_move_the_addresses() {
    let mut f = Fixture::with_policy();
    // Record-route option (type 7) filling 36 bytes of options: IHL 14.
    let mut rr = vec![7, 35, 4];
    rr.resize(35, 0);
    rr.push(0); // end of options list
    let internet = Ip {
        options: rr.clone(),
        ..Ip::new(POD_IP, ip("203.0.113.77"))
    }
    .build();
    let blocked = Ip {
        options: vec![1, 1, 1, 0], // NOP NOP NOP EOL
        ..Ip::new(POD_IP, ip("169.254.169.254"))
    }
    .build();
    assert_eq!(internet[ETH_HLEN] & 0x0f, 14);
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[(&internet, TC_ACT_UNSPEC), (&blocked, TC_ACT_SHOT)],
    );
    assert_eq!(
        f.counters(),
        expect(&[
            (Egress, Internet, c(1, internet.len())),
            (Egress, Blocked, c(1, blocked.len())),
        ])
    );
}

// ---- IPv6 only: extension headers, the link -------------------------------------------------

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
fn more_extension_headers_than_the_walk_takes_are_classed_by_address() {
    let mut f = Fixture::with_policy();
    // Seven destination-options headers: more than the walk takes. Still classed (and
    // blocked) by its addresses.
    let deep = Ip {
        ext: (0..7).map(|_| ext_opts(NEXTHDR_DEST, 1)).collect(),
        ..tcp(POD_IP6, ip6("fd00:99::1"), 10)
    }
    .build();
    f.expect_verdicts(programs::HOST_INGRESS, &[(&deep, TC_ACT_SHOT)]);
    assert_eq!(f.counters(), expect(&[(Egress, Blocked, c(1, deep.len()))]));
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
fn link_scoped_traffic_from_the_pod_side_is_not_shaped() {
    let mut f = Fixture::with_policy();
    f.set_limit(Egress, abi::KIND_TOTAL, Some(100 * SLOW));
    f.set_limit(Egress, abi::KIND_INTERNET, Some(SLOW));
    // Link-scoped, from an address that does not name the pod: without the filter's classid
    // (a test run cannot set it) the pod is unknown, so unshaped.
    let ns = neighbour_solicitation(POD_LL, ip6("ff02::1:ff00:1"), GATEWAY_LL);
    let (ret, out) = f.run(programs::POD_EGRESS, &ns, Some(&prio_ctx(6)));
    assert_eq!(ret, TC_ACT_UNSPEC, "the pod-side program never drops");
    assert_eq!(prio_of(&out), abi::CLASSID_DIRECT, "{:x}", prio_of(&out));
}
