//! Per-pod bandwidth limits: parsing (CNI `runtimeConfig.bandwidth`, pod annotations,
//! Kubernetes quantities), validation, and the burst and queue sizes derived from them.

use std::collections::BTreeMap;

use aliasnet_ebpf::abi;

/// Lowest accepted rate: 1 kbit/s.
pub const MIN_RATE: u64 = 1_000;
/// Highest accepted rate: 1 Pbit/s.
pub const MAX_RATE: u64 = 1_000_000_000_000_000;
/// containerd sends this burst (bits) when the pod sets none; the CNI bandwidth plugin then
/// builds a 512 MiB bucket that lets short transfers through unshaped. We treat it as unset.
pub const UNSET_BURST: u64 = u32::MAX as u64;

/// Pod annotation for the ingress (to the pod) limit, a Kubernetes quantity in bit/s.
pub const ANNOTATION_INGRESS: &str = "kubernetes.io/ingress-bandwidth";
/// Pod annotation for the total egress (from the pod) limit.
pub const ANNOTATION_EGRESS: &str = "kubernetes.io/egress-bandwidth";
/// Pod annotation for the internet-bound egress limit (aliasnet's own).
pub const ANNOTATION_INTERNET_EGRESS: &str = "aliasnet.io/internet-egress-bandwidth";

/// What a pod asks for. Rates are bit/s, bursts bits, as in CNI `runtimeConfig.bandwidth`.
/// `None` means "not set". `internet_egress_rate: None` lets node policy decide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
    pub internet_egress_rate: Option<u64>,
}

/// A bandwidth value that cannot be used; `field` names where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct LimitError {
    pub field: String,
    pub reason: String,
}

impl LimitError {
    fn new(field: &str, reason: impl Into<String>) -> Self {
        Self {
            field: field.to_owned(),
            reason: reason.into(),
        }
    }
}

/// The four `runtimeConfig.bandwidth` values as the runtime sent them (bits/s and bits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CniBandwidth {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
}

impl Limits {
    /// Combines `runtimeConfig.bandwidth` and the pod annotations.
    ///
    /// For ingress and egress, `runtimeConfig` wins when both are given (containerd derives it
    /// from the same annotations); every annotation present is still parsed, so a bad value
    /// is reported even when shadowed. The internet-egress limit comes from
    /// `aliasnet.io/internet-egress-bandwidth` only.
    pub fn from_cni(
        bw: CniBandwidth,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Self, LimitError> {
        let ann = |key: &str| -> Result<Option<u64>, LimitError> {
            annotations
                .get(key)
                .map(|v| parse_quantity(v).map_err(|r| LimitError::new(key, r)))
                .transpose()
        };
        let ann_ingress = ann(ANNOTATION_INGRESS)?;
        let ann_egress = ann(ANNOTATION_EGRESS)?;
        let ann_internet = ann(ANNOTATION_INTERNET_EGRESS)?;
        let limits = Self {
            ingress_rate: bw.ingress_rate.or(ann_ingress),
            ingress_burst: bw.ingress_burst,
            egress_rate: bw.egress_rate.or(ann_egress),
            egress_burst: bw.egress_burst,
            internet_egress_rate: ann_internet,
        };
        // Name the field the value came from.
        let src = |cni: Option<u64>, cni_name: &'static str, ann_name: &'static str| {
            if cni.is_some() {
                cni_name
            } else {
                ann_name
            }
        };
        check_rate(
            src(
                bw.ingress_rate,
                "runtimeConfig.bandwidth.ingressRate",
                ANNOTATION_INGRESS,
            ),
            limits.ingress_rate,
        )?;
        check_rate(
            src(
                bw.egress_rate,
                "runtimeConfig.bandwidth.egressRate",
                ANNOTATION_EGRESS,
            ),
            limits.egress_rate,
        )?;
        check_rate(ANNOTATION_INTERNET_EGRESS, limits.internet_egress_rate)?;
        check_burst("runtimeConfig.bandwidth.ingressBurst", limits.ingress_burst)?;
        check_burst("runtimeConfig.bandwidth.egressBurst", limits.egress_burst)?;
        Ok(limits)
    }

    /// Checks every field; errors name the `Limits` field.
    pub fn validate(&self) -> Result<(), LimitError> {
        check_rate("ingress_rate", self.ingress_rate)?;
        check_rate("egress_rate", self.egress_rate)?;
        check_rate("internet_egress_rate", self.internet_egress_rate)?;
        check_burst("ingress_burst", self.ingress_burst)?;
        check_burst("egress_burst", self.egress_burst)?;
        Ok(())
    }
}

/// Checks that a rate in bit/s is usable. A rate of zero is rejected rather than read as
/// "unlimited": the CNI bandwidth plugin rejects it too, and silently not shaping a pod that
/// asked for 0 would be worse than failing its ADD.
pub fn check_rate(field: &str, rate: Option<u64>) -> Result<(), LimitError> {
    match rate {
        None => Ok(()),
        Some(0) => Err(LimitError::new(field, "rate must not be zero")),
        Some(r) if r < MIN_RATE => Err(LimitError::new(
            field,
            format!("{r} bit/s is below the minimum of {MIN_RATE} bit/s (1 kbit/s)"),
        )),
        Some(r) if r > MAX_RATE => Err(LimitError::new(
            field,
            format!("{r} bit/s is above the maximum of {MAX_RATE} bit/s (1 Pbit/s)"),
        )),
        Some(_) => Ok(()),
    }
}

fn check_burst(field: &str, burst: Option<u64>) -> Result<(), LimitError> {
    match burst {
        Some(b) if b != UNSET_BURST && b > MAX_RATE => Err(LimitError::new(
            field,
            format!("{b} bits is above the maximum of {MAX_RATE} bits"),
        )),
        _ => Ok(()),
    }
}

/// Parses a Kubernetes quantity as used by the bandwidth annotations ("10M", "1.5G", "500Ki",
/// "1e6", "100000"), in bit/s, rounding a fractional result up as `Quantity.Value()` does.
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty quantity".to_owned());
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() || num.matches('.').count() > 1 || num == "." {
        return Err(format!("{s:?} is not a quantity like 10M or 1G"));
    }
    // Scale as (multiplier, divisor) so that the arithmetic stays exact in integers.
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: u32 = e[1..]
                .parse()
                .map_err(|_| format!("{s:?}: bad exponent {e:?}"))?;
            if exp > 30 {
                return Err(format!("{s:?} is too large"));
            }
            (10u128.pow(exp), 1)
        }
        other => {
            return Err(format!(
                "{s:?}: unknown suffix {other:?} (use k, M, G, T, P, Ki, Mi, Gi)"
            ))
        }
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if frac.len() > 18 {
        return Err(format!("{s:?}: too many decimal places"));
    }
    let digits = format!("{int}{frac}");
    let mantissa: u128 = digits.parse().map_err(|_| format!("{s:?} is too large"))?;
    let scale = 10u128.pow(frac.len() as u32) * div;
    let value = mantissa
        .checked_mul(mul)
        .ok_or_else(|| format!("{s:?} is too large"))?
        .div_ceil(scale);
    u64::try_from(value).map_err(|_| format!("{s:?} is too large"))
}

/// Formats bit/s for logs and errors ("10 Mbit/s").
pub fn fmt_rate(bps: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (1_000_000_000_000_000, "Pbit/s"),
        (1_000_000_000_000, "Tbit/s"),
        (1_000_000_000, "Gbit/s"),
        (1_000_000, "Mbit/s"),
        (1_000, "kbit/s"),
    ];
    for (unit, name) in UNITS {
        if bps >= unit && bps.is_multiple_of((unit / 1000).max(1)) {
            let whole = bps / unit;
            let frac = (bps % unit) / (unit / 1000);
            return if frac == 0 {
                format!("{whole} {name}")
            } else {
                format!(
                    "{whole}.{} {name}",
                    format!("{frac:03}").trim_end_matches('0')
                )
            };
        }
    }
    format!("{bps} bit/s")
}

/// Sizes derived from a rate for one HTB class and its leaf queues.
///
/// This kernel has no AQM or flow-queueing qdisc (no fq, fq_codel, sfq, RED): the leaves are
/// drop-tail, and the programs do the rest (see ebpf/include/aliasnet_abi.h; the sizes here
/// are the ABI's constants so that the programs' model matches the qdiscs; measurements in
/// BENCHMARKS.md section 4):
/// - Flow isolation (`an_flows`): every shaped class has a sparse leaf (pings, DNS, ACKs, new
///   flows; served first) and a bulk leaf, so a bulk flow's queue does not delay the pod's
///   other traffic. Under a BBR download at 10 Mbit/s a ping's RTT went from 11-26 ms to
///   0.1 ms.
/// - Forwarded traffic (to the pod, node uplink): drops are real losses. Above the marking
///   threshold ECN-capable packets are CE-marked, and the pod's TCP receive windows are
///   clamped to the path plus a short queue (`an_conns`), which bounds any sender, BBR's
///   startup included (it overshot the 25 ms leaf by ~160 segments per connection at 10
///   Mbit/s: 1.9 % retransmits, 0 with the clamp). The bulk leaf is a tbf (a 1 ms bucket, so
///   larger GSO skbs are segmented and the byte limit holds) that drops beyond 25 ms.
/// - Local senders (pod egress, on the pod's eth0): above the threshold ECN-capable packets
///   are marked and local TCP data is dropped before the qdisc, which the local TCP takes as
///   congestion (CWR) and not as a loss. The FIFO leaves hold 25 ms of full frames (at
///   least 16 packets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// bit/s
    pub rate: u64,
    /// bytes HTB may send at once above the rate
    pub burst_bytes: u64,
    /// packets a local-sender leaf FIFO holds
    pub queue_packets: u32,
    /// bytes a forwarded-traffic leaf (tbf) holds
    pub queue_bytes: u64,
    /// tbf bucket; GSO skbs above it are segmented
    pub leaf_burst_bytes: u64,
    /// tbf rate (bit/s): `LEAF_RATE_HEADROOM` above the class's, so that HTB alone shapes and
    /// the tbf only segments and bounds the queue. Two buckets at the same rate in series
    /// idle each other: measured, L2 99.5 % instead of 100.2 % of the rate at 10 Mbit/s.
    pub leaf_rate: u64,
}

/// The tbf leaf runs this fraction (1/N) faster than its class.
const LEAF_RATE_HEADROOM: u64 = 50;

/// One full-size Ethernet frame.
const MTU_FRAME: u64 = abi::FRAME_BYTES;

/// Forwarded-traffic leaf queue: this many ms of the rate, at least 3 full frames.
pub const QUEUE_MS: u64 = abi::LEAF_QUEUE_NS / 1_000_000;
/// Local-sender leaf FIFO, in packets: the forwarded leaf's time in full frames, within
/// these bounds. The programs keep TCP's share of it short (`an_pod_egress` drops local TCP
/// data above the marking threshold); the rest is room for other packets, which a FIFO of
/// a few packets full of 64 KiB GSO skbs would drop.
const LOCAL_QUEUE_MIN: u64 = 16;
const LOCAL_QUEUE_MAX: u64 = 100_000;

/// `ns` worth of bytes at `bytes_per_sec`, at least `frames` full frames: the sizes the
/// programs' queue model assumes (see `an_vqueue` in the ABI header).
fn at_least(bytes_per_sec: u64, ns: u64, frames: u64) -> u64 {
    let b = u128::from(bytes_per_sec) * u128::from(ns) / 1_000_000_000;
    (b.min(u128::from(u64::MAX)) as u64).max(frames * MTU_FRAME)
}

impl Shape {
    /// `burst_bits` as given by the runtime: `None`, `0` and [`UNSET_BURST`] mean unset. A set
    /// burst is kept within [4 frames, 1 s of the rate] so that no value can defeat the limit.
    pub fn new(rate: u64, burst_bits: Option<u64>) -> Self {
        let bytes_per_sec = (rate / 8).max(1);
        let floor = abi::DEFAULT_BURST_FRAMES * MTU_FRAME;
        let ceiling = bytes_per_sec.max(floor);
        let burst_bytes = match burst_bits {
            None | Some(0) | Some(UNSET_BURST) => {
                at_least(bytes_per_sec, abi::DEFAULT_BURST_NS, 0).clamp(floor, ceiling)
            }
            Some(b) => (b / 8).clamp(floor, ceiling),
        };
        let queue_packets = (at_least(bytes_per_sec, abi::LEAF_QUEUE_NS, 0) / MTU_FRAME)
            .clamp(LOCAL_QUEUE_MIN, LOCAL_QUEUE_MAX) as u32;
        Self {
            rate,
            burst_bytes,
            queue_packets,
            queue_bytes: at_least(bytes_per_sec, abi::LEAF_QUEUE_NS, abi::LEAF_QUEUE_FRAMES),
            leaf_burst_bytes: at_least(bytes_per_sec, abi::LEAF_BURST_NS, abi::LEAF_BURST_FRAMES),
            leaf_rate: rate.saturating_add(rate / LEAF_RATE_HEADROOM),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        let ok = [
            ("10M", 10_000_000),
            ("1G", 1_000_000_000),
            ("1.5M", 1_500_000),
            ("500k", 500_000),
            ("1Mi", 1_048_576),
            ("2Gi", 2 * (1 << 30)),
            ("1e6", 1_000_000),
            ("100000", 100_000),
            (" 10M ", 10_000_000),
            ("1500m", 2), // 1.5 rounds up
            ("0.0001k", 1),
        ];
        for (s, want) in ok {
            assert_eq!(parse_quantity(s), Ok(want), "{s}");
        }
        for bad in [
            "",
            "M",
            "10MB",
            "ten",
            "1..2M",
            "-5M",
            "1e99",
            "99999999999999999999999E",
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn rate_bounds_name_the_field() {
        let e = check_rate("egress_rate", Some(0)).unwrap_err();
        assert_eq!(e.field, "egress_rate");
        assert!(e.to_string().contains("zero"), "{e}");
        assert!(check_rate("x", Some(999))
            .unwrap_err()
            .reason
            .contains("below"));
        assert!(check_rate("x", Some(MAX_RATE + 1))
            .unwrap_err()
            .reason
            .contains("above"));
        assert!(check_rate("x", Some(MIN_RATE)).is_ok());
        assert!(check_rate("x", Some(MAX_RATE)).is_ok());
    }

    #[test]
    fn from_cni_prefers_runtime_config_and_checks_annotations() {
        let mut ann = BTreeMap::new();
        ann.insert(ANNOTATION_EGRESS.to_owned(), "20M".to_owned());
        ann.insert(ANNOTATION_INTERNET_EGRESS.to_owned(), "5M".to_owned());
        let bw = CniBandwidth {
            ingress_rate: Some(10_000_000),
            ingress_burst: Some(UNSET_BURST),
            egress_rate: None,
            egress_burst: Some(UNSET_BURST),
        };
        let l = Limits::from_cni(bw, &ann).unwrap();
        assert_eq!(l.ingress_rate, Some(10_000_000));
        assert_eq!(l.egress_rate, Some(20_000_000));
        assert_eq!(l.internet_egress_rate, Some(5_000_000));

        ann.insert(ANNOTATION_INGRESS.to_owned(), "fast".to_owned());
        let e = Limits::from_cni(bw, &ann).unwrap_err();
        assert_eq!(e.field, ANNOTATION_INGRESS);

        ann.remove(ANNOTATION_INGRESS);
        let e = Limits::from_cni(
            CniBandwidth {
                egress_rate: Some(0),
                ..bw
            },
            &ann,
        )
        .unwrap_err();
        assert_eq!(e.field, "runtimeConfig.bandwidth.egressRate");
        let mut ann2 = BTreeMap::new();
        ann2.insert(ANNOTATION_INTERNET_EGRESS.to_owned(), "500".to_owned());
        let e = Limits::from_cni(CniBandwidth::default(), &ann2).unwrap_err();
        assert_eq!(e.field, ANNOTATION_INTERNET_EGRESS);
        assert!(e.reason.contains("below"));
    }

    #[test]
    fn unset_burst_does_not_defeat_the_limit() {
        let rate = 10_000_000; // 10 Mbit/s = 1.25 MB/s
        let unset = Shape::new(rate, Some(UNSET_BURST));
        assert_eq!(unset, Shape::new(rate, None));
        assert_eq!(unset, Shape::new(rate, Some(0)));
        assert_eq!(unset.burst_bytes, 12_500);
        // A huge explicit burst is capped at one second of the rate.
        assert_eq!(
            Shape::new(rate, Some(u64::from(u32::MAX) - 1)).burst_bytes,
            1_250_000
        );
        // A tiny one is raised to a few frames.
        assert_eq!(Shape::new(rate, Some(8)).burst_bytes, 4 * 1514);
        assert_eq!(Shape::new(rate, Some(800_000)).burst_bytes, 100_000);
    }

    #[test]
    fn leaf_sizes_are_the_programs_model() {
        // 10 Mbit/s: 25 ms queue, a 2-frame bucket (1 ms would be below a frame), and a
        // pod-side FIFO of 25 ms of full frames.
        let ten = Shape::new(10_000_000, None);
        assert_eq!(ten.queue_bytes, 31_250);
        assert_eq!(ten.leaf_burst_bytes, 2 * 1514);
        assert_eq!(ten.queue_packets, 20);
        assert_eq!(ten.leaf_rate, 10_200_000);
        // Slow classes keep room for a few packets.
        let slow = Shape::new(1_000_000, None);
        assert_eq!(slow.queue_bytes, 3 * 1514);
        assert_eq!(slow.queue_packets, 16);
        let gig = Shape::new(1_000_000_000, None);
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
    fn rates_format() {
        assert_eq!(fmt_rate(10_000_000), "10 Mbit/s");
        assert_eq!(fmt_rate(1_500_000), "1.5 Mbit/s");
        assert_eq!(fmt_rate(1_000), "1 kbit/s");
        assert_eq!(fmt_rate(999), "999 bit/s");
    }
}
