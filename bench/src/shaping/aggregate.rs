//! The `aggregates` and `classes` sections: several pods downloading under one namespace's
//! or the node's download limit, and a pod downloading from a named class and the rest of
//! the internet at once. Next to aliasnet, the nearest the reference `bandwidth` plugin can
//! do: a static share of the limit on each pod (it has neither aggregates nor destination
//! classes).
//!
//! - Namespace level: pods 0-3 of namespace `team-a` under `team-a`'s download limit, and a
//!   pod of `team-c` (no namespace limit) downloading at `--pace` at the same time: its
//!   goodput against the same download alone.
//! - Node level: pods 0-3 of two namespaces under the node's download limit, and a fifth
//!   pod's download from the internal peer at `--pace`, against the same download alone.
//! - Classes: pod 0 with an internet download limit R and a class `mirrors` (the internet
//!   host's second address) at R/4, downloading from both at once.
//!
//! Every download runs from the internet host (or the internal peer) into the pods for the
//! whole run; the pings go from pod 0 to the internet host.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use aliasnet_ebpf::Limits;
use aliasnet_tests::{
    single::pod_role,
    traffic::{
        idle_seconds, jain, netns_exec, parse_ping, received_bps, run_transfers, tcp_segments,
        Ping, Transfer,
    },
};
use anyhow::{anyhow, Result};
use serde_json::{json, Value};

use super::{
    check_stop, fmt_rate, loadavg, median,
    node::{Bench, BASE_POLICY, INTERNAL, INTERNET, MIRROR},
    Args, Cc, Config,
};

/// The pods sharing an aggregate.
const SHARERS: usize = 4;
/// The pod beside them: another namespace's (namespace level), or an internal download's
/// (node level).
const OTHER: usize = SHARERS;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Namespace,
    Node,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Aliasnet,
    /// The reference plugin's ingress limit on each pod: the limit's share, or the limit.
    Reference,
}

impl Side {
    fn all(args: &Args) -> Vec<Side> {
        let mut v = vec![Side::Aliasnet];
        if args.configs.contains(&Config::Bandwidth) {
            v.push(Side::Reference);
        }
        v
    }
}

/// One download: the pod receiving it, the sending namespace (role) and address, its pace.
struct Flow<'a> {
    pod: usize,
    from: &'a str,
    addr: &'a str,
    pace: Option<&'a str>,
}

/// What the flows of one run got.
struct Run {
    reports: Vec<Value>,
    /// Retransmitted / sent segments of the internet host's kernel, %.
    retrans_pct: f64,
    /// Pings from pod 0 to the internet host during the run, and before it.
    ping: Ping,
    idle: Ping,
}

impl Run {
    fn mbps(&self, i: usize) -> f64 {
        received_bps(&self.reports[i]) / 1e6
    }
}

/// The flows at once for `secs`, pod 0 pinging the internet host from 1.5 s to 1.5 s
/// before the end.
fn run(b: &Bench, flows: &[Flow], secs: u32, cc: Option<&str>) -> Result<Run> {
    let idle = b.idle_rtt(INTERNET)?;
    let each: Vec<Transfer> = flows
        .iter()
        .map(|f| Transfer {
            client: b.net.netns(&pod_role(f.pod)),
            server: &b.net.netns(f.from).name,
            addr: f.addr,
            pace: f.pace,
        })
        .collect();
    let inet = b.net.ns("inet");
    let before = tcp_segments(&inet)?;
    let (reports, ping) = std::thread::scope(|s| {
        let ping = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1500));
            let w = secs.saturating_sub(3).max(1).to_string();
            netns_exec(
                &b.net.ns("pod"),
                &["ping", "-n", "-q", "-i", "0.1", "-w", &w, INTERNET],
            )
            .output()
        });
        let reports = run_transfers(&each, secs, cc, true);
        let ping = ping.join().map_err(|_| anyhow!("ping thread"));
        (reports, ping)
    });
    let after = tcp_segments(&inet)?;
    let (sent, re) = (after.0 - before.0, after.1 - before.1);
    Ok(Run {
        reports: reports?,
        retrans_pct: 100.0 * re as f64 / sent.max(1) as f64,
        ping: parse_ping(&ping??.stdout),
        idle,
    })
}

#[derive(Default)]
struct AggStats {
    total_pct: Vec<f64>,
    jain: Vec<f64>,
    retrans_pct: Vec<f64>,
    zero_seconds: Vec<f64>,
    ping_above_idle: Vec<f64>,
    other_pct: Vec<f64>,
}

/// The namespace of pod `pod` at `level`.
fn namespace_of(level: Level, pod: usize) -> &'static str {
    match (level, pod) {
        (_, OTHER) => "team-c",
        (Level::Namespace, _) => "team-a",
        (Level::Node, p) if p < SHARERS / 2 => "team-a",
        (Level::Node, _) => "team-b",
    }
}

/// Sets up `side` for `level` at `rate`; pods 0..=OTHER.
fn set_up(b: &mut Bench, level: Level, side: Side, rate: u64) -> Result<()> {
    match side {
        Side::Aliasnet => {
            b.apply_policy(&match level {
                Level::Namespace => format!(
                    "{BASE_POLICY}[namespaces.team-a.internet]\nnamespace_ingress_rate = \"{rate}\"\n"
                ),
                Level::Node => format!("{BASE_POLICY}[internet]\nnode_ingress_rate = \"{rate}\"\n"),
            })?;
            for i in 0..=OTHER {
                b.attach_pod(i, namespace_of(level, i), Limits::default())?;
            }
            b.reconcile()
        }
        Side::Reference => {
            (0..SHARERS).try_for_each(|i| b.bandwidth_ingress_add(i, rate / SHARERS as u64))
        }
    }
}

fn tear_down(b: &mut Bench, side: Side, rate: u64) -> Result<()> {
    match side {
        Side::Aliasnet => {
            for i in 0..=OTHER {
                b.detach_pod(i)?;
            }
            b.apply_policy(BASE_POLICY)
        }
        Side::Reference => {
            (0..SHARERS).try_for_each(|i| b.bandwidth_ingress_del(i, rate / SHARERS as u64))
        }
    }
}

pub fn aggregates(b: &mut Bench, args: &Args, rates: &[u64], report: &mut String) -> Result<()> {
    let pace = args.pace.as_str();
    let default_cc = b.sysctl_get("pod", "net.ipv4.tcp_congestion_control")?;
    let mut stats: BTreeMap<(Level, Cc, u64, Side), AggStats> = BTreeMap::new();
    let load0 = loadavg();
    for rep in 0..args.reps {
        for &rate in rates {
            for &cc in &args.cc {
                b.set_cc_mode(cc)?;
                for level in [Level::Namespace, Level::Node] {
                    for side in Side::all(args) {
                        check_stop()?;
                        set_up(b, level, side, rate)?;
                        let other = match level {
                            Level::Namespace => Flow {
                                pod: OTHER,
                                from: "inet",
                                addr: INTERNET,
                                pace: Some(pace),
                            },
                            Level::Node => Flow {
                                pod: OTHER,
                                from: "peer",
                                addr: INTERNAL,
                                pace: Some(pace),
                            },
                        };
                        let mut flows: Vec<Flow> = (0..SHARERS)
                            .map(|pod| Flow {
                                pod,
                                from: "inet",
                                addr: INTERNET,
                                pace: None,
                            })
                            .collect();
                        flows.push(other);
                        let measured = run(b, &flows, args.secs, cc.iperf_cc()).and_then(|r| {
                            let alone = run(b, &flows[SHARERS..], args.secs, cc.iperf_cc())?;
                            Ok((r, alone))
                        });
                        tear_down(b, side, rate)?;
                        let (r, alone) = measured?;
                        let got: Vec<f64> = (0..SHARERS).map(|i| r.mbps(i)).collect();
                        let total = got.iter().sum::<f64>();
                        let conf = rate as f64 / 1e6;
                        let zero: usize = r.reports[..SHARERS].iter().map(idle_seconds).sum();
                        let other_pct = 100.0 * r.mbps(OTHER) / alone.mbps(0);
                        eprintln!(
                            "rep {rep} {level:?} {} {cc:?} {side:?}: pods {got:.1?} Mbit/s, total {:.1} % (Jain {:.3}), retrans {:.2} %, {zero} s without bytes, ping {:.2} ms (idle {:.2}), other {:.0} of {:.0} Mbit/s alone [load {}]",
                            fmt_rate(rate),
                            100.0 * total / conf,
                            jain(&got),
                            r.retrans_pct,
                            r.ping.avg,
                            r.idle.avg,
                            r.mbps(OTHER),
                            alone.mbps(0),
                            loadavg()
                        );
                        b.record(&json!({
                            "section": "aggregates", "rep": rep, "rate": rate,
                            "level": format!("{level:?}"), "cc_mode": format!("{cc:?}"),
                            "side": format!("{side:?}"), "pods_mbps": got,
                            "retrans_pct": r.retrans_pct, "zero_seconds": zero,
                            "ping_avg": r.ping.avg, "idle_avg": r.idle.avg,
                            "other_mbps": r.mbps(OTHER), "other_alone_mbps": alone.mbps(0),
                            "loadavg": loadavg(),
                        }));
                        let s = stats.entry((level, cc, rate, side)).or_default();
                        s.total_pct.push(100.0 * total / conf);
                        s.jain.push(jain(&got));
                        s.retrans_pct.push(r.retrans_pct);
                        s.zero_seconds.push(zero as f64);
                        s.ping_above_idle.push(r.ping.avg - r.idle.avg);
                        s.other_pct.push(other_pct);
                    }
                }
            }
        }
    }
    let _ = writeln!(
        report,
        "\n### Aggregate download limits: {SHARERS} pods, iperf3 TCP {} s each, medians of {} runs\n\n\
         Load average {load0} at the start, {} at the end. Namespace level: {SHARERS} pods of one namespace under its download limit; \
         the other pod is another namespace's, without a namespace limit, downloading from the internet at {pace}. Node level: \
         {SHARERS} pods of two namespaces under the node's download limit; the other pod downloads from the internal peer at {pace}. \
         \"Other\": that download's goodput against the same download alone. The reference: its ingress limit (tbf) at the limit / {SHARERS} on each of the {SHARERS} pods.\n\n\
         | level | CC | limit | config | total / limit | Jain's index | retransmits | seconds without bytes (worst run, all pods) | ping above idle ms | other: loaded / alone |\n|---|---|---|---|---|---|---|---|---|---|",
        args.secs,
        args.reps,
        loadavg()
    );
    for ((level, cc, rate, side), s) in &stats {
        let config = match side {
            Side::Aliasnet => match level {
                Level::Namespace => "aliasnet namespace limit",
                Level::Node => "aliasnet node limit",
            },
            Side::Reference => "bandwidth plugin (tbf), limit / 4 per pod",
        };
        let _ = writeln!(
            report,
            "| {} | {} | {} | {config} | {:.1} % | {:.3} | {:.2} % | {:.0} | {:.2} | {:.1} % |",
            match level {
                Level::Namespace => "namespace",
                Level::Node => "node",
            },
            cc.label(&default_cc),
            fmt_rate(*rate),
            median(&s.total_pct),
            median(&s.jain),
            median(&s.retrans_pct),
            s.zero_seconds.iter().copied().fold(0.0, f64::max),
            median(&s.ping_above_idle),
            median(&s.other_pct),
        );
    }
    Ok(())
}

#[derive(Default)]
struct ClassStats {
    class_pct: Vec<f64>,
    total_pct: Vec<f64>,
    rest_pct: Vec<f64>,
    retrans_pct: Vec<f64>,
    zero_seconds: Vec<f64>,
    ping_above_idle: Vec<f64>,
}

pub fn classes(b: &mut Bench, args: &Args, rates: &[u64], report: &mut String) -> Result<()> {
    let default_cc = b.sysctl_get("pod", "net.ipv4.tcp_congestion_control")?;
    let mut stats: BTreeMap<(Cc, u64, Side), ClassStats> = BTreeMap::new();
    let load0 = loadavg();
    for rep in 0..args.reps {
        for &rate in rates {
            let class = rate / 4;
            for &cc in &args.cc {
                b.set_cc_mode(cc)?;
                for side in Side::all(args) {
                    check_stop()?;
                    match side {
                        Side::Aliasnet => {
                            b.apply_policy(&format!(
                                "{BASE_POLICY}[internet]\npod_ingress_rate = \"{rate}\"\n\
                                 [classes.mirrors]\ncidrs = [\"{MIRROR}/32\"]\npod_ingress_rate = \"{class}\"\n"
                            ))?;
                            b.attach(Limits::default())?;
                        }
                        Side::Reference => b.bandwidth_ingress_add(0, rate)?,
                    }
                    let flows = [INTERNET, MIRROR].map(|addr| Flow {
                        pod: 0,
                        from: "inet",
                        addr,
                        pace: None,
                    });
                    let r = run(b, &flows, args.secs, cc.iperf_cc());
                    match side {
                        Side::Aliasnet => {
                            b.detach()?;
                            b.apply_policy(BASE_POLICY)?;
                        }
                        Side::Reference => b.bandwidth_ingress_del(0, rate)?,
                    }
                    let r = r?;
                    let (plain, named) = (r.mbps(0), r.mbps(1));
                    let conf = rate as f64 / 1e6;
                    let zero: usize = r.reports.iter().map(idle_seconds).sum();
                    eprintln!(
                        "rep {rep} class {} {cc:?} {side:?}: internet {plain:.1} + class {named:.1} Mbit/s ({:.1} % of the class limit, total {:.1} %), retrans {:.2} %, {zero} s without bytes, ping {:.2} ms (idle {:.2}) [load {}]",
                        fmt_rate(rate),
                        100.0 * named / (conf / 4.0),
                        100.0 * (plain + named) / conf,
                        r.retrans_pct,
                        r.ping.avg,
                        r.idle.avg,
                        loadavg()
                    );
                    b.record(&json!({
                        "section": "classes", "rep": rep, "rate": rate, "class_rate": class,
                        "cc_mode": format!("{cc:?}"), "side": format!("{side:?}"),
                        "internet_mbps": plain, "class_mbps": named,
                        "retrans_pct": r.retrans_pct, "zero_seconds": zero,
                        "ping_avg": r.ping.avg, "idle_avg": r.idle.avg, "loadavg": loadavg(),
                    }));
                    let s = stats.entry((cc, rate, side)).or_default();
                    s.class_pct.push(100.0 * named / (conf / 4.0));
                    s.total_pct.push(100.0 * (plain + named) / conf);
                    s.rest_pct.push(100.0 * plain / (conf * 0.75));
                    s.retrans_pct.push(r.retrans_pct);
                    s.zero_seconds.push(zero as f64);
                    s.ping_above_idle.push(r.ping.avg - r.idle.avg);
                }
            }
        }
    }
    let _ = writeln!(
        report,
        "\n### A named class and the rest of the internet at once: iperf3 TCP {} s, two downloads into one pod, medians of {} runs\n\n\
         Load average {load0} at the start, {} at the end. aliasnet: `[internet] pod_ingress_rate` = the limit, `[classes.mirrors] pod_ingress_rate` = a quarter of it. \
         The reference: its ingress limit (tbf) at the internet limit (it has no classes).\n\n\
         | CC | internet limit | config | class / class limit | internet total / internet limit | rest / (internet − class limit) | retransmits | seconds without bytes (worst run) | ping above idle ms |\n|---|---|---|---|---|---|---|---|---|",
        args.secs,
        args.reps,
        loadavg()
    );
    for ((cc, rate, side), s) in &stats {
        let config = match side {
            Side::Aliasnet => "aliasnet internet + class limits",
            Side::Reference => "bandwidth plugin (tbf), internet limit",
        };
        let _ = writeln!(
            report,
            "| {} | {} | {config} | {:.1} % | {:.1} % | {:.1} % | {:.2} % | {:.0} | {:.2} |",
            cc.label(&default_cc),
            fmt_rate(*rate),
            median(&s.class_pct),
            median(&s.total_pct),
            median(&s.rest_pct),
            median(&s.retrans_pct),
            s.zero_seconds.iter().copied().fold(0.0, f64::max),
            median(&s.ping_above_idle),
        );
    }
    Ok(())
}
