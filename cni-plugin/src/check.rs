//! CHECK: every piece ADD made must still be there and right, the eBPF datapath attachment and
//! its limits included. All problems are collected and reported together, each naming the piece.

use std::net::IpAddr;

use aliasnet_cni_types::{code, AttachEnv, CniError, CniResult, NetConf};
use aliasnet_ipam_proto::{host_veth_name, AttachmentKey, Request, Response};
use rtnetlink::packet_route::route::RouteScope;

mod v6;

use crate::{
    datapath, ipam,
    netns::NetNs,
    nl::{format_mac, nl_err, Link, Nl, GATEWAY},
    sysctl,
    wiring::{describe, Wiring},
};

pub fn run(conf: &NetConf, env: &AttachEnv) -> Result<(), CniError> {
    let Some(prev) = &conf.prev_result else {
        return Err(CniError::config(
            "prevResult",
            "CHECK needs the ADD result in prevResult",
        ));
    };
    let prev = CniResult::from_prev_result(prev)?;
    let ifname = env.ifname.as_str();
    let key = AttachmentKey::new(&conf.name, &env.container_id, ifname);
    let veth = host_veth_name(&conf.host_veth_prefix, &key);
    let fail = |m: String| CniError::new(code::CHECK_FAILED, m);

    // Our entries in prevResult: the pod interface (with a sandbox) and its addresses.
    let Some(pod_idx) = prev
        .interfaces
        .iter()
        .position(|i| i.name == ifname && i.sandbox.is_some())
    else {
        return Err(fail(format!(
            "prevResult lists no interface {ifname} with a sandbox"
        )));
    };
    let pod_if = &prev.interfaces[pod_idx];
    let host_if = prev
        .interfaces
        .iter()
        .find(|i| i.name == veth && i.sandbox.is_none());
    let w = Wiring::from_prev_result(conf, &prev, pod_idx)?;

    let netns = NetNs::open(&env.netns)?;
    let rt = crate::runtime()?;
    let problems = rt.block_on(async {
        let host = Nl::connect()?;
        let pod = netns.enter(Nl::connect)??;
        let want_mtu = match pod_if.mtu.or(conf.mtu) {
            Some(m) => m,
            None => crate::add::detect_mtu(&host).await?,
        };
        let mut p = check_datapath(
            &host,
            &pod,
            &veth,
            ifname,
            &w,
            want_mtu,
            host_if.and_then(|i| i.mac.as_deref()),
            pod_if.mac.as_deref(),
        )
        .await?;
        if w.v6.is_some() {
            p.extend(sysctl::check_ipv6_forward());
            p.extend(netns.enter(|| sysctl::check_pod_ipv6(ifname))?);
        }
        Ok::<_, CniError>(p)
    });
    rt.shutdown_background();
    let mut problems = problems?;
    problems.extend(datapath::check(
        conf,
        &env.container_id,
        ifname,
        &veth,
        w.v4,
        w.v6,
    )?);

    let want = w.addrs();
    match ipam::call(conf, &Request::Check { key: key.clone() }) {
        Ok(Response::Lease { lease: None, .. }) => problems.push(format!(
            "IPAM reservation for {key} ({}) missing",
            describe(&want)
        )),
        Ok(Response::Lease {
            lease: Some(l),
            more,
        }) => {
            let mut held: Vec<IpAddr> = std::iter::once(&l)
                .chain(&more)
                .map(|l| l.address)
                .collect();
            held.sort();
            if held != want {
                problems.push(format!(
                    "IPAM reservation for {key} holds {}, prevResult says {}",
                    describe(&held),
                    describe(&want)
                ));
            }
        }
        Ok(other) => return Err(ipam::unexpected("CHECK", &other)),
        Err(e) => return Err(ipam::to_cni(&e)),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(fail(problems.join("; ")))
    }
}

#[allow(clippy::too_many_arguments)]
async fn check_datapath(
    host: &Nl,
    pod: &Nl,
    veth: &str,
    ifname: &str,
    w: &Wiring,
    want_mtu: u32,
    prev_host_mac: Option<&str>,
    prev_pod_mac: Option<&str>,
) -> Result<Vec<String>, CniError> {
    let mut p = Vec::new();
    let (h, l) = futures::join!(host.link_by_name(veth), pod.link_by_name(ifname));
    let h = h.map_err(|e| nl_err(format!("host: get {veth}"), e))?;
    let l = l.map_err(|e| nl_err(format!("pod: get {ifname}"), e))?;
    let Some(h) = h else {
        p.push(format!("host veth {veth} missing"));
        if l.is_none() {
            p.push(format!("pod interface {ifname} missing"));
        }
        return Ok(p);
    };
    if !h.is_veth {
        p.push(format!("host interface {veth} is not a veth"));
    }
    if !h.up {
        p.push(format!("host veth {veth} is down"));
    }
    if h.mtu != Some(want_mtu) {
        p.push(format!(
            "host veth {veth} MTU is {:?}, want {want_mtu}",
            h.mtu
        ));
    }
    let h_mac = h.mac_string();
    if let (Some(want), Some(have)) = (prev_host_mac, &h_mac) {
        if !want.eq_ignore_ascii_case(have) {
            p.push(format!(
                "host veth {veth} MAC is {have}, prevResult says {want}"
            ));
        }
    }
    // The /32 route to the pod through the host veth.
    if let Some(ip) = w.v4 {
        let host_routes = host
            .routes_v4()
            .await
            .map_err(|e| nl_err("host: dump routes", e))?;
        if !host_routes
            .iter()
            .any(|r| r.in_main_table() && r.dst == ip && r.dst_len == 32 && r.oif == Some(h.index))
        {
            p.push(format!("host route {ip}/32 via {veth} missing"));
        }
    }
    let Some(l) = l else {
        p.push(format!("pod interface {ifname} missing"));
        return Ok(p);
    };
    if !l.is_veth || h.peer_index != Some(l.index) {
        p.push(format!(
            "pod interface {ifname} is not the peer of host veth {veth}"
        ));
    }
    if !l.up {
        p.push(format!("pod interface {ifname} is down"));
    }
    if l.mtu != Some(want_mtu) {
        p.push(format!(
            "pod interface {ifname} MTU is {:?}, want {want_mtu}",
            l.mtu
        ));
    }
    if let (Some(want), Some(have)) = (prev_pod_mac, l.mac_string()) {
        if !want.eq_ignore_ascii_case(&have) {
            p.push(format!(
                "pod interface {ifname} MAC is {have}, prevResult says {want}"
            ));
        }
    }
    if let Some(ip) = w.v4 {
        p.extend(check_pod_v4(pod, ifname, &l, ip, &w.routes4, h_mac.as_deref(), veth).await?);
    }
    if w.v6.is_some() {
        p.extend(v6::check_v6(host, pod, veth, &h, ifname, &l, w).await?);
    }
    Ok(p)
}

/// The pod side of the IPv4 address `ip`: the /32, the gateway's link route and permanent
/// neighbour, the pod routes.
async fn check_pod_v4(
    pod: &Nl,
    ifname: &str,
    l: &Link,
    ip: std::net::Ipv4Addr,
    pod_routes: &[(std::net::Ipv4Addr, u8)],
    h_mac: Option<&str>,
    veth: &str,
) -> Result<Vec<String>, CniError> {
    let (addrs, routes, neigh) = futures::join!(
        pod.addrs_v4(l.index),
        pod.routes_v4(),
        pod.neighbours_v4(l.index)
    );
    let addrs = addrs.map_err(|e| nl_err(format!("pod: list addresses on {ifname}"), e))?;
    let mut p = Vec::new();
    if !addrs.contains(&(ip, 32)) {
        p.push(format!("pod address {ip}/32 on {ifname} missing"));
    }
    let routes = routes.map_err(|e| nl_err("pod: dump routes", e))?;
    if !routes.iter().any(|r| {
        r.in_main_table()
            && r.dst == GATEWAY
            && r.dst_len == 32
            && r.oif == Some(l.index)
            && r.scope == RouteScope::Link
    }) {
        p.push(format!(
            "pod route {GATEWAY}/32 dev {ifname} scope link missing"
        ));
    }
    for &(dst, len) in pod_routes {
        if !routes.iter().any(|r| {
            r.in_main_table()
                && r.dst == dst
                && r.dst_len == len
                && r.gateway == Some(GATEWAY)
                && r.oif == Some(l.index)
        }) {
            let what = if len == 0 {
                "default route".to_owned()
            } else {
                format!("route {dst}/{len}")
            };
            p.push(format!("pod {what} via {GATEWAY} dev {ifname} missing"));
        }
    }
    let neigh = neigh.map_err(|e| nl_err(format!("pod: list neighbours on {ifname}"), e))?;
    match neigh.iter().find(|(n, _, _)| *n == GATEWAY) {
        None => p.push(format!("pod neighbour {GATEWAY} on {ifname} missing")),
        Some((_, ll, permanent)) => {
            let have = ll.as_deref().map(format_mac);
            if have.as_deref() != h_mac {
                p.push(format!(
                    "pod neighbour {GATEWAY} on {ifname} points at {}, host veth {veth} is {}",
                    have.as_deref().unwrap_or("nothing"),
                    h_mac.unwrap_or("unknown")
                ));
            }
            if !permanent {
                p.push(format!(
                    "pod neighbour {GATEWAY} on {ifname} is not PERMANENT"
                ));
            }
        }
    }
    Ok(p)
}
