//! The group-commit writer thread and the compactions it starts.

use std::{
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use crate::{
    clock::Clock,
    store::{self, record::Record, Store},
};

use super::*;

/// Why a change was not made durable; it was rolled back in memory, and every request of the
/// batch gets the same error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommitError {
    /// The store's error with its causes (a full disk, an I/O error).
    #[error("{}", crate::error_chain(.0.as_ref()))]
    Write(Arc<store::StoreError>),
    #[error("the store writer has stopped (daemon shutting down)")]
    WriterStopped,
    #[error("the store writer stopped before acknowledging")]
    NotAcknowledged,
}

/// First wait after a failed compaction (a new log or a snapshot that could not be written);
/// it doubles with every further failure up to [`COMPACT_BACKOFF_MAX`]. The usual cause is a
/// full disk, which retrying after every batch would only fill further.
const COMPACT_BACKOFF_MIN: Duration = Duration::from_secs(10);
const COMPACT_BACKOFF_MAX: Duration = Duration::from_secs(600);

/// The compaction in progress, if any, and when the next may start.
#[derive(Default)]
struct Compaction {
    running: Option<(u64, JoinHandle<Result<u64, store::StoreError>>)>,
    not_before: Option<Instant>,
    backoff: Duration,
}

impl Compaction {
    fn failed(&mut self) -> Duration {
        self.backoff = (self.backoff * 2).clamp(COMPACT_BACKOFF_MIN, COMPACT_BACKOFF_MAX);
        self.not_before = Some(Instant::now() + self.backoff);
        self.backoff
    }

    fn succeeded(&mut self) {
        self.backoff = Duration::ZERO;
        self.not_before = None;
    }
}

/// The group-commit writer: one write + fdatasync per batch of everything queued.
pub(super) fn writer_loop(
    mut store: Store,
    shared: &Shared,
    mut rx: mpsc::UnboundedReceiver<WriterMsg>,
    cooldown_ms: u64,
) {
    let mut compaction = Compaction::default();
    let mut stopping = false;
    let mut buf = Vec::with_capacity(64 << 10);
    maybe_compact(&mut store, &mut compaction, cooldown_ms, &shared.clock);
    while !stopping {
        let mut batch = match rx.blocking_recv() {
            Some(WriterMsg::Commit { records, ack }) => vec![(records, ack)],
            Some(WriterMsg::Stop) | None => break,
        };
        let mut n = batch[0].0.len();
        while n < MAX_BATCH_RECORDS {
            match rx.try_recv() {
                Ok(WriterMsg::Commit { records, ack }) => {
                    n += records.len();
                    batch.push((records, ack));
                }
                Ok(WriterMsg::Stop) => {
                    stopping = true;
                    break;
                }
                Err(_) => break,
            }
        }
        write_batch(&mut store, shared, batch, &mut buf);
        maybe_compact(&mut store, &mut compaction, cooldown_ms, &shared.clock);
    }
    // Requests still queued behind Stop are written too: nothing queued is dropped unanswered.
    while let Ok(WriterMsg::Commit { records, ack }) = rx.try_recv() {
        write_batch(&mut store, shared, vec![(records, ack)], &mut buf);
    }
    if let Some((g, h)) = compaction.running.take() {
        finish_compaction(&mut store, &mut compaction, g, h);
    }
}

fn write_batch(
    store: &mut Store,
    shared: &Shared,
    batch: Vec<(Vec<Record>, Ack)>,
    buf: &mut Vec<u8>,
) {
    buf.clear();
    for r in batch.iter().flat_map(|(r, _)| r) {
        store::record::encode(buf, r);
    }
    let res = store.append(buf);
    let mut links = Vec::new();
    {
        let mut st = shared.lock();
        for (records, _) in &batch {
            for r in records {
                match &res {
                    Ok(()) => links.extend(st.commit(r)),
                    Err(_) => st.abort(r),
                }
            }
        }
    }
    shared.changed.notify_waiters();
    for l in links {
        let _ = shared.teardown.send(l);
    }
    let res = res.map_err(|e| {
        let e = CommitError::Write(Arc::new(e));
        tracing::error!(error = %e, records = batch.iter().map(|b| b.0.len()).sum::<usize>(), "durable write failed; the batch was rolled back");
        e
    });
    for (_, ack) in batch {
        let _ = ack.send(res.clone());
    }
}

fn finish_compaction(
    store: &mut Store,
    compaction: &mut Compaction,
    generation: u64,
    h: JoinHandle<Result<u64, store::StoreError>>,
) {
    match h.join() {
        Ok(Ok(len)) => {
            store.snapshot_done(generation, len);
            compaction.succeeded();
            tracing::info!(
                generation,
                bytes = len,
                "snapshot written, older logs removed"
            );
        }
        Ok(Err(e)) => {
            let wait = compaction.failed();
            tracing::error!(error = %crate::error_chain(&e), retry_in_s = wait.as_secs(), "snapshot failed; keeping the logs (the store stays consistent)")
        }
        Err(_) => {
            let wait = compaction.failed();
            tracing::error!(
                retry_in_s = wait.as_secs(),
                "snapshot thread panicked; keeping the logs"
            )
        }
    }
}

/// Rotate the log and merge a snapshot in the background once enough log has accumulated,
/// unless the last attempt failed recently.
fn maybe_compact(store: &mut Store, compaction: &mut Compaction, cooldown_ms: u64, clock: &Clock) {
    if let Some((g, h)) = compaction.running.take() {
        if h.is_finished() {
            finish_compaction(store, compaction, g, h);
        } else {
            compaction.running = Some((g, h));
            return;
        }
    }
    if !store.should_compact() || compaction.not_before.is_some_and(|t| Instant::now() < t) {
        return;
    }
    // Between batches nothing is half-written: the logs before the new generation hold
    // exactly the acknowledged changes, and the writer never touches them again.
    let generation = match store.rotate() {
        Ok(g) => g,
        Err(e) => {
            let wait = compaction.failed();
            tracing::error!(error = %crate::error_chain(&e), retry_in_s = wait.as_secs(), "cannot start a new log; compaction postponed");
            return;
        }
    };
    // The daemon's clock: a wall-clock step must not drop cooling entries early.
    let job = store.compaction(generation, clock.now_ms(), cooldown_ms);
    let h = std::thread::Builder::new()
        .name("ipam-snapshot".into())
        .spawn(move || job.run());
    match h {
        Ok(h) => compaction.running = Some((generation, h)),
        Err(e) => {
            let wait = compaction.failed();
            tracing::error!(error = %e, retry_in_s = wait.as_secs(), "cannot start the snapshot thread")
        }
    }
}
