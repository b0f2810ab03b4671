//! The durable store: an append-only log of checksummed records plus a compacted snapshot.
//!
//! Files in `state_dir`:
//! * `state.snap`: every live lease and cooling address as of generation G (header says G);
//! * `log.<gen>`: records appended after the snapshot of generation `gen` was taken; replay
//!   reads `log.G`, `log.G+1`, ... in order (a rotation creates the next log before the new
//!   snapshot is durable, so several may be live);
//! * `lock`: `flock`ed while a daemon uses the directory.
//!
//! Logs are pre-allocated: zeros are written (and made durable) ahead of the records, up to
//! 4 MiB at a time, so an append overwrites blocks that already exist and its `fdatasync` does
//! not have to commit a file-size change to the journal (about 40% cheaper on ext4 here). A
//! log ends at the first frame whose header is zero, followed by zeros only.
//!
//! Crash rules on load: a record cut short at the very end of the newest log was never
//! acknowledged and is zeroed out. Anything else that does not check out (a bad record followed
//! by valid ones, a damaged snapshot, a gap in the log chain, a record contradicting the state)
//! refuses to start with the file named: starting empty would hand out addresses that running
//! pods still use.
//!
//! Compaction ([`compact`]) merges the previous snapshot with the logs written since, reading
//! them back from disk in a background thread: the daemon's state lock is never held for it.

pub mod compact;
pub mod record;

use std::{
    collections::HashMap,
    fs::{self, DirBuilder, File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};
use record::{AllocRec, CoolRec, Frame, Record, ReleaseRec, HEADER_LEN, LOG_MAGIC, SNAPSHOT_MAGIC};

use crate::lease::{display_key, InsertError, LeaseEntry, LeaseState, LeaseTable};

pub const SNAPSHOT_FILE: &str = "state.snap";
pub(crate) const SNAPSHOT_TMP: &str = "state.snap.tmp";
const LOCK_FILE: &str = "lock";
const LOG_PREFIX: &str = "log.";
/// Compact once the logs since the last snapshot exceed this or half the snapshot's size,
/// whichever is larger: restart replays at most 1.5 times the live state, and a compaction
/// (which rewrites the snapshot) runs at most every half-snapshot of log.
const COMPACT_MIN_LOG_BYTES: u64 = 8 << 20;
/// Most zeros written ahead of the log's end at a time. A new log starts with
/// [`LOG_FIRST_CHUNK`] and each extension doubles the allocation up to this step, so small
/// logs stay small and a busy one extends (one extra ~10 ms sync) every 4 MiB.
pub const LOG_CHUNK: u64 = 4 << 20;
pub const LOG_FIRST_CHUNK: u64 = 64 << 10;
/// Bytes per lease in a snapshot, roughly (to size the tables once when loading).
const SNAPSHOT_BYTES_PER_LEASE: usize = 120;

/// What an operator should do when the store cannot be loaded.
pub const RECOVERY_HINT: &str = "stop the daemon and rebuild the state from the kernel's host \
     routes with `aliasnet-ipamd recover --config <config>` (it moves this state directory \
     aside, it deletes nothing)";

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

impl StoreError {
    /// The state on disk is damaged (as opposed to unreadable or locked).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Self::Corrupt { .. })
    }
}

pub fn log_name(generation: u64) -> String {
    format!("{LOG_PREFIX}{generation:020}")
}

/// State rebuilt from disk, before it is laid over the configured pools.
#[derive(Default)]
pub struct Loaded {
    /// Pool names as recorded (leases refer to them by index).
    pub names: Vec<Box<str>>,
    name_idx: HashMap<Box<str>, u16>,
    pub leases: LeaseTable,
    /// Released addresses: address -> (release time, link still to tear down).
    pub cooling: HashMap<u32, (u64, Option<Box<str>>)>,
    /// Log records replayed (for the start-up log line).
    pub replayed: u64,
    /// Bytes of a torn tail that were zeroed out.
    pub truncated: u64,
    /// The latest allocation or release time recorded (the daemon's clock never reads
    /// earlier after a restart).
    pub newest_ms: u64,
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

    fn apply_alloc(
        &mut self,
        pool: &str,
        data: Box<[u8]>,
        key_len: u16,
        addr: u32,
        allocated_at_ms: u64,
    ) -> Result<(), String> {
        let pool_name = self.intern(pool)?;
        self.newest_ms = self.newest_ms.max(allocated_at_ms);
        let entry = LeaseEntry {
            data,
            allocated_at_ms,
            addr,
            key_len,
            pool_name,
            state: LeaseState::Committed,
            seen: true,
        };
        match self.leases.insert(entry) {
            Ok(_) => {}
            Err(InsertError::Key(id)) => {
                return Err(format!(
                    "allocation for {} which already holds a lease",
                    display_key(self.leases.get(id).key())
                ))
            }
            Err(InsertError::Addr(_)) => {
                return Err(format!(
                    "allocation of {} which another key already holds",
                    std::net::Ipv4Addr::from(addr)
                ))
            }
        }
        if !self.cooling.is_empty() {
            self.cooling.remove(&addr);
        }
        Ok(())
    }

    /// Apply one framed payload (version-2 allocations without an intermediate copy).
    fn apply_payload(&mut self, payload: &[u8], in_snapshot: bool) -> Result<Applied, String> {
        match record::view_alloc(payload) {
            Some(Ok(a)) => {
                self.apply_alloc(a.pool, a.data.into(), a.key_len, a.addr, a.allocated_at_ms)?;
                Ok(Applied::Lease)
            }
            Some(Err(e)) => Err(e),
            None => match record::decode_payload(payload)? {
                Record::End { leases, cooling } if in_snapshot => {
                    Ok(Applied::End { leases, cooling })
                }
                rec => {
                    let kind = match rec {
                        Record::Alloc(_) => Applied::Lease,
                        Record::Cooling(_) => Applied::Cooling,
                        _ => Applied::Change,
                    };
                    self.apply(rec, in_snapshot)?;
                    Ok(kind)
                }
            },
        }
    }

    /// Apply one record, checking it is consistent with what came before.
    fn apply(&mut self, rec: Record, in_snapshot: bool) -> Result<(), String> {
        match rec {
            Record::Alloc(a) => {
                self.apply_alloc(&a.pool, a.data, a.key_len, a.addr, a.allocated_at_ms)?;
            }
            Record::Release(r) if !in_snapshot => {
                match self.leases.find(&r.key) {
                    Some(id) if self.leases.get(id).addr == r.addr => {
                        self.leases.remove(id);
                    }
                    _ => {
                        return Err(format!(
                            "release of {} ({}) which holds no such lease",
                            display_key(&r.key),
                            std::net::Ipv4Addr::from(r.addr)
                        ))
                    }
                }
                self.newest_ms = self.newest_ms.max(r.released_at_ms);
                self.cooling.insert(r.addr, (r.released_at_ms, r.teardown));
            }
            Record::Cooling(c) if in_snapshot => {
                self.newest_ms = self.newest_ms.max(c.released_at_ms);
                if self.leases.by_addr(c.addr).is_some()
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

/// What a loaded record was.
enum Applied {
    Lease,
    Cooling,
    Change,
    End { leases: u64, cooling: u64 },
}

/// The open store: appends go to the newest log.
pub struct Store {
    dir: PathBuf,
    _lock: Flock<File>,
    log: File,
    log_path: PathBuf,
    generation: u64,
    /// Length of the log that holds records known durable; appends go here.
    log_len: u64,
    /// Length of the log's durable zero-filled allocation (>= `log_len`).
    log_alloc: u64,
    /// A failed append left this many bytes of garbage after `log_len`; zeroed before the next.
    dirty_tail: u64,
    /// Log bytes written since the snapshot generation on disk.
    bytes_since_snapshot: u64,
    snapshot_len: u64,
    /// Generation of the newest durable snapshot (0 when none).
    snapshot_generation: u64,
    compact_min_bytes: u64,
    /// The batch being written (marker + records), reused.
    scratch: Vec<u8>,
    #[cfg(test)]
    pub(crate) fail_appends: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

pub(crate) fn corrupt(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn is_zero(b: &[u8]) -> bool {
    // OR-folding a block vectorises; the tail of a pre-allocated log is megabytes of zeros.
    b.chunks(4096)
        .all(|c| c.iter().fold(0u8, |acc, x| acc | x) == 0)
}

/// Write `len` zero bytes at `off`.
fn write_zeros(f: &File, off: u64, len: u64) -> io::Result<()> {
    static ZEROS: [u8; 1 << 16] = [0; 1 << 16];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(ZEROS.len() as u64);
        f.write_all_at(&ZEROS[..n as usize], off + done)?;
        done += n;
    }
    Ok(())
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
        let lock = lock_dir(dir)?;

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
            Ok(bytes) => {
                let n = bytes.len() / SNAPSHOT_BYTES_PER_LEASE;
                loaded.leases = LeaseTable::with_capacity(n);
                let g = load_snapshot(&snap_path, &bytes, &mut loaded)?;
                (g, bytes.len() as u64)
            }
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
        let mut last: Option<(PathBuf, LogExtent)> = None;
        for (i, g) in live.iter().enumerate() {
            let path = dir.join(log_name(*g));
            let is_last = i + 1 == live.len();
            let ext = replay_log(&path, *g, is_last, &mut loaded)?;
            bytes_since_snapshot += ext.used;
            last = Some((path, ext));
        }

        let (log_path, generation, log_len, log_alloc, log) = match last {
            Some((_, ext)) if ext.version < record::BATCHED_VERSION => {
                // A log of an older format is never appended to in the new one: continue in
                // the next generation (a rotation, as compaction does; it merges both later).
                let g = *live.last().expect("non-empty") + 1;
                let path = dir.join(log_name(g));
                let (f, alloc) = create_log(dir, &path, g)?;
                (path, g, HEADER_LEN as u64, alloc, f)
            }
            Some((path, ext)) => {
                let f = OpenOptions::new()
                    .write(true)
                    .read(true)
                    .open(&path)
                    .map_err(|source| StoreError::Read {
                        path: path.clone(),
                        source,
                    })?;
                let g = *live.last().expect("non-empty");
                if ext.used < HEADER_LEN as u64 {
                    // Created by a rotation that crashed before its header was durable.
                    let alloc = init_log(&f, &path, g)?;
                    (path, g, HEADER_LEN as u64, alloc, f)
                } else {
                    (path, g, ext.used, ext.file_len, f)
                }
            }
            None => {
                let path = dir.join(log_name(0));
                let (f, alloc) = create_log(dir, &path, 0)?;
                (path, 0, HEADER_LEN as u64, alloc, f)
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
                log_alloc,
                dirty_tail: 0,
                bytes_since_snapshot,
                snapshot_len,
                snapshot_generation: snap_gen,
                compact_min_bytes: COMPACT_MIN_LOG_BYTES,
                scratch: Vec::new(),
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

    fn werr(&self, source: io::Error) -> StoreError {
        StoreError::Write {
            path: self.log_path.clone(),
            source,
        }
    }

    /// Append encoded records as one batch and make them durable (write + fdatasync). On
    /// failure the bytes are zeroed again so a later append never follows unacknowledged data.
    pub fn append(&mut self, records: &[u8]) -> Result<(), StoreError> {
        let mut batch = std::mem::take(&mut self.scratch);
        batch.clear();
        if !records.is_empty() {
            record::encode_batch(&mut batch, records);
        }
        let r = self.append_raw(&batch);
        self.scratch = batch;
        r
    }

    fn append_raw(&mut self, buf: &[u8]) -> Result<(), StoreError> {
        if self.dirty_tail > 0 {
            write_zeros(&self.log, self.log_len, self.dirty_tail)
                .and_then(|()| self.log.sync_data())
                .map_err(|e| self.werr(e))?;
            self.dirty_tail = 0;
        }
        let end = self.log_len + buf.len() as u64;
        // Extend the zero-filled allocation in the same sync as the records.
        let alloc = if end > self.log_alloc {
            let step = self.log_alloc.clamp(LOG_FIRST_CHUNK, LOG_CHUNK);
            Some((end + step).div_ceil(4096) * 4096)
        } else {
            None
        };
        let res = (|| {
            if let Some(want) = alloc {
                write_zeros(&self.log, self.log_alloc, want - self.log_alloc)?;
            }
            self.log.write_all_at(buf, self.log_len)?;
            #[cfg(test)]
            {
                use std::sync::atomic::Ordering;
                // An injected failure behaves like a write that reached the file but whose
                // fdatasync failed: the bytes are there and must be zeroed again.
                if self
                    .fail_appends
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                }
            }
            self.log.sync_data()
        })();
        match res {
            Ok(()) => {
                self.log_len = end;
                if let Some(want) = alloc {
                    self.log_alloc = want;
                }
                self.bytes_since_snapshot += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.dirty_tail = buf.len() as u64;
                if write_zeros(&self.log, self.log_len, self.dirty_tail)
                    .and_then(|()| self.log.sync_data())
                    .is_ok()
                {
                    self.dirty_tail = 0;
                }
                Err(self.werr(e))
            }
        }
    }

    /// Whether enough log has accumulated to be worth a snapshot.
    pub fn should_compact(&self) -> bool {
        self.bytes_since_snapshot > self.compact_min_bytes.max(self.snapshot_len / 2)
    }

    /// Lower the compaction threshold (tests exercise compaction with a few records).
    pub fn set_compact_min_bytes(&mut self, bytes: u64) {
        self.compact_min_bytes = bytes;
    }

    /// Start a new log generation; returns it. The caller then merges the snapshot and the
    /// logs before it into a snapshot of that generation ([`Store::compaction`]), and once it
    /// is durable reports back with [`Store::snapshot_done`].
    pub fn rotate(&mut self) -> Result<u64, StoreError> {
        if self.dirty_tail > 0 {
            // Do not leave unacknowledged bytes behind in a log that is about to be closed.
            self.append_raw(&[])?;
        }
        let g = self.generation + 1;
        let path = self.dir.join(log_name(g));
        let (f, alloc) = create_log(&self.dir, &path, g)?;
        self.log = f;
        self.log_path = path;
        self.generation = g;
        self.log_len = HEADER_LEN as u64;
        self.log_alloc = alloc;
        Ok(g)
    }

    /// The merge that produces the snapshot of `generation` (returned by [`Store::rotate`]).
    /// Cooling entries released more than `cooldown_ms` before `now_ms` are dropped (unless a
    /// link deletion may still have to be redone).
    pub fn compaction(&self, generation: u64, now_ms: u64, cooldown_ms: u64) -> compact::Job {
        compact::Job {
            dir: self.dir.clone(),
            from: self.snapshot_generation,
            has_snapshot: self.snapshot_len > 0,
            to: generation,
            now_ms,
            cooldown_ms,
        }
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

/// `flock` the state directory's lock file.
pub(crate) fn lock_dir(dir: &Path) -> Result<Flock<File>, StoreError> {
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join(LOCK_FILE))
        .map_err(|source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
    Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| StoreError::Locked {
        path: dir.to_path_buf(),
    })
}

/// Write a log header and the first zero-filled chunk; returns the allocated length.
fn init_log(f: &File, path: &Path, generation: u64) -> Result<u64, StoreError> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    record::encode_header(&mut h, LOG_MAGIC, generation);
    let alloc = LOG_FIRST_CHUNK;
    f.set_len(0)
        .and_then(|()| f.write_all_at(&h, 0))
        .and_then(|()| write_zeros(f, HEADER_LEN as u64, alloc - HEADER_LEN as u64))
        .and_then(|()| f.sync_all())
        .map_err(|source| StoreError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(alloc)
}

fn create_log(dir: &Path, path: &Path, generation: u64) -> Result<(File, u64), StoreError> {
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
    let alloc = init_log(&f, path, generation)?;
    sync_dir(dir).map_err(werr)?;
    Ok((f, alloc))
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

/// Create a new state directory holding exactly `snapshot` (generation 0, from
/// [`SnapshotWriter`]) and an empty log. `dir` must not exist.
pub fn create_fresh(dir: &Path, snapshot: &[u8]) -> Result<(), StoreError> {
    let dir_err = |source| StoreError::Dir {
        path: dir.to_path_buf(),
        source,
    };
    DirBuilder::new().mode(0o700).create(dir).map_err(dir_err)?;
    write_snapshot(dir, snapshot)?;
    create_log(dir, &dir.join(log_name(0)), 0)?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent).map_err(dir_err)?;
    }
    Ok(())
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
        let len = match record::check_frame(&bytes[off..]) {
            Ok(len) => len,
            Err(Frame::Bad(d)) => return Err(corrupt(path, format!("at byte {off}: {d}"))),
            Err(_) => {
                return Err(corrupt(
                    path,
                    format!("truncated at byte {off} (no end record)"),
                ))
            }
        };
        let n = record::FRAME_HEADER + len;
        let payload = &bytes[off + record::FRAME_HEADER..off + n];
        match loaded
            .apply_payload(payload, true)
            .map_err(|d| corrupt(path, format!("at byte {off}: {d}")))?
        {
            Applied::Lease => leases += 1,
            Applied::Cooling => cooling += 1,
            Applied::Change => {}
            Applied::End {
                leases: l,
                cooling: c,
            } => {
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
        }
        off += n;
    }
}

/// True when some valid record starts anywhere in `buf`.
fn valid_record_follows(buf: &[u8]) -> bool {
    (0..buf.len()).any(|i| matches!(record::read_frame(&buf[i..]), Frame::Ok(..)))
}

/// How much of a log holds records, and how long the file is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogExtent {
    pub used: u64,
    pub file_len: u64,
    /// Format version of its header (the current one for a log torn at creation).
    pub version: u32,
}

/// Whether `rest` (what follows the last record) is a zero tail: `Ok(())`, or `Err(n)` with
/// `n` the extent of the non-zero bytes (a torn write, or corruption).
pub(crate) fn tail_after(rest: &[u8]) -> Result<(), usize> {
    if is_zero(rest) {
        return Ok(());
    }
    // Index of the last non-zero byte + 1: the extent of the garbage.
    Err(rest.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1))
}

/// Replay one log; returns its extent (a torn tail in the newest log is zeroed out).
fn replay_log(
    path: &Path,
    generation: u64,
    is_last: bool,
    loaded: &mut Loaded,
) -> Result<LogExtent, StoreError> {
    let bytes = fs::read(path).map_err(|source| StoreError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file_len = bytes.len() as u64;
    if is_last && (bytes.len() < HEADER_LEN || is_zero(&bytes)) {
        // Torn creation: a log is used only after its header is durable, so a newest log
        // without a whole header never had a record appended.
        return Ok(LogExtent {
            used: 0,
            file_len,
            version: record::FORMAT_VERSION,
        });
    }
    let (g, version) =
        record::decode_header_version(&bytes, LOG_MAGIC).map_err(|d| corrupt(path, d))?;
    if g != generation {
        return Err(corrupt(
            path,
            format!("header says generation {g}, the file name says {generation}"),
        ));
    }
    if version >= record::BATCHED_VERSION {
        return replay_batches(path, &bytes, is_last, loaded).map(|used| LogExtent {
            used,
            file_len,
            version,
        });
    }
    let mut off = HEADER_LEN;
    while off < bytes.len() {
        let torn = match record::check_frame(&bytes[off..]) {
            Ok(len) => {
                let n = record::FRAME_HEADER + len;
                loaded
                    .apply_payload(&bytes[off + record::FRAME_HEADER..off + n], false)
                    .map_err(|d| corrupt(path, format!("record at byte {off}: {d}")))?;
                loaded.replayed += 1;
                off += n;
                continue;
            }
            Err(Frame::Bad(d)) => Some(d),
            Err(_) => None,
        };
        let rest = &bytes[off..];
        let garbage = match tail_after(rest) {
            // The pre-allocated zeros: the end of the records.
            Ok(()) => {
                return Ok(LogExtent {
                    used: off as u64,
                    file_len,
                    version,
                })
            }
            Err(n) => n,
        };
        // Only the newest log can end in a torn write; and only if nothing valid follows.
        if !is_last || valid_record_follows(&rest[1..garbage.max(1)]) {
            return Err(corrupt(
                path,
                format!(
                    "{} at byte {off}, followed by {} more bytes{}",
                    torn.as_deref().unwrap_or("incomplete record"),
                    garbage,
                    if is_last {
                        " that contain valid records"
                    } else {
                        " in a log that is not the newest"
                    }
                ),
            ));
        }
        OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| {
                write_zeros(&f, off as u64, garbage as u64)?;
                f.sync_data()
            })
            .map_err(|source| StoreError::Write {
                path: path.to_path_buf(),
                source,
            })?;
        tracing::warn!(
            path = %path.display(),
            offset = off,
            bytes = garbage,
            "zeroed a torn record at the end of the log (a write cut short by a crash; it was never acknowledged)"
        );
        loaded.truncated = garbage as u64;
        return Ok(LogExtent {
            used: off as u64,
            file_len,
            version,
        });
    }
    Ok(LogExtent {
        used: bytes.len() as u64,
        file_len,
        version,
    })
}

/// Zero `len` bytes of a torn write at `off` of the newest log.
fn zero_torn(path: &Path, off: usize, len: usize) -> Result<(), StoreError> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| {
            write_zeros(&f, off as u64, len as u64)?;
            f.sync_data()
        })
        .map_err(|source| StoreError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    tracing::warn!(
        path = %path.display(),
        offset = off,
        bytes = len,
        "zeroed a torn batch at the end of the log (a group commit cut short by a crash; it was never acknowledged)"
    );
    Ok(())
}

/// Replay a batched (version 3) log; returns how many bytes hold acknowledged batches.
///
/// A batch was acknowledged only once it was durable, and the next one is written after that,
/// so a batch that does not verify is either the last one written (cut short by a crash, its
/// pages persisted in any order, possibly leaving a zero page before records of the same
/// batch: zeroed, like a torn tail) or damage to acknowledged data (a verified batch follows
/// it: refused).
fn replay_batches(
    path: &Path,
    bytes: &[u8],
    is_last: bool,
    loaded: &mut Loaded,
) -> Result<u64, StoreError> {
    let mut off = HEADER_LEN;
    while off < bytes.len() {
        if let Some(end) = record::verified_batch(bytes, off) {
            let mut r = off + record::BATCH_MARKER_LEN;
            while r < end {
                let len = record::check_frame(&bytes[r..end]).map_err(|f| {
                    corrupt(
                        path,
                        format!("record at byte {r} of a verified batch: {f:?}"),
                    )
                })?;
                let n = record::FRAME_HEADER + len;
                loaded
                    .apply_payload(&bytes[r + record::FRAME_HEADER..r + n], false)
                    .map_err(|d| corrupt(path, format!("record at byte {r}: {d}")))?;
                loaded.replayed += 1;
                r += n;
            }
            off = end;
            continue;
        }
        let garbage = match tail_after(&bytes[off..]) {
            // The pre-allocated zeros: the end of the batches.
            Ok(()) => return Ok(off as u64),
            Err(n) => n,
        };
        let later = (off + 1..off + garbage).find(|i| record::verified_batch(bytes, *i).is_some());
        if !is_last || later.is_some() {
            return Err(corrupt(
                path,
                format!(
                    "damaged or incomplete batch at byte {off}, followed by {garbage} more bytes{}",
                    match later {
                        Some(at) =>
                            format!(" that contain valid records (a verified batch at byte {at})"),
                        None => " in a log that is not the newest".to_owned(),
                    }
                ),
            ));
        }
        zero_torn(path, off, garbage)?;
        loaded.truncated = garbage as u64;
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

/// A release record (tests and the state module).
pub fn release_record(key: Box<[u8]>, addr: u32, at: u64, teardown: Option<Box<str>>) -> Record {
    Record::Release(ReleaseRec {
        key,
        addr,
        released_at_ms: at,
        teardown,
    })
}
