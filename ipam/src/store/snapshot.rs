//! Writing snapshots: the encoder, and the durable tmp-fsync-rename of a snapshot file.

use std::{
    fs::{self, DirBuilder},
    os::unix::fs::{DirBuilderExt, FileExt},
    path::Path,
};

use record::{AllocRec, CoolRec, Record, SNAPSHOT_MAGIC};

use super::*;

/// Durably replace the snapshot: temp file, fsync, rename, fsync the directory.
pub fn write_snapshot(dir: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = dir.join(SNAPSHOT_TMP);
    let werr = |source| StoreError::Write {
        path: tmp.clone(),
        source,
    };
    let f = create_private(&tmp, false).map_err(werr)?;
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
