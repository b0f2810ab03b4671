//! Addresses no pod may hold, whatever a pool's source lists: a pod with one of them would
//! shadow the node's own use of it (the pods' link-local gateway, loopback), or could never be
//! routed to it as a unicast host. Static and prefixes pools leave them out with a config
//! warning; metadata pools refuse them at every read, logging a warning.

use std::net::IpAddr;

use super::addr::IpRange;

const fn v4(a: [u8; 4]) -> u128 {
    u32::from_be_bytes(a) as u128
}

const fn v6(a: [u16; 8]) -> u128 {
    let mut out = 0u128;
    let mut i = 0;
    while i < 8 {
        out = (out << 16) | a[i] as u128;
        i += 1;
    }
    out
}

/// IPv4 blocks no pod address may come from: (first, last, why).
const RESERVED4: [(u128, u128, &str); 5] = [
    (
        v4([0, 0, 0, 0]),
        v4([0, 255, 255, 255]),
        "in \"this network\" 0.0.0.0/8 (never a destination)",
    ),
    (
        v4([127, 0, 0, 0]),
        v4([127, 255, 255, 255]),
        "loopback (127.0.0.0/8)",
    ),
    (
        v4([169, 254, 0, 0]),
        v4([169, 254, 255, 255]),
        "link-local (169.254.0.0/16: the pods' gateway 169.254.1.1, instance metadata)",
    ),
    (
        v4([224, 0, 0, 0]),
        v4([239, 255, 255, 255]),
        "multicast (224.0.0.0/4)",
    ),
    (
        v4([255, 255, 255, 255]),
        v4([255, 255, 255, 255]),
        "the limited broadcast address",
    ),
];

/// IPv6 blocks no pod address may come from: (first, last, why).
const RESERVED6: [(u128, u128, &str); 4] = [
    (
        0,
        (1 << 32) - 1,
        "in ::/96 (the unspecified and loopback addresses, IPv4-compatible)",
    ),
    (
        v6([0, 0, 0, 0, 0, 0xffff, 0, 0]),
        v6([0, 0, 0, 0, 0, 0xffff, 0xffff, 0xffff]),
        "IPv4-mapped (::ffff:0:0/96)",
    ),
    (
        v6([0xfe80, 0, 0, 0, 0, 0, 0, 0]),
        v6([
            0xfebf, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff,
        ]),
        "link-local (fe80::/10: the pods' gateway fe80::1)",
    ),
    (
        v6([0xff00, 0, 0, 0, 0, 0, 0, 0]),
        u128::MAX,
        "multicast (ff00::/8)",
    ),
];

/// Why `ip` can never be a pod's address, or `None` if it can be.
pub fn reserved(ip: IpAddr) -> Option<&'static str> {
    let (table, a): (&[_], u128) = match ip {
        IpAddr::V4(a) => (&RESERVED4, u32::from(a).into()),
        IpAddr::V6(a) => (&RESERVED6, a.into()),
    };
    table
        .iter()
        .find(|(f, l, _)| *f <= a && a <= *l)
        .map(|(.., why)| *why)
}

/// The parts of `ranges` that are reserved, each with why.
pub(super) fn reserved_in(ranges: &[IpRange]) -> Vec<(IpRange, &'static str)> {
    let mut out = Vec::new();
    for r in ranges {
        let (first, last) = r.bounds();
        let table: &[_] = if r.is_ipv6() { &RESERVED6 } else { &RESERVED4 };
        for &(f, l, why) in table {
            if first <= l && f <= last {
                let part = (first.max(f), last.min(l));
                out.push((r.with_bounds(part.0, part.1), why));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_agree_with_the_standard_library() {
        for s in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "169.254.1.1",
            "224.0.0.1",
            "239.255.255.255",
            "255.255.255.255",
        ] {
            assert!(reserved(s.parse().unwrap()).is_some(), "{s}");
        }
        for s in [
            "10.0.0.1",
            "1.1.1.1",
            "126.255.255.255",
            "169.253.255.255",
            "240.0.0.1",
        ] {
            assert_eq!(reserved(s.parse().unwrap()), None, "{s}");
        }
        for s in [
            "::",
            "::1",
            "::10.0.0.1",
            "::ffff:10.0.0.1",
            "fe80::1",
            "febf::1",
            "ff02::1",
        ] {
            let a: std::net::Ipv6Addr = s.parse().unwrap();
            assert!(reserved(a.into()).is_some(), "{s}");
            assert!(
                a.is_unspecified()
                    || a.is_loopback()
                    || a.is_multicast()
                    || a.is_unicast_link_local()
                    || a.to_ipv4().is_some(),
                "{s}"
            );
        }
        for s in ["fd00::1", "2001:db8::1", "fec0::1", "1::"] {
            assert_eq!(reserved(s.parse().unwrap()), None, "{s}");
        }
    }
}
