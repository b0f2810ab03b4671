//! One download budget for the whole cluster (docs/design/cluster-budget.md), end to end: six
//! nodes, each with its own `aliasnet-shaperd`, `aliasnet-ipamd` and pods added through the
//! real plugin, a real 3-member etcd behind the fabric's router, and a mirror host (the
//! internet's 198.51.100.10, class `mirrors`) under a 120 Mbit/s cluster budget. Every pod
//! downloads from the mirror with TCP; goodput is what the pods' sockets received.
//!
//! One test runs the phases back to back (share period 1 s, lease TTL 3 s): the start
//! (90-105 % of the budget within 3 periods, Jain >= 0.9), a node that wants less than its
//! fair share and a node whose own limit is lower, a demand shift, the leader's shaperd
//! killed and restarted by its "kubelet", one etcd member killed, then all of them, and etcd
//! back. Pods' internal traffic is not slowed meanwhile.

use std::{
    net::Ipv4Addr,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use aliasnet_ebpf::{
    abi::{self, Direction},
    Datapath,
};
use aliasnet_tests::{
    ctl::ctl_json,
    etcd::{EtcdCluster, EtcdOpts},
    fabric::{Fabric, FabricOpts, Node, Pod, INTERNET_IP2},
    metrics::{http_get, wait_metrics, SHAPERD_METRICS},
    require_root, require_tool,
    traffic::{jain, netns_exec, received_bps, transfers, IperfServer},
};

const NODES: usize = 6;
const BUDGET: f64 = 120e6;
const PERIOD: Duration = Duration::from_secs(1);
const TTL: Duration = Duration::from_secs(3);
/// The mirror host: the `mirrors` class.
const MIRROR: Ipv4Addr = INTERNET_IP2;
const MIRRORS: &str = "198.51.100.0/24";
/// How long a phase's goodput is measured.
const WINDOW: Duration = Duration::from_secs(3);

/// A TCP download from the mirror into a pod (`iperf3 -R`), for as long as it lives; `bitrate`
/// limits what the mirror sends (a pod that wants less).
struct Download {
    client: Child,
    _server: IperfServer,
}

impl Download {
    fn start(f: &Fabric, pod: &Pod, bitrate: Option<&str>) -> Self {
        let server = IperfServer::start(&f.internet.name, &MIRROR.to_string()).unwrap();
        let (addr, port) = (MIRROR.to_string(), server.port.to_string());
        let mut args = vec!["iperf3", "-c", &addr, "-p", &port, "-R", "-t", "900"];
        if let Some(b) = bitrate {
            args.extend(["-b", b]);
        }
        let client = netns_exec(&pod.ns.name, &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("iperf3 client");
        Self {
            client,
            _server: server,
        }
    }
}

impl Download {
    fn running(&mut self) -> bool {
        self.client.try_wait().is_ok_and(|s| s.is_none())
    }
}

impl Drop for Download {
    fn drop(&mut self) {
        let _ = self.client.kill();
        let _ = self.client.wait();
    }
}

/// Bytes the pod's sockets received from the mirror so far (TCP payload: goodput).
fn received(pod: &Pod) -> u64 {
    let out = netns_exec(&pod.ns.name, &["ss", "-tinH", "dst", &MIRROR.to_string()])
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("bytes_received:")?.parse::<u64>().ok())
        .sum()
}

/// One reading of every pod's received bytes, taken in parallel, each with its own time (the
/// middle of its `ss` run: a loaded machine starts them at different moments).
struct Reading {
    at: Instant,
    bytes: Vec<(Instant, u64)>,
}

fn read(pods: &[Pod]) -> Reading {
    let at = Instant::now();
    let bytes = std::thread::scope(|s| {
        let hs: Vec<_> = pods
            .iter()
            .map(|p| {
                s.spawn(|| {
                    let t = Instant::now();
                    let b = received(p);
                    (t + (Instant::now() - t) / 2, b)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    Reading { at, bytes }
}

/// Goodput of each pod between two readings, bit/s (0 where a download restarted between).
fn rates(a: &Reading, b: &Reading) -> Vec<f64> {
    a.bytes
        .iter()
        .zip(&b.bytes)
        .map(|((t0, x), (t1, y))| y.saturating_sub(*x) as f64 * 8.0 / (*t1 - *t0).as_secs_f64())
        .collect()
}

fn mbps(v: &[f64]) -> String {
    let parts: Vec<String> = v.iter().map(|b| format!("{:.1}", b / 1e6)).collect();
    format!("[{}] Mbit/s", parts.join(", "))
}

fn pct(total: f64) -> f64 {
    total / BUDGET * 100.0
}

/// Goodput of each pod over `window`, from now.
fn measure(pods: &[Pod], window: Duration) -> Vec<f64> {
    let a = read(pods);
    std::thread::sleep(window);
    rates(&a, &read(pods))
}

#[track_caller]
fn assert_in_band(what: &str, got: &[f64]) {
    let p = pct(got.iter().sum());
    assert!(
        (90.0..=105.0).contains(&p),
        "{what}: total {p:.1} % of the budget, {}",
        mbps(got)
    );
}

/// The node's policy: the mirror class under the cluster budget, `extra` in `[classes.mirrors]`.
fn policy(etcd: Option<&EtcdCluster>, prefix: &str, extra: &str) -> String {
    let mut p = format!(
        "internal_cidrs = [\"10.0.0.0/8\", \"fd00::/8\"]\n[classes.mirrors]\ncidrs = [\"{MIRRORS}\"]\n{extra}\n"
    );
    if let Some(e) = etcd {
        let list: Vec<String> = e.endpoints().iter().map(|x| format!("{x:?}")).collect();
        p = format!(
            "{p}cluster_ingress_rate = \"120M\"\n[cluster]\netcd_endpoints = [{}]\netcd_prefix = \"{prefix}\"\nshare_period = \"1s\"\nlease_ttl = \"3s\"\n",
            list.join(", ")
        );
    }
    p
}

fn set_policy(n: &Node, text: &str) {
    std::fs::write(&n.shaper_paths.config, text).unwrap();
    let d = n.shaperd.as_ref().expect("shaperd runs");
    d.signal(nix::sys::signal::Signal::SIGHUP).unwrap();
}

/// What a node's shaperd says about the budget (its metrics).
#[derive(Debug, Clone, PartialEq)]
struct View {
    leader: bool,
    mode: String,
    share_bps: u64,
    demand_bps: u64,
    /// The leader's count of nodes reporting the budget.
    cluster_nodes: Option<u64>,
}

fn view(n: &Node) -> Option<View> {
    let (_, text) = http_get(&n.ns.path(), SHAPERD_METRICS, "/metrics")?;
    let value = |name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    };
    let mode = text
        .lines()
        .filter(|l| l.starts_with("aliasnet_budget_mode{") && l.ends_with(" 1"))
        .find_map(|l| Some(l.split("mode=\"").nth(1)?.split('"').next()?.to_owned()))?;
    Some(View {
        leader: value("aliasnet_budget_leader ")? == 1.0,
        mode,
        share_bps: value("aliasnet_budget_share_bytes_per_second{")? as u64 * 8,
        demand_bps: value("aliasnet_budget_demand_bytes_per_second{")? as u64 * 8,
        cluster_nodes: value("aliasnet_budget_cluster_nodes{").map(|n| n as u64),
    })
}

/// The mirror class's download limit in force on each node (what the shares became).
struct Caps(Vec<(Datapath, usize)>);

impl Caps {
    fn new(f: &Fabric) -> Self {
        Self(
            f.nodes
                .iter()
                .map(|n| {
                    let dp = n.datapath();
                    let k = dp
                        .class_names()
                        .unwrap()
                        .iter()
                        .position(|c| c.as_deref() == Some("mirrors"))
                        .expect("the class has an index");
                    (dp, k)
                })
                .collect(),
        )
    }

    /// Node `i`'s (from 0).
    fn get(&self, i: usize) -> Option<u64> {
        let (dp, k) = &self.0[i];
        dp.entity(abi::NODE_ENTITY)
            .unwrap()
            .limits
            .get(Direction::Ingress, abi::KIND_NAMED + k)
    }

    fn all(&self) -> Vec<Option<u64>> {
        (0..self.0.len()).map(|i| self.get(i)).collect()
    }
}

/// Polls until `ok` holds for every node's view, at most `limit`; the views.
fn wait_views(f: &Fabric, limit: Duration, what: &str, ok: impl Fn(&View) -> bool) -> Vec<View> {
    let start = Instant::now();
    loop {
        let views: Vec<Option<View>> = f.nodes.iter().map(view).collect();
        if views.iter().all(|v| v.as_ref().is_some_and(&ok)) {
            return views.into_iter().map(Option::unwrap).collect();
        }
        if start.elapsed() > limit {
            let bad = views
                .iter()
                .position(|v| !v.as_ref().is_some_and(&ok))
                .unwrap();
            let log = f.nodes[bad].shaperd.as_ref().map(|d| d.log());
            let tail: Vec<&str> = log
                .as_deref()
                .unwrap_or("")
                .lines()
                .rev()
                .take(30)
                .collect();
            panic!(
                "{what}: not within {limit:?}: {views:?}\nnode {}'s shaperd:\n{}",
                bad + 1,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every node's share and demand, Mbit/s, for messages.
fn shares(f: &Fabric) -> String {
    let v: Vec<String> = f
        .nodes
        .iter()
        .map(|n| {
            view(n).map_or("-".into(), |v| {
                format!(
                    "{:.1}/{:.1} {}",
                    v.share_bps as f64 / 1e6,
                    v.demand_bps as f64 / 1e6,
                    v.mode
                )
            })
        })
        .collect();
    format!("shares/demands [{}]", v.join(", "))
}

fn leader(f: &Fabric) -> Option<usize> {
    let l: Vec<usize> = (1..=NODES)
        .filter(|i| view(f.node(*i)).is_some_and(|v| v.leader))
        .collect();
    (l.len() == 1).then(|| l[0])
}

#[test]
fn six_nodes_share_one_download_budget_through_etcd() {
    require_root();
    require_tool("iperf3", "iperf3");
    let started = Instant::now();
    let mut f = Fabric::new(FabricOpts {
        nodes: NODES,
        shaper_policy: policy(None, "", ""),
        ..Default::default()
    })
    .expect("fabric");
    let mut etcd = EtcdCluster::start(&f.vnet, EtcdOpts::default()).expect("etcd");
    let prefix = format!("/aliasnet-{}", f.tag);
    // Each daemon answers once it has installed the datapath (the verifier's seconds of CPU on
    // a loaded machine, under the pin root's lock that an ADD waits for) and handles SIGHUP.
    for n in &f.nodes {
        wait_metrics(&n.ns.path(), SHAPERD_METRICS);
    }
    let pods: Vec<Pod> = f
        .nodes
        .iter()
        .map(|n| n.add_pod_in("dl", "team", None).expect("ADD"))
        .collect();
    // The budget arrives as a policy reload: every node starts its engine.
    let with_budget = policy(Some(&etcd), &prefix, "");
    for n in &f.nodes {
        set_policy(n, &with_budget);
    }
    wait_views(
        &f,
        Duration::from_secs(20),
        "every node on the level",
        |v| v.mode == "level",
    );
    let ready = started.elapsed();
    let caps = Caps::new(&f);

    // 1. All six pull: 90-105 % of the budget within 3 periods, fairly.
    let t0 = Instant::now();
    let mut dl: Vec<Option<Download>> = pods
        .iter()
        .map(|p| Some(Download::start(&f, p, None)))
        .collect();
    let mut series = vec![read(&pods)];
    while t0.elapsed() < 3 * PERIOD + WINDOW {
        std::thread::sleep(Duration::from_millis(500));
        series.push(read(&pods));
    }
    // The first 1-s window in the band, for the record.
    let first_in_band = series.windows(3).find_map(|w| {
        let p = pct(rates(&w[0], &w[2]).iter().sum());
        (90.0..=105.0).contains(&p).then(|| w[2].at - t0)
    });
    let from = series
        .iter()
        .find(|r| r.at >= t0 + 3 * PERIOD)
        .expect("a reading 3 periods in");
    let got = rates(from, series.last().unwrap());
    eprintln!(
        "start: {} total {:.1} %, Jain {:.3}; first 1-s window in the band ends {first_in_band:?} after the start; {}",
        mbps(&got),
        pct(got.iter().sum()),
        jain(&got),
        shares(&f)
    );
    assert_in_band("from 3 periods after the start", &got);
    assert!(jain(&got) >= 0.9, "Jain {:.3}: {}", jain(&got), mbps(&got));

    // aliasnetctl budget on a node: the cluster's view from etcd and the node's from shaperd.
    let n = f.node(1);
    let config = n.shaper_paths.config.to_string_lossy().into_owned();
    let report = ctl_json(n, &["budget", "--config", &config, "--node", &n.ns.name], 0);
    let b = &report["budgets"][0];
    assert!(report["leader"].as_str().is_some(), "{report}");
    assert_eq!(b["limit_bps"], 120_000_000, "{report}");
    assert_eq!(b["nodes_counted"], NODES, "{report}");
    assert_eq!(b["nodes_reporting"], NODES, "{report}");
    assert_eq!(b["node"]["mode"], "level", "{report}");
    assert_eq!(b["node"]["share_bps"], b["level_bps"], "{report}");

    // Pods' internal traffic beside their capped downloads: not slowed.
    let internal = transfers(
        &[(
            &pods[0].ns,
            pods[1].ns.name.as_str(),
            &pods[1].ip.to_string(),
        )],
        2,
        None,
        false,
        None,
    )
    .unwrap();
    let internal = received_bps(&internal[0]);
    eprintln!(
        "internal pod to pod beside the downloads: {:.0} Mbit/s",
        internal / 1e6
    );
    assert!(
        internal > 10.0 * BUDGET / NODES as f64,
        "internal traffic slowed: {:.1} Mbit/s",
        internal / 1e6
    );

    // 2. Node 5's pod wants 10M, node 6's own limit of the class is 8M: both keep that, the
    // other four share the rest.
    dl[4] = Some(Download::start(&f, &pods[4], Some("10M")));
    set_policy(
        f.node(6),
        &policy(Some(&etcd), &prefix, "node_ingress_rate = \"8M\""),
    );
    // Node 5's bursts queue under a share of its use plus headroom: it probes once (one
    // period at the level) before its demand settles.
    std::thread::sleep(4 * PERIOD);
    let got = measure(&pods, WINDOW);
    let others = [got[0], got[1], got[2], got[3]];
    eprintln!(
        "node 5 wants 10M, node 6 limited to 8M: {} total {:.1} %, Jain of the others {:.3}; {}",
        mbps(&got),
        pct(got.iter().sum()),
        jain(&others),
        shares(&f)
    );
    assert!(got[4] >= 9e6, "node 5 kept its demand: {}", mbps(&got));
    assert!(
        (7.2e6..=8.4e6).contains(&got[5]),
        "node 6's own limit holds: {}",
        mbps(&got)
    );
    assert!(jain(&others) >= 0.9, "others: {}", mbps(&got));
    // The rest of the budget, what nodes 5 and 6 hold, goes to the other four: their
    // shares add up to it and they use 90-105 % of it.
    let held = caps.get(4).unwrap() + caps.get(5).unwrap();
    let rest = BUDGET - held as f64;
    let shared: f64 = others.iter().sum();
    let shares4: u64 = (0..4).map(|i| caps.get(i).unwrap()).sum();
    assert!(
        shares4.abs_diff(rest as u64) * 100 <= rest as u64,
        "the others' shares {shares4} are not the rest {rest}: {}",
        shares(&f)
    );
    assert!(
        (0.9..=1.05).contains(&(shared / rest)),
        "the others use {:.1} % of the rest: {}",
        shared / rest * 100.0,
        mbps(&got)
    );

    // 3. Demand shift: four nodes stop; within 3 periods the other two have the budget.
    set_policy(f.node(6), &with_budget);
    for d in &mut dl[2..] {
        *d = None;
    }
    std::thread::sleep(3 * PERIOD);
    let got = measure(&pods, WINDOW);
    eprintln!(
        "nodes 3-6 stopped: {} total {:.1} %; {}",
        mbps(&got),
        pct(got.iter().sum()),
        shares(&f)
    );
    assert_in_band("two busy nodes", &got);
    assert!(jain(&got[..2]) >= 0.9, "{}", mbps(&got));

    // A node's shaperd stopped (an upgrade): it revokes its lease, so the leader counts one
    // node less at once, and it leaves the static split applied (budget / 6), not its share.
    let stopped = Instant::now();
    f.node_mut(2).shaperd.as_mut().unwrap().stop().unwrap();
    let split = (BUDGET / NODES as f64) as u64;
    assert_eq!(caps.get(1), Some(split), "node 2 after SIGTERM");
    let counted = loop {
        let n = f.nodes.iter().filter_map(view).find(|v| v.leader);
        if let Some(n) = n
            .and_then(|v| v.cluster_nodes)
            .filter(|n| *n == NODES as u64 - 1)
        {
            break n;
        }
        assert!(
            stopped.elapsed() < 2 * PERIOD,
            "the leader still counts the stopped node: {}",
            shares(&f)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "node 2 stopped: static split {split} applied, the leader counts {counted} nodes after {:?}",
        stopped.elapsed()
    );
    f.node_mut(2).shaperd.as_mut().unwrap().respawn().unwrap();

    // 4. All six again; the leader's shaperd is killed and its kubelet restarts it a second
    // later: another node leads, the total stays within 105 % and is back in the band within
    // one TTL plus 3 periods.
    for (d, p) in dl.iter_mut().zip(&pods).skip(2) {
        *d = Some(Download::start(&f, p, None));
    }
    std::thread::sleep(3 * PERIOD);
    let got = measure(&pods, WINDOW);
    eprintln!(
        "six again: {} total {:.1} %",
        mbps(&got),
        pct(got.iter().sum())
    );
    assert_in_band("six again", &got);
    let old = leader(&f).expect("one leader");
    let killed_at = Instant::now();
    f.node_mut(old).shaperd.as_mut().unwrap().kill();
    let mut series = vec![read(&pods)];
    let mut respawned = false;
    let mut new_leader = None;
    while killed_at.elapsed() < TTL + 3 * PERIOD + Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(500));
        if !respawned && killed_at.elapsed() >= PERIOD {
            f.node_mut(old).shaperd.as_mut().unwrap().respawn().unwrap();
            respawned = true;
        }
        if new_leader.is_none() {
            new_leader = leader(&f).map(|l| (l, killed_at.elapsed()));
        }
        series.push(read(&pods));
    }
    // 2-s windows (4 readings apart), by when they end.
    let windows: Vec<(Duration, f64)> = series
        .windows(5)
        .map(|w| (w[4].at - killed_at, pct(rates(&w[0], &w[4]).iter().sum())))
        .collect();
    eprintln!(
        "leader node {old} killed: new leader {new_leader:?}; 2-s totals {:?}",
        windows
            .iter()
            .map(|(t, p)| format!("{:.1}s:{p:.1}%", t.as_secs_f64()))
            .collect::<Vec<_>>()
    );
    let (l, took) = new_leader.expect("a new leader");
    assert!(
        l != old && took <= TTL + PERIOD,
        "leader {l} after {took:?}"
    );
    for (t, p) in &windows {
        assert!(
            *p <= 105.0,
            "{p:.1} % in the 2 s before {t:?} after the kill"
        );
        if *t >= TTL + 3 * PERIOD {
            assert!(
                (90.0..=105.0).contains(p),
                "{p:.1} % in the 2 s before {t:?} after the kill"
            );
        }
    }

    // 5. One etcd member dies: no node changes its share.
    let before = caps.all();
    let a = read(&pods);
    etcd.kill(1);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(4) {
        for (i, (n, b)) in f.nodes.iter().zip(&before).enumerate() {
            let (c, v) = (caps.get(i), view(n));
            assert!(
                c.zip(*b).is_some_and(|(c, b)| c.abs_diff(b) * 10 <= b),
                "node {}: share {c:?} was {b:?}",
                n.index
            );
            assert!(
                v.as_ref()
                    .is_some_and(|v| v.mode == "level" || v.mode == "holding"),
                "node {}: {v:?}",
                n.index
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let got = rates(&a, &read(&pods));
    eprintln!(
        "one etcd member down: {} total {:.1} %, shares {before:?}",
        mbps(&got),
        pct(got.iter().sum())
    );
    assert_in_band("one etcd member down", &got);
    etcd.restart(1).unwrap();
    etcd.wait_healthy(Duration::from_secs(20)).unwrap();

    // 6. Every member dies: nodes hold their last share while their lease could live, then
    // take the static split (budget / 6); never unlimited.
    let before = caps.all();
    etcd.kill_all();
    let down = Instant::now();
    let split = (BUDGET / NODES as f64) as u64;
    let mut static_after = vec![None; NODES];
    while down.elapsed() < TTL + Duration::from_secs(2) {
        for (i, n) in f.nodes.iter().enumerate() {
            let c = caps
                .get(i)
                .unwrap_or_else(|| panic!("node {}: no limit", n.index));
            let v = view(n).expect("metrics");
            match v.mode.as_str() {
                "level" | "holding" => assert_eq!(Some(c), before[i], "node {}", n.index),
                "static" => {
                    assert_eq!(c, split, "node {}", n.index);
                    static_after
                        .get_mut(i)
                        .unwrap()
                        .get_or_insert(down.elapsed());
                }
                m => panic!("node {}: mode {m}", n.index),
            }
            assert!(
                v.mode == "static" || static_after[i].is_none(),
                "node {} left the static split",
                n.index
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!("etcd down: static split after {static_after:?}");
    for (i, t) in static_after.iter().enumerate() {
        let t = t.unwrap_or_else(|| panic!("node {} never fell back", i + 1));
        assert!(
            t <= TTL + Duration::from_millis(750),
            "node {}: {t:?}",
            i + 1
        );
    }
    let got = measure(&pods, Duration::from_secs(2));
    eprintln!(
        "static split: {} total {:.1} %",
        mbps(&got),
        pct(got.iter().sum())
    );
    assert_in_band("the static split", &got);

    // 7. etcd back: every node returns to the level.
    etcd.restart_all().unwrap();
    let back = Instant::now();
    wait_views(&f, TTL + 5 * PERIOD, "back on the level", |v| {
        v.mode == "level"
    });
    eprintln!(
        "etcd back: every node on the level after {:?}; ready after {ready:?}, whole test {:?}",
        back.elapsed(),
        started.elapsed()
    );
    // Every download ran through all of it.
    for (i, d) in dl.iter_mut().enumerate() {
        assert!(
            d.as_mut().is_some_and(Download::running),
            "node {}'s download ended",
            i + 1
        );
    }
    // The daemons stop (revoking their leases) while etcd is up.
    drop(dl);
    drop(pods);
    drop(f);
}
