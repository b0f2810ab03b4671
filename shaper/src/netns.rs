//! Running code in another network namespace.
//!
//! `setns` changes the namespace of the calling thread only, so the work runs on a scoped
//! thread that exits afterwards: nothing else ever runs in the wrong namespace. Only the
//! network namespace changes; the mount namespace (and with it bpffs) stays the caller's.

use std::{
    fs::File,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use nix::sched::{setns, CloneFlags};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("enter network namespace {path}: {source}")]
    Enter {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("thread working in network namespace {0} panicked")]
    Panicked(PathBuf),
}

/// Runs `f` on a fresh thread inside the network namespace at `path`
/// (`/proc/<pid>/ns/net`, `/run/netns/<name>`, ...).
pub fn run_in<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    let ns = File::open(path).map_err(|source| NetnsError::Open {
        path: path.to_owned(),
        source,
    })?;
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
                path: path.to_owned(),
                source,
            })?;
            Ok(f())
        })
        .join()
        .map_err(|_| NetnsError::Panicked(path.to_owned()))?
    })
}
