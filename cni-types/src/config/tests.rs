use serde_json::json;

use super::*;
use crate::code;

fn base() -> Value {
    json!({"cniVersion": "1.0.0", "name": "demo-net", "type": "aliasnet"})
}

fn with(k: &str, v: Value) -> Vec<u8> {
    let mut b = base();
    b[k] = v;
    serde_json::to_vec(&b).unwrap()
}

#[test]
fn defaults() {
    let c = NetConf::parse(&serde_json::to_vec(&base()).unwrap()).unwrap();
    assert_eq!(c.cni_version, CniVersion::V1_0_0);
    assert_eq!(c.ipam_socket, PathBuf::from("/run/aliasnet/ipamd.sock"));
    assert_eq!(c.spool_dir, PathBuf::from("/var/lib/aliasnet/spool"));
    assert_eq!(c.host_veth_prefix, "ali");
    assert_eq!(c.mtu, None);
    assert!(c.async_teardown);
    assert_eq!(c.timeout, Duration::from_millis(5000));
    assert_eq!(c.log_level, LogLevel::Info);
    assert!(c.valid_attachments.is_none());
    assert_eq!(c.bpf_pin_root, PathBuf::from("/sys/fs/bpf/aliasnet"));
    assert_eq!(c.datapath, DatapathMode::Required);
}

#[test]
fn datapath_keys() {
    let c = NetConf::parse(&with("bpfPinRoot", json!("/sys/fs/bpf/x"))).unwrap();
    assert_eq!(c.bpf_pin_root, PathBuf::from("/sys/fs/bpf/x"));
    for (v, want) in [
        ("required", DatapathMode::Required),
        ("Optional", DatapathMode::Optional),
        ("off", DatapathMode::Off),
    ] {
        assert_eq!(
            NetConf::parse(&with("datapath", json!(v)))
                .unwrap()
                .datapath,
            want
        );
    }
    assert_eq!(
        NetConf::parse(&with("datapath", Value::Null))
            .unwrap()
            .datapath,
        DatapathMode::Required
    );
}

#[test]
fn pod_routes_default_and_validation() {
    let c = NetConf::parse(&serde_json::to_vec(&base()).unwrap()).unwrap();
    assert_eq!(c.pod_routes, vec![(std::net::Ipv4Addr::UNSPECIFIED, 0)]);
    let c = NetConf::parse(&with("podRoutes", json!(["10.0.0.0/8", "172.16.0.0/12"]))).unwrap();
    assert_eq!(c.pod_routes.len(), 2);
    for (bad, needle) in [
        (json!(["10.0.0.0/33"]), "podRoutes[0]"),
        (json!(["10.0.0.1/8"]), "host bits"),
        (json!(["10.0.0.0/8", "10.0.0.0/8"]), "twice"),
        (json!(["fd00::/8"]), "not IPv4"),
        (json!([]), "non-empty"),
        (json!("10.0.0.0/8"), "podRoutes"),
        (json!([7]), "podRoutes[0]"),
    ] {
        let e = NetConf::parse(&with("podRoutes", bad.clone())).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
        assert!(
            format!("{} {}", e.msg, e.details).contains(needle),
            "{bad}: {e:?}"
        );
    }
}

#[test]
fn full_config_with_nulls_and_unknown_keys() {
    let c = NetConf::parse(
        json!({
            "cniVersion": "1.1.0", "name": "n", "type": "aliasnet",
            "ipamSocket": "/tmp/x.sock", "spoolDir": "/tmp/spool", "pool": null, "mtu": 1400,
            "hostVethPrefix": "an", "logFile": "/tmp/cni.log", "logLevel": "DEBUG",
            "asyncTeardown": false, "timeoutMs": 250, "somethingElse": {"x": 1},
            "dns": {"nameservers": ["10.0.0.10"], "search": ["svc"]},
            "capabilities": {"bandwidth": true},
            "runtimeConfig": {"bandwidth": {"IngressRate": 5}},
            "args": {"cni": {"labels": []}},
            "prevResult": {"cniVersion": "1.1.0"},
            "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}],
            "cni.dev/attachments": [{"containerID": "ignored", "ifname": "eth0"}]
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(c.mtu, Some(1400));
    assert_eq!(c.pool, None);
    assert_eq!(c.host_veth_prefix, "an");
    assert_eq!(c.log_level, LogLevel::Debug);
    assert!(!c.async_teardown);
    assert_eq!(c.timeout, Duration::from_millis(250));
    assert_eq!(c.dns.unwrap().nameservers, vec!["10.0.0.10".to_string()]);
    assert_eq!(c.runtime_config.bandwidth.unwrap().ingress_rate, Some(5));
    assert_eq!(
        c.valid_attachments.unwrap(),
        vec![GcAttachment {
            container_id: "c1".into(),
            ifname: "eth0".into()
        }]
    );
    assert!(c.prev_result.is_some());
}

#[test]
fn older_attachments_key_is_accepted() {
    let c = NetConf::parse(&with(
        "cni.dev/attachments",
        json!([{"containerID": "c2", "ifname": "net1"}]),
    ))
    .unwrap();
    assert_eq!(c.valid_attachments.unwrap()[0].container_id, "c2");
}

/// Each bad input, its code, and the field the message must name.
#[test]
fn bad_config_table() {
    let raw = |s: &str| s.as_bytes().to_vec();
    let cases: Vec<(Vec<u8>, u32, &str)> = vec![
        (raw("{not json"), 6, "decode"),
        (raw(""), 6, "decode"),
        (raw("[1,2]"), 6, "object"),
        (raw(r#"{"name":"n","type":"aliasnet"}"#), 7, "cniVersion"),
        (
            raw(r#"{"cniVersion":1,"name":"n","type":"t"}"#),
            7,
            "cniVersion",
        ),
        (
            raw(r#"{"cniVersion":"0.2.0","name":"n","type":"t"}"#),
            1,
            "0.2.0",
        ),
        (
            raw(r#"{"cniVersion":"2.0.0","name":"n","type":"t"}"#),
            1,
            "2.0.0",
        ),
        (raw(r#"{"cniVersion":"1.0.0","type":"t"}"#), 7, "name"),
        (with("name", json!("bad name")), 7, "name"),
        (with("name", json!(5)), 7, "name"),
        (raw(r#"{"cniVersion":"1.0.0","name":"n"}"#), 7, "type"),
        (with("mtu", json!(67)), 7, "mtu"),
        (with("mtu", json!(65536)), 7, "mtu"),
        (with("mtu", json!("1500")), 7, "mtu"),
        (with("mtu", json!(-1)), 7, "mtu"),
        (with("mtu", json!(1500.5)), 7, "mtu"),
        (with("ipamSocket", json!(1)), 7, "ipamSocket"),
        (with("ipamSocket", json!("relative.sock")), 7, "ipamSocket"),
        (with("spoolDir", json!(["x"])), 7, "spoolDir"),
        (with("pool", json!("")), 7, "pool"),
        (with("pool", json!(3)), 7, "pool"),
        (with("hostVethPrefix", json!("")), 7, "hostVethPrefix"),
        (
            with("hostVethPrefix", json!("waytoolong")),
            7,
            "hostVethPrefix",
        ),
        (with("hostVethPrefix", json!("a/b")), 7, "hostVethPrefix"),
        (with("logFile", json!(false)), 7, "logFile"),
        (with("logLevel", json!("loud")), 7, "logLevel"),
        (with("asyncTeardown", json!("yes")), 7, "asyncTeardown"),
        (with("timeoutMs", json!(0)), 7, "timeoutMs"),
        (with("bpfPinRoot", json!("bpf/aliasnet")), 7, "bpfPinRoot"),
        (with("bpfPinRoot", json!(1)), 7, "bpfPinRoot"),
        (with("datapath", json!("sometimes")), 7, "datapath"),
        (with("datapath", json!(true)), 7, "datapath"),
        (with("timeoutMs", json!("5s")), 7, "timeoutMs"),
        (with("dns", json!({"nameservers": "1.1.1.1"})), 7, "dns"),
        (with("capabilities", json!(true)), 7, "capabilities"),
        (with("runtimeConfig", json!("x")), 7, "runtimeConfig"),
        (with("args", json!([1])), 7, "args"),
        (with("prevResult", json!("x")), 7, "prevResult"),
        (
            with("cni.dev/valid-attachments", json!({})),
            7,
            "cni.dev/valid-attachments",
        ),
        (
            with("cni.dev/valid-attachments", json!([{"containerID": "c"}])),
            7,
            "ifname",
        ),
    ];
    for (input, code, needle) in cases {
        let shown = String::from_utf8_lossy(&input).into_owned();
        let e = NetConf::parse(&input).unwrap_err();
        assert_eq!(e.code, code, "{shown}: {}", e.msg);
        assert!(e.msg.contains(needle), "{shown}: {}", e.msg);
    }
}

#[test]
fn version_is_known_before_field_errors() {
    let raw = RawConf::decode(&with("mtu", json!(1))).unwrap();
    assert_eq!(raw.version, CniVersion::V1_0_0);
    assert_eq!(raw.validate().unwrap_err().code, 7);
}
