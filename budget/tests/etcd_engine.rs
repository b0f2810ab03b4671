//! The engine against a real 3-member etcd (Debian's etcd-server) behind the fabric's router,
//! with simulated nodes (real engines, fluid traffic) in a node namespace: shares converge
//! to the water level, follow demand, survive leader and etcd failures within the bounds of
//! docs/design/cluster-budget.md, and never become unlimited.
//!
//! Share period 500 ms and lease TTL 3 s keep each scenario to seconds (etcd runs with a
//! 500 ms election timeout: a member failure costs well under a TTL).

use std::time::{Duration, Instant};

use aliasnet_budget::{Budget, BudgetKey, ClusterConfig, Direction, Mode};
use aliasnet_tests::{
    budget::SimCluster,
    etcd::{EtcdCluster, EtcdOpts},
    fabric::{Fabric, FabricOpts},
    require_root,
};

const P: Duration = Duration::from_millis(500);
const TTL: Duration = Duration::from_secs(3);
const B: u64 = 120_000_000;
/// Connecting, granting a lease and the first election take a moment on a loaded machine.
const START: Duration = Duration::from_secs(3);

fn mirrors() -> BudgetKey {
    BudgetKey::new(None, "mirrors", Direction::Ingress)
}

fn budgets() -> Vec<Budget> {
    vec![Budget {
        key: mirrors(),
        rate: B,
    }]
}

fn config(endpoints: &[String], extra: &str) -> ClusterConfig {
    let list = endpoints
        .iter()
        .map(|e| format!("{e:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "etcd_endpoints = [{list}]\netcd_prefix = \"/t\"\nshare_period = \"500ms\"\nlease_ttl = \"3s\"\n{extra}"
    );
    ClusterConfig::from_table(&text.parse().unwrap()).unwrap()
}

// Field order is drop order: the engines stop (revoking their leases) before etcd and the
// namespaces go.
struct Env {
    sim: SimCluster,
    etcd: EtcdCluster,
    _fabric: Fabric,
}

fn env(opts: EtcdOpts, extra: &str) -> Env {
    require_root();
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    }
    let fabric = Fabric::new(FabricOpts {
        nodes: 1,
        start_ipamd: false,
        shaper: false,
        ..FabricOpts::default()
    })
    .expect("fabric");
    let etcd = EtcdCluster::start(&fabric.vnet, opts).expect("etcd");
    let tls = etcd.tls().map_or(String::new(), |t| {
        format!(
            "etcd_ca_file = {:?}\netcd_cert_file = {:?}\netcd_key_file = {:?}\n",
            t.ca, t.cert, t.key
        )
    });
    let cfg = config(&etcd.endpoints(), &format!("{tls}{extra}"));
    let sim = SimCluster::new(fabric.node(1).ns.path(), cfg).expect("simulation");
    Env {
        sim,
        etcd,
        _fabric: fabric,
    }
}

impl Env {
    fn start_elastic(&mut self, n: usize) {
        for i in 1..=n {
            let idx = self
                .sim
                .start(&format!("node-{i}"), &budgets(), None)
                .unwrap();
            self.sim.nodes[idx].set_want(&mirrors(), f64::INFINITY);
        }
    }

    fn report(&self) -> String {
        let mut s = String::new();
        for n in &self.sim.nodes {
            let st = n.status();
            let b = st.budgets.first();
            s += &format!(
                "{} alive={} connected={} leader={} cap={:?} rate={:.0} demand={:?} mode={:?} published={:?}\n",
                n.name,
                n.alive,
                st.connected,
                st.leader,
                n.cap(&mirrors()),
                n.rate(&mirrors()),
                b.map(|b| b.demand),
                b.map(|b| b.mode),
                b.and_then(|b| b.published.as_ref()).map(|p| (p.level, p.rev, p.nodes)),
            );
        }
        s
    }

    /// Waits until `pred` holds; the time it took. Panics with every node's state after `limit`.
    fn until(&self, what: &str, limit: Duration, pred: impl Fn(&Env) -> bool) -> Duration {
        let start = Instant::now();
        loop {
            if pred(self) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "{what}: not within {limit:?}\n{}",
                self.report()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Watches Σ caps for `d`: panics if it exceeds `bound`; the largest seen.
    fn bounded(&self, d: Duration, bound: u64) -> u64 {
        let start = Instant::now();
        let mut max = 0;
        while start.elapsed() < d {
            let t = self.sim.total_caps(&mirrors());
            assert!(
                t <= bound,
                "Σ caps {t} above {bound} at {:?}\n{}",
                start.elapsed(),
                self.report()
            );
            max = max.max(t);
            std::thread::sleep(Duration::from_millis(10));
        }
        max
    }

    /// Every node's cap, in node order.
    fn caps(&self) -> Vec<u64> {
        self.sim
            .nodes
            .iter()
            .map(|n| n.cap(&mirrors()).unwrap())
            .collect()
    }

    fn total_rate(&self) -> f64 {
        self.sim.total_rate(&mirrors())
    }

    /// Every live node runs on the published level.
    fn settled(&self) -> bool {
        self.sim.nodes.iter().filter(|n| n.alive).all(|n| {
            n.status()
                .budgets
                .first()
                .is_some_and(|b| b.mode == Mode::Level)
        })
    }

    fn in_band(&self) -> bool {
        let t = self.total_rate();
        t >= 0.9 * B as f64 && t <= 1.05 * B as f64
    }
}

/// Jain's fairness index of `x`.
fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    if q == 0.0 {
        return 0.0;
    }
    s * s / (x.len() as f64 * q)
}

fn caps_of(e: &Env, idx: std::ops::Range<usize>) -> Vec<f64> {
    idx.map(|i| e.sim.nodes[i].rate(&mirrors())).collect()
}

#[test]
fn shares_follow_demand() {
    let mut e = env(EtcdOpts::default(), "");
    e.start_elastic(6);
    let t = e.until(
        "6 busy nodes at 90-105 % of the budget, Jain ≥ 0.9",
        START + 3 * P,
        |e| e.in_band() && jain(&caps_of(e, 0..6)) >= 0.9,
    );
    eprintln!("converged in {t:?}");
    let max = e.bounded(4 * P, B * 105 / 100);
    eprintln!(
        "steady state: max Σ caps {max} ({:.1} %)",
        max as f64 / B as f64 * 100.0
    );

    // Demand shift: 4 stop pulling; the 2 others get the budget.
    for n in &e.sim.nodes[2..6] {
        n.set_want(&mirrors(), 0.0);
    }
    let t = e.until("2 busy nodes take the budget", 3 * P + P / 2, |e| {
        e.in_band()
    });
    eprintln!("demand shift in {t:?}: {:?}", caps_of(&e, 0..2));
    e.bounded(2 * P, B * 105 / 100);

    // A node that wants less than its fair share keeps what it wants; the rest is shared.
    for n in &e.sim.nodes[2..6] {
        n.set_want(&mirrors(), f64::INFINITY);
    }
    e.sim.nodes[0].set_want(&mirrors(), 10e6);
    let t = e.until("a 10M node keeps 10M, the others share", 4 * P, |e| {
        let others = caps_of(e, 1..6);
        e.sim.nodes[0].rate(&mirrors()) >= 10e6
            && e.sim.nodes[0].cap(&mirrors()).unwrap_or(B) < B / 6
            && e.in_band()
            && jain(&others) >= 0.95
            && others.iter().all(|r| *r > (B / 6) as f64)
    });
    e.bounded(2 * P, B * 105 / 100);
    let small = e.sim.nodes[0].status().budgets[0].share;
    eprintln!(
        "small demand in {t:?}: its share {small}, the others {:?}",
        caps_of(&e, 1..6)
    );
    // A node that leaves (graceful stop, its pods gone) frees its share at once.
    e.sim.nodes[5].set_want(&mirrors(), 0.0);
    e.sim.stop(5);
    let t = e.until("a leaving node's share goes to the others", TTL, |e| {
        e.in_band() && e.sim.nodes[1].cap(&mirrors()).unwrap_or(0) > (B - small) / 5 * 11 / 10
    });
    eprintln!("graceful leave freed in {t:?}");
    // A node that dies (machine gone): its lease expires; within one TTL and a period.
    e.sim.nodes[4].set_want(&mirrors(), 0.0);
    e.sim.kill(4);
    let t = e.until("a dead node's share goes to the others", TTL + 2 * P, |e| {
        e.in_band() && e.sim.nodes[1].cap(&mirrors()).unwrap_or(0) > (B - small) / 4 * 105 / 100
    });
    eprintln!("dead node freed in {t:?}");
}

#[test]
fn joining_nodes_overshoot_at_most_their_static_shares() {
    let mut e = env(EtcdOpts::default(), "");
    e.start_elastic(6);
    e.until("6 nodes converge", START + 3 * P, |e| {
        e.settled() && e.in_band()
    });
    for i in 7..=9 {
        let idx = e.sim.start(&format!("node-{i}"), &budgets(), None).unwrap();
        e.sim.nodes[idx].set_want(&mirrors(), f64::INFINITY);
    }
    // Three joins in one period: at most 3 static shares of 6 nodes over the budget.
    let max = e.bounded(3 * P, B + 3 * (B / 6));
    eprintln!(
        "churn: max Σ caps {max} ({:.1} %)",
        max as f64 / B as f64 * 100.0
    );
    e.until("9 nodes converge", 3 * P, |e| {
        e.sim.total_caps(&mirrors()) <= B * 105 / 100 && jain(&caps_of(e, 0..9)) >= 0.9
    });
    e.bounded(2 * P, B * 105 / 100);
}

#[test]
fn leader_failover_keeps_the_total() {
    let mut e = env(EtcdOpts::default(), "");
    e.start_elastic(6);
    // Converged: every node on the level (while nodes join, their joining shares may exceed
    // the budget by the churn bound, which is not this test's).
    e.until("6 nodes converge", START + 3 * P, |e| {
        e.settled() && e.in_band() && e.sim.leader().is_some()
    });
    let old = e.sim.leader().unwrap();
    // The leader's daemon dies (its datapath keeps the last caps) and its DaemonSet restarts it.
    e.sim.kill(old);
    let killed = Instant::now();
    e.bounded(P, B * 105 / 100);
    e.sim.restart(old, &budgets()).unwrap();
    let (took, max) = std::thread::scope(|s| {
        let h = s.spawn(|| e.bounded(TTL + 4 * P, B * 105 / 100));
        e.until("another node leads", TTL + P, |e| {
            e.sim.leader().is_some_and(|l| l != old)
        });
        let took = killed.elapsed();
        (took, h.join().unwrap())
    });
    eprintln!("new leader after {took:?}; max Σ caps {max}");
    assert!(took <= TTL, "takeover took {took:?}");
    e.until("back to 90-105 %", P, |e| e.in_band());
}

#[test]
fn etcd_failures_hold_then_split_never_unlimited() {
    let mut e = env(EtcdOpts::default(), "");
    e.start_elastic(6);
    e.sim.nodes[0].set_want(&mirrors(), 10e6);
    e.until("converge", START + 4 * P, |e| {
        e.settled() && e.in_band() && e.sim.nodes[0].cap(&mirrors()).unwrap_or(B) < B / 6
    });
    std::thread::sleep(2 * P);
    let before = e.caps();

    // One member down: no change.
    e.etcd.kill(1);
    let start = Instant::now();
    while start.elapsed() < TTL + 2 * P {
        for (i, n) in e.sim.nodes.iter().enumerate() {
            let c = n.cap(&mirrors()).unwrap();
            assert!(
                c.abs_diff(before[i]) <= before[i] / 20,
                "node {i}: {} -> {c}\n{}",
                before[i],
                e.report()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    e.etcd.restart(1).unwrap();
    e.etcd.wait_healthy(Duration::from_secs(10)).unwrap();

    // All members down: hold the last shares, then the static split.
    let before = e.caps();
    e.etcd.kill_all();
    let down = Instant::now();
    std::thread::sleep(TTL / 3);
    for (i, n) in e.sim.nodes.iter().enumerate() {
        assert_eq!(
            n.cap(&mirrors()).unwrap(),
            before[i],
            "node {i} held\n{}",
            e.report()
        );
    }
    e.until("every node on the static split", TTL + 2 * P, |e| {
        e.sim
            .nodes
            .iter()
            .all(|n| n.status().budgets[0].mode == Mode::Static)
    });
    eprintln!("static split {:?} after etcd went down", down.elapsed());
    for n in &e.sim.nodes {
        assert_eq!(n.cap(&mirrors()), Some(B / 6), "{}", e.report());
    }
    e.bounded(2 * P, B);

    // etcd back: the nodes rejoin with their leases and return to the level.
    e.etcd.restart_all().unwrap();
    let t = e.until("back on the level", 10 * TTL, |e| {
        e.settled() && e.in_band()
    });
    eprintln!("recovered {t:?} after etcd answered again");
    e.bounded(2 * P, B * 105 / 100);
}

#[test]
fn tls_with_client_certificates() {
    let mut e = env(
        EtcdOpts {
            tls: true,
            ..EtcdOpts::default()
        },
        "fallback_nodes = 10",
    );
    e.start_elastic(2);
    e.until("2 nodes share over TLS", START + 3 * P, |e| {
        e.settled() && e.in_band()
    });
    // A node without a client certificate is refused by etcd: never more than its static
    // share of the fallback node count.
    let mut sim = SimCluster::new(e._fabric.node(1).ns.path(), {
        let mut c = e.sim.cfg.clone();
        c.tls.as_mut().unwrap().identity = None;
        c
    })
    .unwrap();
    let i = sim.start("no-cert", &budgets(), None).unwrap();
    sim.nodes[i].set_want(&mirrors(), f64::INFINITY);
    std::thread::sleep(4 * P);
    let st = sim.nodes[i].status();
    assert!(!st.connected, "connected without a client certificate");
    assert_eq!(st.budgets[0].mode, Mode::Static);
    assert_eq!(sim.nodes[i].cap(&mirrors()), Some(B / 10));
}

/// A node whose wall clock steps (NTP, an operator) keeps its share: the engine times
/// everything on the monotonic clock and etcd times the leases. The node runs in a process of
/// its own under libfaketime, its wall clock stepped a day forward, two hours back and a year
/// forward while it shares with five others.
#[test]
fn a_wall_clock_step_changes_nothing() {
    aliasnet_tests::require_tool("faketime", "faketime");
    let lib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    assert!(
        std::path::Path::new(lib).exists(),
        "{lib} missing: apt-get install faketime"
    );
    let mut e = env(EtcdOpts::default(), "");
    e.start_elastic(5);
    let dir = e.etcd.dir().to_owned();
    let (stamp, policy) = (dir.join("faketime"), dir.join("shaper.toml"));
    std::fs::write(&stamp, "+0").unwrap();
    let list: Vec<String> = e
        .etcd
        .endpoints()
        .iter()
        .map(|x| format!("{x:?}"))
        .collect();
    std::fs::write(
        &policy,
        format!(
            "[cluster]\netcd_endpoints = [{}]\netcd_prefix = \"/t\"\nshare_period = \"500ms\"\nlease_ttl = \"3s\"\n[classes.mirrors]\ncidrs = [\"203.0.113.0/24\"]\ncluster_ingress_rate = {B}\n",
            list.join(", ")
        ),
    )
    .unwrap();
    let mut child = e
        ._fabric
        .node(1)
        .ns
        .command(aliasnet_tests::bin("aliasnet-budget-node"))
        .args(["--name", "node-6", "--policy"])
        .arg(&policy)
        .env("LD_PRELOAD", lib)
        .env("FAKETIME_TIMESTAMP_FILE", &stamp)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let guard = aliasnet_tests::ChildGuard(child);
    let last = std::sync::Arc::new(std::sync::Mutex::new(serde_json::Value::Null));
    let sink = last.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            *sink.lock().unwrap() = serde_json::from_str(&l).unwrap_or_default();
        }
    });
    // Fair: the process node's share within 5 % of a sixth, and on the level.
    let fair = |e: &Env| {
        let v = last.lock().unwrap().clone();
        let share = v["share"].as_u64().unwrap_or(0);
        let total = e.sim.total_caps(&mirrors()) + share;
        v["mode"] == "level"
            && share.abs_diff(B / 6) <= B / 6 / 20
            && e.settled()
            && total <= B * 105 / 100
    };
    e.until(
        "six nodes share, one of them in its own process",
        START + 4 * P,
        |e| fair(e),
    );
    let skew = || {
        let wall = last.lock().unwrap()["wall_unix"].as_i64().unwrap_or(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        wall - now
    };
    for (step, secs) in [("+1d", 86_400), ("-2h", -7_200), ("+365d", 365 * 86_400)] {
        std::fs::write(&stamp, step).unwrap();
        e.until(
            "the node's wall clock stepped",
            Duration::from_secs(2),
            |_| (skew() - secs).abs() < 60,
        );
        let start = Instant::now();
        while start.elapsed() < 4 * P {
            assert!(
                fair(&e),
                "after a wall clock step of {step}: {}\n{}",
                last.lock().unwrap(),
                e.report()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    drop(guard);
}
