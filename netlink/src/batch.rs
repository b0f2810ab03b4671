//! Requests of one step sent together: one `sendmsg`, their acks read together.

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::RouteNetlinkMessage;

use crate::{NetlinkError, Reply, Request, Rtnl};

/// Requests queued on one socket, sent by [`Batch::run`] or [`Batch::replies`].
///
/// The kernel takes them in the order pushed, each on its own: a failed one does not stop the
/// ones after it, and a later one sees what an earlier one did (a route through a gateway
/// after the gateway's link route). At most one dump, and only as the last request: a socket
/// runs one dump at a time.
pub struct Batch<'a> {
    rtnl: &'a mut Rtnl,
    out: Vec<u8>,
    first: u32,
    ops: Vec<String>,
    dump: bool,
}

impl<'a> Batch<'a> {
    pub(crate) fn new(rtnl: &'a mut Rtnl) -> Self {
        Self {
            rtnl,
            out: Vec::with_capacity(1024),
            first: 0,
            ops: Vec::new(),
            dump: false,
        }
    }

    /// Queues `msg` with `flags` (NLM_F_REQUEST and NLM_F_ACK are added); `op` names it in
    /// errors.
    pub fn push(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        op: impl Into<String>,
    ) -> &mut Self {
        assert!(!self.dump, "a dump must be the last request of a batch");
        self.dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let seq = self.rtnl.encode(msg, flags, &mut self.out);
        if self.ops.is_empty() {
            self.first = seq;
        }
        self.ops.push(op.into());
        self
    }

    /// Queues a request built by this crate ([`crate::link::set_up`], ...).
    pub fn add(&mut self, req: Request, op: impl Into<String>) -> &mut Self {
        self.push(req.0, req.1, op)
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Sends every request and waits for all of them; each one's outcome, in push order. The
    /// outer error is the socket's (nothing known about the requests).
    pub fn replies(self) -> Result<Vec<Reply>, NetlinkError> {
        if self.ops.is_empty() {
            return Ok(Vec::new());
        }
        self.rtnl.exchange(&self.out, self.first, &self.ops)
    }

    /// Sends every request and waits for all of them; the first failure in push order, if any.
    pub fn run(self) -> Result<(), NetlinkError> {
        for r in self.replies()? {
            r?;
        }
        Ok(())
    }
}
