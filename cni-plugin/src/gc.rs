//! GC: the daemon releases every lease of this network not in the valid list and tears down
//! those attachments' host veths.

use aliasnet_cni_types::{CniError, NetConf};
use aliasnet_ipam_proto::{Attachment, Request, Response};
use anyhow::Result;

use crate::ipam;

pub fn run(conf: &NetConf) -> Result<()> {
    let Some(valid) = &conf.valid_attachments else {
        // Treating a missing list as empty would release every attachment of the network.
        return Err(CniError::config(
            "cni.dev/valid-attachments",
            "GC needs the list of valid attachments",
        )
        .into());
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
    match ipam::call(conf, &req) {
        Ok(Response::GcDone { released }) => {
            for l in &released {
                tracing::info!(key = %l.key, address = %l.address, "GC released");
            }
            Ok(())
        }
        Ok(other) => Err(ipam::unexpected("GC", &other).into()),
        Err(e) => Err(ipam::to_cni(&e).into()),
    }
}
