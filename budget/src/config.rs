//! The cluster budget's keys in `shaper.toml`:
//!
//! ```toml
//! [cluster]
//! etcd_endpoints = ["https://10.0.0.5:2379", "https://10.0.0.6:2379", "https://10.0.0.7:2379"]
//! etcd_ca_file = "/etc/aliasnet-etcd/ca.crt"     # required with https endpoints
//! etcd_cert_file = "/etc/aliasnet-etcd/tls.crt"  # client certificate (etcd --client-cert-auth)
//! etcd_key_file = "/etc/aliasnet-etcd/tls.key"
//! etcd_prefix = "/aliasnet"                      # every key lives under it
//! share_period = "2s"                            # demand reports and share computation
//! lease_ttl = "10s"                              # default 5 share periods
//! fallback_nodes = 100                           # static split before etcd was ever reached
//!
//! [internet]
//! cluster_ingress_rate = "400G"                  # all nodes' pods together
//! [classes.mirrors]
//! cluster_ingress_rate = "40G"
//! [namespaces.research.classes.mirrors]
//! cluster_ingress_rate = "10G"                   # this namespace's pods on all nodes together
//! ```
//!
//! Only these keys are read here; every other key of those tables belongs to the node policy
//! parser, which calls [`ClusterRates::from_table`] and [`ClusterConfig::from_table`] (or
//! [`BudgetPolicy::from_toml`] for the whole document).

use std::{collections::BTreeMap, fmt, path::PathBuf, str::FromStr, time::Duration};

use aliasnet_ebpf::limits::{check_rate, parse_quantity};
use toml::{Table, Value};

/// The budget keys of `[internet]`, `[classes.<name>]` and their per-namespace tables.
pub const CLUSTER_RATE_KEYS: [&str; 2] = ["cluster_ingress_rate", "cluster_egress_rate"];

/// The keys of `[cluster]`.
pub const CLUSTER_KEYS: [&str; 8] = [
    "etcd_endpoints",
    "etcd_ca_file",
    "etcd_cert_file",
    "etcd_key_file",
    "etcd_prefix",
    "share_period",
    "lease_ttl",
    "fallback_nodes",
];

/// The class of all internet traffic (every named class is part of it).
pub const INTERNET: &str = "internet";

pub const DEFAULT_PREFIX: &str = "/aliasnet";
pub const DEFAULT_SHARE_PERIOD: Duration = Duration::from_secs(2);
/// Lease TTL in share periods when `lease_ttl` is not set.
pub const DEFAULT_TTL_PERIODS: u32 = 5;
pub const DEFAULT_FALLBACK_NODES: u32 = 100;
const MIN_SHARE_PERIOD: Duration = Duration::from_millis(500);
const MAX_SHARE_PERIOD: Duration = Duration::from_secs(60);
/// etcd rounds shorter TTLs up to its own minimum (1.5 election timeouts, 2 s by default); the
/// engine asks for one second less than `lease_ttl` (see `session::granted_ttl`).
const MIN_LEASE_TTL: Duration = Duration::from_secs(3);
const MAX_LEASE_TTL: Duration = Duration::from_secs(600);

/// A key with a value it cannot have. `key` is the dotted path (`classes.mirrors.cluster_ingress_rate`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// Traffic direction, seen from the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// To the pod: downloads.
    Ingress,
    /// From the pod: uploads.
    Egress,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Direction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ingress" => Ok(Direction::Ingress),
            "egress" => Ok(Direction::Egress),
            _ => Err(format!("{s:?} is not ingress or egress")),
        }
    }
}

/// What one cluster budget limits: a class in one direction, for all pods or for one
/// namespace's pods. Its [`id`](Self::id) names it in etcd and in metrics.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BudgetKey {
    pub namespace: Option<String>,
    pub class: String,
    pub direction: Direction,
}

impl BudgetKey {
    pub fn new(namespace: Option<&str>, class: &str, direction: Direction) -> Self {
        Self {
            namespace: namespace.map(str::to_owned),
            class: class.to_owned(),
            direction,
        }
    }

    /// `<class>.<direction>` or `<namespace>.<class>.<direction>`: one etcd path segment
    /// (namespace and class names are RFC 1123 labels, without dots), unambiguous by its
    /// number of parts.
    pub fn id(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}.{}.{}", self.class, self.direction),
            None => format!("{}.{}", self.class, self.direction),
        }
    }

    /// The inverse of [`id`](Self::id).
    pub fn from_id(id: &str) -> Option<Self> {
        let parts: Vec<&str> = id.split('.').collect();
        let (ns, class, dir) = match parts.as_slice() {
            [c, d] => (None, *c, *d),
            [n, c, d] => (Some(*n), *c, *d),
            _ => return None,
        };
        if !is_label(class) || !ns.is_none_or(is_label) {
            return None;
        }
        Some(Self::new(ns, class, dir.parse().ok()?))
    }
}

impl fmt::Display for BudgetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {} of namespace {ns}", self.class, self.direction),
            None => write!(f, "{} {}", self.class, self.direction),
        }
    }
}

/// One cluster budget: all matching traffic of all nodes together stays within `rate` (bit/s).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Budget {
    pub key: BudgetKey,
    pub rate: u64,
}

/// `cluster_ingress_rate` and `cluster_egress_rate` of one table; `None` is no budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterRates {
    pub ingress: Option<u64>,
    pub egress: Option<u64>,
}

impl ClusterRates {
    /// Reads the two keys from `table` (other keys are ignored); `at` is the table's dotted
    /// path for messages (`classes.mirrors`).
    pub fn from_table(table: &Table, at: &str) -> Result<Self, ConfigError> {
        let get = |key: &str| -> Result<Option<u64>, ConfigError> {
            let path = format!("{at}.{key}");
            table.get(key).map_or(Ok(None), |v| rate(&path, v))
        };
        Ok(Self {
            ingress: get(CLUSTER_RATE_KEYS[0])?,
            egress: get(CLUSTER_RATE_KEYS[1])?,
        })
    }

    pub fn get(&self, d: Direction) -> Option<u64> {
        match d {
            Direction::Ingress => self.ingress,
            Direction::Egress => self.egress,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }
}

/// A rate as every other rate of shaper.toml: bit/s as an integer or a quantity ("40G"), or
/// "unlimited" (no budget).
fn rate(path: &str, v: &Value) -> Result<Option<u64>, ConfigError> {
    let bps = match v {
        Value::Integer(n) => {
            u64::try_from(*n).map_err(|_| ConfigError::new(path, "must not be negative"))?
        }
        Value::String(s) if s.trim().eq_ignore_ascii_case("unlimited") => return Ok(None),
        Value::String(s) => parse_quantity(s).map_err(|e| ConfigError::new(path, e))?,
        other => {
            return Err(ConfigError::new(
                path,
                format!("expected a rate like \"40G\", got {}", other.type_str()),
            ))
        }
    };
    check_rate(path, Some(bps)).map_err(|e| ConfigError::new(path, e.reason))?;
    Ok(Some(bps))
}

/// TLS towards etcd: the CA that signed its serving certificates and, for etcd's
/// `--client-cert-auth`, this node's client certificate and key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// `[cluster]`: how nodes reach etcd and how often they share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `http://host:port` or `https://host:port`, all of one scheme.
    pub endpoints: Vec<String>,
    /// Set exactly when the endpoints are https.
    pub tls: Option<TlsFiles>,
    /// Key prefix, `/`-led, without a trailing `/`.
    pub prefix: String,
    pub share_period: Duration,
    /// TTL of each node's lease: its demand keys and its leadership live that long without it.
    pub lease_ttl: Duration,
    /// Node count assumed for the static split by a node that has not reached etcd since it
    /// started (it has never seen how many nodes share the budgets).
    pub fallback_nodes: u32,
}

impl ClusterConfig {
    /// Parses and validates `[cluster]`; unknown keys are refused.
    pub fn from_table(t: &Table) -> Result<Self, ConfigError> {
        if let Some(k) = t.keys().find(|k| !CLUSTER_KEYS.contains(&k.as_str())) {
            return Err(ConfigError::new(
                format!("cluster.{k}"),
                // serde's wording, as for every other table of the file.
                format!(
                    "unknown key, expected one of {}",
                    CLUSTER_KEYS.map(|k| format!("`{k}`")).join(", ")
                ),
            ));
        }
        let endpoints = endpoints(t.get("etcd_endpoints"))?;
        let path = |k: &str| -> Result<Option<PathBuf>, ConfigError> {
            match t.get(k) {
                None => Ok(None),
                Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(PathBuf::from(s))),
                Some(_) => Err(ConfigError::new(
                    format!("cluster.{k}"),
                    "expected a file path",
                )),
            }
        };
        let (ca, cert, key) = (
            path("etcd_ca_file")?,
            path("etcd_cert_file")?,
            path("etcd_key_file")?,
        );
        let https = endpoints[0].starts_with("https://");
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "cluster.etcd_key_file",
                    "required with etcd_cert_file",
                ))
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "cluster.etcd_cert_file",
                    "required with etcd_key_file",
                ))
            }
        };
        let tls = match (https, ca) {
            (true, Some(ca)) => Some(TlsFiles { ca, identity }),
            (true, None) => {
                return Err(ConfigError::new(
                    "cluster.etcd_ca_file",
                    "required with https endpoints (the CA of etcd's serving certificates)",
                ))
            }
            (false, None) if identity.is_none() => None,
            (false, _) => {
                return Err(ConfigError::new(
                    "cluster.etcd_endpoints",
                    "TLS files are set but the endpoints are http://; use https://",
                ))
            }
        };
        let prefix = match t.get("etcd_prefix") {
            None => DEFAULT_PREFIX.to_owned(),
            Some(Value::String(s)) => prefix(s)?,
            Some(_) => return Err(ConfigError::new("cluster.etcd_prefix", "expected a string")),
        };
        let share_period = duration(t, "share_period")?.unwrap_or(DEFAULT_SHARE_PERIOD);
        if !(MIN_SHARE_PERIOD..=MAX_SHARE_PERIOD).contains(&share_period) {
            return Err(ConfigError::new(
                "cluster.share_period",
                format!("{share_period:?} is outside 500ms..60s"),
            ));
        }
        let lease_ttl = duration(t, "lease_ttl")?.unwrap_or_else(|| {
            let t = share_period * DEFAULT_TTL_PERIODS;
            Duration::from_secs(t.as_secs() + u64::from(t.subsec_nanos() > 0)).max(MIN_LEASE_TTL)
        });
        if lease_ttl < MIN_LEASE_TTL.max(share_period * 2) || lease_ttl > MAX_LEASE_TTL {
            return Err(ConfigError::new(
                "cluster.lease_ttl",
                format!(
                    "{lease_ttl:?} must be at least 3 s and 2 share periods, and at most 10 minutes"
                ),
            ));
        }
        if lease_ttl.subsec_millis() != 0 {
            return Err(ConfigError::new(
                "cluster.lease_ttl",
                "etcd leases have whole seconds",
            ));
        }
        let fallback_nodes = match t.get("fallback_nodes") {
            None => DEFAULT_FALLBACK_NODES,
            Some(Value::Integer(n)) if (1..=1_000_000).contains(n) => *n as u32,
            Some(_) => {
                return Err(ConfigError::new(
                    "cluster.fallback_nodes",
                    "expected a node count between 1 and 1000000",
                ))
            }
        };
        Ok(Self {
            endpoints,
            tls,
            prefix,
            share_period,
            lease_ttl,
            fallback_nodes,
        })
    }
}

fn endpoints(v: Option<&Value>) -> Result<Vec<String>, ConfigError> {
    const KEY: &str = "cluster.etcd_endpoints";
    let list = match v {
        None => return Err(ConfigError::new(KEY, "required: the etcd client URLs")),
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(_) => return Err(ConfigError::new(KEY, "expected a non-empty list of URLs")),
    };
    let mut out = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let at = format!("{KEY}[{i}]");
        let s = e
            .as_str()
            .ok_or_else(|| ConfigError::new(&at, "expected a URL string"))?
            .trim();
        let rest = s
            .strip_prefix("https://")
            .or_else(|| s.strip_prefix("http://"))
            .ok_or_else(|| {
                ConfigError::new(
                    &at,
                    format!("{s:?} is not http://host:port or https://host:port"),
                )
            })?;
        let port = rest.rsplit_once(':').map(|(_, p)| p);
        if rest.contains('/') || !port.is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0)) {
            return Err(ConfigError::new(
                &at,
                format!("{s:?} is not scheme://host:port (e.g. https://10.0.0.5:2379)"),
            ));
        }
        out.push(s.to_owned());
    }
    let https = out[0].starts_with("https://");
    if out.iter().any(|e| e.starts_with("https://") != https) {
        return Err(ConfigError::new(
            KEY,
            "mixes http:// and https:// endpoints",
        ));
    }
    Ok(out)
}

fn prefix(s: &str) -> Result<String, ConfigError> {
    const KEY: &str = "cluster.etcd_prefix";
    let p = s.trim_end_matches('/');
    if !p.starts_with('/') || p.len() < 2 {
        return Err(ConfigError::new(
            KEY,
            format!("{s:?} must start with / and name a path"),
        ));
    }
    if !p.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            KEY,
            format!("{s:?} must be printable ASCII without spaces"),
        ));
    }
    Ok(p.to_owned())
}

fn duration(t: &Table, key: &str) -> Result<Option<Duration>, ConfigError> {
    let at = format!("cluster.{key}");
    match t.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => humantime::parse_duration(s.trim())
            .map(Some)
            .map_err(|e| ConfigError::new(at, format!("{s:?}: {e} (e.g. \"2s\", \"500ms\")"))),
        Some(_) => Err(ConfigError::new(at, "expected a duration like \"2s\"")),
    }
}

/// An RFC 1123 label: Kubernetes namespace names and class names.
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Everything of the cluster budget in one policy document: `[cluster]` and every budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetPolicy {
    /// `None` without a `[cluster]` table (then there are no budgets).
    pub cluster: Option<ClusterConfig>,
    /// Sorted by key.
    pub budgets: Vec<Budget>,
}

impl BudgetPolicy {
    /// Parses a whole `shaper.toml`, reading only the cluster budget's keys.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let doc: Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::new("shaper.toml", e.message()))?;
        Self::from_toml(&doc)
    }

    /// Reads `[cluster]` and the budget keys of `[internet]`, `[classes.<name>]`,
    /// `[namespaces.<ns>.internet]` and `[namespaces.<ns>.classes.<name>]`. A budget needs
    /// `[cluster]`; a namespace's budget of a class needs that class.
    pub fn from_toml(doc: &Table) -> Result<Self, ConfigError> {
        let mut budgets = BTreeMap::new();
        let mut add = |ns: Option<&str>, class: &str, rates: ClusterRates| {
            for d in Direction::ALL {
                if let Some(rate) = rates.get(d) {
                    budgets.insert(BudgetKey::new(ns, class, d), rate);
                }
            }
        };
        if let Some(t) = sub(doc, "internet", "internet")? {
            add(None, INTERNET, ClusterRates::from_table(t, "internet")?);
        }
        let classes = sub(doc, "classes", "classes")?;
        for (name, t) in classes.into_iter().flatten() {
            let at = format!("classes.{name}");
            let t = t
                .as_table()
                .ok_or_else(|| ConfigError::new(&at, "expected a table"))?;
            if !is_label(name) || name == INTERNET {
                return Err(ConfigError::new(
                    &at,
                    "a class name is a lowercase RFC 1123 label other than \"internet\"",
                ));
            }
            add(None, name, ClusterRates::from_table(t, &at)?);
        }
        let has_class = |c: &str| classes.is_some_and(|t| t.contains_key(c));
        for (ns, t) in sub(doc, "namespaces", "namespaces")?.into_iter().flatten() {
            let at = format!("namespaces.{ns}");
            let Some(t) = t.as_table() else { continue };
            if let Some(i) = sub(t, "internet", &format!("{at}.internet"))? {
                let rates = ClusterRates::from_table(i, &format!("{at}.internet"))?;
                if !rates.is_empty() && !is_label(ns) {
                    return Err(ConfigError::new(&at, "not a Kubernetes namespace name"));
                }
                add(Some(ns), INTERNET, rates);
            }
            for (class, c) in sub(t, "classes", &format!("{at}.classes"))?
                .into_iter()
                .flatten()
            {
                let cat = format!("{at}.classes.{class}");
                let Some(c) = c.as_table() else { continue };
                let rates = ClusterRates::from_table(c, &cat)?;
                if rates.is_empty() {
                    continue;
                }
                if !is_label(ns) {
                    return Err(ConfigError::new(&at, "not a Kubernetes namespace name"));
                }
                if !has_class(class) {
                    return Err(ConfigError::new(
                        &cat,
                        format!("a budget for class {class:?}, which has no [classes.{class}]"),
                    ));
                }
                add(Some(ns), class, rates);
            }
        }
        let cluster = sub(doc, "cluster", "cluster")?
            .map(ClusterConfig::from_table)
            .transpose()?;
        if cluster.is_none() {
            if let Some(k) = budgets.keys().next() {
                return Err(ConfigError::new(
                    k.id(),
                    "a cluster budget needs [cluster] with etcd_endpoints",
                ));
            }
        }
        Ok(Self {
            cluster,
            budgets: budgets
                .into_iter()
                .map(|(key, rate)| Budget { key, rate })
                .collect(),
        })
    }
}

impl BudgetPolicy {
    /// Each budget's static split over `[cluster] fallback_nodes`: what a node applies before
    /// its engine has derived a share (empty without `[cluster]`).
    pub fn static_caps(&self) -> BTreeMap<BudgetKey, u64> {
        let Some(c) = &self.cluster else {
            return BTreeMap::new();
        };
        self.budgets
            .iter()
            .map(|b| {
                (
                    b.key.clone(),
                    crate::share::static_share(b.rate, c.fallback_nodes),
                )
            })
            .collect()
    }
}

/// `t[key]` as a table, if present.
fn sub<'a>(t: &'a Table, key: &str, at: &str) -> Result<Option<&'a Table>, ConfigError> {
    match t.get(key) {
        None => Ok(None),
        Some(Value::Table(s)) => Ok(Some(s)),
        Some(_) => Err(ConfigError::new(at, "expected a table")),
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
