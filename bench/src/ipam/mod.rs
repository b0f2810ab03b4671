//! `aliasnet-bench ipam`: throughput, latency, memory and restart time of `aliasnet-ipamd`
//! over its socket, side by side with Debian's `host-local` in the same run.
//!
//! ```sh
//! cargo build --release -p aliasnet-ipam -p aliasnet-bench
//! target/release/aliasnet-bench ipam --runs 3 --out ipam-bench.md
//! ```
//!
//! Every daemon runs as a child process in a network namespace of its own (so its link
//! teardown never sees the host's interfaces), on a temp directory on the same file system as
//! `--dir`, with the reconcile off: that namespace cannot hold the 200,000 host veths the
//! leases name, and a reconcile there would find them all missing. Requests look like the plugin's: 64-hex container ids, pod namespace,
//! name and uid, and the derived host veth name. Every allocation is durable (fdatasync)
//! before its reply. Each section is repeated `--runs` times and the median is reported.
//!
//! The pool is one static CIDR, `10.64.0.0/14` unless `IPAM_BENCH_POOL` names another, of
//! either family (`fd00:240::/112` for the IPv6 "95 % of a /112" point); the occupancy points
//! are fractions of the pool's usable size as the daemon reports it.

mod client;
mod hostlocal;
mod sections;

use std::{fs, path::PathBuf};

use anyhow::{bail, Context, Result};

use self::{
    client::{fill, Daemon},
    hostlocal::host_local,
    sections::{latency, memory, throughput},
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Repetitions of every section; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The daemon binary (default: `aliasnet-ipamd` next to this binary, or in
    /// `ALIASNET_BIN_DIR`).
    #[arg(long)]
    daemon: Option<PathBuf>,
    /// Debian's host-local plugin; the comparison is skipped when it is missing.
    #[arg(long, default_value = "/usr/lib/cni/host-local")]
    host_local: PathBuf,
    /// Scratch directory (must be on a real disk: fdatasync is part of what is measured).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Seconds each throughput measurement runs.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Client counts of the throughput section.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    clients: Vec<usize>,
    /// Allocations timed per latency point.
    #[arg(long, default_value_t = 2000)]
    samples: usize,
    /// Leases for the memory / restart section.
    #[arg(long, default_value_t = 200_000)]
    leases: usize,
    /// Only these sections (comma separated): throughput, latency, memory, hostlocal.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Instead of benchmarking: leave a daemon directory with `--leases` leases in this new
    /// directory (config `ipamd.toml` inside), for profiling the start-up by hand.
    #[arg(long)]
    prepare: Option<PathBuf>,
}

const POOL: &str = "10.64.0.0/14";

/// The pool's CIDR: `IPAM_BENCH_POOL`, or [`POOL`].
fn pool() -> String {
    std::env::var("IPAM_BENCH_POOL").unwrap_or_else(|_| POOL.into())
}
const NETWORK: &str = "aliasnet";

pub fn run(args: Args) -> Result<()> {
    let daemon = match &args.daemon {
        Some(p) => p.clone(),
        None => aliasnet_tests::bin_dir().join("aliasnet-ipamd"),
    };
    if !daemon.exists() {
        bail!(
            "{} not found (build it, or pass --daemon)",
            daemon.display()
        );
    }
    if let Some(dir) = &args.prepare {
        let mut d = Daemon::new(&args, &daemon)?;
        d.start()?;
        let rate = fill(&d.socket(), 1, 0, args.leases as u64, 64)?;
        d.stop()?;
        std::fs::rename(d.dir.path(), dir)
            .with_context(|| format!("moving the daemon directory to {}", dir.display()))?;
        let cfg = dir.join("ipamd.toml");
        let text = fs::read_to_string(&cfg)?.replace(
            &d.dir.path().display().to_string(),
            &dir.display().to_string(),
        );
        fs::write(&cfg, text)?;
        eprintln!("{} leases ({rate:.0}/s) in {}", args.leases, dir.display());
        return Ok(());
    }
    let want = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    let mut report = String::new();
    let load = |r: &mut String| {
        let l = fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let l: Vec<&str> = l.split_whitespace().take(3).collect();
        r.push_str(&format!("load average {}\n", l.join(" ")));
    };
    report.push_str(&format!(
        "# aliasnet-ipamd benchmark\n\n{} CPUs, runs = {}, scratch {}\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        args.runs,
        args.dir.display()
    ));
    load(&mut report);
    eprint!("{report}");

    let mut out = |s: String| {
        eprint!("{s}");
        report.push_str(&s);
    };
    if want("throughput") {
        out(throughput(&args, &daemon)?);
    }
    if want("latency") {
        out(latency(&args, &daemon)?);
    }
    if want("memory") {
        out(memory(&args, &daemon)?);
    }
    if want("hostlocal") {
        out(host_local(&args, &daemon)?);
    }
    let mut tail = String::new();
    load(&mut tail);
    out(tail);
    print!("{report}");
    if let Some(p) = &args.out {
        fs::write(p, &report).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
