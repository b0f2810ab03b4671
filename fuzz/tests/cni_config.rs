//! Fuzz target: the network configuration the plugin reads on stdin (`NetConf::parse`), its
//! `runtimeConfig` (`RuntimeConfig::parse`) and `prevResult` (`CniResult::from_prev_result`).
//!
//! Invariants: no panic; every error is a CNI error of code 1 (version), 6 (decode) or 7
//! (config, naming the field); an accepted config satisfies the documented ranges, parses
//! again to the same value from its own JSON object, and its `prevResult` prints and parses
//! back to itself. `runtimeConfig` keys are case-insensitive.

use aliasnet_cni_types::{code, CniResult, CniVersion, NetConf, RawConf, RuntimeConfig};
use aliasnet_fuzz::{config, corpus, has_float, json_value, mutated, nested, text, JSON_DICT};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const TARGET: &str = "cni_config";

/// Config keys (ours and the CNI envelope's), for generated objects and the dictionary.
const KEYS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "ipamSocket",
    "spoolDir",
    "pool",
    "mtu",
    "hostVethPrefix",
    "logFile",
    "logLevel",
    "asyncTeardown",
    "timeoutMs",
    "dns",
    "podRoutes",
    "ipFamilies",
    "bpfPinRoot",
    "datapath",
    "capabilities",
    "runtimeConfig",
    "args",
    "prevResult",
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
];

const DICT: &[&[u8]] = &[
    b"\"cniVersion\":\"1.1.0\",",
    b"\"cniVersion\":\"0.2.0\",",
    b"\"mtu\":65536,",
    b"\"timeoutMs\":0,",
    b"\"podRoutes\":[\"10.0.0.1/8\"],",
    b"\"runtimeConfig\":{\"Bandwidth\":{\"IngressRate\":-1}},",
    b"\"prevResult\":{\"ips\":[{\"address\":\"10.0.0.1/33\",\"interface\":7}]},",
    b"\"cni.dev/valid-attachments\":[{}],",
    b"\"hostVethPrefix\":\"waytoolong\",",
];

/// Check everything that must hold of one stdin, whatever it is.
fn check(bytes: &[u8]) {
    let parsed = NetConf::parse(bytes);
    match &parsed {
        Err(e) => {
            assert!(
                matches!(
                    e.code,
                    code::INCOMPATIBLE_VERSION | code::DECODE | code::INVALID_CONFIG
                ),
                "unexpected code {}: {}",
                e.code,
                e.msg
            );
            if e.code == code::INVALID_CONFIG {
                assert!(e.msg.starts_with("invalid config field "), "{}", e.msg);
            }
            // The error document prints for every version, supported or not.
            let doc = e.to_json("1.0.0");
            assert_eq!(doc["code"], e.code);
        }
        Ok(c) => check_accepted(c),
    }
    // Decode then validate is parse, and decoding alone never loses the version.
    if let Ok(raw) = RawConf::decode(bytes) {
        let version = raw.version;
        let again = raw.clone().validate();
        assert_eq!(format!("{again:?}"), format!("{parsed:?}"));
        // Its own object, printed and parsed, is the same config.
        let obj = Value::Object(raw.object().clone());
        if !has_float(&obj) {
            let text = serde_json::to_vec(&obj).expect("a JSON object prints");
            let re = NetConf::parse(&text);
            assert_eq!(format!("{re:?}"), format!("{parsed:?}"), "re-parse differs");
        }
        if let Ok(c) = &parsed {
            assert_eq!(c.cni_version, version);
        }
    } else {
        assert!(parsed.is_err());
    }
}

fn check_accepted(c: &NetConf) {
    assert!(aliasnet_cni_types::validate_network_name(&c.name).is_ok());
    assert!(!c.plugin_type.is_empty());
    if let Some(m) = c.mtu {
        assert!((68..=65535).contains(&m), "mtu {m}");
    }
    let ms = c.timeout.as_millis();
    assert!((1..=300_000).contains(&ms), "timeout {ms}");
    let p = c.host_veth_prefix.as_bytes();
    assert!(
        (1..=8).contains(&p.len())
            && p.iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-'),
        "prefix {:?}",
        c.host_veth_prefix
    );
    for path in [&c.ipam_socket, &c.spool_dir, &c.bpf_pin_root] {
        assert!(path.is_absolute(), "{}", path.display());
    }
    if let Some(l) = &c.log_file {
        assert!(l.is_absolute());
    }
    assert!(!c.pod_routes.is_empty());
    for (i, r) in c.pod_routes.iter().enumerate() {
        let (bits, width) = match r.addr {
            std::net::IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            std::net::IpAddr::V6(a) => (u128::from(a), 128),
        };
        let host_bits = width - u32::from(r.prefix_len);
        let host = u128::MAX.checked_shr(128 - host_bits).unwrap_or(0);
        let host = if host_bits == 0 { 0 } else { host };
        assert_eq!(bits & host, 0, "host bits in {r}");
        assert!(!c.pod_routes[..i].contains(r), "duplicate route");
        if let Some(f) = &c.ip_families {
            let fam = aliasnet_cni_types::IpFamily::of(r.addr);
            assert!(
                f.contains(&fam),
                "route {r} of a family ipFamilies leaves out"
            );
        }
    }
    if let Some(f) = &c.ip_families {
        assert!(!f.is_empty() && f.windows(2).all(|w| w[0] < w[1]), "{f:?}");
    }
    if let Some(bw) = c.runtime_config.bandwidth {
        let _ = format!("{bw:?}");
    }
    if let Some(v) = &c.prev_result {
        check_prev_result(v);
    }
    for a in c.valid_attachments.iter().flatten() {
        assert!(!a.container_id.is_empty() && !a.ifname.is_empty());
    }
}

/// A parsed `prevResult` prints (in every version) and parses back: losslessly in the 1.x
/// form, stably in the legacy one.
fn check_prev_result(v: &Value) {
    let Ok(r) = CniResult::from_prev_result(v) else {
        return;
    };
    for ip in &r.ips {
        if let Some(i) = ip.interface {
            assert!(i < r.interfaces.len());
        }
    }
    let latest = r.to_json(CniVersion::LATEST);
    let back = CniResult::from_prev_result(&latest).expect("our own 1.x result parses");
    assert_eq!(back, r);
    for v in aliasnet_cni_types::SUPPORTED_VERSIONS {
        let doc = r.to_json(v);
        let once = CniResult::from_prev_result(&doc).expect("our own result parses");
        assert_eq!(once.to_json(v), doc, "{} result not stable", v.as_str());
    }
    // The chained pass-through appends without overflowing indices.
    let mut merged = r.clone();
    merged.merge(r.clone());
    for ip in &merged.ips {
        if let Some(i) = ip.interface {
            assert!(i < merged.interfaces.len());
        }
    }
}

/// `runtimeConfig` keys we interpret are case-insensitive: with no two keys equal but for
/// case, renaming them to their lowercase form changes nothing we interpret.
fn check_runtime_config(v: &Value) {
    let parsed = RuntimeConfig::parse(v);
    if let Err(e) = &parsed {
        assert_eq!(e.code, code::INVALID_CONFIG, "{}", e.msg);
    }
    let Some(obj) = v.as_object() else {
        assert!(parsed.is_err());
        return;
    };
    let lower = |m: &Map<String, Value>| -> Option<Map<String, Value>> {
        let mut out = Map::new();
        for (k, v) in m {
            if out.insert(k.to_ascii_lowercase(), v.clone()).is_some() {
                return None;
            }
        }
        Some(out)
    };
    let Some(mut low) = lower(obj) else {
        return;
    };
    if let Some(Value::Object(bw)) = low.get("bandwidth") {
        match lower(bw) {
            Some(b) => {
                low.insert("bandwidth".into(), Value::Object(b));
            }
            None => return,
        }
    }
    let again = RuntimeConfig::parse(&Value::Object(low));
    match (&parsed, &again) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.bandwidth, b.bandwidth);
            assert_eq!(a.pod_annotations, b.pod_annotations);
            assert_eq!(a.ips, b.ips);
            assert_eq!(a.mac, b.mac);
            let dedup: std::collections::BTreeSet<_> = a.ips.iter().collect();
            assert_eq!(dedup.len(), a.ips.len(), "duplicate ips kept");
        }
        (Err(_), Err(_)) => {}
        _ => panic!("case changed the outcome: {parsed:?} vs {again:?}"),
    }
}

#[test]
fn corpus_replays() {
    for e in corpus(TARGET) {
        let r = std::panic::catch_unwind(|| check(&e.bytes));
        assert!(r.is_ok(), "corpus entry {} failed", e.name());
    }
}

#[test]
fn real_runtime_inputs_are_accepted() {
    // What podman, ctr and containerd's CRI sent (with our type): all valid configs.
    for e in corpus(TARGET) {
        let named =
            serde_json::from_slice::<Value>(&e.bytes).is_ok_and(|v| v.get("name").is_some());
        if e.name().starts_with("runtime-") && e.name().ends_with("-aliasnet.json") && named {
            NetConf::parse(&e.bytes).unwrap_or_else(|e2| panic!("{}: {e2:?}", e.name()));
        }
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    for depth in [1_000, 100_000] {
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let doc = format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"aliasnet","runtimeConfig":{}}}"#,
                nested(open, close, depth, "1")
            );
            assert_eq!(
                NetConf::parse(doc.as_bytes()).unwrap_err().code,
                code::DECODE
            );
        }
    }
}

fn dict() -> &'static [&'static [u8]] {
    // JSON tokens, then our keys as `"key":` and a few hostile members.
    static D: std::sync::OnceLock<Vec<&'static [u8]>> = std::sync::OnceLock::new();
    D.get_or_init(|| {
        let mut d: Vec<&'static [u8]> = JSON_DICT.to_vec();
        d.extend_from_slice(DICT);
        for k in KEYS {
            d.push(Box::leak(
                format!("\"{k}\":").into_bytes().into_boxed_slice(),
            ));
        }
        d
    })
}

/// A key of `k` in one of its casings (runtimes disagree: `IngressRate`, `ingressRate`).
fn cased(k: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just(k.to_owned()),
        1 => Just(k.to_ascii_lowercase()),
        1 => Just(k.to_ascii_uppercase()),
        1 => Just({
            let mut s = k.to_owned();
            if let Some(f) = s.get_mut(0..1) {
                f.make_ascii_uppercase();
            }
            s
        }),
    ]
}

fn rate() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        Just(json!(4_294_967_295u64)),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(json!("10M")),
        Just(Value::Null),
    ]
}

fn bandwidth() -> impl Strategy<Value = Value> {
    proptest::collection::vec(
        (
            prop_oneof![
                cased("ingressRate"),
                cased("ingressBurst"),
                cased("egressRate"),
                cased("egressBurst"),
                text()
            ],
            rate(),
        ),
        0..6,
    )
    .prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

fn runtime_config() -> impl Strategy<Value = Value> {
    let member = prop_oneof![
        (
            cased("bandwidth"),
            prop_oneof![3 => bandwidth(), 1 => json_value()]
        ),
        (
            cased("io.kubernetes.cri.pod-annotations"),
            prop_oneof![
                proptest::collection::btree_map(text(), text(), 0..4).prop_map(|m| json!(m)),
                json_value()
            ]
        ),
        (
            cased("ips"),
            prop_oneof![
                proptest::collection::vec(
                    prop_oneof![Just("10.0.0.5/24".to_owned()), text()],
                    0..5
                )
                .prop_map(|v| json!(v)),
                json_value()
            ]
        ),
        (cased("mac"), json_value()),
        (cased("portMappings"), json_value()),
        (text(), json_value()),
    ];
    proptest::collection::vec(member, 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

/// A value for config key `k`: mostly plausible, sometimes anything.
fn value_for(k: &'static str) -> BoxedStrategy<Value> {
    let plausible: BoxedStrategy<Value> = match k {
        "cniVersion" => prop_oneof![
            proptest::sample::select(vec!["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
                .prop_map(Value::from),
            Just(json!("0.2.0")),
            Just(json!("1.1.0 ")),
        ]
        .boxed(),
        "name" | "type" | "pool" => text().prop_map(Value::from).boxed(),
        "ipamSocket" | "spoolDir" | "logFile" | "bpfPinRoot" => prop_oneof![
            "/[a-z/.]{0,20}".prop_map(Value::from),
            text().prop_map(Value::from)
        ]
        .boxed(),
        "mtu" | "timeoutMs" => prop_oneof![
            (0u64..70_000).prop_map(Value::from),
            (299_990u64..300_010).prop_map(Value::from),
            rate()
        ]
        .boxed(),
        "hostVethPrefix" => "[a-zA-Z0-9_/-]{0,10}".prop_map(Value::from).boxed(),
        "logLevel" => prop_oneof![
            proptest::sample::select(vec!["error", "WARN", "warning", "Info", "debug", "trace"])
                .prop_map(Value::from),
            text().prop_map(Value::from)
        ]
        .boxed(),
        "datapath" => prop_oneof![proptest::sample::select(vec![
            "required",
            "Optional",
            "off",
            "OFF",
            "sometimes"
        ])
        .prop_map(Value::from),]
        .boxed(),
        "asyncTeardown" => any::<bool>().prop_map(Value::from).boxed(),
        "podRoutes" => proptest::collection::vec(
            prop_oneof![
                (any::<[u8; 4]>(), 0u8..34)
                    .prop_map(|(a, l)| json!(format!("{}.{}.{}.{}/{l}", a[0], a[1], a[2], a[3]))),
                Just(json!("0.0.0.0/0")),
                Just(json!("fd00::/8")),
                text().prop_map(Value::from),
            ],
            0..4,
        )
        .prop_map(Value::Array)
        .boxed(),
        "ipFamilies" => proptest::collection::vec(
            prop_oneof![
                proptest::sample::select(vec!["ipv4", "ipv6", "IPv6", "ipv5"])
                    .prop_map(Value::from),
                text().prop_map(Value::from),
            ],
            0..3,
        )
        .prop_map(Value::Array)
        .boxed(),
        "runtimeConfig" => runtime_config().boxed(),
        "prevResult" => prev_result().boxed(),
        "cni.dev/valid-attachments" | "cni.dev/attachments" => proptest::collection::vec(
            prop_oneof![
                (text(), text()).prop_map(|(c, i)| json!({"containerID": c, "ifname": i})),
                json_value()
            ],
            0..4,
        )
        .prop_map(Value::Array)
        .boxed(),
        _ => json_value().boxed(),
    };
    prop_oneof![4 => plausible, 1 => json_value()].boxed()
}

fn prev_result() -> impl Strategy<Value = Value> {
    let iface = (text(), proptest::option::of(any::<u32>())).prop_map(|(name, mtu)| {
        let mut o = json!({ "name": name, "mac": "02:00:00:00:00:01" });
        if let Some(m) = mtu {
            o["mtu"] = json!(m);
        }
        o
    });
    let ip = (
        prop_oneof![
            Just("10.0.0.5/32".to_owned()),
            Just("fd00::5/128".to_owned()),
            text()
        ],
        proptest::option::of(0usize..4),
    )
        .prop_map(|(a, i)| json!({"address": a, "gateway": "169.254.1.1", "interface": i}));
    let route = prop_oneof![
        Just(json!({"dst": "0.0.0.0/0", "gw": "169.254.1.1", "mtu": 1400, "table": 7})),
        text().prop_map(|d| json!({ "dst": d })),
    ];
    (
        proptest::collection::vec(iface, 0..3),
        proptest::collection::vec(ip, 0..3),
        proptest::collection::vec(route, 0..3),
    )
        .prop_map(|(i, ips, r)| {
            json!({"cniVersion": "1.0.0", "interfaces": i, "ips": ips, "routes": r,
                   "dns": {"nameservers": ["10.0.0.10"]}})
        })
}

/// A config object: the required keys (usually), any subset of the others, unknown keys.
fn netconf() -> impl Strategy<Value = Vec<u8>> {
    let members = proptest::collection::vec(
        proptest::sample::select(KEYS.to_vec()).prop_flat_map(|k| (cased(k), value_for(k))),
        0..10,
    );
    (
        value_for("cniVersion"),
        prop_oneof![
            4 => "[a-z][a-z0-9-]{0,10}".prop_map(Value::from),
            1 => value_for("name")
        ],
        members,
        any::<bool>(),
    )
        .prop_map(|(v, name, members, pretty)| {
            let mut o = Map::new();
            o.insert("cniVersion".into(), v);
            o.insert("name".into(), name);
            o.insert("type".into(), json!("aliasnet"));
            for (k, v) in members {
                o.insert(k, v);
            }
            let v = Value::Object(o);
            if pretty {
                serde_json::to_vec_pretty(&v).expect("prints")
            } else {
                serde_json::to_vec(&v).expect("prints")
            }
        })
}

fn corpus_bytes() -> Vec<Vec<u8>> {
    corpus(TARGET).into_iter().map(|e| e.bytes).collect()
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn generated_configs(bytes in netconf()) {
        check(&bytes);
    }

    #[test]
    fn mutated_corpus(bytes in mutated(corpus_bytes(), dict())) {
        check(&bytes);
    }

    #[test]
    fn runtime_config_values(v in prop_oneof![3 => runtime_config(), 1 => json_value()]) {
        check_runtime_config(&v);
    }

    #[test]
    fn prev_results(v in prop_oneof![3 => prev_result(), 1 => json_value()]) {
        check_prev_result(&v);
    }
}
