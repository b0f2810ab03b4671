//! The eBPF datapath as the tests see it on a fabric node: a one-node fabric whose plugin
//! takes limits from the runtime, the node's pinned records and attachments (maps are
//! readable from any netns), and the traffic counters expected of known pings.

use aliasnet_ebpf::{abi::Counter, Datapath, PodRecord};
use serde_json::json;

use crate::{
    fabric::{Fabric, FabricOpts, Node, Pod},
    netns::Netns,
};

/// The pod-annotations capability key of a runtimeConfig.
pub const ANNOTATIONS: &str = "io.kubernetes.cri.pod-annotations";
/// The pod annotation limiting a pod's internet egress.
pub const INTERNET_EGRESS: &str = "aliasnet.io/internet-egress-bandwidth";

impl Fabric {
    /// One node with node policy `policy`, whose plugin entry declares the bandwidth and
    /// pod-annotation capabilities, so runtimeConfig reaches the plugin.
    pub fn with_limits(policy: &str, cni_version: &str) -> Fabric {
        Fabric::new(FabricOpts {
            nodes: 1,
            shaper_policy: policy.into(),
            cni_version: cni_version.into(),
            plugin_extra: json!({"capabilities": {"bandwidth": true, ANNOTATIONS: true}}),
            ..Default::default()
        })
        .expect("build fabric")
    }
}

impl Node {
    /// The node's pinned datapath.
    pub fn datapath(&self) -> Datapath {
        Datapath::open(&self.shaper_paths.pin_root).expect("open the node's pinned datapath")
    }

    /// The datapath's record of `pod`; panics when the pod is not attached.
    pub fn record(&self, pod: &Pod) -> PodRecord {
        self.datapath()
            .pod(&pod.container_id, &pod.ifname)
            .expect("read the datapath")
            .unwrap_or_else(|| panic!("{} is not attached", pod.name))
    }

    /// Container ids of the pods attached to the datapath.
    pub fn attached(&self) -> Vec<String> {
        self.datapath()
            .pods()
            .expect("list attachments")
            .iter()
            .map(PodRecord::container_id)
            .collect()
    }

    /// Nothing of an attempted pod may remain: no link in its netns, no host veth, no lease,
    /// no datapath attachment.
    #[track_caller]
    pub fn assert_nothing_left(&self, pod_ns: &Netns, what: &str) {
        assert_eq!(pod_ns.link_names().unwrap(), ["lo"], "{what}: pod links");
        assert!(
            self.host_veths().is_empty(),
            "{what}: host veths {:?}",
            self.host_veths()
        );
        let leases = self.ipamd().leases();
        assert!(leases.is_empty(), "{what}: leases {leases:?}");
        assert!(
            self.attached().is_empty(),
            "{what}: attachments {:?}",
            self.attached()
        );
    }
}

/// `n` ICMP echoes of `size` data bytes as counted at L2: 14 + 20 + 8 + size each.
pub fn echoes(n: u64, size: u64) -> Counter {
    Counter {
        packets: n,
        bytes: n * (42 + size),
    }
}
