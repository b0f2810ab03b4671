//! A pod's limits as the datapath takes them: [`Limits`], parsed and validated once on the CNI
//! side (`aliasnet_cni_types::limits`, whose rate bounds and quantity parser shaperd's policy
//! uses too), and rates formatted for logs.

pub use aliasnet_cni_types::limits::{
    check_rate, parse_quantity, LimitError, Limits, MAX_RATE, MIN_RATE, UNSET_BURST,
};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_format() {
        assert_eq!(fmt_rate(10_000_000), "10 Mbit/s");
        assert_eq!(fmt_rate(1_500_000), "1.5 Mbit/s");
        assert_eq!(fmt_rate(1_000), "1 kbit/s");
        assert_eq!(fmt_rate(999), "999 bit/s");
    }
}
