//! `ipamd.toml`: parsing and validation.
//!
//! Every key is checked up front and errors name the offending field, so a bad config stops the
//! daemon at start instead of surfacing as a confusing allocation failure later.

mod addr;
mod error;
mod parse;
mod pool;
mod reserved;
#[cfg(test)]
mod tests;

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

pub use addr::{AddrError, IpRange};
pub use error::{ConfigError, ConfigProblem, DurationError};
pub use parse::parse_duration;
pub use pool::{check_metadata_url, ImdsSpec, PoolSource, PoolSpec, UrlError};
pub use reserved::reserved;

/// Default config path.
pub const DEFAULT_CONFIG: &str = "/etc/aliasnet/ipamd.toml";
/// Default durable store directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/aliasnet/ipam";
/// Default reuse cooldown: longer than conntrack's 120 s SYN_SENT timeout, so a reused address
/// never meets a stale flow of its previous owner.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(130);
/// Upper bound on the addresses one daemon manages. Per-address state is a byte plus two bits,
/// so this caps memory at a few MiB while leaving 16x headroom over a /14.
pub const MAX_TOTAL_ADDRESSES: u64 = 1 << 22;
/// Most pools one daemon serves (pool names are indexed with 16 bits in memory).
pub const MAX_POOLS: usize = 4096;
/// Longest host veth prefix: leaves at least 3 hash characters in a 15-character name.
const MAX_VETH_PREFIX: usize = 12;
/// Default address of the Prometheus endpoint.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9545";
/// Default period of the reconcile against the kernel's host veths.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(30);
/// Default grace before a lease whose host veth is gone is released: longer than any ADD
/// takes between reserving the address and creating the veth.
pub const DEFAULT_RECONCILE_GRACE: Duration = Duration::from_secs(60);
/// Default age below which GC never releases a lease: the runtime's list of valid
/// attachments may not name an ADD that is still running or just finished.
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(60);
/// Default Azure IMDS endpoint of the node's network metadata.
pub const DEFAULT_IMDS_URL: &str =
    "http://169.254.169.254/metadata/instance/network?api-version=2021-02-01";
/// Most addresses one metadata pool tracks (Azure allows 256 per NIC).
pub const MAX_METADATA_ADDRESSES: usize = 1 << 16;

/// What Allocate does when every free address of the eligible pools is still cooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnOnlyCooling {
    /// Refuse with `OnlyCooling`: reuse never shortens the cooldown.
    #[default]
    Fail,
    /// Hand out the address released longest ago.
    ReuseOldest,
}

/// A validated daemon configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub spool_dir: PathBuf,
    pub cooldown: Duration,
    pub on_only_cooling: OnOnlyCooling,
    pub host_veth_prefix: String,
    /// `tracing` filter directive; validated by the binary, which owns the subscriber.
    pub log_level: String,
    pub log_file: Option<PathBuf>,
    /// Prometheus endpoint; `None` when disabled (`metrics_address = ""`).
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Period of the reconcile against the kernel; zero = off.
    pub reconcile_interval: Duration,
    /// A lease whose host veth is gone is released once it is older than this and the veth
    /// has been seen missing for this long.
    pub reconcile_grace: Duration,
    /// GC never releases a lease younger than this.
    pub gc_grace: Duration,
    pub pools: Vec<PoolSpec>,
    /// Suspicious but legal settings (e.g. an exclusion outside its pool), for the log.
    pub warnings: Vec<String>,
}
