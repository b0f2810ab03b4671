//! `address/prefix` as CNI writes it (host bits kept: `10.0.0.5/24` is an address in a subnet).

use std::{fmt, net::IpAddr, str::FromStr};

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl IpNet {
    /// `addr/prefix_len`; panics on a prefix longer than the family allows (a programming error).
    pub fn new(addr: IpAddr, prefix_len: u8) -> Self {
        assert!(prefix_len <= max_len(addr), "prefix too long for {addr}");
        Self { addr, prefix_len }
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }
}

fn max_len(addr: IpAddr) -> u8 {
    if addr.is_ipv4() {
        32
    } else {
        128
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an address/prefix (like 10.0.0.5/32)")]
pub struct IpNetParseError(String);

impl FromStr for IpNet {
    type Err = IpNetParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || IpNetParseError(s.to_owned());
        let (a, p) = s.split_once('/').ok_or_else(err)?;
        let addr: IpAddr = a.parse().map_err(|_| err())?;
        // Reject "+1", " 1" and friends that u8::from_str would take or that hide typos.
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let prefix_len: u8 = p.parse().map_err(|_| err())?;
        if prefix_len > max_len(addr) {
            return Err(err());
        }
        Ok(Self { addr, prefix_len })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl Serialize for IpNet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IpNet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_display() {
        for s in ["10.0.0.5/32", "0.0.0.0/0", "10.1.2.3/24", "fd00::1/64"] {
            assert_eq!(s.parse::<IpNet>().unwrap().to_string(), s);
        }
        for bad in [
            "10.0.0.5",
            "10.0.0.5/33",
            "10.0.0.5/+1",
            "x/1",
            "fd00::/129",
            "1.2.3.4/",
        ] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad}");
        }
    }
}
