//! What can be wrong with a file header or a record, as read back.

use crate::lease::FieldError;

use super::{FORMAT_VERSION, HEADER_LEN, MAX_RECORD, OLDEST_READABLE};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("file is {len} bytes, shorter than its {HEADER_LEN}-byte header")]
    ShortHeader { len: usize },
    #[error("bad magic {found:?} (expected {expected:?})")]
    BadMagic { found: String, expected: String },
    #[error("header checksum mismatch")]
    HeaderChecksum,
    #[error(
        "format version {version}, this daemon reads versions {OLDEST_READABLE} to {FORMAT_VERSION}"
    )]
    Version { version: u32 },
    #[error("record length {len} out of range (1 to {MAX_RECORD})")]
    Length { len: usize },
    #[error("record checksum mismatch")]
    Checksum,
    #[error("record cut short")]
    CutShort,
    #[error("record payload truncated")]
    Truncated,
    #[error("IPv6 record with the reserved address {addr}")]
    ReservedV6 { addr: u128 },
    #[error("record string is not UTF-8")]
    NotUtf8,
    #[error("bad option tag {tag}")]
    OptionTag { tag: u8 },
    #[error("record with a malformed key")]
    MalformedKey,
    #[error("alloc record with a malformed key or pod fields")]
    AllocData,
    #[error("alloc record with malformed pod fields")]
    PodFields,
    #[error("release record with a malformed key")]
    ReleaseKey,
    #[error("batch marker where a record was expected")]
    BatchMarker,
    #[error("unknown record type {kind}")]
    UnknownType { kind: u8 },
    #[error("trailing bytes in record")]
    Trailing,
    #[error(transparent)]
    Link(#[from] FieldError),
}
