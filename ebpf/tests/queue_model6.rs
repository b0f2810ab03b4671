//! `BPF_PROG_TEST_RUN` tests of the shaping model on IPv6: CE marks in the traffic class
//! (IPv6 has no header checksum to update), GSO skbs charged with their IPv6 headers per
//! segment, and flow isolation by the IPv6 5-tuple.
//!
//! Needs root (loads BPF programs); touches no network state (see `common`).

mod common;

use std::net::Ipv6Addr;

use aliasnet_ebpf::{abi, programs};
use common::*;

use abi::{Class::*, Direction::*};

const ECT0: u8 = 2;
const CE: u8 = 3;

/// A full-size TCP frame over IPv6 (1514 bytes on the wire) with DSCP 8 and `ecn`.
fn frame(src: Ipv6Addr, dst: Ipv6Addr, ecn: u8) -> Vec<u8> {
    let p = Ip {
        tos: 0x20 | ecn,
        ..tcp(src, dst, 1428)
    }
    .build();
    assert_eq!(p.len(), 1514);
    p
}

/// The ECN bits of a frame's traffic class, checking that nothing else in it changed.
fn ecn_of(pkt: &[u8], sent: &[u8]) -> u8 {
    let tc = (pkt[ETH_HLEN] << 4) | (pkt[ETH_HLEN + 1] >> 4);
    assert_eq!(tc & 0xfc, 0x20, "DSCP changed");
    assert_eq!(pkt[ETH_HLEN] >> 4, 6, "version changed");
    assert_eq!(
        pkt[ETH_HLEN + 1] & 0x0f,
        sent[ETH_HLEN + 1] & 0x0f,
        "flow label changed"
    );
    assert_eq!(
        pkt[ETH_HLEN + 2..],
        sent[ETH_HLEN + 2..],
        "more than the traffic class changed"
    );
    tc & 3
}

#[test]
fn ingress_limit_ce_marks_ipv6_ect_packets_above_the_modelled_queue() {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    let ect = frame(ip6("2001:db8::10"), POD_IP6, ECT0);
    // As for IPv4: the class's burst (4 frames) and two frames of queue pass unmarked,
    // then every frame is marked.
    let got: Vec<u8> = (0..12)
        .map(|_| {
            let (ret, out) = f.run_data(programs::HOST_EGRESS, &ect, None);
            assert_eq!(ret, TC_ACT_UNSPEC);
            ecn_of(&out, &ect)
        })
        .collect();
    assert_eq!(&got[..7], &[ECT0; 7], "marked below the threshold: {got:?}");
    assert_eq!(
        &got[8..],
        &[CE; 4],
        "not marked above the threshold: {got:?}"
    );
    let marked = got.iter().filter(|&&e| e == CE).count() as u64;
    assert_eq!(
        f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL))
            .ce_marked,
        marked
    );
    assert_eq!(
        f.counters(),
        expect(&[(Ingress, Internet, c(12, 12 * 1514))])
    );
}

#[test]
fn gso_skbs_charge_their_ipv6_headers_per_segment() {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    // 3 segments of 1000 bytes behind 14 + 40 + 8 (hop-by-hop) + 32 header bytes each.
    let pkt = Ip {
        ext: vec![ext_opts(NEXTHDR_HOP, 1)],
        ..tcp(ip6("2001:db8::10"), POD_IP6, 3000)
    }
    .build();
    let wire = 3 * (14 + 40 + 8 + 32 + 1000);
    assert_eq!(
        f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL))
            .t_empty,
        0
    );
    let start = monotonic_ns();
    assert_eq!(
        f.run(programs::HOST_EGRESS, &pkt, Some(&gso_ctx(3, 1000)))
            .0,
        TC_ACT_UNSPEC
    );
    let end = monotonic_ns();
    assert_eq!(f.counters(), expect(&[(Ingress, Internet, c(3, wire))]));
    // The model drains what HTB will charge, every segment with its headers: after an idle
    // class it starts `credit` (the class's burst, 4 frames) before now and adds the three
    // segments at the class's rate (8 us a byte at 1 Mbit/s).
    let t = f
        .vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL))
        .t_empty;
    let ns_per_byte = 8 * 1_000_000_000 / SLOW;
    let credit = abi::DEFAULT_BURST_FRAMES * abi::MIN_FRAME * ns_per_byte;
    let at = t + credit - wire as u64 * ns_per_byte;
    assert!(
        (start..=end).contains(&at),
        "t_empty {t}: start {at}, test run in {start}..={end}"
    );
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The programs' flow bucket (`flow_bucket()` in ebpf/lib/flow.h) of an IPv6 packet: the
/// addresses folded to 32 bits (their words XORed, as loaded from the packet), ports as
/// loaded, the protocol.
fn flow_bucket6(src: Ipv6Addr, dst: Ipv6Addr, ports: [u8; 4], proto: u8) -> u32 {
    let fold = |a: Ipv6Addr| {
        a.octets()
            .chunks(4)
            .map(|w| u32::from_ne_bytes(w.try_into().expect("4 bytes")))
            .fold(0, |x, w| x ^ w)
    };
    let mut h = fold(src)
        ^ fold(dst).wrapping_mul(0x9e37_79b1)
        ^ u32::from_ne_bytes(ports).wrapping_mul(0x85eb_ca6b)
        ^ u32::from(proto);
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h & (abi::FLOW_BUCKETS - 1)
}

#[test]
fn ipv6_flows_are_isolated_by_their_five_tuple() {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    let sparse = pod_leaf(abi::KIND_TOTAL, abi::LEAF_SPARSE);
    let bulk_leaf = pod_leaf(abi::KIND_TOTAL, abi::LEAF_BULK);
    let remote = ip6("2001:db8::10");
    let bulk = frame(remote, POD_IP6, 0);
    // A ping from a remote whose flow lands in another bucket than the download's.
    let download = flow_bucket6(remote, POD_IP6, [0x9c, 0x40, 0x01, 0xbb], 6);
    let other = (0x11..0xff)
        .map(|i| Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i))
        .find(|a| flow_bucket6(*a, POD_IP6, [0; 4], 58) != download)
        .expect("a remote in another bucket");
    let ping = Ip::new(other, POD_IP6).build();
    let leaf = |f: &Fixture, pkt: &[u8]| {
        let (ret, ctx) = f.run(programs::HOST_EGRESS, pkt, None);
        assert_eq!(ret, TC_ACT_UNSPEC);
        prio_of(&ctx)
    };
    // The download's first two frames fit its sparse budget, then it is bulk.
    let got: Vec<u32> = (0..5).map(|_| leaf(&f, &bulk)).collect();
    assert_eq!(got, [sparse, sparse, bulk_leaf, bulk_leaf, bulk_leaf]);
    // The other flow stays sparse, again and again.
    for _ in 0..5 {
        assert_eq!(leaf(&f, &ping), sparse);
    }
    // A ping whose flow shares the download's bucket waits behind it (bulk), which shows
    // that the bucket is the one computed above from the whole IPv6 addresses.
    let same = (0x100..0xffff)
        .map(|i| Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i))
        .find(|a| flow_bucket6(*a, POD_IP6, [0; 4], 58) == download)
        .expect("a remote in the download's bucket");
    assert_eq!(leaf(&f, &Ip::new(same, POD_IP6).build()), bulk_leaf);
}
