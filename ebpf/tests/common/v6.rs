//! IPv6 packet builders and the pod's IPv6 side of the fixture.

use std::net::Ipv6Addr;

use aliasnet_ebpf::{abi, maps};
use aya::maps::{lpm_trie::Key, LpmTrie};

use super::{csum, eth, Fixture};

/// The fixture pod's IPv6 address (registered by [`Fixture::new`] next to `POD_IP`).
pub const POD_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x240, 0, 0, 0, 0, 0, 5);
/// The pod's link-local address and its gateway's, as the plugin wires them.
pub const POD_LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x5);
pub const GATEWAY_LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

pub const NEXTHDR_HOP: u8 = 0;
pub const NEXTHDR_ROUTING: u8 = 43;
pub const NEXTHDR_FRAGMENT: u8 = 44;
pub const NEXTHDR_DEST: u8 = 60;
pub const NEXTHDR_ICMPV6: u8 = 58;

pub fn ip6(s: &str) -> Ipv6Addr {
    s.parse().expect("IPv6 address")
}

impl Fixture {
    pub fn prefix6(&mut self, gen: u32, cidr: (Ipv6Addr, u32), class: u32) {
        let mut trie: LpmTrie<_, abi::Lpm6KeyData, abi::LpmValue> = self.map(maps::PREFIXES6);
        trie.insert(
            &Key::new(32 + cidr.1, abi::Lpm6KeyData::new(gen, cidr.0)),
            abi::LpmValue { class, reserved: 0 },
            0,
        )
        .expect("insert IPv6 prefix");
    }

    /// The IPv6 half of the policy most tests use, mirroring the IPv4 one: fd00::/8
    /// internal, AWS's metadata endpoint and fd00:99::/32 blocked, fd00:99:7::/48 internal.
    pub fn with_policy6(mut self) -> Self {
        self.prefix6(0, (ip6("fd00::"), 8), abi::CLASS_INTERNAL);
        self.prefix6(0, (ip6("fd00:ec2::254"), 128), abi::CLASS_BLOCKED);
        self.prefix6(0, (ip6("fd00:99::"), 32), abi::CLASS_BLOCKED);
        self.prefix6(0, (ip6("fd00:99:7::"), 48), abi::CLASS_INTERNAL);
        self
    }
}

/// The one's-complement sum of an IPv6 transport segment with its pseudo-header (RFC 8200
/// section 8.1); 0 for a segment whose checksum field is right.
pub fn l4_sum6(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, seg: &[u8]) -> u16 {
    let mut data = Vec::with_capacity(40 + seg.len());
    data.extend_from_slice(&src.octets());
    data.extend_from_slice(&dst.octets());
    data.extend_from_slice(&(seg.len() as u32).to_be_bytes());
    data.extend_from_slice(&[0, 0, 0, proto]);
    data.extend_from_slice(seg);
    csum(&data)
}

pub struct Ip6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// Traffic class (DSCP and ECN).
    pub tc: u8,
    /// The transport protocol after the extension headers.
    pub proto: u8,
    /// Extension headers in order: (type, bytes from the length byte on; the next-header
    /// byte is filled in).
    pub ext: Vec<(u8, Vec<u8>)>,
    pub payload: Vec<u8>,
    /// Payload length field override (bogus lengths); `None` = the real one.
    pub payload_len: Option<u16>,
}

impl Ip6 {
    /// ICMPv6 echo request with 100 bytes of data, as `ping -6 -s 100` sends.
    pub fn new(src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        let mut icmp = vec![128, 0, 0, 0, 0x12, 0x34, 0, 1];
        icmp.extend(std::iter::repeat_n(0xab, 100));
        let c = l4_sum6(src, dst, NEXTHDR_ICMPV6, &icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        Self {
            src,
            dst,
            tc: 0,
            proto: NEXTHDR_ICMPV6,
            ext: Vec::new(),
            payload: icmp,
            payload_len: None,
        }
    }

    pub fn build(&self) -> Vec<u8> {
        let ext_len: usize = self.ext.iter().map(|(_, b)| 1 + b.len()).sum();
        let plen = self
            .payload_len
            .unwrap_or((ext_len + self.payload.len()) as u16);
        let first = self.ext.first().map_or(self.proto, |(t, _)| *t);
        let mut p = eth(0x86dd);
        p.extend_from_slice(&[0x60 | (self.tc >> 4), self.tc << 4, 0, 0]);
        p.extend_from_slice(&plen.to_be_bytes());
        p.extend_from_slice(&[first, 64]);
        p.extend_from_slice(&self.src.octets());
        p.extend_from_slice(&self.dst.octets());
        for (i, (_, body)) in self.ext.iter().enumerate() {
            let next = self.ext.get(i + 1).map_or(self.proto, |(t, _)| *t);
            p.push(next);
            p.extend_from_slice(body);
        }
        p.extend_from_slice(&self.payload);
        p
    }
}

/// An options extension header (hop-by-hop, destination options, or routing) of
/// `8 * units` bytes, PadN-filled.
pub fn ext_opts(kind: u8, units: u8) -> (u8, Vec<u8>) {
    assert!(units >= 1);
    let len = 8 * usize::from(units);
    let mut b = vec![0u8; len - 1];
    b[0] = units - 1;
    // PadN over the rest (type 1, length).
    b[1] = 1;
    b[2] = (len - 4) as u8;
    (kind, b)
}

/// A fragment header: offset in 8-byte units, more-fragments flag.
pub fn ext_frag(offset: u16, more: bool) -> (u8, Vec<u8>) {
    let fo = (offset << 3) | u16::from(more);
    let mut b = vec![0u8; 7];
    b[1..3].copy_from_slice(&fo.to_be_bytes());
    b[3..7].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    (NEXTHDR_FRAGMENT, b)
}

/// A TCP segment (ACK, 32-byte header with timestamps, `len` bytes of payload) with a valid
/// checksum, ports 40000 -> 443.
pub fn tcp6(src: Ipv6Addr, dst: Ipv6Addr, len: usize) -> Ip6 {
    let mut seg = vec![0u8; 32 + len];
    seg[0..2].copy_from_slice(&40000u16.to_be_bytes());
    seg[2..4].copy_from_slice(&443u16.to_be_bytes());
    seg[12] = 8 << 4;
    seg[13] = 0x10;
    seg[20..22].copy_from_slice(&[1, 1]);
    seg[22..24].copy_from_slice(&[8, 10]);
    let c = l4_sum6(src, dst, 6, &seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    Ip6 {
        proto: 6,
        payload: seg,
        ..Ip6::new(src, dst)
    }
}

/// An ICMPv6 neighbour solicitation for `target` (RFC 4861 4.3), with a source link-layer
/// option unless `src` is unspecified (DAD).
pub fn neighbour_solicitation(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut icmp = vec![135, 0, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(&target.octets());
    if !src.is_unspecified() {
        icmp.extend_from_slice(&[1, 1, 0x02, 0, 0, 0, 0, 0x01]);
    }
    let c = l4_sum6(src, dst, NEXTHDR_ICMPV6, &icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    Ip6 {
        payload: icmp,
        ..Ip6::new(src, dst)
    }
    .build()
}

/// An ICMPv6 neighbour advertisement for `target`, solicited, with a target link-layer option.
pub fn neighbour_advertisement(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut icmp = vec![136, 0, 0, 0, 0x60, 0, 0, 0];
    icmp.extend_from_slice(&target.octets());
    icmp.extend_from_slice(&[2, 1, 0x02, 0, 0, 0, 0, 0x01]);
    let c = l4_sum6(src, dst, NEXTHDR_ICMPV6, &icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    Ip6 {
        payload: icmp,
        ..Ip6::new(src, dst)
    }
    .build()
}
