//! The release spool: durable "please release this key" records that DEL leaves when the
//! daemon is unreachable, so DEL never fails because the daemon is down (as Azure CNI learned
//! with its asynchronous delete).
//!
//! One file per key, named after a hash of the key, so repeated DELs of one pod write one
//! file. Written as temp file → fsync → rename → fsync(dir): a crash leaves either no record
//! or a whole one, never a torn one.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read, Write},
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
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
    /// The kernel's boot id and boot-time clock (ms) when DEL ran: unlike `released_at_ms`,
    /// immune to wall-clock steps (see [`boot_clock`]). Absent in entries of older plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_ms: Option<u64>,
}

/// The kernel's boot id and `CLOCK_BOOTTIME` in milliseconds: a clock shared by every process
/// of this boot that wall-clock steps do not move.
pub fn boot_clock() -> Option<(String, u64)> {
    static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let id = BOOT_ID
        .get_or_init(|| {
            fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .clone()?;
    // SAFETY: timespec is plain data; clock_gettime only writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a pointer to our timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    let ms = u64::try_from(ts.tv_sec).ok()? * 1000 + u64::try_from(ts.tv_nsec).ok()? / 1_000_000;
    Some((id, ms))
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

/// Largest spool entry read; a real one is a few hundred bytes.
pub const MAX_ENTRY_BYTES: u64 = 64 << 10;
/// A writer's temp file this old was left by a DEL that crashed mid-write.
pub const STALE_TMP: Duration = Duration::from_secs(600);

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
    let body = serde_json::to_vec(entry).expect("spool entry serialises");
    // A fresh temp file, never one that exists (a leftover, or a link planted in its place):
    // O_EXCL also refuses to follow a symlink at the name, O_NOFOLLOW says so explicitly.
    let mut attempt = 0u32;
    let (tmp, mut f) = loop {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = dir.join(format!(
            ".{}.tmp{}-{nanos}-{attempt}",
            file_name(&entry.key),
            std::process::id()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
            Err(e) => return Err(err(e)),
        }
    };
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

/// Read one entry without ever blocking or following a link: `O_NOFOLLOW` (a symlink, to
/// `/dev/zero` say, is refused), `O_NONBLOCK` (a FIFO does not wait for a writer), then
/// `fstat` of what was opened (only a regular file, at most [`MAX_ENTRY_BYTES`]).
fn read_entry(path: &Path) -> Result<SpoolEntry, String> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "a symbolic link, not a spool entry".to_owned(),
            _ => format!("cannot open: {e}"),
        })?;
    let md = f.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    let ft = md.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(format!("{kind}, not a regular file"));
    }
    if md.len() > MAX_ENTRY_BYTES {
        return Err(format!(
            "{} bytes, over the {MAX_ENTRY_BYTES}-byte limit of a spool entry",
            md.len()
        ));
    }
    let mut b = Vec::with_capacity(md.len() as usize);
    f.take(MAX_ENTRY_BYTES + 1)
        .read_to_end(&mut b)
        .map_err(|e| format!("cannot read: {e}"))?;
    if b.len() as u64 > MAX_ENTRY_BYTES {
        return Err(format!(
            "over the {MAX_ENTRY_BYTES}-byte limit of a spool entry"
        ));
    }
    serde_json::from_slice::<SpoolEntry>(&b).map_err(|e| e.to_string())
}

/// Remove the writers' temp files older than [`STALE_TMP`] (their DEL crashed mid-write);
/// returns what was removed.
pub fn remove_stale_tmp(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for ent in rd.flatten() {
        let name = ent.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with('.') && name.contains(".tmp")) {
            continue;
        }
        // The entry itself, never what a link points at.
        let Ok(md) = ent.metadata() else {
            continue;
        };
        let age = md
            .modified()
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok());
        if !md.is_dir() && age.is_some_and(|a| a > STALE_TMP) && fs::remove_file(ent.path()).is_ok()
        {
            removed.push(ent.path());
        }
    }
    removed
}

/// Every complete entry in `dir` (temp files of interrupted writers are skipped; see
/// [`remove_stale_tmp`]). A missing directory is an empty spool. Entries that cannot be read as one
/// (not a regular file, too big, unparsable) come back with the reason, to be moved aside.
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
        let entry = read_entry(&path);
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
            boot_id: boot_clock().map(|b| b.0),
            boot_ms: Some(7),
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
