//! GC: the daemon releases every lease of this network not in the valid list and tears down
//! those attachments' host veths; then the eBPF datapath drops the released attachments and
//! any whose host veth is gone (best effort; failures are reported with code 110).

use aliasnet_cni_types::{code, CniError, NetConf};
use aliasnet_ipam_proto::{Attachment, Request, Response};

use crate::{attachment, ipam};

pub fn run(conf: &NetConf) -> Result<(), CniError> {
    let Some(valid) = &conf.valid_attachments else {
        // Treating a missing list as empty would release every attachment of the network.
        return Err(CniError::config(
            "cni.dev/valid-attachments",
            "GC needs the list of valid attachments",
        ));
    };
    let req = Request::Gc {
        network: conf.name.clone(),
        valid: valid
            .iter()
            .map(|a| Attachment {
                container_id: a.container_id.clone(),
                ifname: a.ifname.clone(),
            })
            .collect(),
    };
    let (ipam_result, released) = match ipam::call(conf, &req) {
        Ok(Response::GcDone { released }) => {
            for l in &released {
                tracing::info!(key = %l.key, address = %l.address, "GC released");
            }
            // A dual-stack attachment is released as two leases; the datapath has one entry.
            let mut keys: Vec<_> = released
                .into_iter()
                .map(|l| (l.key.container_id, l.key.ifname))
                .collect();
            keys.sort();
            keys.dedup();
            (Ok(()), keys)
        }
        Ok(other) => (Err(ipam::unexpected("GC", &other)), Vec::new()),
        Err(e) => (Err(ipam::to_cni(&e)), Vec::new()),
    };
    // Best effort whatever the IPAM side did; failures are reported, not swallowed.
    let dp_errors = attachment::gc(conf, &released);
    match (ipam_result, dp_errors.is_empty()) {
        (Ok(()), true) => Ok(()),
        (Ok(()), false) => Err(CniError::new(code::DATAPATH, dp_errors.join("; "))),
        (Err(e), true) => Err(e),
        (Err(e), false) => Err(CniError {
            msg: format!("{}; {}", e.msg, dp_errors.join("; ")),
            ..e
        }),
    }
}
