//! THE route-netlink client of aliasnet, for the CNI plugin, aliasnet-ipamd, aliasnet-shaperd,
//! aliasnetctl and the datapath library alike: links ([`link`]), addresses ([`addr`]), routes
//! ([`route`]), neighbours ([`neigh`]), HTB and its leaves ([`tc`], [`stats`]) and clsact with
//! cls_bpf filters ([`clsact`]). Messages are netlink-packet-route's.
//!
//! A blocking socket, not an async one: the CNI plugin is exec'd per pod operation and starts
//! no runtime, aliasnetctl and short-lived namespace threads use it as they are, and the
//! daemons call it from a blocking task. The socket talks to the network namespace of the
//! thread that created it, for its whole life (see `aliasnet_netns`): a socket opened on a
//! short-lived thread inside a pod's namespace works on the pod from any thread.
//!
//! Requests of one step go out together ([`Batch`]): one `sendmsg` carries them all, the
//! kernel handles them in order (a later one may depend on an earlier one), and their acks are
//! read together, instead of one round trip each.

pub mod addr;
mod batch;
pub mod clsact;
pub mod link;
pub mod neigh;
pub mod route;
pub mod stats;
pub mod tc;

use std::{io, net::IpAddr};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

pub use addr::Addr;
pub use batch::Batch;
pub use clsact::{BpfFilter, FilterMode, Hook};
pub use link::{Link, Removed};
pub use neigh::Neighbour;
pub use netlink_packet_route;
pub use route::Route;
pub use stats::{QueueKind, QueueSize, TcStats};
pub use tc::{handle, HtbClassOptions, HtbRate, RootQdisc, TbfOptions};

/// A netlink request the kernel refused, or a socket failure.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(#[source] io::Error),
    /// The kernel's answer to `op` (what the caller was doing, in its words) was an errno.
    #[error("{op}: {source}")]
    Kernel {
        op: String,
        #[source]
        source: io::Error,
    },
    #[error("{op}: cannot decode reply: {reason}")]
    Decode { op: String, reason: String },
}

impl NetlinkError {
    /// The OS error behind the failure (the socket's, or the kernel's answer), if any.
    pub fn os_error(&self) -> Option<&io::Error> {
        match self {
            NetlinkError::Socket(e) | NetlinkError::Kernel { source: e, .. } => Some(e),
            NetlinkError::Decode { .. } => None,
        }
    }

    /// The errno the kernel answered with, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The kernel's answer without `op`: "File exists (os error 17)".
    pub fn detail(&self) -> String {
        match self {
            NetlinkError::Kernel { source, .. } => source.to_string(),
            other => other.to_string(),
        }
    }

    /// The same failure described as `op` (a caller that knows better what it was doing).
    pub fn with_op(self, op: impl Into<String>) -> Self {
        match self {
            NetlinkError::Kernel { source, .. } => NetlinkError::Kernel {
                op: op.into(),
                source,
            },
            NetlinkError::Decode { reason, .. } => NetlinkError::Decode {
                op: op.into(),
                reason,
            },
            s @ NetlinkError::Socket(_) => s,
        }
    }

    fn kernel(op: &str, errno: i32) -> Self {
        NetlinkError::Kernel {
            op: op.to_owned(),
            source: io::Error::from_raw_os_error(errno),
        }
    }
}

/// An address family of the kernel's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    /// Both, IPv4 first.
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::Ipv4,
            IpAddr::V6(_) => Family::Ipv6,
        }
    }

    /// The length of a host prefix (/32, /128).
    pub fn host_len(self) -> u8 {
        match self {
            Family::Ipv4 => 32,
            Family::Ipv6 => 128,
        }
    }

    fn af(self) -> AddressFamily {
        match self {
            Family::Ipv4 => AddressFamily::Inet,
            Family::Ipv6 => AddressFamily::Inet6,
        }
    }
}

/// A request as the kernel takes it: the message and its flags (NLM_F_CREATE, ...; NLM_F_REQUEST
/// and NLM_F_ACK are added when it is sent).
pub type Request = (RouteNetlinkMessage, u16);

/// A route-netlink socket in the network namespace of the thread that opened it.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

/// One request's outcome: the messages it got back (a get, a dump, an echo), or the kernel's
/// refusal.
pub type Reply = Result<Vec<RouteNetlinkMessage>, NetlinkError>;

impl Rtnl {
    /// Opens a socket in the calling thread's network namespace.
    pub fn new() -> Result<Self, NetlinkError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        sock.bind_auto().map_err(NetlinkError::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        // Errors carry the request's header only, not its payload back.
        sock.set_cap_ack(true).map_err(NetlinkError::Socket)?;
        // Dumps of many classes or routes fill more than a page per datagram.
        Ok(Self {
            sock,
            seq: 0,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    /// One request and the messages it gets back (the objects of a dump, the object of a get
    /// or an echo). `op` names it in errors.
    pub fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        op: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        let mut b = self.batch();
        b.push(msg, flags, op);
        b.replies()?.pop().expect("one request, one reply")
    }

    /// Requests to send together: see [`Batch`].
    pub fn batch(&mut self) -> Batch<'_> {
        Batch::new(self)
    }

    /// Serialises `msg` as the next request into `out`; returns its sequence number.
    fn encode(&mut self, msg: RouteNetlinkMessage, flags: u16, out: &mut Vec<u8>) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut hdr = NetlinkHeader::default();
        // Dumps end with NLMSG_DONE; everything else with an ACK (NLMSG_ERROR, code 0).
        hdr.flags = NLM_F_REQUEST | flags | if dump { 0 } else { NLM_F_ACK };
        hdr.sequence_number = self.seq;
        let mut nl = NetlinkMessage::new(hdr, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let start = out.len();
        out.resize(start + nl.buffer_len(), 0);
        nl.serialize(&mut out[start..]);
        self.seq
    }

    /// Sends `out` (requests `first..first + ops.len()`) and reads until every one of them has
    /// ended (ack, error or end of dump). Other sequence numbers are skipped.
    fn exchange(
        &mut self,
        out: &[u8],
        first: u32,
        ops: &[String],
    ) -> Result<Vec<Reply>, NetlinkError> {
        self.sock.send(out, 0).map_err(NetlinkError::Socket)?;
        let n = ops.len();
        let mut replies: Vec<Vec<RouteNetlinkMessage>> = (0..n).map(|_| Vec::new()).collect();
        let mut ended: Vec<Option<Result<(), NetlinkError>>> = (0..n).map(|_| None).collect();
        let mut open = n;
        while open > 0 {
            self.buf.clear();
            let got = self
                .sock
                .recv(&mut self.buf, 0)
                .map_err(NetlinkError::Socket)?;
            let data = &self.buf[..got.min(self.buf.len())];
            let mut off = 0;
            while off + 16 <= data.len() {
                let len =
                    u32::from_ne_bytes(data[off..off + 4].try_into().expect("4 bytes")) as usize;
                let seq = u32::from_ne_bytes(data[off + 8..off + 12].try_into().expect("4 bytes"));
                let i = seq.wrapping_sub(first) as usize;
                let op = ops.get(i).map_or("netlink reply", String::as_str);
                if len < 16 || off + len > data.len() {
                    return Err(NetlinkError::Decode {
                        op: op.to_owned(),
                        reason: format!("bad message length {len}"),
                    });
                }
                let frame = &data[off..off + len];
                off += len.next_multiple_of(4);
                if i >= n || ended[i].is_some() {
                    continue;
                }
                let msg =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(frame).map_err(|e| {
                        NetlinkError::Decode {
                            op: op.to_owned(),
                            reason: e.to_string(),
                        }
                    })?;
                let end = match msg.payload {
                    NetlinkPayload::Done(_) => Ok(()),
                    NetlinkPayload::Error(e) => match e.code {
                        None => Ok(()),
                        Some(code) => Err(NetlinkError::kernel(op, -code.get())),
                    },
                    NetlinkPayload::InnerMessage(m) => {
                        replies[i].push(m);
                        continue;
                    }
                    _ => continue,
                };
                ended[i] = Some(end);
                open -= 1;
            }
        }
        Ok(replies
            .into_iter()
            .zip(ended)
            .map(|(r, e)| e.expect("every request ended").map(|()| r))
            .collect())
    }
}

/// Errors that mean "there is nothing there": no such object (`ENOENT`) or device (`ENODEV`).
pub fn is_not_found(e: &NetlinkError) -> bool {
    matches!(e.errno(), Some(libc::ENOENT | libc::ENODEV))
}
