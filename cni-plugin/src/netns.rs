//! The pod's network namespace: opened once, entered only briefly by the calling thread to
//! create a netlink socket bound to it.

use std::{
    fs::File,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    os::unix::fs::MetadataExt,
};

use aliasnet_cni_types::{code, CniError};

/// An open network namespace.
pub struct NetNs {
    file: File,
    path: String,
}

impl NetNs {
    /// Open `CNI_NETNS`. A path that does not exist is code 3 (the container is gone: nothing
    /// to clean up); a path that is not a network namespace, or is the host's own, is code 4.
    pub fn open(path: &str) -> Result<Self, CniError> {
        let file = File::open(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => CniError::new(
                code::UNKNOWN_CONTAINER,
                format!("CNI_NETNS {path} does not exist"),
            ),
            _ => CniError::new(code::NETNS, format!("cannot open CNI_NETNS {path}: {e}")),
        })?;
        // A netns file lives on nsfs; anything else (a typo pointing at a regular file) is not one.
        const NSFS_MAGIC: i64 = 0x6e73_6673;
        // SAFETY: fstatfs writes into the zeroed struct we own; the fd is valid for the call.
        let magic = unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            if libc::fstatfs(file.as_raw_fd(), &mut st) != 0 {
                return Err(CniError::new(
                    code::NETNS,
                    format!(
                        "cannot stat CNI_NETNS {path}: {}",
                        io::Error::last_os_error()
                    ),
                ));
            }
            st.f_type as i64
        };
        if magic != NSFS_MAGIC {
            return Err(CniError::env(format!(
                "CNI_NETNS {path} is not a network namespace"
            )));
        }
        let ns = Self {
            file,
            path: path.to_owned(),
        };
        let own = File::open("/proc/thread-self/ns/net")
            .map_err(|e| CniError::new(code::NETNS, format!("cannot open our own netns: {e}")))?;
        if same_file(&ns.file, &own) {
            return Err(CniError::env(format!(
                "CNI_NETNS {path} is the plugin's own (host) network namespace"
            )));
        }
        Ok(ns)
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Run `f` with the calling thread inside this namespace, then return to the original
    /// one. Sockets created by `f` stay bound to this namespace.
    pub fn enter<T>(&self, f: impl FnOnce() -> T) -> Result<T, CniError> {
        let home = File::open("/proc/thread-self/ns/net")
            .map_err(|e| CniError::new(code::NETNS, format!("cannot open our own netns: {e}")))?;
        setns(self.file.as_fd()).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => CniError::env(format!(
                "CNI_NETNS {} is not a network namespace",
                self.path
            )),
            _ => CniError::new(
                code::NETNS,
                format!("cannot enter netns {}: {e}", self.path),
            ),
        })?;
        let out = f();
        if let Err(e) = setns(home.as_fd()) {
            // Carrying on would configure the host through the pod's namespace.
            panic!(
                "cannot return to the host netns after entering {}: {e}",
                self.path
            );
        }
        Ok(out)
    }
}

fn setns(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall on a valid fd; it only changes this thread's netns.
    if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn same_file(a: &File, b: &File) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
