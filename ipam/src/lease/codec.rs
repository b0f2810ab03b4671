//! The canonical field encoding of keys and pod data (see the parent module's docs).

use aliasnet_ipam_proto::{AttachmentKey, PodRef};

use super::*;

/// Optional-field presence bits (first byte of the extra part).
pub const HAS_NAMESPACE: u8 = 1;
pub const HAS_NAME: u8 = 2;
pub const HAS_UID: u8 = 4;
pub const HAS_VETH: u8 = 8;
pub const HAS_ALL: u8 = HAS_NAMESPACE | HAS_NAME | HAS_UID | HAS_VETH;

const KIND_RAW: u32 = 0;
const KIND_HEX: u32 = 1;
const KIND_UUID: u32 = 2;

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(buf: &[u8], pos: &mut usize) -> Option<u32> {
    let mut v: u32 = 0;
    for shift in [0, 7, 14] {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u32::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn is_lower_hex(b: &u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(b)
}

fn uuid_like(s: &[u8]) -> bool {
    s.len() == 36
        && s.iter().enumerate().all(|(i, b)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                *b == b'-'
            } else {
                is_lower_hex(b)
            }
        })
}

fn hex_like(s: &[u8]) -> bool {
    !s.is_empty() && s.len().is_multiple_of(2) && s.iter().all(is_lower_hex)
}

fn nibble(b: u8) -> u8 {
    if b.is_ascii_digit() {
        b - b'0'
    } else {
        b - b'a' + 10
    }
}

fn pack_hex(out: &mut Vec<u8>, hex: impl Iterator<Item = u8>) {
    let mut hi = None;
    for b in hex {
        match hi.take() {
            None => hi = Some(nibble(b)),
            Some(h) => out.push(h << 4 | nibble(b)),
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Append the canonical encoding of `s`.
pub fn put_field(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    if uuid_like(b) {
        put_varint(out, (16 << 2) | KIND_UUID);
        pack_hex(out, b.iter().copied().filter(|c| *c != b'-'));
    } else if hex_like(b) {
        put_varint(out, ((b.len() as u32 / 2) << 2) | KIND_HEX);
        pack_hex(out, b.iter().copied());
    } else {
        put_varint(out, ((b.len() as u32) << 2) | KIND_RAW);
        out.extend_from_slice(b);
    }
}

/// One decoded field, borrowed from the entry's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    Raw(&'a str),
    Hex(&'a [u8]),
    Uuid(&'a [u8]),
}

impl Field<'_> {
    pub fn write_to(&self, out: &mut String) {
        match self {
            Field::Raw(s) => out.push_str(s),
            Field::Hex(b) => {
                for x in *b {
                    out.push(HEX[(x >> 4) as usize] as char);
                    out.push(HEX[(x & 15) as usize] as char);
                }
            }
            Field::Uuid(b) => {
                for (i, x) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        out.push('-');
                    }
                    out.push(HEX[(x >> 4) as usize] as char);
                    out.push(HEX[(x & 15) as usize] as char);
                }
            }
        }
    }

    pub fn to_string_lossless(self) -> String {
        let mut s = String::new();
        self.write_to(&mut s);
        s
    }

    /// Equal to the text `s`, without allocating.
    pub fn eq_str(&self, s: &str) -> bool {
        match self {
            Field::Raw(r) => *r == s,
            Field::Hex(b) => {
                let sb = s.as_bytes();
                sb.len() == b.len() * 2
                    && b.iter().zip(sb.chunks(2)).all(|(x, c)| {
                        c[0] == HEX[(x >> 4) as usize] && c[1] == HEX[(x & 15) as usize]
                    })
            }
            Field::Uuid(_) => {
                let mut t = String::with_capacity(36);
                self.write_to(&mut t);
                t == s
            }
        }
    }
}

/// Decode the field at `*pos`, checking it is canonical.
pub(super) fn read_field<'a>(buf: &'a [u8], pos: &mut usize) -> Option<Field<'a>> {
    let h = get_varint(buf, pos)?;
    let (len, kind) = ((h >> 2) as usize, h & 3);
    let end = pos.checked_add(len).filter(|e| *e <= buf.len())?;
    let p = &buf[*pos..end];
    *pos = end;
    match kind {
        KIND_RAW => {
            if len > MAX_FIELD || uuid_like(p) || hex_like(p) {
                return None;
            }
            if p.contains(&0) {
                return None;
            }
            std::str::from_utf8(p).ok().map(Field::Raw)
        }
        KIND_HEX if len > 0 && len * 2 <= MAX_FIELD => Some(Field::Hex(p)),
        KIND_UUID if len == 16 => Some(Field::Uuid(p)),
        _ => None,
    }
}

/// The encoded key of `key` (no validation: call [`validate_key`] first).
pub fn encode_key(key: &AttachmentKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.network.len() + key.container_id.len() / 2 + 16);
    encode_key_into(&mut out, key);
    out
}

fn encode_key_into(out: &mut Vec<u8>, key: &AttachmentKey) {
    put_field(out, &key.network);
    put_field(out, &key.container_id);
    put_field(out, &key.ifname);
}

/// Encode key and optional fields; returns (data, key length).
pub fn encode_data(key: &AttachmentKey, pod: &PodRef, host_veth: Option<&str>) -> (Box<[u8]>, u16) {
    let mut out = Vec::with_capacity(128);
    encode_key_into(&mut out, key);
    let key_len = out.len() as u16;
    let mut present = 0;
    let at = out.len();
    out.push(0);
    for (bit, v) in [
        (HAS_NAMESPACE, pod.namespace.as_deref()),
        (HAS_NAME, pod.name.as_deref()),
        (HAS_UID, pod.uid.as_deref()),
        (HAS_VETH, host_veth),
    ] {
        if let Some(v) = v {
            present |= bit;
            put_field(&mut out, v);
        }
    }
    out[at] = present;
    (out.into_boxed_slice(), key_len)
}

/// The three key fields of an encoded key, if it is well formed (and nothing follows).
pub fn key_fields(key: &[u8]) -> Option<[Field<'_>; 3]> {
    let mut pos = 0;
    let f = [
        read_field(key, &mut pos)?,
        read_field(key, &mut pos)?,
        read_field(key, &mut pos)?,
    ];
    (pos == key.len()).then_some(f)
}

/// Validate an encoded key (from disk); every part must be non-empty.
pub fn key_is_valid(key: &[u8]) -> bool {
    key_fields(key).is_some_and(|f| f.iter().all(|x| !matches!(x, Field::Raw(""))))
}

/// Step over the field at `*pos`, checking only its framing (kind and length).
fn skip_field(buf: &[u8], pos: &mut usize) -> Option<()> {
    let h = get_varint(buf, pos)?;
    let (len, kind) = ((h >> 2) as usize, h & 3);
    let ok = match kind {
        KIND_RAW => len <= MAX_FIELD,
        KIND_HEX => len > 0 && len * 2 <= MAX_FIELD,
        KIND_UUID => len == 16,
        _ => false,
    };
    *pos = pos.checked_add(len).filter(|e| ok && *e <= buf.len())?;
    Some(())
}

/// Validate data from disk; returns the key length. The key is checked in full (the index
/// depends on its canonical form); the pod fields only for their framing, their text is
/// checked when read (a field that does not decode reads as absent). Loading 200,000
/// leases spends its time here otherwise, on records whose checksum already matched.
pub fn data_key_len(data: &[u8]) -> Option<u16> {
    let mut pos = 0;
    for _ in 0..3 {
        if matches!(read_field(data, &mut pos)?, Field::Raw("")) {
            return None;
        }
    }
    let key_len = pos;
    let present = *data.get(pos)?;
    pos += 1;
    if present & !HAS_ALL != 0 {
        return None;
    }
    for _ in 0..present.count_ones() {
        skip_field(data, &mut pos)?;
    }
    (pos == data.len() && key_len <= usize::from(u16::MAX)).then_some(key_len as u16)
}

/// Decode an encoded key into the wire type.
pub fn decode_key(key: &[u8]) -> AttachmentKey {
    match key_fields(key) {
        Some([n, c, i]) => AttachmentKey {
            network: n.to_string_lossless(),
            container_id: c.to_string_lossless(),
            ifname: i.to_string_lossless(),
        },
        None => AttachmentKey::new("?", "?", "?"),
    }
}

/// Human form of an encoded key, for messages.
pub fn display_key(key: &[u8]) -> String {
    decode_key(key).to_string()
}
