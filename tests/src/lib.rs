//! The aliasnet test fabric, used by every integration test and benchmark: network namespaces
//! this process creates and removes, topologies built from them, the daemons run inside them
//! and the CNI plugin invoked as a runtime does. Nothing here touches the root namespace's
//! routes, addresses, sysctls or qdiscs.
//!
//! - [`netns`]: a named namespace removed on drop, `ip` and commands inside it.
//! - [`fabric`]: the simulated VNet below (nodes running the real daemons, pods wired by the
//!   real plugin).
//! - [`single`]: one node with hand-wired pods, an internet host and an internal peer, and a
//!   private bpffs ([`bpffs`]): the datapath tests and the shaping benchmarks.
//! - [`family`]: what differs between IPv4 and IPv6, for tests written once for both.
//! - [`datapath`]: a node's pinned datapath as the tests read it (records, attachments).
//! - [`mountns`]: a private mount namespace for tiny tmpfs and bpffs mounts.
//! - [`ipamd`], [`shaperd`]: the daemons as child processes; [`cni`]: plugin invocations;
//!   [`traffic`]: iperf3 and ping; [`ctl`]: aliasnetctl; [`metrics`]: `/metrics`, promtool and Prometheus.
//! - [`etcd`]: a real 3-member etcd in its own namespace behind the VNet router; [`budget`]:
//!   simulated nodes running the cluster budget's engine against it.
//!
//! Every link of a node's uplink has [`test_mtu`] (9000 unless `ALIASNET_TEST_MTU` says
//! otherwise). Namespace names carry the process id and a counter ([`unique_tag`]), so
//! parallel tests and test binaries never collide.
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
//! a cloud fabric delivers alias IPs: no tunnel, pod addresses on the wire. Every link also
//! carries IPv6 (node `i`'s uplink `fd00:100:<i>::2/64`, its pod prefix `fd00:240:<i>::/112`
//! routed to it, the internet host `2001:db8::10` and `2001:db8:1::10`); whether pods get IPv6
//! addresses is the fabric's [`fabric::Stack`].
//!
//! Tests panic on failure (backtraces survive); helpers return `anyhow::Result` where the
//! caller wants to assert on failure.

pub mod bpffs;
pub mod budget;
pub mod cni;
pub mod ctl;
pub mod datapath;
pub mod etcd;
pub mod fabric;
pub mod family;
pub mod ipamd;
pub mod metrics;
pub mod mountns;
pub mod netns;
pub mod shaperd;
pub mod single;
pub mod traffic;

use std::{
    path::PathBuf,
    process::Child,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
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

/// A short tag unique within this machine for the lifetime of the process, for netns names
/// (the separator keeps pid 1234 tag 51 apart from pid 12345 tag 1).
pub fn unique_tag() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{}x{}", std::process::id() % 100_000, n)
}

/// MTU of the simulated uplinks: 9000 (AWS 9001, Azure 9000, GCP up to 8896), or
/// `ALIASNET_TEST_MTU`; the datapath suites also run at 1500 (tests/run.sh).
pub fn test_mtu() -> u32 {
    std::env::var("ALIASNET_TEST_MTU")
        .ok()
        .map(|v| v.parse().expect("ALIASNET_TEST_MTU is a number"))
        .unwrap_or(9000)
}

/// Privileged tests (namespaces, veths, bpffs and tmpfs mounts, BPF programs) call this
/// first: without root the test fails with this message instead of passing without having
/// run anything.
#[track_caller]
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: this test creates network namespaces and mounts (run tests/run.sh, or \
         cargo test as root)"
    );
}

/// Tests that drive a tool (promtool, iperf3, ...) call this first: without it the test fails
/// naming the Debian package (tests/setup.sh installs them all) instead of passing untested.
#[track_caller]
pub fn require_tool(name: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "needs {name}: apt-get install {package} (tests/setup.sh installs it)"
    );
}

/// Stops a child process (SIGTERM, then SIGKILL after 10 s) when dropped.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let start = Instant::now();
        while matches!(self.0.try_wait(), Ok(None)) {
            if start.elapsed() > Duration::from_secs(10) {
                let _ = self.0.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.wait();
    }
}
