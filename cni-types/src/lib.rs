//! CNI spec 1.1 types for aliasnet: the environment ([`Invocation`]), `CNI_ARGS`
//! ([`CniArgs`]), the network configuration ([`NetConf`], with [`RuntimeConfig`]), results
//! per version ([`CniResult`]) and the error object with its codes ([`CniError`], [`code`]).
//!
//! Everything here is pure parsing and printing; no I/O, so it is unit-tested without root.

pub mod args;
pub mod config;
pub mod env;
pub mod error;
pub mod limits;
pub mod net;
pub mod result;
pub mod runtime_config;
pub mod version;

pub use args::CniArgs;
pub use config::{DatapathMode, GcAttachment, IpFamily, LogLevel, NetConf, RawConf};
pub use env::{AttachEnv, Command, DelEnv, Invocation};
pub use error::{code, CniError};
pub use limits::{LimitError, Limits};
pub use net::IpNet;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use runtime_config::{Bandwidth, RuntimeConfig, POD_ANNOTATIONS_KEY};
pub use version::{CniVersion, SUPPORTED_VERSIONS};

/// As libcni's `ValidateNetworkName`: alphanumeric first, then alphanumerics, `_`, `.`, `-`.
pub fn validate_network_name(name: &str) -> Result<(), String> {
    env::validate_container_id(name).map_err(|e| format!("{name:?} {e}"))
}

/// The VERSION answer: `cniVersion` echoes the request when we support it, otherwise our
/// newest (a newer runtime asking with a version we do not know still learns what we speak).
pub fn version_info(requested: Option<&str>) -> serde_json::Value {
    let v = requested
        .and_then(|r| CniVersion::parse(r).ok())
        .unwrap_or(CniVersion::LATEST);
    serde_json::json!({
        "cniVersion": v.as_str(),
        "supportedVersions": SUPPORTED_VERSIONS.map(|v| v.as_str()),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn version_answer() {
        let all = json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
        assert_eq!(
            version_info(Some("1.0.0")),
            json!({"cniVersion": "1.0.0", "supportedVersions": all})
        );
        assert_eq!(version_info(None)["cniVersion"], "1.1.0");
        assert_eq!(version_info(Some("9.9.9"))["cniVersion"], "1.1.0");
    }
}
