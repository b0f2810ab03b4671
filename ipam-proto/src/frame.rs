//! Framing: a 4-byte big-endian length, then that many bytes of JSON.
//!
//! The length is checked against [`MAX_FRAME`] before any allocation, so a hostile or broken
//! peer cannot make either side allocate unbounded memory.

use std::io::{self, Read, Write};

use serde::{de::DeserializeOwned, Serialize};

use crate::msg::{Envelope, Request, PROTOCOL_VERSION};

/// Largest frame either side accepts. A GC request listing every attachment of a busy node is
/// the biggest legitimate message, well under this.
pub const MAX_FRAME: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("i/o error on the ipamd socket")]
    Io(#[from] io::Error),
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error("malformed frame")]
    Decode(#[source] serde_json::Error),
    #[error("peer speaks protocol version {got}, this side speaks {PROTOCOL_VERSION}")]
    Version { got: u32 },
    /// A well-formed reply of the wrong kind for the request.
    #[error("unexpected reply: {0}")]
    Unexpected(String),
}

/// Encode `body` as one frame (header included).
pub fn encode<T: Serialize>(body: &T) -> Vec<u8> {
    let mut buf = vec![0u8; 4];
    // Serialising our own message types into a Vec cannot fail.
    serde_json::to_writer(&mut buf, &Envelope::new(body)).expect("message serialises");
    let len = (buf.len() - 4) as u32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    buf
}

/// Parse a frame's length header; errors when it exceeds [`MAX_FRAME`].
pub fn parse_len(header: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge {
            len,
            max: MAX_FRAME,
        });
    }
    Ok(len)
}

/// Decode a frame body, checking the protocol version first so a future peer gets a version
/// error rather than a confusing decode error. For replies (from the daemon); requests from
/// untrusted clients go through [`decode_request`].
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    #[derive(serde::Deserialize)]
    struct VersionOnly {
        v: u32,
    }
    let probe: VersionOnly = serde_json::from_slice(body).map_err(FrameError::Decode)?;
    if probe.v != PROTOCOL_VERSION {
        return Err(FrameError::Version { got: probe.v });
    }
    // `v` is one more key the body's type ignores.
    serde_json::from_slice(body).map_err(FrameError::Decode)
}

/// Decode a request frame body with memory proportional to the fields the request keeps:
/// unknown fields, values of other operations and nesting are skipped without being stored
/// (serde's tagged-enum decoding would first copy the whole document into generic values).
pub fn decode_request(body: &[u8]) -> Result<Request, FrameError> {
    crate::decode::request(body)
}

/// Blocking write of one frame.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, body: &T) -> Result<(), FrameError> {
    w.write_all(&encode(body))?;
    w.flush()?;
    Ok(())
}

/// Blocking read of one frame.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> Result<T, FrameError> {
    let mut header = [0u8; 4];
    r.read_exact(&mut header)?;
    let len = parse_len(header)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    decode(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{AttachmentKey, Family, Request};

    #[test]
    fn round_trip() {
        let req = Request::Check {
            key: AttachmentKey::new("n", "c", "eth0"),
        };
        let bytes = encode(&req);
        let back: Request = read_frame(&mut &bytes[..]).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn oversized_header_is_rejected_before_allocating() {
        let bytes = u32::MAX.to_be_bytes();
        let err = read_frame::<_, Request>(&mut &bytes[..]).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }));
    }

    #[test]
    fn wrong_version_is_a_version_error() {
        let body = br#"{"v":99,"op":"list"}"#;
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(body);
        let err = read_frame::<_, Request>(&mut &bytes[..]).unwrap_err();
        assert!(matches!(err, FrameError::Version { got: 99 }));
    }

    fn every_request() -> Vec<Request> {
        use crate::msg::{Attachment, PodRef};
        let key = AttachmentKey::new("n", "c", "eth0");
        vec![
            Request::Allocate {
                key: key.clone(),
                pod: PodRef {
                    namespace: Some("ns".into()),
                    name: Some("p".into()),
                    uid: Some("u".into()),
                },
                pool: Some("pool".into()),
                host_veth: Some("ali0123456789ab".into()),
                families: Some(vec![crate::msg::Family::Ipv4, crate::msg::Family::Ipv6]),
            },
            Request::Allocate {
                key: key.clone(),
                pod: PodRef::default(),
                pool: None,
                host_veth: None,
                families: None,
            },
            Request::Release {
                key: key.clone(),
                teardown_link: Some("ali0123456789ab".into()),
            },
            Request::Release {
                key: key.clone(),
                teardown_link: None,
            },
            Request::ReleaseLease {
                key: key.clone(),
                teardown_link: Some("ali0123456789ab".into()),
                lease: crate::msg::LeaseRef {
                    address: "10.0.0.7".parse().unwrap(),
                    allocated_at_ms: 42,
                },
            },
            Request::ReleaseLease {
                key: key.clone(),
                teardown_link: None,
                lease: crate::msg::LeaseRef {
                    address: "fd00:240::7".parse().unwrap(),
                    allocated_at_ms: 42,
                },
            },
            Request::Check { key },
            Request::List,
            Request::ListPage {
                after: Some("10.0.0.1".parse().unwrap()),
                limit: Some(5),
            },
            Request::ListPage {
                after: None,
                limit: None,
            },
            Request::ListPage {
                after: Some("fd00:240::1".parse().unwrap()),
                limit: None,
            },
            Request::Gc {
                network: "n".into(),
                valid: vec![Attachment {
                    container_id: "c".into(),
                    ifname: "eth0".into(),
                }],
            },
            Request::Status {
                pool: Some("p".into()),
                families: None,
            },
            Request::Status {
                pool: None,
                families: Some(vec![Family::Ipv6]),
            },
            Request::Status {
                pool: None,
                families: None,
            },
            Request::Stats,
            Request::RecordOp {
                verb: "ADD".into(),
                code: 7,
                duration_us: 99,
            },
        ]
    }

    #[test]
    fn the_streaming_request_decoder_agrees_with_the_types() {
        for req in every_request() {
            let bytes = encode(&req);
            assert_eq!(decode_request(&bytes[4..]).unwrap(), req);
            // What serde's own decoding of the type makes of it.
            assert_eq!(decode::<Request>(&bytes[4..]).unwrap(), req);
            // Keys in any order, unknown keys and values anywhere.
            let mut v: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(&bytes[4..]).unwrap();
            v.insert(
                "zz_unknown".into(),
                serde_json::json!({"a": [1, [2, {"b": 3}]]}),
            );
            let mut reordered: Vec<(String, serde_json::Value)> = v.into_iter().collect();
            reordered.reverse();
            let text = format!(
                "{{{}}}",
                reordered
                    .iter()
                    .map(|(k, v)| format!("{}:{}", serde_json::json!(k), v))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            assert_eq!(decode_request(text.as_bytes()).unwrap(), req, "{text}");
        }
    }

    #[test]
    fn bad_requests_are_decode_or_version_errors() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"v":1,"op":"explode"}"#, "explode"),
            (br#"{"op":"list"}"#, "missing field `v`"),
            (br#"{"v":1}"#, "missing field `op`"),
            (br#"{"v":1,"op":"check"}"#, "missing field `key`"),
            (br#"{"v":1,"op":"list"} trailing"#, "trailing"),
            (b"\x00\xffnot json", ""),
        ];
        for (body, want) in cases {
            match decode_request(body) {
                Err(FrameError::Decode(e)) => assert!(e.to_string().contains(want), "{e}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            decode_request(br#"{"op":"list","v":7}"#),
            Err(FrameError::Version { got: 7 })
        ));
        // Deep nesting where a field is kept is a type error at its first level; in an unknown
        // field it is skipped with a byte of stack per level, never built.
        let nest = |field: &str| {
            format!(
                r#"{{"v":1,"op":"check","{field}":{}{}}}"#,
                "[".repeat(100_000),
                "]".repeat(100_000)
            )
        };
        match decode_request(nest("key").as_bytes()) {
            Err(FrameError::Decode(e)) => assert!(e.to_string().contains("invalid type"), "{e}"),
            other => panic!("{other:?}"),
        }
        match decode_request(nest("x").as_bytes()) {
            Err(FrameError::Decode(e)) => assert!(e.to_string().contains("key"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn truncated_frame_is_an_io_error() {
        let mut bytes = encode(&Request::List);
        bytes.truncate(bytes.len() - 2);
        let err = read_frame::<_, Request>(&mut &bytes[..]).unwrap_err();
        assert!(matches!(err, FrameError::Io(_)));
    }
}
