//! aliasnet-shaperd's modules: the node policy file, the Prometheus exporter and the cluster
//! budget's engine over the datapath. The
//! datapath itself (install, per-pod attach, HTB, netlink) is the `aliasnet-ebpf` library;
//! the daemon's reconcile loop is `main.rs`.

pub mod cluster;
pub mod metrics;
pub mod policy;

pub use policy::{Policy, PolicyError, DEFAULT_POLICY_PATH};
