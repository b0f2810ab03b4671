//! What one attachment's addresses become on the wire, derived from the leases (or a
//! `prevResult`) and the config alone: ADD creates it, CHECK compares against it, and the ADD
//! result is printed from it. Pure, so it is unit-tested without root.
//!
//! Per family the pod gets its address as a host route (/32, /128) on its interface, a
//! link-local gateway with a permanent neighbour entry to the host veth's MAC, and its pod
//! routes via that gateway; the host gets a host route to the pod through the veth.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aliasnet_cni_types::{code, CniError, CniResult, IpConfig, IpFamily, IpNet, NetConf, Route};

use crate::nl::{GATEWAY, GATEWAY6};

/// The addresses of one attachment and the pod routes of each family present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wiring {
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
    /// IPv4 pod routes via [`GATEWAY`] (empty without an IPv4 address).
    pub routes4: Vec<(Ipv4Addr, u8)>,
    /// IPv6 pod routes via [`GATEWAY6`] (empty without an IPv6 address).
    pub routes6: Vec<(Ipv6Addr, u8)>,
}

impl Wiring {
    /// At most one address per family, at least one address.
    pub fn new(conf: &NetConf, addrs: &[IpAddr]) -> Result<Self, String> {
        let mut v4 = None;
        let mut v6 = None;
        for &a in addrs {
            let dup = match a {
                IpAddr::V4(a) => v4.replace(a).is_some(),
                IpAddr::V6(a) => v6.replace(a).is_some(),
            };
            if dup {
                return Err(format!(
                    "more than one {} address ({addrs:?})",
                    IpFamily::of(a)
                ));
            }
        }
        if v4.is_none() && v6.is_none() {
            return Err("no address".into());
        }
        let routes4 = match v4 {
            None => vec![],
            Some(_) => conf
                .pod_routes_for(IpFamily::Ipv4)
                .into_iter()
                .filter_map(|r| match r.addr {
                    IpAddr::V4(a) => Some((a, r.prefix_len)),
                    IpAddr::V6(_) => None,
                })
                .collect(),
        };
        let routes6 = match v6 {
            None => vec![],
            Some(_) => conf
                .pod_routes_for(IpFamily::Ipv6)
                .into_iter()
                .filter_map(|r| match r.addr {
                    IpAddr::V6(a) => Some((a, r.prefix_len)),
                    IpAddr::V4(_) => None,
                })
                .collect(),
        };
        Ok(Self {
            v4,
            v6,
            routes4,
            routes6,
        })
    }

    /// The addresses, IPv4 first.
    pub fn addrs(&self) -> Vec<IpAddr> {
        self.v4
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.v6.map(IpAddr::V6))
            .collect()
    }

    /// The families present, IPv4 first (the order `ipFamilies` is kept in).
    pub fn families(&self) -> Vec<IpFamily> {
        self.addrs().into_iter().map(IpFamily::of).collect()
    }

    /// With `ipFamilies`, exactly those families: a daemon that predates the key ignores it
    /// and would otherwise hand out whatever its pools serve.
    pub fn check_families(&self, conf: &NetConf) -> Result<(), String> {
        match &conf.ip_families {
            Some(want) if *want != self.families() => Err(format!(
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
        let v4 = self.v4.map(|a| IpConfig {
            address: IpNet::new(IpAddr::V4(a), 32),
            gateway: Some(IpAddr::V4(GATEWAY)),
            interface: Some(pod_if),
        });
        let v6 = self.v6.map(|a| IpConfig {
            address: IpNet::new(IpAddr::V6(a), 128),
            gateway: Some(IpAddr::V6(GATEWAY6)),
            interface: Some(pod_if),
        });
        v4.into_iter().chain(v6).collect()
    }

    /// `routes` of the result: IPv4's, then IPv6's.
    pub fn routes(&self) -> Vec<Route> {
        let r4 = self
            .routes4
            .iter()
            .map(|&(d, l)| Route::new(IpNet::new(IpAddr::V4(d), l), Some(IpAddr::V4(GATEWAY))));
        let r6 = self
            .routes6
            .iter()
            .map(|&(d, l)| Route::new(IpNet::new(IpAddr::V6(d), l), Some(IpAddr::V6(GATEWAY6))));
        r4.chain(r6).collect()
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
        let w = Wiring::new(&conf(json!({})), &[ip("10.240.1.5")]).unwrap();
        assert_eq!(w.v6, None);
        assert_eq!(w.routes4, vec![(Ipv4Addr::UNSPECIFIED, 0)]);
        assert!(w.routes6.is_empty());
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
        let w = Wiring::new(&c, &[ip("fd00:240:1::5"), ip("10.240.1.5")]).unwrap();
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
        let w = Wiring::new(&conf(json!({})), &[ip("2001:db8::7")]).unwrap();
        assert_eq!(w.v4, None);
        assert!(w.routes4.is_empty());
        assert_eq!(w.routes6, vec![(Ipv6Addr::UNSPECIFIED, 0)]);
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
        let w = Wiring::new(&dual, &[ip("10.0.0.1")]).unwrap();
        let e = w.check_families(&dual).unwrap_err();
        assert!(e.contains("ipv4, ipv6") && e.contains("10.0.0.1"), "{e}");
        let w = Wiring::new(&dual, &[ip("fd00::1"), ip("10.0.0.1")]).unwrap();
        assert_eq!(w.families(), vec![IpFamily::Ipv4, IpFamily::Ipv6]);
        w.check_families(&dual).unwrap();
        let v6 = conf(json!({"ipFamilies": ["ipv6"]}));
        assert!(Wiring::new(&v6, &[ip("10.0.0.1")])
            .unwrap()
            .check_families(&v6)
            .is_err());
        // Without the key, whatever the daemon serves.
        let any = conf(json!({}));
        for addrs in [vec![ip("10.0.0.1")], vec![ip("fd00::1")]] {
            Wiring::new(&any, &addrs)
                .unwrap()
                .check_families(&any)
                .unwrap();
        }
    }

    #[test]
    fn refused_address_sets() {
        let c = conf(json!({}));
        assert!(Wiring::new(&c, &[]).unwrap_err().contains("no address"));
        let e = Wiring::new(&c, &[ip("10.0.0.1"), ip("10.0.0.2")]).unwrap_err();
        assert!(e.contains("more than one ipv4"), "{e}");
        let e = Wiring::new(&c, &[ip("fd00::1"), ip("fd00::2")]).unwrap_err();
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
        let w = Wiring::from_prev_result(&c, &prev, 2).unwrap();
        assert_eq!(w.addrs(), vec![ip("10.240.1.5"), ip("fd00:240:1::5")]);
        let e = Wiring::from_prev_result(&c, &prev, 1).unwrap_err();
        assert_eq!(e.code, code::CHECK_FAILED);
        assert!(
            e.msg.contains("ali1") && e.msg.contains("no address"),
            "{}",
            e.msg
        );
    }
}
