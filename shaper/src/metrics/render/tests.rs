//! The exposition: series per pod, per namespace and per node, classes and limits.

use std::{net::Ipv4Addr, path::PathBuf};

use aliasnet_ebpf::abi::Counter;

use super::*;
use crate::metrics::PodSample;

fn counters(egress_internet: u64, ingress_internal: u64) -> PodCounters {
    let mut c = PodCounters::default();
    c.dir[abi::DIR_EGRESS][abi::CLASS_INTERNET as usize] = Counter {
        packets: egress_internet,
        bytes: egress_internet * 100,
    };
    c.dir[abi::DIR_INGRESS][abi::CLASS_INTERNAL as usize] = Counter {
        packets: ingress_internal,
        bytes: ingress_internal * 100,
    };
    c
}

fn pod(slot: u32, ns: &str, name: &str, c: PodCounters) -> PodSample {
    PodSample {
        slot,
        attached_unix_ns: u64::from(slot) + 1,
        namespace: ns.into(),
        pod: name.into(),
        ip: Ipv4Addr::new(10, 0, 0, slot as u8),
        host_ifindex: slot + 10,
        pod_ifindex: 2,
        netns: PathBuf::from("/nonexistent"),
        counters: c,
        limits: PodLimits::default(),
        rate_drops: [None; 2],
        conns: Default::default(),
    }
}

fn snap(pods: Vec<PodSample>) -> Snapshot {
    Snapshot {
        pods,
        ..Snapshot::default()
    }
}

fn value(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .map(|v| v.parse().expect("integer sample"))
}

fn scrape(ledger: &mut Ledger, snap: &Snapshot, opts: &ExporterOptions) -> String {
    let drops = ledger.observe(snap);
    render(snap, &drops, ledger, opts, None)
}

#[test]
fn per_pod_series_follow_the_maps() {
    let opts = ExporterOptions::default();
    let mut l = Ledger::default();
    let mut a = pod(0, "team", "a", counters(3, 5));
    a.limits
        .0
        .set(Direction::Ingress, abi::KIND_TOTAL, Some(10_000_000));
    a.limits
        .0
        .set(Direction::Egress, abi::KIND_INTERNET, Some(1_000_000));
    a.rate_drops = [Some(7), Some(2)];
    a.counters.spoofed = Counter {
        packets: 4,
        bytes: 400,
    };
    a.counters.policed = Counter {
        packets: 9,
        bytes: 900,
    };
    a.counters.dropped[abi::DROP_ND] = Counter {
        packets: 11,
        bytes: 1100,
    };
    a.counters.dropped[abi::DROP_GATEWAY] = Counter {
        packets: 6,
        bytes: 600,
    };
    a.conns.conns = 40;
    a.conns.conns_refused = 12;
    a.conns.conns_relearnt = 3;
    let mut b = pod(1, "team", "b", counters(1, 0));
    b.conns.conns = 2;
    let text = scrape(
        &mut l,
        &Snapshot {
            conn_share: 4096,
            ..snap(vec![a, b.clone()])
        },
        &opts,
    );
    for (series, v) in [
        (
            r#"aliasnet_pod_drops_total{namespace="team",pod="a",direction="egress",reason="nd"}"#,
            11,
        ),
        (
            r#"aliasnet_pod_drops_total{namespace="team",pod="a",direction="egress",reason="gateway"}"#,
            6,
        ),
        (
            r#"aliasnet_pod_tcp_connections_refused_total{namespace="team",pod="a"}"#,
            12,
        ),
        (
            r#"aliasnet_pod_tcp_connections_relearnt_total{namespace="team",pod="a"}"#,
            3,
        ),
        (
            r#"aliasnet_pod_tcp_connections_refused_total{namespace="team",pod="b"}"#,
            0,
        ),
        ("aliasnet_datapath_tcp_connections", 42),
        ("aliasnet_datapath_tcp_connection_share", 4096),
    ] {
        assert_eq!(value(&text, series), Some(v), "{series}");
    }
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_bytes_total{namespace="team",pod="a",direction="egress",class="internet"}"#
        ),
        Some(300)
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_packets_total{namespace="team",pod="a",direction="ingress",class="internal"}"#
        ),
        Some(5)
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_drops_total{namespace="team",pod="a",direction="egress",reason="rate"}"#
        ),
        Some(7)
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_drops_total{namespace="team",pod="a",direction="egress",reason="spoofed"}"#
        ),
        Some(4)
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_drops_total{namespace="team",pod="a",direction="ingress",reason="spoofed"}"#
        ),
        None
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_drops_total{namespace="team",pod="a",direction="egress",reason="policed"}"#
        ),
        Some(9)
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_bandwidth_limit_bytes_per_second{namespace="team",pod="a",direction="egress",class="internet"}"#
        ),
        Some(125_000)
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_bandwidth_limit_bytes_per_second{namespace="team",pod="a",direction="ingress",class="all"}"#
        ),
        Some(1_250_000)
    );
    assert!(
        !text.contains(r#"pod="b",direction="egress",class="all""#),
        "b has no limits"
    );
    assert_eq!(value(&text, "aliasnet_datapath_pods"), Some(2));
    // The node totals start at zero with the exporter.
    assert_eq!(
        value(
            &text,
            r#"aliasnet_node_packets_total{direction="egress",class="internet"}"#
        ),
        Some(0)
    );
    assert!(text.contains(r#"aliasnet_build_info{component="shaperd",version=""#));
    assert!(text.contains(r#"aliasnet_datapath_backend_info{backend="htb"} 1"#));

    // a is deleted; b counts more: a's series disappear, node totals keep a's part.
    let b2 = pod(1, "team", "b", counters(4, 0));
    let mut a2 = pod(0, "team", "a", counters(6, 5));
    a2.rate_drops = [Some(9), Some(2)];
    let _ = scrape(&mut l, &snap(vec![a2, b.clone()]), &opts);
    let text = scrape(&mut l, &snap(vec![b2]), &opts);
    assert!(!text.contains(r#"pod="a""#), "{text}");
    // Egress internet since start: a 3 more, b 3 more.
    assert_eq!(
        value(
            &text,
            r#"aliasnet_node_packets_total{direction="egress",class="internet"}"#
        ),
        Some(6)
    );
    assert_eq!(value(&text, "aliasnet_datapath_pods"), Some(1));
}

#[test]
fn namespace_aggregation_is_monotonic_across_pod_deletion() {
    let opts = ExporterOptions {
        aggregation: Aggregation::Namespace,
        ..ExporterOptions::default()
    };
    let mut l = Ledger::default();
    let s0 = snap(vec![
        pod(0, "x", "a", counters(10, 0)),
        pod(1, "x", "b", counters(20, 0)),
    ]);
    let t0 = scrape(&mut l, &s0, &opts);
    let key = r#"aliasnet_pod_packets_total{namespace="x",direction="egress",class="internet"}"#;
    assert_eq!(value(&t0, key), Some(0));
    assert!(!t0.contains("pod=\""), "no pod label when aggregated");
    assert!(
        !t0.contains("aliasnet_pod_bandwidth_limit"),
        "no per-pod limits when aggregated"
    );
    let s1 = snap(vec![
        pod(0, "x", "a", counters(15, 0)),
        pod(1, "x", "b", counters(21, 0)),
    ]);
    assert_eq!(value(&scrape(&mut l, &s1, &opts), key), Some(6));
    // b goes away, a new pod c (slot reused: new attachment time) appears.
    let mut c = pod(1, "x", "c", counters(2, 0));
    c.attached_unix_ns = 99;
    let s2 = snap(vec![pod(0, "x", "a", counters(16, 0)), c]);
    assert_eq!(value(&scrape(&mut l, &s2, &opts), key), Some(6 + 1 + 2));
    // The namespace empties: its series go.
    let t3 = scrape(&mut l, &Snapshot::default(), &opts);
    assert!(!t3.contains(r#"namespace="x""#), "{t3}");
    assert_eq!(value(&t3, "aliasnet_datapath_pods"), Some(0));
}

#[test]
fn duplicate_pod_names_are_summed_not_repeated() {
    let opts = ExporterOptions::default();
    let mut l = Ledger::default();
    let snap = snap(vec![
        pod(0, "n", "p", counters(1, 0)),
        pod(1, "n", "p", counters(2, 0)),
    ]);
    let text = scrape(&mut l, &snap, &opts);
    let key =
        r#"aliasnet_pod_packets_total{namespace="n",pod="p",direction="egress",class="internet"}"#;
    assert_eq!(text.matches(key).count(), 1);
    assert_eq!(value(&text, key), Some(3));
}

#[test]
fn unreadable_rate_drops_repeat_the_last_value() {
    let opts = ExporterOptions::default();
    let mut l = Ledger::default();
    let mut a = pod(0, "n", "a", counters(0, 0));
    a.limits
        .0
        .set(Direction::Ingress, abi::KIND_TOTAL, Some(1_000_000));
    a.rate_drops = [None, Some(42)];
    let _ = scrape(&mut l, &snap(vec![a.clone()]), &opts);
    a.rate_drops = [None, None];
    let text = scrape(&mut l, &snap(vec![a]), &opts);
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_drops_total{namespace="n",pod="a",direction="ingress",reason="rate"}"#
        ),
        Some(42)
    );
}

#[test]
fn label_values_are_escaped() {
    let opts = ExporterOptions::default();
    let mut l = Ledger::default();
    let snap = snap(vec![pod(0, "n", "we\"ird\\name\n", counters(1, 0))]);
    let text = scrape(&mut l, &snap, &opts);
    assert!(text.contains(r#"pod="we\"ird\\name\n""#), "{text}");
}

/// Asserts `promtool check metrics` accepts `text` (no errors, no lint findings).
#[track_caller]
fn assert_promtool_passes(text: &str) {
    let (code, out) = aliasnet_tests::metrics::promtool_check_metrics(text);
    assert_eq!(code, 0, "promtool check metrics: {out}\n{text}");
}

#[test]
fn exposition_passes_promtool() {
    let opts = ExporterOptions::default();
    let mut l = Ledger::default();
    let mut a = pod(0, "team", "a", counters(3, 5));
    a.limits
        .0
        .set(Direction::Egress, abi::KIND_TOTAL, Some(5_000_000));
    let text = scrape(&mut l, &snap(vec![a]), &opts);
    assert_promtool_passes(&text);
}

/// Two named classes at indices 0 and 2 (index 1 unused, as after a class was removed).
fn class_names() -> Vec<Option<String>> {
    let mut names = vec![None; abi::MAX_NAMED];
    names[0] = Some("mirrors".to_owned());
    names[2] = Some("datasets".to_owned());
    names
}

/// A pod that downloaded `n` packets from `mirrors` and sent `n` to it, and downloaded `2n`
/// from plain internet.
fn class_pod(slot: u32, ns: &str, name: &str, n: u64) -> PodSample {
    let mut c = PodCounters::default();
    let mirrors = abi::Class::Named(0).index();
    for d in [abi::DIR_INGRESS, abi::DIR_EGRESS] {
        c.dir[d][mirrors] = Counter {
            packets: n,
            bytes: n * 1000,
        };
    }
    c.dir[abi::DIR_INGRESS][abi::CLASS_INTERNET as usize] = Counter {
        packets: 2 * n,
        bytes: 2 * n * 1000,
    };
    pod(slot, ns, name, c)
}

/// Samples of `text` whose series starts with `prefix`.
fn series<'a>(text: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.lines().filter(move |l| l.starts_with(prefix))
}

#[test]
fn named_classes_are_class_labels_of_pods_and_node_totals() {
    let opts = ExporterOptions::default();
    let mut l = Ledger::default();
    let mut s = snap(vec![
        class_pod(0, "team", "a", 3),
        class_pod(1, "team", "b", 1),
    ]);
    s.class_names = class_names();
    let text = scrape(&mut l, &s, &opts);
    let pod = |p: &str, what: &str, dir: &str, class: &str| {
        value(
            &text,
            &format!(
                r#"aliasnet_pod_{what}_total{{namespace="team",pod="{p}",direction="{dir}",class="{class}"}}"#
            ),
        )
    };
    assert_eq!(pod("a", "bytes", "ingress", "mirrors"), Some(3000));
    assert_eq!(pod("a", "packets", "egress", "mirrors"), Some(3));
    // `internet` is the internet in no named class.
    assert_eq!(pod("a", "bytes", "ingress", "internet"), Some(6000));
    assert_eq!(pod("b", "bytes", "ingress", "datasets"), Some(0));
    assert!(
        !text.contains("class=\"class1\""),
        "an unused index has no series:\n{text}"
    );
    // Per pod: bytes and packets of 2 directions x (3 + 2 classes), 8 drops, 2 connection
    // counters, no limits.
    for p in ["a", "b"] {
        let n = series(&text, "aliasnet_pod_")
            .filter(|l| l.contains(&format!("pod=\"{p}\"")))
            .count();
        assert_eq!(n, 4 * (3 + 2) + 8 + 2, "series of pod {p}");
    }
    // The node's: 2 directions x (4 + 2 classes) each for bytes and packets, from zero.
    assert_eq!(
        series(&text, "aliasnet_node_bytes_total").count(),
        2 * (4 + 2)
    );
    assert_eq!(
        series(&text, "aliasnet_node_packets_total").count(),
        2 * (4 + 2)
    );
    let mut s2 = snap(vec![
        class_pod(0, "team", "a", 5),
        class_pod(1, "team", "b", 1),
    ]);
    s2.class_names = class_names();
    let text = scrape(&mut l, &s2, &opts);
    assert_eq!(
        value(
            &text,
            r#"aliasnet_node_bytes_total{direction="ingress",class="mirrors"}"#
        ),
        Some(2000)
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_node_packets_total{direction="ingress",class="internet"}"#
        ),
        Some(4)
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_node_bytes_total{direction="egress",class="datasets"}"#
        ),
        Some(0)
    );
    assert_promtool_passes(&text);
}

#[test]
fn namespace_aggregation_keeps_the_class_labels() {
    let opts = ExporterOptions {
        aggregation: Aggregation::Namespace,
        ..ExporterOptions::default()
    };
    let mut l = Ledger::default();
    let mut s = snap(vec![
        class_pod(0, "team", "a", 3),
        class_pod(1, "team", "b", 1),
        class_pod(2, "other", "c", 7),
    ]);
    s.class_names = class_names();
    let _ = scrape(&mut l, &s, &opts);
    let mut s = snap(vec![
        class_pod(0, "team", "a", 4),
        class_pod(1, "team", "b", 3),
        class_pod(2, "other", "c", 7),
    ]);
    s.class_names = class_names();
    let text = scrape(&mut l, &s, &opts);
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_bytes_total{namespace="team",direction="ingress",class="mirrors"}"#
        ),
        Some(3000),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"aliasnet_pod_packets_total{namespace="team",direction="egress",class="datasets"}"#
        ),
        Some(0)
    );
    // Per namespace: the per-pod families' series, once (no connection counters).
    for ns in ["team", "other"] {
        let n = series(&text, "aliasnet_pod_")
            .filter(|l| l.contains(&format!("namespace=\"{ns}\"")))
            .count();
        assert_eq!(n, 4 * (3 + 2) + 8, "series of namespace {ns}");
    }
    assert_promtool_passes(&text);
}

#[test]
fn limits_of_every_level_are_gauges_by_direction_and_class() {
    let mut l = Ledger::default();
    let mut a = class_pod(0, "team", "a", 1);
    a.limits
        .0
        .set(Direction::Ingress, abi::KIND_INTERNET, Some(80_000_000));
    a.limits
        .0
        .set(Direction::Ingress, abi::KIND_NAMED, Some(8_000_000));
    a.limits
        .0
        .set(Direction::Egress, abi::KIND_NAMED + 2, Some(800_000));
    let mut s = snap(vec![a]);
    s.class_names = class_names();
    s.node_limits
        .set(Direction::Ingress, abi::KIND_INTERNET, Some(1_000_000_000));
    s.node_limits
        .set(Direction::Egress, abi::KIND_NAMED, Some(16_000_000));
    let mut team = abi::Rates::default();
    team.set(Direction::Ingress, abi::KIND_INTERNET, Some(400_000_000));
    team.set(Direction::Ingress, abi::KIND_NAMED + 2, Some(40_000_000));
    s.namespace_limits = vec![("team".to_owned(), team)];
    // An index without a name has no class label: its limit is not exported.
    s.node_limits
        .set(Direction::Ingress, abi::KIND_NAMED + 1, Some(24_000_000));
    let text = scrape(&mut l, &s, &ExporterOptions::default());
    let gauges = [
        (
            r#"aliasnet_pod_bandwidth_limit_bytes_per_second{namespace="team",pod="a",direction="ingress",class="internet"}"#,
            10_000_000,
        ),
        (
            r#"aliasnet_pod_bandwidth_limit_bytes_per_second{namespace="team",pod="a",direction="ingress",class="mirrors"}"#,
            1_000_000,
        ),
        (
            r#"aliasnet_pod_bandwidth_limit_bytes_per_second{namespace="team",pod="a",direction="egress",class="datasets"}"#,
            100_000,
        ),
        (
            r#"aliasnet_namespace_bandwidth_limit_bytes_per_second{namespace="team",direction="ingress",class="internet"}"#,
            50_000_000,
        ),
        (
            r#"aliasnet_namespace_bandwidth_limit_bytes_per_second{namespace="team",direction="ingress",class="datasets"}"#,
            5_000_000,
        ),
        (
            r#"aliasnet_node_bandwidth_limit_bytes_per_second{direction="ingress",class="internet"}"#,
            125_000_000,
        ),
        (
            r#"aliasnet_node_bandwidth_limit_bytes_per_second{direction="egress",class="mirrors"}"#,
            2_000_000,
        ),
    ];
    for (key, want) in gauges {
        assert_eq!(value(&text, key), Some(want), "{key}\n{text}");
    }
    // Nothing else: an unset limit has no series.
    assert_eq!(series(&text, "aliasnet_pod_bandwidth_limit").count(), 3);
    assert_eq!(
        series(&text, "aliasnet_namespace_bandwidth_limit").count(),
        2
    );
    assert_eq!(series(&text, "aliasnet_node_bandwidth_limit").count(), 2);
    assert_promtool_passes(&text);

    // Aggregated per namespace: no per-pod limits; the namespaces' and the node's stay.
    let opts = ExporterOptions {
        aggregation: Aggregation::Namespace,
        ..ExporterOptions::default()
    };
    let text = scrape(&mut Ledger::default(), &s, &opts);
    assert_eq!(series(&text, "aliasnet_pod_bandwidth_limit").count(), 0);
    assert_eq!(
        series(&text, "aliasnet_namespace_bandwidth_limit").count(),
        2
    );
    assert_eq!(series(&text, "aliasnet_node_bandwidth_limit").count(), 2);
    assert_promtool_passes(&text);
}

#[test]
fn aggregation_parses() {
    assert_eq!(
        "namespace".parse::<Aggregation>(),
        Ok(Aggregation::Namespace)
    );
    assert_eq!("pod".parse::<Aggregation>(), Ok(Aggregation::Pod));
    assert!("node".parse::<Aggregation>().is_err());
}
