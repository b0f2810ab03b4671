//! `BPF_PROG_TEST_RUN` tests of classification: the class each program gives a packet by
//! the node policy, the verdict, the per-pod counters, and the HTB class the pod-side and
//! uplink programs select.
//!
//! Needs root (loads BPF programs); touches no network state (see `common`).

mod common;

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::HashMap;
use common::*;

use abi::{Class::*, Direction::*};

#[test]
fn pod_egress_internal_internet_blocked() {
    let mut f = Fixture::with_policy();
    let internal = Ip::new(POD_IP, ip("10.1.2.3")).build();
    let internet = Ip::new(POD_IP, ip("203.0.113.9")).build();
    let metadata = Ip::new(POD_IP, ip("169.254.169.254")).build();
    assert_eq!(internal.len(), 142);

    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[
            (&internal, TC_ACT_UNSPEC),
            (&internal, TC_ACT_UNSPEC),
            (&internal, TC_ACT_UNSPEC),
            (&internet, TC_ACT_UNSPEC),
            (&metadata, TC_ACT_SHOT),
            (&metadata, TC_ACT_SHOT),
        ],
    );

    assert_eq!(
        f.counters(),
        expect(&[
            (Egress, Internal, c(3, 3 * 142)),
            (Egress, Internet, c(1, 142)),
            (Egress, Blocked, c(2, 2 * 142)),
        ])
    );
}

#[test]
fn pod_ingress_is_classed_on_the_source() {
    let mut f = Fixture::with_policy();
    // Destination is the pod; the remote end is the source.
    let from_internal = Ip::new(ip("10.3.3.3"), POD_IP).build();
    let from_internet = Ip::new(ip("198.51.100.7"), POD_IP).build();
    let from_blocked = Ip::new(ip("10.99.1.1"), POD_IP).build();
    // A packet *to* a blocked address seen on the ingress path is classed by its source.
    let to_blocked_from_internet = Ip::new(ip("198.51.100.7"), ip("169.254.169.254")).build();
    f.expect_verdicts(
        programs::HOST_EGRESS,
        &[
            (&from_internal, TC_ACT_UNSPEC),
            (&from_internet, TC_ACT_UNSPEC),
            (&from_blocked, TC_ACT_SHOT),
            (&to_blocked_from_internet, TC_ACT_UNSPEC),
        ],
    );
    assert_eq!(
        f.counters(),
        expect(&[
            (Ingress, Internal, c(1, 142)),
            (Ingress, Internet, c(2, 2 * 142)),
            (Ingress, Blocked, c(1, 142)),
        ])
    );
}

#[test]
fn most_specific_prefix_wins() {
    let mut f = Fixture::with_policy();
    // 10/8 internal, 10.99/16 blocked inside it, 10.99.7/24 internal inside that.
    let cases = [
        ("10.98.0.1", TC_ACT_UNSPEC, Internal),
        ("10.99.0.1", TC_ACT_SHOT, Blocked),
        ("10.99.7.200", TC_ACT_UNSPEC, Internal),
        ("10.99.8.1", TC_ACT_SHOT, Blocked),
        ("11.0.0.1", TC_ACT_UNSPEC, Internet),
        ("169.254.169.253", TC_ACT_UNSPEC, Internet),
    ];
    let mut want = abi::PodCounters::default();
    for (dst, verdict, class) in cases {
        let pkt = Ip::new(POD_IP, ip(dst)).build();
        assert_eq!(
            f.run(programs::HOST_INGRESS, &pkt, None).0,
            verdict,
            "dst {dst}"
        );
        want.dir[Egress.index()][class.index()] += c(1, pkt.len());
    }
    assert_eq!(f.counters(), want);
}

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
fn fragments_are_classed_by_address() {
    let mut f = Fixture::with_policy();
    // First fragment (MF, offset 0) and a later one (offset 185*8 bytes) whose payload is
    // mid-datagram data, not an L4 header.
    let first = Ip {
        frag: (true, 0),
        ..Ip::new(POD_IP, ip("203.0.113.5"))
    }
    .build();
    let later = Ip {
        frag: (false, 185),
        proto: 17,
        payload: vec![0xee; 60],
        ..Ip::new(POD_IP, ip("203.0.113.5"))
    }
    .build();
    let later_blocked = Ip {
        frag: (true, 370),
        proto: 17,
        payload: vec![0xee; 16],
        ..Ip::new(POD_IP, ip("10.99.200.1"))
    }
    .build();
    let later_internal = Ip {
        frag: (false, 1),
        proto: 6,
        payload: vec![0x01; 8],
        ..Ip::new(POD_IP, ip("10.4.0.1"))
    }
    .build();
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[
            (&first, TC_ACT_UNSPEC),
            (&later, TC_ACT_UNSPEC),
            (&later_blocked, TC_ACT_SHOT),
            (&later_internal, TC_ACT_UNSPEC),
        ],
    );
    assert_eq!(
        f.counters(),
        expect(&[
            (Egress, Internet, c(2, first.len() + later.len())),
            (Egress, Blocked, c(1, later_blocked.len())),
            (Egress, Internal, c(1, later_internal.len())),
        ])
    );
}

#[test]
fn gso_packets_count_every_segment() {
    let mut f = Fixture::with_policy();
    // One skb carrying 3 segments of 1000 bytes: eth 14 + ip 20 + tcp 32 = 66 header bytes
    // repeated on each wire packet.
    let pkt = tcp(POD_IP, ip("203.0.113.1"), 3000).build();
    assert_eq!(
        f.run(programs::HOST_INGRESS, &pkt, Some(&gso_ctx(3, 1000)))
            .0,
        TC_ACT_UNSPEC
    );
    assert_eq!(pkt.len(), 66 + 3000);
    assert_eq!(
        f.counters(),
        expect(&[(Egress, Internet, c(3, 3 * (66 + 1000)))])
    );
}

#[test]
fn policy_generation_switch_is_atomic() {
    let mut f = Fixture::new();
    f.prefix(0, (ip("203.0.113.0"), 24), abi::CLASS_INTERNAL);
    f.prefix(1, (ip("203.0.113.0"), 24), abi::CLASS_BLOCKED);
    let pkt = Ip::new(POD_IP, ip("203.0.113.10")).build();
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

#[test]
fn unregistered_device_is_enforced_but_not_counted() {
    let mut f = Fixture::with_policy();
    let mut pods: HashMap<_, u32, abi::Pod> = f.map(maps::PODS);
    pods.remove(&TEST_IFINDEX).expect("unregister");
    let blocked = Ip::new(POD_IP, ip("169.254.169.254")).build();
    let internet = Ip::new(POD_IP, ip("203.0.113.9")).build();
    f.expect_verdicts(
        programs::HOST_INGRESS,
        &[(&blocked, TC_ACT_SHOT), (&internet, TC_ACT_UNSPEC)],
    );
    assert_eq!(f.counters(), abi::PodCounters::default());
}

#[test]
fn pod_egress_selects_the_htb_class() {
    let mut f = Fixture::with_policy();
    f.prefix(0, (ip("203.0.113.128"), 25), abi::CLASS_NAMED);
    let ctx = prio_ctx(6);
    let internet = Ip::new(POD_IP, ip("203.0.113.1")).build();
    let internal = Ip::new(POD_IP, ip("10.1.1.1")).build();
    let blocked = Ip::new(POD_IP, ip("169.254.169.254")).build();
    let named = Ip::new(POD_IP, ip("203.0.113.200")).build();
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

#[test]
fn uplink_shapes_only_pod_internet_traffic_with_node_limits() {
    // Flow isolation is switched off (the benchmarks' object): see queue_model.rs.
    let mut f = Fixture::bench_with_policy();
    f.prefix(0, (ip("203.0.113.128"), 25), abi::CLASS_NAMED + 3);
    let ctx = prio_ctx(3);
    let pod_internet = Ip::new(POD_IP, ip("203.0.113.1")).build();
    let pod_named = Ip::new(POD_IP, ip("203.0.113.200")).build();
    let others = [
        // Internal traffic of a pod and anything the node itself sends keep their priority.
        Ip::new(POD_IP, ip("10.1.1.1")).build(),
        Ip::new(ip("10.20.0.6"), ip("203.0.113.1")).build(),
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
    let bulk_ctx = prio_ctx(3);
    // Every packet to the bulk leaves (flow isolation is tested in queue_model.rs).
    f.update_config(|c| c.flags |= abi::CFG_FLOWS_OFF);
    let gso = prio_ctx(3);
    for (pkt, want) in [
        (&pod_internet, abi::classid(group + abi::GROUP_SHARED)),
        (&pod_named, abi::classid(group + abi::GROUP_SHARED)),
    ] {
        let (ret, out) = f.run(programs::UPLINK, pkt, Some(&gso));
        assert_eq!(ret, TC_ACT_UNSPEC);
        assert_eq!(prio_of(&out), want, "{:x}", prio_of(&out));
    }
    for pkt in &others {
        assert_eq!(prio_of(&f.run(programs::UPLINK, pkt, Some(&bulk_ctx)).1), 3);
    }
    // With its own leaf, and a named class's group nested in the internet's.
    f.update_meta(|m| m.agg_leaves[1][abi::DIR_EGRESS] = 1 << abi::KIND_INTERNET);
    f.set_node_limit(Egress, abi::KIND_NAMED + 3, Some(SLOW / 2));
    let (_, out) = f.run(programs::UPLINK, &pod_internet, Some(&gso));
    assert_eq!(
        prio_of(&out),
        abi::classid(abi::agg_leaf(abi::KIND_INTERNET, SLOT))
    );
    let (_, out) = f.run(programs::UPLINK, &pod_named, Some(&gso));
    assert_eq!(
        prio_of(&out),
        abi::classid(abi::node_group(abi::KIND_NAMED + 3) + abi::GROUP_SHARED)
    );
    assert_eq!(f.node_counters()[abi::DIR_EGRESS].packets, 4);
}
