//! A pod's bandwidth limits, parsed once: `runtimeConfig.bandwidth` (as containerd and podman
//! send it), the pod's annotations and Kubernetes quantities become the one [`Limits`] the
//! datapath takes (`aliasnet_ebpf::Limits` is this type). Every value is validated here, and a
//! bad one names the field it came from.

use crate::runtime_config::RuntimeConfig;

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
/// Pod annotation for the limit of downloads from the internet (aliasnet's own).
pub const ANNOTATION_INTERNET_INGRESS: &str = "aliasnet.io/internet-ingress-bandwidth";

/// `runtimeConfig.bandwidth`'s fields as messages name them.
const INGRESS_RATE: &str = "runtimeConfig.bandwidth.ingressRate";
const INGRESS_BURST: &str = "runtimeConfig.bandwidth.ingressBurst";
const EGRESS_RATE: &str = "runtimeConfig.bandwidth.egressRate";
const EGRESS_BURST: &str = "runtimeConfig.bandwidth.egressBurst";

/// What a pod asks for. Rates are bit/s, bursts bits, as in CNI `runtimeConfig.bandwidth`.
/// `None` means "not set". `internet_egress_rate: None` lets node policy decide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
    pub internet_egress_rate: Option<u64>,
    /// Downloads from the internet (`aliasnet.io/internet-ingress-bandwidth`).
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

/// What a pod asks for, and where its first limit comes from (for "we cannot honour it"
/// errors: a limit with the datapath off, or not initialised yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub limits: Limits,
    pub field: Option<&'static str>,
}

impl Requested {
    pub fn any(&self) -> bool {
        self.field.is_some()
    }
}

/// One direction of `runtimeConfig.bandwidth`. containerd (go-cni's `BandWidth`, no
/// `omitempty`) sends rate 0 with burst 0 for a direction the pod does not limit, so exactly
/// that pair means "unset". Any other zero rate is a request we reject.
fn direction(rate: Option<u64>, burst: Option<u64>) -> (Option<u64>, Option<u64>) {
    match (rate, burst) {
        (Some(0), Some(0)) => (None, None),
        other => other,
    }
}

impl Limits {
    /// The limits in `runtimeConfig.bandwidth` and the pod annotations.
    ///
    /// For ingress and egress, `runtimeConfig` wins when both are given (containerd derives it
    /// from the same annotations); every annotation present is still parsed, so a bad value
    /// is reported even when shadowed. The internet limits come from aliasnet's annotations
    /// only.
    pub fn requested(rc: &RuntimeConfig) -> Result<Requested, LimitError> {
        let bw = rc.bandwidth.unwrap_or_default();
        let (cni_ingress, ingress_burst) = direction(bw.ingress_rate, bw.ingress_burst);
        let (cni_egress, egress_burst) = direction(bw.egress_rate, bw.egress_burst);
        let annotations = &rc.pod_annotations;
        let ann = |key: &str| -> Result<Option<u64>, LimitError> {
            annotations
                .get(key)
                .map(|v| parse_quantity(v).map_err(|r| LimitError::new(key, r)))
                .transpose()
        };
        let ann_ingress = ann(ANNOTATION_INGRESS)?;
        let ann_egress = ann(ANNOTATION_EGRESS)?;
        let internet_egress_rate = ann(ANNOTATION_INTERNET_EGRESS)?;
        let internet_ingress_rate = ann(ANNOTATION_INTERNET_INGRESS)?;
        // Each rate with the field it came from.
        let pick = |cni: Option<u64>, cni_field: &'static str, a: Option<u64>, a_field| match cni {
            Some(r) => (Some(r), cni_field),
            None => (a, a_field),
        };
        let ingress = pick(cni_ingress, INGRESS_RATE, ann_ingress, ANNOTATION_INGRESS);
        let egress = pick(cni_egress, EGRESS_RATE, ann_egress, ANNOTATION_EGRESS);
        let rates = [
            ingress,
            egress,
            (internet_egress_rate, ANNOTATION_INTERNET_EGRESS),
            (internet_ingress_rate, ANNOTATION_INTERNET_INGRESS),
        ];
        for (rate, field) in rates {
            check_rate(field, rate)?;
        }
        check_burst(INGRESS_BURST, ingress_burst)?;
        check_burst(EGRESS_BURST, egress_burst)?;
        let present = |k: &'static str| annotations.contains_key(k).then_some(k);
        let field = cni_ingress
            .map(|_| INGRESS_RATE)
            .or_else(|| cni_egress.map(|_| EGRESS_RATE))
            .or_else(|| present(ANNOTATION_INGRESS))
            .or_else(|| present(ANNOTATION_EGRESS))
            .or_else(|| present(ANNOTATION_INTERNET_EGRESS))
            .or_else(|| present(ANNOTATION_INTERNET_INGRESS));
        Ok(Requested {
            limits: Limits {
                ingress_rate: ingress.0,
                ingress_burst,
                egress_rate: egress.0,
                egress_burst,
                internet_egress_rate,
                internet_ingress_rate,
            },
            field,
        })
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

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

    fn rc(v: serde_json::Value) -> RuntimeConfig {
        RuntimeConfig::parse(&v).unwrap()
    }

    fn annotations(kv: &[(&str, &str)]) -> serde_json::Value {
        let m: BTreeMap<&str, &str> = kv.iter().copied().collect();
        json!({ crate::POD_ANNOTATIONS_KEY: m })
    }

    #[test]
    fn runtime_config_wins_and_every_annotation_is_checked() {
        let mut v = annotations(&[
            (ANNOTATION_EGRESS, "20M"),
            (ANNOTATION_INTERNET_EGRESS, "5M"),
            (ANNOTATION_INTERNET_INGRESS, "1G"),
        ]);
        v["bandwidth"] = json!({"ingressRate": 10_000_000, "ingressBurst": UNSET_BURST,
            "egressBurst": UNSET_BURST});
        let r = Limits::requested(&rc(v.clone())).unwrap();
        let l = r.limits;
        assert_eq!(l.ingress_rate, Some(10_000_000));
        assert_eq!(l.egress_rate, Some(20_000_000));
        assert_eq!(l.internet_egress_rate, Some(5_000_000));
        assert_eq!(l.internet_ingress_rate, Some(1_000_000_000));
        assert_eq!(r.field, Some(INGRESS_RATE));

        v[crate::POD_ANNOTATIONS_KEY][ANNOTATION_INGRESS] = json!("fast");
        let e = Limits::requested(&rc(v.clone())).unwrap_err();
        assert_eq!(e.field, ANNOTATION_INGRESS);

        let mut v = annotations(&[(ANNOTATION_EGRESS, "20M")]);
        v["bandwidth"] = json!({"egressRate": 0});
        let e = Limits::requested(&rc(v)).unwrap_err();
        assert_eq!(e.field, EGRESS_RATE);

        for key in [ANNOTATION_INTERNET_EGRESS, ANNOTATION_INTERNET_INGRESS] {
            let e = Limits::requested(&rc(annotations(&[(key, "500")]))).unwrap_err();
            assert_eq!(e.field, key);
            assert!(e.reason.contains("below"), "{e}");
            let r = Limits::requested(&rc(annotations(&[(key, "10M")]))).unwrap();
            assert_eq!(r.field, Some(key));
        }
    }

    #[test]
    fn containerd_unset_direction_is_not_a_zero_limit() {
        // containerd with only kubernetes.io/ingress-bandwidth set.
        let r = Limits::requested(&rc(json!({"bandwidth": {
            "IngressRate": 10_000_000u64, "IngressBurst": UNSET_BURST,
            "EgressRate": 0, "EgressBurst": 0}})))
        .unwrap();
        assert_eq!(r.limits.ingress_rate, Some(10_000_000));
        assert_eq!(r.limits.egress_rate, None);
        assert_eq!(r.field, Some(INGRESS_RATE));
        assert!(!Limits::requested(&rc(json!({}))).unwrap().any());
    }
}
