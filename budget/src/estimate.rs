//! A node's demand for one budget: what its pods would use unshaped.
//!
//! Measured throughput is a lower bound of that: traffic held back by the node's share is not
//! seen. So a node whose share is the bottleneck asks for its ceiling: the most it could use
//! (its own node-level limit for the class, else the whole budget). Max-min fairness then
//! gives it the water level, and the next period's measurement says whether it used it. A
//! node that is not held back asks for its measured use plus [`HEADROOM`], so that ordinary
//! variation does not make it look held back. A node whose pods stop frees its share after one
//! period.
//!
//! The share is the bottleneck when the node uses at least [`BOTTLENECK`] of it. Below that,
//! a congested queue (drops, overlimits, a backlog) is ambiguous: TCP that a tight share
//! holds back may not fill it (losses, timeouts: it can sit at 80 % of its share, which 20 %
//! headroom would shrink a little every period), while a pod that reads at 10 Mbit/s in
//! 128 KiB blocks queues at every burst under a share of 12 Mbit/s it does not need more of.
//! So a congested node using at least [`PROBE_USE`] of its share **probes**: it asks for its
//! ceiling, and if the next period gives it [`PROBE_GAIN`] more share but its use did not grow
//! by as much while its queue still delays traffic, the probe is refuted: the node asks for its
//! use plus headroom and does not probe again near that use for [`PROBE_BACKOFF`] periods
//! (doubling with each refuted probe). A probe that found no queue and no more use proves
//! nothing (TCP waiting out a loss sends nothing at any share).

use tokio::time::Instant;

/// Use / share at or above which the share counts as the bottleneck.
pub const BOTTLENECK: f64 = 0.95;
/// Use / share at or above which a congested queue makes the node probe.
pub const PROBE_USE: f64 = 0.75;
/// How much more share a probe must get, and its use grow by, to count.
pub const PROBE_GAIN: f64 = 1.2;
/// Periods without probing after the first refuted probe, and at most.
pub const PROBE_BACKOFF: (u32, u32) = (8, 128);
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
    /// packets since the last reading.
    pub congested: bool,
    /// The node's own limit for this class and direction (bit/s), if any: its demand never
    /// exceeds it.
    pub ceiling: Option<u64>,
}

/// A probe under way: the use and share of the period that started it.
#[derive(Debug, Clone, Copy)]
struct Probe {
    rate: u64,
    share: u64,
}

/// A refuted probe: at this use more share went unused; `left` periods without probing.
#[derive(Debug, Clone, Copy)]
struct Refuted {
    rate: u64,
    left: u32,
    backoff: u32,
}

/// Demand estimate of one budget on one node.
#[derive(Debug, Clone, Default)]
pub struct Estimator {
    last: Option<(Instant, u64)>,
    /// Throughput of the last period, bit/s.
    pub rate: u64,
    probe: Option<Probe>,
    refuted: Option<Refuted>,
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
            Some(c) => self.held_back(rate, c, u.congested),
            None => u.congested,
        };
        let demand = if held_back {
            ceiling
        } else {
            (rate as f64 * HEADROOM) as u64
        };
        demand.clamp(floor.min(ceiling), ceiling)
    }

    /// Whether the share `c` held back a node that used `rate` of it (see the module docs).
    fn held_back(&mut self, rate: u64, c: u64, congested: bool) -> bool {
        let used = rate as f64 / c.max(1) as f64;
        if let Some(p) = self.probe.take() {
            let got_more = c as f64 >= p.share as f64 * PROBE_GAIN;
            let used_more = rate as f64 >= p.rate as f64 * PROBE_GAIN;
            // Still queueing with more share and no more use: bursts, not demand. (No queue
            // and no more use is a TCP stalled by a loss: no conclusion.)
            if got_more && !used_more && congested && used < BOTTLENECK {
                let backoff = self
                    .refuted
                    .map_or(PROBE_BACKOFF.0, |r| (r.backoff * 2).min(PROBE_BACKOFF.1));
                self.refuted = Some(Refuted {
                    rate: p.rate.max(rate),
                    left: backoff,
                    backoff,
                });
                return false;
            }
        }
        if used >= BOTTLENECK {
            self.refuted = None;
            return true;
        }
        if !congested || used < PROBE_USE {
            return false;
        }
        if let Some(r) = &mut self.refuted {
            // The same use as the refuted probe's (more or much less is another situation).
            let near =
                (r.rate as f64 / PROBE_GAIN..r.rate as f64 * PROBE_GAIN).contains(&(rate as f64));
            if r.left > 0 && near {
                r.left -= 1;
                return false;
            }
        }
        self.probe = Some(Probe { rate, share: c });
        true
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
        // A congested queue under 75 % of the share: not held back.
        let b = b + 2_500_000;
        assert_eq!(
            e.update(s(3), usage(b, true), Some(50_000_000), 800_000_000, 1_000),
            24_000_000
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

    /// One period at `rate` bit/s under `share`, congested or not: the demand.
    fn period(
        e: &mut Estimator,
        t: &mut (Instant, u64),
        rate: u64,
        share: u64,
        congested: bool,
    ) -> u64 {
        t.0 += Duration::from_secs(1);
        t.1 += rate / 8;
        e.update(
            t.0,
            usage(t.1, congested),
            Some(share),
            120_000_000,
            1_000_000,
        )
    }

    #[test]
    fn a_congested_node_probes_and_a_refuted_probe_backs_off() {
        const C: u64 = 120_000_000;
        let mut e = Estimator::default();
        let mut t = (Instant::now(), 0);
        e.update(t.0, usage(0, false), None, C, 1_000_000);
        // TCP at 80 % of the idle floor with a congested queue: it probes, gets 20M, fills it.
        assert_eq!(period(&mut e, &mut t, 800_000, 1_000_000, true), C);
        assert_eq!(period(&mut e, &mut t, 19_500_000, 20_000_000, true), C);
        // A pod that reads 10M in bursts: at a 20M share it is not held back.
        assert_eq!(
            period(&mut e, &mut t, 10_000_000, 20_000_000, true),
            12_000_000
        );
        // At 12M its bursts queue: it probes once, gets 24M and still uses 10M: refuted.
        assert_eq!(period(&mut e, &mut t, 10_000_000, 12_000_000, true), C);
        assert_eq!(
            period(&mut e, &mut t, 10_000_000, 24_000_000, true),
            12_000_000
        );
        for _ in 0..PROBE_BACKOFF.0 {
            assert_eq!(
                period(&mut e, &mut t, 10_000_000, 12_000_000, true),
                12_000_000
            );
        }
        // Then it probes again; refuted again, it waits twice as long.
        assert_eq!(period(&mut e, &mut t, 10_000_000, 12_000_000, true), C);
        assert_eq!(
            period(&mut e, &mut t, 10_000_000, 24_000_000, true),
            12_000_000
        );
        for _ in 0..2 * PROBE_BACKOFF.0 - 1 {
            assert_eq!(
                period(&mut e, &mut t, 10_000_000, 12_000_000, true),
                12_000_000
            );
        }
        // Its pod wants more now: the use grew past the refuted one, it probes at once.
        assert_eq!(period(&mut e, &mut t, 12_500_000, 14_000_000, true), C);
        // A probe that gets no more share (the level is no higher) proves nothing.
        assert_eq!(period(&mut e, &mut t, 12_500_000, 14_000_000, true), C);
        // Nor does one whose TCP sent nothing more and queued nothing (waiting out a loss);
        // when it sends again at its small share, it probes again.
        assert_eq!(
            period(&mut e, &mut t, 1_000_000, 30_000_000, false),
            1_200_000
        );
        assert_eq!(period(&mut e, &mut t, 1_000_000, 1_200_000, true), C);
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
