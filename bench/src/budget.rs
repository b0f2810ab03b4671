//! The `budget` section: what the cluster budget costs etcd and the leader with N reporting
//! nodes.
//!
//! A real 3-member etcd (Debian's etcd-server) in its own namespace behind a router, a leader
//! process (`aliasnet-budget-node` of the test fabric, started first so that it wins the
//! election; its CPU is measured from /proc) and N light reporters in this process: real engines (own connection, lease,
//! watch, candidacy) over simulated traffic on two budgets, half elastic, with 5 % of the
//! nodes changing their demand every share period. After a warm-up, over `--secs`:
//! etcd write transactions per second (store revisions), watch events sent by the members,
//! the members' CPU, the leader's CPU and its share computation time, and this process's CPU
//! per reporter.
//!
//! ```text
//! cargo build --release -p aliasnet-bench
//! target/release/aliasnet-bench budget --reporters 10,100,1000 --secs 30
//! ```

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    time::{Duration, Instant},
};

use aliasnet_budget::BudgetPolicy;
use aliasnet_tests::{
    budget::SimCluster,
    etcd::{EtcdCluster, EtcdOpts},
    fabric::{Fabric, FabricOpts},
    ChildGuard,
};
use anyhow::{bail, Context, Result};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Reporter counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    reporters: Vec<usize>,
    /// Measurement window per count, seconds (after a warm-up of 5 share periods).
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// share_period, as in shaper.toml.
    #[arg(long, default_value = "2s")]
    period: String,
}

const PREFIX: &str = "/bench";

/// The policy of every node: two budgets sized for `n` nodes.
fn policy(endpoints: &[String], period: &str, n: usize) -> Result<(String, BudgetPolicy)> {
    let rate = 10_000_000 * n.max(1) as u64;
    let list: Vec<String> = endpoints.iter().map(|e| format!("{e:?}")).collect();
    let text = format!(
        "[cluster]\netcd_endpoints = [{}]\netcd_prefix = {PREFIX:?}\nshare_period = {period:?}\n\
         [internet]\ncluster_ingress_rate = {}\n\
         [classes.mirrors]\ncidrs = [\"203.0.113.0/24\"]\ncluster_ingress_rate = {rate}\n",
        list.join(", "),
        rate * 4
    );
    let parsed = BudgetPolicy::parse(&text)?;
    Ok((text, parsed))
}

/// A small deterministic generator (no dependency for a benchmark's dice).
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A demand: elastic half of the time, else 1-20 Mbit/s.
    fn want(&mut self) -> f64 {
        if self.next().is_multiple_of(2) {
            f64::INFINITY
        } else {
            (1 + self.next() % 20) as f64 * 1e6
        }
    }
}

/// utime + stime of a process, seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    f.iter().sum::<u64>() as f64 / hz
}

/// Sum of a counter over every member's /metrics.
fn etcd_counter(etcd: &EtcdCluster, name: &str) -> Result<f64> {
    let mut total = 0.0;
    for e in etcd.endpoints() {
        let out = etcd
            .ns
            .exec("curl", &["-sf", "--max-time", "5", &format!("{e}/metrics")])?;
        let text = String::from_utf8_lossy(&out.stdout);
        total += text
            .lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(total)
}

fn revision(etcd: &EtcdCluster) -> Result<i64> {
    let out = etcd.etcdctl(&["endpoint", "status", "-w", "json"])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    v[0]["Status"]["header"]["revision"]
        .as_i64()
        .context("no revision in endpoint status")
}

struct Row {
    n: usize,
    writes: f64,
    events: f64,
    etcd_cpu: f64,
    leader_cpu: f64,
    compute_us: (u64, u64),
    reporter_cpu: f64,
    nodes_seen: u32,
}

fn measure(n: usize, args: &Args) -> Result<Row> {
    let fabric = Fabric::new(FabricOpts {
        nodes: 1,
        start_ipamd: false,
        shaper: false,
        ..FabricOpts::default()
    })?;
    let etcd = EtcdCluster::start(&fabric.vnet, EtcdOpts::default())?;
    let (text, policy) = policy(&etcd.endpoints(), &args.period, n)?;
    let cfg = policy.cluster.clone().context("[cluster]")?;
    let period = cfg.share_period;
    let file = etcd.dir().join("shaper.toml");
    std::fs::write(&file, text)?;
    // The leader, in its own process.
    let mut leader = fabric
        .node(1)
        .ns
        .command(aliasnet_tests::bin("aliasnet-budget-node"))
        .args(["--name", "leader", "--policy"])
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn the leader")?;
    let lines = BufReader::new(leader.stdout.take().context("leader stdout")?);
    let leader = ChildGuard(leader);
    let (tx, rx) = std::sync::mpsc::channel::<(bool, u64, u32)>();
    std::thread::spawn(move || {
        for l in lines.lines().map_while(Result::ok) {
            let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_default();
            let s = (
                v["leader"].as_bool().unwrap_or(false),
                v["compute_us"].as_u64().unwrap_or(0),
                v["nodes"].as_u64().unwrap_or(0) as u32,
            );
            if tx.send(s).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    while !rx.recv_timeout(Duration::from_secs(10))?.0 {
        if start.elapsed() > Duration::from_secs(20) {
            bail!("the leader process was not elected");
        }
    }
    let mut sim = SimCluster::new(fabric.node(1).ns.path(), cfg)?;
    let mut dice = Dice(0x9e37_79b9_7f4a_7c15 ^ n as u64);
    let b = policy.budgets;
    for i in 0..n {
        let idx = sim.start(&format!("r{i}"), &b, None)?;
        for bud in &b {
            sim.nodes[idx].set_want(&bud.key, dice.want());
        }
    }
    let churn = |sim: &SimCluster, dice: &mut Dice| {
        for _ in 0..(n / 20).max(1) {
            let i = (dice.next() % n as u64) as usize;
            let k = &b[(dice.next() % 2) as usize].key;
            sim.nodes[i].set_want(k, dice.want());
        }
    };
    let warm = Instant::now();
    while warm.elapsed() < period * 5 {
        churn(&sim, &mut dice);
        std::thread::sleep(period);
    }
    while rx.try_recv().is_ok() {}
    let me = std::process::id();
    let (rev0, ev0) = (
        revision(&etcd)?,
        etcd_counter(&etcd, "etcd_debugging_mvcc_events_total")?,
    );
    let etcd0: f64 = etcd.pids().iter().map(|p| cpu_secs(*p)).sum();
    let (lead0, me0) = (cpu_secs(leader.0.id()), cpu_secs(me));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(args.secs) {
        churn(&sim, &mut dice);
        std::thread::sleep(period);
    }
    let secs = t0.elapsed().as_secs_f64();
    let (rev1, ev1) = (
        revision(&etcd)?,
        etcd_counter(&etcd, "etcd_debugging_mvcc_events_total")?,
    );
    let etcd1: f64 = etcd.pids().iter().map(|p| cpu_secs(*p)).sum();
    let (lead1, me1) = (cpu_secs(leader.0.id()), cpu_secs(me));
    let mut computes: Vec<(u64, u32)> = rx.try_iter().filter(|s| s.0).map(|s| (s.1, s.2)).collect();
    computes.sort_unstable();
    let median = computes.get(computes.len() / 2).map_or(0, |c| c.0);
    let max = computes.last().map_or(0, |c| c.0);
    let nodes_seen = computes.iter().map(|c| c.1).max().unwrap_or(0);
    drop(sim);
    drop(leader);
    Ok(Row {
        n,
        writes: (rev1 - rev0) as f64 / secs,
        events: (ev1 - ev0) / secs,
        etcd_cpu: (etcd1 - etcd0) / secs,
        leader_cpu: (lead1 - lead0) / secs,
        compute_us: (median, max),
        reporter_cpu: (me1 - me0) / secs / n as f64 * 1000.0,
        nodes_seen,
    })
}

/// The leader's computation alone for `n` nodes: one budget's water level over `n` demands
/// (allocation and sort included), median of 101 runs, in µs.
fn compute_only(n: usize) -> f64 {
    let mut dice = Dice(0x2545_f491_4f6c_dd1d);
    let demands: Vec<u64> = (0..n).map(|_| 1 + dice.next() % 1_000_000_000).collect();
    let mut times: Vec<f64> = (0..101)
        .map(|_| {
            let mut d = demands.clone();
            let t = Instant::now();
            std::hint::black_box(aliasnet_budget::water::allocate(
                40_000_000_000,
                std::hint::black_box(&mut d),
            ));
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[50]
}

pub fn run(args: Args) -> Result<()> {
    aliasnet_tests::require_root();
    for n in [1_000, 7_500, 75_000] {
        println!(
            "water level over {n} demands: {:.0} µs (median of 101)",
            compute_only(n)
        );
    }
    println!();
    println!(
        "| reporters | nodes counted | etcd writes/s | watch events/s | etcd CPU (3 members, cores) | leader CPU (cores) | computation p50 / max (µs) | CPU per reporter (ms/s) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &n in &args.reporters {
        let r = measure(n, &args)?;
        println!(
            "| {} | {} | {:.1} | {:.0} | {:.3} | {:.4} | {} / {} | {:.3} |",
            r.n,
            r.nodes_seen,
            r.writes,
            r.events,
            r.etcd_cpu,
            r.leader_cpu,
            r.compute_us.0,
            r.compute_us.1,
            r.reporter_cpu
        );
    }
    Ok(())
}
