//! The little route-netlink aliasnetctl needs, over a synchronous socket: the links of the
//! current network namespace and a qdisc-kind probe. A CLI makes a handful of requests, so a
//! blocking socket (as the shaper's tc code uses) is simpler than an async runtime.

use std::{io, net::Ipv4Addr};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::{
    link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage},
    route::{RouteAddress, RouteAttribute, RouteMessage},
    tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcMessage, TcOption},
    AddressFamily, RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// A link as `ip link` would show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    /// `veth`, `bridge`, ...; empty for devices without a kind (lo, physical NICs).
    pub kind: String,
}

/// A synchronous route-netlink socket in the calling thread's network namespace.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    pub fn new() -> io::Result<Self> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Self {
            sock,
            seq: 0,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut hdr = NetlinkHeader::default();
        hdr.flags = NLM_F_REQUEST | flags | if dump { 0 } else { NLM_F_ACK };
        hdr.sequence_number = self.seq;
        let mut nl = NetlinkMessage::new(hdr, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let mut out = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut out);
        self.sock.send(&out, 0)?;
        let mut replies = Vec::new();
        loop {
            self.buf.clear();
            let n = self.sock.recv(&mut self.buf, 0)?;
            let data = &self.buf[..n.min(self.buf.len())];
            let mut off = 0;
            while off + 16 <= data.len() {
                let len =
                    u32::from_ne_bytes(data[off..off + 4].try_into().expect("4 bytes")) as usize;
                if len < 16 || off + len > data.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("netlink: bad message length {len}"),
                    ));
                }
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..off + len])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                off += len.next_multiple_of(4);
                if msg.header.sequence_number != self.seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(replies),
                            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                        }
                    }
                    NetlinkPayload::InnerMessage(m) => replies.push(m),
                    _ => {}
                }
            }
        }
    }

    /// Every link of the namespace.
    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        let req = RouteNetlinkMessage::GetLink(LinkMessage::default());
        let mut out = Vec::new();
        for m in self.request(req, NLM_F_DUMP)? {
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
    pub fn default_route_oif(&mut self) -> io::Result<Option<u32>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        let mut best: Option<(u32, u32)> = None;
        for m in self.request(RouteNetlinkMessage::GetRoute(msg), NLM_F_DUMP)? {
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

    /// Names of the cls_bpf programs filtering on the clsact `ingress` (or egress) hook of
    /// `ifindex`; empty without a clsact qdisc.
    pub fn bpf_filter_names(&mut self, ifindex: u32, ingress: bool) -> io::Result<Vec<String>> {
        let mut req = TcMessage::with_index(ifindex as i32);
        req.header.parent = TcHandle {
            major: 0xffff,
            minor: if ingress {
                TcHandle::MIN_INGRESS
            } else {
                TcHandle::MIN_EGRESS
            },
        };
        let replies = match self.request(RouteNetlinkMessage::GetTrafficFilter(req), NLM_F_DUMP) {
            // No clsact qdisc (EINVAL) or no device: no filters.
            Err(e) if matches!(e.raw_os_error(), Some(22 | 2 | 19)) => return Ok(Vec::new()),
            r => r?,
        };
        let mut out = Vec::new();
        for m in replies {
            let RouteNetlinkMessage::NewTrafficFilter(f) = m else {
                continue;
            };
            if f.header.index as u32 != ifindex {
                continue;
            }
            for a in &f.attributes {
                if let TcAttribute::Options(opts) = a {
                    for o in opts {
                        if let TcOption::Bpf(TcFilterBpfOption::ProgName(n)) = o {
                            out.push(n.clone());
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Tries to create a qdisc of `kind` on `ifindex` (`clsact` in its own slot, anything
    /// else as the root). Only for probing in a throwaway namespace: the qdisc is left for the
    /// namespace's destruction to remove.
    pub fn add_qdisc(&mut self, ifindex: u32, kind: &str) -> io::Result<()> {
        let mut m = TcMessage::with_index(ifindex as i32);
        if kind == "clsact" {
            m.header.parent = TcHandle::CLSACT;
            m.header.handle = TcHandle::from(0xffff_0000);
        } else {
            m.header.parent = TcHandle::ROOT;
        }
        m.attributes.push(TcAttribute::Kind(kind.to_owned()));
        self.request(
            RouteNetlinkMessage::NewQueueDiscipline(m),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(|_| ())
    }
}
