//! The pod's network namespace: opened once, entered only briefly by the calling thread to
//! create a netlink socket bound to it.

use std::{
    fs::{File, OpenOptions},
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt},
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
    ///
    /// The path is first opened with `O_PATH`, which neither blocks nor has side effects
    /// whatever it names (a FIFO would block a plain open forever, a device could act on it),
    /// and checked to be an nsfs inode; only then is that very inode reopened (through
    /// `/proc/self/fd`, so the path cannot be swapped in between) for `setns`, and checked to
    /// be a network namespace. A stale `/proc/<pid>/ns/net` whose pid now belongs to a host
    /// process resolves to the host's namespace and is refused like it.
    pub fn open(path: &str) -> Result<Self, CniError> {
        let not_netns = |what: &str| {
            CniError::env(format!(
                "CNI_NETNS {path} is not a network namespace ({what})"
            ))
        };
        let cpath =
            std::ffi::CString::new(path).map_err(|_| not_netns("it contains a NUL byte"))?;
        // SAFETY: plain syscall on a NUL-terminated path; the fd is owned right below.
        let raw = unsafe { libc::open(cpath.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.kind() {
                io::ErrorKind::NotFound => CniError::new(
                    code::UNKNOWN_CONTAINER,
                    format!("CNI_NETNS {path} does not exist"),
                ),
                _ => CniError::new(code::NETNS, format!("cannot open CNI_NETNS {path}: {e}")),
            });
        }
        // SAFETY: `raw` is a fresh fd nobody else owns.
        let opath = unsafe { OwnedFd::from_raw_fd(raw) };
        // A netns file lives on nsfs; anything else (a FIFO, a device, a regular file) is not one.
        const NSFS_MAGIC: i64 = 0x6e73_6673;
        // SAFETY: fstatfs writes into the zeroed struct we own; the fd is valid for the call.
        let magic = unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            if libc::fstatfs(opath.as_raw_fd(), &mut st) != 0 {
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
            let kind = std::fs::metadata(format!("/proc/self/fd/{}", opath.as_raw_fd()))
                .map(|m| {
                    let t = m.file_type();
                    if t.is_fifo() {
                        "a FIFO"
                    } else if t.is_dir() {
                        "a directory"
                    } else if t.is_file() {
                        "a regular file"
                    } else {
                        "a device or socket"
                    }
                })
                .unwrap_or("not nsfs");
            return Err(not_netns(kind));
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", opath.as_raw_fd()))
            .map_err(|e| {
                CniError::new(code::NETNS, format!("cannot open CNI_NETNS {path}: {e}"))
            })?;
        // SAFETY: an ioctl without argument on a valid nsfs fd.
        let nstype = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_NSTYPE) };
        if nstype != libc::CLONE_NEWNET {
            return Err(not_netns("another kind of namespace"));
        }
        let ns = Self {
            file,
            path: path.to_owned(),
        };
        let own = File::open("/proc/thread-self/ns/net")
            .map_err(|e| CniError::new(code::NETNS, format!("cannot open our own netns: {e}")))?;
        // The host's namespace is ours, and init's (a plugin run from a container has its own).
        let init = File::open("/proc/1/ns/net").ok();
        if same_file(&ns.file, &own) || init.is_some_and(|i| same_file(&ns.file, &i)) {
            return Err(CniError::env(format!(
                "CNI_NETNS {path} is the host's network namespace (a process that left its pod, \
                 or a stale /proc/<pid>/ns/net whose pid now belongs to a host process)"
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

#[cfg(test)]
mod tests {
    use std::{sync::mpsc, time::Duration};

    use super::*;

    /// `NetNs::open(path)` within a second, or a panic: the hostile cases must not hang.
    fn open_quickly(path: &str) -> Result<(), String> {
        let (tx, rx) = mpsc::channel();
        let p = path.to_owned();
        std::thread::spawn(move || {
            let _ = tx.send(NetNs::open(&p).map(|_| ()).map_err(|e| e.msg));
        });
        rx.recv_timeout(Duration::from_secs(1))
            .unwrap_or_else(|_| panic!("opening {path} hung"))
    }

    #[test]
    fn hostile_netns_paths_are_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: plain syscall on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let to_fifo = dir.path().join("to-fifo");
        std::os::unix::fs::symlink(&fifo, &to_fifo).unwrap();
        let to_zero = dir.path().join("to-zero");
        std::os::unix::fs::symlink("/dev/zero", &to_zero).unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        for (p, want) in [
            (fifo.to_str().unwrap(), "FIFO"),
            (to_fifo.to_str().unwrap(), "FIFO"),
            (to_zero.to_str().unwrap(), "device"),
            (file.to_str().unwrap(), "regular file"),
            ("/proc/self/ns/mnt", "another kind of namespace"),
        ] {
            let e = open_quickly(p).unwrap_err();
            assert!(
                e.contains("not a network namespace") && e.contains(want),
                "{p}: {e}"
            );
        }
        // A pid reused by a host process: its /proc/<pid>/ns/net is the host's namespace.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let e = open_quickly(&format!("/proc/{}/ns/net", child.id())).unwrap_err();
        let _ = child.kill();
        let _ = child.wait();
        assert!(e.contains("host's network namespace"), "{e}");
    }

    #[test]
    fn a_real_pod_netns_opens() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "needs root (unshare of a network namespace)"
        );
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            // SAFETY: unshare only changes this thread's network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            // SAFETY: gettid has no preconditions.
            let _ = tx.send(unsafe { libc::gettid() });
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let r = open_quickly(&format!("/proc/self/task/{tid}/ns/net"));
        drop(done_tx);
        assert!(r.is_ok(), "{r:?}");
    }
}
