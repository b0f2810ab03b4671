//! Where the datapath is pinned, the lock that serialises its users, and the bpf
//! filesystem under it.

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use tracing::info;

use crate::error::DatapathError;

/// Default pin root.
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/aliasnet";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Pin paths under a root.
#[derive(Debug, Clone)]
pub struct PinPaths {
    pub root: PathBuf,
}

impl PinPaths {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn map(&self, name: &str) -> PathBuf {
        self.root.join("maps").join(name)
    }
    pub fn prog(&self, name: &str) -> PathBuf {
        self.root.join("progs").join(name)
    }
    pub fn uplink_link(&self) -> PathBuf {
        self.root.join("node").join("uplink")
    }
    /// The TCX link of the uplink's ingress program (node download limits).
    pub fn uplink_in_link(&self) -> PathBuf {
        self.root.join("node").join("uplink_in")
    }
}

/// Exclusive lock on the pin root, released when the descriptor closes on drop.
pub(crate) struct Lock {
    _dir: File,
}

impl Lock {
    pub(crate) fn exclusive(root: &Path) -> Result<Self, DatapathError> {
        let dir = File::open(root).map_err(|e| DatapathError::io("open", root, e))?;
        loop {
            // SAFETY: flock on a valid, owned file descriptor.
            let rc = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(Self { _dir: dir });
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(DatapathError::io("lock", root, err));
            }
        }
    }
}

/// Makes sure `root` lives on a bpf filesystem, mounting bpffs on `/sys/fs/bpf` when `root`
/// is below it and nothing is mounted there yet (fresh machines do not mount it).
pub fn ensure_bpffs(root: &Path) -> Result<(), DatapathError> {
    let sys_bpf = Path::new("/sys/fs/bpf");
    let mut probe = root.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    if is_bpffs(&probe)? {
        return Ok(());
    }
    if root.starts_with(sys_bpf) && !is_bpffs(sys_bpf)? {
        info!("mounting bpffs on /sys/fs/bpf");
        nix::mount::mount(
            Some("bpf"),
            sys_bpf,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|source| DatapathError::MountBpffs {
            path: sys_bpf.to_owned(),
            source,
        })?;
        return Ok(());
    }
    Err(DatapathError::NotBpffs {
        path: root.to_owned(),
    })
}

fn is_bpffs(path: &Path) -> Result<bool, DatapathError> {
    let st = nix::sys::statfs::statfs(path)
        .map_err(|e| DatapathError::io("statfs", path, std::io::Error::from(e)))?;
    Ok(st.filesystem_type().0 as i64 == BPF_FS_MAGIC)
}
