//! An `aliasnet-shaperd` running in a node's netns with its own bpffs pin root, so several
//! simulated nodes (and parallel tests) never share pinned objects.

use std::{
    fs,
    path::PathBuf,
    process::{Child, Stdio},
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

/// A running daemon. Dropping it stops the daemon and removes the pin root, which detaches
/// whatever is still attached (the pods are gone by then).
pub struct Shaperd {
    pub paths: ShaperPaths,
    ns_path: PathBuf,
    child: Option<Child>,
}

impl Shaperd {
    pub fn start(ns: &Netns, paths: ShaperPaths) -> Result<Self> {
        // `--once` installs the datapath and applies the policy before returning, so the
        // plugin finds complete pins as soon as this returns.
        run(ns
            .command(crate::bin("aliasnet-shaperd"))
            .arg("--config")
            .arg(&paths.config)
            .arg("--pin-root")
            .arg(&paths.pin_root)
            .arg("--once"))
        .context("aliasnet-shaperd --once")?;
        let mut me = Self {
            paths,
            ns_path: ns.path(),
            child: None,
        };
        me.spawn(ns)?;
        Ok(me)
    }

    fn spawn(&mut self, ns: &Netns) -> Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.paths.log)?;
        let child = ns
            .command(crate::bin("aliasnet-shaperd"))
            .arg("--config")
            .arg(&self.paths.config)
            .arg("--pin-root")
            .arg(&self.paths.pin_root)
            .arg("--poll-interval")
            .arg("1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning aliasnet-shaperd")?;
        self.child = Some(child);
        Ok(())
    }

    /// Restart the daemon (what an upgrade does); pods keep their programs meanwhile.
    pub fn restart(&mut self, ns: &Netns) -> Result<()> {
        self.stop()?;
        self.spawn(ns)
    }

    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            signal::kill(Pid::from_raw(c.id() as i32), signal::Signal::SIGTERM)?;
            let start = Instant::now();
            while c.try_wait()?.is_none() {
                if start.elapsed() > Duration::from_secs(10) {
                    let _ = c.kill();
                    let _ = c.wait();
                    bail!("aliasnet-shaperd ignored SIGTERM for 10 s");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
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
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = fs::remove_dir_all(&self.paths.pin_root);
    }
}
