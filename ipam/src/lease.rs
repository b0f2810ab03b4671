//! Compact in-memory lease representation and the lease table.
//!
//! 200,000 leases must fit in a few tens of MiB and load in a few tens of milliseconds, so a
//! lease is not kept as the wire [`Lease`] (seven `String`s). All its text lives in one boxed
//! byte string, [`LeaseEntry::data`]:
//!
//! ```text
//! data  := key extra
//! key   := field(network) field(container_id) field(ifname)
//! extra := present:u8 [field(namespace)] [field(name)] [field(uid)] [field(host_veth)]
//! field := varint(len << 2 | kind) payload[len]
//!          kind 0 raw UTF-8, 1 lowercase hex of even length packed two digits a byte,
//!          2 canonical lowercase UUID (8-4-4-4-12) as its 16 bytes
//! ```
//!
//! The common container id (64 hex digits) takes 33 bytes instead of 64, a pod UID 17 instead
//! of 36. The encoding is canonical (a string has exactly one encoding: raw is only used for
//! text that is neither hex nor a UUID), so keys compare and hash as bytes. The same bytes are
//! what the store writes, so loading a snapshot is a copy, not a parse into strings.
//!
//! [`LeaseTable`] holds the entries in a slab, indexed by key (hash table of slab ids) and by
//! address (ordered, for paging and scans in address order).

use std::{collections::BTreeMap, fmt::Write as _, hash::BuildHasher, net::Ipv4Addr};

use aliasnet_ipam_proto::{AttachmentKey, Lease, PodRef};
use hashbrown::HashTable;

/// Longest accepted key or pod field, in bytes.
pub const MAX_FIELD: usize = 1024;
/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
pub const MAX_IFNAME: usize = 15;

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
fn read_field<'a>(buf: &'a [u8], pos: &mut usize) -> Option<Field<'a>> {
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

/// Where a lease is in its commit life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Durable and acknowledged (or acknowledgeable).
    Committed,
    /// Reserved in memory; its record is not yet durable. Invisible to readers.
    PendingAlloc,
    /// Committed, and a release record is on its way to disk. Still visible to readers.
    PendingRelease,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEntry {
    /// Key then optional fields, encoded as described in the module docs.
    pub data: Box<[u8]>,
    pub allocated_at_ms: u64,
    pub addr: u32,
    /// Bytes of `data` that are the key.
    pub key_len: u16,
    /// Index into the state's pool-name table.
    pub pool_name: u16,
    pub state: LeaseState,
    /// Handed out again by an idempotent repeat since it was made (so someone holds it even if
    /// the first requester vanished).
    pub seen: bool,
}

impl LeaseEntry {
    pub fn key(&self) -> &[u8] {
        &self.data[..usize::from(self.key_len)]
    }

    /// The optional fields in order: namespace, name, uid, host veth.
    pub fn fields(&self) -> [Option<Field<'_>>; 4] {
        let mut out = [None; 4];
        let mut pos = usize::from(self.key_len);
        let Some(&present) = self.data.get(pos) else {
            return out;
        };
        pos += 1;
        for (i, bit) in [HAS_NAMESPACE, HAS_NAME, HAS_UID, HAS_VETH]
            .into_iter()
            .enumerate()
        {
            if present & bit != 0 {
                out[i] = read_field(&self.data, &mut pos);
            }
        }
        out
    }

    pub fn host_veth(&self) -> Option<String> {
        self.fields()[3].map(Field::to_string_lossless)
    }

    /// The host veth field, borrowed (veth names are raw text, so `Field::Raw` in practice).
    pub fn host_veth_field(&self) -> Option<Field<'_>> {
        self.fields()[3]
    }

    pub fn host_veth_is(&self, name: &str) -> bool {
        self.fields()[3].is_some_and(|f| f.eq_str(name))
    }

    /// The key's network is `network`.
    pub fn network_is(&self, network: &str) -> bool {
        let mut pos = 0;
        read_field(&self.data, &mut pos).is_some_and(|f| f.eq_str(network))
    }

    pub fn attachment_key(&self) -> AttachmentKey {
        decode_key(self.key())
    }

    pub fn to_lease(&self, pool: &str) -> Lease {
        let [namespace, name, uid, veth] = self.fields();
        Lease {
            key: self.attachment_key(),
            address: Ipv4Addr::from(self.addr),
            pool: pool.to_owned(),
            pod: PodRef {
                namespace: namespace.map(Field::to_string_lossless),
                name: name.map(Field::to_string_lossless),
                uid: uid.map(Field::to_string_lossless),
            },
            host_veth: veth.map(Field::to_string_lossless),
            allocated_at_ms: self.allocated_at_ms,
            missing: false,
        }
    }

    /// Bytes a [`Lease`] of this entry takes as JSON, roughly (for paging under a frame limit).
    pub fn json_size_hint(&self) -> usize {
        // Field names and punctuation ~200 bytes; hex-packed text doubles back.
        240 + self.data.len() * 2
    }
}

/// Why an insert was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The key already holds a lease (its id).
    Key(u32),
    /// The address is already leased (the holder's id).
    Addr(u32),
}

type Hasher = foldhash::fast::FixedState;

/// Entries per slab chunk.
const CHUNK: usize = 4096;

/// Slab storage in fixed chunks: it grows 160 KiB at a time, so a big table never has the
/// up-to-half-empty tail (and the copy) of a doubling `Vec`.
#[derive(Default)]
struct Slab {
    chunks: Vec<Box<[Option<LeaseEntry>]>>,
    len: usize,
}

impl Slab {
    fn get(&self, id: u32) -> &Option<LeaseEntry> {
        let i = id as usize;
        &self.chunks[i / CHUNK][i % CHUNK]
    }

    fn get_mut(&mut self, id: u32) -> &mut Option<LeaseEntry> {
        let i = id as usize;
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }

    fn push(&mut self, e: LeaseEntry) -> u32 {
        if self.len == self.chunks.len() * CHUNK {
            self.chunks.push(
                (0..CHUNK)
                    .map(|_| None)
                    .collect::<Vec<_>>()
                    .into_boxed_slice(),
            );
        }
        let id = self.len as u32;
        self.len += 1;
        *self.get_mut(id) = Some(e);
        id
    }

    fn iter(&self) -> impl Iterator<Item = (u32, &LeaseEntry)> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter())
            .take(self.len)
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i as u32, e)))
    }
}

/// All leases: a slab of entries, a hash index by key and an ordered index by address.
#[derive(Default)]
pub struct LeaseTable {
    slab: Slab,
    vacant: Vec<u32>,
    index: HashTable<u32>,
    by_addr: BTreeMap<u32, u32>,
    hasher: Hasher,
}

impl LeaseTable {
    pub fn with_capacity(n: usize) -> Self {
        Self {
            index: HashTable::with_capacity(n),
            ..Self::default()
        }
    }

    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The id of the lease of `key` (encoded).
    pub fn find(&self, key: &[u8]) -> Option<u32> {
        let h = self.hash(key);
        self.index
            .find(h, |&id| {
                self.slab.get(id).as_ref().is_some_and(|e| e.key() == key)
            })
            .copied()
    }

    pub fn get(&self, id: u32) -> &LeaseEntry {
        self.slab.get(id).as_ref().expect("live lease id")
    }

    pub fn get_mut(&mut self, id: u32) -> &mut LeaseEntry {
        self.slab.get_mut(id).as_mut().expect("live lease id")
    }

    pub fn by_addr(&self, addr: u32) -> Option<u32> {
        self.by_addr.get(&addr).copied()
    }

    pub fn insert(&mut self, e: LeaseEntry) -> Result<u32, InsertError> {
        // One hash, one probe of each index (loading 200,000 leases is mostly this).
        let h = self.hash(e.key());
        let (slab, hasher) = (&self.slab, &self.hasher);
        let key_slot = match self.index.entry(
            h,
            |&id| slab.get(id).as_ref().is_some_and(|x| x.key() == e.key()),
            |&i| hasher.hash_one(slab.get(i).as_ref().expect("indexed").key()),
        ) {
            hashbrown::hash_table::Entry::Occupied(o) => return Err(InsertError::Key(*o.get())),
            hashbrown::hash_table::Entry::Vacant(v) => v,
        };
        let addr_slot = match self.by_addr.entry(e.addr) {
            std::collections::btree_map::Entry::Occupied(o) => {
                return Err(InsertError::Addr(*o.get()))
            }
            std::collections::btree_map::Entry::Vacant(v) => v,
        };
        let id = match self.vacant.pop() {
            Some(id) => {
                *self.slab.get_mut(id) = Some(e);
                id
            }
            None => self.slab.push(e),
        };
        key_slot.insert(id);
        addr_slot.insert(id);
        Ok(id)
    }

    pub fn remove(&mut self, id: u32) -> LeaseEntry {
        let e = self.slab.get_mut(id).take().expect("live lease id");
        let h = self.hash(e.key());
        if let Ok(o) = self.index.find_entry(h, |&i| i == id) {
            o.remove();
        }
        self.by_addr.remove(&e.addr);
        self.vacant.push(id);
        e
    }

    /// Every lease, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &LeaseEntry)> {
        self.slab.iter()
    }

    /// (address, id) of leases with an address above `after` (all when `None`), ascending.
    pub fn after_addr(&self, after: Option<u32>) -> impl Iterator<Item = (u32, u32)> + '_ {
        let range = match after {
            None => self.by_addr.range(..),
            Some(u32::MAX) => self.by_addr.range(u32::MAX..u32::MAX),
            Some(a) => self.by_addr.range(a + 1..),
        };
        range.map(|(a, i)| (*a, *i))
    }
}

/// Check a request's key; the error names the bad field.
pub fn validate_key(key: &AttachmentKey) -> Result<(), String> {
    for (name, v) in [
        ("network", &key.network),
        ("container_id", &key.container_id),
        ("ifname", &key.ifname),
    ] {
        if v.is_empty() {
            return Err(format!("key.{name} must not be empty"));
        }
        check_text(&format!("key.{name}"), v)?;
    }
    Ok(())
}

pub fn validate_pod(pod: &PodRef) -> Result<(), String> {
    for (name, v) in [
        ("namespace", &pod.namespace),
        ("name", &pod.name),
        ("uid", &pod.uid),
    ] {
        if let Some(v) = v {
            check_text(&format!("pod.{name}"), v)?;
        }
    }
    Ok(())
}

fn check_text(field: &str, v: &str) -> Result<(), String> {
    if v.len() > MAX_FIELD {
        return Err(format!(
            "{field} is {} bytes long; at most {MAX_FIELD} are accepted",
            v.len()
        ));
    }
    if v.contains('\0') {
        return Err(format!("{field} contains a NUL character"));
    }
    Ok(())
}

/// A valid Linux interface name (what the kernel's `dev_valid_name` accepts).
pub fn validate_ifname(field: &str, v: &str) -> Result<(), String> {
    if v.is_empty() || v.len() > MAX_IFNAME || v == "." || v == ".." {
        return Err(format!(
            "{field} {v:?} is not a valid interface name (1 to {MAX_IFNAME} bytes)"
        ));
    }
    if v.bytes()
        .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
    {
        return Err(format!(
            "{field} {v:?} is not a valid interface name (no '/', ':' or whitespace)"
        ));
    }
    Ok(())
}

/// `key` as text for log lines (`network/container/ifname`).
pub fn key_text(key: &AttachmentKey) -> String {
    let mut s = String::new();
    let _ = write!(s, "{key}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &AttachmentKey, pod: &PodRef, veth: Option<&str>, addr: u32) -> LeaseEntry {
        let (data, key_len) = encode_data(key, pod, veth);
        LeaseEntry {
            data,
            allocated_at_ms: 7,
            addr,
            key_len,
            pool_name: 0,
            state: LeaseState::Committed,
            seen: false,
        }
    }

    #[test]
    fn fields_round_trip_in_every_encoding() {
        let cid = "0123456789abcdef".repeat(4);
        for (c, u) in [
            (cid.as_str(), "123e4567-e89b-12d3-a456-426614174000"),
            ("ABC", "not-a-uuid"),
            ("abc", "123E4567-E89B-12D3-A456-426614174000"),
            ("ab", ""),
            ("recovered:ali1234", "x"),
        ] {
            let key = AttachmentKey::new("net", c, "eth0");
            let pod = PodRef {
                namespace: Some("ns".into()),
                name: None,
                uid: Some(u.into()),
            };
            let e = entry(&key, &pod, Some("ali0123456789ab"), 0x0a00_0001);
            assert_eq!(data_key_len(&e.data), Some(e.key_len));
            let l = e.to_lease("p");
            assert_eq!(l.key, key);
            assert_eq!(l.pod, pod);
            assert_eq!(l.host_veth.as_deref(), Some("ali0123456789ab"));
            assert!(e.host_veth_is("ali0123456789ab"));
            assert!(e.network_is("net") && !e.network_is("ne"));
            assert_eq!(encode_key(&key), e.key());
        }
        // The common case is compact: 64 hex digits take 33 bytes.
        let key = AttachmentKey::new("aliasnet", &cid, "eth0");
        assert_eq!(encode_key(&key).len(), 9 + 34 + 5);
    }

    #[test]
    fn hex_field_compares_without_decoding() {
        let mut b = Vec::new();
        put_field(&mut b, "00ff");
        let mut pos = 0;
        let f = read_field(&b, &mut pos).unwrap();
        assert!(f.eq_str("00ff"));
        assert!(!f.eq_str("00fe") && !f.eq_str("00ff00") && !f.eq_str("00FF"));
    }

    #[test]
    fn non_canonical_bytes_are_rejected() {
        // "ab" written raw instead of hex-packed.
        let mut b = vec![(2 << 2) as u8];
        b.extend_from_slice(b"ab");
        assert!(read_field(&b, &mut 0).is_none());
        assert!(!key_is_valid(b"\x00\x00\x00"), "empty parts");
        assert!(
            data_key_len(&[4, b'a', 4, b'b', 4, b'c', 0x10]).is_none(),
            "bad present bits"
        );
        assert_eq!(data_key_len(&[4, b'g', 4, b'h', 4, b'i', 0]), Some(6));
        // A pod field whose text does not decode loads (its framing is sound) and reads as
        // absent; the fields after it still decode.
        let data: Box<[u8]> = vec![
            4,
            b'g',
            4,
            b'h',
            4,
            b'i',
            HAS_NAME | HAS_VETH,
            8,
            0xff,
            0xfe,
            8,
            b'v',
            b'1',
        ]
        .into();
        assert_eq!(data_key_len(&data), Some(6));
        let e = LeaseEntry {
            data,
            allocated_at_ms: 0,
            addr: 1,
            key_len: 6,
            pool_name: 0,
            state: LeaseState::Committed,
            seen: true,
        };
        let l = e.to_lease("p");
        assert_eq!((l.pod.name, l.host_veth.as_deref()), (None, Some("v1")));
        // Framing errors are refused: a UUID of the wrong length, a field past the end.
        assert!(
            data_key_len(&[4, b'g', 4, b'h', 4, b'i', HAS_UID, (4 << 2) | 2, 1, 2, 3, 4]).is_none()
        );
        assert!(data_key_len(&[4, b'g', 4, b'h', 4, b'i', HAS_NAME, 40, b'x']).is_none());
    }

    #[test]
    fn table_indexes_by_key_and_address() {
        let mut t = LeaseTable::default();
        let pod = PodRef::default();
        let ka = AttachmentKey::new("n", "a", "eth0");
        let kb = AttachmentKey::new("n", "b", "eth0");
        let a = t.insert(entry(&ka, &pod, None, 5)).unwrap();
        let b = t.insert(entry(&kb, &pod, None, 3)).unwrap();
        assert_eq!(
            t.insert(entry(&ka, &pod, None, 9)),
            Err(InsertError::Key(a))
        );
        let kc = AttachmentKey::new("n", "c", "eth0");
        assert_eq!(
            t.insert(entry(&kc, &pod, None, 3)),
            Err(InsertError::Addr(b))
        );
        assert_eq!(t.find(&encode_key(&kb)), Some(b));
        assert_eq!(t.after_addr(None).collect::<Vec<_>>(), vec![(3, b), (5, a)]);
        assert_eq!(t.after_addr(Some(3)).collect::<Vec<_>>(), vec![(5, a)]);
        t.remove(b);
        assert_eq!(t.find(&encode_key(&kb)), None);
        assert_eq!(t.len(), 1);
        // The vacant slot is reused.
        assert_eq!(t.insert(entry(&kc, &pod, None, 3)).unwrap(), b);
        for i in 0..1000u32 {
            let k = AttachmentKey::new("n", &format!("k{i}"), "eth0");
            t.insert(entry(&k, &pod, None, 100 + i)).unwrap();
        }
        for i in 0..1000u32 {
            let k = AttachmentKey::new("n", &format!("k{i}"), "eth0");
            let id = t.find(&encode_key(&k)).unwrap();
            assert_eq!(t.get(id).addr, 100 + i);
        }
    }

    #[test]
    fn validation() {
        assert!(validate_key(&AttachmentKey::new("n", "", "eth0")).is_err());
        assert!(validate_key(&AttachmentKey::new("n", "c\0", "eth0")).is_err());
        assert!(validate_key(&AttachmentKey::new("n", &"x".repeat(2000), "eth0")).is_err());
        assert!(validate_key(&AttachmentKey::new("n", "c", "eth0")).is_ok());
        assert!(validate_ifname("host_veth", "ali0123456789ab").is_ok());
        assert!(validate_ifname("host_veth", "ali0123456789abc").is_err());
        assert!(validate_ifname("host_veth", "a/b").is_err());
    }
}
