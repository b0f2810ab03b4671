//! IPv6 only: what a pod may send on its link. Its link-local source, the gateway's
//! link-local address, neighbour discovery and its budget.

use super::*;

/// What the pod's host veth did with `pkt` from the pod: its verdict, and the pod's
/// spoofed, link-budget (nd) and gateway drop counts after it.
fn from_the_pod(f: &mut Fixture, pkt: &[u8]) -> (u32, u64, u64, u64) {
    let (ret, _) = f.run_data(programs::HOST_INGRESS, pkt, None);
    let c = f.counters();
    (
        ret,
        c.spoofed.packets,
        c.dropped[abi::DROP_ND].packets,
        c.dropped[abi::DROP_GATEWAY].packets,
    )
}

#[test]
fn a_pod_speaks_on_the_link_only_from_its_own_link_local_address() {
    let mut f = Fixture::new();
    let solicited = ip6("ff02::1:ff00:1");
    // Its own link-local address, and the unspecified one (duplicate address detection).
    let own = neighbour_solicitation(POD_LL, solicited, GATEWAY_LL);
    let dad = neighbour_solicitation(ip6("::"), ip6("ff02::1:ff00:5"), POD_LL);
    // Its global address to the gateway (the kernel may pick it for a solicitation).
    let global = neighbour_solicitation(POD_IP6, GATEWAY_LL, GATEWAY_LL);
    for (pkt, what) in [(&own, "own"), (&dad, "DAD"), (&global, "global")] {
        let (ret, spoofed, ..) = from_the_pod(&mut f, pkt);
        assert_eq!((ret, spoofed), (TC_ACT_UNSPEC, 0), "{what}");
    }
    // Any other link-local source would take an entry of the node's neighbour table: the
    // flood that filled it (gc_thresh3) for the whole node.
    for (i, src) in [
        "fe80::6",
        "fe80::dead:beef",
        "fe80::1",
        "fe81::5",
        "febf::5",
    ]
    .iter()
    .enumerate()
    {
        let pkt = neighbour_solicitation(ip6(src), GATEWAY_LL, GATEWAY_LL);
        let (ret, spoofed, ..) = from_the_pod(&mut f, &pkt);
        assert_eq!((ret, spoofed), (TC_ACT_SHOT, i as u64 + 1), "{src}");
    }
    // A link-local source off the link is spoofed as before.
    let (ret, ..) = from_the_pod(&mut f, &Ip::new(POD_LL, ip6("2001:db8::10")).build());
    assert_eq!(ret, TC_ACT_SHOT);
    // A pod whose link-local address is unknown (attached by an older plugin) may use none.
    let mut pods: HashMap<_, u32, abi::Pod> = f.map(maps::PODS);
    let mut p = pods.get(&TEST_IFINDEX, 0).expect("pod");
    p.ipv6_ll = [0; 16];
    pods.insert(TEST_IFINDEX, p, 0).expect("update pod");
    assert_eq!(from_the_pod(&mut f, &own).0, TC_ACT_SHOT);
    assert_eq!(from_the_pod(&mut f, &dad).0, TC_ACT_UNSPEC);
}

#[test]
fn the_gateway_takes_from_a_pod_only_what_it_needs_of_the_link() {
    let mut f = Fixture::new();
    // Router and neighbour solicitation, neighbour advertisement, MLD reports, ICMPv6 errors.
    let needed = [
        (133, GATEWAY_LL),
        (135, GATEWAY_LL),
        (136, GATEWAY_LL),
        (143, ip6("ff02::16")),
        (131, ip6("ff02::1:3")),
        (132, ip6("ff02::2")),
        (1, GATEWAY_LL),
        (2, GATEWAY_LL),
        (3, GATEWAY_LL),
        (4, GATEWAY_LL),
    ];
    for (kind, dst) in needed {
        let (ret, _, nd, gw) = from_the_pod(&mut f, &icmp6(POD_LL, dst, kind, &[0; 4]).build());
        assert_eq!((ret, nd, gw), (TC_ACT_UNSPEC, 0, 0), "ICMPv6 type {kind}");
    }
    // The node's own services on its link-local address: a kubelet port, a DNS query, a
    // ping; multicast services (mDNS, LLMNR); from the pod's global address too.
    let mut kubelet = tcp(POD_LL, GATEWAY_LL, 0);
    kubelet.payload[2..4].copy_from_slice(&10250u16.to_be_bytes());
    let mut dns = Ip::new(POD_IP6, GATEWAY_LL);
    dns.proto = 17;
    dns.payload = vec![0x9c, 0x40, 0, 53, 0, 8, 0, 0];
    let mut mdns = Ip::new(POD_LL, ip6("ff02::fb"));
    mdns.proto = 17;
    mdns.payload = vec![0x14, 0xe9, 0x14, 0xe9, 0, 8, 0, 0];
    let denied = [
        (kubelet.build(), "TCP to the gateway"),
        (
            dns.build(),
            "UDP to the gateway from the pod's global address",
        ),
        (
            Ip::new(POD_LL, GATEWAY_LL).build(),
            "echo request to the gateway",
        ),
        (mdns.build(), "mDNS"),
        (
            icmp6(POD_LL, GATEWAY_LL, 134, &[0; 4]).build(),
            "router advertisement",
        ),
        (icmp6(POD_LL, GATEWAY_LL, 137, &[0; 4]).build(), "redirect"),
    ];
    for (i, (pkt, what)) in denied.iter().enumerate() {
        let (ret, spoofed, nd, gw) = from_the_pod(&mut f, pkt);
        assert_eq!(
            (ret, spoofed, nd, gw),
            (TC_ACT_SHOT, 0, 0, i as u64 + 1),
            "{what}"
        );
    }
    // A fragmented solicitation hides its type from a fragment that follows: dropped.
    let frag = Ip {
        ext: vec![ext_frag(0, true)],
        ..icmp6(POD_LL, GATEWAY_LL, 135, &[0; 4])
    };
    let (ret, _, _, gw) = from_the_pod(&mut f, &frag.build());
    assert_eq!((ret, gw), (TC_ACT_SHOT, denied.len() as u64 + 1));
    // Pod-to-pod and internet traffic is not the link's: untouched.
    let (ret, _, nd, gw) = from_the_pod(&mut f, &Ip::new(POD_IP6, ip6("2001:db8::10")).build());
    assert_eq!((ret, nd, gw), (TC_ACT_UNSPEC, 0, denied.len() as u64 + 1));
}

#[test]
fn neighbour_discovery_beyond_the_pods_budget_is_dropped_and_counted() {
    let mut f = Fixture::new();
    let ns = neighbour_solicitation(POD_LL, ip6("ff02::1:ff00:1"), GATEWAY_LL);
    let sent = 3 * abi::ND_BURST;
    let mut passed = 0;
    for _ in 0..sent {
        if f.run_data(programs::HOST_INGRESS, &ns, None).0 == TC_ACT_UNSPEC {
            passed += 1;
        }
    }
    // The burst, and what the rate refilled while the test ran (milliseconds: at most one
    // or two more).
    assert!(
        (abi::ND_BURST..abi::ND_BURST + 3).contains(&passed),
        "{passed} of {sent} passed"
    );
    let c = f.counters();
    assert_eq!(c.dropped[abi::DROP_ND].packets, sent - passed);
    assert_eq!(c.spoofed.packets, 0);
    // Another pod's budget is its own.
    let mut rt: aya::maps::Array<_, abi::PodRt> = f.map(maps::POD_RT);
    assert!(rt.get(&SLOT, 0).expect("pod rt").nd_tat > 0);
    assert_eq!(rt.get(&(SLOT + 1), 0).expect("pod rt").nd_tat, 0);
    // Refilled at its rate: a pod whose budget was spent sends again a while later.
    rt.set(SLOT, abi::PodRt::default(), 0).expect("reset");
    assert_eq!(
        f.run_data(programs::HOST_INGRESS, &ns, None).0,
        TC_ACT_UNSPEC
    );
}
