//! What the budget keeps in etcd, under `<etcd_prefix>/budget/v1/`:
//!
//! | key | value | written by | lives |
//! |---|---|---|---|
//! | `demand/<budget id>/<node>` | the node's demand, bit/s, decimal | each node, on change | the node's lease |
//! | `level/<budget id>` | [`Published`] as JSON (~150 bytes) | the leader, when demands changed | until the budget is removed |
//! | `leader/<lease id>` | the candidate's node name | etcd's election API | the candidate's lease |
//!
//! Nodes watch `level/` only; the leader watches `demand/`.

use serde::{Deserialize, Serialize};

use crate::config::BudgetKey;

/// Key layout under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    root: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            root: format!("{prefix}/budget/v1/"),
        }
    }

    pub fn demand_prefix(&self) -> String {
        format!("{}demand/", self.root)
    }

    /// Every node's demand for one budget.
    pub fn demand_budget_prefix(&self, key: &BudgetKey) -> String {
        format!("{}demand/{}/", self.root, key.id())
    }

    pub fn demand(&self, key: &BudgetKey, node: &str) -> String {
        format!("{}demand/{}/{node}", self.root, key.id())
    }

    pub fn level_prefix(&self) -> String {
        format!("{}level/", self.root)
    }

    pub fn level(&self, key: &BudgetKey) -> String {
        format!("{}level/{}", self.root, key.id())
    }

    /// The election's name (etcd appends `/<lease id>` per candidate).
    pub fn election(&self) -> String {
        format!("{}leader", self.root)
    }

    /// `(budget, node)` of a demand key.
    pub fn parse_demand(&self, key: &[u8]) -> Option<(BudgetKey, String)> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(&self.demand_prefix())?;
        let (id, node) = rest.split_once('/')?;
        (!node.is_empty()).then(|| Some((BudgetKey::from_id(id)?, node.to_owned())))?
    }

    /// The budget of a level key.
    pub fn parse_level(&self, key: &[u8]) -> Option<BudgetKey> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(&self.level_prefix())?;
        BudgetKey::from_id(rest)
    }
}

/// A node name as a key segment: the Kubernetes node name (a DNS subdomain) or a host name.
pub fn valid_node_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// This node's name in the budget: `flag` (a `--node-name`), else `NODE_NAME` (the DaemonSet
/// sets it from `spec.nodeName`), else the host name.
pub fn node_name(flag: Option<String>) -> String {
    flag.or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_default()
}

pub fn encode_demand(bps: u64) -> String {
    bps.to_string()
}

pub fn decode_demand(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

/// The one value per budget that nodes watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// Water level, bit/s: a node's share is min(its demand, level).
    pub level: u64,
    /// The etcd revision up to which the leader had seen every demand.
    pub rev: i64,
    /// Nodes counted (the static split's divisor).
    pub nodes: u32,
    /// The budget as the leader has it configured, bit/s.
    pub budget: u64,
    pub total_demand: u64,
    pub total_share: u64,
    /// The leader's node name.
    pub leader: String,
}

impl Published {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain struct serialises")
    }

    pub fn decode(v: &[u8]) -> Option<Self> {
        serde_json::from_slice(v).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Direction;

    #[test]
    fn keys_parse_back() {
        let k = Keys::new("/aliasnet");
        let b = BudgetKey::new(Some("research"), "mirrors", Direction::Ingress);
        let d = k.demand(&b, "node-1.example");
        assert_eq!(
            d,
            "/aliasnet/budget/v1/demand/research.mirrors.ingress/node-1.example"
        );
        assert_eq!(
            k.parse_demand(d.as_bytes()),
            Some((b.clone(), "node-1.example".into()))
        );
        assert_eq!(k.parse_level(k.level(&b).as_bytes()), Some(b.clone()));
        assert!(d.starts_with(&k.demand_budget_prefix(&b)));
        assert_eq!(
            k.parse_demand(b"/aliasnet/budget/v1/demand/x.ingress/"),
            None
        );
        assert_eq!(k.parse_demand(b"/other/budget/v1/demand/x.ingress/n"), None);
        let p = Published {
            level: 1,
            rev: 2,
            nodes: 3,
            budget: 4,
            total_demand: 5,
            total_share: 6,
            leader: "n".into(),
        };
        assert_eq!(Published::decode(&p.encode()), Some(p));
        assert_eq!(decode_demand(encode_demand(42).as_bytes()), Some(42));
        assert!(valid_node_name("ip-10-0-0-1.ec2.internal"));
        assert!(!valid_node_name("a/b"));
    }
}
