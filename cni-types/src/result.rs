//! The ADD result, parsed from `prevResult` (any supported version) and printed per version.
//!
//! One in-memory shape; [`CniResult::to_json`] writes the 0.3.x/0.4.0 form (`ips[].version`,
//! interfaces without `mtu`) or the 1.x form.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{CniError, CniVersion, IpNet};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub dns: Dns,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The netns path for interfaces inside the container; absent for host interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    #[serde(
        default,
        rename = "socketPath",
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    #[serde(default, rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u32>,
}

impl Route {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Self {
        Self {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

impl CniResult {
    /// Parse a `prevResult` of any supported version (`ips[].version` is ignored).
    pub fn from_prev_result(v: &Value) -> Result<Self, CniError> {
        // serde would also take a struct from an array; a result is only ever an object.
        if !v.is_object() {
            return Err(CniError::config("prevResult", "must be an object"));
        }
        let r: Self =
            serde_json::from_value(v.clone()).map_err(|e| CniError::config("prevResult", e))?;
        for (i, ip) in r.ips.iter().enumerate() {
            if let Some(idx) = ip.interface {
                if idx >= r.interfaces.len() {
                    return Err(CniError::config(
                        "prevResult",
                        format!("ips[{i}].interface {idx} is out of range"),
                    ));
                }
            }
        }
        Ok(r)
    }

    /// Append `ours` after the interfaces, IPs and routes already here (the chained-plugin
    /// pass-through), fixing up `ours`' interface indices. Non-empty DNS in `ours` wins.
    pub fn merge(&mut self, ours: CniResult) {
        let offset = self.interfaces.len();
        self.interfaces.extend(ours.interfaces);
        self.ips.extend(ours.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i + offset);
            ip
        }));
        self.routes.extend(ours.routes);
        if !ours.dns.is_empty() {
            self.dns = ours.dns;
        }
    }

    /// The result document for `version`.
    pub fn to_json(&self, version: CniVersion) -> Value {
        let legacy = version.legacy_result();
        let mut doc = Map::new();
        doc.insert("cniVersion".into(), version.as_str().into());
        if !self.interfaces.is_empty() {
            let ifs = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut v = to_map(i);
                    if legacy {
                        // 0.3.x/0.4.0 interfaces have only name, mac and sandbox.
                        for k in ["mtu", "socketPath", "pciID"] {
                            v.remove(k);
                        }
                    }
                    Value::Object(v)
                })
                .collect();
            doc.insert("interfaces".into(), Value::Array(ifs));
        }
        if !self.ips.is_empty() {
            let ips = self
                .ips
                .iter()
                .map(|ip| {
                    let mut v = to_map(ip);
                    if legacy {
                        let fam = if ip.address.is_ipv4() { "4" } else { "6" };
                        v.insert("version".into(), fam.into());
                    }
                    Value::Object(v)
                })
                .collect();
            doc.insert("ips".into(), Value::Array(ips));
        }
        if !self.routes.is_empty() {
            let routes = self
                .routes
                .iter()
                .map(|r| {
                    let mut v = to_map(r);
                    if legacy {
                        v.retain(|k, _| k == "dst" || k == "gw");
                    }
                    Value::Object(v)
                })
                .collect();
            doc.insert("routes".into(), Value::Array(routes));
        }
        doc.insert("dns".into(), Value::Object(to_map(&self.dns)));
        Value::Object(doc)
    }
}

fn to_map<T: Serialize>(t: &T) -> Map<String, Value> {
    match serde_json::to_value(t).expect("result types serialise") {
        Value::Object(m) => m,
        _ => unreachable!("result types are structs"),
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use serde_json::json;

    use super::*;
    use crate::SUPPORTED_VERSIONS as SUPPORTED;

    fn sample() -> CniResult {
        let gw = IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1));
        CniResult {
            interfaces: vec![
                Interface {
                    name: "ali0123456789ab".into(),
                    mac: Some("02:00:00:00:00:01".into()),
                    ..Default::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("02:00:00:00:00:02".into()),
                    mtu: Some(1500),
                    sandbox: Some("/var/run/netns/cni-1".into()),
                    ..Default::default()
                },
            ],
            ips: vec![IpConfig {
                address: "10.240.1.5/32".parse().unwrap(),
                gateway: Some(gw),
                interface: Some(1),
            }],
            routes: vec![Route::new("0.0.0.0/0".parse().unwrap(), Some(gw))],
            dns: Dns::default(),
        }
    }

    #[test]
    fn per_version_serialisation() {
        let r = sample();
        let v1 = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "ali0123456789ab", "mac": "02:00:00:00:00:01"},
                {"name": "eth0", "mac": "02:00:00:00:00:02", "mtu": 1500, "sandbox": "/var/run/netns/cni-1"}
            ],
            "ips": [{"address": "10.240.1.5/32", "gateway": "169.254.1.1", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
            "dns": {}
        });
        assert_eq!(r.to_json(CniVersion::V1_0_0), v1);
        let mut v11 = v1.clone();
        v11["cniVersion"] = "1.1.0".into();
        assert_eq!(r.to_json(CniVersion::V1_1_0), v11);
        for legacy in [CniVersion::V0_3_0, CniVersion::V0_3_1, CniVersion::V0_4_0] {
            let want = json!({
                "cniVersion": legacy.as_str(),
                "interfaces": [
                    {"name": "ali0123456789ab", "mac": "02:00:00:00:00:01"},
                    {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/var/run/netns/cni-1"}
                ],
                "ips": [{"version": "4", "address": "10.240.1.5/32", "gateway": "169.254.1.1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
                "dns": {}
            });
            assert_eq!(r.to_json(legacy), want, "{legacy}");
        }
    }

    #[test]
    fn prev_result_round_trips_in_both_formats() {
        let r = sample();
        for v in [CniVersion::V0_4_0, CniVersion::V1_1_0] {
            let back = CniResult::from_prev_result(&r.to_json(v)).unwrap();
            if v.legacy_result() {
                // The legacy form has no interface MTU.
                let mut want = r.clone();
                want.interfaces[1].mtu = None;
                assert_eq!(back, want);
            } else {
                assert_eq!(back, r);
            }
        }
    }

    #[test]
    fn merge_offsets_interface_indices() {
        let mut prev = CniResult::from_prev_result(&json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "net1", "sandbox": "/x"}],
            "ips": [{"address": "192.168.0.2/24", "interface": 0}],
            "dns": {"nameservers": ["10.0.0.10"]}
        }))
        .unwrap();
        prev.merge(sample());
        assert_eq!(prev.interfaces.len(), 3);
        assert_eq!(prev.ips[0].interface, Some(0));
        assert_eq!(prev.ips[1].interface, Some(2));
        assert_eq!(prev.dns.nameservers, vec!["10.0.0.10".to_string()]);
    }

    /// A dual-stack attachment: IPv4 then IPv6 on the pod interface, a route per family.
    fn dual_stack() -> CniResult {
        let gw4 = IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1));
        let gw6: IpAddr = "fe80::1".parse().unwrap();
        let mut r = sample();
        r.ips.push(IpConfig {
            address: "fd00:240:1::5/128".parse().unwrap(),
            gateway: Some(gw6),
            interface: Some(1),
        });
        r.routes = vec![
            Route::new("0.0.0.0/0".parse().unwrap(), Some(gw4)),
            Route::new("::/0".parse().unwrap(), Some(gw6)),
            Route::new("2001:db8::/32".parse().unwrap(), Some(gw6)),
        ];
        r
    }

    #[test]
    fn ipv6_in_every_format() {
        let r = dual_stack();
        for v in SUPPORTED {
            let doc = r.to_json(v);
            let ips = doc["ips"].as_array().unwrap();
            assert_eq!(ips.len(), 2, "{v}");
            let v6 = &ips[1];
            assert_eq!(v6["address"], "fd00:240:1::5/128", "{v}");
            assert_eq!(v6["gateway"], "fe80::1", "{v}");
            assert_eq!(v6["interface"], 1, "{v}");
            if v.legacy_result() {
                assert_eq!(ips[0]["version"], "4", "{v}");
                assert_eq!(v6["version"], "6", "{v}");
            } else {
                assert!(ips.iter().all(|ip| ip.get("version").is_none()), "{v}");
            }
            assert_eq!(
                doc["routes"],
                json!([
                    {"dst": "0.0.0.0/0", "gw": "169.254.1.1"},
                    {"dst": "::/0", "gw": "fe80::1"},
                    {"dst": "2001:db8::/32", "gw": "fe80::1"}
                ]),
                "{v}"
            );
            // And back, as a later plugin's prevResult.
            let back = CniResult::from_prev_result(&doc).unwrap();
            assert_eq!(back.ips, r.ips, "{v}");
            assert_eq!(back.routes, r.routes, "{v}");
        }
    }

    #[test]
    fn ipv6_only_result() {
        let gw6: IpAddr = "fe80::1".parse().unwrap();
        let mut r = sample();
        r.ips = vec![IpConfig {
            address: "2001:db8:0:1::a/128".parse().unwrap(),
            gateway: Some(gw6),
            interface: Some(1),
        }];
        r.routes = vec![Route::new("::/0".parse().unwrap(), Some(gw6))];
        assert_eq!(
            r.to_json(CniVersion::V0_4_0)["ips"],
            json!([{"version": "6", "address": "2001:db8:0:1::a/128", "gateway": "fe80::1", "interface": 1}])
        );
        assert_eq!(
            r.to_json(CniVersion::V1_0_0)["ips"],
            json!([{"address": "2001:db8:0:1::a/128", "gateway": "fe80::1", "interface": 1}])
        );
    }

    #[test]
    fn legacy_ipv6_prev_result_parses() {
        let r = CniResult::from_prev_result(&json!({
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "eth0", "sandbox": "/x"}],
            "ips": [
                {"version": "4", "address": "10.0.0.2/32", "interface": 0},
                {"version": "6", "address": "fd00::2/128", "gateway": "fe80::1", "interface": 0}
            ],
            "routes": [{"dst": "::/0", "gw": "fe80::1"}]
        }))
        .unwrap();
        assert_eq!(r.ips[1].address, "fd00::2/128".parse().unwrap());
        assert_eq!(r.ips[1].gateway, Some("fe80::1".parse().unwrap()));
        assert_eq!(r.routes[0].dst, "::/0".parse().unwrap());
    }

    #[test]
    fn merge_offsets_ipv6_indices_too() {
        let mut prev = CniResult::from_prev_result(&json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "net1", "sandbox": "/x"}],
            "ips": [{"address": "fd01::2/64", "interface": 0}]
        }))
        .unwrap();
        prev.merge(dual_stack());
        let idx: Vec<_> = prev.ips.iter().map(|i| i.interface).collect();
        assert_eq!(idx, vec![Some(0), Some(2), Some(2)]);
    }

    #[test]
    fn bad_prev_results_are_code_7() {
        for bad in [
            json!({"ips": [{"address": "nonsense"}]}),
            json!({"interfaces": [{}]}),
            json!({"ips": [{"address": "10.0.0.1/32", "interface": 3}]}),
            json!([]),
            json!({"ips": [{"version": "6", "address": "fd00::1/129"}]}),
            json!({"routes": [{"dst": "fd00::/8", "gw": "fe80::1%eth0"}]}),
        ] {
            let e = CniResult::from_prev_result(&bad).unwrap_err();
            assert_eq!(e.code, 7, "{bad}");
            assert!(e.msg.contains("prevResult"), "{}", e.msg);
        }
    }
}
