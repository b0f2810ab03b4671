//! The extreme rates and bursts userspace may configure.

use aliasnet_ebpf::{limits, shape::Shape};
use aya::maps::Array;

use super::*;

// Each runs for both families: `name::ipv4`, `name::ipv6`.
per_family!(extreme_rates_and_bursts_give_the_queue_model_the_right_credit);

/// The highest and lowest rate `Limits` accepts, with the largest burst it keeps: the
/// queue model's credit (the class's burst as time) is right, not wrapped. 1 s of 1 Pbit/s
/// is 1.25e14 bytes, whose product with 8e9 does not fit 64 bits.
fn extreme_rates_and_bursts_give_the_queue_model_the_right_credit(fam: Family) {
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
        let pkt = Ip::new(internet(fam), fam.pod()).build();
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
