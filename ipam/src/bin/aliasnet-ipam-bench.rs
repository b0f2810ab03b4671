//! `aliasnet-ipam-bench`: throughput, latency, memory and restart time of `aliasnet-ipamd`
//! over its socket, side by side with Debian's `host-local` in the same run.
//!
//! ```sh
//! cargo build --release -p aliasnet-ipam
//! target/release/aliasnet-ipam-bench --runs 3 --out ipam-bench.md
//! ```
//!
//! Every daemon runs as a child process in a network namespace of its own (so its link
//! teardown never sees the host's interfaces), on a temp directory on the same file system as
//! `--dir`, with the reconcile off: that namespace cannot hold the 200,000 host veths the
//! leases name, and a reconcile there would find them all missing. Requests look like the plugin's: 64-hex container ids, pod namespace,
//! name and uid, and the derived host veth name. Every allocation is durable (fdatasync)
//! before its reply. Each section is repeated `--runs` times and the median is reported.

use std::{
    fs,
    io::Write as _,
    os::unix::{fs::MetadataExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{
    frame, host_veth_name, AttachmentKey, Client, ClientError, PodRef, Request, Response,
};
use anyhow::{bail, Context, Result};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "aliasnet-ipamd benchmarks (throughput, latency, RSS, restart) vs host-local")]
struct Args {
    /// Repetitions of every section; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The daemon binary (default: `aliasnet-ipamd` next to this binary).
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
const POOL_SIZE: usize = 1 << 18;
const NETWORK: &str = "aliasnet";

fn main() -> Result<()> {
    let args = Args::parse();
    let daemon = match &args.daemon {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("binary directory")?
            .join("aliasnet-ipamd"),
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

/// A daemon child process with its own temp directory.
struct Daemon {
    bin: PathBuf,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Daemon {
    fn new(args: &Args, bin: &Path) -> Result<Self> {
        fs::create_dir_all(&args.dir)?;
        let dir = tempfile::Builder::new()
            .prefix("ipam-bench")
            .tempdir_in(&args.dir)?;
        let d = dir.path().display();
        // The daemon's own log (its start-up timings) with IPAM_BENCH_LOG=info.
        let level = std::env::var("IPAM_BENCH_LOG").unwrap_or_else(|_| "warn".into());
        fs::write(
            dir.path().join("ipamd.toml"),
            format!(
                "socket = \"{d}/ipamd.sock\"\nstate_dir = \"{d}/state\"\nspool_dir = \"{d}/spool\"\n\
                 cooldown = \"130s\"\nlog_level = \"{level}\"\nmetrics_address = \"\"\nreconcile_interval = \"0s\"\n\
                 [[pool]]\nname = \"secondary\"\nsource = \"static\"\ncidrs = [\"{POOL}\"]\n"
            ),
        )?;
        Ok(Self {
            bin: bin.to_path_buf(),
            dir,
            child: None,
        })
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("ipamd.sock")
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Start and wait until a request is answered; returns the time from spawn to serving.
    fn start(&mut self) -> Result<Duration> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--config")
            .arg(self.dir.path().join("ipamd.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: unshare is async-signal-safe and only affects the child.
        unsafe {
            cmd.pre_exec(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
            });
        }
        let t0 = Instant::now();
        let mut child = cmd.spawn().context("spawning aliasnet-ipamd")?;
        let socket = self.socket();
        loop {
            if let Ok(mut c) = Client::connect(&socket, Duration::from_secs(5)) {
                if c.call(&Request::Stats).is_ok() {
                    break;
                }
            }
            if let Some(st) = child.try_wait()? {
                bail!("aliasnet-ipamd exited during start: {st}");
            }
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("aliasnet-ipamd not serving after 60 s");
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        let took = t0.elapsed();
        self.child = Some(child);
        Ok(took)
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )?;
            let st = c.wait()?;
            if !st.success() {
                bail!("aliasnet-ipamd exited with {st}");
            }
        }
        Ok(())
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A plugin-like Allocate for pod number `i` of series `series`.
fn alloc_req(series: u64, i: u64) -> Request {
    let seed = splitmix(series << 40 ^ i);
    let cid: String = (0..4)
        .map(|k| format!("{:016x}", splitmix(seed + k)))
        .collect();
    let key = AttachmentKey::new(NETWORK, &cid, "eth0");
    let u = splitmix(seed ^ 0xdead_beef);
    let v = splitmix(u);
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        u >> 32,
        (u >> 16) & 0xffff,
        u & 0xfff,
        v >> 52,
        v & 0xffff_ffff_ffff
    );
    let host_veth = host_veth_name("ali", &key);
    Request::Allocate {
        pod: PodRef {
            namespace: Some(format!("team-{}", i % 40)),
            name: Some(format!("trainer-{series}-{i}-worker-{}", seed % 1000)),
            uid: Some(uid),
        },
        key,
        pool: None,
        host_veth: Some(host_veth),
    }
}

fn release_req(alloc: &Request) -> Request {
    let Request::Allocate { key, .. } = alloc else {
        unreachable!()
    };
    Request::Release {
        key: key.clone(),
        teardown_link: None,
    }
}

fn call(c: &mut Client, req: &Request) -> Result<Response, ClientError> {
    let r = c.call(req)?;
    Ok(r)
}

fn expect_allocated(r: Result<Response, ClientError>) -> Result<()> {
    match r {
        Ok(Response::Allocated { .. }) => Ok(()),
        other => bail!("allocate failed: {other:?}"),
    }
}

/// A protocol connection driven asynchronously: the bench runs its concurrent clients as
/// tasks on one thread, so 64 clients do not take the CPU from the daemon they measure (64
/// client threads on a 2-core machine spend it on context switches).
struct AsyncConn {
    s: tokio::net::UnixStream,
    buf: Vec<u8>,
}

impl AsyncConn {
    async fn connect(path: &Path) -> Result<Self> {
        Ok(Self {
            s: tokio::net::UnixStream::connect(path).await?,
            buf: Vec::with_capacity(4096),
        })
    }

    async fn call(&mut self, req: &Request) -> Result<Response> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.s.write_all(&frame::encode(req)).await?;
        let mut h = [0u8; 4];
        self.s.read_exact(&mut h).await?;
        self.buf.resize(frame::parse_len(h)?, 0);
        self.s.read_exact(&mut self.buf).await?;
        Ok(frame::decode(&self.buf)?)
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `clients` concurrent connections allocate keys `series`/[from, to) (each once) as fast as
/// they can; returns allocations per second.
fn fill(socket: &Path, series: u64, from: u64, to: u64, clients: usize) -> Result<f64> {
    let next = std::cell::Cell::new(from);
    let t0 = Instant::now();
    runtime()?.block_on(futures::future::try_join_all((0..clients).map(|_| async {
        let mut c = AsyncConn::connect(socket).await?;
        loop {
            let i = next.get();
            if i >= to {
                return Ok::<_, anyhow::Error>(());
            }
            next.set(i + 1);
            match c.call(&alloc_req(series, i)).await? {
                Response::Allocated { .. } => {}
                other => bail!("allocate failed: {other:?}"),
            }
        }
    })))?;
    Ok((to - from) as f64 / t0.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn throughput(args: &Args, bin: &Path) -> Result<String> {
    let mut s = String::from(
        "\n## Allocate+release throughput over the socket (durable)\n\n\
         Each client: one connection, loop { Allocate new key; Release it }; the clients are \
         async tasks on one bench thread. Empty /14 pool, cooldown 130 s. allocations/s = Allocates acknowledged per second (each followed by a \
         durable Release, so the daemon does twice as many durable writes).\n\n\
         | clients | allocations/s (median) | runs |\n|---|---|---|\n",
    );
    for &clients in &args.clients {
        let mut per_run = Vec::new();
        for run in 0..args.runs {
            let mut d = Daemon::new(args, bin)?;
            d.start()?;
            let socket = d.socket();
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicU64::new(0));
            let driver = {
                let (stop, done) = (stop.clone(), done.clone());
                std::thread::spawn(move || -> Result<()> {
                    runtime()?.block_on(futures::future::try_join_all((0..clients).map(|t| {
                        let (socket, stop, done) = (&socket, &stop, &done);
                        async move {
                            let mut c = AsyncConn::connect(socket).await?;
                            let mut i = 0u64;
                            while !stop.load(Ordering::Relaxed) {
                                let req = alloc_req(run as u64 * 1000 + t as u64, i);
                                match c.call(&req).await? {
                                    Response::Allocated { .. } => {}
                                    other => bail!("allocate failed: {other:?}"),
                                }
                                done.fetch_add(1, Ordering::Relaxed);
                                c.call(&release_req(&req)).await?;
                                i += 1;
                            }
                            Ok::<_, anyhow::Error>(())
                        }
                    })))?;
                    Ok(())
                })
            };
            // Warm up, then count over the measured window only.
            std::thread::sleep(Duration::from_millis(300));
            let (c0, t0) = (done.load(Ordering::Relaxed), Instant::now());
            std::thread::sleep(Duration::from_secs_f64(args.seconds));
            let rate = (done.load(Ordering::Relaxed) - c0) as f64 / t0.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            driver.join().expect("client driver")?;
            d.stop()?;
            per_run.push(rate);
        }
        s.push_str(&format!(
            "| {clients} | {:.0} | {} |\n",
            median(per_run.clone()),
            per_run
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(s)
}

/// Time `n` allocations from one client (each released right after, untimed): sorted ms.
fn alloc_latencies(
    socket: &Path,
    series: u64,
    n: usize,
    fresh_connection: bool,
) -> Result<Vec<f64>> {
    let mut c = Client::connect(socket, Duration::from_secs(30))?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let req = alloc_req(series, i);
        let t0 = Instant::now();
        if fresh_connection {
            // As the plugin does: one connection per invocation.
            c = Client::connect(socket, Duration::from_secs(30))?;
        }
        expect_allocated(call(&mut c, &req))?;
        v.push(t0.elapsed().as_secs_f64() * 1e3);
        call(&mut c, &release_req(&req))?;
    }
    v.sort_by(f64::total_cmp);
    Ok(v)
}

/// Wait (at most 30 s) until no compaction is running in `state_dir`, then flush the page
/// cache, so what is measured next does not share the disk with the work before it.
fn settle(state_dir: &Path) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        let busy = fs::read_dir(state_dir).is_ok_and(|rd| {
            let names: Vec<String> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.iter().any(|n| n.ends_with(".tmp"))
                || names.iter().filter(|n| n.starts_with("log.")).count() > 1
        });
        if !busy {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    nix::unistd::sync();
}

fn latency(args: &Args, bin: &Path) -> Result<String> {
    let mut s = format!(
        "\n## Allocation latency by occupancy of a 262,144-address pool\n\n\
         One client, {} Allocates per point on one connection (each followed by an untimed \
         Release), the pool pre-filled over the socket by 64 clients; sampled once the \
         pre-fill's compaction has finished and its writes are flushed (`sync`), so the points \
         compare occupancy, not the pre-fill's writeback. ms, median over runs.\n\n\
         | occupancy | p50 ms | p99 ms | max ms |\n|---|---|---|---|\n",
        args.samples
    );
    let points = [0.0f64, 0.5, 0.95];
    let mut res: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); points.len()];
    for run in 0..args.runs {
        let mut d = Daemon::new(args, bin)?;
        d.start()?;
        let socket = d.socket();
        let mut filled = 0u64;
        for (k, occ) in points.iter().enumerate() {
            let target = (POOL_SIZE as f64 * occ) as u64;
            if target > filled {
                fill(&socket, 7_000 + run as u64, filled, target, 64)?;
                filled = target;
            }
            settle(&d.state_dir());
            let v = alloc_latencies(
                &socket,
                8_000 + run as u64 * 10 + k as u64,
                args.samples,
                false,
            )?;
            res[k].push((
                percentile(&v, 0.5),
                percentile(&v, 0.99),
                percentile(&v, 1.0),
            ));
        }
        d.stop()?;
    }
    for (k, occ) in points.iter().enumerate() {
        let r = &res[k];
        s.push_str(&format!(
            "| {:.0}% | {:.3} | {:.3} | {:.3} |\n",
            occ * 100.0,
            median(r.iter().map(|x| x.0).collect()),
            median(r.iter().map(|x| x.1).collect()),
            median(r.iter().map(|x| x.2).collect()),
        ));
    }
    Ok(s)
}

fn dir_size(dir: &Path) -> (u64, u64) {
    let mut apparent = 0;
    let mut allocated = 0;
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if let Ok(md) = e.metadata() {
                apparent += md.len();
                allocated += md.blocks() * 512;
            }
        }
    }
    (apparent, allocated)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn memory(args: &Args, bin: &Path) -> Result<String> {
    let n = args.leases as u64;
    let mut fill_rate = Vec::new();
    let mut rss_filled = Vec::new();
    let mut rss_restart = Vec::new();
    let mut disk = Vec::new();
    let mut disk_alloc = Vec::new();
    let mut restart_term = Vec::new();
    let mut restart_kill = Vec::new();
    for run in 0..args.runs {
        let mut d = Daemon::new(args, bin)?;
        d.start()?;
        fill_rate.push(fill(&d.socket(), 9_000 + run as u64, 0, n, 64)?);
        rss_filled.push(d.rss_kib() as f64 / 1024.0);
        d.stop()?;
        let (a, b) = dir_size(&d.state_dir());
        disk.push(mib(a));
        disk_alloc.push(mib(b));
        restart_term.push(d.start()?.as_secs_f64() * 1e3);
        rss_restart.push(d.rss_kib() as f64 / 1024.0);
        d.kill9();
        restart_kill.push(d.start()?.as_secs_f64() * 1e3);
        let Response::Stats { pools, .. } =
            Client::connect(d.socket(), Duration::from_secs(10))?.call(&Request::Stats)?
        else {
            bail!("stats")
        };
        if pools[0].allocated != n {
            bail!("after restart {} leases, expected {n}", pools[0].allocated);
        }
        d.stop()?;
    }
    let list = |v: &[f64], p: usize| {
        v.iter()
            .map(|x| format!("{x:.p$}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Ok(format!(
        "\n## {n} leases: fill rate, memory, disk, restart\n\n\
         | metric | median | runs |\n|---|---|---|\n\
         | fill: durable allocations/s, 64 clients, new keys | {:.0} | {} |\n\
         | daemon RSS after the fill (MiB) | {:.1} | {} |\n\
         | daemon RSS after a restart (MiB) | {:.1} | {} |\n\
         | state dir size (MiB, apparent) | {:.1} | {} |\n\
         | state dir size (MiB, allocated blocks) | {:.1} | {} |\n\
         | restart to serving after SIGTERM (ms, spawn to first reply) | {:.0} | {} |\n\
         | restart to serving after kill -9 (ms) | {:.0} | {} |\n",
        median(fill_rate.clone()),
        list(&fill_rate, 0),
        median(rss_filled.clone()),
        list(&rss_filled, 1),
        median(rss_restart.clone()),
        list(&rss_restart, 1),
        median(disk.clone()),
        list(&disk, 1),
        median(disk_alloc.clone()),
        list(&disk_alloc, 1),
        median(restart_term.clone()),
        list(&restart_term, 0),
        median(restart_kill.clone()),
        list(&restart_kill, 0),
    ))
}

/// Run host-local once; returns the wall time in ms.
fn host_local_call(plugin: &Path, conf: &str, cmd: &str, cid: &str) -> Result<f64> {
    let t0 = Instant::now();
    let mut child = Command::new(plugin)
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", "/var/run/netns/ipam-bench-dummy")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", plugin.parent().unwrap_or(Path::new("/")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", plugin.display()))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(conf.as_bytes())?;
    let out = child.wait_with_output()?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        bail!(
            "host-local {cmd} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(ms)
}

/// Pre-fill host-local's directory with `n` allocations written as files (its own format).
fn host_local_prefill(data: &Path, n: usize) -> Result<()> {
    let dir = data.join("scale-test");
    fs::create_dir_all(&dir)?;
    let base = u32::from(std::net::Ipv4Addr::new(10, 64, 0, 2));
    for i in 0..n as u32 {
        let ip = std::net::Ipv4Addr::from(base + i);
        fs::write(dir.join(ip.to_string()), format!("prefill{i}\r\neth0"))?;
    }
    if n > 0 {
        fs::write(
            dir.join("last_reserved_ip.0"),
            std::net::Ipv4Addr::from(base + n as u32 - 1).to_string(),
        )?;
    }
    Ok(())
}

fn host_local(args: &Args, bin: &Path) -> Result<String> {
    const OPS: usize = 200;
    const PREFILL: usize = 20_000;
    if !args.host_local.exists() {
        return Ok(format!(
            "\n## host-local comparison skipped: {} not found (apt install containernetworking-plugins)\n",
            args.host_local.display()
        ));
    }
    // (host-local empty ADD, host-local 20k ADD, host-local 20k DEL, aliasnet empty, aliasnet 20k)
    let mut hl_empty = Vec::new();
    let mut hl_full = Vec::new();
    let mut hl_del = Vec::new();
    let mut al_empty = Vec::new();
    let mut al_full = Vec::new();
    for run in 0..args.runs {
        for prefill in [0usize, PREFILL] {
            let data = tempfile::Builder::new()
                .prefix("hostlocal-bench")
                .tempdir_in(&args.dir)?;
            host_local_prefill(data.path(), prefill)?;
            let conf = serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "scale-test",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POOL}]],
                         "dataDir": data.path()},
            })
            .to_string();
            let mut adds = Vec::with_capacity(OPS);
            let mut dels = Vec::with_capacity(OPS);
            for i in 0..OPS {
                adds.push(host_local_call(
                    &args.host_local,
                    &conf,
                    "ADD",
                    &format!("bench{run}-{i}"),
                )?);
            }
            for i in 0..OPS {
                dels.push(host_local_call(
                    &args.host_local,
                    &conf,
                    "DEL",
                    &format!("bench{run}-{i}"),
                )?);
            }
            adds.sort_by(f64::total_cmp);
            dels.sort_by(f64::total_cmp);
            if prefill == 0 {
                hl_empty.push(adds);
            } else {
                hl_full.push(adds);
                hl_del.push(dels);
            }
        }
        let mut d = Daemon::new(args, bin)?;
        d.start()?;
        let socket = d.socket();
        al_empty.push(alloc_latencies(&socket, 11_000 + run as u64, OPS, true)?);
        fill(&socket, 12_000 + run as u64, 0, PREFILL as u64, 64)?;
        al_full.push(alloc_latencies(&socket, 13_000 + run as u64, OPS, true)?);
        d.stop()?;
    }
    let row = |name: &str, v: &[Vec<f64>]| {
        format!(
            "| {name} | {:.3} | {:.3} | {:.3} |\n",
            median(v.iter().map(|x| percentile(x, 0.5)).collect()),
            median(v.iter().map(|x| percentile(x, 0.9)).collect()),
            median(v.iter().map(|x| percentile(x, 0.99)).collect()),
        )
    };
    let p50 = |v: &[Vec<f64>]| median(v.iter().map(|x| percentile(x, 0.5)).collect());
    let p99 = |v: &[Vec<f64>]| median(v.iter().map(|x| percentile(x, 0.99)).collect());
    let mut s = format!(
        "\n## Side by side with host-local on {POOL} ({OPS} ops per point)\n\n\
         host-local: `{}` exec'd per operation with CNI_COMMAND=ADD/DEL (process start included), \
         its dataDir pre-filled with files in its own format. aliasnet: one new connection + \
         Allocate per operation (what the plugin does), leases pre-filled over the socket.\n\n\
         | operation | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|\n",
        args.host_local.display()
    );
    s.push_str(&row("host-local ADD, nearly empty", &hl_empty));
    s.push_str(&row(
        &format!("host-local ADD, {PREFILL} allocations"),
        &hl_full,
    ));
    s.push_str(&row(
        &format!("host-local DEL, {PREFILL} allocations"),
        &hl_del,
    ));
    s.push_str(&row("aliasnet-ipamd Allocate, nearly empty", &al_empty));
    s.push_str(&row(
        &format!("aliasnet-ipamd Allocate, {PREFILL} leases"),
        &al_full,
    ));
    s.push_str(&format!(
        "\nAt {PREFILL} allocations aliasnet-ipamd is {:.0}x faster at p50 and {:.0}x at p99.\n",
        p50(&hl_full) / p50(&al_full),
        p99(&hl_full) / p99(&al_full)
    ));
    Ok(s)
}
