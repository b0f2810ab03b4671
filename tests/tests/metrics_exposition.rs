//! aliasnet-shaperd's `/metrics` exposition on a fabric node: valid and monotonic while pods
//! churn, malformed requests refused, and the per-namespace aggregation.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::File,
    process::Stdio,
};

use aliasnet_tests::{
    fabric::{Fabric, FabricOpts, Pod, DEFAULT_POLICY, INTERNET_IP, MIRROR_IP},
    metrics::{http_get, http_raw, promtool_check_metrics, wait_metrics, SHAPERD_METRICS},
    require_root, require_tool, ChildGuard,
};

/// Scrapes while pods are added and deleted: every answer is a complete, valid exposition
/// (promtool clean, no duplicate series), series of deleted pods vanish, and the node totals
/// never go backwards. Malformed requests get a 4xx.
#[test]
fn scrapes_stay_valid_and_monotonic_while_pods_churn() {
    require_root();
    require_tool("promtool", "prometheus");
    let f = Fabric::one_node();
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
/// second exporter on the same maps in per-pod mode), a named class's included; the
/// namespace's limit gauges stay, the pods' go.
#[test]
fn namespace_aggregation_sums_pods_without_the_pod_label() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        shaper_policy: format!(
            "{DEFAULT_POLICY}[classes.mirrors]\ncidrs = [\"{MIRROR_IP}/32\"]\npod_egress_rate = \"300M\"\nnamespace_ingress_rate = \"400M\"\n"
        ),
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
    assert!(a.ping(MIRROR_IP, &[]));
    assert!(b.ping(MIRROR_IP, &[]));

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
    assert!(per_pod.contains_key(
        r#"aliasnet_pod_bandwidth_limit_bytes_per_second{namespace="test",pod="a",direction="egress",class="mirrors"}"#
    ));
    let limit = r#"aliasnet_namespace_bandwidth_limit_bytes_per_second{namespace="test",direction="ingress",class="mirrors"}"#;
    assert_eq!(agg_samples.get(limit), Some(&50_000_000.0), "{body}");
    assert_eq!(per_pod.get(limit), Some(&50_000_000.0));
    for (dir, class) in [
        ("egress", "internal"),
        ("ingress", "internal"),
        ("egress", "internet"),
        ("egress", "mirrors"),
        ("ingress", "mirrors"),
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
