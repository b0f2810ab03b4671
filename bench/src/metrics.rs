//! The `metrics` section: scrape latency and size of aliasnet-shaperd's `/metrics` with many
//! pods.
//!
//! Builds a private node: a network namespace this process enters, its own bpffs pin root,
//! and N real pods (a netns each, a veth pair, attached through `Datapath::attach_pod` with
//! an ingress limit and the policy's internet-egress limit, so every pod has shaping qdiscs
//! on both sides: the worst case for a scrape). Counters are then set to realistic large
//! values through the pinned per-CPU map. Measured per run, median of `--scrapes`:
//! `Exporter::render` in process (what a scrape does: read the maps, encode), the same with
//! `--aggregate namespace`, `Exporter::sample` (shaperd's 5-second background sample: maps
//! plus every pod's shaping-queue drops, one netns switch per pod), and a real HTTP GET
//! against `aliasnet-shaperd`.
//! Everything is removed on exit.
//!
//! ```text
//! cargo build --release -p aliasnet-shaper -p aliasnet-bench
//! target/release/aliasnet-bench metrics --pods 250,1000 --runs 3 --scrapes 21
//! ```

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aliasnet_ebpf::{abi, Datapath, Limits, PodAttachment, PodIdentity};
use aliasnet_netns::NetNs;
use aliasnet_shaper::{
    metrics::{Aggregation, Exporter, ExporterOptions},
    Policy,
};
use aliasnet_tests::{
    netns::{ip_batch, Netns},
    shaperd::{ShaperPaths, Shaperd},
};
use anyhow::{bail, Context, Result};
use aya::maps::{Map, MapData, PerCpuArray, PerCpuValues};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Pod counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "250,1000")]
    pods: Vec<usize>,
    /// Independent runs per pod count.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Scrapes per run and mode (the run's figure is their median).
    #[arg(long, default_value_t = 21)]
    scrapes: usize,
    /// aliasnet-shaperd binary (default: next to this binary, or in `ALIASNET_BIN_DIR`).
    #[arg(long)]
    shaperd: Option<PathBuf>,
}

/// Everything one node of the bench created; removed on drop.
struct Node {
    // Field order is drop order: the daemon, the pins (unpinning the links detaches the
    // programs; the maps go with the last reference), then the namespaces.
    shaperd: Option<Shaperd>,
    pin_root: PinRoot,
    pods: Vec<String>,
    ns: Netns,
    tag: String,
}

/// A pin root under the host's bpffs, removed on drop.
struct PinRoot(PathBuf);

impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Node {
    fn pod_ns(&self, i: usize) -> String {
        format!("{}-p{i}", self.tag)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut d) = self.shaperd.take() {
            d.kill();
        }
        let mut batch = String::new();
        for p in &self.pods {
            batch.push_str(&format!("netns del {p}\n"));
        }
        let _ = ip_batch(None, &batch);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// GET /metrics over HTTP/1.0; returns (duration, body bytes).
fn http_scrape(addr: &str) -> Result<(Duration, usize)> {
    let start = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut out = Vec::with_capacity(4 << 20);
    s.read_to_end(&mut out)?;
    let took = start.elapsed();
    let head = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no HTTP head")?;
    if !out.starts_with(b"HTTP/1.1 200") && !out.starts_with(b"HTTP/1.0 200") {
        bail!("scrape answered {}", String::from_utf8_lossy(&out[..head]));
    }
    Ok((took, out.len() - head - 4))
}

/// The node and pod namespaces, a veth pair per pod.
fn build(tag: &str, pods: usize) -> Result<Node> {
    let mut node = Node {
        shaperd: None,
        pin_root: PinRoot(PathBuf::from(format!("/sys/fs/bpf/aliasnet-{tag}"))),
        pods: Vec::new(),
        ns: Netns::new(&format!("{tag}-node"))?,
        tag: tag.to_owned(),
    };
    let mut batch = String::new();
    for i in 0..pods {
        batch.push_str(&format!("netns add {}\n", node.pod_ns(i)));
    }
    ip_batch(None, &batch)?;
    node.pods = (0..pods).map(|i| node.pod_ns(i)).collect();
    let mut batch = String::new();
    for i in 0..pods {
        batch.push_str(&format!(
            "link add mbh{i} type veth peer name eth0 netns {}\nlink set mbh{i} up\n",
            node.pod_ns(i)
        ));
    }
    ip_batch(Some(&node.ns.name), &batch)?;
    Ok(node)
}

/// In the node's netns: the datapath installed and every pod attached with an ingress limit,
/// counters set to realistic large values.
fn install(node: &Node, pods: usize) -> Result<Datapath> {
    let (mut dp, _) = Datapath::install(&node.pin_root.0)?;
    let policy =
        Policy::parse("internal_cidrs = [\"10.0.0.0/8\"]\npod_internet_egress_rate = \"100M\"\n")
            .map_err(anyhow::Error::msg)?;
    dp.apply_policy(&policy)?;
    let start = Instant::now();
    for i in 0..pods {
        dp.attach_pod(&PodAttachment {
            host_ifname: format!("mbh{i}"),
            netns: PathBuf::from(format!("/run/netns/{}", node.pod_ns(i))),
            identity: PodIdentity {
                namespace: format!("team-{:02}", i % 20),
                name: format!("trainer-{i:04}-5d8c7b9f6d-x2kq{}", i % 10),
                container_id: format!("{:064x}", i + 1),
                ifname: "eth0".into(),
                ipv4: Some(std::net::Ipv4Addr::new(
                    10,
                    250,
                    (i / 256) as u8,
                    (i % 256) as u8,
                )),
                ipv6: None,
            },
            limits: Limits {
                ingress_rate: Some(1_000_000_000),
                ..Limits::default()
            },
            pod_mac: None,
        })
        .with_context(|| format!("attach pod {i}"))?;
    }
    eprintln!(
        "  {pods} pods attached in {:.1} s",
        start.elapsed().as_secs_f64()
    );

    // Realistic counter values (a few TB, billions of packets) in every slot.
    let data = MapData::from_pin(dp.pins().map(aliasnet_ebpf::maps::COUNTERS))
        .context("open the pinned counters")?;
    let mut counters: PerCpuArray<MapData, abi::PodCounters> =
        PerCpuArray::try_from(Map::PerCpuArray(data)).context("counters map")?;
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    for rec in dp.pods()? {
        let mut c = abi::PodCounters::default();
        for (d, dir) in c.dir.iter_mut().enumerate() {
            for (k, ctr) in dir.iter_mut().enumerate() {
                let base = 1_000_000_000_007u64 * (d as u64 + 1) + k as u64 * 7_919;
                *ctr = abi::Counter {
                    packets: base / 1_300 + u64::from(rec.slot),
                    bytes: base + u64::from(rec.slot) * 104_729,
                };
            }
        }
        let v = PerCpuValues::try_from(vec![c; cpus])?;
        counters.set(rec.slot, v, 0).context("set counters")?;
    }
    Ok(dp)
}

fn time_render(exp: &mut Exporter, n: usize) -> Result<(f64, usize)> {
    let mut times = Vec::with_capacity(n);
    let mut size = 0;
    for _ in 0..n {
        let start = Instant::now();
        let text = exp.render()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
        size = text.len();
    }
    Ok((median(times), size))
}

pub fn run(args: Args) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("needs root (network namespaces, bpf)");
    }
    let shaperd = match &args.shaperd {
        Some(p) => p.clone(),
        None => aliasnet_tests::bin_dir().join("aliasnet-shaperd"),
    };
    if !shaperd.exists() {
        bail!(
            "{} not built (cargo build --release -p aliasnet-shaper --bins)",
            shaperd.display()
        );
    }
    println!("| pods | run | render ms (pod) | render ms (namespace) | background sample ms | HTTP scrape ms | body bytes (pod) | body bytes (namespace) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &pods in &args.pods {
        let mut sums: Vec<[f64; 4]> = Vec::new();
        for run in 1..=args.runs {
            // A fresh thread per run: it enters the run's node netns (with everything it
            // starts) and dies with it.
            let tag = format!("anmb{}r{run}n{pods}", std::process::id() % 100_000);
            let shaperd = shaperd.clone();
            let scrapes = args.scrapes;
            let row = std::thread::spawn(move || -> Result<([f64; 4], usize, usize)> {
                let mut node = build(&tag, pods)?;
                let home = NetNs::open(node.ns.path())?;
                home.enter(|| {
                    let _dp = install(&node, pods)?;
                    measure(&mut node, &shaperd, scrapes)
                })?
            })
            .join()
            .map_err(|_| anyhow::anyhow!("bench thread panicked"))??;
            let (t, size_pod, size_ns) = row;
            println!(
                "| {pods} | {run} | {:.2} | {:.2} | {:.2} | {:.2} | {size_pod} | {size_ns} |",
                t[0], t[1], t[2], t[3]
            );
            sums.push(t);
        }
        let col = |i: usize| median(sums.iter().map(|r| r[i]).collect());
        println!(
            "| {pods} | median | **{:.2}** | {:.2} | {:.2} | **{:.2}** | | |",
            col(0),
            col(1),
            col(2),
            col(3)
        );
    }
    Ok(())
}

/// One run's figures in the node's netns: `[render (pod), render (namespace), background
/// sample, HTTP scrape]` ms and the two body sizes.
fn measure(node: &mut Node, shaperd: &Path, scrapes: usize) -> Result<([f64; 4], usize, usize)> {
    let mut pod =
        Exporter::open(&node.pin_root.0, ExporterOptions::default()).context("open exporter")?;
    let (render_pod, size_pod) = time_render(&mut pod, scrapes)?;
    let mut times = Vec::with_capacity(scrapes);
    for _ in 0..scrapes {
        let start = Instant::now();
        pod.sample()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let sample = median(times);
    let mut ns = Exporter::open(
        &node.pin_root.0,
        ExporterOptions {
            aggregation: Aggregation::Namespace,
            ..ExporterOptions::default()
        },
    )?;
    let (render_ns, size_ns) = time_render(&mut ns, scrapes)?;

    let policy = std::env::temp_dir().join(format!("{}-shaper.toml", node.tag));
    std::fs::write(
        &policy,
        "internal_cidrs = [\"10.0.0.0/8\"]\npod_internet_egress_rate = \"100M\"\n",
    )?;
    let addr = "127.0.0.1:19546";
    let log = std::env::temp_dir().join(format!("{}-shaperd.log", node.tag));
    let paths = ShaperPaths {
        config: policy.clone(),
        pin_root: node.pin_root.0.clone(),
        log: log.clone(),
    };
    node.shaperd = Some(Shaperd::spawn(
        shaperd,
        &node.ns.path(),
        paths,
        &["--metrics-address", addr],
    )?);
    let start = Instant::now();
    while http_scrape(addr).is_err() {
        if start.elapsed() > Duration::from_secs(20) {
            bail!("aliasnet-shaperd did not serve {addr}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut times = Vec::new();
    for _ in 0..scrapes {
        let (t, _) = http_scrape(addr)?;
        times.push(t.as_secs_f64() * 1e3);
    }
    let _ = std::fs::remove_file(&policy);
    let _ = std::fs::remove_file(&log);
    Ok((
        [render_pod, render_ns, sample, median(times)],
        size_pod,
        size_ns,
    ))
}
