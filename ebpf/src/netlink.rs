//! The datapath's netlink: aliasnet-netlink's client (the one route-netlink layer of
//! aliasnet), plus what only the datapath knows: a shaping point's sizes ([`Shape`]) as HTB
//! classes and tbf leaves, and a device's sizes ([`DeviceSizes`]).
//!
//! [`Rtnl`] is aliasnet-netlink's socket with these methods added; everything else of the
//! client is reached through it.

use std::ops::{Deref, DerefMut};

pub use aliasnet_netlink::{
    clsact, handle, link, stats, BpfFilter, FilterMode, Hook, Link, NetlinkError, QueueKind,
    QueueSize, RootQdisc, TcStats,
};
use aliasnet_netlink::{HtbClassOptions, HtbRate, TbfOptions};

use crate::shape::{DeviceSizes, Shape};

/// One HTB class to create or change, sized for the datapath.
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

impl HtbClass {
    /// The class in the kernel's terms.
    fn options(&self) -> HtbClassOptions {
        let rate = (self.rate.rate / 8).max(1);
        // The DRR quantum used when siblings borrow: ~1/10 s of rate within HTB's sane range
        // (setting it avoids the kernel's "quantum is big/small" warnings), and at least the
        // largest packet the class's leaf hands HTB. HTB sends one packet per round whatever
        // its deficit, so with a smaller quantum siblings share by packets, not bytes: under
        // 100 Mbit/s on 9000-byte frames a pod whose GRO aggregates held two frames got 1.7x
        // the share of the others. Where a frame takes a millisecond or more of the ceiling,
        // the quantum stays one frame: a two-frame quantum per pod made HTB's rounds tens of
        // milliseconds long and their bursts overflowed the pods' queues (4 pods under
        // 10 Mbit/s on 9000-byte frames: 83 % of the rate, 7.5 % retransmits), and at such
        // rates the class's TCP segments are a 1500-byte network's (the MSS clamp).
        let frame = self.ceil.frame.max(self.rate.frame);
        let largest = if self.ceil.rate / 8 / 1000 >= frame {
            frame
                .max(self.ceil.leaf_burst_bytes)
                .max(self.rate.leaf_burst_bytes)
        } else {
            frame
        };
        let quantum = (rate / 10).clamp(1600.max(largest), 200_000.max(largest)) as u32;
        HtbClassOptions {
            classid: self.classid,
            parent: self.parent,
            rate: HtbRate {
                rate: self.rate.rate,
                burst_bytes: self.rate.burst_bytes,
            },
            ceil: HtbRate {
                rate: self.ceil.rate,
                burst_bytes: self.ceil.burst_bytes,
            },
            quantum,
            prio: self.prio,
        }
    }
}

/// The packet sizes link `l` hands its qdiscs (MTU, GSO and GRO maxima), as a link message
/// reports them; `None` for a message without an MTU. A kernel that reports no GSO or GRO
/// maximum has the classic 64 KiB one.
pub fn link_sizes(l: &Link) -> Option<DeviceSizes> {
    let or_64k = |v: u32| if v == 0 { 65_536 } else { v };
    (l.mtu != 0).then(|| DeviceSizes {
        mtu: l.mtu,
        gso_max: or_64k(l.gso_max),
        gro_max: or_64k(l.gro_max),
    })
}

/// A route-netlink socket in the calling thread's network namespace (aliasnet-netlink's).
pub struct Rtnl(aliasnet_netlink::Rtnl);

impl Deref for Rtnl {
    type Target = aliasnet_netlink::Rtnl;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Rtnl {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Rtnl {
    /// Opens a socket in the calling thread's network namespace.
    pub fn new() -> Result<Self, NetlinkError> {
        aliasnet_netlink::Rtnl::new().map(Self)
    }

    /// The packet sizes device `ifindex` hands its qdiscs: MTU, GSO and GRO maxima.
    pub fn link_sizes(&mut self, ifindex: u32) -> Result<DeviceSizes, NetlinkError> {
        let op = format!("get link {ifindex}");
        match self.0.link(ifindex)? {
            Some(l) if l.mtu != 0 => Ok(link_sizes(&l).expect("an MTU")),
            Some(_) => Err(NetlinkError::Decode {
                op,
                reason: "no link message with an MTU in the reply".to_owned(),
            }),
            None => Err(NetlinkError::Kernel {
                op,
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
            }),
        }
    }

    /// Creates or changes an HTB class.
    pub fn set_htb_class(&mut self, ifindex: u32, class: &HtbClass) -> Result<(), NetlinkError> {
        self.0.put_htb_class(ifindex, &class.options())
    }

    /// Puts a tbf under `parent` (an HTB leaf): a bucket of `leaf_bucket_bytes` refilled at
    /// `leaf_rate`, a peak bucket of `leaf_burst_bytes` (larger GSO skbs are segmented)
    /// refilled at `leaf_peak_rate`, and a queue of `queue_bytes`.
    pub fn set_tbf(
        &mut self,
        ifindex: u32,
        parent: u32,
        qdisc_handle: u32,
        shape: &Shape,
    ) -> Result<(), NetlinkError> {
        let tbf = TbfOptions {
            rate: shape.leaf_rate,
            peak_rate: shape.leaf_peak_rate,
            bucket_bytes: shape.leaf_bucket_bytes,
            peak_bucket_bytes: shape.leaf_burst_bytes,
            limit_bytes: shape.queue_bytes,
        };
        self.0.put_tbf(ifindex, parent, qdisc_handle, &tbf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn htb_quantum_holds_the_largest_packet() {
        let c = HtbClass {
            classid: handle(1, 0x10),
            parent: handle(1, 0),
            rate: Shape::new(10_000_000, None, 1514),
            ceil: Shape::new(10_000_000, None, 1514),
            prio: 1,
        };
        let o = c.options();
        // ~1/10 s of the rate: 125,000 bytes at 10 Mbit/s.
        assert_eq!(o.quantum, 125_000);
        assert_eq!(o.rate.rate, 10_000_000);
        assert_eq!(o.rate.burst_bytes, c.rate.burst_bytes);

        // A slow class's DRR quantum is one of its device's frames: a larger one makes the
        // rounds of its siblings long.
        let slow = Shape::new(100_000, None, 9014);
        let o = HtbClass {
            rate: slow,
            ceil: slow,
            ..c
        }
        .options();
        assert_eq!(o.quantum, 9014);
        let o = HtbClass {
            rate: Shape::new(1_000, None, 9014),
            ceil: Shape::new(10_000_000, None, 9014),
            ..c
        }
        .options();
        assert_eq!(o.quantum, 9014);
        // A fast class's holds the largest packet its tbf leaf passes whole (a GRO aggregate
        // up to its peak bucket), also for a pod's leaf in an aggregate (a token guarantee, the
        // group's ceiling): its siblings share by bytes, whatever their aggregates' sizes.
        let o = HtbClass {
            rate: Shape::new(1_000, None, 9014),
            ceil: Shape::new(100_000_000, None, 9014),
            ..c
        }
        .options();
        assert_eq!(o.quantum, 2 * 9014);
        let o = HtbClass {
            rate: Shape::new(1_000, None, 1514),
            ceil: Shape::new(1_000_000_000, None, 1514),
            ..c
        }
        .options();
        assert_eq!(o.quantum, 125_000);
    }
}
