//! A read-only look at the budgets in etcd, for `aliasnetctl budget`: what the leader
//! published, how many nodes report, who leads, and one node's reported demands.

use std::collections::BTreeMap;

use etcd_client::GetOptions;

use crate::{
    config::{BudgetKey, ClusterConfig},
    error::{deadline, BudgetError},
    session::{connect, request_timeout},
    wire::{decode_demand, Keys, Published},
};

/// One budget as etcd has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetView {
    pub published: Option<Published>,
    /// Nodes with a demand key now.
    pub reporting: u32,
    /// The demand etcd has for the node asked about.
    pub node_demand: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// The member that answered.
    pub endpoint: String,
    /// The elected leader's node name.
    pub leader: Option<String>,
    /// Every budget with a published level or a reporting node.
    pub budgets: BTreeMap<BudgetKey, BudgetView>,
}

/// Reads the view through the first member that answers.
pub async fn read(cfg: &ClusterConfig, node: &str) -> Result<ClusterView, BudgetError> {
    let mut last = None;
    for ep in &cfg.endpoints {
        match read_from(cfg, ep, node).await {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| BudgetError::Protocol("no endpoint".into())))
}

async fn read_from(cfg: &ClusterConfig, ep: &str, node: &str) -> Result<ClusterView, BudgetError> {
    let keys = Keys::new(&cfg.prefix);
    let limit = request_timeout(cfg);
    let client = connect(cfg, ep).await?;
    let mut kv = client.kv_client();
    let mut view = ClusterView {
        endpoint: ep.to_owned(),
        ..ClusterView::default()
    };
    let levels = deadline(
        "read levels",
        limit,
        kv.get(keys.level_prefix(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    for e in levels.kvs() {
        if let Some(k) = keys.parse_level(e.key()) {
            view.budgets.entry(k).or_default().published = Published::decode(e.value());
        }
    }
    // Keys only: a node count per budget without moving every demand value.
    let demands = deadline(
        "read demands",
        limit,
        kv.get(
            keys.demand_prefix(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ),
    )
    .await?;
    for e in demands.kvs() {
        if let Some((k, n)) = keys.parse_demand(e.key()) {
            let b = view.budgets.entry(k.clone()).or_default();
            b.reporting += 1;
            if n == node {
                let v = deadline("read demand", limit, kv.get(keys.demand(&k, node), None)).await?;
                b.node_demand = v.kvs().first().and_then(|kv| decode_demand(kv.value()));
            }
        }
    }
    let mut election = client.election_client();
    // No leader is an error answer of the election API, not a failure to read.
    if let Ok(Ok(l)) = tokio::time::timeout(limit, election.leader(keys.election())).await {
        view.leader = l
            .kv()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok())
            .map(str::to_owned);
    }
    Ok(view)
}
