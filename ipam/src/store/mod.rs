//! The durable store: an append-only log of checksummed records plus a compacted snapshot.
//!
//! Files in `state_dir`:
//! * `state.snap`: every live lease and cooling address as of generation G (header says G);
//! * `log.<gen>`: records appended after the snapshot of generation `gen` was taken; replay
//!   reads `log.G`, `log.G+1`, ... in order (a rotation creates the next log before the new
//!   snapshot is durable, so several may be live);
//! * `lock`: `flock`ed while a daemon uses the directory.
//!
//! Crash rules on load: a record cut short at the very end of the newest log was never
//! acknowledged and is truncated. Anything else that does not check out (a bad record followed
//! by valid ones, a damaged snapshot, a gap in the log chain, a record contradicting the state)
//! refuses to start with the file named: starting empty would hand out addresses that running
//! pods still use.

pub mod record;

use std::{
    collections::{HashMap, HashSet},
    fs::{self, DirBuilder, File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};
use record::{AllocRec, CoolRec, Frame, Record, ReleaseRec, HEADER_LEN, LOG_MAGIC, SNAPSHOT_MAGIC};

use crate::lease::{LeaseEntry, LeaseState};

pub const SNAPSHOT_FILE: &str = "state.snap";
const SNAPSHOT_TMP: &str = "state.snap.tmp";
const LOCK_FILE: &str = "lock";
const LOG_PREFIX: &str = "log.";
/// Compact once the logs since the last snapshot exceed this or the snapshot's own size,
/// whichever is larger, so restart replays at most about twice the live state.
const COMPACT_MIN_LOG_BYTES: u64 = 8 << 20;

/// What an operator should do when the store cannot be loaded.
pub const RECOVERY_HINT: &str = "stop the daemon, move the state directory aside and rebuild \
     it from the kernel's host routes with `aliasnet-ipamd recover --config <config>`";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot use state directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("state directory {path} is in use by another aliasnet-ipamd (its lock file is held)")]
    Locked { path: PathBuf },
    #[error(
        "state file {path} is corrupt: {detail}; refusing to start rather than forget leases \
         (to recover: {RECOVERY_HINT})"
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error("cannot read state file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write state file {path}; the change was not acknowledged")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub fn log_name(generation: u64) -> String {
    format!("{LOG_PREFIX}{generation:020}")
}

/// State rebuilt from disk, before it is laid over the configured pools.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Pool names as recorded (leases refer to them by index).
    pub names: Vec<Box<str>>,
    name_idx: HashMap<Box<str>, u16>,
    pub leases: HashMap<Box<str>, LeaseEntry>,
    by_addr: HashSet<u32>,
    /// Released addresses: address -> (release time, link still to tear down).
    pub cooling: HashMap<u32, (u64, Option<Box<str>>)>,
    /// Log records replayed (for the start-up log line).
    pub replayed: u64,
    /// Bytes of a torn tail that were cut off.
    pub truncated: u64,
}

impl Loaded {
    fn intern(&mut self, name: &str) -> Result<u16, String> {
        // Nearly every record names the same pool as the one before.
        if let Some(last) = self.names.len().checked_sub(1) {
            if *self.names[last] == *name {
                return Ok(last as u16);
            }
        }
        if let Some(i) = self.name_idx.get(name) {
            return Ok(*i);
        }
        let i = u16::try_from(self.names.len()).map_err(|_| "too many pool names".to_owned())?;
        self.names.push(name.into());
        self.name_idx.insert(name.into(), i);
        Ok(i)
    }

    /// Apply one record, checking it is consistent with what came before.
    fn apply(&mut self, rec: Record, in_snapshot: bool) -> Result<(), String> {
        match rec {
            Record::Alloc(a) => {
                if self.leases.contains_key(&a.key) {
                    return Err(format!(
                        "allocation for {} which already holds a lease",
                        crate::lease::unpack_key(&a.key)
                    ));
                }
                if !self.by_addr.insert(a.addr) {
                    return Err(format!(
                        "allocation of {} which another key already holds",
                        std::net::Ipv4Addr::from(a.addr)
                    ));
                }
                self.cooling.remove(&a.addr);
                let pool_name = self.intern(&a.pool)?;
                self.leases.insert(
                    a.key,
                    LeaseEntry {
                        extra: a.extra,
                        present: a.present,
                        state: LeaseState::Committed,
                        seen: true,
                        pool_name,
                        addr: a.addr,
                        allocated_at_ms: a.allocated_at_ms,
                    },
                );
            }
            Record::Release(r) if !in_snapshot => {
                match self.leases.get(&r.key) {
                    Some(e) if e.addr == r.addr => {}
                    _ => {
                        return Err(format!(
                            "release of {} ({}) which holds no such lease",
                            crate::lease::unpack_key(&r.key),
                            std::net::Ipv4Addr::from(r.addr)
                        ))
                    }
                }
                self.leases.remove(&r.key);
                self.by_addr.remove(&r.addr);
                self.cooling.insert(r.addr, (r.released_at_ms, r.teardown));
            }
            Record::Cooling(c) if in_snapshot => {
                if self.by_addr.contains(&c.addr)
                    || self
                        .cooling
                        .insert(c.addr, (c.released_at_ms, c.teardown))
                        .is_some()
                {
                    return Err(format!(
                        "cooling entry for {} listed twice or also leased",
                        std::net::Ipv4Addr::from(c.addr)
                    ));
                }
            }
            other => return Err(format!("record {other:?} does not belong in this file")),
        }
        Ok(())
    }
}

/// The open store: appends go to the newest log.
pub struct Store {
    dir: PathBuf,
    _lock: Flock<File>,
    log: File,
    log_path: PathBuf,
    generation: u64,
    /// Length of the log that is known durable; a failed append is cut back to it.
    log_len: u64,
    /// A failed append could not be cut back; retried before the next append.
    needs_truncate: bool,
    /// Log bytes written since the snapshot generation on disk.
    bytes_since_snapshot: u64,
    snapshot_len: u64,
    /// Generation of the newest durable snapshot (0 when none).
    snapshot_generation: u64,
    compact_min_bytes: u64,
    #[cfg(test)]
    pub(crate) fail_appends: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

fn corrupt(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Store {
    /// Lock `dir` (creating it), load the snapshot and replay the logs.
    pub fn open(dir: &Path) -> Result<(Self, Loaded), StoreError> {
        let dir_err = |source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        };
        if !dir.exists() {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(dir_err)?;
            // Make the new directory's entry durable before anything is acknowledged in it.
            if let Some(parent) = dir.parent() {
                sync_dir(parent).map_err(dir_err)?;
            }
        }
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(dir.join(LOCK_FILE))
            .map_err(dir_err)?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| {
            StoreError::Locked {
                path: dir.to_path_buf(),
            }
        })?;

        let mut logs: Vec<u64> = Vec::new();
        for ent in fs::read_dir(dir).map_err(dir_err)? {
            let ent = ent.map_err(dir_err)?;
            let name = ent.file_name();
            let name = name.to_string_lossy();
            if let Some(g) = name.strip_prefix(LOG_PREFIX) {
                let g = g
                    .parse::<u64>()
                    .map_err(|_| corrupt(&ent.path(), "unexpected file name in state directory"))?;
                logs.push(g);
            } else if name == SNAPSHOT_TMP {
                // A compaction interrupted before its rename; the old snapshot still rules.
                fs::remove_file(ent.path()).map_err(dir_err)?;
            }
        }
        logs.sort_unstable();

        let mut loaded = Loaded::default();
        let snap_path = dir.join(SNAPSHOT_FILE);
        let (snap_gen, snapshot_len) = match fs::read(&snap_path) {
            Ok(bytes) => (
                {
                    // About 170 bytes per lease: size the maps once instead of growing them.
                    loaded.leases.reserve(bytes.len() / 170);
                    loaded.by_addr.reserve(bytes.len() / 170);
                    load_snapshot(&snap_path, &bytes, &mut loaded)?
                },
                bytes.len() as u64,
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(first) = logs.first().filter(|g| **g != 0) {
                    return Err(corrupt(
                        &snap_path,
                        format!(
                            "missing, but the logs start at {} (generation {first}), so it existed",
                            log_name(*first)
                        ),
                    ));
                }
                (0, 0)
            }
            Err(source) => {
                return Err(StoreError::Read {
                    path: snap_path,
                    source,
                })
            }
        };

        let live: Vec<u64> = logs.iter().copied().filter(|g| *g >= snap_gen).collect();
        for (i, g) in live.iter().enumerate() {
            if *g != snap_gen + i as u64 {
                return Err(corrupt(
                    &dir.join(log_name(snap_gen + i as u64)),
                    "missing from the log chain",
                ));
            }
        }
        if live.is_empty() && snapshot_len > 0 {
            return Err(corrupt(
                &dir.join(log_name(snap_gen)),
                format!("missing, but {SNAPSHOT_FILE} refers to it"),
            ));
        }

        let mut bytes_since_snapshot = 0;
        let mut last: Option<(PathBuf, u64)> = None;
        for (i, g) in live.iter().enumerate() {
            let path = dir.join(log_name(*g));
            let is_last = i + 1 == live.len();
            let len = replay_log(&path, *g, is_last, &mut loaded)?;
            bytes_since_snapshot += len;
            last = Some((path, len));
        }

        let (log_path, generation, log_len, log) = match last {
            Some((path, len)) => {
                let f = OpenOptions::new()
                    .write(true)
                    .read(true)
                    .open(&path)
                    .map_err(|source| StoreError::Read {
                        path: path.clone(),
                        source,
                    })?;
                let g = *live.last().expect("non-empty");
                if len < HEADER_LEN as u64 {
                    // Created by a rotation that crashed before its header was durable.
                    write_header(&f, &path, g)?;
                    (path, g, HEADER_LEN as u64, f)
                } else {
                    (path, g, len, f)
                }
            }
            None => {
                let path = dir.join(log_name(0));
                let f = create_log(dir, &path, 0)?;
                (path, 0, HEADER_LEN as u64, f)
            }
        };

        // Logs older than the snapshot are fully contained in it.
        for g in logs.iter().filter(|g| **g < snap_gen) {
            let p = dir.join(log_name(*g));
            fs::remove_file(&p).map_err(|source| StoreError::Write { path: p, source })?;
        }

        Ok((
            Self {
                dir: dir.to_path_buf(),
                _lock: lock,
                log,
                log_path,
                generation,
                log_len,
                needs_truncate: false,
                bytes_since_snapshot,
                snapshot_len,
                snapshot_generation: snap_gen,
                compact_min_bytes: COMPACT_MIN_LOG_BYTES,
                #[cfg(test)]
                fail_appends: Default::default(),
            },
            loaded,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Append encoded records and make them durable (write + fdatasync). On failure the log is
    /// cut back so a later append never follows unacknowledged bytes.
    pub fn append(&mut self, buf: &[u8]) -> Result<(), StoreError> {
        let werr = |path: &Path, source| StoreError::Write {
            path: path.to_path_buf(),
            source,
        };
        if self.needs_truncate {
            self.log
                .set_len(self.log_len)
                .and_then(|()| self.log.sync_data())
                .map_err(|e| werr(&self.log_path, e))?;
            self.needs_truncate = false;
        }
        #[cfg(test)]
        let res = {
            use std::sync::atomic::Ordering;
            let inject = self
                .fail_appends
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            // An injected failure behaves like a write that reached the file but whose fdatasync
            // failed: the bytes are there and must be cut back.
            self.log.write_all_at(buf, self.log_len).and_then(|()| {
                if inject {
                    Err(io::Error::from_raw_os_error(libc::EIO))
                } else {
                    self.log.sync_data()
                }
            })
        };
        #[cfg(not(test))]
        let res = self
            .log
            .write_all_at(buf, self.log_len)
            .and_then(|()| self.log.sync_data());
        match res {
            Ok(()) => {
                self.log_len += buf.len() as u64;
                self.bytes_since_snapshot += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.needs_truncate = true;
                if self
                    .log
                    .set_len(self.log_len)
                    .and_then(|()| self.log.sync_data())
                    .is_ok()
                {
                    self.needs_truncate = false;
                }
                Err(werr(&self.log_path, e))
            }
        }
    }

    /// Whether enough log has accumulated to be worth a snapshot.
    pub fn should_compact(&self) -> bool {
        self.bytes_since_snapshot > self.compact_min_bytes.max(self.snapshot_len)
    }

    /// Lower the compaction threshold (tests exercise compaction with a few records).
    pub fn set_compact_min_bytes(&mut self, bytes: u64) {
        self.compact_min_bytes = bytes;
    }

    /// Start a new log generation; returns it. The caller then writes a snapshot of the state
    /// as of this instant with that generation ([`write_snapshot`]), and once it is durable
    /// reports back with [`Store::snapshot_done`].
    pub fn rotate(&mut self) -> Result<u64, StoreError> {
        if self.needs_truncate {
            // Do not leave unacknowledged bytes behind in a log that is about to be closed.
            self.append(&[])?;
        }
        let g = self.generation + 1;
        let path = self.dir.join(log_name(g));
        let f = create_log(&self.dir, &path, g)?;
        self.log = f;
        self.log_path = path;
        self.generation = g;
        self.log_len = HEADER_LEN as u64;
        Ok(g)
    }

    /// A snapshot of `generation` is durable: logs before it are obsolete.
    pub fn snapshot_done(&mut self, generation: u64, len: u64) {
        if generation <= self.snapshot_generation {
            return;
        }
        for g in self.snapshot_generation..generation {
            let p = self.dir.join(log_name(g));
            if let Err(e) = fs::remove_file(&p) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %p.display(), error = %e, "cannot remove obsolete log");
                }
            }
        }
        self.snapshot_generation = generation;
        self.snapshot_len = len;
        // Only what went into logs since the rotation remains to be replayed.
        self.bytes_since_snapshot = self.log_len;
    }
}

fn write_header(f: &File, path: &Path, generation: u64) -> Result<(), StoreError> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    record::encode_header(&mut h, LOG_MAGIC, generation);
    f.set_len(0)
        .and_then(|()| f.write_all_at(&h, 0))
        .and_then(|()| f.sync_all())
        .map_err(|source| StoreError::Write {
            path: path.to_path_buf(),
            source,
        })
}

fn create_log(dir: &Path, path: &Path, generation: u64) -> Result<File, StoreError> {
    let werr = |source| StoreError::Write {
        path: path.to_path_buf(),
        source,
    };
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(werr)?;
    write_header(&f, path, generation)?;
    sync_dir(dir).map_err(werr)?;
    Ok(f)
}

/// Durably replace the snapshot: temp file, fsync, rename, fsync the directory.
pub fn write_snapshot(dir: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = dir.join(SNAPSHOT_TMP);
    let werr = |source| StoreError::Write {
        path: tmp.clone(),
        source,
    };
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(werr)?;
    f.write_all_at(bytes, 0)
        .and_then(|()| f.sync_all())
        .map_err(werr)?;
    drop(f);
    fs::rename(&tmp, dir.join(SNAPSHOT_FILE)).map_err(werr)?;
    sync_dir(dir).map_err(werr)
}

/// Encode a snapshot of `generation` from the leases and cooling addresses given.
pub struct SnapshotWriter {
    buf: Vec<u8>,
    leases: u64,
    cooling: u64,
}

impl SnapshotWriter {
    pub fn new(generation: u64, capacity: usize) -> Self {
        let mut buf = Vec::with_capacity(capacity);
        record::encode_header(&mut buf, SNAPSHOT_MAGIC, generation);
        Self {
            buf,
            leases: 0,
            cooling: 0,
        }
    }

    pub fn lease(&mut self, rec: &AllocRec) {
        record::encode(&mut self.buf, &Record::Alloc(rec.clone()));
        self.leases += 1;
    }

    pub fn cooling(&mut self, rec: CoolRec) {
        record::encode(&mut self.buf, &Record::Cooling(rec));
        self.cooling += 1;
    }

    pub fn finish(mut self) -> Vec<u8> {
        record::encode(
            &mut self.buf,
            &Record::End {
                leases: self.leases,
                cooling: self.cooling,
            },
        );
        self.buf
    }
}

fn load_snapshot(path: &Path, bytes: &[u8], loaded: &mut Loaded) -> Result<u64, StoreError> {
    let generation = record::decode_header(bytes, SNAPSHOT_MAGIC).map_err(|d| corrupt(path, d))?;
    let mut off = HEADER_LEN;
    let (mut leases, mut cooling) = (0u64, 0u64);
    loop {
        match record::read_frame(&bytes[off..]) {
            Frame::Ok(
                Record::End {
                    leases: l,
                    cooling: c,
                },
                n,
            ) => {
                if off + n != bytes.len() {
                    return Err(corrupt(
                        path,
                        format!("data after the end record at byte {off}"),
                    ));
                }
                if (l, c) != (leases, cooling) {
                    return Err(corrupt(
                        path,
                        format!(
                            "end record counts {l} leases and {c} cooling addresses, file holds {leases} and {cooling}"
                        ),
                    ));
                }
                return Ok(generation);
            }
            Frame::Ok(rec, n) => {
                match rec {
                    Record::Alloc(_) => leases += 1,
                    Record::Cooling(_) => cooling += 1,
                    _ => {}
                }
                loaded
                    .apply(rec, true)
                    .map_err(|d| corrupt(path, format!("at byte {off}: {d}")))?;
                off += n;
            }
            Frame::Incomplete => {
                return Err(corrupt(
                    path,
                    format!("truncated at byte {off} (no end record)"),
                ))
            }
            Frame::Bad(d) => return Err(corrupt(path, format!("at byte {off}: {d}"))),
        }
    }
}

/// True when some valid record starts anywhere in `buf`.
fn valid_record_follows(buf: &[u8]) -> bool {
    (0..buf.len()).any(|i| matches!(record::read_frame(&buf[i..]), Frame::Ok(..)))
}

/// Replay one log; returns its (possibly truncated) length.
fn replay_log(
    path: &Path,
    generation: u64,
    is_last: bool,
    loaded: &mut Loaded,
) -> Result<u64, StoreError> {
    let bytes = fs::read(path).map_err(|source| StoreError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if is_last && (bytes.len() < HEADER_LEN || bytes.iter().all(|b| *b == 0)) {
        // Torn creation: a log is used only after its header is durable, so a newest log
        // without a whole header never had a record appended.
        return Ok(0);
    }
    let g = record::decode_header(&bytes, LOG_MAGIC).map_err(|d| corrupt(path, d))?;
    if g != generation {
        return Err(corrupt(
            path,
            format!("header says generation {g}, the file name says {generation}"),
        ));
    }
    let mut off = HEADER_LEN;
    while off < bytes.len() {
        let torn = match record::read_frame(&bytes[off..]) {
            Frame::Ok(rec, n) => {
                loaded
                    .apply(rec, false)
                    .map_err(|d| corrupt(path, format!("record at byte {off}: {d}")))?;
                loaded.replayed += 1;
                off += n;
                continue;
            }
            Frame::Incomplete => None,
            Frame::Bad(d) => Some(d),
        };
        // Only the newest log can end in a torn write; and only if nothing valid follows.
        let rest = &bytes[off..];
        if !is_last || valid_record_follows(&rest[1..]) {
            return Err(corrupt(
                path,
                format!(
                    "{} at byte {off}, followed by {} more bytes{}",
                    torn.as_deref().unwrap_or("incomplete record"),
                    rest.len(),
                    if is_last {
                        " that contain valid records"
                    } else {
                        " in a log that is not the newest"
                    }
                ),
            ));
        }
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| {
                f.set_len(off as u64)?;
                f.sync_all()
            })
            .map_err(|source| StoreError::Write {
                path: path.to_path_buf(),
                source,
            });
        f?;
        tracing::warn!(
            path = %path.display(),
            offset = off,
            bytes = rest.len(),
            "truncated a torn record at the end of the log (a write cut short by a crash; it was never acknowledged)"
        );
        loaded.truncated = rest.len() as u64;
        return Ok(off as u64);
    }
    Ok(bytes.len() as u64)
}

/// Records to append for a batch, in order.
pub fn encode_records<'a>(recs: impl IntoIterator<Item = &'a Record>) -> Vec<u8> {
    let mut buf = Vec::new();
    for r in recs {
        record::encode(&mut buf, r);
    }
    buf
}

/// Convenience for tests and the state module.
pub fn release_record(key: Box<str>, addr: u32, at: u64, teardown: Option<Box<str>>) -> Record {
    Record::Release(ReleaseRec {
        key,
        addr,
        released_at_ms: at,
        teardown,
    })
}
