//! Per-pod bandwidth limits: parsing (CNI `runtimeConfig.bandwidth`, pod annotations,
//! Kubernetes quantities), validation, and the burst and queue sizes derived from them.

use std::collections::BTreeMap;

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
/// Pod annotation for the limit on what the pod downloads from the internet (aliasnet's own).
pub const ANNOTATION_INTERNET_INGRESS: &str = "aliasnet.io/internet-ingress-bandwidth";

/// What a pod asks for. Rates are bit/s, bursts bits, as in CNI `runtimeConfig.bandwidth`.
/// `None` means "not set". The internet limits can only lower what node policy gives the
/// pod's namespace, never raise it: policy is a ceiling the pod's owner cannot lift.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
    pub internet_egress_rate: Option<u64>,
    pub internet_ingress_rate: Option<u64>,
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
    /// `aliasnet.io/internet-egress-bandwidth`, the internet-ingress limit from
    /// `aliasnet.io/internet-ingress-bandwidth`.
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
        let ann_internet_in = ann(ANNOTATION_INTERNET_INGRESS)?;
        let limits = Self {
            ingress_rate: bw.ingress_rate.or(ann_ingress),
            ingress_burst: bw.ingress_burst,
            egress_rate: bw.egress_rate.or(ann_egress),
            egress_burst: bw.egress_burst,
            internet_egress_rate: ann_internet,
            internet_ingress_rate: ann_internet_in,
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
        check_rate(ANNOTATION_INTERNET_INGRESS, limits.internet_ingress_rate)?;
        check_burst("runtimeConfig.bandwidth.ingressBurst", limits.ingress_burst)?;
        check_burst("runtimeConfig.bandwidth.egressBurst", limits.egress_burst)?;
        Ok(limits)
    }

    /// Checks every field; errors name the `Limits` field.
    pub fn validate(&self) -> Result<(), LimitError> {
        check_rate("ingress_rate", self.ingress_rate)?;
        check_rate("egress_rate", self.egress_rate)?;
        check_rate("internet_egress_rate", self.internet_egress_rate)?;
        check_rate("internet_ingress_rate", self.internet_ingress_rate)?;
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
    fn rates_format() {
        assert_eq!(fmt_rate(10_000_000), "10 Mbit/s");
        assert_eq!(fmt_rate(1_500_000), "1.5 Mbit/s");
        assert_eq!(fmt_rate(1_000), "1 kbit/s");
        assert_eq!(fmt_rate(999), "999 bit/s");
    }
}
