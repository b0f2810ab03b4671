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
//! ```

mod cni;
mod ipam;

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
}

fn main() -> Result<()> {
    match Cli::parse().section {
        Section::Cni(a) => cni::run(a),
        Section::Ipam(a) => ipam::run(a),
    }
}
