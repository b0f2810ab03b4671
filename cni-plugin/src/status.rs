//! STATUS: success when an ADD would succeed now (an address is free, of every family
//! `ipFamilies` lists, and, with `datapath: required`, the eBPF datapath is pinned); code 50
//! otherwise, naming the reason.

use aliasnet_cni_types::{code, CniError, IpFamily, NetConf};
use aliasnet_ipam_proto::{ClientError, PoolStats, Request, Response};

use crate::{attachment, ipam};

pub fn run(conf: &NetConf) -> Result<(), CniError> {
    let req = Request::Status {
        pool: conf.pool.clone(),
        families: conf
            .ip_families
            .as_ref()
            .map(|l| l.iter().map(|f| ipam::family(*f)).collect()),
    };
    let unavailable = |msg: String| CniError::new(code::NOT_AVAILABLE, msg);
    // Local and cheap, so first.
    attachment::status(conf).map_err(unavailable)?;
    match ipam::call(conf, &req) {
        // The daemon answers for the listed families (for every family it serves when it
        // predates `families`, which is stricter): ready is final. Not ready with ipFamilies
        // is checked against the pools, so an older daemon's answer about a family not asked
        // for does not count.
        Ok(Response::Status { ready: true, .. }) => Ok(()),
        Ok(Response::Status { .. }) if conf.ip_families.is_some() => {
            let families = conf.ip_families.as_deref().unwrap_or_default();
            families_ready(conf, families).map_err(unavailable)
        }
        Ok(Response::Status { free, reason, .. }) => Err(unavailable(format!(
            "aliasnet-ipamd cannot allocate: {} ({free} free)",
            reason.unwrap_or_else(|| "no free address".into())
        ))),
        Ok(other) => Err(ipam::unexpected("STATUS", &other)),
        Err(e @ (ClientError::Unavailable { .. } | ClientError::Timeout { .. })) => {
            Err(unavailable(format!(
                "aliasnet-ipamd unreachable: {}",
                ipam::error_chain(&e)
            )))
        }
        Err(e) => Err(unavailable(format!(
            "aliasnet-ipamd not ready: {}",
            ipam::error_chain(&e)
        ))),
    }
}

/// With `ipFamilies`, an ADD needs an address of each listed family (all or nothing); a
/// daemon that predates STATUS `families` answers for every family it serves, so when it says
/// not ready the pools' statistics decide. An
/// address whose veth teardown is pending counts, as the daemon counts it: it is free soon.
fn families_ready(conf: &NetConf, families: &[IpFamily]) -> Result<(), String> {
    let pools = match ipam::call(conf, &Request::Stats) {
        Ok(Response::Stats { pools, .. }) => pools,
        Ok(other) => return Err(ipam::unexpected("STATS", &other).msg),
        Err(e) => {
            return Err(format!(
                "aliasnet-ipamd not ready: {}",
                ipam::error_chain(&e)
            ))
        }
    };
    let missing = missing_families(&pools, conf.pool.as_deref(), families);
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "aliasnet-ipamd cannot allocate: no free {} address{} (ipFamilies)",
        missing
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join(" or "),
        if conf.pool.is_some() {
            " in the eligible pools"
        } else {
            ""
        }
    ))
}

/// The families of `want` no eligible pool has a free address of. A named `pool` restricts
/// its own family only (the other family comes from any pool of it, as in an Allocate).
fn missing_families(pools: &[PoolStats], pool: Option<&str>, want: &[IpFamily]) -> Vec<IpFamily> {
    let named = pool.and_then(|n| pools.iter().find(|p| p.name == n));
    want.iter()
        .copied()
        .filter(|&f| {
            let fam = ipam::family(f);
            let eligible = |p: &PoolStats| match named {
                Some(n) if n.family == fam => p.name == n.name,
                _ => true,
            };
            !pools
                .iter()
                .any(|p| p.family == fam && p.free + p.pending_teardown > 0 && eligible(p))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use aliasnet_ipam_proto::Family;

    use super::*;

    fn pool(name: &str, family: Family, free: u64) -> PoolStats {
        serde_json::from_value(serde_json::json!({
            "name": name, "family": family.as_str(), "source": "static",
            "total": 10, "allocated": 10 - free, "cooling": 0, "free": free
        }))
        .unwrap()
    }

    #[test]
    fn every_listed_family_needs_a_free_address() {
        let both = [IpFamily::Ipv4, IpFamily::Ipv6];
        let pools = [pool("v4", Family::Ipv4, 3), pool("v6", Family::Ipv6, 0)];
        assert_eq!(missing_families(&pools, None, &both), [IpFamily::Ipv6]);
        assert!(missing_families(&pools, None, &[IpFamily::Ipv4]).is_empty());
        let pools = [pool("v4", Family::Ipv4, 3), pool("v6", Family::Ipv6, 1)];
        assert!(missing_families(&pools, None, &both).is_empty());
        // A named pool restricts its own family only.
        let pools = [
            pool("v4", Family::Ipv4, 0),
            pool("v4b", Family::Ipv4, 5),
            pool("v6", Family::Ipv6, 1),
        ];
        assert_eq!(
            missing_families(&pools, Some("v4"), &both),
            [IpFamily::Ipv4]
        );
        assert!(missing_families(&pools, Some("v4b"), &both).is_empty());
        assert!(missing_families(&pools, Some("v6"), &both).is_empty());
        assert_eq!(missing_families(&[], None, &both), both);
        // Free soon: the daemon is tearing down a released attachment's veth.
        let mut draining = pool("v6", Family::Ipv6, 0);
        draining.pending_teardown = 1;
        assert!(missing_families(&[draining], None, &[IpFamily::Ipv6]).is_empty());
    }
}
