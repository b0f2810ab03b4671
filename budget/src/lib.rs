//! Cluster-wide budgets: all nodes' pods together stay within one rate per class and
//! direction (and per namespace), shared among the nodes by demand.
//!
//! Every node runs an [`Engine`]: it reports its demand per budget under a lease-bound etcd key
//! and applies its share; one node at a time, elected through etcd's election API, computes the
//! max-min fair water level of each budget ([`water`]) and publishes it as one small value that
//! every node watches ([`wire`]). A node's share is min(its demand, level) ([`share`]).
//! `docs/design/cluster-budget.md` explains the allocation and its failure modes.
//!
//! - [`config`]: the `[cluster]` table and the `cluster_*_rate` keys of shaper.toml.
//! - [`estimate`]: a node's demand from its counters and queue state.
//! - [`session`]: the etcd connection and the node's lease.
//! - [`leader`]: the elected node's demand view and publishing.
//! - [`view`]: a read-only look at the budgets in etcd (`aliasnetctl budget`).

pub mod config;
pub mod engine;
pub mod error;
pub mod estimate;
pub mod leader;
pub mod session;
pub mod share;
pub mod view;
pub mod water;
pub mod wire;

pub use config::{
    Budget, BudgetKey, BudgetPolicy, ClusterConfig, ClusterRates, ConfigError, Direction,
};
pub use engine::{BudgetStatus, Engine, Handle, NodeBudgets, Status};
pub use error::BudgetError;
pub use estimate::Usage;
pub use share::Mode;
