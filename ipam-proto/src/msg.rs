//! Request and response bodies.
//!
//! JSON on the wire: the messages are small, the cost is dwarfed by the fsync behind every
//! mutating call, and an operator can read a capture.

use std::net::IpAddr;

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

/// An address family. A key holds at most one lease per family.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    #[default]
    Ipv4,
    Ipv6,
}

impl Family {
    /// Both families, IPv4 first (the order leases of one key are reported in).
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    pub fn of(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => Self::Ipv4,
            IpAddr::V6(_) => Self::Ipv6,
        }
    }

    /// The name used on the wire and in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One live reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub key: AttachmentKey,
    pub address: IpAddr,
    pub pool: String,
    #[serde(default)]
    pub pod: PodRef,
    /// Host-side veth of the attachment, when the plugin told us; used by reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_veth: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub allocated_at_ms: u64,
    /// The address has disappeared from the pool's cloud metadata while leased (`azure-imds`
    /// pools): the pod keeps it, but it is not handed out again after release.
    #[serde(default, skip_serializing_if = "is_false")]
    pub missing: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Lease {
    pub fn family(&self) -> Family {
        Family::of(self.address)
    }
}

/// Which lease of a key a [`Request::ReleaseLease`] means: a key that is released and
/// allocated again gets another lease, with another allocation time (and, while the first
/// address cools down, another address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRef {
    pub address: IpAddr,
    pub allocated_at_ms: u64,
}

impl From<&Lease> for LeaseRef {
    fn from(l: &Lease) -> Self {
        Self {
            address: l.address,
            allocated_at_ms: l.allocated_at_ms,
        }
    }
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
    /// Reserve addresses for `key`, one per family; idempotent: the same key gets the same
    /// leases back. All or nothing: when one family cannot be served, nothing is allocated.
    Allocate {
        key: AttachmentKey,
        #[serde(default)]
        pod: PodRef,
        /// Restrict that pool's family to the named pool; any pool when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_veth: Option<String>,
        /// The families wanted, each exactly once. `None`: every family the node has an
        /// eligible pool for (what clients older than this field get).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        families: Option<Vec<Family>>,
    },
    /// Release every lease of `key` (no error if there is none). When `teardown_link` is set the
    /// daemon also deletes that host interface after replying: unregistering a veth costs the
    /// kernel ~20 ms of RCU grace periods that need not sit on the runtime's critical path.
    Release {
        key: AttachmentKey,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        teardown_link: Option<String>,
    },
    /// Release the leases of `key` only if they are still the ones `lease` identifies (one of
    /// their addresses and their common allocation time, as Check or Allocate returned them): a release that arrives late (its
    /// DEL timed out and a later ADD of the same key got a new lease) releases and deletes
    /// nothing and is answered `Released { address: None }`. Otherwise as
    /// [`Request::Release`]. Daemons older than this operation answer `BadRequest` (unknown
    /// variant); send a plain Release to those.
    ReleaseLease {
        key: AttachmentKey,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        teardown_link: Option<String>,
        lease: LeaseRef,
    },
    /// Look up the leases of `key`.
    Check { key: AttachmentKey },
    /// Every lease, sorted by address (IPv4 before IPv6). Answered with an `Internal` error when the reply would
    /// exceed the frame limit (more than ~20,000 leases): use [`Request::ListPage`].
    List,
    /// One page of leases in address order: those with an address above `after` (from the
    /// lowest when absent), at most `limit` (default [`LIST_PAGE_DEFAULT`], at most
    /// [`LIST_PAGE_MAX`]; the daemon may return fewer to stay under the frame limit). Answered
    /// with [`Response::LeasePage`]; pass its `next` as `after` until `next` is `None`.
    /// Leases allocated or released meanwhile may or may not appear; a lease that exists for
    /// the whole walk appears exactly once.
    ListPage {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<IpAddr>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// Release every lease of `network` whose (container, ifname) is not in `valid`.
    Gc {
        network: String,
        valid: Vec<Attachment>,
    },
    /// Could an Allocate succeed now?
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<String>,
        /// The families the Allocate would ask for; absent: every family a pool serves (what
        /// a daemon that predates the field answers).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        families: Option<Vec<Family>>,
    },
    /// Pool usage.
    Stats,
    /// Count one CNI operation in the daemon's metrics (`aliasnet_cni_operations_total`,
    /// `aliasnet_cni_operation_duration_seconds`): the plugin is too short-lived to be scraped.
    /// Not durable, never waits for the disk; answered with [`Response::Recorded`]. `verb` is
    /// the CNI command (ADD, DEL, CHECK, GC, STATUS, VERSION; case-insensitive), `code` the CNI
    /// error code of the result (0 = success).
    RecordOp {
        verb: String,
        code: u32,
        duration_us: u64,
    },
}

/// Default page size of [`Request::ListPage`].
pub const LIST_PAGE_DEFAULT: u32 = 1000;
/// Largest page size of [`Request::ListPage`].
pub const LIST_PAGE_MAX: u32 = 10_000;

/// Verbs [`Request::RecordOp`] accepts (the CNI commands), as exported in the `verb` label.
pub const RECORDED_VERBS: [&str; 6] = ["add", "del", "check", "gc", "status", "version"];
/// Largest `code` [`Request::RecordOp`] accepts (CNI codes are small; this bounds the label).
pub const RECORDED_CODE_MAX: u32 = 999;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    pub name: String,
    /// Family of every address of the pool.
    #[serde(default)]
    pub family: Family,
    pub source: String,
    pub total: u64,
    pub allocated: u64,
    /// Released recently, not yet reusable (including `pending_teardown`).
    #[serde(default)]
    pub cooling: u64,
    pub free: u64,
    /// Cooldown over, but the released attachment's host veth is still being deleted (its
    /// route still points there); reusable within milliseconds. Included in `cooling`.
    #[serde(default)]
    pub pending_teardown: u64,
    /// Leased addresses that disappeared from the pool's metadata (`azure-imds`); included in
    /// `allocated`, not in `total`. Not handed out again after release unless they reappear.
    #[serde(default)]
    pub missing: u64,
    /// Refresh state of a metadata-backed pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<MetadataStatus>,
}

/// Where a metadata-backed pool (`azure-imds`) stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataStatus {
    /// Endpoint polled.
    pub url: String,
    /// Milliseconds since the Unix epoch of the last read that was applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_ms: Option<u64>,
    /// Result of the last attempt: ok, changed, throttled, http_error, parse_error, unreachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<String>,
    /// Why the last attempt failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Milliseconds since the Unix epoch of the next attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_refresh_ms: Option<u64>,
    /// Primary addresses seen (never handed out).
    #[serde(default)]
    pub primaries: u64,
}

/// Node-wide findings of the reconcile against the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileStats {
    /// Milliseconds since the Unix epoch of the last completed pass (`None` before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_ms: Option<u64>,
    /// Host veths named like ours (prefix + hash) that no lease claims, up to 1,000 names.
    #[serde(default)]
    pub orphan_veths: Vec<String>,
    /// How many such veths there are.
    #[serde(default)]
    pub orphan_veth_count: u64,
    /// Leases whose host veth is gone, waiting out the grace period before release.
    #[serde(default)]
    pub veth_missing: u64,
    /// Leases released because their host veth stayed gone, since the daemon started.
    #[serde(default)]
    pub released: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Response {
    /// `lease` is the IPv4 lease when there is one, else the IPv6 one; `more` holds the
    /// other family's. All leases of one Allocate share `allocated_at_ms`.
    Allocated {
        lease: Lease,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        more: Vec<Lease>,
    },
    Released {
        /// The address freed (the IPv4 one when the key held both), or `None` when `key`
        /// held nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        address: Option<IpAddr>,
    },
    /// Answer to Check, ordered as [`Response::Allocated`].
    Lease {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease: Option<Lease>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        more: Vec<Lease>,
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
        #[serde(default)]
        reconcile: ReconcileStats,
    },
    LeasePage {
        leases: Vec<Lease>,
        /// Pass as `after` for the next page; `None` when this was the last.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<IpAddr>,
    },
    Recorded,
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

/// A frame as sent: the body plus the protocol version. Only serialised: decoding goes through
/// [`crate::frame::decode`] and [`crate::frame::decode_request`], which do not buffer the
/// document the way `flatten` does.
#[derive(Debug, Serialize)]
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
        let back = crate::frame::decode_request(s.as_bytes()).unwrap();
        assert_eq!(back, req.body);
    }

    #[test]
    fn additions_are_backward_compatible() {
        // What a client of the first protocol version sends and expects still works.
        let old = crate::frame::decode_request(br#"{"v":1,"op":"list"}"#).unwrap();
        assert_eq!(old, Request::List);
        let stats: Response = crate::frame::decode(
            br#"{"v":1,"reply":"stats","pools":[{"name":"p","source":"static","total":4,"allocated":1,"free":3}]}"#,
        )
        .unwrap();
        let Response::Stats { pools, reconcile } = stats else {
            panic!()
        };
        assert_eq!((pools[0].cooling, pools[0].missing), (0, 0));
        assert_eq!(reconcile, ReconcileStats::default());
        let lease = r#"{"key":{"network":"n","container_id":"c","ifname":"eth0"},"address":"10.0.0.1","pool":"p","allocated_at_ms":1}"#;
        assert!(!serde_json::from_str::<Lease>(lease).unwrap().missing);
        // The new requests, as they go on the wire.
        let page = Envelope::new(Request::ListPage {
            after: Some(IpAddr::from([10, 0, 0, 9])),
            limit: Some(50),
        });
        assert_eq!(
            serde_json::to_string(&page).unwrap(),
            r#"{"v":1,"op":"list_page","after":"10.0.0.9","limit":50}"#
        );
        let bare = crate::frame::decode_request(br#"{"v":1,"op":"list_page"}"#).unwrap();
        assert_eq!(
            bare,
            Request::ListPage {
                after: None,
                limit: None
            }
        );
        let op = Envelope::new(Request::RecordOp {
            verb: "ADD".into(),
            code: 0,
            duration_us: 1500,
        });
        assert_eq!(
            serde_json::to_string(&op).unwrap(),
            r#"{"v":1,"op":"record_op","verb":"ADD","code":0,"duration_us":1500}"#
        );
        assert_eq!(
            serde_json::to_string(&Envelope::new(Response::Recorded)).unwrap(),
            r#"{"v":1,"reply":"recorded"}"#
        );
    }

    fn lease(addr: &str) -> Lease {
        Lease {
            key: AttachmentKey::new("n", "c", "eth0"),
            address: addr.parse().unwrap(),
            pool: "p".into(),
            pod: PodRef::default(),
            host_veth: None,
            allocated_at_ms: 1,
            missing: false,
        }
    }

    #[test]
    fn ipv4_leases_serialise_as_before_families() {
        // Byte for byte what the IPv4-only protocol produced.
        let v4 = r#"{"key":{"network":"n","container_id":"c","ifname":"eth0"},"address":"10.0.0.1","pool":"p","pod":{},"allocated_at_ms":1}"#;
        assert_eq!(serde_json::to_string(&lease("10.0.0.1")).unwrap(), v4);
        let reply = Envelope::new(Response::Allocated {
            lease: lease("10.0.0.1"),
            more: vec![],
        });
        assert_eq!(
            serde_json::to_string(&reply).unwrap(),
            format!(r#"{{"v":1,"reply":"allocated","lease":{v4}}}"#)
        );
        let check = Envelope::new(Response::Lease {
            lease: None,
            more: vec![],
        });
        assert_eq!(
            serde_json::to_string(&check).unwrap(),
            r#"{"v":1,"reply":"lease"}"#
        );
        let released = Envelope::new(Response::Released {
            address: Some("10.0.0.1".parse().unwrap()),
        });
        assert_eq!(
            serde_json::to_string(&released).unwrap(),
            r#"{"v":1,"reply":"released","address":"10.0.0.1"}"#
        );
        // An old client's Allocate has no families; it is serialised without them too.
        let alloc = Envelope::new(Request::Allocate {
            key: AttachmentKey::new("n", "c", "eth0"),
            pod: PodRef::default(),
            pool: None,
            host_veth: None,
            families: None,
        });
        let s = serde_json::to_string(&alloc).unwrap();
        assert_eq!(
            s,
            r#"{"v":1,"op":"allocate","key":{"network":"n","container_id":"c","ifname":"eth0"},"pod":{}}"#
        );
        assert_eq!(
            crate::frame::decode_request(s.as_bytes()).unwrap(),
            alloc.body
        );
    }

    #[test]
    fn old_frames_decode_with_family_defaults() {
        let r: Response = crate::frame::decode(
            br#"{"v":1,"reply":"allocated","lease":{"key":{"network":"n","container_id":"c","ifname":"eth0"},"address":"10.0.0.1","pool":"p","allocated_at_ms":1}}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            Response::Allocated {
                lease: lease("10.0.0.1"),
                more: vec![]
            }
        );
        let r: Response = crate::frame::decode(br#"{"v":1,"reply":"lease","lease":null}"#).unwrap();
        assert_eq!(
            r,
            Response::Lease {
                lease: None,
                more: vec![]
            }
        );
        let s: PoolStats = serde_json::from_str(
            r#"{"name":"p","source":"static","total":4,"allocated":1,"free":3}"#,
        )
        .unwrap();
        assert_eq!(s.family, Family::Ipv4);
        let page: Response =
            crate::frame::decode(br#"{"v":1,"reply":"lease_page","leases":[],"next":"10.0.0.3"}"#)
                .unwrap();
        assert_eq!(
            page,
            Response::LeasePage {
                leases: vec![],
                next: Some("10.0.0.3".parse().unwrap())
            }
        );
    }

    #[test]
    fn dual_stack_wire_format() {
        let alloc = Envelope::new(Request::Allocate {
            key: AttachmentKey::new("n", "c", "eth0"),
            pod: PodRef::default(),
            pool: None,
            host_veth: None,
            families: Some(vec![Family::Ipv4, Family::Ipv6]),
        });
        let s = serde_json::to_string(&alloc).unwrap();
        assert!(s.ends_with(r#""families":["ipv4","ipv6"]}"#), "{s}");
        assert_eq!(
            crate::frame::decode_request(s.as_bytes()).unwrap(),
            alloc.body
        );
        let reply = Response::Allocated {
            lease: lease("10.0.0.1"),
            more: vec![lease("fd00:240::5")],
        };
        let s = serde_json::to_string(&Envelope::new(reply.clone())).unwrap();
        assert!(s.contains(r#""more":[{"key""#) && s.contains(r#""address":"fd00:240::5""#));
        assert_eq!(
            crate::frame::decode::<Response>(s.as_bytes()).unwrap(),
            reply
        );
        assert!(crate::frame::decode_request(
            br#"{"v":1,"op":"allocate","key":{"network":"n","container_id":"c","ifname":"eth0"},"families":["ipv5"]}"#
        )
        .is_err());
        assert_eq!(Family::of("fd00::1".parse().unwrap()), Family::Ipv6);
        assert_eq!(Family::of("10.0.0.1".parse().unwrap()), Family::Ipv4);
        assert_eq!(serde_json::to_string(&Family::Ipv6).unwrap(), r#""ipv6""#);
        // Addresses order IPv4 before IPv6, which is the order of lease pages.
        let a: IpAddr = "255.255.255.255".parse().unwrap();
        let b: IpAddr = "::".parse().unwrap();
        assert!(a < b);
    }

    #[test]
    fn error_reply_round_trips() {
        let r = Envelope::new(Response::Error {
            kind: ErrorKind::PoolExhausted,
            message: "no free address".into(),
        });
        let s = serde_json::to_string(&r).unwrap();
        let back: Response = crate::frame::decode(s.as_bytes()).unwrap();
        assert_eq!(back, r.body);
    }
}
