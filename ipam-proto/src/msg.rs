//! Request and response bodies.
//!
//! JSON on the wire: the messages are small, the cost is dwarfed by the fsync behind every
//! mutating call, and an operator can read a capture.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// Version carried by every frame. A daemon answers a frame with another version with
/// [`ErrorKind::UnsupportedVersion`] instead of guessing.
pub const PROTOCOL_VERSION: u32 = 1;

/// The CNI state key: (network name, `CNI_CONTAINERID`, `CNI_IFNAME`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttachmentKey {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

impl AttachmentKey {
    pub fn new(network: &str, container_id: &str, ifname: &str) -> Self {
        Self {
            network: network.to_owned(),
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        }
    }
}

impl std::fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// Pod identity from `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID`).
/// Informational: shown by introspection and metrics, never used as a key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// One live reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub key: AttachmentKey,
    pub address: Ipv4Addr,
    pub pool: String,
    #[serde(default)]
    pub pod: PodRef,
    /// Host-side veth of the attachment, when the plugin told us; used by reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_veth: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub allocated_at_ms: u64,
}

/// A container attachment named in a GC request's valid list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Reserve an address for `key`; idempotent: the same key gets the same lease back.
    Allocate {
        key: AttachmentKey,
        #[serde(default)]
        pod: PodRef,
        /// Restrict to one named pool; any pool when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_veth: Option<String>,
    },
    /// Release the lease of `key` (no error if there is none). When `teardown_link` is set the
    /// daemon also deletes that host interface after replying: unregistering a veth costs the
    /// kernel ~20 ms of RCU grace periods that need not sit on the runtime's critical path.
    Release {
        key: AttachmentKey,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        teardown_link: Option<String>,
    },
    /// Look up the lease of `key`.
    Check { key: AttachmentKey },
    /// Every lease.
    List,
    /// Release every lease of `network` whose (container, ifname) is not in `valid`.
    Gc {
        network: String,
        valid: Vec<Attachment>,
    },
    /// Could an Allocate succeed now?
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<String>,
    },
    /// Pool usage.
    Stats,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    pub name: String,
    pub source: String,
    pub total: u64,
    pub allocated: u64,
    /// Released recently, not yet reusable.
    #[serde(default)]
    pub cooling: u64,
    pub free: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Response {
    Allocated {
        lease: Lease,
    },
    Released {
        /// The address freed, or `None` when `key` held nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        address: Option<Ipv4Addr>,
    },
    Lease {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease: Option<Lease>,
    },
    Leases {
        leases: Vec<Lease>,
    },
    GcDone {
        released: Vec<Lease>,
    },
    Status {
        ready: bool,
        free: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    Stats {
        pools: Vec<PoolStats>,
    },
    Error {
        kind: ErrorKind,
        message: String,
    },
}

/// Why the daemon refused a request. The plugin maps each to a CNI error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No free address in the eligible pools.
    PoolExhausted,
    /// Only addresses still in their reuse cooldown remain.
    OnlyCooling,
    /// The named pool does not exist.
    UnknownPool,
    /// The frame could not be decoded or the request is invalid.
    BadRequest,
    /// The frame's protocol version is not ours.
    UnsupportedVersion,
    /// The change could not be made durable; nothing was acknowledged.
    Storage,
    /// The daemon is starting or shutting down; retry later.
    Unavailable,
    Internal,
}

/// A frame as sent: the body plus the protocol version.
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub v: u32,
    #[serde(flatten)]
    pub body: T,
}

impl<T> Envelope<T> {
    pub fn new(body: T) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wire_format_is_tagged_and_versioned() {
        let req = Envelope::new(Request::Release {
            key: AttachmentKey::new("n", "c", "eth0"),
            teardown_link: None,
        });
        let s = serde_json::to_string(&req).unwrap();
        assert_eq!(
            s,
            r#"{"v":1,"op":"release","key":{"network":"n","container_id":"c","ifname":"eth0"}}"#
        );
        let back: Envelope<Request> = serde_json::from_str(&s).unwrap();
        assert_eq!(back.v, 1);
        assert_eq!(back.body, req.body);
    }

    #[test]
    fn error_reply_round_trips() {
        let r = Envelope::new(Response::Error {
            kind: ErrorKind::PoolExhausted,
            message: "no free address".into(),
        });
        let s = serde_json::to_string(&r).unwrap();
        let back: Envelope<Response> = serde_json::from_str(&s).unwrap();
        assert_eq!(back.body, r.body);
    }
}
