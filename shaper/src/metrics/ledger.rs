//! Node and namespace totals that only grow while pods come and go.

use std::collections::{HashMap, HashSet};

use aliasnet_ebpf::abi::{self, PodCounters};

use super::snapshot::{PodSample, Snapshot};

fn wrapping_sub(a: &mut PodCounters, b: &PodCounters) {
    let cells = a
        .dir
        .iter_mut()
        .flatten()
        .chain([&mut a.spoofed, &mut a.policed])
        .chain(a.dropped.iter_mut());
    let from = b
        .dir
        .iter()
        .flatten()
        .chain([&b.spoofed, &b.policed])
        .chain(b.dropped.iter());
    for (x, y) in cells.zip(from) {
        x.packets = x.packets.wrapping_sub(y.packets);
        x.bytes = x.bytes.wrapping_sub(y.bytes);
    }
}

/// Counters plus rate drops: what the namespace and node totals add up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Totals {
    pub(super) counters: PodCounters,
    pub(super) rate_drops: [u64; abi::NR_DIRS],
}

impl Totals {
    pub(super) fn add(&mut self, c: &PodCounters, drops: &[u64; abi::NR_DIRS]) {
        self.counters += *c;
        for (a, b) in self.rate_drops.iter_mut().zip(drops) {
            *a = a.wrapping_add(*b);
        }
    }
    /// Forgets what the totals kept of named class `k`: its index went to another class.
    fn restart_class(&mut self, k: usize) {
        for dir in self.counters.dir.iter_mut() {
            dir[abi::CLASS_NAMED as usize + k] = abi::Counter::default();
        }
    }
    pub(super) fn sub(&mut self, c: &PodCounters, drops: &[u64; abi::NR_DIRS]) {
        wrapping_sub(&mut self.counters, c);
        for (a, b) in self.rate_drops.iter_mut().zip(drops) {
            *a = a.wrapping_sub(*b);
        }
    }
}

#[derive(Debug, Clone)]
struct Seen {
    namespace: String,
    counters: PodCounters,
    rate_drops: [u64; abi::NR_DIRS],
}

/// Keeps node and namespace totals monotonic across pod churn (see the module docs).
///
/// Offsets are applied with wrapping arithmetic: `total = live + offset (mod 2^64)`, where
/// `offset` = counted by detached pods − what live pods had counted at the first sample.
#[derive(Debug, Default)]
pub struct Ledger {
    started: bool,
    seen: HashMap<(u32, u64), Seen>,
    node: Totals,
    namespaces: HashMap<String, Totals>,
    /// The named classes by index at the last sample.
    class_names: Vec<Option<String>>,
}

impl Ledger {
    /// Folds a snapshot in and returns the rate drops to export per pod (index-aligned with
    /// `snap.pods`): the value read, else the last value read for that attachment, else 0.
    pub fn observe(&mut self, snap: &Snapshot) -> Vec<[u64; abi::NR_DIRS]> {
        let drops: Vec<[u64; abi::NR_DIRS]> = snap
            .pods
            .iter()
            .map(|p| {
                let last = self.seen.get(&p.key()).map(|s| s.rate_drops);
                let mut d = [0; abi::NR_DIRS];
                for (i, v) in d.iter_mut().enumerate() {
                    *v = p.rate_drops[i].or(last.map(|l| l[i])).unwrap_or(0);
                }
                d
            })
            .collect();
        if !self.started {
            self.started = true;
            for (p, d) in snap.pods.iter().zip(&drops) {
                self.node.sub(&p.counters, d);
                self.namespaces
                    .entry(p.namespace.clone())
                    .or_default()
                    .sub(&p.counters, d);
            }
        } else {
            let live: HashSet<(u32, u64)> = snap.pods.iter().map(PodSample::key).collect();
            let gone: Vec<(u32, u64)> = self
                .seen
                .keys()
                .filter(|k| !live.contains(k))
                .copied()
                .collect();
            for k in gone {
                if let Some(s) = self.seen.remove(&k) {
                    self.node.add(&s.counters, &s.rate_drops);
                    self.namespaces
                        .entry(s.namespace)
                        .or_default()
                        .add(&s.counters, &s.rate_drops);
                }
            }
        }
        // A named class's index that went to another class: the pods' counters of the new
        // class start at zero (the datapath rebases them), and so do its totals.
        for k in 0..snap.class_names.len() {
            if self
                .class_names
                .get(k)
                .is_some_and(|n| *n != snap.class_names[k])
            {
                self.node.restart_class(k);
                for t in self.namespaces.values_mut() {
                    t.restart_class(k);
                }
            }
        }
        self.class_names.clone_from(&snap.class_names);
        self.seen.clear();
        for (p, d) in snap.pods.iter().zip(&drops) {
            self.seen.insert(
                p.key(),
                Seen {
                    namespace: p.namespace.clone(),
                    counters: p.counters,
                    rate_drops: *d,
                },
            );
        }
        // A namespace without pods has no series; its next pod starts a fresh one.
        let live_ns: HashSet<&str> = snap.pods.iter().map(|p| p.namespace.as_str()).collect();
        self.namespaces
            .retain(|ns, _| live_ns.contains(ns.as_str()));
        drops
    }

    pub(super) fn node_offset(&self) -> &Totals {
        &self.node
    }

    pub(super) fn namespace_offset(&self, ns: &str) -> Totals {
        self.namespaces.get(ns).copied().unwrap_or_default()
    }
}
