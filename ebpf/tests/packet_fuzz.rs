//! Fuzz target: packets through every datapath program (`BPF_PROG_TEST_RUN`). Generated
//! frames (IPv4 with options and fragments, IPv6 with extension-header chains, neighbour
//! discovery, ARP, VLAN tags, anything) get their headers mutated: lengths made bogus, headers
//! cut short at any byte, versions and header lengths changed, bytes flipped. The program's
//! verdict, what it left in the packet and the counters are checked against an oracle written
//! here, independent of the programs' parser:
//!
//! * every verdict is pass (`TC_ACT_UNSPEC`) or drop (`TC_ACT_SHOT`), and no program rewrites
//!   a packet of a pod without limits;
//! * on the host veth, each packet is counted exactly once, in wire packets and bytes, in the
//!   cell its verdict implies: a drop as spoofed or blocked, a pass in a class that is not
//!   blocked;
//! * a packet the kernel would accept as IPv4 or IPv6 (a whole, consistent header) is never
//!   passed from the pod with a source that is not the pod's (IPv6: nor link-scoped), nor to a
//!   blocked destination (or from a blocked source, towards the pod), and is counted in the
//!   class of its remote address; a VLAN-tagged frame from the pod never passes;
//! * the uplink program stages a packet into the node's upload limit only if it is the
//!   pod's, to the internet.
//!
//! `BPF_PROG_TEST_RUN` refuses a frame shorter than the fixed IPv4 or IPv6 header its
//! ethertype announces: frames are cut from there on.
//!
//! Needs root (loads BPF programs); touches no network state. The fixture functions used are
//! `Fixture::{new, prefix, run_data, counters, node_counters}` and the packet builders of
//! `common` (`Ip`, `ext_opts`, `ext_frag`, `tcp`, `neighbour_solicitation`, `arp_request`,
//! `csum`).

mod common;

use std::{
    cell::RefCell,
    net::{Ipv4Addr, Ipv6Addr},
};

use aliasnet_ebpf::{abi, programs};
use common::*;
use proptest::{prelude::*, test_runner::TestRunner};

use abi::{Class, Direction};

/// This target's node policy, set in the fixture and mirrored by [`class4`] and [`class6`].
const POLICY4: [(&str, u32, Class); 4] = [
    ("10.0.0.0", 8, Class::Internal),
    ("10.99.0.0", 16, Class::Blocked),
    ("10.99.7.0", 24, Class::Internal),
    ("169.254.169.254", 32, Class::Blocked),
];
const POLICY6: [(&str, u32, Class); 4] = [
    ("fd00::", 8, Class::Internal),
    ("fd00:99::", 32, Class::Blocked),
    ("fd00:99:7::", 48, Class::Internal),
    ("fd00:ec2::254", 128, Class::Blocked),
];

fn fixture() -> Fixture {
    let mut f = Fixture::new();
    let code = |c: Class| match c {
        Class::Blocked => abi::CLASS_BLOCKED,
        _ => abi::CLASS_INTERNAL,
    };
    for (a, len, c) in POLICY4 {
        f.prefix(0, (ip(a), len), code(c));
    }
    for (a, len, c) in POLICY6 {
        f.prefix(0, (ip6(a), len), code(c));
    }
    // The node's upload limit, far above anything a test run sends, so that the uplink
    // program stages (and counts) the pods' internet packets without ever dropping one.
    f.set_node_limit(Direction::Egress, abi::KIND_INTERNET, Some(100_000_000_000));
    f
}

/// Longest-prefix match over `table`, internet when nothing matches.
fn lpm(table: &[(u128, u32, Class)], a: u128, bits: u32) -> Class {
    table
        .iter()
        .filter(|(p, len, _)| *len == 0 || (a ^ p) >> (bits - len) == 0)
        .max_by_key(|(_, len, _)| *len)
        .map_or(Class::Internet, |(_, _, c)| *c)
}

fn class4(remote: Ipv4Addr) -> Class {
    let t: Vec<_> = POLICY4
        .iter()
        .map(|(a, l, c)| {
            (
                u128::from(u32::from(a.parse::<Ipv4Addr>().unwrap())),
                *l,
                *c,
            )
        })
        .collect();
    lpm(&t, u128::from(u32::from(remote)), 32)
}

/// Link-local, multicast or unspecified: IPv6 neighbour discovery and the like.
fn link_scope6(a: Ipv6Addr) -> bool {
    a.is_unicast_link_local() || a.is_multicast() || a.is_unspecified()
}

/// A destination on the link only (link-local or multicast): delivered to the node itself.
fn link_dest6(dst: Ipv6Addr) -> bool {
    dst.is_unicast_link_local() || dst.is_multicast()
}

/// From the pod's own link-local address or the unspecified one to the link: the only
/// sources besides its address a pod may use.
fn scoped6(src: Ipv6Addr, dst: Ipv6Addr) -> bool {
    (src.is_unspecified() || src == POD_LL) && link_dest6(dst)
}

fn class6(src: Ipv6Addr, dst: Ipv6Addr, remote: Ipv6Addr) -> Class {
    if link_scope6(src) || link_scope6(dst) {
        return Class::Other;
    }
    let t: Vec<_> = POLICY6
        .iter()
        .map(|(a, l, c)| (u128::from(a.parse::<Ipv6Addr>().unwrap()), *l, *c))
        .collect();
    lpm(&t, u128::from(remote), 128)
}

/// What the kernel would accept as an IP packet: a whole, consistent header.
#[derive(Debug, Clone, Copy)]
enum Strict {
    V4 { src: Ipv4Addr, dst: Ipv4Addr },
    V6 { src: Ipv6Addr, dst: Ipv6Addr },
}

fn strict(pkt: &[u8]) -> Option<Strict> {
    let l3 = pkt.get(ETH_HLEN..)?;
    match u16::from_be_bytes([pkt[12], pkt[13]]) {
        0x0800 => {
            let hl = usize::from(l3.first()? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*l3.get(2)?, *l3.get(3)?]));
            let ok = l3[0] >> 4 == 4
                && hl >= 20
                && hl <= total
                && total <= l3.len()
                && csum(&l3[..hl]) == 0;
            ok.then(|| Strict::V4 {
                src: Ipv4Addr::new(l3[12], l3[13], l3[14], l3[15]),
                dst: Ipv4Addr::new(l3[16], l3[17], l3[18], l3[19]),
            })
        }
        0x86dd => {
            let h = l3.get(..40)?;
            let plen = usize::from(u16::from_be_bytes([h[4], h[5]]));
            let ok = h[0] >> 4 == 6 && plen > 0 && 40 + plen <= l3.len();
            let addr = |b: &[u8]| Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap());
            ok.then(|| Strict::V6 {
                src: addr(&h[8..24]),
                dst: addr(&h[24..40]),
            })
        }
        _ => None,
    }
}

/// A counter cell of the pod's: (direction, class), spoofed or policed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    Class(Direction, Class),
    Spoofed,
    Policed,
    /// Dropped on the way to the link (neighbour discovery over budget, or not needed).
    Link,
}

/// The cells that changed between two readings, with their change.
fn changed(before: &abi::PodCounters, after: &abi::PodCounters) -> Vec<(Cell, abi::Counter)> {
    let delta = |a: abi::Counter, b: abi::Counter| abi::Counter {
        packets: b.packets.wrapping_sub(a.packets),
        bytes: b.bytes.wrapping_sub(a.bytes),
    };
    let mut out = Vec::new();
    for d in Direction::ALL {
        for c in (0..abi::NR_CLASSES).map(Class::from_index) {
            out.push((Cell::Class(d, c), delta(before.get(d, c), after.get(d, c))));
        }
    }
    out.push((Cell::Spoofed, delta(before.spoofed, after.spoofed)));
    out.push((Cell::Policed, delta(before.policed, after.policed)));
    for r in [abi::DROP_ND, abi::DROP_GATEWAY] {
        out.push((Cell::Link, delta(before.dropped[r], after.dropped[r])));
    }
    out.retain(|(_, d)| *d != abi::Counter::default());
    out
}

fn check(f: &mut Fixture, pkt: &[u8]) {
    let whole = abi::Counter {
        packets: 1,
        bytes: pkt.len() as u64,
    };
    let s = strict(pkt);
    let tagged = matches!(u16::from_be_bytes([pkt[12], pkt[13]]), 0x8100 | 0x88a8);
    for prog in programs::PACKET {
        let before = f.counters();
        let node_before = f.node_counters()[Direction::Egress.index()];
        let (verdict, out) = f.run_data(prog, pkt, None);
        // The namespaces' download device's filters are classic classifiers: the gate
        // matches (-1) only what an_host_egress staged, never a packet arriving on its own;
        // the classifier picks a class (TC_ACT_OK) or leaves HTB's default.
        let allowed: &[u32] = match prog {
            programs::NS_GATE => &[0],
            programs::NS_CLASSIFY => &[TC_ACT_UNSPEC, TC_ACT_OK],
            _ => &[TC_ACT_UNSPEC, TC_ACT_SHOT],
        };
        assert!(allowed.contains(&verdict), "{prog}: verdict {verdict}");
        assert_eq!(
            out, pkt,
            "{prog} rewrote the packet of a pod without limits"
        );
        let cells = changed(&before, &f.counters());
        let capped = f.node_counters()[Direction::Egress.index()];
        let capped = capped.packets - node_before.packets;
        let dir = match prog {
            programs::HOST_INGRESS => Direction::Egress,
            programs::HOST_EGRESS => Direction::Ingress,
            _ => {
                assert!(cells.is_empty(), "{prog} counted into the pod: {cells:?}");
                assert_ne!(
                    verdict, TC_ACT_SHOT,
                    "{prog} dropped a packet of a pod without limits"
                );
                if prog == programs::UPLINK {
                    assert!(
                        capped <= 1,
                        "uplink staged {capped} packets into the node's limit"
                    );
                    let want = match s {
                        Some(Strict::V4 { src, dst }) => {
                            Some(src == POD_IP && class4(dst) == Class::Internet)
                        }
                        Some(Strict::V6 { src, dst }) => {
                            Some(src == POD_IP6 && class6(src, dst, dst) == Class::Internet)
                        }
                        None => None,
                    };
                    if let Some(want) = want {
                        assert_eq!(capped == 1, want, "uplink: node limit staging of {s:?}");
                    }
                }
                continue;
            }
        };
        // Exactly one cell, the whole packet, and the verdict it implies.
        let dropped = verdict == TC_ACT_SHOT;
        assert_eq!(cells.len(), 1, "{prog}: counted {cells:?}");
        assert_eq!(cells[0].1, whole, "{prog}: counted {cells:?}");
        for (cell, _) in &cells {
            let drop_cell = matches!(
                cell,
                Cell::Spoofed | Cell::Policed | Cell::Link | Cell::Class(_, Class::Blocked)
            );
            assert_eq!(
                drop_cell, dropped,
                "{prog}: verdict {verdict} counted as {cell:?}"
            );
            if let Cell::Class(d, _) = cell {
                assert_eq!(*d, dir, "{prog}: counted in the other direction");
            }
        }
        if dir == Direction::Egress && tagged {
            assert!(dropped, "a VLAN-tagged frame passed from the pod");
        }
        let Some(s) = s else { continue };
        let (own, class, spoof_ok) = match s {
            Strict::V4 { src, dst } => {
                let remote = if dir == Direction::Egress { dst } else { src };
                (src == POD_IP, class4(remote), false)
            }
            Strict::V6 { src, dst } => {
                let remote = if dir == Direction::Egress { dst } else { src };
                (src == POD_IP6, class6(src, dst, remote), scoped6(src, dst))
            }
        };
        if dir == Direction::Egress && !own {
            if !spoof_ok {
                assert!(
                    dropped,
                    "{prog} passed a packet from the pod with a forged source: {s:?}"
                );
                assert_eq!(cells[0].0, Cell::Spoofed, "{s:?}");
            }
            continue;
        }
        if dir == Direction::Egress && dropped {
            if let Strict::V6 { dst, .. } = s {
                if link_dest6(dst) {
                    // Not what the pod needs of the link, or over its budget.
                    assert_eq!(cells[0].0, Cell::Link, "{prog}: {s:?}");
                    continue;
                }
            }
        }
        if class == Class::Blocked {
            assert!(dropped, "{prog} passed blocked traffic: {s:?}");
        }
        if !dropped || class == Class::Blocked {
            assert_eq!(
                cells[0].0,
                Cell::Class(dir, class),
                "{prog}: class of {s:?}"
            );
        }
    }
}

// ---- generators -------------------------------------------------------------------------

fn addr4() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        4 => Just(POD_IP),
        6 => proptest::sample::select(vec![
            "10.1.2.3", "10.99.1.1", "10.99.7.7", "169.254.169.254", "203.0.113.9",
            "10.20.0.6", "0.0.0.0", "255.255.255.255", "224.0.0.1", "127.0.0.1",
        ])
        .prop_map(|a| a.parse().unwrap()),
        1 => any::<[u8; 4]>().prop_map(Ipv4Addr::from),
    ]
}

fn addr6() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![
        4 => Just(POD_IP6),
        2 => Just(POD_LL),
        2 => Just(GATEWAY_LL),
        6 => proptest::sample::select(vec![
            "::", "ff02::1", "ff02::2", "ff02::1:ff00:5", "fd00:1::1", "fd00:99::1",
            "fd00:99:7::1", "fd00:ec2::254", "2001:db8::1", "fe80::99", "fe80::5:1", "ff05::2",
            "::ffff:10.20.0.5",
        ])
        .prop_map(|a| a.parse().unwrap()),
        1 => any::<[u16; 8]>().prop_map(Ipv6Addr::from),
    ]
}

fn ipv4() -> impl Strategy<Value = Vec<u8>> {
    (
        addr4(),
        addr4(),
        0u8..4,
        proptest::collection::vec(any::<u8>(), 0..3).prop_map(|w| w.repeat(4)),
        (
            any::<bool>(),
            prop_oneof![3 => Just(0u16), 1 => 0u16..0x2000],
        ),
        0usize..64,
    )
        .prop_map(|(src, dst, l4, options, frag, len)| {
            let mut ip = match l4 {
                0 => Ip::new(src, dst),
                1 => tcp(src, dst, len),
                2 => Ip {
                    proto: 17,
                    payload: {
                        let mut u = vec![0u8; 8 + len];
                        u[0..2].copy_from_slice(&53u16.to_be_bytes());
                        u[2..4].copy_from_slice(&5353u16.to_be_bytes());
                        u[4..6].copy_from_slice(&((8 + len) as u16).to_be_bytes());
                        u
                    },
                    ..Ip::new(src, dst)
                },
                _ => Ip {
                    proto: len as u8,
                    payload: vec![0x5a; len],
                    ..Ip::new(src, dst)
                },
            };
            ip.options = options[..options.len().min(40)].to_vec();
            ip.frag = frag;
            ip.build()
        })
}

fn ext_header() -> impl Strategy<Value = (u8, Vec<u8>)> {
    prop_oneof![
        3 => (proptest::sample::select(vec![NEXTHDR_HOP, NEXTHDR_DEST, NEXTHDR_ROUTING]), 1u8..4)
            .prop_map(|(k, u)| ext_opts(k, u)),
        2 => (0u16..0x2000, any::<bool>()).prop_map(|(o, m)| ext_frag(o, m)),
        // Authentication header: length in 4-byte units, minus 2.
        1 => (1u8..4).prop_map(|u| {
            let mut b = vec![0u8; 4 * usize::from(u) + 8 - 1];
            b[0] = u;
            (51u8, b)
        }),
        1 => (any::<u8>(), proptest::collection::vec(any::<u8>(), 1..24)).prop_map(|(k, b)| (k, b)),
    ]
}

fn ipv6() -> impl Strategy<Value = Vec<u8>> {
    (
        addr6(),
        addr6(),
        0u8..3,
        proptest::collection::vec(ext_header(), 0..9),
        0usize..64,
    )
        .prop_map(|(src, dst, l4, ext, len)| {
            if l4 == 2 && ext.is_empty() {
                return neighbour_solicitation(src, dst, POD_LL);
            }
            let mut ip = if l4 == 1 {
                tcp(src, dst, len)
            } else {
                Ip::new(src, dst)
            };
            ip.ext = ext;
            ip.build()
        })
}

fn other_frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(arp_request()),
        (any::<u16>(), proptest::collection::vec(any::<u8>(), 0..80)).prop_map(|(t, body)| {
            let mut p = eth(t);
            p.extend(body);
            p
        }),
    ]
}

/// A header mutation at the IP layer.
#[derive(Debug, Clone)]
enum Bend {
    /// IPv4 total length / IPv6 payload length.
    Length(u16),
    /// IPv4 header length nibble.
    Ihl(u8),
    Version(u8),
    /// An extension header's length byte (the n-th byte after the fixed header).
    ExtLen(usize, u8),
    /// Cut the frame after this many bytes (at least the Ethernet header).
    Cut(usize),
    /// VLAN tags in front of the ethertype.
    Tags(Vec<u16>),
}

fn bend() -> impl Strategy<Value = Bend> {
    prop_oneof![
        3 => prop_oneof![Just(0u16), Just(1), Just(19), Just(20), Just(39), Just(40), Just(0xffff), any::<u16>()]
            .prop_map(Bend::Length),
        1 => (0u8..16).prop_map(Bend::Ihl),
        1 => (0u8..16).prop_map(Bend::Version),
        2 => (0usize..48, any::<u8>()).prop_map(|(n, b)| Bend::ExtLen(n, b)),
        3 => (ETH_HLEN..200).prop_map(Bend::Cut),
        2 => proptest::collection::vec(proptest::sample::select(vec![0x8100u16, 0x88a8]), 1..3)
            .prop_map(Bend::Tags),
    ]
}

impl Bend {
    fn apply(&self, p: &mut Vec<u8>) {
        let v6 = p.get(12..14) == Some(&[0x86, 0xdd][..]);
        match *self {
            Bend::Length(n) => {
                let at = ETH_HLEN + if v6 { 4 } else { 2 };
                if p.len() >= at + 2 {
                    p[at..at + 2].copy_from_slice(&n.to_be_bytes());
                }
            }
            Bend::Ihl(n) if !v6 && p.len() > ETH_HLEN => p[ETH_HLEN] = (p[ETH_HLEN] & 0xf0) | n,
            Bend::Version(n) if p.len() > ETH_HLEN => p[ETH_HLEN] = (p[ETH_HLEN] & 0x0f) | n << 4,
            Bend::ExtLen(n, b) if v6 => {
                let at = ETH_HLEN + 40 + 1 + n;
                if at < p.len() {
                    p[at] = b;
                }
            }
            Bend::Cut(n) => p.truncate(n.max(ETH_HLEN)),
            Bend::Tags(ref tpids) => {
                for t in tpids.iter().rev() {
                    let mut tag = t.to_be_bytes().to_vec();
                    tag.extend_from_slice(&[0, 0]);
                    p.splice(12..12, tag);
                }
            }
            _ => {}
        }
    }
}

/// Fixes the IPv4 header checksum (a forged packet the kernel would accept), if there is a
/// whole header to fix.
fn fix_checksum(p: &mut [u8]) {
    if p.get(12..14) != Some(&[0x08, 0x00][..]) || p.len() < ETH_HLEN + 20 {
        return;
    }
    let hl = usize::from(p[ETH_HLEN] & 0x0f) * 4;
    if hl < 20 || ETH_HLEN + hl > p.len() {
        return;
    }
    p[ETH_HLEN + 10..ETH_HLEN + 12].fill(0);
    let c = csum(&p[ETH_HLEN..ETH_HLEN + hl]);
    p[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&c.to_be_bytes());
}

/// Largest frame a test run takes (a page less the skb's head and tail room) is about 3.8 KB.
const MAX_LEN: usize = 3000;

/// The shortest frame `BPF_PROG_TEST_RUN` takes: an Ethernet header, and the fixed IPv4 or
/// IPv6 header its ethertype announces. Shorter ones cannot be tested; what lies past the
/// fixed header (options, extension headers, transport headers) is cut at every byte.
fn min_len(p: &[u8]) -> usize {
    match p.get(12..14) {
        Some([0x08, 0x00]) => ETH_HLEN + 20,
        Some([0x86, 0xdd]) => ETH_HLEN + 40,
        _ => ETH_HLEN,
    }
}

fn packet() -> impl Strategy<Value = aliasnet_fuzz::Bytes> {
    (
        prop_oneof![4 => ipv4(), 4 => ipv6(), 1 => other_frame()],
        proptest::collection::vec(bend(), 0..4),
        any::<bool>(),
        proptest::collection::vec(aliasnet_fuzz::mutation(), 0..3),
    )
        .prop_map(|(mut p, bends, fix, muts)| {
            for b in &bends {
                b.apply(&mut p);
            }
            if fix {
                fix_checksum(&mut p);
            }
            for m in &muts {
                m.apply(&mut p, &[], &[]);
            }
            // Padding a frame shorter than its ethertype's end can complete an IP ethertype.
            while p.len() < min_len(&p) {
                p.resize(min_len(&p), 0);
            }
            p.truncate(MAX_LEN);
            aliasnet_fuzz::Bytes(p)
        })
}

fn run(cases: u32, strategy: impl Strategy<Value = aliasnet_fuzz::Bytes>) {
    let f = RefCell::new(fixture());
    let mut runner = TestRunner::new(aliasnet_fuzz::config(cases));
    let result = runner.run(&strategy, |pkt| {
        check(&mut f.borrow_mut(), &pkt);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn mutated_packets_through_every_program() {
    run(1500, packet());
}

/// The packets the datapath's own tests are built from, each cut at every length a test run
/// takes: every truncation of options, extension headers and transport headers.
#[test]
fn every_truncation_of_well_formed_packets() {
    let mut f = fixture();
    let mut chain = Ip::new(POD_IP6, ip6("2001:db8::1"));
    chain.ext = vec![
        ext_opts(NEXTHDR_HOP, 1),
        ext_opts(NEXTHDR_DEST, 2),
        ext_opts(NEXTHDR_ROUTING, 1),
        ext_frag(0, true),
    ];
    let whole = [
        tcp(POD_IP, ip("203.0.113.9"), 0).build(),
        Ip {
            options: vec![1; 40],
            ..Ip::new(POD_IP, ip("10.99.1.1"))
        }
        .build(),
        tcp(POD_IP6, ip6("fd00:99:7::1"), 0).build(),
        chain.build(),
        neighbour_solicitation(POD_LL, ip6("ff02::1:ff00:1"), GATEWAY_LL),
        arp_request(),
    ];
    for p in whole {
        for n in min_len(&p)..=p.len() {
            check(&mut f, &p[..n]);
        }
    }
}
