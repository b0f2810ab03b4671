//! The daemon core: answers protocol requests over the in-memory [`State`] and the group-commit
//! writer.
//!
//! Concurrency model:
//! * `State` sits under a std mutex held only for in-memory work (microseconds).
//! * A mutating request reserves its change in memory, hands the record to the writer thread
//!   and waits for the acknowledgement; the reply goes out only after that.
//! * The writer thread takes every record queued while it was busy, appends them with one
//!   write + fdatasync, then commits (or on failure aborts) them in memory and acknowledges all
//!   of them. Throughput grows with concurrency instead of queueing on the disk.
//! * Requests that depend on something in flight (same key, a host veth still being deleted)
//!   wait on `changed`, which is notified after every batch and every finished teardown.
//! * Compaction merges the last snapshot with the logs on disk in a background thread; the
//!   state lock is not involved.

use std::{
    collections::HashSet,
    net::Ipv4Addr,
    path::Path,
    sync::{Arc, Mutex, MutexGuard},
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use aliasnet_ipam_proto::{
    frame::MAX_FRAME, spool, AttachmentKey, ErrorKind, Lease, ReconcileStats, Request, Response,
    LIST_PAGE_DEFAULT, LIST_PAGE_MAX,
};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

use crate::{
    clock::Clock,
    metrics::Metrics,
    state::{AllocRequest, AllocStep, Refusal, ReleaseStep, State},
    store::{self, record::Record, Store},
    teardown::{LinkRemover, Removed},
};

/// How long a request waits for something in flight before giving up.
const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// Most records written in one batch (bounds the write size, not the latency).
const MAX_BATCH_RECORDS: usize = 4096;
/// Concurrent link deletions (the kernel serialises them on RTNL anyway).
const TEARDOWN_CONCURRENCY: usize = 8;
/// Deletion attempts before giving up on a link and freeing its address anyway.
const TEARDOWN_ATTEMPTS: u32 = 5;
/// JSON bytes a lease page may take: the frame limit less room for the envelope.
const PAGE_BYTES: usize = MAX_FRAME - (256 << 10);

/// The wall clock, in ms since the Unix epoch. Cooldowns and lease times use the daemon's
/// [`Clock`] instead ([`Ipam::now_ms`]).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

type Ack = oneshot::Sender<Result<(), String>>;

enum WriterMsg {
    Commit { records: Vec<Record>, ack: Ack },
    Stop,
}

struct Shared {
    state: Mutex<State>,
    clock: Arc<Clock>,
    changed: Notify,
    writer: mpsc::UnboundedSender<WriterMsg>,
    teardown: mpsc::UnboundedSender<Box<str>>,
    metrics: Arc<Metrics>,
    reconcile: Mutex<ReconcileStats>,
    remover: Arc<dyn LinkRemover>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock may have left the state half-changed: do not go on.
        self.state.lock().expect("ipam state mutex poisoned")
    }
}

/// A reply, plus what to undo if it cannot be delivered.
#[derive(Debug)]
pub struct Handled {
    pub response: Response,
    /// Set for a fresh allocation: release it if the client is gone before it gets the reply.
    pub rollback: Option<Lease>,
}

impl From<Response> for Handled {
    fn from(response: Response) -> Self {
        Self {
            response,
            rollback: None,
        }
    }
}

fn error(kind: ErrorKind, message: impl Into<String>) -> Handled {
    Response::Error {
        kind,
        message: message.into(),
    }
    .into()
}

/// Cheap to clone handle on the daemon core.
#[derive(Clone)]
pub struct Ipam {
    shared: Arc<Shared>,
}

/// Running background parts, stopped by [`Ipam::stop`].
pub struct Workers {
    writer: JoinHandle<()>,
    teardown: tokio::task::JoinHandle<()>,
}

impl Ipam {
    /// Start the writer thread and the teardown worker around a loaded state. Must be called
    /// inside a tokio runtime.
    pub fn start(
        state: State,
        store: Store,
        remover: Arc<dyn LinkRemover>,
    ) -> std::io::Result<(Self, Workers)> {
        Self::start_with_clock(state, store, remover, Arc::new(Clock::system()))
    }

    /// [`Ipam::start`] on the given clock (tests inject wall-clock steps).
    pub fn start_with_clock(
        state: State,
        store: Store,
        remover: Arc<dyn LinkRemover>,
        clock: Arc<Clock>,
    ) -> std::io::Result<(Self, Workers)> {
        let metrics = Arc::new(Metrics::new(
            &state.pool_names(false),
            &state.pool_names(true),
        ));
        let cooldown_ms = state.cooldown_ms();
        let (wtx, wrx) = mpsc::unbounded_channel();
        let (ttx, trx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            clock,
            changed: Notify::new(),
            writer: wtx,
            teardown: ttx,
            metrics,
            reconcile: Mutex::new(ReconcileStats::default()),
            remover: remover.clone(),
        });
        let ws = shared.clone();
        let writer = std::thread::Builder::new()
            .name("ipam-writer".into())
            .spawn(move || writer_loop(store, &ws, wrx, cooldown_ms))?;
        let teardown = tokio::spawn(teardown_loop(shared.clone(), remover, trx));
        Ok((Self { shared }, Workers { writer, teardown }))
    }

    /// Now on the daemon's clock (monotonic; see [`crate::clock`]).
    pub fn now_ms(&self) -> u64 {
        self.shared.clock.now_ms()
    }

    pub fn clock(&self) -> &Arc<Clock> {
        &self.shared.clock
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    pub fn remover(&self) -> &Arc<dyn LinkRemover> {
        &self.shared.remover
    }

    /// Queue deletion of `link` (already registered as pending in the state).
    pub fn queue_teardown(&self, link: Box<str>) {
        // The receiver lives as long as the daemon; after stop a lost teardown is redone at the
        // next start from the persisted release record.
        let _ = self.shared.teardown.send(link);
    }

    /// Stop background work after the last request: flush the writer, end the teardowns.
    pub async fn stop(&self, workers: Workers) {
        let _ = self.shared.writer.send(WriterMsg::Stop);
        let _ = tokio::task::spawn_blocking(move || workers.writer.join()).await;
        workers.teardown.abort();
    }

    /// Run a closure on the locked state (introspection, metadata, reconcile and tests).
    pub fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.shared.lock())
    }

    /// Update the reconcile findings shown by Stats.
    pub fn with_reconcile_stats<R>(&self, f: impl FnOnce(&mut ReconcileStats) -> R) -> R {
        f(&mut self
            .shared
            .reconcile
            .lock()
            .unwrap_or_else(|e| e.into_inner()))
    }

    /// The Prometheus exposition, gauges read now.
    pub fn render_metrics(&self) -> String {
        let counts = self.shared.lock().counts(self.now_ms());
        let orphans = self.with_reconcile_stats(|r| r.last_run_ms.map(|_| r.orphan_veth_count));
        self.shared.metrics.render(&counts, orphans)
    }

    /// Make `records` durable; on success they are committed in memory before this returns.
    async fn commit(&self, records: Vec<Record>) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError(WriterMsg::Commit { records, .. })) = self
            .shared
            .writer
            .send(WriterMsg::Commit { records, ack: tx })
        {
            let mut st = self.shared.lock();
            for r in &records {
                st.abort(r);
            }
            drop(st);
            self.shared.changed.notify_waiters();
            return Err("the store writer has stopped (daemon shutting down)".into());
        }
        rx.await
            .unwrap_or_else(|_| Err("the store writer stopped before acknowledging".into()))
    }

    /// Run `step` until it stops asking to wait (`Ok(Err(reason))`), waiting for a state
    /// change in between, for at most [`WAIT_LIMIT`].
    async fn wait_until<T>(
        &self,
        mut step: impl FnMut(&mut State) -> Result<Result<T, String>, Refusal>,
    ) -> Result<T, Refusal> {
        // Nearly every request goes through at once: no waiter registration for those.
        match step(&mut self.shared.lock()) {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(_)) => {}
            Err(r) => return Err(r),
        }
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            // Register before looking, so a change between the look and the wait is not missed.
            notified.as_mut().enable();
            let why = match step(&mut self.shared.lock()) {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(why)) => why,
                Err(r) => return Err(r),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, notified).await.is_err() {
                return Err(Refusal::new(
                    ErrorKind::Unavailable,
                    format!("gave up after {}s waiting: {why}", WAIT_LIMIT.as_secs()),
                ));
            }
        }
    }

    async fn allocate(
        &self,
        key: AttachmentKey,
        pod: aliasnet_ipam_proto::PodRef,
        pool: Option<String>,
        host_veth: Option<String>,
    ) -> Handled {
        let step = self
            .wait_until(|st| {
                let r = AllocRequest {
                    key: &key,
                    pod: &pod,
                    pool: pool.as_deref(),
                    host_veth: host_veth.as_deref(),
                };
                Ok(match st.begin_allocate(r, self.now_ms())? {
                    AllocStep::Wait(why) => Err(why),
                    s => Ok(s),
                })
            })
            .await;
        let metrics = &self.shared.metrics;
        match step {
            Err(r) => {
                metrics.allocation_error(pool.as_deref(), r.kind);
                error(r.kind, r.message)
            }
            Ok(AllocStep::Existing(lease)) => Response::Allocated { lease }.into(),
            Ok(AllocStep::Fresh { lease, record }) => match self.commit(vec![record]).await {
                Ok(()) => {
                    tracing::debug!(key = %lease.key, address = %lease.address, "allocated");
                    metrics.allocated(&lease.pool);
                    Handled {
                        response: Response::Allocated {
                            lease: lease.clone(),
                        },
                        rollback: Some(lease),
                    }
                }
                Err(e) => {
                    metrics.allocation_error(pool.as_deref(), ErrorKind::Storage);
                    storage_error("allocation", &key, &e)
                }
            },
            Ok(AllocStep::Wait(_)) => unreachable!("wait_until never returns a wait"),
        }
    }

    /// Answer one request.
    pub async fn handle(&self, req: Request) -> Handled {
        match req {
            Request::Allocate {
                key,
                pod,
                pool,
                host_veth,
            } => self.allocate(key, pod, pool, host_veth).await,
            Request::Release { key, teardown_link } => {
                match self
                    .release(&key, teardown_link.as_deref(), None, None)
                    .await
                {
                    Ok(address) => Response::Released { address }.into(),
                    Err(h) => h,
                }
            }
            Request::ReleaseLease {
                key,
                teardown_link,
                lease,
            } => {
                let ident = (u32::from(lease.address), lease.allocated_at_ms);
                match self
                    .release(&key, teardown_link.as_deref(), None, Some(ident))
                    .await
                {
                    Ok(address) => Response::Released { address }.into(),
                    Err(h) => h,
                }
            }
            Request::Check { key } => match self.shared.lock().check(&key) {
                Ok(lease) => Response::Lease { lease }.into(),
                Err(r) => error(r.kind, r.message),
            },
            Request::List => {
                // Built within the frame budget, so a big node cannot make it allocate the
                // whole table as JSON just to refuse it.
                let (leases, more) = self.shared.lock().list_page(None, usize::MAX, PAGE_BYTES);
                if more.is_some() {
                    return error(
                        ErrorKind::Internal,
                        format!(
                            "the reply would exceed the {MAX_FRAME}-byte frame limit; use ListPage \
                             (aliasnet_ipam_proto::Client::list_all) to page through the leases"
                        ),
                    );
                }
                Response::Leases { leases }.into()
            }
            Request::ListPage { after, limit } => {
                let limit = limit.unwrap_or(LIST_PAGE_DEFAULT);
                if limit == 0 || limit > LIST_PAGE_MAX {
                    return error(
                        ErrorKind::BadRequest,
                        format!("limit must be 1 to {LIST_PAGE_MAX}, got {limit}"),
                    );
                }
                let (leases, next) =
                    self.shared
                        .lock()
                        .list_page(after.map(u32::from), limit as usize, PAGE_BYTES);
                Response::LeasePage {
                    leases,
                    next: next.map(Ipv4Addr::from),
                }
                .into()
            }
            Request::Gc { network, valid } => self.gc(network, valid).await,
            Request::Status { pool } => {
                match self.shared.lock().status(pool.as_deref(), self.now_ms()) {
                    Ok((ready, free, reason)) => Response::Status {
                        ready,
                        free,
                        reason,
                    }
                    .into(),
                    Err(r) => error(r.kind, r.message),
                }
            }
            Request::Stats => {
                let pools = self.shared.lock().stats(self.now_ms());
                Response::Stats {
                    pools,
                    reconcile: self.with_reconcile_stats(|r| r.clone()),
                }
                .into()
            }
            Request::RecordOp {
                verb,
                code,
                duration_us,
            } => match self.shared.metrics.cni_operation(
                &verb,
                code,
                Duration::from_micros(duration_us),
            ) {
                Ok(()) => Response::Recorded.into(),
                Err(m) => error(ErrorKind::BadRequest, m),
            },
        }
    }

    async fn gc(&self, network: String, valid: Vec<aliasnet_ipam_proto::Attachment>) -> Handled {
        // Recovered leases are only released when their veth is gone: ask the kernel first
        // (without the lock), and release none of them if it cannot say.
        let has_recovered = self.shared.lock().has_recovered();
        let links: Option<HashSet<String>> = if has_recovered {
            self.shared
                .remover
                .list()
                .await
                .ok()
                .map(|v| v.into_iter().map(|l| l.name).collect())
        } else {
            None
        };
        let gone = |veth: &str| links.as_ref().is_some_and(|l| !l.contains(veth));
        let step = self
            .shared
            .lock()
            .begin_gc(&network, &valid, self.now_ms(), &gone);
        match step {
            Err(r) => error(r.kind, r.message),
            Ok(v) if v.is_empty() => Response::GcDone { released: vec![] }.into(),
            Ok(v) => {
                let (records, released): (Vec<Record>, Vec<Lease>) = v.into_iter().unzip();
                match self.commit(records).await {
                    Ok(()) => {
                        for l in &released {
                            self.shared.metrics.released(&l.pool);
                        }
                        tracing::info!(
                            network,
                            released = released.len(),
                            "gc released stale leases"
                        );
                        Response::GcDone { released }.into()
                    }
                    Err(e) => error(
                        ErrorKind::Storage,
                        format!("gc of network {network} was not made durable, nothing was released: {e}"),
                    ),
                }
            }
        }
    }

    /// Release `key`, durably. `not_after`: see [`State::begin_release`].
    async fn release(
        &self,
        key: &AttachmentKey,
        teardown: Option<&str>,
        not_after: Option<u64>,
        lease: Option<(u32, u64)>,
    ) -> Result<Option<Ipv4Addr>, Handled> {
        let step = self
            .wait_until(|st| {
                match st.begin_release_of(key, teardown, not_after, lease, self.now_ms())? {
                    ReleaseStep::Wait(why) => Ok(Err(why)),
                    s => Ok(Ok(s)),
                }
            })
            .await
            .map_err(|r| error(r.kind, r.message))?;
        match step {
            ReleaseStep::NotFound { teardown } => {
                if let Some(l) = teardown {
                    self.queue_teardown(l);
                }
                Ok(None)
            }
            ReleaseStep::Fresh {
                record,
                address,
                pool,
            } => match self.commit(vec![record]).await {
                Ok(()) => {
                    tracing::debug!(%key, %address, "released");
                    self.shared.metrics.released(&pool);
                    Ok(Some(address))
                }
                Err(e) => Err(storage_error("release", key, &e)),
            },
            ReleaseStep::Wait(_) => unreachable!("wait_until never returns a wait"),
        }
    }

    /// Release the lease at `addr` if it is still the one allocated at `allocated_at_ms`
    /// (reconcile: its host veth stayed gone). Returns whether it was released.
    pub async fn release_stale(&self, addr: u32, allocated_at_ms: u64) -> Result<bool, String> {
        let step = self
            .shared
            .lock()
            .begin_release_stale(addr, allocated_at_ms, self.now_ms());
        match step {
            Some(ReleaseStep::Fresh { record, pool, .. }) => {
                self.commit(vec![record]).await?;
                self.shared.metrics.released(&pool);
                self.shared.metrics.reconcile_released();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The client of a fresh allocation is gone before it got the reply: release the lease so
    /// it does not leak, unless someone has since been handed the same lease.
    pub async fn rollback(&self, lease: &Lease) {
        let still_unseen = self
            .shared
            .lock()
            .unseen_fresh(&lease.key, lease.allocated_at_ms);
        if !still_unseen {
            return;
        }
        match self.release(&lease.key, None, None, None).await {
            Ok(_) => tracing::info!(
                key = %lease.key,
                address = %lease.address,
                "client went away before receiving its allocation; released it"
            ),
            Err(h) => tracing::warn!(
                key = %lease.key,
                reply = ?h.response,
                "could not release an allocation whose client went away"
            ),
        }
    }

    /// Apply every entry of the release spool; returns how many were applied. Entries that
    /// are not regular files, too big, unparsable or invalid are moved aside (`<name>.bad`)
    /// with an error logged, not retried; only a refusal that may pass (storage, shutting
    /// down) is retried at the next scan.
    pub async fn apply_spool(&self, dir: &Path) -> usize {
        for p in spool::remove_stale_tmp(dir) {
            tracing::warn!(path = %p.display(), "removed a release spool temp file left by a DEL that crashed mid-write");
        }
        let entries = match spool::read_all(dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the release spool");
                return 0;
            }
        };
        let mut applied = 0;
        for s in entries {
            let entry = match s.entry {
                Ok(e) => e,
                Err(why) => {
                    move_aside(&s.path, &why);
                    continue;
                }
            };
            if let Some(v) = &entry.host_veth {
                if let Err(m) = crate::lease::validate_ifname("host_veth", v) {
                    move_aside(&s.path, &m);
                    continue;
                }
            }
            match self
                .release(
                    &entry.key,
                    entry.host_veth.as_deref(),
                    Some(self.shared.clock.spooled_at(&entry)),
                    None,
                )
                .await
            {
                Ok(address) => {
                    tracing::info!(
                        key = %entry.key,
                        address = ?address,
                        host_veth = ?entry.host_veth,
                        "applied a release spooled while the daemon was unreachable"
                    );
                    if let Err(e) = spool::remove(&s.path) {
                        tracing::error!(path = %s.path.display(), error = %e, "cannot remove an applied spool entry (it will be applied again, harmlessly)");
                    }
                    applied += 1;
                }
                Err(Handled {
                    response: Response::Error { kind, message },
                    ..
                }) if !matches!(kind, ErrorKind::Storage | ErrorKind::Unavailable) => {
                    move_aside(&s.path, &message);
                }
                Err(h) => tracing::warn!(
                    path = %s.path.display(),
                    reply = ?h.response,
                    "could not apply a spool entry yet; will retry"
                ),
            }
        }
        applied
    }
}

/// Rename a spool entry that can never be applied to `<name>.bad` (rename does not follow or
/// open it, whatever it is), so it is neither retried forever nor lost.
fn move_aside(path: &Path, why: &str) {
    let mut bad = path.to_path_buf().into_os_string();
    bad.push(".bad");
    tracing::error!(
        path = %path.display(),
        error = %why,
        moved_to = %Path::new(&bad).display(),
        "unusable release spool entry; moved aside, its key was NOT released"
    );
    if let Err(e) = std::fs::rename(path, &bad) {
        tracing::error!(path = %path.display(), error = %e, "cannot move the bad spool entry aside");
    }
}

fn storage_error(what: &str, key: &AttachmentKey, e: &str) -> Handled {
    error(
        ErrorKind::Storage,
        format!("the {what} for {key} could not be made durable and was not done: {e}"),
    )
}

type Compaction = Option<(u64, JoinHandle<Result<u64, store::StoreError>>)>;

/// The group-commit writer: one write + fdatasync per batch of everything queued.
fn writer_loop(
    mut store: Store,
    shared: &Shared,
    mut rx: mpsc::UnboundedReceiver<WriterMsg>,
    cooldown_ms: u64,
) {
    let mut compaction: Compaction = None;
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
    if let Some((g, h)) = compaction.take() {
        finish_compaction(&mut store, g, h);
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
        let msg = error_chain(&e);
        tracing::error!(error = %msg, records = batch.iter().map(|b| b.0.len()).sum::<usize>(), "durable write failed; the batch was rolled back");
        msg
    });
    for (_, ack) in batch {
        let _ = ack.send(res.clone());
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

fn finish_compaction(
    store: &mut Store,
    generation: u64,
    h: JoinHandle<Result<u64, store::StoreError>>,
) {
    match h.join() {
        Ok(Ok(len)) => {
            store.snapshot_done(generation, len);
            tracing::info!(
                generation,
                bytes = len,
                "snapshot written, older logs removed"
            );
        }
        Ok(Err(e)) => {
            tracing::error!(error = %error_chain(&e), "snapshot failed; keeping the logs (the store stays consistent)")
        }
        Err(_) => tracing::error!("snapshot thread panicked; keeping the logs"),
    }
}

/// Rotate the log and merge a snapshot in the background once enough log has accumulated.
fn maybe_compact(store: &mut Store, compaction: &mut Compaction, cooldown_ms: u64, clock: &Clock) {
    if let Some((g, h)) = compaction.take() {
        if h.is_finished() {
            finish_compaction(store, g, h);
        } else {
            *compaction = Some((g, h));
            return;
        }
    }
    if !store.should_compact() {
        return;
    }
    // Between batches nothing is half-written: the logs before the new generation hold
    // exactly the acknowledged changes, and the writer never touches them again.
    let generation = match store.rotate() {
        Ok(g) => g,
        Err(e) => {
            tracing::error!(error = %error_chain(&e), "cannot start a new log; compaction postponed");
            return;
        }
    };
    // The daemon's clock: a wall-clock step must not drop cooling entries early.
    let job = store.compaction(generation, clock.now_ms(), cooldown_ms);
    let h = std::thread::Builder::new()
        .name("ipam-snapshot".into())
        .spawn(move || job.run());
    match h {
        Ok(h) => *compaction = Some((generation, h)),
        Err(e) => tracing::error!(error = %e, "cannot start the snapshot thread"),
    }
}

async fn teardown_loop(
    shared: Arc<Shared>,
    remover: Arc<dyn LinkRemover>,
    mut rx: mpsc::UnboundedReceiver<Box<str>>,
) {
    let limit = Arc::new(Semaphore::new(TEARDOWN_CONCURRENCY));
    let mut in_flight: HashSet<Box<str>> = HashSet::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Box<str>>();
    loop {
        tokio::select! {
            Some(link) = rx.recv() => {
                if !in_flight.insert(link.clone()) {
                    continue;
                }
                let (remover, limit, done) = (remover.clone(), limit.clone(), done_tx.clone());
                tokio::spawn(async move {
                    let _permit = limit.acquire().await;
                    remove_with_retries(&*remover, &link).await;
                    let _ = done.send(link);
                });
            }
            Some(link) = done_rx.recv() => {
                in_flight.remove(&link);
                shared.lock().teardown_done(&link);
                shared.changed.notify_waiters();
            }
            else => break,
        }
    }
}

async fn remove_with_retries(remover: &dyn LinkRemover, link: &str) {
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=TEARDOWN_ATTEMPTS {
        match remover.remove(link).await {
            Ok(Removed::Deleted) => {
                tracing::debug!(link, "deleted host link");
                return;
            }
            Ok(Removed::NotFound) => return,
            Ok(Removed::NotVeth(kind)) => {
                tracing::error!(
                    link,
                    kind,
                    "not deleting the host link: it is not a veth (a link of another kind was \
                     given the name of a pod's host veth)"
                );
                return;
            }
            Err(e) if attempt == TEARDOWN_ATTEMPTS => {
                tracing::error!(
                    link,
                    error = %e,
                    "giving up deleting the host link; its addresses become allocatable again"
                );
            }
            Err(e) => {
                tracing::warn!(link, error = %e, attempt, "deleting the host link failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use aliasnet_ipam_proto::PodRef;

    use super::*;
    use crate::{config::Config, teardown::RemoveFuture};

    struct NoLinks;
    impl LinkRemover for NoLinks {
        fn remove<'a>(&'a self, _: &'a str) -> RemoveFuture<'a> {
            Box::pin(async { Ok(Removed::NotFound) })
        }
    }

    fn config(dir: &Path) -> Config {
        Config::parse(
            &format!(
                "state_dir = \"{}/state\"\nspool_dir = \"{}/spool\"\nsocket = \"{}/s.sock\"\n\
                 [[pool]]\nname=\"p\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/30\"]\n",
                dir.display(),
                dir.display(),
                dir.display()
            ),
            Path::new("/t.toml"),
        )
        .unwrap()
    }

    fn alloc(c: &str) -> Request {
        Request::Allocate {
            key: AttachmentKey::new("n", c, "eth0"),
            pod: PodRef::default(),
            pool: None,
            host_veth: None,
        }
    }

    fn check(c: &str) -> Request {
        Request::Check {
            key: AttachmentKey::new("n", c, "eth0"),
        }
    }

    #[tokio::test]
    async fn write_failure_fails_the_request_and_rolls_back() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let (store, loaded) = Store::open(&cfg.state_dir).unwrap();
        let fail = store.fail_appends.clone();
        let (state, _) = State::from_loaded(&cfg, loaded, now_ms());
        let (ipam, workers) = Ipam::start(state, store, Arc::new(NoLinks)).unwrap();

        fail.store(1, Ordering::SeqCst);
        let r = ipam.handle(alloc("a")).await.response;
        match r {
            Response::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::Storage);
                assert!(message.contains("not done"), "{message}");
                assert!(message.contains("log."), "names the file: {message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            ipam.handle(check("a")).await.response,
            Response::Lease { lease: None }
        );
        // The address the failed request had reserved is free again.
        let Response::Stats { pools, .. } = ipam.handle(Request::Stats).await.response else {
            panic!()
        };
        assert_eq!((pools[0].free, pools[0].allocated), (4, 0));
        let Response::Allocated { lease } = ipam.handle(alloc("b")).await.response else {
            panic!()
        };

        fail.store(1, Ordering::SeqCst);
        let r = ipam
            .handle(Request::Release {
                key: lease.key.clone(),
                teardown_link: None,
            })
            .await
            .response;
        assert!(
            matches!(
                r,
                Response::Error {
                    kind: ErrorKind::Storage,
                    ..
                }
            ),
            "{r:?}"
        );
        assert!(matches!(
            ipam.handle(check("b")).await.response,
            Response::Lease { lease: Some(_) }
        ));
        ipam.stop(workers).await;

        // What is on disk is exactly what was acknowledged.
        let (_, loaded) = Store::open(&cfg.state_dir).unwrap();
        let (state, _) = State::from_loaded(&cfg, loaded, now_ms());
        let keys: Vec<String> = state
            .list()
            .into_iter()
            .map(|l| l.key.container_id)
            .collect();
        assert_eq!(keys, ["b"]);
    }

    #[tokio::test]
    async fn compaction_keeps_every_lease() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config::parse(
            &format!(
                "state_dir = \"{}/state\"\ncooldown=\"0s\"\n\
                 [[pool]]\nname=\"p\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/23\"]\n",
                dir.path().display()
            ),
            Path::new("/t.toml"),
        )
        .unwrap();
        let (mut store, loaded) = Store::open(&cfg.state_dir).unwrap();
        store.set_compact_min_bytes(2_000);
        let (state, _) = State::from_loaded(&cfg, loaded, now_ms());
        let (ipam, workers) = Ipam::start(state, store, Arc::new(NoLinks)).unwrap();
        for round in 0..5 {
            for i in 0..100 {
                ipam.handle(alloc(&format!("c{round}-{i}"))).await;
            }
            for i in (0..100).step_by(2) {
                ipam.handle(Request::Release {
                    key: AttachmentKey::new("n", &format!("c{round}-{i}"), "eth0"),
                    teardown_link: None,
                })
                .await;
            }
        }
        let before = ipam.with_state(|s| s.list());
        assert_eq!(before.len(), 250);
        ipam.stop(workers).await;
        let files: Vec<String> = std::fs::read_dir(&cfg.state_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(files.contains(&"state.snap".to_owned()), "{files:?}");
        // Old logs were removed; at most the current one and one still being superseded remain.
        assert!(
            files.iter().filter(|f| f.starts_with("log.")).count() <= 2,
            "{files:?}"
        );
        let (_, loaded) = Store::open(&cfg.state_dir).unwrap();
        let (state, _) = State::from_loaded(&cfg, loaded, now_ms());
        assert_eq!(state.list(), before);
    }
}
