//! `BPF_PROG_TEST_RUN` tests of the host veth's backstop of a pod's egress limits: what the
//! pod sends above them, as it would after deleting its own HTB, is dropped and counted as
//! policed; what conforms to them, as the pod's HTB releases it, never is.
//!
//! Needs root (loads BPF programs); touches no network state (see `common`).

mod common;

use std::{
    net::Ipv4Addr,
    thread,
    time::{Duration, Instant},
};

use aliasnet_ebpf::{abi, programs, shape::Shape, tuning};
use common::*;

use abi::{Class::*, Direction::*};

const INTERNET: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);
const INTERNAL: Ipv4Addr = Ipv4Addr::new(10, 1, 2, 3);

/// A full-size TCP frame (1514 bytes on the wire).
fn frame(dst: Ipv4Addr) -> Vec<u8> {
    let p = tcp(POD_IP, dst, 1448).build();
    assert_eq!(p.len(), 1514);
    p
}

/// How many of a back-to-back burst of 1514-byte frames the backstop of a limit at `rate`
/// (default burst, no GSO) admits: its tolerance, at the police rate, plus the first frame.
fn admitted_at_once(rate: u64) -> u64 {
    let frame = tuning::MIN_FRAME;
    let credit = tuning::burst_ns(Shape::new(rate, None, frame).burst_bytes, rate);
    let tol = tuning::police_tolerance_ns(credit, rate, frame, 0);
    tol / tuning::tx_ns(1514, tuning::police_rate(rate)) + 1
}

/// The policy fixture with the pod in use on a 1500-byte veth and the limits `limits` sets.
fn limited(limits: impl FnOnce(&mut abi::PodMeta)) -> Fixture {
    let mut f = Fixture::with_policy();
    f.update_meta(|m| {
        m.flags = abi::META_IN_USE;
        m.frame = 1514;
        limits(m);
    });
    f
}

/// Runs `n` copies of `pkt` back to back through the host veth's ingress program; returns how
/// many passed.
fn burst(f: &Fixture, pkt: &[u8], n: u64) -> u64 {
    (0..n)
        .filter(|_| match f.run(programs::HOST_INGRESS, pkt, None).0 {
            TC_ACT_UNSPEC => true,
            TC_ACT_SHOT => false,
            v => panic!("unexpected verdict {v}"),
        })
        .count() as u64
}

#[test]
fn a_burst_above_the_egress_limit_is_policed_on_the_host_veth() {
    let mut f = limited(|m| set_rate(m, abi::Direction::Egress, abi::KIND_TOTAL, SLOW));
    let pkt = frame(INTERNET);
    let want = admitted_at_once(SLOW);
    // 1 Mbit/s: 48 ms of burst (4 frames), a frame and 100 ms of slack at 1.1 Mbit/s.
    assert_eq!(want, 15);
    let passed = burst(&f, &pkt, 100);
    // A test run takes microseconds, at most one more frame's time drains meanwhile.
    assert!(
        (want..=want + 1).contains(&passed),
        "{passed} passed, {want} expected"
    );
    let got = f.counters();
    assert_eq!(
        got.policed,
        c(100 - passed, (100 - passed) as usize * pkt.len())
    );
    // Counted in its class as sent, as blocked traffic is.
    assert_eq!(got.get(Egress, Internet), c(100, 100 * pkt.len()));
    assert_eq!(got.spoofed, abi::Counter::default());
    // Traffic to the pod is never policed by its egress limits.
    let to_pod = tcp(INTERNET, POD_IP, 1448).build();
    assert_eq!(
        (0..50)
            .filter(|_| f.run(programs::HOST_EGRESS, &to_pod, None).0 == TC_ACT_SHOT)
            .count(),
        0
    );
}

#[test]
fn the_internet_limit_polices_only_internet_traffic() {
    let mut f = limited(|m| set_rate(m, abi::Direction::Egress, abi::KIND_INTERNET, SLOW));
    // Unlimited inside the cluster.
    assert_eq!(burst(&f, &frame(INTERNAL), 100), 100);
    assert_eq!(f.counters().policed, abi::Counter::default());
    let passed = burst(&f, &frame(INTERNET), 100);
    assert!(passed <= admitted_at_once(SLOW) + 1, "{passed} passed");
    assert_eq!(f.counters().policed.packets, 100 - passed);
    // IPv6 shares the pod's limits and the backstop's model.
    let v6 = tcp(POD_IP6, ip6("2001:db8::9"), 1428).build();
    assert_eq!(burst(&f, &v6, 10), 0);
    assert_eq!(f.counters().policed.packets, 110 - passed);
}

/// What the pod's HTB releases: its burst at once, then one frame per frame time at the
/// limit's rate, for ~0.6 s. Not one packet is policed, also after an idle period.
#[test]
fn traffic_within_the_limit_is_never_policed() {
    let rate = 2 * SLOW;
    let mut f = limited(|m| {
        set_rate(m, abi::Direction::Egress, abi::KIND_TOTAL, rate);
        set_rate(m, abi::Direction::Egress, abi::KIND_INTERNET, SLOW);
    });
    let burst_frames = Shape::new(SLOW, None, tuning::MIN_FRAME).burst_bytes / 1514;
    for dst in [INTERNET, INTERNAL] {
        let pkt = frame(dst);
        let limit = if dst == INTERNET { SLOW } else { rate };
        let gap = Duration::from_nanos(tuning::tx_ns(1514, limit));
        for round in 0..2 {
            assert_eq!(burst(&f, &pkt, burst_frames), burst_frames);
            let start = Instant::now();
            for i in 1..=25u32 {
                // Never ahead of the rate, as HTB.
                if let Some(wait) = (gap * i).checked_sub(start.elapsed()) {
                    thread::sleep(wait);
                }
                assert_eq!(
                    f.run(programs::HOST_INGRESS, &pkt, None).0,
                    TC_ACT_UNSPEC,
                    "{dst} round {round} frame {i}"
                );
            }
            thread::sleep(Duration::from_millis(150));
        }
    }
    assert_eq!(f.counters().policed, abi::Counter::default());
}

/// A pod with no egress limit, or whose slot has none yet, is never policed.
#[test]
fn unlimited_pods_are_never_policed() {
    let mut f = limited(|m| set_rate(m, abi::Direction::Ingress, abi::KIND_TOTAL, SLOW));
    assert_eq!(burst(&f, &frame(INTERNET), 200), 200);
    assert_eq!(f.counters().policed, abi::Counter::default());
}
