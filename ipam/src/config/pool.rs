//! Building pools: sources, allowed keys, ranges minus exclusions, metadata endpoints.

use std::{fmt, net::Ipv4Addr, time::Duration};

use super::*;

use aliasnet_ipam_proto::Family;

use super::addr::{
    parse_any_cidr, parse_any_exclusion, parse_any_ip, parse_any_range, parse_cidr, parse_ip,
    parse_range, subtract, subtract6, AnyRange, Span,
};
use super::parse::RawPool;
use super::reserved::{reserved_in, reserved_in6};

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
    /// Usable IPv4 addresses (exclusions applied): sorted, disjoint, non-adjacent.
    pub ranges: Vec<AddrRange>,
    /// Usable IPv6 addresses, likewise (IPv6 pools only).
    pub ranges6: Vec<Range6>,
    /// Number of usable addresses (saturating: a /64 has more than `u64` counts).
    pub size: u64,
    /// Short human description of the configured sources, for messages ("10.240.1.0/24").
    pub description: String,
    /// Exclusions (metadata pools apply them to the addresses they read).
    pub exclude: Vec<AddrRange>,
    /// IPv6 exclusions (already applied to `ranges6`; IPv6 metadata pools apply them to the
    /// addresses they read).
    pub exclude6: Vec<Range6>,
    /// Set for `azure-imds` pools (which have no `ranges`).
    pub imds: Option<ImdsSpec>,
}

impl PoolSpec {
    /// The usable addresses as allocator values ([`crate::lease::Addr`]: an IPv4 address is
    /// its 32-bit value), whichever family the pool serves: sorted, disjoint ranges.
    pub fn address_ranges(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.ranges
            .iter()
            .map(Span::bounds)
            .chain(self.ranges6.iter().map(Span::bounds))
    }

    /// Whether an exclusion covers `addr` (an allocator value of either family; metadata pools
    /// apply the exclusions to the addresses they read).
    pub fn is_excluded(&self, addr: u128) -> bool {
        self.exclude
            .iter()
            .map(Span::bounds)
            .chain(self.exclude6.iter().map(Span::bounds))
            .any(|(first, last)| first <= addr && addr <= last)
    }
}

/// Build one pool; errors are (field, message).
pub(super) fn build_pool(
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
            format!(
                "not used by source \"{source}\" (it takes: {}, exclude)",
                allowed.join(", ")
            ),
        ));
    }
    if source != PoolSource::AzureImds {
        let any = rp
            .cidrs
            .iter()
            .chain(&rp.ranges)
            .chain(&rp.ips)
            .chain(&rp.prefixes)
            .any(|s| s.contains(':'));
        if any {
            return build_pool6(name, source, rp, warnings);
        }
    }
    if source == PoolSource::AzureImds
        && metadata_family(rp).map_err(|m| (at("family"), m))? == Family::Ipv6
    {
        return build_imds6(name, rp, warnings);
    }
    let mut excl: Vec<AddrRange> = Vec::new();
    for (j, s) in rp.exclude.iter().enumerate() {
        if s.contains(':') {
            // An IPv6 exclusion cannot touch an IPv4 pool.
            warnings.push(format!(
                "pool '{name}': exclude[{j}] {s:?} is outside the pool's addresses and has no effect"
            ));
            continue;
        }
        let r = if s.contains('/') {
            parse_cidr(s).map(AddrRange::from)
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
            family: Family::Ipv4,
            ranges: Vec::new(),
            ranges6: Vec::new(),
            size: 0,
            description: format!("metadata from {}", imds.url),
            exclude: excl,
            exclude6: Vec::new(),
            imds: Some(imds),
        });
    }

    // Every configured range, remembering where it came from for duplicate messages.
    let mut parts: Vec<(AddrRange, String)> = Vec::new();
    for (j, s) in rp.cidrs.iter().enumerate() {
        let r = parse_cidr(s)
            .map_err(|m| (at(&format!("cidrs[{j}]")), m))?
            .into();
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
        let r = parse_cidr(s)
            .map_err(|m| (at(&format!("prefixes[{j}]")), m))?
            .into();
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
    let listed: Vec<AddrRange> = parts.iter().map(|(r, _)| *r).collect();
    let reserved = reserved_in(&listed);
    excl.extend(reserved.iter().map(|(r, _)| *r));
    let ranges = subtract(&listed, &mut excl);
    let size: u64 = ranges.iter().map(AddrRange::len).sum();
    if size == 0 {
        return Err(empty_pool(at("exclude"), &reserved));
    }
    warn_reserved(name, &reserved, warnings);
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
        family: Family::Ipv4,
        ranges,
        ranges6: Vec::new(),
        size,
        description,
        exclude,
        exclude6: Vec::new(),
        imds: None,
    })
}

/// Build a static or prefixes pool that lists an IPv6 address: every address must be IPv6.
fn build_pool6(
    name: &str,
    source: PoolSource,
    rp: &RawPool,
    warnings: &mut Vec<String>,
) -> Result<PoolSpec, (String, String)> {
    let at = |field: &str| format!("pool '{name}'.{field}");
    let mut parts: Vec<(Range6, String)> = Vec::new();
    let mut v4: Option<String> = None;
    // Subnet-router anycast addresses (RFC 4291 2.6.1) of the `cidrs`.
    let mut anycast: Vec<Range6> = Vec::new();
    type Parse = fn(&str) -> Result<AnyRange, String>;
    let lists: [(&str, &Vec<String>, Parse); 4] = [
        ("cidrs", &rp.cidrs, parse_any_cidr),
        ("ranges", &rp.ranges, parse_any_range),
        ("ips", &rp.ips, parse_any_ip),
        ("prefixes", &rp.prefixes, parse_any_cidr),
    ];
    for (field, list, parse) in lists {
        for (j, s) in list.iter().enumerate() {
            let what = format!("{field}[{j}]");
            match parse(s).map_err(|m| (at(&what), m))? {
                AnyRange::V6(r) => {
                    // A `cidrs` entry is a subnet: its all-zero host address is the
                    // subnet-router anycast address, which a router (the kernel, with
                    // forwarding on, for a prefix on one of its interfaces) answers itself, so
                    // a pod must never hold it. Not for /127 and /128 (RFC 6164; the kernel
                    // does not join it there either), nor for delegated `prefixes`, which are
                    // routed to the node whole.
                    if field == "cidrs" && r.len() > 2 {
                        anycast.push(Range6 {
                            first: r.first,
                            last: r.first,
                        });
                    }
                    parts.push((r, format!("{what} {s:?}")));
                }
                AnyRange::V4(_) => {
                    v4.get_or_insert(format!("{what} {s:?}"));
                }
            }
        }
    }
    if let (Some(v4), Some((_, v6))) = (v4, parts.first()) {
        return Err((
            at("cidrs"),
            format!(
                "mixes IPv4 ({v4}) and IPv6 ({v6}) addresses; a pool serves one family: put each family in its own pool"
            ),
        ));
    }
    let mut excl: Vec<Range6> = Vec::new();
    for (j, s) in rp.exclude.iter().enumerate() {
        let r = parse_any_exclusion(s).map_err(|m| (at(&format!("exclude[{j}]")), m))?;
        match r {
            AnyRange::V6(r) if parts.iter().any(|(p, _)| p.first <= r.last && r.first <= p.last) => {
                excl.push(r)
            }
            _ => warnings.push(format!(
                "pool '{name}': exclude[{j}] {s:?} is outside the pool's addresses and has no effect"
            )),
        }
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
                    std::net::Ipv6Addr::from(w[1].0.first)
                ),
            ));
        }
    }
    let exclude6 = excl.clone();
    excl.extend(anycast);
    let listed: Vec<Range6> = parts.iter().map(|(r, _)| *r).collect();
    let reserved = reserved_in6(&listed);
    excl.extend(reserved.iter().map(|(r, _)| *r));
    let ranges6 = subtract6(&listed, &mut excl);
    if ranges6.is_empty() {
        return Err(empty_pool(at("exclude"), &reserved));
    }
    warn_reserved(name, &reserved, warnings);
    let size: u128 = ranges6.iter().fold(0u128, |n, r| n.saturating_add(r.len()));
    Ok(PoolSpec {
        name: name.to_owned(),
        source,
        family: Family::Ipv6,
        ranges: Vec::new(),
        ranges6,
        size: u64::try_from(size).unwrap_or(u64::MAX),
        description: describe(rp),
        exclude: Vec::new(),
        exclude6,
        imds: None,
    })
}

/// The error of a static or prefixes pool left without addresses by its exclusions and the
/// reserved addresses it listed (named, so the mistake is plain).
fn empty_pool<R: fmt::Display>(field: String, reserved: &[(R, &str)]) -> (String, String) {
    if reserved.is_empty() {
        return (
            field,
            "the exclusions remove every address; the pool would be empty".into(),
        );
    }
    let named: Vec<String> = reserved
        .iter()
        .map(|(r, why)| format!("{r} is {why}"))
        .collect();
    (
        field,
        format!(
            "no address is left that a pod may hold ({}); the pool would be empty",
            named.join("; ")
        ),
    )
}

/// One warning per reserved block a pool listed: those addresses are never handed out.
fn warn_reserved<R: fmt::Display>(name: &str, reserved: &[(R, &str)], warnings: &mut Vec<String>) {
    for (r, why) in reserved {
        warnings.push(format!(
            "pool '{name}': {r} is {why} and is never handed out"
        ));
    }
}

/// The family an `azure-imds` pool serves: `family`, IPv4 unless set.
fn metadata_family(rp: &RawPool) -> Result<Family, String> {
    match rp.family.as_deref().map(str::trim) {
        None | Some("ipv4") => Ok(Family::Ipv4),
        Some("ipv6") => Ok(Family::Ipv6),
        Some(other) => Err(format!(
            "unknown family {other:?}; expected \"ipv4\" or \"ipv6\""
        )),
    }
}

/// An `azure-imds` pool of the interfaces' IPv6 secondaries (`ipv6.ipAddress[1..]`).
fn build_imds6(
    name: &str,
    rp: &RawPool,
    warnings: &mut Vec<String>,
) -> Result<PoolSpec, (String, String)> {
    let at = |field: &str| format!("pool '{name}'.{field}");
    let mut exclude6: Vec<Range6> = Vec::new();
    for (j, s) in rp.exclude.iter().enumerate() {
        let r = parse_any_exclusion(s).map_err(|m| (at(&format!("exclude[{j}]")), m))?;
        match r {
            AnyRange::V6(r) => exclude6.push(r),
            AnyRange::V4(_) => warnings.push(format!(
                "pool '{name}': exclude[{j}] {s:?} is outside the pool's addresses and has no effect"
            )),
        }
    }
    exclude6.sort();
    let imds = build_imds(rp).map_err(|(f, m)| (at(&f), m))?;
    Ok(PoolSpec {
        name: name.to_owned(),
        source: PoolSource::AzureImds,
        family: Family::Ipv6,
        ranges: Vec::new(),
        ranges6: Vec::new(),
        size: 0,
        description: format!("IPv6 metadata from {}", imds.url),
        exclude: Vec::new(),
        exclude6,
        imds: Some(imds),
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

pub(super) fn check_pool_overlaps(pools: &[PoolSpec]) -> Result<(), String> {
    let mut all6: Vec<(Range6, usize)> = pools
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.ranges6.iter().map(move |r| (*r, i)))
        .collect();
    all6.sort();
    for w in all6.windows(2) {
        if w[1].0.first <= w[0].0.last {
            return Err(format!(
                "pools '{}' and '{}' overlap (both contain {}); an address may belong to one pool only",
                pools[w[0].1].name,
                pools[w[1].1].name,
                std::net::Ipv6Addr::from(w[1].0.first)
            ));
        }
    }
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
