//! The shaping benchmarks, side by side in one run on one netns topology (`aliasnet bench
//! shaping`).
//!
//! Builds the fabric's single-node topology (node, pod, "internet", internal peer; see
//! `aliasnet_tests::single`) and a private bpffs, installs the datapath from the pinned-object
//! API, and removes everything on exit; the root network namespace is never changed.
//! Sections (`--sections`), one module each:
//!
//! - `shaping` ([`goodput`]): iperf3 TCP (`--secs`, one stream) at each rate, both
//!   directions, with a ping from the pod through the shaped class, interleaved per
//!   repetition, for: aliasnet's per-pod total limits (`Limits { ingress_rate, egress_rate }`);
//!   the same with flow isolation off (every packet to the bulk leaf, as before the sparse
//!   leaves); aliasnet's internet-only egress limit (`internet_egress_rate`); the node
//!   policy's per-pod download limit (`[internet] pod_ingress_rate`); and the
//!   reference CNI `bandwidth` plugin binary, invoked with a prevResult naming the host veth
//!   (tbf on the host veth, ifb + tbf for egress). Congestion control: the namespaces'
//!   default (bbr), cubic, cubic and bbr with ECN (`net.ipv4.tcp_ecn = 1` in the test
//!   namespaces). With `--internal-download`, a download from the internal peer into the pod
//!   at `--pace` runs beside every download from the internet.
//! - `parallel` ([`goodput`]): `--streams` parallel downloads into the pod.
//! - `internal` ([`throughput`]): pod -> internal peer throughput with nothing attached, with
//!   aliasnet attached and no limits, and with a 10 Mbit/s internet-egress limit.
//! - `overhead` ([`throughput`]): pod -> internet throughput with nothing, with aliasnet's
//!   programs (classification + counting, no limits), and with OpenAI's four iptables mangle
//!   rules in the node namespace.
//! - `aggregates`, `classes` ([`aggregate`]): 4 pods under a namespace's and under the node's
//!   download limit, beside a download that must not be slowed; a pod downloading from a
//!   named class and the rest of the internet at once; next to the reference's static
//!   per-pod share.
//! - `cost` ([`cost`]): ns per packet through `BPF_PROG_TEST_RUN` of `an_host_ingress`
//!   (classification and counting) and of the download path (`an_host_egress` with a pod's
//!   and a namespace's download limits, `an_uplink_in` with the node's), by prefixes
//!   (10-65,536) and named classes (none or 32), against a no-op program.
//!
//! The machine is shared: run it niced up so that other work disturbs it less.
//!
//! ```text
//! cargo build --release -p aliasnet-bench
//! sudo nice -n -10 target/release/aliasnet-bench shaping --reps 3 --secs 10 \
//!     --cc default,cubic,cubic-ecn --throughput-reps 7 --out shaping-bench.md
//! ```

mod aggregate;
mod cost;
mod goodput;
mod node;
mod throughput;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use aliasnet_ebpf::{limits::parse_quantity, Limits};
use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;

use self::node::{run_ok, Bench, INTERNAL, INTERNET};

const BANDWIDTH_PLUGIN: &str = "/usr/lib/cni/bandwidth";

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn check_stop() -> Result<()> {
    if STOP.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn fmt_rate(r: u64) -> String {
    aliasnet_ebpf::limits::fmt_rate(r)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Section {
    Shaping,
    /// `--streams` parallel downloads (iperf3 -P) into the pod at the first rate, bbr, for
    /// aliasnet and the reference: retransmits and fairness with several connections.
    Parallel,
    /// Downloads of 4 pods under a namespace's and under the node's download limit (the
    /// first rate), beside a download that must not be slowed.
    Aggregates,
    /// A pod downloading from a named class (at a quarter of the rate) and the rest of the
    /// internet at once, under its internet download limit.
    Classes,
    Internal,
    Overhead,
    Cost,
    /// Exploration: attach the pod with the first rate as its internet-egress and ingress
    /// limit and wait for SIGINT (inspect the namespaces meanwhile).
    Hold,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Config {
    /// aliasnet, per-pod total limits (ingress_rate + egress_rate), ECN marking on.
    Aliasnet,
    /// The same with the queue model off (an_config.flags: no CE marks, no pod-side drops).
    AliasnetAqmOff,
    /// The same with flow isolation off (an_config.flags: every packet to the bulk leaf),
    /// for before/after in one run: the previous design (one leaf per class).
    AliasnetFlowsOff,
    /// The same with receive-window clamping off (an_config.flags).
    AliasnetClampOff,
    /// aliasnet, internet-egress limit only (internet_egress_rate), egress only.
    AliasnetInternet,
    /// aliasnet, the node policy's per-pod download limit (`[internet] pod_ingress_rate`):
    /// internet -> pod only, internal traffic unshaped.
    AliasnetDownload,
    /// The reference CNI bandwidth plugin binary.
    Bandwidth,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Aliasnet => "aliasnet",
            Config::AliasnetAqmOff => "aliasnet, AQM off",
            Config::AliasnetFlowsOff => "aliasnet, flow isolation off",
            Config::AliasnetClampOff => "aliasnet, window clamp off",
            Config::AliasnetInternet => "aliasnet internet-only",
            Config::AliasnetDownload => "aliasnet download limit (policy)",
            Config::Bandwidth => "bandwidth plugin (tbf)",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Dir {
    /// pod -> internet (sender in the pod)
    Egress,
    /// internet -> pod (sender in the internet namespace)
    Ingress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Cc {
    /// The namespaces' default congestion control, tcp_ecn = 2 (the kernel default).
    Default,
    /// cubic, tcp_ecn = 2.
    Cubic,
    /// cubic, tcp_ecn = 1 (ECN requested by the connecting side).
    CubicEcn,
    /// bbr, tcp_ecn = 1.
    BbrEcn,
}

impl Cc {
    fn iperf_cc(self) -> Option<&'static str> {
        match self {
            Cc::Default => None,
            Cc::Cubic | Cc::CubicEcn => Some("cubic"),
            Cc::BbrEcn => Some("bbr"),
        }
    }

    fn ecn(self) -> bool {
        matches!(self, Cc::CubicEcn | Cc::BbrEcn)
    }

    /// As the tables name it; `cc` is what the default turned out to be.
    fn label(self, cc: &str) -> String {
        match self {
            Cc::Default => format!("default ({cc})"),
            Cc::Cubic => "cubic".to_owned(),
            Cc::CubicEcn => "cubic + ECN".to_owned(),
            Cc::BbrEcn => "bbr + ECN".to_owned(),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "shaping,internal,overhead,cost"
    )]
    sections: Vec<Section>,
    /// Repetitions of every shaping and throughput measurement (medians are reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// iperf3 duration, seconds.
    #[arg(long, default_value_t = 10)]
    secs: u32,
    #[arg(long, value_delimiter = ',', default_value = "10M,100M,1G")]
    rates: Vec<String>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "default,cubic-ecn"
    )]
    cc: Vec<Cc>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "aliasnet,aliasnet-flows-off,aliasnet-internet,bandwidth"
    )]
    configs: Vec<Config>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "egress,ingress"
    )]
    dirs: Vec<Dir>,
    /// Parallel stream counts of the `parallel` section.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    streams: Vec<u32>,
    /// `shaping`: beside every download from the internet, a download from the internal
    /// peer into the pod at `--pace`, compared with the same download with nothing attached.
    #[arg(long)]
    internal_download: bool,
    /// The pace (iperf3 -b) of the downloads that must not be slowed: the internal download
    /// of `shaping` and of the node level of `aggregates`, the other namespace's download of
    /// its namespace level.
    #[arg(long, default_value = "2G")]
    pace: String,
    /// Repetitions of the `internal` and `overhead` throughput runs.
    #[arg(long, default_value_t = 5)]
    throughput_reps: usize,
    /// `cost`: prefixes in each family's trie.
    #[arg(long, value_delimiter = ',', default_value = "10,1000,10000,65536")]
    cost_prefixes: Vec<usize>,
    /// `cost`: named classes the prefixes are spread over (0: all internal, as before
    /// destination classes).
    #[arg(long, value_delimiter = ',', default_value = "0,32")]
    cost_classes: Vec<usize>,
    /// Exploration: `ns:tc args` run after every aliasnet attach, e.g.
    /// `node:qdisc replace dev vh1 parent 1:3 handle 4: pfifo limit 8`.
    #[arg(long)]
    tweak: Vec<String>,
    /// Exploration: `role:k=v` sysctls set at start (role: pod, inet, peer, node).
    #[arg(long)]
    sysctl: Vec<String>,
    /// MTU of every link of the topology (pod veth, uplink, internal peer): 1500 or a jumbo
    /// MTU such as 9000.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// GRO on the node's veths.
    #[arg(long)]
    gro: bool,
    /// Write the markdown report here too.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Append every raw sample as a JSON line here.
    #[arg(long)]
    raw: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the shaping bench creates network namespaces and loads BPF programs: run it as root"
        );
    }
    for tool in ["iperf3", "ping", "tc", "iptables"] {
        run_ok(Command::new("sh").args(["-c", &format!("command -v {tool}")]))
            .with_context(|| format!("{tool} is not installed"))?;
    }
    if args.sections.contains(&Section::Shaping)
        && args.configs.contains(&Config::Bandwidth)
        && !Path::new(BANDWIDTH_PLUGIN).exists()
    {
        bail!("{BANDWIDTH_PLUGIN} is missing (apt-get install containernetworking-plugins)");
    }
    let rates: Vec<u64> = args
        .rates
        .iter()
        .map(|r| parse_quantity(r).map_err(|e| anyhow!("--rates {r}: {e}")))
        .collect::<Result<_>>()?;
    for sig in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
    ] {
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::Handler(on_signal))?;
        }
    }
    let raw = args
        .raw
        .as_ref()
        .map(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
        })
        .transpose()?;

    let mut b = Bench::new(raw, args.tweak.clone(), args.mtu, args.gro)?;
    for s in &args.sysctl {
        let (role, kv) = s
            .split_once(':')
            .ok_or_else(|| anyhow!("--sysctl {s:?}: expected role:k=v"))?;
        b.sysctl(role, kv)?;
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut report = format!(
        "## Shaping benchmark (shape-bench)\n\nKernel {}, {} CPUs, default congestion control in the test namespaces: {}; {}.\n",
        kernel.trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        b.sysctl_get("pod", "net.ipv4.tcp_congestion_control")?,
        String::from_utf8_lossy(&run_ok(Command::new("date").arg("-u"))?.stdout).trim()
    );
    let result = b.in_node(|b| -> Result<()> {
        for s in &args.sections {
            match s {
                Section::Shaping => goodput::shaping(b, &args, &rates, &mut report)?,
                Section::Parallel => goodput::parallel(b, &args, rates[0], &mut report)?,
                Section::Aggregates => aggregate::aggregates(b, &args, &rates, &mut report)?,
                Section::Classes => aggregate::classes(b, &args, &rates, &mut report)?,
                Section::Internal => throughput::section(
                    b,
                    &args,
                    "Internal traffic of a pod with an internet limit (pod → internal peer)",
                    INTERNAL,
                    "peer",
                    &[
                        "nothing",
                        "aliasnet, no limits",
                        "aliasnet, internet egress 10 Mbit/s",
                    ],
                    &mut report,
                )?,
                Section::Overhead => throughput::section(
                    b,
                    &args,
                    "Classification overhead (pod → internet, unshaped)",
                    INTERNET,
                    "inet",
                    &[
                        "nothing",
                        "aliasnet, no limits",
                        "iptables mangle (4 rules)",
                    ],
                    &mut report,
                )?,
                Section::Cost => cost::cost(&args.cost_prefixes, &args.cost_classes, &mut report)?,
                Section::Hold => {
                    let a = b.attach(Limits {
                        ingress_rate: Some(rates[0]),
                        internet_egress_rate: Some(rates[0]),
                        ..Limits::default()
                    })?;
                    eprintln!(
                        "holding {} (slot {}); SIGINT to clean up",
                        b.net.prefix, a.slot
                    );
                    while !STOP.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            }
        }
        Ok(())
    });
    println!("{report}");
    if let Some(out) = &args.out {
        std::fs::write(out, &report).with_context(|| format!("write {}", out.display()))?;
    }
    result
}
