//! `aliasnetctl` run against a fabric node, inside the node's netns (`nsenter --net`, bpffs
//! stays visible) as on a real node, and its output read back.

use std::process::{Command, Output};

use serde_json::Value;

use crate::fabric::Node;

/// `aliasnetctl` in the node's netns, pointed at this node's socket and pins.
pub fn ctl_cmd(node: &Node, args: &[&str]) -> Command {
    let mut c = node.ns.command(crate::bin("aliasnetctl"));
    c.arg("--socket")
        .arg(&node.ipamd_paths.socket)
        .arg("--pin-root")
        .arg(&node.shaper_paths.pin_root)
        .args(args)
        .env("RUST_BACKTRACE", "1");
    c
}

/// Runs `aliasnetctl args` in the node's netns.
pub fn ctl(node: &Node, args: &[&str]) -> Output {
    ctl_cmd(node, args).output().expect("run aliasnetctl")
}

/// A command's stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs and parses `--json` output, asserting the exit code.
#[track_caller]
pub fn ctl_json(node: &Node, args: &[&str], code: i32) -> Value {
    let mut full = args.to_vec();
    full.push("--json");
    let o = ctl(node, &full);
    assert_eq!(
        o.status.code(),
        Some(code),
        "aliasnetctl {args:?}: stdout={} stderr={}",
        stdout(&o),
        stderr(&o)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "aliasnetctl {args:?} --json is not JSON ({e}): {}",
            stdout(&o)
        )
    })
}

/// No panic, no raw OS error, no backtrace: a sentence for the operator.
#[track_caller]
pub fn assert_clean_error(o: &Output, want: &str) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "stderr={err} stdout={}",
        stdout(o)
    );
    assert!(err.contains(want), "stderr lacks {want:?}: {err}");
    for bad in ["panicked", "os error", "RUST_BACKTRACE", "stack backtrace"] {
        assert!(!err.contains(bad), "stderr shows {bad:?}: {err}");
    }
}

/// The entry of pod `name` in a `pods --json` array.
pub fn by_pod<'a>(pods: &'a Value, name: &str) -> &'a Value {
    pods.as_array()
        .expect("pods array")
        .iter()
        .find(|p| p["pod"] == name)
        .unwrap_or_else(|| panic!("pod {name} not in {pods}"))
}

/// The kernel's answer on fq, from its config when the kernel exposes it.
pub fn kernel_has_fq() -> Option<bool> {
    let out = Command::new("sh")
        .args([
            "-c",
            "zcat /proc/config.gz 2>/dev/null | grep -E 'CONFIG_NET_SCH_FQ(=| is not set)'",
        ])
        .output()
        .ok()?;
    let t = String::from_utf8_lossy(&out.stdout);
    if t.contains("CONFIG_NET_SCH_FQ=y") || t.contains("CONFIG_NET_SCH_FQ=m") {
        Some(true)
    } else if t.contains("# CONFIG_NET_SCH_FQ is not set") {
        Some(false)
    } else {
        None
    }
}

/// Runs `fix` in the node's netns with aliasnetctl on the PATH.
pub fn apply_fix(node: &Node, fix: &str) {
    let path = format!(
        "{}:{}",
        crate::bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = node
        .ns
        .command("sh")
        .args(["-c", fix])
        .env("PATH", path)
        .output()
        .expect("sh");
    assert!(
        o.status.success(),
        "fix {fix:?} failed: {}{}",
        stdout(&o),
        stderr(&o)
    );
}

/// The findings of a `doctor --json` report.
pub fn findings(report: &Value) -> Vec<Value> {
    report["findings"].as_array().cloned().unwrap_or_default()
}
