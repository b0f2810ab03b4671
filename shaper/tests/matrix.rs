//! The rate matrix: every kind of limit (pod ingress, pod egress, pod internet-only egress,
//! the node's internet cap) at 1 Mbit/s, 10 Mbit/s, 100 Mbit/s and 1 Gbit/s, on nodes with
//! 1500- and 9000-byte MTUs, GRO on the node's veths. Each cell is a 10 s TCP transfer
//! measured by its receiver: goodput 90-105 % of the limit over the whole run (the first
//! second included), no second without bytes, retransmits under 1 % of the segments sent.
//! Root only.
//!
//! Cells of a rate run side by side (each in its own fabric), the 1 Gbit/s ones alone, so
//! that the whole matrix takes about two minutes.

mod fabric;

use aliasnet_shaper::Limits;
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
        p
    }
}

/// One cell: a fabric with the limit, a 10 s transfer through it, measured.
fn measure(kind: Kind, rate: u64, mtu: u32) -> Cell {
    let links = Links {
        gro: true,
        ..Links::mtu(mtu)
    };
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
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    // The receiver runs the client and measures; the sender is the server (-R).
    let v = match kind {
        Kind::Ingress => f.iperf_received("pod", "inet", INTERNET, SECS),
        _ => f.iperf_received("inet", "pod", POD_IP, SECS),
    };
    let received = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("iperf3 result: {v}"));
    let intervals = v["intervals"].as_array().expect("intervals");
    let zero_seconds = intervals
        .iter()
        .filter(|i| i["sum"]["bytes"].as_u64() == Some(0))
        .count();
    let retransmits = v["end"]["sum_sent"]["retransmits"]
        .as_u64()
        .unwrap_or_else(|| panic!("no sender retransmits in {}", v["end"]));
    let sent = v["end"]["sum_sent"]["bytes"].as_f64().expect("bytes sent");
    let mss = v["start"]["tcp_mss_default"]
        .as_f64()
        .filter(|m| *m > 0.0)
        .unwrap_or(f64::from(mtu - 52));
    Cell {
        kind,
        rate,
        mtu,
        goodput_pct: 100.0 * received / rate as f64,
        zero_seconds,
        retrans_pct: 100.0 * retransmits as f64 / (sent / mss).max(1.0),
        retransmits,
    }
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

#[test]
fn every_limit_holds_at_every_rate_and_mtu() {
    if !require_root() {
        return;
    }
    let mut all = Vec::new();
    for mtu in [1500, 9000] {
        for rate in [1_000_000u64, 10_000_000, 100_000_000, 1_000_000_000] {
            for kind in Kind::ALL {
                all.push((kind, rate, mtu));
            }
        }
    }
    // Low rates need little CPU: all at once. 100 Mbit/s four at a time, 1 Gbit/s alone.
    let mut results = Vec::new();
    let low: Vec<_> = all.iter().copied().filter(|c| c.1 <= 10_000_000).collect();
    results.extend(run_group(&low));
    let mid: Vec<_> = all.iter().copied().filter(|c| c.1 == 100_000_000).collect();
    for chunk in mid.chunks(4) {
        results.extend(run_group(chunk));
    }
    for c in all.iter().filter(|c| c.1 == 1_000_000_000) {
        results.extend(run_group(&[*c]));
    }
    results.sort_by_key(|c| (c.mtu, c.kind as u8, c.rate));

    let mut failed = Vec::new();
    eprintln!("MTU   limit            rate        goodput  zero s  retransmits");
    for c in &results {
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
