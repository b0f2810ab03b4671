//! `BPF_PROG_TEST_RUN` tests of malformed IPv6 from a pod: truncated and overlong extension
//! headers, more of them than the walk takes, fragments, bogus payload lengths. None of them
//! is parsed as TCP (no rewrite, nothing learnt), none crashes or is misclassified: each is
//! classified by its addresses and passed (or dropped if blocked).
//!
//! Needs root (loads BPF programs); touches no network state.

mod common;

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::HashMap;
use common::*;

use abi::{Class::*, Direction::*};

const SYN: u8 = 0x02;

/// The pod with an ingress limit on a jumbo-frame device: a well-formed SYN from it has its
/// MSS lowered and is learnt, so a malformed one that is not shows it was not parsed.
fn limited_fixture() -> Fixture {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| {
        m.flags = abi::META_IN_USE;
        set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, 10_000_000);
        m.frame = 9014;
    });
    let mut pods: HashMap<_, u32, abi::Pod> = f.map(maps::PODS);
    pods.insert(
        TEST_IFINDEX,
        abi::Pod {
            slot: SLOT,
            flags: 0,
            ipv4: POD_IP.octets(),
            ipv6: POD_IP6.octets(),
            ..Default::default()
        },
        0,
    )
    .expect("register pod");
    f
}

/// A SYN with MSS 8940 from the pod to the internet, as an `Ip6` to dress up.
fn syn() -> Ip6 {
    let mut seg = vec![0u8; 24];
    seg[0..2].copy_from_slice(&40000u16.to_be_bytes());
    seg[2..4].copy_from_slice(&443u16.to_be_bytes());
    seg[12] = 6 << 4;
    seg[13] = SYN;
    seg[14..16].copy_from_slice(&64240u16.to_be_bytes());
    seg[20..24].copy_from_slice(&[2, 4, 0x22, 0xec]);
    let dst = ip6("2001:db8::10");
    let c = l4_sum6(POD_IP6, dst, 6, &seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    Ip6 {
        proto: 6,
        payload: seg,
        ..Ip6::new(POD_IP6, dst)
    }
}

fn conns(f: &mut Fixture) -> usize {
    let m: HashMap<_, abi::ConnKey, abi::Conn> = f.map(maps::CONNS);
    m.keys().count()
}

#[test]
fn a_well_formed_ipv6_syn_is_clamped_and_learnt() {
    // The control for the cases below.
    let mut f = limited_fixture();
    let pkt = syn().build();
    let (ret, out) = f.run_data(programs::HOST_INGRESS, &pkt, None);
    assert_eq!(ret, TC_ACT_UNSPEC);
    assert_ne!(out, pkt, "MSS lowered");
    assert_eq!(conns(&mut f), 1);
}

#[test]
fn malformed_extension_headers_are_never_parsed_as_tcp() {
    let mut f = limited_fixture();
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // A hop-by-hop header claiming 2048 bytes: the TCP header is not where it says.
    let mut long = ext_opts(NEXTHDR_HOP, 1);
    long.1[0] = 255;
    cases.push((
        "an extension longer than the packet",
        Ip6 {
            ext: vec![long],
            ..syn()
        }
        .build(),
    ));
    // The packet ends inside the extension header chain.
    let mut cut = Ip6 {
        ext: vec![ext_opts(NEXTHDR_HOP, 1), ext_opts(NEXTHDR_DEST, 1)],
        ..syn()
    }
    .build();
    cut.truncate(ETH_HLEN + 40 + 9);
    cases.push(("a truncated extension chain", cut));
    // More extension headers than the walk takes: a chain as long as a hostile pod likes
    // ends the walk, it never loops.
    cases.push((
        "seven destination-options headers",
        Ip6 {
            ext: (0..7).map(|_| ext_opts(NEXTHDR_DEST, 1)).collect(),
            ..syn()
        }
        .build(),
    ));
    // Routing headers pointing at each other's type: still a bounded walk.
    cases.push((
        "a chain of routing headers",
        Ip6 {
            ext: (0..12).map(|_| ext_opts(NEXTHDR_ROUTING, 1)).collect(),
            ..syn()
        }
        .build(),
    ));
    // Fragments: first (ports not read, as for IPv4) and later ones that look like a SYN.
    for (offset, more) in [(0, true), (185, true), (185, false)] {
        cases.push((
            "a fragment",
            Ip6 {
                ext: vec![ext_frag(offset, more)],
                ..syn()
            }
            .build(),
        ));
    }
    for (what, pkt) in &cases {
        f.passes_untouched(pkt, what);
    }
    assert_eq!(conns(&mut f), 0, "nothing learnt");
    // Each was classed by its addresses (internet) on the host veth, both directions' programs
    // having seen it once from the pod's side.
    assert_eq!(
        f.counters().get(Egress, Internet).packets,
        cases.len() as u64
    );
}

#[test]
fn bogus_payload_lengths_are_classified_by_address() {
    let mut f = limited_fixture();
    // The payload length is not what the walk trusts: it reads what is in the packet.
    for plen in [0u16, 1, 0xffff] {
        let pkt = Ip6 {
            payload_len: Some(plen),
            ..Ip6::new(POD_IP6, ip6("fd00:ec2::254"))
        }
        .build();
        assert_eq!(
            f.run(programs::HOST_INGRESS, &pkt, None).0,
            TC_ACT_SHOT,
            "payload length {plen}"
        );
    }
    assert_eq!(f.counters().get(Egress, Blocked).packets, 3);
    assert_eq!(f.counters().get(Egress, Other).packets, 0);
}
