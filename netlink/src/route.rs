//! Routes: a pod's host and gateway routes, the tables CHECK and recovery read, and the node's
//! default route (whose device is the uplink).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::{
    route::{
        RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol,
        RouteScope, RouteType,
    },
    RouteNetlinkMessage,
};

use crate::{link::Link, Family, NetlinkError, Request, Rtnl};

/// A route, reduced to what aliasnet compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpAddr,
    pub dst_len: u8,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub scope: RouteScope,
    pub table: u32,
    pub priority: u32,
    pub kind: RouteType,
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(d) => Some(IpAddr::V4(*d)),
        RouteAddress::Inet6(d) => Some(IpAddr::V6(*d)),
        _ => None,
    }
}

fn unspecified(f: Family) -> IpAddr {
    match f {
        Family::Ipv4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Family::Ipv6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

impl Route {
    /// `None` for a message of another family than `family`.
    fn from_msg(m: RouteMessage, family: Family) -> Option<Self> {
        if m.header.address_family != family.af() {
            return None;
        }
        let mut r = Route {
            dst: unspecified(family),
            dst_len: m.header.destination_prefix_length,
            gateway: None,
            oif: None,
            scope: m.header.scope,
            table: u32::from(m.header.table),
            priority: 0,
            kind: m.header.kind,
        };
        for a in m.attributes {
            match a {
                RouteAttribute::Destination(d) => {
                    if let Some(d) = route_addr(&d) {
                        r.dst = d;
                    }
                }
                RouteAttribute::Gateway(g) => r.gateway = route_addr(&g),
                RouteAttribute::Oif(i) => r.oif = Some(i),
                RouteAttribute::Table(t) => r.table = t,
                RouteAttribute::Priority(p) => r.priority = p,
                RouteAttribute::MultiPath(hops) if r.oif.is_none() => {
                    // A multipath default route: the first hop's device stands for the uplink.
                    r.oif = hops.first().map(|h| h.interface_index);
                }
                _ => {}
            }
        }
        Some(r)
    }

    pub fn in_main_table(&self) -> bool {
        self.table == u32::from(RouteHeader::RT_TABLE_MAIN)
    }

    /// A unicast default route of the main table with a device.
    fn is_default(&self) -> bool {
        self.dst_len == 0
            && self.in_main_table()
            && self.kind == RouteType::Unicast
            && self.oif.is_some()
    }
}

fn route_message(dst: IpAddr, len: u8) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = Family::of(dst).af();
    m.header.destination_prefix_length = len;
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    m.header.protocol = RouteProtocol::Static;
    m.header.scope = RouteScope::Universe;
    m.header.kind = RouteType::Unicast;
    m.attributes.push(RouteAttribute::Destination(match dst {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }));
    m
}

/// `dst/len dev index`: scope link for IPv4 (a gateway's /32, the host's /32 to a pod); IPv6
/// routes have no link scope, on-link is implied by the device (the host's /128 to a pod,
/// resolved by neighbour discovery as the IPv4 /32 is by ARP).
pub fn add_link_route(index: u32, dst: IpAddr, len: u8) -> Request {
    let mut m = route_message(dst, len);
    if dst.is_ipv4() {
        m.header.scope = RouteScope::Link;
    }
    m.attributes.push(RouteAttribute::Oif(index));
    (RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_EXCL)
}

/// `dst/len via gw dev index` (`0.0.0.0/0` and `::/0` are the default routes). An IPv6
/// link-local gateway needs no route of its own: the device names its link. `gw` is of the
/// family of `dst`.
pub fn add_gateway_route(index: u32, dst: IpAddr, len: u8, gw: IpAddr) -> Request {
    debug_assert_eq!(
        Family::of(dst),
        Family::of(gw),
        "a route's gateway is of its family"
    );
    let mut m = route_message(dst, len);
    m.attributes.push(RouteAttribute::Gateway(match gw {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }));
    m.attributes.push(RouteAttribute::Oif(index));
    (RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_EXCL)
}

impl Rtnl {
    /// Every route of `family` (all tables).
    pub fn routes(&mut self, family: Family) -> Result<Vec<Route>, NetlinkError> {
        let mut req = RouteMessage::default();
        req.header.address_family = family.af();
        let op = match family {
            Family::Ipv4 => "list IPv4 routes",
            Family::Ipv6 => "list IPv6 routes",
        };
        Ok(self
            .request(RouteNetlinkMessage::GetRoute(req), NLM_F_DUMP, op)?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => Route::from_msg(r, family),
                _ => None,
            })
            .collect())
    }

    /// The device of `family`'s default route: one FIB lookup (`ip route get fibmatch`) of a
    /// documentation address (RFC 5737, RFC 3849: no real node routes them more
    /// specifically), so a node holding a host route per pod is not dumped on every ADD. Only
    /// a main-table unicast default with a device is taken (what the dump would choose: the
    /// lookup picks the lowest metric too); anything else, an error included, falls back to
    /// the dump's lowest-metric one.
    pub fn default_route_oif_of(&mut self, family: Family) -> Result<Option<u32>, NetlinkError> {
        let probe = match family {
            Family::Ipv4 => IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1)),
            Family::Ipv6 => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        };
        let mut m = route_message(probe, family.host_len());
        m.header.table = 0;
        m.header.protocol = RouteProtocol::Unspec;
        m.header.kind = RouteType::Unspec;
        m.header.flags = RouteFlags::FibMatch;
        if let Ok(replies) = self.request(
            RouteNetlinkMessage::GetRoute(m),
            0,
            "look up the default route",
        ) {
            let found = replies.into_iter().find_map(|r| match r {
                RouteNetlinkMessage::NewRoute(r) => Route::from_msg(r, family),
                _ => None,
            });
            if let Some(r) = found.filter(Route::is_default) {
                return Ok(r.oif);
            }
        }
        Ok(self
            .routes(family)?
            .iter()
            .filter(|r| r.is_default())
            .min_by_key(|r| r.priority)
            .and_then(|r| r.oif))
    }

    /// The device of the node's default route, the uplink: IPv4's, else (an IPv6-only node)
    /// IPv6's.
    pub fn default_route_oif(&mut self) -> Result<Option<u32>, NetlinkError> {
        match self.default_route_oif_of(Family::Ipv4)? {
            Some(oif) => Ok(Some(oif)),
            None => self.default_route_oif_of(Family::Ipv6),
        }
    }

    /// The uplink's link ([`Rtnl::default_route_oif`]).
    pub fn uplink(&mut self) -> Result<Option<Link>, NetlinkError> {
        match self.default_route_oif()? {
            Some(oif) => self.link(oif),
            None => Ok(None),
        }
    }
}
