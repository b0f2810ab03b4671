//! `azure-imds` pools against a fake IMDS server on 127.0.0.1 that the test starts and
//! mutates: addresses appearing and disappearing, 429 with Retry-After, truncated JSON and
//! bodies cut short, and a leased address vanishing.

mod common;

use std::{
    collections::VecDeque,
    net::{Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{AttachmentKey, ErrorKind, PodRef, Request, Response};
use common::*;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

/// One canned answer.
#[derive(Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    /// Announce this many more body bytes than are sent, then close (a body cut short).
    short_by: usize,
}

impl Reply {
    fn ok(body: String) -> Self {
        Self {
            status: 200,
            headers: vec![],
            body,
            short_by: 0,
        }
    }
}

#[derive(Default)]
struct Fake {
    /// Served once each, before `current`.
    queue: VecDeque<Reply>,
    current: Option<Reply>,
    /// (arrival, saw `Metadata: true`) of every request.
    requests: Vec<(Instant, bool)>,
}

type Shared = Arc<Mutex<Fake>>;

fn doc(primary: &str, secondary: &[&str]) -> String {
    let mut ips = vec![format!(
        r#"{{"privateIpAddress":"{primary}","publicIpAddress":""}}"#
    )];
    ips.extend(
        secondary
            .iter()
            .map(|s| format!(r#"{{"privateIpAddress":"{s}","publicIpAddress":""}}"#)),
    );
    format!(
        r#"{{"interface":[{{"ipv4":{{"ipAddress":[{}],"subnet":[{{"address":"10.0.8.0","prefix":"24"}}]}},"ipv6":{{"ipAddress":[]}},"macAddress":"000D3A328570"}}]}}"#,
        ips.join(",")
    )
}

async fn serve_fake(fake: Shared) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let fake = fake.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&req).to_ascii_lowercase();
                let reply = {
                    let mut f = fake.lock().unwrap();
                    f.requests
                        .push((Instant::now(), text.contains("\r\nmetadata: true\r\n")));
                    match f.queue.pop_front() {
                        Some(r) => r,
                        None => f.current.clone().expect("a current reply"),
                    }
                };
                let mut out = format!(
                    "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                    reply.status,
                    reply.body.len() + reply.short_by
                );
                for (k, v) in &reply.headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                out.push_str(&reply.body);
                let _ = s.write_all(out.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

fn alloc(c: &str) -> Request {
    Request::Allocate {
        key: AttachmentKey::new("net", c, "eth0"),
        pod: PodRef {
            namespace: Some("ml".into()),
            name: Some(format!("pod-{c}")),
            uid: None,
        },
        pool: Some("nic".into()),
        host_veth: None,
        families: None,
    }
}

async fn nic(socket: &std::path::Path) -> aliasnet_ipam_proto::PoolStats {
    stats(socket)
        .await
        .0
        .into_iter()
        .find(|p| p.name == "nic")
        .unwrap()
}

fn set(fake: &Shared, body: String) {
    fake.lock().unwrap().current = Some(Reply::ok(body));
}

fn requests(fake: &Shared) -> usize {
    fake.lock().unwrap().requests.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_follows_the_metadata_and_never_acts_on_a_bad_read() {
    let fake: Shared = Arc::default();
    set(&fake, doc("10.0.8.5", &["10.0.8.6", "10.0.8.7"]));
    let addr = serve_fake(fake.clone()).await;
    let env = Env::new(
        "cooldown = \"1s\"",
        &format!(
            "cidrs = [\"10.240.0.0/30\"]\n[[pool]]\nname = \"nic\"\nsource = \"azure-imds\"\n\
             url = \"http://{addr}/metadata/instance/network?api-version=2021-02-01\"\n\
             refresh_min = \"100ms\"\nrefresh_max = \"400ms\"\ntimeout = \"1s\"\n\
             exclude = [\"10.0.8.99\"]"
        ),
    );
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let metrics = d.metrics_address().expect("metrics enabled");

    // The first read: two secondaries; the primary is never in the pool.
    eventually(5, "the first read", || async {
        (nic(&socket).await.total == 2).then_some(())
    })
    .await;
    let mut got = Vec::new();
    for c in ["a", "b"] {
        match call(&socket, alloc(c)).await.unwrap() {
            Response::Allocated { lease, .. } => got.push(lease.address),
            other => panic!("{other:?}"),
        }
    }
    got.sort();
    assert_eq!(
        got,
        [Ipv4Addr::new(10, 0, 8, 6), Ipv4Addr::new(10, 0, 8, 7)]
    );
    assert!(matches!(
        call(&socket, alloc("c")).await,
        Err(aliasnet_ipam_proto::ClientError::Refused {
            kind: ErrorKind::PoolExhausted,
            ..
        })
    ));
    assert!(
        fake.lock().unwrap().requests.iter().all(|(_, h)| *h),
        "Metadata: true sent"
    );

    // A new address is usable at once; an excluded one never is.
    set(
        &fake,
        doc(
            "10.0.8.5",
            &["10.0.8.6", "10.0.8.7", "10.0.8.8", "10.0.8.99"],
        ),
    );
    eventually(5, "10.0.8.8 to appear", || async {
        (nic(&socket).await.total == 3).then_some(())
    })
    .await;
    let Response::Allocated { lease, .. } = call(&socket, alloc("c")).await.unwrap() else {
        panic!()
    };
    assert_eq!(lease.address, Ipv4Addr::new(10, 0, 8, 8));

    // Throttled with Retry-After: the next attempt waits at least that long; the pool stays.
    let before = requests(&fake);
    fake.lock().unwrap().queue.push_back(Reply {
        status: 429,
        headers: vec![("Retry-After", "1".into())],
        body: "Too Many Requests".into(),
        short_by: 0,
    });
    eventually(5, "the 429 to be served", || async {
        (requests(&fake) > before).then_some(())
    })
    .await;
    let throttled_at = fake.lock().unwrap().requests[before].0;
    eventually(5, "a request after the 429", || async {
        (requests(&fake) > before + 1).then_some(())
    })
    .await;
    let next_at = fake.lock().unwrap().requests[before + 1].0;
    assert!(
        next_at - throttled_at >= Duration::from_millis(950),
        "Retry-After honoured: {:?}",
        next_at - throttled_at
    );
    assert_eq!(nic(&socket).await.total, 3);

    // Truncated JSON, a body cut short, a 503 and an empty interface list: none is applied,
    // even though each would drop every address.
    let bad = [
        Reply::ok(doc("10.0.8.5", &[])[..40].to_owned()),
        Reply {
            short_by: 500,
            ..Reply::ok(doc("10.0.8.5", &[]))
        },
        Reply {
            status: 503,
            ..Reply::ok(String::new())
        },
        Reply::ok(r#"{"interface":[]}"#.into()),
    ];
    let before = requests(&fake);
    fake.lock().unwrap().queue.extend(bad.iter().cloned());
    eventually(10, "the bad answers to be served", || async {
        (requests(&fake) > before + bad.len()).then_some(())
    })
    .await;
    let s = nic(&socket).await;
    assert_eq!((s.total, s.allocated, s.missing), (3, 3, 0), "{s:?}");
    let text = scrape(metrics);
    for (result, at_least) in [
        ("throttled", 1.0),
        ("parse_error", 2.0),
        ("http_error", 1.0),
        ("unreachable", 1.0),
        ("ok", 1.0),
        ("changed", 2.0),
    ] {
        let v = sample(
            &text,
            &format!("aliasnet_ipam_metadata_refresh_total{{pool=\"nic\",result=\"{result}\"}}"),
        )
        .unwrap();
        assert!(v >= at_least, "{result}: {v}\n{text}");
    }
    assert!(
        sample(
            &text,
            "aliasnet_ipam_metadata_last_success_timestamp_seconds{pool=\"nic\"}"
        )
        .unwrap()
            > 1e9
    );

    // A leased address disappears: the pod keeps it, it is reported, and after release it is
    // not handed out again. A free address that disappears leaves the pool at once.
    set(
        &fake,
        doc(
            "10.0.8.5",
            &["10.0.8.6", "10.0.8.8", "10.0.8.9", "10.0.8.10"],
        ),
    );
    eventually(5, "10.0.8.9 and .10 to appear", || async {
        (nic(&socket).await.total == 4).then_some(())
    })
    .await;
    set(
        &fake,
        doc("10.0.8.5", &["10.0.8.6", "10.0.8.8", "10.0.8.9"]),
    );
    let s = eventually(5, "10.0.8.7 to go missing", || async {
        let s = nic(&socket).await;
        (s.missing == 1 && s.total == 3).then_some(s)
    })
    .await;
    assert_eq!((s.allocated, s.free), (3, 1), "{s:?}");
    let holder = if got[0] == Ipv4Addr::new(10, 0, 8, 7) {
        "a"
    } else {
        "b"
    };
    let Response::Lease { lease: Some(l), .. } = call(&socket, Request::Check { key: key(holder) })
        .await
        .unwrap()
    else {
        panic!()
    };
    assert!(
        l.missing && l.address == Ipv4Addr::new(10, 0, 8, 7),
        "{l:?}"
    );
    let text = scrape(metrics);
    assert_eq!(
        sample(
            &text,
            "aliasnet_ipam_pool_addresses{pool=\"nic\",state=\"missing\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "aliasnet_ipam_pool_size{pool=\"nic\"}"),
        Some(3.0)
    );
    release(&socket, holder, None).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // past the cooldown
    let Response::Allocated { lease, .. } = call(&socket, alloc("d")).await.unwrap() else {
        panic!()
    };
    assert_eq!(lease.address, Ipv4Addr::new(10, 0, 8, 9));
    assert!(matches!(
        call(&socket, alloc("e")).await,
        Err(aliasnet_ipam_proto::ClientError::Refused {
            kind: ErrorKind::PoolExhausted,
            ..
        })
    ));
    let s = nic(&socket).await;
    assert_eq!((s.missing, s.free, s.cooling), (0, 0, 0), "{s:?}");

    // Listed again: usable again.
    set(
        &fake,
        doc(
            "10.0.8.5",
            &["10.0.8.6", "10.0.8.7", "10.0.8.8", "10.0.8.9"],
        ),
    );
    eventually(5, "10.0.8.7 to return", || async {
        (nic(&socket).await.free == 1).then_some(())
    })
    .await;
    let Response::Allocated { lease, .. } = call(&socket, alloc("e")).await.unwrap() else {
        panic!()
    };
    assert_eq!(lease.address, Ipv4Addr::new(10, 0, 8, 7));
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_pool_waits_for_its_first_read() {
    // Nothing listens at this address: every attempt is "unreachable".
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let env = Env::new(
        "",
        &format!(
            "cidrs = [\"10.240.0.0/30\"]\n[[pool]]\nname = \"nic\"\nsource = \"azure-imds\"\n\
             url = \"http://{dead}/x\"\nrefresh_min = \"100ms\"\nrefresh_max = \"200ms\""
        ),
    );
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let s = eventually(5, "a failed attempt", || async {
        let s = nic(&socket).await;
        s.metadata
            .as_ref()
            .is_some_and(|m| m.last_result.as_deref() == Some("unreachable"))
            .then_some(s)
    })
    .await;
    assert_eq!(s.total, 0);
    assert!(s
        .metadata
        .unwrap()
        .last_error
        .unwrap()
        .contains("unreachable"));
    match call(&socket, alloc("a")).await {
        Err(aliasnet_ipam_proto::ClientError::Refused { kind, message }) => {
            assert_eq!(kind, ErrorKind::Unavailable, "{message}");
            assert!(
                message.contains("no metadata read has succeeded"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Other pools are not held up.
    assert!(matches!(
        call(&socket, alloc_req("x", None)).await,
        Ok(Response::Allocated { .. })
    ));
    d.shutdown().await;
}

/// A metadata document whose interface lists `secondary6` after its own IPv6 address.
fn doc6(secondary6: &[&str]) -> String {
    let ips: Vec<String> = std::iter::once("fd00:8::5")
        .chain(secondary6.iter().copied())
        .map(|s| format!(r#"{{"privateIpAddress":"{s}"}}"#))
        .collect();
    format!(
        r#"{{"interface":[{{"ipv4":{{"ipAddress":[{{"privateIpAddress":"10.0.8.5"}},{{"privateIpAddress":"10.0.8.6"}}]}},"ipv6":{{"ipAddress":[{}]}},"macAddress":"000D3A328570"}}]}}"#,
        ips.join(",")
    )
}

fn alloc6(c: &str) -> Request {
    match alloc(c) {
        Request::Allocate { key, pod, .. } => Request::Allocate {
            key,
            pod,
            pool: Some("nic".into()),
            host_veth: None,
            families: Some(vec![aliasnet_ipam_proto::Family::Ipv6]),
        },
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_metadata_pool_follows_the_ipv6_secondaries() {
    use std::net::Ipv6Addr;
    let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
    let fake: Shared = Arc::default();
    set(&fake, doc6(&["fd00:8::6", "fd00:8::7", "fd00:8::99"]));
    let addr = serve_fake(fake.clone()).await;
    let env = Env::new(
        "cooldown = \"1s\"",
        &format!(
            "cidrs = [\"10.240.0.0/30\"]\n[[pool]]\nname = \"nic\"\nsource = \"azure-imds\"\n\
             family = \"ipv6\"\n\
             url = \"http://{addr}/metadata/instance/network?api-version=2021-02-01\"\n\
             refresh_min = \"100ms\"\nrefresh_max = \"400ms\"\ntimeout = \"1s\"\n\
             exclude = [\"fd00:8::99\", \"10.0.8.6\"]"
        ),
    );
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();

    // The IPv6 secondaries, without the interface's own address, the IPv4 ones or the
    // excluded one.
    let s = eventually(5, "the first read", || async {
        let s = nic(&socket).await;
        (s.total == 2).then_some(s)
    })
    .await;
    assert_eq!(s.family, aliasnet_ipam_proto::Family::Ipv6);
    assert_eq!(s.metadata.as_ref().map(|m| m.primaries), Some(1), "{s:?}");
    let mut got = Vec::new();
    for c in ["a", "b"] {
        match call(&socket, alloc6(c)).await.unwrap() {
            Response::Allocated { lease, more } => {
                assert!(more.is_empty());
                got.push(lease.address);
            }
            other => panic!("{other:?}"),
        }
    }
    got.sort();
    assert_eq!(got, [v6("fd00:8::6"), v6("fd00:8::7")]);
    assert!(matches!(
        call(&socket, alloc6("c")).await,
        Err(aliasnet_ipam_proto::ClientError::Refused {
            kind: ErrorKind::PoolExhausted,
            ..
        })
    ));

    // New addresses are usable at once; then a leased one and a free one disappear.
    set(
        &fake,
        doc6(&["fd00:8::6", "fd00:8::7", "fd00:8::8", "fd00:8::9"]),
    );
    eventually(5, "::8 and ::9 to appear", || async {
        (nic(&socket).await.free == 2).then_some(())
    })
    .await;
    set(&fake, doc6(&["fd00:8::6", "fd00:8::8"]));
    let s = eventually(5, "::7 to go missing and ::9 to leave", || async {
        let s = nic(&socket).await;
        (s.missing == 1 && s.total == 2).then_some(s)
    })
    .await;
    assert_eq!((s.allocated, s.free), (2, 1), "{s:?}");
    let holder = if got[0] == v6("fd00:8::7") { "a" } else { "b" };
    let Response::Lease { lease: Some(l), .. } = call(&socket, Request::Check { key: key(holder) })
        .await
        .unwrap()
    else {
        panic!()
    };
    assert!(l.missing && l.address == v6("fd00:8::7"), "{l:?}");

    // Released, cooled down: still not handed out, as it is not listed.
    release(&socket, holder, None).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let Response::Allocated { lease, .. } = call(&socket, alloc6("d")).await.unwrap() else {
        panic!()
    };
    assert_eq!(lease.address, v6("fd00:8::8"));
    assert!(matches!(
        call(&socket, alloc6("e")).await,
        Err(aliasnet_ipam_proto::ClientError::Refused {
            kind: ErrorKind::PoolExhausted,
            ..
        })
    ));
    let s = nic(&socket).await;
    assert_eq!((s.missing, s.free, s.cooling), (0, 0, 0), "{s:?}");

    // Listed again: usable again; the leases survive a restart.
    set(&fake, doc6(&["fd00:8::6", "fd00:8::7", "fd00:8::8"]));
    eventually(5, "::7 to return", || async {
        (nic(&socket).await.free == 1).then_some(())
    })
    .await;
    let Response::Allocated { lease, .. } = call(&socket, alloc6("e")).await.unwrap() else {
        panic!()
    };
    assert_eq!(lease.address, v6("fd00:8::7"));
    d.shutdown().await;
    let d = env.start(Arc::new(Recorder::default())).await;
    let s = eventually(5, "the first read after the restart", || async {
        let s = nic(&socket).await;
        (s.total == 3).then_some(s)
    })
    .await;
    assert_eq!((s.allocated, s.free, s.missing), (3, 0, 0), "{s:?}");
    d.shutdown().await;
}
