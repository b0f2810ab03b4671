//! The daemon under test as a child process, and clients that talk to it like the plugin.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{
    frame, host_veth_name, AttachmentKey, Client, ClientError, PodRef, Request, Response,
};
use aliasnet_tests::ipamd::{unshared_command, wait_ready};
use anyhow::{bail, Context, Result};

use super::{pool, Args, NETWORK};

/// A daemon child process with its own temp directory.
pub struct Daemon {
    pub bin: PathBuf,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Daemon {
    pub fn new(args: &Args, bin: &Path) -> Result<Self> {
        fs::create_dir_all(&args.dir)?;
        let dir = tempfile::Builder::new()
            .prefix("ipam-bench")
            .tempdir_in(&args.dir)?;
        let d = dir.path().display();
        // The daemon's own log (its start-up timings) with IPAM_BENCH_LOG=info.
        let level = std::env::var("IPAM_BENCH_LOG").unwrap_or_else(|_| "warn".into());
        let pool = pool();
        fs::write(
            dir.path().join("ipamd.toml"),
            format!(
                "socket = \"{d}/ipamd.sock\"\nstate_dir = \"{d}/state\"\nspool_dir = \"{d}/spool\"\n\
                 cooldown = \"130s\"\nlog_level = \"{level}\"\nmetrics_address = \"\"\nreconcile_interval = \"0s\"\n\
                 [[pool]]\nname = \"secondary\"\nsource = \"static\"\ncidrs = [\"{pool}\"]\n"
            ),
        )?;
        Ok(Self {
            bin: bin.to_path_buf(),
            dir,
            child: None,
        })
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("ipamd.sock")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Start and wait until a request is answered; returns the time from spawn to serving.
    pub fn start(&mut self) -> Result<Duration> {
        let config = self.dir.path().join("ipamd.toml");
        let mut cmd = unshared_command(&self.bin, &["--config", &config.display().to_string()]);
        cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().context("spawning aliasnet-ipamd")?;
        let took = wait_ready(&self.socket(), &mut child, Duration::from_secs(60))?;
        self.child = Some(child);
        Ok(took)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    pub fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    pub fn stop(&mut self) -> Result<()> {
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

    pub fn kill9(&mut self) {
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

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A plugin-like Allocate for pod number `i` of series `series`.
pub fn alloc_req(series: u64, i: u64) -> Request {
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
        families: None,
    }
}

pub fn release_req(alloc: &Request) -> Request {
    let Request::Allocate { key, .. } = alloc else {
        unreachable!()
    };
    Request::Release {
        key: key.clone(),
        teardown_link: None,
    }
}

pub fn call(c: &mut Client, req: &Request) -> Result<Response, ClientError> {
    let r = c.call(req)?;
    Ok(r)
}

pub fn expect_allocated(r: Result<Response, ClientError>) -> Result<()> {
    match r {
        Ok(Response::Allocated { .. }) => Ok(()),
        other => bail!("allocate failed: {other:?}"),
    }
}

/// A protocol connection driven asynchronously: the bench runs its concurrent clients as
/// tasks on one thread, so 64 clients do not take the CPU from the daemon they measure (64
/// client threads on a 2-core machine spend it on context switches).
pub struct AsyncConn {
    s: tokio::net::UnixStream,
    buf: Vec<u8>,
}

impl AsyncConn {
    pub async fn connect(path: &Path) -> Result<Self> {
        Ok(Self {
            s: tokio::net::UnixStream::connect(path).await?,
            buf: Vec::with_capacity(4096),
        })
    }

    pub async fn call(&mut self, req: &Request) -> Result<Response> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.s.write_all(&frame::encode(req)).await?;
        let mut h = [0u8; 4];
        self.s.read_exact(&mut h).await?;
        self.buf.resize(frame::parse_len(h)?, 0);
        self.s.read_exact(&mut self.buf).await?;
        Ok(frame::decode(&self.buf)?)
    }
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `clients` concurrent connections allocate keys `series`/[from, to) (each once) as fast as
/// they can; returns allocations per second.
pub fn fill(socket: &Path, series: u64, from: u64, to: u64, clients: usize) -> Result<f64> {
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

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Time `n` allocations from one client (each released right after, untimed): sorted ms.
pub fn alloc_latencies(
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
pub fn settle(state_dir: &Path) {
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
