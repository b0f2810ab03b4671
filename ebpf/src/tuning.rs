//! Rust mirrors of `ebpf/include/aliasnet_tuning.h`: the sizes and thresholds of the queue
//! model, flow isolation and the window clamp, which the qdiscs user space builds must match,
//! and the benchmark switches in `an_config.flags`.
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

/// The window clamp: rate x RTT plus this much queue, at least `WND_MIN_FRAMES` frames for
/// the class and `WND_MIN_FLOW_FRAMES` per connection.
pub const WND_QUEUE_NS: u64 = 16_000_000;
pub const WND_MIN_FRAMES: u64 = 4;
pub const WND_MIN_FLOW_FRAMES: u64 = 2;

#[cfg(test)]
mod tests {
    use super::*;

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
