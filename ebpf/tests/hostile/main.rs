//! `BPF_PROG_TEST_RUN` tests of what a hostile or broken pod can put on its veth: forged
//! source addresses, VLAN tags (`spoofing`); malformed TCP, IPv4 headers and IPv6 extension
//! headers, fragments, bogus lengths (`tcp`); link-scoped IPv6 (`link`); and the extreme
//! rates and bursts userspace may configure (`rates`). Each checks the verdict, the counters
//! and the packet bytes the program leaves: options are rewritten only in a well-formed
//! header. Each test of both families runs for IPv4 and IPv6 (`name::ipv4`, `name::ipv6`).
//!
//! Checksum offload: a test run's skb is CHECKSUM_NONE, and `struct __sk_buff` as a test
//! run's ctx cannot set `ip_summed`, so CHECKSUM_PARTIAL packets cannot be built here. What
//! is tested is the clamps' incremental update (`bpf_l4_csum_replace` without flags, as the
//! programs call it): the TCP checksum of a rewritten segment is verified over the pseudo
//! header. With CHECKSUM_PARTIAL the kernel leaves the field alone for such an update, and
//! the checksum is computed over the rewritten bytes when the packet leaves.
//!
//! Needs root (loads BPF programs); touches no network state.

#[path = "../common/mod.rs"]
mod common;
mod link;
mod rates;
mod spoofing;
mod tcp;

use std::net::IpAddr;

use aliasnet_ebpf::{abi, maps, programs};
use aya::maps::HashMap;
use common::*;

use abi::{Class::*, Direction::*};

/// Another pod on the node, registered in `an_pod_ips` and `an_pod_ips6` at its own slot.
fn other_pod(fam: Family) -> IpAddr {
    fam.addr("10.20.0.6", "fd00:240::6")
}
const OTHER_SLOT: u32 = 8;

/// A host on the internet.
fn internet(fam: Family) -> IpAddr {
    fam.addr("203.0.113.9", "2001:db8::10")
}

/// The fixture with the node policy and another pod.
fn fixture() -> Fixture {
    let mut f = Fixture::with_policy();
    let mut ips: HashMap<_, [u8; 4], u32> = f.map(maps::POD_IPS);
    ips.insert(ip("10.20.0.6").octets(), OTHER_SLOT, 0)
        .expect("register other pod ip");
    let mut ips6: HashMap<_, [u8; 16], u32> = f.map(maps::POD_IPS6);
    ips6.insert(ip6("fd00:240::6").octets(), OTHER_SLOT, 0)
        .expect("register other pod IPv6");
    f
}

/// The pod with an ingress limit of `rate` on a device of `frame`-byte frames: its SYNs'
/// MSS is clamped and its connections' windows too (so a malformed SYN that is not shows it
/// was not parsed).
fn limited_fixture(rate: u64, frame: u32) -> Fixture {
    let mut f = fixture();
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

/// The connections learnt.
fn conns(f: &mut Fixture) -> usize {
    let m: HashMap<_, abi::ConnKey, abi::Conn> = f.map(maps::CONNS);
    m.keys().count()
}

// ---- TCP segments with a real checksum ----------------------------------------------------

const SYN: u8 = 0x02;

/// A TCP segment from `src` to `dst` whose header carries `opts` (padded with EOL to whole
/// words; `doff` overrides the data offset), and a correct checksum.
fn tcp_raw(src: IpAddr, dst: IpAddr, flags: u8, opts: &[u8], doff: Option<u8>) -> Vec<u8> {
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
    let c = l4_csum(src, dst, 6, &seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    seg
}

/// The segment from the pod to the internet, with fragment fields `frag`.
fn tcp_packet(fam: Family, seg: Vec<u8>, frag: (bool, u16)) -> Ip {
    Ip {
        proto: 6,
        frag,
        payload: seg,
        ..Ip::new(fam.pod(), internet(fam))
    }
}

/// A SYN from the pod to the internet with the MSS of a jumbo frame (8960).
fn jumbo_syn(fam: Family) -> Vec<u8> {
    tcp_raw(fam.pod(), internet(fam), SYN, &MSS_9000, None)
}

const MSS_9000: [u8; 4] = [2, 4, 0x23, 0x18]; // MSS 8960
