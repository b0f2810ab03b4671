//! CHECK of the IPv6 half of an attachment (see `wire.rs` for what ADD made).

use aliasnet_cni_types::CniError;

use crate::{
    nl::{format_mac, nl_err, Link, Nl, GATEWAY6},
    wiring::Wiring,
};

/// Host: the /128 to the pod through `veth` and the gateway address on `veth`. Pod: the
/// /128 (usable, not tentative), the gateway's permanent neighbour to the host veth's MAC,
/// the IPv6 pod routes.
pub async fn check_v6(
    host: &Nl,
    pod: &Nl,
    veth: &str,
    h: &Link,
    ifname: &str,
    l: &Link,
    w: &Wiring,
) -> Result<Vec<String>, CniError> {
    let Some(ip) = w.v6 else {
        return Ok(Vec::new());
    };
    let mut p = Vec::new();
    let (h_routes, h_addrs, addrs, routes, neigh) = futures::join!(
        host.routes_v6(),
        host.addrs_v6(h.index),
        pod.addrs_v6(l.index),
        pod.routes_v6(),
        pod.neighbours_v6(l.index)
    );
    let h_routes = h_routes.map_err(|e| nl_err("host: dump IPv6 routes", e))?;
    if !h_routes
        .iter()
        .any(|r| r.in_main_table() && r.dst == ip && r.dst_len == 128 && r.oif == Some(h.index))
    {
        p.push(format!("host route {ip}/128 via {veth} missing"));
    }
    let h_addrs = h_addrs.map_err(|e| nl_err(format!("host: list addresses on {veth}"), e))?;
    if !h_addrs.iter().any(|a| a.ip == GATEWAY6 && a.len == 64) {
        p.push(format!("host address {GATEWAY6}/64 on {veth} missing"));
    }
    let addrs = addrs.map_err(|e| nl_err(format!("pod: list addresses on {ifname}"), e))?;
    match addrs.iter().find(|a| a.ip == ip && a.len == 128) {
        None => p.push(format!("pod address {ip}/128 on {ifname} missing")),
        Some(a) if a.tentative => p.push(format!(
            "pod address {ip}/128 on {ifname} is tentative (duplicate address detection)"
        )),
        Some(_) => {}
    }
    let routes = routes.map_err(|e| nl_err("pod: dump IPv6 routes", e))?;
    for &(dst, len) in &w.routes6 {
        if !routes.iter().any(|r| {
            r.in_main_table()
                && r.dst == dst
                && r.dst_len == len
                && r.gateway == Some(GATEWAY6)
                && r.oif == Some(l.index)
        }) {
            let what = if len == 0 {
                "IPv6 default route".to_owned()
            } else {
                format!("route {dst}/{len}")
            };
            p.push(format!("pod {what} via {GATEWAY6} dev {ifname} missing"));
        }
    }
    let neigh = neigh.map_err(|e| nl_err(format!("pod: list neighbours on {ifname}"), e))?;
    let h_mac = h.mac_string();
    match neigh.iter().find(|(n, _, _)| *n == GATEWAY6) {
        None => p.push(format!("pod neighbour {GATEWAY6} on {ifname} missing")),
        Some((_, ll, permanent)) => {
            let have = ll.as_deref().map(format_mac);
            if have != h_mac {
                p.push(format!(
                    "pod neighbour {GATEWAY6} on {ifname} points at {}, host veth {veth} is {}",
                    have.as_deref().unwrap_or("nothing"),
                    h_mac.as_deref().unwrap_or("unknown")
                ));
            }
            if !permanent {
                p.push(format!(
                    "pod neighbour {GATEWAY6} on {ifname} is not PERMANENT"
                ));
            }
        }
    }
    Ok(p)
}
