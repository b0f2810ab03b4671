//! One simulated node of the cluster budget in a process of its own (the benchmark's leader,
//! the clock-jump test's node): a real engine over simulated traffic, in the network namespace
//! it is started in. Prints its state as one JSON object per line every 200 ms until killed.

use std::{path::PathBuf, time::Duration};

use aliasnet_budget::BudgetPolicy;
use aliasnet_tests::budget::SimCluster;
use anyhow::{Context, Result};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "one simulated node of the cluster budget (tests and benchmarks)")]
struct Args {
    /// A shaper.toml with [cluster] and the budgets.
    #[arg(long)]
    policy: PathBuf,
    /// The node's name.
    #[arg(long)]
    name: String,
    /// What its pods would pull per budget, bit/s; omitted: elastic (as much as they get).
    #[arg(long)]
    want: Option<f64>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.policy).context("read the policy")?;
    let policy = BudgetPolicy::parse(&text)?;
    let cfg = policy.cluster.context("the policy has no [cluster]")?;
    let mut sim = SimCluster::new("/proc/self/ns/net".into(), cfg)?;
    let i = sim.start(&args.name, &policy.budgets, None)?;
    for b in &policy.budgets {
        sim.nodes[i].set_want(&b.key, args.want.unwrap_or(f64::INFINITY));
    }
    let status = sim.nodes[i].handle.status();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let s = status.borrow().clone();
        let first = s.budgets.first();
        println!(
            "{}",
            serde_json::json!({
                "leader": s.leader,
                "connected": s.connected,
                "mode": first.map(|b| b.mode.as_str()),
                "share": first.map(|b| b.share),
                "compute_us": s.compute_time.as_micros() as u64,
                "nodes": s.budgets.iter().filter_map(|b| b.cluster.map(|c| c.nodes)).max(),
                // The wall clock as this process sees it (the clock-jump test steps it).
                "wall_unix": std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            })
        );
    }
}
