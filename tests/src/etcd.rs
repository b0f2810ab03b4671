//! A real etcd cluster (Debian's `etcd-server`) for the cluster budget: its members run in a
//! network namespace of their own, attached to a router namespace (the fabric's VNet) on
//! `10.100.250.0/24`, so that simulated nodes in their own namespaces reach it through the
//! fabric as real nodes reach an etcd cluster. Member `i` (from 1) listens on
//! `10.100.250.(10 + i)`, clients on 2379, peers on 2380. Data lives in `/dev/shm`.
//!
//! With [`EtcdOpts::tls`] the client port is https with client-certificate authentication;
//! [`EtcdCluster::tls`] gives the CA and a client certificate signed by it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{netns::Netns, unique_tag};

/// The etcd network's router side and member addresses.
pub const ETCD_NET: &str = "10.100.250";

#[derive(Debug, Clone)]
pub struct EtcdOpts {
    pub members: usize,
    /// https with client certificates.
    pub tls: bool,
}

impl Default for EtcdOpts {
    fn default() -> Self {
        Self {
            members: 3,
            tls: false,
        }
    }
}

/// Client TLS material of a TLS cluster.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

struct Member {
    name: String,
    ip: String,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

pub struct EtcdCluster {
    members: Vec<Member>,
    initial: String,
    token: String,
    tls: Option<EtcdTls>,
    // Field order is drop order: the members stop (Drop) before the namespace goes.
    pub ns: Netns,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts the members in a new namespace linked to `router` and waits until the cluster
    /// answers; the router gets `10.100.250.1/24`.
    pub fn start(router: &Netns, opts: EtcdOpts) -> Result<Self> {
        crate::require_tool("etcd", "etcd-server");
        crate::require_tool("etcdctl", "etcd-client");
        let tag = unique_tag();
        let ns = Netns::new(&format!("an{tag}-etcd"))?;
        let base = if Path::new("/dev/shm").is_dir() {
            Path::new("/dev/shm")
        } else {
            Path::new("/tmp")
        };
        let dir = tempfile::Builder::new()
            .prefix("aliasnet-etcd-")
            .tempdir_in(base)?;
        // The router's side of the link, in the router's (the test's own) namespace.
        let rif = "etcd";
        router.ip(&[
            "link", "add", rif, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ])?;
        router.ip(&["addr", "add", &format!("{ETCD_NET}.1/24"), "dev", rif])?;
        router.ip(&["link", "set", rif, "up"])?;
        let mut members = Vec::new();
        for i in 1..=opts.members {
            let ip = format!("{ETCD_NET}.{}", 10 + i);
            ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            members.push(Member {
                name: format!("m{i}"),
                data: dir.path().join(format!("m{i}")),
                log: dir.path().join(format!("m{i}.log")),
                ip,
                child: None,
            });
        }
        ns.ip(&["link", "set", "eth0", "up"])?;
        ns.ip(&["route", "add", "default", "via", &format!("{ETCD_NET}.1")])?;
        let tls = if opts.tls {
            Some(make_certs(dir.path(), &members)?)
        } else {
            None
        };
        let initial = members
            .iter()
            .map(|m| format!("{}=http://{}:2380", m.name, m.ip))
            .collect::<Vec<_>>()
            .join(",");
        let mut me = Self {
            members,
            initial,
            token: format!("aliasnet-{tag}"),
            tls,
            ns,
            dir,
        };
        for i in 0..me.members.len() {
            me.spawn(i, "new")?;
        }
        me.wait_healthy(Duration::from_secs(30))?;
        Ok(me)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://{}:2379", self.scheme(), m.ip))
            .collect()
    }

    /// CA and client certificate of a TLS cluster.
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// The scratch directory (logs, certificates).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn spawn(&mut self, i: usize, state: &str) -> Result<()> {
        let scheme = self.scheme();
        let m = &self.members[i];
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)?;
        let client = format!("{scheme}://{}:2379", m.ip);
        let peer = format!("http://{}:2380", m.ip);
        let mut c = self.ns.command("etcd");
        c.args(["--name", &m.name, "--data-dir"])
            .arg(&m.data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args([
                "--initial-cluster",
                &self.initial,
                "--initial-cluster-state",
                state,
            ])
            .args(["--initial-cluster-token", &self.token])
            // A member failure costs a raft election: 0.5-1 s instead of 1-2 s with the
            // defaults, so that lease TTLs of a few seconds keep the tests short.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"]);
        if let Some(t) = &self.tls {
            let d = self.dir.path();
            c.arg("--cert-file")
                .arg(d.join("server.crt"))
                .arg("--key-file")
                .arg(d.join("server.key"))
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
        let child = c
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning etcd")?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// `etcdctl ARGS` against every member, inside the etcd namespace.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let mut c = self.ns.command("etcdctl");
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints().join(",")))
            .arg("--command-timeout=3s");
        if let Some(t) = &self.tls {
            c.arg(format!("--cacert={}", t.ca.display()))
                .arg(format!("--cert={}", t.cert.display()))
                .arg(format!("--key={}", t.key.display()));
        }
        let out = crate::netns::run(c.args(args))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until a quorum answers a linearizable read.
    pub fn wait_healthy(&self, limit: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            match self.etcdctl(&["get", "--prefix", "/aliasnet-health-probe"]) {
                Ok(_) => return Ok(()),
                Err(e) if start.elapsed() > limit => {
                    bail!("etcd not healthy after {limit:?}: {e:#}\n{}", self.logs())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// SIGKILL member `i` (from 1).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i - 1].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Restarts member `i` (from 1) on its data.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        self.spawn(i - 1, "existing")
    }

    pub fn kill_all(&mut self) {
        for i in 1..=self.members.len() {
            self.kill(i);
        }
    }

    /// Restarts every member and waits for a quorum.
    pub fn restart_all(&mut self) -> Result<()> {
        for i in 1..=self.members.len() {
            self.restart(i)?;
        }
        self.wait_healthy(Duration::from_secs(30))
    }

    /// Process ids of the running members (for CPU accounting).
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().map(Child::id))
            .collect()
    }

    /// Every member's log, for failure messages.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let t = fs::read_to_string(&m.log).unwrap_or_default();
                let tail: Vec<&str> = t.lines().rev().take(20).collect();
                format!(
                    "--- {} ---\n{}",
                    m.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// A CA, a serving certificate for every member's address and a client certificate.
fn make_certs(dir: &Path, members: &[Member]) -> Result<EtcdTls> {
    crate::require_tool("openssl", "openssl");
    let p = |n: &str| dir.join(n);
    let ssl = |args: &[&str]| -> Result<()> {
        crate::netns::run(Command::new("openssl").args(args).current_dir(dir)).map(|_| ())
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=aliasnet-test-ca",
    ];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
    ssl(&ca)?;
    let sans = members
        .iter()
        .map(|m| format!("IP:{}", m.ip))
        .collect::<Vec<_>>()
        .join(",");
    for (name, ext) in [
        (
            "server",
            format!("subjectAltName={sans}\nextendedKeyUsage=serverAuth\n"),
        ),
        ("client", "extendedKeyUsage=clientAuth\n".to_owned()),
    ] {
        let mut req = vec!["req", "-subj"];
        let subj = format!("/CN=aliasnet-{name}");
        req.push(&subj);
        req.extend(ec);
        let (key, csr) = (format!("{name}.key"), format!("{name}.csr"));
        req.extend(["-keyout", &key, "-out", &csr]);
        ssl(&req)?;
        fs::write(p(&format!("{name}.ext")), ext)?;
        let (crt, extf) = (format!("{name}.crt"), format!("{name}.ext"));
        ssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &extf,
            "-out",
            &crt,
        ])?;
    }
    Ok(EtcdTls {
        ca: p("ca.crt"),
        cert: p("client.crt"),
        key: p("client.key"),
    })
}
