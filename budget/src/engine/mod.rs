//! The engine one node runs: every share period it reads its usage, estimates its demand per
//! budget, reports changed demands to etcd, derives its shares from the published levels and
//! applies them; next to that it is a candidate in the election and, while elected, the
//! leader that computes and publishes the levels ([`crate::leader`]).
//!
//! The node side is a trait ([`NodeBudgets`]) so that the engine runs the same against the
//! datapath in `aliasnet-shaperd` and against simulated nodes in tests and benchmarks.

mod tasks;

pub(crate) use tasks::MAX_TXN_OPS;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use aliasnet_ebpf::limits::MIN_RATE;
use tokio::{
    sync::{watch, Notify},
    time::Instant,
};

use crate::{
    config::{Budget, BudgetKey, ClusterConfig},
    error::BudgetError,
    estimate::{Estimator, Usage},
    share::{static_share, Contact, Mode, ShareState},
    water::Allocation,
    wire::{valid_node_name, Published},
};

/// What the engine needs from a node.
pub trait NodeBudgets: Send + 'static {
    /// The node's usage of each budget's traffic (in `keys`' order), read once per period:
    /// bytes so far, congestion of the queue that enforces it, the node's own limit for it.
    fn usage(&mut self, keys: &[BudgetKey]) -> Vec<Usage>;
    /// Applies every budget's share (bit/s) as the node's limit for that class and direction
    /// (or namespace, class and direction): the lower of it and the node's own limit. Called
    /// with every configured budget whenever a share changes.
    fn apply(&mut self, caps: &BTreeMap<BudgetKey, u64>);
}

/// One budget as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetStatus {
    pub key: BudgetKey,
    /// The configured budget, bit/s.
    pub budget: u64,
    /// This node's demand estimate, bit/s.
    pub demand: u64,
    /// The demand etcd has for this node (last written under the current lease).
    pub reported: Option<u64>,
    /// This node's share, bit/s, and how it was derived.
    pub share: u64,
    pub mode: Mode,
    /// Measured throughput of the last period, bit/s.
    pub use_bps: u64,
    /// The leader's last published value.
    pub published: Option<Published>,
    /// The leader's own computation (this node is the leader).
    pub cluster: Option<Allocation>,
}

/// The engine's state, for metrics and `aliasnetctl budget`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    pub node: String,
    /// The session to etcd is up.
    pub connected: bool,
    pub leader: bool,
    pub budgets: Vec<BudgetStatus>,
    /// Time of the leader's last computation of all levels.
    pub compute_time: Duration,
    /// Leader elections this node won since it started.
    pub elections_won: u64,
    /// Sessions (re)established since start.
    pub sessions: u64,
}

#[derive(Debug, Default)]
pub(crate) struct PerBudget {
    pub estimator: Estimator,
    pub share: ShareState,
    pub demand: u64,
    pub ceiling: u64,
    /// The demand etcd has for this node under its current lease.
    pub reported: Option<u64>,
    /// The shares applied since the last reading.
    pub applied: Applied,
}

/// The shares applied over a period, by time: the limit a reading's use is judged against.
/// A share that changed just before the reading (a level published late in the period) did
/// not hold the traffic of the period back, the one before it did.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// The share in force and since when (accounted up to then).
    current: Option<(u64, Instant)>,
    /// ∫ share dt and the time covered, since the last reading.
    area: f64,
    covered: f64,
}

impl Applied {
    fn account(&mut self, now: Instant) {
        if let Some((s, t)) = self.current {
            let dt = now.saturating_duration_since(t).as_secs_f64();
            self.area += s as f64 * dt;
            self.covered += dt;
            self.current = Some((s, now));
        }
    }

    /// `share` is in force from `now`.
    pub fn set(&mut self, now: Instant, share: u64) {
        self.account(now);
        self.current = Some((share, now));
    }

    /// The mean share since the last call (`None` before any share was applied).
    pub fn take_mean(&mut self, now: Instant) -> Option<u64> {
        self.account(now);
        let mean = if self.covered > 0.0 {
            Some((self.area / self.covered) as u64)
        } else {
            self.current.map(|(s, _)| s)
        };
        self.area = 0.0;
        self.covered = 0.0;
        mean
    }
}

#[derive(Debug)]
pub(crate) struct Core {
    pub budgets: Vec<Budget>,
    pub per: BTreeMap<BudgetKey, PerBudget>,
    /// Every published level seen, configured here or not.
    pub levels: BTreeMap<BudgetKey, Published>,
    /// Nodes reporting each budget, counted at session start.
    pub counted: BTreeMap<BudgetKey, u32>,
    /// Budgets removed from the configuration whose demand keys are still in etcd.
    pub removed: BTreeSet<BudgetKey>,
    pub contact: Contact,
    pub leader: bool,
    pub cluster: BTreeMap<BudgetKey, Allocation>,
    pub compute_time: Duration,
    pub elections_won: u64,
    pub sessions: u64,
}

impl Core {
    /// Starts using `budgets`; state of budgets that stay is kept.
    fn set_budgets(&mut self, mut budgets: Vec<Budget>) {
        budgets.sort();
        budgets.dedup_by(|a, b| a.key == b.key);
        let keep: BTreeSet<&BudgetKey> = budgets.iter().map(|b| &b.key).collect();
        let gone: Vec<BudgetKey> = self
            .per
            .keys()
            .filter(|k| !keep.contains(k))
            .cloned()
            .collect();
        for k in gone {
            if self.per.remove(&k).is_some_and(|p| p.reported.is_some()) {
                self.removed.insert(k);
            }
        }
        for b in &budgets {
            self.removed.remove(&b.key);
            self.per.entry(b.key.clone()).or_default();
        }
        self.budgets = budgets;
    }

    /// Forgets everything written under a lease that expired.
    pub(crate) fn lease_lost(&mut self) {
        for p in self.per.values_mut() {
            p.share.lease_lost();
            p.reported = None;
        }
        self.removed.clear();
    }
}

/// Aborts the task when dropped: a dropped engine leaves no session behind.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) type Shared = Arc<Mutex<Core>>;

pub(crate) fn lock(core: &Shared) -> MutexGuard<'_, Core> {
    // Nothing is left half-updated by a panic that matters more than stopping the engine.
    core.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Controls a running engine.
#[derive(Clone)]
pub struct Handle {
    budgets: watch::Sender<Vec<Budget>>,
    status: watch::Receiver<Status>,
    stop: watch::Sender<bool>,
}

impl Handle {
    /// Replaces the budgets (a policy reload). The cluster settings need a new engine.
    pub fn set_budgets(&self, budgets: Vec<Budget>) {
        self.budgets.send_replace(budgets);
    }

    /// The engine's state, updated every period and on every share change.
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Stops the engine: it revokes its lease (its demands and candidacy go at once) and
    /// [`Engine::run`] returns. The shares applied last stay applied.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }
}

/// One node's engine; [`Engine::run`] drives it.
pub struct Engine {
    cfg: ClusterConfig,
    node: String,
    budgets: watch::Receiver<Vec<Budget>>,
    status: watch::Sender<Status>,
    stop: watch::Receiver<bool>,
}

impl Engine {
    /// An engine for node `node` (its Kubernetes node name) with `budgets`.
    pub fn new(
        cfg: ClusterConfig,
        node: &str,
        budgets: Vec<Budget>,
    ) -> Result<(Engine, Handle), BudgetError> {
        if !valid_node_name(node) {
            return Err(BudgetError::NodeName(node.to_owned()));
        }
        let (btx, brx) = watch::channel(budgets);
        let (stx, srx) = watch::channel(Status {
            node: node.to_owned(),
            ..Status::default()
        });
        let (ptx, prx) = watch::channel(false);
        Ok((
            Engine {
                cfg,
                node: node.to_owned(),
                budgets: brx,
                status: stx,
                stop: prx,
            },
            Handle {
                budgets: btx,
                status: srx,
                stop: ptx,
            },
        ))
    }

    /// Runs until [`Handle::stop`]. etcd errors are retried, never returned: a node without
    /// etcd holds, then splits statically.
    pub async fn run<N: NodeBudgets>(mut self, mut node: N) -> Result<(), BudgetError> {
        let core: Shared = Arc::new(Mutex::new(Core {
            budgets: Vec::new(),
            per: BTreeMap::new(),
            levels: BTreeMap::new(),
            counted: BTreeMap::new(),
            removed: BTreeSet::new(),
            contact: Contact {
                connected: false,
                last_ok: None,
                ttl: self.cfg.lease_ttl,
            },
            leader: false,
            cluster: BTreeMap::new(),
            compute_time: Duration::ZERO,
            elections_won: 0,
            sessions: 0,
        }));
        lock(&core).set_budgets(self.budgets.borrow_and_update().clone());
        let wake = Arc::new(Notify::new());
        let write = Arc::new(Notify::new());
        let mut sessions = AbortOnDrop(tokio::spawn(tasks::sessions(
            self.cfg.clone(),
            self.node.clone(),
            core.clone(),
            wake.clone(),
            write.clone(),
            self.stop.clone(),
        )));
        let mut tick = tokio::time::interval(self.cfg.share_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut applied: Option<BTreeMap<BudgetKey, u64>> = None;
        loop {
            let sample = tokio::select! {
                _ = tick.tick() => true,
                _ = wake.notified() => false,
                r = self.budgets.changed() => {
                    if r.is_ok() {
                        lock(&core).set_budgets(self.budgets.borrow_and_update().clone());
                        write.notify_one();
                    }
                    false
                }
                _ = self.stop.changed() => break,
            };
            let keys: Vec<BudgetKey> = lock(&core).budgets.iter().map(|b| b.key.clone()).collect();
            let usage: Vec<Usage> = if sample {
                node.usage(&keys)
            } else {
                Vec::new()
            };
            let caps = self.period(&core, &usage);
            if applied.as_ref() != Some(&caps) {
                node.apply(&caps);
                applied = Some(caps);
            }
            if sample {
                write.notify_one();
            }
        }
        let _ = (&mut sessions.0).await;
        // The datapath keeps the last caps after the daemon exits: leave the static split
        // there, not a share the leader is about to give to others.
        node.apply(&self.static_caps(&core));
        Ok(())
    }

    /// budget ÷ nodes last seen, for every budget.
    fn static_caps(&self, core: &Shared) -> BTreeMap<BudgetKey, u64> {
        let c = lock(core);
        c.budgets
            .iter()
            .map(|b| {
                let nodes = c.per[&b.key].share.nodes(self.cfg.fallback_nodes);
                (b.key.clone(), static_share(b.rate, nodes))
            })
            .collect()
    }

    /// Takes the readings (empty: only re-derive shares), updates demands and shares; the caps.
    fn period(&self, core: &Shared, usage: &[Usage]) -> BTreeMap<BudgetKey, u64> {
        let now = Instant::now();
        let mut guard = lock(core);
        let c = &mut *guard;
        let mut caps = BTreeMap::new();
        for (i, b) in c.budgets.iter().enumerate() {
            let p = c.per.entry(b.key.clone()).or_default();
            p.share.published = c.levels.get(&b.key).cloned();
            p.share.counted = c.counted.get(&b.key).copied();
            let nodes = p.share.nodes(self.cfg.fallback_nodes);
            // An idle node's demand: all idle nodes together hold at most 5 % of the budget,
            // and a node that starts pulling is not stalled while it waits for the leader.
            let floor = (b.rate / (20 * u64::from(nodes))).max(MIN_RATE);
            if let Some(u) = usage.get(i) {
                p.ceiling = u.ceiling.map_or(b.rate, |c| c.min(b.rate));
                let cap = p.applied.take_mean(now);
                p.demand = p.estimator.update(now, *u, cap, p.ceiling, floor);
                tracing::debug!(
                    budget = %b.key,
                    use_bps = p.estimator.rate,
                    share = ?cap,
                    congested = u.congested,
                    demand = p.demand,
                    "cluster budget: period"
                );
            } else if p.ceiling == 0 {
                // Not sampled yet: as a first reading (see `Estimator::update`).
                p.ceiling = b.rate;
                p.demand = b.rate;
            }
            let (share, _) =
                p.share
                    .derive(now, c.contact, b.rate, p.demand, self.cfg.fallback_nodes);
            p.applied.set(now, share);
            caps.insert(b.key.clone(), share);
        }
        let status = Status {
            node: self.node.clone(),
            connected: c.contact.connected,
            leader: c.leader,
            budgets: c
                .budgets
                .iter()
                .map(|b| {
                    let p = &c.per[&b.key];
                    let (share, mode) = p.share.share.unwrap_or((0, Mode::Static));
                    BudgetStatus {
                        key: b.key.clone(),
                        budget: b.rate,
                        demand: p.demand,
                        reported: p.reported,
                        share,
                        mode,
                        use_bps: p.estimator.rate,
                        published: p.share.published.clone(),
                        cluster: c.cluster.get(&b.key).copied(),
                    }
                })
                .collect(),
            compute_time: c.compute_time,
            elections_won: c.elections_won,
            sessions: c.sessions,
        };
        drop(guard);
        self.status.send_replace(status);
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_is_judged_against_the_shares_of_its_period_by_time() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut a = Applied::default();
        assert_eq!(a.take_mean(t0), None);
        a.set(t0, 2_000_000);
        // A level published 100 ms before the reading: the period was mostly at 2M.
        a.set(ms(900), 20_000_000);
        assert_eq!(a.take_mean(ms(1000)), Some(3_800_000));
        // Unchanged through the next period.
        assert_eq!(a.take_mean(ms(2000)), Some(20_000_000));
        // Re-derived without a change: the same.
        a.set(ms(2500), 20_000_000);
        assert_eq!(a.take_mean(ms(3000)), Some(20_000_000));
    }
}
