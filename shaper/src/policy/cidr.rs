//! The policy's CIDR lists.

use std::net::IpAddr;

use ipnet::IpNet;

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

/// Every prefix of the list at `field`; errors name the entry (`internal_cidrs[2]`).
pub(super) fn cidrs(field: &str, raw: &[String]) -> Result<Vec<IpNet>, String> {
    raw.iter()
        .enumerate()
        .map(|(i, s)| parse_cidr(s.trim()).map_err(|e| format!("{field}[{i}]: {e}")))
        .collect()
}
