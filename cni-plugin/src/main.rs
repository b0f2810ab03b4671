//! `aliasnet`: the CNI plugin binary (spec 1.1.0; configs 0.3.0 through 1.1.0).
//!
//! Parse (env, stdin) → dispatch to the verb → print exactly one JSON document (the result or
//! the error) → exit. Error codes are tabled in `aliasnet_cni_types::error`.
#![deny(clippy::print_stdout)]

mod add;
mod check;
mod datapath;
mod del;
mod gc;
mod ipam;
mod logging;
mod netns;
mod nl;
mod output;
mod status;
mod sysctl;

use std::io::Read;

use aliasnet_cni_types::{code, CniError, CniVersion, Command, Invocation, RawConf};
use anyhow::Result;
use serde_json::Value;

fn main() {
    output::install_panic_hook();
    let mut version = None;
    let exit = match run(&mut version) {
        Ok(doc) => output::success(doc),
        Err(e) => {
            tracing::error!("{e:#}");
            output::failure(version, &e)
        }
    };
    std::process::exit(exit);
}

/// Returns the document to print (none for a successful DEL, GC or STATUS). `version` is set
/// as soon as the config's version is known, so errors are reported in it.
fn run(version: &mut Option<CniVersion>) -> Result<Option<Value>> {
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
        ))
        .into());
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
fn version_cmd(stdin: &[u8]) -> Result<Value> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Ok(aliasnet_cni_types::version_info(None));
    }
    let v: Value = serde_json::from_slice(stdin)
        .map_err(|e| CniError::decode(format!("cannot decode VERSION input: {e}")))?;
    Ok(aliasnet_cni_types::version_info(
        v.get("cniVersion").and_then(Value::as_str),
    ))
}

/// The single-threaded runtime rtnetlink runs on; building it costs microseconds.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| {
            CniError::new(code::INTERNAL, format!("cannot start tokio runtime: {e}")).into()
        })
}
