//! The IPv6 half of [`Nl`]: the pod's /128 without duplicate address detection, routes via the
//! link-local gateway, permanent neighbours, and the dumps CHECK compares.

use std::net::{IpAddr, Ipv6Addr};

use futures::TryStreamExt;
use rtnetlink::{
    packet_route::{
        address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage},
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
        route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteType},
        AddressFamily,
    },
    RouteMessageBuilder,
};

use super::{Nl, Route6};

/// The pod's IPv6 gateway. Link-local, so the same on every veth; the host veth carries it
/// (the pod can ping its gateway, and the host's neighbour solicitations towards the pod have
/// a valid source from the first packet on) and the pod holds a permanent neighbour for it.
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// An IPv6 address on a link, with the flags CHECK looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr6 {
    pub ip: Ipv6Addr,
    pub len: u8,
    /// Still in (or failed) duplicate address detection: unusable as a source.
    pub tentative: bool,
    pub nodad: bool,
}

impl Nl {
    /// `ip/len dev index nodad`: usable at once, no 1-2 s of tentative state. The addresses we
    /// assign are unique by construction (IPAM for the pod's, link scope for the gateway's).
    pub async fn add_addr6_nodad(
        &self,
        index: u32,
        ip: Ipv6Addr,
        len: u8,
    ) -> Result<(), rtnetlink::Error> {
        let mut req = self.handle.address().add(index, IpAddr::V6(ip), len);
        let m = req.message_mut();
        m.header.flags |= AddressHeaderFlags::Nodad;
        m.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
        req.execute().await
    }

    /// The IPv6 default route's device, for nodes without an IPv4 one: one FIB lookup of a
    /// documentation address (RFC 3849), else the main table's lowest-metric unicast default.
    pub async fn default_route6_oif(&self) -> Result<Option<u32>, rtnetlink::Error> {
        const PROBE: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet6;
        msg.header.destination_prefix_length = 128;
        msg.header.flags = RouteFlags::FibMatch;
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet6(PROBE)));
        let is_default =
            |r: &Route6| r.dst_len == 0 && r.in_main_table() && r.kind == RouteType::Unicast;
        if let Ok(Some(m)) = self.handle.route().get(msg).execute().try_next().await {
            let r = Route6::from_msg(m);
            if is_default(&r) && r.oif.is_some() {
                return Ok(r.oif);
            }
        }
        let routes = self.routes_v6().await?;
        Ok(routes
            .iter()
            .filter(|r| is_default(r) && r.oif.is_some())
            .min_by_key(|r| r.priority)
            .and_then(|r| r.oif))
    }

    /// Every IPv6 route (all tables).
    pub async fn routes_v6(&self) -> Result<Vec<Route6>, rtnetlink::Error> {
        let req = RouteMessageBuilder::<Ipv6Addr>::new().build();
        self.handle
            .route()
            .get(req)
            .execute()
            .map_ok(Route6::from_msg)
            .try_collect()
            .await
    }

    /// IPv6 addresses on `index`.
    pub async fn addrs_v6(&self, index: u32) -> Result<Vec<Addr6>, rtnetlink::Error> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await?;
        Ok(msgs
            .into_iter()
            .filter(|m| m.header.index == index && m.header.family == AddressFamily::Inet6)
            .filter_map(|m| {
                let len = m.header.prefix_len;
                // IFA_FLAGS carries all 32 bits; the header byte is the older, partial copy.
                let mut flags = AddressFlags::from_bits_retain(u32::from(m.header.flags.bits()));
                let mut ip = None;
                for a in m.attributes {
                    match a {
                        AddressAttribute::Address(IpAddr::V6(a)) => ip = Some(a),
                        AddressAttribute::Flags(f) => flags = f,
                        _ => {}
                    }
                }
                ip.map(|ip| Addr6 {
                    ip,
                    len,
                    tentative: flags.intersects(AddressFlags::Tentative | AddressFlags::Dadfailed),
                    nodad: flags.contains(AddressFlags::Nodad),
                })
            })
            .collect())
    }

    /// IPv6 neighbours on `index`: (ip, lladdr, state is permanent).
    pub async fn neighbours_v6(
        &self,
        index: u32,
    ) -> Result<Vec<(Ipv6Addr, Option<Vec<u8>>, bool)>, rtnetlink::Error> {
        let msgs: Vec<NeighbourMessage> = self
            .handle
            .neighbours()
            .get()
            .set_address_family(AddressFamily::Inet6)
            .execute()
            .try_collect()
            .await?;
        Ok(msgs
            .into_iter()
            .filter(|m| m.header.ifindex == index)
            .filter_map(|m| {
                let permanent = m.header.state == NeighbourState::Permanent;
                let mut ip = None;
                let mut ll = None;
                for a in m.attributes {
                    match a {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet6(d)) => ip = Some(d),
                        NeighbourAttribute::LinkLayerAddress(l) => ll = Some(l),
                        _ => {}
                    }
                }
                ip.map(|ip| (ip, ll, permanent))
            })
            .collect())
    }
}
