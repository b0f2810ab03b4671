//! Blocking client used by the CNI plugin and the operator CLI.

use std::{
    io,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    frame::{self, FrameError},
    msg::{ErrorKind, Request, Response},
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
