//! An `aliasnet-ipamd` process running inside a node's netns.

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{Client, Lease, Request, Response};
use anyhow::{bail, Context, Result};
use nix::{sys::signal, unistd::Pid};

use crate::netns::Netns;

/// Paths of one daemon instance; all under the node's scratch directory.
#[derive(Debug, Clone)]
pub struct IpamdPaths {
    pub config: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub spool_dir: PathBuf,
    pub log: PathBuf,
}

impl IpamdPaths {
    pub fn under(dir: &Path) -> Self {
        Self {
            config: dir.join("ipamd.toml"),
            socket: dir.join("ipamd.sock"),
            state_dir: dir.join("ipam-state"),
            spool_dir: dir.join("spool"),
            log: dir.join("ipamd.log"),
        }
    }

    /// Write a config with one static pool described by `pool_body` (TOML lines inside
    /// `[[pool]]`, e.g. `cidrs = ["10.240.1.0/24"]`).
    pub fn write_config(&self, pool_body: &str, cooldown: &str) -> Result<()> {
        self.write_config_pools(&[("secondary", pool_body.to_owned())], cooldown)
    }

    /// Write a config with one static pool per `(name, body)`.
    pub fn write_config_pools(&self, pools: &[(&str, String)], cooldown: &str) -> Result<()> {
        let mut cfg = format!(
            r#"socket = "{}"
state_dir = "{}"
spool_dir = "{}"
cooldown = "{cooldown}"
# GC may release a lease at once here: the tests run GC right after ADD (the grace period has
# its own test in ipam/tests/clock.rs).
gc_grace = "0s"
host_veth_prefix = "ali"
log_level = "debug"
"#,
            self.socket.display(),
            self.state_dir.display(),
            self.spool_dir.display(),
        );
        for (name, body) in pools {
            cfg.push_str(&format!(
                "\n[[pool]]\nname = \"{name}\"\nsource = \"static\"\n{body}\n"
            ));
        }
        fs::write(&self.config, cfg).context("writing ipamd config")
    }
}

/// `aliasnet-ipamd ARGS` (the binary at `bin`) in a network namespace of its own, unshared
/// for the child alone: its netlink socket can never touch the host's interfaces, and the
/// namespace goes with the process.
pub fn unshared_command(bin: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.args(args).stdin(Stdio::null());
    // SAFETY: unshare is async-signal-safe and touches only the child.
    unsafe {
        c.pre_exec(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
        });
    }
    c
}

/// Wait until the daemon `child` answers a Stats request on `socket`; returns the time it
/// took. Fails when the daemon exits first (its state did not load) or after `timeout`.
pub fn wait_ready(socket: &Path, child: &mut Child, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if let Ok(mut c) = Client::connect(socket, Duration::from_secs(2)) {
            if c.call(&Request::Stats).is_ok() {
                return Ok(start.elapsed());
            }
        }
        if let Some(st) = child.try_wait()? {
            bail!("aliasnet-ipamd exited during start ({st})");
        }
        if start.elapsed() > timeout {
            bail!("aliasnet-ipamd not ready after {timeout:?}");
        }
        // Short: the benchmark measures restart times with this.
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// A running daemon; stopped (SIGTERM, then SIGKILL) on drop.
pub struct Ipamd {
    pub paths: IpamdPaths,
    child: Option<Child>,
}

impl Ipamd {
    /// Start the daemon in `ns` and wait until its socket answers.
    pub fn start(ns: &Netns, paths: IpamdPaths) -> Result<Self> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&paths.log)?;
        let child = ns
            .command(crate::bin("aliasnet-ipamd"))
            .arg("--config")
            .arg(&paths.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning aliasnet-ipamd")?;
        let mut me = Self {
            paths,
            child: Some(child),
        };
        me.wait_ready(Duration::from_secs(20))?;
        Ok(me)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let child = self.child.as_mut().expect("spawned");
        wait_ready(&self.paths.socket, child, timeout)
            .map(drop)
            .map_err(|e| {
                anyhow::anyhow!(
                    "{e}; log:\n{}",
                    fs::read_to_string(&self.paths.log).unwrap_or_default()
                )
            })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL the daemon (crash simulation).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            signal::kill(Pid::from_raw(c.id() as i32), signal::Signal::SIGTERM)?;
            let start = Instant::now();
            while c.try_wait()?.is_none() {
                if start.elapsed() > Duration::from_secs(10) {
                    let _ = c.kill();
                    let _ = c.wait();
                    bail!("aliasnet-ipamd ignored SIGTERM for 10 s");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.paths.socket, Duration::from_secs(5)).expect("connect to ipamd")
    }

    /// Every lease the daemon holds.
    pub fn leases(&self) -> Vec<Lease> {
        match self.client().call(&Request::List).expect("list leases") {
            Response::Leases { leases } => leases,
            other => panic!("unexpected reply to List: {other:?}"),
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.paths.log).unwrap_or_default()
    }
}

impl Drop for Ipamd {
    fn drop(&mut self) {
        if self.stop().is_err() {
            self.kill9();
        }
    }
}
