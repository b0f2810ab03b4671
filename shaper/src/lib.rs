//! aliasnet-shaperd's modules: the node policy file and the Prometheus exporter. The
//! datapath itself (install, per-pod attach, HTB, netlink) is the `aliasnet-ebpf` library;
//! the daemon's reconcile loop is `main.rs`.

pub mod metrics;
pub mod policy;

pub use policy::{Policy, PolicyError, DEFAULT_POLICY_PATH};
