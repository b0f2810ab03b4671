//! The rate matrix: every kind of limit at 1 Mbit/s-1 Gbit/s on nodes with 1500- and
//! 9000-byte MTUs, GRO on the node's veths. Kinds: a pod's total ingress and egress limits,
//! its internet-only upload limit and the node's upload cap; a pod's download limit from the
//! policy (`[internet] pod_ingress_rate`); a pod downloading from a named class and the rest
//! of the internet at once (the class at a quarter of the internet limit); four pods of one
//! namespace under the namespace's download limit beside a pod of another namespace under
//! its own; four pods of two namespaces under the node's download limit.
//!
//! Each cell is a 10 s TCP transfer per pod measured by its receiver: goodput 90-105 % of
//! the limit over the whole run (the first second included), no second without bytes in
//! any transfer, retransmits under 1 % of the segments the senders' kernel sent, nothing
//! policed on the host veths. Aggregates also: Jain's fairness index over the pods that
//! share one at least 0.95. Root only.
//!
//! Cells of low rates run side by side (each in its own topology, set up first, then all
//! transfers at once), 100 Mbit/s ones by pairs, the 1 Gbit/s ones alone, so that the whole
//! matrix takes about five minutes.

mod fabric;

use std::{
    panic::{catch_unwind, resume_unwind, AssertUnwindSafe},
    sync::Barrier,
};

use aliasnet_ebpf::{Datapath, Limits};
use aliasnet_tests::traffic::{
    drops, idle_seconds, jain, received_bps, run_transfers, tcp_counters, Transfer,
};
use fabric::*;

const SECS: u32 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Ingress,
    Egress,
    InternetEgress,
    NodeCap,
    Download,
    ClassDownload,
    NamespaceDownload,
    NodeDownload,
}

/// The namespaces of a namespace cell's pods: four share `team-a`'s limit, one has
/// `team-b`'s to itself.
const NAMESPACE_PODS: [&str; 5] = ["team-a", "team-a", "team-a", "team-a", "team-b"];
/// The namespaces of a node cell's pods.
const NODE_PODS: [&str; 4] = ["team-a", "team-a", "team-b", "team-b"];

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::Ingress,
        Kind::Egress,
        Kind::InternetEgress,
        Kind::NodeCap,
        Kind::Download,
        Kind::ClassDownload,
        Kind::NamespaceDownload,
        Kind::NodeDownload,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Ingress => "ingress",
            Kind::Egress => "egress",
            Kind::InternetEgress => "internet egress",
            Kind::NodeCap => "node cap",
            Kind::Download => "download",
            Kind::ClassDownload => "class download",
            Kind::NamespaceDownload => "namespace download",
            Kind::NodeDownload => "node download",
        }
    }

    /// The rates (Mbit/s) of the kind's cells. A class at a quarter of 1 Mbit/s, or a
    /// quarter of it per pod of an aggregate, would be a few frames a second: a test of the
    /// first frames' timing, not of the limit.
    fn rates(self) -> &'static [u64] {
        match self {
            Kind::ClassDownload => &[10, 100, 1000],
            Kind::NamespaceDownload | Kind::NodeDownload => &[10, 100],
            _ => &[1, 10, 100, 1000],
        }
    }

    /// The namespace of each of the cell's pods.
    fn pods(self) -> &'static [&'static str] {
        match self {
            Kind::NamespaceDownload => &NAMESPACE_PODS,
            Kind::NodeDownload => &NODE_PODS,
            _ => &NAMESPACE_PODS[..1],
        }
    }

    /// Traffic a cell moves, in multiples of its rate (cells side by side share two CPUs).
    fn load(self) -> u64 {
        match self {
            Kind::NamespaceDownload => 2,
            _ => 1,
        }
    }

    /// The node policy of a cell at `rate`.
    fn policy(self, rate: u64) -> String {
        let mut p = String::from("internal_cidrs = [\"10.0.0.0/8\"]\n");
        p.push_str(&match self {
            Kind::NodeCap => format!("node_internet_egress_cap = \"{rate}\"\n"),
            Kind::Download => format!("[internet]\npod_ingress_rate = \"{rate}\"\n"),
            Kind::ClassDownload => format!(
                "[internet]\npod_ingress_rate = \"{rate}\"\n[classes.mirrors]\n\
                 cidrs = [\"{MIRROR}/32\"]\npod_ingress_rate = \"{}\"\n",
                rate / 4
            ),
            Kind::NamespaceDownload => format!("[internet]\nnamespace_ingress_rate = \"{rate}\"\n"),
            Kind::NodeDownload => format!("[internet]\nnode_ingress_rate = \"{rate}\"\n"),
            _ => String::new(),
        });
        p
    }

    /// The pods' own limits, as the CRI path sends them (containerd's "unset" burst).
    fn limits(self, rate: u64) -> Limits {
        let unset = Some(u64::from(u32::MAX));
        match self {
            Kind::Ingress => Limits {
                ingress_rate: Some(rate),
                ingress_burst: unset,
                ..Default::default()
            },
            Kind::Egress => Limits {
                egress_rate: Some(rate),
                egress_burst: unset,
                ..Default::default()
            },
            Kind::InternetEgress => Limits {
                internet_egress_rate: Some(rate),
                ..Default::default()
            },
            _ => Limits::default(),
        }
    }

    /// Whether the pods send (the receiver is the internet host).
    fn upload(self) -> bool {
        matches!(self, Kind::Egress | Kind::InternetEgress | Kind::NodeCap)
    }
}

/// A goodput that must be 90-105 % of `limit`.
#[derive(Debug, Clone)]
struct Check {
    what: &'static str,
    bps: f64,
    limit: f64,
}

impl Check {
    fn of(what: &'static str, bps: f64, limit: f64) -> Self {
        Self { what, bps, limit }
    }

    fn pct(&self) -> f64 {
        100.0 * self.bps / self.limit
    }
}

#[derive(Debug, Clone)]
struct Cell {
    kind: Kind,
    rate: u64,
    mtu: u32,
    /// The first is the cell's limit.
    checks: Vec<Check>,
    /// Fairness among the pods sharing an aggregate.
    jain: Option<f64>,
    /// Each transfer's goodput, bit/s.
    bps: Vec<f64>,
    /// Seconds without bytes, over every transfer of the cell.
    zero_seconds: usize,
    retrans_pct: f64,
    retransmits: u64,
    /// Packets the host veths' backstop dropped: the pods' own HTBs shape, so none.
    policed: u64,
    /// Where packets were dropped (qdiscs and links of the node and the pods), for the
    /// report of a failed cell.
    drops: Vec<(String, u64)>,
    /// What the senders' kernel says of its retransmits (`LOSS_COUNTERS`), for the report of
    /// a failed cell.
    losses: [u64; 4],
}

impl Cell {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for c in &self.checks {
            if !(90.0..=105.0).contains(&c.pct()) {
                p.push(format!("{} {:.1} % of the limit", c.what, c.pct()));
            }
        }
        if let Some(j) = self.jain.filter(|j| *j < 0.95) {
            p.push(format!("Jain's index {j:.3} among the pods"));
        }
        if self.zero_seconds > 0 {
            p.push(format!("{} seconds without bytes", self.zero_seconds));
        }
        if self.retrans_pct >= 1.0 {
            p.push(format!(
                "{} retransmits ({:.2} % of segments)",
                self.retransmits, self.retrans_pct
            ));
        }
        if self.policed > 0 {
            p.push(format!("{} packets policed on the host veth", self.policed));
        }
        if !p.is_empty() {
            let d: Vec<String> = self
                .drops
                .iter()
                .map(|(q, n)| format!("{q}: {n}"))
                .collect();
            let l: Vec<String> = LOSS_COUNTERS
                .iter()
                .zip(self.losses)
                .map(|(c, n)| format!("{} {n}", c.trim_start_matches("TcpExt")))
                .collect();
            let d = if d.is_empty() {
                "nowhere".into()
            } else {
                d.join(", ")
            };
            p.push(format!("(dropped: {d}; the senders: {})", l.join(", ")));
        }
        p
    }
}

/// A cell's topology with its policy applied and its pods attached.
struct Prepared {
    f: Fabric,
    dp: Datapath,
    slots: Vec<u32>,
}

fn prepare(kind: Kind, rate: u64, links: Links) -> Prepared {
    let mut f = Fabric::concurrent(links);
    let pods = kind.pods();
    f.add_pods(pods.len()).expect("wire the pods");
    let path = f.write_policy(&kind.policy(rate));
    let shaperd = |f: &Fabric| {
        let out = f.shaperd_once(&path);
        assert!(
            out.status.success(),
            "shaperd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    shaperd(&f);
    let mut dp = f.open();
    let mut slots = Vec::new();
    for (i, ns) in pods.iter().enumerate() {
        let att = f.attachment_of(i, ns, kind.limits(rate));
        slots.push(f.in_node(|| dp.attach_pod(&att)).expect("attach").slot);
    }
    if pods.len() > 1 {
        // What the daemon does when pods come and go: the aggregates' groups and a leaf of
        // each pod's own in them.
        shaperd(&f);
    }
    Prepared { f, dp, slots }
}

/// One cell: a topology with the limit, set up, then (with the other cells of its group,
/// `start`) a 10 s transfer per pod through it, measured.
fn measure(kind: Kind, rate: u64, links: Links, start: &Barrier) -> Cell {
    // A cell that fails to set up still lets the others of its group start.
    let prepared = catch_unwind(AssertUnwindSafe(|| prepare(kind, rate, links)));
    start.wait();
    let Prepared { f, dp, slots } = prepared.unwrap_or_else(|p| resume_unwind(p));
    // The receiver runs the client and measures; the sender is the server (-R). The
    // senders' kernel counts what they sent and retransmitted (the segment size can be
    // lowered by the handshake's MSS option, so bytes / MSS would not do).
    let roles: Vec<String> = (0..slots.len()).map(pod_role).collect();
    let flows: Vec<(&str, &str, String)> = match kind {
        k if k.upload() => vec![("inet", "pod", POD_IP.to_owned())],
        Kind::ClassDownload => vec![
            ("pod", "inet", INTERNET.to_owned()),
            ("pod", "inet", MIRROR.to_owned()),
        ],
        _ => roles
            .iter()
            .map(|r| (r.as_str(), "inet", INTERNET.to_owned()))
            .collect(),
    };
    let sender = flows[0].1;
    let each: Vec<Transfer> = flows
        .iter()
        .map(|(client, server, addr)| Transfer {
            client: f.netns(client),
            server: f.netns(server).name.as_str(),
            addr,
            pace: None,
        })
        .collect();
    let before = tcp_segments(&f, sender);
    let losses_before = tcp_counters(&f.ns(sender), LOSS_COUNTERS).expect("nstat");
    let runs = run_transfers(&each, SECS, None, true).unwrap_or_else(|e| panic!("{e:#}"));
    let after = tcp_segments(&f, sender);
    let (out_segs, retransmits) = (after.0 - before.0, after.1 - before.1);
    let policed = slots
        .iter()
        .map(|s| dp.counters_of(*s).expect("counters").policed.packets)
        .sum();
    let losses_after = tcp_counters(&f.ns(sender), LOSS_COUNTERS).expect("nstat");
    let drops = ["node".to_owned()]
        .into_iter()
        .chain(roles.iter().cloned())
        .flat_map(|r| {
            let found = drops(&f.ns(&r)).expect("drops");
            found
                .into_iter()
                .map(move |(w, n)| (format!("{r}: {w}"), n))
        })
        .collect();
    let bps: Vec<f64> = runs.iter().map(received_bps).collect();
    let limit = rate as f64;
    let (checks, jain) = match kind {
        Kind::ClassDownload => (
            vec![
                Check::of("the class", bps[1], limit / 4.0),
                Check::of("the internet (class included)", bps.iter().sum(), limit),
            ],
            None,
        ),
        Kind::NamespaceDownload => (
            vec![
                Check::of("the namespace", bps[..4].iter().sum(), limit),
                Check::of("another namespace's pod", bps[4], limit),
            ],
            Some(jain(&bps[..4])),
        ),
        Kind::NodeDownload => (
            vec![Check::of("the node", bps.iter().sum(), limit)],
            Some(jain(&bps)),
        ),
        _ => (vec![Check::of("goodput", bps[0], limit)], None),
    };
    Cell {
        kind,
        rate,
        mtu: links.pod_mtu,
        checks,
        jain,
        bps,
        zero_seconds: runs.iter().map(idle_seconds).sum(),
        retrans_pct: 100.0 * retransmits as f64 / out_segs.max(1) as f64,
        retransmits,
        policed,
        drops,
        losses: std::array::from_fn(|i| losses_after[i] - losses_before[i]),
    }
}

/// The sender's counters that tell a loss from a retransmit nothing was lost for: tail loss
/// probes, timeouts, duplicates the receiver reported (DSACK) and reordering seen.
const LOSS_COUNTERS: [&str; 4] = [
    "TcpExtTCPLossProbes",
    "TcpExtTCPTimeouts",
    "TcpExtTCPDSACKRecv",
    "TcpExtTCPSACKReorder",
];

/// TCP segments sent and retransmitted by the kernel of namespace `role` so far.
fn tcp_segments(f: &Fabric, role: &str) -> (u64, u64) {
    aliasnet_tests::traffic::tcp_segments(&f.ns(role)).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The cells of `cells` side by side, each in its own topology, their transfers at once.
fn run_group(cells: &[(Kind, u64, Links)]) -> Vec<Cell> {
    let start = Barrier::new(cells.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = cells
            .iter()
            .map(|&(k, r, l)| {
                let start = &start;
                s.spawn(move || measure(k, r, l, start))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("cell thread"))
            .collect()
    })
}

fn print_and_check(results: &[Cell]) {
    let mut failed = Vec::new();
    eprintln!("MTU   limit                rate        goodput  zero s  retransmits");
    for c in results {
        eprintln!(
            "{:<5} {:<20} {:>6} Mbit/s {:>7.1} % {:>6} {:>8} ({:.2} %)",
            c.mtu,
            c.kind.name(),
            c.rate / 1_000_000,
            c.checks[0].pct(),
            c.zero_seconds,
            c.retransmits,
            c.retrans_pct
        );
        for x in &c.checks[1..] {
            eprintln!("      {:<35} {:>7.1} %", x.what, x.pct());
        }
        if let Some(j) = c.jain {
            let mbps: Vec<String> = c.bps.iter().map(|b| format!("{:.2}", b / 1e6)).collect();
            eprintln!(
                "      {:<35} {j:>7.3} (Mbit/s: {})",
                "Jain's index among the pods",
                mbps.join(", ")
            );
        }
        let p = c.problems();
        if !p.is_empty() {
            failed.push(format!(
                "MTU {} {} at {} Mbit/s: {}",
                c.mtu,
                c.kind.name(),
                c.rate / 1_000_000,
                p.join(", ")
            ));
        }
    }
    assert!(failed.is_empty(), "cells failed:\n{}", failed.join("\n"));
}

/// A pod whose MTU is set below the node's (`"mtu": 1500` on a 9000-byte node): its shaping
/// points are sized for its own frames, the node cap's and the aggregates' for the
/// uplink's.
#[test]
fn a_pod_mtu_below_the_uplinks() {
    require_root();
    let _serial = Fabric::serial();
    let links = Links {
        uplink_mtu: 9000,
        pod_mtu: 1500,
        gro: true,
    };
    let cells: Vec<_> = Kind::ALL.iter().map(|&k| (k, 10_000_000, links)).collect();
    print_and_check(&run_group(&cells));
}

#[test]
fn every_limit_holds_at_every_rate_and_mtu() {
    require_root();
    let _serial = Fabric::serial();
    // ALIASNET_MATRIX_MTUS / ALIASNET_MATRIX_MBITS (comma lists) and ALIASNET_MATRIX_KINDS
    // (names as printed, `_` for a space) narrow the matrix by hand.
    let list = |var: &str, all: &[u64]| -> Vec<u64> {
        std::env::var(var).map_or_else(
            |_| all.to_vec(),
            |v| v.split(',').map(|x| x.trim().parse().expect(var)).collect(),
        )
    };
    let kinds: Vec<Kind> = std::env::var("ALIASNET_MATRIX_KINDS").map_or(Kind::ALL.to_vec(), |v| {
        v.split(',')
            .map(|n| {
                let n = n.trim().replace('_', " ");
                *Kind::ALL
                    .iter()
                    .find(|k| k.name() == n)
                    .unwrap_or_else(|| panic!("ALIASNET_MATRIX_KINDS: no kind {n:?}"))
            })
            .collect()
    });
    let mbits = list("ALIASNET_MATRIX_MBITS", &[1, 10, 100, 1000]);
    let mut all = Vec::new();
    for mtu in list("ALIASNET_MATRIX_MTUS", &[1500, 9000]) {
        let links = Links {
            gro: true,
            ..Links::mtu(u32::try_from(mtu).expect("MTU"))
        };
        for &kind in &kinds {
            for rate in kind.rates().iter().filter(|r| mbits.contains(r)) {
                all.push((kind, rate * 1_000_000, links));
            }
        }
    }
    // Low rates need little CPU: all at once. 100 Mbit/s cells by pairs, up to 200 Mbit/s
    // of transfers at once (four 1500-byte transfers of 100 Mbit/s at once on two CPUs
    // sometimes lost packets to CPU contention), 1 Gbit/s alone.
    let mut results = Vec::new();
    let low: Vec<_> = all.iter().copied().filter(|c| c.1 <= 10_000_000).collect();
    if !low.is_empty() {
        results.extend(run_group(&low));
    }
    let mut group: Vec<(Kind, u64, Links)> = Vec::new();
    for &c in all.iter().filter(|c| c.1 == 100_000_000) {
        let load = |g: &[(Kind, u64, Links)]| g.iter().map(|c| c.0.load()).sum::<u64>();
        if !group.is_empty() && load(&group) + c.0.load() > 2 {
            results.extend(run_group(&group));
            group.clear();
        }
        group.push(c);
    }
    if !group.is_empty() {
        results.extend(run_group(&group));
    }
    for c in all.iter().filter(|c| c.1 == 1_000_000_000) {
        results.extend(run_group(&[*c]));
    }
    results.sort_by_key(|c| (c.mtu, c.kind, c.rate));

    print_and_check(&results);
}
