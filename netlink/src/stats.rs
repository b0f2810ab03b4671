//! Reading shaping points back: counters of classes and qdiscs, and their sizes as the
//! kernel reports them.

use netlink_packet_core::{Nla, NLM_F_DUMP};
use netlink_packet_route::{
    tc::{TcAttribute, TcMessage, TcStats2},
    RouteNetlinkMessage,
};

use crate::{
    tc::{
        NLA_F_NESTED, NS_PER_TICK, TCA_HTB_CEIL64, TCA_HTB_PARMS, TCA_HTB_RATE64, TCA_TBF_PARMS,
        TCA_TBF_PRATE64, TCA_TBF_RATE64,
    },
    NetlinkError, Rtnl,
};

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
    /// An HTB class: `rate` and `ceil` bytes/s, the bytes its burst lets through at once,
    /// its priority.
    HtbClass {
        rate: u64,
        ceil: u64,
        burst_bytes: u64,
        prio: u32,
    },
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
            let mut ceil = u64::from(u32_at(parms, 20)?);
            if let Some((_, v)) = attrs.iter().find(|(k, _)| *k == TCA_HTB_CEIL64) {
                ceil = u64_of(v)?;
            }
            QueueKind::HtbClass {
                rate,
                ceil,
                burst_bytes: ticks_to_bytes(u32_at(parms, 24)?, rate),
                prio: u32_at(parms, 40)?,
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
            let mut bucket_bytes = ticks_to_bytes(u32_at(parms, 28)?, rate);
            // With a peak rate, the largest packet passed whole is the smaller bucket.
            let mut peak = u64::from(u32_at(parms, 20)?);
            if peak != 0 {
                if let Some((_, v)) = attrs.iter().find(|(k, _)| *k == TCA_TBF_PRATE64) {
                    peak = u64_of(v)?;
                }
                bucket_bytes = bucket_bytes.min(ticks_to_bytes(u32_at(parms, 32)?, peak));
            }
            QueueKind::Tbf {
                rate,
                bucket_bytes,
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

impl Rtnl {
    /// Counters of every class on `ifindex`.
    pub fn class_stats(&mut self, ifindex: u32) -> Result<Vec<TcStats>, NetlinkError> {
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
    pub fn queue_sizes(&mut self, ifindex: u32) -> Result<Vec<QueueSize>, NetlinkError> {
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
    pub fn qdisc_stats(&mut self, ifindex: u32) -> Result<Vec<TcStats>, NetlinkError> {
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
