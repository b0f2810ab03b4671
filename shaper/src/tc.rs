//! HTB qdiscs and classes over a synchronous rtnetlink socket.
//!
//! netlink-packet-route has no HTB or FIFO option types, so their `TCA_OPTIONS` payloads are
//! encoded here from `linux/pkt_sched.h`. The socket talks to the network namespace of the
//! thread that created it (see `crate::netns`).

use std::io;

use netlink_packet_core::{
    DefaultNla, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NLM_F_ACK, NLM_F_CREATE,
    NLM_F_DUMP, NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::{
    link::{LinkAttribute, LinkMessage},
    tc::{TcAttribute, TcHandle, TcMessage, TcStats2},
    RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::limits::{DeviceSizes, Shape};

/// A netlink request the kernel refused, or a socket failure.
#[derive(Debug, thiserror::Error)]
pub enum TcError {
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

impl TcError {
    /// The errno the kernel answered with, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            TcError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

// linux/pkt_sched.h
const TCA_OPTIONS: u16 = 2;
const TCA_HTB_PARMS: u16 = 1;
const TCA_HTB_INIT: u16 = 2;
const TCA_HTB_DIRECT_QLEN: u16 = 5;
const TCA_HTB_RATE64: u16 = 6;
const TCA_HTB_CEIL64: u16 = 7;
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
const NLA_F_NESTED: u16 = 1 << 15;
const TC_LINKLAYER_ETHERNET: u8 = 1;
const TC_HTB_PROTOVER: u32 = 3;
/// psched ticks are 64 ns (PSCHED_SHIFT 6).
const NS_PER_TICK: u128 = 64;

/// `major:minor` as the kernel packs it.
pub const fn handle(major: u16, minor: u16) -> u32 {
    ((major as u32) << 16) | minor as u32
}

/// One HTB class to create or change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtbClass {
    pub classid: u32,
    pub parent: u32,
    /// Guaranteed rate and its burst.
    pub rate: Shape,
    /// Ceiling (borrowing limit) and its burst; equal to `rate` for a hard limit.
    pub ceil: Shape,
    /// HTB priority among siblings (0 is served first).
    pub prio: u32,
}

/// Counters of one class or qdisc.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcStats {
    pub handle: u32,
    pub parent: u32,
    pub bytes: u64,
    pub packets: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub backlog: u64,
}

/// The sizes of one shaping point as the kernel reports them (see [`Rtnl::queue_sizes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSize {
    /// Class id (HTB class) or qdisc handle (leaf).
    pub handle: u32,
    pub parent: u32,
    pub kind: QueueKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueKind {
    /// An HTB class: `rate` bytes/s, and the bytes its burst lets through at once.
    HtbClass { rate: u64, burst_bytes: u64 },
    /// A tbf: `rate` bytes/s, its bucket (the largest packet it passes unsegmented) and its
    /// queue limit, in bytes.
    Tbf {
        rate: u64,
        bucket_bytes: u64,
        limit_bytes: u64,
    },
    /// A packet FIFO of `limit` packets.
    Pfifo { limit: u32 },
}

impl QueueSize {
    /// Bytes that the kernel's 64 ns tick rounding can take off a size at this point's rate.
    pub fn rounding(&self) -> u64 {
        let rate = match self.kind {
            QueueKind::HtbClass { rate, .. } | QueueKind::Tbf { rate, .. } => rate,
            QueueKind::Pfifo { .. } => 0,
        };
        (u128::from(rate) * NS_PER_TICK / 1_000_000_000) as u64 + 1
    }

    /// What is smaller than a `frame`-byte packet here, if anything.
    pub fn below_frame(&self, frame: u64) -> Option<String> {
        let min = frame.saturating_sub(self.rounding());
        match self.kind {
            QueueKind::HtbClass { burst_bytes, .. } if burst_bytes < min => {
                Some(format!("HTB burst {burst_bytes} B"))
            }
            QueueKind::Tbf { bucket_bytes, .. } if bucket_bytes < min => {
                Some(format!("tbf bucket {bucket_bytes} B"))
            }
            QueueKind::Tbf { limit_bytes, .. } if limit_bytes < frame => {
                Some(format!("tbf queue limit {limit_bytes} B"))
            }
            QueueKind::Pfifo { limit: 0 } => Some("pfifo limit 0 packets".to_owned()),
            _ => None,
        }
    }
}

/// Bytes sent in `ticks` psched ticks at `bytes_per_sec`.
fn ticks_to_bytes(ticks: u32, bytes_per_sec: u64) -> u64 {
    (u128::from(ticks) * NS_PER_TICK * u128::from(bytes_per_sec) / 1_000_000_000) as u64
}

/// The raw payload of a non-nested `TCA_OPTIONS` (netlink-packet-route keeps HTB, tbf and
/// FIFO options undecoded), and the nested attributes in it.
fn raw_options(m: &TcMessage) -> Option<Vec<u8>> {
    m.attributes.iter().find_map(|a| match a {
        TcAttribute::Options(opts) => opts.iter().find_map(|o| match o {
            netlink_packet_route::tc::TcOption::Other(nla) => {
                let mut v = vec![0u8; nla.value_len()];
                nla.emit_value(&mut v);
                Some(v)
            }
            _ => None,
        }),
        _ => None,
    })
}

fn nested(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 4 <= buf.len() {
        let len = usize::from(u16::from_ne_bytes([buf[i], buf[i + 1]]));
        let kind = u16::from_ne_bytes([buf[i + 2], buf[i + 3]]) & !NLA_F_NESTED;
        if len < 4 || i + len > buf.len() {
            break;
        }
        out.push((kind, &buf[i + 4..i + len]));
        i += len.next_multiple_of(4);
    }
    out
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn u64_of(b: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(..8)?.try_into().ok()?))
}

fn kind_of(m: &TcMessage) -> String {
    m.attributes
        .iter()
        .find_map(|a| match a {
            TcAttribute::Kind(k) => Some(k.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// The sizes of an HTB class, tbf or pfifo message; `None` for anything else.
fn queue_size_of(m: &TcMessage) -> Option<QueueSize> {
    let kind = kind_of(m);
    let opts = raw_options(m)?;
    let kind = match kind.as_str() {
        "htb" => {
            let attrs = nested(&opts);
            let parms = attrs.iter().find(|(k, _)| *k == TCA_HTB_PARMS)?.1;
            // struct tc_htb_opt { rate, ceil (tc_ratespec, 12 bytes each), buffer, cbuffer, .. }
            let mut rate = u64::from(u32_at(parms, 8)?);
            if let Some((_, v)) = attrs.iter().find(|(k, _)| *k == TCA_HTB_RATE64) {
                rate = u64_of(v)?;
            }
            QueueKind::HtbClass {
                rate,
                burst_bytes: ticks_to_bytes(u32_at(parms, 24)?, rate),
            }
        }
        "tbf" => {
            let attrs = nested(&opts);
            let parms = attrs.iter().find(|(k, _)| *k == TCA_TBF_PARMS)?.1;
            // struct tc_tbf_qopt { rate, peakrate (12 bytes each), limit, buffer, mtu }
            let mut rate = u64::from(u32_at(parms, 8)?);
            if let Some((_, v)) = attrs.iter().find(|(k, _)| *k == TCA_TBF_RATE64) {
                rate = u64_of(v)?;
            }
            QueueKind::Tbf {
                rate,
                bucket_bytes: ticks_to_bytes(u32_at(parms, 28)?, rate),
                limit_bytes: u64::from(u32_at(parms, 24)?),
            }
        }
        "pfifo" => QueueKind::Pfifo {
            limit: u32_at(&opts, 0)?,
        },
        _ => return None,
    };
    Some(QueueSize {
        handle: u32::from(m.header.handle),
        parent: u32::from(m.header.parent),
        kind,
    })
}

/// What sits at the root of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootQdisc {
    pub kind: String,
    pub handle: u32,
}

/// A route-netlink socket in the calling thread's network namespace.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn nla(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut v = Vec::with_capacity(len.next_multiple_of(4));
    v.extend_from_slice(&(len as u16).to_ne_bytes());
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(len.next_multiple_of(4), 0);
    v
}

/// `struct tc_ratespec` with the rate in bytes/s (saturated; the 64-bit value goes in
/// TCA_HTB_RATE64/CEIL64). Ethernet link layer: the kernel then needs no rate table.
fn ratespec(bytes_per_sec: u64) -> [u8; 12] {
    let mut r = [0u8; 12];
    r[1] = TC_LINKLAYER_ETHERNET;
    r[8..12].copy_from_slice(&(bytes_per_sec.min(u64::from(u32::MAX)) as u32).to_ne_bytes());
    r
}

/// Time to send `bytes` at `bytes_per_sec`, in psched ticks (HTB's buffer unit).
fn ticks(bytes: u64, bytes_per_sec: u64) -> u32 {
    let ns = u128::from(bytes) * 1_000_000_000 / u128::from(bytes_per_sec.max(1));
    (ns / NS_PER_TICK).min(u128::from(u32::MAX)) as u32
}

fn htb_class_options(c: &HtbClass) -> Vec<u8> {
    let rate = (c.rate.rate / 8).max(1);
    let ceil = (c.ceil.rate / 8).max(1);
    // The DRR quantum used when siblings borrow: ~1/10 s of rate within HTB's sane range
    // (setting it avoids the kernel's "quantum is big/small" warnings), and at least one of
    // the device's frames, so that a class sends a full-size frame in one round.
    let frame = c.ceil.frame.max(c.rate.frame);
    let quantum = (rate / 10).clamp(1600.max(frame), 200_000.max(frame)) as u32;
    let mut parms = Vec::with_capacity(44);
    parms.extend_from_slice(&ratespec(rate));
    parms.extend_from_slice(&ratespec(ceil));
    parms.extend_from_slice(&ticks(c.rate.burst_bytes, rate).to_ne_bytes());
    parms.extend_from_slice(&ticks(c.ceil.burst_bytes, ceil).to_ne_bytes());
    parms.extend_from_slice(&quantum.to_ne_bytes());
    parms.extend_from_slice(&0u32.to_ne_bytes()); // level
    parms.extend_from_slice(&c.prio.to_ne_bytes());
    let mut opts = nla(TCA_HTB_PARMS, &parms);
    if rate >= u64::from(u32::MAX) {
        opts.extend(nla(TCA_HTB_RATE64, &rate.to_ne_bytes()));
    }
    if ceil >= u64::from(u32::MAX) {
        opts.extend(nla(TCA_HTB_CEIL64, &ceil.to_ne_bytes()));
    }
    opts
}

fn htb_qdisc_options(defcls: u16, direct_qlen: u32) -> Vec<u8> {
    let mut glob = Vec::with_capacity(20);
    glob.extend_from_slice(&TC_HTB_PROTOVER.to_ne_bytes());
    glob.extend_from_slice(&10u32.to_ne_bytes()); // rate2quantum (unused: quanta are explicit)
    glob.extend_from_slice(&u32::from(defcls).to_ne_bytes());
    glob.extend_from_slice(&0u32.to_ne_bytes()); // debug
    glob.extend_from_slice(&0u32.to_ne_bytes()); // direct_pkts
    let mut opts = nla(TCA_HTB_INIT, &glob);
    opts.extend(nla(TCA_HTB_DIRECT_QLEN, &direct_qlen.to_ne_bytes()));
    opts
}

fn tc_message(ifindex: u32, handle: u32, parent: u32) -> TcMessage {
    let mut m = TcMessage::with_index(ifindex as i32);
    m.header.handle = TcHandle::from(handle);
    m.header.parent = TcHandle::from(parent);
    m
}

impl Rtnl {
    /// Opens a socket in the calling thread's network namespace.
    pub fn new() -> Result<Self, TcError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(TcError::Socket)?;
        sock.bind_auto().map_err(TcError::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(TcError::Socket)?;
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
    ) -> Result<Vec<RouteNetlinkMessage>, TcError> {
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
        self.sock.send(&out, 0).map_err(TcError::Socket)?;

        let mut replies = Vec::new();
        loop {
            self.buf.clear();
            let n = self.sock.recv(&mut self.buf, 0).map_err(TcError::Socket)?;
            let data = &self.buf[..n.min(self.buf.len())];
            let mut off = 0;
            while off + 16 <= data.len() {
                let len =
                    u32::from_ne_bytes(data[off..off + 4].try_into().expect("4 bytes")) as usize;
                if len < 16 || off + len > data.len() {
                    return Err(TcError::Decode {
                        op: op.to_owned(),
                        reason: format!("bad message length {len}"),
                    });
                }
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..off + len])
                    .map_err(|e| TcError::Decode {
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
                            return Err(TcError::Kernel {
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

    /// The packet sizes device `ifindex` hands its qdiscs: MTU, GSO and GRO maxima. A kernel
    /// that reports no GSO or GRO maximum has the classic 64 KiB one.
    pub fn link_sizes(&mut self, ifindex: u32) -> Result<DeviceSizes, TcError> {
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
        Err(TcError::Decode {
            op,
            reason: "no link message with an MTU in the reply".to_owned(),
        })
    }

    /// The root qdisc of `ifindex`, if it has a real one (not noqueue).
    pub fn root_qdisc(&mut self, ifindex: u32) -> Result<Option<RootQdisc>, TcError> {
        // A targeted get of the root, not a dump: the kernel's qdisc dump walks every device
        // of the namespace (no ifindex filter), ~4 ms per call on a node with 100 shaped pods.
        // 6.18 answers a get only with NLM_F_ECHO (older kernels ignore the flag here).
        let req = RouteNetlinkMessage::GetQueueDiscipline(tc_message(ifindex, 0, u32::MAX));
        let op = format!("get the root qdisc of ifindex {ifindex}");
        let replies = match self.request(req, netlink_packet_core::NLM_F_ECHO, &op) {
            Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
            r => r?,
        };
        for m in replies {
            let RouteNetlinkMessage::NewQueueDiscipline(q) = m else {
                continue;
            };
            if q.header.index as u32 != ifindex || u32::from(q.header.parent) != u32::MAX {
                continue;
            }
            let kind = q
                .attributes
                .iter()
                .find_map(|a| match a {
                    TcAttribute::Kind(k) => Some(k.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            if kind == "noqueue" {
                return Ok(None);
            }
            return Ok(Some(RootQdisc {
                kind,
                handle: u32::from(q.header.handle),
            }));
        }
        Ok(None)
    }

    /// Makes `major:` an HTB root qdisc with default class `major:defcls` (0 = unclassified
    /// traffic bypasses shaping through HTB's direct queue). Keeps an existing HTB with that
    /// handle (and its classes); replaces any other root qdisc.
    pub fn ensure_root_htb(
        &mut self,
        ifindex: u32,
        major: u16,
        defcls: u16,
        direct_qlen: u32,
    ) -> Result<bool, TcError> {
        if let Some(root) = self.root_qdisc(ifindex)? {
            if root.kind == "htb" && root.handle == handle(major, 0) {
                return Ok(false);
            }
        }
        let mut m = tc_message(ifindex, handle(major, 0), u32::MAX);
        m.attributes.push(TcAttribute::Kind("htb".to_owned()));
        m.attributes.push(TcAttribute::Other(DefaultNla::new(
            TCA_OPTIONS | NLA_F_NESTED,
            htb_qdisc_options(defcls, direct_qlen),
        )));
        self.request(
            RouteNetlinkMessage::NewQueueDiscipline(m),
            NLM_F_CREATE | NLM_F_REPLACE,
            &format!("add htb root qdisc to ifindex {ifindex}"),
        )?;
        Ok(true)
    }

    /// Creates or changes an HTB class.
    pub fn set_htb_class(&mut self, ifindex: u32, class: &HtbClass) -> Result<(), TcError> {
        let mut m = tc_message(ifindex, class.classid, class.parent);
        m.attributes.push(TcAttribute::Kind("htb".to_owned()));
        m.attributes.push(TcAttribute::Other(DefaultNla::new(
            TCA_OPTIONS | NLA_F_NESTED,
            htb_class_options(class),
        )));
        self.request(
            RouteNetlinkMessage::NewTrafficClass(m),
            NLM_F_CREATE,
            &format!(
                "set htb class {:x}:{:x} on ifindex {ifindex}",
                class.classid >> 16,
                class.classid & 0xffff
            ),
        )?;
        Ok(())
    }

    /// Puts a packet-limited FIFO under `parent` (an HTB leaf). The default leaf queue is
    /// 1000 packets, which at low rates adds hundreds of ms of delay.
    pub fn set_pfifo(
        &mut self,
        ifindex: u32,
        parent: u32,
        qdisc_handle: u32,
        limit_packets: u32,
    ) -> Result<(), TcError> {
        // struct tc_fifo_qopt { __u32 limit; } directly in TCA_OPTIONS (not nested).
        self.replace_leaf(
            ifindex,
            parent,
            qdisc_handle,
            "pfifo",
            limit_packets.to_ne_bytes().to_vec(),
        )
    }

    /// Puts a tbf under `parent` (an HTB leaf): a bucket of `leaf_burst_bytes` (larger GSO skbs
    /// are segmented) refilled at `leaf_rate`, and a queue of `queue_bytes`.
    pub fn set_tbf(
        &mut self,
        ifindex: u32,
        parent: u32,
        qdisc_handle: u32,
        shape: &Shape,
    ) -> Result<(), TcError> {
        let rate = (shape.leaf_rate / 8).max(1);
        let burst = shape.leaf_burst_bytes.min(u64::from(u32::MAX)) as u32;
        let limit = shape.queue_bytes.min(u64::from(u32::MAX)) as u32;
        // struct tc_tbf_qopt { rate, peakrate, limit, buffer, mtu }
        let mut parms = Vec::with_capacity(36);
        parms.extend_from_slice(&ratespec(rate));
        parms.extend_from_slice(&[0u8; 12]); // no peak rate
        parms.extend_from_slice(&limit.to_ne_bytes());
        parms.extend_from_slice(&ticks(u64::from(burst), rate).to_ne_bytes());
        parms.extend_from_slice(&0u32.to_ne_bytes());
        let mut opts = nla(TCA_TBF_PARMS, &parms);
        // The bucket in bytes: the kernel derives its max packet size from it exactly.
        opts.extend(nla(TCA_TBF_BURST, &burst.to_ne_bytes()));
        if rate >= u64::from(u32::MAX) {
            opts.extend(nla(TCA_TBF_RATE64, &rate.to_ne_bytes()));
        }
        self.replace_leaf(ifindex, parent, qdisc_handle, "tbf", opts)
    }

    fn replace_leaf(
        &mut self,
        ifindex: u32,
        parent: u32,
        qdisc_handle: u32,
        kind: &str,
        options: Vec<u8>,
    ) -> Result<(), TcError> {
        let nested = if kind == "tbf" { NLA_F_NESTED } else { 0 };
        let build = || {
            let mut m = tc_message(ifindex, qdisc_handle, parent);
            m.attributes.push(TcAttribute::Kind(kind.to_owned()));
            m.attributes.push(TcAttribute::Other(DefaultNla::new(
                TCA_OPTIONS | nested,
                options.clone(),
            )));
            RouteNetlinkMessage::NewQueueDiscipline(m)
        };
        let op = format!("set {kind} under {parent:x} on ifindex {ifindex}");
        match self.request(build(), NLM_F_CREATE | NLM_F_REPLACE, &op) {
            // A leaf of another kind holds the handle: delete it, then create.
            Err(e) if e.errno() == Some(libc::EINVAL) => {
                let del = tc_message(ifindex, qdisc_handle, parent);
                match self.request(RouteNetlinkMessage::DelQueueDiscipline(del), 0, &op) {
                    Ok(_) => {}
                    Err(d) if matches!(d.errno(), Some(libc::ENOENT)) => return Err(e),
                    Err(d) => return Err(d),
                }
                self.request(build(), NLM_F_CREATE | NLM_F_REPLACE, &op)?;
                Ok(())
            }
            r => r.map(|_| ()),
        }
    }

    /// Deletes an HTB class; a missing class is not an error.
    pub fn delete_class(&mut self, ifindex: u32, classid: u32, parent: u32) -> Result<(), TcError> {
        let m = tc_message(ifindex, classid, parent);
        match self.request(
            RouteNetlinkMessage::DelTrafficClass(m),
            0,
            &format!("delete class {classid:x} on ifindex {ifindex}"),
        ) {
            Err(e) if matches!(e.errno(), Some(libc::ENOENT)) => Ok(()),
            r => r.map(|_| ()),
        }
    }

    /// Deletes the root qdisc if it is HTB `major:`; anything else is left alone (it is not
    /// ours). Returns whether one was deleted.
    pub fn delete_root_htb(&mut self, ifindex: u32, major: u16) -> Result<bool, TcError> {
        match self.root_qdisc(ifindex)? {
            Some(root) if root.kind == "htb" && root.handle == handle(major, 0) => {}
            _ => return Ok(false),
        }
        let m = tc_message(ifindex, handle(major, 0), u32::MAX);
        match self.request(
            RouteNetlinkMessage::DelQueueDiscipline(m),
            0,
            &format!("delete root qdisc of ifindex {ifindex}"),
        ) {
            Err(e) if matches!(e.errno(), Some(libc::ENOENT | libc::ENODEV | libc::EINVAL)) => {
                Ok(false)
            }
            r => r.map(|_| true),
        }
    }

    /// Counters of every class on `ifindex`.
    pub fn class_stats(&mut self, ifindex: u32) -> Result<Vec<TcStats>, TcError> {
        let req = RouteNetlinkMessage::GetTrafficClass(TcMessage::with_index(ifindex as i32));
        let op = format!("list classes of ifindex {ifindex}");
        let mut out = Vec::new();
        for m in self.request(req, NLM_F_DUMP, &op)? {
            if let RouteNetlinkMessage::NewTrafficClass(c) = m {
                out.push(stats_of(&c));
            }
        }
        Ok(out)
    }

    /// The sizes of every HTB class, tbf and pfifo on `ifindex`.
    pub fn queue_sizes(&mut self, ifindex: u32) -> Result<Vec<QueueSize>, TcError> {
        let mut out = Vec::new();
        let req = RouteNetlinkMessage::GetTrafficClass(TcMessage::with_index(ifindex as i32));
        let op = format!("list classes of ifindex {ifindex}");
        for m in self.request(req, NLM_F_DUMP, &op)? {
            if let RouteNetlinkMessage::NewTrafficClass(c) = m {
                out.extend(queue_size_of(&c));
            }
        }
        let req = RouteNetlinkMessage::GetQueueDiscipline(TcMessage::with_index(ifindex as i32));
        let op = format!("list qdiscs of ifindex {ifindex}");
        for m in self.request(req, NLM_F_DUMP, &op)? {
            if let RouteNetlinkMessage::NewQueueDiscipline(q) = m {
                if q.header.index as u32 == ifindex {
                    out.extend(queue_size_of(&q));
                }
            }
        }
        Ok(out)
    }

    /// Counters of every qdisc on `ifindex`.
    pub fn qdisc_stats(&mut self, ifindex: u32) -> Result<Vec<TcStats>, TcError> {
        let req = RouteNetlinkMessage::GetQueueDiscipline(TcMessage::with_index(ifindex as i32));
        let op = format!("list qdiscs of ifindex {ifindex}");
        let mut out = Vec::new();
        for m in self.request(req, NLM_F_DUMP, &op)? {
            if let RouteNetlinkMessage::NewQueueDiscipline(q) = m {
                if q.header.index as u32 == ifindex {
                    out.push(stats_of(&q));
                }
            }
        }
        Ok(out)
    }
}

fn stats_of(m: &TcMessage) -> TcStats {
    let mut s = TcStats {
        handle: u32::from(m.header.handle),
        parent: u32::from(m.header.parent),
        ..TcStats::default()
    };
    for a in &m.attributes {
        if let TcAttribute::Stats2(v) = a {
            for st in v {
                match st {
                    TcStats2::Basic(b) => {
                        s.bytes = b.bytes;
                        s.packets = u64::from(b.packets);
                    }
                    TcStats2::Queue(q) => {
                        s.drops = u64::from(q.drops);
                        s.overlimits = u64::from(q.overlimits);
                        s.backlog = u64::from(q.backlog);
                    }
                    _ => {}
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn htb_class_options_layout() {
        let c = HtbClass {
            classid: handle(1, 0x10),
            parent: handle(1, 0),
            rate: Shape::new(10_000_000, None, 1514),
            ceil: Shape::new(10_000_000, None, 1514),
            prio: 1,
        };
        let o = htb_class_options(&c);
        // One TCA_HTB_PARMS attribute: 4-byte header + 44-byte struct tc_htb_opt.
        assert_eq!(o.len(), 48);
        assert_eq!(u16::from_ne_bytes([o[0], o[1]]), 48);
        assert_eq!(u16::from_ne_bytes([o[2], o[3]]), TCA_HTB_PARMS);
        let parms = &o[4..];
        assert_eq!(parms[1], TC_LINKLAYER_ETHERNET);
        assert_eq!(
            u32::from_ne_bytes(parms[8..12].try_into().unwrap()),
            1_250_000
        );
        // buffer: 12500 bytes at 1.25 MB/s = 10 ms = 156250 ticks of 64 ns.
        assert_eq!(
            u32::from_ne_bytes(parms[24..28].try_into().unwrap()),
            156_250
        );
        assert_eq!(
            u32::from_ne_bytes(parms[32..36].try_into().unwrap()),
            125_000
        );
        assert_eq!(u32::from_ne_bytes(parms[40..44].try_into().unwrap()), 1);

        // A slow class's DRR quantum holds one of its device's frames.
        let slow = Shape::new(100_000, None, 9014);
        let o = htb_class_options(&HtbClass {
            rate: slow,
            ceil: slow,
            ..c
        });
        assert_eq!(u32::from_ne_bytes(o[36..40].try_into().unwrap()), 9014);

        // Above 34 Gbit/s the rates need the 64-bit attributes.
        let fast = HtbClass {
            rate: Shape::new(100_000_000_000, None, 1514),
            ceil: Shape::new(100_000_000_000, None, 1514),
            ..c
        };
        let o = htb_class_options(&fast);
        assert_eq!(o.len(), 48 + 12 + 12);
        assert_eq!(u16::from_ne_bytes([o[50], o[51]]), TCA_HTB_RATE64);
        assert_eq!(
            u64::from_ne_bytes(o[52..60].try_into().unwrap()),
            12_500_000_000
        );
    }
}
