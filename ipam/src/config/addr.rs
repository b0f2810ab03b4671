//! Address math: the addresses, CIDRs and ranges a pool lists, of either family, and range
//! subtraction.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::IpNet;

/// An inclusive range of addresses of one family as host-order integers ([`AddrRange`] for
/// IPv4, [`Range6`] for IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Range<T> {
    pub first: T,
    pub last: T,
}

pub type AddrRange = Range<u32>;
pub type Range6 = Range<u128>;

/// An address of one family as an integer: `u32` for IPv4, `u128` for IPv6.
pub trait AddrValue: Copy + Ord + Into<u128> {
    fn ip(self) -> IpAddr;
    /// Only called with a value of this family.
    fn narrow(v: u128) -> Self;
}

impl AddrValue for u32 {
    fn ip(self) -> IpAddr {
        Ipv4Addr::from(self).into()
    }
    fn narrow(v: u128) -> Self {
        u32::try_from(v).expect("within an IPv4 range")
    }
}

impl AddrValue for u128 {
    fn ip(self) -> IpAddr {
        Ipv6Addr::from(self).into()
    }
    fn narrow(v: u128) -> Self {
        v
    }
}

impl<T: AddrValue> Range<T> {
    /// The addresses as allocator values ([`crate::lease::Addr`]).
    pub fn bounds(&self) -> (u128, u128) {
        (self.first.into(), self.last.into())
    }

    /// Only called with bounds of this family.
    fn from_bounds(first: u128, last: u128) -> Self {
        Range {
            first: T::narrow(first),
            last: T::narrow(last),
        }
    }

    /// Number of addresses, saturating (an IPv6 /64 has 2^64).
    pub fn len(&self) -> u128 {
        (self.last.into() - self.first.into()).saturating_add(1)
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl<T: AddrValue> fmt::Display for Range<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first.ip())
        } else {
            write!(f, "{}-{}", self.first.ip(), self.last.ip())
        }
    }
}

/// An inclusive range of addresses of either family: what a pool lists, excludes and serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IpRange {
    V4(AddrRange),
    V6(Range6),
}

impl IpRange {
    /// The addresses as allocator values ([`crate::lease::Addr`]: an IPv4 address is its
    /// 32-bit value).
    pub fn bounds(&self) -> (u128, u128) {
        match self {
            Self::V4(r) => r.bounds(),
            Self::V6(r) => r.bounds(),
        }
    }

    /// Whether the range holds allocator value `a` (of either family).
    pub fn contains(&self, a: u128) -> bool {
        let (first, last) = self.bounds();
        first <= a && a <= last
    }

    /// Number of addresses, saturating (an IPv6 /64 has 2^64).
    pub fn len(&self) -> u128 {
        match self {
            Self::V4(r) => r.len(),
            Self::V6(r) => r.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The first and the last address.
    pub fn ips(&self) -> (IpAddr, IpAddr) {
        let (first, last) = self.bounds();
        (self.ip(first), self.ip(last))
    }

    /// The range of `self`'s family from allocator values inside it.
    pub(super) fn with_bounds(&self, first: u128, last: u128) -> Self {
        match self {
            Self::V4(_) => Self::V4(AddrRange::from_bounds(first, last)),
            Self::V6(_) => Self::V6(Range6::from_bounds(first, last)),
        }
    }

    pub fn is_ipv6(&self) -> bool {
        matches!(self, Self::V6(_))
    }

    pub(super) fn overlaps(&self, other: &Self) -> bool {
        let ((f1, l1), (f2, l2)) = (self.bounds(), other.bounds());
        self.is_ipv6() == other.is_ipv6() && f1 <= l2 && f2 <= l1
    }

    /// The address of allocator value `a` in this range's family.
    pub(super) fn ip(&self, a: u128) -> IpAddr {
        match self {
            Self::V4(_) => u32::narrow(a).ip(),
            Self::V6(_) => a.ip(),
        }
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V4(r) => r.fmt(f),
            Self::V6(r) => r.fmt(f),
        }
    }
}

/// What is wrong with an address, CIDR or range a pool lists. `input` is the entry as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("{input:?} is not a CIDR (expected {expected})")]
    NotCidr {
        input: String,
        expected: &'static str,
    },
    #[error("{input:?} is not a range (expected {expected})")]
    NotRange {
        input: String,
        expected: &'static str,
    },
    /// The whole entry is not an address.
    #[error("{input:?} is not an {family} address")]
    NotAddress { input: String, family: &'static str },
    /// `part` of the entry (a CIDR's address, one end of a range) is not an address.
    #[error("{input:?}: {part:?} is not an {family} address")]
    BadPart {
        input: String,
        part: String,
        family: &'static str,
    },
    #[error("{input:?}: prefix length must be 0..={max}")]
    PrefixLength { input: String, max: u8 },
    #[error("{input:?} has host bits set (did you mean {network}?)")]
    HostBits { input: String, network: IpNet },
    #[error("{input:?}: the first address is after the last")]
    Reversed { input: String },
    #[error(
        "{input:?} reaches into ::/96 (unspecified, loopback, IPv4-compatible), which no pod \
         address may come from"
    )]
    BelowV6Min { input: String },
}

/// Lowest IPv6 address a pool may hold: `::/96` (unspecified, loopback, the deprecated
/// IPv4-compatible block) is never a pod address, and the allocator keys IPv4 addresses there.
const V6_MIN: u128 = 1 << 32;

/// The family an entry is written in: IPv6 when it has a colon.
fn family_of(s: &str) -> &'static str {
    if s.contains(':') {
        "IPv6"
    } else {
        "IPv4"
    }
}

/// `s` as an address of `family` (what [`family_of`] says of the whole entry).
fn parse_addr(s: &str, family: &str) -> Option<IpAddr> {
    let s = s.trim();
    if family == "IPv6" {
        s.parse::<Ipv6Addr>().ok().map(IpAddr::from)
    } else {
        s.parse::<Ipv4Addr>().ok().map(IpAddr::from)
    }
}

/// The range from `first` to `last` (one family), refusing IPv6 addresses in `::/96`.
fn range(input: &str, first: IpAddr, last: IpAddr) -> Result<IpRange, AddrError> {
    match (first, last) {
        (IpAddr::V4(f), IpAddr::V4(l)) => Ok(IpRange::V4(AddrRange {
            first: f.into(),
            last: l.into(),
        })),
        (IpAddr::V6(f), IpAddr::V6(l)) => {
            let r = Range6 {
                first: f.into(),
                last: l.into(),
            };
            if r.first < V6_MIN {
                return Err(AddrError::BelowV6Min {
                    input: input.to_owned(),
                });
            }
            Ok(IpRange::V6(r))
        }
        _ => unreachable!("both ends are parsed in the family of the entry"),
    }
}

/// Parse `a.b.c.d/n` or an IPv6 prefix, refusing host bits so a typo cannot silently widen or
/// shift a pool. Every address of the prefix counts (pool addresses are routed /32s and
/// /128s, so none is reserved); `cidrs` leave IPv6's subnet-router anycast address out
/// elsewhere.
///
/// Split by hand rather than with `IpNet::from_str` so each mistake gets its own message.
pub(super) fn parse_cidr(s: &str) -> Result<IpRange, AddrError> {
    let input = || s.to_owned();
    let family = family_of(s);
    let (ip, len) = s.split_once('/').ok_or_else(|| AddrError::NotCidr {
        input: input(),
        expected: if family == "IPv6" {
            "an IPv6 prefix such as fd00::/112"
        } else {
            "a.b.c.d/len"
        },
    })?;
    let addr = parse_addr(ip, family).ok_or_else(|| AddrError::BadPart {
        input: input(),
        part: ip.to_owned(),
        family,
    })?;
    let net = len
        .trim()
        .parse::<u8>()
        .ok()
        .and_then(|len| IpNet::new(addr, len).ok())
        .ok_or_else(|| AddrError::PrefixLength {
            input: input(),
            max: if addr.is_ipv6() { 128 } else { 32 },
        })?;
    if net.trunc() != net {
        return Err(AddrError::HostBits {
            input: input(),
            network: net.trunc(),
        });
    }
    range(s, net.network(), net.broadcast())
}

/// Parse a single address.
pub(super) fn parse_ip(s: &str) -> Result<IpRange, AddrError> {
    let family = family_of(s);
    let ip = parse_addr(s, family).ok_or_else(|| AddrError::NotAddress {
        input: s.to_owned(),
        family,
    })?;
    range(s, ip, ip)
}

/// Parse `first-last`.
pub(super) fn parse_range(s: &str) -> Result<IpRange, AddrError> {
    let family = family_of(s);
    let (a, b) = s.split_once('-').ok_or_else(|| AddrError::NotRange {
        input: s.to_owned(),
        expected: if family == "IPv6" {
            "fd00::10-fd00::20"
        } else {
            "a.b.c.d-e.f.g.h"
        },
    })?;
    let end = |x: &str| {
        parse_addr(x, family).ok_or_else(|| AddrError::BadPart {
            input: s.to_owned(),
            part: x.to_owned(),
            family,
        })
    };
    let (first, last) = (end(a)?, end(b)?);
    if first > last {
        return Err(AddrError::Reversed {
            input: s.to_owned(),
        });
    }
    range(s, first, last)
}

/// An `exclude` entry: a CIDR, or a single address.
pub(super) fn parse_exclusion(s: &str) -> Result<IpRange, AddrError> {
    if s.contains('/') {
        parse_cidr(s)
    } else {
        parse_ip(s)
    }
}

/// `ranges` (sorted, disjoint, one family) minus `excl`; the result is sorted, disjoint and
/// merged.
pub(super) fn subtract(ranges: &[IpRange], excl: &mut [(u128, u128)]) -> Vec<IpRange> {
    excl.sort();
    let mut out: Vec<(u128, u128)> = Vec::new();
    for r in ranges {
        let mut cur = Some(r.bounds());
        for &(ef, el) in excl.iter() {
            let Some((cf, cl)) = cur else { break };
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
    let Some(like) = ranges.first() else {
        return Vec::new();
    };
    merged
        .into_iter()
        .map(|(f, l)| like.with_bounds(f, l))
        .collect()
}
