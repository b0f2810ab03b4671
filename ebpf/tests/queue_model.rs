//! `BPF_PROG_TEST_RUN` tests of the shaping model: ECN marking above a shaped class's
//! modelled queue (in IPv4's TOS with its header checksum, in IPv6's traffic class), GSO
//! skbs charged with their headers per segment, and flow isolation by the 5-tuple (IPv6's
//! addresses folded) into the sparse and bulk leaves of a class. Each test runs for IPv4 and
//! IPv6 (`name::ipv4`, `name::ipv6`); GSO behind IPv6 extension headers is tested at the end.
//!
//! Needs root (loads BPF programs); touches no network state (see `common`).

mod common;

use std::net::{IpAddr, Ipv6Addr};

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::Array;
use common::*;

use abi::{Class::*, Direction::*};

// Each runs for both families: `name::ipv4`, `name::ipv6`.
per_family!(
    ingress_limit_ce_marks_ect_packets_above_the_modelled_queue,
    the_queue_model_counts_in_the_devices_frames,
    a_gso_packet_is_queued_as_all_its_segments,
    no_marking_without_a_limit_or_with_ecn_off,
    pod_egress_marks_against_its_internet_and_total_limits,
    uplink_marks_above_the_node_cap,
    a_shaped_class_serves_sparse_flows_first_and_never_reorders_a_flow,
    an_aggregates_flow_is_bulk_until_its_round_robin_share_drained,
    every_shaping_point_picks_a_leaf_of_its_class,
);

// ---- ECN marking above a shaped class's modelled queue ---------------------------------

const NOT_ECT: u8 = 0;
const ECT1: u8 = 1;
const ECT0: u8 = 2;
const CE: u8 = 3;

/// A TCP frame of `size` bytes on the wire with DSCP 8 and the given ECN codepoint.
fn frame_of(src: IpAddr, dst: IpAddr, ecn: u8, size: usize) -> Vec<u8> {
    let p = Ip {
        tos: 0x20 | ecn, // some DSCP, which marking must keep
        ..tcp(src, dst, Family::of(src).tcp_payload(size))
    }
    .build();
    assert_eq!(p.len(), size);
    p
}

/// A full-size TCP frame (1514 bytes on the wire) with the given ECN codepoint.
fn frame(src: IpAddr, dst: IpAddr, ecn: u8) -> Vec<u8> {
    frame_of(src, dst, ecn, 1514)
}

/// The ECN bits of `pkt` as a program left it, checking that nothing but them changed of
/// the frame `sent` (and IPv4's header checksum, which must still be valid).
#[track_caller]
fn ecn_of(pkt: &[u8], sent: &[u8]) -> u8 {
    let h = &pkt[ETH_HLEN..];
    let (tos, mut rest, mut sent_rest) = match h[0] >> 4 {
        4 => {
            assert_eq!(csum(&h[..20]), 0, "IPv4 header checksum broken");
            let (mut a, mut b) = (pkt.to_vec(), sent.to_vec());
            // The type of service and the header checksum may change.
            for p in [&mut a, &mut b] {
                p[ETH_HLEN + 1] = 0;
                p[ETH_HLEN + 10..ETH_HLEN + 12].fill(0);
            }
            (h[1], a, b)
        }
        6 => {
            let (mut a, mut b) = (pkt.to_vec(), sent.to_vec());
            // The traffic class is the low nibble of byte 0 and the high one of byte 1.
            for p in [&mut a, &mut b] {
                p[ETH_HLEN] &= 0xf0;
                p[ETH_HLEN + 1] &= 0x0f;
            }
            ((h[0] << 4) | (h[1] >> 4), a, b)
        }
        v => panic!("IP version {v}"),
    };
    assert_eq!(tos & 0xfc, 0x20, "DSCP changed");
    rest.truncate(sent.len());
    sent_rest.truncate(sent.len());
    assert_eq!(rest, sent_rest, "more than the ECN bits changed");
    tos & 3
}

/// Sends `n` frames back to back through `prog`; returns the ECN bits each left with.
fn burst(f: &Fixture, prog: &str, pkt: &[u8], n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            let (ret, out) = f.run_data(prog, pkt, None);
            assert_eq!(ret, TC_ACT_UNSPEC);
            ecn_of(&out, pkt)
        })
        .collect()
}

/// A remote on the internet, and an internal address.
fn internet(fam: Family) -> IpAddr {
    fam.addr("203.0.113.9", "2001:db8::10")
}

fn internal(fam: Family) -> IpAddr {
    fam.addr("10.1.2.3", "fd00:240:1::9")
}

fn ingress_limit_ce_marks_ect_packets_above_the_modelled_queue(fam: Family) {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    let (remote, pod) = (internet(fam), fam.pod());
    let ect = frame(remote, pod, ECT0);

    // The class's HTB burst (4 frames at this rate) leaves at once: the model gives it as
    // credit. After it, back to back at 1 Mbit/s each frame adds 12.1 ms to the modelled
    // queue: the next three wait 0, 1 and 2 frames, never above the 24.2 ms (2 frames)
    // mark.
    let got = burst(&f, programs::HOST_EGRESS, &ect, 12);
    assert_eq!(&got[..7], &[ECT0; 7], "marked below the threshold: {got:?}");
    // From the eighth on the modelled wait is above 2 frames (less whatever time the test
    // runs took, which is far below a frame).
    assert_eq!(
        &got[8..],
        &[CE; 4],
        "not marked above the threshold: {got:?}"
    );
    let marked = got.iter().filter(|&&e| e == CE).count() as u64;
    let vq = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
    assert_eq!(vq.ce_marked, marked);

    // With the queue full: ECT(1) is marked as well, Not-ECT cannot be and passes as is,
    // an already-CE packet stays CE and is not counted again.
    let got = burst(&f, programs::HOST_EGRESS, &frame(remote, pod, ECT1), 1);
    assert_eq!(got, [CE]);
    // Its sender is remote: a Not-ECT packet is never dropped here, only left as it is.
    let got = burst(&f, programs::HOST_EGRESS, &frame(remote, pod, NOT_ECT), 1);
    assert_eq!(got, [NOT_ECT]);
    let got = burst(&f, programs::HOST_EGRESS, &frame(remote, pod, CE), 1);
    assert_eq!(got, [CE]);

    let vq = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
    assert_eq!(vq.ce_marked, marked + 1);
    // Marking does not change what is counted.
    assert_eq!(
        f.counters(),
        expect(&[(Ingress, Internet, c(15, 15 * 1514))])
    );
    // The pod's egress direction has no ingress limit and no queue.
    let got = burst(&f, programs::HOST_INGRESS, &frame(pod, remote, ECT0), 10);
    assert_eq!(got, [ECT0; 10]);
}

fn the_queue_model_counts_in_the_devices_frames(fam: Family) {
    // A pod on a jumbo-frame MTU: its credit, marking threshold and queue limit are in its
    // own frames. With 1514-byte floors every jumbo frame would be over the threshold.
    // (BPF_PROG_TEST_RUN takes at most a page per packet: a 3000-byte MTU stands for
    // 9000.)
    let mut f = Fixture::with_policy();
    f.update_meta(|m| {
        set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW);
        m.frame = 3014;
    });
    let jumbo = frame_of(internet(fam), fam.pod(), ECT0, 3014);
    // Credit: four of the class's 1514-byte segments (6056 bytes, two of these frames);
    // mark above two frames. Back to back the first four wait at most two frames, from
    // the sixth on each waits longer.
    let got = burst(&f, programs::HOST_EGRESS, &jumbo, 12);
    assert_eq!(&got[..4], &[ECT0; 4], "marked below the threshold: {got:?}");
    assert_eq!(&got[5..], &[CE; 7], "not marked above it: {got:?}");
}

fn a_gso_packet_is_queued_as_all_its_segments(fam: Family) {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    let idx = abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL);
    // A first frame puts the model in its steady state (the queue is not idle any more).
    burst(
        &f,
        programs::HOST_EGRESS,
        &frame(internet(fam), fam.pod(), ECT0),
        1,
    );
    let before = f.vqueue(idx).t_empty;
    // One skb carrying 3 segments of 1000 bytes: 3 wire frames of 66 (86) + 1000 bytes.
    let gso = Ip {
        tos: 0x20 | ECT0,
        ..tcp(internet(fam), fam.pod(), 3000)
    }
    .build();
    f.run_data(programs::HOST_EGRESS, &gso, Some(&gso_ctx(3, 1000)));
    // It occupies the class for the time of 3 segments with their headers at 1 Mbit/s,
    // not of skb->len.
    let wire = 3 * (ETH_HLEN + fam.ip_hlen() + 32 + 1000) as u64;
    let added = f.vqueue(idx).t_empty - before;
    assert_eq!(added, wire * 8 * 1_000_000_000 / SLOW);
}

fn no_marking_without_a_limit_or_with_ecn_off(fam: Family) {
    let mut f = Fixture::bench_with_policy();
    let ect = frame(internet(fam), fam.pod(), ECT0);
    // No ingress limit: nothing is queued, nothing marked.
    assert_eq!(burst(&f, programs::HOST_EGRESS, &ect, 10), [ECT0; 10]);
    // A limit, but marking switched off in an_config.flags: the model still runs (flow
    // isolation needs it) but signals nothing.
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    f.update_config(|c| c.flags |= abi::CFG_AQM_OFF);
    assert_eq!(burst(&f, programs::HOST_EGRESS, &ect, 10), [ECT0; 10]);
    let q = f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL));
    assert!(q.t_empty > 0);
    assert_eq!((q.ce_marked, q.dropped), (0, 0));
    // Switched back on, the same traffic is marked.
    f.update_config(|c| c.flags &= !abi::CFG_AQM_OFF);
    assert!(burst(&f, programs::HOST_EGRESS, &ect, 10).contains(&CE));

    // The product's object has no switches: with every flag set it still marks.
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    f.update_config(|c| c.flags |= abi::CFG_AQM_OFF | abi::CFG_FLOWS_OFF | abi::CFG_CLAMP_OFF);
    assert!(burst(&f, programs::HOST_EGRESS, &ect, 10).contains(&CE));
}

fn pod_egress_marks_against_its_internet_and_total_limits(fam: Family) {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Egress, abi::KIND_INTERNET, SLOW));
    let pod = fam.pod();
    let internet_frame = frame(pod, internet(fam), ECT0);
    let internal_frame = frame(pod, internal(fam), ECT0);
    // Internal traffic is not limited (no total egress limit): never marked.
    assert_eq!(
        burst(&f, programs::POD_EGRESS, &internal_frame, 10),
        [ECT0; 10]
    );
    // The pod side's FIFO leaf lets the class burst (4 frames at this rate) through at
    // once: the model gives that much credit, so marking starts later than on the host
    // side.
    let got = burst(&f, programs::POD_EGRESS, &internet_frame, 8);
    assert_eq!(&got[..6], &[ECT0; 6], "{got:?}");
    assert_eq!(got[7], CE, "{got:?}");
    let internet_marks = got.iter().filter(|&&e| e == CE).count() as u64;
    assert_eq!(
        f.vqueue(abi::vq_pod(SLOT, abi::DIR_EGRESS, abi::KIND_INTERNET))
            .ce_marked,
        internet_marks
    );
    assert_eq!(
        f.vqueue(abi::vq_pod(SLOT, abi::DIR_EGRESS, abi::KIND_TOTAL)),
        abi::VQueue::default()
    );

    // With the class congested, what cannot be marked goes to the leaf queue: a ping, a
    // pure ACK, a Not-ECT UDP datagram, and a Not-ECT TCP data segment whose socket has
    // nothing in flight (the socket a test run attaches is not a TCP socket). Only a local
    // TCP sender with segments in flight is dropped, which the netns tests show.
    let tcp_data = frame(pod, internet(fam), NOT_ECT);
    let ping = Ip::new(pod, internet(fam)).build();
    let ack = tcp(pod, internet(fam), 0).build();
    let udp = Ip {
        proto: 17,
        payload: vec![0x55; 1000],
        ..Ip::new(pod, internet(fam))
    }
    .build();
    for pkt in [&ping, &ack, &udp, &tcp_data] {
        assert_eq!(f.run_data(programs::POD_EGRESS, pkt, None).0, TC_ACT_UNSPEC);
    }
    assert_eq!(
        f.vqueue(abi::vq_pod(SLOT, abi::DIR_EGRESS, abi::KIND_INTERNET))
            .dropped,
        0
    );

    // A total egress limit queues internal traffic as well.
    f.update_meta(|m| set_rate(m, abi::Direction::Egress, abi::KIND_TOTAL, SLOW));
    let got = burst(&f, programs::POD_EGRESS, &internal_frame, 8);
    assert_eq!(got[7], CE, "{got:?}");
    assert!(
        f.vqueue(abi::vq_pod(SLOT, abi::DIR_EGRESS, abi::KIND_TOTAL))
            .ce_marked
            >= 1
    );
    // Marking never changes the class the packet is shaped in (the flow is backlogged:
    // bulk).
    let (_, ctx_out) = f.run(programs::POD_EGRESS, &internet_frame, Some(&prio_ctx(6)));
    assert_eq!(
        prio_of(&ctx_out),
        pod_leaf(abi::KIND_INTERNET, abi::LEAF_BULK)
    );
}

fn uplink_marks_above_the_node_cap(fam: Family) {
    let mut f = Fixture::with_policy();
    f.set_node_limit(abi::Direction::Egress, abi::KIND_INTERNET, Some(SLOW));
    let got = burst(
        &f,
        programs::UPLINK,
        &frame(fam.pod(), internet(fam), ECT0),
        8,
    );
    assert_eq!(&got[..3], &[ECT0; 3], "{got:?}");
    assert_eq!(got[7], CE, "{got:?}");
    // Traffic that is not the pods' internet traffic (the node's own) is not in the cap
    // class.
    let other = frame(fam.addr("10.20.0.6", "fd00:240::6"), internet(fam), ECT0);
    assert_eq!(burst(&f, programs::UPLINK, &other, 10), [ECT0; 10]);
    assert!(
        f.vqueue(abi::vq_agg(
            abi::NODE_ENTITY,
            abi::DIR_EGRESS,
            abi::KIND_INTERNET
        ))
        .ce_marked
            >= 1
    );
}

// ---- flow isolation: sparse and bulk leaves of a shaped class ----------------------------

const INGRESS_SPARSE: u32 = pod_leaf(abi::KIND_TOTAL, abi::LEAF_SPARSE);
const INGRESS_BULK: u32 = pod_leaf(abi::KIND_TOTAL, abi::LEAF_BULK);

/// The flow buckets of one flow table.
fn flows_of(f: &mut Fixture, table: u32) -> Vec<(u32, abi::Flow)> {
    let m: Array<_, abi::Flow> = f.map(maps::FLOWS);
    (table * abi::FLOW_BUCKETS..(table + 1) * abi::FLOW_BUCKETS)
        .map(|k| (k, m.get(&k, 0).expect("flow bucket")))
        .collect()
}

fn set_flows(f: &mut Fixture, table: u32, edit: impl Fn(&mut abi::Flow)) {
    let flows = flows_of(f, table);
    let mut m: Array<_, abi::Flow> = f.map(maps::FLOWS);
    for (k, mut v) in flows {
        edit(&mut v);
        m.set(k, v, 0).expect("set flow bucket");
    }
}

/// The leaf the host veth's egress program (towards the pod) picks for `pkt`.
fn leaf(f: &Fixture, pkt: &[u8]) -> u32 {
    let (ret, ctx) = f.run(programs::HOST_EGRESS, pkt, None);
    assert_eq!(ret, TC_ACT_UNSPEC);
    prio_of(&ctx)
}

/// The flow bucket of a [`frame`] from `remote` to the pod (`abi::flow_bucket`, the
/// programs' hash; `tcp` sends from port 40000 to 443).
fn download_bucket(remote: IpAddr, pod: IpAddr) -> u32 {
    abi::flow_bucket(remote, pod, 6, Some((40000, 443)))
}

/// The flow bucket of a ping from `remote` to the pod (ICMP has no ports).
fn ping_bucket(remote: IpAddr, pod: IpAddr) -> u32 {
    abi::flow_bucket(remote, pod, Family::of(pod).icmp(), None)
}

/// Internet host `i` (below 512): 203.0.113.i, then 198.51.100.i; 2001:db8::i.
fn internet_host(fam: Family, i: u16) -> IpAddr {
    match fam {
        Family::Ipv4 if i < 256 => IpAddr::from([203, 0, 113, i as u8]),
        Family::Ipv4 => IpAddr::from([198, 51, 100, i as u8]),
        Family::Ipv6 => Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i).into(),
    }
}

/// An internet host whose pings share the download's bucket (`same`) or not.
fn pinger(fam: Family, download: u32, same: bool) -> IpAddr {
    (0x11..0x200)
        .map(|i| internet_host(fam, i))
        .find(|a| (ping_bucket(*a, fam.pod()) == download) == same)
        .expect("a remote")
}

fn a_shaped_class_serves_sparse_flows_first_and_never_reorders_a_flow(fam: Family) {
    let mut f = Fixture::bench_with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    let idx = abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL);
    let table = abi::flows_pod(SLOT, abi::DIR_INGRESS);
    let bulk = frame(internet(fam), fam.pod(), NOT_ECT);
    // A ping from a remote whose flow lands in another bucket than the download's.
    let download = download_bucket(internet(fam), fam.pod());
    let ping = Ip::new(pinger(fam, download, false), fam.pod()).build();

    // A flow's first packets fit its budget of 2 full frames: a new connection starts in
    // the sparse leaf, as in fq_codel. The third full frame back to back does not.
    let got: Vec<u32> = (0..6).map(|_| leaf(&f, &bulk)).collect();
    assert_eq!(
        got,
        [
            INGRESS_SPARSE,
            INGRESS_SPARSE,
            INGRESS_BULK,
            INGRESS_BULK,
            INGRESS_BULK,
            INGRESS_BULK
        ]
    );
    // Another flow with nothing queued (a ping) is still sparse, again and again.
    for _ in 0..5 {
        assert_eq!(leaf(&f, &ping), INGRESS_SPARSE);
    }
    // A ping whose flow shares the download's bucket waits behind it (bulk), which shows
    // that the bucket is the one computed from the whole addresses (IPv6's folded).
    let same = Ip::new(pinger(fam, download, true), fam.pod()).build();
    assert_eq!(leaf(&f, &same), INGRESS_BULK);
    // Every packet, sparse or bulk, takes its share of the class's rate in the model.
    let t_empty = f.vqueue(idx).t_empty;
    assert!(t_empty > 0);

    // Refill every bucket's budget, but keep the bulk flow's queued packets: it stays in
    // the bulk leaf, since a sparse packet would overtake them (reordering).
    set_flows(&mut f, table, |v| v.t_sparse = 0);
    assert_eq!(leaf(&f, &bulk), INGRESS_BULK);
    // Once its packets have left the bulk leaf (the model says when), it may be sparse
    // again.
    set_flows(&mut f, table, |v| {
        v.t_sparse = 0;
        v.t_bulk = 0;
    });
    assert_eq!(leaf(&f, &bulk), INGRESS_SPARSE);

    // A GSO skb larger than the budget (3 segments of 1066 (1086) bytes on the wire) is
    // bulk.
    set_flows(&mut f, table, |v| *v = abi::Flow::default());
    let gso = tcp(internet(fam), fam.pod(), 3000).build();
    let (_, out) = f.run(programs::HOST_EGRESS, &gso, Some(&gso_ctx(3, 1000)));
    assert_eq!(prio_of(&out), INGRESS_BULK);

    // Flow isolation switched off: everything goes to the bulk leaf.
    f.update_config(|c| c.flags |= abi::CFG_FLOWS_OFF);
    set_flows(&mut f, table, |v| *v = abi::Flow::default());
    assert_eq!(leaf(&f, &ping), INGRESS_BULK);
    assert_eq!(leaf(&f, &bulk), INGRESS_BULK);
    // Without an ingress limit the packet takes HTB's direct queue.
    f.update_config(|c| c.flags &= !abi::CFG_FLOWS_OFF);
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, 0));
    assert_eq!(leaf(&f, &ping), abi::CLASSID_DIRECT);

    // The product's object has no switch: the flag changes nothing.
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    f.update_config(|c| c.flags |= abi::CFG_FLOWS_OFF);
    assert_eq!(leaf(&f, &ping), INGRESS_SPARSE);
}

/// An aggregate's pods have bulk leaves of their own that HTB serves round by round: a
/// flow's last bulk packet leaves up to (flows with a backlog) times later than in arrival
/// order, and its flow stays out of the sparse leaf until then.
fn an_aggregates_flow_is_bulk_until_its_round_robin_share_drained(fam: Family) {
    let mut f = Fixture::with_policy();
    f.set_node_limit(abi::Direction::Egress, abi::KIND_INTERNET, Some(SLOW));
    let vq = abi::vq_agg(abi::NODE_ENTITY, abi::DIR_EGRESS, abi::KIND_INTERNET);
    let table = abi::flows_agg(abi::NODE_ENTITY, abi::DIR_EGRESS);
    let upload = |i: u16| frame(fam.pod(), internet_host(fam, i), NOT_ECT);
    let bucket_of =
        |i: u16| abi::flow_bucket(fam.pod(), internet_host(fam, i), 6, Some((40000, 443)));
    let flow = |f: &mut Fixture, i: u16| flows_of(f, table)[bucket_of(i) as usize].1;
    // Hosts whose uploads land in four different buckets.
    let mut hosts: Vec<u16> = Vec::new();
    for i in 0x11..0x200 {
        if hosts.len() < 4 && hosts.iter().all(|h| bucket_of(*h) != bucket_of(i)) {
            hosts.push(i);
        }
    }
    let run = |f: &Fixture, pkt: &[u8]| prio_of(&f.run(programs::UPLINK, pkt, None).1);
    let bulk = abi::classid(abi::node_group(abi::KIND_INTERNET) + abi::GROUP_SHARED);

    // One flow with a backlog: its last packet leaves when the model says.
    let got: Vec<u32> = (0..4).map(|_| run(&f, &upload(hosts[0]))).collect();
    assert_eq!(got[3], bulk, "{got:x?}");
    assert_eq!(flow(&mut f, hosts[0]).t_bulk, f.vqueue(vq).t_empty);

    // Three more flows get a backlog; the first flow's next packet leaves up to four times
    // later than the model's time for it.
    for &h in &hosts[1..] {
        let got: Vec<u32> = (0..4).map(|_| run(&f, &upload(h))).collect();
        assert_eq!(got[3], bulk, "{got:x?}");
    }
    let start = monotonic_ns();
    assert_eq!(run(&f, &upload(hosts[0])), bulk);
    let end = monotonic_ns();
    let t = f.vqueue(vq).t_empty;
    let t_bulk = flow(&mut f, hosts[0]).t_bulk;
    assert!(t > end, "the model has a backlog");
    assert!(
        (4 * t - 3 * end..=4 * t - 3 * start).contains(&t_bulk),
        "t_bulk {t_bulk}, model {t}, run in {start}..={end}"
    );

    // Its budget refilled, it is still bulk: a sparse packet would overtake its queue.
    set_flows(&mut f, table, |v| v.t_sparse = 0);
    assert_eq!(run(&f, &upload(hosts[0])), bulk);
}

fn every_shaping_point_picks_a_leaf_of_its_class(fam: Family) {
    let mut f = Fixture::with_policy();
    let prio = |f: &Fixture, prog: &str, pkt: &[u8]| prio_of(&f.run(prog, pkt, None).1);
    let pod = fam.pod();
    let internet_ping = Ip::new(pod, fam.addr("203.0.113.1", "2001:db8::1")).build();
    let internal_ping = Ip::new(pod, fam.addr("10.1.1.1", "fd00:240:1::1")).build();

    // Pod eth0, internet limit only: internet pings are sparse in its class; internal
    // traffic takes HTB's direct queue, unshaped.
    f.update_meta(|m| set_rate(m, abi::Direction::Egress, abi::KIND_INTERNET, SLOW));
    assert_eq!(
        prio(&f, programs::POD_EGRESS, &internet_ping),
        pod_leaf(abi::KIND_INTERNET, abi::LEAF_SPARSE)
    );
    assert_eq!(
        prio(&f, programs::POD_EGRESS, &internal_ping),
        abi::CLASSID_DIRECT
    );
    // A burst of one internet flow moves to the bulk leaf.
    let data = frame(pod, internet(fam), NOT_ECT);
    let got: Vec<u32> = (0..4)
        .map(|_| prio(&f, programs::POD_EGRESS, &data))
        .collect();
    assert_eq!(
        got[3],
        pod_leaf(abi::KIND_INTERNET, abi::LEAF_BULK),
        "{got:x?}"
    );
    // With a total egress limit, internal traffic is shaped under it and isolated too.
    f.update_meta(|m| set_rate(m, abi::Direction::Egress, abi::KIND_TOTAL, SLOW));
    assert_eq!(
        prio(&f, programs::POD_EGRESS, &internal_ping),
        pod_leaf(abi::KIND_TOTAL, abi::LEAF_SPARSE)
    );

    // The uplink's node internet limit.
    f.set_node_limit(abi::Direction::Egress, abi::KIND_INTERNET, Some(SLOW));
    assert_eq!(
        prio(&f, programs::UPLINK, &internet_ping),
        abi::classid(abi::node_group(abi::KIND_INTERNET) + abi::GROUP_SPARSE)
    );
    let got: Vec<u32> = (0..4).map(|_| prio(&f, programs::UPLINK, &data)).collect();
    assert_eq!(
        got[3],
        abi::classid(abi::node_group(abi::KIND_INTERNET) + abi::GROUP_SHARED),
        "{got:x?}"
    );
}

// ---- IPv6 only: GSO behind extension headers ----------------------------------------------

#[test]
fn gso_skbs_charge_their_ipv6_extension_headers_per_segment() {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    // 3 segments of 1000 bytes behind 14 + 40 + 8 (hop-by-hop) + 32 header bytes each.
    let pkt = Ip {
        ext: vec![ext_opts(NEXTHDR_HOP, 1)],
        ..tcp(ip6("2001:db8::10"), POD_IP6, 3000)
    }
    .build();
    let wire = 3 * (14 + 40 + 8 + 32 + 1000);
    assert_eq!(
        f.vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL))
            .t_empty,
        0
    );
    let start = monotonic_ns();
    assert_eq!(
        f.run(programs::HOST_EGRESS, &pkt, Some(&gso_ctx(3, 1000)))
            .0,
        TC_ACT_UNSPEC
    );
    let end = monotonic_ns();
    assert_eq!(f.counters(), expect(&[(Ingress, Internet, c(3, wire))]));
    // The model drains what HTB will charge, every segment with its headers: after an idle
    // class it starts `credit` (the class's burst, 4 frames) before now and adds the three
    // segments at the class's rate (8 us a byte at 1 Mbit/s).
    let t = f
        .vqueue(abi::vq_pod(SLOT, abi::DIR_INGRESS, abi::KIND_TOTAL))
        .t_empty;
    let ns_per_byte = 8 * 1_000_000_000 / SLOW;
    let credit = abi::DEFAULT_BURST_FRAMES * abi::MIN_FRAME * ns_per_byte;
    let at = t + credit - wire as u64 * ns_per_byte;
    assert!(
        (start..=end).contains(&at),
        "t_empty {t}: start {at}, test run in {start}..={end}"
    );
}
