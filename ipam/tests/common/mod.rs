//! Shared helpers of the daemon tests: a config in a temp dir, a recording link remover,
//! blocking protocol calls run off the async runtime, and the daemon binary started through
//! the test fabric (`aliasnet_tests::ipamd`).
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aliasnet_ipam::{
    config::Config,
    daemon::Daemon,
    teardown::{Link, LinkRemover, LinksError, Removed},
};
use aliasnet_ipam_proto::{AttachmentKey, Client, ClientError, Lease, PodRef, Request, Response};

/// The daemon binary of this package.
pub const BIN: &str = env!("CARGO_BIN_EXE_aliasnet-ipamd");

/// `aliasnet-ipamd ARGS` in a network namespace of its own (unshared for the child), so its
/// netlink socket can never touch the host's interfaces.
pub fn daemon_command(args: &[&str]) -> std::process::Command {
    aliasnet_tests::ipamd::unshared_command(Path::new(BIN), args)
}

/// Wait until the daemon answers; panics if it exits first (the state did not load) or is
/// not serving after 20 s. Returns the time it took.
#[track_caller]
pub fn wait_ready(socket: &Path, child: &mut std::process::Child) -> Duration {
    aliasnet_tests::ipamd::wait_ready(socket, child, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("daemon not ready: {e}"))
}

/// Records link deletions instead of touching any interface; optionally slow, like the kernel.
/// With `links` set it also plays the kernel's link list (a deleted link leaves it).
#[derive(Default)]
pub struct Recorder {
    /// (link, when its deletion finished)
    pub removed: Mutex<Vec<(String, Instant)>>,
    pub delay: Duration,
    pub links: Mutex<Option<Vec<String>>>,
}

impl Recorder {
    /// A recorder whose link list starts as `links` (all veths).
    pub fn with_links(links: &[&str]) -> Self {
        Self {
            links: Mutex::new(Some(links.iter().map(|s| (*s).to_owned()).collect())),
            ..Self::default()
        }
    }

    pub fn set_links(&self, links: &[&str]) {
        *self.links.lock().unwrap() = Some(links.iter().map(|s| (*s).to_owned()).collect());
    }

    pub fn names(&self) -> Vec<String> {
        self.removed
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }
}

impl LinkRemover for Recorder {
    fn list(&self) -> Result<Vec<Link>, LinksError> {
        match &*self.links.lock().unwrap() {
            Some(l) => Ok(l
                .iter()
                .map(|n| Link {
                    name: n.clone(),
                    kind: Some("veth".into()),
                    ..Link::default()
                })
                .collect()),
            None => Err(LinksError::CannotList),
        }
    }

    fn remove(&self, name: &str) -> Result<Removed, LinksError> {
        // The blocking pool's thread, as the daemon's netlink call would block it.
        std::thread::sleep(self.delay);
        if let Some(l) = &mut *self.links.lock().unwrap() {
            l.retain(|n| n != name);
        }
        self.removed
            .lock()
            .unwrap()
            .push((name.to_owned(), Instant::now()));
        Ok(Removed::Deleted)
    }
}

/// A daemon's directory: config, state, spool and socket all under one temp dir.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub config: Config,
}

impl Env {
    /// `top`: extra top-level keys; `pool`: the body of one static pool named "secondary".
    pub fn new(top: &str, pool: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        // Tests run in parallel: an ephemeral metrics port unless the test picks one.
        let metrics = if top.contains("metrics_address") {
            ""
        } else {
            "metrics_address = \"127.0.0.1:0\"\n"
        };
        // Tests GC right after allocating unless they test the grace itself.
        let gc = if top.contains("gc_grace") {
            ""
        } else {
            "gc_grace = \"0s\"\n"
        };
        let text = format!(
            "socket = \"{d}/run/ipamd.sock\"\nstate_dir = \"{d}/state\"\nspool_dir = \"{d}/spool\"\n\
             {metrics}{gc}{top}\n[[pool]]\nname = \"secondary\"\nsource = \"static\"\n{pool}\n"
        );
        let path = dir.path().join("ipamd.toml");
        std::fs::write(&path, &text).unwrap();
        let config = Config::load(&path).unwrap();
        Self { dir, config }
    }

    pub fn socket(&self) -> PathBuf {
        self.config.socket.clone()
    }

    pub fn state_dir(&self) -> &Path {
        &self.config.state_dir
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("ipamd.toml")
    }

    pub async fn start(&self, remover: Arc<dyn LinkRemover>) -> Daemon {
        Daemon::start(&self.config, remover)
            .await
            .expect("daemon starts")
    }
}

pub fn key(c: &str) -> AttachmentKey {
    AttachmentKey::new("net", c, "eth0")
}

/// The plugin's host veth name for container `c`.
pub fn v(c: &str) -> String {
    aliasnet_ipam_proto::host_veth_name("ali", &key(c))
}

pub fn alloc_req(c: &str, host_veth: Option<&str>) -> Request {
    Request::Allocate {
        key: key(c),
        pod: PodRef {
            namespace: Some("default".into()),
            name: Some(format!("pod-{c}")),
            uid: None,
        },
        pool: None,
        host_veth: host_veth.map(str::to_owned),
        families: None,
    }
}

/// One request on a fresh connection, from a blocking thread.
pub async fn call(socket: &Path, req: Request) -> Result<Response, ClientError> {
    let socket = socket.to_path_buf();
    tokio::task::spawn_blocking(move || {
        Client::connect(&socket, Duration::from_secs(40))?.call(&req)
    })
    .await
    .unwrap()
}

pub async fn allocate(socket: &Path, c: &str) -> Lease {
    match call(socket, alloc_req(c, None)).await {
        Ok(Response::Allocated { lease, .. }) => lease,
        other => panic!("allocate {c}: {other:?}"),
    }
}

/// Allocates for `c` with its host veth named (as the plugin does); the lease.
pub async fn allocate_with_veth(socket: &Path, c: &str) -> Lease {
    match call(socket, alloc_req(c, Some(&v(c)))).await {
        Ok(Response::Allocated { lease, .. }) => lease,
        other => panic!("{other:?}"),
    }
}

/// Releases `c`'s lease, tearing down `teardown_link` if named; the daemon's answer.
pub async fn release(socket: &Path, c: &str, teardown_link: Option<String>) -> Response {
    call(
        socket,
        Request::Release {
            key: key(c),
            teardown_link,
        },
    )
    .await
    .unwrap()
}

pub async fn list(socket: &Path) -> Vec<Lease> {
    match call(socket, Request::List).await {
        Ok(Response::Leases { leases }) => leases,
        other => panic!("list: {other:?}"),
    }
}

/// Stats of the daemon at `socket`.
pub async fn stats(
    socket: &Path,
) -> (
    Vec<aliasnet_ipam_proto::PoolStats>,
    aliasnet_ipam_proto::ReconcileStats,
) {
    match call(socket, Request::Stats).await {
        Ok(Response::Stats { pools, reconcile }) => (pools, reconcile),
        other => panic!("stats: {other:?}"),
    }
}

/// Poll `f` every 20 ms until it returns `Some`, for at most `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Run `f` on a thread of its own in a new network namespace (which goes with the thread),
/// for at most 60 s.
pub fn in_own_netns<F: std::future::Future<Output = ()> + 'static>(f: fn() -> F) {
    aliasnet_tests::require_root();
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("unshare netns (needs root)");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), f())
                .await
                .expect("scenario finished in time");
        });
    })
    .join()
    .expect("scenario passed");
}

/// `ip ARGS` in the calling thread's network namespace (a child inherits it); panics naming
/// the command when it fails.
pub fn run_ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether a link named `name` exists in the calling thread's network namespace.
pub fn link_exists(name: &str) -> bool {
    aliasnet_netlink::Rtnl::new()
        .and_then(|mut r| r.link_by_name(name))
        .expect("look up a link")
        .is_some()
}

/// A plain HTTP/1.1 request to `addr`; returns (status, body). `raw` is sent as is.
pub fn http(addr: std::net::SocketAddr, raw: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// GET /metrics from the daemon's endpoint.
pub fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, body) = http(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample `series` (name and labels exactly as exposed) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}
