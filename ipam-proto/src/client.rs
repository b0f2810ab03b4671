//! Blocking client used by the CNI plugin and the operator CLI.

use std::{
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, net::UnixStream},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{
    frame::{self, FrameError},
    msg::{ErrorKind, Lease, Request, Response},
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing is listening (socket missing, connection refused). DEL treats this as "daemon down".
    #[error("aliasnet-ipamd is not reachable at {path}: {source}")]
    Unavailable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("aliasnet-ipamd at {path} did not answer within {timeout:?}")]
    Timeout { path: PathBuf, timeout: Duration },
    #[error("protocol error talking to aliasnet-ipamd at {path}")]
    Protocol {
        path: PathBuf,
        #[source]
        source: FrameError,
    },
    /// The daemon answered with an error.
    #[error("aliasnet-ipamd refused the request ({kind:?}): {message}")]
    Refused { kind: ErrorKind, message: String },
}

impl ClientError {
    /// True when the daemon could not be reached at all (as opposed to answering badly).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Timeout { .. })
    }
}

/// One connection to the daemon. Requests on it are answered in order.
pub struct Client {
    stream: UnixStream,
    path: PathBuf,
    timeout: Duration,
}

impl Client {
    /// Connect within `timeout`, and apply `timeout` to every later read and write.
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Self, ClientError> {
        let path = path.as_ref().to_path_buf();
        let stream = connect_within(&path, timeout).map_err(|source| {
            if source.kind() == io::ErrorKind::TimedOut {
                ClientError::Timeout {
                    path: path.clone(),
                    timeout,
                }
            } else {
                ClientError::Unavailable {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(|source| ClientError::Unavailable {
                path: path.clone(),
                source,
            })?;
        Ok(Self {
            stream,
            path,
            timeout,
        })
    }

    /// Send one request and wait for its answer. A daemon-side error becomes
    /// [`ClientError::Refused`].
    pub fn call(&mut self, req: &Request) -> Result<Response, ClientError> {
        self.send(req)?;
        self.receive()
    }

    /// Send one request without waiting: its answer is read by [`Client::receive`], so the
    /// caller works meanwhile (the daemon's answer waits for its disk).
    pub fn send(&mut self, req: &Request) -> Result<(), ClientError> {
        let result = frame::write_frame(&mut self.stream, req);
        self.map_err(result)
    }

    /// The answer to the request [`Client::send`] sent.
    pub fn receive(&mut self) -> Result<Response, ClientError> {
        let result = frame::read_frame(&mut self.stream);
        match self.map_err(result)? {
            Response::Error { kind, message } => Err(ClientError::Refused { kind, message }),
            resp => Ok(resp),
        }
    }

    fn map_err<T>(&self, result: Result<T, FrameError>) -> Result<T, ClientError> {
        match result {
            Ok(v) => Ok(v),
            Err(FrameError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(ClientError::Timeout {
                    path: self.path.clone(),
                    timeout: self.timeout,
                })
            }
            Err(FrameError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::UnexpectedEof
                ) =>
            {
                // The daemon went away mid-call (crash or restart).
                Err(ClientError::Unavailable {
                    path: self.path.clone(),
                    source: e,
                })
            }
            Err(source) => Err(ClientError::Protocol {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

impl Client {
    /// One page of leases above `after` in address order, and where the next page starts.
    pub fn list_page(
        &mut self,
        after: Option<std::net::IpAddr>,
        limit: Option<u32>,
    ) -> Result<(Vec<Lease>, Option<std::net::IpAddr>), ClientError> {
        match self.call(&Request::ListPage { after, limit })? {
            Response::LeasePage { leases, next } => Ok((leases, next)),
            other => Err(self.unexpected("ListPage", &other)),
        }
    }

    /// Every lease, in address order, fetched page by page (works at any lease count).
    pub fn list_all(&mut self) -> Result<Vec<Lease>, ClientError> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let (page, next) = self.list_page(after, None)?;
            all.extend(page);
            match next {
                Some(n) => after = Some(n),
                None => return Ok(all),
            }
        }
    }

    fn unexpected(&self, what: &str, resp: &Response) -> ClientError {
        ClientError::Protocol {
            path: self.path.clone(),
            source: FrameError::Unexpected(format!("{what} answered with {resp:?}")),
        }
    }
}

/// Record one CNI operation in the daemon's metrics (`RecordOp`): `verb` is the CNI command,
/// `code` the CNI error code of the result (0 = success), `duration` what the operation took.
/// One short round trip on a fresh connection, bounded by `timeout` (the plugin should pass a
/// small one, e.g. 100 ms, and ignore errors: metrics must never fail or delay a pod).
pub fn record_op(
    socket: impl AsRef<Path>,
    verb: &str,
    code: u32,
    duration: Duration,
    timeout: Duration,
) -> Result<(), ClientError> {
    let mut c = Client::connect(socket, timeout)?;
    match c.call(&record_op_request(verb, code, duration))? {
        Response::Recorded => Ok(()),
        other => Err(c.unexpected("RecordOp", &other)),
    }
}

/// Most [`send_op_record`] may take, whatever timeout it is given: it runs after the CNI
/// result is out, and the runtime waits for the plugin to exit.
pub const SEND_OP_RECORD_BUDGET: Duration = Duration::from_millis(5);

/// [`record_op`] without waiting for the answer: connect, send the frame, close. The runtime
/// waits for the plugin process to exit, so the daemon's reply would only add a scheduling
/// round trip to every pod operation; a record lost to a daemon restart costs one sample.
/// Bounded by `timeout` and by [`SEND_OP_RECORD_BUDGET`] (a daemon whose backlog is full
/// costs the sample, not the pod's time).
pub fn send_op_record(
    socket: impl AsRef<Path>,
    verb: &str,
    code: u32,
    duration: Duration,
    timeout: Duration,
) -> Result<(), ClientError> {
    let mut c = Client::connect(socket, timeout.min(SEND_OP_RECORD_BUDGET))?;
    let req = record_op_request(verb, code, duration);
    frame::write_frame(&mut c.stream, &req).map_err(|source| ClientError::Protocol {
        path: c.path.clone(),
        source,
    })
}

/// Connect to the unix socket `path` within `timeout`. A blocking `connect(2)` on a unix
/// socket waits without limit while the listener's backlog is full (a daemon that stopped
/// accepting); a non-blocking one fails with `EAGAIN` instead, so this retries with short
/// pauses until the deadline and then reports `TimedOut`.
pub fn connect_within(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    let deadline = Instant::now() + timeout;
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a usable unix socket path (empty, too long or with NUL)",
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: plain syscall; the returned fd is owned below.
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut pause = Duration::from_millis(1);
    loop {
        // SAFETY: addr/len describe a valid sockaddr_un; fd is open.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&raw const addr).cast::<libc::sockaddr>(),
                len,
            )
        };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the daemon's listen backlog stayed full",
                    ));
                }
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            _ => return Err(e),
        }
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

fn record_op_request(verb: &str, code: u32, duration: Duration) -> Request {
    Request::RecordOp {
        verb: verb.to_owned(),
        code,
        duration_us: u64::try_from(duration.as_micros()).unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that never accepts, its backlog filled by connections nobody serves.
    fn stuck_listener(dir: &Path) -> (std::os::unix::net::UnixListener, Vec<OwnedFd>, PathBuf) {
        let path = dir.join("stuck.sock");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut held = Vec::new();
        loop {
            match connect_within(&path, Duration::ZERO) {
                Ok(s) => held.push(OwnedFd::from(s)),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => break,
                Err(e) => panic!("{e}"),
            }
            assert!(held.len() < 100_000, "backlog never filled");
        }
        (l, held, path)
    }

    #[test]
    fn connect_to_a_full_backlog_times_out_instead_of_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let (_l, _held, path) = stuck_listener(dir.path());
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let r = Client::connect(&p, Duration::from_millis(300)).map(|_| ());
            let _ = tx.send((r, t0.elapsed()));
        });
        let (r, took) = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("connect hung on a full backlog");
        assert!(matches!(r, Err(ClientError::Timeout { .. })), "{r:?}");
        assert!(took >= Duration::from_millis(250), "{took:?}");
        assert!(took < Duration::from_millis(1000), "{took:?}");

        // The plugin's operation record, sent after the CNI result, costs a few ms at most.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let r = send_op_record(
                &path,
                "ADD",
                0,
                Duration::from_millis(3),
                Duration::from_millis(100),
            );
            let _ = tx.send((r.is_err(), t0.elapsed()));
        });
        let (failed, took) = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("send_op_record hung on a full backlog");
        assert!(failed);
        assert!(took < Duration::from_millis(20), "{took:?}");
    }

    #[test]
    fn connect_reports_a_missing_socket_as_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let r = Client::connect(dir.path().join("nope.sock"), Duration::from_secs(1));
        assert!(matches!(r, Err(ClientError::Unavailable { .. })));
    }
}
