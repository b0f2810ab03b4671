//! THE synchronous route-netlink client of aliasnet: links ([`link`]), HTB and its leaves
//! ([`tc`], [`stats`]) and clsact with cls_bpf filters ([`clsact`]).
//!
//! A blocking socket, not rtnetlink's async one: the CNI plugin, aliasnetctl and short-lived
//! setns threads use it without a runtime. The socket talks to the network namespace of the
//! thread that created it (see `aliasnet_netns`).

pub mod clsact;
pub mod link;
pub mod stats;
pub mod tc;

use std::io;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

pub use clsact::{BpfFilter, FilterMode, Hook};
pub use link::Link;
pub use stats::{QueueKind, QueueSize, TcStats};
pub use tc::{handle, HtbClass, RootQdisc};

/// A netlink request the kernel refused, or a socket failure.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(#[source] io::Error),
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
}

/// A route-netlink socket in the calling thread's network namespace.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    /// Opens a socket in the calling thread's network namespace.
    pub fn new() -> Result<Self, NetlinkError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        sock.bind_auto().map_err(NetlinkError::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        // Dumps of many classes can exceed one page per datagram.
        Ok(Self {
            sock,
            seq: 0,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    pub(crate) fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        op: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut hdr = NetlinkHeader::default();
        // Dumps end with NLMSG_DONE; everything else with an ACK (NLMSG_ERROR, code 0).
        hdr.flags = NLM_F_REQUEST | flags | if dump { 0 } else { NLM_F_ACK };
        hdr.sequence_number = self.seq;
        let mut nl = NetlinkMessage::new(hdr, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let mut out = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut out);
        self.sock.send(&out, 0).map_err(NetlinkError::Socket)?;

        let mut replies = Vec::new();
        loop {
            self.buf.clear();
            let n = self
                .sock
                .recv(&mut self.buf, 0)
                .map_err(NetlinkError::Socket)?;
            let data = &self.buf[..n.min(self.buf.len())];
            let mut off = 0;
            while off + 16 <= data.len() {
                let len =
                    u32::from_ne_bytes(data[off..off + 4].try_into().expect("4 bytes")) as usize;
                if len < 16 || off + len > data.len() {
                    return Err(NetlinkError::Decode {
                        op: op.to_owned(),
                        reason: format!("bad message length {len}"),
                    });
                }
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..off + len])
                    .map_err(|e| NetlinkError::Decode {
                        op: op.to_owned(),
                        reason: e.to_string(),
                    })?;
                off += len.next_multiple_of(4);
                if msg.header.sequence_number != self.seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::Error(e) => match e.code {
                        None => return Ok(replies),
                        Some(code) => {
                            return Err(NetlinkError::Kernel {
                                op: op.to_owned(),
                                source: io::Error::from_raw_os_error(-code.get()),
                            })
                        }
                    },
                    NetlinkPayload::InnerMessage(m) => replies.push(m),
                    _ => {}
                }
            }
        }
    }
}
