//! Cost of attaching and detaching pods through the library, and of one TCX link for
//! comparison (why per-pod hooks are cls_bpf filters: see `aliasnet_netlink::clsact`).
//!
//! Builds a private node: a network namespace this process enters, a private bpffs, and N
//! veth pairs with the peers in pod namespaces. Measures, per pod: `attach_pod` without limits
//! (host veth filters only) and with an ingress plus an internet-egress limit (HTB on both
//! sides, pod netns entered), `detach_pod_with(MapsOnly)` (CNI DEL) and `detach_pod` (full),
//! then a TCX attach and release of the same program on the same veths. Everything is removed
//! on exit.
//!
//! ```text
//! cargo build --release -p aliasnet-bench
//! target/release/aliasnet-bench attach-cost --pods 100
//! ```

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use aliasnet_ebpf::{Datapath, Limits, PodAttachment, PodIdentity, Teardown};
use aliasnet_netns::NetNs;
use aliasnet_tests::{
    bpffs::Bpffs,
    netns::{ip, ip_batch, Netns},
};
use anyhow::{bail, Context, Result};
use aya::programs::{tc::TcAttachOptions, LinkOrder, SchedClassifier, TcAttachType};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Pods (veth pairs) to attach.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// TCX attach/release samples (each ~10 ms of RTNL held: keep it small).
    #[arg(long, default_value_t = 20)]
    tcx: usize,
}

/// Namespaces and the private bpffs; removed on drop.
struct Node {
    tag: String,
    pods: Vec<String>,
    ns: Netns,
    bpffs: Bpffs,
}

impl Node {
    fn pod_ns(&self, i: usize) -> String {
        format!("{}-p{i}", self.tag)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let mut batch = String::new();
        for p in &self.pods {
            batch.push_str(&format!("netns del {p}\n"));
        }
        let _ = ip_batch(None, &batch);
    }
}

fn build(pods: usize) -> Result<Node> {
    let tag = format!("atc{}", std::process::id() % 100_000);
    let mut node = Node {
        ns: Netns::new(&format!("{tag}-node"))?,
        bpffs: Bpffs::mount("aliasnet-attach-cost-")?,
        pods: Vec::new(),
        tag,
    };
    let mut batch = String::new();
    for i in 0..pods {
        batch.push_str(&format!("netns add {}\n", node.pod_ns(i)));
    }
    ip_batch(None, &batch)?;
    node.pods = (0..pods).map(|i| node.pod_ns(i)).collect();
    let mut links = String::new();
    for i in 0..pods {
        links.push_str(&format!(
            "link add ac{i} type veth peer name eth0 netns {}\nlink set ac{i} up\n",
            node.pod_ns(i)
        ));
    }
    ip_batch(Some(&node.ns.name), &links)?;
    for i in 0..pods {
        ip(&["-n", &node.pod_ns(i), "link", "set", "eth0", "up"])?;
    }
    Ok(node)
}

fn attachment(node: &Node, i: usize, limits: Limits) -> PodAttachment {
    PodAttachment {
        host_ifname: format!("ac{i}"),
        netns: PathBuf::from(format!("/run/netns/{}", node.pod_ns(i))),
        identity: PodIdentity {
            namespace: "bench".into(),
            name: format!("pod-{i}"),
            container_id: format!("{i:064x}"),
            ifname: "eth0".into(),
            ipv4: Some(std::net::Ipv4Addr::new(
                10,
                20,
                (i / 250) as u8,
                (i % 250 + 1) as u8,
            )),
            ipv6: None,
        },
        limits,
        pod_mac: None,
    }
}

fn report(what: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| ms(v[((v.len() - 1) as f64 * q).round() as usize]);
    println!(
        "| {what} | {} | {:.3} | {:.3} | {:.3} |",
        v.len(),
        at(0.5),
        at(0.9),
        ms(*v.last().expect("samples"))
    );
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(Duration, T)> {
    let t = Instant::now();
    let r = f()?;
    Ok((t.elapsed(), r))
}

pub fn run(args: Args) -> Result<()> {
    if args.pods == 0 || args.pods > 1000 {
        bail!("--pods must be 1..=1000");
    }
    let node = build(args.pods)?;
    NetNs::open(node.ns.path())
        .context("open the node netns")?
        .enter(|| measure(&node, &args))?
}

/// In the node's netns: the rows of the report, printed.
fn measure(node: &Node, args: &Args) -> Result<()> {
    let (mut dp, _) = Datapath::install(node.bpffs.pin_root())?;

    let limited = Limits {
        ingress_rate: Some(100_000_000),
        internet_egress_rate: Some(10_000_000),
        ..Limits::default()
    };
    let mut rows: Vec<(&str, Vec<Duration>)> = Vec::new();
    for (name, limits, how, del) in [
        (
            "no limits",
            Limits::default(),
            Teardown::MapsOnly,
            "detach MapsOnly (CNI DEL)",
        ),
        (
            "ingress + internet limits",
            limited,
            Teardown::Full,
            "detach Full (veth stays)",
        ),
    ] {
        let mut add = Vec::new();
        let mut rem = Vec::new();
        for i in 0..args.pods {
            let att = attachment(node, i, limits);
            add.push(timed(|| Ok(dp.attach_pod(&att)?))?.0);
        }
        for i in 0..args.pods {
            let cid = format!("{i:064x}");
            let (d, found) = timed(|| Ok(dp.detach_pod_with(&cid, "eth0", how)?))?;
            if !found {
                bail!("pod {i} not found on detach");
            }
            rem.push(d);
        }
        rows.push((name, add));
        rows.push((del, rem));
    }

    // The same program as a TCX link on the same veths: attach, then release.
    let mut tcx_add = Vec::new();
    let mut tcx_del = Vec::new();
    let mut prog = SchedClassifier::from_pin(dp.pins().prog("an_host_ingress"))?;
    for i in 0..args.tcx.min(args.pods) {
        let dev = format!("ac{i}");
        let (d, id) = timed(|| {
            Ok(prog.attach_with_options(
                &dev,
                TcAttachType::Ingress,
                TcAttachOptions::TcxOrder(LinkOrder::first()),
            )?)
        })?;
        tcx_add.push(d);
        tcx_del.push(timed(|| Ok(prog.detach(id)?))?.0);
    }
    if !tcx_add.is_empty() {
        rows.push(("TCX link attach (one hook)", tcx_add));
        rows.push(("TCX link release (one hook)", tcx_del));
    }

    println!("| operation | n | p50 ms | p90 ms | max ms |");
    println!("|---|---|---|---|---|");
    for (what, v) in rows {
        report(what, v);
    }
    drop(dp);
    Ok(())
}
