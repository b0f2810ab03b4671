//! Named network namespaces owned by a test, removed on drop.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use anyhow::{bail, Context, Result};

/// Run a command, failing with its stderr when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{:?} failed ({}): {}{}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(out)
}

/// `ip ARGS...` in the root mount namespace (the target netns is named with `-n`).
pub fn ip(args: &[&str]) -> Result<Output> {
    run(Command::new("ip").args(args))
}

/// `ip [-n NS] -batch -`: many `ip` commands (one a line) in one process, for topologies of
/// hundreds of namespaces.
pub fn ip_batch(ns: Option<&str>, lines: &str) -> Result<()> {
    use std::io::Write as _;
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("ip -batch")?;
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(lines.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("ip -batch: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A named netns (`/run/netns/NAME`) deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
    keep: bool,
}

impl Netns {
    /// Create the namespace and bring its loopback up.
    pub fn new(name: &str) -> Result<Self> {
        // A leftover from a crashed earlier run would make `add` fail.
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        ip(&["netns", "add", name])?;
        let ns = Self {
            name: name.to_owned(),
            keep: false,
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `/run/netns/NAME`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> Result<Output> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// `ip -j -n NAME ARGS...`, parsed.
    pub fn ip_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut full = vec!["-j", "-n", &self.name];
        full.extend_from_slice(args);
        let out = ip(&full)?;
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(serde_json::Value::Array(vec![]));
        }
        serde_json::from_slice(&out.stdout).context("parsing ip -j output")
    }

    /// A command that runs `prog` with only the network namespace switched (`nsenter --net`):
    /// unlike `ip netns exec` it keeps /sys and therefore bpffs visible.
    pub fn command(&self, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(prog);
        c
    }

    /// Run `prog args` in the namespace and return its output (success required).
    pub fn exec(&self, prog: &str, args: &[&str]) -> Result<Output> {
        run(self.command(prog).args(args))
    }

    /// Run `prog args` in the namespace, returning the output whatever the exit status.
    pub fn exec_status(&self, prog: &str, args: &[&str]) -> Result<Output> {
        self.command(prog)
            .args(args)
            .output()
            .with_context(|| format!("spawning {prog} in {}", self.name))
    }

    /// Runs `f` on a fresh thread inside the namespace (bpffs stays visible; sockets it opens
    /// stay in the namespace).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        Ok(aliasnet_netns::run_in(self.path(), f)?)
    }

    /// Read a sysctl as seen inside the namespace.
    pub fn sysctl(&self, key: &str) -> Result<String> {
        let out = self.exec("sysctl", &["-n", key])?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Leave the namespace in place after the test (debugging aid).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Names of all links in the namespace.
    pub fn link_names(&self) -> Result<Vec<String>> {
        let v = self.ip_json(&["link", "show"])?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The main-table IPv4 routes.
    pub fn routes(&self) -> Result<Vec<serde_json::Value>> {
        let v = self.ip_json(&["-4", "route", "show", "table", "main"])?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// The main-table IPv6 routes.
    pub fn routes6(&self) -> Result<Vec<serde_json::Value>> {
        let v = self.ip_json(&["-6", "route", "show", "table", "main"])?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.keep {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .output();
        }
    }
}
