//! Crash artifacts and corruption of the durable store, seen through a daemon restart.

mod common;

use std::{
    fs::{self, OpenOptions},
    io::Write,
    path::{Path, PathBuf},
    sync::Arc,
};

use aliasnet_ipam::{
    daemon::Daemon,
    service::now_ms,
    state::State,
    store::{self, log_name, record, Store, SNAPSHOT_FILE},
};
use common::*;

fn newest_log(dir: &Path) -> PathBuf {
    let mut logs: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("log."))
        .collect();
    logs.sort();
    logs.pop().expect("a log")
}

async fn env_with_leases(n: usize) -> (Env, Vec<aliasnet_ipam_proto::Lease>) {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    for i in 0..n {
        allocate(&env.socket(), &format!("c{i}")).await;
    }
    let leases = list(&env.socket()).await;
    d.shutdown().await;
    (env, leases)
}

async fn start_err(env: &Env) -> String {
    match Daemon::start(&env.config, Arc::new(Recorder::default())).await {
        Ok(_) => panic!("the daemon started on a corrupt state"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_record_at_the_end_is_truncated() {
    let (env, leases) = env_with_leases(3).await;
    let log = newest_log(env.state_dir());
    let good_len = fs::metadata(&log).unwrap().len();

    // Half of a record: the write a crash cut short.
    let mut rec = Vec::new();
    record::encode(
        &mut rec,
        &store::release_record("net\0c0\0eth0".into(), 0x0af0_0000, 1, None),
    );
    let mut f = OpenOptions::new().append(true).open(&log).unwrap();
    f.write_all(&rec[..rec.len() / 2]).unwrap();
    drop(f);
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(
        list(&env.socket()).await,
        leases,
        "the torn release was applied"
    );
    assert_eq!(fs::metadata(&log).unwrap().len(), good_len);
    // Appending after the truncation works and survives another restart.
    allocate(&env.socket(), "after").await;
    d.shutdown().await;

    // Zeros at the end (a file extended but never written, as ext4 can leave it).
    let log = newest_log(env.state_dir());
    let mut f = OpenOptions::new().append(true).open(&log).unwrap();
    f.write_all(&[0u8; 4096]).unwrap();
    drop(f);
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&env.socket()).await.len(), 4);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corruption_inside_the_log_refuses_to_start() {
    let (env, _) = env_with_leases(3).await;
    let log = newest_log(env.state_dir());
    let mut bytes = fs::read(&log).unwrap();
    // Flip a bit inside the first record; valid records follow it.
    bytes[record::HEADER_LEN + 12] ^= 0x40;
    fs::write(&log, &bytes).unwrap();
    let e = start_err(&env).await;
    assert!(
        e.contains(&log.display().to_string()),
        "names the file: {e}"
    );
    assert!(e.contains("corrupt"), "{e}");
    assert!(e.contains("valid records"), "{e}");
    assert!(
        e.contains("aliasnet-ipamd recover"),
        "points at recovery: {e}"
    );
    // The file was left untouched for the operator.
    assert_eq!(fs::read(&log).unwrap(), bytes);

    // A damaged header is refused too.
    bytes[3] ^= 1;
    fs::write(&log, &bytes).unwrap();
    let e = start_err(&env).await;
    assert!(e.contains("bad magic"), "{e}");
}

/// Write a snapshot the way the daemon's compaction does.
fn compact(env: &Env) {
    let (mut store, loaded) = Store::open(env.state_dir()).unwrap();
    let (state, _) = State::from_loaded(&env.config, loaded, now_ms());
    let g = store.rotate().unwrap();
    let bytes = state.snapshot(g);
    store::write_snapshot(env.state_dir(), &bytes).unwrap();
    store.snapshot_done(g, bytes.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_round_trips_and_damage_refuses_to_start() {
    let (env, leases) = env_with_leases(5).await;
    compact(&env);
    let snap = env.state_dir().join(SNAPSHOT_FILE);
    assert!(snap.exists());
    assert!(!env.state_dir().join(log_name(0)).exists(), "old log kept");
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&env.socket()).await, leases);
    d.shutdown().await;

    let good = fs::read(&snap).unwrap();
    // A flipped bit.
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 1;
    fs::write(&snap, &bad).unwrap();
    let e = start_err(&env).await;
    assert!(e.contains(&snap.display().to_string()), "{e}");
    assert!(e.contains("aliasnet-ipamd recover"), "{e}");
    // Cut short (no end record).
    fs::write(&snap, &good[..good.len() - 10]).unwrap();
    let e = start_err(&env).await;
    assert!(e.contains(SNAPSHOT_FILE) && e.contains("truncated"), "{e}");
    // Empty.
    fs::write(&snap, b"").unwrap();
    let e = start_err(&env).await;
    assert!(e.contains(SNAPSHOT_FILE), "{e}");
    // Missing while the logs show it existed: never start empty.
    fs::remove_file(&snap).unwrap();
    let e = start_err(&env).await;
    assert!(e.contains(SNAPSHOT_FILE) && e.contains("missing"), "{e}");

    fs::write(&snap, &good).unwrap();
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&env.socket()).await, leases);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_log_in_the_chain_refuses_to_start() {
    let (env, _) = env_with_leases(2).await;
    compact(&env);
    let newest = newest_log(env.state_dir());
    fs::remove_file(&newest).unwrap();
    let e = start_err(&env).await;
    assert!(e.contains("missing"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_torn_while_being_created_is_reinitialised() {
    let (env, leases) = env_with_leases(2).await;
    // A rotation that crashed before the new log's header was durable.
    let torn = env.state_dir().join(log_name(1));
    fs::write(&torn, b"ALNIP").unwrap();
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&env.socket()).await, leases);
    allocate(&env.socket(), "later").await;
    d.shutdown().await;
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&env.socket()).await.len(), 3);
    d.shutdown().await;
}
