use super::*;

const IN: Direction = Direction::Ingress;
const OUT: Direction = Direction::Egress;

const FULL: &str = r#"
    internal_cidrs = ["10.0.0.0/8", "172.16.0.0/12", "10.99.7.0/24"]
    blocked_cidrs = ["10.99.0.0/16", "172.16.0.0/12"]
    pod_internet_egress_rate = "100M"
    node_internet_egress_cap = 1000000000
    uplink = "eth0"

    [namespaces.research]
    internet_egress_rate = "1G"

    [namespaces.batch]
    internet_egress_rate = "unlimited"
"#;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn parses_the_first_releases_keys() {
    let p = Policy::parse(FULL).unwrap();
    assert_eq!(p.internal_cidrs.len(), 3);
    let d = &p.datapath;
    assert_eq!(d.defaults.pod.get(OUT, INTERNET), Some(100_000_000));
    assert_eq!(d.node.get(OUT, INTERNET), Some(1_000_000_000));
    assert_eq!(d.uplink.as_deref(), Some("eth0"));
    assert_eq!(
        d.limits_for("research").pod.get(OUT, INTERNET),
        Some(1_000_000_000)
    );
    assert_eq!(d.limits_for("batch").pod.get(OUT, INTERNET), None);
    assert_eq!(
        d.limits_for("default").pod.get(OUT, INTERNET),
        Some(100_000_000)
    );
    // Four distinct prefixes (one is in both lists) and the four metadata endpoints.
    assert_eq!(d.prefixes.len(), 8);
}

#[test]
fn classes_and_limits_at_every_level() {
    let p = Policy::parse(
        r#"
        internal_cidrs = ["10.0.0.0/8"]
        [internet]
        pod_ingress_rate = "1G"
        pod_egress_rate = "200M"
        namespace_ingress_rate = "2G"
        namespace_egress_rate = "1G"
        node_ingress_rate = "5G"
        node_egress_rate = "2G"
        [classes.mirrors]
        cidrs = ["203.0.113.0/24", "2001:db8:1::/48"]
        pod_ingress_rate = "500M"
        node_ingress_rate = "1G"
        [classes.datasets]
        cidrs = ["198.51.100.0/25"]
        namespace_ingress_rate = "300M"
        [namespaces.research.internet]
        namespace_ingress_rate = "unlimited"
        pod_ingress_rate = "100M"
        [namespaces.research.classes.mirrors]
        namespace_ingress_rate = "250M"
        "#,
    )
    .unwrap();
    let d = &p.datapath;
    assert_eq!(d.classes, ["datasets", "mirrors"]);
    assert_eq!(d.defaults.pod.get(IN, INTERNET), Some(1_000_000_000));
    assert_eq!(d.defaults.pod.get(IN, "mirrors"), Some(500_000_000));
    assert_eq!(d.defaults.namespace.get(IN, "datasets"), Some(300_000_000));
    assert_eq!(d.defaults.namespace.get(OUT, INTERNET), Some(1_000_000_000));
    assert_eq!(d.node.get(IN, INTERNET), Some(5_000_000_000));
    assert_eq!(d.node.get(IN, "mirrors"), Some(1_000_000_000));
    assert_eq!(d.node.get(OUT, INTERNET), Some(2_000_000_000));
    // The override replaces what it names and keeps the rest of the defaults.
    let r = d.limits_for("research");
    assert_eq!(r.pod.get(IN, INTERNET), Some(100_000_000));
    assert_eq!(r.pod.get(IN, "mirrors"), Some(500_000_000));
    assert_eq!(r.namespace.get(IN, INTERNET), None);
    assert_eq!(r.namespace.get(IN, "mirrors"), Some(250_000_000));
    assert_eq!(r.namespace.get(IN, "datasets"), Some(300_000_000));
    // Classification: a named class is a part of the internet; the most specific wins.
    assert_eq!(
        p.classify(ip("203.0.113.9")),
        Some(Dest::Named("mirrors".into()))
    );
    assert_eq!(
        p.classify(ip("2001:db8:1::7")),
        Some(Dest::Named("mirrors".into()))
    );
    assert_eq!(p.classify(ip("198.51.100.200")), None);
    assert_eq!(p.classify(ip("10.1.1.1")), Some(Dest::Internal));
}

#[test]
fn one_limit_under_both_spellings_is_refused() {
    let cases = [
        (
            "pod_internet_egress_rate = \"1M\"\n[internet]\npod_egress_rate = \"2M\"",
            "pod_internet_egress_rate and internet.pod_egress_rate",
        ),
        (
            "node_internet_egress_cap = \"1G\"\n[internet]\nnode_egress_rate = \"1G\"",
            "node_internet_egress_cap and internet.node_egress_rate",
        ),
        (
            "[namespaces.a]\ninternet_egress_rate = \"1M\"\n[namespaces.a.internet]\npod_egress_rate = \"1M\"",
            "namespaces.a.internet_egress_rate and namespaces.a.internet.pod_egress_rate",
        ),
    ];
    for (text, needle) in cases {
        let e = Policy::parse(text).expect_err(text);
        assert!(e.contains(needle), "{text:?}: {e}");
    }
    // Either spelling alone is fine.
    Policy::parse("[internet]\npod_egress_rate = \"2M\"").unwrap();
    Policy::parse("pod_internet_egress_rate = \"2M\"").unwrap();
}

#[test]
fn class_limits_and_counts_are_checked_naming_the_key() {
    let mut many = String::new();
    for i in 0..33 {
        many.push_str(&format!("[classes.c{i}]\ncidrs = [\"203.0.{i}.0/24\"]\n"));
    }
    let e = Policy::parse(&many).unwrap_err();
    assert!(e.contains("classes: 33 named classes, at most 32"), "{e}");
    many.truncate(many.find("[classes.c32]").unwrap());
    assert_eq!(Policy::parse(&many).unwrap().datapath.classes.len(), 32);

    // 65,536 prefixes and the metadata endpoints: too many.
    let cidrs: Vec<String> = (0..65_536u32)
        .map(|i| format!("\"10.{}.{}.0/24\"", i >> 8, i & 255))
        .collect();
    let text = format!(
        "[classes.big]\ncidrs = [{}]\n",
        cidrs[..65_536 - 4 + 1].join(",")
    );
    let e = Policy::parse(&text).unwrap_err();
    assert!(
        e.contains("distinct prefixes, at most 65536") && e.contains("classes' cidrs"),
        "{e}"
    );

    let cases = [
        ("[classes.internet]\ncidrs = []", "classes.internet"),
        ("[classes.Mirrors]\ncidrs = []", "classes.Mirrors"),
        ("[classes.a]\ncidrs = [\"1.2.3.4/8\"]", "classes.a.cidrs[0]"),
        ("[classes.a]\nrate = \"1M\"", "unknown field"),
        (
            "[classes.a]\ncidrs = [\"1.2.3.0/24\"]\n[classes.b]\ncidrs = [\"1.2.3.0/24\"]",
            "classes.b.cidrs[0]: 1.2.3.0/24 is also in classes.a.cidrs[0]",
        ),
        (
            "internal_cidrs = [\"1.2.3.0/24\"]\n[classes.b]\ncidrs = [\"1.2.3.0/24\"]",
            "is also in internal_cidrs[0]",
        ),
        (
            "[classes.a]\npod_ingress_rate = 0",
            "classes.a.pod_ingress_rate",
        ),
        (
            "[namespaces.x.classes.nope]\npod_ingress_rate = \"1M\"",
            "namespaces.x.classes.nope: no class",
        ),
        (
            "[namespaces.x.internet]\nnode_ingress_rate = \"1M\"",
            "unknown field",
        ),
    ];
    for (text, needle) in cases {
        let e = Policy::parse(text).expect_err(text);
        assert!(e.contains(needle), "{text:?}: error {e:?} lacks {needle:?}");
    }
    // Blocked wins over a class listing the same prefix.
    let p =
        Policy::parse("blocked_cidrs = [\"1.2.3.0/24\"]\n[classes.b]\ncidrs = [\"1.2.3.0/24\"]")
            .unwrap();
    assert_eq!(p.classify(ip("1.2.3.4")), Some(Dest::Blocked));
}

#[test]
fn most_specific_wins_and_ties_are_blocked() {
    let p = Policy::parse(FULL).unwrap();
    assert_eq!(p.classify(ip("10.1.2.3")), Some(Dest::Internal));
    assert_eq!(p.classify(ip("10.99.1.1")), Some(Dest::Blocked));
    assert_eq!(p.classify(ip("10.99.7.9")), Some(Dest::Internal));
    // Listed in both: blocked.
    assert_eq!(p.classify(ip("172.16.5.5")), Some(Dest::Blocked));
    assert_eq!(p.classify(ip("169.254.169.254")), Some(Dest::Blocked));
    assert_eq!(p.classify(ip("168.63.129.16")), Some(Dest::Blocked));
    assert_eq!(p.classify(ip("203.0.113.1")), None);
}

#[test]
fn ipv6_cidrs_in_every_list_classify_by_their_family() {
    let p = Policy::parse(
        r#"
        internal_cidrs = ["10.0.0.0/8", "fd00::/8", "2001:db8:ff::/48"]
        blocked_cidrs = ["fd00:99::/32", "2001:db8:ff:1::/64"]
        "#,
    )
    .unwrap();
    assert_eq!(p.classify(ip("fd00:240:1::5")), Some(Dest::Internal));
    assert_eq!(p.classify(ip("fd00:99::1")), Some(Dest::Blocked));
    assert_eq!(p.classify(ip("2001:db8:ff:2::1")), Some(Dest::Internal));
    // Longest prefix wins, within IPv6 as within IPv4.
    assert_eq!(p.classify(ip("2001:db8:ff:1::9")), Some(Dest::Blocked));
    assert_eq!(p.classify(ip("2001:db8::10")), None);
    // The families do not mix: ::ffff:10.0.0.1 is an IPv6 address outside fd00::/8.
    assert_eq!(p.classify(ip("::ffff:10.0.0.1")), None);
    assert_eq!(p.classify(ip("fd00:ec2::254")), Some(Dest::Blocked));
    assert_eq!(p.classify(ip("fd20:ce::254")), Some(Dest::Blocked));
    let v6 = p
        .datapath
        .prefixes
        .iter()
        .filter(|(n, _)| matches!(n, IpNet::V6(_)));
    // Four listed and the two IPv6 metadata endpoints.
    assert_eq!(v6.count(), 6);
}

#[test]
fn metadata_blocking_can_be_disabled() {
    let p = Policy::parse("block_cloud_metadata = false").unwrap();
    assert!(p.prefixes().is_empty());
    let p = Policy::parse("").unwrap();
    assert_eq!(p, Policy::default());
    assert_eq!(p.prefixes().len(), 4);
}

#[test]
fn rejects_bad_input_with_the_key_named() {
    let cases = [
        (r#"internal_cidrs = ["10.0.0.1/8"]"#, "internal_cidrs[0]"),
        (r#"internal_cidrs = ["10.0.0.1/8"]"#, "host bits"),
        (
            r#"blocked_cidrs = ["1.2.3.0/24", "nonsense"]"#,
            "blocked_cidrs[1]",
        ),
        (r#"blocked_cidrs = ["fd00::1/8"]"#, "host bits"),
        (r#"internal_cidrs = ["10.0.0.0/33"]"#, "above 32"),
        (r#"internal_cidrs = ["fd00::/129"]"#, "above 128"),
        (
            r#"internal_cidrs = ["fd00::g/16"]"#,
            "not an IPv4 or IPv6 address",
        ),
        (
            r#"pod_internet_egress_rate = "fast""#,
            "pod_internet_egress_rate",
        ),
        (r#"pod_internet_egress_rate = 0"#, "zero"),
        (r#"node_internet_egress_cap = "10""#, "below the minimum"),
        ("pod_internet_egress = \"1M\"", "unknown field"),
        (
            "[namespaces.Bad_Name]\ninternet_egress_rate = \"1M\"",
            "namespaces.Bad_Name",
        ),
        ("[namespaces.ok]\nrate = \"1M\"", "unknown field"),
        ("[internet]\nrate = \"1M\"", "unknown field"),
        (
            "[internet]\npod_ingress_rate = \"2P\"",
            "internet.pod_ingress_rate",
        ),
        ("uplink = \"a/b\"", "uplink"),
        ("internal_cidrs = [", "expected"),
    ];
    for (text, needle) in cases {
        let e = Policy::parse(text).expect_err(text);
        assert!(e.contains(needle), "{text:?}: error {e:?} lacks {needle:?}");
    }
}

#[test]
fn load_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shaper.toml");
    std::fs::write(&path, "internal_cidrs = [\"x\"]").unwrap();
    let e = Policy::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("shaper.toml") && e.contains("internal_cidrs[0]"),
        "{e}"
    );
    let e = Policy::load(&dir.path().join("missing.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.toml"), "{e}");
}

#[test]
fn cluster_budgets_in_every_class_table() {
    use aliasnet_budget::{BudgetKey, Direction as D};
    let p = Policy::parse(
        r#"
        [cluster]
        etcd_endpoints = ["http://10.0.0.5:2379"]
        share_period = "1s"
        [internet]
        node_ingress_rate = "10G"
        cluster_ingress_rate = "400G"
        [classes.mirrors]
        cidrs = ["203.0.113.0/24"]
        cluster_ingress_rate = "40G"
        cluster_egress_rate = "1G"
        [namespaces.research.internet]
        cluster_egress_rate = "2G"
        [namespaces.research.classes.mirrors]
        namespace_ingress_rate = "1G"
        cluster_ingress_rate = "10G"
        "#,
    )
    .unwrap();
    let cluster = p.budgets.cluster.as_ref().expect("[cluster]");
    assert_eq!(cluster.share_period, std::time::Duration::from_secs(1));
    let got: Vec<(BudgetKey, u64)> = p
        .budgets
        .budgets
        .iter()
        .map(|b| (b.key.clone(), b.rate))
        .collect();
    let k = |ns, c, d| BudgetKey::new(ns, c, d);
    assert_eq!(
        got,
        vec![
            (k(None, "internet", D::Ingress), 400_000_000_000),
            (k(None, "mirrors", D::Ingress), 40_000_000_000),
            (k(None, "mirrors", D::Egress), 1_000_000_000),
            (k(Some("research"), "internet", D::Egress), 2_000_000_000),
            (k(Some("research"), "mirrors", D::Ingress), 10_000_000_000),
        ]
    );
    // The node policy is the one without the budgets: shares cap it while shaperd runs.
    assert_eq!(p.datapath.node.get(IN, "mirrors"), None);
    assert_eq!(
        p.datapath
            .limits_for("research")
            .namespace
            .get(IN, "mirrors"),
        Some(1_000_000_000)
    );
    assert_eq!(Policy::parse("").unwrap().budgets.cluster, None);
}

#[test]
fn cluster_keys_are_checked_naming_the_key() {
    let cluster = "[cluster]\netcd_endpoints = [\"http://10.0.0.5:2379\"]\n";
    let cases = [
        (
            "[classes.m]\ncidrs = []\ncluster_ingress_rate = \"1G\"".to_owned(),
            "needs [cluster]",
        ),
        (
            format!("{cluster}[internet]\ncluster_ingress_rate = \"fast\""),
            "internet.cluster_ingress_rate",
        ),
        (
            format!("{cluster}[namespaces.a.internet]\ncluster_egress_rate = 0"),
            "namespaces.a.internet.cluster_egress_rate",
        ),
        (
            format!("{cluster}share_period = \"1h\""),
            "cluster.share_period",
        ),
        (
            format!("{cluster}etcd_password = \"x\""),
            "cluster.etcd_password: unknown key",
        ),
        (
            "[cluster]\nshare_period = \"1s\"".to_owned(),
            "cluster.etcd_endpoints",
        ),
        (
            format!("{cluster}[internet]\ncluster_rate = \"1G\""),
            "unknown field",
        ),
    ];
    for (text, needle) in cases {
        let e = Policy::parse(&text).expect_err(&text);
        assert!(e.contains(needle), "{text:?}: error {e:?} lacks {needle:?}");
    }
}
