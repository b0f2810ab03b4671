//! The unix socket: binding, framing, and one task per connection.
//!
//! A connection's requests are answered in order. Bad input only ever affects its own
//! connection: an undecodable or wrong-version frame gets an error reply and the connection goes
//! on (the frame boundary is intact); an oversized length gets an error reply and the connection
//! is closed (it cannot be resynchronised); a truncated frame just ends the connection and
//! changes nothing.

use std::{
    io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use aliasnet_ipam_proto::{
    frame::{self, FrameError, MAX_FRAME},
    ErrorKind, Request, Response,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::{watch, Semaphore},
    task::JoinSet,
};

use aliasnet_serve::slots::{Slot, Slots};

use crate::service::Ipam;

/// Connections served at once (see [`Slots`]: at the limit the longest-waiting one is closed).
const MAX_CONNECTIONS: usize = 1024;
/// A connection must deliver a whole frame header within this of being accepted or of its
/// previous reply: the plugin sends its request right after connecting, so an idle or
/// trickling client only holds a slot and a task.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A client that sent a frame header must deliver the body within this (8 MiB over a local
/// socket takes milliseconds).
const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// A reply must be taken by the client within this; one that never reads is dropped (a fresh
/// allocation it was owed is released again).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Frames up to this size are read without asking the budget below (an Allocate with every
/// field at its 1,024-byte maximum is under 8 KiB).
const SMALL_FRAME: usize = 16 << 10;
/// Bytes of larger frames (a GC listing a node's attachments; anything else is an attack or a
/// bug) held by all connections together, from their header until their reply: with the
/// streaming decoder keeping at most a few times the frame's size, this bounds the daemon's
/// memory for requests to tens of MiB whatever the number of clients.
const LARGE_FRAME_BUDGET: usize = MAX_FRAME;
/// How long shutdown waits for requests in progress.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("another aliasnet-ipamd is already serving on {path}")]
    InUse { path: PathBuf },
    #[error("cannot create the socket {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Bind `path` with mode 0600, creating its directory and replacing a stale socket file.
pub fn bind(path: &Path) -> Result<UnixListener, BindError> {
    let err = |source| BindError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(BindError::InUse {
                    path: path.to_path_buf(),
                });
            }
            // Left behind by a daemon that died: nobody listens on it.
            std::fs::remove_file(path).map_err(err)?;
        }
        Ok(_) => {
            return Err(err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    // The umask makes the socket 0600 from its first instant; set_permissions makes sure.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = listener.map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(listener)
}

/// Serve until `shutdown` turns true; then remove the socket file, let requests in progress
/// finish, and return.
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    ipam: Ipam,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Slots::new(MAX_CONNECTIONS);
    let budget = Arc::new(Semaphore::new(LARGE_FRAME_BUDGET));
    let mut conns = JoinSet::new();
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => break,
        };
        // Every slot busy (not one waiting for its client): wait for one to free or to start
        // waiting, which requests do within milliseconds.
        let Some(slot) = slots.claim(stopped(&mut shutdown)).await else {
            break;
        };
        let (ipam, sd) = (ipam.clone(), shutdown.clone());
        conns.spawn(connection(stream, ipam, sd, slot, budget.clone()));
        // Reap finished connections so the set does not grow without bound.
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove the socket");
        }
    }
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = conns.len(),
            "requests still running after the drain timeout; abandoning them"
        );
        conns.abort_all();
    }
}

/// Resolves once shutdown is requested (or its sender is gone).
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

fn encode_reply(resp: &Response) -> Vec<u8> {
    let bytes = frame::encode(resp);
    if bytes.len() - 4 <= MAX_FRAME {
        return bytes;
    }
    frame::encode(&Response::Error {
        kind: ErrorKind::Internal,
        message: format!(
            "the reply is {} bytes, over the {MAX_FRAME}-byte frame limit",
            bytes.len() - 4
        ),
    })
}

async fn connection(
    stream: UnixStream,
    ipam: Ipam,
    mut shutdown: watch::Receiver<bool>,
    mut slot: Slot,
    budget: Arc<Semaphore>,
) {
    let (rd, mut wr) = stream.into_split();
    // Header and body of a request usually arrive together: one read for both. Small, as
    // every connection has one.
    let mut rd = BufReader::with_capacity(4 << 10, rd);
    loop {
        slot.wait();
        let mut header = [0u8; 4];
        tokio::select! {
            r = tokio::time::timeout(HEADER_TIMEOUT, rd.read_exact(&mut header)) => match r {
                Ok(Ok(_)) => {}
                // EOF between frames (normal close) or a header cut short: nothing to do.
                Ok(Err(_)) => return,
                Err(_) => {
                    tracing::debug!("no request within {HEADER_TIMEOUT:?}; closing");
                    return;
                }
            },
            _ = slot.evicted() => {
                tracing::debug!("connection limit reached; closing the longest-idle connection");
                return;
            }
            _ = stopped(&mut shutdown) => return,
        }
        let len = match frame::parse_len(header) {
            Ok(l) => l,
            Err(e) => {
                let reply = Response::Error {
                    kind: ErrorKind::BadRequest,
                    message: e.to_string(),
                };
                let _ =
                    tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(&encode_reply(&reply))).await;
                return;
            }
        };
        // A large frame waits for its share of the budget (as long as a body may take).
        let _large = if len > SMALL_FRAME {
            let permits = u32::try_from(len).expect("MAX_FRAME fits u32");
            let got = tokio::select! {
                p = tokio::time::timeout(BODY_TIMEOUT, budget.clone().acquire_many_owned(permits)) => p,
                _ = slot.evicted() => return,
            };
            match got {
                Ok(Ok(p)) => Some(p),
                _ => {
                    let reply = Response::Error {
                        kind: ErrorKind::Unavailable,
                        message: format!(
                            "too many large requests at once ({len}-byte frame); retry"
                        ),
                    };
                    let _ =
                        tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(&encode_reply(&reply)))
                            .await;
                    return;
                }
            }
        } else {
            None
        };
        // Grow the buffer as bytes arrive rather than trusting the length up front.
        let mut body = Vec::with_capacity(len.min(SMALL_FRAME));
        let mut limited = (&mut rd).take(len as u64);
        let read = tokio::select! {
            r = tokio::time::timeout(BODY_TIMEOUT, limited.read_to_end(&mut body)) => r,
            _ = slot.evicted() => return,
        };
        if !matches!(read, Ok(Ok(n)) if n == len) {
            tracing::debug!(expected = len, got = body.len(), "truncated frame; closing");
            return;
        }
        if !slot.busy() {
            return;
        }
        let arrived = std::time::Instant::now();
        let mut is_alloc = false;
        let decoded = frame::decode_request(&body);
        drop(body);
        let handled = match decoded {
            Ok(req) => {
                is_alloc = matches!(req, Request::Allocate { .. });
                ipam.handle(req).await
            }
            Err(FrameError::Version { got }) => Response::Error {
                kind: ErrorKind::UnsupportedVersion,
                message: format!(
                    "protocol version {got} is not supported; this daemon speaks version {}",
                    aliasnet_ipam_proto::PROTOCOL_VERSION
                ),
            }
            .into(),
            Err(e) => Response::Error {
                kind: ErrorKind::BadRequest,
                message: match e {
                    FrameError::Decode(d) => format!("malformed request: {d}"),
                    other => other.to_string(),
                },
            }
            .into(),
        };
        // A client that does not take its reply waits like an idle one.
        slot.wait();
        let reply = encode_reply(&handled.response);
        let written = tokio::select! {
            r = tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(&reply)) => {
                r.unwrap_or_else(|_| Err(io::Error::from(io::ErrorKind::TimedOut)))
            }
            _ = slot.evicted() => Err(io::Error::other("evicted at the connection limit")),
        };
        if let Err(e) = written {
            tracing::debug!(error = %e, "client went away or did not read its reply");
            if let Some(lease) = handled.rollback {
                ipam.rollback(&lease).await;
            }
            return;
        }
        if is_alloc && matches!(handled.response, Response::Allocated { .. }) {
            ipam.metrics().allocation_duration(arrived.elapsed());
        }
    }
}
