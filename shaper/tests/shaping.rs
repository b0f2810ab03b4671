//! Shaping in network namespaces with iperf3: a pod's internet traffic is limited while its
//! internal traffic is not, and ingress and total egress limits, in each address family;
//! the node-wide internet cap.
//! Root only. Rates are checked within a band (HTB shapes L2 bytes, iperf3 reports TCP
//! goodput, and the machine is shared), not for benchmark-grade accuracy.

mod fabric;

use std::{net::IpAddr, time::Duration};

use aliasnet_ebpf::{
    abi::{self, Class, Direction},
    AttachedPod, Limits,
};
use fabric::*;

const SECS: u32 = 3;

fn assert_near(what: &str, got_mbit: f64, limit_mbit: f64) {
    eprintln!("{what}: {got_mbit:.2} Mbit/s (limit {limit_mbit})");
    assert!(
        got_mbit >= 0.80 * limit_mbit && got_mbit <= 1.05 * limit_mbit,
        "{what}: {got_mbit:.2} Mbit/s, limit {limit_mbit} Mbit/s"
    );
}

fn assert_unshaped(what: &str, got_mbit: f64, limit_mbit: f64) {
    eprintln!("{what}: {got_mbit:.1} Mbit/s (unshaped)");
    // Unshaped veth forwarding does several Gbit/s here; ten times the limit is unambiguous.
    assert!(
        got_mbit > 10.0 * limit_mbit,
        "{what}: only {got_mbit:.1} Mbit/s, looks shaped"
    );
}

fn installed(policy: &str) -> Fabric {
    Fabric::installed(Family::V4, policy)
}

/// What the pod's counters of `class` in `dir` hold now.
fn counted(dp: &aliasnet_ebpf::Datapath, dir: Direction, class: Class) -> u64 {
    dp.pod(CONTAINER_ID, "eth0")
        .expect("read record")
        .expect("pod recorded")
        .counters
        .get(dir, class)
        .bytes
}

/// The pod's internet egress limit from node policy, in `fam`: its uploads to the internet
/// are held to it, its internal uploads and its downloads are not.
fn internet_is_limited_while_internal_is_not(fam: Family) {
    // The limit comes from node policy; nothing is set on the pod.
    let f = Fabric::installed(
        fam,
        r#"
        internal_cidrs = ["10.0.0.0/8", "fd00::/8"]
        pod_internet_egress_rate = "20M"
        "#,
    );
    let mut dp = f.open();
    let a = f.attach_in(fam, &mut dp, Limits::default());
    assert_eq!(a.internet_egress.map(|s| s.rate), Some(20_000_000));
    assert_eq!(a.egress, None, "no total egress limit");

    let before = counted(&dp, Direction::Egress, Class::Internet);
    assert_near(
        &format!("pod -> internet over {fam}"),
        f.iperf("inet", fam.internet_ip(), SECS, false),
        20.0,
    );
    // Counted as the pod's internet traffic: half of what 3 s at 20 Mbit/s carry.
    let sent = counted(&dp, Direction::Egress, Class::Internet) - before;
    assert!(sent > 3_000_000, "{sent} bytes counted as internet egress");
    // fd00::/8 and 10/8 are internal: the internet limit does not apply.
    assert_unshaped(
        &format!("pod -> internal over {fam}"),
        f.iperf("peer", fam.internal(), SECS, false),
        20.0,
    );
    // Downloads are not limited by an egress limit.
    assert_unshaped(
        &format!("internet -> pod over {fam}"),
        f.iperf("inet", fam.internet_ip(), SECS, true),
        20.0,
    );

    let rec = dp.pod(CONTAINER_ID, "eth0").unwrap().unwrap();
    let stats = f.in_node(|| dp.shaping_stats(&rec)).expect("stats");
    let internet = stats
        .of(Direction::Egress, abi::KIND_INTERNET)
        .expect("internet class leaf");
    assert!(
        internet.bytes > 3_000_000,
        "internet leaf saw the traffic: {internet:?}"
    );
    assert_eq!(stats.leaves.len(), 1, "the internet limit only: {stats:?}");
}

per_family!(internet_is_limited_while_internal_is_not:
    internet_is_limited_while_internal_is_not_ipv4 => Family::V4,
    internet_is_limited_while_internal_is_not_ipv6 => Family::V6,
);

/// A pod's ingress, total egress and internet egress limits from its attachment, in `fam`.
fn ingress_and_total_egress_limits(fam: Family) {
    let f = Fabric::installed(fam, r#"internal_cidrs = ["10.0.0.0/8", "fd00::/8"]"#);
    let mut dp = f.open();
    let a = f.attach_in(
        fam,
        &mut dp,
        Limits {
            ingress_rate: Some(30_000_000),
            // containerd's "unset" burst must not let traffic through unshaped.
            ingress_burst: Some(u64::from(u32::MAX)),
            egress_rate: Some(50_000_000),
            egress_burst: Some(u64::from(u32::MAX)),
            internet_egress_rate: Some(10_000_000),
            ..Limits::default()
        },
    );
    assert_eq!(
        a.ingress.map(|s| s.burst_bytes),
        Some(37_500),
        "10 ms of 30 Mbit/s"
    );

    let before = counted(&dp, Direction::Ingress, Class::Internet);
    let download = f.iperf("inet", fam.internet_ip(), SECS, true);
    assert_near(
        &format!("internet -> pod over {fam} (ingress limit)"),
        download,
        30.0,
    );
    // Counted as internet traffic to the pod: at least what iperf3 moved.
    let got = counted(&dp, Direction::Ingress, Class::Internet) - before;
    assert!(
        got as f64 * 8.0 >= download * 1e6 * f64::from(SECS) * 0.95,
        "{got} bytes counted for {download:.2} Mbit/s over {SECS} s"
    );
    assert_near(
        &format!("internal -> pod over {fam} (ingress limit)"),
        f.iperf("peer", fam.internal(), SECS, true),
        30.0,
    );
    assert_near(
        &format!("pod -> internet over {fam} (internet limit)"),
        f.iperf("inet", fam.internet_ip(), SECS, false),
        10.0,
    );
    assert_near(
        &format!("pod -> internal over {fam} (total egress limit)"),
        f.iperf("peer", fam.internal(), SECS, false),
        50.0,
    );
}

per_family!(ingress_and_total_egress_limits:
    ingress_and_total_egress_limits_ipv4 => Family::V4,
    ingress_and_total_egress_limits_ipv6 => Family::V6,
);

#[test]
fn node_cap_limits_all_pods_internet_egress() {
    require_root();
    // No per-pod limit; the uplink comes from the node's default route.
    let f = installed(
        r#"
        internal_cidrs = ["10.0.0.0/8", "100.64.0.0/16"]
        node_internet_egress_cap = "15M"
        "#,
    );
    let dp_cfg = f.open().config().unwrap();
    let node = f.open().entity(abi::NODE_ENTITY).unwrap();
    assert_eq!(
        node.limits.get(Direction::Egress, abi::KIND_INTERNET),
        Some(15_000_000)
    );
    assert_eq!(dp_cfg.node_out, 1);
    assert_ne!(dp_cfg.uplink_ifindex, 0);
    assert_eq!(f.tc_json("node", "qdisc", "up0")[0]["kind"], "htb");

    let mut dp = f.open();
    let att = f.attachment(Limits::default());
    let a = f.in_node(|| dp.attach_pod(&att)).expect("attach");
    assert_eq!(a.internet_egress, None, "the pod itself is unlimited");

    assert_near(
        "pod -> internet (node cap)",
        f.iperf("inet", INTERNET, SECS, false),
        15.0,
    );
    assert_unshaped(
        "pod -> internal",
        f.iperf("peer", INTERNAL, SECS, false),
        15.0,
    );
    let capped = dp.node_counters().unwrap()[abi::DIR_EGRESS];
    // Half of what 3 s at 15 Mbit/s carry, whatever the frame size.
    assert!(
        capped.bytes > 2_800_000,
        "uplink program classed the pod's internet traffic: {capped:?}"
    );
    // Traffic the node itself sends to the internet is not the pods' and is not capped.
    assert_eq!(f.ping("node", INTERNET, 3, 100, &[]), 3);
    assert_eq!(
        dp.node_counters().unwrap()[abi::DIR_EGRESS].packets,
        capped.packets
    );
}

/// What one `iperf_json` run measured.
struct Run {
    mbps: f64,
    retrans_pct: f64,
    /// The sender's mean smoothed RTT of the flow.
    flow_rtt_ms: f64,
    ping_replies: u32,
    ping_avg_ms: f64,
}

impl Run {
    fn of(v: &serde_json::Value, ping: &str) -> Self {
        let end = &v["end"];
        let sent = end["sum_sent"]["bytes"].as_f64().expect("bytes sent");
        let mss = v["start"]["tcp_mss_default"].as_f64().unwrap_or(1448.0);
        let replies = ping
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(", ").collect();
                (f.len() >= 2 && f[1].ends_with("received"))
                    .then(|| f[1].split(' ').next()?.parse().ok())?
            })
            .unwrap_or(0);
        let ping_avg_ms = ping
            .lines()
            .find(|l| l.starts_with("rtt"))
            .and_then(|l| l.split(" = ").nth(1)?.split('/').nth(1)?.parse().ok())
            .unwrap_or(f64::NAN);
        Self {
            mbps: end["sum_received"]["bits_per_second"]
                .as_f64()
                .expect("goodput")
                / 1e6,
            retrans_pct: 100.0 * end["sum_sent"]["retransmits"].as_f64().unwrap_or(0.0)
                / (sent / mss),
            flow_rtt_ms: end["streams"][0]["sender"]["mean_rtt"]
                .as_f64()
                .expect("mean_rtt")
                / 1e3,
            ping_replies: replies,
            ping_avg_ms,
        }
    }
}

/// The pod attached with an ingress limit of `rate` bit/s and nothing else, under the basic
/// policy. The datapath handle is returned so that it lives as long as the test.
fn pod_with_ingress_limit(rate: u64) -> (Fabric, aliasnet_ebpf::Datapath, AttachedPod) {
    let f = installed(r#"internal_cidrs = ["10.0.0.0/8"]"#);
    let mut dp = f.open();
    let att = f.attachment(Limits {
        ingress_rate: Some(rate),
        ..Limits::default()
    });
    let a = f.in_node(|| dp.attach_pod(&att)).expect("attach");
    (f, dp, a)
}

/// A short queue at 10 Mbit/s: 10 ms, or three of the fabric's frames where those take longer
/// (9014 bytes take 7.2 ms). The drop-tail leaf (what non-ECN traffic fills) holds 25 ms or
/// six frames, far above this.
fn short_queue_ms(f: &Fabric) -> f64 {
    let frame_ms = f64::from(f.links.pod_mtu + 14) * 8.0 / 10_000.0;
    (3.0 * frame_ms).max(10.0)
}

#[test]
fn ecn_traffic_to_a_shaped_pod_is_marked_not_dropped() {
    require_root();
    let (f, _dp, a) = pod_with_ingress_limit(10_000_000);
    // ECN is negotiated by the connecting side (here the internet sender, iperf3's
    // client): it must ask (tcp_ecn = 1); Linux's default (2) only accepts.
    for role in ["pod", "inet"] {
        f.exec(role, &["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]);
    }
    let (v, ping) = f.iperf_json(
        "inet",
        "pod",
        POD_IP,
        Some(INTERNET),
        5,
        Some("cubic"),
        INTERNET,
    );
    let r = Run::of(&v, &ping);
    let q = f.vqueue(abi::vq_pod(a.slot, abi::DIR_INGRESS, abi::KIND_TOTAL));
    eprintln!(
        "internet -> pod, cubic + ECN: {:.2} Mbit/s, retransmits {:.2} %, flow RTT {:.1} ms, ping {:.2} ms, {} CE marks",
        r.mbps, r.retrans_pct, r.flow_rtt_ms, r.ping_avg_ms, q.ce_marked
    );
    assert_near("internet -> pod (ingress limit)", r.mbps, 10.0);
    assert!(q.ce_marked > 100, "the class was congested: {q:?}");
    assert!(
        r.retrans_pct < 1.0,
        "ECN traffic lost {:.2} %",
        r.retrans_pct
    );
    assert!(
        r.flow_rtt_ms < short_queue_ms(&f) && r.ping_avg_ms < short_queue_ms(&f),
        "the queue stayed long: flow RTT {:.1} ms, ping {:.1} ms",
        r.flow_rtt_ms,
        r.ping_avg_ms
    );
}

#[test]
fn pod_egress_queue_stays_short_without_losses() {
    require_root();
    let f = installed(r#"internal_cidrs = ["10.0.0.0/8"]"#);
    let mut dp = f.open();
    let att = f.attachment(Limits {
        internet_egress_rate: Some(10_000_000),
        ..Limits::default()
    });
    let a = f.in_node(|| dp.attach_pod(&att)).expect("attach");
    // No ECN (Linux's default for connections it opens): the queue is kept short by
    // dropping the local sender's segments before the qdisc, which it does not count as
    // losses, and small packets still get through.
    let secs = 5;
    let (v, ping) = f.iperf_json("pod", "inet", INTERNET, None, secs, Some("cubic"), INTERNET);
    let r = Run::of(&v, &ping);
    let q = f.vqueue(abi::vq_pod(a.slot, abi::DIR_EGRESS, abi::KIND_INTERNET));
    eprintln!(
        "pod -> internet, cubic: {:.2} Mbit/s, retransmits {:.2} %, flow RTT {:.1} ms, ping {:.2} ms ({} replies), {} pod-side drops",
        r.mbps, r.retrans_pct, r.flow_rtt_ms, r.ping_avg_ms, r.ping_replies, q.dropped
    );
    assert_near("pod -> internet (internet limit)", r.mbps, 10.0);
    assert!(q.dropped > 0, "the class was congested: {q:?}");
    assert_eq!(r.retrans_pct, 0.0, "pod-side drops are not losses");
    assert!(
        r.flow_rtt_ms < short_queue_ms(&f) && r.ping_avg_ms < short_queue_ms(&f),
        "the queue stayed long: flow RTT {:.1} ms, ping {:.1} ms",
        r.flow_rtt_ms,
        r.ping_avg_ms
    );
    // Pings every 0.1 s for secs - 2 s: a FIFO full of bulk data would refuse most.
    let expected = (secs - 2) * 10;
    assert!(
        r.ping_replies >= expected * 9 / 10,
        "{} of {expected} pings answered",
        r.ping_replies
    );
}

/// A client port for a download from the internet host to the pod's server on `server_port`
/// whose flow bucket is not that of the pings' replies.
fn apart_from_the_pings(server_port: u16) -> u16 {
    let (inet, pod): (IpAddr, IpAddr) = (INTERNET.parse().unwrap(), POD_IP.parse().unwrap());
    let ping = abi::flow_bucket(inet, pod, 1, None);
    (40_000..)
        .find(|&p| abi::flow_bucket(inet, pod, 6, Some((p, server_port))) != ping)
        .expect("a port")
}

#[test]
fn a_bbr_download_is_held_by_the_window_clamp_and_pings_pass_it() {
    require_root();
    let (f, _dp, _) = pod_with_ingress_limit(10_000_000);
    // BBR ignores ECN and, without the clamp, overshoots the 25 ms bulk leaf in its
    // startup (~2 % of a 10 s run's segments lost here). The download's client port keeps it
    // out of the pings' flow bucket: flows sharing one share its state (1 in 64 would).
    let opts = IperfOpts {
        bind: Some(INTERNET),
        cc: Some("bbr"),
        streams: 1,
        ping: Some(PingDuring {
            dst: INTERNET,
            delay: Duration::from_secs(1),
            margin: 2,
        }),
        client_port: Some(apart_from_the_pings),
        server_output: false,
    };
    let (v, ping) = f
        .iperf_run("inet", "pod", POD_IP, 5, &opts)
        .expect("iperf3");
    let ping = ping.unwrap_or_default();
    let r = Run::of(&v, &ping);
    let leaves = f.tc_json("node", "qdisc", "vh1");
    let leaf = |handle: &str| {
        leaves
            .as_array()
            .and_then(|a| a.iter().find(|q| q["handle"] == handle))
            .unwrap_or_else(|| panic!("no leaf {handle} on vh1: {leaves}"))
            .clone()
    };
    let (sparse, bulk) = (leaf("3:"), leaf("4:"));
    eprintln!(
        "internet -> pod, bbr: {:.2} Mbit/s, retransmits {:.2} %, flow RTT {:.1} ms, ping {:.2} ms; sparse leaf {} packets, bulk leaf {} packets / {} drops",
        r.mbps, r.retrans_pct, r.flow_rtt_ms, r.ping_avg_ms, sparse["packets"], bulk["packets"], bulk["drops"]
    );
    assert_near("internet -> pod (ingress limit)", r.mbps, 10.0);
    assert_eq!(
        bulk["drops"], 0,
        "the clamped sender overflowed the bulk leaf"
    );
    assert!(r.retrans_pct < 1.0, "BBR lost {:.2} %", r.retrans_pct);
    // HTB alone shaped: the tbf leaf passed what HTB released without holding it back (with a
    // bucket below HTB's burst it throttled most packets on 1500-byte nodes).
    let (throttled, packets) = (
        bulk["overlimits"].as_u64().unwrap_or(u64::MAX),
        bulk["packets"].as_u64().unwrap_or(0),
    );
    assert!(
        throttled * 100 <= packets,
        "the tbf leaf throttled {throttled} times for {packets} packets"
    );
    // The download went through the bulk leaf, the pings' replies through the sparse one,
    // past the download's queue.
    // Half of 5 s at 10 Mbit/s, whatever the frame size.
    assert!(bulk["bytes"].as_u64().unwrap_or(0) > 3_000_000, "{bulk}");
    assert!(
        sparse["packets"].as_u64().unwrap_or(0) >= u64::from(r.ping_replies),
        "{sparse}"
    );
    assert!(r.ping_replies >= 20, "{} pings answered", r.ping_replies);
    assert!(
        r.ping_avg_ms < short_queue_ms(&f),
        "pings waited behind the download: {:.1} ms",
        r.ping_avg_ms
    );

    // Four downloads at once share the clamp's allowance (each window a quarter), so
    // together they still fit the bulk leaf; each gets a fair part of the rate.
    let mut server = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &f.ns("pod"),
            "iperf3",
            "-s",
            "-1",
            "-B",
            POD_IP,
        ])
        .args(["-p", "5990"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("iperf3 server");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Four flows in four of the class's flow buckets: flows that share a bucket share its
    // allowance as one (as in fq_codel), which this part does not measure.
    let cport = distinct_buckets_cport(4).to_string();
    let out = f.exec(
        "inet",
        &[
            "iperf3", "-J", "-c", POD_IP, "-p", "5990", "-B", INTERNET, "--cport", &cport, "-t",
            "4", "-P", "4", "-C", "bbr",
        ],
    );
    let _ = server.wait();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 -J");
    let total = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .expect("goodput")
        / 1e6;
    let mss = v["start"]["tcp_mss_default"].as_f64().unwrap_or(1448.0);
    let sent = v["end"]["sum_sent"]["bytes"].as_f64().expect("bytes") / mss;
    let retrans = 100.0 * v["end"]["sum_sent"]["retransmits"].as_f64().unwrap_or(0.0) / sent;
    let streams: Vec<f64> = v["end"]["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .map(|s| s["receiver"]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6)
        .collect();
    eprintln!("4 x bbr -> pod: {total:.2} Mbit/s {streams:.2?}, retransmits {retrans:.2} %");
    assert_near("4 downloads -> pod", total, 10.0);
    assert!(retrans < 2.0, "4 BBR downloads lost {retrans:.2} %");
    for s in &streams {
        assert!(*s > total / 8.0, "unfair share: {streams:?}");
    }
}

/// The `an_flows` bucket of a TCP flow from `src:sport` to `dst:dport` (the programs'
/// `flow_bucket()`; addresses and ports as the programs load them from the packet).
fn flow_bucket(src: std::net::Ipv4Addr, dst: std::net::Ipv4Addr, sport: u16, dport: u16) -> u32 {
    let saddr = u32::from_ne_bytes(src.octets());
    let daddr = u32::from_ne_bytes(dst.octets());
    let (s, d) = (sport.to_be_bytes(), dport.to_be_bytes());
    let ports = u32::from_ne_bytes([s[0], s[1], d[0], d[1]]);
    let mut h = saddr ^ daddr.wrapping_mul(0x9e37_79b1) ^ ports.wrapping_mul(0x85eb_ca6b) ^ 6;
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h & (abi::FLOW_BUCKETS - 1)
}

/// A first client port from which `n` consecutive ports (iperf3 -P with --cport) put the
/// flows from the internet host to the pod's port 5990 in `n` different buckets.
fn distinct_buckets_cport(n: u16) -> u16 {
    let (src, dst) = (INTERNET.parse().unwrap(), POD_IP.parse().unwrap());
    (40_000..60_000)
        .step_by(usize::from(n))
        .find(|&p| {
            let mut seen = std::collections::HashSet::new();
            (p..p + n).all(|q| seen.insert(flow_bucket(src, dst, q, 5990)))
        })
        .expect("a port range with distinct buckets")
}
