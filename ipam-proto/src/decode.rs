//! Decoding a request frame in constant memory beyond the fields it keeps.
//!
//! serde's internally tagged enums (`Request` is tagged by `op`) and `#[serde(flatten)]`
//! first buffer the whole document as generic values, because the tag may come last: an 8 MiB
//! frame of unknown fields or small numbers becomes several times that in memory. The daemon
//! instead reads the frame twice: once streaming, keeping only `v` and `op` and skipping
//! everything else in place, then straight into the fields of that operation, where unknown
//! keys are skipped in place too. Nesting is bounded by serde_json's recursion limit.

use std::fmt;

use serde::{
    de::{self, IgnoredAny, MapAccess, Visitor},
    Deserialize, Deserializer,
};

use crate::{
    frame::FrameError,
    msg::{Attachment, AttachmentKey, Family, LeaseRef, PodRef, Request, PROTOCOL_VERSION},
};

/// The operations, as named on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Allocate,
    Release,
    ReleaseLease,
    Check,
    List,
    ListPage,
    Gc,
    Status,
    Stats,
    Record,
}

const OPS: &[&str] = &[
    "allocate",
    "release",
    "release_lease",
    "check",
    "list",
    "list_page",
    "gc",
    "status",
    "stats",
    "record_op",
];

/// What the first pass keeps: the version and the operation (an unknown one by a short
/// prefix of its name, for the error message).
#[derive(Default)]
struct Probe {
    v: Option<u32>,
    op: Option<Result<Op, String>>,
}

struct OpVisitor;

impl Visitor<'_> for OpVisitor {
    type Value = Result<Op, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an operation name")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(match s {
            "allocate" => Ok(Op::Allocate),
            "release" => Ok(Op::Release),
            "release_lease" => Ok(Op::ReleaseLease),
            "check" => Ok(Op::Check),
            "list" => Ok(Op::List),
            "list_page" => Ok(Op::ListPage),
            "gc" => Ok(Op::Gc),
            "status" => Ok(Op::Status),
            "stats" => Ok(Op::Stats),
            "record_op" => Ok(Op::Record),
            other => Err(other.chars().take(64).collect()),
        })
    }
}

struct OpName(Result<Op, String>);

impl<'de> Deserialize<'de> for OpName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(OpVisitor).map(OpName)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum TopKey {
    V,
    Op,
    #[serde(other)]
    Other,
}

impl<'de> Deserialize<'de> for Probe {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Probe;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Probe, A::Error> {
                let mut p = Probe::default();
                while let Some(k) = m.next_key::<TopKey>()? {
                    match k {
                        TopKey::V => p.v = Some(m.next_value()?),
                        TopKey::Op => p.op = Some(m.next_value::<OpName>()?.0),
                        TopKey::Other => {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(p)
            }
        }
        d.deserialize_map(V)
    }
}

// The fields of each operation, as `Request` defines them; keys of other operations, `v`,
// `op` and unknown ones are skipped without being stored.

#[derive(Deserialize)]
struct AllocateBody {
    key: AttachmentKey,
    #[serde(default)]
    pod: PodRef,
    #[serde(default)]
    pool: Option<String>,
    #[serde(default)]
    host_veth: Option<String>,
    #[serde(default)]
    families: Option<Vec<Family>>,
}

#[derive(Deserialize)]
struct ReleaseBody {
    key: AttachmentKey,
    #[serde(default)]
    teardown_link: Option<String>,
}

#[derive(Deserialize)]
struct ReleaseLeaseBody {
    key: AttachmentKey,
    #[serde(default)]
    teardown_link: Option<String>,
    lease: LeaseRef,
}

#[derive(Deserialize)]
struct KeyBody {
    key: AttachmentKey,
}

#[derive(Deserialize)]
struct ListPageBody {
    #[serde(default)]
    after: Option<std::net::IpAddr>,
    #[serde(default)]
    limit: Option<u32>,
}

#[derive(Deserialize)]
struct GcBody {
    network: String,
    valid: Vec<Attachment>,
}

#[derive(Deserialize)]
struct StatusBody {
    #[serde(default)]
    pool: Option<String>,
    #[serde(default)]
    families: Option<Vec<Family>>,
}

#[derive(Deserialize)]
struct RecordOpBody {
    verb: String,
    code: u32,
    duration_us: u64,
}

fn body<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, FrameError> {
    serde_json::from_slice(b).map_err(FrameError::Decode)
}

/// Decode a request frame's body (see the module documentation).
pub(crate) fn request(b: &[u8]) -> Result<Request, FrameError> {
    let p: Probe = body(b)?;
    let v =
        p.v.ok_or_else(|| FrameError::Decode(de::Error::missing_field("v")))?;
    if v != PROTOCOL_VERSION {
        return Err(FrameError::Version { got: v });
    }
    let op = match p.op {
        Some(Ok(op)) => op,
        Some(Err(name)) => {
            return Err(FrameError::Decode(de::Error::unknown_variant(&name, OPS)));
        }
        None => return Err(FrameError::Decode(de::Error::missing_field("op"))),
    };
    Ok(match op {
        Op::Allocate => {
            let a: AllocateBody = body(b)?;
            Request::Allocate {
                key: a.key,
                pod: a.pod,
                pool: a.pool,
                host_veth: a.host_veth,
                families: a.families,
            }
        }
        Op::Release => {
            let r: ReleaseBody = body(b)?;
            Request::Release {
                key: r.key,
                teardown_link: r.teardown_link,
            }
        }
        Op::ReleaseLease => {
            let r: ReleaseLeaseBody = body(b)?;
            Request::ReleaseLease {
                key: r.key,
                teardown_link: r.teardown_link,
                lease: r.lease,
            }
        }
        Op::Check => Request::Check {
            key: body::<KeyBody>(b)?.key,
        },
        Op::List => Request::List,
        Op::ListPage => {
            let l: ListPageBody = body(b)?;
            Request::ListPage {
                after: l.after,
                limit: l.limit,
            }
        }
        Op::Gc => {
            let g: GcBody = body(b)?;
            Request::Gc {
                network: g.network,
                valid: g.valid,
            }
        }
        Op::Status => {
            let s = body::<StatusBody>(b)?;
            Request::Status {
                pool: s.pool,
                families: s.families,
            }
        }
        Op::Stats => Request::Stats,
        Op::Record => {
            let r: RecordOpBody = body(b)?;
            Request::RecordOp {
                verb: r.verb,
                code: r.code,
                duration_us: r.duration_us,
            }
        }
    })
}
