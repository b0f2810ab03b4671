//! Reconcile the leases against the host veths in the kernel, at start and periodically.
//!
//! * A lease whose host veth is gone is released once the lease is older than
//!   `reconcile_grace` *and* its veth has been seen missing for that long. An ADD reserves its
//!   address before it creates the veth, so a young lease without a veth is normal; the second
//!   condition keeps a veth that is being re-created (a repeated ADD) from costing its lease.
//!   Leases without a recorded host veth cannot be checked and are left alone.
//! * A veth named like ours (`host_veth_prefix` + hash digits, 15 characters, kind veth) that no
//!   lease claims and that is not being deleted is an orphan: reported in the log, in Stats
//!   and as `aliasnet_ipam_orphan_veths`, never deleted (it may carry a pod the operator wants
//!   to look at; `aliasnetctl doctor` says how to remove it).
//!
//! The lease table is read in pages of 1,024 under the state lock, so a node with 200,000
//! leases never blocks allocations for more than a fraction of a millisecond.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    time::Duration,
};

use tokio::sync::watch;

use aliasnet_ipam_proto::is_host_veth;

use crate::{lease::Field, service::Ipam, teardown::LinksError};

/// Leases read per lock acquisition (~50 us of work each).
const PAGE: usize = 1024;
/// Orphan names kept for Stats.
const MAX_ORPHAN_NAMES: usize = 1000;

/// A lease whose veth stayed gone past the grace.
struct Stale {
    key: aliasnet_ipam_proto::AttachmentKey,
    addr: crate::lease::Addr,
    host_veth: String,
    allocated_at_ms: u64,
}

/// What one pass found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    pub released: Vec<(std::net::IpAddr, String)>,
    pub orphans: Vec<String>,
    pub missing: usize,
}

/// The reconcile's memory between passes.
pub struct Reconciler {
    ipam: Ipam,
    grace_ms: u64,
    /// (address, allocation time) of a lease -> when its veth was first seen missing.
    missing_since: HashMap<(crate::lease::Addr, u64), u64>,
    reported_orphans: HashSet<String>,
}

impl Reconciler {
    pub fn new(ipam: Ipam, grace: Duration) -> Self {
        Self {
            ipam,
            grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            missing_since: HashMap::new(),
            reported_orphans: HashSet::new(),
        }
    }

    /// One pass against the links the daemon's link remover lists.
    pub async fn pass(&mut self) -> Result<PassReport, LinksError> {
        let links = crate::teardown::list(self.ipam.remover()).await?;
        let names: HashSet<&str> = links.iter().map(|l| l.name.as_str()).collect();
        let (prefix, pending) = self
            .ipam
            .with_state(|st| (st.veth_prefix().to_owned(), st.pending_teardowns()));
        let mut candidates: BTreeSet<&str> = links
            .iter()
            .filter(|l| is_host_veth(l.kind.as_deref(), &l.name, &prefix))
            .map(|l| l.name.as_str())
            .collect();
        for p in &pending {
            candidates.remove(&**p);
        }

        let now = self.ipam.now_ms();
        let grace = self.grace_ms;
        let mut missing = HashMap::new();
        let mut stale = Vec::new();
        let mut after = None;
        loop {
            // Borrowing scan: a lease whose veth exists costs a lookup, no allocation.
            let next = self.ipam.with_state(|st| {
                st.scan_leases(after, PAGE, |addr, e| {
                    let Some(field) = e.host_veth_field() else {
                        return;
                    };
                    let owned;
                    let name = match field {
                        Field::Raw(s) => s,
                        other => {
                            owned = other.to_string_lossless();
                            owned.as_str()
                        }
                    };
                    if names.contains(name) {
                        candidates.remove(name);
                        return;
                    }
                    let id = (addr, e.allocated_at_ms);
                    let since = self.missing_since.get(&id).copied().unwrap_or(now);
                    missing.insert(id, since);
                    if now.saturating_sub(since) >= grace
                        && now.saturating_sub(e.allocated_at_ms) >= grace
                    {
                        stale.push(Stale {
                            key: e.attachment_key(),
                            addr,
                            host_veth: name.to_owned(),
                            allocated_at_ms: e.allocated_at_ms,
                        });
                    }
                })
            });
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
            tokio::task::yield_now().await;
        }
        self.missing_since = missing;

        let mut report = PassReport::default();
        for l in stale {
            match self.ipam.release_stale(l.addr, l.allocated_at_ms).await {
                Ok(true) => {
                    tracing::info!(
                        key = %l.key,
                        address = %crate::lease::addr_ip(l.addr),
                        host_veth = l.host_veth,
                        grace_s = self.grace_ms / 1000,
                        "released a lease whose host veth is gone"
                    );
                    self.missing_since.remove(&(l.addr, l.allocated_at_ms));
                    report
                        .released
                        .push((crate::lease::addr_ip(l.addr), l.host_veth));
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    key = %l.key,
                    error = %e,
                    "could not release a lease whose host veth is gone; will retry"
                ),
            }
        }
        report.missing = self.missing_since.len();
        report.orphans = candidates.iter().map(|s| (*s).to_owned()).collect();
        for o in &report.orphans {
            if !self.reported_orphans.contains(o) {
                tracing::warn!(
                    host_veth = o,
                    "host veth named like aliasnet's has no lease (left in place; delete it with \
                     `ip link del {o}` if no pod uses it)"
                );
            }
        }
        self.reported_orphans = report.orphans.iter().cloned().collect();
        let n_released = report.released.len() as u64;
        let orphans = &report.orphans;
        let missing_now = report.missing as u64;
        self.ipam.with_reconcile_stats(|r| {
            r.last_run_ms = Some(now);
            r.orphan_veth_count = orphans.len() as u64;
            r.orphan_veths = orphans.iter().take(MAX_ORPHAN_NAMES).cloned().collect();
            r.veth_missing = missing_now;
            r.released += n_released;
        });
        self.ipam.metrics().set_orphan_veths(orphans.len() as u64);
        Ok(report)
    }
}

/// Reconcile now, then every `interval`, until `shutdown`. A zero interval turns the reconcile
/// off (for a daemon that does not run in the node's network namespace: every lease would look
/// stale there).
pub async fn run(
    ipam: Ipam,
    interval: Duration,
    grace: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    if interval.is_zero() {
        tracing::info!("reconcile against the kernel is off (reconcile_interval = \"0s\")");
        return;
    }
    let mut r = Reconciler::new(ipam, grace);
    let mut last_error: Option<String> = None;
    loop {
        match r.pass().await {
            Ok(_) => last_error = None,
            // Said once per distinct error, not every pass.
            Err(e) if last_error.as_deref() != Some(&e.to_string()) => {
                tracing::warn!(error = %e, "reconcile against the kernel failed; will retry");
                last_error = Some(e.to_string());
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}
