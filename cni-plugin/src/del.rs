//! DEL: best effort and idempotent. Needs neither the netns nor `prevResult`: the host veth
//! name and the IPAM key both derive from (network, container id, ifname). Deleting the host
//! veth removes its peer in the pod and the host /32 and /128 routes with it.
//!
//! * `asyncTeardown` (default): `Check`, then `ReleaseLease` of that lease with `teardown_link`; the
//!   daemon deletes the veth after replying, so the kernel's ~20 ms of RCU waits in veth
//!   unregistration stay off the runtime's critical path. The daemon deletes only the veth
//!   recorded for a lease it holds: when the key held nothing, the veth is deleted here.
//! * Daemon unreachable: delete the veth here and spool the release on disk; success.
//! * `asyncTeardown: false`: delete the veth here, then `Release`.

use aliasnet_cni_types::{code, CniError, DelEnv, NetConf};
use aliasnet_ipam_proto::{
    frame::FrameError, host_veth_name, AttachmentKey, ClientError, ErrorKind, LeaseRef, Request,
    Response,
};

use aliasnet_netlink::{Removed, Rtnl};

use crate::{attachment, ipam, veth::to_cni};

pub fn run(conf: &NetConf, env: &DelEnv) -> Result<(), CniError> {
    let key = AttachmentKey::new(&conf.name, &env.container_id, &env.ifname);
    let veth = host_veth_name(&conf.host_veth_prefix, &key);
    // Before the veth goes (every path below deletes it): only the pod's map entries are
    // removed here; its cls_bpf filters and qdiscs go with the veth pair.
    let t0 = std::time::Instant::now();
    attachment::detach(conf, &env.container_id, &env.ifname);
    tracing::debug!(
        datapath_detach_us = t0.elapsed().as_micros() as u64,
        "DEL timings"
    );
    if conf.async_teardown {
        match release_own(conf, &key, Some(&veth)) {
            Ok(Some(a)) => {
                tracing::info!(%key, %a, "released");
                Ok(())
            }
            Ok(None) => {
                tracing::info!(%key, "nothing held");
                // The daemon deletes only the veth of a lease it holds; without one the veth
                // (if any) is ours to remove.
                if let Err(e) = delete_veth(&veth) {
                    tracing::warn!("{e}");
                }
                Ok(())
            }
            Err(e) if ipam::is_down(&e) => daemon_down(conf, &key, &veth, &e),
            Err(e) => {
                // The daemon is up but refused: still take the pod off the network, then
                // report so the runtime retries the release.
                let _ = delete_veth(&veth);
                Err(ipam::to_cni(&e))
            }
        }
    } else {
        delete_veth(&veth)?;
        match release_own(conf, &key, None) {
            Ok(_) => Ok(()),
            Err(e) if ipam::is_down(&e) => spool(conf, &key, None, &e),
            Err(e) => Err(ipam::to_cni(&e)),
        }
    }
}

/// Release the lease `key` holds now, naming it by its identity (Check, then ReleaseLease on
/// the same connection): if this request reaches the daemon late (the DEL timed out, and a
/// later ADD of the same key got a new lease), it releases and deletes nothing. `None` when
/// the key held nothing.
fn release_own(
    conf: &NetConf,
    key: &AttachmentKey,
    teardown: Option<&str>,
) -> Result<Option<std::net::IpAddr>, ClientError> {
    let unexpected = |what: &str, r: &Response| ClientError::Protocol {
        path: conf.ipam_socket.clone(),
        source: FrameError::Unexpected(format!("{what} answered with {r:?}")),
    };
    let mut c = ipam::connect(conf)?;
    let lease = match c.call(&Request::Check { key: key.clone() })? {
        Response::Lease { lease, .. } => lease,
        other => return Err(unexpected("CHECK", &other)),
    };
    let Some(lease) = lease else {
        return Ok(None);
    };
    let teardown_link = teardown.map(str::to_owned);
    let req = Request::ReleaseLease {
        key: key.clone(),
        teardown_link: teardown_link.clone(),
        lease: LeaseRef::from(&lease),
    };
    let resp = match c.call(&req) {
        Err(ClientError::Refused {
            kind: ErrorKind::BadRequest,
            message,
        }) if message.contains("release_lease") => {
            // A daemon from before ReleaseLease (an upgrade installs the plugin first).
            c.call(&Request::Release {
                key: key.clone(),
                teardown_link,
            })?
        }
        r => r?,
    };
    match resp {
        Response::Released { address } => Ok(address),
        other => Err(unexpected("RELEASE", &other)),
    }
}

/// Tear down the host side here and leave a durable release record.
fn daemon_down(
    conf: &NetConf,
    key: &AttachmentKey,
    veth: &str,
    why: &ClientError,
) -> Result<(), CniError> {
    // If we cannot delete it, the daemon retries from the spool entry.
    let leftover = match delete_veth(veth) {
        Ok(_) => None,
        Err(e) => {
            tracing::warn!("{e}; leaving it to aliasnet-ipamd");
            Some(veth.to_owned())
        }
    };
    spool(conf, key, leftover, why)
}

fn spool(
    conf: &NetConf,
    key: &AttachmentKey,
    veth: Option<String>,
    why: &ClientError,
) -> Result<(), CniError> {
    match ipam::spool_release(conf, key, veth) {
        Ok(path) => {
            tracing::warn!(
                %key,
                spool = %path.display(),
                "aliasnet-ipamd unreachable ({}); release spooled",
                ipam::error_chain(why)
            );
            Ok(())
        }
        Err(e) => Err(CniError::new(
            code::IO,
            format!(
                "aliasnet-ipamd unreachable ({}) and the release could not be spooled: {}",
                ipam::error_chain(why),
                ipam::error_chain(&e)
            ),
        )),
    }
}

/// Delete the host veth synchronously (only a veth: a link of another kind under our name is
/// not ours); returns whether it existed.
fn delete_veth(name: &str) -> Result<bool, CniError> {
    let op = format!("host: delete {name}");
    let mut host = Rtnl::new().map_err(|e| to_cni(e.with_op(&op)))?;
    match host.delete_veth(name) {
        Ok(Removed::Deleted) => Ok(true),
        Ok(Removed::NotFound) => Ok(false),
        Ok(Removed::NotVeth(kind)) => Err(CniError::new(
            code::NETLINK,
            format!("{op}: it is a {kind}, not a veth of aliasnet; left alone"),
        )),
        Err(e) => Err(to_cni(e.with_op(op))),
    }
}
