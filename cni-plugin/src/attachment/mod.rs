//! The pod's datapath attachment, from the plugin's side: which limits a pod asks for,
//! whether and how to attach it (`datapath`: required / optional / off), and the DEL, CHECK,
//! GC and STATUS parts.
//!
//! The pinned objects under `bpfPinRoot` are all that is needed: aliasnet-shaperd only has to
//! have run once on the node. Every call here is blocking and runs in the node's network
//! namespace (the plugin's own) with bpffs visible.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use aliasnet_cni_types::{
    code, limits::Requested, AttachEnv, CniArgs, CniError, CniResult, DatapathMode, Limits, NetConf,
};
use aliasnet_ebpf::{
    abi, AttachHints, Datapath, DatapathError, PodAttachment, PodIdentity, PodRecord, Teardown,
};
use aliasnet_netlink::Link;

use crate::pod_netns::PodNetns;

/// The limits in `runtimeConfig.bandwidth` and the pod annotations, validated: a bad value is
/// code 7 naming the field.
pub fn requested(conf: &NetConf) -> Result<Requested, CniError> {
    Limits::requested(&conf.runtime_config).map_err(|e| CniError::config(&e.field, e.reason))
}

fn not_initialised(conf: &NetConf) -> String {
    format!(
        "aliasnet-shaperd has not initialised the datapath under {}",
        conf.bpf_pin_root.display()
    )
}

/// The CNI error for a datapath failure.
pub fn to_cni(conf: &NetConf, what: &str, e: &DatapathError) -> CniError {
    match e {
        DatapathError::NotInitialised { .. } => CniError::new(
            code::TRY_AGAIN_LATER,
            format!("{}; try again later", not_initialised(conf)),
        ),
        DatapathError::InvalidArgument { field, reason } => CniError::config(field, reason),
        DatapathError::Limit(l) => CniError::config(&l.field, &l.reason),
        DatapathError::Netns(_) => CniError::new(code::NETNS, format!("{what}: {e}")),
        DatapathError::LockTimeout { .. } => {
            CniError::new(code::TRY_AGAIN_LATER, format!("{what}: {e}"))
        }
        _ => CniError::new(code::DATAPATH, format!("{what}: {e}")),
    }
}

/// ADD, before anything exists: decides whether this pod is attached and opens the pins if
/// so. `None` means "do not attach". Fails (nothing to undo) when the pod cannot be served:
/// a limit with `datapath: off` (7), pins missing when required or when a limit needs them (11).
pub fn open_for_add(conf: &NetConf, req: &Requested) -> Result<Option<Datapath>, CniError> {
    match conf.datapath {
        DatapathMode::Off => match req.field {
            Some(field) => Err(CniError::config(
                field,
                "a bandwidth limit was requested but \"datapath\" is \"off\" in the network config; \
                 aliasnet never ignores a limit",
            )),
            None => Ok(None),
        },
        DatapathMode::Required => Datapath::open(&conf.bpf_pin_root)
            .map(Some)
            .map_err(|e| to_cni(conf, "open the datapath", &e)),
        DatapathMode::Optional => match Datapath::open(&conf.bpf_pin_root) {
            Ok(dp) => Ok(Some(dp)),
            Err(DatapathError::NotInitialised { .. }) => match req.field {
                Some(field) => Err(CniError::new(
                    code::TRY_AGAIN_LATER,
                    format!(
                        "{field} asks for a bandwidth limit and {}; try again later",
                        not_initialised(conf)
                    ),
                )),
                None => {
                    tracing::warn!(
                        "{}: pod attached without classification, counters or shaping (datapath: optional)",
                        not_initialised(conf)
                    );
                    Ok(None)
                }
            },
            // Pins exist but cannot be used (another ABI, no access): attaching "sometimes"
            // would hide a broken node.
            Err(e) => Err(to_cni(conf, "open the datapath", &e)),
        },
    }
}

/// Who the pod is, from `CNI_ARGS`. Runtimes other than the kubelet's may send neither key:
/// then the namespace stays empty (not a Kubernetes pod; node policy's default rate applies)
/// and the name is the container ID.
pub fn identity(
    args: &CniArgs,
    env: &AttachEnv,
    ipv4: Option<Ipv4Addr>,
    ipv6: Option<Ipv6Addr>,
) -> PodIdentity {
    PodIdentity {
        namespace: args.k8s_pod_namespace.clone().unwrap_or_default(),
        name: args
            .k8s_pod_name
            .clone()
            .unwrap_or_else(|| env.container_id.clone()),
        container_id: env.container_id.clone(),
        ifname: env.ifname.clone(),
        ipv4,
        ipv6,
    }
}

/// Checks that the identity fits the pinned maps' fixed-size fields, before anything is
/// allocated (the address is not known yet; it does not matter here).
pub fn check_identity(args: &CniArgs, env: &AttachEnv) -> Result<(), CniError> {
    let id = identity(args, env, None, None);
    let fits = |what: &str, s: &str, max: usize| {
        if s.len() < max {
            Ok(())
        } else {
            Err(CniError::env(format!(
                "{what} is {} bytes; the datapath records at most {}",
                s.len(),
                max - 1
            )))
        }
    };
    let meta = abi::PodMeta::default();
    fits(
        "CNI_ARGS K8S_POD_NAMESPACE",
        &id.namespace,
        meta.k8s_namespace.len(),
    )?;
    fits("CNI_ARGS K8S_POD_NAME", &id.name, meta.k8s_name.len())?;
    fits("CNI_CONTAINERID", &id.container_id, meta.container_id.len())?;
    fits("CNI_NETNS", &env.netns, meta.netns.len())
}

/// The MAC address of the pod's interface in ADD's result (the one inside the sandbox).
pub fn sandbox_mac(result: &CniResult) -> Option<[u8; 6]> {
    let mac = result
        .interfaces
        .iter()
        .find(|i| i.sandbox.is_some())?
        .mac
        .as_deref()?;
    let mut out = [0u8; 6];
    let mut parts = mac.split(':');
    for b in &mut out {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// ADD, last step: attach the pinned programs to the pod and record it. On failure the
/// library has undone its part; the caller rolls back the rest. `host_veth` is the host
/// veth as its creation echoed it, `netns` the pod's namespace ADD opened: the library looks
/// up neither again.
#[allow(clippy::too_many_arguments)]
pub fn attach(
    conf: &NetConf,
    dp: &mut Datapath,
    host_veth: &Link,
    netns: &PodNetns,
    env: &AttachEnv,
    identity: PodIdentity,
    limits: Limits,
    pod_mac: Option<[u8; 6]>,
) -> Result<(), CniError> {
    let att = PodAttachment {
        host_ifname: host_veth.name.clone(),
        netns: PathBuf::from(&env.netns),
        identity,
        limits,
        pod_mac,
    };
    let hints = AttachHints {
        host_veth: Some(host_veth),
        netns: Some(netns.open_ns()),
    };
    let a = dp
        .attach_pod_with(&att, hints)
        .map_err(|e| to_cni(conf, "attach the eBPF datapath", &e))?;
    tracing::info!(
        slot = a.slot,
        ingress = ?a.ingress.map(|s| s.rate),
        egress = ?a.egress.map(|s| s.rate),
        internet_egress = ?a.internet_egress.map(|s| s.rate),
        internet_ingress = ?a.internet_ingress.map(|s| s.rate),
        namespace_aggregate = a.entity,
        "datapath attached"
    );
    Ok(())
}

/// DEL: best effort, never fails. Works from the pins alone (aliasnet-shaperd down) and
/// when there are none.
///
/// Removes only the pod's map entries ([`Teardown::MapsOnly`], a few map operations): every
/// DEL path deletes the host veth right after (aliasnet-ipamd with `asyncTeardown`, the plugin
/// otherwise), and the pod's filters and qdiscs go with the veth and its peer.
pub fn detach(conf: &NetConf, container_id: &str, ifname: &str) {
    if conf.datapath == DatapathMode::Off {
        return;
    }
    let mut dp = match Datapath::open(&conf.bpf_pin_root) {
        Ok(dp) => dp,
        Err(DatapathError::NotInitialised { .. }) => {
            tracing::debug!("{}: nothing to detach", not_initialised(conf));
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the datapath to detach the pod; aliasnet-shaperd's GC removes it once the host veth is gone");
            return;
        }
    };
    match dp.detach_pod_with(container_id, ifname, Teardown::MapsOnly) {
        Ok(true) => tracing::info!("datapath detached"),
        Ok(false) => tracing::debug!("no datapath attachment"),
        Err(e) => {
            tracing::warn!(error = %e, "detaching the datapath failed; aliasnet-shaperd's GC retries once the host veth is gone")
        }
    }
}

/// CHECK: the pod's attachment exists, belongs to this host veth and address, and carries the
/// limits the config asks for now. Returns the problems found, each naming the piece.
pub fn problems(
    conf: &NetConf,
    container_id: &str,
    ifname: &str,
    host_veth: &str,
    ipv4: Option<Ipv4Addr>,
    ipv6: Option<Ipv6Addr>,
) -> Result<Vec<String>, CniError> {
    let req = requested(conf)?;
    let dp = match conf.datapath {
        DatapathMode::Off => return Ok(Vec::new()),
        DatapathMode::Optional if !req.any() => match Datapath::open(&conf.bpf_pin_root) {
            Ok(dp) => dp,
            // ADD skipped the datapath too.
            Err(DatapathError::NotInitialised { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(to_cni(conf, "open the datapath", &e)),
        },
        _ => match Datapath::open(&conf.bpf_pin_root) {
            Ok(dp) => dp,
            Err(DatapathError::NotInitialised { .. }) => {
                return Ok(vec![format!(
                    "datapath attachment missing: {}",
                    not_initialised(conf)
                )])
            }
            Err(e) => return Err(to_cni(conf, "open the datapath", &e)),
        },
    };
    let rec = dp
        .pod(container_id, ifname)
        .map_err(|e| to_cni(conf, "read the datapath", &e))?;
    let Some(rec) = rec else {
        if conf.datapath == DatapathMode::Optional && !req.any() {
            // ADD may have run before the pins existed, which optional allows.
            tracing::debug!("no datapath attachment (datapath: optional)");
            return Ok(Vec::new());
        }
        return Ok(vec![format!(
            "datapath attachment for {container_id}/{ifname} missing under {}",
            conf.bpf_pin_root.display()
        )]);
    };
    let mut p = Vec::new();
    let slot = rec.slot;
    if rec.host_ifname() != host_veth {
        p.push(format!(
            "datapath attachment (slot {slot}) is on host veth {}, want {host_veth}",
            rec.host_ifname()
        ));
    } else if ifindex(host_veth) != Some(rec.meta.host_ifindex) {
        p.push(format!(
            "datapath attachment (slot {slot}) is for an earlier {host_veth} (ifindex {})",
            rec.meta.host_ifindex
        ));
    }
    if rec.ipv4() != ipv4 || rec.ipv6() != ipv6 {
        let want = crate::plan::describe(
            &ipv4
                .map(std::net::IpAddr::V4)
                .into_iter()
                .chain(ipv6.map(std::net::IpAddr::V6))
                .collect::<Vec<_>>(),
        );
        p.push(format!(
            "datapath attachment (slot {slot}) records {}, prevResult says {want}",
            rec.addresses()
        ));
    }
    p.extend(dp.hooks_of(&rec).problems(&rec));
    let (rates, bursts) = dp
        .effective_limits(&rec.namespace(), &req.limits, rec.frame())
        .map_err(|e| to_cni(conf, "read the datapath policy", &e))?;
    let names = dp
        .class_names()
        .map_err(|e| to_cni(conf, "read the datapath's classes", &e))?;
    p.extend(limit_mismatches(&rec, &rates, &bursts, &names));
    Ok(p)
}

fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated string for the duration of the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// Differences between the limits recorded for a pod and what an attach would record now
/// (`rates`, `bursts`: the config's limits under the applied policy).
fn limit_mismatches(
    rec: &PodRecord,
    rates: &abi::Rates,
    bursts: &[u64; abi::NR_DIRS],
    names: &[Option<String>],
) -> Vec<String> {
    let m = &rec.meta;
    let show = |v: u64, unit: &str| {
        if v == 0 {
            "none".to_owned()
        } else {
            format!("{v} {unit}")
        }
    };
    let mut p = Vec::new();
    for dir in abi::Direction::ALL {
        for kind in 0..abi::NR_KINDS {
            let (have, want) = (
                m.limits.rate[dir.index()][kind],
                rates.rate[dir.index()][kind],
            );
            if have != want {
                let what = match kind {
                    abi::KIND_TOTAL => dir.name().to_owned(),
                    abi::KIND_INTERNET => format!("internet-{}", dir.name()),
                    k => format!(
                        "{} {}",
                        names
                            .get(k - abi::KIND_NAMED)
                            .cloned()
                            .flatten()
                            .unwrap_or_else(|| format!("class{}", k - abi::KIND_NAMED)),
                        dir.name()
                    ),
                };
                p.push(format!(
                    "datapath {what} rate is {}, the config and policy ask for {}",
                    show(have, "bit/s"),
                    show(want, "bit/s")
                ));
            }
        }
        let (have, want) = (m.burst[dir.index()], bursts[dir.index()]);
        if have != want {
            p.push(format!(
                "datapath {} burst is {}, the config asks for {}",
                dir.name(),
                show(have, "bytes"),
                show(want, "bytes")
            ));
        }
    }
    p
}

/// GC: detach what the IPAM GC released (their veths go asynchronously), then sweep
/// attachments whose host veth is gone. Best effort: every failure is returned, none stops
/// the rest.
pub fn gc(conf: &NetConf, released: &[(String, String)]) -> Vec<String> {
    if conf.datapath == DatapathMode::Off {
        return Vec::new();
    }
    let mut dp = match Datapath::open(&conf.bpf_pin_root) {
        Ok(dp) => dp,
        Err(DatapathError::NotInitialised { .. }) => {
            tracing::debug!("{}: nothing to collect", not_initialised(conf));
            return Vec::new();
        }
        Err(e) => return vec![format!("datapath GC: open: {e}")],
    };
    let mut errors = Vec::new();
    for (cid, ifname) in released {
        // aliasnet-ipamd deletes their host veths: the map entries are all there is to remove.
        match dp.detach_pod_with(cid, ifname, Teardown::MapsOnly) {
            Ok(true) => tracing::info!(cid, ifname, "GC detached the datapath"),
            Ok(false) => {}
            Err(e) => errors.push(format!("datapath GC: detach {cid}/{ifname}: {e}")),
        }
    }
    match dp.gc() {
        Ok(removed) => {
            for r in removed {
                tracing::info!(
                    cid = %r.container_id(),
                    ifname = %r.ifname(),
                    host_veth = %r.host_ifname(),
                    "GC removed a datapath attachment whose host veth is gone"
                );
            }
        }
        Err(e) => errors.push(format!("datapath GC: {e}")),
    }
    errors
}

/// STATUS: with `datapath: required`, an ADD needs the pins. `Err` carries the reason.
pub fn status(conf: &NetConf) -> Result<(), String> {
    if conf.datapath != DatapathMode::Required {
        return Ok(());
    }
    match Datapath::open(&conf.bpf_pin_root) {
        Ok(_) => Ok(()),
        Err(DatapathError::NotInitialised { .. }) => Err(not_initialised(conf)),
        Err(e) => Err(format!("the datapath cannot be used: {e}")),
    }
}

#[cfg(test)]
mod tests;
