//! What can be wrong with `ipamd.toml`: every error names the file, and a bad value its key.

use std::{net::IpAddr, path::PathBuf};

use super::{
    addr::AddrError, pool::UrlError, PoolSource, MAX_POOLS, MAX_TOTAL_ADDRESSES, MAX_VETH_PREFIX,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or a key that does not exist or has the wrong type (`message` is the TOML
    /// parser's, which names the line).
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config {path}: `{field}`: {problem}")]
    Invalid {
        path: PathBuf,
        /// The key, such as `cooldown` or `pool 'nic'.url`.
        field: String,
        /// Boxed: the problems carry the values they refuse, and a config error is rare.
        problem: Box<ConfigProblem>,
    },
}

/// What is wrong with the value of a key (the key is [`ConfigError::Invalid`]'s `field`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    #[error(transparent)]
    Address(#[from] AddrError),
    #[error(transparent)]
    Duration(#[from] DurationError),
    #[error(transparent)]
    MetadataUrl(#[from] UrlError),
    #[error("must not be empty")]
    Empty,
    #[error("must be an absolute path, got {path:?}")]
    NotAbsolute { path: String },
    #[error("must differ from state_dir (the plugin writes into it)")]
    SpoolIsStateDir,
    #[error("must be 1 to {MAX_VETH_PREFIX} characters, got {prefix:?}")]
    VethPrefixLength { prefix: String },
    #[error("may only contain ASCII letters, digits, '-' and '_', got {prefix:?}")]
    VethPrefixCharacters { prefix: String },
    #[error(
        "{address:?} is not an IP:port such as \"127.0.0.1:9545\" (\"\" disables the endpoint)"
    )]
    MetricsAddress { address: String },
    #[error("must be at least 1s (or \"0s\": off)")]
    ReconcileInterval,
    #[error(
        "must be at least 5s: an ADD in progress has reserved its address before its veth exists"
    )]
    ReconcileGrace,
    #[error("no [[pool]] defined; the daemon needs at least one address pool")]
    NoPools,
    #[error("{count} pools defined; at most {MAX_POOLS} are supported")]
    TooManyPools { count: usize },
    #[error("duplicate pool name '{name}' (also pool[{other}])")]
    DuplicatePool { name: String, other: usize },
    #[error(
        "pools '{first}' and '{second}' overlap (both contain {shared}); an address may belong \
         to one pool only"
    )]
    PoolsOverlap {
        first: String,
        second: String,
        shared: IpAddr,
    },
    #[error("pools total {total} addresses; one daemon manages at most {MAX_TOTAL_ADDRESSES}")]
    TooManyAddresses { total: u64 },
    #[error("{name:?} must be 1 to 64 printable ASCII characters without spaces")]
    PoolName { name: String },
    #[error("unknown source {given:?}; expected \"static\", \"prefixes\" or \"azure-imds\"")]
    UnknownSource { given: String },
    #[error("not used by source \"{pool_source}\" (it takes: {takes}, exclude)")]
    NotForSource {
        pool_source: PoolSource,
        takes: String,
    },
    #[error("unknown family {given:?}; expected \"ipv4\" or \"ipv6\"")]
    UnknownFamily { given: String },
    /// `v4` and `v6` are the first entry of each family, as `cidrs[0] "10.0.0.0/30"`.
    #[error(
        "mixes IPv4 ({v4}) and IPv6 ({v6}) addresses; a pool serves one family: put each \
         family in its own pool"
    )]
    MixedFamilies { v4: String, v6: String },
    /// `first` and `second` are entries, as `cidrs[0] "10.0.0.0/24"`.
    #[error("{first} overlaps {second} (first shared address {shared})")]
    Overlap {
        first: String,
        second: String,
        shared: IpAddr,
    },
    #[error("the pool lists no blocks (set prefixes = [\"10.64.0.0/28\", ...])")]
    NoBlocks,
    #[error("the pool lists no addresses (set cidrs, ranges or ips)")]
    NoAddresses,
    #[error("the exclusions remove every address; the pool would be empty")]
    AllExcluded,
    /// `reserved` names each reserved part and why ("169.254.1.1 is link-local (...)").
    #[error("no address is left that a pod may hold ({reserved}); the pool would be empty")]
    OnlyReserved { reserved: String },
    #[error("the pool has {size} addresses; one daemon manages at most {MAX_TOTAL_ADDRESSES}")]
    PoolTooLarge { size: u64 },
    #[error("must be at least 100ms (IMDS rate-limits)")]
    RefreshTooFast,
    #[error("must be at least refresh_min ({refresh_min_ms}ms)")]
    RefreshMaxBelowMin { refresh_min_ms: u128 },
    #[error("must be between 1ms and 60s")]
    Timeout,
}

/// A duration that is not a number with a unit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: expected a number with a unit (ms, s, m, h), e.g. \"130s\", \
     \"500ms\", \"2m\", \"1m30s\""
)]
pub struct DurationError {
    pub input: String,
}
