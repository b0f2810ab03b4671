//! The pod's network namespace as the plugin sees it: `CNI_NETNS` opened once (and refused
//! when it is not a pod's network namespace), entered only by short-lived threads: one opens
//! the pod's netlink socket (which stays bound to the namespace), another sets the pod's
//! sysctls. The checks are `aliasnet_netns`'s; this maps their failures to CNI error codes.

use std::os::fd::BorrowedFd;

use aliasnet_cni_types::{code, CniError};
use aliasnet_netns::{NetnsError, Spawned};

/// An open network namespace.
pub struct PodNetns {
    ns: aliasnet_netns::NetNs,
    path: String,
}

impl PodNetns {
    /// Open `CNI_NETNS`. A path that does not exist is code 3 (the container is gone: nothing
    /// to clean up); a path that is not a network namespace, or is the host's own, is code 4.
    pub fn open(path: &str) -> Result<Self, CniError> {
        let ns = aliasnet_netns::NetNs::open(path).map_err(|e| to_cni(path, e))?;
        ns.ensure_not_host().map_err(|e| to_cni(path, e))?;
        Ok(Self {
            ns,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.ns.fd()
    }

    /// The open namespace, for the datapath's attach (which then does not open the path
    /// again).
    pub fn open_ns(&self) -> &aliasnet_netns::NetNs {
        &self.ns
    }

    /// Runs `f` on a short-lived thread inside this namespace: the plugin's own threads never
    /// enter it. Sockets `f` creates stay bound to it.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, CniError> {
        self.ns.run(f).map_err(|e| to_cni(&self.path, e))
    }

    /// Starts `f` on a short-lived thread of `scope` inside this namespace; [`PodNetns::join`]
    /// collects it.
    pub fn spawn<'s, T: Send + 's>(
        &'s self,
        scope: &'s std::thread::Scope<'s, '_>,
        f: impl FnOnce() -> T + Send + 's,
    ) -> Spawned<'s, T> {
        self.ns.spawn(scope, f)
    }

    pub fn join<T>(&self, work: Spawned<'_, T>) -> Result<T, CniError> {
        work.join().map_err(|e| to_cni(&self.path, e))
    }
}

fn to_cni(path: &str, e: NetnsError) -> CniError {
    match e {
        NetnsError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            CniError::new(
                code::UNKNOWN_CONTAINER,
                format!("CNI_NETNS {path} does not exist"),
            )
        }
        NetnsError::Open { source, .. } => CniError::new(
            code::NETNS,
            format!("cannot open CNI_NETNS {path}: {source}"),
        ),
        NetnsError::Stat { source, .. } => CniError::new(
            code::NETNS,
            format!("cannot stat CNI_NETNS {path}: {source}"),
        ),
        NetnsError::NotNetns { what, .. } => CniError::env(format!(
            "CNI_NETNS {path} is not a network namespace ({what})"
        )),
        NetnsError::Host { .. } => CniError::env(format!(
            "CNI_NETNS {path} is the host's network namespace (a process that left its pod, \
             or a stale /proc/<pid>/ns/net whose pid now belongs to a host process)"
        )),
        NetnsError::Own(source) => {
            CniError::new(code::NETNS, format!("cannot open our own netns: {source}"))
        }
        NetnsError::Enter { source, .. } if source.raw_os_error() == Some(libc::EINVAL) => {
            CniError::env(format!("CNI_NETNS {path} is not a network namespace"))
        }
        e => CniError::new(code::NETNS, format!("cannot enter netns {path}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_cni_spec() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("gone");
        let e = PodNetns::open(missing.to_str().unwrap())
            .err()
            .expect("missing");
        assert_eq!(e.code, code::UNKNOWN_CONTAINER, "{}", e.msg);
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = PodNetns::open(file.to_str().unwrap())
            .err()
            .expect("a file");
        assert_eq!(e.code, code::INVALID_ENV, "{}", e.msg);
        assert!(
            e.msg.contains("CNI_NETNS") && e.msg.contains("regular file"),
            "{}",
            e.msg
        );
        let e = PodNetns::open("/proc/self/ns/net").err().expect("our own");
        assert_eq!(e.code, code::INVALID_ENV, "{}", e.msg);
        assert!(e.msg.contains("host's network namespace"), "{}", e.msg);
    }
}
