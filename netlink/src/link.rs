//! Links: look-ups, the namespace's links, veth pairs, up, delete — and the one rule for
//! deleting a host link: only a veth is ever deleted ([`Rtnl::delete_veth`]).

use std::os::fd::{AsRawFd, BorrowedFd};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_ECHO, NLM_F_EXCL};
use netlink_packet_route::{
    link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
    RouteNetlinkMessage,
};

use crate::{is_not_found, NetlinkError, Request, Rtnl};

/// A link as `ip link` shows it, reduced to what aliasnet reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub mac: Option<[u8; 6]>,
    /// `IFLA_INFO_KIND` (`veth`, `bridge`, ...); `None` for devices without one (lo, NICs).
    pub kind: Option<String>,
    /// `IFLA_LINK`: for a veth, its peer's ifindex (in the peer's namespace).
    pub peer_index: Option<u32>,
    pub up: bool,
    /// The largest GSO and GRO aggregates it builds or takes; 0 when the kernel does not say.
    pub gso_max: u32,
    pub gro_max: u32,
}

impl Link {
    pub fn from_msg(m: &LinkMessage) -> Self {
        let mut l = Link {
            index: m.header.index,
            name: String::new(),
            mtu: 0,
            mac: None,
            kind: None,
            peer_index: None,
            up: m.header.flags.contains(LinkFlags::Up),
            gso_max: 0,
            gro_max: 0,
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => l.name.clone_from(n),
                LinkAttribute::Mtu(v) => l.mtu = *v,
                LinkAttribute::Address(a) => l.mac = a.as_slice().try_into().ok(),
                LinkAttribute::Link(i) => l.peer_index = Some(*i),
                LinkAttribute::GsoMaxSize(v) => l.gso_max = l.gso_max.max(*v),
                LinkAttribute::GroMaxSize(v) => l.gro_max = l.gro_max.max(*v),
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        if let LinkInfo::Kind(k) = i {
                            l.kind = Some(k.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        l
    }

    pub fn is_veth(&self) -> bool {
        self.kind.as_deref() == Some("veth")
    }

    /// The MAC as `ip link` prints it (`02:42:0a:00:00:05`).
    pub fn mac_string(&self) -> Option<String> {
        self.mac.map(|m| format_mac(&m))
    }
}

/// A hardware address in lower-case colon notation.
pub fn format_mac(m: &[u8]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What [`Rtnl::delete_veth`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    Deleted,
    /// There was no such link (already gone): fine.
    NotFound,
    /// The link is not a veth (a bridge or dummy given our name): left alone, with its kind.
    NotVeth(String),
}

fn link_message(index: u32, name: Option<&str>) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.index = index;
    if let Some(n) = name {
        m.attributes.push(LinkAttribute::IfName(n.to_owned()));
    }
    m
}

/// `ip link set dev <index> up`.
pub fn set_up(index: u32) -> Request {
    let mut m = link_message(index, None);
    m.header.flags |= LinkFlags::Up;
    m.header.change_mask |= LinkFlags::Up;
    (RouteNetlinkMessage::SetLink(m), 0)
}

/// A get of link `index` (its reply is the link).
pub fn get(index: u32) -> Request {
    (RouteNetlinkMessage::GetLink(link_message(index, None)), 0)
}

fn first_link(replies: Vec<RouteNetlinkMessage>) -> Option<Link> {
    replies.into_iter().find_map(|m| match m {
        RouteNetlinkMessage::NewLink(l) => Some(Link::from_msg(&l)),
        _ => None,
    })
}

/// The link of a get's replies ([`get`]); `None` for `ENODEV`.
pub fn link_of(reply: crate::Reply) -> Result<Option<Link>, NetlinkError> {
    match reply {
        Ok(r) => Ok(first_link(r)),
        Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Rtnl {
    /// Link `index`, if there is one.
    pub fn link(&mut self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let (msg, flags) = get(index);
        link_of(self.request(msg, flags, &format!("get link {index}")))
    }

    /// The link named `name`, if there is one.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let msg = RouteNetlinkMessage::GetLink(link_message(0, Some(name)));
        link_of(self.request(msg, 0, &format!("get link {name}")))
    }

    /// Every link of the namespace.
    pub fn links(&mut self) -> Result<Vec<Link>, NetlinkError> {
        let req = RouteNetlinkMessage::GetLink(LinkMessage::default());
        Ok(self
            .request(req, NLM_F_DUMP, "list links")?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(Link::from_msg(&l)),
                _ => None,
            })
            .collect())
    }

    /// Creates a veth pair in one request: `host` here, up, and `peer` created directly in the
    /// namespace `peer_ns` (no move afterwards), both with `mtu`. Returns the host end as the
    /// kernel made it (its index, MAC, and the peer's index). The peer cannot be created up
    /// (veth_open fails with ENOTCONN until the pair is linked, which happens after the peer's
    /// flags are applied): bring it up with [`set_up`] from its namespace.
    pub fn create_veth(
        &mut self,
        host: &str,
        peer: &str,
        peer_ns: BorrowedFd<'_>,
        mtu: u32,
        op: &str,
    ) -> Result<Link, NetlinkError> {
        let mut peer_msg = LinkMessage::default();
        peer_msg.attributes = vec![
            LinkAttribute::IfName(peer.to_owned()),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::NetNsFd(peer_ns.as_raw_fd()),
        ];
        let mut m = LinkMessage::default();
        m.header.flags |= LinkFlags::Up;
        m.header.change_mask |= LinkFlags::Up;
        m.attributes = vec![
            LinkAttribute::IfName(host.to_owned()),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Veth),
                LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
            ]),
        ];
        // The echo is the new link as the kernel announces it: no look-up afterwards.
        let replies = self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO,
            op,
        )?;
        match first_link(replies) {
            Some(l) if l.name == host => Ok(l),
            // A kernel that does not echo new links.
            _ => self
                .link_by_name(host)
                .map_err(|e| e.with_op(op))?
                .ok_or_else(|| NetlinkError::kernel(op, libc::ENODEV)),
        }
    }

    /// Makes `name` an IFB device with `mtu`, up; returns its ifindex. An IFB of that name is
    /// kept (its MTU set); a device of another kind is refused, as it is not ours.
    pub fn ensure_ifb(&mut self, name: &str, mtu: u32) -> Result<u32, NetlinkError> {
        let op = format!("create IFB device {name}");
        let index = match self.link_by_name(name)? {
            Some(l) if l.kind.as_deref() == Some("ifb") => l.index,
            Some(l) => {
                return Err(NetlinkError::Kernel {
                    op: format!(
                        "{op}: a {} device of that name exists",
                        l.kind.as_deref().unwrap_or("kindless")
                    ),
                    source: std::io::Error::from_raw_os_error(libc::EEXIST),
                })
            }
            None => {
                let mut m = link_message(0, Some(name));
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
        let mut m = link_message(index, None);
        m.header.flags |= LinkFlags::Up;
        m.header.change_mask |= LinkFlags::Up;
        m.attributes.push(LinkAttribute::Mtu(mtu));
        self.request(
            RouteNetlinkMessage::SetLink(m),
            0,
            &format!("set IFB device {name} up with MTU {mtu}"),
        )?;
        Ok(index)
    }

    /// Deletes link `ifindex` (one the caller made: a rollback, a device of its own); a missing
    /// one is not an error. For a link that may not be ours, [`Rtnl::delete_veth`].
    pub fn delete_link(&mut self, ifindex: u32) -> Result<(), NetlinkError> {
        let msg = RouteNetlinkMessage::DelLink(link_message(ifindex, None));
        match self.request(msg, 0, &format!("delete link {ifindex}")) {
            Err(e) if is_not_found(&e) => Ok(()),
            r => r.map(|_| ()),
        }
    }

    /// Deletes the host link `name` if it is a veth: aliasnet deletes nothing else, whatever
    /// its name. The link is looked up, checked, then deleted by its index, so a link created
    /// under that name in between is not touched.
    pub fn delete_veth(&mut self, name: &str) -> Result<Removed, NetlinkError> {
        let Some(l) = self.link_by_name(name)? else {
            return Ok(Removed::NotFound);
        };
        if !l.is_veth() {
            return Ok(Removed::NotVeth(
                l.kind.unwrap_or_else(|| "no kind".to_owned()),
            ));
        }
        let msg = RouteNetlinkMessage::DelLink(link_message(l.index, None));
        match self.request(msg, 0, &format!("delete veth {name}")) {
            Ok(_) => Ok(Removed::Deleted),
            Err(e) if is_not_found(&e) => Ok(Removed::NotFound),
            Err(e) => Err(e),
        }
    }
}
