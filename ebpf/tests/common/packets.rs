//! Packet builders for both address families: one [`Ip`] builder whose family is its
//! addresses', [`Family`] for the tests written once and run for each, and the IPv6-only
//! pieces (extension headers, neighbour discovery) and ARP.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The fixture pod's IPv4 address (registered by `Fixture::new`).
pub const POD_IP: Ipv4Addr = Ipv4Addr::new(10, 20, 0, 5);
/// The fixture pod's IPv6 address (registered by `Fixture::new` next to `POD_IP`).
pub const POD_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x240, 0, 0, 0, 0, 0, 5);
/// The pod's link-local address and its gateway's, as the plugin wires them.
pub const POD_LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x5);
pub const GATEWAY_LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

pub const NEXTHDR_HOP: u8 = 0;
pub const NEXTHDR_ROUTING: u8 = 43;
pub const NEXTHDR_FRAGMENT: u8 = 44;
pub const NEXTHDR_DEST: u8 = 60;
pub const NEXTHDR_ICMPV6: u8 = 58;

pub const ETH_HLEN: usize = 14;

/// An address family: what a test written once for both is run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    /// `v4` for IPv4, `v6` for IPv6.
    pub fn pick<T>(self, v4: T, v6: T) -> T {
        match self {
            Family::Ipv4 => v4,
            Family::Ipv6 => v6,
        }
    }

    /// The address of this family of the two, which name the same role in the policy
    /// (`Fixture::with_policy` mirrors the IPv4 policy in IPv6).
    pub fn addr(self, v4: &str, v6: &str) -> IpAddr {
        let a: IpAddr = self.pick(v4, v6).parse().expect("address");
        assert_eq!(Family::of(a), self, "{a} is not of {self:?}");
        a
    }

    pub fn of(a: IpAddr) -> Self {
        match a {
            IpAddr::V4(_) => Family::Ipv4,
            IpAddr::V6(_) => Family::Ipv6,
        }
    }

    /// The fixture pod's address.
    pub fn pod(self) -> IpAddr {
        self.pick(POD_IP.into(), POD_IP6.into())
    }

    /// The fixed IP header's length.
    pub fn ip_hlen(self) -> usize {
        self.pick(20, 40)
    }

    /// The ICMP (echo) protocol number.
    pub fn icmp(self) -> u8 {
        self.pick(1, NEXTHDR_ICMPV6)
    }

    /// The payload that makes a [`tcp`] segment (32-byte header) a `frame`-byte frame.
    pub fn tcp_payload(self, frame: usize) -> usize {
        frame - ETH_HLEN - self.ip_hlen() - 32
    }

    /// The MSS of a `frame`-byte frame (TCP's fixed header, no IP options).
    pub fn mss(self, frame: u16) -> u16 {
        frame - (ETH_HLEN + self.ip_hlen() + 20) as u16
    }
}

pub fn ip(s: &str) -> Ipv4Addr {
    s.parse().expect("address")
}

pub fn ip6(s: &str) -> Ipv6Addr {
    s.parse().expect("IPv6 address")
}

pub fn eth(ethertype: u16) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
    p.extend_from_slice(&ethertype.to_be_bytes());
    p
}

pub fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The one's-complement sum of a transport segment with its family's pseudo-header (RFC 793
/// 3.1, RFC 8200 8.1; ICMP over IPv4 has none); 0 for a segment whose checksum field is
/// right.
pub fn l4_csum(src: IpAddr, dst: IpAddr, proto: u8, seg: &[u8]) -> u16 {
    let mut data = Vec::with_capacity(40 + seg.len());
    match (src, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) if proto == 1 => {}
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            data.extend_from_slice(&s.octets());
            data.extend_from_slice(&d.octets());
            data.extend_from_slice(&[0, proto]);
            data.extend_from_slice(&(seg.len() as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            data.extend_from_slice(&s.octets());
            data.extend_from_slice(&d.octets());
            data.extend_from_slice(&(seg.len() as u32).to_be_bytes());
            data.extend_from_slice(&[0, 0, 0, proto]);
        }
        _ => panic!("{src} and {dst} are of different families"),
    }
    data.extend_from_slice(seg);
    csum(&data)
}

/// An IP packet in an Ethernet frame, of the family of its addresses.
pub struct Ip {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// DSCP and ECN: IPv4's type of service, IPv6's traffic class.
    pub tos: u8,
    /// The transport protocol (after IPv6's extension headers).
    pub proto: u8,
    /// IPv4 options (whole words).
    pub options: Vec<u8>,
    /// IPv6 extension headers in order: (type, bytes from the length byte on; the
    /// next-header byte is filled in).
    pub ext: Vec<(u8, Vec<u8>)>,
    /// (more fragments, offset in 8-byte units): IPv4's header fields; for IPv6 a fragment
    /// header after `ext` unless (false, 0).
    pub frag: (bool, u16),
    pub payload: Vec<u8>,
    /// IPv6's payload length field instead of the real one (bogus lengths).
    pub payload_len: Option<u16>,
}

impl Ip {
    /// An ICMP echo request with 100 bytes of data, as `ping -s 100` sends (ICMPv6's over
    /// IPv6), from `src` to `dst`.
    pub fn new(src: impl Into<IpAddr>, dst: impl Into<IpAddr>) -> Self {
        let (src, dst) = (src.into(), dst.into());
        let fam = Family::of(src);
        assert_eq!(fam, Family::of(dst), "{src} and {dst}");
        let mut icmp = vec![fam.pick(8, 128), 0, 0, 0, 0x12, 0x34, 0, 1];
        icmp.extend(std::iter::repeat_n(0xab, 100));
        let c = l4_csum(src, dst, fam.icmp(), &icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        Self {
            src,
            dst,
            tos: 0,
            proto: fam.icmp(),
            options: Vec::new(),
            ext: Vec::new(),
            frag: (false, 0),
            payload: icmp,
            payload_len: None,
        }
    }

    pub fn family(&self) -> Family {
        Family::of(self.src)
    }

    /// The IPv6 extension headers with the fragment header `frag` asks for.
    fn chain(&self) -> Vec<(u8, Vec<u8>)> {
        let mut ext = self.ext.clone();
        if self.frag != (false, 0) {
            ext.push(ext_frag(self.frag.1, self.frag.0));
        }
        ext
    }

    /// The bytes of the IP header: options and extension headers included.
    pub fn l3_len(&self) -> usize {
        match self.family() {
            Family::Ipv4 => 20 + self.options.len(),
            Family::Ipv6 => 40 + self.chain().iter().map(|(_, b)| 1 + b.len()).sum::<usize>(),
        }
    }

    pub fn build(&self) -> Vec<u8> {
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => self.build4(s, d),
            (IpAddr::V6(s), IpAddr::V6(d)) => self.build6(s, d),
            (s, d) => panic!("{s} and {d} are of different families"),
        }
    }

    fn build4(&self, src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
        assert!(self.ext.is_empty(), "IPv4 has no extension headers");
        assert_eq!(self.options.len() % 4, 0);
        let ihl = 5 + self.options.len() / 4;
        let total = ihl * 4 + self.payload.len();
        let frag = (u16::from(self.frag.0) << 13) | self.frag.1;
        let mut h = vec![(4 << 4) | ihl as u8, self.tos];
        h.extend_from_slice(&(total as u16).to_be_bytes());
        h.extend_from_slice(&[0x4a, 0x11]);
        h.extend_from_slice(&frag.to_be_bytes());
        h.extend_from_slice(&[64, self.proto, 0, 0]);
        h.extend_from_slice(&src.octets());
        h.extend_from_slice(&dst.octets());
        h.extend_from_slice(&self.options);
        let c = csum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        let mut p = eth(0x0800);
        p.extend(h);
        p.extend_from_slice(&self.payload);
        p
    }

    fn build6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
        assert!(self.options.is_empty(), "IPv6 has no options");
        let ext = self.chain();
        let ext_len: usize = ext.iter().map(|(_, b)| 1 + b.len()).sum();
        let plen = self
            .payload_len
            .unwrap_or((ext_len + self.payload.len()) as u16);
        let first = ext.first().map_or(self.proto, |(t, _)| *t);
        let mut p = eth(0x86dd);
        p.extend_from_slice(&[0x60 | (self.tos >> 4), self.tos << 4, 0, 0]);
        p.extend_from_slice(&plen.to_be_bytes());
        p.extend_from_slice(&[first, 64]);
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        for (i, (_, body)) in ext.iter().enumerate() {
            let next = ext.get(i + 1).map_or(self.proto, |(t, _)| *t);
            p.push(next);
            p.extend_from_slice(body);
        }
        p.extend_from_slice(&self.payload);
        p
    }
}

/// A TCP segment (ACK, 32-byte header with timestamps, `len` bytes of payload) with a valid
/// checksum, ports 40000 -> 443.
pub fn tcp(src: impl Into<IpAddr>, dst: impl Into<IpAddr>, len: usize) -> Ip {
    let (src, dst) = (src.into(), dst.into());
    let mut seg = vec![0u8; 32 + len];
    seg[0..2].copy_from_slice(&40000u16.to_be_bytes());
    seg[2..4].copy_from_slice(&443u16.to_be_bytes());
    seg[12] = 8 << 4; // data offset: 8 words
    seg[13] = 0x10; // ACK
    seg[20..22].copy_from_slice(&[1, 1]); // NOP NOP
    seg[22..24].copy_from_slice(&[8, 10]); // timestamp option header
    let c = l4_csum(src, dst, 6, &seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    Ip {
        proto: 6,
        payload: seg,
        ..Ip::new(src, dst)
    }
}

/// The addresses and the transport segment of a frame `Ip` built (IPv4 options and IPv6
/// extension headers skipped; IPv6's fragment header ends the walk).
pub fn l4_of(pkt: &[u8]) -> (IpAddr, IpAddr, &[u8]) {
    let h = &pkt[ETH_HLEN..];
    match h[0] >> 4 {
        4 => {
            let a = |at: usize| IpAddr::from(<[u8; 4]>::try_from(&h[at..at + 4]).expect("4"));
            (a(12), a(16), &h[usize::from(h[0] & 0x0f) * 4..])
        }
        6 => {
            let a = |at: usize| IpAddr::from(<[u8; 16]>::try_from(&h[at..at + 16]).expect("16"));
            let (mut next, mut off) = (h[6], 40);
            while [NEXTHDR_HOP, NEXTHDR_ROUTING, NEXTHDR_DEST, NEXTHDR_FRAGMENT].contains(&next) {
                let len = if next == NEXTHDR_FRAGMENT {
                    8
                } else {
                    (usize::from(h[off + 1]) + 1) * 8
                };
                next = h[off];
                off += len;
            }
            (a(8), a(24), &h[off..])
        }
        v => panic!("IP version {v}"),
    }
}

/// The TCP segment of a frame, its checksum checked over the pseudo-header.
#[track_caller]
pub fn checked_tcp(pkt: &[u8]) -> &[u8] {
    let (src, dst, seg) = l4_of(pkt);
    assert_eq!(l4_csum(src, dst, 6, seg), 0, "TCP checksum broken");
    seg
}

pub fn arp_request() -> Vec<u8> {
    let mut p = eth(0x0806);
    p.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    p.extend_from_slice(&POD_IP.octets());
    p.extend_from_slice(&[0; 6]);
    p.extend_from_slice(&[169, 254, 1, 1]);
    p
}

// ---- IPv6 only: extension headers, neighbour discovery ------------------------------------

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

/// An ICMPv6 message of `kind` with `body` after its first 4 bytes, and a valid checksum.
pub fn icmp6(src: Ipv6Addr, dst: Ipv6Addr, kind: u8, body: &[u8]) -> Ip {
    let mut icmp = vec![kind, 0, 0, 0];
    icmp.extend_from_slice(body);
    let c = l4_csum(src.into(), dst.into(), NEXTHDR_ICMPV6, &icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    Ip {
        payload: icmp,
        ..Ip::new(src, dst)
    }
}

/// An ICMPv6 neighbour solicitation for `target` (RFC 4861 4.3), with a source link-layer
/// option unless `src` is unspecified (DAD).
pub fn neighbour_solicitation(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut body = vec![0, 0, 0, 0];
    body.extend_from_slice(&target.octets());
    if !src.is_unspecified() {
        body.extend_from_slice(&[1, 1, 0x02, 0, 0, 0, 0, 0x01]);
    }
    icmp6(src, dst, 135, &body).build()
}

/// An ICMPv6 neighbour advertisement for `target`, solicited, with a target link-layer option.
pub fn neighbour_advertisement(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut body = vec![0x60, 0, 0, 0];
    body.extend_from_slice(&target.octets());
    body.extend_from_slice(&[2, 1, 0x02, 0, 0, 0, 0, 0x01]);
    icmp6(src, dst, 136, &body).build()
}
