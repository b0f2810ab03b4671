//! `aliasnetctl` against a fabric node: every command, human and `--json` output, and clear
//! messages when a daemon is down (`doctor` is in doctor.rs). The CLI runs inside the node's
//! netns (`nsenter --net`, bpffs stays visible), as on a real node.

use std::{
    io::Read,
    net::Ipv4Addr,
    path::Path,
    process::{Child, Output, Stdio},
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{AttachmentKey, PodRef, Request, Response};
use aliasnet_tests::{
    ctl::{
        assert_clean_error, by_pod, ctl, ctl_cmd, ctl_json, findings, kernel_has_fq, stderr, stdout,
    },
    fabric::{Fabric, FabricOpts, Pod, DEFAULT_POLICY, INTERNET_IP, MIRROR_IP},
    require_root,
};
use serde_json::Value;

/// `n` pings of `size` bytes from `pod` to each of `dsts`, every one answered.
fn pings(pod: &Pod, dsts: &[Ipv4Addr], n: u32, size: u32) {
    for dst in dsts {
        let p = pod.ping_summary(*dst, n, size, "0.05");
        assert_eq!((p.sent, p.received), (n, n), "ping {dst}");
    }
}

/// ~100 pings/s of 1000 bytes from `pod` to `dst` for 4 s in the background: load for `top`.
fn ping_load(pod: &Pod, dst: Ipv4Addr) -> Child {
    let dst = dst.to_string();
    pod.ns
        .command("ping")
        .args(["-c", "400", "-i", "0.01", "-s", "1000", "-q", &dst])
        .stdout(Stdio::null())
        .spawn()
        .expect("load")
}

/// Pod `name`'s entries of every refresh of `top --json`.
fn top_json(o: &Output, name: &str) -> Vec<Value> {
    assert!(o.status.success(), "{}", stderr(o));
    let frames: Vec<Value> = stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(frames.len(), 2, "{}", stdout(o));
    frames
        .iter()
        .flat_map(|f| f["pods"].as_array().cloned().unwrap_or_default())
        .filter(|p| p["pod"] == name)
        .collect()
}

#[test]
fn status_pods_top_and_ipam_describe_the_node() {
    require_root();
    const N: u32 = 5;
    const S: u32 = 500;
    let frame = u64::from(S) + 42;
    let f = Fabric::one_node();
    let node = f.node(1);
    let a = node.add_pod("a").expect("a");
    let b = node.add_pod("b").expect("b");
    pings(&a, &[b.ip, INTERNET_IP], N, S);

    // --help with examples, for every command.
    for cmd in [
        vec!["--help"],
        vec!["status", "--help"],
        vec!["pods", "--help"],
        vec!["top", "--help"],
        vec!["doctor", "--help"],
        vec!["ipam", "--help"],
        vec!["ipam", "release", "--help"],
    ] {
        let o = ctl(node, &cmd);
        assert!(o.status.success(), "{cmd:?}");
        assert!(
            stdout(&o).contains("Examples:"),
            "{cmd:?} has no examples: {}",
            stdout(&o)
        );
    }

    // status
    let st = ctl_json(node, &["status"], 0);
    assert_eq!(st["healthy"], true, "{st:#}");
    assert_eq!(st["ipamd"]["reachable"], true);
    assert_eq!(st["ipamd"]["ready"], true);
    assert_eq!(st["shaperd_metrics"]["reachable"], true);
    assert_eq!(st["shaperd_metrics"]["backend"], "htb");
    assert!(st["shaperd_metrics"]["version"].is_string());
    assert_eq!(st["ipamd_metrics"]["reachable"], true);
    assert_eq!(st["datapath"]["installed"], true);
    assert!(st["datapath"]["config"]["policy_epoch"].as_u64() >= Some(1));
    let dp_pods = st["datapath"]["pods"].as_array().expect("datapath pods");
    assert_eq!(dp_pods.len(), 2);
    for p in dp_pods {
        assert_eq!(p["programs"]["host_ingress"], "attached", "{p}");
        assert_eq!(p["programs"]["host_egress"], "attached", "{p}");
        assert_eq!(p["programs"]["pod_egress"], "not_needed", "{p}");
        assert_eq!(p["programs"]["pod_htb"], "not_needed", "{p}");
    }
    assert_eq!(st["ipamd"]["pools"][0]["allocated"], 2);
    let feature = |name: &str| {
        st["kernel"]["features"]
            .as_array()
            .expect("features")
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("feature {name} not reported"))
            .clone()
    };
    for name in ["bpffs", "tcx", "clsact", "btf"] {
        assert_eq!(feature(name)["available"], true, "{name}");
    }
    let fq = feature("fq");
    assert!(fq["available"].is_boolean(), "fq probed: {fq}");
    if let Some(has) = kernel_has_fq() {
        assert_eq!(
            fq["available"], has,
            "fq probe disagrees with /proc/config.gz: {fq}"
        );
    }
    let human = ctl(node, &["status"]);
    assert!(human.status.success(), "{}", stderr(&human));
    let text = stdout(&human);
    for want in [
        "DAEMONS",
        "POOLS",
        "secondary",
        "test/a",
        "KERNEL",
        "fq",
        "OK: no problems found",
    ] {
        assert!(text.contains(want), "status lacks {want:?}:\n{text}");
    }

    // pods: exact counters from the maps.
    let pods = ctl_json(node, &["pods"], 0);
    let pa = by_pod(&pods, "a");
    assert_eq!(pa["ip"], a.ip.to_string());
    assert_eq!(pa["namespace"], "test");
    assert_eq!(pa["egress"]["internal"]["packets"], N);
    assert_eq!(pa["egress"]["internal"]["bytes"], u64::from(N) * frame);
    assert_eq!(pa["egress"]["internet"]["packets"], N);
    assert_eq!(pa["ingress"]["internet"]["bytes"], u64::from(N) * frame);
    assert_eq!(pa["egress"]["blocked"]["packets"], 0);
    assert!(pa["limits"]["ingress"].is_null());
    let pb = by_pod(&pods, "b");
    assert_eq!(pb["ingress"]["internal"]["packets"], N);
    assert_eq!(pb["egress"]["internet"]["packets"], 0);
    let text = stdout(&ctl(node, &["pods"]));
    assert!(
        text.lines()
            .any(|l| l.contains("test/a") && l.contains(&a.ip.to_string())),
        "{text}"
    );
    assert!(stdout(&ctl(node, &["pods", "-n", "elsewhere"])).contains("no pods attached"));
    assert_eq!(
        ctl_json(node, &["pods", "-n", "elsewhere"], 0),
        Value::Array(vec![])
    );

    // top: rates while a sends to b.
    let mut load = ping_load(&a, b.ip);
    let o = ctl(
        node,
        &["top", "--iterations", "2", "--interval", "1", "--json"],
    );
    let busiest = top_json(&o, "a")
        .iter()
        .map(|p| p["internal_egress_bps"].as_f64().unwrap_or(0.0))
        .fold(0.0, f64::max);
    // ~100 packets/s of 1042 bytes: ~0.8 Mbit/s.
    assert!(
        busiest > 200_000.0,
        "top saw a at {busiest} bit/s: {}",
        stdout(&o)
    );
    let o = ctl(
        node,
        &["top", "--once", "--interval", "0.5", "--sort", "internal"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("INTERNET OUT") && text.contains("test/a"),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "no terminal escapes into a pipe");
    let _ = load.kill();
    let _ = load.wait();

    // ipam: pools and leases, paged one lease per request.
    let ip = ctl_json(node, &["ipam", "--page-size", "1"], 0);
    assert_eq!(ip["pools"][0]["name"], "secondary");
    assert_eq!(ip["pools"][0]["allocated"], 2);
    let leases = ip["leases"].as_array().expect("leases");
    assert_eq!(leases.len(), 2, "{ip:#}");
    for (pod, name) in [(&a, "a"), (&b, "b")] {
        let l = leases
            .iter()
            .find(|l| l["address"] == pod.ip.to_string())
            .unwrap_or_else(|| panic!("no lease for {}", pod.ip));
        assert_eq!(l["pod"]["name"], name);
        assert_eq!(l["pod"]["namespace"], "test");
    }
    let text = stdout(&ctl(node, &["ipam"]));
    for want in [
        "POOLS",
        "secondary",
        "LEASES (2)",
        "test/a",
        "test/b",
        "COOLING",
    ] {
        assert!(text.contains(want), "ipam lacks {want:?}:\n{text}");
    }
    assert!(ctl_json(node, &["ipam", "--no-leases"], 0)["leases"].is_null());
    let o = ctl(node, &["ipam", "--pool", "nope"]);
    assert_clean_error(&o, "no pool named \"nope\"");

    // ipam release: a lease nobody uses.
    let key = AttachmentKey::new("aliasnet", "ghost", "eth0");
    let ghost = match node
        .ipamd()
        .client()
        .call(&Request::Allocate {
            key: key.clone(),
            pod: PodRef::default(),
            pool: None,
            host_veth: None,
            families: None,
        })
        .expect("allocate ghost")
    {
        Response::Allocated { lease, .. } => lease.address,
        other => panic!("{other:?}"),
    };
    let o = ctl(
        node,
        &[
            "ipam",
            "release",
            "--network",
            "aliasnet",
            "--container-id",
            "ghost",
            "--ifname",
            "eth0",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("released {ghost}")),
        "{}",
        stdout(&o)
    );
    assert_eq!(node.ipamd().leases().len(), 2);

    node.del_pod(&a).expect_ok("DEL a");
    node.del_pod(&b).expect_ok("DEL b");
}

#[test]
fn commands_explain_daemons_that_are_down() {
    require_root();
    let mut f = Fabric::one_node();
    {
        let node = f.node_mut(1);
        // Stop the daemons; the pins stay (shaperd exits leaving the datapath in place).
        node.shaperd
            .as_mut()
            .expect("shaperd")
            .stop()
            .expect("stop shaperd");
        drop(node.ipamd.take());
    }
    let node = f.node(1);

    let o = ctl(node, &["ipam"]);
    assert_clean_error(&o, "aliasnet-ipamd is not running");
    let o = ctl(node, &["ipam", "--json"]);
    assert_clean_error(&o, "aliasnet-ipamd is not running");
    let o = ctl(node, &["ipam", "release", "--veth", "alix"]);
    assert_clean_error(&o, "aliasnet-ipamd is not running");

    let o = ctl(node, &["status"]);
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    for want in [
        "aliasnet-ipamd is not running",
        "nothing is listening on 127.0.0.1:9546 (aliasnet-shaperd is down",
        "PROBLEMS",
    ] {
        assert!(text.contains(want), "status lacks {want:?}:\n{text}");
    }
    assert!(!stderr(&o).contains("panicked"));
    let st = ctl_json(node, &["status"], 1);
    assert_eq!(st["healthy"], false);
    assert_eq!(st["ipamd"]["reachable"], false);
    assert_eq!(st["ipamd_metrics"]["reachable"], false);
    assert_eq!(st["shaperd_metrics"]["reachable"], false);
    // The datapath outlives shaperd: pods and top still read the pinned maps.
    assert_eq!(st["datapath"]["installed"], true);
    assert_eq!(ctl_json(node, &["pods"], 0), Value::Array(vec![]));

    let d = ctl_json(node, &["doctor"], 1);
    assert!(
        findings(&d)
            .iter()
            .any(|f| f["check"] == "daemon_unreachable"),
        "{d:#}"
    );

    // Nothing pinned there: explained, not a raw error.
    let missing = Path::new("/sys/fs/bpf/aliasnet-no-such-root");
    for cmd in [vec!["pods"], vec!["top", "--once"]] {
        let mut c = node.ns.command(aliasnet_tests::bin("aliasnetctl"));
        c.arg("--pin-root").arg(missing).args(&cmd);
        let o = c.output().expect("run");
        assert_clean_error(
            &o,
            "the eBPF datapath is not installed under /sys/fs/bpf/aliasnet-no-such-root",
        );
    }
    // A socket path that is not a socket.
    let mut c = node.ns.command(aliasnet_tests::bin("aliasnetctl"));
    c.args(["--socket", "/etc/hostname", "ipam"]);
    let o = c.output().expect("run");
    assert_eq!(o.status.code(), Some(1));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    assert!(stderr(&o).contains("aliasnet-ipamd"), "{}", stderr(&o));

    // Usage errors are clap's (exit 2), still no panic.
    let o = ctl(node, &["top", "--interval", "0"]);
    assert_clean_error(&o, "--interval must be between 0 and 3600 seconds");
    let mut child = ctl_cmd(node, &["frobnicate"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(2), "{err}");
    assert!(err.contains("unrecognized subcommand"), "{err}");
}

/// Named classes in `pods`, `top` and `status`: the bytes of every class, the pods' limits by
/// class, and (`status`) the node's and the namespaces' aggregate limits.
#[test]
fn pods_top_and_status_show_every_class_and_the_limits_by_class() {
    require_root();
    const N: u32 = 5;
    const S: u32 = 500;
    let frame = u64::from(S) + 42;
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        shaper_policy: format!(
            r#"{DEFAULT_POLICY}
[internet]
pod_ingress_rate = "300M"
namespace_ingress_rate = "1G"
node_ingress_rate = "2G"
[classes.mirrors]
cidrs = ["{MIRROR_IP}/32"]
pod_ingress_rate = "200M"
pod_egress_rate = "20M"
namespace_ingress_rate = "500M"
[classes.datasets]
cidrs = ["192.0.2.0/24", "2001:db8:5::/48"]
"#
        ),
        ..FabricOpts::default()
    })
    .expect("fabric");
    let node = f.node(1);
    let a = node.add_pod("a").expect("a");
    let b = node.add_pod("b").expect("b");
    pings(&a, &[MIRROR_IP, INTERNET_IP], N, S);

    // pods: each class's bytes, internet including them, the limits by class.
    let pods = ctl_json(node, &["pods"], 0);
    let pa = by_pod(&pods, "a");
    assert_eq!(pa["ingress"]["classes"]["mirrors"]["packets"], N, "{pa:#}");
    assert_eq!(
        pa["ingress"]["classes"]["mirrors"]["bytes"],
        u64::from(N) * frame
    );
    assert_eq!(pa["egress"]["classes"]["mirrors"]["packets"], N);
    assert_eq!(pa["ingress"]["classes"]["datasets"]["packets"], 0);
    assert_eq!(pa["ingress"]["internet"]["packets"], 2 * N);
    assert_eq!(pa["limits"]["internet_ingress"], 300_000_000u64);
    assert_eq!(
        pa["limits"]["classes"]["mirrors"]["ingress"],
        200_000_000u64
    );
    assert_eq!(pa["limits"]["classes"]["mirrors"]["egress"], 20_000_000u64);
    assert!(pa["limits"]["classes"]["datasets"]["ingress"].is_null());
    let text = stdout(&ctl(node, &["pods"]));
    for want in [
        "LIMIT INET IN",
        "class mirrors",
        "class datasets",
        "200.0Mbit/s",
    ] {
        assert!(text.contains(want), "pods lacks {want:?}:\n{text}");
    }

    // top: a class's rate while a downloads from it, and the limits by class.
    let mut load = ping_load(&a, MIRROR_IP);
    let o = ctl(
        node,
        &["top", "--iterations", "2", "--interval", "1", "--json"],
    );
    let mine = top_json(&o, "a");
    let busiest = mine
        .iter()
        .map(|p| {
            p["classes"]["mirrors"]["ingress_bps"]
                .as_f64()
                .unwrap_or(0.0)
        })
        .fold(0.0, f64::max);
    assert!(
        busiest > 200_000.0,
        "top saw mirrors at {busiest} bit/s: {mine:?}"
    );
    assert!(
        mine.iter().all(|p| p["internet_ingress_bps"].as_f64()
            >= p["classes"]["mirrors"]["ingress_bps"].as_f64()),
        "internet includes the class: {mine:?}"
    );
    assert_eq!(mine[0]["limits"]["ingress"]["mirrors"], 200_000_000u64);
    assert_eq!(mine[0]["limits"]["ingress"]["internet"], 300_000_000u64);
    let text = stdout(&ctl(node, &["top", "--once", "--interval", "0.5"]));
    for want in ["INET LIMIT IN", "class mirrors", "300.0Mbit/s"] {
        assert!(text.contains(want), "top lacks {want:?}:\n{text}");
    }
    let _ = load.kill();
    let _ = load.wait();

    // status: the classes, the limits of every level, the traffic by class. shaperd forms
    // the namespace's aggregate within a poll of the pods' ADD.
    let start = Instant::now();
    let st = loop {
        let st = ctl_json(node, &["status"], 0);
        if st["datapath"]["config"]["namespace_limits"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no namespace aggregate in {st:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let c = &st["datapath"]["config"];
    let class = |name: &str| {
        c["classes"]
            .as_array()
            .and_then(|a| a.iter().find(|k| k["name"] == name))
            .unwrap_or_else(|| panic!("class {name} not in {c:#}"))
            .clone()
    };
    assert_eq!(class("mirrors")["prefixes"], 1);
    assert_eq!(class("datasets")["prefixes"], 2);
    assert_eq!(c["node_limits"]["ingress"]["internet"], 2_000_000_000u64);
    assert_eq!(
        c["default_pod_limits"]["ingress"]["mirrors"],
        200_000_000u64
    );
    assert_eq!(c["default_pod_limits"]["egress"]["mirrors"], 20_000_000u64);
    assert_eq!(
        c["default_namespace_limits"]["ingress"]["internet"],
        1_000_000_000u64
    );
    let ns = &c["namespace_limits"][0];
    assert_eq!(ns["namespace"], "test", "{c:#}");
    assert_eq!(ns["pods"], 2);
    assert_eq!(ns["limits"]["ingress"]["mirrors"], 500_000_000u64);
    let tr = &st["datapath"]["traffic"];
    assert!(
        tr["ingress"]["classes"]["mirrors"]["packets"].as_u64() >= Some(u64::from(N)),
        "{tr:#}"
    );
    assert_eq!(tr["ingress"]["classes"]["datasets"]["bytes"], 0);
    let pa = st["datapath"]["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pod"] == "a"))
        .expect("a in status");
    assert_eq!(pa["limits"]["ingress"]["mirrors"], 200_000_000u64);
    let text = stdout(&ctl(node, &["status"]));
    for want in [
        "classes: datasets (2 prefixes), mirrors (1 prefix)",
        "LIMITS",
        "namespace on this node",
        "in: internet 2.0Gbit/s",
        "in: internet 1.0Gbit/s, mirrors 500.0Mbit/s",
        "TRAFFIC",
        "  mirrors",
    ] {
        assert!(text.contains(want), "status lacks {want:?}:\n{text}");
    }

    node.del_pod(&a).expect_ok("DEL a");
    node.del_pod(&b).expect_ok("DEL b");
}
