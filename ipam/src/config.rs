//! `ipamd.toml`: parsing and validation.
//!
//! Every key is checked up front and errors name the offending field, so a bad config stops the
//! daemon at start instead of surfacing as a confusing allocation failure later.

use std::{
    fmt,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config {path}: `{field}`: {message}")]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
}

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

/// Where a pool's addresses come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSource {
    /// CIDRs, ranges and single addresses listed in the config.
    Static,
    /// Address blocks delegated to the node (AWS prefix delegation, AKS static blocks); every
    /// address of every block is usable.
    Prefixes,
    /// The node's secondary IPs, read from an Azure IMDS-format endpoint at run time.
    AzureImds,
}

impl PoolSource {
    /// Whether the pool's addresses are only known at run time.
    pub fn is_dynamic(self) -> bool {
        self == Self::AzureImds
    }
}

impl fmt::Display for PoolSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Static => "static",
            Self::Prefixes => "prefixes",
            Self::AzureImds => "azure-imds",
        })
    }
}

/// How an `azure-imds` pool polls its endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImdsSpec {
    /// `http://` URL on a loopback or link-local address.
    pub url: String,
    /// Host and port to connect to (parsed from `url`).
    pub authority: String,
    /// Interval right after a change (and the first error backoff).
    pub refresh_min: Duration,
    /// Interval reached by doubling while nothing changes (and the longest error backoff).
    pub refresh_max: Duration,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// An inclusive range of IPv4 addresses as host-order integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AddrRange {
    pub first: u32,
    pub last: u32,
}

impl AddrRange {
    pub fn len(&self) -> u64 {
        u64::from(self.last - self.first) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", Ipv4Addr::from(self.first))
        } else {
            write!(
                f,
                "{}-{}",
                Ipv4Addr::from(self.first),
                Ipv4Addr::from(self.last)
            )
        }
    }
}

/// A validated pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    pub source: PoolSource,
    /// Usable addresses (exclusions applied): sorted, disjoint, non-adjacent.
    pub ranges: Vec<AddrRange>,
    /// Number of usable addresses.
    pub size: u64,
    /// Short human description of the configured sources, for messages ("10.240.1.0/24").
    pub description: String,
    /// Exclusions (metadata pools apply them to the addresses they read).
    pub exclude: Vec<AddrRange>,
    /// Set for `azure-imds` pools (which have no `ranges`).
    pub imds: Option<ImdsSpec>,
}

impl PoolSpec {
    pub fn is_excluded(&self, addr: u32) -> bool {
        self.exclude
            .iter()
            .any(|r| r.first <= addr && addr <= r.last)
    }
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
struct RawPool {
    name: String,
    source: String,
    #[serde(default)]
    cidrs: Vec<String>,
    #[serde(default)]
    ranges: Vec<String>,
    #[serde(default)]
    ips: Vec<String>,
    #[serde(default)]
    exclude: Vec<String>,
    #[serde(default)]
    prefixes: Vec<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    refresh_min: Option<String>,
    #[serde(default)]
    refresh_max: Option<String>,
    #[serde(default)]
    timeout: Option<String>,
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
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: field.to_owned(),
            message,
        };

        let cooldown = match &raw.cooldown {
            None => DEFAULT_COOLDOWN,
            Some(s) => parse_duration(s).map_err(|m| invalid("cooldown", m))?,
        };
        for (field, p) in [
            ("socket", &raw.socket),
            ("state_dir", &raw.state_dir),
            ("spool_dir", &raw.spool_dir),
        ] {
            if !p.is_absolute() {
                return Err(invalid(
                    field,
                    format!(
                        "must be an absolute path, got {:?}",
                        p.display().to_string()
                    ),
                ));
            }
        }
        if raw.state_dir == raw.spool_dir {
            return Err(invalid(
                "spool_dir",
                "must differ from state_dir (the plugin writes into it)".into(),
            ));
        }
        check_veth_prefix(&raw.host_veth_prefix).map_err(|m| invalid("host_veth_prefix", m))?;
        if raw.log_level.trim().is_empty() {
            return Err(invalid("log_level", "must not be empty".into()));
        }
        let metrics_address = match raw.metrics_address.trim() {
            "" => None,
            a => Some(a.parse::<std::net::SocketAddr>().map_err(|_| {
                invalid(
                    "metrics_address",
                    format!("{a:?} is not an IP:port such as \"127.0.0.1:9545\" (\"\" disables the endpoint)"),
                )
            })?),
        };
        let dur = |field: &str, v: &Option<String>, default: Duration| match v {
            None => Ok(default),
            Some(s) => parse_duration(s).map_err(|m| invalid(field, m)),
        };
        let reconcile_interval = dur(
            "reconcile_interval",
            &raw.reconcile_interval,
            DEFAULT_RECONCILE_INTERVAL,
        )?;
        if !reconcile_interval.is_zero() && reconcile_interval < Duration::from_secs(1) {
            return Err(invalid(
                "reconcile_interval",
                "must be at least 1s (or \"0s\": off)".into(),
            ));
        }
        let reconcile_grace = dur(
            "reconcile_grace",
            &raw.reconcile_grace,
            DEFAULT_RECONCILE_GRACE,
        )?;
        if reconcile_grace < Duration::from_secs(5) {
            return Err(invalid(
                "reconcile_grace",
                "must be at least 5s: an ADD in progress has reserved its address before its veth exists".into(),
            ));
        }
        let gc_grace = dur("gc_grace", &raw.gc_grace, DEFAULT_GC_GRACE)?;

        if raw.pools.is_empty() {
            return Err(invalid(
                "pool",
                "no [[pool]] defined; the daemon needs at least one address pool".into(),
            ));
        }
        if raw.pools.len() > MAX_POOLS {
            return Err(invalid(
                "pool",
                format!(
                    "{} pools defined; at most {MAX_POOLS} are supported",
                    raw.pools.len()
                ),
            ));
        }
        let mut warnings = Vec::new();
        let mut pools: Vec<PoolSpec> = Vec::with_capacity(raw.pools.len());
        for (i, rp) in raw.pools.iter().enumerate() {
            let spec = build_pool(i, rp, &mut warnings).map_err(|(f, m)| invalid(&f, m))?;
            if let Some(other) = pools.iter().position(|p| p.name == spec.name) {
                return Err(invalid(
                    &format!("pool[{i}].name"),
                    format!("duplicate pool name '{}' (also pool[{other}])", spec.name),
                ));
            }
            pools.push(spec);
        }
        check_pool_overlaps(&pools).map_err(|m| invalid("pool", m))?;
        let total: u64 = pools.iter().map(|p| p.size).sum();
        if total > MAX_TOTAL_ADDRESSES {
            return Err(invalid(
                "pool",
                format!(
                    "pools total {total} addresses; one daemon manages at most {MAX_TOTAL_ADDRESSES}"
                ),
            ));
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

    /// Total usable addresses over all pools.
    pub fn total_addresses(&self) -> u64 {
        self.pools.iter().map(|p| p.size).sum()
    }
}

fn check_veth_prefix(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > MAX_VETH_PREFIX {
        return Err(format!(
            "must be 1 to {MAX_VETH_PREFIX} characters, got {p:?}"
        ));
    }
    if !p
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "may only contain ASCII letters, digits, '-' and '_', got {p:?}"
        ));
    }
    Ok(())
}

/// Parse a duration like `0`, `500ms`, `130s`, `2m`, `1h`, `1m30s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let bad = || {
        format!("invalid duration {s:?}: expected a number with a unit (ms, s, m, h), e.g. \"130s\", \"500ms\", \"2m\", \"1m30s\"")
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

/// Parse `a.b.c.d/n`, refusing host bits so a typo cannot silently widen or shift a pool.
fn parse_cidr(s: &str) -> Result<AddrRange, String> {
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not a CIDR (expected a.b.c.d/len)"))?;
    let ip: Ipv4Addr = ip
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: {ip:?} is not an IPv4 address"))?;
    let len: u32 = len
        .trim()
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or_else(|| format!("{s:?}: prefix length must be 0..=32"))?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    let first = u32::from(ip) & mask;
    if first != u32::from(ip) {
        return Err(format!(
            "{s:?} has host bits set (did you mean {}/{len}?)",
            Ipv4Addr::from(first)
        ));
    }
    Ok(AddrRange {
        first,
        last: first | !mask,
    })
}

fn parse_ip(s: &str) -> Result<AddrRange, String> {
    let ip: Ipv4Addr = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not an IPv4 address"))?;
    Ok(AddrRange {
        first: ip.into(),
        last: ip.into(),
    })
}

fn parse_range(s: &str) -> Result<AddrRange, String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?} is not a range (expected a.b.c.d-e.f.g.h)"))?;
    let a = parse_ip(a).map_err(|m| format!("{s:?}: {m}"))?;
    let b = parse_ip(b).map_err(|m| format!("{s:?}: {m}"))?;
    if a.first > b.first {
        return Err(format!("{s:?}: the first address is after the last"));
    }
    Ok(AddrRange {
        first: a.first,
        last: b.first,
    })
}

/// Build one pool; errors are (field, message).
fn build_pool(
    i: usize,
    rp: &RawPool,
    warnings: &mut Vec<String>,
) -> Result<PoolSpec, (String, String)> {
    let name = rp.name.trim();
    if name.is_empty() {
        return Err((format!("pool[{i}].name"), "must not be empty".into()));
    }
    if name.len() > 64 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err((
            format!("pool[{i}].name"),
            format!("{name:?} must be 1 to 64 printable ASCII characters without spaces"),
        ));
    }
    let at = |field: &str| format!("pool '{name}'.{field}");
    let source = match rp.source.as_str() {
        "static" => PoolSource::Static,
        "prefixes" => PoolSource::Prefixes,
        "azure-imds" => PoolSource::AzureImds,
        other => {
            return Err((
                at("source"),
                format!(
                    "unknown source {other:?}; expected \"static\", \"prefixes\" or \"azure-imds\""
                ),
            ))
        }
    };
    // Keys that belong to another source are refused rather than ignored.
    let given: [(&str, bool); 8] = [
        ("cidrs", !rp.cidrs.is_empty()),
        ("ranges", !rp.ranges.is_empty()),
        ("ips", !rp.ips.is_empty()),
        ("prefixes", !rp.prefixes.is_empty()),
        ("url", rp.url.is_some()),
        ("refresh_min", rp.refresh_min.is_some()),
        ("refresh_max", rp.refresh_max.is_some()),
        ("timeout", rp.timeout.is_some()),
    ];
    let allowed: &[&str] = match source {
        PoolSource::Static => &["cidrs", "ranges", "ips"],
        PoolSource::Prefixes => &["prefixes"],
        PoolSource::AzureImds => &["url", "refresh_min", "refresh_max", "timeout"],
    };
    if let Some((k, _)) = given.iter().find(|(k, g)| *g && !allowed.contains(k)) {
        return Err((
            at(k),
            format!(
                "not used by source \"{source}\" (it takes: {}, exclude)",
                allowed.join(", ")
            ),
        ));
    }
    let mut excl: Vec<AddrRange> = Vec::new();
    for (j, s) in rp.exclude.iter().enumerate() {
        let r = if s.contains('/') {
            parse_cidr(s)
        } else {
            parse_ip(s)
        }
        .map_err(|m| (at(&format!("exclude[{j}]")), m))?;
        excl.push(r);
    }
    if source == PoolSource::AzureImds {
        let imds = build_imds(rp).map_err(|(f, m)| (at(&f), m))?;
        excl.sort();
        return Ok(PoolSpec {
            name: name.to_owned(),
            source,
            ranges: Vec::new(),
            size: 0,
            description: format!("metadata from {}", imds.url),
            exclude: excl,
            imds: Some(imds),
        });
    }

    // Every configured range, remembering where it came from for duplicate messages.
    let mut parts: Vec<(AddrRange, String)> = Vec::new();
    for (j, s) in rp.cidrs.iter().enumerate() {
        let r = parse_cidr(s).map_err(|m| (at(&format!("cidrs[{j}]")), m))?;
        parts.push((r, format!("cidrs[{j}] {s:?}")));
    }
    for (j, s) in rp.ranges.iter().enumerate() {
        let r = parse_range(s).map_err(|m| (at(&format!("ranges[{j}]")), m))?;
        parts.push((r, format!("ranges[{j}] {s:?}")));
    }
    for (j, s) in rp.ips.iter().enumerate() {
        let r = parse_ip(s).map_err(|m| (at(&format!("ips[{j}]")), m))?;
        parts.push((r, format!("ips[{j}] {s:?}")));
    }
    for (j, s) in rp.prefixes.iter().enumerate() {
        let r = parse_cidr(s).map_err(|m| (at(&format!("prefixes[{j}]")), m))?;
        parts.push((r, format!("prefixes[{j}] {s:?}")));
    }
    if parts.is_empty() {
        return Err(match source {
            PoolSource::Prefixes => (
                at("prefixes"),
                "the pool lists no blocks (set prefixes = [\"10.64.0.0/28\", ...])".into(),
            ),
            _ => (
                at("cidrs"),
                "the pool lists no addresses (set cidrs, ranges or ips)".into(),
            ),
        });
    }
    parts.sort_by_key(|(r, _)| *r);
    for w in parts.windows(2) {
        if w[1].0.first <= w[0].0.last {
            return Err((
                at("cidrs"),
                format!(
                    "{} overlaps {} (first shared address {})",
                    w[0].1,
                    w[1].1,
                    Ipv4Addr::from(w[1].0.first)
                ),
            ));
        }
    }
    let description = describe(rp);
    for (j, (r, s)) in rp
        .exclude
        .iter()
        .zip(&excl)
        .map(|(s, r)| (r, s))
        .enumerate()
    {
        if !parts
            .iter()
            .any(|(p, _)| p.first <= r.last && r.first <= p.last)
        {
            warnings.push(format!(
                "pool '{name}': exclude[{j}] {s:?} is outside the pool's addresses and has no effect"
            ));
        }
    }
    let exclude = excl.clone();
    let ranges = subtract(
        &parts.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        &mut excl,
    );
    let size: u64 = ranges.iter().map(AddrRange::len).sum();
    if size == 0 {
        return Err((
            at("exclude"),
            "the exclusions remove every address; the pool would be empty".into(),
        ));
    }
    if size > MAX_TOTAL_ADDRESSES {
        return Err((
            at("cidrs"),
            format!(
                "the pool has {size} addresses; one daemon manages at most {MAX_TOTAL_ADDRESSES}"
            ),
        ));
    }
    Ok(PoolSpec {
        name: name.to_owned(),
        source,
        ranges,
        size,
        description,
        exclude,
        imds: None,
    })
}

/// Validate an `azure-imds` pool's endpoint and timings; errors are (field, message).
fn build_imds(rp: &RawPool) -> Result<ImdsSpec, (String, String)> {
    let url = rp
        .url
        .clone()
        .unwrap_or_else(|| DEFAULT_IMDS_URL.to_owned());
    let authority = check_metadata_url(&url).map_err(|m| ("url".to_owned(), m))?;
    let dur = |field: &str, v: &Option<String>, default: Duration| match v {
        None => Ok(default),
        Some(s) => parse_duration(s).map_err(|m| (field.to_owned(), m)),
    };
    let refresh_min = dur("refresh_min", &rp.refresh_min, Duration::from_secs(4))?;
    let refresh_max = dur("refresh_max", &rp.refresh_max, Duration::from_secs(1024))?;
    let timeout = dur("timeout", &rp.timeout, Duration::from_secs(2))?;
    if refresh_min < Duration::from_millis(100) {
        return Err((
            "refresh_min".into(),
            "must be at least 100ms (IMDS rate-limits)".into(),
        ));
    }
    if refresh_max < refresh_min {
        return Err((
            "refresh_max".into(),
            format!(
                "must be at least refresh_min ({}ms)",
                refresh_min.as_millis()
            ),
        ));
    }
    if timeout.is_zero() || timeout > Duration::from_secs(60) {
        return Err(("timeout".into(), "must be between 1ms and 60s".into()));
    }
    Ok(ImdsSpec {
        url,
        authority,
        refresh_min,
        refresh_max,
        timeout,
    })
}

/// `http://HOST[:PORT]/PATH` with HOST an IPv4 loopback or link-local literal (metadata never
/// leaves the node, and plain HTTP is only acceptable there). Returns `HOST:PORT`.
pub fn check_metadata_url(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!("{url:?} must start with http:// (plain HTTP to a loopback or link-local address)")
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if path
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(format!("{url:?}: the path contains whitespace"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("{url:?}: bad port {p:?}"))?,
        ),
        None => (authority, 80),
    };
    let ip: Ipv4Addr = host
        .parse()
        .map_err(|_| format!("{url:?}: the host must be an IPv4 address literal, got {host:?}"))?;
    if !(ip.is_loopback() || ip.is_link_local()) {
        return Err(format!(
            "{url:?}: {ip} is neither loopback (127.0.0.0/8) nor link-local (169.254.0.0/16); \
             metadata is only fetched from the node itself"
        ));
    }
    Ok(format!("{ip}:{port}"))
}

fn describe(rp: &RawPool) -> String {
    let all: Vec<&str> = rp
        .cidrs
        .iter()
        .chain(&rp.ranges)
        .chain(&rp.ips)
        .chain(&rp.prefixes)
        .map(|s| s.trim())
        .collect();
    match all.len() {
        0..=2 => all.join(", "),
        n => format!("{}, {} and {} more", all[0], all[1], n - 2),
    }
}

/// `ranges` (sorted, disjoint) minus `excl`; the result is sorted, disjoint and merged.
fn subtract(ranges: &[AddrRange], excl: &mut [AddrRange]) -> Vec<AddrRange> {
    excl.sort();
    let mut out: Vec<AddrRange> = Vec::new();
    for r in ranges {
        let mut cur = Some(*r);
        for e in excl.iter() {
            let Some(c) = cur else { break };
            if e.last < c.first || e.first > c.last {
                continue;
            }
            if e.first > c.first {
                out.push(AddrRange {
                    first: c.first,
                    last: e.first - 1,
                });
            }
            cur = (e.last < c.last).then(|| AddrRange {
                first: e.last + 1,
                last: c.last,
            });
        }
        if let Some(c) = cur {
            out.push(c);
        }
    }
    // Merge adjacent pieces (e.g. ips listed next to a range) so lookups stay short.
    let mut merged: Vec<AddrRange> = Vec::with_capacity(out.len());
    for r in out {
        match merged.last_mut() {
            Some(m) if u64::from(m.last) + 1 == u64::from(r.first) => m.last = r.last,
            _ => merged.push(r),
        }
    }
    merged
}

fn check_pool_overlaps(pools: &[PoolSpec]) -> Result<(), String> {
    let mut all: Vec<(AddrRange, usize)> = pools
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.ranges.iter().map(move |r| (*r, i)))
        .collect();
    all.sort();
    for w in all.windows(2) {
        if w[1].0.first <= w[0].0.last {
            return Err(format!(
                "pools '{}' and '{}' overlap (both contain {}); an address may belong to one pool only",
                pools[w[0].1].name,
                pools[w[1].1].name,
                Ipv4Addr::from(w[1].0.first)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/aliasnet/ipamd.toml"))
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    const FULL: &str = r#"
socket = "/run/aliasnet/ipamd.sock"
state_dir = "/var/lib/aliasnet/ipam"
spool_dir = "/var/lib/aliasnet/spool"
cooldown = "130s"
on_only_cooling = "fail"
host_veth_prefix = "ali"
log_level = "info"
[[pool]]
name = "secondary"
source = "static"
cidrs = ["10.240.1.0/24"]
ranges = ["10.240.2.10-10.240.2.20"]
ips = ["10.240.3.7"]
exclude = ["10.240.1.0/30", "10.240.1.255"]
"#;

    #[test]
    fn full_example_parses() {
        let c = parse(FULL).unwrap();
        assert_eq!(c.cooldown, Duration::from_secs(130));
        assert_eq!(c.on_only_cooling, OnOnlyCooling::Fail);
        assert_eq!(c.pools.len(), 1);
        let p = &c.pools[0];
        // 256 - 4 - 1 + 11 + 1
        assert_eq!(p.size, 263);
        assert_eq!(p.ranges[0].to_string(), "10.240.1.4-10.240.1.254");
        assert_eq!(p.ranges[1].to_string(), "10.240.2.10-10.240.2.20");
        assert_eq!(p.ranges[2].to_string(), "10.240.3.7");
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn defaults_apply() {
        let c = parse("[[pool]]\nname=\"p\"\nsource=\"static\"\nips=[\"10.0.0.1\"]\n").unwrap();
        assert_eq!(c.socket, Path::new("/run/aliasnet/ipamd.sock"));
        assert_eq!(c.cooldown, DEFAULT_COOLDOWN);
        assert_eq!(c.host_veth_prefix, "ali");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        for bad in ["", "10", "s", "10x", "1.5s", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn invalid_configs_name_the_field() {
        let pool = |body: &str| format!("[[pool]]\nname=\"p\"\nsource=\"static\"\n{body}\n");
        let cases = [
            (pool("cidrs=[\"10.0.0.0/33\"]"), "cidrs[0]"),
            (pool("cidrs=[\"10.0.0.5/24\"]"), "did you mean 10.0.0.0/24"),
            (pool("cidrs=[\"banana\"]"), "cidrs[0]"),
            (pool("ranges=[\"10.0.0.9-10.0.0.1\"]"), "ranges[0]"),
            (pool("ips=[\"10.0.0.256\"]"), "ips[0]"),
            (pool("exclude=[\"10.0.0.1\"]"), "no addresses"),
            (
                pool("ips=[\"10.0.0.1\"]\nexclude=[\"10.0.0.0/24\"]"),
                "pool would be empty",
            ),
            (pool("ips=[\"10.0.0.1\"]\nmtu=5"), "unknown field `mtu`"),
            (
                format!("colour=\"red\"\n{}", pool("ips=[\"10.0.0.1\"]")),
                "unknown field `colour`",
            ),
            (
                format!("cooldown=\"soon\"\n{}", pool("ips=[\"10.0.0.1\"]")),
                "`cooldown`",
            ),
            (
                format!("on_only_cooling=\"panic\"\n{}", pool("ips=[\"10.0.0.1\"]")),
                "on_only_cooling",
            ),
            (
                format!("host_veth_prefix=\"a/b\"\n{}", pool("ips=[\"10.0.0.1\"]")),
                "`host_veth_prefix`",
            ),
            (
                format!("state_dir=\"relative\"\n{}", pool("ips=[\"10.0.0.1\"]")),
                "`state_dir`",
            ),
            (
                format!(
                    "{}{}",
                    pool("ips=[\"10.0.0.1\"]"),
                    pool("ips=[\"10.0.0.2\"]")
                ),
                "duplicate pool name 'p'",
            ),
            (
                pool("cidrs=[\"10.0.0.0/24\"]\nips=[\"10.0.0.7\"]"),
                "overlaps",
            ),
            (
                "[[pool]]\nname=\"p\"\nsource=\"azure\"\nips=[\"10.0.0.1\"]\n".to_owned(),
                "unknown source",
            ),
            (
                "[[pool]]\nname=\"\"\nsource=\"static\"\nips=[\"10.0.0.1\"]\n".to_owned(),
                "pool[0].name",
            ),
            ("socket=\"/run/x.sock\"\n".to_owned(), "no [[pool]]"),
            (pool("cidrs=[\"10.0.0.0/8\"]"), "at most"),
        ];
        for (text, want) in cases {
            let e = err(&text);
            assert!(
                e.contains(want),
                "config:\n{text}\nerror {e:?} lacks {want:?}"
            );
            assert!(e.contains("/etc/aliasnet/ipamd.toml"), "{e}");
        }
    }

    #[test]
    fn overlapping_pools_are_refused() {
        let e = err(
            "[[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/24\"]\n\
             [[pool]]\nname=\"b\"\nsource=\"static\"\nranges=[\"10.0.0.200-10.0.1.5\"]\n",
        );
        assert!(e.contains("pools 'a' and 'b' overlap"), "{e}");
        assert!(e.contains("10.0.0.200"), "{e}");
    }

    #[test]
    fn excluded_addresses_may_belong_to_another_pool() {
        let c = parse(
            "[[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/24\"]\nexclude=[\"10.0.0.5\"]\n\
             [[pool]]\nname=\"b\"\nsource=\"static\"\nips=[\"10.0.0.5\"]\n",
        )
        .unwrap();
        assert_eq!(c.total_addresses(), 256);
    }

    #[test]
    fn exclusion_outside_pool_warns() {
        let c = parse(
            "[[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/30\"]\nexclude=[\"10.9.9.9\"]\n",
        )
        .unwrap();
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    }

    #[test]
    fn prefix_and_metadata_pools() {
        let c = parse(
            "metrics_address = \"\"\nreconcile_interval = \"0s\"\nreconcile_grace = \"2m\"\n\
             [[pool]]\nname=\"blocks\"\nsource=\"prefixes\"\nprefixes=[\"10.64.0.0/28\", \"10.64.0.16/28\"]\n\
             [[pool]]\nname=\"nic\"\nsource=\"azure-imds\"\nexclude=[\"10.1.0.9\"]\n",
        )
        .unwrap();
        assert_eq!(c.metrics_address, None);
        assert_eq!(c.reconcile_interval, Duration::ZERO);
        assert_eq!(c.reconcile_grace, Duration::from_secs(120));
        assert_eq!(c.pools[0].source, PoolSource::Prefixes);
        assert_eq!(c.pools[0].size, 32);
        let imds = c.pools[1].imds.as_ref().unwrap();
        assert_eq!(imds.url, DEFAULT_IMDS_URL);
        assert_eq!(imds.authority, "169.254.169.254:80");
        assert_eq!(imds.refresh_min, Duration::from_secs(4));
        assert_eq!(imds.refresh_max, Duration::from_secs(1024));
        assert!(c.pools[1].is_excluded(u32::from(Ipv4Addr::new(10, 1, 0, 9))));
        let d = parse("[[pool]]\nname=\"p\"\nsource=\"static\"\nips=[\"10.0.0.1\"]\n").unwrap();
        assert_eq!(d.metrics_address, Some("127.0.0.1:9545".parse().unwrap()));
        assert_eq!(d.reconcile_grace, DEFAULT_RECONCILE_GRACE);
    }

    #[test]
    fn invalid_new_keys_name_the_field() {
        let p = |src: &str, body: &str| format!("[[pool]]\nname=\"p\"\nsource=\"{src}\"\n{body}\n");
        let cases = [
            (p("prefixes", "prefixes=[\"10.64.0.1/28\"]"), "prefixes[0]"),
            (p("prefixes", ""), "lists no blocks"),
            (
                p("prefixes", "cidrs=[\"10.64.0.0/28\"]"),
                "pool 'p'.cidrs`: not used by source \"prefixes\"",
            ),
            (
                p("static", "prefixes=[\"10.64.0.0/28\"]\nips=[\"10.0.0.1\"]"),
                "'p'.prefixes",
            ),
            (p("azure-imds", "ips=[\"10.0.0.1\"]"), "'p'.ips"),
            (
                p("azure-imds", "url=\"https://169.254.169.254/x\""),
                "must start with http://",
            ),
            (
                p("azure-imds", "url=\"http://10.0.0.1/x\""),
                "neither loopback",
            ),
            (
                p("azure-imds", "url=\"http://metadata/x\""),
                "IPv4 address literal",
            ),
            (p("azure-imds", "url=\"http://127.0.0.1:0/x\""), "bad port"),
            (p("azure-imds", "refresh_min=\"10ms\""), "refresh_min"),
            (
                p("azure-imds", "refresh_min=\"10s\"\nrefresh_max=\"5s\""),
                "refresh_max",
            ),
            (p("azure-imds", "timeout=\"0s\""), "timeout"),
            (
                format!(
                    "metrics_address=\"localhost\"\n{}",
                    p("static", "ips=[\"10.0.0.1\"]")
                ),
                "`metrics_address`",
            ),
            (
                format!(
                    "reconcile_grace=\"1s\"\n{}",
                    p("static", "ips=[\"10.0.0.1\"]")
                ),
                "`reconcile_grace`",
            ),
            (
                format!(
                    "reconcile_interval=\"10ms\"\n{}",
                    p("static", "ips=[\"10.0.0.1\"]")
                ),
                "`reconcile_interval`",
            ),
        ];
        for (text, want) in cases {
            let e = err(&text);
            assert!(
                e.contains(want),
                "config:\n{text}\nerror {e:?} lacks {want:?}"
            );
        }
    }

    #[test]
    fn a_slash_14_fits() {
        let c =
            parse("[[pool]]\nname=\"big\"\nsource=\"static\"\ncidrs=[\"10.64.0.0/14\"]\n").unwrap();
        assert_eq!(c.total_addresses(), 262_144);
    }
}
