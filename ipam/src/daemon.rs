//! Start-up and shutdown of the whole daemon.
//!
//! Start: lock and load the store (refusing on corruption), lay it over the configured pools,
//! redo interrupted link teardowns, apply the release spool, and only then bind the socket.
//! Shutdown: stop accepting and remove the socket, let requests in progress finish, flush the
//! writer.

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::{sync::watch, task::JoinHandle};

use crate::{
    config::Config,
    server::{self, stopped, BindError},
    service::{now_ms, Ipam, Workers},
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
}

/// A running daemon.
pub struct Daemon {
    ipam: Ipam,
    workers: Workers,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<()>,
    spool: JoinHandle<()>,
    socket: PathBuf,
}

impl Daemon {
    /// Load state, apply the spool and start serving on `config.socket`.
    pub async fn start(
        config: &Config,
        remover: Arc<dyn LinkRemover>,
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
        let (state, report) = State::from_loaded(config, loaded, now_ms());
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
        for l in &report.orphans {
            tracing::warn!(
                key = %l.key,
                address = %l.address,
                pool = %l.pool,
                "lease for an address no configured pool contains; kept (not handed out again) until released"
            );
        }
        let (ipam, workers) = Ipam::start(state, store, remover).map_err(DaemonError::Thread)?;
        for link in report.teardowns {
            tracing::info!(link = %link, "redoing a host link deletion interrupted by a restart");
            ipam.queue_teardown(link);
        }
        let applied = ipam.apply_spool(&config.spool_dir).await;
        if applied > 0 {
            tracing::info!(applied, "release spool applied");
        }

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
        let spool = tokio::spawn(spool_loop(ipam.clone(), config.spool_dir.clone(), rx));
        tracing::info!(
            socket = %config.socket.display(),
            startup_ms = started.elapsed().as_millis() as u64,
            "serving"
        );
        Ok(Self {
            ipam,
            workers,
            shutdown,
            server,
            spool,
            socket: config.socket.clone(),
        })
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
        let _ = self.spool.await;
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
