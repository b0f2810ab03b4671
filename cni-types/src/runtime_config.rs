//! `runtimeConfig`: what the runtime fills in for the capabilities a plugin declares.
//!
//! Keys are matched case-insensitively at every level we interpret: containerd 1.6 sends Go
//! field names (`IngressRate`, `HostPort`), podman sends camelCase (`hostPort`). Only the
//! sections aliasnet will use are typed; the rest is kept verbatim.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::CniError;

/// The capability key under which containerd passes pod annotations.
pub const POD_ANNOTATIONS_KEY: &str = "io.kubernetes.cri.pod-annotations";

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeConfig {
    pub bandwidth: Option<Bandwidth>,
    /// Pod annotations (names and values verbatim).
    pub pod_annotations: BTreeMap<String, String>,
    /// Requested addresses, duplicates removed (podman repeats them after `network reload`).
    pub ips: Vec<String>,
    pub mac: Option<String>,
    /// Every other key, verbatim.
    pub other: BTreeMap<String, Value>,
}

/// `runtimeConfig.bandwidth` (CNI conventions): rates in bits/s, bursts in bits.
/// containerd sends a burst of `u32::MAX` when the pod sets none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bandwidth {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
}

impl RuntimeConfig {
    pub fn parse(v: &Value) -> Result<Self, CniError> {
        let obj = v
            .as_object()
            .ok_or_else(|| CniError::config("runtimeConfig", "must be an object"))?;
        let mut out = Self::default();
        for (k, val) in obj {
            match k.to_ascii_lowercase().as_str() {
                "bandwidth" => out.bandwidth = Some(Bandwidth::parse(k, val)?),
                "io.kubernetes.cri.pod-annotations" => {
                    out.pod_annotations = parse_annotations(k, val)?
                }
                "ips" => out.ips = parse_ips(k, val)?,
                "mac" => {
                    out.mac = match val {
                        Value::Null => None,
                        Value::String(s) => Some(s.clone()),
                        _ => return Err(field_err(k, "must be a string")),
                    }
                }
                _ => {
                    out.other.insert(k.clone(), val.clone());
                }
            }
        }
        Ok(out)
    }
}

fn field_err(key: &str, why: &str) -> CniError {
    CniError::config(&format!("runtimeConfig.{key}"), why)
}

impl Bandwidth {
    fn parse(key: &str, v: &Value) -> Result<Self, CniError> {
        let obj = match v {
            Value::Null => return Ok(Self::default()),
            Value::Object(o) => o,
            _ => return Err(field_err(key, "must be an object")),
        };
        let mut out = Self::default();
        for (k, val) in obj {
            let slot = match k.to_ascii_lowercase().as_str() {
                "ingressrate" => &mut out.ingress_rate,
                "ingressburst" => &mut out.ingress_burst,
                "egressrate" => &mut out.egress_rate,
                "egressburst" => &mut out.egress_burst,
                _ => continue,
            };
            *slot = match val {
                Value::Null => None,
                _ => Some(val.as_u64().ok_or_else(|| {
                    field_err(&format!("{key}.{k}"), "must be a non-negative integer")
                })?),
            };
        }
        Ok(out)
    }
}

fn parse_annotations(key: &str, v: &Value) -> Result<BTreeMap<String, String>, CniError> {
    let obj: &Map<String, Value> = match v {
        Value::Null => return Ok(BTreeMap::new()),
        Value::Object(o) => o,
        _ => return Err(field_err(key, "must be an object")),
    };
    obj.iter()
        .map(|(k, val)| match val {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(field_err(&format!("{key}.{k}"), "must be a string")),
        })
        .collect()
}

fn parse_ips(key: &str, v: &Value) -> Result<Vec<String>, CniError> {
    let arr = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(a) => a,
        _ => return Err(field_err(key, "must be an array of strings")),
    };
    let mut out: Vec<String> = Vec::with_capacity(arr.len());
    for ip in arr {
        let s = ip
            .as_str()
            .ok_or_else(|| field_err(key, "must be an array of strings"))?;
        if !out.iter().any(|o| o == s) {
            out.push(s.to_owned());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn containerd_go_field_names() {
        let rc = RuntimeConfig::parse(&json!({
            "bandwidth": {"IngressRate": 10000000u64, "IngressBurst": 4294967295u64, "EgressRate": 20000000u64, "EgressBurst": 4294967295u64},
            "dns": {"Servers": ["10.217.0.10"]},
            "io.kubernetes.cri.pod-annotations": {"kubernetes.io/egress-bandwidth": "20M", "demo/note": "hello"},
            "portMappings": [{"HostPort": 18082, "ContainerPort": 80, "Protocol": "tcp", "HostIP": "127.0.0.1"}]
        }))
        .unwrap();
        assert_eq!(
            rc.bandwidth,
            Some(Bandwidth {
                ingress_rate: Some(10_000_000),
                ingress_burst: Some(4_294_967_295),
                egress_rate: Some(20_000_000),
                egress_burst: Some(4_294_967_295),
            })
        );
        assert_eq!(rc.pod_annotations["demo/note"], "hello");
        assert!(rc.other.contains_key("portMappings"));
    }

    #[test]
    fn podman_camel_case_and_duplicate_ips() {
        let rc = RuntimeConfig::parse(&json!({
            "Bandwidth": {"ingressRate": 1000, "egressBurst": 8},
            "IPs": ["10.0.0.5/24", "10.0.0.5/24"],
            "mac": "02:42:0a:d5:00:99"
        }))
        .unwrap();
        let bw = rc.bandwidth.unwrap();
        assert_eq!(bw.ingress_rate, Some(1000));
        assert_eq!(bw.egress_burst, Some(8));
        assert_eq!(rc.ips, vec!["10.0.0.5/24".to_string()]);
        assert_eq!(rc.mac.as_deref(), Some("02:42:0a:d5:00:99"));
    }

    #[test]
    fn bad_types_name_the_field() {
        for (bad, field) in [
            (json!([]), "runtimeConfig"),
            (
                json!({"bandwidth": {"IngressRate": "10M"}}),
                "bandwidth.IngressRate",
            ),
            (
                json!({"bandwidth": {"egressRate": -1}}),
                "bandwidth.egressRate",
            ),
            (json!({"bandwidth": 5}), "bandwidth"),
            (json!({POD_ANNOTATIONS_KEY: {"a": 1}}), "pod-annotations.a"),
            (json!({"ips": "10.0.0.1"}), "ips"),
        ] {
            let e = RuntimeConfig::parse(&bad).unwrap_err();
            assert_eq!(e.code, 7, "{bad}");
            assert!(e.msg.contains(field), "{bad}: {}", e.msg);
        }
    }
}
