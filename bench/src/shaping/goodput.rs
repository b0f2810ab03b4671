//! The `shaping` and `parallel` sections: goodput, latency under load, retransmits and
//! fairness of each configuration at each rate; with `--internal-download`, a download from
//! the internal peer into the pod beside every download from the internet.

use std::{collections::BTreeMap, fmt::Write as _, time::Instant};

use aliasnet_ebpf::Limits;
use anyhow::{anyhow, Context, Result};
use serde_json::json;

use super::{
    check_stop, fmt_rate, loadavg, median,
    node::{Bench, Iperf, BASE_POLICY, INTERNAL, INTERNET, POD_IP},
    Args, Cc, Config, Dir,
};
use aliasnet_tests::traffic::{received_bps, run_transfers, Ping, Transfer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct ShapeKey {
    cc: Cc,
    rate: u64,
    dir: Dir,
    config: Config,
}

/// One shaping run.
struct Sample {
    iperf: Iperf,
    /// L2 rate through the shaping qdisc (its byte counter), Mbit/s.
    l2_mbps: f64,
    /// Drops counted by the shaping qdisc (drop-tail).
    qdisc_drops: u64,
    /// CE marks and pod-side drops by the programs' queue model.
    ce: u64,
    aqm_drops: u64,
    /// Dropped by the host veth's backstop of the egress limits (none while the pod's HTB
    /// shapes).
    policed: u64,
    idle: Ping,
    /// The concurrent internal download's goodput, Mbit/s.
    internal_mbps: Option<f64>,
}

#[derive(Debug, Clone, Default)]
struct ShapeStats {
    goodput_pct: Vec<f64>,
    first_pct: Vec<f64>,
    zero_seconds: Vec<f64>,
    ping_above_idle: Vec<f64>,
    internal_mbps: Vec<f64>,
    l2_pct: Vec<f64>,
    retrans_pct: Vec<f64>,
    ping_avg: Vec<f64>,
    ping_max: Vec<f64>,
    ping_replies: Vec<f64>,
    ping_sent: Vec<f64>,
    flow_rtt: Vec<f64>,
    idle_avg: Vec<f64>,
    qdisc_drops: Vec<f64>,
    ce: Vec<f64>,
    aqm_drops: Vec<f64>,
    policed: Vec<f64>,
    cc: String,
}

fn applies(config: Config, dir: Dir) -> bool {
    match config {
        Config::AliasnetInternet => dir == Dir::Egress,
        Config::AliasnetDownload => dir == Dir::Ingress,
        _ => true,
    }
}

/// A download from the internal peer into the pod, paced at `pace`, for `secs`: Mbit/s.
fn internal_download(b: &Bench, pace: &str, secs: u32, cc: Option<&str>) -> Result<f64> {
    let t = Transfer {
        client: b.net.netns("pod"),
        server: &b.net.netns("peer").name,
        addr: INTERNAL,
        pace: Some(pace),
    };
    let v = run_transfers(&[t], secs, cc, true)?;
    Ok(received_bps(&v[0]) / 1e6)
}

/// Seconds the ping runs: every 0.1 s from 1.5 s to 1.5 s before the end.
fn pings_expected(secs: u32) -> u32 {
    secs.saturating_sub(3).max(1)
}

fn shaping_run(
    b: &mut Bench,
    key: ShapeKey,
    secs: u32,
    internal_pace: Option<&str>,
) -> Result<Sample> {
    let rate = key.rate;
    let mut slot = None;
    match key.config {
        Config::Aliasnet
        | Config::AliasnetAqmOff
        | Config::AliasnetFlowsOff
        | Config::AliasnetClampOff => {
            b.set_features(Some(key.config))?;
            let a = b.attach(Limits {
                ingress_rate: Some(rate),
                egress_rate: Some(rate),
                ..Limits::default()
            })?;
            slot = Some(a.slot);
        }
        Config::AliasnetInternet => {
            b.set_features(None)?;
            let a = b.attach(Limits {
                internet_egress_rate: Some(rate),
                ..Limits::default()
            })?;
            slot = Some(a.slot);
        }
        Config::AliasnetDownload => {
            b.set_features(None)?;
            b.apply_policy(&format!(
                "{BASE_POLICY}[internet]\npod_ingress_rate = \"{rate}\"\n"
            ))?;
            let a = b.attach(Limits::default())?;
            slot = Some(a.slot);
        }
        Config::Bandwidth => b.bandwidth_add(rate)?,
    }
    let result = (|| {
        let (role, dev) = match (key.config, key.dir) {
            (Config::Bandwidth, Dir::Egress) => ("node", b.ifb.clone().expect("ifb")),
            (_, Dir::Egress) => ("pod", "eth0".to_owned()),
            (_, Dir::Ingress) => ("node", "vh1".to_owned()),
        };
        let idle = b.idle_rtt(INTERNET)?;
        let (bytes0, drops0) = b.net.qdisc_counters(role, &dev)?;
        let aqm0 = slot
            .map(|s| b.aqm_counters(s))
            .transpose()?
            .unwrap_or_default();
        let bench: &Bench = b;
        let run = || match key.dir {
            Dir::Egress => bench.iperf(
                "pod",
                "inet",
                INTERNET,
                None,
                secs,
                key.cc.iperf_cc(),
                Some(INTERNET),
            ),
            Dir::Ingress => bench.iperf(
                "inet",
                "pod",
                POD_IP,
                Some(INTERNET),
                secs,
                key.cc.iperf_cc(),
                Some(INTERNET),
            ),
        };
        // The internal download beside the download from the internet, both for the
        // whole run.
        let (iperf, internal_mbps) = match internal_pace.filter(|_| key.dir == Dir::Ingress) {
            Some(pace) => std::thread::scope(|s| {
                let internal = s.spawn(|| internal_download(bench, pace, secs, key.cc.iperf_cc()));
                let iperf = run();
                let internal = internal
                    .join()
                    .map_err(|_| anyhow!("internal download thread"))?;
                Ok::<_, anyhow::Error>((iperf?, Some(internal?)))
            })?,
            None => (run()?, None),
        };
        let (bytes1, drops1) = b.net.qdisc_counters(role, &dev)?;
        let aqm1 = slot
            .map(|s| b.aqm_counters(s))
            .transpose()?
            .unwrap_or_default();
        Ok(Sample {
            // The root qdisc counts the internal download too: no L2 figure then.
            l2_mbps: if internal_mbps.is_some() {
                f64::NAN
            } else {
                (bytes1 - bytes0) as f64 * 8.0 / iperf.seconds.max(1e-3) / 1e6
            },
            qdisc_drops: drops1 - drops0,
            ce: aqm1.0 - aqm0.0,
            aqm_drops: aqm1.1 - aqm0.1,
            policed: aqm1.2 - aqm0.2,
            iperf,
            idle,
            internal_mbps,
        })
    })();
    match key.config {
        Config::Bandwidth => b.bandwidth_del(rate)?,
        _ => {
            b.detach()?;
            b.set_features(None)?;
            if key.config == Config::AliasnetDownload {
                b.apply_policy(BASE_POLICY)?;
            }
        }
    }
    result
}

pub fn shaping(b: &mut Bench, args: &Args, rates: &[u64], report: &mut String) -> Result<()> {
    let mut stats: BTreeMap<ShapeKey, ShapeStats> = BTreeMap::new();
    let load0 = loadavg();
    let started = Instant::now();
    let expected = pings_expected(args.secs);
    let pace = Some(args.pace.as_str())
        .filter(|_| args.internal_download && args.dirs.contains(&Dir::Ingress));
    // The internal download alone with nothing attached, by congestion control.
    let mut unshaped: BTreeMap<Cc, Vec<f64>> = BTreeMap::new();
    for rep in 0..args.reps {
        // The internal download alone, once per repetition and congestion control.
        for &cc in args.cc.iter() {
            let Some(pace) = pace else { break };
            check_stop()?;
            b.set_cc_mode(cc)?;
            let mbps = internal_download(b, pace, args.secs, cc.iperf_cc())?;
            eprintln!(
                "rep {rep} {cc:?} internal download alone, nothing attached: {mbps:.0} Mbit/s"
            );
            b.record(&json!({
                "section": "shaping", "rep": rep, "cc_mode": format!("{cc:?}"),
                "config": "unshaped internal download", "goodput_mbps": mbps,
                "loadavg": loadavg(),
            }));
            unshaped.entry(cc).or_default().push(mbps);
        }
        for &rate in rates {
            for &cc in &args.cc {
                b.set_cc_mode(cc)?;
                for &config in &args.configs {
                    for &dir in &args.dirs {
                        if !applies(config, dir) {
                            continue;
                        }
                        check_stop()?;
                        let key = ShapeKey {
                            cc,
                            rate,
                            dir,
                            config,
                        };
                        let x = shaping_run(b, key, args.secs, pace)
                            .with_context(|| format!("{key:?}"))?;
                        let r = &x.iperf;
                        let conf = rate as f64 / 1e6;
                        let ping = r.ping.unwrap_or_default();
                        let seconds = &r.receiver_intervals;
                        let first = seconds.first().copied().unwrap_or(0.0);
                        let zero = seconds.iter().filter(|m| **m == 0.0).count();
                        eprintln!(
                            "rep {rep} {:>9} {:?}/{:?} {:<26} goodput {:7.2} ({:5.1}%, first s {:5.1}%, {zero} s without bytes) L2 {:5.1}% retrans {:5.2}% ping {:6.2}/{:6.2} ms (idle {:.2}) {:2}/{} internal {:?} Mbit/s flow rtt {:5.1} qdisc drops {} ce {} aqm drops {} policed {} [load {}]",
                            fmt_rate(rate),
                            cc,
                            dir,
                            config.name(),
                            r.mbps,
                            100.0 * r.mbps / conf,
                            100.0 * first / conf,
                            100.0 * x.l2_mbps / conf,
                            r.retrans_pct(),
                            ping.avg,
                            ping.max,
                            x.idle.avg,
                            ping.received,
                            ping.sent,
                            x.internal_mbps,
                            r.flow_rtt,
                            x.qdisc_drops,
                            x.ce,
                            x.aqm_drops,
                            x.policed,
                            loadavg()
                        );
                        b.record(&json!({
                            "section": "shaping", "rep": rep, "rate": rate,
                            "cc_mode": format!("{cc:?}"), "cc": r.cc, "dir": format!("{dir:?}"),
                            "config": config.name(), "goodput_mbps": r.mbps,
                            "l2_mbps": x.l2_mbps, "seconds": r.seconds,
                            "retransmits": r.retransmits, "segments": r.segments,
                            "ping_avg": ping.avg, "ping_max": ping.max,
                            "ping_received": ping.received, "ping_sent": ping.sent,
                            "idle_avg": x.idle.avg, "flow_rtt_ms": r.flow_rtt,
                            "qdisc_drops": x.qdisc_drops, "ce_marked": x.ce,
                            "aqm_drops": x.aqm_drops, "policed": x.policed,
                            "intervals": r.intervals,
                            "receiver_intervals": seconds,
                            "internal_mbps": x.internal_mbps,
                            "loadavg": loadavg(),
                        }));
                        let s = stats.entry(key).or_default();
                        s.goodput_pct.push(100.0 * r.mbps / conf);
                        s.first_pct.push(100.0 * first / conf);
                        s.zero_seconds.push(zero as f64);
                        s.ping_above_idle.push(ping.avg - x.idle.avg);
                        s.internal_mbps.extend(x.internal_mbps);
                        s.l2_pct.push(100.0 * x.l2_mbps / conf);
                        s.retrans_pct.push(r.retrans_pct());
                        s.ping_avg.push(ping.avg);
                        s.ping_max.push(ping.max);
                        s.ping_replies.push(f64::from(ping.received));
                        s.ping_sent.push(f64::from(ping.sent));
                        s.flow_rtt.push(r.flow_rtt);
                        s.idle_avg.push(x.idle.avg);
                        s.qdisc_drops.push(x.qdisc_drops as f64);
                        s.ce.push(x.ce as f64);
                        s.aqm_drops.push(x.aqm_drops as f64);
                        s.policed.push(x.policed as f64);
                        s.cc.clone_from(&r.cc);
                    }
                }
            }
        }
    }
    let _ = writeln!(
        report,
        "\n### Shaping: iperf3 TCP {} s, one stream, medians of {} runs\n\nLoad average {} at the start, {} at the end; {:.0} min. Ping: every 0.1 s from the pod to the \
         remote host for {expected} s of the run (replies of the requests ping sent; a request refused locally with ENOBUFS is not sent); idle RTT {:.2} ms (median). \
         Flow RTT: the sender's mean smoothed RTT of the iperf3 flow.\n",
        args.secs,
        args.reps,
        load0,
        loadavg(),
        started.elapsed().as_secs_f64() / 60.0,
        median(&stats.values().flat_map(|s| s.idle_avg.iter().copied()).collect::<Vec<_>>()),
    );
    if let Some(pace) = pace {
        let _ = writeln!(
            report,
            "Internal download: from the internal peer into the pod, paced at {pace} (iperf3 -b), for the whole run of every download from the internet; \
             its goodput against the same download with nothing attached ({} runs, median {:.0} Mbit/s). L2 is not given with it (the root qdisc counts both).\n",
            unshaped.values().map(Vec::len).sum::<usize>(),
            median(&unshaped.values().flatten().copied().collect::<Vec<_>>()),
        );
    }
    let _ = writeln!(
        report,
        "| CC | rate | direction | config | goodput / configured | first second / configured | seconds without bytes (worst run) | L2 / configured | retransmits | ping avg / max ms | ping above idle ms | ping replies / sent | flow RTT ms | qdisc drops | CE marks | pod-side drops | host veth policed | internal download / unshaped |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let pct = |v: f64| {
        if v.is_nan() {
            "-".to_owned()
        } else {
            format!("{v:.1} %")
        }
    };
    for (k, s) in &stats {
        let dir = match k.dir {
            Dir::Egress => "pod → internet",
            Dir::Ingress => "internet → pod",
        };
        let internal = match unshaped.get(&k.cc) {
            Some(base) if !s.internal_mbps.is_empty() => {
                pct(100.0 * median(&s.internal_mbps) / median(base))
            }
            _ => "-".to_owned(),
        };
        let _ = writeln!(
            report,
            "| {} | {} | {dir} | {} | {:.1} % | {:.1} % | {:.0} | {} | {:.2} % | {:.2} / {:.2} | {:.2} | {:.0} / {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {internal} |",
            k.cc.label(&s.cc),
            fmt_rate(k.rate),
            k.config.name(),
            median(&s.goodput_pct),
            median(&s.first_pct),
            s.zero_seconds.iter().copied().fold(0.0, f64::max),
            pct(median(&s.l2_pct)),
            median(&s.retrans_pct),
            median(&s.ping_avg),
            median(&s.ping_max),
            median(&s.ping_above_idle),
            median(&s.ping_replies),
            median(&s.ping_sent),
            median(&s.flow_rtt),
            median(&s.qdisc_drops),
            median(&s.ce),
            median(&s.aqm_drops),
            median(&s.policed),
        );
    }
    Ok(())
}

pub fn parallel(b: &mut Bench, args: &Args, rate: u64, report: &mut String) -> Result<()> {
    #[derive(Default)]
    struct Row {
        goodput_pct: Vec<f64>,
        retrans_pct: Vec<f64>,
        slowest_pct: Vec<f64>,
        fastest_pct: Vec<f64>,
        qdisc_drops: Vec<f64>,
        ping_avg: Vec<f64>,
    }
    let configs: Vec<Config> = [Config::Aliasnet, Config::Bandwidth]
        .into_iter()
        .filter(|c| args.configs.contains(c))
        .collect();
    let mut rows: BTreeMap<(u32, Config), Row> = BTreeMap::new();
    let load0 = loadavg();
    b.set_cc_mode(Cc::Default)?;
    for rep in 0..args.reps {
        for &n in &args.streams {
            for &config in &configs {
                check_stop()?;
                b.streams = n.max(1);
                let key = ShapeKey {
                    cc: Cc::Default,
                    rate,
                    dir: Dir::Ingress,
                    config,
                };
                let x = shaping_run(b, key, args.secs, None);
                b.streams = 1;
                let x = x.with_context(|| format!("{n} streams, {key:?}"))?;
                let r = &x.iperf;
                let conf = rate as f64 / 1e6;
                // Each stream against a fair share of the configured rate.
                let fair = conf / f64::from(n.max(1));
                let slowest = r.stream_mbps.iter().copied().fold(f64::INFINITY, f64::min);
                let fastest = r.stream_mbps.iter().copied().fold(0.0, f64::max);
                let ping = r.ping.unwrap_or_default();
                eprintln!(
                    "rep {rep} {n:>2} streams {:<24} goodput {:5.1}% retrans {:5.2}% streams {:5.1}-{:5.1}% of fair, qdisc drops {} ping {:.2} ms [load {}]",
                    config.name(),
                    100.0 * r.mbps / conf,
                    r.retrans_pct(),
                    100.0 * slowest / fair,
                    100.0 * fastest / fair,
                    x.qdisc_drops,
                    ping.avg,
                    loadavg()
                );
                b.record(&json!({
                    "section": "parallel", "rep": rep, "rate": rate, "streams": n,
                    "config": config.name(), "cc": r.cc, "goodput_mbps": r.mbps,
                    "retransmits": r.retransmits, "segments": r.segments,
                    "stream_mbps": r.stream_mbps, "qdisc_drops": x.qdisc_drops,
                    "ping_avg": ping.avg, "loadavg": loadavg(),
                }));
                let row = rows.entry((n, config)).or_default();
                row.goodput_pct.push(100.0 * r.mbps / conf);
                row.retrans_pct.push(r.retrans_pct());
                row.slowest_pct.push(100.0 * slowest / fair);
                row.fastest_pct.push(100.0 * fastest / fair);
                row.qdisc_drops.push(x.qdisc_drops as f64);
                row.ping_avg.push(ping.avg);
            }
        }
    }
    let _ = writeln!(
        report,
        "\n### Parallel downloads into the pod: iperf3 -P N, {} s, bbr, {} ingress limit, medians of {} runs\n\nLoad average {} at the start, {} at the end. Streams: the slowest and the fastest stream's goodput against a fair share (configured / N).\n\n| streams | config | goodput / configured | retransmits | slowest / fastest stream, % of fair | qdisc drops | ping avg ms |\n|---|---|---|---|---|---|---|",
        args.secs,
        fmt_rate(rate),
        args.reps,
        load0,
        loadavg()
    );
    for ((n, config), r) in &rows {
        let _ = writeln!(
            report,
            "| {n} | {} | {:.1} % | {:.2} % | {:.0} / {:.0} | {:.0} | {:.2} |",
            config.name(),
            median(&r.goodput_pct),
            median(&r.retrans_pct),
            median(&r.slowest_pct),
            median(&r.fastest_pct),
            median(&r.qdisc_drops),
            median(&r.ping_avg),
        );
    }
    Ok(())
}
