//! `BPF_PROG_TEST_RUN` tests of the datapath programs on packets built here.
//!
//! Needs root (loads BPF programs); touches no network state: test runs use the
//! loopback device of the test's own network namespace as `skb->dev`, so the
//! "pod" is registered under ifindex 1. Maps are private to each test (not pinned).

mod common;

use std::net::Ipv4Addr;

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::{Array, HashMap};
use common::*;

use abi::{Class::*, Direction::*};

// ---- tests ----------------------------------------------------------------------------

#[test]
fn pod_egress_internal_internet_blocked() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    let internal = Ip::new(POD_IP, ip("10.1.2.3")).build();
    let internet = Ip::new(POD_IP, ip("203.0.113.9")).build();
    let metadata = Ip::new(POD_IP, ip("169.254.169.254")).build();
    assert_eq!(internal.len(), 142);

    for _ in 0..3 {
        assert_eq!(
            f.run(programs::HOST_INGRESS, &internal, None).0,
            TC_ACT_UNSPEC
        );
    }
    assert_eq!(
        f.run(programs::HOST_INGRESS, &internet, None).0,
        TC_ACT_UNSPEC
    );
    assert_eq!(
        f.run(programs::HOST_INGRESS, &metadata, None).0,
        TC_ACT_SHOT
    );
    assert_eq!(
        f.run(programs::HOST_INGRESS, &metadata, None).0,
        TC_ACT_SHOT
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
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    // Destination is the pod; the remote end is the source.
    let from_internal = Ip::new(ip("10.3.3.3"), POD_IP).build();
    let from_internet = Ip::new(ip("198.51.100.7"), POD_IP).build();
    let from_blocked = Ip::new(ip("10.99.1.1"), POD_IP).build();
    assert_eq!(
        f.run(programs::HOST_EGRESS, &from_internal, None).0,
        TC_ACT_UNSPEC
    );
    assert_eq!(
        f.run(programs::HOST_EGRESS, &from_internet, None).0,
        TC_ACT_UNSPEC
    );
    assert_eq!(
        f.run(programs::HOST_EGRESS, &from_blocked, None).0,
        TC_ACT_SHOT
    );
    // A packet *to* a blocked address seen on the ingress path is classed by its source.
    let to_blocked_from_internet = Ip::new(ip("198.51.100.7"), ip("169.254.169.254")).build();
    assert_eq!(
        f.run(programs::HOST_EGRESS, &to_blocked_from_internet, None)
            .0,
        TC_ACT_UNSPEC
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
    if !require_root() {
        return;
    }
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
    if !require_root() {
        return;
    }
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
    assert_eq!(
        f.run(programs::HOST_INGRESS, &internet, None).0,
        TC_ACT_UNSPEC
    );
    assert_eq!(f.run(programs::HOST_INGRESS, &blocked, None).0, TC_ACT_SHOT);
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
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    let arp = arp_request();
    // IPv6 header (40 bytes) + 8 bytes: not classified (the pods are IPv4 only).
    let mut v6 = eth(0x86dd);
    v6.extend_from_slice(&[0x60, 0, 0, 0, 0, 8, 17, 64]);
    v6.extend_from_slice(&[0u8; 40]);
    // Ethertype says IPv4 but the header is bad (IHL 3): the stack drops it, we pass it.
    let mut bad = Ip::new(POD_IP, ip("169.254.169.254")).build();
    bad[ETH_HLEN] = 0x43;
    assert_eq!(f.run(programs::HOST_INGRESS, &arp, None).0, TC_ACT_UNSPEC);
    assert_eq!(f.run(programs::HOST_EGRESS, &arp, None).0, TC_ACT_UNSPEC);
    assert_eq!(f.run(programs::HOST_INGRESS, &v6, None).0, TC_ACT_UNSPEC);
    assert_eq!(f.run(programs::HOST_INGRESS, &bad, None).0, TC_ACT_UNSPEC);
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
    if !require_root() {
        return;
    }
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
    assert_eq!(f.run(programs::HOST_INGRESS, &first, None).0, TC_ACT_UNSPEC);
    assert_eq!(f.run(programs::HOST_INGRESS, &later, None).0, TC_ACT_UNSPEC);
    assert_eq!(
        f.run(programs::HOST_INGRESS, &later_blocked, None).0,
        TC_ACT_SHOT
    );
    assert_eq!(
        f.run(programs::HOST_INGRESS, &later_internal, None).0,
        TC_ACT_UNSPEC
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
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    // One skb carrying 3 segments of 1000 bytes: eth 14 + ip 20 + tcp 32 = 66 header bytes
    // repeated on each wire packet.
    let pkt = tcp(POD_IP, ip("203.0.113.1"), 3000).build();
    let mut ctx = [0u8; SKB_SIZE];
    ctx[SKB_GSO_SEGS..SKB_GSO_SEGS + 4].copy_from_slice(&3u32.to_ne_bytes());
    ctx[SKB_GSO_SIZE..SKB_GSO_SIZE + 4].copy_from_slice(&1000u32.to_ne_bytes());
    assert_eq!(
        f.run(programs::HOST_INGRESS, &pkt, Some(&ctx)).0,
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
    if !require_root() {
        return;
    }
    let mut f = Fixture::new();
    f.prefix(0, (ip("203.0.113.0"), 24), abi::CLASS_INTERNAL);
    f.prefix(1, (ip("203.0.113.0"), 24), abi::CLASS_BLOCKED);
    let pkt = Ip::new(POD_IP, ip("203.0.113.10")).build();
    assert_eq!(f.run(programs::HOST_INGRESS, &pkt, None).0, TC_ACT_UNSPEC);
    f.set_config(1);
    assert_eq!(f.run(programs::HOST_INGRESS, &pkt, None).0, TC_ACT_SHOT);
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
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    let mut pods: HashMap<_, u32, abi::Pod> = f.map(maps::PODS);
    pods.remove(&TEST_IFINDEX).expect("unregister");
    let blocked = Ip::new(POD_IP, ip("169.254.169.254")).build();
    let internet = Ip::new(POD_IP, ip("203.0.113.9")).build();
    assert_eq!(f.run(programs::HOST_INGRESS, &blocked, None).0, TC_ACT_SHOT);
    assert_eq!(
        f.run(programs::HOST_INGRESS, &internet, None).0,
        TC_ACT_UNSPEC
    );
    assert_eq!(f.counters(), abi::PodCounters::default());
}

#[test]
fn pod_egress_selects_the_htb_class() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    let prio = |ctx: &[u8; SKB_SIZE]| {
        u32::from_ne_bytes(
            ctx[SKB_PRIORITY..SKB_PRIORITY + 4]
                .try_into()
                .expect("4 bytes"),
        )
    };
    let mut ctx = [0u8; SKB_SIZE];
    ctx[SKB_PRIORITY..SKB_PRIORITY + 4].copy_from_slice(&6u32.to_ne_bytes());
    // No limit in the pod's record: every packet names its class's bulk leaf.
    let cases = [
        (
            Ip::new(POD_IP, ip("203.0.113.1")).build(),
            abi::CLASSID_POD_INTERNET + abi::LEAF_BULK,
        ),
        (
            Ip::new(POD_IP, ip("10.1.1.1")).build(),
            abi::CLASSID_POD_OTHER + abi::LEAF_BULK,
        ),
        (
            Ip::new(POD_IP, ip("169.254.169.254")).build(),
            abi::CLASSID_POD_OTHER + abi::LEAF_BULK,
        ),
        (arp_request(), abi::CLASSID_POD_OTHER + abi::LEAF_BULK),
    ];
    for (pkt, want) in cases {
        let (ret, out) = f.run(programs::POD_EGRESS, &pkt, Some(&ctx));
        assert_eq!(ret, TC_ACT_UNSPEC, "the pod-side program never drops");
        assert_eq!(prio(&out), want);
    }
    // It only selects; counting happens once, on the host side.
    assert_eq!(f.counters(), abi::PodCounters::default());
}

#[test]
fn uplink_caps_only_pod_internet_traffic() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    let prio = |ctx: &[u8; SKB_SIZE]| {
        u32::from_ne_bytes(
            ctx[SKB_PRIORITY..SKB_PRIORITY + 4]
                .try_into()
                .expect("4 bytes"),
        )
    };
    let mut ctx = [0u8; SKB_SIZE];
    ctx[SKB_PRIORITY..SKB_PRIORITY + 4].copy_from_slice(&3u32.to_ne_bytes());
    let pod_internet = Ip::new(POD_IP, ip("203.0.113.1")).build();
    let cases = [
        // No cap configured: the bulk leaf (there is no HTB then).
        (pod_internet.clone(), abi::CLASSID_NODE_CAP + abi::LEAF_BULK),
        // Internal traffic of a pod and anything the node itself sends keep their priority.
        (Ip::new(POD_IP, ip("10.1.1.1")).build(), 3),
        (Ip::new(ip("10.20.0.6"), ip("203.0.113.1")).build(), 3),
        (arp_request(), 3),
    ];
    for (pkt, want) in cases {
        let (ret, out) = f.run(programs::UPLINK, &pkt, Some(&ctx));
        assert_eq!(ret, TC_ACT_UNSPEC);
        assert_eq!(prio(&out), want);
    }
    assert_eq!(f.node_counters().capped, c(1, pod_internet.len()));
}

// ---- ECN marking above a shaped class's modelled queue ---------------------------------

const NOT_ECT: u8 = 0;
const ECT1: u8 = 1;
const ECT0: u8 = 2;
const CE: u8 = 3;
/// 1 Mbit/s: one full frame takes 12.1 ms, so the model's steps are far above the time a
/// test run takes, and the marking threshold is 2 frames (24.2 ms).
const SLOW: u64 = 1_000_000;

/// A full-size TCP frame (1514 bytes on the wire) with the given ECN codepoint.
fn frame(src: Ipv4Addr, dst: Ipv4Addr, ecn: u8) -> Vec<u8> {
    let p = Ip {
        tos: 0x20 | ecn, // some DSCP, which marking must keep
        ..tcp(src, dst, 1448)
    }
    .build();
    assert_eq!(p.len(), 1514);
    p
}

/// The ECN bits of a frame, checking that its IPv4 header checksum is still valid.
fn ecn_of(pkt: &[u8]) -> u8 {
    let h = &pkt[ETH_HLEN..ETH_HLEN + 20];
    assert_eq!(csum(h), 0, "IPv4 header checksum broken");
    assert_eq!(h[1] & 0xfc, 0x20, "DSCP changed");
    h[1] & 3
}

/// Sends `n` frames back to back through `prog`; returns the ECN bits each left with.
fn burst(f: &Fixture, prog: &str, pkt: &[u8], n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            let (ret, out) = f.run_data(prog, pkt, None);
            assert_eq!(ret, TC_ACT_UNSPEC);
            ecn_of(&out)
        })
        .collect()
}

#[test]
fn ingress_limit_ce_marks_ect_packets_above_the_modelled_queue() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    f.update_meta(|m| m.ingress_rate = SLOW);
    let from_internet = ip("203.0.113.9");
    let ect = frame(from_internet, POD_IP, ECT0);

    // The class's HTB burst (4 frames at this rate) leaves at once: the model gives it as
    // credit. After it, back to back at 1 Mbit/s each frame adds 12.1 ms to the modelled
    // queue: the next three wait 0, 1 and 2 frames, never above the 24.2 ms (2 frames) mark.
    let got = burst(&f, programs::HOST_EGRESS, &ect, 12);
    assert_eq!(&got[..7], &[ECT0; 7], "marked below the threshold: {got:?}");
    // From the eighth on the modelled wait is above 2 frames (less whatever time the test
    // runs took, which is far below a frame).
    assert_eq!(
        &got[8..],
        &[CE; 4],
        "not marked above the threshold: {got:?}"
    );
    let marked = got.iter().filter(|&&e| e == CE).count() as u64;

    // With the queue full: ECT(1) is marked as well, Not-ECT cannot be and passes as is,
    // an already-CE packet stays CE and is not counted again.
    let got = burst(
        &f,
        programs::HOST_EGRESS,
        &frame(from_internet, POD_IP, ECT1),
        1,
    );
    assert_eq!(got, [CE]);
    // Its sender is remote: a Not-ECT packet is never dropped here, only left as it is.
    let got = burst(
        &f,
        programs::HOST_EGRESS,
        &frame(from_internet, POD_IP, NOT_ECT),
        1,
    );
    assert_eq!(got, [NOT_ECT]);
    let got = burst(
        &f,
        programs::HOST_EGRESS,
        &frame(from_internet, POD_IP, CE),
        1,
    );
    assert_eq!(got, [CE]);

    let vq = f.vqueue(abi::vq_index(SLOT, abi::VQ_INGRESS));
    assert_eq!(vq.ce_marked, marked + 1);
    // Marking does not change what is counted.
    assert_eq!(
        f.counters(),
        expect(&[(Ingress, Internet, c(15, 15 * 1514))])
    );
    // The pod's egress direction has no ingress limit and no queue.
    let got = burst(
        &f,
        programs::HOST_INGRESS,
        &frame(POD_IP, from_internet, ECT0),
        10,
    );
    assert_eq!(got, [ECT0; 10]);
}

#[test]
fn the_queue_model_counts_in_the_devices_frames() {
    if !require_root() {
        return;
    }
    // A pod on a jumbo-frame MTU: its credit, marking threshold and queue limit are in its
    // own frames. With 1514-byte floors every jumbo frame would be over the threshold.
    // (BPF_PROG_TEST_RUN takes at most a page per packet: a 3000-byte MTU stands for 9000.)
    let mut f = Fixture::with_policy();
    f.update_meta(|m| {
        m.ingress_rate = SLOW;
        m.frame = 3014;
    });
    let jumbo = Ip {
        tos: 0x20 | ECT0,
        ..tcp(ip("203.0.113.9"), POD_IP, 2948)
    }
    .build();
    assert_eq!(jumbo.len(), 3014);
    // Credit: four of the class's 1514-byte segments (6056 bytes, two of these frames); mark
    // above two frames. Back to back the first four wait at most two frames, from the sixth
    // on each waits longer.
    let got = burst(&f, programs::HOST_EGRESS, &jumbo, 12);
    assert_eq!(&got[..4], &[ECT0; 4], "marked below the threshold: {got:?}");
    assert_eq!(&got[5..], &[CE; 7], "not marked above it: {got:?}");
}

#[test]
fn the_window_clamp_floor_is_in_the_classs_segments() {
    if !require_root() {
        return;
    }
    // 1 Mbit/s on a 9000-byte MTU: rate x (RTT + 16 ms) is 2 kB, below one segment; the
    // floor is WND_MIN_FRAMES of the segments the class asks for (1514-byte frames here, see
    // the MSS test), not of the device's 9014-byte frames, which would overflow its queue.
    let rate = SLOW;
    let mut f = clamping_fixture(rate);
    f.update_meta(|m| m.frame = 9014);
    pod_connects(&f, Some(7), Some(7));
    let c = conn(&mut f).expect("conn");
    assert_eq!(c.state, abi::CONN_ESTABLISHED);
    let want = clamped_with(rate, &c, 1, 1514);
    assert_eq!(
        u64::from(want) << c.wscale,
        (abi::WND_MIN_FRAMES * 1514).next_multiple_of(1 << c.wscale)
    );
    let (_, out) = f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg(true, ACK, 65535, None),
        None,
    );
    assert_eq!(window_of(&out), want);
}

#[test]
fn a_gso_packet_is_queued_as_all_its_segments() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    f.update_meta(|m| m.ingress_rate = SLOW);
    let idx = abi::vq_index(SLOT, abi::VQ_INGRESS);
    // A first frame puts the model in its steady state (the queue is not idle any more).
    burst(
        &f,
        programs::HOST_EGRESS,
        &frame(ip("203.0.113.9"), POD_IP, ECT0),
        1,
    );
    let before = f.vqueue(idx).t_empty;
    // One skb carrying 3 segments of 1000 bytes: 3 wire frames of 66 + 1000 bytes.
    let gso = Ip {
        tos: 0x20 | ECT0,
        ..tcp(ip("203.0.113.9"), POD_IP, 3000)
    }
    .build();
    let mut ctx = [0u8; SKB_SIZE];
    ctx[SKB_GSO_SEGS..SKB_GSO_SEGS + 4].copy_from_slice(&3u32.to_ne_bytes());
    ctx[SKB_GSO_SIZE..SKB_GSO_SIZE + 4].copy_from_slice(&1000u32.to_ne_bytes());
    f.run_data(programs::HOST_EGRESS, &gso, Some(&ctx));
    // It occupies the class for the time of 3 * 1066 bytes at 1 Mbit/s, not of skb->len.
    let added = f.vqueue(idx).t_empty - before;
    assert_eq!(added, 3 * 1066 * 8 * 1_000_000_000 / SLOW);
}

#[test]
fn no_marking_without_a_limit_or_with_ecn_off() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    let ect = frame(ip("203.0.113.9"), POD_IP, ECT0);
    // No ingress limit: nothing is queued, nothing marked.
    assert_eq!(burst(&f, programs::HOST_EGRESS, &ect, 10), [ECT0; 10]);
    // A limit, but marking switched off in an_config.flags: the model still runs (flow
    // isolation needs it) but signals nothing.
    f.update_meta(|m| m.ingress_rate = SLOW);
    f.update_config(|c| c.flags |= abi::CFG_AQM_OFF);
    assert_eq!(burst(&f, programs::HOST_EGRESS, &ect, 10), [ECT0; 10]);
    let q = f.vqueue(abi::vq_index(SLOT, abi::VQ_INGRESS));
    assert!(q.t_empty > 0);
    assert_eq!((q.ce_marked, q.dropped), (0, 0));
    // Switched back on, the same traffic is marked.
    f.update_config(|c| c.flags &= !abi::CFG_AQM_OFF);
    assert!(burst(&f, programs::HOST_EGRESS, &ect, 10).contains(&CE));
}

#[test]
fn pod_egress_marks_against_its_internet_and_total_limits() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    f.update_meta(|m| m.internet_egress_rate = SLOW);
    let internet = frame(POD_IP, ip("203.0.113.9"), ECT0);
    let internal = frame(POD_IP, ip("10.1.2.3"), ECT0);
    // Internal traffic is not limited (no total egress limit): never marked.
    assert_eq!(burst(&f, programs::POD_EGRESS, &internal, 10), [ECT0; 10]);
    // The pod side's FIFO leaf lets the class burst (4 frames at this rate) through at
    // once: the model gives that much credit, so marking starts later than on the host side.
    let got = burst(&f, programs::POD_EGRESS, &internet, 8);
    assert_eq!(&got[..6], &[ECT0; 6], "{got:?}");
    assert_eq!(got[7], CE, "{got:?}");
    let internet_marks = got.iter().filter(|&&e| e == CE).count() as u64;
    assert_eq!(
        f.vqueue(abi::vq_index(SLOT, abi::VQ_INTERNET)).ce_marked,
        internet_marks
    );
    assert_eq!(
        f.vqueue(abi::vq_index(SLOT, abi::VQ_EGRESS)),
        abi::VQueue::default()
    );

    // With the class congested, what cannot be marked goes to the leaf queue: a ping, a
    // pure ACK, a Not-ECT UDP datagram, and a Not-ECT TCP data segment whose socket has
    // nothing in flight (the socket a test run attaches is not a TCP socket). Only a local
    // TCP sender with segments in flight is dropped, which the netns tests show.
    let tcp_data = frame(POD_IP, ip("203.0.113.9"), NOT_ECT);
    let ping = Ip::new(POD_IP, ip("203.0.113.9")).build();
    let ack = tcp(POD_IP, ip("203.0.113.9"), 0).build();
    let udp = Ip {
        proto: 17,
        payload: vec![0x55; 1000],
        ..Ip::new(POD_IP, ip("203.0.113.9"))
    }
    .build();
    for pkt in [&ping, &ack, &udp, &tcp_data] {
        assert_eq!(f.run_data(programs::POD_EGRESS, pkt, None).0, TC_ACT_UNSPEC);
    }
    assert_eq!(f.vqueue(abi::vq_index(SLOT, abi::VQ_INTERNET)).dropped, 0);

    // A total egress limit queues internal traffic as well.
    f.update_meta(|m| m.egress_rate = SLOW);
    let got = burst(&f, programs::POD_EGRESS, &internal, 8);
    assert_eq!(got[7], CE, "{got:?}");
    assert!(f.vqueue(abi::vq_index(SLOT, abi::VQ_EGRESS)).ce_marked >= 1);
    // Marking never changes the class the packet is shaped in (the flow is backlogged: bulk).
    let mut ctx = [0u8; SKB_SIZE];
    ctx[SKB_PRIORITY..SKB_PRIORITY + 4].copy_from_slice(&6u32.to_ne_bytes());
    let (_, ctx_out) = f.run(programs::POD_EGRESS, &internet, Some(&ctx));
    assert_eq!(
        u32::from_ne_bytes(ctx_out[SKB_PRIORITY..SKB_PRIORITY + 4].try_into().unwrap()),
        abi::CLASSID_POD_INTERNET + abi::LEAF_BULK
    );
}

#[test]
fn uplink_marks_above_the_node_cap() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    f.update_config(|c| c.node_internet_cap = SLOW);
    let got = burst(
        &f,
        programs::UPLINK,
        &frame(POD_IP, ip("203.0.113.9"), ECT0),
        8,
    );
    assert_eq!(&got[..3], &[ECT0; 3], "{got:?}");
    assert_eq!(got[7], CE, "{got:?}");
    // Traffic that is not the pods' internet traffic is not in the cap class.
    let other = frame(ip("10.20.0.6"), ip("203.0.113.9"), ECT0);
    assert_eq!(burst(&f, programs::UPLINK, &other, 10), [ECT0; 10]);
    assert!(f.vqueue(abi::VQ_NODE_CAP).ce_marked >= 1);
}

// ---- flow isolation: sparse and bulk leaves of a shaped class ----------------------------

fn prio_of(ctx: &[u8; SKB_SIZE]) -> u32 {
    u32::from_ne_bytes(
        ctx[SKB_PRIORITY..SKB_PRIORITY + 4]
            .try_into()
            .expect("4 bytes"),
    )
}

const INGRESS_SPARSE: u32 = abi::CLASSID_POD_INGRESS + abi::LEAF_SPARSE;
const INGRESS_BULK: u32 = abi::CLASSID_POD_INGRESS + abi::LEAF_BULK;

/// The flow buckets of one shaped class.
fn flows_of(f: &mut Fixture, vq_idx: u32) -> Vec<(u32, abi::Flow)> {
    let m: Array<_, abi::Flow> = f.map(maps::FLOWS);
    (vq_idx * abi::FLOW_BUCKETS..(vq_idx + 1) * abi::FLOW_BUCKETS)
        .map(|k| (k, m.get(&k, 0).expect("flow bucket")))
        .collect()
}

fn set_flows(f: &mut Fixture, vq_idx: u32, edit: impl Fn(&mut abi::Flow)) {
    let flows = flows_of(f, vq_idx);
    let mut m: Array<_, abi::Flow> = f.map(maps::FLOWS);
    for (k, mut v) in flows {
        edit(&mut v);
        m.set(k, v, 0).expect("set flow bucket");
    }
}

#[test]
fn a_shaped_class_serves_sparse_flows_first_and_never_reorders_a_flow() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    f.update_meta(|m| m.ingress_rate = SLOW);
    let idx = abi::vq_index(SLOT, abi::VQ_INGRESS);
    let bulk = frame(ip("203.0.113.9"), POD_IP, NOT_ECT);
    let ping = Ip::new(ip("203.0.113.10"), POD_IP).build();
    let leaf = |f: &Fixture, pkt: &[u8]| {
        let (ret, ctx) = f.run(programs::HOST_EGRESS, pkt, None);
        assert_eq!(ret, TC_ACT_UNSPEC);
        prio_of(&ctx)
    };

    // A flow's first packets fit its budget of 2 full frames: a new connection starts in
    // the sparse leaf, as in fq_codel. The third full frame back to back does not.
    let got: Vec<u32> = (0..6).map(|_| leaf(&f, &bulk)).collect();
    assert_eq!(
        got,
        [
            INGRESS_SPARSE,
            INGRESS_SPARSE,
            INGRESS_BULK,
            INGRESS_BULK,
            INGRESS_BULK,
            INGRESS_BULK
        ]
    );
    // Another flow with nothing queued (a ping) is still sparse, again and again.
    for _ in 0..5 {
        assert_eq!(leaf(&f, &ping), INGRESS_SPARSE);
    }
    // Every packet, sparse or bulk, takes its share of the class's rate in the model.
    let t_empty = f.vqueue(idx).t_empty;
    assert!(t_empty > 0);

    // Refill every bucket's budget, but keep the bulk flow's queued packets: it stays in
    // the bulk leaf, since a sparse packet would overtake them (reordering).
    set_flows(&mut f, idx, |v| v.t_sparse = 0);
    assert_eq!(leaf(&f, &bulk), INGRESS_BULK);
    // Once its packets have left the bulk leaf (the model says when), it may be sparse again.
    set_flows(&mut f, idx, |v| {
        v.t_sparse = 0;
        v.t_bulk = 0;
    });
    assert_eq!(leaf(&f, &bulk), INGRESS_SPARSE);

    // A GSO skb larger than the budget (3 segments of 1066 bytes on the wire) is bulk.
    set_flows(&mut f, idx, |v| *v = abi::Flow::default());
    let gso = tcp(ip("203.0.113.9"), POD_IP, 3000).build();
    let mut ctx = [0u8; SKB_SIZE];
    ctx[SKB_GSO_SEGS..SKB_GSO_SEGS + 4].copy_from_slice(&3u32.to_ne_bytes());
    ctx[SKB_GSO_SIZE..SKB_GSO_SIZE + 4].copy_from_slice(&1000u32.to_ne_bytes());
    let (_, out) = f.run(programs::HOST_EGRESS, &gso, Some(&ctx));
    assert_eq!(prio_of(&out), INGRESS_BULK);

    // Flow isolation switched off: everything goes to the bulk leaf.
    f.update_config(|c| c.flags |= abi::CFG_FLOWS_OFF);
    set_flows(&mut f, idx, |v| *v = abi::Flow::default());
    assert_eq!(leaf(&f, &ping), INGRESS_BULK);
    assert_eq!(leaf(&f, &bulk), INGRESS_BULK);
    // Without an ingress limit the program leaves the priority alone (no HTB to pick in).
    f.update_config(|c| c.flags &= !abi::CFG_FLOWS_OFF);
    f.update_meta(|m| m.ingress_rate = 0);
    assert_eq!(leaf(&f, &ping), 0);
}

#[test]
fn every_shaping_point_picks_a_leaf_of_its_class() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    let prio = |f: &Fixture, prog: &str, pkt: &[u8]| prio_of(&f.run(prog, pkt, None).1);
    let internet_ping = Ip::new(POD_IP, ip("203.0.113.1")).build();
    let internal_ping = Ip::new(POD_IP, ip("10.1.1.1")).build();

    // Pod eth0, internet limit only: internet pings are sparse in 1:10; internal traffic
    // names 1:20's bulk leaf, which does not exist, so HTB sends it unshaped.
    f.update_meta(|m| m.internet_egress_rate = SLOW);
    assert_eq!(
        prio(&f, programs::POD_EGRESS, &internet_ping),
        abi::CLASSID_POD_INTERNET + abi::LEAF_SPARSE
    );
    assert_eq!(
        prio(&f, programs::POD_EGRESS, &internal_ping),
        abi::CLASSID_POD_OTHER + abi::LEAF_BULK
    );
    // A burst of one internet flow moves to the bulk leaf.
    let data = frame(POD_IP, ip("203.0.113.9"), NOT_ECT);
    let got: Vec<u32> = (0..4)
        .map(|_| prio(&f, programs::POD_EGRESS, &data))
        .collect();
    assert_eq!(
        got[3],
        abi::CLASSID_POD_INTERNET + abi::LEAF_BULK,
        "{got:x?}"
    );
    // With a total egress limit, internal traffic is shaped in 1:20 and isolated too.
    f.update_meta(|m| m.egress_rate = SLOW);
    assert_eq!(
        prio(&f, programs::POD_EGRESS, &internal_ping),
        abi::CLASSID_POD_OTHER + abi::LEAF_SPARSE
    );

    // The uplink's node cap class.
    f.update_config(|c| c.node_internet_cap = SLOW);
    assert_eq!(
        prio(&f, programs::UPLINK, &internet_ping),
        abi::CLASSID_NODE_CAP + abi::LEAF_SPARSE
    );
    let got: Vec<u32> = (0..4).map(|_| prio(&f, programs::UPLINK, &data)).collect();
    assert_eq!(got[3], abi::CLASSID_NODE_CAP + abi::LEAF_BULK, "{got:x?}");
}

// ---- receive-window clamping for pods with an ingress limit ------------------------------

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const POD_PORT: u16 = 40000;
const REMOTE_PORT: u16 = 443;

/// A TCP segment with a valid checksum. `ws`: a window-scale option (after MSS, SACK
/// permitted, timestamps and a NOP, as Linux orders them in a SYN).
fn tcp_seg(from_pod: bool, flags: u8, window: u16, ws: Option<u8>) -> Vec<u8> {
    tcp_seg_mss(from_pod, flags, window, ws, 1460)
}

/// `tcp_seg` with the MSS option (SYNs only) set to `mss`.
fn tcp_seg_mss(from_pod: bool, flags: u8, window: u16, ws: Option<u8>, mss: u16) -> Vec<u8> {
    let (src, dst, sport, dport) = if from_pod {
        (POD_IP, ip("203.0.113.9"), POD_PORT, REMOTE_PORT)
    } else {
        (ip("203.0.113.9"), POD_IP, REMOTE_PORT, POD_PORT)
    };
    let mut opts = Vec::new();
    if flags & SYN != 0 {
        let m = mss.to_be_bytes();
        opts.extend_from_slice(&[2, 4, m[0], m[1], 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0]);
        if let Some(s) = ws {
            opts.extend_from_slice(&[1, 3, 3, s]);
        } else {
            opts.extend_from_slice(&[1, 1, 1, 1]);
        }
    } else {
        opts.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 2, 0, 0, 0, 1]);
    }
    let mut seg = vec![0u8; 20];
    seg[0..2].copy_from_slice(&sport.to_be_bytes());
    seg[2..4].copy_from_slice(&dport.to_be_bytes());
    seg[4..8].copy_from_slice(&1000u32.to_be_bytes());
    seg[8..12].copy_from_slice(&2000u32.to_be_bytes());
    seg[12] = (((20 + opts.len()) / 4) << 4) as u8;
    seg[13] = flags;
    seg[14..16].copy_from_slice(&window.to_be_bytes());
    seg.extend(opts);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(&seg);
    let c = csum(&pseudo);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    Ip {
        proto: 6,
        payload: seg,
        ..Ip::new(src, dst)
    }
    .build()
}

/// The TCP window of a frame built by `tcp_seg`, checking its TCP checksum.
fn window_of(pkt: &[u8]) -> u16 {
    let ip = &pkt[ETH_HLEN..];
    let seg = &ip[20..];
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&ip[12..20]);
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(seg);
    assert_eq!(csum(&pseudo), 0, "TCP checksum broken");
    u16::from_be_bytes([seg[14], seg[15]])
}

fn set_pod_flags(f: &mut Fixture, flags: u32) {
    let mut pods: HashMap<_, u32, abi::Pod> = f.map(maps::PODS);
    pods.insert(
        TEST_IFINDEX,
        abi::Pod {
            slot: SLOT,
            flags,
            ipv4: POD_IP.octets(),
            ..Default::default()
        },
        0,
    )
    .expect("register pod");
}

fn conn(f: &mut Fixture) -> Option<abi::Conn> {
    let m: HashMap<_, abi::ConnKey, abi::Conn> = f.map(maps::CONNS);
    m.get(
        &abi::ConnKey {
            pod_addr: POD_IP.octets(),
            remote_addr: ip("203.0.113.9").octets(),
            pod_port: POD_PORT.to_be_bytes(),
            remote_port: REMOTE_PORT.to_be_bytes(),
        },
        0,
    )
    .ok()
}

/// The window field the clamp writes for a connection: rate x RTT + 16 ms of the rate (at
/// least `WND_MIN_FRAMES` of the pod's frames), shared by `flows` (at least
/// `WND_MIN_FLOW_FRAMES` frames each), in units of the pod's window scale, rounded up.
fn clamped_with(rate: u64, c: &abi::Conn, flows: u64, frame: u64) -> u16 {
    let cap = (rate / 8 * (u64::from(c.rtt_ns) / 1000) / 1_000_000
        + rate / 8 * abi::WND_QUEUE_NS / 1_000_000_000)
        .max(abi::WND_MIN_FRAMES * frame);
    let cap = (cap / flows).max(abi::WND_MIN_FLOW_FRAMES * frame);
    cap.div_ceil(1 << c.wscale) as u16
}

fn clamped_among(rate: u64, c: &abi::Conn, flows: u64) -> u16 {
    clamped_with(rate, c, flows, abi::MIN_FRAME)
}

fn clamped(rate: u64, c: &abi::Conn) -> u16 {
    clamped_among(rate, c, 1)
}

/// The pod's SYN (window scale `pod_ws`) out and the server's SYN-ACK (`remote_ws`) back.
fn pod_connects(f: &Fixture, pod_ws: Option<u8>, remote_ws: Option<u8>) {
    f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg(true, SYN, 64240, pod_ws),
        None,
    );
    f.run_data(
        programs::HOST_EGRESS,
        &tcp_seg(false, SYN | ACK, 65160, remote_ws),
        None,
    );
}

/// The fixture with the pod's ingress limit at `rate`, flagged as attach flags it.
fn clamping_fixture(rate: u64) -> Fixture {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| m.ingress_rate = rate);
    set_pod_flags(&mut f, abi::POD_INGRESS_LIMIT);
    f
}

#[test]
fn tcp_windows_of_an_ingress_limited_pod_are_clamped_to_the_path_and_a_short_queue() {
    if !require_root() {
        return;
    }
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate);
    let host_in = |f: &Fixture, pkt: &[u8]| {
        let (ret, out) = f.run_data(programs::HOST_INGRESS, pkt, None);
        assert_eq!(ret, TC_ACT_UNSPEC);
        out
    };
    let host_out = |f: &Fixture, pkt: &[u8]| {
        let (ret, out) = f.run_data(programs::HOST_EGRESS, pkt, None);
        assert_eq!(ret, TC_ACT_UNSPEC);
        out
    };

    // The pod connects (window scale 7) and the server agrees (it sends the option too).
    let syn = tcp_seg(true, SYN, 64240, Some(7));
    assert_eq!(
        window_of(&host_in(&f, &syn)),
        64240,
        "a SYN is never clamped"
    );
    let c = conn(&mut f).expect("the SYN was learnt");
    assert_eq!((c.state, c.wscale), (abi::CONN_SYN_SENT, 7));
    // Before the handshake completes nothing is clamped.
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(true, ACK, 65535, None))),
        65535
    );
    host_out(&f, &tcp_seg(false, SYN | ACK, 65160, Some(9)));
    let c = conn(&mut f).expect("conn");
    assert_eq!((c.state, c.wscale), (abi::CONN_ESTABLISHED, 7));
    // 65535 << 7 = 8 MiB advertised: clamped to ~20 kB (10 Mbit/s x (RTT + 16 ms)).
    let want = clamped(rate, &c);
    assert!((150..=170).contains(&want), "{want}");
    let out = host_in(&f, &tcp_seg(true, ACK, 65535, None));
    assert_eq!(window_of(&out), want);
    // A smaller window passes as it is: the clamp only lowers.
    assert_eq!(window_of(&host_in(&f, &tcp_seg(true, ACK, 100, None))), 100);
    // Segments to the pod are never changed.
    let to_pod = tcp_seg(false, ACK, 65535, None);
    assert_eq!(window_of(&host_out(&f, &to_pod)), 65535);

    // Switched off in an_config.flags: not clamped.
    f.update_config(|c| c.flags |= abi::CFG_CLAMP_OFF);
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(true, ACK, 65535, None))),
        65535
    );
    f.update_config(|c| c.flags &= !abi::CFG_CLAMP_OFF);

    // The server did not agree to scaling: the pod's windows are plain bytes.
    pod_connects(&f, Some(7), None);
    let c = conn(&mut f).expect("conn");
    assert_eq!((c.state, c.wscale), (abi::CONN_ESTABLISHED, 0));
    let want = clamped(rate, &c);
    assert!((19_000..=21_000).contains(&want), "{want}");
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(true, ACK, 65535, None))),
        want
    );

    // The pod is the server: its SYN-ACK carries the agreed scale, the next ACK ends the
    // handshake.
    host_out(&f, &tcp_seg(false, SYN, 65160, Some(7)));
    host_in(&f, &tcp_seg(true, SYN | ACK, 65160, Some(9)));
    let c = conn(&mut f).expect("conn");
    assert_eq!((c.state, c.wscale), (abi::CONN_SYNACK_SENT, 9));
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(true, ACK, 65535, None))),
        65535
    );
    host_out(&f, &tcp_seg(false, ACK, 502, None));
    let c = conn(&mut f).expect("conn");
    assert_eq!(c.state, abi::CONN_ESTABLISHED);
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(true, ACK, 65535, None))),
        clamped(rate, &c)
    );
}

#[test]
fn the_node_cap_clamps_the_remote_windows_of_the_pods_internet_connections() {
    if !require_root() {
        return;
    }
    // No ingress limit: only the node's internet cap, whose senders are the pods.
    let rate = 10_000_000;
    let mut f = Fixture::with_policy();
    f.update_config(|c| {
        c.node_internet_cap = rate;
        c.uplink_frame = 1514;
    });
    // The pod connects (scale 7); the server answers with scale 9.
    pod_connects(&f, Some(7), Some(9));
    let c = conn(&mut f).expect("learnt for the node cap");
    assert_eq!(
        (c.state, c.wscale, c.remote_wscale),
        (abi::CONN_ESTABLISHED, 7, 9)
    );
    // The server's windows to the pod are capped at the cap's rate x (RTT + 16 ms), in its
    // own scale; the pod's windows are not touched (no ingress limit).
    let to_pod = |f: &Fixture, win: u16| {
        let (ret, out) = f.run_data(programs::HOST_EGRESS, &tcp_seg(false, ACK, win, None), None);
        assert_eq!(ret, TC_ACT_UNSPEC);
        window_of(&out)
    };
    let want = {
        let remote = abi::Conn {
            wscale: c.remote_wscale,
            ..c
        };
        clamped_with(rate, &remote, 1, 1514)
    };
    assert!(want < 65535 && want > 0, "{want}");
    assert_eq!(to_pod(&f, 65535), want);
    assert_eq!(to_pod(&f, 1), 1, "only lowered");
    let (_, out) = f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg(true, ACK, 65535, None),
        None,
    );
    assert_eq!(window_of(&out), 65535, "the pod's own windows stay");

    // The pod as the server: the remote's scale comes from its SYN.
    f.run_data(
        programs::HOST_EGRESS,
        &tcp_seg(false, SYN, 64240, Some(5)),
        None,
    );
    f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg(true, SYN | ACK, 65160, Some(7)),
        None,
    );
    f.run_data(programs::HOST_EGRESS, &tcp_seg(false, ACK, 502, None), None);
    let c = conn(&mut f).expect("conn");
    assert_eq!(
        (c.state, c.wscale, c.remote_wscale),
        (abi::CONN_ESTABLISHED, 7, 5)
    );

    // Without a cap nothing is clamped.
    f.update_config(|c| c.node_internet_cap = 0);
    assert_eq!(to_pod(&f, 65535), 65535);
}

/// The MSS option of a SYN (checking the TCP checksum).
fn mss_of(pkt: &[u8]) -> u16 {
    window_of(pkt);
    let tcp = &pkt[ETH_HLEN + 20..];
    assert_eq!(&tcp[20..22], &[2, 4], "MSS option first");
    u16::from_be_bytes([tcp[22], tcp[23]])
}

#[test]
fn slow_classes_on_jumbo_frame_devices_ask_for_smaller_segments() {
    if !require_root() {
        return;
    }
    // A pod with a 10 Mbit/s ingress limit on a 9000-byte MTU: its SYN's MSS (8960) becomes
    // a 1500-byte network's, so senders into its class use 1514-byte frames.
    let mut f = clamping_fixture(10_000_000);
    f.update_meta(|m| m.frame = 9014);
    let (_, out) = f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg_mss(true, SYN, 64240, Some(7), 8960),
        None,
    );
    assert_eq!(mss_of(&out), 1460);
    // The window clamp's floor is then in those frames too: 2 x 1514 per flow, not 2 x 9014.
    f.run_data(
        programs::HOST_EGRESS,
        &tcp_seg_mss(false, SYN | ACK, 65160, Some(7), 1460),
        None,
    );
    let c = conn(&mut f).expect("conn");
    let (_, out) = f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg(true, ACK, 65535, None),
        None,
    );
    assert_eq!(window_of(&out), clamped_with(10_000_000, &c, 1, 1514));
    // From ~72 Mbit/s a jumbo segment takes under 1 ms: the pod's MSS passes as it is. A
    // smaller MSS is never raised.
    f.update_meta(|m| m.ingress_rate = 100_000_000);
    let (_, out) = f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg_mss(true, SYN, 64240, Some(7), 8960),
        None,
    );
    assert_eq!(mss_of(&out), 8960);
    f.update_meta(|m| m.ingress_rate = 10_000_000);
    let (_, out) = f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg_mss(true, SYN, 64240, Some(7), 1200),
        None,
    );
    assert_eq!(mss_of(&out), 1200);

    // A pod with only an egress limit: the remote's MSS in its SYN-ACK bounds what the pod's
    // own TCP sends into its egress class; no connection is tracked for it.
    let mut f = Fixture::with_policy();
    f.update_meta(|m| {
        m.egress_rate = 10_000_000;
        m.frame = 9014;
    });
    assert_eq!(remote_mss_after_handshake(&f, 8960), 1460);
    assert!(conn(&mut f).is_none(), "nothing to clamp: not tracked");

    // The node cap: the remote's MSS in its SYN-ACK to a pod bounds what the pod sends.
    let mut f = Fixture::with_policy();
    f.update_config(|c| {
        c.node_internet_cap = 10_000_000;
        c.uplink_frame = 9014;
    });
    assert_eq!(remote_mss_after_handshake(&f, 8960), 1460);
}

/// The pod connects (MSS 8960); returns the MSS of the server's SYN-ACK (`mss`) as it
/// reaches the pod.
fn remote_mss_after_handshake(f: &Fixture, mss: u16) -> u16 {
    f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg_mss(true, SYN, 64240, Some(7), 8960),
        None,
    );
    let (_, out) = f.run_data(
        programs::HOST_EGRESS,
        &tcp_seg_mss(false, SYN | ACK, 65160, Some(7), mss),
        None,
    );
    mss_of(&out)
}

#[test]
fn pods_without_an_ingress_limit_keep_their_windows() {
    if !require_root() {
        return;
    }
    let mut f = Fixture::with_policy();
    // A limit in the record but not the pod's flag (what attach sets from that limit): the
    // connection is not even learnt.
    f.update_meta(|m| m.ingress_rate = 10_000_000);
    pod_connects(&f, Some(7), Some(7));
    assert!(conn(&mut f).is_none());
    let (_, out) = f.run_data(
        programs::HOST_INGRESS,
        &tcp_seg(true, ACK, 65535, None),
        None,
    );
    assert_eq!(window_of(&out), 65535);
}

#[test]
fn the_window_clamp_is_shared_by_the_flows_queued_in_the_class() {
    if !require_root() {
        return;
    }
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate);
    pod_connects(&f, Some(7), Some(7));
    let c = conn(&mut f).expect("established");
    // Data for the connection: it now counts as one flow of the class.
    let mut data = tcp(ip("203.0.113.9"), POD_IP, 1448);
    data.payload[0..2].copy_from_slice(&REMOTE_PORT.to_be_bytes());
    data.payload[2..4].copy_from_slice(&POD_PORT.to_be_bytes());
    f.run_data(programs::HOST_EGRESS, &data.build(), None);
    let q = f.vqueue(abi::vq_index(SLOT, abi::VQ_INGRESS));
    assert_eq!(q.flows_cur.count_ones(), 1, "{q:?}");
    let ack = tcp_seg(true, ACK, 65535, None);
    let (_, out) = f.run_data(programs::HOST_INGRESS, &ack, None);
    assert_eq!(window_of(&out), clamped(rate, &c));

    // Three more downloads into the pod (other remote ports) queue bulk data.
    for port in [444u16, 445, 446] {
        let mut seg = tcp(ip("203.0.113.9"), POD_IP, 1448);
        seg.payload[0..2].copy_from_slice(&port.to_be_bytes());
        let pkt = seg.build();
        for _ in 0..3 {
            f.run_data(programs::HOST_EGRESS, &pkt, None);
        }
    }
    let q = f.vqueue(abi::vq_index(SLOT, abi::VQ_INGRESS));
    let flows = u64::from((q.flows_cur | q.flows_prev).count_ones());
    // Four flows in 64 buckets; these four hash apart.
    assert_eq!(flows, 4, "{q:?}");
    let (_, out) = f.run_data(programs::HOST_INGRESS, &ack, None);
    assert_eq!(window_of(&out), clamped_among(rate, &c, flows));
    assert!(clamped_among(rate, &c, flows) < clamped(rate, &c) / 3);
}
