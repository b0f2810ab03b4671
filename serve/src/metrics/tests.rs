//! The endpoint's answers, and its defences one by one (the whole attack on both daemons is
//! `tests/tests/metrics_lockout.rs`).

use std::io::{Read, Write};

use super::*;

/// Sends raw bytes, returns the whole answer (the connection is closed by `Connection:
/// close` or by the server on a bad request).
fn exchange(addr: std::net::SocketAddr, raw: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(raw).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

/// Serves `render` on a loopback port from a thread of its own for 20 s; returns the address.
fn start(render: RenderFn) -> std::net::SocketAddr {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind loopback");
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        rt.block_on(async move {
            tokio::select! {
                _ = serve(listener, render, std::future::pending()) => {}
                _ = tokio::time::sleep(Duration::from_secs(20)) => {}
            }
        })
    });
    addr
}

#[test]
fn serves_only_get_metrics_and_rejects_garbage() {
    let addr = start(Arc::new(|| {
        Ok("# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n".into())
    }));

    let ok = exchange(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&ok), 200, "{ok}");
    assert!(ok.contains(CONTENT_TYPE), "{ok}");
    assert!(ok.ends_with("x_total 1\n"), "{ok}");
    let q = exchange(addr, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n");
    assert_eq!(status(&q), 200, "{q}");
    let head = exchange(
        addr,
        b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&head), 200);
    assert!(!head.contains("x_total"), "HEAD has no body: {head}");

    let other = exchange(
        addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&other), 404, "{other}");
    let post = exchange(
        addr,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&post), 405, "{post}");
    assert!(
        post.to_ascii_lowercase().contains("allow: get, head"),
        "{post}"
    );
    for garbage in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n"[..],
        b"GET /metrics\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n",
        b"BREW /metrics HTCPCP/1.0\r\n\r\n",
    ] {
        let a = exchange(addr, garbage);
        let code = status(&a);
        assert!((400..500).contains(&code), "{garbage:?} -> {a}");
    }
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let a = exchange(addr, huge.as_bytes());
    assert!((400..500).contains(&status(&a)), "{a}");
}

#[test]
fn render_errors_are_500_not_partial() {
    let addr = start(Arc::new(|| Err("map an_pod_meta: gone".into())));
    let a = exchange(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&a), 500, "{a}");
    assert!(a.contains("an_pod_meta: gone"));
    assert!(!a.contains("# TYPE"));
}

#[tokio::test(start_paused = true)]
async fn a_write_the_client_never_takes_times_out() {
    use tokio::io::AsyncWriteExt;
    let (server, _client) = tokio::io::duplex(1024);
    let mut w = WriteDeadline::new(server);
    let big = vec![0u8; 64 << 10];
    let start = tokio::time::Instant::now();
    let e = w
        .write_all(&big)
        .await
        .expect_err("the client reads nothing");
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), WRITE_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn a_write_that_keeps_progressing_is_not_cut() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (server, mut client) = tokio::io::duplex(1024);
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        let mut n = 0;
        // Slow, but never silent for the whole write timeout.
        while let Ok(k) = client.read(&mut buf).await {
            if k == 0 {
                break;
            }
            n += k;
            tokio::time::sleep(WRITE_TIMEOUT / 2).await;
        }
        n
    });
    let mut w = WriteDeadline::new(server);
    w.write_all(&[7u8; 8 << 10])
        .await
        .expect("a slow reader is served");
    drop(w);
    assert_eq!(reader.await.unwrap(), 8 << 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_renders_and_no_answer_predates_its_request() {
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    let renders = Arc::new(Renders {
        render: Arc::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::sleep(Duration::from_millis(20));
            Ok(format!("n {n}\n"))
        }),
        turn: Default::default(),
        started: AtomicU64::new(0),
        last: Mutex::new(None),
    });
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let r = renders.clone();
        let count = count.clone();
        tasks.push(tokio::spawn(async move {
            // Renders started before this request arrived: its answer must come from a later
            // one.
            let before = count.load(Ordering::SeqCst);
            let body = r.get().await.unwrap();
            let n: u64 = std::str::from_utf8(&body).unwrap()[2..]
                .trim()
                .parse()
                .unwrap();
            assert!(
                n > before,
                "answer of render {n}, {before} were done before the request"
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = count.load(Ordering::SeqCst);
    assert!(n <= 20, "{n} renders for 200 concurrent requests");
}
