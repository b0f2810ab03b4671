//! Binary records of the log and the snapshot.
//!
//! ```text
//! file   := header record* zero*
//! header := magic[8] version:u32 reserved:u32 generation:u64 crc:u32      (28 bytes)
//! record := len:u32 crc:u32 payload[len]        crc = crc32(len bytes ++ payload)
//! payload:= 5 Alloc   addr:u32 allocated_at_ms:u64 pool:str data:bytes
//!         | 6 Release addr:u32 released_at_ms:u64 key:bytes teardown:opt
//!         | 3 Cooling addr:u32 released_at_ms:u64 teardown:opt          (snapshot only)
//!         | 4 End     leases:u64 cooling:u64                            (snapshot only, last)
//!         | 7 Batch   bytes:u32 crc:u32                                 (log only, version 3)
//!         | 8 Alloc   addr:u128 allocated_at_ms:u64 pool:str data:bytes     (IPv6, version 3)
//!         | 9 Release addr:u128 released_at_ms:u64 key:bytes teardown:opt   (IPv6, version 3)
//!         | 10 Cooling addr:u128 released_at_ms:u64 teardown:opt  (IPv6, snapshot only, version 3)
//!         | 1 Alloc (version 1) addr:u32 allocated_at_ms:u64 present:u8 key:str pool:str extra:str
//!         | 2 Release (version 1) addr:u32 released_at_ms:u64 key:str teardown:opt
//! str    := len:u16 utf8[len]     bytes := len:u16 byte[len]     opt := 0 | 1 str
//! ```
//! All integers little-endian. `data` and `key` are the compact encodings of
//! [`crate::lease`] (what the daemon keeps in memory, so loading is a copy). Version 2 files
//! are written with types 3-6 and logs are pre-allocated: a log ends at its first all-zero
//! frame header, followed by zeros only. Version 1 files (types 1-4, packed `\0`-separated
//! key strings) are still read. A hand-rolled format rather than JSON: replaying 200,000
//! leases must take well under the 300 ms restart budget.
//!
//! Version 3 logs group the records of each group commit behind a `Batch` marker giving the
//! length and CRC32 of the records that follow it. A power cut during the batch's write can
//! persist its pages in any order (a zero page followed by records of the same batch); the
//! marker lets the loader tell such an unacknowledged batch (no verified batch after it) from
//! damage to acknowledged data (verified batches after it). Version 2 logs are still read, and
//! a daemon never appends version-3 batches to an older log.
//!
//! IPv6 leases use types 8-10, the IPv4 types with a 16-byte address; an IPv4 lease is
//! written exactly as before, so a file only changes once an IPv6 pool is used (a daemon
//! older than these types then refuses it as unknown records instead of forgetting leases).

use crate::lease::{
    data_key_len, encode_data, key_is_valid, validate_ifname, Addr, HAS_ALL, V6_START,
};
use aliasnet_ipam_proto::{AttachmentKey, PodRef};

mod error;
pub use error::RecordError;

pub const HEADER_LEN: usize = 28;
pub const LOG_MAGIC: &[u8; 8] = b"ALNIPLOG";
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"ALNIPSNP";
/// Written in new files. Bump on any incompatible change of the layout above.
pub const FORMAT_VERSION: u32 = 3;
/// First version whose logs group records in batches.
pub const BATCHED_VERSION: u32 = 3;
/// Framed length of a batch marker.
pub const BATCH_MARKER_LEN: usize = FRAME_HEADER + 9;
/// Oldest version still read.
pub const OLDEST_READABLE: u32 = 1;
/// No legitimate record comes close; a larger length field is corruption.
pub const MAX_RECORD: usize = 64 << 10;
/// Bytes of a frame header (length + checksum).
pub const FRAME_HEADER: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocRec {
    /// Encoded key and optional fields ([`crate::lease`]).
    pub data: Box<[u8]>,
    pub key_len: u16,
    pub addr: Addr,
    pub allocated_at_ms: u64,
    pub pool: Box<str>,
}

impl AllocRec {
    pub fn key(&self) -> &[u8] {
        &self.data[..usize::from(self.key_len)]
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRec {
    /// Encoded key.
    pub key: Box<[u8]>,
    pub addr: Addr,
    pub released_at_ms: u64,
    /// Host link to delete; kept in the record so a teardown cut short by a crash is redone.
    pub teardown: Option<Box<str>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoolRec {
    pub addr: Addr,
    pub released_at_ms: u64,
    pub teardown: Option<Box<str>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Alloc(AllocRec),
    Release(ReleaseRec),
    Cooling(CoolRec),
    End { leases: u64, cooling: u64 },
}

pub fn encode_header(out: &mut Vec<u8>, magic: &[u8; 8], generation: u64) {
    encode_header_version(out, magic, generation, FORMAT_VERSION);
}

/// A header of an older format `version` (tests of upgrades).
pub fn encode_header_version(out: &mut Vec<u8>, magic: &[u8; 8], generation: u64, version: u32) {
    let start = out.len();
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Check a header; returns the generation.
pub fn decode_header(buf: &[u8], magic: &[u8; 8]) -> Result<u64, RecordError> {
    decode_header_version(buf, magic).map(|(g, _)| g)
}

/// Check a header; returns (generation, format version).
pub fn decode_header_version(buf: &[u8], magic: &[u8; 8]) -> Result<(u64, u32), RecordError> {
    if buf.len() < HEADER_LEN {
        return Err(RecordError::ShortHeader { len: buf.len() });
    }
    if &buf[..8] != magic {
        return Err(RecordError::BadMagic {
            found: String::from_utf8_lossy(&buf[..8]).into_owned(),
            expected: String::from_utf8_lossy(magic).into_owned(),
        });
    }
    let crc = u32::from_le_bytes(buf[24..28].try_into().expect("4 bytes"));
    if crc32fast::hash(&buf[..24]) != crc {
        return Err(RecordError::HeaderChecksum);
    }
    let version = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    if !(OLDEST_READABLE..=FORMAT_VERSION).contains(&version) {
        return Err(RecordError::Version { version });
    }
    Ok((
        u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes")),
        version,
    ))
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Lengths are bounded by request validation (MAX_FIELD), far below u16::MAX.
    let len = u16::try_from(s.len()).expect("field length validated");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Encoded keys and data are bounded by request validation (a few KiB).
    let len = u16::try_from(b.len()).expect("field length validated");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(b);
}

fn put_opt(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.push(0),
        Some(s) => {
            out.push(1);
            put_str(out, s);
        }
    }
}

/// The record type (`types[0]` for an IPv4 address, `types[1]` for IPv6) and the address.
fn put_addr(out: &mut Vec<u8>, types: [u8; 2], addr: Addr) {
    match u32::try_from(addr) {
        Ok(v4) => {
            out.push(types[0]);
            out.extend_from_slice(&v4.to_le_bytes());
        }
        Err(_) => {
            out.push(types[1]);
            out.extend_from_slice(&addr.to_le_bytes());
        }
    }
}

/// Append one framed record to `out`.
pub fn encode(out: &mut Vec<u8>, rec: &Record) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER]);
    match rec {
        Record::Alloc(a) => {
            put_addr(out, [5, 8], a.addr);
            out.extend_from_slice(&a.allocated_at_ms.to_le_bytes());
            put_str(out, &a.pool);
            put_bytes(out, &a.data);
        }
        Record::Release(r) => {
            put_addr(out, [6, 9], r.addr);
            out.extend_from_slice(&r.released_at_ms.to_le_bytes());
            put_bytes(out, &r.key);
            put_opt(out, r.teardown.as_deref());
        }
        Record::Cooling(c) => {
            put_addr(out, [3, 10], c.addr);
            out.extend_from_slice(&c.released_at_ms.to_le_bytes());
            put_opt(out, c.teardown.as_deref());
        }
        Record::End { leases, cooling } => {
            out.push(4);
            out.extend_from_slice(&leases.to_le_bytes());
            out.extend_from_slice(&cooling.to_le_bytes());
        }
    }
    seal(out, start);
}

/// Append one group commit to `out`: a batch marker, then `records` (framed records).
pub fn encode_batch(out: &mut Vec<u8>, records: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER]);
    out.push(7);
    let len = u32::try_from(records.len()).expect("a batch is far below 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(records).to_le_bytes());
    seal(out, start);
    out.extend_from_slice(records);
}

/// The batch marker whose frame starts `buf` (already checked by [`check_frame`]): the length
/// and CRC32 of the records it covers. `None` for any other frame.
pub fn peek_batch(frame: &[u8]) -> Option<(usize, u32)> {
    let p = frame.get(FRAME_HEADER..BATCH_MARKER_LEN)?;
    if p[0] != 7 || u32::from_le_bytes(frame[0..4].try_into().ok()?) != 9 {
        return None;
    }
    let len = u32::from_le_bytes(p[1..5].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(p[5..9].try_into().ok()?);
    Some((len, crc))
}

/// Where the batch starting at `buf[off..]` ends, if a complete batch with a valid marker and
/// matching records starts there.
pub fn verified_batch(buf: &[u8], off: usize) -> Option<usize> {
    let rest = buf.get(off..)?;
    check_frame(rest).ok()?;
    let (len, crc) = peek_batch(rest)?;
    let records = rest.get(BATCH_MARKER_LEN..BATCH_MARKER_LEN + len)?;
    (len > 0 && crc32fast::hash(records) == crc).then_some(off + BATCH_MARKER_LEN + len)
}

/// Fill in the length and checksum of the frame starting at `start` (payload already there).
pub fn seal(out: &mut [u8], start: usize) {
    let len = u32::try_from(out.len() - start - FRAME_HEADER).expect("record fits u32");
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(&out[start + FRAME_HEADER..]);
    let crc = h.finalize();
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Outcome of reading one frame at some offset.
#[derive(Debug)]
pub enum Frame {
    /// A valid record and its total framed length.
    Ok(Record, usize),
    /// The frame runs past the end of the data: a write cut short.
    Incomplete,
    /// Bad length, checksum or content.
    Bad(RecordError),
}

/// Read the frame at the start of `buf`.
pub fn read_frame(buf: &[u8]) -> Frame {
    match check_frame(buf) {
        Ok(len) => match decode_payload(&buf[FRAME_HEADER..FRAME_HEADER + len]) {
            Ok(r) => Frame::Ok(r, FRAME_HEADER + len),
            Err(e) => Frame::Bad(e),
        },
        Err(f) => f,
    }
}

/// Check the length and checksum of the frame at the start of `buf`; returns the payload
/// length (the payload is not decoded).
pub fn check_frame(buf: &[u8]) -> Result<usize, Frame> {
    if buf.len() < 8 {
        return Err(Frame::Incomplete);
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if len == 0 || len > MAX_RECORD {
        return Err(Frame::Bad(RecordError::Length { len }));
    }
    if buf.len() < 8 + len {
        return Err(Frame::Incomplete);
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[0..4]);
    h.update(&buf[8..8 + len]);
    if h.finalize() != crc {
        return Err(Frame::Bad(RecordError::Checksum));
    }
    Ok(len)
}

/// A version-2 alloc payload (type 5), borrowed.
pub struct AllocView<'a> {
    pub addr: Addr,
    pub allocated_at_ms: u64,
    pub pool: &'a str,
    pub data: &'a [u8],
    pub key_len: u16,
}

/// Parse a version-2 alloc payload without copying (loading 200,000 leases then costs one
/// allocation each); `None` for any other record type, `Some(Err)` when it is malformed.
pub fn view_alloc(p: &[u8]) -> Option<Result<AllocView<'_>, RecordError>> {
    let t = *p.first()?;
    if t != 5 && t != 8 {
        return None;
    }
    let mut c = Cursor(&p[1..]);
    Some((|| {
        let addr = c.addr(t == 8)?;
        let allocated_at_ms = c.u64()?;
        let pool = std::str::from_utf8(c.bytes()?).map_err(|_| RecordError::NotUtf8)?;
        let data = c.bytes()?;
        if !c.0.is_empty() {
            return Err(RecordError::Trailing);
        }
        let key_len = data_key_len(data).ok_or(RecordError::AllocData)?;
        Ok(AllocView {
            addr,
            allocated_at_ms,
            pool,
            data,
            key_len,
        })
    })())
}

/// Address and encoded key of a version-2 alloc payload (type 5), without copying; `None`
/// for any other record or a malformed one.
pub fn peek_alloc(p: &[u8]) -> Option<(Addr, &[u8])> {
    let mut c = Cursor(p);
    let t = c.u8().ok()?;
    if t != 5 && t != 8 {
        return None;
    }
    let addr = c.addr(t == 8).ok()?;
    c.u64().ok()?;
    let pool_len = u16::from_le_bytes(c.take(2).ok()?.try_into().ok()?) as usize;
    c.take(pool_len).ok()?;
    let data = c.bytes().ok()?;
    if !c.0.is_empty() {
        return None;
    }
    let key_len = usize::from(data_key_len(data)?);
    Some((addr, &data[..key_len]))
}

/// A version-2 release payload (type 6) without copying: (address, release time, encoded key,
/// link to tear down); `None` for any other record or a malformed one.
pub fn peek_release(p: &[u8]) -> Option<(Addr, u64, &[u8], Option<&str>)> {
    let mut c = Cursor(p);
    let t = c.u8().ok()?;
    if t != 6 && t != 9 {
        return None;
    }
    let addr = c.addr(t == 9).ok()?;
    let at = c.u64().ok()?;
    let key = c.bytes().ok()?;
    let teardown = match c.u8().ok()? {
        0 => None,
        1 => Some(std::str::from_utf8(c.bytes().ok()?).ok()?),
        _ => return None,
    };
    if !c.0.is_empty() || !key_is_valid(key) || check_link(teardown).is_err() {
        return None;
    }
    Some((addr, at, key, teardown))
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, RecordError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    /// An IPv4 address (4 bytes) or, with `v6`, an IPv6 one (16 bytes, never below 2^32).
    fn addr(&mut self, v6: bool) -> Result<Addr, RecordError> {
        if !v6 {
            return Ok(Addr::from(self.u32()?));
        }
        let a = u128::from_le_bytes(self.take(16)?.try_into().expect("16"));
        if a < V6_START {
            return Err(RecordError::ReservedV6 { addr: a });
        }
        Ok(a)
    }
    fn str(&mut self) -> Result<Box<str>, RecordError> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().expect("2")) as usize;
        let b = self.take(len)?;
        std::str::from_utf8(b)
            .map(Into::into)
            .map_err(|_| RecordError::NotUtf8)
    }
    fn bytes(&mut self) -> Result<&'a [u8], RecordError> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().expect("2")) as usize;
        self.take(len)
    }
    fn opt(&mut self) -> Result<Option<Box<str>>, RecordError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.str().map(Some),
            tag => Err(RecordError::OptionTag { tag }),
        }
    }
}

/// Split a version-1 packed key (`network\0container\0ifname`).
fn v1_key(packed: &str) -> Result<AttachmentKey, RecordError> {
    let parts: Vec<&str> = packed.split('\0').collect();
    match parts.as_slice() {
        [n, c, i] if !n.is_empty() && !c.is_empty() && !i.is_empty() => {
            Ok(AttachmentKey::new(n, c, i))
        }
        _ => Err(RecordError::MalformedKey),
    }
}

pub fn decode_payload(p: &[u8]) -> Result<Record, RecordError> {
    let mut c = Cursor(p);
    let rec = match c.u8()? {
        t @ (5 | 8) => {
            let addr = c.addr(t == 8)?;
            let allocated_at_ms = c.u64()?;
            let pool = c.str()?;
            let data = c.bytes()?;
            let key_len = data_key_len(data).ok_or(RecordError::AllocData)?;
            Record::Alloc(AllocRec {
                data: data.into(),
                key_len,
                addr,
                allocated_at_ms,
                pool,
            })
        }
        t @ (6 | 9) => {
            let addr = c.addr(t == 9)?;
            let released_at_ms = c.u64()?;
            let key = c.bytes()?;
            let teardown = c.opt()?;
            release_rec(key, addr, released_at_ms, teardown)?
        }
        1 => {
            let addr = Addr::from(c.u32()?);
            let allocated_at_ms = c.u64()?;
            let present = c.u8()?;
            let key = v1_key(&c.str()?)?;
            let pool = c.str()?;
            let extra = c.str()?;
            let fields: Vec<&str> = extra.split('\0').collect();
            if present & !HAS_ALL != 0
                || fields.len() != present.count_ones() as usize + 1
                || fields.last() != Some(&"")
            {
                return Err(RecordError::PodFields);
            }
            let mut it = fields.into_iter();
            let mut take = |bit: u8| (present & bit != 0).then(|| it.next()).flatten();
            let namespace = take(crate::lease::HAS_NAMESPACE).map(str::to_owned);
            let name = take(crate::lease::HAS_NAME).map(str::to_owned);
            let uid = take(crate::lease::HAS_UID).map(str::to_owned);
            let veth = take(crate::lease::HAS_VETH);
            let pod = PodRef {
                namespace,
                name,
                uid,
            };
            let (data, key_len) = encode_data(&key, &pod, veth);
            // Re-encoded from version 1: held to what a current record must satisfy (a field
            // over the length limit would load, but not reload from the next snapshot).
            if data_key_len(&data) != Some(key_len) {
                return Err(RecordError::AllocData);
            }
            Record::Alloc(AllocRec {
                data,
                key_len,
                addr,
                allocated_at_ms,
                pool,
            })
        }
        2 => {
            let addr = Addr::from(c.u32()?);
            let released_at_ms = c.u64()?;
            let key = crate::lease::encode_key(&v1_key(&c.str()?)?);
            let teardown = c.opt()?;
            release_rec(&key, addr, released_at_ms, teardown)?
        }
        t @ (3 | 10) => {
            let addr = c.addr(t == 10)?;
            let released_at_ms = c.u64()?;
            let teardown = c.opt()?;
            check_link(teardown.as_deref())?;
            Record::Cooling(CoolRec {
                addr,
                released_at_ms,
                teardown,
            })
        }
        4 => Record::End {
            leases: c.u64()?,
            cooling: c.u64()?,
        },
        7 => return Err(RecordError::BatchMarker),
        kind => return Err(RecordError::UnknownType { kind }),
    };
    if !c.0.is_empty() {
        return Err(RecordError::Trailing);
    }
    Ok(rec)
}

/// A release record, once its key and teardown link are valid.
fn release_rec(
    key: &[u8],
    addr: Addr,
    released_at_ms: u64,
    teardown: Option<Box<str>>,
) -> Result<Record, RecordError> {
    if !key_is_valid(key) {
        return Err(RecordError::ReleaseKey);
    }
    check_link(teardown.as_deref())?;
    Ok(Record::Release(ReleaseRec {
        key: key.into(),
        addr,
        released_at_ms,
        teardown,
    }))
}

fn check_link(l: Option<&str>) -> Result<(), RecordError> {
    match l {
        Some(l) => Ok(validate_ifname("teardown", l)?),
        None => Ok(()),
    }
}

/// Phase-1 (version 1) encodings, to test upgrades.
#[cfg(test)]
pub(crate) mod v1 {
    use super::*;

    pub fn header(magic: &[u8; 8], generation: u64) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(magic);
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&generation.to_le_bytes());
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    fn frame(out: &mut Vec<u8>, payload: &[u8]) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER]);
        out.extend_from_slice(payload);
        seal(out, start);
    }

    pub fn alloc(
        out: &mut Vec<u8>,
        packed_key: &str,
        addr: u32,
        at: u64,
        extra: &str,
        present: u8,
    ) {
        let mut p = vec![1u8];
        p.extend_from_slice(&addr.to_le_bytes());
        p.extend_from_slice(&at.to_le_bytes());
        p.push(present);
        put_str(&mut p, packed_key);
        put_str(&mut p, "p");
        put_str(&mut p, extra);
        frame(out, &p);
    }

    pub fn release(out: &mut Vec<u8>, packed_key: &str, addr: u32, at: u64) {
        let mut p = vec![2u8];
        p.extend_from_slice(&addr.to_le_bytes());
        p.extend_from_slice(&at.to_le_bytes());
        put_str(&mut p, packed_key);
        put_opt(&mut p, None);
        frame(out, &p);
    }
}

#[cfg(test)]
mod tests;
