//! The aliasnet test fabric: simulated cloud VNet, nodes, pods and an "internet", all in
//! network namespaces this process creates and removes. Nothing here touches the root
//! namespace's routes, addresses, sysctls or qdiscs.
//!
//! ```text
//!                 internet netns (203.0.113.10, 198.51.100.10)
//!                        | 203.0.113.0/24
//!   node1 netns ---- vnet netns (router) ---- node2 netns
//!   10.100.0.11   10.100.0.0/24, MTU 9000     10.100.0.12
//!   pods 10.240.1.0/24                        pods 10.240.2.0/24
//! ```
//!
//! The vnet router routes each node's secondary range to that node's uplink address, the way
//! a cloud fabric delivers alias IPs: no tunnel, pod addresses on the wire.
//!
//! Tests panic on failure (backtraces survive); helpers return `anyhow::Result` where the
//! caller wants to assert on failure.

pub mod cni;
pub mod fabric;
pub mod ipamd;
pub mod netns;
pub mod shaperd;

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

/// Directory holding the built binaries (`aliasnet`, `aliasnet-ipamd`, ...).
///
/// `ALIASNET_BIN_DIR` wins; otherwise the profile directory this test binary was built into
/// (`target/<profile>/deps/..`).
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ALIASNET_BIN_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of one built binary; panics with a hint when it has not been built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} not built; run `cargo build --release --workspace --bins` (or set ALIASNET_BIN_DIR)",
        p.display()
    );
    p
}

/// A short tag unique within this machine for the lifetime of the process, for netns names.
pub fn unique_tag() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{}{}", std::process::id() % 100_000, n)
}

/// Tests in this crate need root (namespaces, veths). Under CI a non-root run is a failure,
/// elsewhere the test is skipped with a message.
pub fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "integration tests must run as root in CI"
    );
    eprintln!("skipping: needs root");
    false
}
