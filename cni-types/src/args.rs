//! `CNI_ARGS`: `K=V;K=V` pairs, a set in any order (runtimes build it from a Go map).
//!
//! Unknown keys are an error unless `IgnoreUnknown` is true, as libcni's `LoadArgs` does;
//! runtimes that add keys we do not know (podman's `MAC=`, `IP=`) always send
//! `IgnoreUnknown=1`.

use crate::CniError;

/// The keys aliasnet understands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub ignore_unknown: bool,
    pub k8s_pod_namespace: Option<String>,
    pub k8s_pod_name: Option<String>,
    pub k8s_pod_uid: Option<String>,
    pub k8s_pod_infra_container_id: Option<String>,
}

impl CniArgs {
    pub fn parse(raw: &str) -> Result<Self, CniError> {
        let mut out = Self::default();
        let mut unknown = Vec::new();
        // Empty segments (a trailing ';') carry nothing; skip them rather than fail a pod.
        for pair in raw.split(';').filter(|p| !p.is_empty()) {
            let Some((k, v)) = pair.split_once('=') else {
                return Err(CniError::env(format!(
                    "invalid CNI_ARGS: pair {pair:?} is not KEY=VALUE"
                )));
            };
            let val = (!v.is_empty()).then(|| v.to_owned());
            match k {
                "IgnoreUnknown" => {
                    out.ignore_unknown = match v.to_ascii_lowercase().as_str() {
                        "1" | "true" => true,
                        "0" | "false" | "" => false,
                        _ => {
                            return Err(CniError::env(format!(
                                "invalid CNI_ARGS: IgnoreUnknown={v:?} is not a boolean"
                            )))
                        }
                    }
                }
                "K8S_POD_NAMESPACE" => out.k8s_pod_namespace = val,
                "K8S_POD_NAME" => out.k8s_pod_name = val,
                "K8S_POD_UID" => out.k8s_pod_uid = val,
                "K8S_POD_INFRA_CONTAINER_ID" => out.k8s_pod_infra_container_id = val,
                _ => unknown.push(pair.to_owned()),
            }
        }
        if !unknown.is_empty() && !out.ignore_unknown {
            return Err(CniError::env(format!(
                "invalid CNI_ARGS: unknown keys {} (set IgnoreUnknown=1 to ignore them)",
                unknown.join(", ")
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_does_not_matter() {
        let a = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=pod-a;K8S_POD_INFRA_CONTAINER_ID=0961;K8S_POD_UID=uid-a").unwrap();
        let b = CniArgs::parse("K8S_POD_NAME=pod-a;K8S_POD_INFRA_CONTAINER_ID=0961;K8S_POD_UID=uid-a;IgnoreUnknown=1;K8S_POD_NAMESPACE=demo").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.k8s_pod_namespace.as_deref(), Some("demo"));
        assert_eq!(a.k8s_pod_name.as_deref(), Some("pod-a"));
        assert_eq!(a.k8s_pod_uid.as_deref(), Some("uid-a"));
    }

    #[test]
    fn unknown_keys_need_ignore_unknown() {
        let ok = CniArgs::parse("MAC=02:42:0a:d5:00:99;IgnoreUnknown=1;K8S_POD_NAME=pod1").unwrap();
        assert_eq!(ok.k8s_pod_name.as_deref(), Some("pod1"));
        assert!(CniArgs::parse("IgnoreUnknown=true;IP=10.0.0.1").is_ok());
        for bad in [
            "MAC=02:42:0a:d5:00:99",
            "IgnoreUnknown=0;IP=1.2.3.4",
            "K8S_POD_NAME",
            "IgnoreUnknown=maybe",
        ] {
            let e = CniArgs::parse(bad).unwrap_err();
            assert_eq!(e.code, 4, "{bad}");
            assert!(e.msg.contains("CNI_ARGS"), "{bad}: {}", e.msg);
        }
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert!(CniArgs::parse("K8S_POD_NAME=a;").is_ok());
    }
}
