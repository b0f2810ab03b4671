//! Node policy: `/etc/aliasnet/shaper.toml` (reference: `docs/config/shaperd.md`).
//!
//! ```toml
//! internal_cidrs = ["10.0.0.0/8", "fd00::/8"]      # internal: never shaped by internet limits
//! blocked_cidrs = ["10.99.0.0/16"]                 # dropped
//!
//! [internet]                     # all internet traffic, named classes included
//! pod_ingress_rate = "1G"        # each pod's downloads
//! namespace_ingress_rate = "5G"  # all pods of one namespace on this node together
//! node_ingress_rate = "10G"      # all pods of this node together
//!
//! [classes.mirrors]              # a named destination class: a part of the internet
//! cidrs = ["203.0.113.0/24", "2001:db8:1::/48"]
//! pod_ingress_rate = "500M"      # on top of the internet limits
//!
//! [namespaces.research.internet] # one namespace's pod and namespace limits
//! namespace_ingress_rate = "2G"
//! [namespaces.research.classes.mirrors]
//! namespace_ingress_rate = "500M"
//! ```
//!
//! Cluster budgets (`cluster_ingress_rate`, `cluster_egress_rate` in the same tables, and
//! `[cluster]`) are parsed by [`aliasnet_budget::BudgetPolicy`] into [`Policy::budgets`].
//!
//! The keys of the first release stay as aliases: `pod_internet_egress_rate` is
//! `[internet] pod_egress_rate`, `node_internet_egress_cap` is `[internet] node_egress_rate`,
//! `[namespaces.<ns>] internet_egress_rate` is `[namespaces.<ns>.internet] pod_egress_rate`;
//! a file that sets one limit under both spellings is refused.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use aliasnet_budget::BudgetPolicy;
use aliasnet_ebpf::{
    abi::{self, Direction},
    limits::{check_rate, parse_quantity},
    Dest, LevelLimits, NamespaceLimits, NodePolicy, INTERNET,
};
use ipnet::IpNet;
use serde::Deserialize;

/// Default location of the node policy.
pub const DEFAULT_POLICY_PATH: &str = "/etc/aliasnet/shaper.toml";

/// Cloud metadata endpoints blocked unless `block_cloud_metadata = false`: the instance
/// metadata service of AWS, GCP and Azure (169.254.169.254), Azure's WireServer, AWS's IMDS
/// over IPv6 (`fd00:ec2::254`, on Nitro instances with the IPv6 endpoint enabled) and GCP's
/// metadata server of IPv6-only instances (`fd20:ce::254`). Azure publishes no IPv6
/// endpoint for IMDS or the WireServer.
pub const CLOUD_METADATA: [IpAddr; 4] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V6(Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254)),
];

/// Class names the counters and metrics use for traffic that is in no named class.
const RESERVED_CLASSES: [&str; 4] = [INTERNET, "internal", "blocked", "other"];

/// The validated node policy: the file's CIDR lists as written, and what the datapath
/// applies ([`NodePolicy`]: prefixes with where they put an address, the limits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub internal_cidrs: Vec<IpNet>,
    /// As configured, without the cloud metadata defaults.
    pub blocked_cidrs: Vec<IpNet>,
    pub block_cloud_metadata: bool,
    /// Each named class's prefixes.
    pub classes: BTreeMap<String, Vec<IpNet>>,
    /// Limits, uplink and every prefix with where it puts an address.
    pub datapath: NodePolicy,
    /// `[cluster]` and the cluster budgets: shares of them cap `datapath`'s node and
    /// namespace limits while shaperd runs.
    pub budgets: BudgetPolicy,
}

impl Default for Policy {
    /// No internal ranges (everything is internet), metadata blocked, no limits.
    fn default() -> Self {
        Self::new(
            Vec::new(),
            Vec::new(),
            true,
            BTreeMap::new(),
            NodePolicy::default(),
        )
    }
}

impl AsRef<NodePolicy> for Policy {
    fn as_ref(&self) -> &NodePolicy {
        &self.datapath
    }
}

/// A policy that cannot be applied. The message names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("read policy {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("policy {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum RawRate {
    Int(u64),
    Str(String),
}

/// The limits of a class (`[internet]`, `[classes.<name>]`) at every level.
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    pod_ingress_rate: Option<RawRate>,
    pod_egress_rate: Option<RawRate>,
    namespace_ingress_rate: Option<RawRate>,
    namespace_egress_rate: Option<RawRate>,
    node_ingress_rate: Option<RawRate>,
    node_egress_rate: Option<RawRate>,
    // The cluster budget's keys: accepted here, read by `BudgetPolicy::from_toml`.
    #[serde(rename = "cluster_ingress_rate")]
    _cluster_ingress_rate: Option<toml::Value>,
    #[serde(rename = "cluster_egress_rate")]
    _cluster_egress_rate: Option<toml::Value>,
}

/// A named class: its prefixes and [`RawLimits`]' keys. Spelled out rather than flattened:
/// serde then names the accepted keys when it refuses an unknown one.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawClass {
    #[serde(default)]
    cidrs: Vec<String>,
    pod_ingress_rate: Option<RawRate>,
    pod_egress_rate: Option<RawRate>,
    namespace_ingress_rate: Option<RawRate>,
    namespace_egress_rate: Option<RawRate>,
    node_ingress_rate: Option<RawRate>,
    node_egress_rate: Option<RawRate>,
    #[serde(rename = "cluster_ingress_rate")]
    _cluster_ingress_rate: Option<toml::Value>,
    #[serde(rename = "cluster_egress_rate")]
    _cluster_egress_rate: Option<toml::Value>,
}

impl RawClass {
    fn limits(&self) -> RawLimits {
        RawLimits {
            pod_ingress_rate: self.pod_ingress_rate.clone(),
            pod_egress_rate: self.pod_egress_rate.clone(),
            namespace_ingress_rate: self.namespace_ingress_rate.clone(),
            namespace_egress_rate: self.namespace_egress_rate.clone(),
            node_ingress_rate: self.node_ingress_rate.clone(),
            node_egress_rate: self.node_egress_rate.clone(),
            ..RawLimits::default()
        }
    }
}

/// A namespace's override of a class's pod and namespace limits.
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawNsLimits {
    pod_ingress_rate: Option<RawRate>,
    pod_egress_rate: Option<RawRate>,
    namespace_ingress_rate: Option<RawRate>,
    namespace_egress_rate: Option<RawRate>,
    #[serde(rename = "cluster_ingress_rate")]
    _cluster_ingress_rate: Option<toml::Value>,
    #[serde(rename = "cluster_egress_rate")]
    _cluster_egress_rate: Option<toml::Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNamespace {
    /// Alias of `internet.pod_egress_rate`.
    internet_egress_rate: Option<RawRate>,
    internet: Option<RawNsLimits>,
    #[serde(default)]
    classes: BTreeMap<String, RawNsLimits>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    internal_cidrs: Vec<String>,
    #[serde(default)]
    blocked_cidrs: Vec<String>,
    #[serde(default = "default_true")]
    block_cloud_metadata: bool,
    /// Alias of `internet.pod_egress_rate`.
    pod_internet_egress_rate: Option<RawRate>,
    /// Alias of `internet.node_egress_rate`.
    node_internet_egress_cap: Option<RawRate>,
    uplink: Option<String>,
    internet: Option<RawLimits>,
    #[serde(default)]
    classes: BTreeMap<String, RawClass>,
    #[serde(default)]
    namespaces: BTreeMap<String, RawNamespace>,
    /// Read by `BudgetPolicy::from_toml`.
    #[serde(rename = "cluster")]
    _cluster: Option<toml::Table>,
}

fn default_true() -> bool {
    true
}

/// `Some(rate)` for a rate, `None` for "unlimited".
fn rate(field: &str, raw: &RawRate) -> Result<Option<u64>, String> {
    let v = match raw {
        RawRate::Int(n) => *n,
        RawRate::Str(s) if s.trim().eq_ignore_ascii_case("unlimited") => return Ok(None),
        RawRate::Str(s) => parse_quantity(s).map_err(|e| format!("{field}: {e}"))?,
    };
    check_rate(field, Some(v)).map_err(|e| e.to_string())?;
    Ok(Some(v))
}

/// A Kubernetes namespace name, or a class name: an RFC 1123 label.
fn valid_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// One limit key: its level (pod, namespace, node) and direction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Pod,
    Namespace,
    Node,
}

/// `(key, level, direction, value)` of every limit set in `l`.
fn limit_keys(l: &RawLimits) -> Vec<(&'static str, Level, Direction, &RawRate)> {
    [
        (
            "pod_ingress_rate",
            Level::Pod,
            Direction::Ingress,
            &l.pod_ingress_rate,
        ),
        (
            "pod_egress_rate",
            Level::Pod,
            Direction::Egress,
            &l.pod_egress_rate,
        ),
        (
            "namespace_ingress_rate",
            Level::Namespace,
            Direction::Ingress,
            &l.namespace_ingress_rate,
        ),
        (
            "namespace_egress_rate",
            Level::Namespace,
            Direction::Egress,
            &l.namespace_egress_rate,
        ),
        (
            "node_ingress_rate",
            Level::Node,
            Direction::Ingress,
            &l.node_ingress_rate,
        ),
        (
            "node_egress_rate",
            Level::Node,
            Direction::Egress,
            &l.node_egress_rate,
        ),
    ]
    .into_iter()
    .filter_map(|(k, lv, d, v)| v.as_ref().map(|v| (k, lv, d, v)))
    .collect()
}

impl RawNsLimits {
    fn as_limits(&self) -> RawLimits {
        RawLimits {
            pod_ingress_rate: self.pod_ingress_rate.clone(),
            pod_egress_rate: self.pod_egress_rate.clone(),
            namespace_ingress_rate: self.namespace_ingress_rate.clone(),
            namespace_egress_rate: self.namespace_egress_rate.clone(),
            node_ingress_rate: None,
            node_egress_rate: None,
            ..RawLimits::default()
        }
    }
}

/// Applies the limits of `raw` for `class` to the levels; `prefix` names the table in
/// errors. "unlimited" removes a limit (an override lifting a default).
fn apply_limits(
    prefix: &str,
    class: &str,
    raw: &RawLimits,
    ns: &mut NamespaceLimits,
    node: Option<&mut LevelLimits>,
) -> Result<(), String> {
    let mut node = node;
    for (key, level, dir, v) in limit_keys(raw) {
        let r = rate(&format!("{prefix}.{key}"), v)?;
        match level {
            Level::Pod => ns.pod.set(dir, class, r),
            Level::Namespace => ns.namespace.set(dir, class, r),
            Level::Node => match node.as_deref_mut() {
                Some(n) => n.set(dir, class, r),
                None => return Err(format!("{prefix}.{key}: not a namespace's limit")),
            },
        }
    }
    Ok(())
}

/// Refuses a limit set under its old key and its new one.
fn alias(old: &str, old_set: bool, new: &str, new_set: bool) -> Result<(), String> {
    if old_set && new_set {
        return Err(format!(
            "{old} and {new} set the same limit: keep one ({old} is the older spelling)"
        ));
    }
    Ok(())
}

impl Policy {
    /// The policy of these lists and settings; `datapath.prefixes` and `datapath.classes`
    /// are derived here.
    fn new(
        internal_cidrs: Vec<IpNet>,
        blocked_cidrs: Vec<IpNet>,
        block_cloud_metadata: bool,
        classes: BTreeMap<String, Vec<IpNet>>,
        datapath: NodePolicy,
    ) -> Self {
        let mut p = Self {
            internal_cidrs,
            blocked_cidrs,
            block_cloud_metadata,
            classes,
            datapath,
            budgets: BudgetPolicy::default(),
        };
        p.datapath.classes = p.classes.keys().cloned().collect();
        p.datapath.prefixes = p.prefixes().into_iter().collect();
        p
    }

    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|reason| PolicyError::Invalid {
            path: path.to_owned(),
            reason,
        })
    }

    /// Parses and validates policy text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let raw: RawPolicy = toml::from_str(text).map_err(|e| e.to_string().trim().to_owned())?;
        if let Some(u) = &raw.uplink {
            if u.is_empty() || u.len() > 15 || u.contains(['/', ' ', '\0']) {
                return Err(format!("uplink: {u:?} is not an interface name"));
            }
        }

        // Named classes and their prefixes.
        if raw.classes.len() > abi::MAX_NAMED {
            return Err(format!(
                "classes: {} named classes, at most {} are supported",
                raw.classes.len(),
                abi::MAX_NAMED
            ));
        }
        let mut classes = BTreeMap::new();
        for (name, c) in &raw.classes {
            if !valid_label(name) || RESERVED_CLASSES.contains(&name.as_str()) {
                return Err(format!(
                    "classes.{name}: a class name is a lowercase RFC 1123 label and not one \
                     of {RESERVED_CLASSES:?}"
                ));
            }
            classes.insert(
                name.clone(),
                cidrs(&format!("classes.{name}.cidrs"), &c.cidrs)?,
            );
        }

        // Limits: the defaults of every namespace, the node's.
        let internet = raw.internet.clone().unwrap_or_default();
        alias(
            "pod_internet_egress_rate",
            raw.pod_internet_egress_rate.is_some(),
            "internet.pod_egress_rate",
            internet.pod_egress_rate.is_some(),
        )?;
        alias(
            "node_internet_egress_cap",
            raw.node_internet_egress_cap.is_some(),
            "internet.node_egress_rate",
            internet.node_egress_rate.is_some(),
        )?;
        let mut defaults = NamespaceLimits::default();
        let mut node = LevelLimits::default();
        if let Some(r) = &raw.pod_internet_egress_rate {
            let r = rate("pod_internet_egress_rate", r)?;
            defaults.pod.set(Direction::Egress, INTERNET, r);
        }
        if let Some(r) = &raw.node_internet_egress_cap {
            let r = rate("node_internet_egress_cap", r)?;
            node.set(Direction::Egress, INTERNET, r);
        }
        apply_limits(
            "internet",
            INTERNET,
            &internet,
            &mut defaults,
            Some(&mut node),
        )?;
        for (name, c) in &raw.classes {
            apply_limits(
                &format!("classes.{name}"),
                name,
                &c.limits(),
                &mut defaults,
                Some(&mut node),
            )?;
        }

        // Namespaces: the defaults with their overrides.
        if raw.namespaces.len() > abi::MAX_NAMESPACES as usize {
            return Err(format!(
                "namespaces: {} namespaces, at most {} are supported",
                raw.namespaces.len(),
                abi::MAX_NAMESPACES
            ));
        }
        let mut namespaces = BTreeMap::new();
        for (name, ns) in &raw.namespaces {
            if !valid_label(name) {
                return Err(format!(
                    "namespaces.{name}: not a valid Kubernetes namespace name"
                ));
            }
            let mut limits = defaults.clone();
            let over = ns.internet.clone().unwrap_or_default();
            alias(
                &format!("namespaces.{name}.internet_egress_rate"),
                ns.internet_egress_rate.is_some(),
                &format!("namespaces.{name}.internet.pod_egress_rate"),
                over.pod_egress_rate.is_some(),
            )?;
            if let Some(r) = &ns.internet_egress_rate {
                let r = rate(&format!("namespaces.{name}.internet_egress_rate"), r)?;
                limits.pod.set(Direction::Egress, INTERNET, r);
            }
            apply_limits(
                &format!("namespaces.{name}.internet"),
                INTERNET,
                &over.as_limits(),
                &mut limits,
                None,
            )?;
            for (class, over) in &ns.classes {
                if !classes.contains_key(class) {
                    return Err(format!(
                        "namespaces.{name}.classes.{class}: no class {class:?} is defined \
                         ([classes.{class}])"
                    ));
                }
                apply_limits(
                    &format!("namespaces.{name}.classes.{class}"),
                    class,
                    &over.as_limits(),
                    &mut limits,
                    None,
                )?;
            }
            namespaces.insert(name.clone(), limits);
        }

        let datapath = NodePolicy {
            prefixes: Vec::new(),
            classes: Vec::new(),
            defaults,
            namespaces,
            node,
            uplink: raw.uplink,
        };
        let mut policy = Self::new(
            cidrs("internal_cidrs", &raw.internal_cidrs)?,
            cidrs("blocked_cidrs", &raw.blocked_cidrs)?,
            raw.block_cloud_metadata,
            classes,
            datapath,
        );
        policy.check_prefixes()?;
        let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
        policy.budgets = BudgetPolicy::from_toml(&doc).map_err(|e| e.to_string())?;
        Ok(policy)
    }

    /// A prefix may be in one list only (in blocked_cidrs and another list it is blocked,
    /// which is the safe reading of such a file), and there are at most
    /// [`abi::MAX_PREFIXES`] of them.
    fn check_prefixes(&self) -> Result<(), String> {
        let mut seen: BTreeMap<IpNet, String> = BTreeMap::new();
        let lists = self
            .internal_cidrs
            .iter()
            .enumerate()
            .map(|(i, c)| (c, format!("internal_cidrs[{i}]")))
            .chain(self.classes.iter().flat_map(|(name, cs)| {
                cs.iter()
                    .enumerate()
                    .map(move |(i, c)| (c, format!("classes.{name}.cidrs[{i}]")))
            }));
        for (cidr, key) in lists {
            if let Some(first) = seen.get(cidr) {
                if first != &key {
                    return Err(format!("{key}: {cidr} is also in {first}"));
                }
            }
            seen.insert(*cidr, key);
        }
        let n = self.datapath.prefixes.len();
        if n > abi::MAX_PREFIXES as usize {
            return Err(format!(
                "internal_cidrs, blocked_cidrs and the classes' cidrs: {n} distinct prefixes, \
                 at most {} are supported",
                abi::MAX_PREFIXES
            ));
        }
        Ok(())
    }

    /// The classifier's view: every prefix with where it puts an address. The most specific
    /// prefix of the address's family wins at lookup time; a prefix listed as blocked is
    /// blocked whatever else lists it.
    pub fn prefixes(&self) -> BTreeMap<IpNet, Dest> {
        let mut out = BTreeMap::new();
        for c in &self.internal_cidrs {
            out.insert(*c, Dest::Internal);
        }
        for (name, cs) in &self.classes {
            for c in cs {
                out.insert(*c, Dest::Named(name.clone()));
            }
        }
        let metadata = if self.block_cloud_metadata {
            &CLOUD_METADATA[..]
        } else {
            &[]
        };
        let metadata = metadata.iter().map(|a| IpNet::from(*a));
        for c in self.blocked_cidrs.iter().copied().chain(metadata) {
            out.insert(c, Dest::Blocked);
        }
        out
    }

    /// Reference classification of an address, as the eBPF programs do it: `None` for plain
    /// internet.
    pub fn classify(&self, ip: impl Into<IpAddr>) -> Option<Dest> {
        let ip = ip.into();
        self.prefixes()
            .into_iter()
            .filter(|(c, _)| c.contains(&ip))
            .max_by_key(|(c, _)| c.prefix_len())
            .map(|(_, d)| d)
    }
}

mod cidr;
use cidr::cidrs;

#[cfg(test)]
mod tests;
