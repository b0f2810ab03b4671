//! STATUS: success when an ADD would succeed now (an address is free and, with
//! `datapath: required`, the eBPF datapath is pinned); code 50 otherwise, naming the reason.

use aliasnet_cni_types::{code, CniError, NetConf};
use aliasnet_ipam_proto::{ClientError, Request, Response};

use crate::{datapath, ipam};

pub fn run(conf: &NetConf) -> Result<(), CniError> {
    let req = Request::Status {
        pool: conf.pool.clone(),
    };
    let unavailable = |msg: String| CniError::new(code::NOT_AVAILABLE, msg);
    // Local and cheap, so first.
    datapath::status(conf).map_err(unavailable)?;
    match ipam::call(conf, &req) {
        Ok(Response::Status { ready: true, .. }) => Ok(()),
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
