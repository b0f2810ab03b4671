//! The HTB class layout of every shaping point: the pod's ingress class on its host veth,
//! its egress classes on its own interface, the node internet cap on the uplink; each shaped
//! class with a sparse and a bulk leaf and bounded leaf queues.

use crate::{
    abi,
    error::DatapathError,
    netlink::{handle, HtbClass, Rtnl, TcStats},
    shape::Shape,
};

/// HTB layout constants shared by the host veth, pod eth0 and uplink qdiscs.
pub const HTB_MAJOR: u16 = abi::HTB_MAJOR;
/// HTB direct queue (unshaped traffic) length in packets, as a default txqueuelen.
pub const DIRECT_QLEN: u32 = 1000;

/// The leaf qdisc under class `major:minor` gets handle `0x100+minor:`.
pub(crate) fn leaf_handle(classid: u32) -> u32 {
    handle(0x100 + (classid & 0xffff) as u16, 0)
}

/// A shaped class as HTB builds it: the class itself, now an inner class, and its two leaves
/// (see flow isolation in `aliasnet_tuning.h`). The sparse leaf (prio 0) is guaranteed
/// 1/`SPARSE_RATE_DIV` of the class's rate, the bulk leaf (prio 1) the rest; both may borrow
/// up to the class's ceiling, so either alone can use all of it.
pub(crate) fn with_leaves(class: HtbClass) -> [HtbClass; 3] {
    let sparse_rate = (class.rate.rate / abi::SPARSE_RATE_DIV).max(1);
    let bulk_rate = class.rate.rate.saturating_sub(sparse_rate).max(1);
    let leaf = |offset: u32, rate: u64, prio: u32| HtbClass {
        classid: class.classid + offset,
        parent: class.classid,
        rate: class.rate.at_rate(rate),
        ceil: class.ceil,
        prio,
    };
    [
        class,
        leaf(abi::LEAF_SPARSE, sparse_rate, 0),
        leaf(abi::LEAF_BULK, bulk_rate, 1),
    ]
}

/// Whether `c` is the sparse leaf of its parent (it gets a plain FIFO: its packets are few
/// and small, never GSO aggregates to segment).
pub(crate) fn is_sparse_leaf(c: &HtbClass) -> bool {
    c.classid == c.parent + abi::LEAF_SPARSE
}

/// The two leaf qdiscs of shaped class `classid` in `stats`, added up (`None` if neither is
/// there).
pub(crate) fn leaves_stats(stats: &[TcStats], classid: u32) -> Option<TcStats> {
    let mut found = stats.iter().filter(|s| {
        s.handle == leaf_handle(classid + abi::LEAF_SPARSE)
            || s.handle == leaf_handle(classid + abi::LEAF_BULK)
    });
    let first = *found.next()?;
    Some(found.fold(first, |mut a, s| {
        a.bytes += s.bytes;
        a.packets += s.packets;
        a.drops += s.drops;
        a.overlimits += s.overlimits;
        a.backlog += s.backlog;
        a
    }))
}

/// The largest frame of a pod's veth as recorded on attach.
pub(crate) fn meta_frame(meta: &abi::PodMeta) -> u64 {
    match meta.frame {
        0 => abi::MIN_FRAME,
        f => u64::from(f),
    }
}

pub(crate) fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

/// HTB classes on the pod's eth0 for a pod's recorded limits, leaves included; `None` = no
/// egress shaping.
pub(crate) fn pod_egress_classes(meta: &abi::PodMeta) -> Option<Vec<HtbClass>> {
    let root = handle(HTB_MAJOR, 0);
    let frame = meta_frame(meta);
    let internet = nonzero(meta.internet_egress_rate);
    match nonzero(meta.egress_rate) {
        None => {
            let i = Shape::new(internet?, None, frame);
            Some(
                with_leaves(HtbClass {
                    classid: abi::CLASSID_POD_INTERNET,
                    parent: root,
                    rate: i,
                    ceil: i,
                    prio: 0,
                })
                .to_vec(),
            )
        }
        Some(e) => {
            // Children's guaranteed rates sum to the parent's, so the total holds; each may
            // borrow up to its ceiling when the other is idle.
            let total = Shape::new(e, Some(meta.egress_burst.saturating_mul(8)), frame);
            let i = internet.unwrap_or(e).min(e);
            let parent = handle(HTB_MAJOR, 1);
            let mut classes = vec![HtbClass {
                classid: parent,
                parent: root,
                rate: total,
                ceil: total,
                prio: 0,
            }];
            classes.extend(with_leaves(HtbClass {
                classid: abi::CLASSID_POD_INTERNET,
                parent,
                rate: Shape::new((i / 2).max(1), None, frame),
                ceil: Shape::new(i, None, frame),
                prio: 0,
            }));
            classes.extend(with_leaves(HtbClass {
                classid: abi::CLASSID_POD_OTHER,
                parent,
                rate: Shape::new((e - i / 2).max(1), None, frame),
                ceil: total,
                prio: 0,
            }));
            Some(classes)
        }
    }
}

/// HTB classes on the host veth for the pod's ingress limit (the class and its leaves).
pub(crate) fn host_ingress_classes(meta: &abi::PodMeta) -> Option<[HtbClass; 3]> {
    let r = nonzero(meta.ingress_rate)?;
    let s = Shape::new(
        r,
        Some(meta.ingress_burst.saturating_mul(8)),
        meta_frame(meta),
    );
    Some(with_leaves(HtbClass {
        classid: abi::CLASSID_POD_INGRESS,
        parent: handle(HTB_MAJOR, 0),
        rate: s,
        ceil: s,
        prio: 0,
    }))
}

/// Who sends the traffic a qdisc shapes (see [`Shape`] for why the leaves differ).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sender {
    /// Sockets in the same network namespace: pod egress on the pod's eth0.
    Local,
    /// Forwarded traffic: the pod's ingress on the host veth.
    Forwarded,
}

/// Installs `classes` under a fresh or existing HTB root, each leaf with a bounded queue.
pub(crate) fn install_htb(
    rt: &mut Rtnl,
    ifindex: u32,
    defcls: u16,
    classes: &[HtbClass],
    fresh: bool,
    sender: Sender,
) -> Result<(), DatapathError> {
    if fresh {
        rt.delete_root_htb(ifindex, HTB_MAJOR)?;
    }
    rt.ensure_root_htb(ifindex, HTB_MAJOR, defcls, DIRECT_QLEN)?;
    for c in classes {
        rt.set_htb_class(ifindex, c)?;
    }
    for c in classes {
        let is_parent = classes.iter().any(|o| o.parent == c.classid);
        if !is_parent {
            // Leaf queue sized by the class ceiling: the rate it drains at when borrowing.
            let leaf = leaf_handle(c.classid);
            match sender {
                Sender::Forwarded if !is_sparse_leaf(c) => {
                    rt.set_tbf(ifindex, c.classid, leaf, &c.ceil)?
                }
                _ => rt.set_pfifo(ifindex, c.classid, leaf, c.ceil.queue_packets)?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ingress: u64, egress: u64, internet: u64) -> abi::PodMeta {
        abi::PodMeta {
            ingress_rate: ingress,
            egress_rate: egress,
            internet_egress_rate: internet,
            ..Default::default()
        }
    }

    /// `(classid, parent, rate, ceil, prio)` of each class, for compact comparisons.
    fn layout(classes: &[HtbClass]) -> Vec<(u32, u32, u64, u64, u32)> {
        classes
            .iter()
            .map(|c| (c.classid, c.parent, c.rate.rate, c.ceil.rate, c.prio))
            .collect()
    }

    #[test]
    fn every_shaped_class_gets_a_sparse_and_a_bulk_leaf() {
        let root = handle(HTB_MAJOR, 0);
        let ingress = host_ingress_classes(&meta(8_000_000, 0, 0)).expect("ingress limit");
        assert_eq!(
            layout(&ingress),
            [
                (0x1_0001, root, 8_000_000, 8_000_000, 0),
                // Sparse: a quarter of the rate guaranteed, served first, may borrow it all.
                (0x1_0002, 0x1_0001, 2_000_000, 8_000_000, 0),
                (0x1_0003, 0x1_0001, 6_000_000, 8_000_000, 1),
            ]
        );
        assert!(is_sparse_leaf(&ingress[1]) && !is_sparse_leaf(&ingress[2]));
        assert!(host_ingress_classes(&meta(0, 0, 0)).is_none());

        let internet_only = pod_egress_classes(&meta(0, 0, 4_000_000)).expect("internet limit");
        assert_eq!(
            layout(&internet_only),
            [
                (0x1_0010, root, 4_000_000, 4_000_000, 0),
                (0x1_0011, 0x1_0010, 1_000_000, 4_000_000, 0),
                (0x1_0012, 0x1_0010, 3_000_000, 4_000_000, 1),
            ]
        );
        // A total limit: 1:1 over the internet (1:10) and other (1:20) classes, each split.
        let total = pod_egress_classes(&meta(0, 20_000_000, 4_000_000)).expect("total");
        assert_eq!(
            layout(&total),
            [
                (0x1_0001, root, 20_000_000, 20_000_000, 0),
                (0x1_0010, 0x1_0001, 2_000_000, 4_000_000, 0),
                (0x1_0011, 0x1_0010, 500_000, 4_000_000, 0),
                (0x1_0012, 0x1_0010, 1_500_000, 4_000_000, 1),
                (0x1_0020, 0x1_0001, 18_000_000, 20_000_000, 0),
                (0x1_0021, 0x1_0020, 4_500_000, 20_000_000, 0),
                (0x1_0022, 0x1_0020, 13_500_000, 20_000_000, 1),
            ]
        );
        // The leaves are the classes nothing else hangs from.
        let leaves: Vec<u32> = total
            .iter()
            .filter(|c| !total.iter().any(|o| o.parent == c.classid))
            .map(|c| c.classid)
            .collect();
        assert_eq!(leaves, [0x1_0011, 0x1_0012, 0x1_0021, 0x1_0022]);
    }

    #[test]
    fn leaf_stats_add_up_both_leaves() {
        let q = |minor: u16, packets: u64, drops: u64| TcStats {
            handle: leaf_handle(handle(HTB_MAJOR, minor)),
            packets,
            drops,
            ..TcStats::default()
        };
        let stats = [q(0x11, 5, 0), q(0x12, 100, 3), q(0x21, 7, 1)];
        let s = leaves_stats(&stats, abi::CLASSID_POD_INTERNET).expect("internet leaves");
        assert_eq!((s.packets, s.drops), (105, 3));
        let s = leaves_stats(&stats, abi::CLASSID_POD_OTHER).expect("one leaf is enough");
        assert_eq!((s.packets, s.drops), (7, 1));
        assert!(leaves_stats(&stats, abi::CLASSID_POD_INGRESS).is_none());
    }
}
