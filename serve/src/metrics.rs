//! The daemons' `/metrics` endpoint: hyper's HTTP/1 server on the caller's tokio runtime.
//!
//! One path, `GET`/`HEAD /metrics`; any other path is 404, any other method 405, a request
//! hyper cannot parse gets hyper's own 400 (or 431 for oversized headers), and a render that
//! fails is a 500, never a partial exposition.
//!
//! Scrapers may be hostile (the endpoint can be bound to the node's address, which pods
//! reach), so no client can hold it:
//! * connections take [`Slots`]: at the limit the one that has waited longest for its client
//!   (idle between requests, sending a request head, or not taking its answer) is closed;
//! * a request head must arrive within [`HEADER_TIMEOUT`] (this also ends idle keep-alive
//!   connections), and a write that makes no progress for [`WRITE_TIMEOUT`] closes the
//!   connection, so a client that pipelines requests and never reads is dropped;
//! * renders run one at a time on the blocking pool, and requests that arrive while one runs
//!   share the next: pipelined requests from many connections cost one render each round, not
//!   one each, and an answer is never older than its request.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    time::Sleep,
};
use tracing::{debug, warn};

use crate::slots::{Slot, Slots};

/// Produces one exposition, or says why it cannot.
pub type RenderFn = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// The Prometheus text format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Connections served at once (Prometheus needs one or two); more evict waiting ones.
pub const MAX_CONNECTIONS: usize = 64;
/// A client must send a request head within this of connecting or of its previous answer.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A write that makes no progress for this long (the client does not read) closes the
/// connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Request head size limit; a scrape request is a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;

/// Renders one at a time; requests that arrive during a render share the next one.
struct Renders {
    render: RenderFn,
    /// Held while rendering (fair: waiters are served in order).
    turn: tokio::sync::Mutex<()>,
    /// Renders started so far.
    started: AtomicU64,
    /// The newest finished render: (its number, its result).
    last: Mutex<Option<(u64, Result<Bytes, String>)>>,
}

impl Renders {
    async fn get(&self) -> Result<Bytes, String> {
        // Any render numbered from `fresh` on started after this request arrived.
        let fresh = self.started.load(Ordering::SeqCst) + 1;
        let _turn = self.turn.lock().await;
        if let Some((n, r)) = &*self.last.lock().unwrap_or_else(|e| e.into_inner()) {
            if *n >= fresh {
                return r.clone();
            }
        }
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        let render = self.render.clone();
        let r = match tokio::task::spawn_blocking(move || render()).await {
            Ok(r) => r.map(Bytes::from),
            Err(e) => Err(format!("the render task failed: {e}")),
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((n, r.clone()));
        r
    }
}

/// Serves `render` on `listener` until `stop` resolves (or the future is dropped).
pub async fn serve(listener: TcpListener, render: RenderFn, stop: impl Future<Output = ()>) {
    let slots = Slots::new(MAX_CONNECTIONS);
    let renders = Arc::new(Renders {
        render,
        turn: Default::default(),
        started: AtomicU64::new(0),
        last: Mutex::new(None),
    });
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!("metrics: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut stop => return,
        };
        let Some(slot) = slots.claim(stop.as_mut()).await else {
            return;
        };
        tokio::spawn(connection(stream, peer, slot, renders.clone()));
    }
}

/// The service gives up a connection that was evicted while it waited for its request.
#[derive(Debug)]
struct Evicted;

impl std::fmt::Display for Evicted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("closed to make room for another connection")
    }
}

impl std::error::Error for Evicted {}

async fn connection(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    mut slot: Slot,
    renders: Arc<Renders>,
) {
    let evicted = slot.eviction();
    slot.wait();
    let slot = Arc::new(Mutex::new(slot));
    let svc = service_fn(move |req| {
        let (slot, renders) = (slot.clone(), renders.clone());
        async move {
            if !slot.lock().unwrap_or_else(|e| e.into_inner()).busy() {
                return Err(Evicted);
            }
            let r = respond(req, &renders).await;
            // Until the client has taken the answer and sent its next request.
            slot.lock().unwrap_or_else(|e| e.into_inner()).wait();
            Ok::<_, Evicted>(r)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(WriteDeadline::new(stream)), svc);
    tokio::select! {
        r = conn => if let Err(e) = r {
            debug!(%peer, "metrics: connection: {e}");
        },
        _ = evicted => debug!(%peer, "metrics: connection limit reached; closed the longest-waiting connection"),
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

async fn respond(req: Request<Incoming>, renders: &Renders) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return text(
            StatusCode::NOT_FOUND,
            "not found: metrics are served at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match renders.get().await {
        Ok(body) => {
            let mut r = Response::new(Full::new(body));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(CONTENT_TYPE),
            );
            r
        }
        Err(e) => {
            warn!("metrics: scrape failed: {e}");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("rendering the metrics failed: {e}\n"),
            )
        }
    }
}

/// A stream whose writes fail with `TimedOut` once one has made no progress for
/// [`WRITE_TIMEOUT`]: a client that stops reading cannot keep its connection forever.
struct WriteDeadline<T> {
    io: T,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    fn new(io: T) -> Self {
        Self { io, stalled: None }
    }

    /// Passes a write's outcome through, timing how long it has been pending.
    fn deadline<R>(&mut self, cx: &mut Context<'_>, p: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if p.is_ready() {
            self.stalled = None;
            return p;
        }
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_TIMEOUT)));
        if timer.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took nothing of the answer for the write timeout",
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.io).poll_write(cx, buf);
        self.deadline(cx, p)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.deadline(cx, p)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let p = Pin::new(&mut self.io).poll_flush(cx);
        self.deadline(cx, p)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let p = Pin::new(&mut self.io).poll_shutdown(cx);
        self.deadline(cx, p)
    }
}

#[cfg(test)]
mod tests;
