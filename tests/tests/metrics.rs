//! The metrics pipeline end to end: aliasnet-shaperd's and aliasnet-ipamd's `/metrics` on a
//! fabric node, scraped by a real (Debian) Prometheus running in the node's netns, with
//! traffic, leases and CNI operations of known size; the dashboard's and the rules' PromQL
//! evaluated against it. The node shares a cluster budget through a one-member etcd, so that
//! the budget's families and dashboard row have data.
//!
//! Everything runs inside namespaces the fabric creates: Prometheus listens on the node
//! netns' loopback, and this process talks to it from a thread that entered that netns.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use aliasnet_tests::{
    etcd::{EtcdCluster, EtcdOpts},
    fabric::{Fabric, FabricOpts, Pod, DEFAULT_POLICY, INTERNET_IP, INTERNET_IP2, MIRROR_IP},
    metrics::{
        assert_promtool_check, dashboard_exprs, dashboard_file, dashboard_variables,
        grafana_to_promql, promtool_check_metrics, rules_file, wait_metrics, Prometheus,
        IPAMD_METRICS, SHAPERD_METRICS,
    },
    require_root, require_tool,
};
use serde_json::Value;

/// `ping -c n -s size -i interval dst` from a pod; returns how many replies came back.
fn ping(pod: &Pod, dst: Ipv4Addr, n: u32, size: u32, interval: &str) -> u32 {
    let p = pod.ping_summary(dst, n, size, interval);
    assert_eq!(p.sent, n, "ping sent {} of {n}", p.sent);
    p.received
}

/// Known traffic, leases and CNI operations through the real daemons, checked exactly in a
/// real Prometheus; then every dashboard and rule expression must return data and every
/// alert must be pending or firing (the scenario provokes each: a full pool, failing
/// allocations, an unreachable metadata endpoint, blocked traffic, a pod without its egress
/// HTB). The policy has a named class and limits at every level, so the class series, the
/// limit gauges and what the budget and cost panels read exist.
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
        r#"{DEFAULT_POLICY}blocked_cidrs = ["198.51.100.0/24"]
pod_internet_egress_rate = "100M"
[internet]
namespace_ingress_rate = "1G"
node_ingress_rate = "2G"
[classes.mirrors]
cidrs = ["{MIRROR_IP}/32"]
pod_ingress_rate = "200M"
namespace_ingress_rate = "500M"
"#
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

    // A cluster budget (on uploads to a class nothing here sends to), through a one-member
    // etcd: a policy reload starts the share engine; the node leads.
    let etcd = EtcdCluster::start(
        &f.vnet,
        EtcdOpts {
            members: 1,
            ..EtcdOpts::default()
        },
    )
    .expect("etcd");
    wait_metrics(&ns, SHAPERD_METRICS);
    let config = &node.shaper_paths.config;
    let budget = format!(
        "{}[classes.budgeted]\ncidrs = [\"192.0.2.0/24\"]\ncluster_egress_rate = \"10G\"\n[cluster]\netcd_endpoints = {:?}\nshare_period = \"1s\"\nlease_ttl = \"3s\"\n",
        std::fs::read_to_string(config).expect("policy"),
        etcd.endpoints()
    );
    std::fs::write(config, budget).expect("write policy");
    node.shaperd
        .as_ref()
        .expect("shaperd")
        .signal(nix::sys::signal::Signal::SIGHUP)
        .expect("SIGHUP");
    let start = Instant::now();
    while !wait_metrics(&ns, SHAPERD_METRICS)
        .contains("aliasnet_budget_cluster_level_bytes_per_second{")
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the node never led its cluster budget"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

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
        ping(&a, MIRROR_IP, N, S, "0.05"),
        N,
        "pod->mirrors pings answered"
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
        (pod("a", "packets", "egress", "mirrors"), n),
        (pod("a", "bytes", "ingress", "mirrors"), n * fr),
        (pod("b", "bytes", "ingress", "mirrors"), 0.0),
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
        (
            r#"aliasnet_node_bytes_total{direction="ingress",class="mirrors"}"#.into(),
            n * fr,
        ),
        // 100 Mbit/s from node policy, exported in bytes/s.
        (
            r#"aliasnet_pod_bandwidth_limit_bytes_per_second{pod="a",direction="egress",class="internet"}"#.into(),
            12_500_000.0,
        ),
        // Limits of every level, by class.
        (
            r#"aliasnet_pod_bandwidth_limit_bytes_per_second{pod="a",direction="ingress",class="mirrors"}"#.into(),
            25_000_000.0,
        ),
        (
            r#"aliasnet_namespace_bandwidth_limit_bytes_per_second{namespace="test",direction="ingress",class="internet"}"#.into(),
            125_000_000.0,
        ),
        (
            r#"aliasnet_namespace_bandwidth_limit_bytes_per_second{namespace="test",direction="ingress",class="mirrors"}"#.into(),
            62_500_000.0,
        ),
        (
            r#"aliasnet_node_bandwidth_limit_bytes_per_second{direction="ingress",class="internet"}"#.into(),
            250_000_000.0,
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

    // Pod a deletes its own egress HTB (CAP_NET_ADMIN in its namespace) and floods the
    // internet far above its 100 Mbit/s limit: the host veth polices it.
    a.ns.exec("tc", &["qdisc", "del", "dev", &a.ifname, "root"])
        .expect("a deletes its egress HTB");
    let dst = INTERNET_IP.to_string();
    a.ns.exec_status(
        "ping",
        &["-q", "-f", "-l", "64", "-s", "1400", "-w", "2", &dst],
    )
    .expect("ping -f");
    prom.wait_data(
        r#"aliasnet_pod_drops_total{pod="a",direction="egress",reason="policed"} > 0"#,
        wait,
    );

    // Fill the pool through the plugin until an ADD fails, then check the pool gauges.
    let mut fillers = Vec::new();
    let failed = loop {
        match node.try_add_pod(&format!("fill{}", fillers.len())) {
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
        let e = node
            .try_add_pod(&format!("over{i}"))
            .map(|_| ())
            .expect_err("pool is full");
        drop(e);
        adds += 1;
    }
    // A release and a new allocation: the pool ends full again.
    let last = fillers.pop().expect("a filler");
    node.del_pod(&last).expect_ok("DEL filler");
    drop(last);
    fillers.push(
        node.try_add_pod("refill")
            .unwrap_or_else(|(_, o)| panic!("refill: {o:?}")),
    );
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
    let vars = dashboard_variables(&dashboard);
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
            .map(|e| grafana_to_promql(e, &vars))
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

/// The rules file passes `promtool check rules`, and the dashboard is valid JSON whose
/// queries all go through the same data source variable.
#[test]
fn monitoring_files_pass_promtool_and_are_well_formed() {
    require_tool("promtool", "prometheus");
    assert_promtool_check("rules", &rules_file());
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
        "Downloads by class",
        "Namespace download budget",
        "Namespace limit usage",
        "Internet cost by namespace and class",
        "Cluster budget: use of all nodes vs budget",
        "Cluster budget: the leader's view",
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

    // Every expression is PromQL once Grafana's variables are filled in with the dashboard's
    // defaults (each is a defined variable): promtool parses them as recording rules.
    let vars = dashboard_variables(&dash);
    for (name, value) in &vars {
        assert!(!value.is_empty(), "variable {name} has no default");
    }
    let mut yaml = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let promql = grafana_to_promql(e, &vars);
        yaml.push_str(&format!(
            "      - record: dashboard:expr_{i}\n        expr: {}\n",
            serde_json::to_string(&promql).expect("a JSON string is a YAML scalar")
        ));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("dashboard-rules.yml");
    std::fs::write(&file, &yaml).expect("write");
    assert_promtool_check("rules", &file);
}
