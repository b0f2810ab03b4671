//! Fuzz target: `CNI_ARGS` (`CniArgs::parse`) and the `CNI_*` environment
//! (`Invocation::from_lookup`).
//!
//! Invariants: no panic; every error is code 4 naming `CNI_ARGS` (or the variables); the
//! pairs are a set (any order gives the same result); printing what was parsed and parsing
//! that gives the same value; an accepted environment holds only valid names (the container
//! id and interface name rules of libcni, an absolute netns path).

use std::collections::HashMap;

use aliasnet_cni_types::{code, env, CniArgs, Invocation};
use aliasnet_fuzz::{config, corpus, mutated, text};
use proptest::prelude::*;

const KEYS: &[&str] = &[
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_UID",
    "K8S_POD_INFRA_CONTAINER_ID",
    "MAC",
    "IP",
];

const DICT: &[&[u8]] = &[
    b";",
    b"=",
    b";;",
    b"IgnoreUnknown=1;",
    b"IgnoreUnknown=0;",
    b"IgnoreUnknown=TRUE;",
    b"IgnoreUnknown=maybe;",
    b"K8S_POD_NAMESPACE=",
    b"K8S_POD_NAME=",
    b"K8S_POD_UID=",
    b"K8S_POD_INFRA_CONTAINER_ID=",
    b"MAC=02:42:0a:d5:00:99;",
    b"\0",
    b"\xff",
    b"\xc3\xa9",
    b"\n",
    b"CNI_COMMAND=",
    b"CNI_CONTAINERID=",
    b"CNI_NETNS=",
    b"CNI_IFNAME=",
    b"CNI_ARGS=",
    b"ADD",
    b"DEL",
    b"CHECK",
    b"/proc/1/ns/net",
    b"..",
];

fn check_args(raw: &str) {
    match CniArgs::parse(raw) {
        Err(e) => {
            assert_eq!(e.code, code::INVALID_ENV, "{}", e.msg);
            assert!(e.msg.contains("CNI_ARGS"), "{}", e.msg);
        }
        Ok(a) => {
            // The pairs are a set: reversed, they mean the same (the last of a repeated key
            // wins either way only when the repeats agree, so compare only without repeats).
            let pairs: Vec<&str> = raw.split(';').filter(|p| !p.is_empty()).collect();
            let keys: Vec<&str> = pairs
                .iter()
                .filter_map(|p| p.split_once('='))
                .map(|(k, _)| k)
                .collect();
            let mut uniq = keys.clone();
            uniq.sort_unstable();
            uniq.dedup();
            if uniq.len() == keys.len() {
                let reversed: Vec<&str> = pairs.iter().rev().copied().collect();
                assert_eq!(
                    CniArgs::parse(&reversed.join(";")).as_ref(),
                    Ok(&a),
                    "order matters"
                );
            }
            // What we keep prints back to itself (values never hold ';', may hold '=').
            let mut printed = vec![format!("IgnoreUnknown={}", u8::from(a.ignore_unknown))];
            for (k, v) in [
                ("K8S_POD_NAMESPACE", &a.k8s_pod_namespace),
                ("K8S_POD_NAME", &a.k8s_pod_name),
                ("K8S_POD_UID", &a.k8s_pod_uid),
                ("K8S_POD_INFRA_CONTAINER_ID", &a.k8s_pod_infra_container_id),
            ] {
                if let Some(v) = v {
                    assert!(!v.is_empty() && !v.contains(';'), "{v:?}");
                    printed.push(format!("{k}={v}"));
                }
            }
            assert_eq!(CniArgs::parse(&printed.join(";")).as_ref(), Ok(&a));
        }
    }
}

/// An environment dump, `KEY=VALUE` per line (bytes that are not UTF-8 read lossily, as a
/// runtime's environment would have to be converted to reach `std::env::var`).
fn env_of(bytes: &[u8]) -> HashMap<String, String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn check_env(vars: &HashMap<String, String>) {
    let inv = Invocation::from_lookup(|k| vars.get(k).cloned());
    match &inv {
        Err(e) => {
            assert_eq!(e.code, code::INVALID_ENV, "{}", e.msg);
            assert!(e.msg.contains("CNI_"), "{}", e.msg);
        }
        Ok(Invocation::Add(a) | Invocation::Check(a)) => {
            assert!(env::validate_container_id(&a.container_id).is_ok());
            assert!(env::validate_ifname(&a.ifname).is_ok() && !a.ifname.is_empty());
            assert!(a.netns.starts_with('/'));
            check_args(&a.args);
        }
        Ok(Invocation::Del(d)) => {
            assert!(env::validate_container_id(&d.container_id).is_ok());
            assert!(env::validate_ifname(&d.ifname).is_ok() && !d.ifname.is_empty());
            assert!(d.netns.as_deref().is_none_or(|n| n.starts_with('/')));
            check_args(&d.args);
        }
        Ok(_) => {}
    }
    // Only CNI_COMMAND decides the verb.
    if let Ok(i) = &inv {
        assert_eq!(
            Some(i.command().as_str()),
            vars.get("CNI_COMMAND").map(String::as_str)
        );
    }
}

#[test]
fn corpus_replays() {
    for e in corpus("cni_args") {
        let s = String::from_utf8_lossy(&e.bytes).into_owned();
        let r = std::panic::catch_unwind(|| check_args(&s));
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
    for e in corpus("cni_env") {
        let vars = env_of(&e.bytes);
        let r = std::panic::catch_unwind(|| check_env(&vars));
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
}

#[test]
fn runtime_environments_are_accepted() {
    for e in corpus("cni_env") {
        if e.name().starts_with("runtime-") {
            let vars = env_of(&e.bytes);
            Invocation::from_lookup(|k| vars.get(k).cloned())
                .unwrap_or_else(|err| panic!("{}: {err:?}", e.name()));
        }
    }
    for e in corpus("cni_args") {
        if e.name().starts_with("runtime-") {
            CniArgs::parse(std::str::from_utf8(&e.bytes).unwrap())
                .unwrap_or_else(|err| panic!("{}: {err:?}", e.name()));
        }
    }
}

fn pair() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        4 => proptest::sample::select(KEYS.to_vec()).prop_map(str::to_owned),
        1 => proptest::sample::select(KEYS.to_vec()).prop_map(|k| k.to_ascii_lowercase()),
        1 => text(),
    ];
    let value = prop_oneof![
        2 => proptest::sample::select(vec!["1", "0", "true", "FALSE", "", "maybe"]).prop_map(str::to_owned),
        3 => text(),
    ];
    prop_oneof![
        8 => (key, value).prop_map(|(k, v)| format!("{k}={v}")),
        1 => text(),
        1 => Just(String::new()),
    ]
}

fn args() -> impl Strategy<Value = String> {
    proptest::collection::vec(pair(), 0..8).prop_map(|p| p.join(";"))
}

fn environment() -> impl Strategy<Value = HashMap<String, String>> {
    let command = prop_oneof![
        6 => proptest::sample::select(vec!["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"]).prop_map(str::to_owned),
        1 => proptest::sample::select(vec!["add", "Add", "", "ADD "]).prop_map(str::to_owned),
        1 => text(),
    ];
    let id = prop_oneof![
        3 => "[a-f0-9]{64}",
        1 => "default-[a-z0-9]{1,8}",
        2 => text(),
    ];
    let ifname = prop_oneof![
        3 => "(eth|net)[0-9]{1,2}",
        1 => Just("dummy".to_owned()),
        1 => proptest::sample::select(vec![".", "..", "a/b", "a:b", "a b", "0123456789abcdef", "ééééééé", "é"]).prop_map(str::to_owned),
        2 => text(),
    ];
    let netns = prop_oneof![
        2 => "/var/run/netns/cni-[0-9a-f-]{8,36}",
        1 => "/proc/[0-9]{1,6}/ns/net",
        1 => Just("dummy".to_owned()),
        2 => text(),
    ];
    (
        proptest::option::weighted(0.95, command),
        proptest::option::weighted(0.9, id),
        proptest::option::weighted(0.9, ifname),
        proptest::option::weighted(0.9, netns),
        proptest::option::of(args()),
    )
        .prop_map(|(c, id, ifn, ns, a)| {
            [
                ("CNI_COMMAND", c),
                ("CNI_CONTAINERID", id),
                ("CNI_IFNAME", ifn),
                ("CNI_NETNS", ns),
                ("CNI_ARGS", a),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
            .collect()
        })
}

fn corpus_bytes(target: &str) -> Vec<Vec<u8>> {
    corpus(target).into_iter().map(|e| e.bytes).collect()
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn generated_args(raw in args()) {
        check_args(&raw);
    }

    #[test]
    fn mutated_args(bytes in mutated(corpus_bytes("cni_args"), DICT)) {
        check_args(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn generated_environments(vars in environment()) {
        check_env(&vars);
    }

    #[test]
    fn mutated_environments(bytes in mutated(corpus_bytes("cni_env"), DICT)) {
        check_env(&env_of(&bytes));
    }
}
