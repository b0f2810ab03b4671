//! Downloads (and uploads) by destination class, limited per pod, per namespace and per node,
//! through the real `aliasnet`, `aliasnet-ipamd` and `aliasnet-shaperd` on the namespace
//! fabric: every limit holds (90-105 % of it), pods of one aggregate share it fairly, other
//! traffic is not slowed, the policy is a ceiling a pod's annotations cannot lift, and a
//! policy change moves running transfers without resetting counters.

use std::time::Duration;

use aliasnet_ebpf::abi::{self, Class, Direction};
use aliasnet_tests::{
    datapath::ANNOTATIONS,
    fabric::{
        Fabric, FabricOpts, Node, Pod, Stack, INTERNET_IP, INTERNET_IP2, INTERNET_IP6,
        INTERNET_IP6_2,
    },
    netns::Netns,
    require_root,
    traffic::{
        concurrent_downloads, concurrent_transfers, idle_seconds, jain, received_bps,
        run_transfers, tcp_segments, transfers, Transfer,
    },
};
use serde_json::json;

const SECS: u32 = 4;
/// The internet host's second address: the `mirrors` class of these tests.
const MIRRORS: &str = "198.51.100.0/24";
/// How long shaperd takes at most to reconcile the aggregates after an ADD (it looks every
/// 250 ms).
const RECONCILE: Duration = Duration::from_millis(1500);

fn mbps(v: &[f64]) -> Vec<String> {
    v.iter().map(|b| format!("{:.1}", b / 1e6)).collect()
}

/// A fabric of `nodes` nodes with `policy`, the plugin taking bandwidth and annotations.
fn fabric(nodes: usize, policy: &str) -> Fabric {
    fabric_of(nodes, policy, Stack::Ipv4)
}

/// [`fabric`] whose pods have the addresses of `stack`.
fn fabric_of(nodes: usize, policy: &str, stack: Stack) -> Fabric {
    Fabric::new(FabricOpts {
        nodes,
        stack,
        shaper_policy: format!("internal_cidrs = [\"10.0.0.0/8\", \"fd00::/8\"]\n{policy}"),
        plugin_extra: json!({"capabilities": {"bandwidth": true, ANNOTATIONS: true}}),
        ..Default::default()
    })
    .expect("build fabric")
}

fn pods(n: &Node, namespace: &str, names: &[&str]) -> Vec<Pod> {
    names
        .iter()
        .map(|p| n.add_pod_in(p, namespace, None).expect("ADD"))
        .collect()
}

/// Asserts `bps` is 90-105 % of `limit`.
#[track_caller]
fn assert_limit(what: &str, bps: f64, limit: f64) {
    let pct = bps / limit * 100.0;
    assert!(
        (90.0..=105.0).contains(&pct),
        "{what}: {:.1} Mbit/s is {pct:.1} % of {:.0} Mbit/s",
        bps / 1e6,
        limit / 1e6
    );
}

/// Runs downloads from the internet into `clients` and checks the internet's sender lost
/// under 1 % of its segments and no download had a second without bytes.
fn downloads(f: &Fabric, clients: &[&Netns], src: &str) -> Vec<f64> {
    let pairs: Vec<(&Netns, &str)> = clients.iter().map(|c| (*c, src)).collect();
    downloads_from(f, &pairs)
}

/// [`downloads`], each client from its own address of the internet host.
fn downloads_from(f: &Fabric, pairs: &[(&Netns, &str)]) -> Vec<f64> {
    let paced: Vec<(&Netns, &str, Option<&str>)> =
        pairs.iter().map(|(c, a)| (*c, *a, None)).collect();
    downloads_paced(f, &paced)
}

/// [`downloads_from`], each sender paced at its rate if given (iperf3's `-b`).
fn downloads_paced(f: &Fabric, each: &[(&Netns, &str, Option<&str>)]) -> Vec<f64> {
    let inet = f.internet.name.as_str();
    let each: Vec<Transfer> = each
        .iter()
        .map(|&(client, addr, pace)| Transfer {
            client,
            server: inet,
            addr,
            pace,
        })
        .collect();
    let before = tcp_segments(&f.internet.name).unwrap();
    let runs = run_transfers(&each, SECS, None, true).unwrap();
    let after = tcp_segments(&f.internet.name).unwrap();
    let (out, re) = (after.0 - before.0, after.1 - before.1);
    assert!(
        (re as f64) < out as f64 / 100.0,
        "{re} of {out} segments retransmitted"
    );
    for r in &runs {
        assert_eq!(idle_seconds(r), 0, "a second without bytes: {r}");
    }
    runs.iter().map(received_bps).collect()
}

#[test]
fn a_namespace_shares_its_download_limit_among_its_pods() {
    require_root();
    let f = fabric(
        1,
        r#"
        [internet]
        namespace_ingress_rate = "40M"
        [namespaces.other.internet]
        namespace_ingress_rate = "unlimited"
        "#,
    );
    let n = f.node(1);
    let team = pods(n, "team", &["t0", "t1", "t2"]);
    let other = n.add_pod_in("o", "other", None).unwrap();
    std::thread::sleep(RECONCILE);
    let clients: Vec<&Netns> = team.iter().map(|p| &p.ns).chain([&other.ns]).collect();
    let got = downloads(&f, &clients, &INTERNET_IP.to_string());
    let team_total: f64 = got[..3].iter().sum();
    eprintln!(
        "team {:?} Mbit/s (Jain {:.3}), other {:?}",
        mbps(&got[..3]),
        jain(&got[..3]),
        mbps(&got[3..])
    );
    assert_limit("the namespace's downloads", team_total, 40e6);
    assert!(jain(&got[..3]) >= 0.95, "fairness: {got:?}");
    assert!(
        got[3] > 200e6,
        "another namespace's pod is not slowed: {got:?}"
    );
}

#[test]
fn the_node_download_limit_covers_every_namespace() {
    require_root();
    let f = fabric(
        1,
        r#"
        [internet]
        node_ingress_rate = "40M"
        "#,
    );
    let n = f.node(1);
    let a = n.add_pod_in("a", "x", None).unwrap();
    let b = n.add_pod_in("b", "y", None).unwrap();
    std::thread::sleep(RECONCILE);
    let got = downloads(&f, &[&a.ns, &b.ns], &INTERNET_IP.to_string());
    eprintln!("x, y: {:?} Mbit/s (Jain {:.3})", mbps(&got), jain(&got));
    assert_limit("the node's downloads", got.iter().sum(), 40e6);
    assert!(jain(&got) >= 0.95, "fairness: {got:?}");
    let dp = n.datapath();
    let staged = dp.node_counters().unwrap()[abi::DIR_INGRESS];
    assert!(
        staged.bytes > 10_000_000,
        "the uplink put them in: {staged:?}"
    );
}

#[test]
fn a_class_download_limit_sits_inside_the_internet_one() {
    require_root();
    let f = fabric(
        1,
        &format!(
            r#"
            [internet]
            pod_ingress_rate = "40M"
            [classes.mirrors]
            cidrs = ["{MIRRORS}"]
            pod_ingress_rate = "10M"
            "#
        ),
    );
    let n = f.node(1);
    let p = n.add_pod_in("p", "team", None).unwrap();
    let inet = f.internet.name.as_str();
    let (plain, mirrors) = (INTERNET_IP.to_string(), INTERNET_IP2.to_string());
    let runs = transfers(
        &[
            (&p.ns, inet, plain.as_str()),
            (&p.ns, inet, mirrors.as_str()),
        ],
        SECS,
        None,
        true,
        None,
    )
    .unwrap();
    let got: Vec<f64> = runs.iter().map(received_bps).collect();
    eprintln!("internet, mirrors: {:?} Mbit/s", mbps(&got));
    assert_limit("the mirrors class", got[1], 10e6);
    assert_limit(
        "the pod's internet (the class included)",
        got.iter().sum(),
        40e6,
    );
    // Counted by class: mirrors' bytes are not plain internet's.
    let c = n.record(&p).counters;
    let names = n.datapath().class_names().unwrap();
    let k = names
        .iter()
        .position(|x| x.as_deref() == Some("mirrors"))
        .expect("the class has an index");
    let named = c.get(Direction::Ingress, Class::Named(k as u8)).bytes as f64;
    let plain_bytes = c.get(Direction::Ingress, Class::Internet).bytes as f64;
    assert!(
        named > 0.8 * got[1] / 8.0 * f64::from(SECS) && plain_bytes > 2.0 * named,
        "counters by class: mirrors {named} B, internet {plain_bytes} B"
    );
}

#[test]
fn policy_is_a_ceiling_the_pods_annotations_cannot_lift() {
    require_root();
    let f = fabric(
        1,
        r#"
        [internet]
        pod_ingress_rate = "20M"
        pod_egress_rate = "20M"
        "#,
    );
    let n = f.node(1);
    let annotations = |rate: &str| {
        json!({ ANNOTATIONS: {
            "aliasnet.io/internet-ingress-bandwidth": rate,
            "aliasnet.io/internet-egress-bandwidth": rate,
        }})
    };
    let greedy = n
        .add_pod_in("greedy", "team", Some(&annotations("1P")))
        .unwrap();
    let modest = n
        .add_pod_in("modest", "team", Some(&annotations("5M")))
        .unwrap();
    for (p, want) in [(&greedy, 20_000_000), (&modest, 5_000_000)] {
        let m = n.record(p).meta;
        assert_eq!(
            (m.internet_ingress_rate(), m.internet_egress_rate()),
            (want, want),
            "{}",
            p.name
        );
    }
    let src = INTERNET_IP.to_string();
    let down = downloads(&f, &[&greedy.ns], &src);
    assert_limit("1P asked for, 20M given (download)", down[0], 20e6);
    let up =
        concurrent_transfers(&[&greedy.ns], &f.internet.name, &src, SECS, None, false).unwrap();
    assert_limit(
        "1P asked for, 20M given (upload)",
        received_bps(&up[0]),
        20e6,
    );
}

#[test]
fn internal_downloads_run_at_line_rate_beside_a_limited_one() {
    require_root();
    let f = fabric(
        2,
        r#"
        [internet]
        pod_ingress_rate = "20M"
        namespace_ingress_rate = "30M"
        node_ingress_rate = "50M"
        "#,
    );
    let p = f.node(1).add_pod_in("p", "team", None).unwrap();
    let peer = f.node(2).add_pod_in("peer", "team", None).unwrap();
    std::thread::sleep(RECONCILE);
    // The internal download is paced at a rate this node carries easily: what it would
    // get unshaped. A limit it met, or a queue it shared with the limited download, would
    // hold it far below.
    let pace = 2e9;
    let (inet, peer_ip) = (INTERNET_IP.to_string(), peer.ip.to_string());
    let both = transfers(
        &[
            (&p.ns, peer.ns.name.as_str(), peer_ip.as_str()),
            (&p.ns, f.internet.name.as_str(), inet.as_str()),
        ],
        SECS,
        None,
        true,
        Some("2G"),
    )
    .unwrap();
    let (internal, internet) = (received_bps(&both[0]), received_bps(&both[1]));
    eprintln!(
        "internal {:.0} Mbit/s (paced at {:.0}) beside a limited download of {:.1} Mbit/s",
        internal / 1e6,
        pace / 1e6,
        internet / 1e6
    );
    assert_limit("the limited internet download", internet, 20e6);
    assert!(
        internal >= 0.9 * pace,
        "the internal download slowed: {internal} of {pace}"
    );
}

#[test]
fn namespace_and_node_upload_limits() {
    require_root();
    let f = fabric(
        1,
        &format!(
            r#"
            [internet]
            namespace_egress_rate = "30M"
            [classes.mirrors]
            cidrs = ["{MIRRORS}"]
            node_egress_rate = "10M"
            "#
        ),
    );
    let n = f.node(1);
    let team = pods(n, "team", &["u0", "u1"]);
    std::thread::sleep(RECONCILE);
    let clients: Vec<&Netns> = team.iter().map(|p| &p.ns).collect();
    let inet = &f.internet.name;
    let up =
        concurrent_transfers(&clients, inet, &INTERNET_IP.to_string(), SECS, None, false).unwrap();
    let got: Vec<f64> = up.iter().map(received_bps).collect();
    eprintln!("namespace uploads {:?} Mbit/s", mbps(&got));
    assert_limit("the namespace's uploads", got.iter().sum(), 30e6);
    assert!(jain(&got) >= 0.95, "fairness: {got:?}");
    let up =
        concurrent_transfers(&clients, inet, &INTERNET_IP2.to_string(), SECS, None, false).unwrap();
    let got: Vec<f64> = up.iter().map(received_bps).collect();
    eprintln!("uploads to mirrors {:?} Mbit/s", mbps(&got));
    assert_limit("the node's uploads to mirrors", got.iter().sum(), 10e6);
}

#[test]
fn a_policy_change_moves_running_transfers_and_keeps_counters() {
    require_root();
    let f = fabric(
        1,
        r#"
        [internet]
        pod_ingress_rate = "40M"
        "#,
    );
    let n = f.node(1);
    let p = n.add_pod_in("p", "team", None).unwrap();
    let src = INTERNET_IP.to_string();
    let (v, before) = std::thread::scope(|s| {
        let run = s.spawn(|| concurrent_downloads(&[&p.ns], &f.internet.name, &src, 8, None));
        std::thread::sleep(Duration::from_secs(3));
        let before = n.record(&p).counters.internet(Direction::Ingress);
        // The plain internet's host becomes a named class with its own, lower limit.
        std::fs::write(
            &n.shaper_paths.config,
            r#"
            internal_cidrs = ["10.0.0.0/8", "fd00::/8"]
            [internet]
            pod_ingress_rate = "40M"
            [classes.moved]
            cidrs = ["203.0.113.0/24"]
            pod_ingress_rate = "10M"
            "#,
        )
        .unwrap();
        (run.join().unwrap().unwrap(), before)
    });
    let after = n.record(&p).counters.internet(Direction::Ingress);
    assert!(
        after.bytes > before.bytes,
        "counters kept: {before:?} {after:?}"
    );
    let per_sec: Vec<f64> = v[0]["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap())
        .collect();
    eprintln!("per second: {:?} Mbit/s", mbps(&per_sec));
    // Shaperd polls the file every second: two polls and the last seconds run at 10M.
    assert_limit(
        "before the change",
        per_sec[1..3].iter().sum::<f64>() / 2.0,
        40e6,
    );
    assert_limit("after it", per_sec[6..].iter().sum::<f64>() / 2.0, 10e6);
}

/// The internet host's prefix behind its link (2001:db8:1::10 is in it, 2001:db8::10 is not):
/// the IPv6 `mirrors` class of these tests.
const MIRRORS6: &str = "2001:db8:1::/48";

/// The index of the class `name` in the node's classifier.
fn class_index(n: &Node, name: &str) -> u8 {
    let names = n.datapath().class_names().unwrap();
    let k = names
        .iter()
        .position(|x| x.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("class {name} has no index: {names:?}"));
    u8::try_from(k).unwrap()
}

#[test]
fn an_ipv6_class_is_counted_and_limited_inside_the_internet_limit() {
    require_root();
    let f = fabric_of(
        1,
        &format!(
            r#"
            [internet]
            pod_ingress_rate = "40M"
            [classes.mirrors]
            cidrs = ["{MIRRORS6}"]
            pod_ingress_rate = "10M"
            "#
        ),
        Stack::Dual,
    );
    let n = f.node(1);
    let p = n.add_pod_in("p", "team", None).unwrap();
    let (plain, mirrors) = (INTERNET_IP6.to_string(), INTERNET_IP6_2.to_string());
    let got = downloads_from(&f, &[(&p.ns, plain.as_str()), (&p.ns, mirrors.as_str())]);
    eprintln!("IPv6 internet, mirrors: {:?} Mbit/s", mbps(&got));
    assert_limit("the mirrors class over IPv6", got[1], 10e6);
    assert_limit(
        "the pod's internet over IPv6 (the class included)",
        got.iter().sum(),
        40e6,
    );
    let c = n.record(&p).counters;
    let k = class_index(n, "mirrors");
    let named = c.get(Direction::Ingress, Class::Named(k)).bytes as f64;
    let plain_bytes = c.get(Direction::Ingress, Class::Internet).bytes as f64;
    assert!(
        named > 0.8 * got[1] / 8.0 * f64::from(SECS) && plain_bytes > 2.0 * named,
        "IPv6 counters by class: mirrors {named} B, internet {plain_bytes} B"
    );
}

#[test]
fn a_namespace_download_limit_holds_for_ipv6() {
    require_root();
    let f = fabric_of(
        1,
        r#"
        [internet]
        namespace_ingress_rate = "30M"
        [namespaces.other.internet]
        namespace_ingress_rate = "unlimited"
        "#,
        Stack::Dual,
    );
    let n = f.node(1);
    let team = pods(n, "team", &["t0", "t1", "t2"]);
    let other = n.add_pod_in("o", "other", None).unwrap();
    std::thread::sleep(RECONCILE);
    // The other namespace's download is paced at a rate it gets unshaped on this node; a
    // limit it met, or a queue it shared with the team's, would hold it far below.
    let (src, pace) = (INTERNET_IP6.to_string(), 500e6);
    let mut each: Vec<(&Netns, &str, Option<&str>)> =
        team.iter().map(|p| (&p.ns, src.as_str(), None)).collect();
    each.push((&other.ns, &src, Some("500M")));
    let got = downloads_paced(&f, &each);
    eprintln!(
        "IPv6: team {:?} Mbit/s (Jain {:.3}), other {:?} (paced at 500)",
        mbps(&got[..3]),
        jain(&got[..3]),
        mbps(&got[3..])
    );
    assert_limit(
        "the namespace's IPv6 downloads",
        got[..3].iter().sum(),
        30e6,
    );
    assert!(jain(&got[..3]) >= 0.95, "fairness: {got:?}");
    assert!(
        got[3] >= 0.9 * pace,
        "another namespace's pod is not slowed: {got:?}"
    );
}

#[test]
fn ipv4_and_ipv6_downloads_of_a_namespace_share_one_aggregate() {
    require_root();
    let f = fabric_of(
        1,
        r#"
        [internet]
        namespace_ingress_rate = "30M"
        "#,
        Stack::Dual,
    );
    let n = f.node(1);
    let team = pods(n, "team", &["v4", "v6"]);
    std::thread::sleep(RECONCILE);
    let (v4, v6) = (INTERNET_IP.to_string(), INTERNET_IP6.to_string());
    let got = downloads_from(
        &f,
        &[(&team[0].ns, v4.as_str()), (&team[1].ns, v6.as_str())],
    );
    eprintln!(
        "IPv4, IPv6: {:?} Mbit/s (Jain {:.3})",
        mbps(&got),
        jain(&got)
    );
    assert_limit("one namespace over both families", got.iter().sum(), 30e6);
    assert!(jain(&got) >= 0.95, "fairness: {got:?}");
    // The same pod over both families at once: one namespace aggregate too.
    let both = downloads_from(
        &f,
        &[(&team[0].ns, v4.as_str()), (&team[0].ns, v6.as_str())],
    );
    eprintln!("one pod, IPv4 and IPv6: {:?} Mbit/s", mbps(&both));
    assert_limit("one pod over both families", both.iter().sum(), 30e6);
}
