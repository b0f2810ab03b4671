//! Deleting host links after a release, off the runtime's critical path.
//!
//! Unregistering a veth costs the kernel ~20 ms of RCU grace periods, so Release replies as soon
//! as the release is durable and the link is deleted here. Until it is gone the address stays
//! unallocatable (its /32 host route still points at the old veth).
//!
//! Netlink is aliasnet-netlink's blocking client: the daemon calls it on tokio's blocking pool
//! ([`remove`], [`list`]).

use std::sync::{Arc, Mutex};

pub use aliasnet_netlink::{Link, Removed};
use aliasnet_netlink::{NetlinkError, Rtnl};

/// Why the host's links could not be read or deleted.
#[derive(Debug, thiserror::Error)]
pub enum LinksError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("this link remover cannot list links")]
    CannotList,
    #[error("the netlink task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Deletes and lists host links; blocking. The daemon uses [`NetlinkRemover`]; tests can record
/// instead.
pub trait LinkRemover: Send + Sync + 'static {
    /// Deletes host link `name` if it is a veth (a link of another kind under a pod's name is
    /// left alone).
    fn remove(&self, name: &str) -> Result<Removed, LinksError>;

    /// Every link (for the reconcile). Without an implementation the reconcile is off and
    /// GC leaves recovered leases to it.
    fn list(&self) -> Result<Vec<Link>, LinksError> {
        Err(LinksError::CannotList)
    }
}

/// [`LinkRemover::remove`] on the blocking pool.
pub async fn remove(remover: Arc<dyn LinkRemover>, name: &str) -> Result<Removed, LinksError> {
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || remover.remove(&name)).await?
}

/// [`LinkRemover::list`] on the blocking pool.
pub async fn list(remover: &Arc<dyn LinkRemover>) -> Result<Vec<Link>, LinksError> {
    let remover = remover.clone();
    tokio::task::spawn_blocking(move || remover.list()).await?
}

/// Deletes links through netlink in the netns the socket was opened in.
pub struct NetlinkRemover {
    rtnl: Mutex<Rtnl>,
}

impl NetlinkRemover {
    /// Opens a netlink socket in the calling thread's netns.
    pub fn new() -> Result<Self, NetlinkError> {
        Ok(Self {
            rtnl: Mutex::new(Rtnl::new()?),
        })
    }

    /// Runs `f` on the remover's socket (one request at a time: RTNL serialises them anyway).
    pub fn with<T>(&self, f: impl FnOnce(&mut Rtnl) -> T) -> T {
        let mut rtnl = self.rtnl.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut rtnl)
    }
}

impl LinkRemover for NetlinkRemover {
    fn list(&self) -> Result<Vec<Link>, LinksError> {
        Ok(self.with(Rtnl::links)?)
    }

    fn remove(&self, name: &str) -> Result<Removed, LinksError> {
        Ok(self.with(|r| r.delete_veth(name))?)
    }
}
