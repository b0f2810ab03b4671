//! The rate matrix: every kind of limit (pod ingress, pod egress, pod internet-only egress,
//! the node's internet cap) at 1 Mbit/s, 10 Mbit/s, 100 Mbit/s and 1 Gbit/s, on nodes with
//! 1500- and 9000-byte MTUs, GRO on the node's veths. Each cell is a 10 s TCP transfer
//! measured by its receiver: goodput 90-105 % of the limit over the whole run (the first
//! second included), no second without bytes, retransmits under 1 % of the segments sent.
//! Root only.
//!
//! Cells of low rates run side by side (each in its own fabric), the 1 Gbit/s ones alone, so
//! that the whole matrix takes about two minutes.

mod fabric;

use aliasnet_ebpf::Limits;
use fabric::*;

const SECS: u32 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ingress,
    Egress,
    InternetEgress,
    NodeCap,
}

impl Kind {
    const ALL: [Kind; 4] = [
        Kind::Ingress,
        Kind::Egress,
        Kind::InternetEgress,
        Kind::NodeCap,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Ingress => "ingress",
            Kind::Egress => "egress",
            Kind::InternetEgress => "internet egress",
            Kind::NodeCap => "node cap",
        }
    }
}

#[derive(Debug, Clone)]
struct Cell {
    kind: Kind,
    rate: u64,
    mtu: u32,
    goodput_pct: f64,
    zero_seconds: usize,
    retrans_pct: f64,
    retransmits: u64,
    /// Packets the host veth's backstop dropped: the pod's own HTB shapes, so none.
    policed: u64,
}

impl Cell {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !(90.0..=105.0).contains(&self.goodput_pct) {
            p.push(format!("goodput {:.1} % of the limit", self.goodput_pct));
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
        p
    }
}

/// One cell: a fabric with the limit, a 10 s transfer through it, measured.
fn measure(kind: Kind, rate: u64, mtu: u32) -> Cell {
    measure_on(
        kind,
        rate,
        Links {
            gro: true,
            ..Links::mtu(mtu)
        },
    )
}

fn measure_on(kind: Kind, rate: u64, links: Links) -> Cell {
    let mtu = links.pod_mtu;
    let f = Fabric::concurrent(links);
    let mut policy = String::from("internal_cidrs = [\"10.0.0.0/8\"]\n");
    if kind == Kind::NodeCap {
        policy.push_str(&format!("node_internet_egress_cap = \"{rate}\"\n"));
    }
    let path = f.write_policy(&policy);
    let out = f.shaperd_once(&path);
    assert!(
        out.status.success(),
        "shaperd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // containerd's "unset" burst, as the CRI path sends it.
    let unset = Some(u64::from(u32::MAX));
    let limits = match kind {
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
        Kind::NodeCap => Limits::default(),
    };
    let mut dp = f.open();
    let att = f.attachment(limits);
    let slot = f.in_node(|| dp.attach_pod(&att)).expect("attach").slot;
    // The receiver runs the client and measures; the sender is the server (-R). The
    // sender's kernel counts what it sent and retransmitted (the segment size can be lowered
    // by the handshake's MSS option, so bytes / MSS would not do).
    let sender = if kind == Kind::Ingress { "inet" } else { "pod" };
    let before = tcp_segments(&f, sender);
    let v = match kind {
        Kind::Ingress => f.iperf_received("pod", "inet", INTERNET, SECS),
        _ => f.iperf_received("inet", "pod", POD_IP, SECS),
    };
    let after = tcp_segments(&f, sender);
    let (out_segs, retransmits) = (after.0 - before.0, after.1 - before.1);
    let policed = dp.counters_of(slot).expect("counters").policed.packets;
    let received = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("iperf3 result: {v}"));
    let intervals = v["intervals"].as_array().expect("intervals");
    let zero_seconds = intervals
        .iter()
        .filter(|i| i["sum"]["bytes"].as_u64() == Some(0))
        .count();
    Cell {
        kind,
        rate,
        mtu,
        goodput_pct: 100.0 * received / rate as f64,
        zero_seconds,
        retrans_pct: 100.0 * retransmits as f64 / out_segs.max(1) as f64,
        retransmits,
        policed,
    }
}

/// TCP segments sent and retransmitted by the kernel of namespace `role` so far.
fn tcp_segments(f: &Fabric, role: &str) -> (u64, u64) {
    let out = f.exec(
        role,
        &["nstat", "-az", "--json", "TcpOutSegs", "TcpRetransSegs"],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nstat --json");
    let k = &v["kernel"];
    (
        k["TcpOutSegs"].as_u64().expect("TcpOutSegs"),
        k["TcpRetransSegs"].as_u64().expect("TcpRetransSegs"),
    )
}

fn run_group(cells: &[(Kind, u64, u32)]) -> Vec<Cell> {
    std::thread::scope(|s| {
        let handles: Vec<_> = cells
            .iter()
            .map(|&(k, r, m)| s.spawn(move || measure(k, r, m)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("cell thread"))
            .collect()
    })
}

fn print_and_check(results: &[Cell]) {
    let mut failed = Vec::new();
    eprintln!("MTU   limit            rate        goodput  zero s  retransmits");
    for c in results {
        eprintln!(
            "{:<5} {:<16} {:>6} Mbit/s {:>7.1} % {:>6} {:>8} ({:.2} %)",
            c.mtu,
            c.kind.name(),
            c.rate / 1_000_000,
            c.goodput_pct,
            c.zero_seconds,
            c.retransmits,
            c.retrans_pct
        );
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
/// points are sized for its own frames, the node cap's for the uplink's.
#[test]
fn a_pod_mtu_below_the_uplinks() {
    require_root();
    let _serial = Fabric::serial();
    let links = Links {
        uplink_mtu: 9000,
        pod_mtu: 1500,
        gro: true,
    };
    let results: Vec<Cell> = std::thread::scope(|s| {
        let h: Vec<_> = Kind::ALL
            .iter()
            .map(|&k| s.spawn(move || measure_on(k, 10_000_000, links)))
            .collect();
        h.into_iter().map(|h| h.join().expect("cell")).collect()
    });
    print_and_check(&results);
}

#[test]
fn every_limit_holds_at_every_rate_and_mtu() {
    require_root();
    let _serial = Fabric::serial();
    // ALIASNET_MATRIX_MTUS / ALIASNET_MATRIX_MBITS (comma lists) narrow the matrix by hand.
    let list = |var: &str, all: &[u64]| -> Vec<u64> {
        std::env::var(var).map_or_else(
            |_| all.to_vec(),
            |v| v.split(',').map(|x| x.trim().parse().expect(var)).collect(),
        )
    };
    let mut all = Vec::new();
    for mtu in list("ALIASNET_MATRIX_MTUS", &[1500, 9000]) {
        let mtu = u32::try_from(mtu).expect("MTU");
        for rate in list("ALIASNET_MATRIX_MBITS", &[1, 10, 100, 1000]) {
            let rate = rate * 1_000_000;
            for kind in Kind::ALL {
                all.push((kind, rate, mtu));
            }
        }
    }
    // Low rates need little CPU: all at once. 100 Mbit/s two at a time (four 1500-byte
    // transfers at once on two CPUs sometimes lost packets to CPU contention), 1 Gbit/s alone.
    let mut results = Vec::new();
    let low: Vec<_> = all.iter().copied().filter(|c| c.1 <= 10_000_000).collect();
    results.extend(run_group(&low));
    let mid: Vec<_> = all.iter().copied().filter(|c| c.1 == 100_000_000).collect();
    for chunk in mid.chunks(2) {
        results.extend(run_group(chunk));
    }
    for c in all.iter().filter(|c| c.1 == 1_000_000_000) {
        results.extend(run_group(&[*c]));
    }
    results.sort_by_key(|c| (c.mtu, c.kind as u8, c.rate));

    print_and_check(&results);
}
