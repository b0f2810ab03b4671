//! The cluster budget in `aliasnet-shaperd`: the share engine ([`aliasnet_budget::Engine`])
//! over this node's datapath.
//!
//! The engine reads the node's use of each budget ([`DatapathNode`]) and hands back its
//! shares; the daemon applies them by capping a copy of the parsed policy's node or
//! namespace limits ([`capped`]) and applying that, so the policy stays a ceiling and a
//! reload keeps the shares. Until the engine has derived a share, and in `--once`, a budget
//! is capped at its static split ([`aliasnet_budget::BudgetPolicy::static_caps`]), never
//! lifted.

mod usage;

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use aliasnet_budget::{
    BudgetError, BudgetKey, BudgetPolicy, ClusterConfig, Direction, Engine, Handle, Status,
};
use aliasnet_ebpf::{abi, Datapath, LevelLimits, NodePolicy, INTERNET};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tracing::{info, warn};

pub use usage::{DatapathNode, Meter};

pub fn dir(d: Direction) -> abi::Direction {
    match d {
        Direction::Ingress => abi::Direction::Ingress,
        Direction::Egress => abi::Direction::Egress,
    }
}

/// `policy` with each share as the node's limit of its class and direction (of a namespace's
/// budget: as that namespace's limit), the lower of the share and the policy's own.
pub fn capped(policy: &NodePolicy, shares: &BTreeMap<BudgetKey, u64>) -> NodePolicy {
    let mut p = policy.clone();
    for (k, share) in shares {
        let level = match &k.namespace {
            None => &mut p.node,
            Some(ns) => {
                &mut p
                    .namespaces
                    .entry(ns.clone())
                    .or_insert_with(|| policy.defaults.clone())
                    .namespace
            }
        };
        level.cap(dir(k.direction), &k.class, *share);
    }
    p
}

/// The node's own limit of a budget's traffic: the lowest of the policy's limits the traffic
/// passes at the budget's level and above (a named class also passes the internet's).
pub fn ceiling(policy: &NodePolicy, key: &BudgetKey) -> Option<u64> {
    let d = dir(key.direction);
    let mut levels: Vec<&LevelLimits> = vec![&policy.node];
    if let Some(ns) = &key.namespace {
        levels.push(&policy.limits_for(ns).namespace);
    }
    let classes = [key.class.as_str(), INTERNET];
    levels
        .iter()
        .flat_map(|l| classes.iter().filter_map(|c| l.get(d, c)))
        .min()
}

/// The shares to apply with `budgets`: the engine's, else the static split.
pub fn shares_for(
    budgets: &BudgetPolicy,
    engine: &BTreeMap<BudgetKey, u64>,
) -> BTreeMap<BudgetKey, u64> {
    let mut caps = budgets.static_caps();
    for (k, c) in caps.iter_mut() {
        if let Some(s) = engine.get(k) {
            *c = *s;
        }
    }
    caps
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("open the datapath for the cluster budget: {0}")]
    Datapath(#[from] aliasnet_ebpf::DatapathError),
    #[error(transparent)]
    Budget(#[from] BudgetError),
}

struct Running {
    cfg: ClusterConfig,
    handle: Handle,
    task: JoinHandle<Result<(), BudgetError>>,
}

/// The daemon's engine: started, updated, restarted and stopped as the policy changes.
pub struct ClusterBudget {
    node: String,
    pin_root: PathBuf,
    /// The node's own limits, for the engine's ceilings.
    ceilings: watch::Sender<Arc<NodePolicy>>,
    shares_tx: mpsc::UnboundedSender<BTreeMap<BudgetKey, u64>>,
    shares_rx: mpsc::UnboundedReceiver<BTreeMap<BudgetKey, u64>>,
    running: Option<Running>,
}

impl ClusterBudget {
    /// No engine yet; `node` is this node's name in the budget.
    pub fn new(node: String, pin_root: PathBuf) -> Self {
        let (shares_tx, shares_rx) = mpsc::unbounded_channel();
        Self {
            node,
            pin_root,
            ceilings: watch::Sender::new(Arc::new(NodePolicy::default())),
            shares_tx,
            shares_rx,
            running: None,
        }
    }

    /// The running engine's state.
    pub fn status(&self) -> Option<watch::Receiver<Status>> {
        self.running.as_ref().map(|r| r.handle.status())
    }

    /// Whether the running engine must stop before `budgets` apply: they have no
    /// `[cluster]`, or another one.
    pub fn must_stop(&self, budgets: &BudgetPolicy) -> bool {
        self.running
            .as_ref()
            .is_some_and(|r| budgets.cluster.as_ref() != Some(&r.cfg))
    }

    /// Follows a policy just applied: gives the running engine the budgets, or starts one for
    /// a `[cluster]` ([`Self::stop`] the engine first when [`Self::must_stop`]). An engine that
    /// cannot start is an error; the shares in force stay.
    pub async fn follow(
        &mut self,
        node_policy: &NodePolicy,
        budgets: &BudgetPolicy,
    ) -> Result<(), ClusterError> {
        self.ceilings.send_replace(Arc::new(node_policy.clone()));
        if self.must_stop(budgets) {
            self.stop().await;
        }
        if let Some(r) = &self.running {
            r.handle.set_budgets(budgets.budgets.clone());
            return Ok(());
        }
        let Some(cfg) = budgets.cluster.clone() else {
            return Ok(());
        };
        let dp = Datapath::open(&self.pin_root)?;
        let (engine, handle) = Engine::new(cfg.clone(), &self.node, budgets.budgets.clone())?;
        let node = DatapathNode::new(dp, self.ceilings.subscribe(), self.shares_tx.clone());
        info!(
            node = %self.node,
            endpoints = ?cfg.endpoints,
            budgets = budgets.budgets.len(),
            share_period = ?cfg.share_period,
            "cluster budget: engine started"
        );
        self.running = Some(Running {
            cfg,
            handle,
            task: tokio::spawn(engine.run(node)),
        });
        Ok(())
    }

    /// The next shares the engine applied (pending while no engine runs).
    pub async fn shares(&mut self) -> BTreeMap<BudgetKey, u64> {
        match self.shares_rx.recv().await {
            Some(s) => s,
            // The sender lives in `self`: never closed.
            None => std::future::pending().await,
        }
    }

    /// Stops the engine (its lease is revoked: its demands and candidacy go at once) and
    /// returns the last shares it applied: the static split, which stays in force after the
    /// daemon exits.
    pub async fn stop(&mut self) -> Option<BTreeMap<BudgetKey, u64>> {
        let r = self.running.take()?;
        r.handle.stop();
        // Revoking is bounded by the request timeout; this bounds a wedged task as well.
        let limit = r.cfg.lease_ttl + Duration::from_secs(1);
        match tokio::time::timeout(limit, r.task).await {
            Ok(Ok(Ok(()))) => info!("cluster budget: engine stopped"),
            Ok(Ok(Err(e))) => warn!("cluster budget: engine stopped: {e}"),
            Ok(Err(e)) => warn!("cluster budget: engine task: {e}"),
            Err(_) => warn!("cluster budget: engine did not stop within {limit:?}"),
        }
        let mut last = None;
        while let Ok(s) = self.shares_rx.try_recv() {
            last = Some(s);
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cap_the_node_or_namespace_limit_and_never_raise_it() {
        let p = crate::Policy::parse(
            r#"
            [cluster]
            etcd_endpoints = ["http://10.0.0.5:2379"]
            fallback_nodes = 10
            [internet]
            node_ingress_rate = "100M"
            [classes.mirrors]
            cidrs = ["203.0.113.0/24"]
            node_ingress_rate = "30M"
            cluster_ingress_rate = "1G"
            [namespaces.team.classes.mirrors]
            namespace_ingress_rate = "5M"
            cluster_ingress_rate = "200M"
            cluster_egress_rate = "200M"
            "#,
        )
        .unwrap();
        let (node, team) = (
            BudgetKey::new(None, "mirrors", Direction::Ingress),
            BudgetKey::new(Some("team"), "mirrors", Direction::Ingress),
        );
        let team_out = BudgetKey::new(Some("team"), "mirrors", Direction::Egress);
        let (i, o) = (abi::Direction::Ingress, abi::Direction::Egress);
        // Before the engine: the static split over fallback_nodes, under the policy's own.
        let shares = shares_for(&p.budgets, &BTreeMap::new());
        assert_eq!(shares[&node], 100_000_000);
        assert_eq!(shares[&team_out], 20_000_000);
        let c = capped(&p.datapath, &shares);
        assert_eq!(c.node.get(i, "mirrors"), Some(30_000_000));
        assert_eq!(
            c.limits_for("team").namespace.get(i, "mirrors"),
            Some(5_000_000)
        );
        assert_eq!(
            c.limits_for("team").namespace.get(o, "mirrors"),
            Some(20_000_000)
        );
        // The engine's shares, a budget it has no share for yet keeps the static split.
        let engine = BTreeMap::from([(node.clone(), 12_000_000), (team.clone(), 1_000_000)]);
        let c = capped(&p.datapath, &shares_for(&p.budgets, &engine));
        assert_eq!(c.node.get(i, "mirrors"), Some(12_000_000));
        assert_eq!(
            c.limits_for("team").namespace.get(i, "mirrors"),
            Some(1_000_000)
        );
        assert_eq!(
            c.limits_for("team").namespace.get(o, "mirrors"),
            Some(20_000_000)
        );
        // Other namespaces and classes are untouched.
        assert_eq!(c.defaults, p.datapath.defaults);
        assert_eq!(c.node.get(i, INTERNET), Some(100_000_000));
        // The ceilings: the lowest limit the traffic passes.
        assert_eq!(ceiling(&p.datapath, &node), Some(30_000_000));
        assert_eq!(ceiling(&p.datapath, &team), Some(5_000_000));
        assert_eq!(ceiling(&p.datapath, &team_out), None);
    }
}
