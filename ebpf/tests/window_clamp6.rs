//! `BPF_PROG_TEST_RUN` tests of the TCP clamps on IPv6: the handshake learnt under the
//! connection's IPv6 addresses, the receive window clamped and the MSS lowered (by IPv6's
//! larger header) with the TCP checksum still valid over the IPv6 pseudo-header, also behind
//! extension headers.
//!
//! Needs root (loads BPF programs); touches no network state (see `common`).

mod common;

use std::net::Ipv6Addr;

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::HashMap;
use common::*;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const POD_PORT: u16 = 40000;
const REMOTE_PORT: u16 = 443;
const REMOTE: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10);

/// A TCP segment over IPv6 with a valid checksum, behind extension headers `ext`. `ws`: a
/// window-scale option in a SYN; `mss` its MSS option.
fn seg6(
    from_pod: bool,
    flags: u8,
    window: u16,
    ws: Option<u8>,
    mss: u16,
    ext: &[(u8, Vec<u8>)],
) -> Vec<u8> {
    let (src, dst, sport, dport) = if from_pod {
        (POD_IP6, REMOTE, POD_PORT, REMOTE_PORT)
    } else {
        (REMOTE, POD_IP6, REMOTE_PORT, POD_PORT)
    };
    let mut opts = Vec::new();
    if flags & SYN != 0 {
        let m = mss.to_be_bytes();
        opts.extend_from_slice(&[2, 4, m[0], m[1], 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0]);
        opts.extend_from_slice(&ws.map_or([1, 1, 1, 1], |s| [1, 3, 3, s]));
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
    let c = l4_csum(src.into(), dst.into(), 6, &seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    Ip {
        proto: 6,
        ext: ext.to_vec(),
        payload: seg,
        ..Ip::new(src, dst)
    }
    .build()
}

fn tcp_seg(from_pod: bool, flags: u8, window: u16, ws: Option<u8>) -> Vec<u8> {
    seg6(from_pod, flags, window, ws, 1440, &[])
}

/// The TCP segment of a frame built by `seg6` with `ext_len` bytes of extension headers,
/// its checksum checked over the IPv6 pseudo-header (computed here from scratch).
fn checked_segment(pkt: &[u8], ext_len: usize) -> &[u8] {
    let ip = &pkt[ETH_HLEN..];
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).expect("16 bytes"));
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).expect("16 bytes"));
    let seg = &ip[40 + ext_len..];
    assert_eq!(
        l4_csum(src.into(), dst.into(), 6, seg),
        0,
        "TCP checksum broken"
    );
    seg
}

fn window_of(pkt: &[u8], ext_len: usize) -> u16 {
    let seg = checked_segment(pkt, ext_len);
    u16::from_be_bytes([seg[14], seg[15]])
}

fn mss_of(pkt: &[u8], ext_len: usize) -> u16 {
    let seg = checked_segment(pkt, ext_len);
    u16::from_be_bytes([seg[22], seg[23]])
}

#[track_caller]
fn host_in(f: &Fixture, pkt: &[u8]) -> Vec<u8> {
    let (ret, out) = f.run_data(programs::HOST_INGRESS, pkt, None);
    assert_eq!(ret, TC_ACT_UNSPEC);
    out
}

#[track_caller]
fn host_out(f: &Fixture, pkt: &[u8]) -> Vec<u8> {
    let (ret, out) = f.run_data(programs::HOST_EGRESS, pkt, None);
    assert_eq!(ret, TC_ACT_UNSPEC);
    out
}

/// The fixture with the pod's ingress limit at `rate` on a device of `frame`-byte frames.
fn clamping_fixture(rate: u64, frame: u32) -> Fixture {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| {
        set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, rate);
        m.frame = frame;
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

fn conn(f: &mut Fixture) -> Option<abi::Conn> {
    let m: HashMap<_, abi::ConnKey, abi::Conn> = f.map(maps::CONNS);
    m.get(
        &abi::ConnKey {
            pod_addr: POD_IP6.octets(),
            remote_addr: REMOTE.octets(),
            pod_port: POD_PORT.to_be_bytes(),
            remote_port: REMOTE_PORT.to_be_bytes(),
        },
        0,
    )
    .ok()
}

/// As window_clamp.rs's reference: rate x RTT + 16 ms of the rate, at least the floors.
fn clamped(rate: u64, c: &abi::Conn, frame: u64) -> u16 {
    let cap = (rate / 8 * (u64::from(c.rtt_ns) / 1000) / 1_000_000
        + rate / 8 * abi::WND_QUEUE_NS / 1_000_000_000)
        .max(abi::WND_MIN_FRAMES * frame);
    let cap = cap.max(abi::WND_MIN_FLOW_FRAMES * frame);
    cap.div_ceil(1 << c.wscale) as u16
}

#[test]
fn ipv6_windows_of_an_ingress_limited_pod_are_clamped_with_a_valid_checksum() {
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate, 0);
    let syn = tcp_seg(true, SYN, 64240, Some(7));
    assert_eq!(
        window_of(&host_in(&f, &syn), 0),
        64240,
        "a SYN is never clamped"
    );
    let c = conn(&mut f).expect("the SYN was learnt under the IPv6 addresses");
    assert_eq!((c.state, c.wscale), (abi::CONN_SYN_SENT, 7));
    host_out(&f, &tcp_seg(false, SYN | ACK, 65160, Some(9)));
    let c = conn(&mut f).expect("conn");
    assert_eq!((c.state, c.wscale), (abi::CONN_ESTABLISHED, 7));
    let want = clamped(rate, &c, abi::MIN_FRAME);
    assert!((150..=170).contains(&want), "{want}");
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(true, ACK, 65535, None)), 0),
        want
    );
    // Only lowered; segments to the pod untouched.
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(true, ACK, 100, None)), 0),
        100
    );
    assert_eq!(
        window_of(&host_out(&f, &tcp_seg(false, ACK, 65535, None)), 0),
        65535
    );

    // Behind a hop-by-hop and a destination-options header (8 + 16 bytes) the TCP header is
    // found, the window clamped and the checksum still valid; the extensions are untouched.
    let ext = [ext_opts(NEXTHDR_HOP, 1), ext_opts(NEXTHDR_DEST, 2)];
    let ack = seg6(true, ACK, 65535, None, 0, &ext);
    let out = host_in(&f, &ack);
    assert_eq!(window_of(&out, 24), want);
    assert_eq!(out[..ETH_HLEN + 40 + 24], ack[..ETH_HLEN + 40 + 24]);
}

#[test]
fn ipv6_syns_get_the_mss_of_ipv6_frames() {
    // A 10 Mbit/s ingress limit on a jumbo-frame device: segments of a 1514-byte frame,
    // which carries 1514 - 14 - 40 - 20 = 1440 bytes of TCP payload over IPv6 (1460 over
    // IPv4).
    let f = clamping_fixture(10_000_000, 9014);
    for ext in [vec![], vec![ext_opts(NEXTHDR_DEST, 1)]] {
        let ext_len: usize = ext.iter().map(|(_, b)| 1 + b.len()).sum();
        let syn = seg6(true, SYN, 64240, Some(7), 8940, &ext);
        assert_eq!(
            mss_of(&host_in(&f, &syn), ext_len),
            1440,
            "{ext_len} bytes of extensions"
        );
        // An MSS already below it stays.
        let small = seg6(true, SYN, 64240, Some(7), 1200, &ext);
        assert_eq!(mss_of(&host_in(&f, &small), ext_len), 1200);
    }
}
