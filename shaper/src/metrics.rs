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
//! | `aliasnet_pod_bandwidth_limit_bytes_per_second` | namespace, pod, direction, class | gauge |
//! | `aliasnet_node_bytes_total` | direction, class | counter |
//! | `aliasnet_node_packets_total` | direction, class | counter |
//! | `aliasnet_datapath_pods` | | gauge |
//! | `aliasnet_build_info` | component, version | gauge |
//! | `aliasnet_datapath_backend_info` | backend | gauge |
//!
//! `direction` is seen from the pod (egress = sent by the pod); `class` is internal, internet
//! or blocked (the node totals also carry `other`: ARP and non-IPv4). Bytes are L2 frame
//! bytes on the host veth. `reason` is `blocked` (dropped by policy in the classifier) or
//! `rate` (dropped by the pod's shaping queue; read by [`Exporter::sample`], every 5 s in
//! shaperd, because it takes a netns switch per pod). With `--aggregate namespace` the per-pod
//! families carry `namespace` instead of `namespace, pod`, and the limit gauges are left out.
//!
//! Counter continuity: per-pod counters are the kernel's, from the pod's attach. The node
//! and namespace totals are sums over pods, so a detached pod would make them fall; the
//! [`Ledger`] keeps what detached pods had counted (as last sampled) and starts the totals at
//! zero when the exporter starts, so they only grow for the exporter's lifetime.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    fs::File,
    os::fd::AsFd,
    path::PathBuf,
    str::FromStr,
};

use aliasnet_ebpf::{
    abi::{self, Class, Direction, PodCounters},
    maps,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};

#[cfg(feature = "daemon")]
pub mod http;

use crate::{
    datapath::Datapath,
    error::ShaperError,
    tc::{Rtnl, TcStats},
};

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

/// Configured limits of a pod in bit/s (`None` = unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodLimits {
    /// All traffic to the pod (host veth).
    pub ingress: Option<u64>,
    /// All traffic from the pod (pod eth0).
    pub egress: Option<u64>,
    /// Internet-bound traffic from the pod (pod eth0).
    pub internet_egress: Option<u64>,
}

impl PodLimits {
    fn of(meta: &abi::PodMeta) -> Self {
        let nz = |v: u64| (v != 0).then_some(v);
        Self {
            ingress: nz(meta.ingress_rate),
            egress: nz(meta.egress_rate),
            internet_egress: nz(meta.internet_egress_rate),
        }
    }

    /// Whether packets of `dir` pass a shaping queue (and can be dropped by it).
    pub fn shaped(&self, dir: Direction) -> bool {
        match dir {
            Direction::Ingress => self.ingress.is_some(),
            Direction::Egress => self.egress.is_some() || self.internet_egress.is_some(),
        }
    }
}

/// One attached pod as read at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSample {
    pub slot: u32,
    /// With `slot`, identifies one attachment: a re-ADD in the same slot is a new pod.
    pub attached_unix_ns: u64,
    pub namespace: String,
    /// The pod name, or the container ID when the runtime passed no `K8S_POD_NAME`.
    pub pod: String,
    pub ip: std::net::Ipv4Addr,
    pub host_ifindex: u32,
    pub pod_ifindex: u32,
    pub netns: PathBuf,
    pub counters: PodCounters,
    pub limits: PodLimits,
    /// Packets dropped by the shaping queue, per direction index; `None` where the pod is not
    /// shaped or its queue could not be read this time.
    pub rate_drops: [Option<u64>; abi::NR_DIRS],
}

impl PodSample {
    fn key(&self) -> (u32, u64) {
        (self.slot, self.attached_unix_ns)
    }
}

/// Every attached pod, read consistently pod by pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub pods: Vec<PodSample>,
}

/// Same attachment in both reads: the identity did not change while counters were read.
fn same_attachment(a: &abi::PodMeta, b: &abi::PodMeta) -> bool {
    b.flags & abi::META_IN_USE != 0
        && a.attached_unix_ns == b.attached_unix_ns
        && a.container_id == b.container_id
        && a.ifname == b.ifname
}

impl Snapshot {
    /// Reads the maps. A pod attached or detached during the read is either complete in the
    /// snapshot or absent (its metadata is read before and after its counters and must
    /// match), never mixed with another pod's counters. With `qdiscs`, the shaping queues'
    /// drop counters are read too (one netns switch per pod with egress limits).
    pub fn read(dp: &Datapath, qdiscs: bool) -> Result<Self, ShaperError> {
        let mut pods = Vec::new();
        for slot in 0..abi::MAX_PODS {
            let meta = dp
                .meta
                .get(&slot, 0)
                .map_err(|e| ShaperError::map(maps::POD_META, e))?;
            if meta.flags & abi::META_IN_USE == 0 {
                continue;
            }
            let counters = dp.counters_of(slot)?;
            let after = dp
                .meta
                .get(&slot, 0)
                .map_err(|e| ShaperError::map(maps::POD_META, e))?;
            if !same_attachment(&meta, &after) {
                continue;
            }
            let name = abi::cstr(&after.k8s_name);
            pods.push(PodSample {
                slot,
                attached_unix_ns: after.attached_unix_ns,
                namespace: abi::cstr(&after.k8s_namespace),
                pod: if name.is_empty() {
                    abi::cstr(&after.container_id)
                } else {
                    name
                },
                ip: std::net::Ipv4Addr::from(after.ipv4),
                host_ifindex: after.host_ifindex,
                pod_ifindex: after.pod_ifindex,
                netns: PathBuf::from(abi::cstr(&after.netns)),
                counters,
                limits: PodLimits::of(&after),
                rate_drops: [None; abi::NR_DIRS],
            });
        }
        let mut snap = Self { pods };
        if qdiscs {
            snap.read_rate_drops();
        }
        Ok(snap)
    }

    /// Fills `rate_drops` from the HTB classes of the pods' limits: a class counts the
    /// packets its leaf queue refused, and, unlike qdiscs, classes are dumped per device (a
    /// qdisc dump walks every device of the namespace, quadratic over a node's veths).
    /// Failures (a pod netns or veth that just went away) leave `None`: the exporter then
    /// repeats the last value.
    fn read_rate_drops(&mut self) {
        // Egress classes live in the pods' netns: worker threads visit them in turn (setns
        // affects only the worker, which exits afterwards), while this thread reads the
        // ingress classes of the node's netns.
        let wanted: Vec<(usize, PathBuf, u32)> = self
            .pods
            .iter()
            .enumerate()
            .filter(|(_, p)| p.limits.shaped(Direction::Egress) && p.pod_ifindex != 0)
            .map(|(i, p)| (i, p.netns.clone(), p.pod_ifindex))
            .collect();
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_NETNS_WORKERS);
        let chunk = wanted.len().div_ceil(workers).max(1);
        let pods = &mut self.pods;
        let found: Vec<(usize, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = wanted
                .chunks(chunk)
                .map(|part| s.spawn(move || egress_class_drops(part)))
                .collect();
            if pods.iter().any(|p| p.limits.shaped(Direction::Ingress)) {
                if let Ok(mut rt) = Rtnl::new() {
                    for p in pods.iter_mut() {
                        if p.limits.shaped(Direction::Ingress) {
                            p.rate_drops[Direction::Ingress.index()] = rt
                                .class_stats(p.host_ifindex)
                                .ok()
                                .map(|c| class_drops(&c, &[abi::CLASSID_POD_INGRESS]));
                        }
                    }
                }
            }
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
        for (i, drops) in found {
            self.pods[i].rate_drops[Direction::Egress.index()] = Some(drops);
        }
    }
}

/// Threads reading pods' egress classes in parallel during a scrape.
const MAX_NETNS_WORKERS: usize = 4;

/// Packets the listed shaped classes dropped (HTB counts drops on the leaves).
fn class_drops(stats: &[TcStats], classes: &[u32]) -> u64 {
    classes
        .iter()
        .flat_map(|c| [c + abi::LEAF_SPARSE, c + abi::LEAF_BULK])
        .filter_map(|c| stats.iter().find(|s| s.handle == c))
        .map(|s| s.drops)
        .sum()
}

/// Runs on its own thread: enters each pod's netns and reads its egress classes' drops.
fn egress_class_drops(pods: &[(usize, PathBuf, u32)]) -> Vec<(usize, u64)> {
    let mut out = Vec::with_capacity(pods.len());
    for (i, path, ifindex) in pods {
        let Ok(ns) = File::open(path) else { continue };
        if nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
            continue;
        }
        // The socket binds to the namespace current at creation.
        let Ok(mut rt) = Rtnl::new() else { continue };
        if let Ok(c) = rt.class_stats(*ifindex) {
            out.push((
                *i,
                class_drops(&c, &[abi::CLASSID_POD_INTERNET, abi::CLASSID_POD_OTHER]),
            ));
        }
    }
    out
}

fn wrapping_sub(a: &mut PodCounters, b: &PodCounters) {
    for (x, y) in a.dir.iter_mut().flatten().zip(b.dir.iter().flatten()) {
        x.packets = x.packets.wrapping_sub(y.packets);
        x.bytes = x.bytes.wrapping_sub(y.bytes);
    }
}

/// Counters plus rate drops: what the namespace and node totals add up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    counters: PodCounters,
    rate_drops: [u64; abi::NR_DIRS],
}

impl Totals {
    fn add(&mut self, c: &PodCounters, drops: &[u64; abi::NR_DIRS]) {
        self.counters += *c;
        for (a, b) in self.rate_drops.iter_mut().zip(drops) {
            *a = a.wrapping_add(*b);
        }
    }
    fn sub(&mut self, c: &PodCounters, drops: &[u64; abi::NR_DIRS]) {
        wrapping_sub(&mut self.counters, c);
        for (a, b) in self.rate_drops.iter_mut().zip(drops) {
            *a = a.wrapping_sub(*b);
        }
    }
}

#[derive(Debug, Clone)]
struct Seen {
    namespace: String,
    counters: PodCounters,
    rate_drops: [u64; abi::NR_DIRS],
}

/// Keeps node and namespace totals monotonic across pod churn (see the module docs).
///
/// Offsets are applied with wrapping arithmetic: `total = live + offset (mod 2^64)`, where
/// `offset` = counted by detached pods − what live pods had counted at the first sample.
#[derive(Debug, Default)]
pub struct Ledger {
    started: bool,
    seen: HashMap<(u32, u64), Seen>,
    node: Totals,
    namespaces: HashMap<String, Totals>,
}

impl Ledger {
    /// Folds a snapshot in and returns the rate drops to export per pod (index-aligned with
    /// `snap.pods`): the value read, else the last value read for that attachment, else 0.
    pub fn observe(&mut self, snap: &Snapshot) -> Vec<[u64; abi::NR_DIRS]> {
        let drops: Vec<[u64; abi::NR_DIRS]> = snap
            .pods
            .iter()
            .map(|p| {
                let last = self.seen.get(&p.key()).map(|s| s.rate_drops);
                let mut d = [0; abi::NR_DIRS];
                for (i, v) in d.iter_mut().enumerate() {
                    *v = p.rate_drops[i].or(last.map(|l| l[i])).unwrap_or(0);
                }
                d
            })
            .collect();
        if !self.started {
            self.started = true;
            for (p, d) in snap.pods.iter().zip(&drops) {
                self.node.sub(&p.counters, d);
                self.namespaces
                    .entry(p.namespace.clone())
                    .or_default()
                    .sub(&p.counters, d);
            }
        } else {
            let live: HashSet<(u32, u64)> = snap.pods.iter().map(PodSample::key).collect();
            let gone: Vec<(u32, u64)> = self
                .seen
                .keys()
                .filter(|k| !live.contains(k))
                .copied()
                .collect();
            for k in gone {
                if let Some(s) = self.seen.remove(&k) {
                    self.node.add(&s.counters, &s.rate_drops);
                    self.namespaces
                        .entry(s.namespace)
                        .or_default()
                        .add(&s.counters, &s.rate_drops);
                }
            }
        }
        self.seen.clear();
        for (p, d) in snap.pods.iter().zip(&drops) {
            self.seen.insert(
                p.key(),
                Seen {
                    namespace: p.namespace.clone(),
                    counters: p.counters,
                    rate_drops: *d,
                },
            );
        }
        // A namespace without pods has no series; its next pod starts a fresh one.
        let live_ns: HashSet<&str> = snap.pods.iter().map(|p| p.namespace.as_str()).collect();
        self.namespaces
            .retain(|ns, _| live_ns.contains(ns.as_str()));
        drops
    }

    fn node_offset(&self) -> &Totals {
        &self.node
    }

    fn namespace_offset(&self, ns: &str) -> Totals {
        self.namespaces.get(ns).copied().unwrap_or_default()
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
}

impl Exporter {
    pub fn new(dp: Datapath, opts: ExporterOptions) -> Self {
        Self {
            dp,
            opts,
            ledger: Ledger::default(),
        }
    }

    /// Opens the pins under `root` (as left by `aliasnet-shaperd`).
    pub fn open(root: impl Into<PathBuf>, opts: ExporterOptions) -> Result<Self, ShaperError> {
        Ok(Self::new(Datapath::open(root)?, opts))
    }

    /// Samples the maps, and the shaping queues' drops, into the ledger without rendering:
    /// the totals keep what a short-lived pod counted even if no scrape saw it, and scrapes
    /// export the drops of the last sample. Call every few seconds.
    pub fn sample(&mut self) -> Result<(), ShaperError> {
        let snap = Snapshot::read(&self.dp, self.opts.qdisc_stats)?;
        self.ledger.observe(&snap);
        Ok(())
    }

    /// One scrape: the maps read now, rendered in the Prometheus text format (rate drops as
    /// of the last [`Exporter::sample`]). All reads happen before anything is written, so an
    /// error yields no partial exposition.
    pub fn render(&mut self) -> Result<String, ShaperError> {
        let snap = Snapshot::read(&self.dp, false)?;
        let drops = self.ledger.observe(&snap);
        Ok(render(&snap, &drops, &self.ledger, &self.opts))
    }
}

/// One label set of the per-pod families: a pod, or a namespace when aggregated.
#[derive(Debug, Default)]
struct Group {
    namespace: String,
    /// `None` when aggregated per namespace.
    pod: Option<String>,
    totals: Totals,
    /// Limits of the group's most recent attachment: `(attached_unix_ns, limits)`.
    limits: (u64, PodLimits),
}

impl Group {
    /// `namespace[, pod], k1=v1, k2=v2` without allocating.
    fn labels<'a>(
        &'a self,
        k1: &'static str,
        v1: &'a str,
        k2: &'static str,
        v2: &'a str,
    ) -> ([(&'a str, &'a str); 4], usize) {
        match &self.pod {
            Some(pod) => (
                [
                    ("namespace", &self.namespace),
                    ("pod", pod),
                    (k1, v1),
                    (k2, v2),
                ],
                4,
            ),
            None => (
                [("namespace", &self.namespace), (k1, v1), (k2, v2), ("", "")],
                3,
            ),
        }
    }
}

/// Everything one scrape encodes.
#[derive(Debug, Default)]
struct Families {
    groups: Vec<Group>,
    /// Per-pod limits are exported (not when aggregated).
    limits: bool,
    node: PodCounters,
    pods: u64,
    version: String,
}

impl Families {
    fn counter(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        value: impl Fn(&Group, Direction, Class) -> u64,
    ) -> Result<(), fmt::Error> {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        for g in &self.groups {
            for dir in Direction::ALL {
                for class in POD_CLASSES {
                    let (l, n) = g.labels("direction", dir.name(), "class", class.name());
                    ConstCounter::new(value(g, dir, class)).encode(m.encode_family(&&l[..n])?)?;
                }
            }
        }
        Ok(())
    }
}

impl Collector for Families {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        self.counter(
            &mut enc,
            "aliasnet_pod_bytes",
            "Bytes the pod sent (direction=egress) or received (direction=ingress) by traffic class, as L2 frames on its host veth; blocked traffic is counted, then dropped.",
            |g, d, c| g.totals.counters.get(d, c).bytes,
        )?;
        self.counter(
            &mut enc,
            "aliasnet_pod_packets",
            "Packets the pod sent (direction=egress) or received (direction=ingress) by traffic class (GSO packets counted per segment).",
            |g, d, c| g.totals.counters.get(d, c).packets,
        )?;
        let mut m = enc.encode_descriptor(
            "aliasnet_pod_drops",
            "Packets of the pod dropped by node policy (reason=blocked) or by its bandwidth limit's queue (reason=rate).",
            None,
            MetricType::Counter,
        )?;
        for g in &self.groups {
            for dir in Direction::ALL {
                let (l, n) = g.labels("direction", dir.name(), "reason", "blocked");
                ConstCounter::new(g.totals.counters.get(dir, Class::Blocked).packets)
                    .encode(m.encode_family(&&l[..n])?)?;
                let (l, n) = g.labels("direction", dir.name(), "reason", "rate");
                ConstCounter::new(g.totals.rate_drops[dir.index()])
                    .encode(m.encode_family(&&l[..n])?)?;
            }
        }
        if self.limits {
            let mut m = enc.encode_descriptor(
                "aliasnet_pod_bandwidth_limit_bytes_per_second",
                "Configured bandwidth limit of the pod (the bit/s of the annotation / 8); class=all limits all traffic of the direction, class=internet only internet-bound egress. Absent = unlimited.",
                None,
                MetricType::Gauge,
            )?;
            for g in &self.groups {
                let l = g.limits.1;
                for (dir, class, v) in [
                    (Direction::Ingress, "all", l.ingress),
                    (Direction::Egress, "all", l.egress),
                    (Direction::Egress, "internet", l.internet_egress),
                ] {
                    if let Some(v) = v {
                        let (l, n) = g.labels("direction", dir.name(), "class", class);
                        // Bytes, not bits: Prometheus base units (promtool rejects `bits`).
                        // Gauges are i64 or f64 in prometheus-client; limits are far below 2^63.
                        ConstGauge::new(i64::try_from(v / 8).unwrap_or(i64::MAX))
                            .encode(m.encode_family(&&l[..n])?)?;
                    }
                }
            }
        }
        for (name, help, bytes) in [
            (
                "aliasnet_node_bytes",
                "Bytes sent (direction=egress) or received (direction=ingress) by all pods of the node, by traffic class; counts from the exporter's start and keeps what deleted pods counted.",
                true,
            ),
            (
                "aliasnet_node_packets",
                "Packets sent (direction=egress) or received (direction=ingress) by all pods of the node, by traffic class; counts from the exporter's start and keeps what deleted pods counted.",
                false,
            ),
        ] {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for dir in Direction::ALL {
                for class in Class::ALL {
                    let c = self.node.get(dir, class);
                    let v = if bytes { c.bytes } else { c.packets };
                    ConstCounter::new(v).encode(
                        m.encode_family(&[("direction", dir.name()), ("class", class.name())])?,
                    )?;
                }
            }
        }
        let m = enc.encode_descriptor(
            "aliasnet_datapath_pods",
            "Pods the eBPF datapath is attached to on this node.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::try_from(self.pods).unwrap_or(i64::MAX)).encode(m)?;
        let mut m = enc.encode_descriptor(
            "aliasnet_build_info",
            "Build of the aliasnet component serving this endpoint (value is always 1).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(
            m.encode_family(&[("component", "shaperd"), ("version", self.version.as_str())])?,
        )?;
        let mut m = enc.encode_descriptor(
            "aliasnet_datapath_backend_info",
            "Shaping backend of the datapath (value is always 1).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(m.encode_family(&[("backend", BACKEND)])?)?;
        Ok(())
    }
}

/// Renders one snapshot. `drops` are the per-pod rate drops [`Ledger::observe`] returned.
fn render(
    snap: &Snapshot,
    drops: &[[u64; abi::NR_DIRS]],
    ledger: &Ledger,
    opts: &ExporterOptions,
) -> String {
    // Pods sharing namespace and name (two interfaces, or a sandbox replaced before its old
    // attachment was removed) are summed: duplicate label sets would make the scrape invalid.
    let mut index: HashMap<(&str, Option<&str>), usize> = HashMap::with_capacity(snap.pods.len());
    let mut groups: Vec<Group> = Vec::with_capacity(snap.pods.len());
    let mut live = Totals::default();
    for (p, d) in snap.pods.iter().zip(drops) {
        live.add(&p.counters, d);
        let pod = match opts.aggregation {
            Aggregation::Pod => Some(p.pod.as_str()),
            Aggregation::Namespace => None,
        };
        let i = *index.entry((p.namespace.as_str(), pod)).or_insert_with(|| {
            groups.push(Group {
                namespace: p.namespace.clone(),
                pod: pod.map(str::to_owned),
                ..Group::default()
            });
            groups.len() - 1
        });
        let g = &mut groups[i];
        g.totals.add(&p.counters, d);
        if p.attached_unix_ns >= g.limits.0 {
            g.limits = (p.attached_unix_ns, p.limits);
        }
    }
    if opts.aggregation == Aggregation::Namespace {
        for g in &mut groups {
            let off = ledger.namespace_offset(&g.namespace);
            g.totals.add(&off.counters, &off.rate_drops);
        }
    }
    // Stable output order: by namespace, then pod.
    groups.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    let mut node = live.counters;
    node += ledger.node_offset().counters;
    let fam = Families {
        groups,
        limits: opts.aggregation == Aggregation::Pod,
        node,
        pods: snap.pods.len() as u64,
        version: opts.version.clone(),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(fam));
    let mut out = String::with_capacity(4096 + snap.pods.len() * 2560);
    // Writing into a String cannot fail.
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        .expect("encoding into a String");
    out
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use aliasnet_ebpf::abi::Counter;

    use super::*;

    fn counters(egress_internet: u64, ingress_internal: u64) -> PodCounters {
        let mut c = PodCounters::default();
        c.dir[abi::DIR_EGRESS][abi::CLASS_INTERNET as usize] = Counter {
            packets: egress_internet,
            bytes: egress_internet * 100,
        };
        c.dir[abi::DIR_INGRESS][abi::CLASS_INTERNAL as usize] = Counter {
            packets: ingress_internal,
            bytes: ingress_internal * 100,
        };
        c
    }

    fn pod(slot: u32, ns: &str, name: &str, c: PodCounters) -> PodSample {
        PodSample {
            slot,
            attached_unix_ns: u64::from(slot) + 1,
            namespace: ns.into(),
            pod: name.into(),
            ip: Ipv4Addr::new(10, 0, 0, slot as u8),
            host_ifindex: slot + 10,
            pod_ifindex: 2,
            netns: PathBuf::from("/nonexistent"),
            counters: c,
            limits: PodLimits::default(),
            rate_drops: [None; 2],
        }
    }

    fn value(text: &str, series: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
            .map(|v| v.parse().expect("integer sample"))
    }

    fn scrape(ledger: &mut Ledger, snap: &Snapshot, opts: &ExporterOptions) -> String {
        let drops = ledger.observe(snap);
        render(snap, &drops, ledger, opts)
    }

    #[test]
    fn per_pod_series_follow_the_maps() {
        let opts = ExporterOptions::default();
        let mut l = Ledger::default();
        let mut a = pod(0, "team", "a", counters(3, 5));
        a.limits = PodLimits {
            ingress: Some(10_000_000),
            egress: None,
            internet_egress: Some(1_000_000),
        };
        a.rate_drops = [Some(7), Some(2)];
        let b = pod(1, "team", "b", counters(1, 0));
        let text = scrape(
            &mut l,
            &Snapshot {
                pods: vec![a, b.clone()],
            },
            &opts,
        );
        assert_eq!(
            value(
                &text,
                r#"aliasnet_pod_bytes_total{namespace="team",pod="a",direction="egress",class="internet"}"#
            ),
            Some(300)
        );
        assert_eq!(
            value(
                &text,
                r#"aliasnet_pod_packets_total{namespace="team",pod="a",direction="ingress",class="internal"}"#
            ),
            Some(5)
        );
        assert_eq!(
            value(
                &text,
                r#"aliasnet_pod_drops_total{namespace="team",pod="a",direction="egress",reason="rate"}"#
            ),
            Some(7)
        );
        assert_eq!(
            value(
                &text,
                r#"aliasnet_pod_bandwidth_limit_bytes_per_second{namespace="team",pod="a",direction="egress",class="internet"}"#
            ),
            Some(125_000)
        );
        assert_eq!(
            value(
                &text,
                r#"aliasnet_pod_bandwidth_limit_bytes_per_second{namespace="team",pod="a",direction="ingress",class="all"}"#
            ),
            Some(1_250_000)
        );
        assert!(
            !text.contains(r#"pod="b",direction="egress",class="all""#),
            "b has no limits"
        );
        assert_eq!(value(&text, "aliasnet_datapath_pods"), Some(2));
        // The node totals start at zero with the exporter.
        assert_eq!(
            value(
                &text,
                r#"aliasnet_node_packets_total{direction="egress",class="internet"}"#
            ),
            Some(0)
        );
        assert!(text.contains(r#"aliasnet_build_info{component="shaperd",version=""#));
        assert!(text.contains(r#"aliasnet_datapath_backend_info{backend="htb"} 1"#));

        // a is deleted; b counts more: a's series disappear, node totals keep a's part.
        let b2 = pod(1, "team", "b", counters(4, 0));
        let mut a2 = pod(0, "team", "a", counters(6, 5));
        a2.rate_drops = [Some(9), Some(2)];
        let _ = scrape(
            &mut l,
            &Snapshot {
                pods: vec![a2, b.clone()],
            },
            &opts,
        );
        let text = scrape(&mut l, &Snapshot { pods: vec![b2] }, &opts);
        assert!(!text.contains(r#"pod="a""#), "{text}");
        // Egress internet since start: a 3 more, b 3 more.
        assert_eq!(
            value(
                &text,
                r#"aliasnet_node_packets_total{direction="egress",class="internet"}"#
            ),
            Some(6)
        );
        assert_eq!(value(&text, "aliasnet_datapath_pods"), Some(1));
    }

    #[test]
    fn namespace_aggregation_is_monotonic_across_pod_deletion() {
        let opts = ExporterOptions {
            aggregation: Aggregation::Namespace,
            ..ExporterOptions::default()
        };
        let mut l = Ledger::default();
        let s0 = Snapshot {
            pods: vec![
                pod(0, "x", "a", counters(10, 0)),
                pod(1, "x", "b", counters(20, 0)),
            ],
        };
        let t0 = scrape(&mut l, &s0, &opts);
        let key =
            r#"aliasnet_pod_packets_total{namespace="x",direction="egress",class="internet"}"#;
        assert_eq!(value(&t0, key), Some(0));
        assert!(!t0.contains("pod=\""), "no pod label when aggregated");
        assert!(
            !t0.contains("bandwidth_limit"),
            "no per-pod limits when aggregated"
        );
        let s1 = Snapshot {
            pods: vec![
                pod(0, "x", "a", counters(15, 0)),
                pod(1, "x", "b", counters(21, 0)),
            ],
        };
        assert_eq!(value(&scrape(&mut l, &s1, &opts), key), Some(6));
        // b goes away, a new pod c (slot reused: new attachment time) appears.
        let mut c = pod(1, "x", "c", counters(2, 0));
        c.attached_unix_ns = 99;
        let s2 = Snapshot {
            pods: vec![pod(0, "x", "a", counters(16, 0)), c],
        };
        assert_eq!(value(&scrape(&mut l, &s2, &opts), key), Some(6 + 1 + 2));
        // The namespace empties: its series go.
        let t3 = scrape(&mut l, &Snapshot::default(), &opts);
        assert!(!t3.contains(r#"namespace="x""#), "{t3}");
        assert_eq!(value(&t3, "aliasnet_datapath_pods"), Some(0));
    }

    #[test]
    fn duplicate_pod_names_are_summed_not_repeated() {
        let opts = ExporterOptions::default();
        let mut l = Ledger::default();
        let snap = Snapshot {
            pods: vec![
                pod(0, "n", "p", counters(1, 0)),
                pod(1, "n", "p", counters(2, 0)),
            ],
        };
        let text = scrape(&mut l, &snap, &opts);
        let key = r#"aliasnet_pod_packets_total{namespace="n",pod="p",direction="egress",class="internet"}"#;
        assert_eq!(text.matches(key).count(), 1);
        assert_eq!(value(&text, key), Some(3));
    }

    #[test]
    fn unreadable_rate_drops_repeat_the_last_value() {
        let opts = ExporterOptions::default();
        let mut l = Ledger::default();
        let mut a = pod(0, "n", "a", counters(0, 0));
        a.limits.ingress = Some(1_000_000);
        a.rate_drops = [None, Some(42)];
        let _ = scrape(
            &mut l,
            &Snapshot {
                pods: vec![a.clone()],
            },
            &opts,
        );
        a.rate_drops = [None, None];
        let text = scrape(&mut l, &Snapshot { pods: vec![a] }, &opts);
        assert_eq!(
            value(
                &text,
                r#"aliasnet_pod_drops_total{namespace="n",pod="a",direction="ingress",reason="rate"}"#
            ),
            Some(42)
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let opts = ExporterOptions::default();
        let mut l = Ledger::default();
        let snap = Snapshot {
            pods: vec![pod(0, "n", "we\"ird\\name\n", counters(1, 0))],
        };
        let text = scrape(&mut l, &snap, &opts);
        assert!(text.contains(r#"pod="we\"ird\\name\n""#), "{text}");
    }

    #[test]
    fn exposition_passes_promtool_when_installed() {
        let opts = ExporterOptions::default();
        let mut l = Ledger::default();
        let mut a = pod(0, "team", "a", counters(3, 5));
        a.limits.egress = Some(5_000_000);
        let text = scrape(&mut l, &Snapshot { pods: vec![a] }, &opts);
        let Ok(mut child) = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        else {
            assert!(
                std::env::var_os("CI").is_none(),
                "promtool (Debian package prometheus) is required under CI"
            );
            eprintln!("skipping: promtool not installed (apt-get install prometheus)");
            return;
        };
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn aggregation_parses() {
        assert_eq!(
            "namespace".parse::<Aggregation>(),
            Ok(Aggregation::Namespace)
        );
        assert_eq!("pod".parse::<Aggregation>(), Ok(Aggregation::Pod));
        assert!("node".parse::<Aggregation>().is_err());
    }
}
