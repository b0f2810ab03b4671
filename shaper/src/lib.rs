//! aliasnet's eBPF datapath control: loading and pinning (aliasnet-shaperd), node policy,
//! and the per-pod API the CNI plugin calls.
//!
//! The CNI plugin, in the node's network namespace with bpffs visible:
//!
//! ```no_run
//! use aliasnet_shaper::{
//!     Datapath, Limits, PodAttachment, PodIdentity, Teardown, DEFAULT_PIN_ROOT,
//! };
//! # fn main() -> Result<(), aliasnet_shaper::ShaperError> {
//! let mut dp = Datapath::open(DEFAULT_PIN_ROOT)?; // fails with NotInitialised before shaperd ran once
//! dp.attach_pod(&PodAttachment {
//!     host_ifname: "veth1234abcd".into(),
//!     netns: "/var/run/netns/cni-1234".into(),
//!     identity: PodIdentity {
//!         namespace: "default".into(),
//!         name: "trainer-0".into(),
//!         container_id: "1234abcd".into(),
//!         ifname: "eth0".into(),
//!         ip: "10.20.0.5".parse().unwrap(),
//!     },
//!     limits: Limits::default(),
//! })?;
//! // ... on DEL, when the host veth is deleted right after (the pod's filters and qdiscs go
//! // with it; `detach_pod` removes them too, for a veth that stays):
//! dp.detach_pod_with("1234abcd", "eth0", Teardown::MapsOnly)?;
//! # Ok(()) }
//! ```
//!
//! Per-pod programs are cls_bpf filters (clsact), not TCX links: a TCX attach waits for an
//! RCU grace period under RTNL (~11 ms per link here); see [`clsact`].

pub mod clsact;
mod datapath;
mod error;
mod index;
pub mod limits;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod netns;
mod pods;
pub mod policy;
pub mod tc;

pub use aliasnet_ebpf::abi;
pub use datapath::{
    ensure_bpffs, resolve_uplink, Datapath, InstallReport, PinPaths, PolicyReport, DEFAULT_PIN_ROOT,
};
pub use error::{MultiError, ShaperError};
pub use limits::{CniBandwidth, LimitError, Limits, Shape};
pub use pods::{
    AttachedPod, HookState, PodAttachment, PodHooks, PodIdentity, PodRecord, ShapingStats, Teardown,
};
pub use policy::{Cidr, Policy, PolicyError, DEFAULT_POLICY_PATH};
