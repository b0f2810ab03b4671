//! A node's share of one budget, from the leader's published level and the node's own
//! reports, and what the node does when it cannot hear from etcd.
//!
//! The leader computes the level from the demands it has seen up to an etcd revision `R`
//! and publishes both. A node takes `min(d, level)` with `d` its demand **as of `R`** (the
//! last value it wrote at or before `R`), not its current one: then the shares of all nodes
//! are exactly the ones the leader summed, and their total stays within the budget. A node
//! that raised its demand after `R` waits one period for the leader to count it.
//!
//! A node the leader has not counted yet (it joined, or came back with a new lease after `R`)
//! takes the static share `budget ÷ (nodes + 1)`: during churn the total exceeds the budget by
//! at most the static shares of the nodes that joined within the last period.
//!
//! Without etcd (its lease keep-alives fail) a node holds its last share until its lease would
//! have expired on the server, that is as long as the leader may still count it; then it
//! falls back to `budget ÷ nodes` with the node count of the last published value, so that
//! if every node falls back the total is the budget. Never unlimited.

use std::time::Duration;

use aliasnet_ebpf::limits::MIN_RATE;
use tokio::time::Instant;

use crate::wire::Published;

/// The static split: `budget ÷ nodes`, at least the smallest rate the datapath enforces.
pub fn static_share(budget: u64, nodes: u32) -> u64 {
    (budget / u64::from(nodes.max(1))).max(MIN_RATE)
}

/// How the current share was derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// min(demand as of the published revision, level).
    Level,
    /// Not counted by the leader yet: budget ÷ (nodes + 1), at most the demand.
    Joining,
    /// etcd unreachable: the last share, until the lease would have expired.
    Holding,
    /// etcd unreachable for longer than the lease: budget ÷ nodes last seen.
    Static,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Level => "level",
            Mode::Joining => "joining",
            Mode::Holding => "holding",
            Mode::Static => "static",
        }
    }
}

/// What the node knows about one budget.
#[derive(Debug, Clone, Default)]
pub struct ShareState {
    /// Demands this node wrote under its current lease: (etcd revision, bit/s), ascending.
    history: Vec<(i64, u64)>,
    /// The leader's last published value for this budget.
    pub published: Option<Published>,
    /// Nodes reporting this budget, counted by the node itself before any value was published.
    pub counted: Option<u32>,
    /// The share last derived, and how.
    pub share: Option<(u64, Mode)>,
}

/// The node's contact with etcd.
#[derive(Debug, Clone, Copy)]
pub struct Contact {
    /// Whether the session (lease keep-alive, watch) is up.
    pub connected: bool,
    /// Last time the server confirmed the lease, and the lease's TTL: the server keeps the
    /// node's keys until `last_ok + ttl` at least.
    pub last_ok: Option<Instant>,
    pub ttl: Duration,
}

impl ShareState {
    /// Records a demand written at `revision`.
    pub fn wrote(&mut self, revision: i64, demand: u64) {
        self.history.push((revision, demand));
    }

    /// Forgets the demands written under a lease that is gone (its keys went with it).
    pub fn lease_lost(&mut self) {
        self.history.clear();
    }

    /// The demand the leader counted for this node at `rev`.
    fn demand_at(&self, rev: i64) -> Option<u64> {
        self.history
            .iter()
            .rev()
            .find(|(r, _)| *r <= rev)
            .map(|(_, d)| *d)
    }

    /// Keeps only what a later published revision can still refer to.
    fn prune(&mut self, rev: i64) {
        if let Some(i) = self.history.iter().rposition(|(r, _)| *r <= rev) {
            self.history.drain(..i);
        }
    }

    /// The node count of the static split: the last published one, else the node's own
    /// count, else `fallback`.
    pub fn nodes(&self, fallback: u32) -> u32 {
        self.published
            .as_ref()
            .map(|p| p.nodes)
            .or(self.counted)
            .unwrap_or(fallback)
            .max(1)
    }

    /// Derives the share (bit/s, at least 1 kbit/s) now; `budget` is this node's configured
    /// rate, `demand` its current demand.
    pub fn derive(
        &mut self,
        now: Instant,
        contact: Contact,
        budget: u64,
        demand: u64,
        fallback_nodes: u32,
    ) -> (u64, Mode) {
        let (share, mode) = if contact.connected {
            self.connected_share(budget, demand, fallback_nodes)
        } else {
            let alive = contact.last_ok.is_some_and(|t| now < t + contact.ttl);
            match self.share {
                Some((s, _)) if alive => (s, Mode::Holding),
                _ => (
                    static_share(budget, self.nodes(fallback_nodes)),
                    Mode::Static,
                ),
            }
        };
        let share = share.max(MIN_RATE);
        self.share = Some((share, mode));
        (share, mode)
    }

    fn connected_share(&mut self, budget: u64, demand: u64, fallback: u32) -> (u64, Mode) {
        if let Some(p) = self.published.clone() {
            // A leader that still runs an older budget rate: its level cannot be more than
            // this node's budget allows.
            if let Some(d) = self.demand_at(p.rev) {
                self.prune(p.rev);
                return (d.min(p.level).min(budget), Mode::Level);
            }
            let joining = budget / (u64::from(p.nodes) + 1);
            return (demand.min(joining), Mode::Joining);
        }
        let n = self.counted.unwrap_or(fallback);
        (demand.min(budget / (u64::from(n) + 1)), Mode::Joining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(level: u64, rev: i64, nodes: u32) -> Published {
        Published {
            level,
            rev,
            nodes,
            budget: 120,
            total_demand: 0,
            total_share: 0,
            leader: "n1".into(),
        }
    }

    fn up() -> Contact {
        Contact {
            connected: true,
            last_ok: Some(Instant::now()),
            ttl: Duration::from_secs(10),
        }
    }

    #[test]
    fn share_uses_the_demand_the_leader_counted() {
        let mut s = ShareState::default();
        let now = Instant::now();
        // Not counted yet: the static share of a joining node (budget ÷ (nodes + 1)), at
        // most the demand; 1 kbit/s at least.
        s.counted = Some(3);
        assert_eq!(
            s.derive(now, up(), 120_000, 1_000_000, 100),
            (30_000, Mode::Joining)
        );
        s.wrote(10, 50_000);
        s.published = Some(published(40_000, 9, 5));
        assert_eq!(
            s.derive(now, up(), 120_000, 50_000, 100),
            (20_000, Mode::Joining)
        );
        // Counted at revision 10: min(demand then, level).
        s.published = Some(published(40_000, 12, 5));
        assert_eq!(
            s.derive(now, up(), 120_000, 50_000, 100),
            (40_000, Mode::Level)
        );
        // A demand raised after the published revision waits for the next computation.
        s.wrote(13, 90_000);
        s.wrote(14, 95_000);
        s.published = Some(published(30_000, 13, 5));
        assert_eq!(
            s.derive(now, up(), 120_000, 95_000, 100),
            (30_000, Mode::Level)
        );
        s.published = Some(published(100_000, 13, 5));
        assert_eq!(
            s.derive(now, up(), 120_000, 95_000, 100),
            (90_000, Mode::Level)
        );
        // A level above this node's own budget rate is capped by it.
        s.published = Some(published(100_000, 20, 5));
        assert_eq!(
            s.derive(now, up(), 60_000, 95_000, 100),
            (60_000, Mode::Level)
        );
        // After the lease is lost the node is new to the leader again.
        s.lease_lost();
        assert_eq!(
            s.derive(now, up(), 120_000, 95_000, 100),
            (20_000, Mode::Joining)
        );
    }

    #[test]
    fn without_etcd_hold_then_static_never_unlimited() {
        let mut s = ShareState::default();
        let t0 = Instant::now();
        s.wrote(5, 80_000);
        s.published = Some(published(50_000, 5, 4));
        assert_eq!(s.derive(t0, up(), 120_000, 80_000, 100).0, 50_000);
        let down = Contact {
            connected: false,
            last_ok: Some(t0),
            ttl: Duration::from_secs(10),
        };
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(
            s.derive(at(9), down, 120_000, 80_000, 100),
            (50_000, Mode::Holding)
        );
        assert_eq!(
            s.derive(at(10), down, 120_000, 80_000, 100),
            (30_000, Mode::Static)
        );
        assert_eq!(
            s.derive(at(500), down, 120_000, 80_000, 100),
            (30_000, Mode::Static)
        );
        // A node that never reached etcd splits by the configured fallback node count.
        let mut fresh = ShareState::default();
        let never = Contact {
            connected: false,
            last_ok: None,
            ttl: Duration::from_secs(10),
        };
        assert_eq!(
            fresh.derive(t0, never, 120_000, 1, 100),
            (1_200, Mode::Static)
        );
        // The floor.
        assert_eq!(fresh.derive(t0, never, 120_000, 1, 1_000).0, MIN_RATE);
    }
}
