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
mod loaded;
pub mod record;
mod replay;
mod snapshot;

use std::{
    fs::{self, DirBuilder, File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use nix::fcntl::{Flock, FlockArg};
use record::{Record, ReleaseRec, HEADER_LEN, LOG_MAGIC};

use crate::lease::LeaseTable;

use loaded::Applied;
pub use loaded::Loaded;
use replay::{load_snapshot, replay_log};
pub(crate) use replay::{tail_after, LogExtent};
pub use snapshot::{create_fresh, write_snapshot, SnapshotWriter};

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

/// The open store: appends go to the newest log.
pub struct Store {
    dir: PathBuf,
    _lock: Arc<DirLock>,
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

pub(crate) fn corrupt(path: &Path, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: detail.to_string(),
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

/// Creates the state directory `dir` (mode 0700) unless it exists.
pub fn ensure_dir(dir: &Path) -> Result<(), StoreError> {
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
    Ok(())
}

impl Store {
    /// Lock `dir` (creating it), load the snapshot and replay the logs.
    pub fn open(dir: &Path) -> Result<(Self, Loaded), StoreError> {
        ensure_dir(dir)?;
        Self::open_locked(dir, Arc::new(DirLock::acquire(dir)?))
    }

    /// [`Store::open`] under `lock` (of `dir`), which the caller took and may keep holding
    /// after the store is gone, whatever the outcome.
    pub fn open_locked(dir: &Path, lock: Arc<DirLock>) -> Result<(Self, Loaded), StoreError> {
        let dir_err = |source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        };

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

        let mut live = live;
        if live.len() > 1 {
            // A newest log that holds no record was made by a rotation that failed (a full
            // disk) or crashed: the log before it is the newest, and its torn tail, if any,
            // was never acknowledged.
            let g = *live.last().expect("non-empty");
            let path = dir.join(log_name(g));
            if holds_no_record(&path)? {
                fs::remove_file(&path).map_err(|source| StoreError::Write {
                    path: path.clone(),
                    source,
                })?;
                sync_dir(dir).map_err(dir_err)?;
                live.pop();
            }
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
        let (f, alloc) = create_log(&self.dir, &path, g).inspect_err(|_| {
            // A full disk: the file exists but never got its header. Appends go on in the
            // current log, which must stay the newest for the crash rules of loading.
            if fs::remove_file(&path).is_ok() {
                let _ = sync_dir(&self.dir);
            }
        })?;
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

/// The state directory's lock: an exclusive `flock` of its `lock` file, held by the daemon
/// (through its [`Store`]) or by `recover` for as long as it uses the directory.
pub struct DirLock {
    _file: Flock<File>,
}

impl DirLock {
    /// Takes the lock of `dir` (which must exist), or fails with [`StoreError::Locked`] at
    /// once if another process holds it.
    pub fn acquire(dir: &Path) -> Result<Self, StoreError> {
        let dir_err = |source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        };
        let path = dir.join(LOCK_FILE);
        // A `recover` may swap the directory between our open and our lock: the file locked
        // must still be the one at `dir/lock`, or it guards a directory that was moved aside.
        for _ in 0..3 {
            let lock_file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(&path)
                .map_err(dir_err)?;
            let file = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| {
                StoreError::Locked {
                    path: dir.to_path_buf(),
                }
            })?;
            let held = file.metadata().map_err(dir_err)?;
            match fs::metadata(&path) {
                Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => {
                    return Ok(Self { _file: file })
                }
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(dir_err(e)),
            }
        }
        Err(StoreError::Locked {
            path: dir.to_path_buf(),
        })
    }
}

/// Whether the log at `path` has nothing but zeros after its header's place (a log whose
/// creation never finished, or one no record was appended to).
fn holds_no_record(path: &Path) -> Result<bool, StoreError> {
    let bytes = fs::read(path).map_err(|source| StoreError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(bytes.len() <= HEADER_LEN || is_zero(&bytes[HEADER_LEN..]))
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

/// Creates (or truncates) `path` for writing (and reading, with `read`), readable by its owner
/// only.
fn create_private(path: &Path, read: bool) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(read)
        .write(true)
        .mode(0o600)
        .open(path)
}

fn create_log(dir: &Path, path: &Path, generation: u64) -> Result<(File, u64), StoreError> {
    let werr = |source| StoreError::Write {
        path: path.to_path_buf(),
        source,
    };
    let f = create_private(path, true).map_err(werr)?;
    let alloc = init_log(&f, path, generation)?;
    sync_dir(dir).map_err(werr)?;
    Ok((f, alloc))
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
pub fn release_record(
    key: Box<[u8]>,
    addr: crate::lease::Addr,
    at: u64,
    teardown: Option<Box<str>>,
) -> Record {
    Record::Release(ReleaseRec {
        key,
        addr,
        released_at_ms: at,
        teardown,
    })
}
