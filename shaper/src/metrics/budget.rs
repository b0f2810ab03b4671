//! The cluster budget's families, from the engine's [`Status`]. Per budget (labels
//! `namespace` — empty for a cluster-wide budget — `class`, `direction`):
//!
//! | name | type | what |
//! |---|---|---|
//! | `aliasnet_budget_limit_bytes_per_second` | gauge | the configured cluster budget |
//! | `aliasnet_budget_demand_bytes_per_second` | gauge | this node's demand estimate |
//! | `aliasnet_budget_share_bytes_per_second` | gauge | this node's share (its limit for the budget) |
//! | `aliasnet_budget_use_bytes_per_second` | gauge | this node's measured throughput, last period |
//! | `aliasnet_budget_mode` | gauge | 1 for how the share is derived (`mode` = level, joining, holding, static), 0 for the others |
//! | `aliasnet_budget_cluster_demand_bytes_per_second` | gauge | leader only: Σ demands |
//! | `aliasnet_budget_cluster_share_bytes_per_second` | gauge | leader only: Σ shares |
//! | `aliasnet_budget_cluster_level_bytes_per_second` | gauge | leader only: the water level |
//! | `aliasnet_budget_cluster_nodes` | gauge | leader only: nodes reporting |
//!
//! Per node: `aliasnet_budget_leader`, `aliasnet_budget_etcd_connected` (0/1),
//! `aliasnet_budget_computation_seconds` (leader: last computation of all levels),
//! `aliasnet_budget_sessions_total`, `aliasnet_budget_elections_total`.

use std::fmt;

use aliasnet_budget::{Mode, Status};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
};

const MODES: [Mode; 4] = [Mode::Level, Mode::Joining, Mode::Holding, Mode::Static];

/// The budget families of one scrape.
#[derive(Debug)]
pub struct BudgetFamilies(pub Status);

fn bytes(bps: u64) -> ConstGauge {
    // Bytes, as every rate the exporter serves; gauges are i64 in prometheus-client.
    ConstGauge::new(i64::try_from(bps / 8).unwrap_or(i64::MAX))
}

impl BudgetFamilies {
    fn per_budget(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        value: impl Fn(&aliasnet_budget::BudgetStatus) -> Option<u64>,
    ) -> Result<(), fmt::Error> {
        let rows: Vec<_> = self
            .0
            .budgets
            .iter()
            .filter_map(|b| Some((b, value(b)?)))
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (b, v) in rows {
            let k = &b.key;
            let labels = [
                ("namespace", k.namespace.as_deref().unwrap_or("")),
                ("class", k.class.as_str()),
                ("direction", k.direction.as_str()),
            ];
            bytes(v).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl Collector for BudgetFamilies {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = &self.0;
        self.per_budget(
            &mut enc,
            "aliasnet_budget_limit_bytes_per_second",
            "Configured cluster-wide budget: all nodes' pods together, for this class and direction (and namespace).",
            |b| Some(b.budget),
        )?;
        self.per_budget(
            &mut enc,
            "aliasnet_budget_demand_bytes_per_second",
            "This node's demand for the budget: its measured use plus headroom, or its ceiling while its share holds it back.",
            |b| Some(b.demand),
        )?;
        self.per_budget(
            &mut enc,
            "aliasnet_budget_share_bytes_per_second",
            "This node's share of the budget, applied as its limit for the class and direction.",
            |b| Some(b.share),
        )?;
        self.per_budget(
            &mut enc,
            "aliasnet_budget_use_bytes_per_second",
            "This node's measured throughput for the budget over the last share period.",
            |b| Some(b.use_bps),
        )?;
        if !s.budgets.is_empty() {
            let mut m = enc.encode_descriptor(
                "aliasnet_budget_mode",
                "How the node's share is derived (value 1 for the current mode): level (from the leader's water level), joining (not yet counted: budget / (nodes + 1)), holding (etcd unreachable: last share, until the lease would expire), static (budget / nodes last seen).",
                None,
                MetricType::Gauge,
            )?;
            for b in &s.budgets {
                let k = &b.key;
                for mode in MODES {
                    let labels = [
                        ("namespace", k.namespace.as_deref().unwrap_or("")),
                        ("class", k.class.as_str()),
                        ("direction", k.direction.as_str()),
                        ("mode", mode.as_str()),
                    ];
                    ConstGauge::new(i64::from(b.mode == mode)).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        for (name, help, f) in [
            (
                "aliasnet_budget_cluster_demand_bytes_per_second",
                "Leader only: the sum of every node's demand for the budget.",
                (|c: &aliasnet_budget::water::Allocation| c.total_demand) as fn(&_) -> u64,
            ),
            (
                "aliasnet_budget_cluster_share_bytes_per_second",
                "Leader only: the sum of every node's share (at most the budget).",
                |c| c.total_share,
            ),
            (
                "aliasnet_budget_cluster_level_bytes_per_second",
                "Leader only: the water level; a node's share is min(its demand, level).",
                |c| c.level,
            ),
        ] {
            self.per_budget(&mut enc, name, help, |b| b.cluster.as_ref().map(f))?;
        }
        if s.budgets.iter().any(|b| b.cluster.is_some()) {
            let mut m = enc.encode_descriptor(
                "aliasnet_budget_cluster_nodes",
                "Leader only: nodes reporting a demand for the budget.",
                None,
                MetricType::Gauge,
            )?;
            for b in s.budgets.iter().filter(|b| b.cluster.is_some()) {
                let k = &b.key;
                let labels = [
                    ("namespace", k.namespace.as_deref().unwrap_or("")),
                    ("class", k.class.as_str()),
                    ("direction", k.direction.as_str()),
                ];
                let n = b.cluster.map_or(0, |c| c.nodes);
                ConstGauge::new(i64::from(n)).encode(m.encode_family(&labels)?)?;
            }
        }
        for (name, help, v) in [
            (
                "aliasnet_budget_leader",
                "1 while this node is the elected leader that computes the budgets' levels.",
                s.leader,
            ),
            (
                "aliasnet_budget_etcd_connected",
                "1 while this node's session to etcd is up.",
                s.connected,
            ),
        ] {
            let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::from(v)).encode(m)?;
        }
        let m = enc.encode_descriptor(
            "aliasnet_budget_computation_seconds",
            "Leader: time of its last computation of the levels of every budget with changed demands.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(s.compute_time.as_secs_f64()).encode(m)?;
        for (name, help, v) in [
            (
                "aliasnet_budget_sessions",
                "Sessions to etcd this daemon established (a reconnection after a member failure adds one).",
                s.sessions,
            ),
            (
                "aliasnet_budget_elections",
                "Leader elections this daemon won.",
                s.elections_won,
            ),
        ] {
            let m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(v).encode(m)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use aliasnet_budget::{BudgetKey, BudgetStatus, Direction};
    use prometheus_client::registry::Registry;

    use super::*;

    fn render(s: Status) -> String {
        let mut r = Registry::default();
        r.register_collector(Box::new(BudgetFamilies(s)));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &r).unwrap();
        out
    }

    #[test]
    fn budget_series() {
        let b = |ns: Option<&str>, cluster| BudgetStatus {
            key: BudgetKey::new(ns, "mirrors", Direction::Ingress),
            budget: 120_000_000,
            demand: 40_000_000,
            reported: Some(40_000_000),
            share: 24_000_000,
            mode: Mode::Level,
            use_bps: 23_000_000,
            published: None,
            cluster,
        };
        let text = render(Status {
            node: "n1".into(),
            connected: true,
            leader: true,
            budgets: vec![
                b(
                    None,
                    Some(aliasnet_budget::water::Allocation {
                        level: 24_000_000,
                        total_demand: 200_000_000,
                        total_share: 120_000_000,
                        nodes: 5,
                    }),
                ),
                b(Some("research"), None),
            ],
            ..Status::default()
        });
        for line in [
            "aliasnet_budget_share_bytes_per_second{namespace=\"\",class=\"mirrors\",direction=\"ingress\"} 3000000",
            "aliasnet_budget_share_bytes_per_second{namespace=\"research\",class=\"mirrors\",direction=\"ingress\"} 3000000",
            "aliasnet_budget_mode{namespace=\"\",class=\"mirrors\",direction=\"ingress\",mode=\"level\"} 1",
            "aliasnet_budget_mode{namespace=\"\",class=\"mirrors\",direction=\"ingress\",mode=\"static\"} 0",
            "aliasnet_budget_cluster_level_bytes_per_second{namespace=\"\",class=\"mirrors\",direction=\"ingress\"} 3000000",
            "aliasnet_budget_cluster_nodes{namespace=\"\",class=\"mirrors\",direction=\"ingress\"} 5",
            "aliasnet_budget_leader 1",
            "aliasnet_budget_etcd_connected 1",
            "aliasnet_budget_elections_total 0",
        ] {
            assert!(text.contains(line), "missing {line}:\n{text}");
        }
        super::super::promtool_check(&text);
        // The cluster view is the leader's alone.
        assert!(!text.contains("cluster_level_bytes_per_second{namespace=\"research\""));
        // Without budgets: only the per-node series.
        let text = render(Status::default());
        assert!(!text.contains("aliasnet_budget_share"));
        assert!(text.contains("aliasnet_budget_leader 0"));
    }
}
