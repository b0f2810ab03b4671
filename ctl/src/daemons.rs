//! Reaching the node's daemons and the pinned datapath, with failures worded for an operator
//! (what is down and what to look at) instead of raw OS errors.

use std::{io, path::Path, time::Duration};

use aliasnet_ebpf::{Datapath, DatapathError};
use aliasnet_ipam_proto::{
    Client, ClientError, Lease, PoolStats, ReconcileStats, Request, Response,
};
use anyhow::{anyhow, Error};
use serde::Serialize;

use crate::http;

/// Why a Unix socket could not be used, in words.
fn socket_problem(path: &Path, e: &io::Error) -> String {
    let p = path.display();
    match e.kind() {
        io::ErrorKind::NotFound => format!(
            "aliasnet-ipamd is not running: its socket {p} does not exist (wrong --socket, or the daemon is down)"
        ),
        io::ErrorKind::ConnectionRefused => format!(
            "aliasnet-ipamd is not running: nothing is listening on {p} (stale socket; the daemon is down)"
        ),
        io::ErrorKind::PermissionDenied => {
            format!("permission denied opening {p}: run aliasnetctl as root")
        }
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::UnexpectedEof => format!(
            "aliasnet-ipamd at {p} closed the connection (restarting or crashing? check its log)"
        ),
        kind => format!("aliasnet-ipamd at {p} cannot be reached ({kind})"),
    }
}

/// An ipamd client error as an operator-readable error.
pub fn ipamd_error(e: ClientError) -> Error {
    match &e {
        ClientError::Unavailable { path, source } => anyhow!(socket_problem(path, source)),
        ClientError::Timeout { path, timeout } => anyhow!(
            "aliasnet-ipamd at {} did not answer within {timeout:?} (overloaded or stuck? check its log)",
            path.display()
        ),
        ClientError::Protocol { path, .. } => anyhow!(
            "aliasnet-ipamd at {} answered something this aliasnetctl does not understand ({e}); are both from the same release?",
            path.display()
        ),
        ClientError::Refused { kind, message } => {
            anyhow!("aliasnet-ipamd refused the request ({kind:?}): {message}")
        }
    }
}

/// A connection to aliasnet-ipamd.
pub struct Ipamd {
    client: Client,
}

impl Ipamd {
    pub fn connect(socket: &Path, timeout: Duration) -> Result<Self, Error> {
        Client::connect(socket, timeout)
            .map(|client| Self { client })
            .map_err(ipamd_error)
    }

    pub fn stats(&mut self) -> Result<(Vec<PoolStats>, ReconcileStats), Error> {
        match self.client.call(&Request::Stats).map_err(ipamd_error)? {
            Response::Stats { pools, reconcile } => Ok((pools, reconcile)),
            other => Err(anyhow!("aliasnet-ipamd answered Stats with {other:?}")),
        }
    }

    /// `(ready, free, reason)`.
    pub fn status(&mut self) -> Result<(bool, u64, Option<String>), Error> {
        match self
            .client
            .call(&Request::Status {
                pool: None,
                families: None,
            })
            .map_err(ipamd_error)?
        {
            Response::Status {
                ready,
                free,
                reason,
            } => Ok((ready, free, reason)),
            other => Err(anyhow!("aliasnet-ipamd answered Status with {other:?}")),
        }
    }

    /// Every lease, fetched in pages of `page` (ListPage), in address order.
    pub fn leases(&mut self, page: u32) -> Result<Vec<Lease>, Error> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let (leases, next) = self
                .client
                .list_page(after, Some(page))
                .map_err(ipamd_error)?;
            all.extend(leases);
            match next {
                Some(n) => after = Some(n),
                None => return Ok(all),
            }
        }
    }
}

/// A daemon's `/metrics` endpoint as seen from here.
#[derive(Debug, Clone, Serialize)]
pub struct Endpoint {
    pub address: String,
    pub reachable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `aliasnet_datapath_backend_info{backend}` (shaperd).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// GETs `/metrics` from `address` and picks out the build info of `component`.
pub fn probe_metrics(address: &str, component: &str, daemon: &str, timeout: Duration) -> Endpoint {
    match http::get(address, "/metrics", timeout) {
        Ok(text) => {
            let version = http::samples(&text, "aliasnet_build_info")
                .find(|s| s.label("component") == Some(component))
                .and_then(|s| s.label("version").map(str::to_owned));
            let backend = http::samples(&text, "aliasnet_datapath_backend_info")
                .next()
                .and_then(|s| s.label("backend").map(str::to_owned));
            Endpoint {
                address: address.to_owned(),
                reachable: true,
                version,
                backend,
                error: None,
            }
        }
        Err(e) => Endpoint {
            address: address.to_owned(),
            reachable: false,
            version: None,
            backend: None,
            error: Some(match e {
                http::HttpError::Refused { .. } => {
                    format!("{e} ({daemon} is down, or serves metrics elsewhere)")
                }
                e => e.to_string(),
            }),
        },
    }
}

/// Opens the pinned datapath maps with an operator-readable failure.
pub fn open_datapath(pin_root: &Path) -> Result<Datapath, Error> {
    Datapath::open(pin_root).map_err(|e| datapath_error(pin_root, &e))
}

fn datapath_error(root: &Path, e: &DatapathError) -> Error {
    let denied = matches!(e, DatapathError::Map { source, .. }
        if matches!(source, aya::maps::MapError::SyscallError(s)
            if s.io_error.kind() == io::ErrorKind::PermissionDenied));
    if denied || !nix::unistd::geteuid().is_root() {
        return anyhow!(
            "cannot read the pinned eBPF maps under {}: run aliasnetctl as root",
            root.display()
        );
    }
    match e {
        DatapathError::NotInitialised { .. } => anyhow!(
            "the eBPF datapath is not installed under {}: aliasnet-shaperd has not run on this node (or uses another --pin-root)",
            root.display()
        ),
        e => anyhow!(
            "cannot read the pinned eBPF datapath under {}: {e}",
            root.display()
        ),
    }
}
