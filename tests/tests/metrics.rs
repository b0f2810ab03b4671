//! The metrics pipeline end to end: aliasnet-shaperd's and aliasnet-ipamd's `/metrics` on a
//! fabric node, scraped by a real (Debian) Prometheus running in the node's netns, with
//! traffic, leases and CNI operations of known size; the dashboard's and the rules' PromQL
//! evaluated against it.
//!
//! Everything runs inside namespaces the fabric creates: Prometheus listens on the node
//! netns' loopback, and this process talks to it from a thread that entered that netns.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::File,
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use aliasnet_tests::{
    cni::Invocation,
    fabric::{Fabric, FabricOpts, Node, Pod, DEFAULT_POLICY, INTERNET_IP, INTERNET_IP2},
    netns::Netns,
    require_root, require_tool,
};
use serde_json::Value;

const IPAMD_METRICS: &str = "127.0.0.1:9545";
const SHAPERD_METRICS: &str = "127.0.0.1:9546";

// ---------------------------------------------------------------------------------------
// Helpers: tools, netns-local HTTP, Prometheus.

/// Runs `f` on a thread inside the network namespace `ns`; sockets it opens stay there.
fn in_netns<T: Send>(ns: &Path, f: impl FnOnce() -> T + Send) -> T {
    aliasnet_netns::run_in(ns, f).unwrap_or_else(|e| panic!("run in {}: {e}", ns.display()))
}

/// One raw HTTP/1.0 exchange with `addr` inside `ns`: (status, body). `None` when nothing
/// listens (yet).
fn http_raw(ns: &Path, addr: &str, request: &[u8]) -> Option<(u16, String)> {
    let addr: SocketAddr = addr.parse().expect("socket address");
    let request = request.to_vec();
    in_netns(ns, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
        s.write_all(&request).ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    })
}

fn http_get(ns: &Path, addr: &str, path: &str) -> Option<(u16, String)> {
    http_raw(
        ns,
        addr,
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
}

/// Polls `addr/metrics` in `ns` until it answers 200.
fn wait_metrics(ns: &Path, addr: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some((200, body)) = http_get(ns, addr, "/metrics") {
            return body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no metrics at {addr} after 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `promtool check metrics` on `text`: exit code and output.
fn promtool_check_metrics(text: &str) -> (i32, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A free TCP port on the loopback of `ns`.
fn free_port(ns: &Path) -> u16 {
    in_netns(ns, || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind loopback")
            .local_addr()
            .expect("local addr")
            .port()
    })
}

/// Debian's Prometheus in a node's netns, stopped (SIGTERM) on drop.
struct Prometheus {
    child: Option<Child>,
    ns: PathBuf,
    addr: String,
    dir: tempfile::TempDir,
}

fn rules_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../install/monitoring/aliasnet-rules.yml")
}

fn dashboard_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../install/monitoring/aliasnet-dashboard.json")
}

impl Prometheus {
    fn start(ns: &Netns) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("aliasnet-prometheus-")
            .tempdir()
            .expect("tempdir");
        let config = format!(
            r#"global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  - job_name: aliasnet-ipamd
    static_configs:
      - targets: ['{IPAMD_METRICS}']
  - job_name: aliasnet-shaperd
    static_configs:
      - targets: ['{SHAPERD_METRICS}']
"#,
            rules = rules_file().canonicalize().expect("rules file").display()
        );
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(&cfg, config).expect("write prometheus.yml");
        let out = Command::new("promtool")
            .args(["check", "config"])
            .arg(&cfg)
            .output()
            .expect("promtool check config");
        assert!(
            out.status.success(),
            "promtool check config: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port(&ns.path());
        let addr = format!("127.0.0.1:{port}");
        let log = File::create(dir.path().join("prometheus.log")).expect("log");
        let child = ns
            .command("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let p = Self {
            child: Some(child),
            ns: ns.path(),
            addr,
            dir,
        };
        let start = Instant::now();
        while !matches!(http_get(&p.ns, &p.addr, "/-/ready"), Some((200, _))) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "prometheus not ready after 30 s; log:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(&self.ns, &self.addr, path)
            .unwrap_or_else(|| panic!("prometheus unreachable for {path}"));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path}: HTTP {status}, not JSON ({e}): {body}"));
        v
    }

    /// An instant query; panics on a PromQL error (a broken expression must fail the test).
    fn query(&self, expr: &str) -> Vec<Value> {
        let v = self.api(&format!("/api/v1/query?query={}", urlencode(expr)));
        assert_eq!(v["status"], "success", "query {expr:?} failed: {v}");
        match v["data"]["resultType"].as_str() {
            Some("vector" | "matrix") => {
                v["data"]["result"].as_array().cloned().unwrap_or_default()
            }
            // A scalar or string always "has data".
            _ => vec![v["data"]["result"].clone()],
        }
    }

    /// The single value of `expr`, if it returns exactly one series.
    fn value(&self, expr: &str) -> Option<f64> {
        let r = self.query(expr);
        match r.as_slice() {
            [one] => one["value"][1].as_str().and_then(|s| s.parse().ok()),
            _ => None,
        }
    }

    /// Polls until `expr` has the value `want`.
    #[track_caller]
    fn wait_value(&self, expr: &str, want: f64, timeout: Duration) {
        let start = Instant::now();
        loop {
            let got = self.value(expr);
            if got == Some(want) {
                return;
            }
            if start.elapsed() > timeout {
                panic!(
                    "{expr} = {got:?} after {timeout:?}, want {want}; full result: {:?}",
                    self.query(expr)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Polls until `expr` returns data.
    #[track_caller]
    fn wait_data(&self, expr: &str, timeout: Duration) -> Vec<Value> {
        self.wait_data_ctx(expr, timeout, "")
    }

    /// As `wait_data`, with `context` in the failure message.
    #[track_caller]
    fn wait_data_ctx(&self, expr: &str, timeout: Duration, context: &str) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let r = self.query(expr);
            if !r.is_empty() {
                return r;
            }
            assert!(
                start.elapsed() < timeout,
                "{expr} returned no data within {timeout:?}; {context}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let start = Instant::now();
            while matches!(c.try_wait(), Ok(None)) {
                if start.elapsed() > Duration::from_secs(10) {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.wait();
        }
    }
}

/// Every `expr` string in the dashboard JSON (panel targets, nested rows included).
fn dashboard_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

/// Grafana variables as the dashboard's "All" selection and a rate window.
fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$instance", ".*")
        .replace("$namespace", ".*")
}

/// A pod on `node` through the real plugin; `Err` carries the failed outcome.
fn try_add(
    node: &Node,
    f: &Fabric,
    name: &str,
) -> Result<Pod, (Netns, aliasnet_tests::cni::Outcome)> {
    let ns = Netns::new(&format!("an{}-n{}-{name}", f.tag, node.index)).expect("pod netns");
    let cid = format!("cid-{}-{name}", f.tag);
    let inv =
        Invocation::new("ADD", &cid, Some(&ns.path()), "eth0").args(&Node::k8s_args(name, &cid));
    let out = node.cni(&inv, &node.plugin_config(None, None));
    if !out.ok() {
        // Undo whatever a failed ADD may have left (it should leave nothing).
        let del = Invocation::new("DEL", &cid, Some(&ns.path()), "eth0")
            .args(&Node::k8s_args(name, &cid));
        let _ = node.cni(&del, &node.plugin_config(None, None));
        return Err((ns, out));
    }
    let result = out.json().expect("ADD result");
    let ip: Ipv4Addr = result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("ips[0].address");
    Ok(Pod {
        ns,
        name: name.to_owned(),
        container_id: cid,
        ifname: "eth0".into(),
        ip,
        result,
    })
}

/// `ping -c n -s size -i interval dst` from a pod; returns how many replies came back.
fn ping(pod: &Pod, dst: Ipv4Addr, n: u32, size: u32, interval: &str) -> u32 {
    let out = pod
        .ns
        .exec_status(
            "ping",
            &[
                "-c",
                &n.to_string(),
                "-s",
                &size.to_string(),
                "-i",
                interval,
                "-W",
                "1",
                "-q",
                &dst.to_string(),
            ],
        )
        .expect("run ping");
    let text = String::from_utf8_lossy(&out.stdout);
    // "5 packets transmitted, 5 received, ..."
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("ping printed no summary: {text}"));
    let sent: u32 = line.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(sent, n, "ping sent {sent} of {n}: {text}");
    line.split(", ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Tests.

/// Known traffic, leases and CNI operations through the real daemons, checked exactly in a
/// real Prometheus; then every dashboard and rule expression must return data and every
/// alert must be pending or firing (the scenario provokes each: a full pool, failing
/// allocations, an unreachable metadata endpoint, blocked traffic).
#[test]
fn prometheus_sees_exact_traffic_and_every_dashboard_and_rule_query_has_data() {
    require_root();
    require_tool("promtool", "prometheus");
    require_tool("prometheus", "prometheus");
    const N: u32 = 5; // pings pod->pod and pod->internet
    const S: u32 = 1000; // ICMP payload bytes
    const NB: u32 = 1000; // pings to a blocked destination
    let frame = u64::from(S) + 8 + 20 + 14; // ICMP + IPv4 + Ethernet headers
    let policy = format!(
        "{DEFAULT_POLICY}blocked_cidrs = [\"198.51.100.0/24\"]\npod_internet_egress_rate = \"100M\"\n"
    );
    // A small static pool to exhaust, and a metadata pool whose endpoint never answers.
    let pool = r#"cidrs = ["10.240.1.0/29"]

[[pool]]
name = "imds"
source = "azure-imds"
url = "http://127.0.0.1:9/metadata/instance/network?api-version=2021-02-01"
refresh_min = "1s"
refresh_max = "2s"
timeout = "500ms"
"#;
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        pool: Some(pool.into()),
        shaper_policy: policy,
        ..FabricOpts::default()
    })
    .expect("fabric");
    let node = f.node(1);
    let ns = node.ns.path();

    // Both endpoints are valid expositions for promtool (exit 0, no lint findings).
    for addr in [IPAMD_METRICS, SHAPERD_METRICS] {
        let text = wait_metrics(&ns, addr);
        let (code, out) = promtool_check_metrics(&text);
        assert_eq!(code, 0, "promtool check metrics on {addr}: {out}\n{text}");
    }

    let prom = Prometheus::start(&node.ns);
    // First samples take ~5.6 s (target discovery); poll.
    prom.wait_data(
        r#"up{job="aliasnet-shaperd"} == 1"#,
        Duration::from_secs(20),
    );
    prom.wait_data(r#"up{job="aliasnet-ipamd"} == 1"#, Duration::from_secs(20));

    let a = node.add_pod("a").expect("pod a");
    let b = node.add_pod("b").expect("pod b");
    let mut adds = 2u32;

    // Known traffic.
    assert_eq!(ping(&a, b.ip, N, S, "0.05"), N, "pod->pod pings answered");
    assert_eq!(
        ping(&a, INTERNET_IP, N, S, "0.05"),
        N,
        "pod->internet pings answered"
    );
    assert_eq!(
        ping(&a, INTERNET_IP2, NB, S, "0.002"),
        0,
        "blocked pings dropped"
    );

    let wait = Duration::from_secs(30);
    let pod = |p: &str, what: &str, dir: &str, class: &str| {
        format!(
            r#"aliasnet_pod_{what}_total{{namespace="test",pod="{p}",direction="{dir}",class="{class}"}}"#
        )
    };
    let (n, nb, fr) = (f64::from(N), f64::from(NB), frame as f64);
    for (expr, want) in [
        (pod("a", "packets", "egress", "internal"), n),
        (pod("a", "bytes", "egress", "internal"), n * fr),
        (pod("a", "packets", "ingress", "internal"), n),
        (pod("a", "bytes", "ingress", "internal"), n * fr),
        (pod("b", "packets", "ingress", "internal"), n),
        (pod("b", "bytes", "egress", "internal"), n * fr),
        (pod("a", "packets", "egress", "internet"), n),
        (pod("a", "bytes", "egress", "internet"), n * fr),
        (pod("a", "packets", "ingress", "internet"), n),
        (pod("a", "bytes", "ingress", "internet"), n * fr),
        (pod("a", "packets", "egress", "blocked"), nb),
        (pod("a", "bytes", "egress", "blocked"), nb * fr),
        (pod("a", "packets", "ingress", "blocked"), 0.0),
        (pod("b", "packets", "egress", "internet"), 0.0),
        (
            r#"aliasnet_pod_drops_total{pod="a",direction="egress",reason="blocked"}"#.into(),
            nb,
        ),
        (
            r#"aliasnet_pod_drops_total{pod="a",direction="egress",reason="rate"}"#.into(),
            0.0,
        ),
        (
            r#"aliasnet_node_packets_total{direction="egress",class="internal"}"#.into(),
            2.0 * n,
        ),
        (
            r#"aliasnet_node_bytes_total{direction="ingress",class="internal"}"#.into(),
            2.0 * n * fr,
        ),
        (
            r#"aliasnet_node_bytes_total{direction="egress",class="internet"}"#.into(),
            n * fr,
        ),
        (
            r#"aliasnet_node_packets_total{direction="ingress",class="internet"}"#.into(),
            n,
        ),
        (
            r#"aliasnet_node_packets_total{direction="egress",class="blocked"}"#.into(),
            nb,
        ),
        // 100 Mbit/s from node policy, exported in bytes/s.
        (
            r#"aliasnet_pod_bandwidth_limit_bytes_per_second{pod="a",direction="egress",class="internet"}"#.into(),
            12_500_000.0,
        ),
        (
            r#"aliasnet_datapath_backend_info{backend="htb"}"#.into(),
            1.0,
        ),
        (
            r#"aliasnet_build_info{component="shaperd"}"#.into(),
            1.0,
        ),
        (r#"aliasnet_build_info{component="ipamd"}"#.into(), 1.0),
    ] {
        prom.wait_value(&expr, want, wait);
    }

    // Fill the pool through the plugin until an ADD fails, then check the pool gauges.
    let mut fillers = Vec::new();
    let failed = loop {
        match try_add(node, &f, &format!("fill{}", fillers.len())) {
            Ok(p) => {
                adds += 1;
                fillers.push(p);
                assert!(fillers.len() < 64, "the /29 pool never ran out");
            }
            Err(e) => break e,
        }
    };
    adds += 1;
    let size = 2 + fillers.len();
    prom.wait_value(
        r#"aliasnet_ipam_pool_size{pool="secondary"}"#,
        size as f64,
        wait,
    );
    prom.wait_value(
        r#"aliasnet_ipam_pool_addresses{pool="secondary",state="allocated"}"#,
        size as f64,
        wait,
    );
    prom.wait_value(
        r#"aliasnet_ipam_pool_addresses{pool="secondary",state="free"}"#,
        0.0,
        wait,
    );
    // The failure is counted once the error series exist; more failures make their
    // increase visible to rate()/increase() (a series born at 1 shows no increase).
    prom.wait_data(
        r#"aliasnet_cni_operations_total{verb="add",code!="0"}"#,
        wait,
    );
    let why = format!(
        "the failed ADD said {}; allocation errors: {:?}",
        failed.1.stdout,
        prom.query("aliasnet_ipam_allocation_errors_total > 0")
    );
    prom.wait_data_ctx(
        // The plugin names no pool, so the error carries pool="" (ipam/src/metrics.rs); the
        // reason is "unavailable" while the metadata pool has never been read, else
        // "pool_exhausted".
        r#"sum(aliasnet_ipam_allocation_errors_total) > 0"#,
        wait,
        &why,
    );
    drop(failed);
    for i in 0..2 {
        let e = try_add(node, &f, &format!("over{i}"))
            .map(|_| ())
            .expect_err("pool is full");
        drop(e);
        adds += 1;
    }
    // A release and a new allocation: the pool ends full again.
    let last = fillers.pop().expect("a filler");
    node.del_pod(&last).expect_ok("DEL filler");
    drop(last);
    fillers.push(try_add(node, &f, "refill").unwrap_or_else(|(_, o)| panic!("refill: {o:?}")));
    adds += 1;
    prom.wait_data(
        r#"aliasnet_ipam_releases_total{pool="secondary"} > 0"#,
        wait,
    );
    prom.wait_value(
        r#"sum(aliasnet_cni_operations_total{verb="add"})"#,
        f64::from(adds),
        wait,
    );
    prom.wait_data(
        r#"aliasnet_ipam_metadata_refresh_total{pool="imds",result!~"ok|changed"} > 1"#,
        wait,
    );

    // Every expression of the dashboard and of the rules returns data. Rule expressions come
    // from Prometheus itself (it loaded the file), so nothing is missed or misparsed here.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard_file()).expect("read dashboard"))
            .expect("dashboard is JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(
        exprs.len() >= 20,
        "dashboard has only {} queries",
        exprs.len()
    );
    let rules = prom.api("/api/v1/rules");
    let mut alerts = Vec::new();
    let mut rule_count = 0;
    for g in rules["data"]["groups"].as_array().expect("rule groups") {
        for r in g["rules"].as_array().expect("rules") {
            rule_count += 1;
            assert_eq!(r["health"], "ok", "rule {} unhealthy: {r}", r["name"]);
            exprs.push(r["query"].as_str().expect("rule query").to_owned());
            if r["type"] == "alerting" {
                alerts.push(r["name"].as_str().expect("alert name").to_owned());
            }
        }
    }
    let file_rules = std::fs::read_to_string(rules_file())
        .expect("rules")
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            t.starts_with("- record:") || t.starts_with("- alert:")
        })
        .count();
    assert_eq!(
        rule_count, file_rules,
        "Prometheus loaded every rule of the file"
    );
    let start = Instant::now();
    let mut empty: Vec<String>;
    loop {
        empty = exprs
            .iter()
            .map(|e| grafana_to_promql(e))
            .filter(|e| prom.query(e).is_empty())
            .collect();
        if empty.is_empty() || start.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        empty.is_empty(),
        "{} of {} expressions returned no data:\n{}",
        empty.len(),
        exprs.len(),
        empty.join("\n")
    );
    // Every alert is active (pending while its `for` runs, or firing).
    let start = Instant::now();
    loop {
        let rules = prom.api("/api/v1/rules?type=alert");
        let inactive: Vec<String> = rules["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .filter(|r| r["state"] == "inactive")
            .map(|r| r["name"].as_str().unwrap_or("?").to_owned())
            .collect();
        if inactive.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "alerts never became active: {inactive:?} (of {alerts:?})"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(prom);
    for p in fillers.iter().chain([&a, &b]) {
        node.del_pod(p).expect_ok("DEL");
    }
}

/// Scrapes while pods are added and deleted: every answer is a complete, valid exposition
/// (promtool clean, no duplicate series), series of deleted pods vanish, and the node totals
/// never go backwards. Malformed requests get a 4xx.
#[test]
fn scrapes_stay_valid_and_monotonic_while_pods_churn() {
    require_root();
    require_tool("promtool", "prometheus");
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        ..FabricOpts::default()
    })
    .expect("fabric");
    let node = f.node(1);
    let ns = node.ns.path();
    wait_metrics(&ns, SHAPERD_METRICS);
    let keep = node.add_pod("keep").expect("pod");

    let mut deleted = Vec::new();
    let mut scrapes = 0usize;
    let mut node_totals: BTreeMap<String, f64> = BTreeMap::new();
    std::thread::scope(|s| {
        let churn = s.spawn(|| {
            let mut gone = Vec::new();
            for round in 0..4 {
                let pods: Vec<Pod> = (0..3)
                    .map(|i| node.add_pod(&format!("c{round}x{i}")).expect("churn pod"))
                    .collect();
                for p in &pods {
                    assert!(p.ping(keep.ip, &[]), "churn pod reaches keep");
                }
                for p in pods {
                    node.del_pod(&p).expect_ok("DEL churn pod");
                    gone.push(p.name.clone());
                }
            }
            gone
        });
        while !churn.is_finished() {
            let (status, body) =
                http_get(&ns, SHAPERD_METRICS, "/metrics").expect("shaperd answers");
            assert_eq!(status, 200, "scrape failed during churn: {body}");
            check_exposition(&body);
            for line in body.lines().filter(|l| l.starts_with("aliasnet_node_")) {
                let (series, v) = line.rsplit_once(' ').expect("sample");
                let v: f64 = v.parse().expect("number");
                let prev = node_totals.insert(series.to_owned(), v).unwrap_or(0.0);
                assert!(v >= prev, "{series} went back from {prev} to {v}");
            }
            if scrapes.is_multiple_of(5) {
                let (code, out) = promtool_check_metrics(&body);
                assert_eq!(code, 0, "promtool during churn: {out}\n{body}");
            }
            scrapes += 1;
        }
        deleted = churn.join().expect("churn thread");
    });
    assert!(scrapes >= 5, "only {scrapes} scrapes overlapped the churn");
    let (_, body) = http_get(&ns, SHAPERD_METRICS, "/metrics").expect("final scrape");
    for name in &deleted {
        assert!(
            !body.contains(&format!("pod=\"{name}\"")),
            "series of deleted pod {name} still exported"
        );
    }
    assert!(body.contains("pod=\"keep\""));
    assert!(body.contains("aliasnet_datapath_pods 1\n"), "{body}");
    // Churn pods pinged keep: the node's internal totals kept their traffic.
    let internal = body
        .lines()
        .find(|l| {
            l.starts_with(r#"aliasnet_node_packets_total{direction="egress",class="internal"}"#)
        })
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse::<u64>().ok())
        .expect("node internal egress");
    assert!(
        internal >= 4 * 3 * 2,
        "node totals lost deleted pods' traffic: {internal}"
    );

    // Bad requests.
    for (raw, what) in [
        (&b"GET /metrics\r\n\r\n"[..], "HTTP/0.9-style request line"),
        (
            b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03tls\r\n\r\n",
            "TLS hello",
        ),
        (
            b"GET /metrics HTTP/1.1\r\nbroken header\r\n\r\n",
            "header without colon",
        ),
    ] {
        let (status, _) = http_raw(&ns, SHAPERD_METRICS, raw).expect("an answer");
        assert!((400..500).contains(&status), "{what}: HTTP {status}");
    }
    assert_eq!(http_get(&ns, SHAPERD_METRICS, "/").map(|r| r.0), Some(404));
    assert_eq!(
        http_raw(&ns, SHAPERD_METRICS, b"DELETE /metrics HTTP/1.0\r\n\r\n").map(|r| r.0),
        Some(405)
    );
    node.del_pod(&keep).expect_ok("DEL keep");
}

/// Structural checks of one exposition: HELP and TYPE before samples, each family once, no
/// duplicate label sets, every value a number.
fn check_exposition(body: &str) {
    let mut typed = HashSet::new();
    let mut seen = HashSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_whitespace().next().expect("TYPE name");
            assert!(typed.insert(name.to_owned()), "family {name} typed twice");
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, v) = line.rsplit_once(' ').expect("sample line");
        v.parse::<f64>()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = series.split('{').next().expect("name");
        let family = name
            .strip_suffix("_bucket")
            .or_else(|| name.strip_suffix("_sum"))
            .or_else(|| name.strip_suffix("_count"))
            .filter(|f| typed.contains(*f))
            .unwrap_or(name);
        assert!(typed.contains(family), "sample before its TYPE: {line}");
        assert!(seen.insert(series.to_owned()), "duplicate series {series}");
    }
    assert!(body.ends_with('\n'), "exposition is cut short");
    for f in [
        "aliasnet_node_bytes_total",
        "aliasnet_build_info",
        "aliasnet_datapath_backend_info",
    ] {
        assert!(typed.contains(f), "{f} missing");
    }
}

/// `--aggregate namespace`: no pod label, values are the sums of the pods' (read from a
/// second exporter on the same maps in per-pod mode).
#[test]
fn namespace_aggregation_sums_pods_without_the_pod_label() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        ..FabricOpts::default()
    })
    .expect("fabric");
    let node = f.node(1);
    let ns = node.ns.path();
    wait_metrics(&ns, SHAPERD_METRICS);
    // A second exporter on the same pins, started before any traffic (its namespace totals
    // count from its start).
    let agg_addr = "127.0.0.1:9547";
    let log = File::create(node.dir.join("shaperd-agg.log")).expect("log");
    let agg = node
        .ns
        .command(aliasnet_tests::bin("aliasnet-shaperd"))
        .arg("--config")
        .arg(&node.shaper_paths.config)
        .arg("--pin-root")
        .arg(&node.shaper_paths.pin_root)
        .args(["--metrics-address", agg_addr, "--aggregate", "namespace"])
        .args(["--gc-interval", "3600", "--poll-interval", "3600"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn aggregated shaperd");
    let agg = ChildGuard(agg);
    wait_metrics(&ns, agg_addr);

    let a = node.add_pod("a").expect("a");
    let b = node.add_pod("b").expect("b");
    assert!(a.ping(b.ip, &[]));
    assert!(b.ping(INTERNET_IP, &[]));

    let parse = |body: &str| -> HashMap<String, f64> {
        body.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(s, v)| (s.to_owned(), v.parse().expect("value")))
            .collect()
    };
    let per_pod = parse(&wait_metrics(&ns, SHAPERD_METRICS));
    let body = wait_metrics(&ns, agg_addr);
    require_tool("promtool", "prometheus");
    let (code, out) = promtool_check_metrics(&body);
    assert_eq!(code, 0, "promtool: {out}");
    let agg_samples = parse(&body);
    assert!(
        !body.contains("pod=\""),
        "aggregated exposition carries pod labels:\n{body}"
    );
    assert!(
        !body.contains("aliasnet_pod_bandwidth_limit"),
        "limits are per pod only"
    );
    for (dir, class) in [
        ("egress", "internal"),
        ("ingress", "internal"),
        ("egress", "internet"),
    ] {
        for what in ["packets", "bytes"] {
            let sum: f64 = ["a", "b"]
                .iter()
                .map(|p| {
                    per_pod[&format!(
                        r#"aliasnet_pod_{what}_total{{namespace="test",pod="{p}",direction="{dir}",class="{class}"}}"#
                    )]
                })
                .sum();
            let key = format!(
                r#"aliasnet_pod_{what}_total{{namespace="test",direction="{dir}",class="{class}"}}"#
            );
            assert!(sum > 0.0, "no {what} {dir} {class} traffic counted");
            assert_eq!(agg_samples.get(&key), Some(&sum), "{key}");
        }
    }
    drop(agg);
    node.del_pod(&a).expect_ok("DEL a");
    node.del_pod(&b).expect_ok("DEL b");
}

/// Stops a child process (SIGTERM, then SIGKILL) when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let start = Instant::now();
        while matches!(self.0.try_wait(), Ok(None)) {
            if start.elapsed() > Duration::from_secs(10) {
                let _ = self.0.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.wait();
    }
}

/// The rules file passes `promtool check rules`, and the dashboard is valid JSON whose
/// queries all go through the same data source variable.
#[test]
fn monitoring_files_pass_promtool_and_are_well_formed() {
    require_tool("promtool", "prometheus");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(rules_file())
        .output()
        .expect("promtool check rules");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard_file()).expect("dashboard"))
            .expect("dashboard JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(&dash, &mut exprs);
    assert!(exprs.len() >= 20);
    for p in dash["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {}",
            p["title"]
        );
        assert!(
            p["targets"].as_array().is_some_and(|t| !t.is_empty()),
            "panel {} has no query",
            p["title"]
        );
    }
    let required = [
        "Internet egress by namespace",
        "Internet egress by pod (top 20)",
        "Internal vs internet split",
        "Top talkers (all classes)",
        "Shaping drops (bandwidth limits)",
        "Pool utilisation",
        "CNI latency p99 by verb",
        "CNI operations by verb and result",
    ];
    let titles: Vec<&str> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for t in required {
        assert!(titles.contains(&t), "dashboard lacks panel {t:?}");
    }
}
