//! DEL: best effort and idempotent. Needs neither the netns nor `prevResult`: the host veth
//! name and the IPAM key both derive from (network, container id, ifname). Deleting the host
//! veth removes its peer in the pod and the host /32 route with it.
//!
//! * `asyncTeardown` (default): one daemon round trip, `Release` with `teardown_link`; the
//!   daemon deletes the veth after replying, so the kernel's ~20 ms of RCU waits in veth
//!   unregistration stay off the runtime's critical path. The daemon deletes only the veth
//!   recorded for a lease it holds: when the key held nothing, the veth is deleted here.
//! * Daemon unreachable: delete the veth here and spool the release on disk; success.
//! * `asyncTeardown: false`: delete the veth here, then `Release`.

use aliasnet_cni_types::{code, CniError, DelEnv, NetConf};
use aliasnet_ipam_proto::{host_veth_name, AttachmentKey, ClientError, Request, Response};
use anyhow::Result;

use crate::{
    datapath, ipam,
    nl::{nl_err, Nl},
};

pub fn run(conf: &NetConf, env: &DelEnv) -> Result<()> {
    let key = AttachmentKey::new(&conf.name, &env.container_id, &env.ifname);
    let veth = host_veth_name(&conf.host_veth_prefix, &key);
    // Before the veth goes (every path below deletes it): only the pod's map entries are
    // removed here; its cls_bpf filters and qdiscs go with the veth pair.
    let t0 = std::time::Instant::now();
    datapath::detach(conf, &env.container_id, &env.ifname);
    tracing::debug!(
        datapath_detach_us = t0.elapsed().as_micros() as u64,
        "DEL timings"
    );
    if conf.async_teardown {
        let req = Request::Release {
            key: key.clone(),
            teardown_link: Some(veth.clone()),
        };
        match ipam::call(conf, &req) {
            Ok(resp) => {
                if released(&key, resp)?.is_none() {
                    // The daemon deletes only the veth of a lease it holds; without one the
                    // veth (if any) is ours to remove.
                    if let Err(e) = delete_veth(&veth) {
                        tracing::warn!("{e}");
                    }
                }
                Ok(())
            }
            Err(e) if ipam::is_down(&e) => daemon_down(conf, &key, &veth, &e),
            Err(e) => {
                // The daemon is up but refused: still take the pod off the network, then
                // report so the runtime retries the release.
                let _ = delete_veth(&veth);
                Err(ipam::to_cni(&e).into())
            }
        }
    } else {
        delete_veth(&veth)?;
        let req = Request::Release {
            key: key.clone(),
            teardown_link: None,
        };
        match ipam::call(conf, &req) {
            Ok(resp) => released(&key, resp).map(|_| ()),
            Err(e) if ipam::is_down(&e) => spool(conf, &key, None, &e),
            Err(e) => Err(ipam::to_cni(&e).into()),
        }
    }
}

/// The address the daemon released, if the key held one.
fn released(key: &AttachmentKey, resp: Response) -> Result<Option<std::net::Ipv4Addr>> {
    match resp {
        Response::Released { address } => {
            match address {
                Some(a) => tracing::info!(%key, %a, "released"),
                None => tracing::info!(%key, "nothing held"),
            }
            Ok(address)
        }
        other => Err(ipam::unexpected("RELEASE", &other).into()),
    }
}

/// Tear down the host side here and leave a durable release record.
fn daemon_down(conf: &NetConf, key: &AttachmentKey, veth: &str, why: &ClientError) -> Result<()> {
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
) -> Result<()> {
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
        )
        .into()),
    }
}

/// Delete the host veth synchronously; returns whether it existed.
fn delete_veth(name: &str) -> Result<bool, CniError> {
    let rt = crate::runtime().map_err(|e| CniError::new(code::INTERNAL, format!("{e:#}")))?;
    rt.block_on(async {
        let host = Nl::connect()?;
        host.del_link_by_name(name)
            .await
            .map_err(|e| nl_err(format!("host: delete {name}"), e))
    })
}
