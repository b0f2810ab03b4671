//! Neighbours: the permanent entry of a pod's gateway, and listing a link's.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::{
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    route::RouteType,
    RouteNetlinkMessage,
};

use crate::{Family, NetlinkError, Request, Rtnl};

/// A neighbour entry of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    pub ip: IpAddr,
    pub lladdr: Option<Vec<u8>>,
    pub permanent: bool,
}

/// Permanent neighbour `ip lladdr mac dev index`: no ARP or neighbour discovery for it, ever.
pub fn add_permanent(index: u32, ip: IpAddr, mac: &[u8; 6]) -> Request {
    let mut m = NeighbourMessage::default();
    m.header.family = Family::of(ip).af();
    m.header.ifindex = index;
    m.header.state = NeighbourState::Permanent;
    m.header.kind = RouteType::Unspec;
    m.attributes.push(NeighbourAttribute::Destination(match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }));
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    (
        RouteNetlinkMessage::NewNeighbour(m),
        NLM_F_CREATE | NLM_F_EXCL,
    )
}

impl Rtnl {
    /// The neighbours of `family` on link `index`.
    pub fn neighbours(
        &mut self,
        index: u32,
        family: Family,
    ) -> Result<Vec<Neighbour>, NetlinkError> {
        let mut req = NeighbourMessage::default();
        req.header.family = family.af();
        let op = format!("list neighbours of ifindex {index}");
        Ok(self
            .request(RouteNetlinkMessage::GetNeighbour(req), NLM_F_DUMP, &op)?
            .into_iter()
            .filter_map(|m| {
                let RouteNetlinkMessage::NewNeighbour(n) = m else {
                    return None;
                };
                if n.header.ifindex != index {
                    return None;
                }
                let permanent = n.header.state == NeighbourState::Permanent;
                let mut ip = None;
                let mut lladdr = None;
                for a in n.attributes {
                    match a {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => {
                            ip = Some(IpAddr::V4(d))
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet6(d)) => {
                            ip = Some(IpAddr::V6(d))
                        }
                        NeighbourAttribute::LinkLayerAddress(l) => lladdr = Some(l),
                        _ => {}
                    }
                }
                Some(Neighbour {
                    ip: ip.filter(|ip| Family::of(*ip) == family)?,
                    lladdr,
                    permanent,
                })
            })
            .collect())
    }
}
