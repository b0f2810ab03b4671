//! `BPF_PROG_TEST_RUN` tests of TCP receive-window clamping and MSS lowering for pods
//! with an ingress limit and for the node's internet cap.
//!
//! Needs root (loads BPF programs); touches no network state (see `common`).

mod common;

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::HashMap;
use common::*;

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
    tcp_seg_on(POD_PORT, from_pod, flags, window, ws, mss)
}

/// `tcp_seg_mss` of the connection on the pod's port `pod_port`.
fn tcp_seg_on(
    pod_port: u16,
    from_pod: bool,
    flags: u8,
    window: u16,
    ws: Option<u8>,
    mss: u16,
) -> Vec<u8> {
    let (src, dst, sport, dport) = if from_pod {
        (POD_IP, ip("203.0.113.9"), pod_port, REMOTE_PORT)
    } else {
        (ip("203.0.113.9"), POD_IP, REMOTE_PORT, pod_port)
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

fn conn(f: &mut Fixture) -> Option<abi::Conn> {
    let m: HashMap<_, abi::ConnKey, abi::Conn> = f.map(maps::CONNS);
    m.get(
        &abi::ConnKey {
            pod_addr: abi::conn_addr(POD_IP.into()),
            remote_addr: abi::conn_addr(ip("203.0.113.9").into()),
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
fn pod_connects(f: &Fixture, pod_ws: Option<u8>, remote_ws: Option<u8>) {
    host_in(f, &tcp_seg(true, SYN, 64240, pod_ws));
    host_out(f, &tcp_seg(false, SYN | ACK, 65160, remote_ws));
}

/// The fixture with the pod's ingress limit at `rate`.
fn clamping_fixture(rate: u64) -> Fixture {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, rate));
    f
}

#[test]
fn the_benchmarks_object_switches_the_clamp_off() {
    let rate = 10_000_000;
    let mut f = Fixture::bench_with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, rate));
    pod_connects(&f, Some(7), Some(9));
    let c = conn(&mut f).expect("conn");
    let want = clamped(rate, &c);
    assert!(want < 65535);
    let ack = tcp_seg(true, ACK, 65535, None);
    assert_eq!(window_of(&host_in(&f, &ack)), want);
    f.update_config(|c| c.flags |= abi::CFG_CLAMP_OFF);
    assert_eq!(window_of(&host_in(&f, &ack)), 65535);
}

#[test]
fn tcp_windows_of_an_ingress_limited_pod_are_clamped_to_the_path_and_a_short_queue() {
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate);

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

    // The product's object has no switch: the benchmarks' flag changes nothing.
    f.update_config(|c| c.flags |= abi::CFG_CLAMP_OFF);
    assert_eq!(
        window_of(&host_in(&f, &tcp_seg(true, ACK, 65535, None))),
        want
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
    // No ingress limit: only the node's internet cap, whose senders are the pods.
    let rate = 10_000_000;
    let mut f = Fixture::with_policy();
    f.set_node_limit(abi::Direction::Egress, abi::KIND_INTERNET, Some(rate));
    f.update_config(|c| c.uplink_frame = 1514);
    // The pod connects (scale 7); the server answers with scale 9.
    pod_connects(&f, Some(7), Some(9));
    let c = conn(&mut f).expect("learnt for the node cap");
    assert_eq!(
        (c.state, c.wscale, c.remote_wscale),
        (abi::CONN_ESTABLISHED, 7, 9)
    );
    // The server's windows to the pod are capped at the cap's rate x (RTT + 16 ms), in its
    // own scale; the pod's windows are not touched (no ingress limit).
    let to_pod = |f: &Fixture, win: u16| window_of(&host_out(f, &tcp_seg(false, ACK, win, None)));
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
    let out = host_in(&f, &tcp_seg(true, ACK, 65535, None));
    assert_eq!(window_of(&out), 65535, "the pod's own windows stay");

    // The pod as the server: the remote's scale comes from its SYN.
    host_out(&f, &tcp_seg(false, SYN, 64240, Some(5)));
    host_in(&f, &tcp_seg(true, SYN | ACK, 65160, Some(7)));
    host_out(&f, &tcp_seg(false, ACK, 502, None));
    let c = conn(&mut f).expect("conn");
    assert_eq!(
        (c.state, c.wscale, c.remote_wscale),
        (abi::CONN_ESTABLISHED, 7, 5)
    );

    // Without a cap nothing is clamped.
    f.set_node_limit(abi::Direction::Egress, abi::KIND_INTERNET, None);
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
    // A pod with a 10 Mbit/s ingress limit on a 9000-byte MTU: its SYN's MSS (8960) becomes
    // a 1500-byte network's, so senders into its class use 1514-byte frames.
    let mut f = clamping_fixture(10_000_000);
    f.update_meta(|m| m.frame = 9014);
    let out = host_in(&f, &tcp_seg_mss(true, SYN, 64240, Some(7), 8960));
    assert_eq!(mss_of(&out), 1460);
    // The window clamp's floor is then in those frames too: 2 x 1514 per flow, not 2 x 9014.
    host_out(&f, &tcp_seg_mss(false, SYN | ACK, 65160, Some(7), 1460));
    let c = conn(&mut f).expect("conn");
    let out = host_in(&f, &tcp_seg(true, ACK, 65535, None));
    assert_eq!(window_of(&out), clamped_with(10_000_000, &c, 1, 1514));
    // From ~72 Mbit/s a jumbo segment takes under 1 ms: the pod's MSS passes as it is. A
    // smaller MSS is never raised.
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, 100_000_000));
    let out = host_in(&f, &tcp_seg_mss(true, SYN, 64240, Some(7), 8960));
    assert_eq!(mss_of(&out), 8960);
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, 10_000_000));
    let out = host_in(&f, &tcp_seg_mss(true, SYN, 64240, Some(7), 1200));
    assert_eq!(mss_of(&out), 1200);

    // A pod with only an egress limit: the remote's MSS in its SYN-ACK bounds what the pod's
    // own TCP sends into its egress class; no connection is tracked for it.
    let mut f = Fixture::with_policy();
    f.update_meta(|m| {
        set_rate(m, abi::Direction::Egress, abi::KIND_TOTAL, 10_000_000);
        m.frame = 9014;
    });
    assert_eq!(remote_mss_after_handshake(&f, 8960), 1460);
    assert!(conn(&mut f).is_none(), "nothing to clamp: not tracked");

    // The node cap: the remote's MSS in its SYN-ACK to a pod bounds what the pod sends.
    let mut f = Fixture::with_policy();
    f.set_node_limit(abi::Direction::Egress, abi::KIND_INTERNET, Some(10_000_000));
    f.update_config(|c| c.uplink_frame = 9014);
    assert_eq!(remote_mss_after_handshake(&f, 8960), 1460);
}

/// The pod connects (MSS 8960); returns the MSS of the server's SYN-ACK (`mss`) as it
/// reaches the pod.
fn remote_mss_after_handshake(f: &Fixture, mss: u16) -> u16 {
    host_in(f, &tcp_seg_mss(true, SYN, 64240, Some(7), 8960));
    let out = host_out(f, &tcp_seg_mss(false, SYN | ACK, 65160, Some(7), mss));
    mss_of(&out)
}

#[test]
fn connections_no_limit_applies_to_keep_their_windows() {
    // Limits on traffic to the pod, but none that this connection's traffic meets: a named
    // class's (another destination) and an egress one. The connection is not even learnt.
    let mut f = Fixture::with_policy();
    f.prefix(0, (ip("198.51.100.0"), 24), abi::CLASS_NAMED);
    f.update_meta(|m| {
        set_rate(m, abi::Direction::Ingress, abi::KIND_NAMED, 10_000_000);
        set_rate(m, abi::Direction::Egress, abi::KIND_NAMED, 10_000_000);
    });
    pod_connects(&f, Some(7), Some(7));
    assert!(conn(&mut f).is_none());
    let out = host_in(&f, &tcp_seg(true, ACK, 65535, None));
    assert_eq!(window_of(&out), 65535);
    // The internet's download limit covers it.
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_INTERNET, 10_000_000));
    pod_connects(&f, Some(7), Some(7));
    assert!(conn(&mut f).is_some());
}

/// `abi::flow_bucket` is the programs' hash: each flow's bulk packets set the bit it predicts
/// in the class's bulk-flow bitmap (TCP and UDP with ports, ICMP and fragments without).
#[test]
fn flow_buckets_are_the_ones_user_space_computes() {
    let mut f = clamping_fixture(10_000_000);
    let remote = ip("203.0.113.9");
    let mut expected = 0u64;
    let mut flows = Vec::new();
    for (i, sport) in [40000u16, 40001, 51234, 65535, 1].into_iter().enumerate() {
        let mut seg = tcp(remote, POD_IP, 1448);
        seg.payload[0..2].copy_from_slice(&sport.to_be_bytes());
        seg.payload[2..4].copy_from_slice(&(5201 + i as u16).to_be_bytes());
        flows.push((seg.build(), 6, Some((sport, 5201 + i as u16))));
    }
    let mut udp = tcp(remote, POD_IP, 1448);
    udp.proto = 17;
    udp.payload[0..4].copy_from_slice(&[0x30, 0x39, 0x00, 0x35]);
    flows.push((udp.build(), 17, Some((12345, 53))));
    let mut frag = tcp(remote, POD_IP, 1448);
    frag.frag = (true, 0);
    flows.push((frag.build(), 6, None));
    let mut echo = Ip::new(remote, POD_IP);
    echo.payload.resize(1400, 0xab);
    flows.push((echo.build(), 1, None));
    for (pkt, proto, ports) in &flows {
        let bucket = abi::flow_bucket(remote.into(), POD_IP.into(), *proto, *ports);
        // Past the flow's sparse budget: bulk.
        for _ in 0..4 {
            host_out(&f, pkt);
        }
        let q = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
        assert_ne!(
            q.flows_cur & (1 << bucket),
            0,
            "proto {proto} ports {ports:?}: {q:?}"
        );
        expected |= 1 << bucket;
    }
    let q = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
    assert_eq!(q.flows_cur, expected, "{q:?}");
}

#[test]
fn the_window_clamp_is_shared_by_the_flows_queued_in_the_class() {
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate);
    pod_connects(&f, Some(7), Some(7));
    let c = conn(&mut f).expect("established");
    // Data for the connection: it now counts as one flow of the class.
    let mut data = tcp(ip("203.0.113.9"), POD_IP, 1448);
    data.payload[0..2].copy_from_slice(&REMOTE_PORT.to_be_bytes());
    data.payload[2..4].copy_from_slice(&POD_PORT.to_be_bytes());
    host_out(&f, &data.build());
    let q = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
    assert_eq!(q.flows_cur.count_ones(), 1, "{q:?}");
    let ack = tcp_seg(true, ACK, 65535, None);
    let out = host_in(&f, &ack);
    assert_eq!(window_of(&out), clamped(rate, &c));

    // Three more downloads into the pod (other remote ports) queue bulk data.
    for port in [444u16, 445, 446] {
        let mut seg = tcp(ip("203.0.113.9"), POD_IP, 1448);
        seg.payload[0..2].copy_from_slice(&port.to_be_bytes());
        let pkt = seg.build();
        for _ in 0..3 {
            host_out(&f, &pkt);
        }
    }
    let q = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
    let flows = u64::from((q.flows_cur | q.flows_prev).count_ones());
    // Four flows in 64 buckets; these four hash apart.
    assert_eq!(flows, 4, "{q:?}");
    let out = host_in(&f, &ack);
    assert_eq!(window_of(&out), clamped_among(rate, &c, flows));
    assert!(clamped_among(rate, &c, flows) < clamped(rate, &c) / 3);
}

#[test]
fn the_window_clamp_floor_is_in_the_classs_segments() {
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
    let out = host_in(&f, &tcp_seg(true, ACK, 65535, None));
    assert_eq!(window_of(&out), want);
}

// ---- the connection table: each pod's share, resets, the sweep, learning again ----------

const RST: u8 = 0x04;
const FIN: u8 = 0x01;

fn table(f: &mut Fixture) -> HashMap<aya::maps::MapData, abi::ConnKey, abi::Conn> {
    f.map(maps::CONNS)
}

fn entries(f: &mut Fixture) -> usize {
    table(f).keys().count()
}

fn pod_rt(f: &mut Fixture) -> abi::PodRt {
    let m: aya::maps::Array<_, abi::PodRt> = f.map(maps::POD_RT);
    m.get(&SLOT, 0).expect("pod rt")
}

/// The pod connects from `port`: its SYN out, the server's SYN-ACK back.
fn connect_from(f: &Fixture, port: u16) {
    host_in(f, &tcp_seg_on(port, true, SYN, 64240, Some(7), 1460));
    host_out(f, &tcp_seg_on(port, false, SYN | ACK, 65160, Some(7), 1460));
}

/// The sweep program once: how many entries it removed.
fn sweep(f: &Fixture) -> u32 {
    f.run_data(programs::CONNS_SWEEP, &[0u8; 64], None).0
}

/// `bpf_ktime_get_ns()` in the table's time unit.
fn now_units() -> u32 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) },
        0
    );
    ((t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64) >> abi::CONN_TIME_SHIFT) as u32
}

#[test]
fn a_pod_holds_at_most_its_share_of_the_connection_table() {
    let mut f = clamping_fixture(10_000_000);
    f.update_config(|c| c.conn_share = 8);
    for port in 0..12 {
        connect_from(&f, 41_000 + port);
    }
    // A pod opening connections fast learns its share and no more: it cannot evict the
    // entries of other pods (the table was one LRU for the node).
    assert_eq!(entries(&mut f), 8);
    let rt = pod_rt(&mut f);
    assert_eq!((rt.conns, rt.conns_refused), (8, 4));
    // The handshake of a connection it holds again (same ports) takes no second place.
    connect_from(&f, 41_000);
    assert_eq!((entries(&mut f), pod_rt(&mut f).conns), (8, 8));
    // A reset, either way, gives its place back at once.
    host_in(&f, &tcp_seg_on(41_001, true, RST | ACK, 0, None, 0));
    host_out(&f, &tcp_seg_on(41_002, false, RST, 0, None, 0));
    assert_eq!((entries(&mut f), pod_rt(&mut f).conns), (6, 6));
    connect_from(&f, 41_100);
    let rt = pod_rt(&mut f);
    assert_eq!((entries(&mut f), rt.conns, rt.conns_refused), (7, 7, 4));
    // A share too small for the connections a pod holds refuses new ones; it never
    // reclaims what is held.
    f.update_config(|c| c.conn_share = 2);
    connect_from(&f, 41_200);
    assert_eq!((entries(&mut f), pod_rt(&mut f).conns_refused), (7, 5));
    // Shares follow the pods attached, with a floor of AN_CONN_SHARE_MIN pods' worth.
    assert_eq!(abi::conn_share(1), abi::MAX_CONNS / abi::CONN_SHARE_MIN);
    assert_eq!(abi::conn_share(110), abi::MAX_CONNS / 110);
}

#[test]
fn the_sweep_removes_silent_closed_and_orphaned_connections() {
    let mut f = clamping_fixture(10_000_000);
    f.update_meta(|m| m.flags = abi::META_IN_USE);
    for port in 0..5 {
        connect_from(&f, 42_000 + port);
    }
    // 42000 established and active; 42001 closed by both sides a while ago; 42002 silent
    // past the idle time; 42003 a handshake that never completed; 42004 of an earlier
    // attachment of the slot.
    host_in(&f, &tcp_seg_on(42_001, true, FIN | ACK, 64240, None, 0));
    host_out(&f, &tcp_seg_on(42_001, false, FIN | ACK, 65160, None, 0));
    let now = now_units();
    let mut t = table(&mut f);
    let keys: Vec<abi::ConnKey> = t.keys().map(|k| k.expect("key")).collect();
    assert_eq!(keys.len(), 5);
    for k in &keys {
        let mut c = t.get(k, 0).expect("entry");
        match u16::from_be_bytes(k.pod_port) {
            42_000 => {}
            42_001 => {
                assert_eq!(
                    c.flags & (abi::CONN_F_FIN_POD | abi::CONN_F_FIN_REMOTE),
                    abi::CONN_F_FIN_POD | abi::CONN_F_FIN_REMOTE
                );
                c.t_last = now - abi::CONN_CLOSED_TTL_S - 1;
            }
            42_002 => c.t_last = now - abi::CONN_IDLE_TTL_S - 1,
            42_003 => {
                c.state = abi::CONN_SYN_SENT;
                c.t_last = now - abi::CONN_HANDSHAKE_TTL_S - 1;
            }
            _ => c.gen = c.gen.wrapping_add(1),
        }
        t.insert(k, c, 0).expect("age entry");
    }
    assert_eq!(sweep(&f), 4);
    let left: Vec<u16> = table(&mut f)
        .keys()
        .map(|k| u16::from_be_bytes(k.expect("key").pod_port))
        .collect();
    assert_eq!(left, [42_000]);
    // Each removal gave its place back to its pod's share; the orphan's pod was another
    // attachment, whose count this one does not carry.
    assert_eq!(pod_rt(&mut f).conns, 2);
    assert_eq!(sweep(&f), 0);
    // A pod that is gone loses all its entries at the next sweep.
    f.update_meta(|m| m.flags = 0);
    assert_eq!(sweep(&f), 1);
    assert_eq!(entries(&mut f), 0);
}

#[test]
fn a_connection_whose_entry_went_is_learnt_again_and_clamped() {
    let rate = 10_000_000;
    let mut f = clamping_fixture(rate);
    f.update_meta(|m| m.flags = abi::META_IN_USE);
    pod_connects(&f, Some(7), Some(7));
    host_in(&f, &tcp_seg(true, ACK, 64240, None));
    let c = conn(&mut f).expect("learnt");
    assert_eq!(c.state, abi::CONN_ESTABLISHED);
    let clamped_window = window_of(&host_in(&f, &tcp_seg(true, ACK, 64240, None)));
    assert_eq!(clamped_window, clamped(rate, &c));
    // The entry goes (idle past its time to live), the connection goes on.
    let mut t = table(&mut f);
    let key = t.keys().next().expect("one entry").expect("key");
    let mut aged = c;
    aged.t_last = now_units() - abi::CONN_IDLE_TTL_S - 1;
    t.insert(key, aged, 0).expect("age entry");
    assert_eq!(sweep(&f), 1);
    assert!(conn(&mut f).is_none());
    // Its next packet learns it again with the pod's handshake (window scale and round
    // trip), so its windows are clamped again; the remote's scale is unknown.
    let first = host_in(&f, &tcp_seg(true, ACK, 64240, None));
    assert_eq!(window_of(&first), 64240, "clamped from the next packet on");
    let again = conn(&mut f).expect("learnt again");
    assert_eq!(again.flags & abi::CONN_F_RELEARNT, abi::CONN_F_RELEARNT);
    assert_eq!((again.wscale, again.rtt_ns), (c.wscale, c.rtt_ns));
    let rt = pod_rt(&mut f);
    assert_eq!((rt.conns, rt.conns_relearnt), (1, 1));
    let w = window_of(&host_in(&f, &tcp_seg(true, ACK, 64240, None)));
    assert_eq!(w, clamped(rate, &again));
    // Of a pod at its share, a packet of a connection without an entry is not learnt and
    // not counted again and again as refused.
    f.update_config(|c| c.conn_share = 1);
    host_in(&f, &tcp_seg_on(43_000, true, ACK, 64240, None, 0));
    host_in(&f, &tcp_seg_on(43_000, true, ACK, 64240, None, 0));
    let rt = pod_rt(&mut f);
    assert_eq!((rt.conns, rt.conns_refused, entries(&mut f)), (1, 0, 1));
}
