//! aliasnet-shaperd lifecycle in network namespaces: policy reload (file change and SIGHUP,
//! invalid policy rejected), restart without losing counters or packets, program upgrade
//! switching live pods' filters in place. Root only.

mod fabric;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use aliasnet_ebpf::{
    abi::{self, Class, Direction},
    maps,
    netlink::{Hook, Rtnl},
    Limits, DATAPATH_OBJECT,
};
use aya::{programs::SchedClassifier, EbpfLoader};
use fabric::*;

const PING_FRAME: u64 = 142;

const POLICY_A: &str = r#"
internal_cidrs = ["10.0.0.0/8", "100.64.0.0/16", "fd00::/8"]
blocked_cidrs = ["198.51.100.0/24", "2001:db8:a::/48"]
pod_internet_egress_rate = "10M"
"#;

const POLICY_B: &str = r#"
internal_cidrs = ["10.0.0.0/8", "100.64.0.0/16", "fd00::/8"]
blocked_cidrs = ["198.51.100.0/24", "203.0.113.0/24", "2001:db8:b::/48"]
pod_internet_egress_rate = "30M"
"#;

fn counter(f: &Fabric, dir: Direction, class: Class) -> abi::Counter {
    f.open()
        .pod(CONTAINER_ID, "eth0")
        .unwrap()
        .expect("attached")
        .counters
        .get(dir, class)
}

/// Program id our cls_bpf filter on `dev`'s `hook` runs (in netns `role`).
fn filter_prog_id(f: &Fabric, role: &str, dev: &str, hook: Hook) -> u32 {
    let dev = dev.to_owned();
    aliasnet_netns::run_in(f.ns_path(role), move || {
        let ifindex = nix::net::if_::if_nametoindex(dev.as_str()).expect("ifindex");
        Rtnl::new()
            .expect("rtnl")
            .our_filter(ifindex, hook)
            .expect("list filters")
            .unwrap_or_else(|| panic!("no filter on {dev} {hook:?}"))
            .prog_id
    })
    .expect("enter netns")
}

/// Programs of the pod's three hooks.
fn pod_prog_ids(f: &Fabric) -> Vec<u32> {
    vec![
        filter_prog_id(f, "node", "vh1", Hook::Ingress),
        filter_prog_id(f, "node", "vh1", Hook::Egress),
        filter_prog_id(f, "pod", "eth0", Hook::Egress),
    ]
}

fn prog_id(f: &Fabric, name: &str) -> u32 {
    SchedClassifier::from_pin(f.pin_root().join("progs").join(name))
        .expect("prog pin")
        .info()
        .expect("prog info")
        .id()
}

/// The rate tc prints for an HTB class ("10Mbit"); tc 6.1 has no JSON for classes.
fn htb_rate(f: &Fabric, role: &str, dev: &str, classid: &str) -> String {
    let out = f.exec(role, &["tc", "class", "show", "dev", dev]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.split_whitespace().nth(2) == Some(classid))
        .and_then(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.iter()
                .position(|t| *t == "rate")
                .map(|i| w[i + 1].to_owned())
        })
        .unwrap_or_else(|| panic!("class {classid} on {dev}: {text}"))
}

/// `ping` running in the background; `finish` returns (sent, received).
struct BackgroundPing(std::process::Child);

impl BackgroundPing {
    fn start(f: &Fabric, dst: &str, count: u32) -> Self {
        let c = count.to_string();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &f.ns("pod"),
                "ping",
                "-q",
                "-n",
                "-i",
                "0.01",
                "-c",
                &c,
                dst,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ping");
        Self(child)
    }

    fn finish(self) -> (u64, u64) {
        let out = self.0.wait_with_output().expect("ping output");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or_else(|| panic!("ping summary: {text}"));
        let n: Vec<u64> = line
            .split(", ")
            .take(2)
            .map(|p| p.split(' ').next().unwrap().parse().unwrap())
            .collect();
        (n[0], n[1])
    }
}

#[test]
fn policy_reload_applies_changes_and_rejects_invalid_ones() {
    require_root();
    let mut f = Fabric::new();
    let path = f.write_policy(POLICY_A);
    f.start_shaperd(&path);
    let mut dp = f.open();
    let att = f.attachment(Limits::default());
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert_eq!(htb_rate(&f, "pod", "eth0", "1:10"), "10Mbit");
    assert_eq!(f.ping("pod", INTERNET, 5, 100, &[]), 5);
    assert_eq!(f.ping("pod", BLOCKED, 2, 100, &[]), 0);
    let epoch_a = dp.config().unwrap().policy_epoch;

    // A valid change: 203.0.113.0/24 becomes blocked and the default rate triples. The pod's
    // limit came from policy, so it follows; its counters and attachment stay.
    f.write_policy(POLICY_B);
    f.wait_log(
        |l| l.matches("policy applied").count() >= 2,
        "reload of policy B",
    );
    assert_eq!(dp.config().unwrap().policy_epoch, epoch_a + 1);
    assert_eq!(f.ping("pod", INTERNET, 3, 100, &[]), 0, "now blocked");
    assert_eq!(
        counter(&f, Direction::Egress, Class::Internet).packets,
        5,
        "counters kept"
    );
    assert_eq!(
        counter(&f, Direction::Egress, Class::Blocked).packets,
        2 + 3
    );
    assert_eq!(htb_rate(&f, "pod", "eth0", "1:10"), "30Mbit");
    let rec = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap();
    assert_eq!(rec.meta.internet_egress_rate(), 30_000_000);

    // An invalid file is rejected with the key named; policy B stays in force.
    f.write_policy(r#"internal_cidrs = ["10.0.0.1/8"]"#);
    f.wait_log(
        |l| l.contains("internal_cidrs[0]"),
        "rejection of the invalid policy",
    );
    assert!(
        f.log().contains("previous policy stays applied"),
        "{}",
        f.log()
    );
    assert!(f.shaperd_alive(), "shaperd survives an invalid policy");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(dp.config().unwrap().policy_epoch, epoch_a + 1);
    assert_eq!(
        f.ping("pod", INTERNET, 2, 100, &[]),
        0,
        "policy B still blocks"
    );
    let active = dp.active_prefixes().unwrap();
    assert!(
        active.contains(&("203.0.113.0".parse().unwrap(), 24, abi::CLASS_BLOCKED)),
        "{active:?}"
    );
    // Both families switched with the generation: B's IPv6 prefixes, not A's, and the IPv6
    // metadata endpoint.
    for (prefix, len, class) in [
        ("fd00::", 8, abi::CLASS_INTERNAL),
        ("2001:db8:b::", 48, abi::CLASS_BLOCKED),
        ("fd00:ec2::254", 128, abi::CLASS_BLOCKED),
    ] {
        assert!(
            active.contains(&(prefix.parse().unwrap(), len, class)),
            "{prefix}/{len} in {active:?}"
        );
    }
    assert!(
        !active.contains(&("2001:db8:a::".parse().unwrap(), 48, abi::CLASS_BLOCKED)),
        "{active:?}"
    );

    // Restart with a long poll interval: only SIGHUP reloads.
    f.stop_shaperd();
    f.start_shaperd_with(&path, &["--poll-interval", "3600"]);
    // On start the file is still invalid: the running policy is kept, not dropped.
    assert!(
        f.log()
            .contains("keeping the policy applied before the restart"),
        "{}",
        f.log()
    );
    f.write_policy(POLICY_A);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        dp.config().unwrap().policy_epoch,
        epoch_a + 1,
        "no reload without SIGHUP"
    );
    f.signal_shaperd(nix::sys::signal::Signal::SIGHUP);
    f.wait_log(|l| l.contains("SIGHUP: reloading policy"), "SIGHUP");
    f.wait_log(
        |l| l.matches("policy applied").count() >= 3,
        "reload of policy A",
    );
    assert_eq!(f.ping("pod", INTERNET, 2, 100, &[]), 2, "unblocked again");
    assert_eq!(htb_rate(&f, "pod", "eth0", "1:10"), "10Mbit");
    f.stop_shaperd();
}

#[test]
fn restart_keeps_counters_links_and_traffic() {
    require_root();
    let mut f = Fabric::new();
    let path = f.write_policy(POLICY_A);
    f.start_shaperd(&path);
    let mut dp = f.open();
    let att = f.attachment(Limits {
        ingress_rate: Some(100_000_000),
        ..Limits::default()
    });
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert_eq!(f.ping("pod", INTERNET, 10, 100, &[]), 10);
    let links_before = pod_prog_ids(&f);

    // Continuous pings while shaperd stops and starts again.
    let bg = BackgroundPing::start(&f, INTERNET, 300);
    std::thread::sleep(Duration::from_millis(300));
    f.stop_shaperd();
    std::thread::sleep(Duration::from_millis(300));
    // A pod added while shaperd is down is still classified and shaped: the plugin only
    // needs the pins (exercised throughout tests/attach.rs, which never run the daemon).
    f.start_shaperd(&path);
    let (sent, received) = bg.finish();
    assert_eq!(sent, 300);
    assert_eq!(received, sent, "no packet lost across the restart");

    let k = counter(&f, Direction::Egress, Class::Internet);
    assert_eq!(k.packets, 10 + sent, "counters continue across the restart");
    assert_eq!(k.bytes, 10 * PING_FRAME + sent * (14 + 20 + 8 + 56));
    let links_after = pod_prog_ids(&f);
    assert_eq!(
        links_before, links_after,
        "same programs: nothing was re-attached"
    );
    assert!(f.log().contains("upgraded=[]"), "{}", f.log());
    assert_eq!(htb_rate(&f, "node", "vh1", "1:1"), "100Mbit");
    f.stop_shaperd();
}

#[test]
fn upgrade_switches_live_filters_to_new_programs() {
    require_root();
    let f = Fabric::new();
    let path = f.write_policy(POLICY_A);
    assert!(f.shaperd_once(&path).status.success());
    // Stand in for "the previous release": pin different code under an_host_ingress, a
    // separately loaded copy of the egress program (it classes on the source and counts as
    // the ingress direction), and under an_pod_egress the uplink program (it picks no pod
    // class), using the same pinned maps.
    let progs = f.pin_root().join("progs");
    let mut loader = EbpfLoader::new();
    let paths: Vec<(&str, std::path::PathBuf)> = maps::ALL
        .iter()
        .map(|m| (*m, f.pin_root().join("maps").join(m)))
        .collect();
    for (m, p) in &paths {
        loader.map_pin_path(m, p.as_path());
    }
    let mut old = loader.load(DATAPATH_OBJECT).expect("load");
    for (code, pin_as) in [
        ("an_host_egress", "an_host_ingress"),
        ("an_uplink", "an_pod_egress"),
    ] {
        let prog: &mut SchedClassifier = old.program_mut(code).unwrap().try_into().unwrap();
        prog.load().expect("verifier");
        std::fs::remove_file(progs.join(pin_as)).unwrap();
        prog.pin(progs.join(pin_as)).unwrap();
    }
    drop(old);
    let old_id = prog_id(&f, "an_host_ingress");
    let old_pod_id = prog_id(&f, "an_pod_egress");

    let mut dp = f.open();
    let att = f.attachment(Limits::default());
    let slot = f.in_node(|| dp.attach_pod(&att)).expect("attach").slot;
    let egress_before = filter_prog_id(&f, "node", "vh1", Hook::Egress);
    assert_eq!(filter_prog_id(&f, "node", "vh1", Hook::Ingress), old_id);
    assert_eq!(filter_prog_id(&f, "pod", "eth0", Hook::Egress), old_pod_id);
    assert_eq!(f.ping("pod", INTERNET, 4, 100, &[]), 4);
    // The old code counted the pod's outgoing requests as ingress: wrong direction.
    assert_eq!(counter(&f, Direction::Egress, Class::Internet).packets, 0);

    let bg = BackgroundPing::start(&f, INTERNET, 200);
    std::thread::sleep(Duration::from_millis(200));
    let out = f.shaperd_once(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("upgraded=[\"an_host_ingress\", \"an_pod_egress\"]")
            && log.contains("relinked=2"),
        "{log}"
    );
    let (sent, received) = bg.finish();
    assert_eq!(received, sent, "no packet lost during the upgrade");

    let new_id = prog_id(&f, "an_host_ingress");
    assert_ne!(new_id, old_id);
    assert_eq!(
        filter_prog_id(&f, "node", "vh1", Hook::Ingress),
        new_id,
        "the live filter runs the new program"
    );
    assert_eq!(
        filter_prog_id(&f, "pod", "eth0", Hook::Egress),
        prog_id(&f, "an_pod_egress"),
        "the pod-side filter runs the new program"
    );
    let classid = aliasnet_netns::run_in(f.ns_path("pod"), || {
        let ifindex = nix::net::if_::if_nametoindex("eth0").expect("ifindex");
        Rtnl::new().expect("rtnl").our_filter(ifindex, Hook::Egress)
    })
    .expect("enter netns")
    .expect("list filters")
    .expect("pod-side filter")
    .classid;
    assert_eq!(
        classid,
        abi::pod_filter_classid(slot),
        "the replaced pod-side filter carries the pod's slot again"
    );
    assert_ne!(prog_id(&f, "an_pod_egress"), old_pod_id);
    assert_eq!(
        filter_prog_id(&f, "node", "vh1", Hook::Egress),
        egress_before,
        "an unchanged program keeps its filter"
    );
    // The new pod program classes internet traffic into the 10 Mbit/s class again.
    let internet_class = || {
        aliasnet_netns::run_in(f.ns_path("pod"), || {
            let ifindex = nix::net::if_::if_nametoindex("eth0").expect("ifindex");
            Rtnl::new()
                .and_then(|mut rt| rt.class_stats(ifindex))
                .expect("class stats")
                .iter()
                .find(|c| c.handle == abi::classid(abi::pod_class(abi::KIND_INTERNET)))
                .map_or(0, |c| c.packets)
        })
        .expect("enter netns")
    };
    let before = internet_class();
    assert_eq!(f.ping("pod", INTERNET, 3, 100, &[]), 3);
    assert!(
        internet_class() >= before + 3,
        "internet pings go through class 1:10"
    );
    let before = counter(&f, Direction::Egress, Class::Internet).packets;
    assert_eq!(f.ping("pod", INTERNET, 5, 100, &[]), 5);
    assert_eq!(
        counter(&f, Direction::Egress, Class::Internet).packets,
        before + 5
    );
}

/// Pinned maps of another ABI version (a downgrade, or an upgrade half done) are never reused:
/// shaperd refuses to start and the plugin's open refuses to attach, both naming the versions
/// and what to do; with the right version back, everything works again.
#[test]
fn pinned_maps_of_another_abi_are_refused() {
    require_root();
    let f = Fabric::new();
    let path = f.write_policy(POLICY_A);
    assert!(f.shaperd_once(&path).status.success());
    let set_abi = |v: u32| {
        let data = aya::maps::MapData::from_pin(f.pin_root().join("maps").join(maps::CONFIG))
            .expect("config pin");
        let mut cfg: aya::maps::Array<_, abi::Config> =
            aya::maps::Array::try_from(aya::maps::Map::Array(data)).expect("array");
        let mut c = cfg.get(&0, 0).expect("config");
        c.abi_version = v;
        cfg.set(0, c, 0).expect("write config");
    };
    let other = abi::ABI_VERSION + 1;
    set_abi(other);

    let out = f.shaperd_once(&path);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "shaperd reused maps of ABI {other}");
    assert!(
        log.contains(&format!(
            "ABI version {other}, this build speaks {}",
            abi::ABI_VERSION
        )) && log.contains("drain the node and remove"),
        "{log}"
    );
    let root = f.pin_root();
    let e = f
        .in_node(|| aliasnet_ebpf::Datapath::open(root))
        .err()
        .expect("opened maps of another ABI");
    assert!(
        matches!(e, aliasnet_ebpf::DatapathError::AbiMismatch { .. }),
        "{e}"
    );

    set_abi(abi::ABI_VERSION);
    assert!(f.shaperd_once(&path).status.success());
    let mut dp = f.open();
    let att = f.attachment(Limits::default());
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert_eq!(f.ping("pod", INTERNET, 2, 100, &[]), 2);
}

/// A network namespace mounted for this test at `/run/netns/<name>`, deleted on drop.
struct NetnsMount(String);

impl Drop for NetnsMount {
    fn drop(&mut self) {
        let _ = aliasnet_tests::netns::ip(&["netns", "del", &self.0]);
    }
}

/// A pod's recorded netns path that now names another namespace (the pod's is gone and the
/// name reused, or a namespace was mounted over the path): shaperd changes nothing there
/// when a policy reload changes the pod's egress limit, and says why.
#[test]
fn a_netns_path_that_names_another_namespace_is_not_entered() {
    require_root();
    let mut f = Fabric::new();
    let path = f.write_policy(POLICY_A);
    f.start_shaperd(&path);
    let mut dp = f.open();
    let att = f.attachment(Limits::default());
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert_eq!(htb_rate(&f, "pod", "eth0", "1:10"), "10Mbit");

    // The pod's namespace stays alive under a second name; its recorded path gets an
    // impostor with an eth0 of its own.
    let name = f.ns("pod");
    let run = |p: &str| format!("/run/netns/{p}");
    let kept = NetnsMount(format!("{name}-kept"));
    std::fs::File::create(run(&kept.0)).expect("mount point");
    let sh = |args: &[&str]| {
        let out = Command::new(args[0])
            .args(&args[1..])
            .output()
            .expect(args[0]);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    sh(&["mount", "--bind", &run(&name), &run(&kept.0)]);
    sh(&["umount", &run(&name)]);
    std::fs::remove_file(run(&name)).expect("remove the pod's netns file");
    ip(&["netns", "add", &name]);
    ip(&[
        "-n", &name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
    ]);
    ip(&["-n", &name, "link", "set", "eth0", "up"]);

    f.write_policy(POLICY_B);
    f.wait_log(
        |l| l.matches("policy applied").count() >= 2,
        "reload of policy B",
    );
    let qdiscs = Command::new("ip")
        .args(["netns", "exec", &name, "tc", "qdisc", "show", "dev", "eth0"])
        .output()
        .expect("tc");
    let qdiscs = String::from_utf8_lossy(&qdiscs.stdout);
    assert!(
        !qdiscs.contains("htb") && !qdiscs.contains("clsact"),
        "shaperd shaped the impostor's eth0: {qdiscs}"
    );
    // The pod's own namespace was not reached either: its limit is as attached.
    let classes = Command::new("ip")
        .args([
            "netns", "exec", &kept.0, "tc", "class", "show", "dev", "eth0",
        ])
        .output()
        .expect("tc");
    let classes = String::from_utf8_lossy(&classes.stdout);
    assert!(classes.contains("rate 10Mbit"), "{classes}");
    assert!(
        f.log().contains("no longer the pod's network namespace"),
        "{}",
        f.log()
    );
    assert!(f.shaperd_alive());
    f.stop_shaperd();
}
