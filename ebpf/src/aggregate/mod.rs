//! Aggregates: the limits on all pods of a namespace on this node together, and on all pods
//! of the node, by class and direction.
//!
//! A limit that covers many pods must be shaped where all their traffic passes: an
//! aggregate device per level and direction ([`devices`]). Each level is a tree of its own
//! (internet, named classes under it), and a packet must pass the limits of every level at
//! once, which no single HTB tree can express when a namespace's and the node's limits cross
//! (the node's `mirrors` limit spans namespaces, a namespace's internet limit spans classes):
//! so each level shapes on its own device, in series: traffic to a pod passes the node's
//! download device, then its namespace's, then its own host veth; traffic from it its own
//! eth0, its namespace's upload device, then the uplink.
//!
//! On each device every limit of an aggregate is a group with a leaf per pod
//! ([`layout`]): HTB shares the group among the pods that use it (round by round), so one
//! pod with many connections does not crowd out the others. The programs pick the leaf per
//! packet (`agg_leaf()` in `lib/stage.h`) from what this module publishes: the groups in
//! `an_entities`, each pod's namespace and own leaves in its `an_pod_meta`. Publishing
//! follows the devices: new groups and leaves are created before the programs are told of
//! them, and the programs stop using old ones before they are deleted.
//!
//! The CNI plugin records a pod's namespace aggregate when it has one; shaperd runs
//! [`Datapath::reconcile_aggregates`] when the set of pods or the policy changes (and on
//! restart), which allocates aggregates, creates groups and pods' leaves, and frees what is
//! no longer used. Until then a new pod's traffic takes its groups' shared leaf: the limits
//! hold, the sharing among pods waits for shaperd.

pub mod devices;
pub(crate) mod layout;

use std::collections::{BTreeMap, BTreeSet};

use tracing::{info, warn};

use crate::{
    abi::{self, Direction},
    datapath::{is_not_found, Datapath},
    error::DatapathError,
    htb::{install_htb, Sender},
    maps,
    netlink::{HtbClass, Rtnl},
    pod::attach_gate,
};
use layout::Group;

/// What [`Datapath::reconcile_aggregates`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AggregateReport {
    /// Namespaces with an aggregate on this node.
    pub namespaces: usize,
    /// Aggregates allocated and freed now.
    pub allocated: usize,
    pub freed: usize,
    /// Pods whose record changed (their namespace's aggregate, their own leaves).
    pub pods_updated: usize,
    /// Gates put on host veths now.
    pub gates: usize,
    /// What could not be done (a pod's host veth gone, too many groups), with why.
    pub errors: Vec<String>,
}

/// The kinds of `limits` limited in `dir` that a group shapes (internet and named).
fn limited_kinds(limits: &abi::Rates, dir: Direction) -> Vec<usize> {
    (abi::KIND_INTERNET..abi::NR_KINDS)
        .filter(|k| limits.get(dir, *k).is_some())
        .collect()
}

/// Group minors of `groups` (a direction's row of an aggregate's record) in use.
fn minors(groups: &[u16; abi::NR_KINDS]) -> impl Iterator<Item = u32> + '_ {
    groups.iter().filter(|g| **g != 0).map(|g| u32::from(*g))
}

impl Datapath {
    /// Brings the aggregates in line with the applied policy and the attached pods (see the
    /// module documentation). Takes the pin root's lock.
    pub fn reconcile_aggregates(&mut self) -> Result<AggregateReport, DatapathError> {
        let _lock = self.lock()?;
        self.reconcile_aggregates_locked()
    }

    pub(crate) fn reconcile_aggregates_locked(&mut self) -> Result<AggregateReport, DatapathError> {
        let cfg = self.config()?;
        let mut report = AggregateReport::default();
        let pods = self.scan()?;

        // 1. Which namespaces need an aggregate: those with pods here and namespace limits.
        let mut by_ns: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (slot, m) in &pods {
            by_ns
                .entry(abi::cstr(&m.k8s_namespace))
                .or_default()
                .push(*slot);
        }
        let mut wanted: BTreeMap<String, abi::Rates> = BTreeMap::new();
        for ns in by_ns.keys() {
            let limits = self.ns_policy(ns)?.ns;
            if limits.any() {
                wanted.insert(ns.clone(), limits);
            }
        }
        let present: BTreeMap<String, u32> = self
            .entity_ids
            .iter()
            .filter_map(Result::ok)
            .map(|(k, e)| (abi::cstr(&k.name), e))
            .filter(|(_, e)| *e != abi::NODE_ENTITY && *e < abi::MAX_ENTITIES)
            .collect();

        // 2. Free the aggregates no longer wanted (their pods first forget them), allocate
        // new ones.
        for (ns, e) in present.iter().filter(|(ns, _)| !wanted.contains_key(*ns)) {
            for (slot, m) in &pods {
                if m.entity == *e {
                    self.update_meta(*slot, |m| {
                        m.entity = 0;
                        m.agg_leaves[0] = [0; abi::NR_DIRS];
                    })?;
                }
            }
            self.free_entity(ns, *e)?;
            report.freed += 1;
        }
        let mut ids: BTreeMap<String, u32> = present
            .into_iter()
            .filter(|(ns, _)| wanted.contains_key(ns))
            .collect();
        let mut used: BTreeSet<u32> = ids.values().copied().collect();
        for ns in wanted.keys() {
            if ids.contains_key(ns) {
                continue;
            }
            let Some(e) = (1..abi::MAX_ENTITIES).find(|e| !used.contains(e)) else {
                report.errors.push(format!(
                    "namespace {ns}: all {} namespace aggregates are in use; its namespace \
                     limits are not enforced on this node",
                    abi::MAX_ENTITIES - 1
                ));
                continue;
            };
            self.new_entity(ns, e)?;
            used.insert(e);
            ids.insert(ns.clone(), e);
            report.allocated += 1;
        }
        report.namespaces = ids.len();

        // 3. Groups: each aggregate's limited kinds, per direction, on its level's device.
        let node = self.entity(abi::NODE_ENTITY)?;
        let mut groups: BTreeMap<u32, [[u16; abi::NR_KINDS]; abi::NR_DIRS]> = BTreeMap::new();
        let mut node_groups = [[0u16; abi::NR_KINDS]; abi::NR_DIRS];
        for dir in Direction::ALL {
            let in_use = match dir {
                Direction::Ingress => cfg.node_in_ifindex != 0,
                Direction::Egress => cfg.node_out != 0,
            };
            if in_use {
                for k in limited_kinds(&node.limits, dir) {
                    node_groups[dir.index()][k] = abi::node_group(k) as u16;
                }
            }
        }
        for dir in Direction::ALL {
            let in_use = match dir {
                Direction::Ingress => cfg.ns_in_ifindex != 0,
                Direction::Egress => cfg.ns_out_ifindex != 0,
            };
            // Minors kept from before, then new ones from what is free on the device.
            let mut taken: BTreeSet<u32> = BTreeSet::new();
            let mut todo = Vec::new();
            for (ns, e) in &ids {
                let old = self.entity(*e)?.groups[dir.index()];
                let row = groups
                    .entry(*e)
                    .or_insert([[0; abi::NR_KINDS]; abi::NR_DIRS]);
                if !in_use {
                    continue;
                }
                for k in limited_kinds(&wanted[ns], dir) {
                    if old[k] != 0 {
                        row[dir.index()][k] = old[k];
                        taken.insert(u32::from(old[k]));
                    } else {
                        todo.push((*e, k));
                    }
                }
            }
            let mut free = (abi::AGG_GROUP_MIN..=abi::AGG_GROUP_MAX - abi::GROUP_SHARED)
                .step_by(3)
                .filter(|g| !taken.contains(g));
            for (e, k) in todo {
                match free.next() {
                    Some(g) => {
                        groups.get_mut(&e).expect("row made above")[dir.index()][k] = g as u16;
                    }
                    None => report.errors.push(format!(
                        "aggregate {e}: no free group on the namespaces' {} device; a limit is \
                         not enforced",
                        dir.name()
                    )),
                }
            }
        }

        // 4. What each pod should have: its namespace's aggregate, and a leaf of its own in
        // every group of its namespace's and of the node's.
        let mut want_meta: BTreeMap<u32, (u32, [[u64; abi::NR_DIRS]; 2])> = BTreeMap::new();
        for (slot, m) in &pods {
            let e = ids.get(&abi::cstr(&m.k8s_namespace)).copied().unwrap_or(0);
            let mut leaves = [[0u64; abi::NR_DIRS]; 2];
            for d in 0..abi::NR_DIRS {
                if let Some(row) = groups.get(&e) {
                    leaves[0][d] = mask(&row[d]);
                }
                leaves[1][d] = mask(&node_groups[d]);
            }
            want_meta.insert(*slot, (e, leaves));
        }

        // 5. Publish what stays, withdraw what goes; the devices; then publish what is new.
        for (slot, m) in &pods {
            let (e, leaves) = want_meta[slot];
            let keep_entity = if m.entity == e { e } else { 0 };
            let mut kept = [[0u64; abi::NR_DIRS]; 2];
            for l in 0..2 {
                for d in 0..abi::NR_DIRS {
                    kept[l][d] = m.agg_leaves[l][d] & leaves[l][d];
                }
            }
            if keep_entity != m.entity || kept != m.agg_leaves {
                self.update_meta(*slot, |m| {
                    m.entity = keep_entity;
                    m.agg_leaves = kept;
                })?;
            }
        }
        for (e, row) in &groups {
            let mut rec = self.entity(*e)?;
            let before = rec.groups;
            withdraw_changed(&mut rec.groups, row);
            if rec.groups != before {
                self.set_entity(*e, rec)?;
            }
        }
        let mut node_rec = node;
        withdraw_changed(&mut node_rec.groups, &node_groups);
        self.set_entity(abi::NODE_ENTITY, node_rec)?;

        let frame = devices::frame(self, u64::from(cfg.uplink_frame))?;
        let mut rt = Rtnl::new()?;
        for dir in Direction::ALL {
            let d = dir.index();
            let (ns_dev, node_dev) = match dir {
                Direction::Ingress => (cfg.ns_in_ifindex, cfg.node_in_ifindex),
                Direction::Egress => (
                    cfg.ns_out_ifindex,
                    if cfg.node_out != 0 {
                        cfg.uplink_ifindex
                    } else {
                        0
                    },
                ),
            };
            if ns_dev != 0 {
                let major = devices::major(Some(dir));
                let mut classes = Vec::new();
                for (ns, e) in &ids {
                    let slots: Vec<u32> = by_ns.get(ns).cloned().unwrap_or_default();
                    classes.extend(group_classes(
                        major,
                        &groups[e][d],
                        &wanted[ns],
                        dir,
                        &slots,
                        frame,
                    ));
                }
                install_htb(
                    &mut rt,
                    ns_dev,
                    major,
                    0,
                    &classes,
                    false,
                    Sender::Forwarded,
                )?;
            }
            if node_dev != 0 {
                let major = devices::major(None);
                let slots: Vec<u32> = pods.iter().map(|(s, _)| *s).collect();
                let classes =
                    group_classes(major, &node_groups[d], &node.limits, dir, &slots, frame);
                install_htb(
                    &mut rt,
                    node_dev,
                    major,
                    0,
                    &classes,
                    false,
                    Sender::Forwarded,
                )?;
            }
        }

        for (ns, e) in &ids {
            let mut rec = self.entity(*e)?;
            let pods_of = want_meta.values().filter(|(x, _)| x == e).count() as u32;
            let want = abi::Entity {
                groups: groups[e],
                limits: wanted[ns],
                pods: pods_of,
                ..rec
            };
            if rec != want {
                rec = want;
                self.set_entity(*e, rec)?;
            }
        }
        node_rec.groups = node_groups;
        self.set_entity(abi::NODE_ENTITY, node_rec)?;
        for slot in want_meta.keys() {
            let (e, leaves) = want_meta[slot];
            let now = self.meta_at(*slot)?;
            if now.entity != e || now.agg_leaves != leaves {
                self.update_meta(*slot, |m| {
                    m.entity = e;
                    m.agg_leaves = leaves;
                })?;
                report.pods_updated += 1;
            }
        }

        // 6. Gates on the host veths of pods attached before the namespaces' download device
        // was in use.
        if cfg.ns_in_ifindex != 0 {
            for (slot, m) in &pods {
                if m.flags & abi::META_NS_GATE != 0 {
                    continue;
                }
                let host = abi::cstr(&m.host_ifname);
                if nix::net::if_::if_nametoindex(host.as_str()) != Ok(m.host_ifindex) {
                    continue;
                }
                match attach_gate(&mut rt, &self.pins, m.host_ifindex, cfg.ns_in_ifindex) {
                    Ok(()) => {
                        self.update_meta(*slot, |m| m.flags |= abi::META_NS_GATE)?;
                        report.gates += 1;
                    }
                    Err(e) => report
                        .errors
                        .push(format!("gate on {host} (slot {slot}): {e}")),
                }
            }
        }
        for err in &report.errors {
            warn!("aggregates: {err}");
        }
        if report.allocated + report.freed + report.pods_updated + report.gates > 0 {
            info!(
                namespaces = report.namespaces,
                allocated = report.allocated,
                freed = report.freed,
                pods = report.pods_updated,
                gates = report.gates,
                "aggregates reconciled"
            );
        }
        Ok(report)
    }

    fn update_meta(
        &mut self,
        slot: u32,
        f: impl FnOnce(&mut abi::PodMeta),
    ) -> Result<(), DatapathError> {
        let mut m = self.meta_at(slot)?;
        f(&mut m);
        self.meta
            .set(slot, m, 0)
            .map_err(|e| DatapathError::map(maps::POD_META, e))
    }

    fn set_entity(&mut self, e: u32, rec: abi::Entity) -> Result<(), DatapathError> {
        self.entities
            .set(e, rec, 0)
            .map_err(|err| DatapathError::map(maps::ENTITIES, err))
    }

    /// A fresh aggregate `e` for namespace `ns`: its record, its id, its models reset.
    fn new_entity(&mut self, ns: &str, e: u32) -> Result<(), DatapathError> {
        let name = abi::fixed_str::<64>(ns).ok_or_else(|| DatapathError::InvalidArgument {
            field: "namespace",
            reason: format!("{ns:?} is longer than 63 bytes"),
        })?;
        let limits = self.ns_policy(ns)?.ns;
        self.reset_models(e)?;
        self.set_entity(
            e,
            abi::Entity {
                flags: abi::ENTITY_IN_USE,
                limits,
                name,
                ..Default::default()
            },
        )?;
        let key = abi::NsKey { name };
        self.entity_ids
            .insert(key, e, 0)
            .map_err(|err| DatapathError::map(maps::ENTITY_IDS, err))
    }

    fn free_entity(&mut self, ns: &str, e: u32) -> Result<(), DatapathError> {
        if let Some(key) = abi::NsKey::new(ns) {
            match self.entity_ids.remove(&key) {
                Ok(()) => {}
                Err(err) if is_not_found(&err) => {}
                Err(err) => return Err(DatapathError::map(maps::ENTITY_IDS, err)),
            }
        }
        self.set_entity(e, abi::Entity::default())
    }

    /// Resets the queue models of aggregate `e`, so that a new namespace starts clean.
    fn reset_models(&mut self, e: u32) -> Result<(), DatapathError> {
        for d in 0..abi::NR_DIRS {
            for k in 0..abi::NR_KINDS {
                self.vqueue
                    .set(abi::vq_agg(e, d, k), abi::VQueue::default(), 0)
                    .map_err(|err| DatapathError::map(maps::VQUEUE, err))?;
            }
        }
        Ok(())
    }
}

/// Clears every group of `groups` that `wanted` does not have at the same place: the programs
/// stop using it before the devices change.
fn withdraw_changed(
    groups: &mut [[u16; abi::NR_KINDS]; abi::NR_DIRS],
    wanted: &[[u16; abi::NR_KINDS]; abi::NR_DIRS],
) {
    for (have, want) in groups.iter_mut().flatten().zip(wanted.iter().flatten()) {
        if have != want {
            *have = 0;
        }
    }
}

/// Bit K set for every kind K with a group in `row`.
fn mask(row: &[u16; abi::NR_KINDS]) -> u64 {
    row.iter()
        .enumerate()
        .filter(|(_, g)| **g != 0)
        .fold(0, |m, (k, _)| m | (1 << k))
}

/// The classes of one aggregate's groups of `dir` (`row`) with a leaf per pod of `slots`, on
/// a device whose HTB root is `major:`.
fn group_classes(
    major: u16,
    row: &[u16; abi::NR_KINDS],
    limits: &abi::Rates,
    dir: Direction,
    slots: &[u32],
    frame: u64,
) -> Vec<HtbClass> {
    let groups: Vec<Group> = minors(row)
        .zip(
            row.iter()
                .enumerate()
                .filter(|(_, g)| **g != 0)
                .map(|(k, _)| k),
        )
        .filter_map(|(minor, kind)| {
            Some(Group {
                kind,
                minor,
                limit: limits.get(dir, kind)?,
            })
        })
        .collect();
    layout::classes(major, &groups, slots, frame)
}

impl Datapath {
    /// The queue statistics of aggregate `entity`'s groups of `dir` on its device (the node
    /// is [`abi::NODE_ENTITY`]), by limit kind: whether a limit is the bottleneck (drops,
    /// overlimits, a backlog) is read here. Empty when the level's device is not in use.
    pub fn group_stats(
        &self,
        entity: u32,
        dir: Direction,
    ) -> Result<Vec<(usize, crate::netlink::TcStats)>, DatapathError> {
        let cfg = self.config()?;
        let (ifindex, major) = match (entity == abi::NODE_ENTITY, dir) {
            (true, Direction::Ingress) => (cfg.node_in_ifindex, devices::major(None)),
            (true, Direction::Egress) => (
                if cfg.node_out != 0 {
                    cfg.uplink_ifindex
                } else {
                    0
                },
                devices::major(None),
            ),
            (false, Direction::Ingress) => (cfg.ns_in_ifindex, devices::major(Some(dir))),
            (false, Direction::Egress) => (cfg.ns_out_ifindex, devices::major(Some(dir))),
        };
        if ifindex == 0 {
            return Ok(Vec::new());
        }
        let groups = self.entity(entity)?.groups[dir.index()];
        let stats = Rtnl::new()?.class_stats(ifindex)?;
        Ok(groups
            .iter()
            .enumerate()
            .filter(|(_, g)| **g != 0)
            .filter_map(|(k, g)| {
                let id = crate::netlink::handle(major, *g);
                stats.iter().find(|s| s.handle == id).map(|s| (k, *s))
            })
            .collect())
    }
}
