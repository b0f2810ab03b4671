use std::{path::Path, sync::atomic::Ordering};

use aliasnet_ipam_proto::PodRef;

use super::*;
use crate::{
    config::Config,
    teardown::{LinksError, Removed},
};

struct NoLinks;
impl LinkRemover for NoLinks {
    fn remove(&self, _: &str) -> Result<Removed, LinksError> {
        Ok(Removed::NotFound)
    }
}

fn config(dir: &Path) -> Config {
    Config::parse(
        &format!(
            "state_dir = \"{}/state\"\nspool_dir = \"{}/spool\"\nsocket = \"{}/s.sock\"\n\
             [[pool]]\nname=\"p\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/30\"]\n",
            dir.display(),
            dir.display(),
            dir.display()
        ),
        Path::new("/t.toml"),
    )
    .unwrap()
}

fn alloc(c: &str) -> Request {
    Request::Allocate {
        key: AttachmentKey::new("n", c, "eth0"),
        pod: PodRef::default(),
        pool: None,
        host_veth: None,
        families: None,
    }
}

fn check(c: &str) -> Request {
    Request::Check {
        key: AttachmentKey::new("n", c, "eth0"),
    }
}

#[tokio::test]
async fn write_failure_fails_the_request_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (store, loaded) = Store::open(&cfg.state_dir).unwrap();
    let fail = store.fail_appends.clone();
    let (state, _) = State::from_loaded(&cfg, loaded, now_ms());
    let (ipam, workers) = Ipam::start(state, store, Arc::new(NoLinks)).unwrap();

    fail.store(1, Ordering::SeqCst);
    let r = ipam.handle(alloc("a")).await.response;
    match r {
        Response::Error { kind, message } => {
            assert_eq!(kind, ErrorKind::Storage);
            assert!(message.contains("not done"), "{message}");
            assert!(message.contains("log."), "names the file: {message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        ipam.handle(check("a")).await.response,
        Response::Lease {
            lease: None,
            more: vec![]
        }
    );
    // The address the failed request had reserved is free again.
    let Response::Stats { pools, .. } = ipam.handle(Request::Stats).await.response else {
        panic!()
    };
    assert_eq!((pools[0].free, pools[0].allocated), (4, 0));
    let Response::Allocated { lease, .. } = ipam.handle(alloc("b")).await.response else {
        panic!()
    };

    fail.store(1, Ordering::SeqCst);
    let r = ipam
        .handle(Request::Release {
            key: lease.key.clone(),
            teardown_link: None,
        })
        .await
        .response;
    assert!(
        matches!(
            r,
            Response::Error {
                kind: ErrorKind::Storage,
                ..
            }
        ),
        "{r:?}"
    );
    assert!(matches!(
        ipam.handle(check("b")).await.response,
        Response::Lease { lease: Some(_), .. }
    ));
    ipam.stop(workers).await;

    // What is on disk is exactly what was acknowledged.
    let (_, loaded) = Store::open(&cfg.state_dir).unwrap();
    let (state, _) = State::from_loaded(&cfg, loaded, now_ms());
    let keys: Vec<String> = state
        .list()
        .into_iter()
        .map(|l| l.key.container_id)
        .collect();
    assert_eq!(keys, ["b"]);
}

#[tokio::test]
async fn compaction_keeps_every_lease() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::parse(
        &format!(
            "state_dir = \"{}/state\"\ncooldown=\"0s\"\n\
             [[pool]]\nname=\"p\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/23\"]\n",
            dir.path().display()
        ),
        Path::new("/t.toml"),
    )
    .unwrap();
    let (mut store, loaded) = Store::open(&cfg.state_dir).unwrap();
    store.set_compact_min_bytes(2_000);
    let (state, _) = State::from_loaded(&cfg, loaded, now_ms());
    let (ipam, workers) = Ipam::start(state, store, Arc::new(NoLinks)).unwrap();
    for round in 0..5 {
        for i in 0..100 {
            ipam.handle(alloc(&format!("c{round}-{i}"))).await;
        }
        for i in (0..100).step_by(2) {
            ipam.handle(Request::Release {
                key: AttachmentKey::new("n", &format!("c{round}-{i}"), "eth0"),
                teardown_link: None,
            })
            .await;
        }
    }
    let before = ipam.with_state(|s| s.list());
    assert_eq!(before.len(), 250);
    ipam.stop(workers).await;
    let files: Vec<String> = std::fs::read_dir(&cfg.state_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.contains(&"state.snap".to_owned()), "{files:?}");
    // Old logs were removed; at most the current one and one still being superseded remain.
    assert!(
        files.iter().filter(|f| f.starts_with("log.")).count() <= 2,
        "{files:?}"
    );
    let (_, loaded) = Store::open(&cfg.state_dir).unwrap();
    let (state, _) = State::from_loaded(&cfg, loaded, now_ms());
    assert_eq!(state.list(), before);
}
