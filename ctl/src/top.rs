//! `aliasnetctl top`: live per-pod internal/internet rates, redrawn in place.

use std::{
    collections::HashMap,
    io::IsTerminal,
    time::{Duration, Instant},
};

use aliasnet_ebpf::{
    abi::{Class, Direction, PodCounters},
    Datapath,
};
use serde::Serialize;

use crate::{
    daemons,
    output::{print, si, Table},
    Global,
};

/// Rates of one pod over the last interval, bit/s (blocked, spoofed: packets/s).
#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    pub namespace: String,
    pub pod: String,
    /// The pod's addresses, IPv4 first, comma-separated.
    pub ip: String,
    pub internal_egress_bps: f64,
    pub internal_ingress_bps: f64,
    pub internet_egress_bps: f64,
    pub internet_ingress_bps: f64,
    pub blocked_pps: f64,
    /// Sent by the pod with a source address not its own, dropped on the host veth.
    pub spoofed_pps: f64,
}

/// One refresh as emitted with `--json` (one JSON object per line).
#[derive(Debug, Serialize)]
struct Frame<'a> {
    interval_seconds: f64,
    pods: &'a [Rates],
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum SortBy {
    Internet,
    Internal,
    Total,
    Name,
}

type Key = (u32, String, String);

fn sample(dp: &Datapath) -> anyhow::Result<HashMap<Key, (String, String, String, PodCounters)>> {
    let pods = dp
        .pods()
        .map_err(|e| anyhow::anyhow!("reading pod records: {e}"))?;
    Ok(pods
        .into_iter()
        .map(|r| {
            // Slot plus attachment key: a slot reused by another pod is not a rate.
            (
                (r.slot, r.container_id(), r.ifname()),
                (r.namespace(), r.name(), r.addresses(), r.counters),
            )
        })
        .collect())
}

fn rates(
    prev: &HashMap<Key, (String, String, String, PodCounters)>,
    cur: &HashMap<Key, (String, String, String, PodCounters)>,
    secs: f64,
) -> Vec<Rates> {
    let mut out = Vec::new();
    for (k, (ns, pod, ip, c)) in cur {
        let Some((_, _, _, p)) = prev.get(k) else {
            continue;
        };
        let bps = |d, cl| c.get(d, cl).bytes.saturating_sub(p.get(d, cl).bytes) as f64 * 8.0 / secs;
        let blocked = (c.get(Direction::Egress, Class::Blocked).packets
            + c.get(Direction::Ingress, Class::Blocked).packets)
            .saturating_sub(
                p.get(Direction::Egress, Class::Blocked).packets
                    + p.get(Direction::Ingress, Class::Blocked).packets,
            );
        out.push(Rates {
            namespace: ns.clone(),
            pod: pod.clone(),
            ip: ip.clone(),
            internal_egress_bps: bps(Direction::Egress, Class::Internal),
            internal_ingress_bps: bps(Direction::Ingress, Class::Internal),
            internet_egress_bps: bps(Direction::Egress, Class::Internet),
            internet_ingress_bps: bps(Direction::Ingress, Class::Internet),
            blocked_pps: blocked as f64 / secs,
            spoofed_pps: c.spoofed.packets.saturating_sub(p.spoofed.packets) as f64 / secs,
        });
    }
    out
}

fn sort(v: &mut [Rates], by: SortBy) {
    let key = |r: &Rates| match by {
        SortBy::Internet => r.internet_egress_bps + r.internet_ingress_bps,
        SortBy::Internal => r.internal_egress_bps + r.internal_ingress_bps,
        SortBy::Total => {
            r.internet_egress_bps
                + r.internet_ingress_bps
                + r.internal_egress_bps
                + r.internal_ingress_bps
        }
        SortBy::Name => 0.0,
    };
    v.sort_by(|a, b| {
        key(b)
            .total_cmp(&key(a))
            .then_with(|| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)))
    });
}

fn table(v: &[Rates], limit: usize) -> String {
    let mut t = Table::new(&[
        "POD",
        "IP",
        "INTERNET OUT>",
        "INTERNET IN>",
        "INTERNAL OUT>",
        "INTERNAL IN>",
        "BLOCKED PKT/S>",
        "SPOOFED PKT/S>",
    ]);
    let b = |x: f64| format!("{}bit/s", si(x));
    for r in v.iter().take(limit) {
        t.row(vec![
            format!("{}/{}", r.namespace, r.pod),
            r.ip.clone(),
            b(r.internet_egress_bps),
            b(r.internet_ingress_bps),
            b(r.internal_egress_bps),
            b(r.internal_ingress_bps),
            format!("{:.1}", r.blocked_pps),
            format!("{:.1}", r.spoofed_pps),
        ]);
    }
    t.render()
}

pub struct Options {
    pub interval: Duration,
    /// `None` = until interrupted.
    pub iterations: Option<u64>,
    pub sort: SortBy,
    pub limit: usize,
}

pub fn run(g: &Global, o: &Options) -> anyhow::Result<i32> {
    if o.interval.is_zero() {
        anyhow::bail!("--interval must be greater than 0");
    }
    let dp = daemons::open_datapath(&g.pin_root)?;
    // Redraw in place only on a terminal; pipes and --json get one frame after another.
    let tty = std::io::stdout().is_terminal() && !g.json;
    let mut prev = sample(&dp)?;
    let mut at = Instant::now();
    let mut n = 0u64;
    loop {
        std::thread::sleep(o.interval);
        let cur = sample(&dp)?;
        let now = Instant::now();
        let secs = now.duration_since(at).as_secs_f64();
        let mut r = rates(&prev, &cur, secs);
        sort(&mut r, o.sort);
        if g.json {
            let mut line = serde_json::to_string(&Frame {
                interval_seconds: secs,
                pods: &r,
            })?;
            line.push('\n');
            print(&line);
        } else {
            let mut screen = String::new();
            if tty {
                // Home + clear: redraw like top(1).
                screen.push_str("\x1b[H\x1b[2J");
            }
            screen.push_str(&format!(
                "aliasnetctl top: {} pods, rates over {:.1}s, sorted by {:?} (Ctrl-C quits)\n",
                r.len(),
                secs,
                o.sort
            ));
            screen.push_str(&table(&r, o.limit));
            if !tty {
                screen.push('\n');
            }
            print(&screen);
        }
        prev = cur;
        at = now;
        n += 1;
        if o.iterations.is_some_and(|max| n >= max) {
            return Ok(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use aliasnet_ebpf::abi::Counter;

    use super::*;

    #[test]
    fn rates_follow_counter_deltas_and_skip_new_pods() {
        let mut c0 = PodCounters::default();
        c0.dir[0][1] = Counter {
            packets: 10,
            bytes: 1000,
        };
        let mut c1 = c0;
        c1.dir[0][1] = Counter {
            packets: 20,
            bytes: 3000,
        };
        let k = (0, "c".to_owned(), "eth0".to_owned());
        let v = |c| ("ns".to_owned(), "p".to_owned(), "10.0.0.1".to_owned(), c);
        let prev = HashMap::from([(k.clone(), v(c0))]);
        let cur = HashMap::from([(k, v(c1)), ((1, "d".into(), "eth0".into()), v(c1))]);
        let r = rates(&prev, &cur, 2.0);
        assert_eq!(
            r.len(),
            1,
            "a pod without a previous sample has no rate yet"
        );
        assert_eq!(r[0].internet_egress_bps, 8000.0);
        assert_eq!(r[0].internal_egress_bps, 0.0);
    }
}
