//! The `/metrics` HTTP endpoint: hyper's HTTP/1 server on the caller's tokio runtime.
//!
//! One path, `GET`/`HEAD /metrics`; any other path is 404, any other method 405, and a request
//! hyper cannot parse gets hyper's own 400 (or 431 for oversized headers). Rendering reads bpf
//! maps (blocking syscalls), so it runs on the blocking pool, never on the runtime's thread.

use std::{convert::Infallible, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};
use tracing::{debug, warn};

/// Produces one exposition, or says why it cannot.
pub type RenderFn = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Concurrent connections served; more are closed at once (Prometheus needs one or two).
const MAX_CONNECTIONS: usize = 32;
/// A client must send its request headers within this time (also bounds idle keep-alive).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Request head size limit; a scrape request is a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;

/// Serves `render` on `listener` until the future is dropped.
pub async fn serve(listener: TcpListener, render: RenderFn) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!("metrics: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "metrics: too many connections, closing");
            continue;
        };
        let render = render.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(req, render.clone()));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                debug!(%peer, "metrics: connection: {e}");
            }
            drop(permit);
        });
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn handle(
    req: Request<Incoming>,
    render: RenderFn,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != "/metrics" {
        return Ok(text(
            StatusCode::NOT_FOUND,
            "not found: metrics are served at /metrics\n",
        ));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    Ok(match tokio::task::spawn_blocking(move || render()).await {
        Ok(Ok(body)) => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(super::CONTENT_TYPE),
            );
            r
        }
        Ok(Err(e)) => {
            warn!("metrics: scrape failed: {e}");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading the datapath failed: {e}\n"),
            )
        }
        Err(e) => {
            warn!("metrics: render task: {e}");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "rendering the metrics failed\n",
            )
        }
    })
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn serves_only_get_metrics_and_rejects_garbage() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind loopback");
        let addr = listener.local_addr().unwrap();
        let render: RenderFn =
            Arc::new(|| Ok("# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n".into()));
        let server = std::thread::spawn(move || {
            rt.block_on(async move {
                tokio::select! {
                    _ = serve(listener, render) => {}
                    _ = tokio::time::sleep(Duration::from_secs(20)) => {}
                }
            })
        });

        let ok = exchange(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status(&ok), 200, "{ok}");
        assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
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
        drop(server);
    }

    #[test]
    fn render_errors_are_500_not_partial() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let render: RenderFn = Arc::new(|| Err("map an_pod_meta: gone".into()));
        std::thread::spawn(move || {
            rt.block_on(async move {
                tokio::select! {
                    _ = serve(listener, render) => {}
                    _ = tokio::time::sleep(Duration::from_secs(20)) => {}
                }
            })
        });
        let a = exchange(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status(&a), 500, "{a}");
        assert!(a.contains("an_pod_meta: gone"));
        assert!(!a.contains("# TYPE"));
    }
}
