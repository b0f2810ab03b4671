//! The only place that writes to stdout: exactly one JSON document per invocation (or none on
//! a successful DEL, GC or STATUS), then the exit code.

use std::{
    io::Write,
    sync::atomic::{AtomicBool, Ordering},
};

use aliasnet_cni_types::{CniError, CniVersion};
use serde_json::Value;

static EMITTED: AtomicBool = AtomicBool::new(false);

fn write_doc(doc: &Value) {
    if EMITTED.swap(true, Ordering::SeqCst) {
        return;
    }
    let mut buf = serde_json::to_vec(doc).expect("JSON value serialises");
    buf.push(b'\n');
    let mut out = std::io::stdout().lock();
    // Nothing sensible is left to do if the runtime closed our stdout.
    let _ = out.write_all(&buf).and_then(|()| out.flush());
}

/// Print a result (if any); exit code 0.
pub fn success(doc: Option<Value>) -> i32 {
    if let Some(d) = doc {
        write_doc(&d);
    }
    0
}

/// Print the error document for `err` in `version` (our newest when the config's is unknown);
/// exit code 1, as the Go skel does.
pub fn failure(version: Option<CniVersion>, err: &CniError) -> i32 {
    let v = version.unwrap_or(CniVersion::LATEST);
    write_doc(&err.to_json(v.as_str()));
    1
}

/// A panic still produces one error document (code 100) before the process dies.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let e = CniError::internal(format!("aliasnet panicked: {info}"));
        write_doc(&e.to_json(CniVersion::LATEST.as_str()));
        default(info);
    }));
}
