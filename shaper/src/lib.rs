//! aliasnet's eBPF datapath control: loading and pinning (aliasnet-shaperd), node policy,
//! and the per-pod API the CNI plugin calls.
//!
//! The CNI plugin, in the node's network namespace with bpffs visible:
//!
//! ```no_run
//! use aliasnet_shaper::{Datapath, Limits, PodAttachment, PodIdentity, DEFAULT_PIN_ROOT};
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
//! // ... on DEL:
//! dp.detach_pod("1234abcd", "eth0")?;
//! # Ok(()) }
//! ```

mod datapath;
mod error;
pub mod limits;
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
pub use pods::{AttachedPod, PodAttachment, PodIdentity, PodRecord, ShapingStats};
pub use policy::{Cidr, Policy, PolicyError, DEFAULT_POLICY_PATH};
