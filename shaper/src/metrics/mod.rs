//! Prometheus exposition of the datapath, read from the pinned maps at scrape time.
//!
//! Every scrape renders from a fresh [`Snapshot`] of the maps: there is no registry of
//! per-pod metric objects that could go stale, so the series of a detached pod disappear
//! with it. Series (per pod, `--aggregate pod`):
//!
//! | name | labels | type |
//! |---|---|---|
//! | `aliasnet_pod_bytes_total` | namespace, pod, direction, class | counter |
//! | `aliasnet_pod_packets_total` | namespace, pod, direction, class | counter |
//! | `aliasnet_pod_drops_total` | namespace, pod, direction, reason | counter |
//! | `aliasnet_pod_tcp_connections_refused_total` | namespace, pod | counter |
//! | `aliasnet_pod_tcp_connections_relearnt_total` | namespace, pod | counter |
//! | `aliasnet_pod_bandwidth_limit_bytes_per_second` | namespace, pod, direction, class | gauge |
//! | `aliasnet_namespace_bandwidth_limit_bytes_per_second` | namespace, direction, class | gauge |
//! | `aliasnet_node_bandwidth_limit_bytes_per_second` | direction, class | gauge |
//! | `aliasnet_node_bytes_total` | direction, class | counter |
//! | `aliasnet_node_packets_total` | direction, class | counter |
//! | `aliasnet_datapath_pods` | | gauge |
//! | `aliasnet_datapath_tcp_connections` | | gauge |
//! | `aliasnet_datapath_tcp_connection_share` | | gauge |
//! | `aliasnet_build_info` | component, version | gauge |
//! | `aliasnet_datapath_backend_info` | backend | gauge |
//!
//! `direction` is seen from the pod (egress = sent by the pod); `class` of the counters is
//! internal, blocked, a named class's name, or internet for the internet in no named class
//! (the node totals also carry `other`: ARP, neighbour discovery, malformed IP), so the
//! classes partition the traffic; `class` of a limit is all, internet (named classes
//! included) or a named class's name. Bytes are L2 frame
//! bytes on the host veth. `reason` is `blocked` (dropped by policy in the classifier),
//! `spoofed` (egress only: sent from an address not the pod's, dropped on the host veth),
//! `policed` (egress only: above the pod's egress limits, dropped on the host veth, which
//! happens only when the pod removed its own shaping), `nd` and `gateway` (egress only:
//! link-scoped IPv6 above its budget, other IPv6 to the node's link-scoped addresses) or
//! `rate` (dropped by the pod's shaping queue; read by [`Exporter::sample`], every 5 s in
//! shaperd, because it takes a netns switch per pod). With `--aggregate namespace` the per-pod
//! families carry `namespace` instead of `namespace, pod`, and the per-pod limit gauges and
//! connection counters are left out.
//!
//! Counter continuity: per-pod counters are the kernel's, from the pod's attach. The node
//! and namespace totals are sums over pods, so a detached pod would make them fall; the
//! [`Ledger`] keeps what detached pods had counted (as last sampled) and starts the totals at
//! zero when the exporter starts, so they only grow for the exporter's lifetime.
//!
//! The HTTP endpoint is `aliasnet_serve::metrics` (shared with ipamd).

pub mod budget;
mod ledger;
mod render;
mod snapshot;

use std::{fmt, path::PathBuf, str::FromStr};

use aliasnet_ebpf::{abi::Class, Datapath, DatapathError};

pub use ledger::Ledger;
pub use snapshot::{PodLimits, PodSample, Snapshot};

/// `Content-Type` of what [`Exporter::render`] returns (Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The datapath backend reported by `aliasnet_datapath_backend_info`: classification in
/// tc programs, shaping by HTB classes the programs select (no EDT, which needs sch_fq).
pub const BACKEND: &str = "htb";

/// The classes exported per pod. `other` (ARP, IPv6) is only in the node totals: it is a
/// handful of packets per pod and would add a third of the per-pod series.
const POD_CLASSES: [Class; 3] = [Class::Internal, Class::Internet, Class::Blocked];

/// Granularity of the per-pod families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// One series set per pod.
    #[default]
    Pod,
    /// Pods summed per Kubernetes namespace (cardinality control for large clusters).
    Namespace,
}

impl FromStr for Aggregation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pod" | "none" => Ok(Self::Pod),
            "namespace" => Ok(Self::Namespace),
            other => Err(format!(
                "unknown aggregation {other:?}: expected \"pod\" or \"namespace\""
            )),
        }
    }
}

impl fmt::Display for Aggregation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pod => "pod",
            Self::Namespace => "namespace",
        })
    }
}

/// What the exporter renders besides the maps.
#[derive(Debug, Clone)]
pub struct ExporterOptions {
    pub aggregation: Aggregation,
    /// `aliasnet_build_info{component="shaperd",version}`.
    pub version: String,
    /// Read the shaping queues' drop counters in [`Exporter::sample`] (netlink, one netns
    /// switch per pod with an egress limit: ~20-30 µs each, so not on the scrape path).
    pub qdisc_stats: bool,
}

impl Default for ExporterOptions {
    fn default() -> Self {
        Self {
            aggregation: Aggregation::Pod,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            qdisc_stats: true,
        }
    }
}

/// The scrape handler's state: its own handles on the pinned maps plus the [`Ledger`].
pub struct Exporter {
    dp: Datapath,
    opts: ExporterOptions,
    ledger: Ledger,
    /// The cluster budget engine's state, when it runs ([`budget`]'s families).
    budget: Option<tokio::sync::watch::Receiver<aliasnet_budget::Status>>,
}

impl Exporter {
    pub fn new(dp: Datapath, opts: ExporterOptions) -> Self {
        Self {
            dp,
            opts,
            ledger: Ledger::default(),
            budget: None,
        }
    }

    /// Exports the cluster budget's families from the engine's status (`None`: no engine).
    pub fn set_budget(
        &mut self,
        status: Option<tokio::sync::watch::Receiver<aliasnet_budget::Status>>,
    ) {
        self.budget = status;
    }

    /// Opens the pins under `root` (as left by `aliasnet-shaperd`).
    pub fn open(root: impl Into<PathBuf>, opts: ExporterOptions) -> Result<Self, DatapathError> {
        Ok(Self::new(Datapath::open(root)?, opts))
    }

    /// Samples the maps, and the shaping queues' drops, into the ledger without rendering:
    /// the totals keep what a short-lived pod counted even if no scrape saw it, and scrapes
    /// export the drops of the last sample. Call every few seconds.
    pub fn sample(&mut self) -> Result<(), DatapathError> {
        let snap = Snapshot::read(&self.dp, self.opts.qdisc_stats)?;
        self.ledger.observe(&snap);
        Ok(())
    }

    /// One scrape: the maps read now, rendered in the Prometheus text format (rate drops as
    /// of the last [`Exporter::sample`]). All reads happen before anything is written, so an
    /// error yields no partial exposition.
    pub fn render(&mut self) -> Result<String, DatapathError> {
        let snap = Snapshot::read(&self.dp, false)?;
        let drops = self.ledger.observe(&snap);
        let budget = self
            .budget
            .as_ref()
            .map(|s| budget::BudgetFamilies(s.borrow().clone()));
        Ok(render::render(
            &snap,
            &drops,
            &self.ledger,
            &self.opts,
            budget,
        ))
    }
}

/// Fails unless `promtool check metrics` accepts `text` (the Prometheus server's own linter).
#[cfg(test)]
pub(crate) fn promtool_check(text: &str) {
    let (code, out) = aliasnet_tests::metrics::promtool_check_metrics(text);
    assert_eq!(code, 0, "promtool check metrics: {out}\n{text}");
}
