//! `aliasnetctl` against a fabric node: every command, human and `--json` output, `doctor`
//! finding (and fixing) broken state, and clear messages when a daemon is down. The CLI runs
//! inside the node's netns (`nsenter --net`, bpffs stays visible), as on a real node.

use std::{
    io::Read,
    path::Path,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{AttachmentKey, PodRef, Request, Response};
use aliasnet_tests::{
    fabric::{Fabric, FabricOpts, Node, INTERNET_IP},
    require_root, test_mtu,
};
use serde_json::{json, Value};

/// `aliasnetctl` in the node's netns, pointed at this node's socket and pins.
fn ctl_cmd(node: &Node, args: &[&str]) -> Command {
    let mut c = node.ns.command(aliasnet_tests::bin("aliasnetctl"));
    c.arg("--socket")
        .arg(&node.ipamd_paths.socket)
        .arg("--pin-root")
        .arg(&node.shaper_paths.pin_root)
        .args(args)
        .env("RUST_BACKTRACE", "1");
    c
}

fn ctl(node: &Node, args: &[&str]) -> Output {
    ctl_cmd(node, args).output().expect("run aliasnetctl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs and parses `--json` output, asserting the exit code.
#[track_caller]
fn ctl_json(node: &Node, args: &[&str], code: i32) -> Value {
    let mut full = args.to_vec();
    full.push("--json");
    let o = ctl(node, &full);
    assert_eq!(
        o.status.code(),
        Some(code),
        "aliasnetctl {args:?}: stdout={} stderr={}",
        stdout(&o),
        stderr(&o)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "aliasnetctl {args:?} --json is not JSON ({e}): {}",
            stdout(&o)
        )
    })
}

/// No panic, no raw OS error, no backtrace: a sentence for the operator.
#[track_caller]
fn assert_clean_error(o: &Output, want: &str) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "stderr={err} stdout={}",
        stdout(o)
    );
    assert!(err.contains(want), "stderr lacks {want:?}: {err}");
    for bad in ["panicked", "os error", "RUST_BACKTRACE", "stack backtrace"] {
        assert!(!err.contains(bad), "stderr shows {bad:?}: {err}");
    }
}

fn by_pod<'a>(pods: &'a Value, name: &str) -> &'a Value {
    pods.as_array()
        .expect("pods array")
        .iter()
        .find(|p| p["pod"] == name)
        .unwrap_or_else(|| panic!("pod {name} not in {pods}"))
}

/// The kernel's answer on fq, from its config when the kernel exposes it.
fn kernel_has_fq() -> Option<bool> {
    let out = Command::new("sh")
        .args([
            "-c",
            "zcat /proc/config.gz 2>/dev/null | grep -E 'CONFIG_NET_SCH_FQ(=| is not set)'",
        ])
        .output()
        .ok()?;
    let t = String::from_utf8_lossy(&out.stdout);
    if t.contains("CONFIG_NET_SCH_FQ=y") || t.contains("CONFIG_NET_SCH_FQ=m") {
        Some(true)
    } else if t.contains("# CONFIG_NET_SCH_FQ is not set") {
        Some(false)
    } else {
        None
    }
}

#[test]
fn status_pods_top_and_ipam_describe_the_node() {
    require_root();
    const N: u32 = 5;
    const S: u32 = 500;
    let frame = u64::from(S) + 42;
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        ..FabricOpts::default()
    })
    .expect("fabric");
    let node = f.node(1);
    let a = node.add_pod("a").expect("a");
    let b = node.add_pod("b").expect("b");
    let (n, s) = (N.to_string(), S.to_string());
    for dst in [b.ip, INTERNET_IP] {
        let o =
            a.ns.exec_status(
                "ping",
                &["-c", &n, "-s", &s, "-i", "0.05", "-q", &dst.to_string()],
            )
            .expect("ping");
        assert!(o.status.success(), "ping {dst}");
    }

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
    let mut load =
        a.ns.command("ping")
            .args([
                "-c",
                "400",
                "-i",
                "0.01",
                "-s",
                "1000",
                "-q",
                &b.ip.to_string(),
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("load");
    let o = ctl(
        node,
        &["top", "--iterations", "2", "--interval", "1", "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let frames: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(frames.len(), 2, "{}", stdout(&o));
    let busiest = frames
        .iter()
        .flat_map(|f| f["pods"].as_array().cloned().unwrap_or_default())
        .filter(|p| p["pod"] == "a")
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
        })
        .expect("allocate ghost")
    {
        Response::Allocated { lease } => lease.address,
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

/// Runs `fix` in the node's netns with aliasnetctl on the PATH.
fn apply_fix(node: &Node, fix: &str) {
    let path = format!(
        "{}:{}",
        aliasnet_tests::bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = node
        .ns
        .command("sh")
        .args(["-c", fix])
        .env("PATH", path)
        .output()
        .expect("sh");
    assert!(
        o.status.success(),
        "fix {fix:?} failed: {}{}",
        stdout(&o),
        stderr(&o)
    );
}

fn findings(report: &Value) -> Vec<Value> {
    report["findings"].as_array().cloned().unwrap_or_default()
}

#[test]
fn doctor_finds_broken_state_and_its_fixes_work() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        ..FabricOpts::default()
    })
    .expect("fabric");
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
        })
        .expect("allocate")
    {
        Response::Allocated { lease } => lease.address,
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
    let start = Instant::now();
    loop {
        let o = ctl(node, &["doctor", "--grace", "0", "--json"]);
        if o.status.success() {
            break;
        }
        // The daemon deletes a released veth asynchronously; give it a moment.
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "doctor still unhappy: {}",
            stdout(&o)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
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
                "103:",
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

#[test]
fn commands_explain_daemons_that_are_down() {
    require_root();
    let mut f = Fabric::new(FabricOpts {
        nodes: 1,
        ..FabricOpts::default()
    })
    .expect("fabric");
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
