//! CHECK: every piece ADD made must still be there and right, the eBPF datapath attachment and
//! its limits included. All problems are collected and reported together, each naming the piece.

use std::net::IpAddr;

use aliasnet_cni_types::{code, AttachEnv, CniError, CniResult, NetConf};
use aliasnet_ipam_proto::{host_veth_name, AttachmentKey, Request, Response};
use aliasnet_netlink::{
    link::format_mac, netlink_packet_route::route::RouteScope, Family, Link, Rtnl,
};

use crate::{
    attachment, ipam,
    plan::{describe, FamilyPlan, Plan},
    pod_netns::PodNetns,
    sysctl,
    veth::{to_cni, uplink_mtu},
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
    let plan = Plan::from_prev_result(conf, &prev, pod_idx)?;

    let netns = PodNetns::open(&env.netns)?;
    // One short-lived thread in the pod's netns: its socket, and its IPv6 sysctls.
    let v6 = plan.v6().is_some();
    let (pod, pod_sysctls) = netns.run(|| {
        (
            Rtnl::new(),
            if v6 {
                sysctl::check_pod_ipv6(ifname)
            } else {
                Vec::new()
            },
        )
    })?;
    let mut pod = pod.map_err(|e| to_cni(e.with_op("pod: open a netlink socket")))?;
    let mut host = Rtnl::new().map_err(|e| to_cni(e.with_op("host: open a netlink socket")))?;
    let want_mtu = match pod_if.mtu.or(conf.mtu) {
        Some(m) => m,
        None => uplink_mtu(&mut host)?,
    };
    let links = Links {
        host: &mut host,
        pod: &mut pod,
        veth: &veth,
        ifname,
    };
    let mut problems = links.problems(
        &plan,
        want_mtu,
        host_if.and_then(|i| i.mac.as_deref()),
        pod_if.mac.as_deref(),
    )?;
    if v6 {
        problems.extend(sysctl::check_ipv6_forward());
        problems.extend(pod_sysctls);
    }
    problems.extend(attachment::problems(
        conf,
        &env.container_id,
        ifname,
        &veth,
        plan.v4(),
        plan.v6(),
    )?);

    let want = plan.addrs();
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

/// The host veth and the pod's interface, and the sockets of their namespaces.
struct Links<'a> {
    host: &'a mut Rtnl,
    pod: &'a mut Rtnl,
    veth: &'a str,
    ifname: &'a str,
}

impl Links<'_> {
    /// The pair (both ends, peers of each other, up, the MTU and the MACs ADD reported), then
    /// every family of `plan`.
    fn problems(
        mut self,
        plan: &Plan,
        want_mtu: u32,
        prev_host_mac: Option<&str>,
        prev_pod_mac: Option<&str>,
    ) -> Result<Vec<String>, CniError> {
        let (veth, ifname) = (self.veth, self.ifname);
        let mut p = Vec::new();
        let h = self
            .host
            .link_by_name(veth)
            .map_err(|e| to_cni(e.with_op(format!("host: get {veth}"))))?;
        let l = self
            .pod
            .link_by_name(ifname)
            .map_err(|e| to_cni(e.with_op(format!("pod: get {ifname}"))))?;
        let Some(h) = h else {
            p.push(format!("host veth {veth} missing"));
            if l.is_none() {
                p.push(format!("pod interface {ifname} missing"));
            }
            return Ok(p);
        };
        if !h.is_veth() {
            p.push(format!("host interface {veth} is not a veth"));
        }
        if !h.up {
            p.push(format!("host veth {veth} is down"));
        }
        if h.mtu != want_mtu {
            p.push(format!(
                "host veth {veth} MTU is {:?}, want {want_mtu}",
                Some(h.mtu)
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
        let l = match l {
            Some(l) => l,
            None => {
                // The host side can still be checked.
                for f in &plan.families {
                    p.extend(self.check_host_family(f, &h)?);
                }
                p.push(format!("pod interface {ifname} missing"));
                return Ok(p);
            }
        };
        if !l.is_veth() || h.peer_index != Some(l.index) {
            p.push(format!(
                "pod interface {ifname} is not the peer of host veth {veth}"
            ));
        }
        if !l.up {
            p.push(format!("pod interface {ifname} is down"));
        }
        if l.mtu != want_mtu {
            p.push(format!(
                "pod interface {ifname} MTU is {:?}, want {want_mtu}",
                Some(l.mtu)
            ));
        }
        if let (Some(want), Some(have)) = (prev_pod_mac, l.mac_string()) {
            if !want.eq_ignore_ascii_case(&have) {
                p.push(format!(
                    "pod interface {ifname} MAC is {have}, prevResult says {want}"
                ));
            }
        }
        for f in &plan.families {
            p.extend(self.check_host_family(f, &h)?);
            p.extend(self.check_pod_family(f, &l, &h)?);
        }
        Ok(p)
    }

    /// The host's side of one family: the host route to the pod through the veth, and the
    /// gateway address where the family puts it on the veth.
    fn check_host_family(&mut self, f: &FamilyPlan, h: &Link) -> Result<Vec<String>, CniError> {
        let veth = self.veth;
        let (ip, len, gw) = (f.ip, f.host_len(), f.gateway());
        let family = Family::of(ip);
        let mut p = Vec::new();
        let routes = self
            .host
            .routes(family)
            .map_err(|e| to_cni(e.with_op(format!("host: dump {} routes", family_name(family)))))?;
        if !routes
            .iter()
            .any(|r| r.in_main_table() && r.dst == ip && r.dst_len == len && r.oif == Some(h.index))
        {
            p.push(format!("host route {ip}/{len} via {veth} missing"));
        }
        if let Some(gl) = gw.on_host_veth {
            let addrs = self
                .host
                .addrs(h.index, family)
                .map_err(|e| to_cni(e.with_op(format!("host: list addresses on {veth}"))))?;
            if !addrs.iter().any(|a| a.ip == gw.ip && a.len == gl) {
                p.push(format!("host address {}/{gl} on {veth} missing", gw.ip));
            }
        }
        Ok(p)
    }

    /// The pod's side of one family: its address (usable, not tentative), the gateway's link
    /// route where needed and its permanent neighbour to the host veth's MAC, the pod routes.
    fn check_pod_family(
        &mut self,
        f: &FamilyPlan,
        l: &Link,
        h: &Link,
    ) -> Result<Vec<String>, CniError> {
        let (veth, ifname) = (self.veth, self.ifname);
        let (ip, len, gw) = (f.ip, f.host_len(), f.gateway());
        let family = Family::of(ip);
        let mut p = Vec::new();
        let addrs = self
            .pod
            .addrs(l.index, family)
            .map_err(|e| to_cni(e.with_op(format!("pod: list addresses on {ifname}"))))?;
        match addrs.iter().find(|a| a.ip == ip && a.len == len) {
            None => p.push(format!("pod address {ip}/{len} on {ifname} missing")),
            Some(a) if a.tentative => p.push(format!(
                "pod address {ip}/{len} on {ifname} is tentative (duplicate address detection)"
            )),
            Some(_) => {}
        }
        let routes = self
            .pod
            .routes(family)
            .map_err(|e| to_cni(e.with_op(format!("pod: dump {} routes", family_name(family)))))?;
        if gw.needs_link_route
            && !routes.iter().any(|r| {
                r.in_main_table()
                    && r.dst == gw.ip
                    && r.dst_len == len
                    && r.oif == Some(l.index)
                    && r.scope == RouteScope::Link
            })
        {
            p.push(format!(
                "pod route {}/{len} dev {ifname} scope link missing",
                gw.ip
            ));
        }
        for &(dst, dlen) in &f.routes {
            if !routes.iter().any(|r| {
                r.in_main_table()
                    && r.dst == dst
                    && r.dst_len == dlen
                    && r.gateway == Some(gw.ip)
                    && r.oif == Some(l.index)
            }) {
                let what = if dlen == 0 {
                    f.default_route_name().to_owned()
                } else {
                    format!("route {dst}/{dlen}")
                };
                p.push(format!("pod {what} via {} dev {ifname} missing", gw.ip));
            }
        }
        let neigh = self
            .pod
            .neighbours(l.index, family)
            .map_err(|e| to_cni(e.with_op(format!("pod: list neighbours on {ifname}"))))?;
        let h_mac = h.mac_string();
        match neigh.iter().find(|n| n.ip == gw.ip) {
            None => p.push(format!("pod neighbour {} on {ifname} missing", gw.ip)),
            Some(n) => {
                let have = n.lladdr.as_deref().map(format_mac);
                if have != h_mac {
                    p.push(format!(
                        "pod neighbour {} on {ifname} points at {}, host veth {veth} is {}",
                        gw.ip,
                        have.as_deref().unwrap_or("nothing"),
                        h_mac.as_deref().unwrap_or("unknown")
                    ));
                }
                if !n.permanent {
                    p.push(format!(
                        "pod neighbour {} on {ifname} is not PERMANENT",
                        gw.ip
                    ));
                }
            }
        }
        Ok(p)
    }
}

fn family_name(f: Family) -> &'static str {
    match f {
        Family::Ipv4 => "IPv4",
        Family::Ipv6 => "IPv6",
    }
}
