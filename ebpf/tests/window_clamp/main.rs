//! `BPF_PROG_TEST_RUN` tests of the TCP clamps: receive-window clamping and MSS lowering for
//! pods with an ingress limit and for the node's internet cap (`window`), and the connection
//! table they learn handshakes in (`conn_table`). Each test runs for IPv4 and IPv6
//! (`name::ipv4`, `name::ipv6`): the connection is learnt under its addresses of either family,
//! the TCP checksum stays valid over that family's pseudo-header, and the MSS is lowered by
//! that family's header. Segments behind IPv6 extension headers are tested on their own.
//!
//! Needs root (loads BPF programs); touches no network state (see `common`).

#[path = "../common/mod.rs"]
mod common;
mod conn_table;
mod window;

use std::net::IpAddr;

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::HashMap;
use common::*;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;
const FIN: u8 = 0x01;
const POD_PORT: u16 = 40000;
const REMOTE_PORT: u16 = 443;

/// The remote end of the test connections: a host on the internet.
fn remote(fam: Family) -> IpAddr {
    fam.addr("203.0.113.9", "2001:db8::10")
}

/// A TCP segment of the connection between the pod's port `pod_port` and the remote's 443,
/// with a valid checksum. A SYN carries an MSS option, SACK permitted, timestamps and a
/// window-scale option `ws` (or NOPs), as Linux orders them; other segments timestamps.
#[derive(Clone)]
struct Seg {
    fam: Family,
    pod_port: u16,
    from_pod: bool,
    flags: u8,
    window: u16,
    ws: Option<u8>,
    mss: u16,
    /// IPv6 extension headers before the TCP header.
    ext: Vec<(u8, Vec<u8>)>,
}

impl Seg {
    /// A segment on the pod's port 40000 with the MSS of a 1514-byte frame.
    fn new(fam: Family, from_pod: bool, flags: u8, window: u16, ws: Option<u8>) -> Self {
        Self {
            fam,
            pod_port: POD_PORT,
            from_pod,
            flags,
            window,
            ws,
            mss: fam.mss(1514),
            ext: Vec::new(),
        }
    }

    fn build(&self) -> Vec<u8> {
        let (src, dst, sport, dport) = if self.from_pod {
            (self.fam.pod(), remote(self.fam), self.pod_port, REMOTE_PORT)
        } else {
            (remote(self.fam), self.fam.pod(), REMOTE_PORT, self.pod_port)
        };
        let mut opts = Vec::new();
        if self.flags & SYN != 0 {
            let m = self.mss.to_be_bytes();
            opts.extend_from_slice(&[2, 4, m[0], m[1], 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0]);
            opts.extend_from_slice(&self.ws.map_or([1, 1, 1, 1], |s| [1, 3, 3, s]));
        } else {
            opts.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 2, 0, 0, 0, 1]);
        }
        let mut seg = vec![0u8; 20];
        seg[0..2].copy_from_slice(&sport.to_be_bytes());
        seg[2..4].copy_from_slice(&dport.to_be_bytes());
        seg[4..8].copy_from_slice(&1000u32.to_be_bytes());
        seg[8..12].copy_from_slice(&2000u32.to_be_bytes());
        seg[12] = (((20 + opts.len()) / 4) << 4) as u8;
        seg[13] = self.flags;
        seg[14..16].copy_from_slice(&self.window.to_be_bytes());
        seg.extend(opts);
        let c = l4_csum(src, dst, 6, &seg);
        seg[16..18].copy_from_slice(&c.to_be_bytes());
        Ip {
            proto: 6,
            ext: self.ext.clone(),
            payload: seg,
            ..Ip::new(src, dst)
        }
        .build()
    }
}

/// A segment of the connection on the pod's port 40000. `ws`: a window-scale option in a
/// SYN.
fn tcp_seg(fam: Family, from_pod: bool, flags: u8, window: u16, ws: Option<u8>) -> Vec<u8> {
    Seg::new(fam, from_pod, flags, window, ws).build()
}

/// `tcp_seg` with the MSS option (SYNs only) set to `mss`.
fn tcp_seg_mss(
    fam: Family,
    from_pod: bool,
    flags: u8,
    window: u16,
    ws: Option<u8>,
    mss: u16,
) -> Vec<u8> {
    Seg {
        mss,
        ..Seg::new(fam, from_pod, flags, window, ws)
    }
    .build()
}

/// A segment without options but timestamps (no SYN) of the connection on the pod's port
/// `pod_port`.
fn tcp_seg_on(fam: Family, pod_port: u16, from_pod: bool, flags: u8, window: u16) -> Vec<u8> {
    assert_eq!(flags & SYN, 0);
    Seg {
        pod_port,
        ..Seg::new(fam, from_pod, flags, window, None)
    }
    .build()
}

/// The TCP window of a frame, checking its TCP checksum.
#[track_caller]
fn window_of(pkt: &[u8]) -> u16 {
    let seg = checked_tcp(pkt);
    u16::from_be_bytes([seg[14], seg[15]])
}

/// The MSS option of a SYN (checking the TCP checksum).
#[track_caller]
fn mss_of(pkt: &[u8]) -> u16 {
    let seg = checked_tcp(pkt);
    assert_eq!(&seg[20..22], &[2, 4], "MSS option first");
    u16::from_be_bytes([seg[22], seg[23]])
}

fn conn(f: &mut Fixture, fam: Family) -> Option<abi::Conn> {
    let m: HashMap<_, abi::ConnKey, abi::Conn> = f.map(maps::CONNS);
    m.get(
        &abi::ConnKey {
            pod_addr: abi::conn_addr(fam.pod()),
            remote_addr: abi::conn_addr(remote(fam)),
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

/// `pkt` from the pod through its host veth (the host-side ingress program), which passes
/// it; the packet as the program left it.
#[track_caller]
fn host_in(f: &Fixture, pkt: &[u8]) -> Vec<u8> {
    let (ret, out) = f.run_data(programs::HOST_INGRESS, pkt, None);
    assert_eq!(ret, TC_ACT_UNSPEC);
    out
}

/// `pkt` to the pod through its host veth (the host-side egress program), which passes it;
/// the packet as the program left it.
#[track_caller]
fn host_out(f: &Fixture, pkt: &[u8]) -> Vec<u8> {
    let (ret, out) = f.run_data(programs::HOST_EGRESS, pkt, None);
    assert_eq!(ret, TC_ACT_UNSPEC);
    out
}

/// The pod's SYN (window scale `pod_ws`) out and the server's SYN-ACK (`remote_ws`) back.
fn pod_connects(f: &Fixture, fam: Family, pod_ws: Option<u8>, remote_ws: Option<u8>) {
    host_in(f, &tcp_seg(fam, true, SYN, 64240, pod_ws));
    host_out(f, &tcp_seg(fam, false, SYN | ACK, 65160, remote_ws));
}

/// The fixture with the pod's ingress limit at `rate`.
fn clamping_fixture(rate: u64) -> Fixture {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, rate));
    f
}
