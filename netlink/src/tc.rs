//! HTB qdiscs and classes and their leaf qdiscs (pfifo, tbf).
//!
//! netlink-packet-route has no HTB or FIFO option types, so their `TCA_OPTIONS` payloads are
//! encoded here from `linux/pkt_sched.h`.

use netlink_packet_core::{DefaultNla, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::{
    tc::{TcAttribute, TcHandle, TcMessage},
    RouteNetlinkMessage,
};

use crate::{NetlinkError, Rtnl};

// linux/pkt_sched.h
const TCA_OPTIONS: u16 = 2;
pub(super) const TCA_HTB_PARMS: u16 = 1;
const TCA_HTB_INIT: u16 = 2;
const TCA_HTB_DIRECT_QLEN: u16 = 5;
pub(super) const TCA_HTB_RATE64: u16 = 6;
pub(super) const TCA_HTB_CEIL64: u16 = 7;
pub(super) const TCA_TBF_PARMS: u16 = 1;
pub(super) const TCA_TBF_RATE64: u16 = 4;
pub(super) const TCA_TBF_PRATE64: u16 = 5;
const TCA_TBF_BURST: u16 = 6;
const TCA_TBF_PBURST: u16 = 7;
pub(super) const NLA_F_NESTED: u16 = 1 << 15;
const TC_LINKLAYER_ETHERNET: u8 = 1;
const TC_HTB_PROTOVER: u32 = 3;
/// psched ticks are 64 ns (PSCHED_SHIFT 6).
pub(super) const NS_PER_TICK: u128 = 64;

/// `major:minor` as the kernel packs it.
pub const fn handle(major: u16, minor: u16) -> u32 {
    ((major as u32) << 16) | minor as u32
}

/// One rate as HTB takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtbRate {
    /// bit/s
    pub rate: u64,
    /// bytes the class may send at once above the rate
    pub burst_bytes: u64,
}

/// One HTB class to create or change, in the kernel's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtbClassOptions {
    pub classid: u32,
    pub parent: u32,
    /// Guaranteed rate and its burst.
    pub rate: HtbRate,
    /// Ceiling (borrowing limit) and its burst; equal to `rate` for a hard limit.
    pub ceil: HtbRate,
    /// Bytes a class sends per round when siblings borrow (DRR quantum).
    pub quantum: u32,
    /// HTB priority among siblings (0 is served first).
    pub prio: u32,
}

/// A tbf qdisc, in the kernel's terms: a bucket of `bucket_bytes` refilled at `rate`, a peak
/// bucket of `peak_bucket_bytes` (larger GSO skbs are segmented) refilled at `peak_rate`, and a
/// queue of `limit_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TbfOptions {
    /// bit/s
    pub rate: u64,
    /// bit/s
    pub peak_rate: u64,
    pub bucket_bytes: u64,
    pub peak_bucket_bytes: u64,
    pub limit_bytes: u64,
}

/// What sits at the root of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootQdisc {
    pub kind: String,
    pub handle: u32,
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

fn htb_class_options(c: &HtbClassOptions) -> Vec<u8> {
    let rate = (c.rate.rate / 8).max(1);
    let ceil = (c.ceil.rate / 8).max(1);
    let mut parms = Vec::with_capacity(44);
    parms.extend_from_slice(&ratespec(rate));
    parms.extend_from_slice(&ratespec(ceil));
    parms.extend_from_slice(&ticks(c.rate.burst_bytes, rate).to_ne_bytes());
    parms.extend_from_slice(&ticks(c.ceil.burst_bytes, ceil).to_ne_bytes());
    parms.extend_from_slice(&c.quantum.to_ne_bytes());
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

pub(super) fn tc_message(ifindex: u32, handle: u32, parent: u32) -> TcMessage {
    let mut m = TcMessage::with_index(ifindex as i32);
    m.header.handle = TcHandle::from(handle);
    m.header.parent = TcHandle::from(parent);
    m
}

impl Rtnl {
    /// The root qdisc of `ifindex`, if it has a real one (not noqueue).
    pub fn root_qdisc(&mut self, ifindex: u32) -> Result<Option<RootQdisc>, NetlinkError> {
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
    ) -> Result<bool, NetlinkError> {
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
    pub fn put_htb_class(
        &mut self,
        ifindex: u32,
        class: &HtbClassOptions,
    ) -> Result<(), NetlinkError> {
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
    ) -> Result<(), NetlinkError> {
        // struct tc_fifo_qopt { __u32 limit; } directly in TCA_OPTIONS (not nested).
        self.replace_leaf(
            ifindex,
            parent,
            qdisc_handle,
            "pfifo",
            limit_packets.to_ne_bytes().to_vec(),
        )
    }

    /// Puts a tbf under `parent` (an HTB leaf).
    pub fn put_tbf(
        &mut self,
        ifindex: u32,
        parent: u32,
        qdisc_handle: u32,
        tbf: &TbfOptions,
    ) -> Result<(), NetlinkError> {
        let rate = (tbf.rate / 8).max(1);
        let peak = (tbf.peak_rate / 8).max(rate + 1);
        let bucket = tbf.bucket_bytes.min(u64::from(u32::MAX)) as u32;
        let pburst = tbf.peak_bucket_bytes.min(u64::from(u32::MAX)) as u32;
        let limit = tbf.limit_bytes.min(u64::from(u32::MAX)) as u32;
        // struct tc_tbf_qopt { rate, peakrate, limit, buffer, mtu }
        let mut parms = Vec::with_capacity(36);
        parms.extend_from_slice(&ratespec(rate));
        parms.extend_from_slice(&ratespec(peak));
        parms.extend_from_slice(&limit.to_ne_bytes());
        parms.extend_from_slice(&ticks(u64::from(bucket), rate).to_ne_bytes());
        parms.extend_from_slice(&ticks(u64::from(pburst), peak).to_ne_bytes());
        let mut opts = nla(TCA_TBF_PARMS, &parms);
        // Both buckets in bytes: the kernel takes the largest packet it passes whole (the
        // smaller of the two) from them exactly.
        opts.extend(nla(TCA_TBF_BURST, &bucket.to_ne_bytes()));
        opts.extend(nla(TCA_TBF_PBURST, &pburst.to_ne_bytes()));
        if rate >= u64::from(u32::MAX) {
            opts.extend(nla(TCA_TBF_RATE64, &rate.to_ne_bytes()));
        }
        if peak >= u64::from(u32::MAX) {
            opts.extend(nla(TCA_TBF_PRATE64, &peak.to_ne_bytes()));
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
    ) -> Result<(), NetlinkError> {
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

    /// Tries to create a qdisc of `kind` on `ifindex` (`clsact` in its own slot, anything
    /// else as the root). Only for probing in a throwaway namespace: the qdisc is left for the
    /// namespace's destruction to remove.
    pub fn add_qdisc(&mut self, ifindex: u32, kind: &str) -> Result<(), NetlinkError> {
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
            &format!("add {kind} qdisc to ifindex {ifindex}"),
        )
        .map(|_| ())
    }

    /// Deletes an HTB class; a missing class is not an error.
    pub fn delete_class(
        &mut self,
        ifindex: u32,
        classid: u32,
        parent: u32,
    ) -> Result<(), NetlinkError> {
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
    pub fn delete_root_htb(&mut self, ifindex: u32, major: u16) -> Result<bool, NetlinkError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn htb_class_options_layout() {
        let ten_mbit = HtbRate {
            rate: 10_000_000,
            burst_bytes: 12_500,
        };
        let c = HtbClassOptions {
            classid: handle(1, 0x10),
            parent: handle(1, 0),
            rate: ten_mbit,
            ceil: ten_mbit,
            quantum: 125_000,
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

        // Above 34 Gbit/s the rates need the 64-bit attributes.
        let fast = HtbRate {
            rate: 100_000_000_000,
            burst_bytes: 125_000_000,
        };
        let o = htb_class_options(&HtbClassOptions {
            rate: fast,
            ceil: fast,
            ..c
        });
        assert_eq!(o.len(), 48 + 12 + 12);
        assert_eq!(u16::from_ne_bytes([o[50], o[51]]), TCA_HTB_RATE64);
        assert_eq!(
            u64::from_ne_bytes(o[52..60].try_into().unwrap()),
            12_500_000_000
        );
    }
}
