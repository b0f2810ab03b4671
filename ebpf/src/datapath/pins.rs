//! Where the datapath is pinned, the lock that serialises its users, and the bpf
//! filesystem under it.
//!
//! The pins are root's alone: bpffs is mounted with mode 0700, the pin directories are
//! created 0700 and must be owned by the user the daemon runs as (a directory another local
//! user created first, on a bpffs mounted world-writable, is refused), and the lock is taken
//! with a deadline, so that whoever holds it cannot freeze pod starts.

use std::{
    fs::{DirBuilder, File, OpenOptions},
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
    time::Duration,
};

use tracing::{info, warn};

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

/// How long ADD, DEL, policy reloads and installs wait for the pin root's lock: far longer
/// than any user holds it (an ADD for milliseconds, an upgrade relinking every pod for about a
/// second), and well under a container runtime's CNI timeout (30 s and more), so a stuck
/// holder produces an error that names it instead of a plugin killed without a word.
pub const PIN_LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// Exclusive lock on the pin root, released when the descriptor closes on drop.
pub(crate) struct Lock {
    _dir: File,
}

impl Lock {
    pub(crate) fn exclusive(root: &Path) -> Result<Self, DatapathError> {
        Self::exclusive_within(root, PIN_LOCK_TIMEOUT)
    }

    fn exclusive_within(root: &Path, deadline: Duration) -> Result<Self, DatapathError> {
        // No symlink is followed: the directory checked is the one locked.
        let dir = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(root)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => not_a_dir(root),
                _ => DatapathError::io("open", root, e),
            })?;
        let md = dir
            .metadata()
            .map_err(|e| DatapathError::io("stat", root, e))?;
        check_owner(root, &md)?;
        match flock(&dir, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => return Ok(Self { _dir: dir }),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
            Err(e) => return Err(DatapathError::io("lock", root, e)),
        }
        // Contended: wait in the kernel's queue, which hands the lock over the moment it is
        // released (polling left it idle while waiters slept, and a burst of ADDs queued
        // behind those pauses). The blocking call runs on a thread so that the wait has a
        // deadline. Its descriptor shares this one's open file, whose lock this is: past the
        // deadline nobody takes the lock from the thread, which then closes the open file's
        // last descriptor and so releases it.
        let waiter = dir
            .try_clone()
            .map_err(|e| DatapathError::io("dup", root, e))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("pin-lock".to_owned())
            .spawn(move || {
                let _ = tx.send(flock(&waiter, libc::LOCK_EX));
            })
            .map_err(|e| DatapathError::io("spawn lock waiter for", root, e))?;
        match rx.recv_timeout(deadline) {
            Ok(Ok(())) => Ok(Self { _dir: dir }),
            Ok(Err(e)) => Err(DatapathError::io("lock", root, e)),
            Err(_) => Err(DatapathError::LockTimeout {
                root: root.to_owned(),
                waited: deadline,
                holder: lock_holder(md.dev(), md.ino()),
            }),
        }
    }
}

/// `flock(2)` on `file`, retried when a signal interrupts it.
fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a valid, owned file descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Who holds the `flock` on the inode `(dev, ino)`, as far as `/proc/locks` tells: "pid N
/// (command, uid U)".
fn lock_holder(dev: u64, ino: u64) -> String {
    let unknown = || "another process (not listed in /proc/locks)".to_owned();
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return unknown();
    };
    let inode = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    // "1: FLOCK  ADVISORY  WRITE 1234 00:2a:567 0 EOF"; a waiter has "->" after the number.
    let pid = locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 6 && f[1] == "FLOCK" && f[5] == inode).then(|| f[4].parse::<i32>().ok())?
    });
    match pid {
        Some(pid) if pid > 0 => {
            let proc = PathBuf::from(format!("/proc/{pid}"));
            let comm = std::fs::read_to_string(proc.join("comm")).unwrap_or_default();
            let uid = std::fs::metadata(&proc).map(|m| m.uid());
            match uid {
                Ok(uid) => format!("pid {pid} ({}, uid {uid})", comm.trim()),
                Err(_) => format!("pid {pid}"),
            }
        }
        Some(_) => "a process of another PID namespace".to_owned(),
        None => unknown(),
    }
}

fn not_a_dir(path: &Path) -> DatapathError {
    DatapathError::UnsafePinDir {
        path: path.to_owned(),
        reason: "is not a directory (a symlink or a file is in its place)".into(),
    }
}

/// A pin directory must belong to the user this process runs as (root): one another local
/// user owns could have its pins replaced or removed by that user.
fn check_owner(path: &Path, md: &std::fs::Metadata) -> Result<(), DatapathError> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        let whose = if me == 0 {
            "root".to_owned()
        } else {
            format!("uid {me}")
        };
        return Err(DatapathError::UnsafePinDir {
            path: path.to_owned(),
            reason: format!("is owned by uid {}, not by {whose}", md.uid()),
        });
    }
    Ok(())
}

/// Checks that `dir` is a directory (not a symlink) of ours.
pub(crate) fn check_pin_dir(dir: &Path) -> Result<std::fs::Metadata, DatapathError> {
    let md = std::fs::symlink_metadata(dir).map_err(|e| DatapathError::io("stat", dir, e))?;
    if !md.is_dir() {
        return Err(not_a_dir(dir));
    }
    check_owner(dir, &md)?;
    Ok(md)
}

/// Creates the pin root and its sub-directories for root alone (0700), or checks the ones
/// that exist: ours, directories, and no longer open to others (an older release created them
/// 0755).
pub(crate) fn create_pin_dirs(pins: &PinPaths) -> Result<(), DatapathError> {
    let root = &pins.root;
    for dir in [
        root.clone(),
        root.join("maps"),
        root.join("progs"),
        root.join("node"),
    ] {
        if let Err(e) = DirBuilder::new().recursive(true).mode(0o700).create(&dir) {
            // An existing symlink or file is reported by the check below.
            if !dir.exists() && std::fs::symlink_metadata(&dir).is_err() {
                return Err(DatapathError::io("create", dir, e));
            }
        }
        let md = check_pin_dir(&dir)?;
        if md.mode() & 0o077 != 0 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| DatapathError::io("chmod", &dir, e))?;
            warn!(path = %dir.display(), was = format!("{:o}", md.mode() & 0o777), "pin directory was open to other users; now 0700");
        }
    }
    Ok(())
}

/// Makes sure `root` lives on a bpf filesystem, mounting bpffs on `/sys/fs/bpf` when `root`
/// is below it and nothing is mounted there yet (fresh machines do not mount it).
pub fn ensure_bpffs(root: &Path) -> Result<(), DatapathError> {
    let sys_bpf = Path::new("/sys/fs/bpf");
    let mut probe = root.to_path_buf();
    while std::fs::symlink_metadata(&probe).is_err() {
        if !probe.pop() {
            break;
        }
    }
    if probe == root && probe.is_symlink() {
        return Err(not_a_dir(root));
    }
    if is_bpffs(&probe)? {
        return Ok(());
    }
    if root.starts_with(sys_bpf) && !is_bpffs(sys_bpf)? {
        info!("mounting bpffs on /sys/fs/bpf (mode 0700)");
        // The kernel's default mode is 1777: any local user could create entries, and the
        // pin root's name first.
        nix::mount::mount(
            Some("bpf"),
            sys_bpf,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            Some("mode=0700"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn held(root: &Path) -> File {
        let f = File::open(root).expect("open");
        flock(&f, libc::LOCK_EX | libc::LOCK_NB).expect("first lock");
        f
    }

    #[test]
    fn a_contended_lock_is_handed_to_the_waiter_when_released() {
        let dir = tempfile::tempdir().expect("tempdir");
        let holder = held(dir.path());
        let root = dir.path().to_owned();
        let waiter = std::thread::spawn(move || Lock::exclusive(&root).map(|_| ()));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "took a lock that was held");
        drop(holder);
        waiter.join().expect("waiter").expect("lock after release");
    }

    #[test]
    fn a_waiter_past_its_deadline_fails_naming_the_holder_and_leaves_the_lock_free() {
        let dir = tempfile::tempdir().expect("tempdir");
        let holder = held(dir.path());
        let err = Lock::exclusive_within(dir.path(), Duration::from_millis(100))
            .err()
            .expect("a held lock was taken");
        let DatapathError::LockTimeout { holder: who, .. } = &err else {
            panic!("unexpected error: {err}");
        };
        assert!(
            who.contains(&std::process::id().to_string()),
            "holder named as {who:?}"
        );
        // The abandoned wait gets the lock once it is released, and gives it up at once.
        drop(holder);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let f = File::open(dir.path()).expect("open");
            if flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "the lock stayed taken after its holder and its timed-out waiter let go"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
