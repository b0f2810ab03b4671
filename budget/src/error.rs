//! Errors of the budget engine.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("read {what} {path}: {source}")]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd: {op} took longer than {secs:.1} s")]
    Timeout { op: &'static str, secs: f64 },
    #[error("etcd: lease {0:x} expired")]
    LeaseExpired(i64),
    #[error("etcd: {0}")]
    Protocol(String),
    #[error("no longer the leader (another node was elected)")]
    LostLeadership,
    #[error("node name {0:?} is not a host or Kubernetes node name")]
    NodeName(String),
}

/// Runs `f` with a deadline.
pub(crate) async fn deadline<T>(
    op: &'static str,
    limit: std::time::Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, BudgetError> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(BudgetError::Timeout {
            op,
            secs: limit.as_secs_f64(),
        }),
    }
}
