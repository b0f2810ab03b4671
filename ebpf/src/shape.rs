//! The sizes of one shaping point: a device's frame and aggregates, and the burst, queue and
//! leaf sizes HTB and its leaves get for a rate on that device.

use crate::{abi, limits::UNSET_BURST};

/// The sizes of the packets a device hands its qdiscs. Every size of a shaping point
/// derives from them, never from a fixed 1500-byte MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSizes {
    /// The device MTU (L3 bytes).
    pub mtu: u32,
    /// The largest GSO aggregate the stack builds for it (`gso_max_size`, BIG TCP included).
    pub gso_max: u32,
    /// The largest GRO aggregate it receives (`gro_max_size`).
    pub gro_max: u32,
}

impl DeviceSizes {
    /// A plain 1500-byte Ethernet device with 64 KiB aggregates.
    pub const ETHERNET: Self = Self {
        mtu: 1500,
        gso_max: 65_536,
        gro_max: 65_536,
    };

    /// The largest frame (MTU + Ethernet header) as HTB and tbf count it: the largest packet
    /// a shaping point can be handed that a qdisc cannot segment.
    pub fn frame(&self) -> u64 {
        abi::frame_of_mtu(self.mtu)
    }

    /// The largest aggregate (GSO or GRO) a shaping point can be handed, at least a frame.
    pub fn aggregate_max(&self) -> u64 {
        u64::from(self.gso_max.max(self.gro_max)).max(self.frame())
    }
}

/// Sizes derived from a rate and the device's frame for one HTB class and its leaf queues.
///
/// Every size has a floor in frames of the device (MTU + Ethernet header): no bucket, queue
/// or threshold can be smaller than a packet the device hands the qdisc. Aggregates (GSO from
/// local senders, GRO from the receive path, up to [`DeviceSizes::aggregate_max`]) are larger
/// and never refused for their size: the tbf leaf segments one above its peak bucket into frames,
/// HTB charges it whole (its tokens go into debt and the class waits that much longer), and
/// the packet FIFOs count packets. At a rate where one frame takes longer than a time target
/// (9014 bytes at 1 Mbit/s: 72 ms, against the 25 ms leaf queue) the frame floor wins: the
/// leaf holds `LEAF_QUEUE_FRAMES` frames and a bulk flow's queueing delay grows with the
/// frame time; the sparse leaf still serves pings and ACKs first, after at most one frame.
/// TCP is spared that: the programs lower the handshake's MSS so that a class's segments
/// take at most `abi::SEG_NS` (never below a 1500-byte network's), and size the window
/// clamp's floors in those segments.
///
/// The kernel may have no AQM or flow-queueing qdisc (no sch_fq, fq_codel, sfq): the leaves
/// are drop-tail, and the programs do the rest (see ebpf/include/aliasnet_tuning.h; the sizes
/// here are its constants so that the programs' model matches the qdiscs; measurements
/// in BENCHMARKS.md section 4):
/// - Flow isolation (`an_flows`): every shaped class has a sparse leaf (pings, DNS, ACKs, new
///   flows; served first) and a bulk leaf, so a bulk flow's queue does not delay the pod's
///   other traffic.
/// - Forwarded traffic (to the pod, node uplink): drops are real losses. Above the marking
///   threshold ECN-capable packets are CE-marked, and the pod's TCP receive windows are
///   clamped to the path plus a short queue (`an_conns`), which bounds any sender, BBR's
///   startup included. The bulk leaf is a tbf that drops beyond 25 ms and segments
///   aggregates above 1 ms (at least two frames; its peak bucket) so that the byte limit holds;
///   its own bucket takes all HTB releases at once, so it never delays HTB's output: HTB alone
///   shapes, and the programs' queue model (HTB's rate and burst) is what the class does.
/// - Local senders (pod egress, on the pod's eth0): above the threshold ECN-capable packets
///   are marked and local TCP data is dropped before the qdisc, which the local TCP takes as
///   congestion (CWR) and not as a loss. The FIFO leaves hold 25 ms of frames (at least 16
///   packets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// bit/s
    pub rate: u64,
    /// The device's largest frame, bytes: the unit of every floor below.
    pub frame: u64,
    /// bytes HTB may send at once above the rate
    pub burst_bytes: u64,
    /// packets a local-sender leaf FIFO holds
    pub queue_packets: u32,
    /// bytes a forwarded-traffic leaf (tbf) holds
    pub queue_bytes: u64,
    /// The largest packet the tbf leaf passes whole (its peak bucket): larger aggregates are
    /// segmented, so the byte limit holds and HTB is never handed more than this at once.
    pub leaf_burst_bytes: u64,
    /// tbf bucket: what HTB releases at once (the class's burst plus one packet over it), so
    /// that the tbf never holds back HTB's output.
    pub leaf_bucket_bytes: u64,
    /// tbf rate (bit/s): `LEAF_RATE_HEADROOM` above the class's, so that HTB alone shapes and
    /// the tbf only segments and bounds the queue. Two buckets at the same rate in series
    /// idle each other: measured, L2 99.5 % instead of 100.2 % of the rate at 10 Mbit/s.
    pub leaf_rate: u64,
    /// tbf peak rate (bit/s), which refills the peak bucket ([`Self::leaf_burst_bytes`]):
    /// far above the class's, so that only the bucket's size (segmentation) matters.
    pub leaf_peak_rate: u64,
}

/// The tbf leaf runs this fraction (1/N) faster than its class.
const LEAF_RATE_HEADROOM: u64 = 50;
/// The tbf leaf's peak rate: this many times its class's, and at least `LEAF_PEAK_MIN`
/// bit/s, so that a frame's worth of it refills in nanoseconds, faster than HTB dequeues.
const LEAF_PEAK_FACTOR: u64 = 1000;
const LEAF_PEAK_MIN: u64 = 1_000_000_000_000;

/// Forwarded-traffic leaf queue: this many ms of the rate, at least `LEAF_QUEUE_FRAMES` frames.
pub const QUEUE_MS: u64 = abi::LEAF_QUEUE_NS / 1_000_000;
/// Local-sender leaf FIFO, in packets: the forwarded leaf's time in frames, within these
/// bounds. The programs keep TCP's share of it short (`an_pod_egress` drops local TCP data
/// above the marking threshold); the rest is room for other packets, which a FIFO of a few
/// packets full of 64 KiB GSO skbs would drop.
const LOCAL_QUEUE_MIN: u64 = 16;
const LOCAL_QUEUE_MAX: u64 = 100_000;

/// `ns` worth of bytes at `bytes_per_sec`, at least `frames` frames of `frame` bytes: the
/// sizes the programs' queue model assumes (see the queue model in `aliasnet_tuning.h`).
fn at_least(bytes_per_sec: u64, ns: u64, frames: u64, frame: u64) -> u64 {
    let b = u128::from(bytes_per_sec) * u128::from(ns) / 1_000_000_000;
    (b.min(u128::from(u64::MAX)) as u64).max(frames.saturating_mul(frame))
}

impl Shape {
    /// A class at `rate` bit/s on a device whose largest frame is `frame` bytes (see
    /// [`DeviceSizes::frame`]). `burst_bits` as given by the runtime: `None`, `0` and
    /// [`UNSET_BURST`] mean unset. A set burst is kept within [4 segments and a frame, 1 s
    /// of the rate] so that no value can defeat the limit or stall a frame.
    pub fn new(rate: u64, burst_bits: Option<u64>, frame: u64) -> Self {
        // 68: the smallest IPv4 MTU.
        let frame = frame.max(abi::frame_of_mtu(68));
        let bytes_per_sec = (rate / 8).max(1);
        // A few of the class's segments, and a frame: what the programs' credit assumes.
        let floor = (abi::DEFAULT_BURST_FRAMES * abi::seg_frame(rate, frame)).max(frame);
        let ceiling = bytes_per_sec.max(floor);
        let burst_bytes = match burst_bits {
            None | Some(0) | Some(UNSET_BURST) => {
                at_least(bytes_per_sec, abi::DEFAULT_BURST_NS, 0, frame).clamp(floor, ceiling)
            }
            Some(b) => (b / 8).clamp(floor, ceiling),
        };
        let leaf_burst_bytes = at_least(
            bytes_per_sec,
            abi::LEAF_BURST_NS,
            abi::LEAF_BURST_FRAMES,
            frame,
        );
        let queue_packets = (at_least(bytes_per_sec, abi::LEAF_QUEUE_NS, 0, frame) / frame)
            .clamp(LOCAL_QUEUE_MIN, LOCAL_QUEUE_MAX) as u32;
        Self {
            rate,
            frame,
            burst_bytes,
            queue_packets,
            queue_bytes: at_least(
                bytes_per_sec,
                abi::LEAF_QUEUE_NS,
                abi::LEAF_QUEUE_FRAMES,
                frame,
            ),
            leaf_burst_bytes,
            leaf_bucket_bytes: burst_bytes.saturating_add(leaf_burst_bytes),
            leaf_rate: rate.saturating_add(rate / LEAF_RATE_HEADROOM),
            leaf_peak_rate: rate.saturating_mul(LEAF_PEAK_FACTOR).max(LEAF_PEAK_MIN),
        }
    }

    /// The same class for a lower or higher rate on the same device.
    pub fn at_rate(&self, rate: u64) -> Self {
        Self::new(rate, None, self.frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_RATE, MIN_RATE};

    const ETH: u64 = 1514;
    const JUMBO: u64 = 9014;

    #[test]
    fn unset_burst_does_not_defeat_the_limit() {
        let rate = 10_000_000; // 10 Mbit/s = 1.25 MB/s
        let unset = Shape::new(rate, Some(UNSET_BURST), ETH);
        assert_eq!(unset, Shape::new(rate, None, ETH));
        assert_eq!(unset, Shape::new(rate, Some(0), ETH));
        assert_eq!(unset.burst_bytes, 12_500);
        // A huge explicit burst is capped at one second of the rate.
        assert_eq!(
            Shape::new(rate, Some(u64::from(u32::MAX) - 1), ETH).burst_bytes,
            1_250_000
        );
        // A tiny one is raised to a few of the device's frames.
        assert_eq!(Shape::new(rate, Some(8), ETH).burst_bytes, 4 * 1514);
        // On a jumbo-frame device a slow class's floor is one frame (its TCP segments are a
        // 1500-byte network's, four of which are less).
        assert_eq!(Shape::new(rate, Some(8), JUMBO).burst_bytes, 9014);
        assert_eq!(
            Shape::new(1_000_000_000, Some(8), JUMBO).burst_bytes,
            4 * 9014
        );
        assert_eq!(Shape::new(rate, Some(800_000), ETH).burst_bytes, 100_000);
    }

    #[test]
    fn leaf_sizes_are_the_programs_model() {
        // 10 Mbit/s: 25 ms queue, a 2-frame bucket (1 ms would be below a frame), and a
        // pod-side FIFO of 25 ms of frames.
        let ten = Shape::new(10_000_000, None, ETH);
        assert_eq!(ten.queue_bytes, 31_250);
        assert_eq!(ten.leaf_burst_bytes, 2 * 1514);
        assert_eq!(ten.queue_packets, 20);
        assert_eq!(ten.leaf_rate, 10_200_000);
        // The tbf's bucket takes HTB's burst and one packet over it: it never holds back
        // what HTB releases (a 2-frame bucket at 1500 bytes did, in series with HTB).
        assert_eq!(ten.leaf_bucket_bytes, 12_500 + 2 * 1514);
        assert_eq!(ten.leaf_peak_rate, 1_000_000_000_000);
        // Slow classes keep room for a few frames.
        let slow = Shape::new(1_000_000, None, ETH);
        assert_eq!(slow.queue_bytes, 6 * 1514);
        assert_eq!(slow.queue_packets, 16);
        let gig = Shape::new(1_000_000_000, None, ETH);
        assert_eq!(gig.queue_bytes, 3_125_000);
        assert_eq!(gig.leaf_burst_bytes, 125_000);
        assert_eq!(gig.queue_packets, 2064);
        assert_eq!(gig.burst_bytes, 1_250_000);
        // The sizes come from the ABI constants the programs' queue model uses.
        assert_eq!(
            gig.queue_bytes,
            125_000_000 * abi::LEAF_QUEUE_NS / 1_000_000_000
        );
        assert_eq!(
            gig.leaf_burst_bytes,
            125_000_000 * abi::LEAF_BURST_NS / 1_000_000_000
        );
        assert_eq!(QUEUE_MS, 25);
    }

    #[test]
    fn jumbo_frames_fit_every_shaping_point() {
        // The reported stall: 10 Mbit/s on a 9000-byte MTU had a 3028-byte tbf bucket, so
        // every full-size frame was dropped.
        let ten = Shape::new(10_000_000, Some(UNSET_BURST), JUMBO);
        assert_eq!(ten.leaf_burst_bytes, 2 * 9014);
        assert_eq!(ten.queue_bytes, 6 * 9014);
        assert_eq!(ten.burst_bytes, 12_500);
        assert_eq!(ten.frame, JUMBO);
    }

    /// Every size of every shaping point holds the device's largest frame, for any rate,
    /// burst and MTU, and the aggregate that a tbf enqueues whole (up to its bucket) fits its
    /// queue; nothing overflows.
    #[test]
    fn no_shaping_point_is_smaller_than_a_frame() {
        let rates = [
            MIN_RATE,
            1_000_000,
            9_999_999,
            10_000_000,
            100_000_000,
            1_000_000_000,
            40_000_000_000,
            MAX_RATE,
        ];
        let mtus = [68u32, 1280, 1460, 1500, 4000, 8896, 9000, 9001, 65_535];
        let bursts = [None, Some(0), Some(1), Some(UNSET_BURST), Some(MAX_RATE)];
        for rate in rates {
            for mtu in mtus {
                for burst in bursts {
                    let dev = DeviceSizes {
                        mtu,
                        gso_max: 524_280,
                        gro_max: 65_536,
                    };
                    let s = Shape::new(rate, burst, dev.frame());
                    let what = format!("rate {rate} mtu {mtu} burst {burst:?}: {s:?}");
                    assert_eq!(s.frame, dev.frame(), "{what}");
                    assert!(s.burst_bytes >= dev.frame(), "{what}");
                    assert!(
                        s.burst_bytes >= 4 * abi::seg_frame(rate, dev.frame()).min(dev.frame()),
                        "{what}"
                    );
                    assert!(s.leaf_burst_bytes >= 2 * dev.frame(), "{what}");
                    assert!(
                        s.queue_bytes >= s.leaf_burst_bytes + 4 * dev.frame(),
                        "{what}"
                    );
                    assert!(s.queue_packets >= 16, "{what}");
                    assert!(
                        abi::ecn_mark_ns(rate, s.frame) >= 2 * s.frame * 8 * 1_000_000_000 / rate,
                        "{what}"
                    );
                    assert!(s.leaf_rate >= rate, "{what}");
                    assert!(
                        s.leaf_bucket_bytes >= s.burst_bytes + s.leaf_burst_bytes,
                        "{what}"
                    );
                    assert!(s.leaf_peak_rate > s.leaf_rate, "{what}");
                }
            }
        }
    }
}
