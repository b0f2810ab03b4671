//! The release spool: durable "please release this key" records that DEL leaves when the
//! daemon is unreachable, so DEL never fails because the daemon is down (Azure's async-delete
//! lesson, see `shared/reference/anchors.md`).
//!
//! One file per key, named after a hash of the key, so repeated DELs of one pod write one
//! file. Written as temp file → fsync → rename → fsync(dir): a crash leaves either no record
//! or a whole one, never a torn one.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::msg::AttachmentKey;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpoolEntry {
    pub key: AttachmentKey,
    /// Host veth the plugin could not confirm as deleted (the daemon retries it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_veth: Option<String>,
    /// Milliseconds since the Unix epoch when DEL ran.
    pub released_at_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("cannot write release spool entry {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read release spool directory {path}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn file_name(key: &AttachmentKey) -> String {
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(key).expect("key serialises"));
    let d = h.finalize();
    let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.json")
}

/// Durably record that `entry.key` must be released.
pub fn write(dir: &Path, entry: &SpoolEntry) -> Result<PathBuf, SpoolError> {
    let path = dir.join(file_name(&entry.key));
    let err = |source| SpoolError::Write {
        path: path.clone(),
        source,
    };
    fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        file_name(&entry.key),
        std::process::id()
    ));
    let body = serde_json::to_vec(entry).expect("spool entry serialises");
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(&body).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    fs::rename(&tmp, &path).map_err(err)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
    Ok(path)
}

/// A spool file and what it says, or why it could not be read.
#[derive(Debug)]
pub struct Spooled {
    pub path: PathBuf,
    pub entry: Result<SpoolEntry, String>,
}

/// Every complete entry in `dir` (temp files of interrupted writers are skipped). A missing
/// directory is an empty spool.
pub fn read_all(dir: &Path) -> Result<Vec<Spooled>, SpoolError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(SpoolError::ReadDir {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|source| SpoolError::ReadDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = ent.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        let path = ent.path();
        let entry = fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<SpoolEntry>(&b).map_err(|e| e.to_string()));
        out.push(Spooled { path, entry });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Remove an applied entry.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_remove() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool");
        let e = SpoolEntry {
            key: AttachmentKey::new("n", "c1", "eth0"),
            host_veth: Some("ali123".into()),
            released_at_ms: 5,
        };
        let p1 = write(&spool, &e).unwrap();
        // Repeated DEL of the same key overwrites, not duplicates.
        let p2 = write(&spool, &e).unwrap();
        assert_eq!(p1, p2);
        fs::write(spool.join(".junk.tmp"), b"partial").unwrap();
        let all = read_all(&spool).unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].entry.as_ref().unwrap(), &e);
        remove(&all[0].path).unwrap();
        remove(&all[0].path).unwrap();
        assert!(read_all(&spool).unwrap().is_empty());
        assert!(read_all(&dir.path().join("missing")).unwrap().is_empty());
    }
}
