//! IPv6 through the datapath with real traffic: the single-node fabric's namespaces get IPv6
//! addresses wired as the plugin wires a dual-stack pod (a /128 on the pod's eth0 without
//! DAD, gateway fe80::1 with a permanent neighbour, a host /128 route), and the pod is
//! attached with both addresses. Checks classification and counters of IPv6 traffic, the
//! blocked IPv6 metadata endpoint, and an ingress limit on an IPv6 TCP download. Root only.

mod fabric;

use aliasnet_ebpf::{
    abi::{Class, Direction},
    Limits,
};
use fabric::*;

const POD_IP6: &str = "fd00:240::5";
const INTERNET6: &str = "2001:db8::10";
const INTERNAL6: &str = "fd00:100::2";
const METADATA6: &str = "fd00:ec2::254";
const SECS: u32 = 4;

const POLICY: &str = r#"
internal_cidrs = ["10.0.0.0/8", "fd00::/8"]
"#;

/// The fabric with IPv6 on every link: node uplink fd00:100::1/64 to the internet host
/// (fd00:100::2, with 2001:db8::10 and AWS's metadata address on its loopback), the pod
/// fd00:240::5/128 behind vh1.
fn dual_stack(limits: Limits) -> (Fabric, aliasnet_ebpf::Datapath) {
    let f = Fabric::new();
    let (node, pod, inet) = (f.ns("node"), f.ns("pod"), f.ns("inet"));
    f.exec("node", &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    f.exec("node", &["sysctl", "-qw", "net.ipv6.conf.vh1.accept_dad=0"]);
    f.exec("pod", &["sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0"]);
    f.exec("pod", &["sysctl", "-qw", "net.ipv6.conf.eth0.accept_ra=0"]);
    ip(&[
        "-n",
        &node,
        "addr",
        "add",
        "fd00:100::1/64",
        "dev",
        "up0",
        "nodad",
    ]);
    ip(&["-n", &node, "route", "add", "default", "via", INTERNAL6]);
    ip(&[
        "-n",
        &node,
        "route",
        "add",
        &format!("{POD_IP6}/128"),
        "dev",
        "vh1",
    ]);
    ip(&[
        "-n",
        &inet,
        "addr",
        "add",
        "fd00:100::2/64",
        "dev",
        "ext0",
        "nodad",
    ]);
    for a in [INTERNET6, METADATA6] {
        ip(&["-n", &inet, "addr", "add", &format!("{a}/128"), "dev", "lo"]);
    }
    ip(&[
        "-n",
        &inet,
        "route",
        "add",
        "fd00:240::/112",
        "via",
        "fd00:100::1",
    ]);
    let mac = f.mac("node", "vh1");
    ip(&[
        "-n",
        &pod,
        "addr",
        "add",
        &format!("{POD_IP6}/128"),
        "dev",
        "eth0",
        "nodad",
    ]);
    ip(&[
        "-n",
        &pod,
        "neigh",
        "add",
        "fe80::1",
        "lladdr",
        &mac,
        "dev",
        "eth0",
        "nud",
        "permanent",
    ]);
    ip(&[
        "-n", &pod, "route", "add", "default", "via", "fe80::1", "dev", "eth0",
    ]);
    let path = f.write_policy(POLICY);
    let out = f.shaperd_once(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut dp = f.open();
    let mut att = f.attachment(limits);
    att.identity.ipv6 = Some(POD_IP6.parse().unwrap());
    f.in_node(|| dp.attach_pod(&att)).expect("attach");
    // The node resolves the pod (NDP through the programs) before the first reply.
    let mut up = false;
    for _ in 0..30 {
        if f.ping("pod", INTERNET6, 1, 56, &["-W", "1"]) == 1 {
            up = true;
            break;
        }
    }
    assert!(up, "no IPv6 path between the pod and the internet host");
    (f, dp)
}

fn counter(
    dp: &aliasnet_ebpf::Datapath,
    dir: Direction,
    class: Class,
) -> aliasnet_ebpf::abi::Counter {
    dp.pod(CONTAINER_ID, "eth0")
        .expect("read record")
        .expect("pod recorded")
        .counters
        .get(dir, class)
}

#[test]
fn ipv6_traffic_is_classified_counted_and_blocked() {
    require_root();
    let (f, dp) = dual_stack(Limits::default());
    let rec = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap();
    assert_eq!(rec.ipv6(), Some(POD_IP6.parse().unwrap()));
    assert_eq!(rec.addresses(), format!("{POD_IP},{POD_IP6}"));

    let before = counter(&dp, Direction::Egress, Class::Internet).packets;
    assert_eq!(f.ping("pod", INTERNET6, 5, 100, &[]), 5);
    assert_eq!(
        counter(&dp, Direction::Egress, Class::Internet).packets,
        before + 5
    );
    assert!(counter(&dp, Direction::Ingress, Class::Internet).packets >= 5);

    assert_eq!(f.ping("pod", INTERNAL6, 3, 100, &[]), 3);
    assert_eq!(counter(&dp, Direction::Egress, Class::Internal).packets, 3);

    // The IPv6 metadata endpoint is blocked by default, and dropped on the host veth.
    assert_eq!(f.ping("pod", METADATA6, 3, 100, &["-W", "1"]), 0);
    assert_eq!(counter(&dp, Direction::Egress, Class::Blocked).packets, 3);

    // IPv4 still works beside it.
    assert_eq!(f.ping("pod", INTERNET, 2, 100, &[]), 2);
    // Neighbour discovery went through the programs as class "other", never spoofed.
    let rec = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap();
    assert_eq!(rec.counters.spoofed.packets, 0);
}

#[test]
fn an_ingress_limit_shapes_an_ipv6_tcp_download() {
    require_root();
    let (f, dp) = dual_stack(Limits {
        ingress_rate: Some(10_000_000),
        ..Limits::default()
    });
    let before = counter(&dp, Direction::Ingress, Class::Internet).bytes;
    let mbit = f.iperf("inet", INTERNET6, SECS, true);
    eprintln!("internet -> pod over IPv6 (ingress limit 10 Mbit/s): {mbit:.2} Mbit/s");
    assert!(
        (9.0..=10.5).contains(&mbit),
        "{mbit:.2} Mbit/s of IPv6 goodput, limit 10"
    );
    // Counted as internet traffic to the pod: at least what iperf3 moved.
    let got = counter(&dp, Direction::Ingress, Class::Internet).bytes - before;
    assert!(
        got as f64 * 8.0 >= mbit * 1e6 * f64::from(SECS) * 0.95,
        "{got} bytes counted for {mbit:.2} Mbit/s over {SECS} s"
    );
}

#[test]
fn an_internet_egress_limit_shapes_ipv6_uploads_and_not_internal_ones() {
    require_root();
    let (f, dp) = dual_stack(Limits {
        internet_egress_rate: Some(10_000_000),
        ..Limits::default()
    });
    let mbit = f.iperf("inet", INTERNET6, SECS, false);
    eprintln!("pod -> internet over IPv6 (internet-egress limit 10 Mbit/s): {mbit:.2} Mbit/s");
    assert!(
        (9.0..=10.5).contains(&mbit),
        "{mbit:.2} Mbit/s of IPv6 goodput, limit 10"
    );
    assert!(counter(&dp, Direction::Egress, Class::Internet).bytes > 4_000_000);
    // fd00:100::2 is internal (fd00::/8): the internet limit does not apply.
    let mbit = f.iperf("inet", INTERNAL6, SECS, false);
    eprintln!("pod -> internal over IPv6: {mbit:.1} Mbit/s");
    assert!(
        mbit > 100.0,
        "{mbit:.1} Mbit/s to an internal IPv6 address, looks shaped"
    );
}
