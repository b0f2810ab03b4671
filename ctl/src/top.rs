//! `aliasnetctl top`: live per-pod internal/internet rates, redrawn in place.

use std::{
    collections::{BTreeMap, HashMap},
    io::IsTerminal,
    time::{Duration, Instant},
};

use aliasnet_ebpf::{
    abi::{self, Class, Direction, PodCounters},
    Datapath,
};
use serde::Serialize;

use crate::{
    classes::{self, ClassLimits},
    daemons,
    output::{print, rate, si, Table},
    Global,
};

/// A named class's rates of one pod over the last interval, bit/s.
#[derive(Debug, Clone, Serialize)]
pub struct ClassRates {
    pub ingress_bps: f64,
    pub egress_bps: f64,
}

/// Rates of one pod over the last interval, bit/s (blocked, spoofed: packets/s).
#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    pub namespace: String,
    pub pod: String,
    /// The pod's addresses, IPv4 first, comma-separated.
    pub ip: String,
    pub internal_egress_bps: f64,
    pub internal_ingress_bps: f64,
    /// All internet traffic, the named classes included.
    pub internet_egress_bps: f64,
    pub internet_ingress_bps: f64,
    pub blocked_pps: f64,
    /// Sent by the pod with a source address not its own, dropped on the host veth.
    pub spoofed_pps: f64,
    /// Every named class.
    pub classes: BTreeMap<String, ClassRates>,
    /// The pod's limits in force, bit/s.
    pub limits: ClassLimits,
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

/// One pod as read at one instant.
#[derive(Debug, Clone)]
struct Sampled {
    namespace: String,
    pod: String,
    ip: String,
    counters: PodCounters,
    limits: abi::Rates,
}

/// The pods, and the named classes' names by index.
struct Sample {
    pods: HashMap<Key, Sampled>,
    names: Vec<Option<String>>,
}

fn sample(dp: &Datapath) -> anyhow::Result<Sample> {
    let pods = dp
        .pods()
        .map_err(|e| anyhow::anyhow!("reading pod records: {e}"))?;
    let names = dp
        .class_names()
        .map_err(|e| anyhow::anyhow!("reading class names: {e}"))?;
    let pods = pods
        .into_iter()
        .map(|r| {
            // Slot plus attachment key: a slot reused by another pod is not a rate.
            let s = Sampled {
                namespace: r.namespace(),
                pod: r.name(),
                ip: r.addresses(),
                counters: r.counters,
                limits: r.meta.limits,
            };
            ((r.slot, r.container_id(), r.ifname()), s)
        })
        .collect();
    Ok(Sample { pods, names })
}

fn rates(prev: &Sample, cur: &Sample, secs: f64) -> Vec<Rates> {
    let named = classes::named(&cur.names);
    let mut out = Vec::new();
    for (k, s) in &cur.pods {
        let Some(p) = prev.pods.get(k) else {
            continue;
        };
        let (c, p) = (&s.counters, &p.counters);
        let per_s = |now: u64, then: u64| now.saturating_sub(then) as f64 * 8.0 / secs;
        let bps = |d, cl| per_s(c.get(d, cl).bytes, p.get(d, cl).bytes);
        let internet = |d| per_s(c.internet(d).bytes, p.internet(d).bytes);
        let blocked = (c.get(Direction::Egress, Class::Blocked).packets
            + c.get(Direction::Ingress, Class::Blocked).packets)
            .saturating_sub(
                p.get(Direction::Egress, Class::Blocked).packets
                    + p.get(Direction::Ingress, Class::Blocked).packets,
            );
        out.push(Rates {
            namespace: s.namespace.clone(),
            pod: s.pod.clone(),
            ip: s.ip.clone(),
            internal_egress_bps: bps(Direction::Egress, Class::Internal),
            internal_ingress_bps: bps(Direction::Ingress, Class::Internal),
            internet_egress_bps: internet(Direction::Egress),
            internet_ingress_bps: internet(Direction::Ingress),
            blocked_pps: blocked as f64 / secs,
            spoofed_pps: c.spoofed.packets.saturating_sub(p.spoofed.packets) as f64 / secs,
            classes: named
                .iter()
                .map(|(cl, name)| {
                    let r = ClassRates {
                        ingress_bps: bps(Direction::Ingress, *cl),
                        egress_bps: bps(Direction::Egress, *cl),
                    };
                    (name.clone(), r)
                })
                .collect(),
            limits: ClassLimits::of(&cur.names, &s.limits),
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
        "INET LIMIT OUT>",
        "INET LIMIT IN>",
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
            rate(r.limits.get(Direction::Egress, aliasnet_ebpf::INTERNET)),
            rate(r.limits.get(Direction::Ingress, aliasnet_ebpf::INTERNET)),
            b(r.internal_egress_bps),
            b(r.internal_ingress_bps),
            format!("{:.1}", r.blocked_pps),
            format!("{:.1}", r.spoofed_pps),
        ]);
        // The named classes: their part of the internet rates, their limits.
        for (name, c) in &r.classes {
            let mut row = vec![String::new(); 10];
            row[0] = format!("  class {name}");
            row[2] = b(c.egress_bps);
            row[3] = b(c.ingress_bps);
            row[4] = rate(r.limits.get(Direction::Egress, name));
            row[5] = rate(r.limits.get(Direction::Ingress, name));
            t.row(row);
        }
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
        let mirrors = Class::Named(2).index();
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
        c1.dir[abi::DIR_INGRESS][mirrors] = Counter {
            packets: 4,
            bytes: 500,
        };
        let mut limits = abi::Rates::default();
        limits.set(Direction::Ingress, abi::KIND_NAMED + 2, Some(50_000_000));
        let k = (0, "c".to_owned(), "eth0".to_owned());
        let v = |c| Sampled {
            namespace: "ns".to_owned(),
            pod: "p".to_owned(),
            ip: "10.0.0.1".to_owned(),
            counters: c,
            limits,
        };
        let mut names = vec![None; abi::MAX_NAMED];
        names[2] = Some("mirrors".to_owned());
        let prev = Sample {
            pods: HashMap::from([(k.clone(), v(c0))]),
            names: names.clone(),
        };
        let cur = Sample {
            pods: HashMap::from([(k, v(c1)), ((1, "d".into(), "eth0".into()), v(c1))]),
            names,
        };
        let r = rates(&prev, &cur, 2.0);
        assert_eq!(
            r.len(),
            1,
            "a pod without a previous sample has no rate yet"
        );
        assert_eq!(r[0].internet_egress_bps, 8000.0);
        assert_eq!(r[0].internal_egress_bps, 0.0);
        // A named class is part of the internet, and shown on its own with its limit.
        assert_eq!(r[0].internet_ingress_bps, 2000.0);
        assert_eq!(r[0].classes["mirrors"].ingress_bps, 2000.0);
        assert_eq!(
            r[0].limits.get(Direction::Ingress, "mirrors"),
            Some(50_000_000)
        );
        let text = table(&r, 10);
        assert!(text.contains("  class mirrors"), "{text}");
        assert!(text.contains("50.0Mbit/s"), "{text}");
    }
}
