//! `aliasnetctl status`: is everything up, attached and configured on this node.

use std::fmt::Write as _;

use aliasnet_ebpf::{abi, Datapath};
use aliasnet_ipam_proto::PoolStats;
use serde::Serialize;

use crate::{
    classes::{self, bytes, ByClass, ClassLimits},
    daemons::{self, Endpoint, Ipamd},
    output::{print, print_json, rate, Table},
    probe::{self, Kernel, Programs},
    Global,
};

#[derive(Debug, Serialize)]
struct IpamdStatus {
    socket: String,
    reachable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    pools: Vec<PoolStats>,
}

#[derive(Debug, Serialize)]
struct PodPrograms {
    namespace: String,
    pod: String,
    ip: String,
    host_veth: String,
    /// The veth's largest frame (MTU + Ethernet header) and aggregate (GSO/GRO), bytes, that
    /// the pod's shaping sizes derive from.
    frame: u32,
    gso_max: u32,
    programs: Programs,
    /// The pod's limits in force, bit/s.
    limits: ClassLimits,
}

/// A named class in force.
#[derive(Debug, Serialize)]
struct ClassInfo {
    name: String,
    /// Its prefixes in the classifier (both families).
    prefixes: usize,
}

/// A namespace's pods on this node together, shaped as one aggregate.
#[derive(Debug, Serialize)]
struct NamespaceAggregate {
    namespace: String,
    pods: u32,
    limits: ClassLimits,
}

/// What the attached pods counted since their attach, by class.
#[derive(Debug, Default, Serialize)]
struct Traffic {
    ingress: ByClass,
    egress: ByClass,
}

/// The shaper's configuration as applied to the maps.
#[derive(Debug, Serialize)]
struct DatapathConfig {
    abi_version: u32,
    policy_epoch: u64,
    /// bit/s; `None` = unlimited.
    default_pod_internet_egress_rate: Option<u64>,
    node_internet_egress_cap: Option<u64>,
    uplink_ifindex: Option<u32>,
    /// The uplink's largest frame and aggregate, bytes, that the node cap's sizes derive from.
    uplink_frame: Option<u32>,
    uplink_gso_max: Option<u32>,
    /// `(prefix, class)` of the classifier.
    prefixes: Vec<(String, String)>,
    classes: Vec<ClassInfo>,
    /// The limits of each pod, and of all pods of a namespace on this node together, for
    /// namespaces without limits of their own in the policy.
    default_pod_limits: ClassLimits,
    default_namespace_limits: ClassLimits,
    /// All pods of this node together.
    node_limits: ClassLimits,
    /// The namespaces with pods here and limits on them together.
    namespace_limits: Vec<NamespaceAggregate>,
}

#[derive(Debug, Serialize)]
struct DatapathStatus {
    pin_root: String,
    installed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<DatapathConfig>,
    pods: Vec<PodPrograms>,
    traffic: Traffic,
}

#[derive(Debug, Serialize)]
struct Status {
    healthy: bool,
    problems: Vec<String>,
    ipamd: IpamdStatus,
    ipamd_metrics: Endpoint,
    shaperd_metrics: Endpoint,
    datapath: DatapathStatus,
    kernel: Kernel,
}

fn class_name(names: &[Option<String>], c: u32) -> String {
    if (c as usize) < abi::NR_CLASSES {
        Datapath::class_label(names, abi::Class::from_index(c as usize))
    } else {
        "other".to_owned()
    }
}

/// The namespaces' aggregates in use on this node.
fn namespace_aggregates(dp: &Datapath, names: &[Option<String>]) -> Vec<NamespaceAggregate> {
    let mut out: Vec<NamespaceAggregate> = (abi::NODE_ENTITY + 1..abi::MAX_ENTITIES)
        .filter_map(|e| dp.entity(e).ok())
        .filter(|rec| rec.flags & abi::ENTITY_IN_USE != 0)
        .map(|rec| NamespaceAggregate {
            namespace: abi::cstr(&rec.name),
            pods: rec.pods,
            limits: ClassLimits::of(names, &rec.limits),
        })
        .collect();
    out.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    out
}

/// The configuration in force, as the maps hold it.
fn config_of(dp: &Datapath, c: &abi::Config) -> DatapathConfig {
    let nz = |v: u64| (v != 0).then_some(v);
    let names = dp.class_names().unwrap_or_default();
    let defaults = dp.ns_policy("").unwrap_or_default();
    let node = dp
        .entity(abi::NODE_ENTITY)
        .map(|e| e.limits)
        .unwrap_or_default();
    let active = dp.active_prefixes().unwrap_or_default();
    let mut class_infos: Vec<ClassInfo> = classes::named(&names)
        .into_iter()
        .map(|(class, name)| ClassInfo {
            prefixes: active
                .iter()
                .filter(|(_, _, c)| *c as usize == class.index())
                .count(),
            name,
        })
        .collect();
    class_infos.sort_by(|a, b| a.name.cmp(&b.name));
    DatapathConfig {
        abi_version: c.abi_version,
        policy_epoch: c.policy_epoch,
        default_pod_internet_egress_rate: defaults
            .pod
            .get(abi::Direction::Egress, abi::KIND_INTERNET),
        node_internet_egress_cap: nz(node.rate[abi::DIR_EGRESS][abi::KIND_INTERNET]),
        uplink_ifindex: (c.uplink_ifindex != 0).then_some(c.uplink_ifindex),
        uplink_frame: (c.uplink_frame != 0).then_some(c.uplink_frame),
        uplink_gso_max: (c.uplink_gso_max != 0).then_some(c.uplink_gso_max),
        prefixes: active
            .iter()
            .map(|(a, l, c)| (format!("{a}/{l}"), class_name(&names, *c)))
            .collect(),
        classes: class_infos,
        default_pod_limits: ClassLimits::of(&names, &defaults.pod),
        default_namespace_limits: ClassLimits::of(&names, &defaults.ns),
        node_limits: ClassLimits::of(&names, &node),
        namespace_limits: namespace_aggregates(dp, &names),
    }
}

fn collect(g: &Global) -> Status {
    let mut problems = Vec::new();

    let mut ipamd = IpamdStatus {
        socket: g.socket.display().to_string(),
        reachable: false,
        error: None,
        ready: None,
        reason: None,
        pools: Vec::new(),
    };
    match Ipamd::connect(&g.socket, g.timeout()).and_then(|mut c| Ok((c.status()?, c.stats()?))) {
        Ok(((ready, _free, reason), (pools, _))) => {
            ipamd.reachable = true;
            ipamd.ready = Some(ready);
            if !ready {
                problems.push(format!(
                    "aliasnet-ipamd is not ready: {}",
                    reason.as_deref().unwrap_or("no reason given")
                ));
            }
            ipamd.reason = reason;
            ipamd.pools = pools;
        }
        Err(e) => {
            problems.push(e.to_string());
            ipamd.error = Some(e.to_string());
        }
    }

    let ipamd_metrics =
        daemons::probe_metrics(&g.ipamd_metrics, "ipamd", "aliasnet-ipamd", g.timeout());
    if let Some(e) = &ipamd_metrics.error {
        problems.push(format!("aliasnet-ipamd metrics: {e}"));
    }
    let shaperd_metrics = daemons::probe_metrics(
        &g.shaperd_metrics,
        "shaperd",
        "aliasnet-shaperd",
        g.timeout(),
    );
    if let Some(e) = &shaperd_metrics.error {
        problems.push(format!("aliasnet-shaperd metrics: {e}"));
    }

    let mut datapath = DatapathStatus {
        pin_root: g.pin_root.display().to_string(),
        installed: false,
        error: None,
        config: None,
        pods: Vec::new(),
        traffic: Traffic::default(),
    };
    match daemons::open_datapath(&g.pin_root) {
        Ok(dp) => {
            datapath.installed = true;
            if let Ok(c) = dp.config() {
                datapath.config = Some(config_of(&dp, &c));
            }
            match dp.pods() {
                Ok(pods) => {
                    let names = dp.class_names().unwrap_or_default();
                    let named = classes::named(&names);
                    let mut total = abi::PodCounters::default();
                    for rec in &pods {
                        total += rec.counters;
                    }
                    datapath.traffic = Traffic {
                        ingress: ByClass::of(&total, abi::Direction::Ingress, &named),
                        egress: ByClass::of(&total, abi::Direction::Egress, &named),
                    };
                    for rec in pods {
                        let programs = probe::programs_of(&dp, &rec);
                        if !programs.complete() {
                            problems.push(format!(
                                "pod {}/{}: eBPF programs missing or unverifiable",
                                rec.namespace(),
                                rec.name()
                            ));
                        }
                        datapath.pods.push(PodPrograms {
                            namespace: rec.namespace(),
                            pod: rec.name(),
                            ip: rec.addresses(),
                            host_veth: rec.host_ifname(),
                            frame: rec.meta.frame,
                            gso_max: rec.meta.gso_max,
                            programs,
                            limits: ClassLimits::of(&names, &rec.meta.limits),
                        });
                    }
                }
                Err(e) => {
                    problems.push(format!("reading pod records: {e}"));
                    datapath.error = Some(e.to_string());
                }
            }
        }
        Err(e) => {
            problems.push(e.to_string());
            datapath.error = Some(e.to_string());
        }
    }

    let kernel = probe::kernel();
    for f in &kernel.features {
        // fq is optional (HTB shaping does not need it): reported, not a problem.
        if f.available == Some(false) && f.name != "fq" {
            problems.push(format!("kernel: {}: {}", f.name, f.detail));
        }
    }
    Status {
        healthy: problems.is_empty(),
        problems,
        ipamd,
        ipamd_metrics,
        shaperd_metrics,
        datapath,
        kernel,
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

fn human(s: &Status) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "DAEMONS");
    let mut t = Table::new(&["COMPONENT", "ENDPOINT", "REACHABLE", "DETAIL"]);
    t.row(vec![
        "aliasnet-ipamd".into(),
        s.ipamd.socket.clone(),
        yes(s.ipamd.reachable).into(),
        match (&s.ipamd.error, s.ipamd.ready) {
            (Some(e), _) => e.clone(),
            (None, Some(true)) => "ready".into(),
            (None, _) => format!("not ready: {}", s.ipamd.reason.as_deref().unwrap_or("-")),
        },
    ]);
    for (name, e) in [
        ("aliasnet-ipamd metrics", &s.ipamd_metrics),
        ("aliasnet-shaperd metrics", &s.shaperd_metrics),
    ] {
        let mut detail = Vec::new();
        if let Some(v) = &e.version {
            detail.push(format!("version {v}"));
        }
        if let Some(b) = &e.backend {
            detail.push(format!("backend {b}"));
        }
        if let Some(err) = &e.error {
            detail.push(err.clone());
        }
        t.row(vec![
            name.into(),
            format!("http://{}/metrics", e.address),
            yes(e.reachable).into(),
            detail.join(", "),
        ]);
    }
    o.push_str(&t.render());

    let _ = writeln!(o, "\nPOOLS");
    if s.ipamd.pools.is_empty() {
        let _ = writeln!(o, "(none: aliasnet-ipamd not reachable)");
    } else {
        let mut t = Table::new(&[
            "POOL",
            "SOURCE",
            "TOTAL>",
            "ALLOCATED>",
            "COOLING>",
            "FREE>",
            "USED>",
        ]);
        for p in &s.ipamd.pools {
            t.row(vec![
                p.name.clone(),
                p.source.clone(),
                p.total.to_string(),
                p.allocated.to_string(),
                p.cooling.to_string(),
                p.free.to_string(),
                format!("{:.1}%", pct(p.allocated, p.total)),
            ]);
        }
        o.push_str(&t.render());
    }

    let _ = writeln!(o, "\nDATAPATH ({})", s.datapath.pin_root);
    match (&s.datapath.config, &s.datapath.error) {
        (Some(c), _) => {
            let _ = writeln!(
                o,
                "policy epoch {}, default pod internet egress {}, node internet cap {}, uplink ifindex {}{}",
                c.policy_epoch,
                rate(c.default_pod_internet_egress_rate),
                rate(c.node_internet_egress_cap),
                c.uplink_ifindex.map_or_else(|| "-".into(), |i| i.to_string()),
                match (c.uplink_frame, c.uplink_gso_max) {
                    (Some(f), Some(g)) => format!(
                        " (shaped for MTU {}, frame {f} B, GSO/GRO max {g} B)",
                        u64::from(f).saturating_sub(abi::ETH_HLEN)
                    ),
                    _ => String::new(),
                }
            );
            let prefixes: Vec<String> = c
                .prefixes
                .iter()
                .map(|(p, cl)| format!("{p}={cl}"))
                .collect();
            let _ = writeln!(o, "prefixes: {}", prefixes.join(" "));
            if !c.classes.is_empty() {
                let cl: Vec<String> = c
                    .classes
                    .iter()
                    .map(|k| {
                        let unit = if k.prefixes == 1 {
                            "prefix"
                        } else {
                            "prefixes"
                        };
                        format!("{} ({} {unit})", k.name, k.prefixes)
                    })
                    .collect();
                let _ = writeln!(o, "classes: {}", cl.join(", "));
            }
            let _ = writeln!(o, "\nLIMITS (bit/s; internet includes the named classes)");
            let mut t = Table::new(&["LEVEL", "NAMESPACE", "PODS>", "LIMITS"]);
            t.row(vec![
                "each pod".into(),
                "(default)".into(),
                String::new(),
                c.default_pod_limits.human(),
            ]);
            t.row(vec![
                "namespace on this node".into(),
                "(default)".into(),
                String::new(),
                c.default_namespace_limits.human(),
            ]);
            for n in &c.namespace_limits {
                t.row(vec![
                    "namespace on this node".into(),
                    n.namespace.clone(),
                    n.pods.to_string(),
                    n.limits.human(),
                ]);
            }
            t.row(vec![
                "node".into(),
                String::new(),
                s.datapath.pods.len().to_string(),
                c.node_limits.human(),
            ]);
            o.push_str(&t.render());
        }
        (None, Some(e)) => {
            let _ = writeln!(o, "{e}");
        }
        (None, None) => {}
    }
    if !s.datapath.pods.is_empty() {
        let _ = writeln!(o, "\nTRAFFIC of the attached pods since their attach");
        let tr = &s.datapath.traffic;
        let mut t = Table::new(&["CLASS", "IN>", "OUT>"]);
        t.row(vec![
            "internal".into(),
            bytes(tr.ingress.internal),
            bytes(tr.egress.internal),
        ]);
        t.row(vec![
            "internet".into(),
            bytes(tr.ingress.internet),
            bytes(tr.egress.internet),
        ]);
        for (name, c) in &tr.ingress.classes {
            t.row(vec![
                format!("  {name}"),
                bytes(*c),
                bytes(tr.egress.classes[name]),
            ]);
        }
        t.row(vec![
            "blocked".into(),
            bytes(tr.ingress.blocked),
            bytes(tr.egress.blocked),
        ]);
        o.push_str(&t.render());
        let _ = writeln!(o);
        let mut t = Table::new(&[
            "POD",
            "IP",
            "HOST VETH",
            "MTU>",
            "GSO MAX>",
            "HOST INGRESS",
            "HOST EGRESS",
            "POD EGRESS",
            "POD HTB",
            "LIMITS",
        ]);
        for p in &s.datapath.pods {
            t.row(vec![
                format!("{}/{}", p.namespace, p.pod),
                p.ip.clone(),
                p.host_veth.clone(),
                u64::from(p.frame).saturating_sub(abi::ETH_HLEN).to_string(),
                p.gso_max.to_string(),
                p.programs.host_ingress.short().into(),
                p.programs.host_egress.short().into(),
                p.programs.pod_egress.short().into(),
                p.programs.pod_htb.short().into(),
                p.limits.human(),
            ]);
        }
        o.push_str(&t.render());
    } else if s.datapath.installed {
        let _ = writeln!(o, "no pods attached");
    }

    let _ = writeln!(o, "\nKERNEL {}", s.kernel.release);
    let mut t = Table::new(&["FEATURE", "AVAILABLE", "DETAIL"]);
    for f in &s.kernel.features {
        t.row(vec![
            f.name.into(),
            match f.available {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => "unknown".into(),
            },
            f.detail.clone(),
        ]);
    }
    o.push_str(&t.render());

    if s.healthy {
        let _ = writeln!(o, "\nOK: no problems found");
    } else {
        let _ = writeln!(o, "\nPROBLEMS");
        for p in &s.problems {
            let _ = writeln!(o, "- {p}");
        }
    }
    o
}

pub fn pct(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 * 100.0 / total as f64
    }
}

/// Exit code 0 when healthy, 1 otherwise (after printing everything).
pub fn run(g: &Global) -> anyhow::Result<i32> {
    let s = collect(g);
    if g.json {
        print_json(&s);
    } else {
        print(&human(&s));
    }
    Ok(if s.healthy { 0 } else { 1 })
}
