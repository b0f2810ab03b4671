//! What a dual-stack pod can do to its node over the link (IPv6 link-local and multicast),
//! end to end on the namespace fabric with the plugin and the datapath: flood the node's
//! neighbour table from forged link-local sources, reach the node's own services on the
//! gateway's link-local address. See docs/security.md, "The link".

use std::{
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use aliasnet_tests::{
    fabric::{Fabric, FabricOpts, Pod, INTERNET_IP6},
    netns::Netns,
    require_root,
};

/// Neighbour solicitations to the gateway (`fe80::1`, through its solicited-node group)
/// from a random link-local source with a random link-layer address each, 2,000 a second for
/// `secs` seconds (ten times what filled the table, without taking a CPU from the tests
/// beside it): each new source the node accepts takes an entry of its neighbour table.
const FLOOD: &str = r#"
import os, random, socket, struct, sys, time

def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff

ifname, secs = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((ifname, 0))
dst = socket.inet_pton(socket.AF_INET6, "ff02::1:ff00:1")
target = socket.inet_pton(socket.AF_INET6, "fe80::1")
sent, start = 0, time.time()
while time.time() < start + secs:
    if sent > (time.time() - start) * 2000:
        time.sleep(0.002)
        continue
    mac = bytes([0x02]) + os.urandom(5)
    src = socket.inet_pton(socket.AF_INET6, "fe80::") [:8] + os.urandom(8)
    icmp = bytes([135, 0, 0, 0, 0, 0, 0, 0]) + target + bytes([1, 1]) + mac
    pseudo = src + dst + struct.pack("!I3xB", len(icmp), 58) + icmp
    icmp = icmp[:2] + struct.pack("!H", csum(pseudo)) + icmp[4:]
    ip6 = struct.pack("!IHBB", 0x60000000, len(icmp), 58, 255) + src + dst
    eth = bytes([0x33, 0x33, 0xff, 0, 0, 1]) + mac + b"\x86\xdd"
    try:
        s.send(eth + ip6 + icmp)
        sent += 1
    except OSError:
        time.sleep(0.001)
print(sent)
"#;

/// Neighbour entries of the node's namespace on any device.
fn neighbours(node: &Netns) -> usize {
    let out = node.ip(&["-6", "neigh", "show"]).expect("ip -6 neigh");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

fn flood(pod: &Pod, secs: u32) -> Child {
    pod.ns
        .command("python3")
        .args(["-c", FLOOD, &pod.ifname, &secs.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the flood")
}

fn dual_stack_node() -> Fabric {
    Fabric::new(FabricOpts {
        nodes: 1,
        ..FabricOpts::dual_stack()
    })
    .expect("build a dual-stack fabric")
}

/// A pod sending neighbour solicitations from random link-local sources for 30 s leaves
/// the node's neighbour table (shared by every namespace of the machine, `gc_thresh3` 1,024
/// entries) far below its first threshold, and other pods' IPv6, old and new, keeps
/// working. Before the pods' link-local sources were checked, 5 s of this filled the table.
#[test]
fn a_pod_flooding_neighbour_solicitations_leaves_the_nodes_table_and_other_pods_alone() {
    require_root();
    let f = dual_stack_node();
    let n = f.node(1);
    let attacker = n.add_pod("attacker").unwrap();
    let other = n.add_pod("other").unwrap();
    assert!(other.ping(INTERNET_IP6, &[]), "before the flood");
    let thresh1: usize = std::fs::read_to_string("/proc/sys/net/ipv6/neigh/default/gc_thresh1")
        .expect("gc_thresh1")
        .trim()
        .parse()
        .expect("number");
    let before = neighbours(&n.ns);
    let child = flood(&attacker, 30);
    let start = Instant::now();
    let mut most = before;
    let mut newcomer = None;
    while start.elapsed() < Duration::from_secs(29) {
        std::thread::sleep(Duration::from_secs(2));
        most = most.max(neighbours(&n.ns));
        // A pod started during the flood resolves its gateway and reaches the internet.
        if newcomer.is_none() && start.elapsed() > Duration::from_secs(10) {
            let p = n.add_pod("newcomer").unwrap();
            assert!(p.ping(INTERNET_IP6, &[]), "a new pod during the flood");
            newcomer = Some(p);
        }
        assert!(
            other.ping(INTERNET_IP6, &[]),
            "another pod during the flood"
        );
    }
    let out = child.wait_with_output().expect("flood");
    let sent: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("solicitations sent");
    assert!(sent > 20_000, "the flood sent {sent} solicitations in 30 s");
    assert!(
        most < thresh1.min(128),
        "the node's neighbour table reached {most} entries (from {before}; gc_thresh1 {thresh1})"
    );
    let counters = n.record(&attacker).counters;
    assert!(
        counters.spoofed.packets + 1_000 >= sent,
        "forged link-local sources dropped as spoofed: {} of {sent}",
        counters.spoofed.packets
    );
    assert!(
        attacker.ping(INTERNET_IP6, &[]),
        "the attacker's own IPv6 still works"
    );
}

/// A dual-stack pod reached any service of the node on the gateway's link-local address
/// (`fe80::1`, the host veth's), whatever `blocked_cidrs` said; IPv4 has no such path. Now
/// only what a pod needs of the link passes: its IPv6 traffic, through neighbour
/// discovery, works; TCP and ping to the gateway do not.
#[test]
fn a_pod_cannot_reach_the_nodes_services_over_the_gateways_link_local_address() {
    require_root();
    let f = dual_stack_node();
    let n = f.node(1);
    let pod = n.add_pod("a").unwrap();
    // A service of the node's listening on every address (as the kubelet does).
    let mut listener =
        n.ns.command("python3")
            .args([
                "-c",
                "import socket,time\n\
             s=socket.socket(socket.AF_INET6)\n\
             s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('::',10250))\n\
             s.listen(16)\n\
             time.sleep(60)",
            ])
            .spawn()
            .expect("listener");
    std::thread::sleep(Duration::from_millis(500));
    let connect = |dst: &str| {
        let script = format!(
            "import socket,sys\n\
             try:\n    socket.create_connection(('{dst}',10250),timeout=2)\n\
             except OSError as e:\n    print(e); sys.exit(1)"
        );
        pod.ns
            .command("python3")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .status()
            .expect("python3")
            .success()
    };
    let gateway = format!("fe80::1%{}", pod.ifname);
    let connected = connect(&gateway);
    let pinged = pod.ping(
        "fe80::1".parse::<std::net::Ipv6Addr>().unwrap(),
        &["-I", &pod.ifname],
    );
    let _ = listener.kill();
    let _ = listener.wait();
    assert!(
        !connected,
        "a pod connected to the node's port 10250 on {gateway}"
    );
    assert!(!pinged, "the gateway's link-local address answered a ping");
    // What the pod needs of the link still works: its IPv6 traffic resolves the gateway.
    pod.ns
        .ip(&["-6", "neigh", "flush", "dev", &pod.ifname])
        .expect("flush the pod's neighbours");
    assert!(
        pod.ping(INTERNET_IP6, &[]),
        "the pod's IPv6 after neighbour discovery"
    );
    let drops = n.record(&pod).counters.dropped[aliasnet_ebpf::abi::DROP_GATEWAY].packets;
    assert!(drops >= 2, "drops to the gateway counted: {drops}");
}
