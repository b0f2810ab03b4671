//! The HTB classes of one aggregate on its device: a group per limited kind (the internet,
//! named classes under it), each with a sparse leaf served first, a bulk leaf shared by pods
//! that have none of their own yet, and one bulk leaf per pod, so that HTB shares the group
//! among its pods.

use crate::{
    abi,
    htb::guarantees,
    netlink::{handle, HtbClass},
    shape::Shape,
};

/// One limit of an aggregate on its device: its kind, its group's minor, its rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Group {
    pub kind: usize,
    pub minor: u32,
    pub limit: u64,
}

/// The guaranteed rate of a pod's own bulk leaf (and of the shared one): the leaves borrow
/// what they send from their group, which HTB shares among them round by round (one
/// quantum each, the largest packet a leaf passes: so by bytes); their own guarantees stay
/// far below the group's so that they never add up to more than it.
const LEAF_RATE: u64 = 1_000;

/// The classes of an aggregate with `groups` (at most one per kind) on a device (HTB root
/// `major:`) whose largest frame is `frame`, with a bulk leaf of its own for each pod of
/// `slots`; parents before children.
pub(crate) fn classes(major: u16, groups: &[Group], slots: &[u32], frame: u64) -> Vec<HtbClass> {
    let internet = groups.iter().find(|g| g.kind == abi::KIND_INTERNET);
    // Named classes nest in the internet's group, the internet's limit applying to them too.
    let tree: Vec<(u32, Option<u32>, u64)> = internet
        .into_iter()
        .chain(groups.iter().filter(|g| g.kind != abi::KIND_INTERNET))
        .map(|g| {
            let parent = internet.filter(|i| i.kind != g.kind).map(|i| i.minor);
            (g.minor, parent, g.limit)
        })
        .collect();
    let g = guarantees(&tree);
    let mut out = Vec::new();
    for &(minor, parent, limit) in &tree {
        let group = groups
            .iter()
            .find(|x| x.minor == minor)
            .expect("every tree node is a group");
        let ceil = Shape::new(limit, None, frame);
        let (guaranteed, own) = g[&minor];
        let id = handle(major, minor as u16);
        out.push(HtbClass {
            classid: id,
            parent: parent.map_or(handle(major, 0), |p| handle(major, p as u16)),
            rate: ceil.at_rate(guaranteed),
            ceil,
            prio: 0,
        });
        let sparse = (own / abi::SPARSE_RATE_DIV).max(1);
        out.push(HtbClass {
            classid: id + abi::GROUP_SPARSE,
            parent: id,
            rate: ceil.at_rate(sparse),
            ceil,
            prio: 0,
        });
        // What is left of the group's own share after the sparse leaf, spread over the bulk
        // leaves, at most LEAF_RATE each.
        let bulk_rate = ((own - sparse.min(own)) / (slots.len() as u64 + 1)).clamp(8, LEAF_RATE);
        let bulk = |classid: u32| HtbClass {
            classid,
            parent: id,
            rate: ceil.at_rate(bulk_rate),
            ceil,
            prio: 1,
        };
        out.push(bulk(id + abi::GROUP_SHARED));
        out.extend(
            slots
                .iter()
                .map(|s| bulk(handle(major, abi::agg_leaf(group.kind, *s) as u16))),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_nest_in_the_internet_and_share_among_pods() {
        let internet = Group {
            kind: abi::KIND_INTERNET,
            minor: abi::node_group(abi::KIND_INTERNET),
            limit: 100_000_000,
        };
        let mirrors = Group {
            kind: abi::KIND_NAMED + 2,
            minor: abi::node_group(abi::KIND_NAMED + 2),
            limit: 20_000_000,
        };
        let c = classes(1, &[mirrors, internet], &[0, 5], 9014);
        let ids: Vec<(u32, u32, u32)> = c.iter().map(|c| (c.classid, c.parent, c.prio)).collect();
        let i = handle(1, internet.minor as u16);
        let m = handle(1, mirrors.minor as u16);
        assert_eq!(
            ids,
            [
                (i, handle(1, 0), 0),
                (i + 1, i, 0),
                (i + 2, i, 1),
                (handle(1, 1), i, 1),
                (handle(1, 6), i, 1),
                (m, i, 0),
                (m + 1, m, 0),
                (m + 2, m, 1),
                (handle(1, (1 + 3 * 1024) as u16), m, 1),
                (handle(1, (1 + 3 * 1024 + 5) as u16), m, 1),
            ]
        );
        // Ceilings are the limits; guarantees of children never exceed their parent's.
        assert_eq!(c[0].ceil.rate, 100_000_000);
        assert_eq!(c[5].ceil.rate, 20_000_000);
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
        // Every pod's leaf has the same guarantee (and so the same DRR quantum).
        assert_eq!(c[3].rate.rate, c[4].rate.rate);
    }

    #[test]
    fn a_named_class_alone_is_a_root_group() {
        let g = Group {
            kind: abi::KIND_NAMED,
            minor: 0x9000,
            limit: 1_000_000,
        };
        let c = classes(abi::NS_IN_MAJOR, &[g], &[], 1514);
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].parent, handle(abi::NS_IN_MAJOR, 0));
        assert_eq!(c[0].classid, handle(abi::NS_IN_MAJOR, 0x9000));
        assert_eq!(c[0].rate.rate, 1_000_000);
    }
}
