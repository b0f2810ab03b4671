//! `aliasnet-ipamd`: the node's alias-IP address pools, served to the CNI plugin over a unix
//! socket (protocol: `aliasnet-ipam-proto`).
//!
//! * [`config`] reads `ipamd.toml`.
//! * [`state`] is the allocator (pools, leases, cooldown) in memory; [`bitmap`] and [`lease`]
//!   are its compact building blocks.
//! * [`store`] is the durable log + snapshot every acknowledged change is written to first.
//! * [`service`] handles requests and runs the group-commit writer and host link teardown.
//! * [`server`] owns the socket, framing and connection life cycle; [`daemon`] wires it all up.
//! * [`imds`] polls the metadata of `azure-imds` pools; [`reconcile`] checks leases against
//!   the host veths; [`recover`] rebuilds a lost state from the kernel; [`metrics`] is the
//!   Prometheus endpoint.

pub mod bitmap;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod imds;
pub mod lease;
pub mod metrics;
pub mod reconcile;
pub mod recover;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
pub mod teardown;

#[cfg(test)]
mod model_tests;

/// An error and its sources joined by ": ", for logs and replies.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
