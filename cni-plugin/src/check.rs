//! CHECK: every piece ADD made must still be there and right, the eBPF datapath attachment and
//! its limits included. All problems are collected and reported together, each naming the piece.

use std::net::{IpAddr, Ipv4Addr};

use aliasnet_cni_types::{code, AttachEnv, CniError, CniResult, NetConf};
use aliasnet_ipam_proto::{host_veth_name, AttachmentKey, Request, Response};
use rtnetlink::packet_route::route::RouteScope;

use crate::{
    datapath, ipam,
    netns::NetNs,
    nl::{format_mac, nl_err, Nl, GATEWAY},
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

    // Our entries in prevResult: the pod interface (with a sandbox) and its IPv4 address.
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
    let Some(ip) = prev.ips.iter().find_map(|c| match c.address.addr {
        IpAddr::V4(a) if c.interface == Some(pod_idx) => Some(a),
        _ => None,
    }) else {
        return Err(fail(format!(
            "prevResult lists no IPv4 address on {ifname}"
        )));
    };

    let netns = NetNs::open(&env.netns)?;
    let rt = crate::runtime()?;
    let problems = rt.block_on(async {
        let host = Nl::connect()?;
        let pod = netns.enter(Nl::connect)??;
        let want_mtu = match pod_if.mtu.or(conf.mtu) {
            Some(m) => m,
            None => crate::add::detect_mtu(&host).await?,
        };
        check_datapath(
            &host,
            &pod,
            &veth,
            ifname,
            ip,
            want_mtu,
            host_if.and_then(|i| i.mac.as_deref()),
            pod_if.mac.as_deref(),
            &crate::add::v4_routes(conf).collect::<Vec<_>>(),
        )
        .await
    });
    rt.shutdown_background();
    let mut problems = problems?;
    problems.extend(datapath::check(conf, &env.container_id, ifname, &veth, ip)?);

    match ipam::call(conf, &Request::Check { key: key.clone() }) {
        Ok(Response::Lease { lease: Some(l), .. }) if l.address == ip => {}
        Ok(Response::Lease { lease: Some(l), .. }) => problems.push(format!(
            "IPAM reservation for {key} holds {}, prevResult says {ip}",
            l.address
        )),
        Ok(Response::Lease { lease: None, .. }) => {
            problems.push(format!("IPAM reservation for {key} ({ip}) missing"))
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
    ip: Ipv4Addr,
    want_mtu: u32,
    prev_host_mac: Option<&str>,
    prev_pod_mac: Option<&str>,
    pod_routes: &[(Ipv4Addr, u8)],
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
    let (addrs, routes, neigh) = futures::join!(
        pod.addrs_v4(l.index),
        pod.routes_v4(),
        pod.neighbours_v4(l.index)
    );
    let addrs = addrs.map_err(|e| nl_err(format!("pod: list addresses on {ifname}"), e))?;
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
            if have != h_mac {
                p.push(format!(
                    "pod neighbour {GATEWAY} on {ifname} points at {}, host veth {veth} is {}",
                    have.as_deref().unwrap_or("nothing"),
                    h_mac.as_deref().unwrap_or("unknown")
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
