//! The elected node: keeps every node's demand in memory (one read, then a watch), and
//! computes and publishes the water level of each budget whose demands changed: at most once
//! per share period, and [`DEBOUNCE`] after a demand changed when the last computation is a
//! period old, so that a node's report takes effect in about one round trip instead of
//! waiting for the leader's next period.
//!
//! A new leader learns by reading the demand keys: they are in etcd, not in the old leader's
//! memory, so its learning period is one range read, and it publishes in its first period.
//! Until then nodes keep applying the old leader's last values, which stay consistent.
//!
//! Every publish is a transaction that succeeds only while this node's election key exists
//! with the revision it won with: a leader that lost its lease (and so its leadership)
//! without noticing cannot overwrite its successor's values.

use std::{
    collections::{BTreeMap, BTreeSet},
    convert::Infallible,
};

use etcd_client::{Compare, CompareOp, EventType, GetOptions, LeaderKey, Txn, TxnOp, WatchOptions};
use tokio::time::{Duration, Instant};
use tracing::debug;

use crate::{
    config::BudgetKey,
    engine::{lock, Shared, MAX_TXN_OPS},
    error::{deadline, BudgetError},
    session::{request_timeout, Session},
    water::allocate,
    wire::{decode_demand, Keys, Published},
    ClusterConfig,
};

/// How long the leader waits after a demand changed before it computes: reports of nodes that
/// saw the same change in the same moment go in one computation.
pub const DEBOUNCE: Duration = Duration::from_millis(50);

/// Every node's demand per budget, as of revision `rev`.
#[derive(Debug, Default)]
pub struct DemandView {
    pub demands: BTreeMap<BudgetKey, BTreeMap<String, u64>>,
    /// Every demand event up to this revision is applied.
    pub rev: i64,
}

impl DemandView {
    /// Applies one put or delete of a demand key at `mod_rev`; the budget it touched.
    pub fn apply(
        &mut self,
        keys: &Keys,
        put: bool,
        key: &[u8],
        value: &[u8],
        mod_rev: i64,
    ) -> Option<BudgetKey> {
        self.rev = self.rev.max(mod_rev);
        let (budget, node) = keys.parse_demand(key)?;
        let nodes = self.demands.entry(budget.clone()).or_default();
        match (put, decode_demand(value)) {
            (true, Some(d)) => {
                nodes.insert(node, d);
            }
            // An undecodable demand counts as none: it must not stop the others' shares.
            _ => {
                nodes.remove(&node);
            }
        }
        Some(budget)
    }

    /// The value to publish for one budget of `rate` bit/s.
    pub fn compute(&self, key: &BudgetKey, rate: u64, leader: &str) -> Published {
        let mut d: Vec<u64> = self
            .demands
            .get(key)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default();
        let a = allocate(rate, &mut d);
        Published {
            level: a.level,
            rev: self.rev,
            nodes: a.nodes,
            budget: rate,
            total_demand: a.total_demand,
            total_share: a.total_share,
            leader: leader.to_owned(),
        }
    }
}

pub(crate) async fn lead(
    s: &Session,
    cfg: &ClusterConfig,
    keys: &Keys,
    won: &LeaderKey,
    node: &str,
    core: &Shared,
) -> Result<Infallible, BudgetError> {
    let limit = request_timeout(cfg);
    let mut kv = s.client.kv_client();
    let got = deadline(
        "read demands",
        limit,
        kv.get(keys.demand_prefix(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let mut view = DemandView {
        rev: got.header().map_or(0, |h| h.revision()),
        ..DemandView::default()
    };
    for e in got.kvs() {
        view.apply(keys, true, e.key(), e.value(), 0);
    }
    // Levels of budgets no longer configured are deleted (the previous leader's or this
    // leader's own from before a reload).
    let existing = deadline(
        "read levels",
        limit,
        kv.get(
            keys.level_prefix(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ),
    )
    .await?;
    let mut on_etcd: BTreeSet<BudgetKey> = existing
        .kvs()
        .iter()
        .filter_map(|e| keys.parse_level(e.key()))
        .collect();
    let mut watcher = s.client.watch_client();
    let mut stream = deadline(
        "watch demands",
        limit,
        watcher.watch(
            keys.demand_prefix(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(view.rev + 1),
            ),
        ),
    )
    .await?;
    let mut published: BTreeMap<BudgetKey, Published> = BTreeMap::new();
    let mut dirty: BTreeSet<BudgetKey> = BTreeSet::new();
    let mut tick = tokio::time::interval(cfg.share_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let guard = Compare::create_revision(won.key().to_vec(), CompareOp::Equal, won.rev());
    // The next computation (the first at once) and the last one.
    let mut due = Some(Instant::now());
    let mut last: Option<Instant> = None;
    let schedule = |due: &mut Option<Instant>, last: Option<Instant>| {
        let soonest = Instant::now() + DEBOUNCE;
        due.get_or_insert(last.map_or(soonest, |l| soonest.max(l + cfg.share_period)));
    };
    loop {
        let compute = async {
            match due {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            msg = stream.message() => {
                let msg = msg?.ok_or_else(|| BudgetError::Protocol("demand watch ended".into()))?;
                if msg.canceled() {
                    return Err(BudgetError::Protocol(format!("demand watch cancelled: {}", msg.cancel_reason())));
                }
                for ev in msg.events() {
                    let Some(e) = ev.kv() else { continue };
                    let put = ev.event_type() == EventType::Put;
                    if let Some(b) = view.apply(keys, put, e.key(), e.value(), e.mod_revision()) {
                        dirty.insert(b);
                    }
                }
                if !dirty.is_empty() {
                    schedule(&mut due, last);
                }
            }
            // Budgets configured, removed or changed since the last computation.
            _ = tick.tick() => {
                let c = lock(core);
                let stale = c.budgets.iter().any(|b| {
                    published.get(&b.key).is_none_or(|p| p.budget != b.rate)
                }) || published.keys().any(|k| !c.budgets.iter().any(|b| b.key == *k));
                drop(c);
                if stale {
                    schedule(&mut due, last);
                }
            }
            _ = compute => {
                due = None;
                last = Some(Instant::now());
                let budgets = lock(core).budgets.clone();
                let started = Instant::now();
                let mut ops = Vec::new();
                let mut cluster = BTreeMap::new();
                for b in &budgets {
                    let stale = published.get(&b.key).is_none_or(|p| p.budget != b.rate);
                    if !stale && !dirty.contains(&b.key) {
                        continue;
                    }
                    let p = view.compute(&b.key, b.rate, node);
                    cluster.insert(b.key.clone(), crate::water::Allocation {
                        level: p.level,
                        total_demand: p.total_demand,
                        total_share: p.total_share,
                        nodes: p.nodes,
                    });
                    if published.get(&b.key) != Some(&p) {
                        ops.push(TxnOp::put(keys.level(&b.key), p.encode(), None));
                        published.insert(b.key.clone(), p);
                    }
                }
                let configured: BTreeSet<&BudgetKey> = budgets.iter().map(|b| &b.key).collect();
                let gone: Vec<BudgetKey> = on_etcd
                    .iter()
                    .chain(published.keys())
                    .filter(|k| !configured.contains(k))
                    .cloned()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                for k in &gone {
                    ops.push(TxnOp::delete(keys.level(k), None));
                    published.remove(k);
                }
                on_etcd.clear();
                let elapsed = started.elapsed();
                {
                    let mut c = lock(core);
                    c.compute_time = elapsed;
                    c.cluster.extend(cluster);
                    c.cluster.retain(|k, _| configured.contains(k));
                }
                dirty.clear();
                while !ops.is_empty() {
                    let chunk: Vec<TxnOp> = ops.drain(..ops.len().min(MAX_TXN_OPS)).collect();
                    let n = chunk.len();
                    let txn = Txn::new().when([guard.clone()]).and_then(chunk);
                    let resp = deadline("publish levels", limit, kv.txn(txn)).await?;
                    if !resp.succeeded() {
                        return Err(BudgetError::LostLeadership);
                    }
                    debug!(levels = n, rev = view.rev, "cluster budget: published");
                }
            }
        }
    }
}
