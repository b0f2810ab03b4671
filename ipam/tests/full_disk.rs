//! A full disk, then a crash. The state directory is a small tmpfs in a mount namespace of
//! the test's own; a client allocates and releases until the log is about to reach the size
//! at which the daemon compacts, the rest of the tmpfs is then filled, and the churn goes on
//! into ENOSPC: the compaction's new log cannot be created, appends start failing. Then
//! `kill -9` and a restart on the still-full disk: the daemon starts and holds exactly the
//! acknowledged leases, and it did not retry the failing compaction after every request.

mod common;

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use aliasnet_ipam_proto::{
    AttachmentKey, Client, ClientError, ErrorKind, Lease, Request, Response,
};
use aliasnet_tests::mountns::MountNs;
use common::*;

/// The daemon compacts once the logs since the last snapshot exceed this (8 MiB).
const COMPACT_AT: u64 = 8 << 20;

fn key_of(i: usize) -> AttachmentKey {
    // Long container ids make the log grow fast with few requests; a batch (one request at a
    // time here) stays well under a page.
    AttachmentKey::new("net", &format!("{i:06}-{}", "c".repeat(600)), "eth0")
}

fn alloc(i: usize) -> Request {
    match alloc_req("x", None) {
        Request::Allocate { pod, .. } => Request::Allocate {
            key: key_of(i),
            pod,
            pool: None,
            host_veth: None,
            families: None,
        },
        _ => unreachable!(),
    }
}

/// The daemon, started in the mount namespace, its stderr collected as it runs.
struct Daemon {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Daemon {
    fn start(ns: &MountNs, config: &Path, socket: &Path) -> Self {
        let config = config.to_owned();
        let mut child = ns.run(move || {
            daemon_command(&["--config", config.to_str().unwrap()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        if let Err(e) =
            aliasnet_tests::ipamd::wait_ready(socket, &mut child, Duration::from_secs(20))
        {
            std::thread::sleep(Duration::from_millis(100));
            panic!("{e}: {}", stderr.lock().unwrap());
        }
        Self { child, stderr }
    }

    fn kill(mut self) -> String {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let s = self.stderr.lock().unwrap().clone();
        s
    }
}

/// Total size of the logs in `dir`, and the length of log 0.
fn log_sizes(ns: &MountNs, dir: &Path) -> (Vec<String>, u64) {
    let dir = dir.to_owned();
    ns.run(move || {
        let mut names = Vec::new();
        let mut log0 = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if name == aliasnet_ipam::store::log_name(0) {
                log0 = e.metadata().unwrap().len();
            }
            names.push(name);
        }
        names.sort();
        (names, log0)
    })
}

/// Writes `path` until the filesystem is full; returns the bytes written.
fn fill(ns: &MountNs, path: PathBuf) -> u64 {
    ns.run(move || {
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0xa5u8; 4096];
        let mut n = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(k) => n += k as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // What did not fit in a page cache flush fails here, if anywhere.
        let _ = f.sync_all();
        n
    })
}

#[test]
fn a_full_disk_then_kill_9_loses_no_acknowledged_lease_and_the_daemon_starts() {
    aliasnet_tests::require_root();
    let ns = MountNs::new().unwrap();
    let env = Env::new("cooldown = \"0s\"", "cidrs = [\"10.240.0.0/16\"]");
    let state = env.state_dir().to_path_buf();
    std::fs::create_dir_all(&state).unwrap();
    ns.tmpfs(&state, "size=16m,mode=0700").unwrap();
    let ballast = state.join("ballast");
    let socket = env.socket();
    let d = Daemon::start(&ns, &env.config_path(), &socket);
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();

    // Acknowledged leases by key index; a refused change leaves the map as it was.
    let mut acked: BTreeMap<usize, Lease> = BTreeMap::new();
    let mut failures = 0usize;
    let mut filled = None;
    let mut i = 0usize;
    // Past the first failure, this many more requests (each its own batch).
    let mut after_failure = 200usize;
    while after_failure > 0 {
        assert!(i < 100_000, "the disk never filled");
        let step = [Request::Release {
            key: key_of(i.wrapping_sub(4)),
            teardown_link: None,
        }];
        let reqs: &[Request] = if i >= 4 { &step } else { &[] };
        for r in reqs.iter().cloned().chain([alloc(i)]) {
            let releasing = matches!(r, Request::Release { .. });
            match c.call(&r) {
                Ok(Response::Allocated { lease, .. }) => {
                    acked.insert(i, lease);
                }
                Ok(Response::Released { .. }) => {
                    acked.remove(&(i - 4));
                }
                Ok(other) => panic!("{other:?}"),
                Err(ClientError::Refused {
                    kind: ErrorKind::Storage,
                    message,
                }) => {
                    assert!(message.contains("No space left"), "{message}");
                    assert!(filled.is_some(), "ENOSPC before the tmpfs was filled");
                    failures += 1;
                    if releasing {
                        // Still leased: the release was not made.
                        assert!(acked.contains_key(&(i - 4)));
                    }
                }
                Err(e) => panic!("request {i}: {e}"),
            }
            if failures > 0 {
                after_failure -= 1;
            }
        }
        // Fill the disk once the log holds nearly enough to compact and its pre-allocated
        // zeros reach past that size: the churn then crosses it on a full disk.
        if filled.is_none() && i.is_multiple_of(64) {
            let (_, log0) = log_sizes(&ns, &state);
            if log0 > COMPACT_AT {
                filled = Some(fill(&ns, ballast.clone()));
            }
        }
        i += 1;
    }
    let (files, _) = log_sizes(&ns, &state);
    let log = d.kill();
    eprintln!(
        "{i} allocations, {failures} refused for ENOSPC, {} acknowledged leases, ballast {} \
         bytes; files after kill -9: {files:?}",
        acked.len(),
        filled.unwrap()
    );
    let retries = log
        .lines()
        .filter(|l| l.contains("compaction postponed") || l.contains("snapshot failed"))
        .count();
    assert!(
        retries >= 1,
        "the churn crossed the compaction size on a full disk: {log}"
    );
    assert!(
        retries <= 2,
        "a failed compaction was retried {retries} times in {failures} failed requests instead \
         of backing off"
    );

    // Restart on the still-full disk.
    let d = Daemon::start(&ns, &env.config_path(), &socket);
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    let Response::Leases { mut leases } = c.call(&Request::List).unwrap() else {
        panic!()
    };
    let mut want: Vec<Lease> = acked.into_values().collect();
    leases.sort_by_key(|l| l.address);
    want.sort_by_key(|l| l.address);
    assert_eq!(leases.len(), want.len(), "leases after the restart");
    assert_eq!(leases, want);

    // Space again: the daemon allocates and compacts.
    ns.run(move || std::fs::remove_file(ballast).unwrap());
    let mut ok = false;
    for j in 0..50 {
        if matches!(
            c.call(&alloc(1_000_000 + j)),
            Ok(Response::Allocated { .. })
        ) {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ok, "no allocation once space was freed");
    drop(c);
    d.kill();
}
