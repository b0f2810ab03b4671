//! Links: the sizes a device hands its qdiscs, the namespace's links, the default route.

use std::net::Ipv4Addr;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::{
    link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage},
    route::{RouteAddress, RouteAttribute, RouteMessage},
    AddressFamily, RouteNetlinkMessage,
};

use super::{NetlinkError, Rtnl};
use crate::shape::DeviceSizes;

/// A link as `ip link` would show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    /// `veth`, `bridge`, ...; empty for devices without a kind (lo, physical NICs).
    pub kind: String,
}

impl Rtnl {
    /// The packet sizes device `ifindex` hands its qdiscs: MTU, GSO and GRO maxima. A kernel
    /// that reports no GSO or GRO maximum has the classic 64 KiB one.
    pub fn link_sizes(&mut self, ifindex: u32) -> Result<DeviceSizes, NetlinkError> {
        let mut m = LinkMessage::default();
        m.header.index = ifindex;
        let op = format!("get link {ifindex}");
        let replies = self.request(RouteNetlinkMessage::GetLink(m), 0, &op)?;
        for r in replies {
            let RouteNetlinkMessage::NewLink(l) = r else {
                continue;
            };
            if l.header.index != ifindex {
                continue;
            }
            let mut sizes = DeviceSizes {
                mtu: 0,
                gso_max: 0,
                gro_max: 0,
            };
            for a in &l.attributes {
                match a {
                    LinkAttribute::Mtu(v) => sizes.mtu = *v,
                    LinkAttribute::GsoMaxSize(v) => sizes.gso_max = sizes.gso_max.max(*v),
                    LinkAttribute::GroMaxSize(v) => sizes.gro_max = sizes.gro_max.max(*v),
                    _ => {}
                }
            }
            if sizes.mtu == 0 {
                break;
            }
            for v in [&mut sizes.gso_max, &mut sizes.gro_max] {
                if *v == 0 {
                    *v = 65_536;
                }
            }
            return Ok(sizes);
        }
        Err(NetlinkError::Decode {
            op,
            reason: "no link message with an MTU in the reply".to_owned(),
        })
    }

    /// Every link of the namespace.
    pub fn links(&mut self) -> Result<Vec<Link>, NetlinkError> {
        let req = RouteNetlinkMessage::GetLink(LinkMessage::default());
        let mut out = Vec::new();
        for m in self.request(req, NLM_F_DUMP, "list links")? {
            let RouteNetlinkMessage::NewLink(l) = m else {
                continue;
            };
            let mut link = Link {
                index: l.header.index,
                name: String::new(),
                mtu: 0,
                kind: String::new(),
            };
            for a in &l.attributes {
                match a {
                    LinkAttribute::IfName(n) => link.name.clone_from(n),
                    LinkAttribute::Mtu(m) => link.mtu = *m,
                    LinkAttribute::LinkInfo(infos) => {
                        for i in infos {
                            if let LinkInfo::Kind(k) = i {
                                link.kind = match k {
                                    InfoKind::Veth => "veth".to_owned(),
                                    other => other.to_string(),
                                };
                            }
                        }
                    }
                    _ => {}
                }
            }
            out.push(link);
        }
        Ok(out)
    }

    /// Output interface index of the IPv4 default route with the lowest metric.
    pub fn default_route_oif(&mut self) -> Result<Option<u32>, NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        let req = RouteNetlinkMessage::GetRoute(msg);
        let mut best: Option<(u32, u32)> = None;
        for m in self.request(req, NLM_F_DUMP, "list IPv4 routes")? {
            let RouteNetlinkMessage::NewRoute(r) = m else {
                continue;
            };
            // Main table only (254); the kernel's local/broadcast routes live elsewhere.
            if r.header.destination_prefix_length != 0 || r.header.table != 254 {
                continue;
            }
            let mut oif = None;
            let mut metric = 0;
            let mut dst_set = false;
            for a in &r.attributes {
                match a {
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Priority(p) => metric = *p,
                    RouteAttribute::Destination(RouteAddress::Inet(d))
                        if *d != Ipv4Addr::UNSPECIFIED =>
                    {
                        dst_set = true;
                    }
                    _ => {}
                }
            }
            if let (Some(o), false) = (oif, dst_set) {
                if best.is_none_or(|(_, m)| metric < m) {
                    best = Some((o, metric));
                }
            }
        }
        Ok(best.map(|(o, _)| o))
    }
}
