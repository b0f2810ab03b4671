//! `aliasnet-bench`: every benchmark of BENCHMARKS.md, one subcommand (and one module) per
//! section, on the namespace topologies of the test fabric (`aliasnet-tests`). Each creates
//! what it measures in namespaces of its own and removes it on exit; all need root.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! target/release/aliasnet-bench cni --runs 3 --out bench-results/cni.md
//! target/release/aliasnet-bench ipam --runs 3 --out ipam-bench.md
//! sudo nice -n -10 target/release/aliasnet-bench shaping --reps 3 --secs 10 --out shaping-bench.md
//! target/release/aliasnet-bench metrics --pods 250,1000 --runs 3 --scrapes 21
//! target/release/aliasnet-bench attach-cost --pods 100
//! target/release/aliasnet-bench budget --reporters 10,100,1000 --secs 30
//! ```
//!
//! `podctl` is a development tool next to them: attach, detach and show a pod by hand.

mod attach_cost;
mod budget;
mod cni;
mod ipam;
mod metrics;
mod podctl;
mod shaping;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(about = "aliasnet benchmarks, one subcommand per section of BENCHMARKS.md")]
struct Cli {
    #[command(subcommand)]
    section: Section,
}

#[derive(Subcommand, Debug)]
enum Section {
    /// CNI ADD/CHECK/DEL latency: aliasnet vs ptp+host-local, same run.
    Cni(cni::Args),
    /// aliasnet-ipamd benchmarks (throughput, latency, RSS, restart) vs host-local.
    Ipam(ipam::Args),
    /// Shaping benchmarks (goodput, latency, fairness, overhead, classifier cost), side by
    /// side with the reference bandwidth plugin in one run.
    Shaping(shaping::Args),
    /// Scrape latency and size of aliasnet-shaperd /metrics with N pods.
    Metrics(metrics::Args),
    /// Per-pod attach/detach cost (cls_bpf) and one TCX link, in a private node.
    AttachCost(attach_cost::Args),
    /// Cluster budget: etcd writes, watch events, etcd and leader CPU, share computation
    /// time with N reporting nodes on a real 3-member etcd.
    Budget(budget::Args),
    /// Development tool: attach, detach or show a pod by hand (run it in the node's netns).
    Podctl(podctl::Args),
}

fn main() -> Result<()> {
    match Cli::parse().section {
        Section::Cni(a) => cni::run(a),
        Section::Ipam(a) => ipam::run(a),
        Section::Shaping(a) => shaping::run(a),
        Section::Metrics(a) => metrics::run(a),
        Section::AttachCost(a) => attach_cost::run(a),
        Section::Podctl(a) => podctl::run(a),
        Section::Budget(a) => budget::run(a),
    }
}
