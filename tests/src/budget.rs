//! Simulated nodes for the cluster budget: real [`aliasnet_budget::Engine`]s (each with its
//! own etcd connection, lease and candidacy) over a fluid model of a node's traffic, all on
//! one thread inside a network namespace that reaches etcd through the fabric.
//!
//! A node's traffic per budget runs at min(want, cap): `want` is what its pods would pull
//! (infinite for elastic downloads), `cap` the share the engine applied last. A killed
//! node's traffic keeps its last cap, as the datapath keeps its limits when the daemon dies.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aliasnet_budget::{
    Budget, BudgetKey, ClusterConfig, Engine, Handle, NodeBudgets, Status, Usage,
};
use anyhow::{Context, Result};
use tokio::sync::mpsc;

/// A simulated node's uplink, bit/s.
pub const LINE_RATE: f64 = 100e9;

/// One node's traffic per budget.
#[derive(Debug, Default)]
pub struct Traffic {
    /// bit/s the pods would use unshaped; `f64::INFINITY` for elastic downloads.
    pub want: BTreeMap<BudgetKey, f64>,
    /// The node's own limit per budget.
    pub ceiling: BTreeMap<BudgetKey, u64>,
    /// What the engine applied last.
    pub caps: BTreeMap<BudgetKey, u64>,
    bytes: BTreeMap<BudgetKey, f64>,
    last: Option<Instant>,
}

impl Traffic {
    /// The rate this node runs at for `key` now: at most its uplink's line rate.
    pub fn rate(&self, key: &BudgetKey) -> f64 {
        let want = self.want.get(key).copied().unwrap_or(0.0).min(LINE_RATE);
        let cap = self.caps.get(key).map_or(f64::INFINITY, |c| *c as f64);
        let own = self.ceiling.get(key).map_or(f64::INFINITY, |c| *c as f64);
        want.min(cap).min(own)
    }

    fn advance(&mut self) {
        let now = Instant::now();
        if let Some(t) = self.last {
            let secs = (now - t).as_secs_f64();
            let keys: Vec<BudgetKey> = self.want.keys().cloned().collect();
            for k in keys {
                let r = self.rate(&k);
                *self.bytes.entry(k).or_default() += r * secs / 8.0;
            }
        }
        self.last = Some(now);
    }
}

struct Driver(Arc<Mutex<Traffic>>);

impl NodeBudgets for Driver {
    fn usage(&mut self, keys: &[BudgetKey]) -> Vec<Usage> {
        let mut t = self.0.lock().unwrap();
        t.advance();
        keys.iter()
            .map(|key| Usage {
                bytes: t.bytes.get(key).copied().unwrap_or(0.0) as u64,
                congested: t.rate(key) < t.want.get(key).copied().unwrap_or(0.0),
                ceiling: t.ceiling.get(key).copied(),
            })
            .collect()
    }

    fn apply(&mut self, caps: &BTreeMap<BudgetKey, u64>) {
        let mut t = self.0.lock().unwrap();
        t.advance();
        t.caps = caps.clone();
    }
}

enum Cmd {
    Start(String, Box<Engine>, Driver),
    Kill(String),
}

/// A simulated node.
pub struct SimNode {
    pub name: String,
    pub traffic: Arc<Mutex<Traffic>>,
    pub handle: Handle,
    pub alive: bool,
}

impl SimNode {
    pub fn status(&self) -> Status {
        self.handle.status().borrow().clone()
    }

    pub fn set_want(&self, key: &BudgetKey, bps: f64) {
        let mut t = self.traffic.lock().unwrap();
        t.advance();
        t.want.insert(key.clone(), bps);
    }

    pub fn cap(&self, key: &BudgetKey) -> Option<u64> {
        self.traffic.lock().unwrap().caps.get(key).copied()
    }

    pub fn rate(&self, key: &BudgetKey) -> f64 {
        self.traffic.lock().unwrap().rate(key)
    }
}

/// Simulated nodes, all on one runtime thread inside `netns`.
pub struct SimCluster {
    pub cfg: ClusterConfig,
    pub nodes: Vec<SimNode>,
    tx: mpsc::UnboundedSender<Cmd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SimCluster {
    /// A runtime inside the namespace at `netns` (where the engines' sockets are made).
    pub fn new(netns: PathBuf, cfg: ClusterConfig) -> Result<Self> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
        let thread = std::thread::Builder::new()
            .name("sim-nodes".into())
            .spawn(move || {
                let run = move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    rt.block_on(async move {
                        let mut tasks = BTreeMap::new();
                        while let Some(cmd) = rx.recv().await {
                            match cmd {
                                Cmd::Start(name, engine, driver) => {
                                    let t = tokio::spawn(async move {
                                        let _ = engine.run(driver).await;
                                    });
                                    tasks.insert(name, t);
                                }
                                Cmd::Kill(name) => {
                                    if let Some(t) = tasks.remove(&name) {
                                        t.abort();
                                    }
                                }
                            }
                        }
                        // Stopped engines revoke their leases; give them the time to.
                        for (_, t) in tasks {
                            let _ = tokio::time::timeout(Duration::from_secs(3), t).await;
                        }
                    });
                };
                aliasnet_netns::run_in(&netns, run).expect("enter the nodes' namespace");
            })
            .context("spawn the simulation thread")?;
        Ok(Self {
            cfg,
            nodes: Vec::new(),
            tx,
            thread: Some(thread),
        })
    }

    /// Starts node `name` with `budgets` and the given traffic (or a fresh one).
    pub fn start(
        &mut self,
        name: &str,
        budgets: &[Budget],
        traffic: Option<Arc<Mutex<Traffic>>>,
    ) -> Result<usize> {
        let (engine, handle) = Engine::new(self.cfg.clone(), name, budgets.to_vec())?;
        let traffic = traffic.unwrap_or_default();
        self.tx
            .send(Cmd::Start(
                name.to_owned(),
                Box::new(engine),
                Driver(traffic.clone()),
            ))
            .ok()
            .context("simulation thread gone")?;
        if let Some(i) = self.index(name) {
            self.nodes[i] = SimNode {
                name: name.to_owned(),
                traffic,
                handle,
                alive: true,
            };
            return Ok(i);
        }
        self.nodes.push(SimNode {
            name: name.to_owned(),
            traffic,
            handle,
            alive: true,
        });
        Ok(self.nodes.len() - 1)
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Graceful stop: the node revokes its lease and leaves the static split applied.
    pub fn stop(&mut self, i: usize) {
        self.nodes[i].handle.stop();
        self.nodes[i].alive = false;
    }

    /// Crash: the engine vanishes without a word; its traffic keeps its last cap.
    pub fn kill(&mut self, i: usize) {
        let _ = self.tx.send(Cmd::Kill(self.nodes[i].name.clone()));
        self.nodes[i].alive = false;
    }

    /// Restarts a killed or stopped node (a new engine, as a restarted daemon), keeping its
    /// traffic.
    pub fn restart(&mut self, i: usize, budgets: &[Budget]) -> Result<()> {
        let (name, traffic) = (self.nodes[i].name.clone(), self.nodes[i].traffic.clone());
        self.start(&name, budgets, Some(traffic))?;
        Ok(())
    }

    /// Σ caps over every node in the simulation (dead ones keep theirs).
    pub fn total_caps(&self, key: &BudgetKey) -> u64 {
        self.nodes.iter().filter_map(|n| n.cap(key)).sum()
    }

    /// Σ traffic over every node.
    pub fn total_rate(&self, key: &BudgetKey) -> f64 {
        self.nodes.iter().map(|n| n.rate(key)).sum()
    }

    /// The live node that is the leader, if one is.
    pub fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.alive && n.handle.status().borrow().leader)
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        for n in &self.nodes {
            n.handle.stop();
        }
        // Closing the channel ends the runtime once the stopped engines are done.
        let (tx, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
