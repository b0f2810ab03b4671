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

mod links;
mod spool;
mod writer;

use links::teardown_loop;
use writer::writer_loop;
pub use writer::CommitError;

use std::{
    collections::HashSet,
    net::IpAddr,
    sync::{Arc, Mutex, MutexGuard},
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use aliasnet_ipam_proto::{
    frame::MAX_FRAME, AttachmentKey, ErrorKind, Family, Lease, ReconcileStats, Request, Response,
    LIST_PAGE_DEFAULT, LIST_PAGE_MAX,
};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::{
    clock::Clock,
    lease::{addr_ip, ip_addr, Addr, V6_START},
    metrics::Metrics,
    state::{AllocRequest, AllocStep, Refusal, ReleaseStep, State, WaitReason},
    store::{record::Record, Store},
    teardown::LinkRemover,
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

type Ack = oneshot::Sender<Result<(), CommitError>>;

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
    async fn commit(&self, records: Vec<Record>) -> Result<(), CommitError> {
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
            return Err(CommitError::WriterStopped);
        }
        rx.await.unwrap_or(Err(CommitError::NotAcknowledged))
    }

    /// Run `step` until it stops asking to wait (`Ok(Err(reason))`), waiting for a state
    /// change in between, for at most [`WAIT_LIMIT`].
    async fn wait_until<T>(
        &self,
        mut step: impl FnMut(&mut State) -> Result<Result<T, WaitReason>, Refusal>,
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
        families: Option<Vec<Family>>,
    ) -> Handled {
        let step = self
            .wait_until(|st| {
                let r = AllocRequest {
                    key: &key,
                    pod: &pod,
                    pool: pool.as_deref(),
                    host_veth: host_veth.as_deref(),
                    families: families.as_deref(),
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
            Ok(AllocStep::Existing(leases)) => match allocated(leases) {
                Some(r) => r.into(),
                // A recovered lease is never handed out by Allocate, so a key has one.
                None => error(ErrorKind::Internal, String::from("no lease to answer with")),
            },
            Ok(AllocStep::Fresh { leases, records }) => match self.commit(records).await {
                Ok(()) => {
                    for l in &leases {
                        tracing::debug!(key = %l.key, address = %l.address, "allocated");
                        metrics.allocated(&l.pool);
                    }
                    let rollback = leases.first().cloned();
                    match allocated(leases) {
                        Some(response) => Handled { response, rollback },
                        None => error(ErrorKind::Internal, String::from("no lease to answer with")),
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
                families,
            } => self.allocate(key, pod, pool, host_veth, families).await,
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
                let Some(address) = ip_addr(lease.address) else {
                    // No pool holds such an address, so it cannot be the key's.
                    return Response::Released { address: None }.into();
                };
                let ident = (address, lease.allocated_at_ms);
                match self
                    .release(&key, teardown_link.as_deref(), None, Some(ident))
                    .await
                {
                    Ok(address) => Response::Released { address }.into(),
                    Err(h) => h,
                }
            }
            Request::Check { key } => match self.shared.lock().check(&key) {
                Ok(mut leases) => {
                    let lease = (!leases.is_empty()).then(|| leases.remove(0));
                    Response::Lease {
                        lease,
                        more: leases,
                    }
                    .into()
                }
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
                // An IPv6 address below every pool's (`::/96`) continues after the IPv4 ones.
                let after = after.map(|a| ip_addr(a).unwrap_or(V6_START - 1));
                let (leases, next) =
                    self.shared
                        .lock()
                        .list_page(after, limit as usize, PAGE_BYTES);
                Response::LeasePage {
                    leases,
                    next: next.map(addr_ip),
                }
                .into()
            }
            Request::Gc { network, valid } => self.gc(network, valid).await,
            Request::Status { pool, families } => {
                let now = self.now_ms();
                match self
                    .shared
                    .lock()
                    .status(pool.as_deref(), families.as_deref(), now)
                {
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
                Err(e) => error(ErrorKind::BadRequest, e.to_string()),
            },
        }
    }

    async fn gc(&self, network: String, valid: Vec<aliasnet_ipam_proto::Attachment>) -> Handled {
        // Recovered leases are only released when their veth is gone: ask the kernel first
        // (without the lock), and release none of them if it cannot say.
        let has_recovered = self.shared.lock().has_recovered();
        let links: Option<HashSet<String>> = if has_recovered {
            crate::teardown::list(&self.shared.remover)
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
        lease: Option<(Addr, u64)>,
    ) -> Result<Option<IpAddr>, Handled> {
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
                records,
                address,
                pools,
            } => match self.commit(records).await {
                Ok(()) => {
                    tracing::debug!(%key, %address, "released");
                    for pool in &pools {
                        self.shared.metrics.released(pool);
                    }
                    Ok(Some(address))
                }
                Err(e) => Err(storage_error("release", key, &e)),
            },
            ReleaseStep::Wait(_) => unreachable!("wait_until never returns a wait"),
        }
    }

    /// Release the lease at `addr` if it is still the one allocated at `allocated_at_ms`
    /// (reconcile: its host veth stayed gone). Returns whether it was released.
    pub async fn release_stale(
        &self,
        addr: Addr,
        allocated_at_ms: u64,
    ) -> Result<bool, CommitError> {
        let step = self
            .shared
            .lock()
            .begin_release_stale(addr, allocated_at_ms, self.now_ms());
        match step {
            Some(ReleaseStep::Fresh { records, pools, .. }) => {
                self.commit(records).await?;
                for pool in &pools {
                    self.shared.metrics.released(pool);
                }
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
}

/// The Allocated reply for `leases` (IPv4 first): the first, and the other family's in `more`.
fn allocated(mut leases: Vec<Lease>) -> Option<Response> {
    if leases.is_empty() {
        return None;
    }
    let lease = leases.remove(0);
    Some(Response::Allocated {
        lease,
        more: leases,
    })
}

fn storage_error(what: &str, key: &AttachmentKey, e: &CommitError) -> Handled {
    error(
        ErrorKind::Storage,
        format!("the {what} for {key} could not be made durable and was not done: {e}"),
    )
}

#[cfg(test)]
mod tests;
