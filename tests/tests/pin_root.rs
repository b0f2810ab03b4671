//! The pin root against local users: bpffs mounted for root only, pin directories 0700 and
//! owned by root (one another user created first is refused), and the pin-root lock taken
//! with a deadline: a held lock fails ADD, DEL and policy reloads with an error naming the
//! holder instead of freezing them until the runtime kills the plugin.
//!
//! Each test works on a bpffs of its own in a private mount namespace (mounted over
//! `/sys/fs/bpf` there, where the product mounts it), so the node's pins are never touched.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use aliasnet_ebpf::{ensure_bpffs, Datapath};
use aliasnet_tests::{mountns::MountNs, require_root};

const BPF: &str = "/sys/fs/bpf";
const NOBODY: u32 = 65534;

/// A mount namespace whose `/sys/fs/bpf` is hidden under an empty tmpfs.
fn without_bpffs() -> MountNs {
    require_root();
    let ns = MountNs::new().unwrap();
    ns.tmpfs(Path::new(BPF), "size=64k,mode=0755").unwrap();
    ns
}

/// A mount namespace with a fresh bpffs on `/sys/fs/bpf`, mounted the way the kernel does
/// without options (mode 1777, as `mount -t bpf bpf /sys/fs/bpf` leaves it).
fn with_default_bpffs() -> MountNs {
    let ns = without_bpffs();
    ns.run(|| {
        nix::mount::mount(
            Some("bpf"),
            BPF,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount bpffs")
    });
    ns
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn bpffs_is_mounted_for_root_only_and_pin_directories_are_0700() {
    let ns = without_bpffs();
    ns.run(|| {
        let root = PathBuf::from(BPF).join("aliasnet");
        ensure_bpffs(&root).expect("mount bpffs");
        // bpffs always sets the sticky bit on its root.
        assert_eq!(
            mode(Path::new(BPF)) & 0o777,
            0o700,
            "bpffs mounted by aliasnet must be root's only"
        );
        Datapath::install(&root).expect("install");
        for d in ["", "maps", "progs", "node"] {
            let p = root.join(d);
            let md = std::fs::symlink_metadata(&p).unwrap();
            assert_eq!(
                (mode(&p), md.uid()),
                (0o700, 0),
                "{} must be root's only",
                p.display()
            );
        }
    });
}

#[test]
fn a_pin_root_another_user_created_is_refused_and_an_old_one_is_tightened() {
    let ns = with_default_bpffs();
    ns.run(|| {
        // A local user was first: on a mode-1777 bpffs anyone may create the directory.
        let root = PathBuf::from(BPF).join("aliasnet");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::chown(&root, Some(NOBODY), Some(NOBODY)).unwrap();
        let e = match Datapath::install(&root) {
            Ok(_) => panic!("installed into a pin root owned by uid {NOBODY}"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains(&root.display().to_string()) && e.contains(&format!("uid {NOBODY}")),
            "the error names the directory and its owner: {e}"
        );
        assert!(
            std::fs::read_dir(&root).unwrap().next().is_none(),
            "nothing was pinned there"
        );
        // So does a sub-directory of a root-owned pin root.
        std::fs::remove_dir(&root).unwrap();
        std::fs::create_dir_all(root.join("maps")).unwrap();
        std::os::unix::fs::chown(root.join("maps"), Some(NOBODY), Some(NOBODY)).unwrap();
        let e = Datapath::install(&root).err().expect("refused").to_string();
        assert!(
            e.contains("maps") && e.contains(&format!("uid {NOBODY}")),
            "{e}"
        );
        std::fs::remove_dir(root.join("maps")).unwrap();

        // A symlink planted in its place is refused too.
        std::fs::remove_dir(&root).unwrap();
        std::os::unix::fs::symlink("/tmp", &root).unwrap();
        let e = Datapath::install(&root).err().expect("refused").to_string();
        assert!(
            e.contains("not a directory") || e.contains("symlink"),
            "{e}"
        );
        std::fs::remove_file(&root).unwrap();

        // A root-owned pin root of an older release (0755) is tightened.
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        Datapath::install(&root).expect("install");
        assert_eq!(mode(&root), 0o700);
    });
}

/// Runs `f` on a thread of the namespace; `None` if it has not returned after `limit`.
fn within<T: Send + 'static>(
    ns: &MountNs,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<(T, Duration)> {
    let (tx, rx) = mpsc::channel();
    // The namespace's own thread spawns the worker, which inherits its mounts.
    ns.run(move || {
        std::thread::spawn(move || {
            let start = Instant::now();
            let out = f();
            let _ = tx.send((out, start.elapsed()));
        });
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn a_user_cannot_take_the_pin_root_lock_and_a_held_lock_fails_in_time_naming_its_holder() {
    let ns = with_default_bpffs();
    let root = PathBuf::from(BPF).join("aliasnet");
    let r = root.clone();
    ns.run(move || Datapath::install(&r).map(|_| ()).expect("install"));

    // An unprivileged user cannot open the pin root, let alone lock it.
    let r = root.clone();
    let out = ns.run(move || {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "flock",
                "-n",
            ])
            .arg(&r)
            .arg("true")
            .output()
            .expect("setpriv")
    });
    assert!(
        !out.status.success(),
        "uid {NOBODY} took the pin root's lock: {out:?}"
    );

    // A holder (here a root process that hangs): ADD, DEL and reloads give up in time and say
    // who holds it.
    let r = root.clone();
    let mut holder = ns.run(move || {
        Command::new("flock")
            .arg(&r)
            .args(["sleep", "60"])
            .stdin(Stdio::null())
            .spawn()
            .expect("flock")
    });
    let pid = holder.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(&pid.to_string()))
    {
        assert!(Instant::now() < deadline, "flock never took the lock");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = root.clone();
    let res = within(&ns, Duration::from_secs(25), move || {
        let mut dp = Datapath::open(&r)?;
        dp.detach_pod("c0ffee", "eth0")
    });
    let _ = holder.kill();
    let _ = holder.wait();
    let Some((res, took)) = res else {
        panic!("detach still waiting for the pin root's lock after 25 s");
    };
    let e = match res {
        Ok(found) => panic!("detach went through a held lock (found: {found})"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(&format!("pid {pid}")) && e.contains(&root.display().to_string()),
        "the error names the pin root and the holder's pid {pid}: {e}"
    );
    assert!(
        took <= aliasnet_ebpf::PIN_LOCK_TIMEOUT + Duration::from_secs(2),
        "gave up after {took:?}"
    );
    eprintln!("after {took:?}: {e}");
}

/// The lock's users wait for installs only while they pin: the verifier, which takes seconds
/// (more than the lock's deadline on a busy node), runs without it. Two installers run side by
/// side (shaperd restarted while another start is still loading) while a CNI-side caller
/// takes the lock the way DEL and ADD do; every acquisition during the installs is timed.
#[test]
fn the_pin_root_lock_is_not_held_while_the_verifier_runs() {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };
    const ROUNDS: usize = 3;
    const BOUND: Duration = Duration::from_secs(2);

    let ns = with_default_bpffs();
    let root = PathBuf::from(BPF).join("aliasnet");
    // The first install pins what the CNI side opens.
    let r = root.clone();
    ns.run(move || Datapath::install(&r).map(|_| ()).expect("install"));

    let installing = Arc::new(AtomicBool::new(true));
    let (tx, rx) = mpsc::channel();
    for who in 0..2 {
        let (r, tx) = (root.clone(), tx.clone());
        ns.run(move || {
            std::thread::spawn(move || {
                let mut took = Vec::new();
                for _ in 0..ROUNDS {
                    let start = Instant::now();
                    let res = Datapath::install(&r).map(|(_, report)| report);
                    took.push(start.elapsed());
                    if let Err(e) = res {
                        let _ = tx.send(Err(format!("installer {who}: {e}")));
                        return;
                    }
                }
                let _ = tx.send(Ok(took));
            });
        });
    }
    drop(tx);
    let (r, busy) = (root.clone(), installing.clone());
    let locker = ns.run(move || {
        std::thread::spawn(move || {
            let mut dp = Datapath::open(&r).expect("open");
            let mut waits = Vec::new();
            while busy.load(Ordering::Relaxed) {
                // A pod that is not attached: the call is the lock and one lookup.
                let start = Instant::now();
                let res = dp.detach_pod("c0ffee", "eth0");
                waits.push((start.elapsed(), res.map_err(|e| e.to_string())));
                std::thread::sleep(Duration::from_millis(5));
            }
            waits
        })
    });
    let mut installs = Vec::new();
    for res in rx.iter() {
        installs.extend(res.unwrap_or_else(|e| panic!("{e}")));
    }
    installing.store(false, Ordering::Relaxed);
    let waits = locker.join().expect("the CNI-side caller panicked");
    for (_, res) in &waits {
        assert!(matches!(res, Ok(false)), "a CNI-side call failed: {res:?}");
    }
    let max = waits.iter().map(|(w, _)| *w).max().unwrap_or_default();
    let shortest = installs.iter().min().copied().unwrap_or_default();
    eprintln!(
        "{} installs of {:?}..{:?}; {} lock acquisitions meanwhile, longest {max:?}",
        installs.len(),
        shortest,
        installs.iter().max().copied().unwrap_or_default(),
        waits.len()
    );
    assert_eq!(installs.len(), 2 * ROUNDS);
    // The lock covers opening the maps and pinning: a small part of an install on any
    // machine, the verifier being the rest.
    assert!(
        max < BOUND.min(shortest / 4),
        "a CNI-side call waited {max:?} for the pin root's lock while installs of {shortest:?} and more ran"
    );
    assert!(
        waits.len() >= 10,
        "only {} acquisitions during the installs",
        waits.len()
    );

    // The concurrent installs left one complete, consistent set: it opens, and a further
    // install finds every program pinned with its own code.
    let r = root.clone();
    let report = ns.run(move || Datapath::install(&r).expect("install").1);
    assert!(
        report.created_maps.is_empty()
            && report.pinned_programs.is_empty()
            && report.upgraded_programs.is_empty(),
        "{report:?}"
    );
}
