//! Deleting host links after a release, off the runtime's critical path.
//!
//! Unregistering a veth costs the kernel ~20 ms of RCU grace periods, so Release replies as soon
//! as the release is durable and the link is deleted here. Until it is gone the address stays
//! unallocatable (its /32 host route still points at the old veth).

use std::{future::Future, pin::Pin};

use futures::TryStreamExt;
use netlink_packet_route::link::LinkAttribute;

/// Outcome of one deletion attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    Deleted,
    /// There was no such link (already gone): fine.
    NotFound,
    /// The link is not a veth (a bridge or dummy given our name): left alone.
    NotVeth(String),
}

pub type RemoveFuture<'a> = Pin<Box<dyn Future<Output = Result<Removed, String>> + Send + 'a>>;
pub type ListFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<LinkInfo>, String>> + Send + 'a>>;

/// A network interface of the daemon's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub name: String,
    /// `IFLA_INFO_KIND` ("veth", ...), when the kernel reports one.
    pub kind: Option<String>,
}

/// Deletes and lists host links. The daemon uses [`NetlinkRemover`]; tests can record
/// instead.
pub trait LinkRemover: Send + Sync + 'static {
    fn remove<'a>(&'a self, name: &'a str) -> RemoveFuture<'a>;

    /// Every link (for the reconcile). Without an implementation the reconcile is off and
    /// GC leaves recovered leases to it.
    fn list(&self) -> ListFuture<'_> {
        Box::pin(async { Err("this link remover cannot list links".to_owned()) })
    }
}

/// Deletes links through rtnetlink in the netns the connection was opened in.
pub struct NetlinkRemover {
    handle: rtnetlink::Handle,
}

impl NetlinkRemover {
    /// Open a netlink connection in the calling thread's netns; must run inside a tokio runtime.
    pub fn new() -> std::io::Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    pub fn handle(&self) -> &rtnetlink::Handle {
        &self.handle
    }
}

fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

impl LinkRemover for NetlinkRemover {
    fn list(&self) -> ListFuture<'_> {
        Box::pin(list_links(&self.handle))
    }

    fn remove<'a>(&'a self, name: &'a str) -> RemoveFuture<'a> {
        Box::pin(async move {
            // Only a veth is ever deleted: look the link up, check its kind, then delete that
            // very link by index (off the request path, so the extra round trip costs no pod
            // anything).
            use netlink_packet_route::link::LinkInfo as NlInfo;
            let mut s = self
                .handle
                .link()
                .get()
                .match_name(name.to_owned())
                .execute();
            let msg = match s.try_next().await {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(Removed::NotFound),
                Err(e) if errno(&e) == Some(libc::ENODEV) => return Ok(Removed::NotFound),
                Err(e) => return Err(e.to_string()),
            };
            let kind = msg.attributes.iter().find_map(|a| match a {
                LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
                    NlInfo::Kind(k) => Some(k.to_string()),
                    _ => None,
                }),
                _ => None,
            });
            if kind.as_deref() != Some("veth") {
                return Ok(Removed::NotVeth(kind.unwrap_or_else(|| "no kind".into())));
            }
            match self.handle.link().del(msg.header.index).execute().await {
                Ok(()) => Ok(Removed::Deleted),
                Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(Removed::NotFound),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

/// Every link of the connection's namespace, with its kind.
pub async fn list_links(handle: &rtnetlink::Handle) -> Result<Vec<LinkInfo>, String> {
    use netlink_packet_route::link::LinkInfo as NlInfo;
    let mut s = handle.link().get().execute();
    let mut out = Vec::new();
    while let Some(msg) = s.try_next().await.map_err(|e| e.to_string())? {
        let mut name = None;
        let mut kind = None;
        for a in msg.attributes {
            match a {
                LinkAttribute::IfName(n) => name = Some(n),
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        if let NlInfo::Kind(k) = i {
                            kind = Some(k.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(name) = name {
            out.push(LinkInfo { name, kind });
        }
    }
    Ok(out)
}

/// Whether a link named `name` exists (used by tests and reconcile).
pub async fn link_exists(handle: &rtnetlink::Handle, name: &str) -> Result<bool, String> {
    let mut s = handle.link().get().match_name(name.to_owned()).execute();
    match s.try_next().await {
        Ok(Some(_)) => Ok(true),
        Ok(None) => Ok(false),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}
