//! Framing: a 4-byte big-endian length, then that many bytes of JSON.
//!
//! The length is checked against [`MAX_FRAME`] before any allocation, so a hostile or broken
//! peer cannot make either side allocate unbounded memory.

use std::io::{self, Read, Write};

use serde::{de::DeserializeOwned, Serialize};

use crate::msg::{Envelope, PROTOCOL_VERSION};

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
/// error rather than a confusing decode error.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    #[derive(serde::Deserialize)]
    struct VersionOnly {
        v: u32,
    }
    let probe: VersionOnly = serde_json::from_slice(body).map_err(FrameError::Decode)?;
    if probe.v != PROTOCOL_VERSION {
        return Err(FrameError::Version { got: probe.v });
    }
    let env: Envelope<T> = serde_json::from_slice(body).map_err(FrameError::Decode)?;
    Ok(env.body)
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
    use crate::msg::{AttachmentKey, Request};

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

    #[test]
    fn truncated_frame_is_an_io_error() {
        let mut bytes = encode(&Request::List);
        bytes.truncate(bytes.len() - 2);
        let err = read_frame::<_, Request>(&mut &bytes[..]).unwrap_err();
        assert!(matches!(err, FrameError::Io(_)));
    }
}
