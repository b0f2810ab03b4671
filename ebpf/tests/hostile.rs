//! `BPF_PROG_TEST_RUN` tests of what a hostile or broken pod can put on its veth: forged
//! source addresses, VLAN tags, malformed TCP and IPv4 headers, fragments; and the extreme
//! rates and bursts userspace may configure. Each checks the verdict, the counters and the
//! packet bytes the program leaves: options are rewritten only in a well-formed header.
//!
//! Checksum offload: a test run's skb is CHECKSUM_NONE, and `struct __sk_buff` as a test
//! run's ctx cannot set `ip_summed`, so CHECKSUM_PARTIAL packets cannot be built here. What
//! is tested is the clamps' incremental update (`bpf_l4_csum_replace` without flags, as the
//! programs call it): the TCP checksum of a rewritten segment is verified over the pseudo
//! header. With CHECKSUM_PARTIAL the kernel leaves the field alone for such an update, and
//! the checksum is computed over the rewritten bytes when the packet leaves.
//!
//! Needs root (loads BPF programs); touches no network state.

mod common;

use std::net::Ipv4Addr;

use aliasnet_ebpf::{abi, limits, maps, programs, shape::Shape};
use aya::maps::{Array, HashMap};
use common::*;

use abi::{Class::*, Direction::*};

/// Another pod on the node, registered in `an_pod_ips` at its own slot.
const OTHER_POD_IP: Ipv4Addr = Ipv4Addr::new(10, 20, 0, 6);
const OTHER_SLOT: u32 = 8;
const INTERNET: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);

fn fixture() -> Fixture {
    let mut f = Fixture::new();
    let mut ips: HashMap<_, [u8; 4], u32> = f.map(maps::POD_IPS);
    ips.insert(OTHER_POD_IP.octets(), OTHER_SLOT, 0)
        .expect("register other pod ip");
    f
}

/// The pod with an ingress limit of `rate` on a device of `frame`-byte frames: its SYNs'
/// MSS is clamped and its connections' windows too.
fn limited_fixture(rate: u64, frame: u32) -> Fixture {
    let mut f = fixture();
    let mut pods: HashMap<_, u32, abi::Pod> = f.map(maps::PODS);
    pods.insert(
        TEST_IFINDEX,
        abi::Pod {
            slot: SLOT,
            flags: 0,
            ipv4: POD_IP.octets(),
            ..Default::default()
        },
        0,
    )
    .expect("register pod");
    f.update_meta(|m| {
        m.flags = abi::META_IN_USE;
        set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, rate);
        m.frame = frame;
    });
    f
}

fn counters_of(f: &mut Fixture, slot: u32) -> abi::PodCounters {
    let arr: aya::maps::PerCpuArray<_, abi::PodCounters> = f.map(maps::COUNTERS);
    let mut total = abi::PodCounters::default();
    for v in arr.get(&slot, 0).expect("counters").iter() {
        total += *v;
    }
    total
}

fn spoofed(packets: u64, bytes: usize) -> abi::PodCounters {
    abi::PodCounters {
        spoofed: c(packets, bytes),
        ..Default::default()
    }
}

// ---- TCP segments with a real checksum ----------------------------------------------------

const SYN: u8 = 0x02;

/// A TCP segment from `src` to `dst` whose header carries `opts` (padded with EOL to whole
/// words; `doff` overrides the data offset), `data` after it, and a correct checksum.
fn tcp_raw(src: Ipv4Addr, dst: Ipv4Addr, flags: u8, opts: &[u8], doff: Option<u8>) -> Vec<u8> {
    let mut seg = vec![0u8; 20];
    seg[0..2].copy_from_slice(&40000u16.to_be_bytes());
    seg[2..4].copy_from_slice(&443u16.to_be_bytes());
    seg[4..8].copy_from_slice(&1000u32.to_be_bytes());
    seg[13] = flags;
    seg[14..16].copy_from_slice(&64240u16.to_be_bytes());
    seg.extend_from_slice(opts);
    while !seg.len().is_multiple_of(4) {
        seg.push(0);
    }
    seg[12] = doff.unwrap_or((seg.len() / 4) as u8) << 4;
    let c = tcp_csum(src, dst, &seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    seg
}

fn tcp_csum(src: Ipv4Addr, dst: Ipv4Addr, seg: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(12 + seg.len());
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(seg);
    csum(&pseudo)
}

/// The segment as an IPv4 packet with `ip_opts` and fragment fields `frag`.
fn tcp_packet(seg: Vec<u8>, ip_opts: &[u8], frag: (bool, u16)) -> Vec<u8> {
    Ip {
        proto: 6,
        options: ip_opts.to_vec(),
        frag,
        payload: seg,
        ..Ip::new(POD_IP, INTERNET)
    }
    .build()
}

const MSS_9000: [u8; 4] = [2, 4, 0x23, 0x18]; // MSS 8960
/// What a 10 Mbit/s ingress limit on a jumbo-frame device clamps an MSS to (1514 - 54).
const CLAMPED_MSS: u16 = 1460;

/// The TCP segment of `pkt` (after `ihl` words of IPv4 header).
fn segment(pkt: &[u8], ihl: usize) -> &[u8] {
    &pkt[ETH_HLEN + ihl * 4..]
}

// ---- forged sources ---------------------------------------------------------------------

#[test]
fn forged_sources_are_dropped_on_the_host_veth_and_counted_as_spoofed() {
    let mut f = fixture();
    let own = Ip::new(POD_IP, INTERNET).build();
    assert_eq!(f.run(programs::HOST_INGRESS, &own, None).0, TC_ACT_UNSPEC);
    let forged = [
        Ip::new(Ipv4Addr::new(198, 51, 100, 1), INTERNET).build(),
        // Another pod's address: counted here, on the veth it came from, not on that pod.
        Ip::new(OTHER_POD_IP, INTERNET).build(),
        Ip::new(Ipv4Addr::UNSPECIFIED, INTERNET).build(),
        Ip::new(Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(10, 1, 2, 3)).build(),
        // To a blocked address: dropped as spoofed, not counted as blocked.
        Ip::new(OTHER_POD_IP, Ipv4Addr::new(169, 254, 169, 254)).build(),
    ];
    for pkt in &forged {
        assert_eq!(f.run(programs::HOST_INGRESS, pkt, None).0, TC_ACT_SHOT);
    }
    let bytes: usize = forged.iter().map(Vec::len).sum();
    let mut want = spoofed(forged.len() as u64, bytes);
    want.dir[Egress.index()][Internet.index()] = c(1, own.len());
    assert_eq!(f.counters(), want);
    assert_eq!(counters_of(&mut f, OTHER_SLOT), abi::PodCounters::default());
    // Traffic to the pod is never checked for its source.
    let from_anyone = Ip::new(Ipv4Addr::new(198, 51, 100, 1), POD_IP).build();
    assert_eq!(
        f.run(programs::HOST_EGRESS, &from_anyone, None).0,
        TC_ACT_UNSPEC
    );
}

#[test]
fn arp_and_malformed_ip_from_the_pod_still_pass() {
    let mut f = fixture();
    // ARP for the gateway names the pod's address as sender; malformed IPv4 and IPv6 are
    // dropped by ip_rcv and ipv6_rcv. Passed and counted as other. (A test run refuses an IP
    // frame shorter than the fixed header; the parser's bounded load passes one as other.)
    let arp = arp_request();
    // IPv6 ethertype, version 5.
    let mut v6 = Ip::new(ip6("2001:db8::66"), ip6("fd00:ec2::254")).build();
    v6[ETH_HLEN] = 0x50;
    let mut bad_ihl = Ip::new(Ipv4Addr::new(198, 51, 100, 1), INTERNET).build();
    bad_ihl[ETH_HLEN] = 0x43;
    for pkt in [&arp, &v6, &bad_ihl] {
        let (ret, out) = f.run_data(programs::HOST_INGRESS, pkt, None);
        assert_eq!(ret, TC_ACT_UNSPEC);
        assert_eq!(&out, pkt);
    }
    let other = (arp.len() + v6.len() + bad_ihl.len()) as u64;
    let got = f.counters();
    assert_eq!(got.spoofed, abi::Counter::default());
    assert_eq!(
        got.get(Egress, Other),
        abi::Counter {
            packets: 3,
            bytes: other
        }
    );
}

#[test]
fn a_forged_syn_teaches_the_connection_table_nothing() {
    let mut f = limited_fixture(10_000_000, 9014);
    let src = OTHER_POD_IP;
    let seg = tcp_raw(src, INTERNET, SYN, &MSS_9000, None);
    let pkt = Ip {
        proto: 6,
        payload: seg,
        ..Ip::new(src, INTERNET)
    }
    .build();
    let (ret, out) = f.run_data(programs::HOST_INGRESS, &pkt, None);
    assert_eq!(ret, TC_ACT_SHOT);
    assert_eq!(out, pkt, "a dropped packet is not rewritten");
    let conns: HashMap<_, abi::ConnKey, abi::Conn> = f.map(maps::CONNS);
    assert_eq!(conns.keys().count(), 0);
    assert_eq!(f.counters(), spoofed(1, pkt.len()));
}

/// 802.1Q: the kernel takes a frame's outer tag off before tc ingress, so a tag the host
/// veth program still sees is a second one (in a test run, whose skb is not untagged, the
/// only one). The kernel would strip a second priority tag (VLAN 0) and route the IPv4
/// packet inside, past the programs: the host veth drops such frames as spoofed. The other
/// programs pass them unparsed, counted as other, as any non-IPv4 frame.
#[test]
fn vlan_tagged_frames_from_the_pod_are_dropped() {
    let mut f = fixture();
    for tpid in [0x8100u16, 0x88a8] {
        let inner = Ip::new(POD_IP, Ipv4Addr::new(169, 254, 169, 254)).build();
        let mut tagged = inner[..12].to_vec();
        tagged.extend_from_slice(&tpid.to_be_bytes());
        tagged.extend_from_slice(&[0, 0]); // VLAN 0: a priority tag
        tagged.extend_from_slice(&inner[12..]);
        let (ret, out) = f.run_data(programs::HOST_INGRESS, &tagged, None);
        assert_eq!(ret, TC_ACT_SHOT, "TPID {tpid:#x}");
        assert_eq!(out, tagged);
        for prog in [
            programs::HOST_EGRESS,
            programs::POD_EGRESS,
            programs::UPLINK,
        ] {
            let (ret, out) = f.run_data(prog, &tagged, None);
            assert_eq!(ret, TC_ACT_UNSPEC, "{prog} TPID {tpid:#x}");
            assert_eq!(out, tagged, "{prog}");
        }
    }
    let got = f.counters();
    assert_eq!(got.spoofed.packets, 2);
    assert_eq!(got.get(Ingress, Other).packets, 2);
    assert_eq!(got.get(Egress, Blocked), abi::Counter::default());
}

// ---- malformed TCP ----------------------------------------------------------------------

#[test]
fn well_formed_syns_are_clamped_with_a_valid_checksum_also_after_ipv4_options() {
    let f = limited_fixture(10_000_000, 9014);
    // ihl 5, 6 (a NOP word) and 15 (40 bytes of options: NOPs and a router alert).
    let ip_opts: [&[u8]; 3] = [
        &[],
        &[1, 1, 1, 1],
        &[[1u8; 36].as_slice(), &[148, 4, 0, 0]].concat(),
    ];
    for opts in ip_opts {
        let ihl = 5 + opts.len() / 4;
        // The MSS behind a window scale and NOPs, with a timestamp after it.
        let tcp_opts = [
            &[1, 3, 3, 7][..],
            &[1, 1],
            &MSS_9000,
            &[8, 10, 0, 0, 0, 1, 0, 0, 0, 0],
        ]
        .concat();
        let pkt = tcp_packet(
            tcp_raw(POD_IP, INTERNET, SYN, &tcp_opts, None),
            opts,
            (false, 0),
        );
        let (ret, out) = f.run_data(programs::HOST_INGRESS, &pkt, None);
        assert_eq!(ret, TC_ACT_UNSPEC);
        let seg = segment(&out, ihl);
        assert_eq!(
            u16::from_be_bytes([seg[28], seg[29]]),
            CLAMPED_MSS,
            "ihl {ihl}"
        );
        assert_eq!(
            tcp_csum(POD_IP, INTERNET, seg),
            0,
            "checksum after the clamp, ihl {ihl}"
        );
        // Nothing else changed: the IPv4 header and options, the other TCP options.
        let mut want = pkt.clone();
        let at = ETH_HLEN + ihl * 4;
        want[at + 28..at + 30].copy_from_slice(&CLAMPED_MSS.to_be_bytes());
        want[at + 16..at + 18].copy_from_slice(&seg[16..18]);
        assert_eq!(out, want, "ihl {ihl}");
    }
}

#[test]
fn malformed_tcp_headers_are_never_rewritten() {
    let f = limited_fixture(10_000_000, 9014);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // Fewer than 20 bytes of TCP.
        ("a truncated fixed header", {
            let mut s = tcp_raw(POD_IP, INTERNET, SYN, &MSS_9000, None);
            s.truncate(12);
            s
        }),
        // doff says 60 bytes; the packet ends after the MSS option.
        (
            "a data offset beyond the packet",
            tcp_raw(POD_IP, INTERNET, SYN, &MSS_9000, Some(15)),
        ),
        // doff below the fixed header: the MSS bytes are payload.
        (
            "a data offset of 4 words",
            tcp_raw(POD_IP, INTERNET, SYN, &MSS_9000, Some(4)),
        ),
        // An MSS option whose value runs past the header's end (doff 6: 4 option bytes).
        (
            "an MSS running past the header",
            tcp_raw(
                POD_IP,
                INTERNET,
                SYN,
                &[1, 1, 2, 4, 0x23, 0x18, 0, 0],
                Some(6),
            ),
        ),
        // An option whose length jumps past the header, an MSS in the payload behind it.
        (
            "an option longer than the header",
            tcp_raw(
                POD_IP,
                INTERNET,
                SYN,
                &[30, 40, 0, 0, 2, 4, 0x23, 0x18],
                None,
            ),
        ),
        // Zero- and one-byte option lengths stop the walk (it would never advance).
        (
            "a zero-length option",
            tcp_raw(
                POD_IP,
                INTERNET,
                SYN,
                &[99, 0, 1, 1, 2, 4, 0x23, 0x18],
                None,
            ),
        ),
        (
            "a one-byte option length",
            tcp_raw(
                POD_IP,
                INTERNET,
                SYN,
                &[99, 1, 1, 1, 2, 4, 0x23, 0x18],
                None,
            ),
        ),
        // The end-of-options marker before the MSS.
        (
            "an MSS after end of options",
            tcp_raw(POD_IP, INTERNET, SYN, &[0, 1, 1, 1, 2, 4, 0x23, 0x18], None),
        ),
        // 40 option bytes of NOPs: the walk gives up after 16 and the MSS stays.
        (
            "an MSS after 36 NOPs",
            tcp_raw(
                POD_IP,
                INTERNET,
                SYN,
                &[[1u8; 36].as_slice(), &MSS_9000].concat(),
                None,
            ),
        ),
    ];
    for (what, seg) in cases {
        f.passes_untouched(&tcp_packet(seg, &[], (false, 0)), what);
    }
    // An IPv4 header longer than the packet: the TCP header is not there to parse.
    let mut pkt = tcp_packet(
        tcp_raw(POD_IP, INTERNET, SYN, &MSS_9000, None),
        &[],
        (false, 0),
    );
    pkt[ETH_HLEN] = 0x4f;
    f.passes_untouched(&pkt, "an IPv4 header beyond the packet");
}

#[test]
fn fragments_are_never_parsed_as_tcp() {
    let mut f = limited_fixture(10_000_000, 9014);
    let syn = tcp_raw(POD_IP, INTERNET, SYN, &MSS_9000, None);
    // A first fragment (SYNs are never fragmented, and a first fragment's ports are not
    // read), and later fragments whose payload looks like a SYN with an MSS option.
    for frag in [(true, 0), (true, 185), (false, 185)] {
        f.passes_untouched(
            &tcp_packet(syn.clone(), &[], frag),
            &format!("fragment {frag:?}"),
        );
    }
    let conns: HashMap<_, abi::ConnKey, abi::Conn> = f.map(maps::CONNS);
    assert_eq!(conns.keys().count(), 0);
    // Counted, by address, as any packet.
    assert_eq!(f.counters().get(Egress, Internet).packets, 3);
}

// ---- extreme configured rates and bursts ------------------------------------------------

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write to.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) },
        0
    );
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The highest and lowest rate `Limits` accepts, with the largest burst it keeps: the
/// queue model's credit (the class's burst as time) is right, not wrapped. 1 s of 1 Pbit/s
/// is 1.25e14 bytes, whose product with 8e9 does not fit 64 bits.
#[test]
fn extreme_rates_and_bursts_give_the_queue_model_the_right_credit() {
    for (rate, burst_bits, want_ns) in [
        (limits::MAX_RATE, limits::MAX_RATE, 1_000_000_000u64),
        (20_000_000_000, limits::MAX_RATE, 1_000_000_000),
        (limits::MIN_RATE, limits::MAX_RATE, 4 * 1514 * 8 * 1_000_000),
    ] {
        let mut f = fixture();
        let shape = Shape::new(rate, Some(burst_bits), 1514);
        f.update_meta(|m| {
            m.flags = abi::META_IN_USE;
            set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, rate);
            m.burst[abi::DIR_INGRESS] = shape.burst_bytes;
            m.frame = 1514;
        });
        let pkt = Ip::new(INTERNET, POD_IP).build();
        let before = monotonic_ns();
        assert_eq!(f.run(programs::HOST_EGRESS, &pkt, None).0, TC_ACT_UNSPEC);
        let after = monotonic_ns();
        let vq: Array<_, abi::VQueue> = f.map(maps::VQUEUE);
        let t_empty = vq
            .get(&abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL), 0)
            .expect("vqueue")
            .t_empty;
        // An idle class: the packet starts a full credit back, t_empty = now - credit + tx.
        let tx = pkt.len() as u64 * 8 * 1_000_000_000 / rate;
        let what = format!(
            "{rate} bit/s, burst {} bytes: t_empty {t_empty}",
            shape.burst_bytes
        );
        let slack = want_ns / 32_768 + 1;
        assert!(t_empty + want_ns + slack >= before + tx, "{what}");
        assert!(t_empty + want_ns <= after + tx + slack, "{what}");
    }
}

// ---- the pod-side program's slot ------------------------------------------------------

/// `offsetof(struct __sk_buff, tc_classid)`.
const SKB_TC_CLASSID: usize = 72;

/// `an_pod_egress` takes its pod's slot from its filter's classid (`skb->tc_classid`), never
/// from the source address the pod wrote. A test run cannot set that field (the kernel
/// refuses a ctx with anything between `cb` and `tstamp`), so the classid path is attacked
/// end to end (`a_pod_cannot_send_from_a_forged_address` in tests/tests/datapath.rs); this
/// keeps that reason true: if a kernel starts accepting it, test it here.
#[test]
fn a_test_run_cannot_give_the_pod_side_program_a_classid() {
    use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
    let f = fixture();
    let prog: &SchedClassifier = f
        .ebpf
        .program(programs::POD_EGRESS)
        .expect("program")
        .try_into()
        .expect("classifier");
    let pkt = Ip::new(OTHER_POD_IP, INTERNET).build();
    let mut ctx = [0u8; SKB_SIZE];
    ctx[SKB_TC_CLASSID..SKB_TC_CLASSID + 4]
        .copy_from_slice(&abi::pod_filter_classid(SLOT).to_ne_bytes());
    let mut out = vec![0u8; pkt.len() + 256];
    let res = prog.test_run(TestRunOptions {
        data_in: Some(&pkt),
        data_out: Some(&mut out),
        ctx_in: Some(&ctx),
        ..TestRunOptions::new()
    });
    match res {
        Err(aya::programs::ProgramError::SyscallError(e)) => {
            assert_eq!(e.io_error.raw_os_error(), Some(libc::EINVAL), "{e:?}");
        }
        other => panic!("a test run's ctx set tc_classid: {other:?}"),
    }
}
