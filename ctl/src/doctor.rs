//! `aliasnetctl doctor`: cross-checks ipamd's leases, the kernel's links and sysctls and the
//! datapath's attachments, and prints the command that fixes each finding.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    time::Duration,
};

use aliasnet_ebpf::{
    abi,
    shadow::{classes_in_view, shadowed_class_prefixes, view_of_active},
    Datapath, PodRecord,
};
use aliasnet_ipam_proto::{host_veth_name, Lease, RECOVERED_NETWORK};
use aliasnet_netlink::{Link, Rtnl};
use serde::Serialize;

use crate::{
    daemons::{self, Ipamd},
    output::{now_ms, print, print_json, Table},
    probe::{self, Attach},
    Global,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    DaemonUnreachable,
    DatapathMissing,
    LeaseWithoutVeth,
    VethWithoutLease,
    ProgramMissing,
    MtuMismatch,
    ShapingBelowFrame,
    ClassShadowed,
    Sysctl,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub check: Check,
    /// What it is about: a veth, an address, a pod, a sysctl.
    pub subject: String,
    pub problem: String,
    /// Shell command(s) that fix it, to run on the node.
    pub fix: String,
}

#[derive(Debug, Default, Serialize)]
struct Checked {
    leases: usize,
    host_veths: usize,
    datapath_pods: usize,
    uplink: Option<String>,
    uplink_mtu: Option<u32>,
}

#[derive(Debug, Serialize)]
struct Report {
    ok: bool,
    checked: Checked,
    findings: Vec<Finding>,
}

pub struct Options {
    pub veth_prefix: String,
    /// Leases younger than this are skipped (a CNI ADD creates the veth after the lease).
    pub grace: Duration,
}

fn read_sysctl(path: &str) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn pod_name(l: &Lease) -> String {
    match (&l.pod.namespace, &l.pod.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.clone(),
        _ => format!("container {}", l.key.container_id),
    }
}

/// The host veth a lease belongs to.
fn veth_of(l: &Lease, prefix: &str) -> String {
    l.host_veth
        .clone()
        .unwrap_or_else(|| host_veth_name(prefix, &l.key))
}

fn delete_pod_fix(ns: &str, name: &str) -> String {
    if name.is_empty() {
        "recreate the pod (its CNI ADD attaches the programs)".to_owned()
    } else {
        format!(
            "kubectl delete pod -n {ns} {name}   # its replacement's CNI ADD attaches the programs"
        )
    }
}

fn collect(g: &Global, o: &Options) -> Report {
    let mut findings = Vec::new();
    let mut checked = Checked::default();
    let now = now_ms();

    let leases = match Ipamd::connect(&g.socket, g.timeout()).and_then(|mut c| c.leases(1000)) {
        Ok(l) => Some(l),
        Err(e) => {
            findings.push(Finding {
                check: Check::DaemonUnreachable,
                subject: "aliasnet-ipamd".into(),
                problem: format!("{e}; lease checks skipped"),
                fix: "kubectl -n kube-system logs -c ipamd $(kubectl -n kube-system get pods -l app.kubernetes.io/name=aliasnet --field-selector spec.nodeName=$(hostname) -o name)".into(),
            });
            None
        }
    };
    let datapath = daemons::open_datapath(&g.pin_root);
    // The applied node config (node cap, uplink), from the same open as the records.
    let node_config = datapath.as_ref().ok().and_then(|dp| dp.config().ok());
    let records: Option<Vec<PodRecord>> = match &datapath {
        Ok(dp) => match dp.pods() {
            Ok(r) => Some(r),
            Err(e) => {
                findings.push(Finding {
                    check: Check::DatapathMissing,
                    subject: g.pin_root.display().to_string(),
                    problem: format!("pod records unreadable: {e}"),
                    fix: "restart aliasnet-shaperd on this node".into(),
                });
                None
            }
        },
        Err(e) => {
            findings.push(Finding {
                check: Check::DatapathMissing,
                subject: g.pin_root.display().to_string(),
                problem: format!("{e}; program checks skipped"),
                fix: "kubectl -n kube-system logs -c shaperd $(kubectl -n kube-system get pods -l app.kubernetes.io/name=aliasnet --field-selector spec.nodeName=$(hostname) -o name)   # aliasnet-shaperd loads and pins the datapath".into(),
            });
            None
        }
    };
    let links = match Rtnl::new().and_then(|mut r| r.links()) {
        Ok(l) => l,
        Err(e) => {
            findings.push(Finding {
                check: Check::Sysctl,
                subject: "netlink".into(),
                problem: format!(
                    "cannot list interfaces ({:?}); link checks skipped",
                    e.os_error().map_or(std::io::ErrorKind::Other, |e| e.kind())
                ),
                fix: "run aliasnetctl as root in the node's network namespace".into(),
            });
            Vec::new()
        }
    };
    let by_name: HashMap<&str, &Link> = links.iter().map(|l| (l.name.as_str(), l)).collect();
    let ours: Vec<&Link> = links
        .iter()
        // Wider than ipamd's orphan check: any veth with the prefix, for the operator to judge.
        .filter(|l| l.is_veth() && l.name.starts_with(&o.veth_prefix))
        .collect();
    checked.host_veths = ours.len();
    let record_of: HashMap<String, &PodRecord> = records
        .iter()
        .flatten()
        .map(|r| (r.host_ifname(), r))
        .collect();
    checked.datapath_pods = record_of.len();

    // Leases <-> veths.
    if let Some(leases) = &leases {
        checked.leases = leases.len();
        let claimed: HashSet<String> = leases.iter().map(|l| veth_of(l, &o.veth_prefix)).collect();
        for l in leases {
            let veth = veth_of(l, &o.veth_prefix);
            if by_name.contains_key(veth.as_str()) {
                continue;
            }
            if now.saturating_sub(l.allocated_at_ms) < o.grace.as_millis() as u64 {
                continue;
            }
            let fix = if l.key.network == RECOVERED_NETWORK {
                format!("{} ipam release --veth {veth}", g.ctl_command())
            } else {
                format!(
                    "{} ipam release --network {} --container-id {} --ifname {}",
                    g.ctl_command(),
                    l.key.network,
                    l.key.container_id,
                    l.key.ifname
                )
            };
            findings.push(Finding {
                check: Check::LeaseWithoutVeth,
                subject: l.address.to_string(),
                problem: format!(
                    "leased to {} but its host veth {veth} does not exist (pod gone without a CNI DEL?)",
                    pod_name(l)
                ),
                fix,
            });
        }
        for v in &ours {
            if !claimed.contains(&v.name) {
                let who = record_of
                    .get(&v.name)
                    .map(|r| format!(" (datapath record: {}/{})", r.namespace(), r.name()))
                    .unwrap_or_default();
                findings.push(Finding {
                    check: Check::VethWithoutLease,
                    subject: v.name.clone(),
                    problem: format!(
                        "host veth without a lease{who}: its address may be handed to another pod"
                    ),
                    fix: format!("ip link del {}", v.name),
                });
            }
        }
        // Programs: every leased pod with a veth should be attached.
        if let (Some(_), Ok(dp)) = (&records, &datapath) {
            for l in leases {
                let veth = veth_of(l, &o.veth_prefix);
                if !by_name.contains_key(veth.as_str()) {
                    continue;
                }
                let (ns, name) = (
                    l.pod.namespace.clone().unwrap_or_default(),
                    l.pod.name.clone().unwrap_or_default(),
                );
                match record_of.get(&veth) {
                    None => findings.push(Finding {
                        check: Check::ProgramMissing,
                        subject: pod_name(l),
                        problem: format!("no datapath record for host veth {veth}: traffic is neither classified, counted nor shaped"),
                        fix: delete_pod_fix(&ns, &name),
                    }),
                    Some(r) => {
                        let p = probe::programs_of(dp, r);
                        for (what, a) in [
                            ("an_host_ingress (ingress hook of the host veth)", &p.host_ingress),
                            ("an_host_egress (egress hook of the host veth)", &p.host_egress),
                            ("an_pod_egress (egress hook of the pod's interface)", &p.pod_egress),
                            ("the HTB of its egress limits (on the pod's interface)", &p.pod_htb),
                        ] {
                            let problem = match a {
                                Attach::Missing => format!("{what} is not attached"),
                                Attach::WrongClassid { found, wanted } => format!(
                                    "{what} carries classid {found}, not the pod's {wanted}: its egress is shaped as another pod's"
                                ),
                                _ => continue,
                            };
                            findings.push(Finding {
                                check: Check::ProgramMissing,
                                subject: pod_name(l),
                                problem,
                                fix: delete_pod_fix(&ns, &name),
                            });
                        }
                    }
                }
            }
        }
    }

    // MTU: pods' veths should match the uplink (no fragmentation, no PMTU black holes).
    let uplink = Rtnl::new()
        .and_then(|mut r| r.default_route_oif())
        .ok()
        .flatten()
        .and_then(|i| links.iter().find(|l| l.index == i));
    if let Some(up) = uplink {
        checked.uplink = Some(up.name.clone());
        checked.uplink_mtu = Some(up.mtu);
        for v in &ours {
            if v.mtu != up.mtu {
                let mut fix = format!("ip link set dev {} mtu {}", v.name, up.mtu);
                if let Some(r) = record_of.get(&v.name) {
                    let netns = abi::cstr(&r.meta.netns);
                    if Path::new(&netns).exists() {
                        fix.push_str(&format!(
                            "; nsenter --net={netns} ip link set dev {} mtu {}",
                            r.ifname(),
                            up.mtu
                        ));
                    }
                }
                findings.push(Finding {
                    check: Check::MtuMismatch,
                    subject: v.name.clone(),
                    problem: format!(
                        "MTU {} differs from the uplink {}'s {} (unless the conflist sets `mtu` on purpose)",
                        v.mtu, up.name, up.mtu
                    ),
                    fix,
                });
            }
        }
    }

    // Shaping points: none may be smaller than a full-size frame of its device, or that
    // device's full-size packets are dropped (a pod with such an ingress limit receives
    // nothing in bulk).
    for r in records.iter().flatten() {
        let host = r.host_ifname();
        if let Some(l) = by_name.get(host.as_str()) {
            findings.extend(below_frame(
                &host,
                l.index,
                l.mtu,
                &format!("pod {}/{}", r.namespace(), r.name()),
                &delete_pod_fix(&r.namespace(), &r.name()),
            ));
        }
        if r.meta.limits.any_in(abi::Direction::Egress) {
            let netns = abi::cstr(&r.meta.netns);
            let meta = r.meta;
            let ifname = r.ifname();
            let what = format!("pod {}/{}", r.namespace(), r.name());
            let fix = delete_pod_fix(&r.namespace(), &r.name());
            let dev = format!("{ifname} in {netns}");
            // One visit to the pod's netns: its interface, then that interface's qdiscs.
            let pod_side = aliasnet_ebpf::run_in_pod(&meta, move || {
                let mut rt = Rtnl::new().ok()?;
                let l = rt.link_by_name(&ifname).ok()??;
                Some(below_frame(&dev, l.index, l.mtu, &what, &fix))
            });
            if let Ok(Some(f)) = pod_side {
                findings.extend(f);
            }
        }
    }
    if let Some(cfg) = node_config {
        if cfg.node_out != 0 {
            if let Some(up) = links.iter().find(|l| l.index == cfg.uplink_ifindex) {
                findings.extend(below_frame(
                    &up.name,
                    up.index,
                    up.mtu,
                    "the node's upload limits",
                    "kill -HUP $(pidof aliasnet-shaperd)   # re-applies the policy with sizes from the uplink's MTU",
                ));
            }
        }
    }

    if let Ok(dp) = &datapath {
        findings.extend(shadowed_classes(dp));
    }

    // Sysctls of the node's network namespace (/proc/sys/net is per netns).
    if read_sysctl("/proc/sys/net/ipv4/ip_forward") != Some(1) {
        findings.push(Finding {
            check: Check::Sysctl,
            subject: "net.ipv4.ip_forward".into(),
            problem: "IPv4 forwarding is off: pods cannot reach anything beyond the node".into(),
            fix: "sysctl -w net.ipv4.ip_forward=1".into(),
        });
    }
    let all_rp = read_sysctl("/proc/sys/net/ipv4/conf/all/rp_filter").unwrap_or(0);
    for v in &ours {
        let own = read_sysctl(&format!("/proc/sys/net/ipv4/conf/{}/rp_filter", v.name));
        // The kernel applies max(all, interface).
        if own.map(|x| x.max(all_rp)) == Some(1) {
            findings.push(Finding {
                check: Check::Sysctl,
                subject: format!("net.ipv4.conf.{}.rp_filter", v.name),
                problem: "strict reverse-path filtering on a host veth drops pod traffic on asymmetric paths (aliasnet sets 2, loose)".into(),
                fix: format!("sysctl -w net.ipv4.conf.{}.rp_filter=2", v.name),
            });
        }
    }

    Report {
        ok: findings.is_empty(),
        checked,
        findings,
    }
}

/// Named classes of the policy in force with prefixes that put no address into the class:
/// the classifier's other lists take all of them (see `aliasnet_ebpf::shadow`).
fn shadowed_classes(dp: &Datapath) -> Vec<Finding> {
    let (active, names) = match (dp.active_prefixes(), dp.class_names()) {
        (Ok(a), Ok(n)) => (a, n),
        (Err(e), _) | (_, Err(e)) => {
            return vec![Finding {
                check: Check::DatapathMissing,
                subject: dp.pins().root.display().to_string(),
                problem: format!("classifier prefixes unreadable: {e}; class checks skipped"),
                fix: "restart aliasnet-shaperd on this node".into(),
            }]
        }
    };
    let view = view_of_active(&active, &names);
    let classes = classes_in_view(&view, names.into_iter().flatten());
    shadowed_class_prefixes(&view, &classes)
        .into_iter()
        .map(|s| {
            let (subject, what) = match s.prefix {
                Some(p) => (
                    format!("class {} {p}", s.class),
                    format!("{p} from [classes.{}] cidrs, or the prefixes that take it", s.class),
                ),
                None => (
                    format!("class {}", s.class),
                    format!(
                        "[classes.{}] if it is not needed, or give it prefixes that are not blocked",
                        s.class
                    ),
                ),
            };
            Finding {
                check: Check::ClassShadowed,
                subject,
                problem: s.to_string(),
                fix: format!(
                    "kubectl -n kube-system edit configmap aliasnet-config   # shaper.toml: remove {what}"
                ),
            }
        })
        .collect()
}

/// Shaping points on device `dev` (`ifindex`, `mtu`, in the calling thread's netns) that are
/// smaller than one of its frames.
fn below_frame(dev: &str, ifindex: u32, mtu: u32, whose: &str, fix: &str) -> Vec<Finding> {
    let frame = abi::frame_of_mtu(mtu);
    let sizes = match Rtnl::new().and_then(|mut rt| rt.queue_sizes(ifindex)) {
        Ok(s) => s,
        Err(e) => {
            return vec![Finding {
                check: Check::ShapingBelowFrame,
                subject: dev.to_owned(),
                problem: format!("cannot read the shaping qdiscs of {whose}: {e}"),
                fix: "run aliasnetctl as root in the node's network namespace".into(),
            }]
        }
    };
    sizes
        .iter()
        .filter_map(|q| {
            let what = q.below_frame(frame)?;
            Some(Finding {
                check: Check::ShapingBelowFrame,
                subject: format!("{dev} {:x}:{:x}", q.handle >> 16, q.handle & 0xffff),
                problem: format!(
                    "{what} of {whose} is below one {frame}-byte frame of {dev} (MTU {mtu}): full-size packets there are dropped"
                ),
                fix: fix.to_owned(),
            })
        })
        .collect()
}

/// Exit code 0 when nothing is wrong, 1 when something is (after printing it all).
pub fn run(g: &Global, o: &Options) -> anyhow::Result<i32> {
    let r = collect(g, o);
    if g.json {
        print_json(&r);
    } else {
        let mut s = format!(
            "checked {} leases, {} host veths (prefix {:?}), {} datapath pods; uplink {}\n",
            r.checked.leases,
            r.checked.host_veths,
            o.veth_prefix,
            r.checked.datapath_pods,
            match (&r.checked.uplink, r.checked.uplink_mtu) {
                (Some(n), Some(m)) => format!("{n} (MTU {m})"),
                _ => "not found (no default route)".into(),
            }
        );
        if r.ok {
            s.push_str("OK: no problems found\n");
        } else {
            let mut t = Table::new(&["CHECK", "SUBJECT", "PROBLEM"]);
            for f in &r.findings {
                t.row(vec![
                    serde_json::to_value(f.check)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    f.subject.clone(),
                    f.problem.clone(),
                ]);
            }
            s.push_str(&t.render());
            s.push_str("\nFIXES\n");
            for f in &r.findings {
                s.push_str(&format!("# {} {}\n{}\n", f.subject, short(f.check), f.fix));
            }
        }
        print(&s);
    }
    Ok(if r.ok { 0 } else { 1 })
}

fn short(c: Check) -> &'static str {
    match c {
        Check::DaemonUnreachable => "(daemon unreachable)",
        Check::DatapathMissing => "(datapath missing)",
        Check::LeaseWithoutVeth => "(lease without veth)",
        Check::VethWithoutLease => "(veth without lease)",
        Check::ProgramMissing => "(program missing)",
        Check::MtuMismatch => "(MTU mismatch)",
        Check::ShapingBelowFrame => "(shaping point below a frame)",
        Check::ClassShadowed => "(class shadowed)",
        Check::Sysctl => "(sysctl)",
    }
}
