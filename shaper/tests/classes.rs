//! Named classes across policy reloads, seen by users through the library's records and the
//! exporter's families: a class that stays keeps its counters, and a new class that takes
//! the index a removed class left starts from zero, per pod and in the node's and
//! namespaces' totals. Root only.

mod fabric;

use aliasnet_ebpf::{
    abi::{self, Class, Direction},
    Datapath, Limits,
};
use aliasnet_shaper::{
    metrics::{Exporter, ExporterOptions},
    Policy,
};
use fabric::*;

const BASE: &str = "internal_cidrs = [\"10.0.0.0/8\", \"100.64.0.0/16\"]\n";
/// INTERNET's and MIRROR's prefixes.
const WEB: &str = "[classes.web]\ncidrs = [\"203.0.113.0/24\"]\n";
const DOWNLOADS: &str = "[classes.downloads]\ncidrs = [\"203.0.113.0/24\"]\n";
const MIRRORS: &str = "[classes.mirrors]\ncidrs = [\"198.51.100.0/24\"]\n";

fn apply(f: &Fabric, dp: &mut Datapath, text: &str) {
    let policy = Policy::parse(text).expect("policy");
    f.in_node(|| dp.apply_policy(&policy))
        .expect("apply policy");
}

fn index_of(dp: &Datapath, class: &str) -> usize {
    let names = dp.class_names().unwrap();
    names
        .iter()
        .position(|n| n.as_deref() == Some(class))
        .unwrap_or_else(|| panic!("no class {class} in {names:?}"))
}

/// The pod's counter of named class `class`, egress.
fn pod_egress(dp: &Datapath, class: &str) -> abi::Counter {
    let k = index_of(dp, class);
    let rec = dp.pod(CONTAINER_ID, "eth0").unwrap().expect("attached");
    assert_eq!(
        rec.counters
            .get(Direction::Ingress, Class::Named(k as u8))
            .packets,
        rec.counters
            .get(Direction::Egress, Class::Named(k as u8))
            .packets,
        "one echo reply per request"
    );
    rec.counters.get(Direction::Egress, Class::Named(k as u8))
}

/// The value of `family` whose labels include every one of `labels` (`name="value"`).
fn value(text: &str, family: &str, labels: &[&str]) -> Option<u64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .unwrap()
                .parse()
                .expect("counter value")
        })
}

/// Egress packets of `class`: the pod's, its namespace's... as `text` exports them.
fn exported(text: &str, class: &str) -> (Option<u64>, Option<u64>) {
    let c = format!("class=\"{class}\"");
    let labels = [c.as_str(), "direction=\"egress\""];
    (
        value(text, "aliasnet_pod_packets_total", &labels),
        value(text, "aliasnet_node_packets_total", &labels),
    )
}

#[test]
fn a_class_that_takes_a_removed_class_index_starts_from_zero() {
    require_root();
    let f = Fabric::new();
    let path = f.write_policy(&format!("{BASE}{WEB}{MIRRORS}"));
    let out = f.shaperd_once(&path);
    assert!(out.status.success(), "{out:?}");
    let mut dp = f.open();
    let att = f.attachment(Limits::default());
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    let opts = || ExporterOptions {
        qdisc_stats: false,
        ..Default::default()
    };
    // One exporter samples every step; the other sees only the start and the end (the index
    // passes from web to downloads between two of its samples).
    let mut every = Exporter::new(f.open(), opts());
    let mut seldom = Exporter::new(f.open(), opts());
    every.render().unwrap();
    seldom.render().unwrap();

    assert_eq!(f.ping("pod", INTERNET, 5, 100, &[]), 5);
    assert_eq!(f.ping("pod", MIRROR, 3, 100, &[]), 3);
    assert_eq!(pod_egress(&dp, "web").packets, 5);
    assert_eq!(pod_egress(&dp, "mirrors").packets, 3);
    let text = every.render().unwrap();
    assert_eq!(exported(&text, "web"), (Some(5), Some(5)), "{text}");
    assert_eq!(exported(&text, "mirrors"), (Some(3), Some(3)), "{text}");
    let web = index_of(&dp, "web");
    let mirrors = index_of(&dp, "mirrors");

    // web goes; later downloads comes and takes its index.
    apply(&f, &mut dp, &format!("{BASE}{MIRRORS}"));
    let text = every.render().unwrap();
    assert_eq!(exported(&text, "web"), (None, None), "{text}");
    apply(&f, &mut dp, &format!("{BASE}{DOWNLOADS}{MIRRORS}"));
    assert_eq!(
        index_of(&dp, "downloads"),
        web,
        "downloads reuses web's index"
    );
    assert_eq!(index_of(&dp, "mirrors"), mirrors, "mirrors keeps its index");

    assert_eq!(pod_egress(&dp, "downloads"), abi::Counter::default());
    assert_eq!(
        pod_egress(&dp, "mirrors").packets,
        3,
        "mirrors' counters go on"
    );
    for (who, e) in [("every", &mut every), ("seldom", &mut seldom)] {
        let text = e.render().unwrap();
        assert_eq!(
            exported(&text, "downloads"),
            (Some(0), Some(0)),
            "{who}: {text}"
        );
        assert_eq!(
            exported(&text, "mirrors"),
            (Some(3), Some(3)),
            "{who}: {text}"
        );
    }

    // downloads counts its own traffic from there.
    assert_eq!(f.ping("pod", INTERNET, 2, 100, &[]), 2);
    assert_eq!(pod_egress(&dp, "downloads").packets, 2);
    assert_eq!(pod_egress(&dp, "mirrors").packets, 3);
    for (who, e) in [("every", &mut every), ("seldom", &mut seldom)] {
        let text = e.render().unwrap();
        assert_eq!(
            exported(&text, "downloads"),
            (Some(2), Some(2)),
            "{who}: {text}"
        );
        assert_eq!(
            exported(&text, "mirrors"),
            (Some(3), Some(3)),
            "{who}: {text}"
        );
    }
    // A reader started now (aliasnetctl, a restarted exporter) sees the same.
    let text = Exporter::new(f.open(), opts()).render().unwrap();
    assert_eq!(exported(&text, "downloads").0, Some(2), "{text}");

    // A new pod in the slot starts with no baseline: its counters are its own.
    f.in_node(|| dp.detach_pod(CONTAINER_ID, "eth0"))
        .expect("detach");
    f.in_node(|| dp.attach_pod(&att)).expect("attach again");
    assert_eq!(f.ping("pod", INTERNET, 1, 100, &[]), 1);
    assert_eq!(pod_egress(&dp, "downloads").packets, 1);
}
