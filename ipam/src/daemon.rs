//! Start-up and shutdown of the whole daemon.
//!
//! Start: lock and load the store (refusing on corruption), lay it over the configured pools,
//! redo interrupted link teardowns, apply the release spool, and only then bind the socket.
//! Shutdown: stop accepting and remove the socket, let requests in progress finish, flush the
//! writer.

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::{sync::watch, task::JoinHandle};

use crate::{
    clock::Clock,
    config::Config,
    imds, metrics, reconcile,
    server::{self, stopped, BindError},
    service::{Ipam, Workers},
    state::State,
    store::{Store, StoreError},
    teardown::LinkRemover,
};

/// How often the spool is re-read, so a DEL that raced a restart is applied.
pub const SPOOL_RESCAN: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("cannot start the store writer thread")]
    Thread(#[source] std::io::Error),
    #[error("the store loader thread failed")]
    Loader(#[source] tokio::task::JoinError),
    #[error("cannot serve metrics on {addr} (set metrics_address, or \"\" to disable)")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A running daemon.
pub struct Daemon {
    ipam: Ipam,
    workers: Workers,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
    socket: PathBuf,
    metrics_address: Option<std::net::SocketAddr>,
}

impl Daemon {
    /// Load state, apply the spool and start serving on `config.socket`.
    pub async fn start(
        config: &Config,
        remover: Arc<dyn LinkRemover>,
    ) -> Result<Self, DaemonError> {
        Self::start_with_clock(config, remover, Arc::new(Clock::system())).await
    }

    /// [`Daemon::start`] on the given clock (tests inject wall-clock steps).
    pub async fn start_with_clock(
        config: &Config,
        remover: Arc<dyn LinkRemover>,
        clock: Arc<Clock>,
    ) -> Result<Self, DaemonError> {
        let started = std::time::Instant::now();
        for w in &config.warnings {
            tracing::warn!("config: {w}");
        }
        let dir = config.state_dir.clone();
        let (store, loaded) = tokio::task::spawn_blocking(move || Store::open(&dir))
            .await
            .map_err(DaemonError::Loader)??;
        let (replayed, truncated) = (loaded.replayed, loaded.truncated);
        let read_ms = started.elapsed().as_millis() as u64;
        // Persisted times ahead of the wall clock (it went back while the daemon was down):
        // continue from them, so no cooldown is stretched or cut.
        clock.not_before(loaded.newest_ms);
        let (state, report) = State::from_loaded(config, loaded, clock.now_ms());
        tracing::info!(
            state_dir = %config.state_dir.display(),
            leases = report.leases,
            cooling = report.cooling,
            log_records_replayed = replayed,
            torn_bytes_truncated = truncated,
            read_ms,
            load_ms = started.elapsed().as_millis() as u64,
            pools = config.pools.len(),
            addresses = config.total_addresses(),
            "state loaded"
        );
        if report.recovered > 0 {
            tracing::warn!(
                leases = report.recovered,
                "leases rebuilt by `aliasnet-ipamd recover` (key unknown) are held until a DEL \
                 names their host veth, the veth disappears, or a GC finds it gone"
            );
        }
        for l in &report.orphans {
            tracing::warn!(
                key = %l.key,
                address = %l.address,
                pool = %l.pool,
                "lease for an address no configured pool contains; kept (not handed out again) until released"
            );
        }
        let (ipam, workers) =
            Ipam::start_with_clock(state, store, remover, clock).map_err(DaemonError::Thread)?;
        for link in report.teardowns {
            tracing::info!(link = %link, "redoing a host link deletion interrupted by a restart");
            ipam.queue_teardown(link);
        }
        let applied = ipam.apply_spool(&config.spool_dir).await;
        if applied > 0 {
            tracing::info!(applied, "release spool applied");
        }

        let metrics_listener = match config.metrics_address {
            Some(addr) => match metrics::bind(addr).await {
                Ok(l) => Some(l),
                Err(source) => {
                    ipam.stop(workers).await;
                    return Err(DaemonError::Metrics { addr, source });
                }
            },
            None => None,
        };
        let metrics_address = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());
        let listener = match server::bind(&config.socket) {
            Ok(l) => l,
            Err(e) => {
                ipam.stop(workers).await;
                return Err(e.into());
            }
        };
        let (shutdown, rx) = watch::channel(false);
        let server = tokio::spawn(server::serve(
            listener,
            config.socket.clone(),
            ipam.clone(),
            rx.clone(),
        ));
        let mut background = vec![tokio::spawn(spool_loop(
            ipam.clone(),
            config.spool_dir.clone(),
            rx.clone(),
        ))];
        if let Some(l) = metrics_listener {
            let i = ipam.clone();
            let render: metrics::Render = std::sync::Arc::new(move || i.render_metrics());
            background.push(tokio::spawn(metrics::serve(l, render, rx.clone())));
        }
        let fetcher = imds::Fetcher::default();
        for p in &config.pools {
            if let Some(spec) = &p.imds {
                background.push(tokio::spawn(imds::run(
                    ipam.clone(),
                    p.name.clone(),
                    spec.clone(),
                    fetcher.clone(),
                    rx.clone(),
                )));
            }
        }
        background.push(tokio::spawn(reconcile::run(
            ipam.clone(),
            config.reconcile_interval,
            config.reconcile_grace,
            rx,
        )));
        tracing::info!(
            socket = %config.socket.display(),
            metrics = ?metrics_address,
            startup_ms = started.elapsed().as_millis() as u64,
            "serving"
        );
        Ok(Self {
            ipam,
            workers,
            shutdown,
            server,
            background,
            socket: config.socket.clone(),
            metrics_address,
        })
    }

    /// Where the metrics endpoint listens (`None` when disabled).
    pub fn metrics_address(&self) -> Option<std::net::SocketAddr> {
        self.metrics_address
    }

    pub fn ipam(&self) -> &Ipam {
        &self.ipam
    }

    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// Graceful stop: no new connections, the socket file removed, requests in progress
    /// finished and durable.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.server.await;
        for h in self.background {
            let _ = h.await;
        }
        self.ipam.stop(self.workers).await;
        tracing::info!("stopped");
    }
}

async fn spool_loop(ipam: Ipam, dir: PathBuf, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(SPOOL_RESCAN);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let n = ipam.apply_spool(&dir).await;
                if n > 0 {
                    tracing::info!(applied = n, "release spool applied");
                }
            }
            _ = stopped(&mut shutdown) => return,
        }
    }
}
