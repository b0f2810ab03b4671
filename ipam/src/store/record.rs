//! Binary records of the log and the snapshot.
//!
//! ```text
//! file   := header record*
//! header := magic[8] version:u32 reserved:u32 generation:u64 crc:u32      (28 bytes)
//! record := len:u32 crc:u32 payload[len]        crc = crc32(len bytes ++ payload)
//! payload:= 1 Alloc   addr:u32 allocated_at_ms:u64 present:u8 key:str pool:str extra:str
//!         | 2 Release addr:u32 released_at_ms:u64 key:str teardown:opt
//!         | 3 Cooling addr:u32 released_at_ms:u64 teardown:opt          (snapshot only)
//!         | 4 End     leases:u64 cooling:u64                            (snapshot only, last)
//! str    := len:u16 utf8[len]        opt := 0 | 1 str
//! ```
//! All integers little-endian. `key` is the packed attachment key and `extra` the packed
//! optional fields of [`crate::lease`]. A hand-rolled format rather than JSON: replaying
//! 200,000 leases must take well under the 300 ms restart budget.

use crate::lease::{extra_is_valid, packed_key_is_valid, validate_ifname};

pub const HEADER_LEN: usize = 28;
pub const LOG_MAGIC: &[u8; 8] = b"ALNIPLOG";
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"ALNIPSNP";
/// Bump on any incompatible change of the layout above.
pub const FORMAT_VERSION: u32 = 1;
/// No legitimate record comes close; a larger length field is corruption.
pub const MAX_RECORD: usize = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocRec {
    pub key: Box<str>,
    pub addr: u32,
    pub allocated_at_ms: u64,
    pub pool: Box<str>,
    pub extra: Box<str>,
    pub present: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRec {
    pub key: Box<str>,
    pub addr: u32,
    pub released_at_ms: u64,
    /// Host link to delete; kept in the record so a teardown cut short by a crash is redone.
    pub teardown: Option<Box<str>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoolRec {
    pub addr: u32,
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
    let start = out.len();
    out.extend_from_slice(magic);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Check a header; returns the generation.
pub fn decode_header(buf: &[u8], magic: &[u8; 8]) -> Result<u64, String> {
    if buf.len() < HEADER_LEN {
        return Err(format!(
            "file is {} bytes, shorter than its {HEADER_LEN}-byte header",
            buf.len()
        ));
    }
    if &buf[..8] != magic {
        return Err(format!(
            "bad magic {:?} (expected {:?})",
            String::from_utf8_lossy(&buf[..8]),
            String::from_utf8_lossy(magic)
        ));
    }
    let crc = u32::from_le_bytes(buf[24..28].try_into().expect("4 bytes"));
    if crc32fast::hash(&buf[..24]) != crc {
        return Err("header checksum mismatch".into());
    }
    let version = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this daemon reads version {FORMAT_VERSION}"
        ));
    }
    Ok(u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes")))
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Lengths are bounded by request validation (MAX_FIELD), far below u16::MAX.
    let len = u16::try_from(s.len()).expect("field length validated");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
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

/// Append one framed record to `out`.
pub fn encode(out: &mut Vec<u8>, rec: &Record) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    match rec {
        Record::Alloc(a) => {
            out.push(1);
            out.extend_from_slice(&a.addr.to_le_bytes());
            out.extend_from_slice(&a.allocated_at_ms.to_le_bytes());
            out.push(a.present);
            put_str(out, &a.key);
            put_str(out, &a.pool);
            put_str(out, &a.extra);
        }
        Record::Release(r) => {
            out.push(2);
            out.extend_from_slice(&r.addr.to_le_bytes());
            out.extend_from_slice(&r.released_at_ms.to_le_bytes());
            put_str(out, &r.key);
            put_opt(out, r.teardown.as_deref());
        }
        Record::Cooling(c) => {
            out.push(3);
            out.extend_from_slice(&c.addr.to_le_bytes());
            out.extend_from_slice(&c.released_at_ms.to_le_bytes());
            put_opt(out, c.teardown.as_deref());
        }
        Record::End { leases, cooling } => {
            out.push(4);
            out.extend_from_slice(&leases.to_le_bytes());
            out.extend_from_slice(&cooling.to_le_bytes());
        }
    }
    let len = u32::try_from(out.len() - start - 8).expect("record fits u32");
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(&out[start + 8..]);
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
    Bad(String),
}

/// Read the frame at the start of `buf`.
pub fn read_frame(buf: &[u8]) -> Frame {
    if buf.len() < 8 {
        return Frame::Incomplete;
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if len == 0 || len > MAX_RECORD {
        return Frame::Bad(format!("record length {len} out of range"));
    }
    if buf.len() < 8 + len {
        return Frame::Incomplete;
    }
    let payload = &buf[8..8 + len];
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[0..4]);
    h.update(payload);
    if h.finalize() != crc {
        return Frame::Bad("record checksum mismatch".into());
    }
    match decode_payload(payload) {
        Ok(r) => Frame::Ok(r, 8 + len),
        Err(e) => Frame::Bad(e),
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("record payload truncated".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn str(&mut self) -> Result<Box<str>, String> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().expect("2")) as usize;
        let b = self.take(len)?;
        std::str::from_utf8(b)
            .map(Into::into)
            .map_err(|_| "record string is not UTF-8".to_owned())
    }
    fn opt(&mut self) -> Result<Option<Box<str>>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.str().map(Some),
            t => Err(format!("bad option tag {t}")),
        }
    }
}

fn decode_payload(p: &[u8]) -> Result<Record, String> {
    let mut c = Cursor(p);
    let rec = match c.u8()? {
        1 => {
            let addr = c.u32()?;
            let allocated_at_ms = c.u64()?;
            let present = c.u8()?;
            let key = c.str()?;
            let pool = c.str()?;
            let extra = c.str()?;
            if !packed_key_is_valid(&key) || !extra_is_valid(&extra, present) {
                return Err("alloc record with a malformed key or pod fields".into());
            }
            Record::Alloc(AllocRec {
                key,
                addr,
                allocated_at_ms,
                pool,
                extra,
                present,
            })
        }
        2 => {
            let addr = c.u32()?;
            let released_at_ms = c.u64()?;
            let key = c.str()?;
            let teardown = c.opt()?;
            if !packed_key_is_valid(&key) {
                return Err("release record with a malformed key".into());
            }
            check_link(teardown.as_deref())?;
            Record::Release(ReleaseRec {
                key,
                addr,
                released_at_ms,
                teardown,
            })
        }
        3 => {
            let addr = c.u32()?;
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
        t => return Err(format!("unknown record type {t}")),
    };
    if !c.0.is_empty() {
        return Err("trailing bytes in record".into());
    }
    Ok(rec)
}

fn check_link(l: Option<&str>) -> Result<(), String> {
    match l {
        Some(l) => validate_ifname("teardown", l),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Record> {
        vec![
            Record::Alloc(AllocRec {
                key: "n\0c\0eth0".into(),
                addr: 0x0a00_0001,
                allocated_at_ms: 123,
                pool: "p".into(),
                extra: "ns\0ali1\0".into(),
                present: crate::lease::HAS_NAMESPACE | crate::lease::HAS_VETH,
            }),
            Record::Release(ReleaseRec {
                key: "n\0c\0eth0".into(),
                addr: 0x0a00_0001,
                released_at_ms: 456,
                teardown: Some("ali1".into()),
            }),
            Record::Cooling(CoolRec {
                addr: 7,
                released_at_ms: 8,
                teardown: None,
            }),
            Record::End {
                leases: 1,
                cooling: 2,
            },
        ]
    }

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        for r in samples() {
            encode(&mut buf, &r);
        }
        let mut off = 0;
        for want in samples() {
            match read_frame(&buf[off..]) {
                Frame::Ok(r, n) => {
                    assert_eq!(r, want);
                    off += n;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(off, buf.len());
    }

    #[test]
    fn damage_is_detected() {
        let mut buf = Vec::new();
        encode(&mut buf, &samples()[0]);
        assert!(matches!(
            read_frame(&buf[..buf.len() - 1]),
            Frame::Incomplete
        ));
        assert!(matches!(read_frame(&buf[..5]), Frame::Incomplete));
        let mut flipped = buf.clone();
        flipped[12] ^= 1;
        assert!(matches!(read_frame(&flipped), Frame::Bad(_)));
        let zeros = vec![0u8; 64];
        assert!(matches!(read_frame(&zeros), Frame::Bad(_)));
    }

    #[test]
    fn header_checks() {
        let mut h = Vec::new();
        encode_header(&mut h, LOG_MAGIC, 42);
        assert_eq!(h.len(), HEADER_LEN);
        assert_eq!(decode_header(&h, LOG_MAGIC).unwrap(), 42);
        assert!(decode_header(&h, SNAPSHOT_MAGIC).is_err());
        let mut v2 = h.clone();
        v2[8] = 2;
        assert!(decode_header(&v2, LOG_MAGIC).is_err());
        assert!(decode_header(&h[..10], LOG_MAGIC).is_err());
    }
}
