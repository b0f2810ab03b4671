use super::*;

const CLUSTER: &str = "[cluster]\netcd_endpoints = [\"http://10.0.0.5:2379\"]\n";

fn err(text: &str) -> ConfigError {
    BudgetPolicy::parse(text).expect_err(text)
}

#[test]
fn no_cluster_no_budgets() {
    let p = BudgetPolicy::parse("internal_cidrs = []\n[internet]\nnode_ingress_rate = \"1G\"\n")
        .unwrap();
    assert_eq!(p, BudgetPolicy::default());
}

#[test]
fn budgets_of_every_table() {
    let text = format!(
        "{CLUSTER}
[internet]
cluster_ingress_rate = \"400G\"
node_ingress_rate = \"5G\"
[classes.mirrors]
cidrs = [\"203.0.113.0/24\"]
cluster_ingress_rate = \"40G\"
cluster_egress_rate = 1000000
[namespaces.research.internet]
cluster_egress_rate = \"1G\"
[namespaces.research.classes.mirrors]
cluster_ingress_rate = \"10G\"
namespace_ingress_rate = \"500M\"
[namespaces.other.classes.mirrors]
cluster_ingress_rate = \"unlimited\"
"
    );
    let p = BudgetPolicy::parse(&text).unwrap();
    let got: Vec<(String, u64)> = p.budgets.iter().map(|b| (b.key.id(), b.rate)).collect();
    assert_eq!(
        got,
        [
            ("internet.ingress".to_owned(), 400_000_000_000),
            ("mirrors.ingress".to_owned(), 40_000_000_000),
            ("mirrors.egress".to_owned(), 1_000_000),
            ("research.internet.egress".to_owned(), 1_000_000_000),
            ("research.mirrors.ingress".to_owned(), 10_000_000_000),
        ]
    );
    let c = p.cluster.unwrap();
    assert_eq!(c.endpoints, ["http://10.0.0.5:2379"]);
    assert_eq!(c.prefix, DEFAULT_PREFIX);
    assert_eq!(c.share_period, Duration::from_secs(2));
    assert_eq!(c.lease_ttl, Duration::from_secs(10));
    assert_eq!(c.fallback_nodes, DEFAULT_FALLBACK_NODES);
    assert_eq!(c.tls, None);
}

#[test]
fn budget_ids_round_trip() {
    for k in [
        BudgetKey::new(None, "mirrors", Direction::Ingress),
        BudgetKey::new(Some("research"), "internet", Direction::Egress),
        BudgetKey::new(Some("ingress"), "egress", Direction::Ingress),
    ] {
        assert_eq!(BudgetKey::from_id(&k.id()), Some(k));
    }
    for bad in [
        "mirrors",
        "a.b.c.d",
        "mirrors.up",
        "Mirrors.ingress",
        ".ingress",
    ] {
        assert_eq!(BudgetKey::from_id(bad), None, "{bad}");
    }
}

#[test]
fn budgets_need_a_cluster() {
    let e = err("[classes.mirrors]\ncidrs = []\ncluster_ingress_rate = \"1G\"\n");
    assert_eq!(e.key, "mirrors.ingress");
    assert!(e.reason.contains("[cluster]"), "{e}");
}

#[test]
fn namespace_budget_needs_its_class() {
    let e = err(&format!(
        "{CLUSTER}[namespaces.research.classes.pypi]\ncluster_ingress_rate = \"1G\"\n"
    ));
    assert_eq!(e.key, "namespaces.research.classes.pypi");
}

#[test]
fn bad_rates_name_their_key() {
    for (body, reason) in [
        ("cluster_ingress_rate = \"fast\"", "quantity"),
        ("cluster_ingress_rate = 0", "zero"),
        ("cluster_ingress_rate = -5", "negative"),
        ("cluster_egress_rate = 10", "minimum"),
        ("cluster_egress_rate = true", "rate"),
    ] {
        let e = err(&format!("{CLUSTER}[classes.mirrors]\ncidrs = []\n{body}\n"));
        assert!(e.key.starts_with("classes.mirrors.cluster_"), "{e}");
        assert!(e.reason.contains(reason), "{body}: {e}");
    }
}

#[test]
fn class_named_internet_is_refused() {
    let e = err(&format!(
        "{CLUSTER}[classes.internet]\ncluster_ingress_rate = \"1G\"\n"
    ));
    assert_eq!(e.key, "classes.internet");
}

fn cluster(body: &str) -> Result<ClusterConfig, ConfigError> {
    ClusterConfig::from_table(&body.parse::<Table>().unwrap())
}

#[test]
fn cluster_keys() {
    let c = cluster(
        "etcd_endpoints = [\"https://a.example:2379\", \"https://10.0.0.6:2379\"]
etcd_ca_file = \"/etc/aliasnet/etcd/ca.crt\"
etcd_cert_file = \"/etc/aliasnet/etcd/tls.crt\"
etcd_key_file = \"/etc/aliasnet/etcd/tls.key\"
etcd_prefix = \"/prod/aliasnet/\"
share_period = \"1s\"
fallback_nodes = 7500",
    )
    .unwrap();
    assert_eq!(c.prefix, "/prod/aliasnet");
    assert_eq!(c.share_period, Duration::from_secs(1));
    assert_eq!(c.lease_ttl, Duration::from_secs(5));
    assert_eq!(c.fallback_nodes, 7500);
    let tls = c.tls.unwrap();
    assert_eq!(tls.ca, PathBuf::from("/etc/aliasnet/etcd/ca.crt"));
    assert!(tls.identity.is_some());
    // An explicit TTL wins; the default is whole seconds, at least 3 s.
    let c = cluster("etcd_endpoints = [\"http://e:2379\"]\nshare_period = \"500ms\"").unwrap();
    assert_eq!(c.lease_ttl, Duration::from_secs(3));
    let c = cluster("etcd_endpoints = [\"http://e:2379\"]\nshare_period = \"700ms\"").unwrap();
    assert_eq!(c.lease_ttl, Duration::from_secs(4));
    let c = cluster("etcd_endpoints = [\"http://e:2379\"]\nshare_period = \"300ms\"");
    assert!(c.is_err());
    let c = cluster("etcd_endpoints = [\"http://e:2379\"]\nlease_ttl = \"30s\"").unwrap();
    assert_eq!(c.lease_ttl, Duration::from_secs(30));
}

#[test]
fn bad_cluster_keys_name_their_key() {
    for (body, key) in [
        ("", "cluster.etcd_endpoints"),
        ("etcd_endpoints = []", "cluster.etcd_endpoints"),
        ("etcd_endpoints = [\"10.0.0.5:2379\"]", "cluster.etcd_endpoints[0]"),
        ("etcd_endpoints = [\"http://10.0.0.5\"]", "cluster.etcd_endpoints[0]"),
        ("etcd_endpoints = [\"http://e:2379/x\"]", "cluster.etcd_endpoints[0]"),
        ("etcd_endpoints = [\"http://e:2379\", \"https://f:2379\"]", "cluster.etcd_endpoints"),
        ("etcd_endpoints = [\"https://e:2379\"]", "cluster.etcd_ca_file"),
        ("etcd_endpoints = [\"http://e:2379\"]\netcd_ca_file = \"/ca\"", "cluster.etcd_endpoints"),
        (
            "etcd_endpoints = [\"https://e:2379\"]\netcd_ca_file = \"/ca\"\netcd_cert_file = \"/c\"",
            "cluster.etcd_key_file",
        ),
        ("etcd_endpoints = [\"http://e:2379\"]\netcd_prefix = \"aliasnet\"", "cluster.etcd_prefix"),
        ("etcd_endpoints = [\"http://e:2379\"]\netcd_prefix = \"/\"", "cluster.etcd_prefix"),
        ("etcd_endpoints = [\"http://e:2379\"]\nshare_period = \"2\"", "cluster.share_period"),
        ("etcd_endpoints = [\"http://e:2379\"]\nshare_period = \"100ms\"", "cluster.share_period"),
        ("etcd_endpoints = [\"http://e:2379\"]\nlease_ttl = \"2s\"", "cluster.lease_ttl"),
        (
            "etcd_endpoints = [\"http://e:2379\"]\nshare_period = \"5s\"\nlease_ttl = \"8s\"",
            "cluster.lease_ttl",
        ),
        ("etcd_endpoints = [\"http://e:2379\"]\nlease_ttl = \"2500ms\"", "cluster.lease_ttl"),
        ("etcd_endpoints = [\"http://e:2379\"]\nfallback_nodes = 0", "cluster.fallback_nodes"),
        ("etcd_endpoints = [\"http://e:2379\"]\netcd_password = \"x\"", "cluster.etcd_password"),
    ] {
        let e = cluster(body).expect_err(body);
        assert_eq!(e.key, key, "{body}: {e}");
    }
}
