//! `aliasnet`: the CNI plugin binary (spec 1.1.0; configs 0.3.0 through 1.1.0).
//!
//! Parse (env, stdin) → dispatch to the verb → print exactly one JSON document (the result or
//! the error) → exit. Every failure is a [`CniError`] (code, message, details) from the step
//! that knows what went wrong; error codes are tabled in `aliasnet_cni_types::error`.
#![deny(clippy::print_stdout)]

mod add;
mod attachment;
mod check;
mod del;
mod gc;
mod ipam;
mod logging;
mod output;
mod plan;
mod pod_netns;
mod status;
mod sysctl;
mod veth;

use std::io::Read;

use aliasnet_cni_types::{code, CniError, CniVersion, Command, Invocation, RawConf};
use serde_json::Value;

/// What is known about the invocation by the time it ends, for error reporting and metrics.
#[derive(Default)]
struct Ctx {
    /// The config's version, as soon as it is known, so errors are reported in it.
    version: Option<CniVersion>,
    /// Verb and daemon socket, once the config validated: where the operation is recorded.
    record: Option<(Command, std::path::PathBuf)>,
}

fn main() {
    output::install_panic_hook();
    let start = std::time::Instant::now();
    let mut ctx = Ctx::default();
    let (exit, cni_code) = match run(&mut ctx) {
        Ok(doc) => (output::success(doc), 0),
        Err(e) => {
            tracing::error!("{e}");
            (output::failure(ctx.version, &e), e.code)
        }
    };
    if let Some((cmd, socket)) = ctx.record {
        // The plugin lives for one call, so the daemon keeps its metrics (count and latency per
        // verb and code). After the answer is printed, sent without waiting for the daemon's
        // reply; a short timeout and no error: metrics never fail or hold up a pod.
        if let Err(e) = aliasnet_ipam_proto::client::send_op_record(
            &socket,
            cmd.as_str(),
            cni_code,
            start.elapsed(),
            std::time::Duration::from_millis(100),
        ) {
            tracing::debug!("operation not recorded in the daemon's metrics: {e}");
        }
    }
    std::process::exit(exit);
}

/// Returns the document to print (none for a successful DEL, GC or STATUS).
fn run(ctx: &mut Ctx) -> Result<Option<Value>, CniError> {
    let version = &mut ctx.version;
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    let raw = RawConf::decode(&stdin);
    if let Ok(r) = &raw {
        *version = Some(r.version);
    }
    let inv = Invocation::from_lookup(|k| std::env::var(k).ok())?;
    read.map_err(|e| CniError::new(code::IO, format!("cannot read stdin: {e}")))?;
    if inv == Invocation::Version {
        return version_cmd(&stdin).map(Some);
    }
    let conf = raw?.validate()?;
    logging::init(&conf);
    let cmd = inv.command();
    ctx.record = Some((cmd, conf.ipam_socket.clone()));
    let needs = match cmd {
        Command::Check if !conf.cni_version.has_check() => Some("0.4.0"),
        Command::Gc | Command::Status if !conf.cni_version.has_gc_and_status() => Some("1.1.0"),
        _ => None,
    };
    if let Some(min) = needs {
        return Err(CniError::version(format!(
            "{} needs cniVersion {min} or later; the config says {}",
            cmd.as_str(),
            conf.cni_version
        )));
    }
    match inv {
        Invocation::Add(env) => {
            let _s = tracing::info_span!("ADD", net = %conf.name, cid = %env.container_id, ifname = %env.ifname).entered();
            add::run(&conf, &env).map(Some)
        }
        Invocation::Del(env) => {
            let _s = tracing::info_span!("DEL", net = %conf.name, cid = %env.container_id, ifname = %env.ifname).entered();
            del::run(&conf, &env).map(|()| None)
        }
        Invocation::Check(env) => {
            let _s = tracing::info_span!("CHECK", net = %conf.name, cid = %env.container_id, ifname = %env.ifname).entered();
            check::run(&conf, &env).map(|()| None)
        }
        Invocation::Gc => {
            let _s = tracing::info_span!("GC", net = %conf.name).entered();
            gc::run(&conf).map(|()| None)
        }
        Invocation::Status => {
            let _s = tracing::info_span!("STATUS", net = %conf.name).entered();
            status::run(&conf).map(|()| None)
        }
        Invocation::Version => unreachable!("handled above"),
    }
}

/// VERSION must answer fast and never depend on anything but stdin (podman calls it with
/// `dummy` everywhere). Empty stdin is allowed.
fn version_cmd(stdin: &[u8]) -> Result<Value, CniError> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Ok(aliasnet_cni_types::version_info(None));
    }
    let v: Value = serde_json::from_slice(stdin)
        .map_err(|e| CniError::decode(format!("cannot decode VERSION input: {e}")))?;
    Ok(aliasnet_cni_types::version_info(
        v.get("cniVersion").and_then(Value::as_str),
    ))
}
