//! The HTB class layout of every shaping point and how it is brought onto a device: a pod's
//! own limits on its host veth (traffic to the pod) and its eth0 (traffic from it), each
//! limit with a sparse and a bulk leaf and bounded leaf queues; the aggregate devices' groups
//! are laid out in `crate::aggregate::layout` and synced the same way.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    abi::{self, Direction},
    error::DatapathError,
    netlink::{handle, HtbClass, QueueKind, Rtnl, TcStats},
    shape::Shape,
};

/// HTB layout constants shared by every shaping point.
pub const HTB_MAJOR: u16 = abi::HTB_MAJOR;
/// HTB direct queue (unshaped traffic) length in packets, as a default txqueuelen.
pub const DIRECT_QLEN: u32 = 1000;

/// The leaf qdisc under class `major:minor` gets handle `minor+1:` (the root HTB is `1:` and
/// no class has minor 0).
pub(crate) fn leaf_handle(classid: u32) -> u32 {
    handle(((classid & 0xffff) + 1) as u16, 0)
}

/// Whether `c` is the sparse leaf of its parent (it gets a plain FIFO: its packets are few
/// and small, never GSO aggregates to segment).
pub(crate) fn is_sparse_leaf(c: &HtbClass) -> bool {
    c.prio == 0 && c.classid == c.parent + abi::LEAF_SPARSE
}

/// The two leaf qdiscs of pod limit `classid` in `stats`, added up (`None` if neither is
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

/// The kind a limit of `kind` hangs under on a pod's device when `limited(k)` says which
/// kinds have a limit: total > internet > named class; `None` for the root.
pub(crate) fn pod_parent(kind: usize, limited: impl Fn(usize) -> bool) -> Option<usize> {
    match kind {
        abi::KIND_TOTAL => None,
        abi::KIND_INTERNET => limited(abi::KIND_TOTAL).then_some(abi::KIND_TOTAL),
        _ if limited(abi::KIND_INTERNET) => Some(abi::KIND_INTERNET),
        _ => limited(abi::KIND_TOTAL).then_some(abi::KIND_TOTAL),
    }
}

/// Guaranteed rates of a tree of limits (`(id, parent, limit)`, parents listed before their
/// children): a root limit is guaranteed its own rate; each child limit at most its rate and
/// 1/(2n) of its parent's guarantee (n children), so that children's guarantees leave the
/// parent at least half of its own for its own leaves. HTB lets a class that has tokens of its
/// own send without asking its parent, so guarantees that sum to more than the parent's would
/// let the children exceed the parent's limit; these never do. Returns each limit's
/// guarantee and what is left of it for its own leaves.
pub(crate) fn guarantees(tree: &[(u32, Option<u32>, u64)]) -> BTreeMap<u32, (u64, u64)> {
    let mut out: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for &(id, parent, limit) in tree {
        let g = match parent.and_then(|p| out.get(&p).map(|x| (p, x.0))) {
            None => limit,
            Some((p, pg)) => {
                let n = tree.iter().filter(|t| t.1 == Some(p)).count() as u64;
                limit.min(pg / (2 * n)).max(1)
            }
        };
        out.insert(id, (g, g));
    }
    for &(id, parent, _) in tree {
        if let Some(p) = parent {
            let g = out[&id].0;
            if let Some(e) = out.get_mut(&p) {
                e.1 = e.1.saturating_sub(g).max(1);
            }
        }
    }
    out
}

/// HTB classes on a pod's device for its own limits of `dir` (the host veth for
/// [`Direction::Ingress`], its eth0 for egress), leaves included; `None` = none.
///
/// Each limit of kind K is class `1:pod_class(K)` with a sparse and a bulk leaf for the
/// packets whose most specific limit it is, and the limits of more specific kinds under it
/// (total > internet > named class): a packet passes every limit above its leaf.
pub(crate) fn pod_classes(meta: &abi::PodMeta, dir: Direction) -> Option<Vec<HtbClass>> {
    let frame = meta_frame(meta);
    let limited = |k: usize| meta.limit(dir, k).is_some();
    let tree: Vec<(u32, Option<u32>, u64)> = (0..abi::NR_KINDS)
        .filter_map(|k| {
            let r = meta.limit(dir, k)?;
            Some((k as u32, pod_parent(k, limited).map(|p| p as u32), r))
        })
        .collect();
    if tree.is_empty() {
        return None;
    }
    let g = guarantees(&tree);
    let mut classes = Vec::with_capacity(tree.len() * 3);
    for &(k, parent, limit) in &tree {
        let kind = k as usize;
        let burst = (kind == abi::KIND_TOTAL)
            .then(|| meta.burst[dir.index()].saturating_mul(8))
            .filter(|b| *b != 0);
        let ceil = Shape::new(limit, burst, frame);
        let (guaranteed, own) = g[&k];
        let classid = abi::classid(abi::pod_class(kind));
        classes.push(HtbClass {
            classid,
            parent: parent.map_or(handle(HTB_MAJOR, 0), |p| {
                abi::classid(abi::pod_class(p as usize))
            }),
            rate: ceil.at_rate(guaranteed),
            ceil,
            prio: 0,
        });
        // Sparse: a quarter of what the limit keeps for itself guaranteed, served first,
        // may borrow it all.
        let sparse = (own / abi::SPARSE_RATE_DIV).max(1);
        classes.push(HtbClass {
            classid: classid + abi::LEAF_SPARSE,
            parent: classid,
            rate: ceil.at_rate(sparse),
            ceil,
            prio: 0,
        });
        classes.push(HtbClass {
            classid: classid + abi::LEAF_BULK,
            parent: classid,
            rate: ceil.at_rate(own.saturating_sub(sparse).max(1)),
            ceil,
            prio: 1,
        });
    }
    Some(classes)
}

/// Who sends the traffic a qdisc shapes (see [`Shape`] for why the leaves differ).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sender {
    /// Sockets in the same network namespace: pod egress on the pod's eth0.
    Local,
    /// Forwarded traffic: to the pod on the host veth, the aggregate devices, the uplink.
    Forwarded,
}

/// What a class's leaf qdisc should be, if it is a leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leaf {
    Pfifo { limit: u32 },
    Tbf(Shape),
}

fn leaf_of(c: &HtbClass, sender: Sender) -> Leaf {
    match sender {
        Sender::Forwarded if !is_sparse_leaf(c) => Leaf::Tbf(c.ceil),
        _ => Leaf::Pfifo {
            limit: c.ceil.queue_packets,
        },
    }
}

/// Whether a class the kernel reports is the one wanted (rates as the kernel rounds them to
/// bytes/s).
fn same_class(kind: &QueueKind, parent: u32, want: &HtbClass) -> bool {
    match *kind {
        QueueKind::HtbClass {
            rate, ceil, prio, ..
        } => {
            parent == want.parent
                && rate == (want.rate.rate / 8).max(1)
                && ceil == (want.ceil.rate / 8).max(1)
                && prio == want.prio
        }
        _ => false,
    }
}

fn same_leaf(kind: &QueueKind, want: &Leaf) -> bool {
    match (*kind, want) {
        (QueueKind::Pfifo { limit }, Leaf::Pfifo { limit: l }) => limit == *l,
        (
            QueueKind::Tbf {
                rate, limit_bytes, ..
            },
            Leaf::Tbf(s),
        ) => {
            rate == (s.leaf_rate / 8).max(1)
                && limit_bytes == s.queue_bytes.min(u64::from(u32::MAX))
        }
        _ => false,
    }
}

/// Brings `classes` (parents listed before their children) onto an HTB root `major:` of
/// `ifindex`, each leaf with a bounded queue: classes that are wanted and already there as
/// wanted are left alone (their queues and counters go on), others are created or changed,
/// and classes of ours that are not wanted are deleted, children first. `fresh` starts from
/// an empty root instead (a new pod).
#[allow(clippy::too_many_arguments)]
pub(crate) fn install_htb(
    rt: &mut Rtnl,
    ifindex: u32,
    major: u16,
    defcls: u16,
    classes: &[HtbClass],
    fresh: bool,
    sender: Sender,
) -> Result<(), DatapathError> {
    if fresh {
        rt.delete_root_htb(ifindex, major)?;
    }
    let created = rt.ensure_root_htb(ifindex, major, defcls, DIRECT_QLEN)?;
    let existing = if fresh || created {
        Vec::new()
    } else {
        rt.queue_sizes(ifindex)?
    };
    let root = handle(major, 0);
    // The kernel reports a class at the top of the tree with parent TC_H_ROOT.
    let have: BTreeMap<u32, (u32, QueueKind)> = existing
        .iter()
        .filter(|q| {
            matches!(q.kind, QueueKind::HtbClass { .. }) && q.handle >> 16 == u32::from(major)
        })
        .map(|q| {
            let parent = if q.parent == u32::MAX { root } else { q.parent };
            (q.handle, (parent, q.kind))
        })
        .collect();
    let leaves: BTreeMap<u32, QueueKind> = existing
        .iter()
        .filter(|q| !matches!(q.kind, QueueKind::HtbClass { .. }))
        .map(|q| (q.handle, q.kind))
        .collect();
    let wanted: BTreeMap<u32, &HtbClass> = classes.iter().map(|c| (c.classid, c)).collect();
    let parents: BTreeSet<u32> = classes.iter().map(|c| c.parent).collect();

    // Unwanted classes, and those that must move to another parent, deepest first (HTB
    // refuses to delete a class with children).
    let depth = |mut id: u32| {
        let mut d = 0;
        while let Some((p, _)) = have.get(&id) {
            if *p == root || d > 16 {
                break;
            }
            id = *p;
            d += 1;
        }
        d
    };
    let mut stale: Vec<(u32, u32)> = have
        .iter()
        .filter(|(id, (p, _))| wanted.get(id).is_none_or(|w| w.parent != *p))
        .map(|(id, (p, _))| (*id, *p))
        .collect();
    stale.sort_by_key(|(id, _)| std::cmp::Reverse(depth(*id)));
    for (id, parent) in &stale {
        rt.delete_class(ifindex, *id, *parent)?;
    }

    for c in classes {
        let keep = have
            .get(&c.classid)
            .is_some_and(|(p, k)| !stale.iter().any(|s| s.0 == c.classid) && same_class(k, *p, c));
        if !keep {
            rt.set_htb_class(ifindex, c)?;
        }
    }
    for c in classes {
        if parents.contains(&c.classid) {
            continue;
        }
        // Leaf queue sized by the class ceiling: the rate it drains at when borrowing.
        let leaf = leaf_handle(c.classid);
        let want = leaf_of(c, sender);
        let kept = have.contains_key(&c.classid)
            && !stale.iter().any(|s| s.0 == c.classid)
            && leaves.get(&leaf).is_some_and(|k| same_leaf(k, &want));
        if kept {
            continue;
        }
        match want {
            Leaf::Tbf(s) => rt.set_tbf(ifindex, c.classid, leaf, &s)?,
            Leaf::Pfifo { limit } => rt.set_pfifo(ifindex, c.classid, leaf, limit)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(limits: &[(Direction, usize, u64)]) -> abi::PodMeta {
        let mut m = abi::PodMeta::default();
        for &(d, k, r) in limits {
            m.limits.set(d, k, Some(r));
        }
        m
    }

    /// `(classid, parent, rate, ceil, prio)` of each class, for compact comparisons.
    fn layout(classes: &[HtbClass]) -> Vec<(u32, u32, u64, u64, u32)> {
        classes
            .iter()
            .map(|c| (c.classid, c.parent, c.rate.rate, c.ceil.rate, c.prio))
            .collect()
    }

    const IN: Direction = Direction::Ingress;
    const OUT: Direction = Direction::Egress;

    #[test]
    fn every_limit_gets_a_sparse_and_a_bulk_leaf() {
        let root = handle(HTB_MAJOR, 0);
        let ingress =
            pod_classes(&meta(&[(IN, abi::KIND_TOTAL, 8_000_000)]), IN).expect("ingress limit");
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
        assert!(pod_classes(&meta(&[]), IN).is_none());
        // Egress limits are not ingress ones.
        assert!(pod_classes(&meta(&[(OUT, abi::KIND_TOTAL, 1_000_000)]), IN).is_none());

        let internet_only =
            pod_classes(&meta(&[(OUT, abi::KIND_INTERNET, 4_000_000)]), OUT).expect("internet");
        assert_eq!(
            layout(&internet_only),
            [
                (0x1_0010, root, 4_000_000, 4_000_000, 0),
                (0x1_0011, 0x1_0010, 1_000_000, 4_000_000, 0),
                (0x1_0012, 0x1_0010, 3_000_000, 4_000_000, 1),
            ]
        );
    }

    #[test]
    fn more_specific_limits_hang_under_less_specific_ones() {
        let root = handle(HTB_MAJOR, 0);
        // Total 20M > internet 4M > named class 0 at 1M; named class 1 at 3M.
        let m = meta(&[
            (IN, abi::KIND_TOTAL, 20_000_000),
            (IN, abi::KIND_INTERNET, 4_000_000),
            (IN, abi::KIND_NAMED, 1_000_000),
            (IN, abi::KIND_NAMED + 1, 3_000_000),
        ]);
        let c = pod_classes(&m, IN).expect("limits");
        assert_eq!(
            layout(&c),
            [
                (0x1_0001, root, 20_000_000, 20_000_000, 0),
                // The total keeps 10M - its child's guarantee is at most half of it.
                (0x1_0002, 0x1_0001, 4_000_000, 20_000_000, 0),
                (0x1_0003, 0x1_0001, 12_000_000, 20_000_000, 1),
                (0x1_0010, 0x1_0001, 4_000_000, 4_000_000, 0),
                // Two children share half of the internet's 4M guarantee.
                (0x1_0011, 0x1_0010, 500_000, 4_000_000, 0),
                (0x1_0012, 0x1_0010, 1_500_000, 4_000_000, 1),
                (0x1_0100, 0x1_0010, 1_000_000, 1_000_000, 0),
                (0x1_0101, 0x1_0100, 250_000, 1_000_000, 0),
                (0x1_0102, 0x1_0100, 750_000, 1_000_000, 1),
                (0x1_0110, 0x1_0010, 1_000_000, 3_000_000, 0),
                (0x1_0111, 0x1_0110, 250_000, 3_000_000, 0),
                (0x1_0112, 0x1_0110, 750_000, 3_000_000, 1),
            ]
        );
        // Guarantees of the children of every class sum to at most its own.
        for p in &c {
            let sum: u64 = c
                .iter()
                .filter(|x| x.parent == p.classid)
                .map(|x| x.rate.rate)
                .sum();
            assert!(
                sum <= p.rate.rate,
                "{:x}: {sum} > {}",
                p.classid,
                p.rate.rate
            );
        }
        // A named class without an internet limit hangs under the total.
        let m = meta(&[
            (OUT, abi::KIND_TOTAL, 20_000_000),
            (OUT, abi::KIND_NAMED + 31, 2_000_000),
        ]);
        let c = pod_classes(&m, OUT).expect("limits");
        assert_eq!(c[3].classid, 0x1_02f0);
        assert_eq!(c[3].parent, 0x1_0001);
    }

    #[test]
    fn leaf_stats_add_up_both_leaves() {
        let q = |minor: u16, packets: u64, drops: u64| TcStats {
            handle: leaf_handle(handle(HTB_MAJOR, minor)),
            packets,
            drops,
            ..TcStats::default()
        };
        let stats = [q(0x11, 5, 0), q(0x12, 100, 3), q(0x2, 7, 1)];
        let internet = abi::classid(abi::pod_class(abi::KIND_INTERNET));
        let s = leaves_stats(&stats, internet).expect("internet leaves");
        assert_eq!((s.packets, s.drops), (105, 3));
        let total = abi::classid(abi::pod_class(abi::KIND_TOTAL));
        let s = leaves_stats(&stats, total).expect("one leaf is enough");
        assert_eq!((s.packets, s.drops), (7, 1));
        assert!(leaves_stats(&stats, abi::classid(abi::pod_class(abi::KIND_NAMED))).is_none());
    }
}
