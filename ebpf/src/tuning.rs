//! Rust mirrors of `ebpf/include/aliasnet_tuning.h`: the sizes and thresholds of the queue
//! model, flow isolation and the window clamp, which the qdiscs user space builds must match,
//! and the benchmark switches in `an_config.flags` (obeyed by [`crate::BENCH_DATAPATH_OBJECT`]
//! only).
//!
//! None of this is layout: changing a value changes behaviour, pinned maps stay valid, and
//! [`crate::abi::ABI_VERSION`] does not change. `tests/headers.rs` checks the values against the
//! header text.

/// `an_config.flags`, benchmarks only: switch the queue model off (no CE marks, no pod-side
/// drops).
pub const CFG_AQM_OFF: u32 = 1;
/// `an_config.flags`, benchmarks only: switch flow isolation off (every packet to the bulk
/// leaf).
pub const CFG_FLOWS_OFF: u32 = 2;
/// `an_config.flags`, benchmarks only: switch receive-window clamping off.
pub const CFG_CLAMP_OFF: u32 = 4;

/// Ethernet header bytes that HTB and tbf count on top of the MTU (no FCS).
pub const ETH_HLEN: u64 = 14;
/// The largest frame assumed for a record that carries none (a 1500-byte MTU). Every size
/// "in frames" is otherwise in frames of the device's own MTU (`PodMeta::frame`,
/// `Config::uplink_frame`).
pub const MIN_FRAME: u64 = 1514;

/// The largest frame of a device with `mtu`, as HTB and tbf count it.
pub const fn frame_of_mtu(mtu: u32) -> u64 {
    mtu as u64 + ETH_HLEN
}

/// Segments TCP is asked for in a shaped class: at most this long at its rate (see the header).
pub const SEG_NS: u64 = 1_000_000;

/// The largest frame TCP is asked to send into a class at `rate` bit/s on a device whose
/// frame is `frame` bytes (what the programs' `seg_frame()` computes).
pub fn seg_frame(rate: u64, frame: u64) -> u64 {
    (rate / 8 / (1_000_000_000 / SEG_NS))
        .max(MIN_FRAME)
        .min(frame)
}

/// `tx_ns` takes counts below this many bytes (packets and frames): `bytes * 8 * 10^9` then
/// fits 64 bits.
pub const TX_EXACT_BYTES: u64 = 1 << 31;
/// `burst_ns` cuts a burst to this many bytes (above 1 s of [`crate::limits::MAX_RATE`]).
pub const BURST_MAX_BYTES: u64 = (1 << 47) - 1;

/// Time to send `bytes` (below [`TX_EXACT_BYTES`]) at `rate` bit/s as the programs compute
/// it (`tx_ns()` in `ebpf/lib/common.h`, 64-bit arithmetic; panics where it would wrap).
pub fn tx_ns(bytes: u64, rate: u64) -> u64 {
    bytes * 8 * 1_000_000_000 / rate
}

/// Time to send a class's burst of `burst` bytes at `rate` bit/s as the programs compute
/// its credit (`burst_ns()` in `ebpf/lib/common.h`). A zero divisor gives 0, as a BPF
/// division does.
pub fn burst_ns(burst: u64, rate: u64) -> u64 {
    if burst < TX_EXACT_BYTES {
        return tx_ns(burst, rate);
    }
    ((burst.min(BURST_MAX_BYTES) >> 16) * 8 * 1_000_000_000)
        .checked_div(rate >> 16)
        .unwrap_or(0)
}

/// Marking threshold (modelled queueing delay): `ECN_MARK_MIN_NS` up to `ECN_MARK_REF_RATE`
/// bit/s, growing with the rate up to `ECN_MARK_MAX_NS`, at least `ECN_MARK_FRAMES` frames.
pub const ECN_MARK_MIN_NS: u64 = 2_000_000;
pub const ECN_MARK_MAX_NS: u64 = 10_000_000;
pub const ECN_MARK_REF_RATE: u64 = 10_000_000;
pub const ECN_MARK_FRAMES: u64 = 2;

/// The marking threshold of a class at `rate` bit/s on a device whose largest frame is
/// `frame` bytes, in ns (what the programs compute).
pub fn ecn_mark_ns(rate: u64, frame: u64) -> u64 {
    let t = if rate < ECN_MARK_REF_RATE * (ECN_MARK_MAX_NS / ECN_MARK_MIN_NS) {
        ECN_MARK_MIN_NS * (rate / 1000) / (ECN_MARK_REF_RATE / 1000)
    } else {
        ECN_MARK_MAX_NS
    };
    let frames = u128::from(ECN_MARK_FRAMES * frame) * 8 * 1_000_000_000 / u128::from(rate.max(1));
    let frames = frames.min(u128::from(u64::MAX)) as u64;
    t.max(ECN_MARK_MIN_NS).max(frames)
}

/// HTB class burst when the pod sets none: 10 ms of the rate, at least 4 of the class's
/// segments ([`seg_frame`]) and one frame.
pub const DEFAULT_BURST_NS: u64 = 10_000_000;
pub const DEFAULT_BURST_FRAMES: u64 = 4;
/// Leaf bucket: 1 ms of the rate, at least 2 frames (a GSO aggregate above it is segmented).
pub const LEAF_BURST_NS: u64 = 1_000_000;
pub const LEAF_BURST_FRAMES: u64 = 2;
/// Forwarded-traffic leaf queue: 25 ms of the rate, at least 6 frames (the window clamp's
/// floor plus the bucket).
pub const LEAF_QUEUE_NS: u64 = 25_000_000;
pub const LEAF_QUEUE_FRAMES: u64 = 6;
const _: () = assert!(LEAF_QUEUE_FRAMES >= WND_MIN_FRAMES + LEAF_BURST_FRAMES);

/// Flow isolation: a flow's sparse budget is `FLOW_BURST_FRAMES` of the class's segments
/// refilled at 1/`FLOW_RATE_DIV` of its rate; it stays bulk until `FLOW_GUARD_FRAMES` after
/// its bulk backlog drained (see the header).
pub const FLOW_BURST_FRAMES: u64 = 2;
pub const FLOW_RATE_DIV: u64 = 16;
pub const FLOW_GUARD_FRAMES: u64 = 1;
/// The sparse leaf is guaranteed this fraction (1/N) of its class's rate.
pub const SPARSE_RATE_DIV: u64 = 4;
/// Epoch of the bulk-flow bitmaps in `an_vqueue`.
pub const FLOW_EPOCH_NS: u64 = 100_000_000;

/// The host veth's backstop of a pod's egress limits: it drains at `POLICE_RATE_PCT` % of
/// the limit and lets through a backlog of the limit's HTB burst, the pod's largest GSO
/// aggregate and `POLICE_SLACK_NS` of the limit (at least `POLICE_SLACK_FRAMES` frames).
pub const POLICE_RATE_PCT: u64 = 110;
pub const POLICE_SLACK_NS: u64 = 100_000_000;
pub const POLICE_SLACK_FRAMES: u64 = 8;
/// The GSO aggregate the tolerance counts is capped here (above any device's maximum).
pub const POLICE_GSO_CAP: u64 = 1 << 20;

/// The rate the backstop of a limit at `rate` drains at (`police_rate()` in the programs).
pub fn police_rate(rate: u64) -> u64 {
    rate / 100 * POLICE_RATE_PCT + rate % 100 * POLICE_RATE_PCT / 100
}

/// The backlog, in ns at `rate`, the backstop of a limit at `rate` lets through
/// (`police_tolerance()` in the programs): the class's HTB burst `credit_ns`, the pod's
/// largest GSO aggregate (at least a frame), and the slack.
pub fn police_tolerance_ns(credit_ns: u64, rate: u64, frame: u64, gso_max: u64) -> u64 {
    let gso = gso_max.max(frame).min(POLICE_GSO_CAP);
    credit_ns + tx_ns(gso, rate) + tx_ns(POLICE_SLACK_FRAMES * frame, rate).max(POLICE_SLACK_NS)
}

/// The window clamp: rate x RTT plus this much queue, at least `WND_MIN_FRAMES` frames for
/// the class and `WND_MIN_FLOW_FRAMES` per connection.
pub const WND_QUEUE_NS: u64 = 16_000_000;
pub const WND_MIN_FRAMES: u64 = 4;
pub const WND_MIN_FLOW_FRAMES: u64 = 2;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_RATE, MIN_RATE, UNSET_BURST};
    use crate::shape::Shape;

    /// The exact time, in 128 bits.
    fn exact_ns(bytes: u64, rate: u64) -> u128 {
        u128::from(bytes) * 8 * 1_000_000_000 / u128::from(rate)
    }

    /// The rates the programs divide by: every rate `Limits` accepts, a flow's share of the
    /// lowest (rate / `FLOW_RATE_DIV`), and the extremes of the field (never 0: the programs
    /// only divide by a rate they checked is set, and make a flow's share at least 1).
    const RATES: [u64; 10] = [
        1,
        MIN_RATE / FLOW_RATE_DIV,
        MIN_RATE,
        1_000_000,
        17_179_869_184,
        20_000_000_000,
        1_000_000_000_000,
        MAX_RATE,
        MAX_RATE + 1,
        u64::MAX,
    ];

    /// The rates of [`RATES`] that `Limits` accepts.
    fn accepted_rates() -> impl Iterator<Item = u64> {
        RATES
            .into_iter()
            .filter(|r| (MIN_RATE..=MAX_RATE).contains(r))
    }

    /// `tx_ns` is handed packets (a 512 KiB GSO aggregate with the headers of its
    /// segments) and frames (`LEAF_QUEUE_FRAMES` of the largest, 65,549 bytes): far below
    /// `TX_EXACT_BYTES`, so the product cannot wrap at any rate, down to 1 bit/s.
    #[test]
    fn packet_times_cannot_wrap() {
        let largest_frame = frame_of_mtu(u32::from(u16::MAX));
        assert_eq!(largest_frame, 65_549);
        let gso = 524_288 + 65_535 * (ETH_HLEN + 60 + 60);
        for bytes in [0, 1, largest_frame, LEAF_QUEUE_FRAMES * largest_frame, gso] {
            assert!(bytes < TX_EXACT_BYTES);
            for rate in RATES {
                assert_eq!(u128::from(tx_ns(bytes, rate)), exact_ns(bytes, rate));
            }
        }
        assert!((TX_EXACT_BYTES - 1)
            .checked_mul(8 * 1_000_000_000)
            .is_some());
    }

    /// Every rate and burst `Limits` accepts ([`MIN_RATE`] ..= [`MAX_RATE`] bit/s, bursts up
    /// to [`MAX_RATE`] bits, kept by `Shape` within 1 s of the rate), on any device, gives
    /// the programs a class credit within 2^-15 of the exact time, at most 1 s or four
    /// frames; and it plus the longest queue and frame times added to a century of uptime
    /// cannot wrap. Bursts beyond what `Shape` produces (up to `u64::MAX`, at any rate)
    /// neither wrap nor divide by zero.
    #[test]
    fn class_credits_cannot_wrap() {
        let century = 100 * 365 * 86_400 * 1_000_000_000u64;
        let bursts = [
            None,
            Some(1),
            Some(UNSET_BURST),
            Some(MAX_RATE / 2),
            Some(MAX_RATE),
        ];
        for rate in accepted_rates() {
            for burst in bursts {
                for frame in [MIN_FRAME, frame_of_mtu(9000), frame_of_mtu(65_535)] {
                    let s = Shape::new(rate, burst, frame);
                    let credit = burst_ns(s.burst_bytes, rate);
                    let exact = exact_ns(s.burst_bytes, rate);
                    let what = format!("{rate} bit/s burst {burst:?} frame {frame}: {s:?}");
                    assert!(
                        u128::from(credit).abs_diff(exact) <= exact / 32_768 + 1,
                        "{what}"
                    );
                    assert!(
                        credit <= 1_000_100_000 || credit <= tx_ns(4 * frame, rate),
                        "{what}"
                    );
                    let longest = tx_ns(LEAF_QUEUE_FRAMES * frame, rate)
                        + tx_ns(frame, (rate / FLOW_RATE_DIV).max(1));
                    assert!(
                        century.checked_add(2 * credit + longest).is_some(),
                        "{what}"
                    );
                }
            }
        }
        // The case that wrapped before bursts were scaled: 1 s at 1 Pbit/s (2^46.8 bytes).
        let s = Shape::new(MAX_RATE, Some(MAX_RATE), MIN_FRAME);
        assert_eq!(s.burst_bytes, MAX_RATE / 8);
        assert!(s.burst_bytes <= BURST_MAX_BYTES);
        assert!((s.burst_bytes).checked_mul(8 * 1_000_000_000).is_none());
        assert_eq!(burst_ns(s.burst_bytes, MAX_RATE), 999_999_999);
        for rate in RATES {
            for burst in [TX_EXACT_BYTES, BURST_MAX_BYTES, u64::MAX] {
                // Never configured (more than 1 s of the rate): inexact, but bounded.
                let t = burst_ns(burst, rate);
                assert!(
                    century.checked_add(2 * t).is_some(),
                    "{burst} at {rate}: {t}"
                );
            }
        }
    }

    /// For every rate `Limits` accepts, the backstop's rate is within a bit/s of
    /// `POLICE_RATE_PCT` % of it, and its tolerance (class credit, the largest GSO aggregate it
    /// counts, the slack or its frames) added to a century of uptime cannot wrap.
    #[test]
    fn police_rate_and_tolerance_cannot_wrap() {
        for rate in accepted_rates() {
            let exact = u128::from(rate) * u128::from(POLICE_RATE_PCT) / 100;
            assert!(u128::from(police_rate(rate)).abs_diff(exact) <= 1, "{rate}");
        }
        let century = 100 * 365 * 86_400 * 1_000_000_000u64;
        for rate in accepted_rates() {
            for frame in [MIN_FRAME, frame_of_mtu(9000), frame_of_mtu(65_535)] {
                let s = Shape::new(rate, Some(MAX_RATE), frame);
                let tol = police_tolerance_ns(burst_ns(s.burst_bytes, rate), rate, frame, u64::MAX);
                assert!(century.checked_add(2 * tol).is_some(), "{rate} {frame}");
            }
        }
    }

    #[test]
    fn marking_threshold_grows_with_the_rate() {
        // 2 frames at 1 Mbit/s are longer than 2 ms.
        assert_eq!(ecn_mark_ns(1_000_000, 1514), 2 * 1514 * 8 * 1000);
        assert_eq!(ecn_mark_ns(10_000_000, 1514), 2_422_400);
        assert_eq!(ecn_mark_ns(20_000_000, 1514), 4_000_000);
        assert_eq!(ecn_mark_ns(50_000_000, 1514), 10_000_000);
        assert_eq!(ecn_mark_ns(1_000_000_000, 1514), 10_000_000);
        assert_eq!(ecn_mark_ns(1_000_000_000_000_000, 1514), 10_000_000);
        // Jumbo frames: never below two of the device's frames.
        assert_eq!(ecn_mark_ns(10_000_000, 9014), 2 * 9014 * 8 * 100);
        assert_eq!(ecn_mark_ns(1_000_000_000, 9014), 10_000_000);
    }
}
