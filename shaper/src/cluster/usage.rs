//! What the engine reads from the datapath: the node's use of each budget's traffic (bytes by
//! class, direction and namespace from the pods' counters) and whether the queue that
//! enforces the node's share is holding traffic back.

use std::collections::{BTreeMap, HashMap};

use aliasnet_budget::{BudgetKey, NodeBudgets, Usage};
use aliasnet_ebpf::{
    abi::{self, Class, PodCounters},
    Datapath, DatapathError, NodePolicy, INTERNET,
};
use aliasnet_netlink::TcStats;
use tokio::sync::{mpsc, watch};
use tracing::warn;

use super::{ceiling, dir};
use crate::metrics::{PodSample, Snapshot};

/// Bytes of one class and direction in `c`: every named class is part of the internet.
fn class_bytes(c: &PodCounters, d: abi::Direction, class: &str, names: &[Option<String>]) -> u64 {
    if class == INTERNET {
        return c.internet(d).bytes;
    }
    names
        .iter()
        .position(|n| n.as_deref() == Some(class))
        .map_or(0, |k| c.get(d, Class::Named(k as u8)).bytes)
}

/// Per-budget byte totals that only grow while the daemon runs, whatever pods come and go:
/// each sample adds what every pod counted since the previous one (all of it for a pod
/// attached since then). A pod detached between two samples loses what it counted after
/// the first of them.
#[derive(Debug, Default)]
pub struct Meter {
    started: bool,
    /// Counters of each attachment (slot, attach time) at the last sample.
    seen: HashMap<(u32, u64), PodCounters>,
    totals: BTreeMap<BudgetKey, u64>,
}

impl Meter {
    /// Folds in one reading of the pods, for `keys` (totals of other keys are dropped; a new
    /// key starts at zero).
    pub fn observe(&mut self, pods: &[PodSample], names: &[Option<String>], keys: &[BudgetKey]) {
        self.totals.retain(|k, _| keys.contains(k));
        for p in pods {
            let base = match self.seen.get(&(p.slot, p.attached_unix_ns)) {
                Some(c) => Some(c),
                // Present at the first sample: counted before the daemon started.
                None if !self.started => Some(&p.counters),
                None => None,
            };
            for k in keys {
                if k.namespace.as_ref().is_some_and(|ns| *ns != p.namespace) {
                    continue;
                }
                let d = dir(k.direction);
                let now = class_bytes(&p.counters, d, &k.class, names);
                let before = base.map_or(0, |b| class_bytes(b, d, &k.class, names));
                *self.totals.entry(k.clone()).or_default() += now.saturating_sub(before);
            }
        }
        self.seen = pods
            .iter()
            .map(|p| ((p.slot, p.attached_unix_ns), p.counters))
            .collect();
        self.started = true;
    }

    pub fn bytes(&self, key: &BudgetKey) -> u64 {
        self.totals.get(key).copied().unwrap_or(0)
    }
}

/// One reading of the queue of a budget's class at its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Queue {
    drops: u64,
    overlimits: u64,
    packets: u64,
    /// Bytes queued at the reading.
    backlog: u64,
}

/// Share of a period's packets that HTB delayed (overlimits) above which the queue counts as
/// holding traffic back. A flow well under its rate still sends a burst over it now and then.
const HELD_BACK_OVERLIMITS: f64 = 0.01;

impl Queue {
    fn of(s: &TcStats) -> Self {
        Self {
            drops: s.drops,
            overlimits: s.overlimits,
            packets: s.packets,
            backlog: s.backlog,
        }
    }

    /// Whether the queue held traffic back between `before` and this reading: it dropped,
    /// delayed more than [`HELD_BACK_OVERLIMITS`] of the packets, or holds a backlog now.
    fn held_back(&self, before: &Queue) -> bool {
        let packets = self.packets.saturating_sub(before.packets);
        let over = self.overlimits.saturating_sub(before.overlimits);
        self.backlog > 0
            || self.drops > before.drops
            || over as f64 > HELD_BACK_OVERLIMITS * packets as f64
    }
}

/// The engine's view of this node's datapath. It reads through its own handle on the pins;
/// shares go to the daemon's loop, which applies them with the rest of the policy.
pub struct DatapathNode {
    dp: Datapath,
    /// The node's own limits (the policy as parsed, without shares): the ceilings.
    policy: watch::Receiver<std::sync::Arc<NodePolicy>>,
    shares: mpsc::UnboundedSender<BTreeMap<BudgetKey, u64>>,
    meter: Meter,
    queues: HashMap<BudgetKey, Queue>,
    /// Whether the last reading failed (one warning per failure streak).
    failing: bool,
}

impl DatapathNode {
    pub fn new(
        dp: Datapath,
        policy: watch::Receiver<std::sync::Arc<NodePolicy>>,
        shares: mpsc::UnboundedSender<BTreeMap<BudgetKey, u64>>,
    ) -> Self {
        Self {
            dp,
            policy,
            shares,
            meter: Meter::default(),
            queues: HashMap::new(),
            failing: false,
        }
    }

    /// The class queues of each level the keys need, by key, as read now.
    fn queues(
        &self,
        keys: &[BudgetKey],
        names: &[Option<String>],
    ) -> Result<HashMap<BudgetKey, Queue>, DatapathError> {
        // Each level's groups, read once: (namespace, direction) → (kind, statistics).
        type Groups<'a> = HashMap<(Option<&'a str>, abi::Direction), Vec<(usize, TcStats)>>;
        let mut groups: Groups = HashMap::new();
        let mut out = HashMap::new();
        for k in keys {
            let d = dir(k.direction);
            let level = (k.namespace.as_deref(), d);
            if let std::collections::hash_map::Entry::Vacant(v) = groups.entry(level) {
                let entity = match level.0 {
                    None => Some(abi::NODE_ENTITY),
                    Some(ns) => self.dp.entity_of(ns)?,
                };
                v.insert(match entity {
                    Some(e) => self.dp.group_stats(e, d)?,
                    None => Vec::new(),
                });
            }
            let kind = if k.class == INTERNET {
                Some(abi::KIND_INTERNET)
            } else {
                names
                    .iter()
                    .position(|n| n.as_deref() == Some(k.class.as_str()))
                    .map(|i| abi::KIND_NAMED + i)
            };
            let found = kind.and_then(|kind| groups[&level].iter().find(|(g, _)| *g == kind));
            if let Some((_, s)) = found {
                out.insert(k.clone(), Queue::of(s));
            }
        }
        Ok(out)
    }

    fn read(&mut self, keys: &[BudgetKey]) -> Result<Vec<bool>, DatapathError> {
        let snap = Snapshot::read(&self.dp, false)?;
        self.meter.observe(&snap.pods, &snap.class_names, keys);
        let now = self.queues(keys, &snap.class_names)?;
        let held = keys
            .iter()
            .map(|k| match (now.get(k), self.queues.get(k)) {
                (Some(n), Some(b)) => n.held_back(b),
                _ => false,
            })
            .collect();
        self.queues = now;
        Ok(held)
    }
}

impl NodeBudgets for DatapathNode {
    fn usage(&mut self, keys: &[BudgetKey]) -> Vec<Usage> {
        let held = match self.read(keys) {
            Ok(h) => {
                self.failing = false;
                h
            }
            Err(e) => {
                if !self.failing {
                    warn!("cluster budget: reading the datapath: {e}");
                }
                self.failing = true;
                vec![false; keys.len()]
            }
        };
        let policy = self.policy.borrow().clone();
        keys.iter()
            .zip(held)
            .map(|(k, congested)| Usage {
                bytes: self.meter.bytes(k),
                congested,
                ceiling: ceiling(&policy, k),
            })
            .collect()
    }

    fn apply(&mut self, caps: &BTreeMap<BudgetKey, u64>) {
        // The daemon's loop is gone only when it exits, and then nothing is left to apply.
        let _ = self.shares.send(caps.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliasnet_budget::Direction;

    fn pod(slot: u32, attached: u64, ns: &str, plain: u64, mirrors: u64) -> PodSample {
        let mut counters = PodCounters::default();
        let d = abi::Direction::Ingress.index();
        counters.dir[d][Class::Internet.index()].bytes = plain;
        counters.dir[d][Class::Named(1).index()].bytes = mirrors;
        PodSample {
            slot,
            attached_unix_ns: attached,
            namespace: ns.into(),
            pod: format!("p{slot}"),
            ip: std::net::Ipv4Addr::UNSPECIFIED,
            host_ifindex: 0,
            pod_ifindex: 0,
            netns: Default::default(),
            counters,
            limits: Default::default(),
            rate_drops: [None; abi::NR_DIRS],
            conns: Default::default(),
        }
    }

    #[test]
    fn totals_grow_by_what_pods_counted_across_churn() {
        let names = vec![None, Some("mirrors".to_owned())];
        let keys = [
            BudgetKey::new(None, "mirrors", Direction::Ingress),
            BudgetKey::new(None, INTERNET, Direction::Ingress),
            BudgetKey::new(Some("team"), "mirrors", Direction::Ingress),
        ];
        let mut m = Meter::default();
        // What pods counted before the first sample is not counted.
        m.observe(&[pod(0, 1, "team", 100, 1000)], &names, &keys);
        assert_eq!(keys.each_ref().map(|k| m.bytes(k)), [0, 0, 0]);
        // Growth of a pod, and all of a pod attached since.
        m.observe(
            &[pod(0, 1, "team", 150, 1500), pod(1, 2, "other", 10, 20)],
            &names,
            &keys,
        );
        assert_eq!(keys.each_ref().map(|k| m.bytes(k)), [520, 580, 500]);
        // A pod gone and another in its slot (a new attachment): totals never go back.
        m.observe(&[pod(0, 3, "team", 5, 7)], &names, &keys);
        assert_eq!(keys.each_ref().map(|k| m.bytes(k)), [527, 592, 507]);
    }

    #[test]
    fn a_queue_holds_back_when_it_drops_queues_or_delays_more_than_a_percent() {
        let q = |drops, overlimits, packets, backlog| Queue {
            drops,
            overlimits,
            packets,
            backlog,
        };
        let before = q(5, 100, 10_000, 0);
        assert!(!before.held_back(&before));
        assert!(!q(5, 105, 11_000, 0).held_back(&before));
        assert!(q(5, 150, 11_000, 0).held_back(&before));
        assert!(q(6, 100, 11_000, 0).held_back(&before));
        assert!(q(5, 100, 11_000, 1514).held_back(&before));
    }
}
