//! Running a CNI plugin the way a runtime does: `CNI_*` environment, config on stdin, one
//! JSON document (result or error) on stdout.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::Value;

/// One plugin invocation.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub command: String,
    pub container_id: String,
    /// `None` leaves `CNI_NETNS` empty (DEL after the netns is gone).
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: String,
    pub path: String,
    /// Extra or overriding environment (`None` value = remove the variable).
    pub env: Vec<(String, Option<String>)>,
}

impl Invocation {
    pub fn new(command: &str, container_id: &str, netns: Option<&Path>, ifname: &str) -> Self {
        Self {
            command: command.to_owned(),
            container_id: container_id.to_owned(),
            netns: netns.map(Path::to_path_buf),
            ifname: ifname.to_owned(),
            args: String::new(),
            path: "/opt/cni/bin:/usr/lib/cni".to_owned(),
            env: Vec::new(),
        }
    }

    pub fn args(mut self, args: &str) -> Self {
        self.args = args.to_owned();
        self
    }

    pub fn env(mut self, k: &str, v: Option<&str>) -> Self {
        self.env.push((k.to_owned(), v.map(str::to_owned)));
        self
    }
}

/// What the plugin did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Outcome {
    /// stdout parsed as exactly one JSON document (`None` when stdout is empty).
    pub fn json(&self) -> Option<Value> {
        if self.stdout.trim().is_empty() {
            return None;
        }
        let mut it = serde_json::Deserializer::from_str(&self.stdout).into_iter::<Value>();
        let first = it
            .next()
            .unwrap_or_else(|| panic!("no JSON on stdout: {:?}", self.stdout))
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.stdout));
        assert!(
            it.next().is_none(),
            "stdout holds more than one JSON document: {:?}",
            self.stdout
        );
        Some(first)
    }

    pub fn ok(&self) -> bool {
        self.exit_code == 0
    }

    /// The CNI error code, when the plugin failed.
    pub fn error_code(&self) -> Option<u64> {
        if self.ok() {
            return None;
        }
        self.json().and_then(|v| v["code"].as_u64())
    }

    pub fn error_msg(&self) -> String {
        self.json()
            .and_then(|v| v["msg"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Panic with everything the plugin said unless it succeeded.
    #[track_caller]
    pub fn expect_ok(&self, what: &str) -> Option<Value> {
        assert!(
            self.ok(),
            "{what} failed (exit {}): stdout={} stderr={}",
            self.exit_code,
            self.stdout,
            self.stderr
        );
        self.json()
    }

    /// Panic unless the plugin failed with `code`.
    #[track_caller]
    pub fn expect_code(&self, code: u64, what: &str) {
        assert_eq!(
            self.error_code(),
            Some(code),
            "{what}: expected CNI error {code}, got exit {} stdout={} stderr={}",
            self.exit_code,
            self.stdout,
            self.stderr
        );
    }
}

/// Run `plugin` with `inv` and `stdin`. `runner` wraps the plugin (e.g. `nsenter --net=...`);
/// it is the command to which the plugin path is appended.
pub fn invoke(
    runner: Option<Command>,
    plugin: &Path,
    inv: &Invocation,
    stdin: &[u8],
) -> Result<Outcome> {
    let mut cmd = match runner {
        Some(mut r) => {
            r.arg(plugin);
            r
        }
        None => Command::new(plugin),
    };
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", &inv.command)
        .env("CNI_CONTAINERID", &inv.container_id)
        .env(
            "CNI_NETNS",
            inv.netns
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        )
        .env("CNI_IFNAME", &inv.ifname)
        .env("CNI_ARGS", &inv.args)
        .env("CNI_PATH", &inv.path);
    for (k, v) in &inv.env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(stdin)
        .context("writing plugin stdin")?;
    let out = child.wait_with_output().context("waiting for plugin")?;
    let elapsed = start.elapsed();
    Ok(Outcome {
        exit_code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed,
    })
}

/// The config one plugin of a conflist receives, as libcni builds it: the plugin's own
/// entry plus `cniVersion`, `name`, optional `prevResult` and the `runtimeConfig` keys the
/// plugin declared in `capabilities`.
pub fn plugin_config(
    conflist: &Value,
    index: usize,
    prev_result: Option<&Value>,
    runtime_config: Option<&Value>,
) -> Value {
    let plugins = conflist["plugins"]
        .as_array()
        .expect("conflist has plugins");
    let mut conf = plugins[index].clone();
    conf["cniVersion"] = conflist["cniVersion"].clone();
    conf["name"] = conflist["name"].clone();
    if let Some(prev) = prev_result {
        conf["prevResult"] = prev.clone();
    }
    if let (Some(rc), Some(caps)) = (runtime_config, conf["capabilities"].as_object().cloned()) {
        let mut filtered = serde_json::Map::new();
        for (k, on) in caps {
            if on.as_bool() == Some(true) {
                if let Some(v) = rc.get(&k) {
                    filtered.insert(k, v.clone());
                }
            }
        }
        if !filtered.is_empty() {
            conf["runtimeConfig"] = Value::Object(filtered);
        }
    }
    conf
}
