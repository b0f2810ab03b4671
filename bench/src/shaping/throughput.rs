//! The `internal` and `overhead` sections: unshaped throughput with nothing attached,
//! with aliasnet's programs, and with the iptables rules they replace.

use std::{collections::BTreeMap, fmt::Write as _};

use aliasnet_ebpf::Limits;
use anyhow::{bail, Result};
use serde_json::json;

use super::{check_stop, loadavg, median, node::Bench, Args, Cc};

const IPTABLES_RULES: [[&str; 2]; 4] = [
    [
        "INPUT",
        "! -s 10.0.0.0/8 -m comment --comment iptables-exporter openai traffic=internet-in",
    ],
    [
        "FORWARD",
        "! -s 10.0.0.0/8 -m comment --comment iptables-exporter openai traffic=internet-in",
    ],
    [
        "OUTPUT",
        "! -d 10.0.0.0/8 -m comment --comment iptables-exporter openai traffic=internet-out",
    ],
    [
        "FORWARD",
        "! -d 10.0.0.0/8 -m comment --comment iptables-exporter openai traffic=internet-out",
    ],
];

fn iptables(b: &Bench, add: bool) -> Result<()> {
    if !add {
        b.exec("node", &["iptables", "-t", "mangle", "-F"])?;
        return Ok(());
    }
    for [chain, spec] in IPTABLES_RULES {
        let (before, comment) = spec.split_once("--comment ").expect("comment");
        let mut cmd = vec!["iptables", "-t", "mangle", "-A", chain];
        cmd.extend(before.split_whitespace());
        cmd.extend(["--comment", comment]);
        b.exec("node", &cmd)?;
    }
    Ok(())
}

/// Bytes the FORWARD internet-out rule counted (to check the rules saw the traffic).
fn iptables_forward_bytes(b: &Bench) -> Result<u64> {
    let out = b.exec(
        "node",
        &[
            "iptables", "-t", "mangle", "-L", "FORWARD", "-v", "-x", "-n",
        ],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter(|l| l.contains("internet-out"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum())
}

pub fn section(
    b: &mut Bench,
    args: &Args,
    title: &str,
    dst: &str,
    receiver: &str,
    variants: &[&str],
    report: &mut String,
) -> Result<()> {
    let load0 = loadavg();
    let mut res: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut skbs: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    b.set_cc_mode(Cc::Default)?;
    for rep in 0..args.throughput_reps {
        for &v in variants {
            check_stop()?;
            let mut check = String::new();
            match v {
                "nothing" => {}
                "aliasnet, no limits" => {
                    b.attach(Limits::default())?;
                }
                "aliasnet, internet egress 10 Mbit/s" => {
                    b.attach(Limits {
                        internet_egress_rate: Some(10_000_000),
                        ..Limits::default()
                    })?;
                }
                "iptables mangle (4 rules)" => iptables(b, true)?,
                other => bail!("unknown variant {other}"),
            }
            let link0 = b.net.link_packets("node", "vh1")?;
            let r = b.iperf("pod", receiver, dst, None, args.secs, None, None);
            let link1 = b.net.link_packets("node", "vh1")?;
            // skbs per second through the host veth's two hooks (veth counts skbs, not
            // segments): what the programs run on.
            let skb_rates = r.as_ref().map_or((0.0, 0.0), |r| {
                let s = r.seconds.max(1e-3);
                (
                    (link1.0 - link0.0) as f64 / s,
                    (link1.1 - link0.1) as f64 / s,
                )
            });
            skbs.entry(v).or_default().push(skb_rates);
            match v {
                "nothing" => {}
                "iptables mangle (4 rules)" => {
                    let n = iptables_forward_bytes(b)?;
                    check = format!(" (FORWARD internet-out rule counted {n} bytes)");
                    iptables(b, false)?;
                }
                _ => b.detach()?,
            }
            let r = r?;
            eprintln!(
                "rep {rep} {title}: {v:<36} {:8.1} Mbit/s{check}, host veth skbs/s in {:.0} out {:.0} [load {}]",
                r.mbps,
                skb_rates.0,
                skb_rates.1,
                loadavg()
            );
            b.record(&json!({
                "section": title, "rep": rep, "variant": v, "mbps": r.mbps, "cc": r.cc,
                "retransmits": r.retransmits, "loadavg": loadavg(),
            }));
            res.entry(v).or_default().push(r.mbps);
        }
    }
    let base = median(&res["nothing"]);
    let _ = writeln!(
        report,
        "\n### {title}\n\niperf3 TCP {} s, default congestion control, {} interleaved runs; load average {} at the start, {} at the end. \
         skbs/s: through the pod's host veth (veth counts skbs; a GSO skb is one), from the pod / to the pod.\n\n| variant | median Mbit/s | min - max | vs nothing | skbs/s from / to the pod |\n|---|---|---|---|---|",
        args.secs,
        args.throughput_reps,
        load0,
        loadavg()
    );
    for &v in variants {
        let s = &res[v];
        let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = s.iter().copied().fold(0.0, f64::max);
        let sk = &skbs[v];
        let _ = writeln!(
            report,
            "| {v} | {:.0} | {lo:.0} - {hi:.0} | {:.1} % | {:.0} / {:.0} |",
            median(s),
            100.0 * median(s) / base,
            median(&sk.iter().map(|x| x.0).collect::<Vec<_>>()),
            median(&sk.iter().map(|x| x.1).collect::<Vec<_>>()),
        );
    }
    Ok(())
}
