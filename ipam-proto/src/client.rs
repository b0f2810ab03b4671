//! Blocking client used by the CNI plugin and the operator CLI.

use std::{
    io,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
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
    /// Connect with `timeout` applied to every later read and write.
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Self, ClientError> {
        let path = path.as_ref().to_path_buf();
        let stream = UnixStream::connect(&path).map_err(|source| ClientError::Unavailable {
            path: path.clone(),
            source,
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
        let result = frame::write_frame(&mut self.stream, req)
            .and_then(|()| frame::read_frame(&mut self.stream));
        match result {
            Ok(Response::Error { kind, message }) => Err(ClientError::Refused { kind, message }),
            Ok(resp) => Ok(resp),
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
        after: Option<std::net::Ipv4Addr>,
        limit: Option<u32>,
    ) -> Result<(Vec<Lease>, Option<std::net::Ipv4Addr>), ClientError> {
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

/// [`record_op`] without waiting for the answer: connect, send the frame, close. The runtime
/// waits for the plugin process to exit, so the daemon's reply would only add a scheduling
/// round trip to every pod operation; a record lost to a daemon restart costs one sample.
/// Bounded by `timeout` like `record_op`.
pub fn send_op_record(
    socket: impl AsRef<Path>,
    verb: &str,
    code: u32,
    duration: Duration,
    timeout: Duration,
) -> Result<(), ClientError> {
    let mut c = Client::connect(socket, timeout)?;
    let req = record_op_request(verb, code, duration);
    frame::write_frame(&mut c.stream, &req).map_err(|source| ClientError::Protocol {
        path: c.path.clone(),
        source,
    })
}

fn record_op_request(verb: &str, code: u32, duration: Duration) -> Request {
    Request::RecordOp {
        verb: verb.to_owned(),
        code,
        duration_us: u64::try_from(duration.as_micros()).unwrap_or(u64::MAX),
    }
}
