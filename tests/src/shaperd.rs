//! An `aliasnet-shaperd` running in a node's netns with its own bpffs pin root, so several
//! simulated nodes (and parallel tests) never share pinned objects.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use nix::{sys::signal, unistd::Pid};

use crate::netns::{run, Netns};

#[derive(Debug, Clone)]
pub struct ShaperPaths {
    pub config: PathBuf,
    pub pin_root: PathBuf,
    pub log: PathBuf,
}

/// A running daemon. Dropping it stops the daemon; one started with [`Shaperd::start`] also
/// removes its pin root then, which detaches whatever is still attached (the pods are gone
/// by then).
pub struct Shaperd {
    pub paths: ShaperPaths,
    bin: PathBuf,
    ns_path: PathBuf,
    child: Option<Child>,
    /// Extra arguments of every (re)spawn.
    args: Vec<String>,
    remove_pins: bool,
}

impl Shaperd {
    /// `nsenter --net=NS aliasnet-shaperd --config C --pin-root P ARGS` (nsenter keeps bpffs
    /// visible), logging at info. The node's name (in a cluster budget) is its namespace's.
    pub fn command(bin: &Path, ns: &Path, paths: &ShaperPaths, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        if let Some(name) = ns.file_name() {
            c.env("NODE_NAME", name);
        }
        c.arg(format!("--net={}", ns.display()))
            .arg(bin)
            .arg("--config")
            .arg(&paths.config)
            .arg("--pin-root")
            .arg(&paths.pin_root)
            .args(args)
            .env("RUST_LOG", "info");
        c
    }

    /// Install the datapath (`--once`, so pins exist when this returns), then keep the daemon
    /// running for policy reloads and GC; the pin root goes with the daemon.
    pub fn start(ns: &Netns, paths: ShaperPaths) -> Result<Self> {
        let bin = crate::bin("aliasnet-shaperd");
        // `--once` installs the datapath and applies the policy before returning, so the
        // plugin finds complete pins as soon as this returns.
        run(&mut Self::command(&bin, &ns.path(), &paths, &["--once"]))
            .context("aliasnet-shaperd --once")?;
        let from = fs::metadata(&paths.log).map_or(0, |m| m.len());
        let mut me = Self::spawn(&bin, &ns.path(), paths, &["--poll-interval", "1"])?;
        me.remove_pins = true;
        // The daemon loads the programs again at start, holding the pin root's lock while the
        // verifier runs (seconds on a loaded machine): an ADD meanwhile waits for the lock
        // and fails after 10 s. Tests add pods once it is past that.
        me.wait_running(from, Duration::from_secs(60))?;
        Ok(me)
    }

    /// Until the log, from byte `from` on, says the daemon is running (its datapath installed
    /// and its signal handlers set).
    fn wait_running(&mut self, from: u64, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            let log = fs::read(&self.paths.log).unwrap_or_default();
            let tail = log.get(usize::try_from(from)?..).unwrap_or_default();
            if String::from_utf8_lossy(tail).contains("running;") {
                return Ok(());
            }
            if !self.is_running() {
                bail!(
                    "aliasnet-shaperd exited at start: {}",
                    String::from_utf8_lossy(tail)
                );
            }
            if start.elapsed() > timeout {
                bail!(
                    "aliasnet-shaperd not running after {timeout:?}: {}",
                    String::from_utf8_lossy(tail)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Start the daemon in the background with `args`; its output is appended to the log.
    pub fn spawn(bin: &Path, ns: &Path, paths: ShaperPaths, args: &[&str]) -> Result<Self> {
        let mut me = Self {
            paths,
            bin: bin.to_path_buf(),
            ns_path: ns.to_path_buf(),
            child: None,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            remove_pins: false,
        };
        me.respawn()?;
        Ok(me)
    }

    /// Starts the daemon again with the same arguments (after [`Self::kill`]: what the
    /// kubelet does when a DaemonSet's container dies).
    pub fn respawn(&mut self) -> Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.paths.log)?;
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let child = Self::command(&self.bin, &self.ns_path, &self.paths, &args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning aliasnet-shaperd")?;
        self.child = Some(child);
        Ok(())
    }

    /// Restart the daemon (what an upgrade does); pods keep their programs meanwhile.
    pub fn restart(&mut self, _ns: &Netns) -> Result<()> {
        self.stop()?;
        self.respawn()
    }

    pub fn signal(&self, sig: signal::Signal) -> Result<()> {
        if let Some(c) = &self.child {
            signal::kill(Pid::from_raw(c.id() as i32), sig)?;
        }
        Ok(())
    }

    /// SIGTERM and wait (at most 30 s); the exit status, `None` when it was not running.
    pub fn stop(&mut self) -> Result<Option<ExitStatus>> {
        let Some(mut c) = self.child.take() else {
            return Ok(None);
        };
        signal::kill(Pid::from_raw(c.id() as i32), signal::Signal::SIGTERM)?;
        let start = Instant::now();
        loop {
            if let Some(st) = c.try_wait()? {
                return Ok(Some(st));
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = c.kill();
                let _ = c.wait();
                bail!("aliasnet-shaperd ignored SIGTERM for 30 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, leaving everything it made in place.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.paths.log).unwrap_or_default()
    }

    /// The node netns this daemon runs in.
    pub fn netns_path(&self) -> &PathBuf {
        &self.ns_path
    }
}

impl Drop for Shaperd {
    fn drop(&mut self) {
        if self.stop().is_err() {
            self.kill();
        }
        if self.remove_pins {
            let _ = fs::remove_dir_all(&self.paths.pin_root);
        }
    }
}
