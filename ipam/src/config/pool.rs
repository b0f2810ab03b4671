//! Building pools: sources, allowed keys, ranges minus exclusions, metadata endpoints.

use std::{fmt, net::Ipv4Addr, time::Duration};

use aliasnet_ipam_proto::Family;

use super::{
    addr::{parse_cidr, parse_exclusion, parse_ip, parse_range, subtract, AddrError, IpRange},
    parse::RawPool,
    reserved::reserved_in,
    *,
};

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

/// A validated pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    pub source: PoolSource,
    /// Family of every address of the pool (a pool is single-family).
    pub family: Family,
    /// Usable addresses, all of `family` (exclusions applied): sorted, disjoint,
    /// non-adjacent. Empty for metadata pools.
    pub ranges: Vec<IpRange>,
    /// Number of usable addresses (saturating: a /64 has more than `u64` counts).
    pub size: u64,
    /// Short human description of the configured sources, for messages ("10.240.1.0/24").
    pub description: String,
    /// Exclusions of `family` (already applied to `ranges`; metadata pools apply them to the
    /// addresses they read).
    pub exclude: Vec<IpRange>,
    /// Set for `azure-imds` pools (which have no `ranges`).
    pub imds: Option<ImdsSpec>,
}

impl PoolSpec {
    /// The usable addresses as allocator values ([`crate::lease::Addr`]: an IPv4 address is
    /// its 32-bit value), whichever family the pool serves: sorted, disjoint ranges.
    pub fn address_ranges(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.ranges.iter().map(IpRange::bounds)
    }

    /// Whether an exclusion covers `addr` (an allocator value of either family; metadata pools
    /// apply the exclusions to the addresses they read).
    pub fn is_excluded(&self, addr: u128) -> bool {
        self.exclude.iter().any(|r| r.contains(addr))
    }
}

/// Build one pool; errors name the key.
pub(super) fn build_pool(
    i: usize,
    rp: &RawPool,
    warnings: &mut Vec<String>,
) -> Result<PoolSpec, (String, ConfigProblem)> {
    let name = rp.name.trim();
    if name.is_empty() {
        return Err((format!("pool[{i}].name"), ConfigProblem::Empty));
    }
    if name.len() > 64 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err((
            format!("pool[{i}].name"),
            ConfigProblem::PoolName {
                name: name.to_owned(),
            },
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
                ConfigProblem::UnknownSource {
                    given: other.to_owned(),
                },
            ))
        }
    };
    // Keys that belong to another source are refused rather than ignored.
    let given: [(&str, bool); 9] = [
        ("cidrs", !rp.cidrs.is_empty()),
        ("ranges", !rp.ranges.is_empty()),
        ("ips", !rp.ips.is_empty()),
        ("prefixes", !rp.prefixes.is_empty()),
        ("url", rp.url.is_some()),
        ("refresh_min", rp.refresh_min.is_some()),
        ("refresh_max", rp.refresh_max.is_some()),
        ("timeout", rp.timeout.is_some()),
        ("family", rp.family.is_some()),
    ];
    let allowed: &[&str] = match source {
        PoolSource::Static => &["cidrs", "ranges", "ips"],
        PoolSource::Prefixes => &["prefixes"],
        PoolSource::AzureImds => &["url", "refresh_min", "refresh_max", "timeout", "family"],
    };
    if let Some((k, _)) = given.iter().find(|(k, g)| *g && !allowed.contains(k)) {
        return Err((
            at(k),
            ConfigProblem::NotForSource {
                pool_source: source,
                takes: allowed.join(", "),
            },
        ));
    }
    match source {
        PoolSource::AzureImds => build_metadata(name, rp, warnings),
        PoolSource::Static | PoolSource::Prefixes => build_listed(name, source, rp, warnings),
    }
}

/// The exclusions of a pool of `family` (IPv6 when `ipv6`) that `keep` accepts; the others
/// have no effect and get a warning.
fn exclusions(
    name: &str,
    rp: &RawPool,
    keep: impl Fn(&IpRange) -> bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<IpRange>, (String, ConfigProblem)> {
    let mut excl = Vec::new();
    for (j, s) in rp.exclude.iter().enumerate() {
        let r =
            parse_exclusion(s).map_err(|e| (format!("pool '{name}'.exclude[{j}]"), e.into()))?;
        if keep(&r) {
            excl.push(r);
        } else {
            warnings.push(format!(
                "pool '{name}': exclude[{j}] {s:?} is outside the pool's addresses and has no effect"
            ));
        }
    }
    excl.sort();
    Ok(excl)
}

/// A static or prefixes pool: the addresses it lists, all of one family, minus its exclusions
/// and the reserved ones.
fn build_listed(
    name: &str,
    source: PoolSource,
    rp: &RawPool,
    warnings: &mut Vec<String>,
) -> Result<PoolSpec, (String, ConfigProblem)> {
    let at = |field: &str| format!("pool '{name}'.{field}");
    // Every configured range, remembering where it came from for messages.
    let mut parts: Vec<(IpRange, String)> = Vec::new();
    // Subnet-router anycast addresses (RFC 4291 2.6.1) of IPv6 `cidrs`.
    let mut anycast: Vec<(u128, u128)> = Vec::new();
    type Parse = fn(&str) -> Result<IpRange, AddrError>;
    let lists: [(&str, &Vec<String>, Parse); 4] = [
        ("cidrs", &rp.cidrs, parse_cidr),
        ("ranges", &rp.ranges, parse_range),
        ("ips", &rp.ips, parse_ip),
        ("prefixes", &rp.prefixes, parse_cidr),
    ];
    for (field, list, parse) in lists {
        for (j, s) in list.iter().enumerate() {
            let what = format!("{field}[{j}]");
            let r = parse(s).map_err(|e| (at(&what), e.into()))?;
            let (first, last) = r.bounds();
            // An IPv6 `cidrs` entry is a subnet: its all-zero host address is the
            // subnet-router anycast address, which a router (the kernel, with forwarding on,
            // for a prefix on one of its interfaces) answers itself, so a pod must never hold
            // it. Not for /127 and /128 (RFC 6164; the kernel does not join it there either),
            // nor for delegated `prefixes`, which are routed to the node whole.
            if field == "cidrs" && r.is_ipv6() && last - first > 1 {
                anycast.push((first, first));
            }
            parts.push((r, format!("{what} {s:?}")));
        }
    }
    if parts.is_empty() {
        return Err(match source {
            PoolSource::Prefixes => (at("prefixes"), ConfigProblem::NoBlocks),
            _ => (at("cidrs"), ConfigProblem::NoAddresses),
        });
    }
    let first_of = |v6: bool| parts.iter().find(|(r, _)| r.is_ipv6() == v6);
    if let (Some((_, v4)), Some((_, v6))) = (first_of(false), first_of(true)) {
        return Err((
            at("cidrs"),
            ConfigProblem::MixedFamilies {
                v4: v4.clone(),
                v6: v6.clone(),
            },
        ));
    }
    let ipv6 = parts[0].0.is_ipv6();
    let excl = exclusions(
        name,
        rp,
        |r| parts.iter().any(|(p, _)| p.overlaps(r)),
        warnings,
    )?;
    parts.sort_by_key(|(r, _)| *r);
    for w in parts.windows(2) {
        if w[1].0.overlaps(&w[0].0) {
            return Err((
                at("cidrs"),
                ConfigProblem::Overlap {
                    first: w[0].1.clone(),
                    second: w[1].1.clone(),
                    shared: w[1].0.ip(w[1].0.bounds().0),
                },
            ));
        }
    }
    let listed: Vec<IpRange> = parts.iter().map(|(r, _)| *r).collect();
    let reserved = reserved_in(&listed);
    let mut cut: Vec<(u128, u128)> = excl
        .iter()
        .map(IpRange::bounds)
        .chain(anycast)
        .chain(reserved.iter().map(|(r, _)| r.bounds()))
        .collect();
    let ranges = subtract(&listed, &mut cut);
    if ranges.is_empty() {
        return Err((at("exclude"), empty_pool(&reserved)));
    }
    warn_reserved(name, &reserved, warnings);
    let size = ranges.iter().fold(0u128, |n, r| {
        let (first, last) = r.bounds();
        n.saturating_add(last - first + 1)
    });
    let size = u64::try_from(size).unwrap_or(u64::MAX);
    // An IPv4 pool has a bit per address; an IPv6 one is never enumerated.
    if !ipv6 && size > MAX_TOTAL_ADDRESSES {
        return Err((at("cidrs"), ConfigProblem::PoolTooLarge { size }));
    }
    Ok(PoolSpec {
        name: name.to_owned(),
        source,
        family: if ipv6 { Family::Ipv6 } else { Family::Ipv4 },
        ranges,
        size,
        description: describe(rp),
        exclude: excl,
        imds: None,
    })
}

/// The error of a static or prefixes pool left without addresses by its exclusions and the
/// reserved addresses it listed (named, so the mistake is plain).
fn empty_pool(reserved: &[(IpRange, &str)]) -> ConfigProblem {
    if reserved.is_empty() {
        return ConfigProblem::AllExcluded;
    }
    let named: Vec<String> = reserved
        .iter()
        .map(|(r, why)| format!("{r} is {why}"))
        .collect();
    ConfigProblem::OnlyReserved {
        reserved: named.join("; "),
    }
}

/// One warning per reserved block a pool listed: those addresses are never handed out.
fn warn_reserved(name: &str, reserved: &[(IpRange, &str)], warnings: &mut Vec<String>) {
    for (r, why) in reserved {
        warnings.push(format!(
            "pool '{name}': {r} is {why} and is never handed out"
        ));
    }
}

/// The family an `azure-imds` pool serves: `family`, IPv4 unless set.
fn metadata_family(rp: &RawPool) -> Result<Family, ConfigProblem> {
    match rp.family.as_deref().map(str::trim) {
        None | Some("ipv4") => Ok(Family::Ipv4),
        Some("ipv6") => Ok(Family::Ipv6),
        Some(other) => Err(ConfigProblem::UnknownFamily {
            given: other.to_owned(),
        }),
    }
}

/// An `azure-imds` pool: the interfaces' secondaries of its family (`ipAddress[1..]` of
/// `ipv4` or `ipv6`), learnt at run time.
fn build_metadata(
    name: &str,
    rp: &RawPool,
    warnings: &mut Vec<String>,
) -> Result<PoolSpec, (String, ConfigProblem)> {
    let at = |field: &str| format!("pool '{name}'.{field}");
    let family = metadata_family(rp).map_err(|p| (at("family"), p))?;
    let ipv6 = family == Family::Ipv6;
    let excl = exclusions(name, rp, |r| r.is_ipv6() == ipv6, warnings)?;
    let imds = build_imds(rp).map_err(|(f, p)| (at(&f), p))?;
    Ok(PoolSpec {
        name: name.to_owned(),
        source: PoolSource::AzureImds,
        family,
        ranges: Vec::new(),
        size: 0,
        description: format!(
            "{}metadata from {}",
            if ipv6 { "IPv6 " } else { "" },
            imds.url
        ),
        exclude: excl,
        imds: Some(imds),
    })
}

/// Validate an `azure-imds` pool's endpoint and timings; errors name the key.
fn build_imds(rp: &RawPool) -> Result<ImdsSpec, (String, ConfigProblem)> {
    let url = rp
        .url
        .clone()
        .unwrap_or_else(|| DEFAULT_IMDS_URL.to_owned());
    let authority = check_metadata_url(&url).map_err(|e| ("url".to_owned(), e.into()))?;
    let dur = |field: &str, v: &Option<String>, default: Duration| match v {
        None => Ok(default),
        Some(s) => parse_duration(s).map_err(|e| (field.to_owned(), e.into())),
    };
    let refresh_min = dur("refresh_min", &rp.refresh_min, Duration::from_secs(4))?;
    let refresh_max = dur("refresh_max", &rp.refresh_max, Duration::from_secs(1024))?;
    let timeout = dur("timeout", &rp.timeout, Duration::from_secs(2))?;
    if refresh_min < Duration::from_millis(100) {
        return Err(("refresh_min".into(), ConfigProblem::RefreshTooFast));
    }
    if refresh_max < refresh_min {
        return Err((
            "refresh_max".into(),
            ConfigProblem::RefreshMaxBelowMin {
                refresh_min_ms: refresh_min.as_millis(),
            },
        ));
    }
    if timeout.is_zero() || timeout > Duration::from_secs(60) {
        return Err(("timeout".into(), ConfigProblem::Timeout));
    }
    Ok(ImdsSpec {
        url,
        authority,
        refresh_min,
        refresh_max,
        timeout,
    })
}

/// What is wrong with a metadata endpoint's URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("{url:?} must start with http:// (plain HTTP to a loopback or link-local address)")]
    NotHttp { url: String },
    #[error("{url:?}: the path contains whitespace")]
    PathWhitespace { url: String },
    #[error("{url:?}: bad port {port:?}")]
    BadPort { url: String, port: String },
    #[error("{url:?}: the host must be an IPv4 address literal, got {host:?}")]
    HostNotLiteral { url: String, host: String },
    #[error(
        "{url:?}: {ip} is neither loopback (127.0.0.0/8) nor link-local (169.254.0.0/16); \
         metadata is only fetched from the node itself"
    )]
    NotOnTheNode { url: String, ip: Ipv4Addr },
}

/// `http://HOST[:PORT]/PATH` with HOST an IPv4 loopback or link-local literal (metadata never
/// leaves the node, and plain HTTP is only acceptable there). Returns `HOST:PORT`.
pub fn check_metadata_url(url: &str) -> Result<String, UrlError> {
    let owned = || url.to_owned();
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| UrlError::NotHttp { url: owned() })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if path
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(UrlError::PathWhitespace { url: owned() });
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| UrlError::BadPort {
                    url: owned(),
                    port: p.to_owned(),
                })?,
        ),
        None => (authority, 80),
    };
    let ip: Ipv4Addr = host.parse().map_err(|_| UrlError::HostNotLiteral {
        url: owned(),
        host: host.to_owned(),
    })?;
    if !(ip.is_loopback() || ip.is_link_local()) {
        return Err(UrlError::NotOnTheNode { url: owned(), ip });
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

/// No address may belong to two pools.
pub(super) fn check_pool_overlaps(pools: &[PoolSpec]) -> Result<(), ConfigProblem> {
    let mut all: Vec<(IpRange, usize)> = pools
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.ranges.iter().map(move |r| (*r, i)))
        .collect();
    all.sort();
    for w in all.windows(2) {
        if w[1].0.overlaps(&w[0].0) {
            return Err(ConfigProblem::PoolsOverlap {
                first: pools[w[0].1].name.clone(),
                second: pools[w[1].1].name.clone(),
                shared: w[1].0.ip(w[1].0.bounds().0),
            });
        }
    }
    Ok(())
}
