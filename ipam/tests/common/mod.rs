//! Shared helpers of the daemon tests: a config in a temp dir, a recording link remover, and
//! blocking protocol calls run off the async runtime.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aliasnet_ipam::{
    config::Config,
    daemon::Daemon,
    teardown::{LinkRemover, RemoveFuture, Removed},
};
use aliasnet_ipam_proto::{AttachmentKey, Client, ClientError, Lease, PodRef, Request, Response};

/// Records link deletions instead of touching any interface; optionally slow, like the kernel.
#[derive(Default)]
pub struct Recorder {
    /// (link, when its deletion finished)
    pub removed: Mutex<Vec<(String, Instant)>>,
    pub delay: Duration,
}

impl Recorder {
    pub fn names(&self) -> Vec<String> {
        self.removed
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }
}

impl LinkRemover for Recorder {
    fn remove<'a>(&'a self, name: &'a str) -> RemoveFuture<'a> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            self.removed
                .lock()
                .unwrap()
                .push((name.to_owned(), Instant::now()));
            Ok(Removed::Deleted)
        })
    }
}

/// A daemon's directory: config, state, spool and socket all under one temp dir.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub config: Config,
}

impl Env {
    /// `top`: extra top-level keys; `pool`: the body of one static pool named "secondary".
    pub fn new(top: &str, pool: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let text = format!(
            "socket = \"{d}/run/ipamd.sock\"\nstate_dir = \"{d}/state\"\nspool_dir = \"{d}/spool\"\n\
             {top}\n[[pool]]\nname = \"secondary\"\nsource = \"static\"\n{pool}\n"
        );
        let path = dir.path().join("ipamd.toml");
        std::fs::write(&path, &text).unwrap();
        let config = Config::load(&path).unwrap();
        Self { dir, config }
    }

    pub fn socket(&self) -> PathBuf {
        self.config.socket.clone()
    }

    pub fn state_dir(&self) -> &Path {
        &self.config.state_dir
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("ipamd.toml")
    }

    pub async fn start(&self, remover: Arc<dyn LinkRemover>) -> Daemon {
        Daemon::start(&self.config, remover)
            .await
            .expect("daemon starts")
    }
}

pub fn key(c: &str) -> AttachmentKey {
    AttachmentKey::new("net", c, "eth0")
}

pub fn alloc_req(c: &str, host_veth: Option<&str>) -> Request {
    Request::Allocate {
        key: key(c),
        pod: PodRef {
            namespace: Some("default".into()),
            name: Some(format!("pod-{c}")),
            uid: None,
        },
        pool: None,
        host_veth: host_veth.map(str::to_owned),
    }
}

/// One request on a fresh connection, from a blocking thread.
pub async fn call(socket: &Path, req: Request) -> Result<Response, ClientError> {
    let socket = socket.to_path_buf();
    tokio::task::spawn_blocking(move || {
        Client::connect(&socket, Duration::from_secs(40))?.call(&req)
    })
    .await
    .unwrap()
}

pub async fn allocate(socket: &Path, c: &str) -> Lease {
    match call(socket, alloc_req(c, None)).await {
        Ok(Response::Allocated { lease }) => lease,
        other => panic!("allocate {c}: {other:?}"),
    }
}

pub async fn list(socket: &Path) -> Vec<Lease> {
    match call(socket, Request::List).await {
        Ok(Response::Leases { leases }) => leases,
        other => panic!("list: {other:?}"),
    }
}
