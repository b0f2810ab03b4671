//! Network namespaces: the one place aliasnet calls `setns(2)`.
//!
//! [`NetNs::open`] opens a namespace file without side effects and checks that it is a
//! network namespace; [`NetNs::enter`] runs code on the calling thread inside it and returns
//! to the thread's own namespace; [`run_in`] runs code on a fresh thread that exits
//! afterwards, so nothing else ever runs in the wrong namespace. Only the network namespace
//! changes; the mount namespace (and with it bpffs) stays the caller's.

use std::{
    ffi::CString,
    fs::{File, OpenOptions},
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

/// A namespace that cannot be opened or entered. Messages name the path.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Opening the path failed; `source.kind()` is `NotFound` when nothing is there.
    #[error("open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("stat network namespace {path}: {source}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The path names something else (`what`: a FIFO, a device, another kind of namespace).
    #[error("{path} is not a network namespace ({what})")]
    NotNetns { path: PathBuf, what: &'static str },
    /// The namespace is the caller's own or init's ([`NetNs::ensure_not_host`]).
    #[error(
        "{path} is the host's network namespace (a process that left its pod, or a stale \
         /proc/<pid>/ns/net whose pid now belongs to a host process)"
    )]
    Host { path: PathBuf },
    /// The calling thread's own namespace could not be opened (to compare, or to return to).
    #[error("open the calling thread's network namespace: {0}")]
    Own(#[source] io::Error),
    /// `setns` refused; `EINVAL` means the file is not a network namespace.
    #[error("enter network namespace {path}: {source}")]
    Enter {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Creating a namespace (`unshare`) failed.
    #[error("create a network namespace: {0}")]
    Create(#[source] io::Error),
    #[error("thread working in network namespace {0} panicked")]
    Panicked(PathBuf),
    /// The path names another namespace than the one recorded when the pod was attached
    /// (the pod's namespace is gone and the path was reused, or something was mounted over
    /// it): nothing is done there.
    #[error(
        "{path} is no longer the pod's network namespace (recorded device {want_dev} inode \
         {want_ino}, found device {dev} inode {ino})"
    )]
    Replaced {
        path: PathBuf,
        want_dev: u64,
        want_ino: u64,
        dev: u64,
        ino: u64,
    },
}

impl NetnsError {
    /// Whether the namespace file does not exist (the container is gone).
    pub fn is_not_found(&self) -> bool {
        matches!(self, NetnsError::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// Whether the recorded namespace is gone: nothing at the path, or another namespace.
    pub fn is_gone(&self) -> bool {
        self.is_not_found() || matches!(self, NetnsError::Replaced { .. })
    }
}

/// An open network namespace.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

/// `f_type` of nsfs, where namespace files live.
const NSFS_MAGIC: i64 = 0x6e73_6673;

impl NetNs {
    /// Opens the network namespace at `path` (`/proc/<pid>/ns/net`, `/run/netns/<name>`, ...).
    ///
    /// The path is first opened with `O_PATH`, which neither blocks nor has side effects
    /// whatever it names (a FIFO would block a plain open forever, a device could act on it),
    /// and checked to be an nsfs inode; only then is that very inode reopened (through
    /// `/proc/self/fd`, so the path cannot be swapped in between) for `setns`, and checked to
    /// be a network namespace.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, NetnsError> {
        let path = path.as_ref();
        let not_netns = |what| NetnsError::NotNetns {
            path: path.to_owned(),
            what,
        };
        let cpath = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| not_netns("it contains a NUL byte"))?;
        // SAFETY: plain syscall on a NUL-terminated path; the fd is owned right below.
        let raw = unsafe { libc::open(cpath.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(NetnsError::Open {
                path: path.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: `raw` is a fresh fd nobody else owns.
        let opath = unsafe { OwnedFd::from_raw_fd(raw) };
        // A netns file lives on nsfs; anything else (a FIFO, a device, a regular file) is not one.
        // SAFETY: fstatfs writes into the zeroed struct we own; the fd is valid for the call.
        let magic = unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            if libc::fstatfs(opath.as_raw_fd(), &mut st) != 0 {
                return Err(NetnsError::Stat {
                    path: path.to_owned(),
                    source: io::Error::last_os_error(),
                });
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
            .map_err(|source| NetnsError::Open {
                path: path.to_owned(),
                source,
            })?;
        // SAFETY: an ioctl without argument on a valid nsfs fd.
        let nstype = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_NSTYPE) };
        if nstype != libc::CLONE_NEWNET {
            return Err(not_netns("another kind of namespace"));
        }
        Ok(Self {
            file,
            path: path.to_owned(),
        })
    }

    /// Refuses the calling thread's own namespace and init's (a plugin run from a container
    /// has its own): a stale `/proc/<pid>/ns/net` whose pid now belongs to a host process
    /// resolves to the host's namespace.
    pub fn ensure_not_host(&self) -> Result<(), NetnsError> {
        let own = File::open("/proc/thread-self/ns/net").map_err(NetnsError::Own)?;
        let init = File::open("/proc/1/ns/net").ok();
        if same_file(&self.file, &own) || init.is_some_and(|i| same_file(&self.file, &i)) {
            return Err(NetnsError::Host {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's identity: the device and inode of its nsfs file.
    pub fn identity(&self) -> Result<(u64, u64), NetnsError> {
        let m = self.file.metadata().map_err(|source| NetnsError::Stat {
            path: self.path.clone(),
            source,
        })?;
        Ok((m.dev(), m.ino()))
    }

    /// Opens the namespace at `path` only if it is still the one whose identity
    /// ([`NetNs::identity`]) was recorded as (`dev`, `ino`): a path kept in a record may since
    /// name another namespace, and work meant for the recorded one must not happen there.
    /// The check is on the open file, so the path cannot be swapped after it.
    pub fn open_recorded(path: impl AsRef<Path>, dev: u64, ino: u64) -> Result<Self, NetnsError> {
        let ns = Self::open(path)?;
        let (have_dev, have_ino) = ns.identity()?;
        if (have_dev, have_ino) != (dev, ino) {
            return Err(NetnsError::Replaced {
                path: ns.path.clone(),
                want_dev: dev,
                want_ino: ino,
                dev: have_dev,
                ino: have_ino,
            });
        }
        Ok(ns)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Runs `f` with the calling thread inside this namespace, then returns to the thread's
    /// own. Sockets created by `f` stay bound to this namespace.
    ///
    /// # Panics
    /// If the thread cannot return to its namespace: carrying on would configure the
    /// caller's namespace through this one.
    pub fn enter<T>(&self, f: impl FnOnce() -> T) -> Result<T, NetnsError> {
        let home = File::open("/proc/thread-self/ns/net").map_err(NetnsError::Own)?;
        setns(self.file.as_fd()).map_err(|source| NetnsError::Enter {
            path: self.path.clone(),
            source,
        })?;
        let out = f();
        if let Err(e) = setns(home.as_fd()) {
            panic!(
                "cannot return to the original netns after entering {}: {e}",
                self.path.display()
            );
        }
        Ok(out)
    }

    /// Runs `f` on a fresh thread inside this namespace; the thread exits afterwards.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
        std::thread::scope(|s| self.spawn(s, f).join())
    }

    /// Starts `f` on a fresh thread of `scope` inside this namespace, for the caller to work
    /// meanwhile and [`Spawned::join`] it later; the thread exits when `f` returns.
    pub fn spawn<'scope, T: Send + 'scope>(
        &'scope self,
        scope: &'scope std::thread::Scope<'scope, '_>,
        f: impl FnOnce() -> T + Send + 'scope,
    ) -> Spawned<'scope, T> {
        let handle = scope.spawn(move || {
            setns(self.file.as_fd()).map_err(|source| NetnsError::Enter {
                path: self.path.clone(),
                source,
            })?;
            Ok(f())
        });
        Spawned {
            handle,
            path: &self.path,
        }
    }
}

/// Work running inside a namespace ([`NetNs::spawn`]).
pub struct Spawned<'scope, T> {
    handle: std::thread::ScopedJoinHandle<'scope, Result<T, NetnsError>>,
    path: &'scope Path,
}

impl<T> Spawned<'_, T> {
    /// Waits for the work's result.
    pub fn join(self) -> Result<T, NetnsError> {
        self.handle
            .join()
            .map_err(|_| NetnsError::Panicked(self.path.to_owned()))?
    }
}

/// Runs `f` on a fresh thread inside the network namespace at `path` (see [`NetNs::open`]).
pub fn run_in<T: Send>(
    path: impl AsRef<Path>,
    f: impl FnOnce() -> T + Send,
) -> Result<T, NetnsError> {
    NetNs::open(path)?.run(f)
}

/// Runs `f` on a fresh thread inside a new, empty network namespace, which (with everything
/// created in it) vanishes when the thread exits. For probes that must not touch the node.
pub fn run_in_new<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare only changes this thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(NetnsError::Create(io::Error::last_os_error()));
            }
            Ok(f())
        })
        .join()
        .map_err(|_| NetnsError::Panicked(PathBuf::from("(new)")))?
    })
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

    /// `NetNs::open(path)` plus the host check within a second, or a panic: the hostile
    /// cases must not hang.
    fn open_quickly(path: &str) -> Result<(), String> {
        let (tx, rx) = mpsc::channel();
        let p = path.to_owned();
        std::thread::spawn(move || {
            let r = NetNs::open(&p).and_then(|ns| ns.ensure_not_host());
            let _ = tx.send(r.map_err(|e| e.to_string()));
        });
        rx.recv_timeout(Duration::from_secs(1))
            .unwrap_or_else(|_| panic!("opening {path} hung"))
    }

    #[test]
    fn hostile_netns_paths_are_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.to_str().unwrap()).unwrap();
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
        let e = NetNs::open(dir.path().join("missing")).unwrap_err();
        assert!(e.is_not_found(), "{e}");
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
    fn a_real_pod_netns_opens_and_runs_code() {
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
        let path = format!("/proc/self/task/{tid}/ns/net");
        let r = open_quickly(&path);
        assert!(r.is_ok(), "{r:?}");
        let ino = |p: &str| std::fs::metadata(p).unwrap().ino();
        let inside = run_in(&path, || ino("/proc/thread-self/ns/net")).unwrap();
        assert_eq!(inside, ino(&path));
        let ns = NetNs::open(&path).unwrap();
        let home = ino("/proc/thread-self/ns/net");
        assert_eq!(
            ns.enter(|| ino("/proc/thread-self/ns/net")).unwrap(),
            inside
        );
        assert_eq!(
            ino("/proc/thread-self/ns/net"),
            home,
            "back home after enter"
        );
        drop(done_tx);
        let fresh = run_in_new(|| ino("/proc/thread-self/ns/net")).unwrap();
        assert!(fresh != home && fresh != inside);
    }
}
