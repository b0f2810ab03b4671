//! `aliasnetctl budget`: the cluster's budgets as etcd has them (the leader's published level,
//! totals, reporting nodes) and this node's part (its demand in etcd; its share, use and mode
//! from aliasnet-shaperd's metrics).

use std::{collections::BTreeMap, path::Path};

use aliasnet_budget::{view::ClusterView, BudgetKey, BudgetPolicy};
use anyhow::{bail, Context};
use serde::Serialize;

use crate::{
    http,
    output::{print, print_json, rate, Table},
    Global,
};

/// This node's figures for one budget, from shaperd's `/metrics`.
#[derive(Debug, Default, Clone, Serialize)]
struct Local {
    share_bps: Option<u64>,
    use_bps: Option<u64>,
    demand_bps: Option<u64>,
    mode: Option<String>,
}

#[derive(Debug, Serialize)]
struct Row {
    budget: String,
    namespace: Option<String>,
    class: String,
    direction: String,
    limit_bps: u64,
    level_bps: Option<u64>,
    cluster_demand_bps: Option<u64>,
    cluster_share_bps: Option<u64>,
    nodes_counted: Option<u32>,
    nodes_reporting: u32,
    node_demand_in_etcd_bps: Option<u64>,
    node: Local,
}

#[derive(Debug, Serialize)]
struct Report {
    node: String,
    etcd_endpoint: String,
    leader: Option<String>,
    shaperd_reachable: bool,
    budgets: Vec<Row>,
}

fn key_labels(s: &http::Sample) -> Option<BudgetKey> {
    let ns = s.label("namespace").filter(|n| !n.is_empty());
    Some(BudgetKey::new(
        ns,
        s.label("class")?,
        s.label("direction")?.parse().ok()?,
    ))
}

/// Per budget: this node's share, use, demand (bit/s) and mode from shaperd's metrics.
fn local(text: &str) -> BTreeMap<BudgetKey, Local> {
    let mut out: BTreeMap<BudgetKey, Local> = BTreeMap::new();
    for (name, set) in [
        ("aliasnet_budget_share_bytes_per_second", 0),
        ("aliasnet_budget_use_bytes_per_second", 1),
        ("aliasnet_budget_demand_bytes_per_second", 2),
    ] {
        for s in http::samples(text, name) {
            let Some(k) = key_labels(&s) else { continue };
            let bps = Some((s.value * 8.0) as u64);
            let l = out.entry(k).or_default();
            match set {
                0 => l.share_bps = bps,
                1 => l.use_bps = bps,
                _ => l.demand_bps = bps,
            }
        }
    }
    for s in http::samples(text, "aliasnet_budget_mode").filter(|s| s.value == 1.0) {
        if let (Some(k), Some(m)) = (key_labels(&s), s.label("mode")) {
            out.entry(k).or_default().mode = Some(m.to_owned());
        }
    }
    out
}

pub fn run(g: &Global, config: &Path, node: &str) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(config)
        .with_context(|| format!("read the node policy {}", config.display()))?;
    let policy =
        BudgetPolicy::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
    let Some(cluster) = policy.cluster else {
        print(&format!(
            "no [cluster] in {}: no cluster budgets\n",
            config.display()
        ));
        return Ok(0);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let view: ClusterView = rt
        .block_on(aliasnet_budget::view::read(&cluster, node))
        .with_context(|| {
            format!(
                "read the budgets from etcd ({})",
                cluster.endpoints.join(", ")
            )
        })?;
    let metrics = http::get(&g.shaperd_metrics, "/metrics", g.timeout()).ok();
    let locals = metrics.as_deref().map(local).unwrap_or_default();
    let rows: Vec<Row> = policy
        .budgets
        .iter()
        .map(|b| {
            let v = view.budgets.get(&b.key).cloned().unwrap_or_default();
            let p = v.published.as_ref();
            Row {
                budget: b.key.id(),
                namespace: b.key.namespace.clone(),
                class: b.key.class.clone(),
                direction: b.key.direction.to_string(),
                limit_bps: b.rate,
                level_bps: p.map(|p| p.level),
                cluster_demand_bps: p.map(|p| p.total_demand),
                cluster_share_bps: p.map(|p| p.total_share),
                nodes_counted: p.map(|p| p.nodes),
                nodes_reporting: v.reporting,
                node_demand_in_etcd_bps: v.node_demand,
                node: locals.get(&b.key).cloned().unwrap_or_default(),
            }
        })
        .collect();
    let report = Report {
        node: node.to_owned(),
        etcd_endpoint: view.endpoint,
        leader: view.leader,
        shaperd_reachable: metrics.is_some(),
        budgets: rows,
    };
    if g.json {
        print_json(&report);
    } else {
        print(&render(&report));
    }
    if report.leader.is_none() {
        bail!("no leader elected: no node computes the budgets' levels (is aliasnet-shaperd running with [cluster] on any node?)");
    }
    Ok(0)
}

fn render(r: &Report) -> String {
    let mut out = format!(
        "leader: {}   etcd: {}   node: {}{}\n\n",
        r.leader.as_deref().unwrap_or("none"),
        r.etcd_endpoint,
        r.node,
        if r.shaperd_reachable {
            ""
        } else {
            "   (aliasnet-shaperd's metrics unreachable: this node's share unknown)"
        }
    );
    let mut t = Table::new(&[
        "BUDGET",
        "LIMIT>",
        "LEVEL>",
        "DEMAND>",
        "SHARES>",
        "NODES>",
        "NODE DEMAND>",
        "NODE SHARE>",
        "NODE USE>",
        "MODE",
    ]);
    for b in &r.budgets {
        t.row(vec![
            b.budget.clone(),
            rate(Some(b.limit_bps)),
            rate(b.level_bps),
            rate(b.cluster_demand_bps),
            rate(b.cluster_share_bps),
            b.nodes_counted
                .map_or_else(|| b.nodes_reporting.to_string(), |n| n.to_string()),
            rate(b.node.demand_bps.or(b.node_demand_in_etcd_bps)),
            rate(b.node.share_bps),
            rate(b.node.use_bps),
            b.node.mode.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_figures_from_metrics() {
        let text = "aliasnet_budget_share_bytes_per_second{namespace=\"\",class=\"mirrors\",direction=\"ingress\"} 2500000\n\
aliasnet_budget_use_bytes_per_second{namespace=\"\",class=\"mirrors\",direction=\"ingress\"} 2000000\n\
aliasnet_budget_mode{namespace=\"\",class=\"mirrors\",direction=\"ingress\",mode=\"level\"} 1\n\
aliasnet_budget_mode{namespace=\"\",class=\"mirrors\",direction=\"ingress\",mode=\"static\"} 0\n\
aliasnet_budget_share_bytes_per_second{namespace=\"research\",class=\"internet\",direction=\"egress\"} 125\n";
        let l = local(text);
        let m = &l[&BudgetKey::new(None, "mirrors", aliasnet_budget::Direction::Ingress)];
        assert_eq!(m.share_bps, Some(20_000_000));
        assert_eq!(m.use_bps, Some(16_000_000));
        assert_eq!(m.mode.as_deref(), Some("level"));
        let r = &l[&BudgetKey::new(
            Some("research"),
            "internet",
            aliasnet_budget::Direction::Egress,
        )];
        assert_eq!(r.share_bps, Some(1000));
    }
}
