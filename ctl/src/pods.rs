//! `aliasnetctl pods`: every attached pod with its limits and counters per class.

use std::collections::BTreeMap;

use aliasnet_ebpf::{
    abi::{self, Class, Direction},
    PodRecord,
};
use serde::Serialize;

use crate::{
    classes::{self, bytes, ByClass},
    daemons,
    output::{print, print_json, rate, Table},
    Global,
};

/// A named class's limits of a pod, bit/s; `null` = unlimited.
#[derive(Debug, Clone, Serialize)]
pub struct ClassLimit {
    pub ingress: Option<u64>,
    pub egress: Option<u64>,
}

/// The pod's limits in force (its own and the policy's, the policy a ceiling).
#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    /// bit/s; `null` = unlimited.
    pub ingress: Option<u64>,
    pub egress: Option<u64>,
    pub internet_egress: Option<u64>,
    pub internet_ingress: Option<u64>,
    /// Every named class, limited or not.
    pub classes: BTreeMap<String, ClassLimit>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Drops {
    /// Blocked by policy (both directions).
    pub blocked: u64,
    /// Sent by the pod with a source address not its own, dropped on the host veth.
    pub spoofed: u64,
    /// Above the pod's egress limits, dropped on the host veth (its own shaping was removed).
    pub policed: u64,
    /// Dropped by the shaping queues; `null` when they could not be read.
    pub rate_ingress: Option<u64>,
    pub rate_egress: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Pod {
    pub namespace: String,
    pub pod: String,
    /// The pod's addresses, IPv4 first, comma-separated.
    pub ip: String,
    pub container_id: String,
    pub ifname: String,
    pub host_veth: String,
    pub netns: String,
    pub slot: u32,
    pub limits: Limits,
    pub egress: ByClass,
    pub ingress: ByClass,
    pub drops: Drops,
}

/// `named`: the named classes in force ([`classes::named`]).
pub fn pod_of(
    dp: &aliasnet_ebpf::Datapath,
    r: &PodRecord,
    named: &[(Class, String)],
    with_qdiscs: bool,
) -> Pod {
    let nz = |v: u64| (v != 0).then_some(v);
    let stats = if with_qdiscs {
        dp.shaping_stats(r).ok()
    } else {
        None
    };
    let m = &r.meta;
    let egress_shaped = m.limits.any_in(Direction::Egress);
    let ingress_shaped = m.limits.any_in(Direction::Ingress);
    Pod {
        namespace: r.namespace(),
        pod: r.name(),
        ip: r.addresses(),
        container_id: r.container_id(),
        ifname: r.ifname(),
        host_veth: r.host_ifname(),
        netns: aliasnet_ebpf::abi::cstr(&m.netns),
        slot: r.slot,
        limits: Limits {
            ingress: nz(m.ingress_rate()),
            egress: nz(m.egress_rate()),
            internet_egress: nz(m.internet_egress_rate()),
            internet_ingress: nz(m.internet_ingress_rate()),
            classes: named
                .iter()
                .map(|(c, name)| {
                    let kind = abi::KIND_NAMED + (c.index() - abi::CLASS_NAMED as usize);
                    let l = ClassLimit {
                        ingress: m.limit(Direction::Ingress, kind),
                        egress: m.limit(Direction::Egress, kind),
                    };
                    (name.clone(), l)
                })
                .collect(),
        },
        egress: ByClass::of(&r.counters, Direction::Egress, named),
        ingress: ByClass::of(&r.counters, Direction::Ingress, named),
        drops: Drops {
            blocked: r.counters.get(Direction::Egress, Class::Blocked).packets
                + r.counters.get(Direction::Ingress, Class::Blocked).packets,
            spoofed: r.counters.spoofed.packets,
            policed: r.counters.policed.packets,
            rate_ingress: match (&stats, ingress_shaped) {
                (_, false) => Some(0),
                (Some(s), true) => Some(s.drops(Direction::Ingress)),
                (None, true) => None,
            },
            rate_egress: match (&stats, egress_shaped) {
                (_, false) => Some(0),
                (Some(s), true) => Some(s.drops(Direction::Egress)),
                (None, true) => None,
            },
        },
    }
}

pub fn run(g: &Global, namespace: Option<&str>) -> anyhow::Result<i32> {
    let dp = daemons::open_datapath(&g.pin_root)?;
    let records = dp
        .pods()
        .map_err(|e| anyhow::anyhow!("reading pod records under {}: {e}", g.pin_root.display()))?;
    let names = dp
        .class_names()
        .map_err(|e| anyhow::anyhow!("reading class names under {}: {e}", g.pin_root.display()))?;
    let named = classes::named(&names);
    let mut pods: Vec<Pod> = records
        .iter()
        .filter(|r| namespace.is_none_or(|n| r.namespace() == n))
        .map(|r| pod_of(&dp, r, &named, true))
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    if g.json {
        print_json(&pods);
        return Ok(0);
    }
    if pods.is_empty() {
        print("no pods attached\n");
        return Ok(0);
    }
    let mut t = Table::new(&[
        "POD",
        "IP",
        "LIMIT IN",
        "LIMIT OUT",
        "LIMIT INET IN",
        "LIMIT INET OUT",
        "OUT INTERNAL>",
        "OUT INTERNET>",
        "IN INTERNAL>",
        "IN INTERNET>",
        "BLOCKED PKTS>",
        "SPOOFED PKTS>",
        "POLICED PKTS>",
        "RATE DROPS>",
    ]);
    for p in &pods {
        let drops = match (p.drops.rate_ingress, p.drops.rate_egress) {
            (Some(i), Some(e)) => (i + e).to_string(),
            _ => "?".into(),
        };
        t.row(vec![
            format!("{}/{}", p.namespace, p.pod),
            p.ip.clone(),
            rate(p.limits.ingress),
            rate(p.limits.egress),
            rate(p.limits.internet_ingress),
            rate(p.limits.internet_egress),
            bytes(p.egress.internal),
            bytes(p.egress.internet),
            bytes(p.ingress.internal),
            bytes(p.ingress.internet),
            p.drops.blocked.to_string(),
            p.drops.spoofed.to_string(),
            p.drops.policed.to_string(),
            drops,
        ]);
        // The named classes: their part of the internet columns, their limits.
        for (name, l) in &p.limits.classes {
            let mut row = vec![String::new(); 14];
            row[0] = format!("  class {name}");
            row[4] = rate(l.ingress);
            row[5] = rate(l.egress);
            row[7] = bytes(p.egress.classes[name]);
            row[9] = bytes(p.ingress.classes[name]);
            t.row(row);
        }
    }
    let mut out = t.render();
    if !named.is_empty() {
        out.push_str(
            "\nINTERNET columns include the named classes; a class row shows its part and its limits.\n",
        );
    }
    print(&out);
    Ok(0)
}
