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

/// Where the batches of a (pre-allocated) log end.
fn records_end(bytes: &[u8]) -> usize {
    let mut off = record::HEADER_LEN;
    while let Some(end) = record::verified_batch(bytes, off) {
        off = end;
    }
    off
}

/// `n` allocation records (addresses from 10.240.0.128 up), framed.
fn alloc_records(n: usize) -> Vec<u8> {
    let mut recs = Vec::new();
    for i in 0..n {
        let (data, key_len) = aliasnet_ipam::lease::encode_data(
            &key(&format!("torn-{i:04}-{}", "x".repeat(60))),
            &aliasnet_ipam_proto::PodRef::default(),
            None,
        );
        record::encode(
            &mut recs,
            &record::Record::Alloc(record::AllocRec {
                data,
                key_len,
                addr: 0x0af0_0080 + i as u128,
                allocated_at_ms: 1,
                pool: "secondary".into(),
            }),
        );
    }
    recs
}

/// The log `good` with a batch of 120 records (several pages) written after its records, as
/// an append writes it before its `fdatasync`; and where that batch ends.
fn with_batch(good: &[u8]) -> (Vec<u8>, usize) {
    let end = records_end(good);
    let mut batch = Vec::new();
    record::encode_batch(&mut batch, &alloc_records(120));
    assert!(batch.len() > 2 * 4096, "the batch spans pages");
    let mut out = good.to_vec();
    out[end..end + batch.len()].copy_from_slice(&batch);
    (out, end + batch.len())
}

/// A power cut in the middle of a group commit: the batch's pages reach the disk in any
/// order. A zero page followed by records of the same (unacknowledged) batch, or the marker's
/// page followed by a zero page, is truncated like a torn tail; damage followed by a verified
/// batch is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_commit_cut_short_by_a_power_cut_is_truncated() {
    let (env, leases) = env_with_leases(3).await;
    let log = newest_log(env.state_dir());
    let good = fs::read(&log).unwrap();
    let end = records_end(&good);
    assert!(good[end..].iter().all(|b| *b == 0));
    let (full, batch_end) = with_batch(&good);
    let page_end = (end / 4096 + 1) * 4096;
    let lost_pages: [(usize, usize); 2] = [
        // The page holding the marker never made it; later pages of the batch did.
        (end, page_end),
        // The marker's page made it; a later one did not.
        (page_end, page_end + 4096),
    ];
    for (from, to) in lost_pages {
        let mut torn = full.clone();
        torn[from..to].fill(0);
        assert!(
            (to..batch_end).any(|i| record::check_frame(&torn[i..]).is_ok()),
            "valid records of the batch follow the lost page"
        );
        fs::write(&log, &torn).unwrap();
        let d = env.start(Arc::new(Recorder::default())).await;
        assert_eq!(list(&env.socket()).await, leases, "pages {from}..{to} lost");
        d.shutdown().await;
        assert_eq!(fs::read(&log).unwrap(), good, "the torn batch is zeroed");
    }

    // The same zero page in the middle of acknowledged batches is damage, not a torn write.
    let mut bad = good.clone();
    let first = record::verified_batch(&good, record::HEADER_LEN).unwrap();
    bad[record::HEADER_LEN..first].fill(0);
    fs::write(&log, &bad).unwrap();
    let e = start_err(&env).await;
    assert!(e.contains("corrupt") && e.contains("valid records"), "{e}");
    assert_eq!(fs::read(&log).unwrap(), bad, "left untouched");
    fs::write(&log, &good).unwrap();
}

/// A full disk makes a rotation fail after it created the next log: the file stays empty (or
/// holds part of its header) and the daemon goes on appending to the current log. A crash in
/// the middle of such an append must still be a torn tail of the newest log that holds
/// records, not damage followed by another log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_log_left_by_a_failed_rotation_is_dropped_and_the_torn_tail_before_it_zeroed() {
    let (env, leases) = env_with_leases(3).await;
    let log = newest_log(env.state_dir());
    let good = fs::read(&log).unwrap();
    let (mut torn, _) = with_batch(&good);
    let page_end = (records_end(&good) / 4096 + 1) * 4096;
    torn[page_end..page_end + 4096].fill(0);
    let next = env.state_dir().join(log_name(1));
    let mut header = Vec::new();
    record::encode_header(&mut header, record::LOG_MAGIC, 1);
    for left in [Vec::new(), header[..header.len() / 2].to_vec()] {
        fs::write(&log, &torn).unwrap();
        fs::write(&next, &left).unwrap();
        let d = match Daemon::start(&env.config, Arc::new(Recorder::default())).await {
            Ok(d) => d,
            Err(e) => panic!(
                "a {}-byte next log made the daemon refuse to start: {e}",
                left.len()
            ),
        };
        assert_eq!(list(&env.socket()).await, leases);
        d.shutdown().await;
        assert!(!next.exists(), "the failed next log is gone");
        assert_eq!(fs::read(&log).unwrap(), good, "the torn batch is zeroed");
    }
}

/// A state directory of the previous format (version 2: records not grouped in batches) loads;
/// the daemon appends to a new log of the current format and a compaction merges both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_log_still_loads_and_is_continued_in_a_new_log() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    fs::create_dir_all(env.state_dir()).unwrap();
    let mut v2 = Vec::new();
    record::encode_header_version(&mut v2, record::LOG_MAGIC, 0, 2);
    v2.extend_from_slice(&alloc_records(3));
    v2.resize(64 << 10, 0);
    fs::write(env.state_dir().join(log_name(0)), &v2).unwrap();

    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&env.socket()).await.len(), 3);
    allocate(&env.socket(), "new").await;
    d.shutdown().await;
    assert_eq!(
        fs::read(env.state_dir().join(log_name(0))).unwrap(),
        v2,
        "not appended to"
    );
    let next = fs::read(env.state_dir().join(log_name(1))).unwrap();
    assert_eq!(
        record::decode_header_version(&next, record::LOG_MAGIC).unwrap(),
        (1, record::FORMAT_VERSION)
    );
    let d = env.start(Arc::new(Recorder::default())).await;
    let before = list(&env.socket()).await;
    assert_eq!(before.len(), 4);
    d.shutdown().await;
    compact(&env);
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&env.socket()).await, before);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_record_at_the_end_is_zeroed() {
    let (env, leases) = env_with_leases(3).await;
    let log = newest_log(env.state_dir());
    let good = fs::read(&log).unwrap();
    let end = records_end(&good);
    assert!(good.len() > end + 4096, "the log is pre-allocated");
    assert!(good[end..].iter().all(|b| *b == 0));

    // Half of a record: the write a crash cut short, inside the pre-allocated zeros.
    let mut rec = Vec::new();
    record::encode(
        &mut rec,
        &store::release_record(
            aliasnet_ipam::lease::encode_key(&key("c0")).into(),
            0x0af0_0000,
            1,
            None,
        ),
    );
    let mut torn = good.clone();
    torn[end..end + rec.len() / 2].copy_from_slice(&rec[..rec.len() / 2]);
    fs::write(&log, &torn).unwrap();
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(
        list(&env.socket()).await,
        leases,
        "the torn release was applied"
    );
    assert_eq!(
        fs::read(&log).unwrap(),
        good,
        "the torn bytes are zeroed again"
    );
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

    // Garbage after the zero tail of the newest log, with no valid record in it: a torn
    // extension; zeroed like any torn write.
    let mut f = OpenOptions::new().append(true).open(&log).unwrap();
    f.write_all(&[0xab; 100]).unwrap();
    drop(f);
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&env.socket()).await.len(), 4);
    d.shutdown().await;
    assert!(fs::read(&log)
        .unwrap()
        .iter()
        .rev()
        .take(100)
        .all(|b| *b == 0));
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

/// Write a snapshot the way the daemon's compaction does (merge on disk).
fn compact(env: &Env) {
    let (mut store, _) = Store::open(env.state_dir()).unwrap();
    let g = store.rotate().unwrap();
    let len = store.compaction(g, now_ms(), 130_000).run().unwrap();
    store.snapshot_done(g, len);
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

/// A state written by a newer daemon (a downgrade) is refused with the file and both versions
/// named, never read as garbage nor replaced by an empty state; the original file is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_format_version_is_refused_clearly() {
    let (env, leases) = env_with_leases(3).await;
    compact(&env);
    let snap = env.state_dir().join(SNAPSHOT_FILE);
    let good = fs::read(&snap).unwrap();
    let mut newer = good.clone();
    let future = record::FORMAT_VERSION + 1;
    newer[8..12].copy_from_slice(&future.to_le_bytes());
    // A valid header checksum: the version, not damage, is what must be refused.
    let crc = crc32fast::hash(&newer[..24]);
    newer[24..28].copy_from_slice(&crc.to_le_bytes());
    fs::write(&snap, &newer).unwrap();
    let e = start_err(&env).await;
    assert!(e.contains(&snap.display().to_string()), "{e}");
    assert!(
        e.contains(&format!("format version {future}")) && e.contains("reads versions"),
        "{e}"
    );
    assert_eq!(
        fs::read(&snap).unwrap(),
        newer,
        "the refused file was changed"
    );

    fs::write(&snap, &good).unwrap();
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&env.socket()).await, leases);
    d.shutdown().await;
}
