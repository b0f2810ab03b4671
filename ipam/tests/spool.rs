//! The release spool DEL writes while the daemon is down.

mod common;

use std::{sync::Arc, time::Duration};

use aliasnet_ipam::{daemon::SPOOL_RESCAN, service::now_ms};
use aliasnet_ipam_proto::spool::{self, SpoolEntry};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_is_applied_at_start_and_rescanned_while_running() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let before_b = now_ms();
    tokio::time::sleep(Duration::from_millis(5)).await;
    for c in ["a", "b", "keep"] {
        allocate(&socket, c).await;
    }
    d.shutdown().await;

    let dir = &env.config.spool_dir;
    // DEL of "a" while the daemon was down, with its host veth still to delete.
    spool::write(
        dir,
        &SpoolEntry {
            key: key("a"),
            host_veth: Some(v("a")),
            released_at_ms: now_ms(),
            boot_id: None,
            boot_ms: None,
        },
    )
    .unwrap();
    // A DEL of "b" older than b's current allocation: stale, must not release it.
    spool::write(
        dir,
        &SpoolEntry {
            key: key("b"),
            host_veth: Some(v("b")),
            released_at_ms: before_b,
            boot_id: None,
            boot_ms: None,
        },
    )
    .unwrap();
    // A DEL for a key the daemon never saw.
    spool::write(
        dir,
        &SpoolEntry {
            key: key("unknown"),
            host_veth: None,
            released_at_ms: now_ms(),
            boot_id: None,
            boot_ms: None,
        },
    )
    .unwrap();
    std::fs::write(dir.join("0000garbage.json"), b"{ not json").unwrap();

    let rec = Arc::new(Recorder::default());
    let d = env.start(rec.clone()).await;
    let mut left: Vec<String> = list(&socket)
        .await
        .into_iter()
        .map(|l| l.key.container_id)
        .collect();
    left.sort();
    assert_eq!(left, ["b", "keep"], "applied before serving");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["0000garbage.json.bad"],
        "applied entries are removed"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rec.names().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "spooled veth never deleted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rec.names(), [v("a")]);

    // A DEL that spooled while the daemon was running (it raced a restart) is picked up too.
    spool::write(
        dir,
        &SpoolEntry {
            key: key("keep"),
            host_veth: None,
            released_at_ms: now_ms(),
            boot_id: None,
            boot_ms: None,
        },
    )
    .unwrap();
    let deadline = std::time::Instant::now() + SPOOL_RESCAN + Duration::from_secs(5);
    while list(&socket).await.len() != 1 {
        assert!(std::time::Instant::now() < deadline, "spool not rescanned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    d.shutdown().await;
}

/// Whatever sits in the spool directory, start-up neither blocks nor follows it: a FIFO, a
/// symlink to `/dev/zero`, a directory, a huge file and an entry that parses but is invalid
/// are each moved aside (`.bad`), a valid entry next to them is applied, a stale temp file of
/// a crashed DEL is removed and a fresh one (a DEL writing right now) is left alone.
#[test]
fn hostile_spool_entries_are_moved_aside_without_blocking_start() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let dir = env.config.spool_dir.clone();
    std::fs::create_dir_all(&dir).unwrap();
    nix::unistd::mkfifo(
        &dir.join("fifo.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.json")).unwrap();
    std::fs::create_dir(dir.join("dir.json")).unwrap();
    let huge = std::fs::File::create(dir.join("huge.json")).unwrap();
    huge.set_len(1 << 30).unwrap();
    drop(huge);
    std::fs::write(
        dir.join("invalid.json"),
        br#"{"key":{"network":"net","container_id":"","ifname":"eth0"},"released_at_ms":1}"#,
    )
    .unwrap();
    let stale = dir.join(".0123.json.tmp99");
    let f = std::fs::File::create(&stale).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    drop(f);
    let fresh = dir.join(".4567.json.tmp98");
    std::fs::write(&fresh, b"{").unwrap();

    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            // A lease and its spooled DEL, next to the hostile entries.
            let d = env.start(Arc::new(Recorder::default())).await;
            allocate(&env.socket(), "a").await;
            d.shutdown().await;
            spool::write(
                &env.config.spool_dir,
                &SpoolEntry {
                    key: key("a"),
                    host_veth: None,
                    released_at_ms: now_ms() + 1,
                    boot_id: None,
                    boot_ms: None,
                },
            )
            .unwrap();
            let t0 = std::time::Instant::now();
            let d = env.start(Arc::new(Recorder::default())).await;
            let took = t0.elapsed();
            let left = list(&env.socket()).await;
            d.shutdown().await;
            let _ = tx.send((took, left, env));
        });
    });
    let (took, left, env) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("start-up blocked on a spool entry");
    assert!(took < Duration::from_secs(5), "start took {took:?}");
    assert_eq!(left, vec![], "the valid entry was applied");
    let mut files: Vec<String> = std::fs::read_dir(&env.config.spool_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            ".4567.json.tmp98",
            "dir.json.bad",
            "fifo.json.bad",
            "huge.json.bad",
            "invalid.json.bad",
            "zero.json.bad"
        ]
    );
    assert!(!stale.exists());
}
