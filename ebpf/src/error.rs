use std::path::PathBuf;

use crate::{limits::LimitError, netlink::NetlinkError, netns::NetnsError, MissingObject};

/// Everything the datapath library can fail with. Messages are lower case, name the object
/// involved, and keep the cause as `source`.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error(
        "{path} is not on a bpf filesystem (mount one with `mount -t bpf -o mode=0700 bpf /sys/fs/bpf`)"
    )]
    NotBpffs { path: PathBuf },
    #[error("mount bpffs at {path}: {source}")]
    MountBpffs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error(
        "{root} is not initialised: aliasnet-shaperd must run once on this node to load and pin the datapath"
    )]
    NotInitialised { root: PathBuf },
    #[error("pinned map {name} does not match this build ({reason}); pinned maps of another ABI are never reused: drain the node and remove {root}")]
    AbiMismatch {
        root: PathBuf,
        name: String,
        reason: String,
    },
    #[error(
        "pin root {root} is locked by {holder}, which did not release it within {} s; \
         pods cannot be added or deleted meanwhile (see /proc/locks)",
        waited.as_secs()
    )]
    LockTimeout {
        root: PathBuf,
        waited: std::time::Duration,
        holder: String,
    },
    #[error(
        "pin directory {path} {reason}: refusing to use it; remove it and restart \
         aliasnet-shaperd, which creates it for root only"
    )]
    UnsafePinDir { path: PathBuf, reason: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    MissingObject(#[from] MissingObject),
    #[error("load eBPF object: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("map {name}: {source}")]
    Map {
        name: String,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("program {name}: {source}")]
    Program {
        name: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("pin {path}: {source}")]
    Pin {
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("link {path}: {source}")]
    Link {
        path: PathBuf,
        #[source]
        source: aya::programs::links::LinkError,
    },
    #[error("interface {name}: {source}")]
    Interface {
        name: String,
        #[source]
        source: nix::Error,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("no free pod slot: {max} pods are attached on this node")]
    Full { max: u32 },
    #[error("uplink for the node internet cap: {0}")]
    Uplink(String),
    #[error("{0}")]
    Multiple(MultiError),
}

/// Several independent failures (best-effort teardown collects them all).
#[derive(Debug)]
pub struct MultiError(pub Vec<DatapathError>);

impl std::fmt::Display for MultiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl DatapathError {
    pub(crate) fn map(name: &str, source: aya::maps::MapError) -> Self {
        Self::Map {
            name: name.to_owned(),
            source,
        }
    }

    pub(crate) fn program(name: &str, source: aya::programs::ProgramError) -> Self {
        Self::Program {
            name: name.to_owned(),
            source,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Collapses a list of failures: none is `Ok`, one is itself.
    pub(crate) fn collect(mut errors: Vec<DatapathError>) -> Result<(), DatapathError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(DatapathError::Multiple(MultiError(errors))),
        }
    }
}
