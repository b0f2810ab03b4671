//! The engine's etcd side: one session at a time (lease keep-alive, level watch, demand
//! writes, candidacy), re-established with backoff after any error.

use std::{convert::Infallible, sync::Arc, time::Duration};

use etcd_client::{EventType, GetOptions, Txn, TxnOp, WatchOptions};
use tokio::sync::{watch, Notify};
use tracing::{debug, info, warn};

use super::{lock, Shared};
use crate::{
    config::ClusterConfig,
    error::{deadline, BudgetError},
    estimate::worth_reporting,
    leader,
    session::{self, request_timeout, Session},
    wire::{encode_demand, Keys, Published},
};

/// etcd's default limit of operations in one transaction.
pub(crate) const MAX_TXN_OPS: usize = 128;

pub(crate) async fn sessions(
    cfg: ClusterConfig,
    node: String,
    core: Shared,
    wake: Arc<Notify>,
    write: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let keys = Keys::new(&cfg.prefix);
    let mut lease = None;
    let mut backoff = Duration::from_millis(200);
    // Nodes start on different members (by name), spreading the connections.
    let n = cfg.endpoints.len();
    let mut ep = node
        .bytes()
        .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b.into()))
        % n;
    let mut failed_in_a_row = 0usize;
    loop {
        if *stop.borrow() {
            return;
        }
        let endpoint = &cfg.endpoints[ep];
        let opened = tokio::select! {
            r = session::open(&cfg, endpoint, lease) => r,
            _ = stop.changed() => return,
        };
        let s = match opened {
            Ok(s) => s,
            Err(e) => {
                lock(&core).contact.connected = false;
                wake.notify_one();
                ep = (ep + 1) % n;
                failed_in_a_row += 1;
                // The next member at once; a pause only after all of them failed. One round of
                // warnings per outage, the retries after it at debug level.
                let first_round = failed_in_a_row <= n;
                if !failed_in_a_row.is_multiple_of(n) {
                    if first_round {
                        warn!(
                            "cluster budget: {endpoint}: {e}; trying {}",
                            cfg.endpoints[ep]
                        );
                    }
                    continue;
                }
                if first_round {
                    warn!(
                        "cluster budget: {endpoint}: {e}; no member answers, retrying every {:?} at most",
                        cfg.share_period
                    );
                } else {
                    debug!("cluster budget: {endpoint}: {e}; retrying in {backoff:?}");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(cfg.share_period);
                continue;
            }
        };
        failed_in_a_row = 0;
        {
            let mut c = lock(&core);
            if !s.reused {
                c.lease_lost();
            }
            c.contact.ttl = s.ttl;
            c.sessions += 1;
        }
        info!(%endpoint, lease = format!("{:x}", s.lease), reused = s.reused, ttl = ?s.ttl, "cluster budget: session to etcd");
        lease = Some(s.lease);
        let ended = tokio::select! {
            r = s.keep_alive(|sent| lock(&core).contact.last_ok = Some(sent)) => r,
            r = watch_levels(&s, &cfg, &keys, &core, &wake) => r.map(|_| ()),
            r = write_demands(&s, &cfg, &keys, &node, &core, &write) => r.map(|_| ()),
            r = candidate(&s, &cfg, &keys, &node, &core) => r.map(|_| ()),
            _ = stop.changed() => {
                // Frees this node's demands and candidacy at once instead of after a TTL.
                if let Err(e) = s.revoke(request_timeout(&cfg)).await {
                    warn!("cluster budget: revoking the lease on stop: {e}");
                }
                let mut c = lock(&core);
                c.contact.connected = false;
                c.leader = false;
                return;
            }
        };
        {
            let mut c = lock(&core);
            c.contact.connected = false;
            c.leader = false;
            c.cluster.clear();
        }
        wake.notify_one();
        match ended {
            Err(BudgetError::LeaseExpired(_)) => {
                warn!("cluster budget: lease expired; starting over with a new one");
                lease = None;
            }
            Err(e) => warn!("cluster budget: session through {endpoint} ended: {e}"),
            Ok(()) => {}
        }
        ep = (ep + 1) % n;
        backoff = Duration::from_millis(200);
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Reads every published level, then follows them. The node counts as connected once the
/// levels are read.
async fn watch_levels(
    s: &Session,
    cfg: &ClusterConfig,
    keys: &Keys,
    core: &Shared,
    wake: &Notify,
) -> Result<Infallible, BudgetError> {
    let limit = request_timeout(cfg);
    let mut kv = s.client.kv_client();
    let prefix = keys.level_prefix();
    let got = deadline(
        "read levels",
        limit,
        kv.get(prefix.clone(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let rev = got.header().map_or(0, |h| h.revision());
    let levels = got
        .kvs()
        .iter()
        .filter_map(|kv| Some((keys.parse_level(kv.key())?, Published::decode(kv.value())?)))
        .collect();
    let unpublished: Vec<_> = {
        let mut c = lock(core);
        c.levels = levels;
        c.budgets
            .iter()
            .filter(|b| !c.levels.contains_key(&b.key))
            .map(|b| b.key.clone())
            .collect()
    };
    // A budget nobody computed yet (a fresh cluster or a new budget): the node's own count
    // of the nodes reporting it sizes its static share.
    for key in unpublished {
        let n = deadline(
            "count demands",
            limit,
            kv.get(
                keys.demand_budget_prefix(&key),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        )
        .await?
        .count();
        lock(core)
            .counted
            .insert(key, n.clamp(0, i64::from(u32::MAX)) as u32);
    }
    let mut watcher = s.client.watch_client();
    let mut stream = deadline(
        "watch levels",
        limit,
        watcher.watch(
            prefix,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(rev + 1),
            ),
        ),
    )
    .await?;
    lock(core).contact.connected = true;
    wake.notify_one();
    loop {
        let msg = stream
            .message()
            .await?
            .ok_or_else(|| BudgetError::Protocol("level watch ended".into()))?;
        if msg.canceled() {
            return Err(BudgetError::Protocol(format!(
                "level watch cancelled: {}",
                msg.cancel_reason()
            )));
        }
        let mut c = lock(core);
        for ev in msg.events() {
            let Some(kv) = ev.kv() else { continue };
            let Some(key) = keys.parse_level(kv.key()) else {
                continue;
            };
            match ev.event_type() {
                EventType::Put => match Published::decode(kv.value()) {
                    Some(p) => {
                        c.levels.insert(key, p);
                    }
                    None => {
                        warn!(key = %kv.key_str().unwrap_or("?"), "cluster budget: undecodable level ignored")
                    }
                },
                EventType::Delete => {
                    c.levels.remove(&key);
                }
            }
        }
        drop(c);
        wake.notify_one();
    }
}

/// Writes the demands worth reporting (and deletes those of removed budgets) whenever the
/// engine samples; the first pass writes everything etcd does not have under this lease.
async fn write_demands(
    s: &Session,
    cfg: &ClusterConfig,
    keys: &Keys,
    node: &str,
    core: &Shared,
    write: &Notify,
) -> Result<Infallible, BudgetError> {
    let limit = request_timeout(cfg);
    let mut kv = s.client.kv_client();
    loop {
        let (puts, deletes) = {
            let c = lock(core);
            let puts: Vec<_> = c
                .per
                .iter()
                .filter(|(_, p)| worth_reporting(p.reported, p.demand, p.ceiling))
                .map(|(k, p)| (k.clone(), p.demand))
                .collect();
            (puts, c.removed.iter().cloned().collect::<Vec<_>>())
        };
        let mut ops: Vec<TxnOp> = puts
            .iter()
            .map(|(k, d)| {
                TxnOp::put(
                    keys.demand(k, node),
                    encode_demand(*d),
                    Some(etcd_client::PutOptions::new().with_lease(s.lease)),
                )
            })
            .collect();
        ops.extend(
            deletes
                .iter()
                .map(|k| TxnOp::delete(keys.demand(k, node), None)),
        );
        let mut done = 0;
        while done < ops.len() {
            let chunk: Vec<TxnOp> = ops[done..].iter().take(MAX_TXN_OPS).cloned().collect();
            let n = chunk.len();
            let resp = deadline("write demands", limit, kv.txn(Txn::new().and_then(chunk))).await?;
            let rev = resp.header().map_or(0, |h| h.revision());
            let mut c = lock(core);
            for i in done..done + n {
                if let Some((k, d)) = puts.get(i) {
                    if let Some(p) = c.per.get_mut(k) {
                        p.share.wrote(rev, *d);
                        p.reported = Some(*d);
                    }
                } else if let Some(k) = deletes.get(i - puts.len()) {
                    c.removed.remove(k);
                }
            }
            done += n;
        }
        write.notified().await;
    }
}

/// Campaigns in the election and leads while elected.
async fn candidate(
    s: &Session,
    cfg: &ClusterConfig,
    keys: &Keys,
    node: &str,
    core: &Shared,
) -> Result<Infallible, BudgetError> {
    let mut election = s.client.election_client();
    loop {
        let won = election.campaign(keys.election(), node, s.lease).await?;
        let key = won.leader().cloned().ok_or_else(|| {
            BudgetError::Protocol("campaign answered without a leader key".into())
        })?;
        {
            let mut c = lock(core);
            c.leader = true;
            c.elections_won += 1;
        }
        info!("cluster budget: this node is the leader");
        let r = leader::lead(s, cfg, keys, &key, node, core).await;
        {
            let mut c = lock(core);
            c.leader = false;
            c.cluster.clear();
        }
        match r {
            Err(BudgetError::LostLeadership) => {
                warn!("cluster budget: lost the leadership; campaigning again");
            }
            Err(e) => return Err(e),
            Ok(never) => match never {},
        }
    }
}
