//! `aliasnetctl doctor` against a fabric node: it finds broken state (and its fixes work),
//! and it reports shaping points below a frame.

use std::time::{Duration, Instant};

use aliasnet_ipam_proto::{AttachmentKey, PodRef, Request, Response};
use aliasnet_tests::{
    ctl::{apply_fix, by_pod, ctl, ctl_json, findings, stdout},
    fabric::{Fabric, FabricOpts, Node},
    require_root, test_mtu,
};
use serde_json::{json, Value};

/// Polls `doctor` until it finds nothing (10 s at most).
#[track_caller]
fn wait_doctor_ok(node: &Node, when: &str) {
    let start = Instant::now();
    loop {
        let o = ctl(node, &["doctor", "--grace", "0", "--json"]);
        if o.status.success() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "doctor still unhappy {when}: {}",
            stdout(&o)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn doctor_finds_broken_state_and_its_fixes_work() {
    require_root();
    let f = Fabric::one_node();
    let node = f.node(1);
    let a = node.add_pod("a").expect("a");
    let b = node.add_pod("b").expect("b");

    let clean = ctl_json(node, &["doctor", "--grace", "0"], 0);
    assert_eq!(clean["ok"], true, "{clean:#}");
    assert_eq!(clean["checked"]["leases"], 2);
    assert_eq!(clean["checked"]["host_veths"], 2);
    assert_eq!(clean["checked"]["uplink"], "eth0");
    assert!(stdout(&ctl(node, &["doctor"])).contains("OK: no problems found"));

    let pods = ctl_json(node, &["pods"], 0);
    let veth_a = by_pod(&pods, "a")["host_veth"].as_str().unwrap().to_owned();
    let veth_b = by_pod(&pods, "b")["host_veth"].as_str().unwrap().to_owned();
    let slot_b = by_pod(&pods, "b")["slot"].as_u64().unwrap();

    // Break the node in every way doctor knows.
    let ghost = AttachmentKey::new("aliasnet", "ghost", "eth0");
    let ghost_ip = match node
        .ipamd()
        .client()
        .call(&Request::Allocate {
            key: ghost,
            pod: PodRef {
                namespace: Some("test".into()),
                name: Some("ghost".into()),
                uid: None,
            },
            pool: None,
            host_veth: None,
            families: None,
        })
        .expect("allocate")
    {
        Response::Allocated { lease, .. } => lease.address,
        other => panic!("{other:?}"),
    };
    let stray = "alistray0000001";
    node.ns
        .ip(&[
            "link", "add", stray, "mtu", "9000", "type", "veth", "peer", "name", "strayp", "mtu",
            "9000",
        ])
        .expect("stray veth");
    node.ns
        .ip(&["link", "set", "dev", &veth_b, "mtu", "1500"])
        .expect("mtu");
    node.ns
        .exec(
            "sysctl",
            &["-qw", &format!("net.ipv4.conf.{veth_a}.rp_filter=1")],
        )
        .expect("rp_filter");
    node.ns
        .exec("sysctl", &["-qw", "net.ipv4.ip_forward=0"])
        .expect("ip_forward");
    // Take b's ingress program away: delete its cls_bpf filter (the per-pod attachment), or
    // unpin its TCX link where an earlier build attached one.
    let legacy = node
        .shaper_paths
        .pin_root
        .join(format!("pods/{slot_b}/host_ingress"));
    if legacy.exists() {
        std::fs::remove_file(&legacy).expect("unpin b's host_ingress link");
    } else {
        node.ns
            .exec("tc", &["filter", "del", "dev", &veth_b, "ingress"])
            .expect("delete b's ingress filter");
    }
    // The kernel releases an unpinned link asynchronously: wait until the hook is empty.
    let start = Instant::now();
    loop {
        // Exit 0 while still attached, 1 once missing: parse either way.
        let st: Value = serde_json::from_slice(&ctl(node, &["status", "--json"]).stdout)
            .expect("status --json");
        let gone = st["datapath"]["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["pod"] == "b" && p["programs"]["host_ingress"] == "missing");
        if gone {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "b's an_host_ingress still attached after removing it"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let report = ctl_json(node, &["doctor", "--grace", "0"], 1);
    let all = findings(&report);
    let has = |check: &str, subject: &str| {
        all.iter()
            .find(|f| {
                f["check"] == check && f["subject"].as_str().is_some_and(|s| s.contains(subject))
            })
            .cloned()
            .unwrap_or_else(|| panic!("no {check} finding for {subject} in {report:#}"))
    };
    let lease = has("lease_without_veth", &ghost_ip.to_string());
    assert!(lease["fix"]
        .as_str()
        .unwrap()
        .contains("ipam release --network aliasnet --container-id ghost --ifname eth0"));
    assert_eq!(
        has("veth_without_lease", stray)["fix"],
        format!("ip link del {stray}")
    );
    let mtu = has("mtu_mismatch", &veth_b);
    assert!(mtu["fix"]
        .as_str()
        .unwrap()
        .starts_with(&format!("ip link set dev {veth_b} mtu 9000")));
    assert_eq!(
        has("sysctl", &format!("net.ipv4.conf.{veth_a}.rp_filter"))["fix"],
        format!("sysctl -w net.ipv4.conf.{veth_a}.rp_filter=2")
    );
    assert_eq!(
        has("sysctl", "net.ipv4.ip_forward")["fix"],
        "sysctl -w net.ipv4.ip_forward=1"
    );
    let prog = has("program_missing", "test/b");
    assert!(
        prog["problem"]
            .as_str()
            .unwrap()
            .contains("an_host_ingress"),
        "{prog}"
    );
    assert!(prog["fix"]
        .as_str()
        .unwrap()
        .contains("kubectl delete pod -n test b"));
    let text = stdout(&ctl(node, &["doctor", "--grace", "0"]));
    for want in [
        "FIXES",
        "lease_without_veth",
        "ip link del alistray0000001",
        "sysctl -w net.ipv4.ip_forward=1",
    ] {
        assert!(text.contains(want), "doctor lacks {want:?}:\n{text}");
    }
    // Within the grace period the young ghost lease is not reported.
    let graced = findings(&ctl_json(node, &["doctor", "--grace", "600"], 1));
    assert!(!graced.iter().any(|f| f["check"] == "lease_without_veth"));

    // Apply every printed fix that is a node command (not the kubectl one).
    for f in &all {
        let fix = f["fix"].as_str().unwrap();
        let subject = f["subject"].as_str().unwrap();
        if fix.starts_with("kubectl")
            || (subject.contains(stray) && f["check"] != "veth_without_lease")
        {
            continue;
        }
        apply_fix(node, fix);
    }
    let after = ctl_json(node, &["doctor", "--grace", "0"], 1);
    let left = findings(&after);
    assert!(
        left.iter().all(|f| f["check"] == "program_missing"),
        "fixes left findings behind: {after:#}"
    );
    // What `kubectl delete pod` leads to: DEL and a fresh ADD.
    node.del_pod(&b).expect_ok("DEL b");
    let b = node.add_pod("b").expect("b again");
    // The daemon deletes a released veth asynchronously; give it a moment.
    wait_doctor_ok(node, "after the pod was recreated");
    assert!(a.ping(b.ip, &[]), "the node forwards again");
    node.del_pod(&a).expect_ok("DEL a");
    node.del_pod(&b).expect_ok("DEL b");
}

#[test]
fn doctor_reports_shaping_points_below_a_frame_and_status_shows_the_sizes() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        plugin_extra: json!({"capabilities": {"bandwidth": true}}),
        ..FabricOpts::default()
    })
    .expect("fabric");
    let node = f.node(1);
    // What containerd sends for `kubernetes.io/ingress-bandwidth: 10M`.
    let rc = json!({"bandwidth": {"ingressRate": 10_000_000u64, "ingressBurst": 4_294_967_295u64}});
    let p = node.add_pod_with("s", Some(&rc)).expect("ADD s");
    let frame = u64::from(test_mtu()) + 14;

    // Exit 1 while shaperd's metrics endpoint comes up: only the datapath part matters here.
    let st: Value =
        serde_json::from_slice(&ctl(node, &["status", "--json"]).stdout).expect("status --json");
    let pod = st["datapath"]["pods"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["pod"] == "s"))
        .unwrap_or_else(|| panic!("pod s in {st:#}"))
        .clone();
    assert_eq!(pod["frame"], frame, "{pod}");
    assert!(pod["gso_max"].as_u64().unwrap() >= 65_536, "{pod}");
    let text = stdout(&ctl(node, &["status"]));
    assert!(text.contains("GSO MAX"), "{text}");
    assert!(ctl_json(node, &["doctor", "--grace", "0"], 0)["ok"] == true);

    // A tbf bucket below one frame under the pod's ingress class, as a build that sized leaves
    // for 1500-byte frames left on jumbo-frame nodes: every full-size frame is dropped.
    let veth = pod["host_veth"].as_str().unwrap().to_owned();
    let small = (frame * 2 / 3).to_string();
    node.ns
        .exec(
            "tc",
            &[
                "qdisc",
                "replace",
                "dev",
                &veth,
                "parent",
                "1:3",
                "handle",
                "4:",
                "tbf",
                "rate",
                "10200kbit",
                "burst",
                &small,
                "limit",
                "31250",
            ],
        )
        .expect("tc");
    let report = ctl_json(node, &["doctor", "--grace", "0"], 1);
    let found = findings(&report)
        .into_iter()
        .find(|f| f["check"] == "shaping_below_frame")
        .unwrap_or_else(|| panic!("no shaping_below_frame finding in {report:#}"));
    let problem = found["problem"].as_str().unwrap();
    assert!(
        found["subject"].as_str().unwrap().contains(&veth),
        "{found}"
    );
    assert!(problem.contains("tbf bucket"), "{found}");
    assert!(problem.contains(&format!("{frame}-byte frame")), "{found}");
    assert!(found["fix"]
        .as_str()
        .unwrap()
        .contains("kubectl delete pod"));
    node.del_pod(&p).expect_ok("DEL s");
}

/// Class prefixes the policy's other lists shadow: doctor names each (and a class left with
/// no prefix), with the class and what takes its addresses; aliasnet-shaperd warns when it
/// applies such a policy; once the policy no longer has them, doctor is content.
#[test]
fn doctor_flags_class_prefixes_other_lists_shadow() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        shaper_policy: r#"
internal_cidrs = ["10.0.0.0/8", "fd00::/8", "203.0.113.0/25"]
blocked_cidrs = ["203.0.113.128/25", "192.0.2.0/24"]
[classes.mirrors]
cidrs = ["203.0.113.0/24", "2001:db8:1::/48"]
[classes.dead]
cidrs = ["192.0.2.0/24"]
"#
        .into(),
        ..FabricOpts::default()
    })
    .expect("fabric");
    let node = f.node(1);
    let a = node.add_pod("a").expect("a");

    let report = ctl_json(node, &["doctor", "--grace", "0"], 1);
    let shadowed: Vec<Value> = findings(&report)
        .into_iter()
        .filter(|f| f["check"] == "class_shadowed")
        .collect();
    assert_eq!(shadowed.len(), 2, "{report:#}");
    let find = |subject: &str| {
        shadowed
            .iter()
            .find(|f| f["subject"] == subject)
            .unwrap_or_else(|| panic!("no class_shadowed finding for {subject} in {report:#}"))
    };
    let mirrors = find("class mirrors 203.0.113.0/24");
    let problem = mirrors["problem"].as_str().unwrap();
    assert!(
        problem.contains("covered entirely by more specific prefixes of other lists")
            && problem.contains("203.0.113.0/25 internal")
            && problem.contains("203.0.113.128/25 blocked"),
        "{mirrors}"
    );
    // Its IPv6 prefix still counts: the class as a whole is not dead.
    assert!(!problem.contains("counts and limits nothing"), "{mirrors}");
    assert!(mirrors["fix"]
        .as_str()
        .unwrap()
        .contains("203.0.113.0/24 from [classes.mirrors] cidrs"));
    let dead = find("class dead");
    assert!(
        dead["problem"]
            .as_str()
            .unwrap()
            .contains("class dead has no prefix in the classifier"),
        "{dead}"
    );
    let text = stdout(&ctl(node, &["doctor", "--grace", "0"]));
    for want in [
        "class_shadowed",
        "(class shadowed)",
        "kubectl -n kube-system edit configmap aliasnet-config",
    ] {
        assert!(text.contains(want), "doctor lacks {want:?}:\n{text}");
    }
    // The daemon (started after `--once` applied the policy) warns when it applies it.
    let start = Instant::now();
    loop {
        let log = std::fs::read_to_string(&node.shaper_paths.log).unwrap_or_default();
        if log.contains("203.0.113.0/24 of class mirrors is covered entirely")
            && log.contains("192.0.2.0/24 of class dead is also blocked")
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "shaperd did not warn:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The fix: a policy without them (shaperd reloads it within its poll interval).
    std::fs::write(
        &node.shaper_paths.config,
        "internal_cidrs = [\"10.0.0.0/8\", \"fd00::/8\"]\n[classes.mirrors]\ncidrs = [\"203.0.113.0/24\"]\n",
    )
    .expect("write policy");
    wait_doctor_ok(node, "after the policy was fixed");
    node.del_pod(&a).expect_ok("DEL a");
}
