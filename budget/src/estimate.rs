//! A node's demand for one budget: what its pods would use unshaped.
//!
//! Measured throughput is a lower bound of that: traffic held back by the node's share is not
//! seen. So a node whose share is the bottleneck (it uses at least [`BOTTLENECK`] of it, or at
//! least [`CONGESTED_USE`] of it while the shaping queue reports drops, overlimits or a
//! backlog) asks for its ceiling: the most it could use (its own node-level limit for the
//! class, else the whole budget). A queue that delays traffic while the node uses less than
//! that is bursty traffic under a share that is large enough, not a share that is too small:
//! a steady flow sits at 1 / [`HEADROOM`] (83 %) of its share, and a burst of a pod that reads
//! at 10 Mbit/s in 128 KiB blocks waits in the queue every time. Max-min
//! fairness then gives it the water level, and the next period's measurement says whether
//! it used it. A node that is not held back asks for its measured use plus [`HEADROOM`], so
//! that ordinary variation does not make it look held back. A node whose pods stop frees its
//! share after one period.

use tokio::time::Instant;

/// Use / share at or above which the share counts as the bottleneck.
pub const BOTTLENECK: f64 = 0.95;
/// Use / share at or above which a congested queue means the share is the bottleneck.
pub const CONGESTED_USE: f64 = 0.9;
/// Demand of a node that is not held back, over its use.
pub const HEADROOM: f64 = 1.2;
/// A demand change smaller than this fraction is not reported (fewer etcd writes).
pub const REPORT_HYSTERESIS: f64 = 0.1;

/// One reading of what a node's pods sent or received for a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes so far: a counter that only grows while the node runs (a drop is read as a
    /// restart of the counter).
    pub bytes: u64,
    /// The node's shaping queue for this budget dropped, delayed (overlimits) or queued
    /// packets since the last reading: the limit is what holds the traffic back.
    pub congested: bool,
    /// The node's own limit for this class and direction (bit/s), if any: its demand never
    /// exceeds it.
    pub ceiling: Option<u64>,
}

/// Demand estimate of one budget on one node.
#[derive(Debug, Clone, Default)]
pub struct Estimator {
    last: Option<(Instant, u64)>,
    /// Throughput of the last period, bit/s.
    pub rate: u64,
}

impl Estimator {
    /// Takes a reading and returns the demand (bit/s) given the limit that applied during
    /// the period (`cap`: the share as applied, `None` if none did), the node's ceiling and the
    /// demand floor (an idle node's demand: enough to start without waiting a period).
    pub fn update(
        &mut self,
        now: Instant,
        u: Usage,
        cap: Option<u64>,
        ceiling: u64,
        floor: u64,
    ) -> u64 {
        let rate = match self.last {
            Some((t, b)) if now > t => {
                let secs = (now - t).as_secs_f64();
                (u.bytes.saturating_sub(b) as f64 * 8.0 / secs) as u64
            }
            Some(_) => self.rate,
            // Nothing measured yet (a start, or a restart under load): ask for the ceiling, so
            // that the node starts from the static share rather than from the idle floor; one
            // period later the measurement corrects it.
            None => {
                self.last = Some((now, u.bytes));
                return ceiling;
            }
        };
        self.last = Some((now, u.bytes));
        self.rate = rate;
        let held_back = match cap {
            Some(c) => {
                let used = rate as f64 / c as f64;
                used >= BOTTLENECK || (u.congested && used >= CONGESTED_USE)
            }
            None => u.congested,
        };
        let demand = if held_back {
            ceiling
        } else {
            (rate as f64 * HEADROOM) as u64
        };
        demand.clamp(floor.min(ceiling), ceiling)
    }
}

/// Whether a demand change is worth an etcd write: reaching or leaving the ceiling always
/// is (that is the probe), otherwise a change of more than [`REPORT_HYSTERESIS`].
pub fn worth_reporting(old: Option<u64>, new: u64, ceiling: u64) -> bool {
    match old {
        None => true,
        Some(o) if o == new => false,
        Some(o) if o == ceiling || new == ceiling => true,
        Some(o) => o.abs_diff(new) as f64 > REPORT_HYSTERESIS * o.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn usage(bytes: u64, congested: bool) -> Usage {
        Usage {
            bytes,
            congested,
            ceiling: None,
        }
    }

    #[test]
    fn demand_follows_use_with_headroom_and_probes_when_held_back() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut e = Estimator::default();
        // First reading: nothing measured yet, the ceiling.
        assert_eq!(
            e.update(t0, usage(0, false), Some(50_000_000), 1_000_000_000, 1_000),
            1_000_000_000
        );
        // 10 Mbit/s under a 50M share: demand 12M.
        assert_eq!(
            e.update(
                s(1),
                usage(1_250_000, false),
                Some(50_000_000),
                1_000_000_000,
                1_000
            ),
            12_000_000
        );
        // 48 Mbit/s of a 50M share: held back, asks for the ceiling.
        let b = 1_250_000 + 6_000_000;
        assert_eq!(
            e.update(
                s(2),
                usage(b, false),
                Some(50_000_000),
                1_000_000_000,
                1_000
            ),
            1_000_000_000
        );
        // A congested queue at 92 % of the share: held back.
        let b = b + 5_750_000;
        assert_eq!(
            e.update(s(3), usage(b, true), Some(50_000_000), 800_000_000, 1_000),
            800_000_000
        );
        // A congested queue at 83 % of the share: bursts of a flow the share does not hold
        // back; the demand stays the use plus headroom.
        let b = b + 1_250_000;
        assert_eq!(
            e.update(s(4), usage(b, true), Some(12_000_000), 800_000_000, 1_000),
            12_000_000
        );
        let s = |n: u64| s(n + 1);
        // Idle: the floor, at once.
        let idle = |e: &mut Estimator, t| {
            e.update(t, usage(b, false), Some(50_000_000), 1_000_000_000, 1_000)
        };
        assert_eq!(idle(&mut e, s(4)), 1_000);
        // A counter that went backwards (reset) reads as no traffic, not as a huge rate.
        assert_eq!(
            e.update(s(6), usage(10, false), None, 1_000_000_000, 1_000),
            1_000
        );
    }

    #[test]
    fn reporting_hysteresis() {
        assert!(worth_reporting(None, 5, 100));
        assert!(!worth_reporting(Some(50), 50, 100));
        assert!(!worth_reporting(Some(50), 54, 100));
        assert!(worth_reporting(Some(50), 56, 100));
        assert!(worth_reporting(Some(50), 44, 100));
        assert!(worth_reporting(Some(95), 100, 100));
        assert!(worth_reporting(Some(100), 96, 100));
    }
}
