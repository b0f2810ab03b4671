//! What one attachment's addresses become on the wire, derived from the leases (or a
//! `prevResult`) and the config alone: ADD creates it, CHECK compares against it, and the ADD
//! result is printed from it. Pure, so it is unit-tested without root.
//!
//! Per family the pod gets its address as a host route (/32, /128) on its interface, a
//! link-local gateway with a permanent neighbour entry to the host veth's MAC, and its pod
//! routes via that gateway; the host gets a host route to the pod through the veth. The
//! families differ in their gateway only (see [`Gateway`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aliasnet_cni_types::{code, CniError, CniResult, IpConfig, IpFamily, IpNet, NetConf, Route};

/// The IPv4 gateway every pod routes through; answered by the permanent neighbour entry.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// The pod's IPv6 gateway. Link-local, so the same on every veth; the host veth carries it
/// (the pod can ping its gateway, and the host's neighbour solicitations towards the pod have
/// a valid source from the first packet on) and the pod holds a permanent neighbour for it.
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// How a pod of one family reaches its gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gateway {
    pub ip: IpAddr,
    /// IPv4's gateway is not on the pod's link: a /32 link route makes it so. IPv6's is
    /// link-local, on every link.
    pub needs_link_route: bool,
    /// The host veth carries the gateway address with this prefix (IPv6's `fe80::1/64`).
    pub on_host_veth: Option<u8>,
}

impl Gateway {
    pub fn of(family: IpFamily) -> Self {
        match family {
            IpFamily::Ipv4 => Gateway {
                ip: IpAddr::V4(GATEWAY),
                needs_link_route: true,
                on_host_veth: None,
            },
            IpFamily::Ipv6 => Gateway {
                ip: IpAddr::V6(GATEWAY6),
                needs_link_route: false,
                on_host_veth: Some(64),
            },
        }
    }
}

/// One family of an attachment: the pod's address and its routes via the family's gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyPlan {
    pub ip: IpAddr,
    /// Pod routes via [`FamilyPlan::gateway`] (the family's default route unless `podRoutes`
    /// names some of this family).
    pub routes: Vec<(IpAddr, u8)>,
}

impl FamilyPlan {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.ip)
    }

    pub fn gateway(&self) -> Gateway {
        Gateway::of(self.family())
    }

    /// The prefix length of the pod's host route (/32, /128).
    pub fn host_len(&self) -> u8 {
        match self.ip {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        }
    }

    /// How messages name this family's default route ("default route", "IPv6 default route").
    pub fn default_route_name(&self) -> &'static str {
        match self.family() {
            IpFamily::Ipv4 => "default route",
            IpFamily::Ipv6 => "IPv6 default route",
        }
    }
}

/// The addresses of one attachment: at most one per family, IPv4 first, at least one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub families: Vec<FamilyPlan>,
}

impl Plan {
    /// At most one address per family, at least one address.
    pub fn new(conf: &NetConf, addrs: &[IpAddr]) -> Result<Self, String> {
        let mut families: Vec<FamilyPlan> = Vec::with_capacity(2);
        for &a in addrs {
            if families.iter().any(|f| f.family() == IpFamily::of(a)) {
                return Err(format!(
                    "more than one {} address ({addrs:?})",
                    IpFamily::of(a)
                ));
            }
            let routes = conf
                .pod_routes_for(IpFamily::of(a))
                .into_iter()
                .filter(|r| IpFamily::of(r.addr) == IpFamily::of(a))
                .map(|r| (r.addr, r.prefix_len))
                .collect();
            families.push(FamilyPlan { ip: a, routes });
        }
        if families.is_empty() {
            return Err("no address".into());
        }
        families.sort_by_key(FamilyPlan::family);
        Ok(Self { families })
    }

    /// The addresses, IPv4 first.
    pub fn addrs(&self) -> Vec<IpAddr> {
        self.families.iter().map(|f| f.ip).collect()
    }

    /// The families present, IPv4 first (the order `ipFamilies` is kept in).
    pub fn family_list(&self) -> Vec<IpFamily> {
        self.families.iter().map(FamilyPlan::family).collect()
    }

    pub fn v4(&self) -> Option<Ipv4Addr> {
        self.families.iter().find_map(|f| match f.ip {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        })
    }

    pub fn v6(&self) -> Option<Ipv6Addr> {
        self.families.iter().find_map(|f| match f.ip {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        })
    }

    /// With `ipFamilies`, exactly those families: a daemon that predates the key ignores it
    /// and would otherwise hand out whatever its pools serve.
    pub fn check_families(&self, conf: &NetConf) -> Result<(), String> {
        match &conf.ip_families {
            Some(want) if *want != self.family_list() => Err(format!(
                "ipFamilies asks for {} but the leases are {} (is aliasnet-ipamd older than \
                 ipFamilies?)",
                want.iter()
                    .map(|f| f.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                describe(&self.addrs())
            )),
            _ => Ok(()),
        }
    }

    /// `ips` of the result: IPv4 first, each on interface `pod_if` with its gateway.
    pub fn ips(&self, pod_if: usize) -> Vec<IpConfig> {
        self.families
            .iter()
            .map(|f| IpConfig {
                address: IpNet::new(f.ip, f.host_len()),
                gateway: Some(f.gateway().ip),
                interface: Some(pod_if),
            })
            .collect()
    }

    /// `routes` of the result: IPv4's, then IPv6's.
    pub fn routes(&self) -> Vec<Route> {
        self.families
            .iter()
            .flat_map(|f| {
                let gw = f.gateway().ip;
                f.routes
                    .iter()
                    .map(move |&(d, l)| Route::new(IpNet::new(d, l), Some(gw)))
            })
            .collect()
    }

    /// What an earlier ADD recorded for the interface at `pod_if` of `prev`: its addresses
    /// (at most one per family; anything else is a CHECK failure, code 107).
    pub fn from_prev_result(
        conf: &NetConf,
        prev: &CniResult,
        pod_if: usize,
    ) -> Result<Self, CniError> {
        let ifname = &prev.interfaces[pod_if].name;
        let addrs: Vec<IpAddr> = prev
            .ips
            .iter()
            .filter(|c| c.interface == Some(pod_if))
            .map(|c| c.address.addr)
            .collect();
        Self::new(conf, &addrs).map_err(|e| {
            CniError::new(
                code::CHECK_FAILED,
                format!("prevResult's addresses on {ifname}: {e}"),
            )
        })
    }
}

/// One line naming `addrs` for logs and messages (`10.0.0.5, fd00::5`).
pub fn describe(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn conf(extra: serde_json::Value) -> NetConf {
        let mut c = json!({"cniVersion": "1.0.0", "name": "n", "type": "aliasnet"});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        NetConf::parse(&serde_json::to_vec(&c).unwrap()).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_only_is_what_it_always_was() {
        let w = Plan::new(&conf(json!({})), &[ip("10.240.1.5")]).unwrap();
        assert_eq!(w.v6(), None);
        assert_eq!(w.families.len(), 1);
        assert_eq!(w.families[0].routes, vec![(ip("0.0.0.0"), 0)]);
        let r = CniResult {
            ips: w.ips(1),
            routes: w.routes(),
            ..Default::default()
        };
        let doc = r.to_json(aliasnet_cni_types::CniVersion::V1_0_0);
        assert_eq!(
            doc["ips"],
            json!([{"address": "10.240.1.5/32", "gateway": "169.254.1.1", "interface": 1}])
        );
        assert_eq!(
            doc["routes"],
            json!([{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}])
        );
    }

    #[test]
    fn dual_stack_lists_ipv4_first_whatever_the_lease_order() {
        let c = conf(json!({"podRoutes": ["10.0.0.0/8", "fd00::/8", "2001:db8::/32"]}));
        let w = Plan::new(&c, &[ip("fd00:240:1::5"), ip("10.240.1.5")]).unwrap();
        assert_eq!(w.addrs(), vec![ip("10.240.1.5"), ip("fd00:240:1::5")]);
        let ips = w.ips(3);
        assert_eq!(ips[0].address.to_string(), "10.240.1.5/32");
        assert_eq!(ips[1].address.to_string(), "fd00:240:1::5/128");
        assert_eq!(ips[1].gateway, Some(ip("fe80::1")));
        assert!(ips.iter().all(|i| i.interface == Some(3)));
        let routes: Vec<String> = w
            .routes()
            .iter()
            .map(|r| format!("{} via {}", r.dst, r.gw.unwrap()))
            .collect();
        assert_eq!(
            routes,
            [
                "10.0.0.0/8 via 169.254.1.1",
                "fd00::/8 via fe80::1",
                "2001:db8::/32 via fe80::1"
            ]
        );
    }

    #[test]
    fn ipv6_only_gets_no_ipv4_routes() {
        let w = Plan::new(&conf(json!({})), &[ip("2001:db8::7")]).unwrap();
        assert_eq!(w.v4(), None);
        assert_eq!(w.families.len(), 1);
        assert_eq!(w.families[0].routes, vec![(ip("::"), 0)]);
        let doc = CniResult {
            ips: w.ips(1),
            routes: w.routes(),
            ..Default::default()
        }
        .to_json(aliasnet_cni_types::CniVersion::V0_4_0);
        assert_eq!(
            doc["ips"],
            json!([{"version": "6", "address": "2001:db8::7/128", "gateway": "fe80::1", "interface": 1}])
        );
        assert_eq!(doc["routes"], json!([{"dst": "::/0", "gw": "fe80::1"}]));
    }

    #[test]
    fn leases_must_match_ip_families() {
        let dual = conf(json!({"ipFamilies": ["ipv6", "ipv4"]}));
        let w = Plan::new(&dual, &[ip("10.0.0.1")]).unwrap();
        let e = w.check_families(&dual).unwrap_err();
        assert!(e.contains("ipv4, ipv6") && e.contains("10.0.0.1"), "{e}");
        let w = Plan::new(&dual, &[ip("fd00::1"), ip("10.0.0.1")]).unwrap();
        assert_eq!(w.family_list(), vec![IpFamily::Ipv4, IpFamily::Ipv6]);
        w.check_families(&dual).unwrap();
        let v6 = conf(json!({"ipFamilies": ["ipv6"]}));
        assert!(Plan::new(&v6, &[ip("10.0.0.1")])
            .unwrap()
            .check_families(&v6)
            .is_err());
        // Without the key, whatever the daemon serves.
        let any = conf(json!({}));
        for addrs in [vec![ip("10.0.0.1")], vec![ip("fd00::1")]] {
            Plan::new(&any, &addrs)
                .unwrap()
                .check_families(&any)
                .unwrap();
        }
    }

    #[test]
    fn refused_address_sets() {
        let c = conf(json!({}));
        assert!(Plan::new(&c, &[]).unwrap_err().contains("no address"));
        let e = Plan::new(&c, &[ip("10.0.0.1"), ip("10.0.0.2")]).unwrap_err();
        assert!(e.contains("more than one ipv4"), "{e}");
        let e = Plan::new(&c, &[ip("fd00::1"), ip("fd00::2")]).unwrap_err();
        assert!(e.contains("more than one ipv6"), "{e}");
    }

    #[test]
    fn from_prev_result_reads_our_interface_only() {
        let c = conf(json!({}));
        let prev = CniResult::from_prev_result(&json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "net1", "sandbox": "/x"}, {"name": "ali1"}, {"name": "eth0", "sandbox": "/x"}],
            "ips": [
                {"address": "192.168.0.2/24", "interface": 0},
                {"address": "10.240.1.5/32", "interface": 2},
                {"address": "fd00:240:1::5/128", "interface": 2}
            ]
        }))
        .unwrap();
        let w = Plan::from_prev_result(&c, &prev, 2).unwrap();
        assert_eq!(w.addrs(), vec![ip("10.240.1.5"), ip("fd00:240:1::5")]);
        let e = Plan::from_prev_result(&c, &prev, 1).unwrap_err();
        assert_eq!(e.code, code::CHECK_FAILED);
        assert!(
            e.msg.contains("ali1") && e.msg.contains("no address"),
            "{}",
            e.msg
        );
    }
}
