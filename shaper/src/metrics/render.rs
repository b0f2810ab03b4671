//! The Prometheus text exposition of a [`Snapshot`] and the [`Ledger`]'s totals.

use std::{collections::HashMap, fmt};

use aliasnet_ebpf::{
    abi::{self, Class, Direction, PodCounters},
    Datapath,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};

use super::{
    ledger::Totals, Aggregation, ExporterOptions, Ledger, PodLimits, Snapshot, BACKEND, POD_CLASSES,
};

/// One label set of the per-pod families: a pod, or a namespace when aggregated.
#[derive(Debug, Default)]
struct Group {
    namespace: String,
    /// `None` when aggregated per namespace.
    pod: Option<String>,
    totals: Totals,
    /// Limits of the group's most recent attachment: `(attached_unix_ns, limits)`.
    limits: (u64, PodLimits),
    /// Connections its attachments' shares refused, and learnt again.
    conns_refused: u64,
    conns_relearnt: u64,
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
    /// The classes of the per-pod families (the node's add `other`), with their labels.
    classes: Vec<(Class, String)>,
    /// Per-pod limits are exported (not when aggregated).
    limits: bool,
    node: PodCounters,
    /// The limits of the node and of the namespaces with aggregates here.
    node_limits: abi::Rates,
    namespace_limits: Vec<(String, abi::Rates)>,
    pods: u64,
    /// Entries of the connection table the pods hold, and each one's share.
    conns_held: i64,
    conn_share: u32,
    version: String,
}

/// `(direction, class label, bytes/s)` of every limit of `r`.
fn limit_series(names: &[Option<String>], r: &abi::Rates) -> Vec<(Direction, String, i64)> {
    let mut out = Vec::new();
    for dir in Direction::ALL {
        for k in 0..abi::NR_KINDS {
            if let (Some(v), Some(label)) = (r.get(dir, k), Datapath::kind_label(names, k)) {
                // Bytes, not bits: Prometheus base units (promtool rejects `bits`). Gauges
                // are i64 or f64 in prometheus-client; limits are far below 2^63.
                out.push((dir, label, i64::try_from(v / 8).unwrap_or(i64::MAX)));
            }
        }
    }
    out
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
                for (class, label) in &self.classes {
                    let (l, n) = g.labels("direction", dir.name(), "class", label);
                    ConstCounter::new(value(g, dir, *class)).encode(m.encode_family(&&l[..n])?)?;
                }
            }
        }
        Ok(())
    }
}

impl Families {
    /// The named classes' names by index, as the class labels give them.
    fn names(&self) -> Vec<Option<String>> {
        let mut names = vec![None; abi::MAX_NAMED];
        for (c, label) in &self.classes {
            if let Class::Named(k) = c {
                names[usize::from(*k)] = Some(label.clone());
            }
        }
        names
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
            "Packets of the pod dropped by node policy (reason=blocked), by its bandwidth limit's queue (reason=rate), on its host veth as sent from an address not its own (reason=spoofed, egress only), on its host veth above its egress limits when its own shaping was removed (reason=policed, egress only), as link-scoped IPv6 (neighbour discovery, MLD) above its rate (reason=nd, egress only), or as other IPv6 to the node's link-scoped addresses (reason=gateway, egress only).",
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
            let (l, n) = g.labels("direction", Direction::Egress.name(), "reason", "spoofed");
            ConstCounter::new(g.totals.counters.spoofed.packets)
                .encode(m.encode_family(&&l[..n])?)?;
            let (l, n) = g.labels("direction", Direction::Egress.name(), "reason", "policed");
            ConstCounter::new(g.totals.counters.policed.packets)
                .encode(m.encode_family(&&l[..n])?)?;
            for (reason, i) in [("nd", abi::DROP_ND), ("gateway", abi::DROP_GATEWAY)] {
                let (l, n) = g.labels("direction", Direction::Egress.name(), "reason", reason);
                ConstCounter::new(g.totals.counters.dropped[i].packets)
                    .encode(m.encode_family(&&l[..n])?)?;
            }
        }
        if self.limits {
            for (name, help, value) in [
                (
                    "aliasnet_pod_tcp_connections_refused",
                    "TCP connections of the pod whose windows could not be clamped because its share of the node's connection table was full (see aliasnet_datapath_tcp_connection_share); counts from the pod's attachment.",
                    (|g: &Group| g.conns_refused) as fn(&Group) -> u64,
                ),
                (
                    "aliasnet_pod_tcp_connections_relearnt",
                    "TCP connections of the pod learnt again from a packet after their entry in the connection table went (idle past its time to live); counts from the pod's attachment.",
                    |g: &Group| g.conns_relearnt,
                ),
            ] {
                let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
                for g in &self.groups {
                    let l = match &g.pod {
                        Some(pod) => [("namespace", g.namespace.as_str()), ("pod", pod.as_str())],
                        None => continue,
                    };
                    ConstCounter::new(value(g)).encode(m.encode_family(&&l[..])?)?;
                }
            }
        }
        let names: Vec<Option<String>> = self.names();
        if self.limits {
            let mut m = enc.encode_descriptor(
                "aliasnet_pod_bandwidth_limit_bytes_per_second",
                "Effective bandwidth limit of the pod (its own and the policy's, the policy a ceiling), bytes/s; class=all limits all traffic of the direction, class=internet all internet traffic, a named class its destinations. Absent = unlimited.",
                None,
                MetricType::Gauge,
            )?;
            for g in &self.groups {
                for (dir, class, v) in limit_series(&names, &g.limits.1 .0) {
                    let (l, n) = g.labels("direction", dir.name(), "class", &class);
                    ConstGauge::new(v).encode(m.encode_family(&&l[..n])?)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "aliasnet_namespace_bandwidth_limit_bytes_per_second",
            "Bandwidth limit on all pods of a namespace on this node together, bytes/s, by direction and class (internet or a named class). Absent = unlimited.",
            None,
            MetricType::Gauge,
        )?;
        for (ns, r) in &self.namespace_limits {
            for (dir, class, v) in limit_series(&names, r) {
                ConstGauge::new(v).encode(m.encode_family(&[
                    ("namespace", ns.as_str()),
                    ("direction", dir.name()),
                    ("class", class.as_str()),
                ])?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "aliasnet_node_bandwidth_limit_bytes_per_second",
            "Bandwidth limit on all pods of the node together, bytes/s, by direction and class (internet or a named class). Absent = unlimited.",
            None,
            MetricType::Gauge,
        )?;
        for (dir, class, v) in limit_series(&names, &self.node_limits) {
            ConstGauge::new(v).encode(
                m.encode_family(&[("direction", dir.name()), ("class", class.as_str())])?,
            )?;
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
            let other = (Class::Other, "other".to_owned());
            for dir in Direction::ALL {
                for (class, label) in self.classes.iter().chain([&other]) {
                    let c = self.node.get(dir, *class);
                    let v = if bytes { c.bytes } else { c.packets };
                    ConstCounter::new(v).encode(
                        m.encode_family(&[("direction", dir.name()), ("class", label.as_str())])?,
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
        let m = enc.encode_descriptor(
            "aliasnet_datapath_tcp_connections",
            "Entries of the node's TCP connection table (the window clamp's) that pods hold.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.conns_held).encode(m)?;
        let m = enc.encode_descriptor(
            "aliasnet_datapath_tcp_connection_share",
            "Entries of the node's TCP connection table each pod may hold (the table's size over the pods attached, at least 64 pods' worth); a pod at its share learns no new connection.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(self.conn_share)).encode(m)?;
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
pub(super) fn render(
    snap: &Snapshot,
    drops: &[[u64; abi::NR_DIRS]],
    ledger: &Ledger,
    opts: &ExporterOptions,
    budget: Option<super::budget::BudgetFamilies>,
) -> String {
    // Pods sharing namespace and name (two interfaces, or a sandbox replaced before its old
    // attachment was removed) are summed: duplicate label sets would make the scrape invalid.
    let mut index: HashMap<(&str, Option<&str>), usize> = HashMap::with_capacity(snap.pods.len());
    let mut groups: Vec<Group> = Vec::with_capacity(snap.pods.len());
    let mut live = Totals::default();
    let mut conns_held = 0i64;
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
        g.conns_refused += p.conns.conns_refused;
        g.conns_relearnt += p.conns.conns_relearnt;
        conns_held += p.conns.conns.max(0);
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
    let classes = POD_CLASSES
        .iter()
        .map(|c| (*c, Datapath::class_label(&snap.class_names, *c)))
        .chain(
            snap.class_names
                .iter()
                .enumerate()
                .filter_map(|(k, n)| Some((Class::Named(k as u8), n.clone()?))),
        )
        .collect();
    let fam = Families {
        groups,
        classes,
        limits: opts.aggregation == Aggregation::Pod,
        node,
        node_limits: snap.node_limits,
        namespace_limits: snap.namespace_limits.clone(),
        pods: snap.pods.len() as u64,
        conns_held,
        conn_share: snap.conn_share,
        version: opts.version.clone(),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(fam));
    if let Some(b) = budget {
        registry.register_collector(Box::new(b));
    }
    let mut out = String::with_capacity(4096 + snap.pods.len() * 2560);
    // Writing into a String cannot fail.
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        .expect("encoding into a String");
    out
}

#[cfg(test)]
mod tests;
