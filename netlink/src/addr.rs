//! Addresses: adding one (IPv6 without duplicate address detection) and listing a link's.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::{
    address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage},
    AddressFamily, RouteNetlinkMessage,
};

use crate::{Family, NetlinkError, Request, Rtnl};

/// An address on a link, with the flags CHECK looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr {
    pub ip: IpAddr,
    pub len: u8,
    /// Still in (or failed) duplicate address detection: unusable as a source.
    pub tentative: bool,
    pub nodad: bool,
}

/// `ip addr add <ip>/<len> dev <index>`; an IPv6 address `nodad`: usable at once, with no
/// 1-2 s of tentative state. Only for addresses unique by construction (IPAM's, a link-local
/// gateway's).
pub fn add(index: u32, ip: IpAddr, len: u8) -> Request {
    let mut m = AddressMessage::default();
    m.header.family = Family::of(ip).af();
    m.header.prefix_len = len;
    m.header.index = index;
    m.attributes.push(AddressAttribute::Address(ip));
    m.attributes.push(AddressAttribute::Local(ip));
    if ip.is_ipv6() {
        m.header.flags |= AddressHeaderFlags::Nodad;
        m.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    (
        RouteNetlinkMessage::NewAddress(m),
        NLM_F_CREATE | NLM_F_EXCL,
    )
}

impl Addr {
    fn from_msg(m: AddressMessage) -> Option<Self> {
        // IFA_FLAGS carries all 32 bits; the header byte is the older, partial copy.
        let mut flags = AddressFlags::from_bits_retain(u32::from(m.header.flags.bits()));
        let (mut local, mut address) = (None, None);
        for a in m.attributes {
            match a {
                AddressAttribute::Local(ip) => local = Some(ip),
                AddressAttribute::Address(ip) => address = Some(ip),
                AddressAttribute::Flags(f) => flags = f,
                _ => {}
            }
        }
        // IPv4 reports the interface's own address as IFA_LOCAL (IFA_ADDRESS is the peer's
        // on point-to-point links); IPv6 only has IFA_ADDRESS.
        Some(Addr {
            ip: local.or(address)?,
            len: m.header.prefix_len,
            tentative: flags.intersects(AddressFlags::Tentative | AddressFlags::Dadfailed),
            nodad: flags.contains(AddressFlags::Nodad),
        })
    }
}

impl Rtnl {
    /// The addresses of `family` on link `index`.
    pub fn addrs(&mut self, index: u32, family: Family) -> Result<Vec<Addr>, NetlinkError> {
        let mut req = AddressMessage::default();
        req.header.family = family.af();
        req.header.index = index;
        let op = format!("list addresses of ifindex {index}");
        let af: AddressFamily = family.af();
        Ok(self
            .request(RouteNetlinkMessage::GetAddress(req), NLM_F_DUMP, &op)?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a)
                    if a.header.index == index && a.header.family == af =>
                {
                    Addr::from_msg(a)
                }
                _ => None,
            })
            .collect())
    }
}
