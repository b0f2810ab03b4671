//! Talking to aliasnet-ipamd, and mapping its failures to CNI codes.

use aliasnet_cni_types::{code, CniError, IpFamily, NetConf};
use aliasnet_ipam_proto::{
    spool, AttachmentKey, Client, ClientError, ErrorKind, Family, Request, Response,
};

/// The protocol's name for a family of `ipFamilies`.
pub fn family(f: IpFamily) -> Family {
    match f {
        IpFamily::Ipv4 => Family::Ipv4,
        IpFamily::Ipv6 => Family::Ipv6,
    }
}

pub fn connect(conf: &NetConf) -> Result<Client, ClientError> {
    Client::connect(&conf.ipam_socket, conf.timeout)
}

/// Connect and make one call.
pub fn call(conf: &NetConf, req: &Request) -> Result<Response, ClientError> {
    connect(conf)?.call(req)
}

/// The CNI error for a failed daemon call.
pub fn to_cni(e: &ClientError) -> CniError {
    // The operator named a pool the node does not have: a config error, not a daemon fault.
    if let ClientError::Refused {
        kind: ErrorKind::UnknownPool,
        message,
    } = e
    {
        return CniError::config("pool", message);
    }
    let c = match e {
        ClientError::Unavailable { .. } | ClientError::Timeout { .. } => code::TRY_AGAIN_LATER,
        ClientError::Refused { kind, .. } => match kind {
            ErrorKind::PoolExhausted => code::POOL_EXHAUSTED,
            ErrorKind::OnlyCooling => code::ONLY_COOLING,
            ErrorKind::UnknownPool => code::INVALID_CONFIG,
            ErrorKind::Unavailable => code::TRY_AGAIN_LATER,
            ErrorKind::BadRequest
            | ErrorKind::UnsupportedVersion
            | ErrorKind::Storage
            | ErrorKind::Internal => code::IPAM_ERROR,
        },
        ClientError::Protocol { .. } => code::IPAM_ERROR,
    };
    let mut msg = error_chain(e);
    if e.is_unavailable() {
        // What the operator reads in `kubectl describe pod`: say where to look.
        msg.push_str(
            "; is aliasnet-ipamd running on this node (the aliasnet-node DaemonSet's ipamd \
             container) and is ipamSocket in the network config its socket?",
        );
    }
    CniError::new(c, msg)
}

/// True when the daemon may have acted on the request even though we got no answer.
pub fn outcome_unknown(e: &ClientError) -> bool {
    !matches!(e, ClientError::Refused { .. })
}

/// True when the daemon should be treated as down (DEL spools instead of failing).
pub fn is_down(e: &ClientError) -> bool {
    e.is_unavailable()
        || matches!(e, ClientError::Protocol { .. })
        || matches!(
            e,
            ClientError::Refused {
                kind: ErrorKind::Unavailable | ErrorKind::UnsupportedVersion,
                ..
            }
        )
}

/// `e` with its sources, on one line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        // Some errors already print their source; do not say it twice.
        let t = src.to_string();
        if !s.ends_with(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = src.source();
    }
    s
}

pub fn unexpected(req: &str, resp: &Response) -> CniError {
    CniError::new(
        code::IPAM_ERROR,
        format!("aliasnet-ipamd answered {req} with an unexpected reply: {resp:?}"),
    )
}

/// Durably record that `key` must be released, for the daemon to apply when it starts.
pub fn spool_release(
    conf: &NetConf,
    key: &AttachmentKey,
    host_veth: Option<String>,
) -> Result<std::path::PathBuf, spool::SpoolError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    // The boot-time clock lets the daemon order this DEL against later ADDs even if the wall
    // clock is stepped before it reads the entry.
    let boot = spool::boot_clock();
    spool::write(
        &conf.spool_dir,
        &spool::SpoolEntry {
            key: key.clone(),
            host_veth,
            released_at_ms: now,
            boot_ms: boot.as_ref().map(|b| b.1),
            boot_id: boot.map(|b| b.0),
        },
    )
}
