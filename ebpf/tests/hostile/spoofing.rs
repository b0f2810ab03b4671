//! Forged source addresses, VLAN tags, and the slot of the pod-side program.

use super::*;

// Each runs for both families: `name::ipv4`, `name::ipv6`.
per_family!(
    forged_sources_are_dropped_on_the_host_veth_and_counted_as_spoofed,
    a_forged_syn_teaches_the_connection_table_nothing,
    vlan_tagged_frames_from_the_pod_are_dropped,
);

fn forged_sources_are_dropped_on_the_host_veth_and_counted_as_spoofed(fam: Family) {
    let mut f = fixture();
    let own = Ip::new(fam.pod(), internet(fam)).build();
    assert_eq!(f.run(programs::HOST_INGRESS, &own, None).0, TC_ACT_UNSPEC);
    let a = |v4, v6| fam.addr(v4, v6);
    let forged = [
        Ip::new(a("198.51.100.1", "2001:db8::1"), internet(fam)).build(),
        // Another pod's address: counted here, on the veth it came from, not on that pod.
        Ip::new(other_pod(fam), internet(fam)).build(),
        Ip::new(a("0.0.0.0", "::"), internet(fam)).build(),
        Ip::new(a("127.0.0.1", "::1"), a("10.1.2.3", "fd00:240:1::9")).build(),
        // To a blocked address: dropped as spoofed, not counted as blocked.
        Ip::new(other_pod(fam), a("169.254.169.254", "fd00:ec2::254")).build(),
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
    let from_anyone = Ip::new(a("198.51.100.1", "2001:db8::1"), fam.pod()).build();
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
    let mut bad_ihl = Ip::new(ip("198.51.100.1"), internet(Family::Ipv4)).build();
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

fn a_forged_syn_teaches_the_connection_table_nothing(fam: Family) {
    let mut f = limited_fixture(10_000_000, 9014);
    let src = other_pod(fam);
    let pkt = Ip {
        proto: 6,
        payload: tcp_raw(src, internet(fam), SYN, &MSS_9000, None),
        ..Ip::new(src, internet(fam))
    }
    .build();
    let (ret, out) = f.run_data(programs::HOST_INGRESS, &pkt, None);
    assert_eq!(ret, TC_ACT_SHOT);
    assert_eq!(out, pkt, "a dropped packet is not rewritten");
    assert_eq!(conns(&mut f), 0);
    assert_eq!(f.counters(), spoofed(1, pkt.len()));
}

/// 802.1Q: the kernel takes a frame's outer tag off before tc ingress, so a tag the host
/// veth program still sees is a second one (in a test run, whose skb is not untagged, the
/// only one). The kernel would strip a second priority tag (VLAN 0) and route the IP packet
/// inside, past the programs: the host veth drops such frames as spoofed. The other programs
/// pass them unparsed, counted as other, as any frame that is not IP.
fn vlan_tagged_frames_from_the_pod_are_dropped(fam: Family) {
    let mut f = fixture();
    for tpid in [0x8100u16, 0x88a8] {
        let inner = Ip::new(fam.pod(), fam.addr("169.254.169.254", "fd00:ec2::254")).build();
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

// ---- the pod-side program's slot ------------------------------------------------------

/// `offsetof(struct __sk_buff, tc_classid)`.
const SKB_TC_CLASSID: usize = 72;

/// `an_pod_egress` takes its pod's slot from its filter's classid (`skb->tc_classid`), never
/// from the source address the pod wrote. A test run cannot set that field (the kernel
/// refuses a ctx with anything between `cb` and `tstamp`, whatever the packet's family), so
/// the classid path is attacked end to end (`a_pod_cannot_send_from_a_forged_address` in
/// tests/tests/datapath.rs); this keeps that reason true: if a kernel starts accepting it,
/// test it here.
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
    let pkt = Ip::new(other_pod(Family::Ipv4), internet(Family::Ipv4)).build();
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
