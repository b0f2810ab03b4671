//! Thin wrapper over rtnetlink for the few operations aliasnet needs.
//!
//! Each [`Nl`] owns one rtnetlink socket; the socket's netns is the one the creating thread was
//! in at creation time (see [`crate::netns::NetNs::enter`]).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, BorrowedFd},
};

use aliasnet_cni_types::{code, CniError};
use futures::TryStreamExt;
use rtnetlink::{
    packet_route::{
        address::{AddressAttribute, AddressMessage},
        link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage},
        route::{
            RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteScope,
            RouteType,
        },
        AddressFamily,
    },
    Handle, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder,
};

mod v6;

pub use v6::GATEWAY6;

/// Link-local gateway every pod routes through; answered by the permanent neighbour entry.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

pub struct Nl {
    handle: Handle,
}

/// The negative errno of a netlink error reply, as a positive errno.
pub fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// A route whose prefix and gateway are of different families (a caller's bug).
fn invalid_route(e: impl std::fmt::Display) -> rtnetlink::Error {
    rtnetlink::Error::InvalidNla(e.to_string())
}

/// A code-106 error for a failed netlink `op`.
pub fn nl_err(op: impl std::fmt::Display, e: rtnetlink::Error) -> CniError {
    let detail = match errno(&e) {
        Some(n) => std::io::Error::from_raw_os_error(n).to_string(),
        None => e.to_string(),
    };
    CniError::new(code::NETLINK, format!("{op}: {detail}"))
}

/// What a link dump tells us that we use.
#[derive(Debug, Clone)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
    /// For a veth: the peer's ifindex (in the peer's netns).
    pub peer_index: Option<u32>,
    pub is_veth: bool,
    pub up: bool,
}

impl Link {
    fn from_msg(m: LinkMessage) -> Self {
        let mut l = Link {
            index: m.header.index,
            name: String::new(),
            mtu: None,
            mac: None,
            peer_index: None,
            is_veth: false,
            up: m.header.flags.contains(LinkFlags::Up),
        };
        for a in m.attributes {
            match a {
                LinkAttribute::IfName(n) => l.name = n,
                LinkAttribute::Mtu(v) => l.mtu = Some(v),
                LinkAttribute::Address(a) => l.mac = a.try_into().ok(),
                LinkAttribute::Link(i) => l.peer_index = Some(i),
                LinkAttribute::LinkInfo(infos) => {
                    l.is_veth = infos
                        .iter()
                        .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Veth)))
                }
                _ => {}
            }
        }
        l
    }

    pub fn mac_string(&self) -> Option<String> {
        self.mac.map(|m| format_mac(&m))
    }
}

pub fn format_mac(m: &[u8]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A family's addresses as route attributes carry them.
pub trait RouteAddr: Copy {
    const UNSPECIFIED: Self;
    /// The address, if `a` is of this family.
    fn of(a: RouteAddress) -> Option<Self>;
}

impl RouteAddr for Ipv4Addr {
    const UNSPECIFIED: Self = Ipv4Addr::UNSPECIFIED;
    fn of(a: RouteAddress) -> Option<Self> {
        match a {
            RouteAddress::Inet(d) => Some(d),
            _ => None,
        }
    }
}

impl RouteAddr for Ipv6Addr {
    const UNSPECIFIED: Self = Ipv6Addr::UNSPECIFIED;
    fn of(a: RouteAddress) -> Option<Self> {
        match a {
            RouteAddress::Inet6(d) => Some(d),
            _ => None,
        }
    }
}

/// A route of family `A`, reduced to what we compare.
#[derive(Debug, Clone)]
pub struct Route<A> {
    pub dst: A,
    pub dst_len: u8,
    pub gateway: Option<A>,
    pub oif: Option<u32>,
    pub scope: RouteScope,
    pub table: u32,
    pub priority: u32,
    pub kind: RouteType,
}

pub type Route4 = Route<Ipv4Addr>;
pub type Route6 = Route<Ipv6Addr>;

impl<A: RouteAddr> Route<A> {
    fn from_msg(m: RouteMessage) -> Self {
        let mut r = Route {
            dst: A::UNSPECIFIED,
            dst_len: m.header.destination_prefix_length,
            gateway: None,
            oif: None,
            scope: m.header.scope,
            table: m.header.table as u32,
            priority: 0,
            kind: m.header.kind,
        };
        for a in m.attributes {
            match a {
                RouteAttribute::Destination(d) => {
                    if let Some(d) = A::of(d) {
                        r.dst = d;
                    }
                }
                RouteAttribute::Gateway(g) => {
                    if let Some(g) = A::of(g) {
                        r.gateway = Some(g);
                    }
                }
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
        r
    }

    pub fn in_main_table(&self) -> bool {
        self.table == RouteHeader::RT_TABLE_MAIN as u32
    }
}

impl Nl {
    /// Open a socket in the calling thread's current netns; its driver task is spawned on the
    /// current tokio runtime.
    pub fn connect() -> Result<Self, CniError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| {
            CniError::new(code::NETLINK, format!("cannot open a netlink socket: {e}"))
        })?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>, rtnetlink::Error> {
        let res = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute()
            .try_next()
            .await;
        match res {
            Ok(m) => Ok(m.map(Link::from_msg)),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>, rtnetlink::Error> {
        let res = self
            .handle
            .link()
            .get()
            .match_index(index)
            .execute()
            .try_next()
            .await;
        match res {
            Ok(m) => Ok(m.map(Link::from_msg)),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Create a veth pair: `host` here, `peer` created directly in the netns `peer_ns` (no
    /// move afterwards), both with `mtu`; the host end comes up, the peer needs [`Nl::set_up`].
    pub async fn create_veth(
        &self,
        host: &str,
        peer: &str,
        peer_ns: BorrowedFd<'_>,
        mtu: u32,
    ) -> Result<(), rtnetlink::Error> {
        // The peer cannot be created up: veth_open fails with ENOTCONN until the pair is
        // linked, which happens after the peer's flags are applied. The host end can.
        let peer_msg = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer.to_owned())
            .mtu(mtu)
            .setns_by_fd(peer_ns.as_raw_fd())
            .build();
        let msg = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
            .name(host.to_owned())
            .mtu(mtu)
            .up()
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
            .build();
        self.handle.link().add(msg).execute().await
    }

    pub async fn set_up(&self, index: u32) -> Result<(), rtnetlink::Error> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
    }

    /// Delete a link by name; returns false when there was none.
    pub async fn del_link_by_name(&self, name: &str) -> Result<bool, rtnetlink::Error> {
        let msg = LinkUnspec::new_with_name(name).build();
        match self.handle.link().del_with_message(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub async fn add_addr32(&self, index: u32, ip: Ipv4Addr) -> Result<(), rtnetlink::Error> {
        self.handle
            .address()
            .add(index, IpAddr::V4(ip), 32)
            .execute()
            .await
    }

    /// `dst/len dev index`: scope link for IPv4 (the gateway's /32, the host's /32 to a pod);
    /// IPv6 routes have no link scope, on-link is implied by the device (the host's /128 to a
    /// pod, resolved by neighbour discovery as the IPv4 /32 is by ARP).
    pub async fn add_link_route(
        &self,
        index: u32,
        dst: IpAddr,
        len: u8,
    ) -> Result<(), rtnetlink::Error> {
        let scope = match dst {
            IpAddr::V4(_) => RouteScope::Link,
            IpAddr::V6(_) => RouteScope::Universe,
        };
        let msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst, len)
            .map_err(invalid_route)?
            .output_interface(index)
            .scope(scope)
            .build();
        self.handle.route().add(msg).execute().await
    }

    /// `dst/len via gw dev index` (`0.0.0.0/0` and `::/0` are the default routes). An IPv6
    /// link-local gateway needs no route of its own: the device names its link.
    pub async fn add_gateway_route(
        &self,
        index: u32,
        dst: IpAddr,
        len: u8,
        gw: IpAddr,
    ) -> Result<(), rtnetlink::Error> {
        let msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst, len)
            .and_then(|b| b.gateway(gw))
            .map_err(invalid_route)?
            .output_interface(index)
            .build();
        self.handle.route().add(msg).execute().await
    }

    /// Permanent neighbour `ip lladdr mac dev index` (no ARP or neighbour discovery for it, ever).
    pub async fn add_permanent_neigh(
        &self,
        index: u32,
        ip: IpAddr,
        mac: &[u8; 6],
    ) -> Result<(), rtnetlink::Error> {
        self.handle
            .neighbours()
            .add(index, ip)
            .link_layer_address(mac)
            .execute()
            .await
    }

    /// Every IPv4 route (all tables).
    /// The default route's device, from one FIB lookup (`ip route get fibmatch`) of a
    /// documentation address (RFC 5737: no real node routes it more specifically). A node
    /// holds a /32 per pod, so this replaces dumping and parsing every route on each ADD. Only
    /// a main-table unicast default with one device is taken (what the dump would choose: the
    /// kernel's lookup picks the lowest metric too); anything else, an error included, falls
    /// back to the dump.
    async fn default_route_oif_by_lookup(&self) -> Option<u32> {
        const PROBE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.destination_prefix_length = 32;
        msg.header.flags = RouteFlags::FibMatch;
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet(PROBE)));
        let m = self
            .handle
            .route()
            .get(msg)
            .execute()
            .try_next()
            .await
            .ok()??;
        let r = Route4::from_msg(m);
        (r.dst_len == 0 && r.in_main_table() && r.kind == RouteType::Unicast)
            .then_some(r.oif)
            .flatten()
    }

    pub async fn routes_v4(&self) -> Result<Vec<Route4>, rtnetlink::Error> {
        let req = RouteMessageBuilder::<Ipv4Addr>::new().build();
        self.handle
            .route()
            .get(req)
            .execute()
            .map_ok(Route4::from_msg)
            .try_collect()
            .await
    }

    /// IPv4 addresses (address, prefix length) on `index`.
    pub async fn addrs_v4(&self, index: u32) -> Result<Vec<(Ipv4Addr, u8)>, rtnetlink::Error> {
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
            .filter(|m| m.header.index == index && m.header.family == AddressFamily::Inet)
            .filter_map(|m| {
                let len = m.header.prefix_len;
                m.attributes.into_iter().find_map(|a| match a {
                    AddressAttribute::Local(IpAddr::V4(ip)) => Some((ip, len)),
                    _ => None,
                })
            })
            .collect())
    }

    /// IPv4 neighbours on `index`: (ip, lladdr, state is permanent).
    pub async fn neighbours_v4(
        &self,
        index: u32,
    ) -> Result<Vec<(Ipv4Addr, Option<Vec<u8>>, bool)>, rtnetlink::Error> {
        let msgs: Vec<NeighbourMessage> = self
            .handle
            .neighbours()
            .get()
            .set_address_family(AddressFamily::Inet)
            .execute()
            .try_collect()
            .await?;
        Ok(msgs
            .into_iter()
            .filter(|m| m.header.ifindex == index)
            .filter_map(|m| {
                let permanent =
                    m.header.state == rtnetlink::packet_route::neighbour::NeighbourState::Permanent;
                let mut ip = None;
                let mut ll = None;
                for a in m.attributes {
                    match a {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => ip = Some(d),
                        NeighbourAttribute::LinkLayerAddress(l) => ll = Some(l),
                        _ => {}
                    }
                }
                ip.map(|ip| (ip, ll, permanent))
            })
            .collect())
    }

    /// MTU of the interface of the main table's default route (lowest metric wins), the IPv6
    /// one when there is no IPv4 one.
    pub async fn default_route_mtu(&self) -> Result<Option<(String, u32)>, rtnetlink::Error> {
        let oif = match self.default_route_oif_by_lookup().await {
            Some(oif) => oif,
            None => {
                let routes = self.routes_v4().await?;
                let best = routes
                    .iter()
                    .filter(|r| r.dst_len == 0 && r.in_main_table() && r.kind == RouteType::Unicast)
                    .filter(|r| r.oif.is_some())
                    .min_by_key(|r| r.priority);
                match best.and_then(|r| r.oif) {
                    Some(oif) => oif,
                    // An IPv6-only node.
                    None => match self.default_route6_oif().await? {
                        Some(oif) => oif,
                        None => return Ok(None),
                    },
                }
            }
        };
        Ok(self
            .link_by_index(oif)
            .await?
            .and_then(|l| l.mtu.map(|m| (l.name, m))))
    }
}
