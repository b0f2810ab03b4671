//! The CNI error object and every error code this project emits.
//!
//! | Code | Meaning | Emitted for |
//! |-----:|---------|-------------|
//! | 1    | Incompatible CNI version (spec) | `cniVersion` not one of [`crate::SUPPORTED_VERSIONS`]; CHECK with a config below 0.4.0; GC/STATUS with a config below 1.1.0 (as the Go `skel` does) |
//! | 2    | Unsupported field (spec) | reserved, not emitted: unknown config keys are tolerated |
//! | 3    | Container unknown (spec) | ADD/CHECK: the `CNI_NETNS` path does not exist (nothing was created, no DEL needed) |
//! | 4    | Invalid environment variables (spec) | missing or malformed `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS` (the message names them); `CNI_NETNS` that is not a network namespace or is the host's own |
//! | 5    | I/O error (spec) | stdin unreadable; DEL could not write the release spool while the daemon was down |
//! | 6    | Decode error (spec) | stdin is not a JSON object |
//! | 7    | Invalid network configuration (spec) | a config value of the wrong type or out of range (the message names the field); no default route and no `mtu`; CHECK without `prevResult`; GC without `cni.dev/valid-attachments`; an invalid bandwidth value (`runtimeConfig.bandwidth.*` or a bandwidth annotation, named); a bandwidth limit with `datapath: off` |
//! | 11   | Try again later (spec) | `aliasnet-ipamd` unreachable, timed out, or starting/stopping; ADD: the eBPF datapath is not pinned yet (`datapath: required`, or `optional` with a bandwidth limit) |
//! | 50   | Plugin not available (spec) | STATUS: daemon unreachable or no free address; `datapath: required` and the datapath is not pinned |
//! | 100  | Internal error | an unexpected failure, including a panic |
//! | 101  | Interface exists | ADD: `CNI_IFNAME` already exists in the pod's netns |
//! | 102  | Pool exhausted | ADD: the daemon has no free address (daemon's message included) |
//! | 103  | Only cooling addresses | ADD: the only free addresses are still in their reuse cooldown |
//! | 104  | Unknown pool | the configured `pool` is not known to the daemon |
//! | 105  | IPAM daemon error | the daemon refused a request for another reason (storage, protocol, internal) |
//! | 106  | Netlink error | the kernel refused a link, address, route or neighbour change |
//! | 107  | Check failed | CHECK: a piece of the attachment is missing or wrong (the message names it) |
//! | 108  | Sysctl error | a host sysctl (ip_forward, rp_filter, accept_ra) could not be set |
//! | 109  | Netns error | the pod's netns could not be entered |
//! | 110  | Datapath error | the eBPF datapath could not be attached, read or detached (pinned maps of another ABI, no free pod slot, a map, program, link or qdisc operation failed); GC: the datapath sweep failed |

use serde_json::{json, Value};

/// Error codes, named. Codes below 100 are the spec's; 100 and up are aliasnet's.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const INTERNAL: u32 = 100;
    pub const INTERFACE_EXISTS: u32 = 101;
    pub const POOL_EXHAUSTED: u32 = 102;
    pub const ONLY_COOLING: u32 = 103;
    pub const UNKNOWN_POOL: u32 = 104;
    pub const IPAM_ERROR: u32 = 105;
    pub const NETLINK: u32 = 106;
    pub const CHECK_FAILED: u32 = 107;
    pub const SYSCTL: u32 = 108;
    pub const NETNS: u32 = 109;
    pub const DATAPATH: u32 = 110;
}

/// A CNI error: what the plugin prints on stdout (with `cniVersion`) when it fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Code 4, naming the variable(s).
    pub fn env(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_ENV, msg)
    }

    /// Code 7 for `field`.
    pub fn config(field: &str, problem: impl std::fmt::Display) -> Self {
        Self::new(
            code::INVALID_CONFIG,
            format!("invalid config field {field:?}: {problem}"),
        )
    }

    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(code::DECODE, msg)
    }

    pub fn version(msg: impl Into<String>) -> Self {
        Self::new(code::INCOMPATIBLE_VERSION, msg)
    }

    /// Code 100: an unexpected failure.
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(code::INTERNAL, msg)
    }

    /// `what: msg`: the step that failed, over its cause. The cause's code and details stay:
    /// the innermost error knows best what went wrong.
    #[must_use]
    pub fn context(mut self, what: impl std::fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }

    /// The JSON document printed on stdout.
    pub fn to_json(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_document_has_the_spec_keys() {
        let e = CniError::config("mtu", "must be 68..=65535, got 5").with_details("d");
        assert_eq!(
            e.to_json("1.0.0"),
            json!({"cniVersion":"1.0.0","code":7,"msg":"invalid config field \"mtu\": must be 68..=65535, got 5","details":"d"})
        );
    }

    #[test]
    fn context_keeps_the_cause_code_and_details() {
        let e = CniError::new(code::NETLINK, "add route: EEXIST")
            .with_details("d")
            .context("configuring pod");
        assert_eq!(e.code, code::NETLINK);
        assert_eq!(e.msg, "configuring pod: add route: EEXIST");
        assert_eq!(e.details, "d");
        assert_eq!(CniError::internal("boom").code, code::INTERNAL);
    }
}
