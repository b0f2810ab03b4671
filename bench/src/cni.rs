//! Side-by-side CNI latency benchmark: `aliasnet` against the reference `ptp` + `host-local`
//! chain (Debian's containernetworking-plugins), in the same run, on the same node netns.
//!
//! Drives each chain the way libcni does (per-plugin config with `cniVersion`, `name`,
//! `prevResult`; ADD in order, CHECK with the cached result, DEL in reverse with it), with a
//! fresh pod netns per pod (created and removed outside the timed region) and kubelet-style
//! `CNI_ARGS`. The benchmark process itself enters the node netns, so plugins are exec'd
//! directly (no wrapper) for both chains.
//!
//! ```sh
//! target/release/aliasnet-bench cni --runs 3 --out bench-results/cni.md
//! target/release/aliasnet-bench cni --stack dual --runs 3 --out bench-results/cni-dual.md
//! target/release/aliasnet-bench cni --runs 3 --burst 250 --out bench-results/cni-burst.md
//! ```
//!
//! `--burst N` adds a phase of N pods whose ADDs all start at once (a node filling up): its
//! "ADD wall (all pods)" row is the time until the last pod has its network.
//!
//! `--stack dual` gives every pod an IPv4 and an IPv6 address: the node's ipamd serves an
//! IPv4 and an IPv6 pool, and the reference `host-local` has two ranges (one per family).

use std::{
    collections::BTreeMap,
    fs::File,
    path::PathBuf,
    sync::Mutex,
    time::{Duration, Instant},
};

use aliasnet_tests::{
    cni::{invoke, plugin_config, Invocation, Outcome},
    fabric::{Fabric, FabricOpts, Stack},
    netns::Netns,
};
use anyhow::{bail, Context, Result};
use nix::sched::{setns, CloneFlags};
use serde::Serialize;
use serde_json::{json, Value};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Pods in the sequential phase.
    #[arg(long, default_value_t = 200)]
    pods: usize,
    /// Pods in the parallel phase.
    #[arg(long, default_value_t = 50)]
    parallel_pods: usize,
    /// Concurrency of the parallel phase.
    #[arg(long, default_value_t = 8)]
    parallel: usize,
    /// Pods of the burst phase, all started at once (a node filling up); 0 skips the phase.
    #[arg(long, default_value_t = 0)]
    burst: usize,
    /// Repetitions; medians of the per-run percentiles are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Directory of the reference plugins.
    #[arg(long, default_value = "/usr/lib/cni")]
    reference_dir: PathBuf,
    /// Markdown report.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Raw samples.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Address families of every pod, for both chains.
    #[arg(long, value_enum, default_value_t = StackArg::Ipv4)]
    stack: StackArg,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackArg {
    /// One IPv4 address per pod.
    Ipv4,
    /// One IPv4 and one IPv6 address per pod.
    Dual,
}

#[derive(Clone)]
struct Chain {
    label: &'static str,
    conflist: Value,
    cni_path: String,
    /// What every ADD result must hold: (IPv4 addresses, IPv6 addresses).
    families: (usize, usize),
}

/// How many IPv4 and IPv6 addresses a CNI result's `ips` holds.
fn families_of(result: &Value) -> (usize, usize) {
    let ips = aliasnet_tests::fabric::result_ips(result);
    let v4 = ips.iter().filter(|a| a.is_ipv4()).count();
    (v4, ips.len() - v4)
}

#[derive(Default, Serialize, Clone)]
struct Samples {
    /// op -> milliseconds
    ms: BTreeMap<String, Vec<f64>>,
    errors: Vec<String>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest-rank percentile.
    let k = ((p / 100.0 * sorted.len() as f64 + 0.5).round() as isize - 1)
        .clamp(0, sorted.len() as isize - 1) as usize;
    sorted[k]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn k8s_args(pod: &str, cid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=uid-{pod}")
}

/// One plugin of the chain (`i`) called with `op` for `pod`, with `prev` as its prevResult.
fn invoke_plugin(
    chain: &Chain,
    op: &str,
    i: usize,
    pod: &Netns,
    cid: &str,
    prev: Option<&Value>,
) -> Outcome {
    let conf = plugin_config(&chain.conflist, i, prev, None);
    let inv = Invocation::new(op, cid, Some(&pod.path()), "eth0").args(&k8s_args(&pod.name, cid));
    let inv = Invocation {
        path: chain.cni_path.clone(),
        ..inv
    };
    let plugin = find_plugin(&chain.cni_path, conf["type"].as_str().unwrap());
    invoke(None, &plugin, &inv, &serde_json::to_vec(&conf).unwrap()).unwrap()
}

/// One pod through ADD; returns the cached final result.
fn add(chain: &Chain, pod: &Netns, cid: &str, s: &Mutex<Samples>) -> Option<Value> {
    let plugins = chain.conflist["plugins"].as_array().unwrap().len();
    let mut prev: Option<Value> = None;
    let start = Instant::now();
    for i in 0..plugins {
        let out = invoke_plugin(chain, "ADD", i, pod, cid, prev.as_ref());
        if !out.ok() {
            s.lock()
                .unwrap()
                .errors
                .push(format!("ADD {cid}: {}", out.stdout));
            return None;
        }
        prev = out.json();
    }
    record(s, "ADD", start.elapsed());
    // A chain that fails to give the pod its addresses must not pass as a fast one.
    let families = prev.as_ref().map(families_of).unwrap_or_default();
    if families != chain.families {
        s.lock().unwrap().errors.push(format!(
            "ADD {cid}: (IPv4, IPv6) addresses {families:?}, want {:?}: {prev:?}",
            chain.families
        ));
    }
    prev
}

fn check(chain: &Chain, pod: &Netns, cid: &str, result: &Value, s: &Mutex<Samples>) {
    run_all(chain, "CHECK", pod, cid, Some(result), false, s);
}

fn del(chain: &Chain, pod: &Netns, cid: &str, result: Option<&Value>, s: &Mutex<Samples>) {
    run_all(chain, "DEL", pod, cid, result, true, s);
}

fn run_all(
    chain: &Chain,
    op: &str,
    pod: &Netns,
    cid: &str,
    result: Option<&Value>,
    reverse: bool,
    s: &Mutex<Samples>,
) {
    let n = chain.conflist["plugins"].as_array().unwrap().len();
    let order: Vec<usize> = if reverse {
        (0..n).rev().collect()
    } else {
        (0..n).collect()
    };
    let start = Instant::now();
    for i in order {
        let out = invoke_plugin(chain, op, i, pod, cid, result);
        if !out.ok() {
            s.lock()
                .unwrap()
                .errors
                .push(format!("{op} {cid}: {}", out.stdout));
        }
    }
    record(s, op, start.elapsed());
}

fn record(s: &Mutex<Samples>, op: &str, d: Duration) {
    s.lock()
        .unwrap()
        .ms
        .entry(op.to_owned())
        .or_default()
        .push(d.as_secs_f64() * 1e3);
}

fn find_plugin(cni_path: &str, ty: &str) -> PathBuf {
    cni_path
        .split(':')
        .map(|d| PathBuf::from(d).join(ty))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("plugin {ty} not found in {cni_path}"))
}

/// Wait until the node has no host veth left (aliasnet tears veths down after DEL replies,
/// ptp synchronously): the next phase must not pay for this one's teardown.
fn wait_quiet(node: &Netns) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let busy = node
            .link_names()
            .map(|l| {
                l.iter()
                    .any(|n| n.starts_with("ali") || n.starts_with("veth"))
            })
            .unwrap_or(false);
        if !busy {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sequential(chain: &Chain, node: &Netns, tag: &str, n: usize) -> Result<Samples> {
    let s = Mutex::new(Samples::default());
    let pods: Vec<Netns> = (0..n)
        .map(|i| Netns::new(&format!("anb{tag}-{i}")))
        .collect::<Result<_>>()?;
    let mut results = Vec::new();
    for (i, p) in pods.iter().enumerate() {
        let cid = format!("bench-{tag}-{i}");
        results.push(add(chain, p, &cid, &s));
    }
    for (i, p) in pods.iter().enumerate() {
        if let Some(r) = &results[i] {
            check(chain, p, &format!("bench-{tag}-{i}"), r, &s);
        }
    }
    for (i, p) in pods.iter().enumerate() {
        del(
            chain,
            p,
            &format!("bench-{tag}-{i}"),
            results[i].as_ref(),
            &s,
        );
    }
    drop(pods);
    wait_quiet(node);
    Ok(s.into_inner().unwrap())
}

fn parallel(chain: &Chain, node: &Netns, tag: &str, n: usize, par: usize) -> Result<Samples> {
    let s = Mutex::new(Samples::default());
    let pods: Vec<Netns> = (0..n)
        .map(|i| Netns::new(&format!("anp{tag}-{i}")))
        .collect::<Result<_>>()?;
    let results: Vec<Mutex<Option<Value>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..par {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                *results[i].lock().unwrap() = add(chain, &pods[i], &format!("par-{tag}-{i}"), &s);
            });
        }
    });
    record(&s, "ADD wall (all pods)", t0.elapsed());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for _ in 0..par {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let r = results[i].lock().unwrap().clone();
                del(chain, &pods[i], &format!("par-{tag}-{i}"), r.as_ref(), &s);
            });
        }
    });
    drop(pods);
    wait_quiet(node);
    Ok(s.into_inner().unwrap())
}

#[derive(Serialize)]
struct RunRecord {
    run: usize,
    chain: String,
    phase: String,
    samples: Samples,
}

pub fn run(args: Args) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("aliasnet-bench cni needs root (it creates network namespaces)");
    }
    let bin = aliasnet_tests::bin_dir();
    let dual = args.stack == StackArg::Dual;
    // Production-like daemon: default cooldown, a /16 pool (and a /112 in IPv6: 65536
    // addresses) so 3 runs of 250 pods never cycle.
    let fabric = Fabric::new(FabricOpts {
        nodes: 1,
        cooldown: "130s".into(),
        pool: Some(r#"cidrs = ["10.241.0.0/16"]"#.into()),
        pool6: Some(r#"cidrs = ["fd00:241::/112"]"#.into()),
        stack: if dual { Stack::Dual } else { Stack::Ipv4 },
        plugin_extra: json!({"logLevel": "info"}),
        ..Default::default()
    })?;
    let node = fabric.node(1);
    let mut ours = node.conflist.clone();
    ours["name"] = json!("bench-aliasnet");
    let mut ours_sync = ours.clone();
    ours_sync["plugins"][0]["asyncTeardown"] = json!(false);
    // The plugin's own work alone, what ptp+host-local do (they have no datapath):
    // the same plugin with the eBPF datapath switched off.
    let mut ours_plain = ours.clone();
    ours_plain["plugins"][0]["datapath"] = json!("off");
    let mut reference = json!({
        "cniVersion": "1.0.0",
        "name": "bench-ptp",
        "plugins": [{"type": "ptp", "ipMasq": false, "mtu": 1400,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.215.0.0/16", "gateway": "10.215.0.1"}]],
                     "routes": [{"dst": "0.0.0.0/0"}]}}]
    });
    if dual {
        // host-local: one range set per family, so each pod gets one address of each.
        let ipam = &mut reference["plugins"][0]["ipam"];
        ipam["ranges"]
            .as_array_mut()
            .expect("ranges")
            .push(json!([{"subnet": "fd00:215::/64", "gateway": "fd00:215::1"}]));
        ipam["routes"]
            .as_array_mut()
            .expect("routes")
            .push(json!({"dst": "::/0"}));
    }
    let families = (1, usize::from(dual));
    let chains = [
        Chain {
            label: "ptp+host-local",
            conflist: reference,
            cni_path: args.reference_dir.display().to_string(),
            families,
        },
        Chain {
            label: "aliasnet",
            conflist: ours,
            cni_path: bin.display().to_string(),
            families,
        },
        Chain {
            label: "aliasnet (sync teardown)",
            conflist: ours_sync,
            cni_path: bin.display().to_string(),
            families,
        },
        Chain {
            label: "aliasnet (datapath off)",
            conflist: ours_plain,
            cni_path: bin.display().to_string(),
            families,
        },
    ];
    let _ = std::fs::remove_dir_all("/var/lib/cni/networks/bench-ptp");

    // Enter the node netns for the rest of the process: every thread and every plugin
    // spawned from here on lives there.
    let nsf = File::open(node.ns.path()).context("open node netns")?;
    setns(&nsf, CloneFlags::CLONE_NEWNET).context("setns into the node")?;

    let mut records = Vec::new();
    for run in 1..=args.runs {
        // Alternate the order so neither chain always runs on a warmer machine.
        let mut order: Vec<(usize, &Chain)> = chains.iter().enumerate().collect();
        if run % 2 == 0 {
            order.reverse();
        }
        for (ci, c) in order {
            let tag = format!("{}r{run}c{ci}", fabric.tag);
            eprintln!("run {run}: {} sequential x{}", c.label, args.pods);
            let s = sequential(c, &node.ns, &tag, args.pods)?;
            records.push(RunRecord {
                run,
                chain: c.label.into(),
                phase: "sequential".into(),
                samples: s,
            });
            eprintln!(
                "run {run}: {} {} parallel x{}",
                c.label, args.parallel, args.parallel_pods
            );
            let s = parallel(c, &node.ns, &tag, args.parallel_pods, args.parallel)?;
            records.push(RunRecord {
                run,
                chain: c.label.into(),
                phase: format!("{}-parallel", args.parallel),
                samples: s,
            });
            if args.burst > 0 {
                eprintln!("run {run}: {} {} at once", c.label, args.burst);
                let s = parallel(c, &node.ns, &format!("{tag}b"), args.burst, args.burst)?;
                records.push(RunRecord {
                    run,
                    chain: c.label.into(),
                    phase: format!("{}-at-once", args.burst),
                    samples: s,
                });
            }
        }
    }
    let _ = std::fs::remove_dir_all("/var/lib/cni/networks/bench-ptp");

    let report = render(&records, &args);
    println!("{report}");
    if let Some(p) = &args.out {
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(p, &report)?;
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_vec_pretty(&records)?)?;
    }
    let errors: usize = records.iter().map(|r| r.samples.errors.len()).sum();
    if errors > 0 {
        for r in &records {
            for e in r.samples.errors.iter().take(3) {
                eprintln!("{} {}: {e}", r.chain, r.phase);
            }
        }
        bail!("{errors} operations failed");
    }
    Ok(())
}

/// Markdown: per chain/phase/op the median over runs of p50/p90/p99, then the ratios.
fn render(records: &[RunRecord], args: &Args) -> String {
    // (phase, op, chain) -> [(p50,p90,p99) per run]
    let mut cells: BTreeMap<(String, String, String), Vec<[f64; 3]>> = BTreeMap::new();
    for r in records {
        for (op, v) in &r.samples.ms {
            let mut s = v.clone();
            s.sort_by(|a, b| a.total_cmp(b));
            cells
                .entry((r.phase.clone(), op.clone(), r.chain.clone()))
                .or_default()
                .push([pct(&s, 50.0), pct(&s, 90.0), pct(&s, 99.0)]);
        }
    }
    let med = |v: &Vec<[f64; 3]>, i: usize| median(&mut v.iter().map(|x| x[i]).collect::<Vec<_>>());
    let mut out = String::new();
    out.push_str(&format!(
        "Medians over {} runs of each run's percentile (ms). Sequential: {} pods ADD, CHECK, DEL; parallel: {} pods, {} at a time{}. Pods: {}.\n\n",
        args.runs, args.pods, args.parallel_pods, args.parallel,
        if args.burst > 0 { format!("; burst: {} pods at once", args.burst) } else { String::new() },
        if args.stack == StackArg::Dual { "dual-stack (one IPv4 and one IPv6 address)" } else { "IPv4" }
    ));
    out.push_str("| phase | op | chain | p50 | p90 | p99 |\n|---|---|---|---|---|---|\n");
    for ((phase, op, chain), v) in &cells {
        out.push_str(&format!(
            "| {phase} | {op} | {chain} | {:.2} | {:.2} | {:.2} |\n",
            med(v, 0),
            med(v, 1),
            med(v, 2)
        ));
    }
    out.push_str("\nRatios (ptp+host-local ÷ aliasnet; higher is better for aliasnet):\n\n| phase | op | chain | p50 ratio | p99 ratio |\n|---|---|---|---|---|\n");
    for ((phase, op, chain), v) in &cells {
        if chain == "ptp+host-local" {
            continue;
        }
        if let Some(r) = cells.get(&(phase.clone(), op.clone(), "ptp+host-local".into())) {
            out.push_str(&format!(
                "| {phase} | {op} | {chain} | {:.1}× | {:.1}× |\n",
                med(r, 0) / med(v, 0),
                med(r, 2) / med(v, 2)
            ));
        }
    }
    out
}
