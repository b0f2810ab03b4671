//! The demo: a simulated VNet with two nodes, pods added through the real `aliasnet` binary,
//! traffic between pods across nodes and to an "internet" host, then a clean teardown.

use std::time::Instant;

use aliasnet_tests::{
    fabric::{Fabric, FabricOpts, Node, Pod, INTERNET_IP, INTERNET_IP2},
    netns::Netns,
    test_mtu,
};
use anyhow::{bail, Result};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "aliasnet demo: two nodes, four pods, cross-node and internet traffic")]
struct Args {
    /// Leave the namespaces and daemons up and wait for Enter before tearing down.
    #[arg(long)]
    hold: bool,
}

fn show(ns: &Netns, args: &[&str]) -> String {
    ns.ip(args)
        .map(|o| String::from_utf8_lossy(&o.stdout).trim_end().to_owned())
        .unwrap_or_else(|e| format!("({e})"))
}

fn print_pod(node: &Node, p: &Pod) {
    println!(
        "  pod {:<6} on node{}  ip {:<12} netns {}",
        p.name, node.index, p.ip, p.ns.name
    );
    for line in show(&p.ns, &["-4", "-br", "addr", "show", "eth0"]).lines() {
        println!("      addr   {line}");
    }
    for line in show(&p.ns, &["route"]).lines() {
        println!("      route  {line}");
    }
    for line in show(&p.ns, &["neigh"]).lines() {
        println!("      neigh  {line}");
    }
}

/// A pod whose internet egress is limited through the pod-annotations capability.
fn shaped_pod(node: &Node, name: &str, rate: &str) -> Result<Pod> {
    let ns = Netns::new(&format!("{}-{name}", node.ns.name))?;
    let cid = format!("demo-{name}");
    let mut conf = node.plugin_config(None, None);
    conf["capabilities"] = serde_json::json!({"io.kubernetes.cri.pod-annotations": true});
    conf["runtimeConfig"] = serde_json::json!({
        "io.kubernetes.cri.pod-annotations": {"aliasnet.io/internet-egress-bandwidth": rate}
    });
    let inv = aliasnet_tests::cni::Invocation::new("ADD", &cid, Some(&ns.path()), "eth0")
        .args(&Node::k8s_args(name, &cid));
    let result = node
        .cni(&inv, &conf)
        .expect_ok("ADD shaped pod")
        .ok_or_else(|| anyhow::anyhow!("ADD printed nothing"))?;
    Pod::from_result(ns, name, cid, result)
}

/// iperf3 TCP for 3 s from `ns` to `dst`; received bits per second.
fn iperf(ns: &Netns, dst: std::net::Ipv4Addr) -> Result<f64> {
    let out = ns.exec(
        "iperf3",
        &["-c", &dst.to_string(), "-p", "5201", "-t", "3", "-J"],
    )?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("no iperf3 result"))
}

fn main() -> Result<()> {
    let args = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        bail!("the demo needs root (it creates network namespaces)");
    }
    println!("== building the fabric: vnet router, node1 (10.240.1.0/24), node2 (10.240.2.0/24), internet (203.0.113.10, 198.51.100.10)");
    let fabric = Fabric::new(FabricOpts {
        cooldown: "130s".into(),
        plugin_extra: serde_json::json!({"logLevel": "info"}),
        ..Default::default()
    })?;
    let (n1, n2) = (fabric.node(1), fabric.node(2));

    println!("== ADD: four pods through /opt/cni/bin-style exec of the aliasnet binary");
    let mut pods = Vec::new();
    for (node, name) in [(n1, "web"), (n1, "mpi-0"), (n2, "mpi-1"), (n2, "fetch")] {
        let t = Instant::now();
        let p = node.add_pod(name)?;
        println!(
            "  ADD {name:<6} on node{} -> {} in {:.1} ms",
            node.index,
            p.ip,
            t.elapsed().as_secs_f64() * 1e3
        );
        pods.push((node, p));
    }
    println!("== pods (addresses, routes, neighbour entries)");
    for (node, p) in &pods {
        print_pod(node, p);
    }
    for node in [n1, n2] {
        println!("  node{} host routes to pods:", node.index);
        for line in show(&node.ns, &["route"])
            .lines()
            .filter(|l| l.contains("ali"))
        {
            println!("      {line}");
        }
    }

    println!("== traffic");
    let p = |i: usize| &pods[i].1;
    let mut failed = 0;
    let mut check = |what: &str, ok: bool| {
        println!("  {} {what}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            failed += 1;
        }
    };
    check(
        &format!("web -> mpi-0 (same node)   {} -> {}", p(0).ip, p(1).ip),
        p(0).ping(p(1).ip, &[]),
    );
    check(
        &format!("mpi-0 -> mpi-1 (cross node) {} -> {}", p(1).ip, p(2).ip),
        p(1).ping(p(2).ip, &[]),
    );
    let full = (test_mtu() - 28).to_string();
    check(
        &format!(
            "mpi-0 -> mpi-1 {}-byte packet, DF set (no encapsulation overhead)",
            test_mtu()
        ),
        p(1).ping(p(2).ip, &["-M", "do", "-s", &full]),
    );
    check(
        &format!("fetch -> internet {INTERNET_IP}"),
        p(3).ping(INTERNET_IP, &[]),
    );
    check(
        &format!("web -> internet {INTERNET_IP2}"),
        p(0).ping(INTERNET_IP2, &[]),
    );

    println!("== shaping: pod 'download' on node2 with aliasnet.io/internet-egress-bandwidth=10M");
    let dl = shaped_pod(n2, "download", "10M")?;
    let mut srv_inet = fabric
        .internet
        .command("iperf3")
        .args(["-s", "-p", "5201"])
        .spawn()?;
    let mut srv_peer = p(2)
        .ns
        .command("iperf3")
        .args(["-s", "-p", "5201"])
        .spawn()?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    let to_inet = iperf(&dl.ns, INTERNET_IP)?;
    let to_peer = iperf(&dl.ns, p(2).ip)?;
    println!(
        "  download -> internet {INTERNET_IP}: {:>8.1} Mbit/s (limited to 10M)",
        to_inet / 1e6
    );
    println!(
        "  download -> mpi-1 {} (internal): {:>8.1} Mbit/s (unshaped)",
        p(2).ip,
        to_peer / 1e6
    );
    check(
        "internet egress held near 10 Mbit/s",
        to_inet < 11e6 && to_inet > 8e6,
    );
    check(
        "internal traffic not shaped (>= 10x the internet limit)",
        to_peer > 100e6,
    );

    println!("== metrics and CLI on node2");
    let ctl = n2
        .ns
        .command(aliasnet_tests::bin("aliasnetctl"))
        .arg("--socket")
        .arg(&n2.ipamd_paths.socket)
        .arg("--pin-root")
        .arg(&n2.shaper_paths.pin_root)
        .arg("pods")
        .output()?;
    for line in String::from_utf8_lossy(&ctl.stdout).lines() {
        println!("  {line}");
    }
    let scrape = n2
        .ns
        .command("curl")
        .args(["-sf", "http://127.0.0.1:9546/metrics"])
        .output()?;
    let text = String::from_utf8_lossy(&scrape.stdout);
    for line in text
        .lines()
        .filter(|l| l.starts_with("aliasnet_node_bytes_total"))
    {
        println!("  {line}");
    }
    check(
        "shaperd /metrics answers",
        scrape.status.success() && text.contains("aliasnet_pod_bytes_total"),
    );
    for srv in [&mut srv_inet, &mut srv_peer] {
        let _ = srv.kill();
        let _ = srv.wait();
    }
    n2.del_pod(&dl).expect_ok("DEL download");

    println!("== IPAM leases");
    for node in [n1, n2] {
        for l in node.ipamd().leases() {
            println!(
                "  node{} {} -> {}/{} ({})",
                node.index,
                l.address,
                l.pod.namespace.as_deref().unwrap_or("-"),
                l.pod.name.as_deref().unwrap_or("-"),
                l.host_veth.as_deref().unwrap_or("-")
            );
        }
    }

    if args.hold {
        println!(
            "== holding; namespaces: {} {} {}. Press Enter to tear down.",
            n1.ns.name, n2.ns.name, fabric.vnet.name
        );
        let mut s = String::new();
        std::io::stdin().read_line(&mut s)?;
    }

    println!("== DEL");
    for (node, p) in &pods {
        let t = Instant::now();
        node.del_pod(p).expect_ok("DEL");
        println!(
            "  DEL {:<6} in {:.1} ms",
            p.name,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    n1.assert_clean();
    n2.assert_clean();
    println!("  nodes clean: no veth, no route, no lease left");
    if failed > 0 {
        bail!("{failed} traffic checks failed");
    }
    println!("== demo done");
    Ok(())
}
