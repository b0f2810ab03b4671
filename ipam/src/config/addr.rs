//! Address math: IPv4 ranges, CIDRs, single addresses and range subtraction.

use std::{
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
};

use ipnet::{Ipv4Net, Ipv6Net};

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

/// Every address of the prefix, network and broadcast included (pool addresses are routed
/// /32s, so none is reserved).
impl From<Ipv4Net> for AddrRange {
    fn from(net: Ipv4Net) -> Self {
        Self {
            first: net.network().into(),
            last: net.broadcast().into(),
        }
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

/// Parse `a.b.c.d/n`, refusing host bits so a typo cannot silently widen or shift a pool.
///
/// Split by hand rather than with `Ipv4Net::from_str` so each mistake gets its own message.
pub(super) fn parse_cidr(s: &str) -> Result<Ipv4Net, String> {
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not a CIDR (expected a.b.c.d/len)"))?;
    let ip: Ipv4Addr = ip
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: {ip:?} is not an IPv4 address"))?;
    let net = len
        .trim()
        .parse::<u8>()
        .ok()
        .and_then(|len| Ipv4Net::new(ip, len).ok())
        .ok_or_else(|| format!("{s:?}: prefix length must be 0..=32"))?;
    if net.trunc() != net {
        return Err(format!(
            "{s:?} has host bits set (did you mean {}?)",
            net.trunc()
        ));
    }
    Ok(net)
}

pub(super) fn parse_ip(s: &str) -> Result<AddrRange, String> {
    let ip: Ipv4Addr = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not an IPv4 address"))?;
    Ok(AddrRange {
        first: ip.into(),
        last: ip.into(),
    })
}

pub(super) fn parse_range(s: &str) -> Result<AddrRange, String> {
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

/// An inclusive range of addresses as integers, of either family: what [`subtract_spans`] works on.
pub(super) trait Span: Copy + Ord {
    fn bounds(&self) -> (u128, u128);
    /// Only called with bounds inside a range of the same type.
    fn from_bounds(first: u128, last: u128) -> Self;
}

impl Span for AddrRange {
    fn bounds(&self) -> (u128, u128) {
        (u128::from(self.first), u128::from(self.last))
    }
    fn from_bounds(first: u128, last: u128) -> Self {
        let narrow = |x: u128| u32::try_from(x).expect("within an IPv4 range");
        AddrRange {
            first: narrow(first),
            last: narrow(last),
        }
    }
}

impl Span for Range6 {
    fn bounds(&self) -> (u128, u128) {
        (self.first, self.last)
    }
    fn from_bounds(first: u128, last: u128) -> Self {
        Range6 { first, last }
    }
}

/// `ranges` (sorted, disjoint) minus `excl`; the result is sorted, disjoint and merged.
fn subtract_spans<S: Span>(ranges: &[S], excl: &mut [S]) -> Vec<S> {
    excl.sort();
    let mut out: Vec<(u128, u128)> = Vec::new();
    for r in ranges {
        let mut cur = Some(r.bounds());
        for e in excl.iter() {
            let Some((cf, cl)) = cur else { break };
            let (ef, el) = e.bounds();
            if el < cf || ef > cl {
                continue;
            }
            if ef > cf {
                out.push((cf, ef - 1));
            }
            cur = (el < cl).then(|| (el + 1, cl));
        }
        if let Some(c) = cur {
            out.push(c);
        }
    }
    // Merge adjacent pieces (e.g. ips listed next to a range) so lookups stay short.
    let mut merged: Vec<(u128, u128)> = Vec::with_capacity(out.len());
    for (first, last) in out {
        match merged.last_mut() {
            Some(m) if m.1.checked_add(1) == Some(first) => m.1 = last,
            _ => merged.push((first, last)),
        }
    }
    merged
        .into_iter()
        .map(|(f, l)| S::from_bounds(f, l))
        .collect()
}

/// `ranges` (sorted, disjoint) minus `excl`; the result is sorted, disjoint and merged.
pub(super) fn subtract(ranges: &[AddrRange], excl: &mut [AddrRange]) -> Vec<AddrRange> {
    subtract_spans(ranges, excl)
}

/// An inclusive range of IPv6 addresses as integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Range6 {
    pub first: u128,
    pub last: u128,
}

impl Range6 {
    /// Number of addresses, saturating (a /64 has 2^64).
    pub fn len(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl fmt::Display for Range6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", Ipv6Addr::from(self.first))
        } else {
            write!(
                f,
                "{}-{}",
                Ipv6Addr::from(self.first),
                Ipv6Addr::from(self.last)
            )
        }
    }
}

/// A configured address, CIDR or range of either family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AnyRange {
    V4(AddrRange),
    V6(Range6),
}

/// Lowest IPv6 address a pool may hold: `::/96` (unspecified, loopback, the deprecated
/// IPv4-compatible block) is never a pod address, and the allocator keys IPv4 addresses there.
const V6_MIN: u128 = 1 << 32;

fn v6_range(s: &str, first: Ipv6Addr, last: Ipv6Addr) -> Result<AnyRange, String> {
    let r = Range6 {
        first: first.into(),
        last: last.into(),
    };
    if r.first < V6_MIN {
        return Err(format!(
            "{s:?} reaches into ::/96 (unspecified, loopback, IPv4-compatible), which no pod \
             address may come from"
        ));
    }
    Ok(AnyRange::V6(r))
}

/// Parse an IPv4 or IPv6 CIDR, refusing host bits (the IPv4 form's messages unchanged).
pub(super) fn parse_any_cidr(s: &str) -> Result<AnyRange, String> {
    let Some((ip, len)) = s.split_once('/') else {
        return Err(format!(
            "{s:?} is not a CIDR (expected a.b.c.d/len or an IPv6 prefix such as fd00::/112)"
        ));
    };
    if !ip.contains(':') {
        return parse_cidr(s).map(|n| AnyRange::V4(n.into()));
    }
    let ip: Ipv6Addr = ip
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: {ip:?} is not an IPv6 address"))?;
    let net = len
        .trim()
        .parse::<u8>()
        .ok()
        .and_then(|len| Ipv6Net::new(ip, len).ok())
        .ok_or_else(|| format!("{s:?}: prefix length must be 0..=128"))?;
    if net.trunc() != net {
        return Err(format!(
            "{s:?} has host bits set (did you mean {}?)",
            net.trunc()
        ));
    }
    v6_range(s, net.network(), net.broadcast())
}

pub(super) fn parse_any_ip(s: &str) -> Result<AnyRange, String> {
    if !s.contains(':') {
        return parse_ip(s).map(AnyRange::V4);
    }
    let ip: Ipv6Addr = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not an IPv6 address"))?;
    v6_range(s, ip, ip)
}

/// An `exclude` entry of either family: a CIDR, or a single address.
pub(super) fn parse_any_exclusion(s: &str) -> Result<AnyRange, String> {
    if s.contains('/') {
        parse_any_cidr(s)
    } else {
        parse_any_ip(s)
    }
}

pub(super) fn parse_any_range(s: &str) -> Result<AnyRange, String> {
    if !s.contains(':') {
        return parse_range(s).map(AnyRange::V4);
    }
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?} is not a range (expected fd00::10-fd00::20)"))?;
    let parse = |x: &str| {
        x.trim()
            .parse::<Ipv6Addr>()
            .map_err(|_| format!("{s:?}: {x:?} is not an IPv6 address"))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    if a > b {
        return Err(format!("{s:?}: the first address is after the last"));
    }
    v6_range(s, a, b)
}

/// [`subtract`] for IPv6 ranges.
pub(super) fn subtract6(ranges: &[Range6], excl: &mut [Range6]) -> Vec<Range6> {
    subtract_spans(ranges, excl)
}
