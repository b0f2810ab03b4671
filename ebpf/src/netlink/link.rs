//! Links: the sizes a device hands its qdiscs, the namespace's links, the default route.

use std::net::Ipv4Addr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::{
    link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
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

    /// The link named `name`, if there is one.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>, NetlinkError> {
        Ok(self.links()?.into_iter().find(|l| l.name == name))
    }

    /// Makes `name` an IFB device with `mtu`, up; returns its ifindex. An IFB of that name is
    /// kept (its MTU set); a device of another kind is refused, as it is not ours.
    pub fn ensure_ifb(&mut self, name: &str, mtu: u32) -> Result<u32, NetlinkError> {
        let op = format!("create IFB device {name}");
        let index = match self.link_by_name(name)? {
            Some(l) if l.kind == "ifb" => l.index,
            Some(l) => {
                return Err(NetlinkError::Kernel {
                    op: format!("{op}: a {} device of that name exists", l.kind),
                    source: std::io::Error::from_raw_os_error(libc::EEXIST),
                })
            }
            None => {
                let mut m = LinkMessage::default();
                m.attributes.push(LinkAttribute::IfName(name.to_owned()));
                m.attributes
                    .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
                self.request(
                    RouteNetlinkMessage::NewLink(m),
                    NLM_F_CREATE | NLM_F_EXCL,
                    &op,
                )?;
                self.link_by_name(name)?
                    .ok_or_else(|| NetlinkError::Decode {
                        op: op.clone(),
                        reason: "the new device is not listed".to_owned(),
                    })?
                    .index
            }
        };
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.flags = LinkFlags::Up;
        m.header.change_mask = LinkFlags::Up;
        m.attributes.push(LinkAttribute::Mtu(mtu));
        self.request(
            RouteNetlinkMessage::SetLink(m),
            0,
            &format!("set IFB device {name} up with MTU {mtu}"),
        )?;
        Ok(index)
    }

    /// Deletes link `ifindex`; a missing one is not an error.
    pub fn delete_link(&mut self, ifindex: u32) -> Result<(), NetlinkError> {
        let mut m = LinkMessage::default();
        m.header.index = ifindex;
        match self.request(
            RouteNetlinkMessage::DelLink(m),
            0,
            &format!("delete link {ifindex}"),
        ) {
            Err(e) if matches!(e.errno(), Some(libc::ENODEV | libc::ENOENT)) => Ok(()),
            r => r.map(|_| ()),
        }
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
