//! Reading the snapshot and replaying the logs on start-up; torn tails are zeroed.

use std::{
    fs::{self, OpenOptions},
    path::Path,
};

use record::{Frame, HEADER_LEN, LOG_MAGIC, SNAPSHOT_MAGIC};

use super::*;

pub(super) fn load_snapshot(
    path: &Path,
    bytes: &[u8],
    loaded: &mut Loaded,
) -> Result<u64, StoreError> {
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
pub(super) fn replay_log(
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
                    torn.map_or("incomplete record".to_owned(), |e| e.to_string()),
                    garbage,
                    if is_last {
                        " that contain valid records"
                    } else {
                        " in a log that is not the newest"
                    }
                ),
            ));
        }
        zero_torn(path, off, garbage, "record", "a write cut short by a crash")?;
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

/// Zero `len` bytes of a torn write at `off` of the newest log; `what` was torn by `cause`.
fn zero_torn(
    path: &Path,
    off: usize,
    len: usize,
    what: &str,
    cause: &str,
) -> Result<(), StoreError> {
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
        "zeroed a torn {what} at the end of the log ({cause}; it was never acknowledged)"
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
        zero_torn(
            path,
            off,
            garbage,
            "batch",
            "a group commit cut short by a crash",
        )?;
        loaded.truncated = garbage as u64;
        return Ok(off as u64);
    }
    Ok(bytes.len() as u64)
}
