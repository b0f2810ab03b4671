//! A pod's effective limits: its own (the runtime's bandwidth limits, its internet
//! annotations) with the node policy's for its namespace, the policy a ceiling.

use crate::{
    abi::{self, Direction},
    datapath::Datapath,
    error::DatapathError,
    limits::Limits,
    shape::Shape,
};

impl Datapath {
    /// The limits and bursts an attach of a pod of `namespace` asking for `limits`, on a veth
    /// whose largest frame is `frame`, records under the applied policy (what CHECK compares
    /// a pod's record with).
    pub fn effective_limits(
        &self,
        namespace: &str,
        limits: &Limits,
        frame: u64,
    ) -> Result<(abi::Rates, [u64; abi::NR_DIRS]), DatapathError> {
        let mut meta = abi::PodMeta {
            frame: u32::try_from(frame).unwrap_or(u32::MAX),
            ..Default::default()
        };
        record_own(&mut meta, limits);
        apply(&mut meta, &self.ns_policy(namespace)?.pod);
        Ok((meta.limits, meta.burst))
    }
}

/// Records what the pod asked for in `meta` (`own_*`), in the units the maps keep.
pub(crate) fn record_own(meta: &mut abi::PodMeta, lim: &Limits) {
    let e = abi::DIR_EGRESS;
    let i = abi::DIR_INGRESS;
    meta.own_total[e] = lim.egress_rate.unwrap_or(0);
    meta.own_total[i] = lim.ingress_rate.unwrap_or(0);
    meta.own_burst[e] = lim.egress_burst.unwrap_or(0);
    meta.own_burst[i] = lim.ingress_burst.unwrap_or(0);
    meta.own_internet[e] = lim.internet_egress_rate.unwrap_or(0);
    meta.own_internet[i] = lim.internet_ingress_rate.unwrap_or(0);
}

fn tighter(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

/// Sets `meta.limits` and `meta.burst` from what the pod asked for (`own_*`) and the
/// policy's pod-level limits for its namespace (`policy`):
/// - the totals are the pod's own (the kubelet's bandwidth limits; policy has none);
/// - the internet limit of each direction is the lower of the policy's and the pod's
///   annotation: an annotation may lower the pod's limit, never raise it above the policy;
///   with no policy limit the annotation alone applies;
/// - a named class's limit is the policy's;
/// - no limit is above a less specific one of the pod's (named class <= internet <= total),
///   as the classes nest on the pod's devices.
pub(crate) fn apply(meta: &mut abi::PodMeta, policy: &abi::Rates) {
    let frame = crate::htb::meta_frame(meta);
    for dir in Direction::ALL {
        let d = dir.index();
        let total = Some(meta.own_total[d]).filter(|r| *r != 0);
        let internet = tighter(
            policy.get(dir, abi::KIND_INTERNET),
            Some(meta.own_internet[d]).filter(|r| *r != 0),
        );
        let internet = internet.map(|r| total.map_or(r, |t| r.min(t)));
        meta.limits.set(dir, abi::KIND_TOTAL, total);
        meta.limits.set(dir, abi::KIND_INTERNET, internet);
        for k in abi::KIND_NAMED..abi::NR_KINDS {
            let named = policy
                .get(dir, k)
                .map(|r| tighter(Some(r), tighter(internet, total)).unwrap_or(r));
            meta.limits.set(dir, k, named);
        }
        meta.burst[d] = total.map_or(0, |t| {
            Shape::new(t, Some(meta.own_burst[d]).filter(|b| *b != 0), frame).burst_bytes
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IN: Direction = Direction::Ingress;
    const OUT: Direction = Direction::Egress;

    fn policy(rates: &[(Direction, usize, u64)]) -> abi::Rates {
        let mut p = abi::Rates::default();
        for &(d, k, r) in rates {
            p.set(d, k, Some(r));
        }
        p
    }

    fn effective(own: Limits, p: &abi::Rates) -> abi::PodMeta {
        let mut m = abi::PodMeta {
            frame: 1514,
            ..Default::default()
        };
        record_own(&mut m, &own);
        apply(&mut m, p);
        m
    }

    #[test]
    fn policy_is_a_ceiling_the_annotation_cannot_lift() {
        let p = policy(&[
            (OUT, abi::KIND_INTERNET, 20_000_000),
            (IN, abi::KIND_INTERNET, 20_000_000),
        ]);
        // 1P asked for, 20M given.
        let m = effective(
            Limits {
                internet_egress_rate: Some(1_000_000_000_000_000),
                internet_ingress_rate: Some(1_000_000_000_000_000),
                ..Default::default()
            },
            &p,
        );
        assert_eq!(m.limit(OUT, abi::KIND_INTERNET), Some(20_000_000));
        assert_eq!(m.limit(IN, abi::KIND_INTERNET), Some(20_000_000));
        // Lower is fine.
        let m = effective(
            Limits {
                internet_ingress_rate: Some(5_000_000),
                ..Default::default()
            },
            &p,
        );
        assert_eq!(m.limit(IN, abi::KIND_INTERNET), Some(5_000_000));
        assert_eq!(m.limit(OUT, abi::KIND_INTERNET), Some(20_000_000));
        // Without a policy limit the annotation applies as it is.
        let m = effective(
            Limits {
                internet_egress_rate: Some(1_000_000_000_000_000),
                ..Default::default()
            },
            &abi::Rates::default(),
        );
        assert_eq!(
            m.limit(OUT, abi::KIND_INTERNET),
            Some(1_000_000_000_000_000)
        );
        assert_eq!(m.limit(IN, abi::KIND_INTERNET), None);
    }

    #[test]
    fn limits_nest_within_less_specific_ones() {
        let p = policy(&[
            (IN, abi::KIND_NAMED, 500_000_000),
            (IN, abi::KIND_NAMED + 3, 50_000_000),
        ]);
        let m = effective(
            Limits {
                ingress_rate: Some(100_000_000),
                ingress_burst: Some(u64::from(u32::MAX)),
                internet_ingress_rate: Some(200_000_000),
                ..Default::default()
            },
            &p,
        );
        assert_eq!(m.limit(IN, abi::KIND_TOTAL), Some(100_000_000));
        assert_eq!(m.limit(IN, abi::KIND_INTERNET), Some(100_000_000));
        assert_eq!(m.limit(IN, abi::KIND_NAMED), Some(100_000_000));
        assert_eq!(m.limit(IN, abi::KIND_NAMED + 3), Some(50_000_000));
        assert_eq!(m.limit(OUT, abi::KIND_NAMED), None);
        // containerd's unset burst is the default one: 10 ms of the rate.
        assert_eq!(m.burst[abi::DIR_INGRESS], 125_000);
        assert_eq!(m.burst[abi::DIR_EGRESS], 0);
    }
}
