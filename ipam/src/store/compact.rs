//! Compaction by merge: snapshot G = snapshot F + logs F..G-1, read back from disk.
//!
//! Runs in a background thread with no lock on the daemon's state: the logs F..G-1 are final
//! once the writer has rotated to log G, and they hold exactly the acknowledged changes. The
//! logs are read into memory (bounded by the compaction threshold) and indexed into a delta
//! (the last word on every key and address they touch, borrowing from the log buffers); the
//! old snapshot is then streamed through, its records copied verbatim unless the delta
//! overrides them, and the delta appended. Memory is the logs, the delta's tables and a 1 MiB
//! buffer each way, whatever the snapshot's size, in a few large allocations that go back to
//! the system afterwards.

use std::{
    collections::{HashMap, HashSet},
    fs::{self, File},
    io::{self, BufReader, BufWriter, Read, Write},
    path::{Path, PathBuf},
};

use super::{
    corrupt, create_private, log_name, record, sync_dir, tail_after, StoreError, SNAPSHOT_FILE,
    SNAPSHOT_TMP,
};
use crate::lease::{addr_family, addr_ip, Addr};
use crate::store::record::{Record, FRAME_HEADER, HEADER_LEN, LOG_MAGIC, SNAPSHOT_MAGIC};
use aliasnet_ipam_proto::Family;

/// A link deletion cut short by a crash is redone at start if its release is younger than the
/// cooldown plus this; deletions take milliseconds, so older entries are dropped.
const TEARDOWN_REDO_MS: u64 = 10 * 60 * 1000;
const IO_BUF: usize = 1 << 20;

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One compaction, built by [`super::Store::compaction`].
#[derive(Debug, Clone)]
pub struct Job {
    pub dir: PathBuf,
    /// Generation of the current snapshot.
    pub from: u64,
    pub has_snapshot: bool,
    /// Generation of the snapshot to write (the log the writer now appends to).
    pub to: u64,
    pub now_ms: u64,
    pub cooldown_ms: u64,
}

/// A live allocation in the logs: its address and encoded frame.
type LogLease<'a> = (Addr, &'a [u8]);

/// The last word of the logs on every key and address they touch, borrowing from the log
/// buffers (no allocation per record, so nothing is left fragmenting the heap afterwards).
#[derive(Default)]
struct Delta<'a> {
    /// (Key, family) -> its live allocation in the logs (address, encoded frame), or `None`
    /// if the logs end with it released.
    keys: FastMap<(&'a [u8], Family), Option<LogLease<'a>>>,
    /// Address -> (release time, link to tear down) of releases in the logs.
    cooling: FastMap<Addr, (u64, Option<&'a str>)>,
}

impl<'a> Delta<'a> {
    /// Apply every record of one (version-2 or -3) log buffer.
    fn apply_log(&mut self, path: &Path, buf: &'a [u8]) -> Result<(), StoreError> {
        let mut off = HEADER_LEN;
        while off < buf.len() {
            let len = match record::check_frame(&buf[off..]) {
                Ok(len) => len,
                Err(f) => {
                    return match tail_after(&buf[off..]) {
                        Ok(()) => Ok(()),
                        Err(_) => Err(corrupt(path, format!("at byte {off}: {f:?}"))),
                    }
                }
            };
            let frame = &buf[off..off + FRAME_HEADER + len];
            let payload = &frame[FRAME_HEADER..];
            if record::peek_batch(frame).is_some() {
                // Batch markers only group the records that follow (verified at load).
                off += frame.len();
                continue;
            }
            if let Some((addr, key)) = record::peek_alloc(payload) {
                self.cooling.remove(&addr);
                self.keys
                    .insert((key, addr_family(addr)), Some((addr, frame)));
            } else if let Some((addr, at, key, link)) = record::peek_release(payload) {
                self.keys.insert((key, addr_family(addr)), None);
                self.cooling.insert(addr, (at, link));
            } else {
                return Err(corrupt(
                    path,
                    format!("record at byte {off} does not belong in a log"),
                ));
            }
            off += frame.len();
        }
        Ok(())
    }
}

/// `buf` with any version-1 records re-encoded as version 2 (logs of the first format), so the delta can
/// borrow every record in the same form.
fn normalise(path: &Path, buf: Vec<u8>) -> Result<Vec<u8>, StoreError> {
    let mut off = HEADER_LEN;
    let mut legacy = false;
    while off < buf.len() {
        match record::check_frame(&buf[off..]) {
            Ok(len) => {
                legacy |= matches!(buf[off + FRAME_HEADER], 1 | 2);
                off += FRAME_HEADER + len;
            }
            Err(_) => break,
        }
    }
    if !legacy {
        return Ok(buf);
    }
    let mut out = buf[..HEADER_LEN].to_vec();
    let mut off = HEADER_LEN;
    while let record::Frame::Ok(rec, n) = record::read_frame(&buf[off..]) {
        record::encode(&mut out, &rec);
        off += n;
    }
    if tail_after(&buf[off..]).is_err() {
        return Err(corrupt(path, format!("bad record at byte {off}")));
    }
    Ok(out)
}

/// Reads the frames of one file through a buffer.
struct FrameReader {
    r: BufReader<File>,
    path: PathBuf,
    off: u64,
    buf: Vec<u8>,
}

impl FrameReader {
    fn open(path: &Path, magic: &[u8; 8]) -> Result<(Self, u64), StoreError> {
        let f = File::open(path).map_err(|source| StoreError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut me = Self {
            r: BufReader::with_capacity(IO_BUF, f),
            path: path.to_path_buf(),
            off: 0,
            buf: Vec::with_capacity(4096),
        };
        let mut h = [0u8; HEADER_LEN];
        me.read_exact(&mut h)?;
        let g = record::decode_header(&h, magic).map_err(|d| corrupt(path, d))?;
        me.off = HEADER_LEN as u64;
        Ok((me, g))
    }

    fn read_exact(&mut self, b: &mut [u8]) -> Result<(), StoreError> {
        self.r.read_exact(b).map_err(|source| StoreError::Read {
            path: self.path.clone(),
            source,
        })
    }

    /// The next frame (header included), or `None` at the end (end of file, or a zero frame
    /// header followed by zeros only).
    fn next(&mut self) -> Result<Option<&[u8]>, StoreError> {
        let mut h = [0u8; FRAME_HEADER];
        let mut got = 0;
        while got < FRAME_HEADER {
            match self.r.read(&mut h[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => {
                    return Err(corrupt(
                        &self.path,
                        format!("cut short at byte {}", self.off),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(StoreError::Read {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
        }
        if h == [0; FRAME_HEADER] {
            let mut rest = Vec::new();
            self.r
                .read_to_end(&mut rest)
                .map_err(|source| StoreError::Read {
                    path: self.path.clone(),
                    source,
                })?;
            return match tail_after(&rest) {
                Ok(()) => Ok(None),
                Err(n) => Err(corrupt(
                    &self.path,
                    format!(
                        "{n} bytes of data after the end of the records at byte {}",
                        self.off
                    ),
                )),
            };
        }
        let len = u32::from_le_bytes(h[..4].try_into().expect("4 bytes")) as usize;
        if len == 0 || len > record::MAX_RECORD {
            return Err(corrupt(
                &self.path,
                format!("record length {len} out of range at byte {}", self.off),
            ));
        }
        self.buf.clear();
        self.buf.extend_from_slice(&h);
        self.buf.resize(FRAME_HEADER + len, 0);
        let mut payload = std::mem::take(&mut self.buf);
        let r = self.read_exact(&mut payload[FRAME_HEADER..]);
        self.buf = payload;
        r?;
        if let Err(f) = record::check_frame(&self.buf) {
            return Err(corrupt(&self.path, format!("at byte {}: {f:?}", self.off)));
        }
        self.off += self.buf.len() as u64;
        Ok(Some(&self.buf))
    }
}

impl Job {
    /// Write the merged snapshot (temp file, fsync, rename, fsync dir); returns its size. A
    /// failed attempt removes its temp file: on a full disk it holds the space the logs need.
    pub fn run(&self) -> Result<u64, StoreError> {
        let r = self.merge();
        if r.is_err() {
            let _ = fs::remove_file(self.dir.join(SNAPSHOT_TMP));
        }
        r
    }

    fn merge(&self) -> Result<u64, StoreError> {
        // The logs since the snapshot, in memory: bounded by the compaction threshold (they
        // are big single buffers, mmapped by the allocator and returned on free).
        let mut logs = Vec::new();
        for g in self.from..self.to {
            let path = self.dir.join(log_name(g));
            let buf = fs::read(&path).map_err(|source| StoreError::Read {
                path: path.clone(),
                source,
            })?;
            let hg = record::decode_header(&buf, LOG_MAGIC).map_err(|d| corrupt(&path, d))?;
            if hg != g {
                return Err(corrupt(&path, format!("header says generation {hg}")));
            }
            let buf = normalise(&path, buf)?;
            logs.push((path, buf));
        }
        let mut delta = Delta::default();
        for (path, buf) in &logs {
            delta.apply_log(path, buf)?;
        }
        let live_addrs: HashSet<Addr, foldhash::fast::RandomState> = delta
            .keys
            .values()
            .filter_map(|v| v.map(|(a, _)| a))
            .collect();

        let tmp = self.dir.join(SNAPSHOT_TMP);
        let werr = |source| StoreError::Write {
            path: tmp.clone(),
            source,
        };
        let f = create_private(&tmp, false).map_err(werr)?;
        let mut w = BufWriter::with_capacity(IO_BUF, f);
        let mut header = Vec::with_capacity(HEADER_LEN);
        record::encode_header(&mut header, SNAPSHOT_MAGIC, self.to);
        w.write_all(&header).map_err(werr)?;
        let (mut leases, mut cooling) = (0u64, 0u64);
        let mut seen_cooling: HashSet<Addr, foldhash::fast::RandomState> = HashSet::default();

        if self.has_snapshot {
            let path = self.dir.join(SNAPSHOT_FILE);
            let (mut r, g) = FrameReader::open(&path, SNAPSHOT_MAGIC)?;
            if g != self.from {
                return Err(corrupt(
                    &path,
                    format!("generation {g}, expected {}", self.from),
                ));
            }
            let mut ended = false;
            while let Some(frame) = r.next()? {
                if ended {
                    return Err(corrupt(&path, "data after the end record"));
                }
                let payload = &frame[FRAME_HEADER..];
                if let Some((addr, key)) = record::peek_alloc(payload) {
                    // Version-2 lease: copied verbatim unless the logs decide about it.
                    if delta.keys.contains_key(&(key, addr_family(addr))) {
                        continue;
                    }
                    if live_addrs.contains(&addr) {
                        return Err(corrupt(
                            &path,
                            format!(
                                "{} is leased here and allocated to another key in the logs",
                                addr_ip(addr)
                            ),
                        ));
                    }
                    w.write_all(frame).map_err(werr)?;
                    leases += 1;
                    continue;
                }
                match decode(frame).map_err(|d| corrupt(&path, d))? {
                    Record::Alloc(a) => {
                        // Version-1 lease: re-encoded.
                        if delta.keys.contains_key(&(a.key(), addr_family(a.addr))) {
                            continue;
                        }
                        if live_addrs.contains(&a.addr) {
                            return Err(corrupt(
                                &path,
                                format!(
                                    "{} is leased here and allocated to another key in the logs",
                                    addr_ip(a.addr)
                                ),
                            ));
                        }
                        let mut out = Vec::new();
                        record::encode(&mut out, &Record::Alloc(a));
                        w.write_all(&out).map_err(werr)?;
                        leases += 1;
                    }
                    Record::Cooling(c) => {
                        if delta.cooling.contains_key(&c.addr) || live_addrs.contains(&c.addr) {
                            continue;
                        }
                        if self.keep(c.released_at_ms, c.teardown.is_some())
                            && seen_cooling.insert(c.addr)
                        {
                            let mut out = Vec::new();
                            record::encode(&mut out, &Record::Cooling(c));
                            w.write_all(&out).map_err(werr)?;
                            cooling += 1;
                        }
                    }
                    Record::End { .. } => ended = true,
                    other => {
                        return Err(corrupt(
                            &path,
                            format!("record {other:?} does not belong in a snapshot"),
                        ))
                    }
                }
            }
            if !ended {
                return Err(corrupt(&path, "no end record"));
            }
        }

        for (_, frame) in delta.keys.values().flatten() {
            w.write_all(frame).map_err(werr)?;
            leases += 1;
        }
        let mut out = Vec::new();
        for (addr, (at, link)) in delta.cooling {
            if live_addrs.contains(&addr) || !self.keep(at, link.is_some()) {
                continue;
            }
            out.clear();
            record::encode(
                &mut out,
                &Record::Cooling(record::CoolRec {
                    addr,
                    released_at_ms: at,
                    teardown: link.map(Into::into),
                }),
            );
            w.write_all(&out).map_err(werr)?;
            cooling += 1;
        }
        out.clear();
        record::encode(&mut out, &Record::End { leases, cooling });
        w.write_all(&out).map_err(werr)?;
        let f = w.into_inner().map_err(|e| werr(e.into_error()))?;
        f.sync_all().map_err(werr)?;
        let len = f.metadata().map_err(werr)?.len();
        drop(f);
        fs::rename(&tmp, self.dir.join(SNAPSHOT_FILE)).map_err(werr)?;
        sync_dir(&self.dir).map_err(werr)?;
        Ok(len)
    }

    /// Whether a cooling entry released at `at` still matters.
    fn keep(&self, at: u64, has_teardown: bool) -> bool {
        let until = at.saturating_add(self.cooldown_ms);
        until > self.now_ms
            || (has_teardown && until.saturating_add(TEARDOWN_REDO_MS) > self.now_ms)
    }
}

fn decode(frame: &[u8]) -> Result<Record, record::RecordError> {
    match record::read_frame(frame) {
        record::Frame::Ok(r, _) => Ok(r),
        record::Frame::Bad(d) => Err(d),
        record::Frame::Incomplete => Err(record::RecordError::CutShort),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{lease::HAS_NAMESPACE, store::Store};

    #[test]
    fn a_version_1_state_is_read_and_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let mut log = record::v1::header(LOG_MAGIC, 0);
        record::v1::alloc(&mut log, "n\0a\0eth0", 1, 10, "ns\0", HAS_NAMESPACE);
        record::v1::alloc(&mut log, "n\0b\0eth0", 2, 11, "", 0);
        record::v1::release(&mut log, "n\0a\0eth0", 1, 12);
        record::v1::alloc(&mut log, "n\0c\0eth0", 3, 13, "", 0);
        std::fs::write(state.join(log_name(0)), &log).unwrap();

        let (mut store, loaded) = Store::open(&state).unwrap();
        assert_eq!(loaded.leases.len(), 2);
        // New records go after the old ones, in the new format.
        store
            .append(&crate::store::encode_records([
                &crate::store::release_record(
                    crate::lease::encode_key(&aliasnet_ipam_proto::AttachmentKey::new(
                        "n", "b", "eth0",
                    ))
                    .into(),
                    2,
                    14,
                    None,
                ),
            ]))
            .unwrap();
        let g = store.rotate().unwrap();
        let len = store.compaction(g, 15, 1_000).run().unwrap();
        store.snapshot_done(g, len);
        drop(store);
        let (_, loaded) = Store::open(&state).unwrap();
        let keys: Vec<String> = loaded
            .leases
            .iter()
            .map(|(_, e)| e.attachment_key().container_id)
            .collect();
        assert_eq!(keys, ["c"]);
        let mut cooling: Vec<crate::lease::Addr> = loaded.cooling.keys().copied().collect();
        cooling.sort();
        assert_eq!(cooling, [1, 2], "releases still cooling at time 15");
    }
}
