//! Malformed TCP, IP headers beyond the packet, IPv6 extension headers, fragments and bogus
//! lengths: none is parsed as TCP (no rewrite, nothing learnt), none crashes or is
//! misclassified; each is classified by its addresses and passed (or dropped if blocked).

use super::*;

// Each runs for both families: `name::ipv4`, `name::ipv6`.
per_family!(
    well_formed_syns_are_clamped_with_a_valid_checksum_also_after_options,
    malformed_tcp_headers_are_never_rewritten,
    fragments_are_never_parsed_as_tcp,
);

/// A well-formed SYN's MSS is lowered and the connection learnt: the control for the
/// malformed ones below. After IPv4 options (ihl 5, 6 (a NOP word) and 15 (40 bytes: NOPs and
/// a router alert)) and IPv6 extension headers (none, hop-by-hop, hop-by-hop and destination
/// options) alike.
fn well_formed_syns_are_clamped_with_a_valid_checksum_also_after_options(fam: Family) {
    let mut f = limited_fixture(10_000_000, 9014);
    // What a 10 Mbit/s ingress limit on a jumbo-frame device clamps an MSS to: a 1514-byte
    // frame's.
    let clamped_mss = fam.mss(1514);
    let headers: [Box<dyn Fn(Ip) -> Ip>; 3] = [
        Box::new(|p| p),
        Box::new(move |p| match fam {
            Family::Ipv4 => Ip {
                options: vec![1, 1, 1, 1],
                ..p
            },
            Family::Ipv6 => Ip {
                ext: vec![ext_opts(NEXTHDR_HOP, 1)],
                ..p
            },
        }),
        Box::new(move |p| match fam {
            Family::Ipv4 => Ip {
                options: [[1u8; 36].as_slice(), &[148, 4, 0, 0]].concat(),
                ..p
            },
            Family::Ipv6 => Ip {
                ext: vec![ext_opts(NEXTHDR_HOP, 1), ext_opts(NEXTHDR_DEST, 4)],
                ..p
            },
        }),
    ];
    for with_headers in headers {
        // The MSS behind a window scale and NOPs, with a timestamp after it.
        let tcp_opts = [
            &[1, 3, 3, 7][..],
            &[1, 1],
            &MSS_9000,
            &[8, 10, 0, 0, 0, 1, 0, 0, 0, 0],
        ]
        .concat();
        let seg = tcp_raw(fam.pod(), internet(fam), SYN, &tcp_opts, None);
        let ip = with_headers(tcp_packet(fam, seg, (false, 0)));
        let l3 = ip.l3_len();
        let pkt = ip.build();
        let (ret, out) = f.run_data(programs::HOST_INGRESS, &pkt, None);
        assert_eq!(ret, TC_ACT_UNSPEC);
        // The checksum after the clamp is checked over the pseudo-header.
        let seg = checked_tcp(&out);
        assert_eq!(
            u16::from_be_bytes([seg[28], seg[29]]),
            clamped_mss,
            "{l3}-byte IP header"
        );
        // Nothing else changed: the IP header, its options or extensions, the other TCP
        // options.
        let mut want = pkt.clone();
        let at = ETH_HLEN + l3;
        want[at + 28..at + 30].copy_from_slice(&clamped_mss.to_be_bytes());
        want[at + 16..at + 18].copy_from_slice(&seg[16..18]);
        assert_eq!(out, want, "{l3}-byte IP header");
    }
    // One connection (the same ports each time), learnt.
    assert_eq!(conns(&mut f), 1);
}

fn malformed_tcp_headers_are_never_rewritten(fam: Family) {
    let f = limited_fixture(10_000_000, 9014);
    let syn = |opts: &[u8], doff| tcp_raw(fam.pod(), internet(fam), SYN, opts, doff);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // Fewer than 20 bytes of TCP.
        ("a truncated fixed header", {
            let mut s = syn(&MSS_9000, None);
            s.truncate(12);
            s
        }),
        // doff says 60 bytes; the packet ends after the MSS option.
        ("a data offset beyond the packet", syn(&MSS_9000, Some(15))),
        // doff below the fixed header: the MSS bytes are payload.
        ("a data offset of 4 words", syn(&MSS_9000, Some(4))),
        // An MSS option whose value runs past the header's end (doff 6: 4 option bytes).
        (
            "an MSS running past the header",
            syn(&[1, 1, 2, 4, 0x23, 0x18, 0, 0], Some(6)),
        ),
        // An option whose length jumps past the header, an MSS in the payload behind it.
        (
            "an option longer than the header",
            syn(&[30, 40, 0, 0, 2, 4, 0x23, 0x18], None),
        ),
        // Zero- and one-byte option lengths stop the walk (it would never advance).
        (
            "a zero-length option",
            syn(&[99, 0, 1, 1, 2, 4, 0x23, 0x18], None),
        ),
        (
            "a one-byte option length",
            syn(&[99, 1, 1, 1, 2, 4, 0x23, 0x18], None),
        ),
        // The end-of-options marker before the MSS.
        (
            "an MSS after end of options",
            syn(&[0, 1, 1, 1, 2, 4, 0x23, 0x18], None),
        ),
        // 40 option bytes of NOPs: the walk gives up after 16 and the MSS stays.
        (
            "an MSS after 36 NOPs",
            syn(&[[1u8; 36].as_slice(), &MSS_9000].concat(), None),
        ),
    ];
    for (what, seg) in cases {
        f.passes_untouched(&tcp_packet(fam, seg, (false, 0)).build(), what);
    }
}

fn fragments_are_never_parsed_as_tcp(fam: Family) {
    let mut f = limited_fixture(10_000_000, 9014);
    // A first fragment (SYNs are never fragmented, and a first fragment's ports are not
    // read), and later fragments whose payload looks like a SYN with an MSS option.
    for frag in [(true, 0), (true, 185), (false, 185)] {
        f.passes_untouched(
            &tcp_packet(fam, jumbo_syn(fam), frag).build(),
            &format!("fragment {frag:?}"),
        );
    }
    assert_eq!(conns(&mut f), 0);
    // Counted, by address, as any packet.
    assert_eq!(f.counters().get(Egress, Internet).packets, 3);
}

// ---- IPv4 only: a header longer than the packet ---------------------------------------------

#[test]
fn an_ipv4_header_beyond_the_packet_is_never_parsed() {
    let f = limited_fixture(10_000_000, 9014);
    // The TCP header is not there to parse.
    let mut pkt = tcp_packet(Family::Ipv4, jumbo_syn(Family::Ipv4), (false, 0)).build();
    pkt[ETH_HLEN] = 0x4f;
    f.passes_untouched(&pkt, "an IPv4 header beyond the packet");
}

// ---- IPv6 only: extension headers, payload lengths ------------------------------------------

#[test]
fn malformed_extension_headers_are_never_parsed_as_tcp() {
    let mut f = limited_fixture(10_000_000, 9014);
    let syn = || tcp_packet(Family::Ipv6, jumbo_syn(Family::Ipv6), (false, 0));
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // A hop-by-hop header claiming 2048 bytes: the TCP header is not where it says.
    let mut long = ext_opts(NEXTHDR_HOP, 1);
    long.1[0] = 255;
    cases.push((
        "an extension longer than the packet",
        Ip {
            ext: vec![long],
            ..syn()
        }
        .build(),
    ));
    // The packet ends inside the extension header chain.
    let mut cut = Ip {
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
        Ip {
            ext: (0..7).map(|_| ext_opts(NEXTHDR_DEST, 1)).collect(),
            ..syn()
        }
        .build(),
    ));
    // Routing headers pointing at each other's type: still a bounded walk.
    cases.push((
        "a chain of routing headers",
        Ip {
            ext: (0..12).map(|_| ext_opts(NEXTHDR_ROUTING, 1)).collect(),
            ..syn()
        }
        .build(),
    ));
    // Fragments: first (ports not read, as for IPv4) and later ones that look like a SYN,
    // also behind another extension header.
    for (offset, more) in [(0, true), (185, true), (185, false)] {
        cases.push((
            "a fragment behind a hop-by-hop header",
            Ip {
                ext: vec![ext_opts(NEXTHDR_HOP, 1), ext_frag(offset, more)],
                ..syn()
            }
            .build(),
        ));
    }
    for (what, pkt) in &cases {
        f.passes_untouched(pkt, what);
    }
    assert_eq!(conns(&mut f), 0, "nothing learnt");
    // Each was classed by its addresses (internet) on the host veth, both directions'
    // programs having seen it once from the pod's side.
    assert_eq!(
        f.counters().get(Egress, Internet).packets,
        cases.len() as u64
    );
}

#[test]
fn bogus_payload_lengths_are_classified_by_address() {
    let mut f = limited_fixture(10_000_000, 9014);
    // The payload length is not what the walk trusts: it reads what is in the packet.
    for plen in [0u16, 1, 0xffff] {
        let pkt = Ip {
            payload_len: Some(plen),
            ..Ip::new(POD_IP6, ip6("fd00:ec2::254"))
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
