//! The daemon over its unix socket: concurrency, idempotency, bad frames, disconnects, list
//! paging and the socket file itself (release, GC and cooldown are in release.rs).

mod common;

use std::{
    collections::HashSet,
    io::{Read, Write},
    os::unix::{fs::PermissionsExt, net::UnixStream},
    sync::Arc,
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{
    frame::{self, MAX_FRAME},
    Client, ClientError, ErrorKind, Request, Response,
};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_get_distinct_addresses_that_survive_a_restart() {
    let env = Env::new("cooldown = \"130s\"", "cidrs = [\"10.240.0.0/20\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let threads: Vec<_> = (0..64)
        .map(|t| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                // One connection per client, several requests on it.
                let mut c = Client::connect(&socket, Duration::from_secs(30)).unwrap();
                (0..16)
                    .map(|i| match c.call(&alloc_req(&format!("t{t}-{i}"), None)) {
                        Ok(Response::Allocated { lease, .. }) => lease,
                        other => panic!("{other:?}"),
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let leases: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let addrs: HashSet<_> = leases.iter().map(|l| l.address).collect();
    assert_eq!(addrs.len(), 64 * 16, "an address was handed out twice");
    let before = list(&socket).await;
    assert_eq!(before.len(), 64 * 16);
    d.shutdown().await;
    assert!(!socket.exists(), "shutdown removes the socket");

    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(list(&socket).await, before);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_is_idempotent_even_when_concurrent() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket, Duration::from_secs(30)).unwrap();
                match c.call(&alloc_req("same", Some(&v("same")))) {
                    Ok(Response::Allocated { lease, .. }) => lease,
                    other => panic!("{other:?}"),
                }
            })
        })
        .collect();
    let leases: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(leases.iter().all(|l| *l == leases[0]), "{leases:?}");
    assert_eq!(leases[0].pod.name.as_deref(), Some("pod-same"));
    assert_eq!(leases[0].host_veth, Some(v("same")));
    assert_eq!(list(&socket).await.len(), 1);
    // Check sees it; a second allocate later returns it again.
    match call(&socket, Request::Check { key: key("same") }).await {
        Ok(Response::Lease { lease: Some(l), .. }) => assert_eq!(l, leases[0]),
        other => panic!("{other:?}"),
    }
    assert_eq!(allocate(&socket, "same").await, leases[0]);
    d.shutdown().await;
}

fn raw_frame(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

fn read_reply(s: &mut UnixStream) -> Response {
    frame::read_frame(s).expect("a reply frame")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_get_errors_and_never_affect_other_clients() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let healthy = allocate(&socket, "healthy").await;

    let s2 = socket.clone();
    tokio::task::spawn_blocking(move || {
        let t = Some(Duration::from_secs(10));
        let mut s = UnixStream::connect(&s2).unwrap();
        s.set_read_timeout(t).unwrap();

        // Garbage: an error reply, and the connection stays usable.
        s.write_all(&raw_frame(b"\x00\xffnot json")).unwrap();
        match read_reply(&mut s) {
            Response::Error { kind, .. } => assert_eq!(kind, ErrorKind::BadRequest),
            other => panic!("{other:?}"),
        }
        // Valid JSON, unknown operation.
        s.write_all(&raw_frame(br#"{"v":1,"op":"explode"}"#))
            .unwrap();
        match read_reply(&mut s) {
            Response::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::BadRequest);
                assert!(message.contains("explode"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // A future protocol version.
        s.write_all(&raw_frame(br#"{"v":2,"op":"list"}"#)).unwrap();
        match read_reply(&mut s) {
            Response::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::UnsupportedVersion);
                assert!(message.contains("version 2"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Still serving this very connection.
        s.write_all(&frame::encode(&Request::Stats)).unwrap();
        assert!(matches!(read_reply(&mut s), Response::Stats { .. }));

        // Oversized length: an error reply, then the connection is closed.
        let mut s = UnixStream::connect(&s2).unwrap();
        s.set_read_timeout(t).unwrap();
        s.write_all(&(MAX_FRAME as u32 + 1).to_be_bytes()).unwrap();
        match read_reply(&mut s) {
            Response::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::BadRequest);
                assert!(message.contains("exceeds"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let mut rest = Vec::new();
        assert_eq!(
            s.read_to_end(&mut rest).unwrap(),
            0,
            "closed after oversize"
        );

        // Truncated: a header promising more than is sent, then the client leaves.
        let mut s = UnixStream::connect(&s2).unwrap();
        let full = frame::encode(&alloc_req("truncated", None));
        s.write_all(&full[..full.len() - 5]).unwrap();
        drop(s);
        // A header cut short.
        let mut s = UnixStream::connect(&s2).unwrap();
        s.write_all(&[0, 0]).unwrap();
        drop(s);
    })
    .await
    .unwrap();

    // Others are served as before, and the truncated request changed nothing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let leases = list(&socket).await;
    assert_eq!(leases, vec![healthy.clone()]);
    assert_eq!(allocate(&socket, "healthy").await, healthy);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_its_reply_leaks_nothing() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let s2 = socket.clone();
    tokio::task::spawn_blocking(move || {
        for i in 0..20 {
            let mut s = UnixStream::connect(&s2).unwrap();
            s.write_all(&frame::encode(&alloc_req(&format!("gone{i}"), None)))
                .unwrap();
            // Close without reading: the daemon's reply cannot be delivered.
            drop(s);
        }
    })
    .await
    .unwrap();
    // Each was allocated, then released when its reply could not be delivered: all 20 end
    // up cooling, none allocated. (Stats, unlike List, also counts allocations in flight.)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let Response::Stats { pools, .. } = call(&socket, Request::Stats).await.unwrap() else {
            panic!()
        };
        if (pools[0].allocated, pools[0].cooling) == (0, 20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "allocations of vanished clients were not released: {pools:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(list(&socket).await, vec![]);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_is_private_and_a_stale_one_is_replaced() {
    let env = Env::new("", "ips = [\"10.240.0.1\"]");
    let socket = env.socket();
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    // A socket file nobody listens on, as a crashed daemon leaves behind.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let d = env.start(Arc::new(Recorder::default())).await;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(list(&socket).await, vec![]);

    // A second daemon on the same state directory or socket is refused.
    let err = aliasnet_ipam::daemon::Daemon::start(&env.config, Arc::new(Recorder::default()))
        .await
        .err()
        .expect("second daemon refused");
    assert!(err.to_string().contains("in use"), "{err}");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_cover_every_lease_once_under_the_frame_limit() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/20\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    // 2,624 leases with the largest fields accepted: ~4.5 KiB of JSON each, ~12 MiB in all,
    // more than one 8 MiB frame holds.
    let big = "n".repeat(1024);
    let threads: Vec<_> = (0..32)
        .map(|t| {
            let (socket, big) = (socket.clone(), big.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket, Duration::from_secs(30)).unwrap();
                for i in 0..82 {
                    let n = t * 100 + i;
                    let req = Request::Allocate {
                        key: aliasnet_ipam_proto::AttachmentKey::new(
                            "net",
                            &format!("{n:04}{}", "c".repeat(1000)),
                            "eth0",
                        ),
                        pod: aliasnet_ipam_proto::PodRef {
                            namespace: Some(big.clone()),
                            name: Some(big.clone()),
                            uid: Some(big.clone()),
                        },
                        pool: None,
                        host_veth: None,
                        families: None,
                    };
                    assert!(matches!(c.call(&req), Ok(Response::Allocated { .. })));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total = match call(&socket, Request::Stats).await.unwrap() {
        Response::Stats { pools, .. } => pools[0].allocated as usize,
        other => panic!("{other:?}"),
    };
    assert_eq!(total, 32 * 82);
    // The unpaged List cannot answer this; it says so instead of failing the connection.
    match call(&socket, Request::List).await {
        Err(ClientError::Refused { kind, message }) => {
            assert_eq!(kind, ErrorKind::Internal);
            assert!(message.contains("frame limit"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let socket2 = socket.clone();
    let pages = tokio::task::spawn_blocking(move || {
        let mut c = Client::connect(&socket2, Duration::from_secs(30)).unwrap();
        let mut pages = Vec::new();
        let mut after = None;
        loop {
            let (page, next) = c.list_page(after, Some(10_000)).unwrap();
            pages.push(page);
            match next {
                Some(n) => after = Some(n),
                None => return pages,
            }
        }
    })
    .await
    .unwrap();
    assert!(pages.len() >= 2, "the byte budget splits the pages");
    let all: Vec<_> = pages.concat();
    assert_eq!(all.len(), total);
    assert!(
        all.windows(2).all(|w| w[0].address < w[1].address),
        "sorted, no repeats"
    );
    // A small limit, and bad limits.
    let socket3 = socket.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = Client::connect(&socket3, Duration::from_secs(30)).unwrap();
        let (page, next) = c.list_page(None, Some(7)).unwrap();
        assert_eq!(page.len(), 7);
        assert_eq!(next, Some(page[6].address));
        assert_eq!(c.list_all().unwrap().len(), total);
        for bad in [0, 10_001] {
            assert!(matches!(
                c.list_page(None, Some(bad)),
                Err(ClientError::Refused {
                    kind: ErrorKind::BadRequest,
                    ..
                })
            ));
        }
    })
    .await
    .unwrap();
    d.shutdown().await;
}
