//! Node policy: `/etc/aliasnet/shaper.toml`.
//!
//! ```toml
//! # Destinations that are "internal" (VNet, pod and service ranges), IPv4 or IPv6. Everything
//! # else is internet.
//! internal_cidrs = ["10.0.0.0/8", "172.16.0.0/12", "fd00::/8"]
//! # Destinations that are dropped (other clusters, ...). Most specific prefix of the
//! # address's family wins across both lists; the same prefix in both is blocked.
//! blocked_cidrs = ["10.99.0.0/16", "fd00:99::/32"]
//! # Adds the cloud metadata endpoints (CLOUD_METADATA) to blocked_cidrs (default true).
//! block_cloud_metadata = true
//! # Default internet-egress limit per pod (bit/s: integer or quantity like "100M"; omit or
//! # "unlimited" for none). A pod's aliasnet.io/internet-egress-bandwidth annotation overrides it.
//! pod_internet_egress_rate = "100M"
//! # Cap on all pods' internet egress together, enforced on the uplink (omit for none).
//! node_internet_egress_cap = "1G"
//! # Uplink for the node cap (default: the interface of the IPv4 default route, else the IPv6 one).
//! uplink = "eth0"
//!
//! [namespaces.research]
//! internet_egress_rate = "1G"      # or "unlimited"
//! ```

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use aliasnet_ebpf::{
    abi,
    limits::{check_rate, parse_quantity},
    NodePolicy,
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

/// An IPv4 or IPv6 prefix with no host bits set; the messages name what is wrong with it.
fn parse_cidr(s: &str) -> Result<IpNet, String> {
    let (a, l) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not a CIDR like 10.0.0.0/8 or fd00::/8"))?;
    let addr: IpAddr = a
        .parse()
        .map_err(|_| format!("{s:?}: {a:?} is not an IPv4 or IPv6 address"))?;
    let len: u8 = l
        .parse()
        .map_err(|_| format!("{s:?}: {l:?} is not a prefix length"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let net =
        IpNet::new(addr, len).map_err(|_| format!("{s:?}: prefix length {len} is above {max}"))?;
    if net.network() != addr {
        return Err(format!(
            "{s:?}: {addr}/{len} has host bits set (did you mean {}?)",
            net.trunc()
        ));
    }
    Ok(net)
}

/// The validated node policy: the file's CIDR lists as written, and what the datapath
/// applies ([`NodePolicy`], prefixes with their class).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub internal_cidrs: Vec<IpNet>,
    /// As configured, without the cloud metadata defaults.
    pub blocked_cidrs: Vec<IpNet>,
    pub block_cloud_metadata: bool,
    /// Rates, uplink and namespaces as configured, and every prefix with its class.
    pub datapath: NodePolicy,
}

impl Default for Policy {
    /// No internal ranges (everything is internet), metadata blocked, no limits.
    fn default() -> Self {
        Self::new(Vec::new(), Vec::new(), true, NodePolicy::default())
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

#[derive(Deserialize)]
#[serde(untagged)]
enum RawRate {
    Int(u64),
    Str(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNamespace {
    internet_egress_rate: RawRate,
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
    pod_internet_egress_rate: Option<RawRate>,
    node_internet_egress_cap: Option<RawRate>,
    uplink: Option<String>,
    #[serde(default)]
    namespaces: BTreeMap<String, RawNamespace>,
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

fn cidrs(field: &str, raw: &[String]) -> Result<Vec<IpNet>, String> {
    raw.iter()
        .enumerate()
        .map(|(i, s)| parse_cidr(s.trim()).map_err(|e| format!("{field}[{i}]: {e}")))
        .collect()
}

/// A Kubernetes namespace name: an RFC 1123 label.
fn valid_namespace(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

impl Policy {
    /// The policy of these lists and settings; `datapath.prefixes` is derived here.
    fn new(
        internal_cidrs: Vec<IpNet>,
        blocked_cidrs: Vec<IpNet>,
        block_cloud_metadata: bool,
        datapath: NodePolicy,
    ) -> Self {
        let mut p = Self {
            internal_cidrs,
            blocked_cidrs,
            block_cloud_metadata,
            datapath,
        };
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
        let mut namespaces = BTreeMap::new();
        for (name, ns) in &raw.namespaces {
            if !valid_namespace(name) {
                return Err(format!(
                    "namespaces.{name}: not a valid Kubernetes namespace name"
                ));
            }
            let r = rate(
                &format!("namespaces.{name}.internet_egress_rate"),
                &ns.internet_egress_rate,
            )?;
            namespaces.insert(name.clone(), r);
        }
        if namespaces.len() > abi::MAX_NAMESPACES as usize {
            return Err(format!(
                "namespaces: {} overrides, at most {} are supported",
                namespaces.len(),
                abi::MAX_NAMESPACES
            ));
        }
        if let Some(u) = &raw.uplink {
            if u.is_empty() || u.len() > 15 || u.contains(['/', ' ', '\0']) {
                return Err(format!("uplink: {u:?} is not an interface name"));
            }
        }
        let datapath = NodePolicy {
            prefixes: Vec::new(),
            pod_internet_egress_rate: raw
                .pod_internet_egress_rate
                .as_ref()
                .map(|r| rate("pod_internet_egress_rate", r))
                .transpose()?
                .flatten(),
            node_internet_egress_cap: raw
                .node_internet_egress_cap
                .as_ref()
                .map(|r| rate("node_internet_egress_cap", r))
                .transpose()?
                .flatten(),
            uplink: raw.uplink,
            namespaces,
        };
        let policy = Self::new(
            cidrs("internal_cidrs", &raw.internal_cidrs)?,
            cidrs("blocked_cidrs", &raw.blocked_cidrs)?,
            raw.block_cloud_metadata,
            datapath,
        );
        let n = policy.datapath.prefixes.len();
        if n > abi::MAX_PREFIXES as usize {
            return Err(format!(
                "{n} distinct prefixes, at most {} are supported",
                abi::MAX_PREFIXES
            ));
        }
        Ok(policy)
    }

    /// The classifier's view: every prefix with its class. The most specific prefix of the
    /// address's family wins at lookup time; a prefix listed as both internal and blocked is
    /// blocked.
    pub fn prefixes(&self) -> BTreeMap<IpNet, u32> {
        let mut out = BTreeMap::new();
        for c in &self.internal_cidrs {
            out.insert(*c, abi::CLASS_INTERNAL);
        }
        let metadata = if self.block_cloud_metadata {
            &CLOUD_METADATA[..]
        } else {
            &[]
        };
        let metadata = metadata.iter().map(|a| IpNet::from(*a));
        for c in self.blocked_cidrs.iter().copied().chain(metadata) {
            out.insert(c, abi::CLASS_BLOCKED);
        }
        out
    }

    /// Reference classification of an address, as the eBPF programs do it.
    pub fn classify(&self, ip: impl Into<IpAddr>) -> u32 {
        let ip = ip.into();
        self.prefixes()
            .iter()
            .filter(|(c, _)| c.contains(&ip))
            .max_by_key(|(c, _)| c.prefix_len())
            .map_or(abi::CLASS_INTERNET, |(_, class)| *class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
        internal_cidrs = ["10.0.0.0/8", "172.16.0.0/12", "10.99.7.0/24"]
        blocked_cidrs = ["10.99.0.0/16", "172.16.0.0/12"]
        pod_internet_egress_rate = "100M"
        node_internet_egress_cap = 1000000000
        uplink = "eth0"

        [namespaces.research]
        internet_egress_rate = "1G"

        [namespaces.batch]
        internet_egress_rate = "unlimited"
    "#;

    #[test]
    fn parses_everything() {
        let p = Policy::parse(FULL).unwrap();
        assert_eq!(p.internal_cidrs.len(), 3);
        let d = &p.datapath;
        assert_eq!(d.pod_internet_egress_rate, Some(100_000_000));
        assert_eq!(d.node_internet_egress_cap, Some(1_000_000_000));
        assert_eq!(d.uplink.as_deref(), Some("eth0"));
        assert_eq!(d.internet_rate_for("research"), Some(1_000_000_000));
        assert_eq!(d.internet_rate_for("batch"), None);
        assert_eq!(d.internet_rate_for("default"), Some(100_000_000));
        // Four distinct prefixes (one is in both lists) and the four metadata endpoints.
        assert_eq!(d.prefixes.len(), 8);
    }

    #[test]
    fn most_specific_wins_and_ties_are_blocked() {
        let p = Policy::parse(FULL).unwrap();
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(p.classify(ip("10.1.2.3")), abi::CLASS_INTERNAL);
        assert_eq!(p.classify(ip("10.99.1.1")), abi::CLASS_BLOCKED);
        assert_eq!(p.classify(ip("10.99.7.9")), abi::CLASS_INTERNAL);
        // Listed in both: blocked.
        assert_eq!(p.classify(ip("172.16.5.5")), abi::CLASS_BLOCKED);
        assert_eq!(p.classify(ip("169.254.169.254")), abi::CLASS_BLOCKED);
        assert_eq!(p.classify(ip("168.63.129.16")), abi::CLASS_BLOCKED);
        assert_eq!(p.classify(ip("203.0.113.1")), abi::CLASS_INTERNET);
    }

    #[test]
    fn ipv6_cidrs_in_every_list_classify_by_their_family() {
        let p = Policy::parse(
            r#"
            internal_cidrs = ["10.0.0.0/8", "fd00::/8", "2001:db8:ff::/48"]
            blocked_cidrs = ["fd00:99::/32", "2001:db8:ff:1::/64"]
            "#,
        )
        .unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(p.classify(ip("fd00:240:1::5")), abi::CLASS_INTERNAL);
        assert_eq!(p.classify(ip("fd00:99::1")), abi::CLASS_BLOCKED);
        assert_eq!(p.classify(ip("2001:db8:ff:2::1")), abi::CLASS_INTERNAL);
        // Longest prefix wins, within IPv6 as within IPv4.
        assert_eq!(p.classify(ip("2001:db8:ff:1::9")), abi::CLASS_BLOCKED);
        assert_eq!(p.classify(ip("2001:db8::10")), abi::CLASS_INTERNET);
        // The families do not mix: ::ffff:10.0.0.1 is an IPv6 address outside fd00::/8.
        assert_eq!(p.classify(ip("::ffff:10.0.0.1")), abi::CLASS_INTERNET);
        assert_eq!(p.classify(ip("fd00:ec2::254")), abi::CLASS_BLOCKED);
        assert_eq!(p.classify(ip("fd20:ce::254")), abi::CLASS_BLOCKED);
        let v6 = p
            .datapath
            .prefixes
            .iter()
            .filter(|(n, _)| matches!(n, IpNet::V6(_)));
        // Four listed and the two IPv6 metadata endpoints.
        assert_eq!(v6.count(), 6);
    }

    #[test]
    fn metadata_blocking_can_be_disabled() {
        let p = Policy::parse("block_cloud_metadata = false").unwrap();
        assert!(p.prefixes().is_empty());
        let p = Policy::parse("").unwrap();
        assert_eq!(p, Policy::default());
        assert_eq!(p.prefixes().len(), 4);
    }

    #[test]
    fn rejects_bad_input_with_the_key_named() {
        let cases = [
            (r#"internal_cidrs = ["10.0.0.1/8"]"#, "internal_cidrs[0]"),
            (r#"internal_cidrs = ["10.0.0.1/8"]"#, "host bits"),
            (
                r#"blocked_cidrs = ["1.2.3.0/24", "nonsense"]"#,
                "blocked_cidrs[1]",
            ),
            (r#"blocked_cidrs = ["fd00::1/8"]"#, "host bits"),
            (r#"internal_cidrs = ["10.0.0.0/33"]"#, "above 32"),
            (r#"internal_cidrs = ["fd00::/129"]"#, "above 128"),
            (
                r#"internal_cidrs = ["fd00::g/16"]"#,
                "not an IPv4 or IPv6 address",
            ),
            (
                r#"pod_internet_egress_rate = "fast""#,
                "pod_internet_egress_rate",
            ),
            (r#"pod_internet_egress_rate = 0"#, "zero"),
            (r#"node_internet_egress_cap = "10""#, "below the minimum"),
            ("pod_internet_egress = \"1M\"", "unknown field"),
            (
                "[namespaces.Bad_Name]\ninternet_egress_rate = \"1M\"",
                "namespaces.Bad_Name",
            ),
            ("[namespaces.ok]\nrate = \"1M\"", "unknown field"),
            ("uplink = \"a/b\"", "uplink"),
            ("internal_cidrs = [", "expected"),
        ];
        for (text, needle) in cases {
            let e = Policy::parse(text).expect_err(text);
            assert!(e.contains(needle), "{text:?}: error {e:?} lacks {needle:?}");
        }
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shaper.toml");
        std::fs::write(&path, "internal_cidrs = [\"x\"]").unwrap();
        let e = Policy::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("shaper.toml") && e.contains("internal_cidrs[0]"),
            "{e}"
        );
        let e = Policy::load(&dir.path().join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.toml"), "{e}");
    }
}
