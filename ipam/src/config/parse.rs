//! Reading `ipamd.toml`: the raw TOML shape, the daemon-wide keys and durations.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use super::{
    pool::{build_pool, check_pool_overlaps},
    *,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_socket")]
    socket: PathBuf,
    #[serde(default = "default_state_dir")]
    state_dir: PathBuf,
    #[serde(default = "default_spool_dir")]
    spool_dir: PathBuf,
    #[serde(default)]
    cooldown: Option<String>,
    #[serde(default)]
    on_only_cooling: OnOnlyCooling,
    #[serde(default = "default_prefix")]
    host_veth_prefix: String,
    #[serde(default = "default_log_level")]
    log_level: String,
    #[serde(default)]
    log_file: Option<PathBuf>,
    #[serde(default = "default_metrics_address")]
    metrics_address: String,
    #[serde(default)]
    reconcile_interval: Option<String>,
    #[serde(default)]
    reconcile_grace: Option<String>,
    #[serde(default)]
    gc_grace: Option<String>,
    #[serde(default, rename = "pool")]
    pools: Vec<RawPool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub(super) name: String,
    pub(super) source: String,
    #[serde(default)]
    pub(super) cidrs: Vec<String>,
    #[serde(default)]
    pub(super) ranges: Vec<String>,
    #[serde(default)]
    pub(super) ips: Vec<String>,
    #[serde(default)]
    pub(super) exclude: Vec<String>,
    #[serde(default)]
    pub(super) prefixes: Vec<String>,
    #[serde(default)]
    pub(super) url: Option<String>,
    #[serde(default)]
    pub(super) refresh_min: Option<String>,
    #[serde(default)]
    pub(super) refresh_max: Option<String>,
    #[serde(default)]
    pub(super) timeout: Option<String>,
    #[serde(default)]
    pub(super) family: Option<String>,
}

fn default_socket() -> PathBuf {
    aliasnet_ipam_proto::DEFAULT_SOCKET.into()
}
fn default_state_dir() -> PathBuf {
    DEFAULT_STATE_DIR.into()
}
fn default_spool_dir() -> PathBuf {
    aliasnet_ipam_proto::DEFAULT_SPOOL_DIR.into()
}
fn default_prefix() -> String {
    aliasnet_ipam_proto::DEFAULT_HOST_VETH_PREFIX.into()
}
fn default_log_level() -> String {
    "info".into()
}
fn default_metrics_address() -> String {
    DEFAULT_METRICS_ADDRESS.into()
}

impl Config {
    /// Read and validate the config at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Validate config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let invalid = |field: &str, problem: ConfigProblem| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: field.to_owned(),
            problem: Box::new(problem),
        };

        let cooldown = match &raw.cooldown {
            None => DEFAULT_COOLDOWN,
            Some(s) => parse_duration(s).map_err(|e| invalid("cooldown", e.into()))?,
        };
        for (field, p) in [
            ("socket", &raw.socket),
            ("state_dir", &raw.state_dir),
            ("spool_dir", &raw.spool_dir),
        ] {
            if !p.is_absolute() {
                return Err(invalid(
                    field,
                    ConfigProblem::NotAbsolute {
                        path: p.display().to_string(),
                    },
                ));
            }
        }
        if raw.state_dir == raw.spool_dir {
            return Err(invalid("spool_dir", ConfigProblem::SpoolIsStateDir));
        }
        check_veth_prefix(&raw.host_veth_prefix).map_err(|p| invalid("host_veth_prefix", p))?;
        if raw.log_level.trim().is_empty() {
            return Err(invalid("log_level", ConfigProblem::Empty));
        }
        let metrics_address = match raw.metrics_address.trim() {
            "" => None,
            a => Some(a.parse::<std::net::SocketAddr>().map_err(|_| {
                invalid(
                    "metrics_address",
                    ConfigProblem::MetricsAddress {
                        address: a.to_owned(),
                    },
                )
            })?),
        };
        let dur = |field: &str, v: &Option<String>, default: Duration| match v {
            None => Ok(default),
            Some(s) => parse_duration(s).map_err(|e| invalid(field, e.into())),
        };
        let reconcile_interval = dur(
            "reconcile_interval",
            &raw.reconcile_interval,
            DEFAULT_RECONCILE_INTERVAL,
        )?;
        if !reconcile_interval.is_zero() && reconcile_interval < Duration::from_secs(1) {
            return Err(invalid(
                "reconcile_interval",
                ConfigProblem::ReconcileInterval,
            ));
        }
        let reconcile_grace = dur(
            "reconcile_grace",
            &raw.reconcile_grace,
            DEFAULT_RECONCILE_GRACE,
        )?;
        if reconcile_grace < Duration::from_secs(5) {
            return Err(invalid("reconcile_grace", ConfigProblem::ReconcileGrace));
        }
        let gc_grace = dur("gc_grace", &raw.gc_grace, DEFAULT_GC_GRACE)?;

        if raw.pools.is_empty() {
            return Err(invalid("pool", ConfigProblem::NoPools));
        }
        if raw.pools.len() > MAX_POOLS {
            return Err(invalid(
                "pool",
                ConfigProblem::TooManyPools {
                    count: raw.pools.len(),
                },
            ));
        }
        let mut warnings = Vec::new();
        let mut pools: Vec<PoolSpec> = Vec::with_capacity(raw.pools.len());
        for (i, rp) in raw.pools.iter().enumerate() {
            let spec = build_pool(i, rp, &mut warnings).map_err(|(f, p)| invalid(&f, p))?;
            if let Some(other) = pools.iter().position(|p| p.name == spec.name) {
                return Err(invalid(
                    &format!("pool[{i}].name"),
                    ConfigProblem::DuplicatePool {
                        name: spec.name,
                        other,
                    },
                ));
            }
            pools.push(spec);
        }
        check_pool_overlaps(&pools).map_err(|p| invalid("pool", p))?;
        // IPv6 pools are not enumerated: their size costs no memory.
        let total: u64 = pools
            .iter()
            .filter(|p| p.family == aliasnet_ipam_proto::Family::Ipv4)
            .map(|p| p.size)
            .sum();
        if total > MAX_TOTAL_ADDRESSES {
            return Err(invalid("pool", ConfigProblem::TooManyAddresses { total }));
        }

        Ok(Self {
            socket: raw.socket,
            state_dir: raw.state_dir,
            spool_dir: raw.spool_dir,
            cooldown,
            on_only_cooling: raw.on_only_cooling,
            host_veth_prefix: raw.host_veth_prefix,
            log_level: raw.log_level,
            log_file: raw.log_file,
            metrics_address,
            reconcile_interval,
            reconcile_grace,
            gc_grace,
            pools,
            warnings,
        })
    }

    /// Total usable addresses over all pools (saturating: IPv6 pools can be huge).
    pub fn total_addresses(&self) -> u64 {
        self.pools
            .iter()
            .fold(0u64, |n, p| n.saturating_add(p.size))
    }
}

fn check_veth_prefix(p: &str) -> Result<(), ConfigProblem> {
    let prefix = || p.to_owned();
    if p.is_empty() || p.len() > MAX_VETH_PREFIX {
        return Err(ConfigProblem::VethPrefixLength { prefix: prefix() });
    }
    if !p
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ConfigProblem::VethPrefixCharacters { prefix: prefix() });
    }
    Ok(())
}

/// Parse a duration like `0`, `500ms`, `130s`, `2m`, `1h`, `1m30s`.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let bad = || DurationError {
        input: s.to_owned(),
    };
    if t.is_empty() {
        return Err(bad());
    }
    let mut total: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let n: u128 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let ms_per = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total = n
            .checked_mul(ms_per)
            .and_then(|v| total.checked_add(v))
            .filter(|v| *v <= u128::from(u64::MAX))
            .ok_or_else(bad)?;
    }
    Ok(Duration::from_millis(total as u64))
}
