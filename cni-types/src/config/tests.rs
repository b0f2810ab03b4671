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

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn pod_routes_default_and_validation() {
    let c = NetConf::parse(&serde_json::to_vec(&base()).unwrap()).unwrap();
    assert_eq!(c.pod_routes, nets(&["0.0.0.0/0", "::/0"]));
    assert_eq!(c.pod_routes_for(IpFamily::Ipv4), nets(&["0.0.0.0/0"]));
    assert_eq!(c.pod_routes_for(IpFamily::Ipv6), nets(&["::/0"]));
    let c = NetConf::parse(&with("podRoutes", json!(["10.0.0.0/8", "172.16.0.0/12"]))).unwrap();
    assert_eq!(c.pod_routes.len(), 2);
    assert_eq!(
        c.pod_routes_for(IpFamily::Ipv4),
        nets(&["10.0.0.0/8", "172.16.0.0/12"])
    );
    // A list without IPv6 entries leaves an IPv6 address its default route.
    assert_eq!(c.pod_routes_for(IpFamily::Ipv6), nets(&["::/0"]));
    let c = NetConf::parse(&with(
        "podRoutes",
        json!(["fd00::/8", "10.0.0.0/8", "2001:db8:1::/48"]),
    ))
    .unwrap();
    assert_eq!(c.pod_routes_for(IpFamily::Ipv4), nets(&["10.0.0.0/8"]));
    assert_eq!(
        c.pod_routes_for(IpFamily::Ipv6),
        nets(&["fd00::/8", "2001:db8:1::/48"])
    );
    let c = NetConf::parse(&with("podRoutes", json!(["::/0"]))).unwrap();
    assert_eq!(c.pod_routes_for(IpFamily::Ipv4), nets(&["0.0.0.0/0"]));
    assert_eq!(c.pod_routes_for(IpFamily::Ipv6), nets(&["::/0"]));
    for (bad, needle) in [
        (json!(["10.0.0.0/33"]), "podRoutes[0]"),
        (json!(["10.0.0.1/8"]), "host bits"),
        (json!(["10.0.0.1/8"]), "10.0.0.0/8"),
        (json!(["10.0.0.0/8", "10.0.0.0/8"]), "twice"),
        (json!(["fd00::/129"]), "podRoutes[0]"),
        (json!(["10.0.0.0/8", "fd00::1/8"]), "podRoutes[1]"),
        (json!(["fd00::1/8"]), "fd00::/8"),
        (json!(["fd00::/8", "fd00::/8"]), "twice"),
        (json!(["fd00::/8", "FD00::/8"]), "podRoutes[1]"),
        (json!(["fe80::/10%eth0"]), "podRoutes[0]"),
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
fn ip_families() {
    let c = NetConf::parse(&serde_json::to_vec(&base()).unwrap()).unwrap();
    assert_eq!(c.ip_families, None);
    for (v, want) in [
        (json!(["ipv4"]), vec![IpFamily::Ipv4]),
        (json!(["ipv6"]), vec![IpFamily::Ipv6]),
        (
            json!(["ipv6", "ipv4"]),
            vec![IpFamily::Ipv4, IpFamily::Ipv6],
        ),
        (
            json!(["IPv4", "IPv6"]),
            vec![IpFamily::Ipv4, IpFamily::Ipv6],
        ),
    ] {
        let c = NetConf::parse(&with("ipFamilies", v.clone())).unwrap();
        assert_eq!(c.ip_families, Some(want), "{v}");
    }
    assert_eq!(
        NetConf::parse(&with("ipFamilies", Value::Null))
            .unwrap()
            .ip_families,
        None
    );
    for (bad, needle) in [
        (json!([]), "ipFamilies"),
        (json!("ipv6"), "ipFamilies"),
        (json!({"ipv6": true}), "ipFamilies"),
        (json!(["ipv5"]), "ipFamilies[0]"),
        (json!(["ipv4", "v6"]), "ipFamilies[1]"),
        (json!(["ipv4", 6]), "ipFamilies[1]"),
        (json!(["ipv6", "ipv6"]), "twice"),
        (json!(["ipv4", "IPV4"]), "ipFamilies[1]"),
    ] {
        let e = NetConf::parse(&with("ipFamilies", bad.clone())).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
        assert!(e.msg.contains(needle), "{bad}: {e:?}");
    }
}

#[test]
fn pod_routes_of_a_family_ip_families_leaves_out_are_refused() {
    let conf = |fams: Value, routes: Value| {
        let mut b = base();
        b["ipFamilies"] = fams;
        b["podRoutes"] = routes;
        NetConf::parse(&serde_json::to_vec(&b).unwrap())
    };
    let e = conf(json!(["ipv4"]), json!(["10.0.0.0/8", "fd00::/8"])).unwrap_err();
    assert_eq!(e.code, code::INVALID_CONFIG);
    assert!(
        e.msg.contains("podRoutes[1]") && e.msg.contains("ipFamilies"),
        "{}",
        e.msg
    );
    let e = conf(json!(["ipv6"]), json!(["0.0.0.0/0"])).unwrap_err();
    assert!(e.msg.contains("podRoutes[0]"), "{}", e.msg);
    let mut b = base();
    b["ipFamilies"] = json!(["ipv6"]);
    let c = NetConf::parse(&serde_json::to_vec(&b).unwrap()).unwrap();
    assert_eq!(
        c.pod_routes,
        nets(&["::/0"]),
        "the default follows ipFamilies"
    );
    let c = conf(json!(["ipv6"]), json!(["fd00::/8"])).unwrap();
    assert_eq!(c.pod_routes_for(IpFamily::Ipv6), nets(&["fd00::/8"]));
    // An invalid ipFamilies is reported as such, not as a podRoutes problem.
    let e = conf(json!(["ipv7"]), json!(["fd00::/8"])).unwrap_err();
    assert!(e.msg.contains("ipFamilies[0]"), "{}", e.msg);
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
        (
            with("ipFamilies", json!(["ipv6", "ipv9"])),
            7,
            "ipFamilies[1]",
        ),
        (with("ipFamilies", json!([])), 7, "ipFamilies"),
        (with("podRoutes", json!(["fd00::1/64"])), 7, "podRoutes[0]"),
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
