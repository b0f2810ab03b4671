//! The veth pair over aliasnet-netlink: the requests that put a [`Plan`] on a pair, one batch per
//! side; the uplink's MTU (the pair's default); netlink failures as CNI errors (code 106).

use aliasnet_cni_types::{code, CniError};
use aliasnet_netlink::{addr, link, neigh, route, Link, NetlinkError, Rtnl};

use crate::plan::Plan;

/// The CNI error (code 106) for a failed netlink request; the message names the request.
pub fn to_cni(e: NetlinkError) -> CniError {
    CniError::new(code::NETLINK, e.to_string())
}

/// The MTU of the default route's device (the uplink); without one the operator must say.
pub fn uplink_mtu(host: &mut Rtnl) -> Result<u32, CniError> {
    match host.uplink() {
        Ok(Some(l)) => {
            tracing::debug!(dev = l.name, mtu = l.mtu, "MTU from the default route");
            Ok(l.mtu)
        }
        Ok(None) => Err(CniError::config(
            "mtu",
            "the host has no default route (IPv4 or IPv6) to take the MTU from; set \"mtu\" in the \
             config",
        )),
        Err(e) => Err(to_cni(
            e.with_op("host: dump routes to find the default route's MTU"),
        )),
    }
}

/// Both ends of a fresh veth pair and their sockets.
pub struct Pair<'a> {
    pub host: &'a mut Rtnl,
    pub pod: &'a mut Rtnl,
    /// The host end as the kernel made it (index, MAC, the peer's index).
    pub host_link: &'a Link,
    pub ifname: &'a str,
}

impl Pair<'_> {
    /// Brings the pod end up and wires `plan`: per family the pod's address, its gateway (a
    /// link route to it where needed, a permanent neighbour to the host veth's MAC) and its
    /// routes; the host's route to the pod and the gateway address where the family puts it
    /// on the host veth. One batch per side, the pod's ending with a read of its interface,
    /// which is returned. The first failure in request order is reported; every request ran.
    pub fn wire(&mut self, plan: &Plan) -> Result<Link, CniError> {
        let h = self.host_link;
        let (hi, veth) = (h.index, h.name.as_str());
        let pi = h.peer_index.ok_or_else(|| {
            CniError::new(
                code::NETLINK,
                format!("host veth {veth} does not name its peer"),
            )
        })?;
        let mac = h.mac.ok_or_else(|| {
            CniError::new(
                code::NETLINK,
                format!("host veth {veth} has no MAC address"),
            )
        })?;
        let ifname = self.ifname;

        let mut pod = self.pod.batch();
        pod.add(link::set_up(pi), format!("pod: set {ifname} up"));
        for f in &plan.families {
            let (ip, len, gw) = (f.ip, f.host_len(), f.gateway());
            let nodad = if ip.is_ipv6() { " nodad" } else { "" };
            pod.add(
                addr::add(pi, ip, len),
                format!("pod: add address {ip}/{len}{nodad} on {ifname}"),
            );
            if gw.needs_link_route {
                let l = f.host_len();
                pod.add(
                    route::add_link_route(pi, gw.ip, l),
                    format!("pod: add route {}/{l} dev {ifname} scope link", gw.ip),
                );
            }
            pod.add(
                neigh::add_permanent(pi, gw.ip, &mac),
                format!("pod: add permanent neighbour {} on {ifname}", gw.ip),
            );
            // After the gateway's link route: the kernel takes the batch in order.
            for &(dst, l) in &f.routes {
                pod.add(
                    route::add_gateway_route(pi, dst, l, gw.ip),
                    format!("pod: add route {dst}/{l} via {} dev {ifname}", gw.ip),
                );
            }
        }
        pod.add(link::get(pi), format!("pod: get {ifname}"));
        let mut replies = pod.replies().map_err(to_cni)?;
        let got = replies.pop().expect("the get is the last request");
        for r in replies {
            r.map_err(to_cni)?;
        }
        let pod_link = link::link_of(got).map_err(to_cni)?.ok_or_else(|| {
            CniError::new(
                code::NETLINK,
                format!("pod interface {ifname} vanished right after creation"),
            )
        })?;

        let mut host = self.host.batch();
        for f in &plan.families {
            let (ip, len, gw) = (f.ip, f.host_len(), f.gateway());
            if let Some(gl) = gw.on_host_veth {
                host.add(
                    addr::add(hi, gw.ip, gl),
                    format!("host: add address {}/{gl} nodad on {veth}", gw.ip),
                );
            }
            host.add(
                route::add_link_route(hi, ip, len),
                format!("host: add route {ip}/{len} dev {veth}"),
            );
        }
        host.run().map_err(to_cni)?;
        Ok(pod_link)
    }
}
