//! Fuzz target: aliasnet-shaperd's node policy (`Policy::parse`, `/etc/aliasnet/shaper.toml`)
//! and the quantity parser it shares with the pods' bandwidth annotations
//! (`limits::parse_quantity`, `Limits::requested`).
//!
//! Invariants: no panic; an accepted policy holds only prefixes without host bits, valid
//! namespace names, usable rates and at most the datapath's number of prefixes and
//! namespaces; printed back as TOML it parses to the same policy; the classifier's prefixes
//! are exactly the configured lists plus the metadata endpoints. A quantity that parses is a
//! number that parses to itself, and its suffixes scale it exactly; accepted pod limits
//! validate.

use std::collections::BTreeMap;

use aliasnet_cni_types::{
    limits::{self, Limits},
    Bandwidth, RuntimeConfig,
};
use aliasnet_ebpf::{abi, Dest, LevelLimits, NamespaceLimits, INTERNET};
use aliasnet_fuzz::{config, corpus, mutated, nested, text};
use aliasnet_shaper::{policy::CLOUD_METADATA, Policy};
use proptest::prelude::*;

const TARGET: &str = "shaper_policy";

/// A TOML basic string (JSON's escapes are a subset of TOML's).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).expect("a string prints")
}

/// The keys of one class's limits at each level, as `(level, direction, key)`.
const KEYS: [(&str, abi::Direction, &str); 6] = [
    ("pod", abi::Direction::Ingress, "pod_ingress_rate"),
    ("pod", abi::Direction::Egress, "pod_egress_rate"),
    (
        "namespace",
        abi::Direction::Ingress,
        "namespace_ingress_rate",
    ),
    ("namespace", abi::Direction::Egress, "namespace_egress_rate"),
    ("node", abi::Direction::Ingress, "node_ingress_rate"),
    ("node", abi::Direction::Egress, "node_egress_rate"),
];

/// The policy as a file that must parse back to it.
fn print(p: &Policy) -> String {
    let list = |v: &[ipnet::IpNet]| {
        v.iter()
            .map(|c| quoted(&c.to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let d = &p.datapath;
    let mut s = format!(
        "internal_cidrs = [{}]\nblocked_cidrs = [{}]\nblock_cloud_metadata = {}\n",
        list(&p.internal_cidrs),
        list(&p.blocked_cidrs),
        p.block_cloud_metadata
    );
    if let Some(u) = &d.uplink {
        s += &format!("uplink = {}\n", quoted(u));
    }
    let level = |ns: &NamespaceLimits, node: Option<&LevelLimits>, class: &str| {
        let mut t = String::new();
        for (lv, dir, key) in KEYS {
            let v = match lv {
                "pod" => ns.pod.get(dir, class),
                "namespace" => ns.namespace.get(dir, class),
                _ => match node {
                    Some(n) => n.get(dir, class),
                    None => continue,
                },
            };
            match (v, node.is_some()) {
                (Some(r), _) => t += &format!("{key} = {r}\n"),
                // An override lifts a default with "unlimited".
                (None, false) => t += &format!("{key} = \"unlimited\"\n"),
                (None, true) => {}
            }
        }
        t
    };
    s += &format!(
        "[internet]\n{}",
        level(&d.defaults, Some(&d.node), INTERNET)
    );
    for (name, cidrs) in &p.classes {
        s += &format!(
            "[classes.{}]\ncidrs = [{}]\n{}",
            quoted(name),
            list(cidrs),
            level(&d.defaults, Some(&d.node), name)
        );
    }
    for (ns, limits) in &d.namespaces {
        s += &format!(
            "[namespaces.{}.internet]\n{}",
            quoted(ns),
            level(limits, None, INTERNET)
        );
        for name in p.classes.keys() {
            s += &format!(
                "[namespaces.{}.classes.{}]\n{}",
                quoted(ns),
                quoted(name),
                level(limits, None, name)
            );
        }
    }
    s
}

fn check_policy(text: &str) {
    let Ok(p) = Policy::parse(text) else {
        return;
    };
    for c in p
        .internal_cidrs
        .iter()
        .chain(&p.blocked_cidrs)
        .chain(p.classes.values().flatten())
    {
        assert_eq!(c.network(), c.addr(), "host bits in {c}");
    }
    let d = &p.datapath;
    assert!(d.prefixes.len() <= abi::MAX_PREFIXES as usize);
    assert!(d.namespaces.len() <= abi::MAX_NAMESPACES as usize);
    assert!(d.classes.len() <= abi::MAX_NAMED);
    let label = |name: &str| {
        !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    for name in d.namespaces.keys().chain(&d.classes) {
        assert!(label(name), "name {name:?}");
    }
    let levels = d
        .namespaces
        .values()
        .chain([&d.defaults])
        .flat_map(|n| [&n.pod, &n.namespace])
        .chain([&d.node]);
    for l in levels {
        for ((_, class), rate) in &l.rates {
            assert!(limits::check_rate("rate", Some(*rate)).is_ok());
            assert!(class == INTERNET || d.classes.contains(class), "{class}");
        }
    }
    if let Some(u) = &d.uplink {
        assert!(!u.is_empty() && u.len() <= 15 && !u.contains(['/', ' ', '\0']));
    }
    // The classifier's prefixes: every list (blocked wins) and the metadata endpoints.
    let prefixes = p.prefixes();
    for c in &p.blocked_cidrs {
        assert_eq!(prefixes.get(c), Some(&Dest::Blocked));
    }
    for c in p.internal_cidrs.iter().chain(p.classes.values().flatten()) {
        assert!(prefixes.contains_key(c));
    }
    if p.block_cloud_metadata {
        for a in CLOUD_METADATA {
            assert_eq!(prefixes.get(&a.into()), Some(&Dest::Blocked));
            assert_eq!(p.classify(a), Some(Dest::Blocked));
        }
    }
    assert_eq!(d.prefixes.len(), prefixes.len());
    // Printed and parsed again: the same policy.
    let printed = print(&p);
    match Policy::parse(&printed) {
        Ok(back) => assert_eq!(back, p, "printed as:\n{printed}"),
        Err(e) => panic!("printed policy refused: {e}\n{printed}"),
    }
}

fn check_quantity(s: &str) {
    let Ok(v) = limits::parse_quantity(s) else {
        return;
    };
    assert_eq!(limits::parse_quantity(&v.to_string()), Ok(v), "{s:?}");
    let _ = aliasnet_ebpf::limits::fmt_rate(v);
    // A plain integer scales exactly by each decimal and binary suffix (or is too large).
    if s.bytes().all(|b| b.is_ascii_digit()) {
        for (suffix, mul) in [
            ("k", 1_000u64),
            ("M", 1_000_000),
            ("Ki", 1024),
            ("Gi", 1 << 30),
        ] {
            let scaled = limits::parse_quantity(&format!("{s}{suffix}"));
            match v.checked_mul(mul) {
                Some(want) => assert_eq!(scaled, Ok(want), "{s}{suffix}"),
                None => assert!(scaled.is_err(), "{s}{suffix}"),
            }
        }
    }
}

fn check_limits(bw: Bandwidth, annotations: BTreeMap<String, String>) {
    let rc = RuntimeConfig {
        bandwidth: Some(bw),
        pod_annotations: annotations,
        ..Default::default()
    };
    if let Ok(r) = Limits::requested(&rc) {
        assert!(r.limits.validate().is_ok(), "{r:?}");
        // A limit is never requested without a field to name it by.
        let l = r.limits;
        let rates = [
            l.ingress_rate,
            l.egress_rate,
            l.internet_egress_rate,
            l.internet_ingress_rate,
        ];
        assert!(rates.iter().all(Option::is_none) || r.any(), "{r:?}");
    }
}

#[test]
fn corpus_replays() {
    for e in corpus(TARGET) {
        let text = String::from_utf8_lossy(&e.bytes).into_owned();
        let r = std::panic::catch_unwind(|| check_policy(&text));
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
}

#[test]
fn shipped_policies_are_accepted() {
    for e in corpus(TARGET) {
        if ["install-shaper.toml", "docs-example.toml", "full.toml"].contains(&e.name().as_str()) {
            Policy::parse(std::str::from_utf8(&e.bytes).unwrap())
                .unwrap_or_else(|err| panic!("{}: {err}", e.name()));
        }
    }
}

#[test]
fn limits_of_the_datapath_are_enforced() {
    let names: String = (0..=abi::MAX_NAMESPACES)
        .map(|i| format!("[namespaces.n{i}]\ninternet_egress_rate = 1000\n"))
        .collect();
    let e = Policy::parse(&names).unwrap_err();
    assert!(e.contains("namespaces"), "{e}");
    for depth in [100, 10_000] {
        let deep = format!("internal_cidrs = {}\n", nested("[", "]", depth, ""));
        assert!(Policy::parse(&deep).is_err());
    }
}

fn cidr() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => (any::<[u8; 4]>(), 0u8..=32).prop_map(|(a, l)| {
            // Mostly without host bits, so that lists get accepted.
            let n = u32::from_be_bytes(a) & u32::MAX.checked_shl(32 - u32::from(l)).unwrap_or(0);
            format!("{}/{l}", std::net::Ipv4Addr::from(n))
        }),
        1 => (any::<[u8; 4]>(), 0u8..40).prop_map(|(a, l)| format!("{}.{}.{}.{}/{l}", a[0], a[1], a[2], a[3])),
        1 => Just("169.254.169.254/32".to_owned()),
        1 => Just("fd00::/8".to_owned()),
        1 => text(),
    ]
}

fn rate_value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (limits::MIN_RATE..=limits::MAX_RATE).prop_map(|v| v.to_string()),
        1 => any::<u64>().prop_map(|v| v.to_string()),
        2 => (1u64..100_000, proptest::sample::select(vec!["", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "m", "e3", "e31", "x"]))
            .prop_map(|(n, s)| quoted(&format!("{n}{s}"))),
        1 => Just(quoted("unlimited")),
        1 => Just(quoted(" UNLIMITED ")),
        1 => proptest::sample::select(vec!["0", "999", "1000", "-1", "1.5", "1e3", "\"\"", "\".\"", "\"1.2.3\"", "\"1.5Gi\"", "true"]).prop_map(str::to_owned),
        1 => text().prop_map(|t| quoted(&t)),
    ]
}

fn namespace() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?",
        1 => text(),
        1 => Just("a".repeat(64)),
    ]
}

/// Policy text: any subset of the keys with plausible or hostile values, namespaces as
/// tables or an inline table.
fn policy_text() -> impl Strategy<Value = String> {
    let list = |s: BoxedStrategy<String>| {
        proptest::collection::vec(s, 0..8).prop_map(|v| {
            format!(
                "[{}]",
                v.iter().map(|c| quoted(c)).collect::<Vec<_>>().join(", ")
            )
        })
    };
    (
        proptest::option::of(list(cidr().boxed())),
        proptest::option::of(list(cidr().boxed())),
        proptest::option::of(any::<bool>()),
        proptest::option::of(rate_value()),
        proptest::option::of(rate_value()),
        proptest::option::of(prop_oneof!["(eth|ens|bond)[0-9]{1,2}", text()]),
        proptest::collection::vec((namespace(), rate_value()), 0..5),
        any::<bool>(),
    )
        .prop_map(|(internal, blocked, meta, pod, cap, uplink, ns, inline)| {
            let mut s = String::new();
            let mut put = |k: &str, v: Option<String>| {
                if let Some(v) = v {
                    s += &format!("{k} = {v}\n");
                }
            };
            put("internal_cidrs", internal);
            put("blocked_cidrs", blocked);
            put("block_cloud_metadata", meta.map(|b| b.to_string()));
            put("pod_internet_egress_rate", pod);
            put("node_internet_egress_cap", cap);
            put("uplink", uplink.map(|u| quoted(&u)));
            if inline {
                let items: Vec<String> = ns
                    .iter()
                    .map(|(n, r)| format!("{} = {{ internet_egress_rate = {r} }}", quoted(n)))
                    .collect();
                s += &format!("namespaces = {{ {} }}\n", items.join(", "));
            } else {
                for (n, r) in &ns {
                    s += &format!("[namespaces.{}]\ninternet_egress_rate = {r}\n", quoted(n));
                }
            }
            s
        })
}

fn quantity() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => ("[0-9]{0,22}", "(\\.[0-9]{0,20})?", "(|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]{1,3}|E\\+?[0-9]{1,2}|x)", "[ ]{0,2}")
            .prop_map(|(i, f, s, pad)| format!("{pad}{i}{f}{s}{pad}")),
        1 => "[0-9]{1,20}",
        1 => text(),
    ]
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(
        prop_oneof![
            Just(limits::ANNOTATION_INGRESS.to_owned()),
            Just(limits::ANNOTATION_EGRESS.to_owned()),
            Just(limits::ANNOTATION_INTERNET_EGRESS.to_owned()),
            Just(limits::ANNOTATION_INTERNET_INGRESS.to_owned()),
            text(),
        ],
        quantity(),
        0..4,
    )
}

fn cni_bandwidth() -> impl Strategy<Value = Bandwidth> {
    let v = || {
        proptest::option::of(prop_oneof![
            any::<u64>(),
            Just(0u64),
            Just(999),
            Just(1000),
            Just(u64::from(u32::MAX)),
            Just(limits::MAX_RATE),
            Just(limits::MAX_RATE + 1),
            Just(u64::MAX)
        ])
    };
    (v(), v(), v(), v()).prop_map(|(ingress_rate, ingress_burst, egress_rate, egress_burst)| {
        Bandwidth {
            ingress_rate,
            ingress_burst,
            egress_rate,
            egress_burst,
        }
    })
}

fn corpus_bytes() -> Vec<Vec<u8>> {
    corpus(TARGET).into_iter().map(|e| e.bytes).collect()
}

const DICT: &[&[u8]] = &[
    b"\n",
    b"[",
    b"]",
    b"\"",
    b"=",
    b"{",
    b"}",
    b",",
    b"#",
    b"'''",
    b"\"\"\"",
    b"[namespaces.a]\n",
    b"internal_cidrs = ",
    b"blocked_cidrs = ",
    b"internet_egress_rate = ",
    b"\"unlimited\"",
    b"\"10.0.0.0/8\"",
    b"18446744073709551616",
    b"1e999",
    b"\xff",
    b"\\u0000",
];

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn generated_policies(text in policy_text()) {
        check_policy(&text);
    }

    #[test]
    fn mutated_policies(bytes in mutated(corpus_bytes(), DICT)) {
        check_policy(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn quantities(s in quantity()) {
        check_quantity(&s);
    }

    #[test]
    fn pod_limits(bw in cni_bandwidth(), ann in annotations()) {
        check_limits(bw, ann);
    }
}
