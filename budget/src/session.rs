//! The node's connection to etcd and its lease.
//!
//! Each node holds one lease: its demand keys and its election candidacy are bound to it, so
//! a node that dies or is cut off loses them after one TTL, and a node that stops revokes it
//! and frees them at once. The lease is kept across reconnections while it is alive (one
//! etcd member down, a restarted etcd: etcd renews leases when its own leader changes).

use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use tokio::time::Instant;

use crate::{
    config::ClusterConfig,
    error::{deadline, BudgetError},
};

/// A connected client and a live lease.
#[derive(Clone)]
pub struct Session {
    pub client: Client,
    pub lease: i64,
    /// The TTL etcd granted (it may round the asked one up).
    pub ttl: Duration,
    /// Whether the lease is the one the node had before (its keys still exist).
    pub reused: bool,
}

/// The TTL asked of etcd: one second under `lease_ttl`, because etcd removes expired leases in
/// a sweep every 500 ms; so a dead node's keys and leadership are gone within `lease_ttl`.
pub fn granted_ttl(cfg: &ClusterConfig) -> Duration {
    cfg.lease_ttl.saturating_sub(Duration::from_secs(1))
}

/// Time allowed for one unary request.
pub fn request_timeout(cfg: &ClusterConfig) -> Duration {
    (cfg.lease_ttl / 3).max(Duration::from_secs(1))
}

async fn read(what: &'static str, path: &std::path::Path) -> Result<Vec<u8>, BudgetError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| BudgetError::ReadFile {
            what,
            path: path.to_owned(),
            source,
        })
}

/// Connects to one endpoint (TLS files are read on every connection, so rotated certificates
/// are picked up). A session talks to one member at a time, as etcd's own clients do, and
/// moves to the next when that one fails: a client balanced over all members keeps sending
/// some requests to a dead one.
pub async fn connect(cfg: &ClusterConfig, endpoint: &str) -> Result<Client, BudgetError> {
    let probe = request_timeout(cfg);
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(probe)
        // HTTP/2 pings find a dead member within a few seconds even on idle streams (a watch
        // that hears nothing), so the session moves to another member.
        .with_keep_alive(probe, probe)
        .with_keep_alive_while_idle(true);
    if let Some(tls) = &cfg.tls {
        let mut t = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read("etcd_ca_file", &tls.ca).await?));
        if let Some((cert, key)) = &tls.identity {
            t = t.identity(Identity::from_pem(
                read("etcd_cert_file", cert).await?,
                read("etcd_key_file", key).await?,
            ));
        }
        opts = opts.with_tls(t);
    }
    let client = deadline("connect", probe, Client::connect([endpoint], Some(opts))).await?;
    Ok(client)
}

/// Opens a session through `endpoint`: reuses `previous` while etcd still has it, else grants
/// a new lease.
pub async fn open(
    cfg: &ClusterConfig,
    endpoint: &str,
    previous: Option<i64>,
) -> Result<Session, BudgetError> {
    let client = connect(cfg, endpoint).await?;
    let limit = request_timeout(cfg);
    let mut leases = client.lease_client();
    if let Some(id) = previous {
        let ttl = deadline("lease ttl", limit, leases.time_to_live(id, None)).await?;
        if ttl.ttl() > 0 {
            return Ok(Session {
                client,
                lease: id,
                ttl: Duration::from_secs(ttl.granted_ttl().max(1) as u64),
                reused: true,
            });
        }
    }
    let asked = granted_ttl(cfg).as_secs() as i64;
    let grant = deadline("lease grant", limit, leases.grant(asked, None)).await?;
    Ok(Session {
        client,
        lease: grant.id(),
        ttl: Duration::from_secs(grant.ttl().max(1) as u64),
        reused: false,
    })
}

impl Session {
    /// Keeps the lease alive every TTL/3 until it fails; `alive` is called with the send time of
    /// each confirmed keep-alive (the server's expiry is at least that plus the TTL).
    pub async fn keep_alive(&self, mut alive: impl FnMut(Instant)) -> Result<(), BudgetError> {
        let every = self.ttl / 3;
        let mut leases = self.client.lease_client();
        let (mut keeper, mut stream) =
            deadline("lease keep-alive", every, leases.keep_alive(self.lease)).await?;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let sent = Instant::now();
            deadline("lease keep-alive", every, keeper.keep_alive()).await?;
            let resp = deadline("lease keep-alive", every, stream.message())
                .await?
                .ok_or_else(|| BudgetError::Protocol("keep-alive stream ended".into()))?;
            if resp.ttl() <= 0 {
                return Err(BudgetError::LeaseExpired(self.lease));
            }
            alive(sent);
        }
    }

    /// Revokes the lease: the node's keys and candidacy go at once.
    pub async fn revoke(&self, limit: Duration) -> Result<(), BudgetError> {
        let mut leases = self.client.lease_client();
        deadline("lease revoke", limit, leases.revoke(self.lease)).await?;
        Ok(())
    }
}
