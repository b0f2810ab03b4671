use aliasnet_cni_types::{
    limits::{ANNOTATION_EGRESS, ANNOTATION_INTERNET_EGRESS},
    NetConf,
};
use serde_json::json;

use super::*;

fn conf(extra: serde_json::Value) -> NetConf {
    let mut c = json!({"cniVersion": "1.0.0", "name": "n", "type": "aliasnet"});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    NetConf::parse(&serde_json::to_vec(&c).unwrap()).unwrap()
}

#[test]
fn containerd_unset_direction_is_not_a_zero_limit() {
    // containerd with only kubernetes.io/ingress-bandwidth set.
    let c = conf(json!({"runtimeConfig": {"bandwidth": {
        "IngressRate": 10_000_000u64, "IngressBurst": 4_294_967_295u64,
        "EgressRate": 0, "EgressBurst": 0}}}));
    let r = requested(&c).unwrap();
    assert_eq!(r.limits.ingress_rate, Some(10_000_000));
    assert_eq!(r.limits.egress_rate, None);
    assert_eq!(r.field, Some("runtimeConfig.bandwidth.ingressRate"));
}

#[test]
fn bad_values_name_the_field() {
    for (rc, field) in [
        (
            json!({"bandwidth": {"egressRate": 0}}),
            "runtimeConfig.bandwidth.egressRate",
        ),
        (
            json!({"bandwidth": {"EgressRate": 0, "EgressBurst": 4_294_967_295u64}}),
            "runtimeConfig.bandwidth.egressRate",
        ),
        (
            json!({"bandwidth": {"ingressRate": 500}}),
            "runtimeConfig.bandwidth.ingressRate",
        ),
        (
            json!({"bandwidth": {"ingressRate": 2_000_000_000_000_000u64}}),
            "runtimeConfig.bandwidth.ingressRate",
        ),
        (
            json!({"io.kubernetes.cri.pod-annotations": {ANNOTATION_INTERNET_EGRESS: "fast"}}),
            ANNOTATION_INTERNET_EGRESS,
        ),
        (
            json!({"io.kubernetes.cri.pod-annotations": {ANNOTATION_EGRESS: "0"}}),
            ANNOTATION_EGRESS,
        ),
    ] {
        let e = requested(&conf(json!({ "runtimeConfig": rc }))).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG, "{rc}");
        assert!(e.msg.contains(field), "{rc}: {}", e.msg);
    }
}

#[test]
fn off_rejects_any_limit_and_names_it() {
    let c = conf(json!({"datapath": "off", "runtimeConfig": {
        "io.kubernetes.cri.pod-annotations": {ANNOTATION_INTERNET_EGRESS: "10M", "other": "x"}}}));
    let e = open_for_add(&c, &requested(&c).unwrap())
        .err()
        .expect("ADD must be refused");
    assert_eq!(e.code, code::INVALID_CONFIG);
    assert!(e.msg.contains(ANNOTATION_INTERNET_EGRESS), "{}", e.msg);
    assert!(e.msg.contains("off"), "{}", e.msg);
    // No limit: nothing to attach, nothing opened.
    let c = conf(json!({"datapath": "off"}));
    assert!(open_for_add(&c, &requested(&c).unwrap()).unwrap().is_none());
}

#[test]
fn missing_pins_required_and_optional() {
    let root = tempfile::tempdir().unwrap();
    let rootp = root.path().join("nothing-pinned");
    let base = json!({"bpfPinRoot": rootp});
    let mut c = conf(base.clone());
    let e = open_for_add(&c, &requested(&c).unwrap())
        .err()
        .expect("ADD must be refused");
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(
        e.msg
            .contains("aliasnet-shaperd has not initialised the datapath under")
            && e.msg.contains(rootp.to_str().unwrap())
            && e.msg.ends_with("try again later"),
        "{}",
        e.msg
    );
    assert!(status(&c).unwrap_err().contains("has not initialised"));

    c.datapath = DatapathMode::Optional;
    assert!(open_for_add(&c, &requested(&c).unwrap()).unwrap().is_none());
    assert!(status(&c).is_ok());
    let mut with_limit = base;
    with_limit["datapath"] = json!("optional");
    with_limit["runtimeConfig"] = json!({"bandwidth": {"egressRate": 20_000_000}});
    let c = conf(with_limit);
    let e = open_for_add(&c, &requested(&c).unwrap())
        .err()
        .expect("ADD must be refused");
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(
        e.msg.contains("runtimeConfig.bandwidth.egressRate"),
        "{}",
        e.msg
    );
}

#[test]
fn identity_falls_back_to_the_container_id() {
    let env = AttachEnv {
        container_id: "c0ffee".into(),
        netns: "/run/netns/x".into(),
        ifname: "eth0".into(),
        args: String::new(),
    };
    let id = identity(
        &CniArgs::default(),
        &env,
        Some(Ipv4Addr::new(10, 0, 0, 1)),
        "fd00::1".parse().ok(),
    );
    assert_eq!(id.ipv6, "fd00::1".parse().ok());
    assert_eq!((id.namespace.as_str(), id.name.as_str()), ("", "c0ffee"));
    let args = CniArgs::parse("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p").unwrap();
    let id = identity(&args, &env, None, "fd00::1".parse().ok());
    assert_eq!((id.ipv4, id.ipv6), (None, "fd00::1".parse().ok()));
    assert_eq!((id.namespace.as_str(), id.name.as_str()), ("ns", "p"));
    assert!(check_identity(&args, &env).is_ok());
    let long = AttachEnv {
        container_id: "c".repeat(128),
        ..env
    };
    let e = check_identity(&args, &long).unwrap_err();
    assert_eq!(e.code, code::INVALID_ENV);
    assert!(e.msg.contains("CNI_CONTAINERID"), "{}", e.msg);
}

#[test]
fn limit_mismatches_name_each_limit() {
    let mut meta = abi::PodMeta {
        flags: abi::META_IN_USE,
        ..Default::default()
    };
    meta.limits
        .set(abi::Direction::Egress, abi::KIND_TOTAL, Some(20_000_000));
    meta.limits.set(
        abi::Direction::Ingress,
        abi::KIND_NAMED + 1,
        Some(5_000_000),
    );
    meta.burst[abi::DIR_EGRESS] = 25_000;
    let rec = PodRecord {
        slot: 3,
        meta,
        counters: Default::default(),
    };
    let names = vec![None, Some("mirrors".to_owned())];
    assert!(limit_mismatches(&rec, &meta.limits, &meta.burst, &names).is_empty());
    let mut want = abi::Rates::default();
    want.set(abi::Direction::Egress, abi::KIND_INTERNET, Some(1_000_000));
    let p = limit_mismatches(&rec, &want, &[0, 0], &names);
    for needle in [
        "datapath egress rate is 20000000 bit/s, the config and policy ask for none",
        "datapath internet-egress rate is none, the config and policy ask for 1000000 bit/s",
        "datapath mirrors ingress rate is 5000000 bit/s",
        "datapath egress burst is 25000 bytes, the config asks for none",
    ] {
        assert!(p.iter().any(|s| s.contains(needle)), "{needle}: {p:?}");
    }
}
