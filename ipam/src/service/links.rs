//! Host link teardown: deletions with retries, bounded concurrency, then the held addresses freed.

use std::{collections::HashSet, sync::Arc, time::Duration};

use tokio::sync::{mpsc, Semaphore};

use crate::teardown::{self, LinkRemover, Removed};

use super::*;

pub(super) async fn teardown_loop(
    shared: Arc<Shared>,
    remover: Arc<dyn LinkRemover>,
    mut rx: mpsc::UnboundedReceiver<Box<str>>,
) {
    let limit = Arc::new(Semaphore::new(TEARDOWN_CONCURRENCY));
    let mut in_flight: HashSet<Box<str>> = HashSet::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Box<str>>();
    loop {
        tokio::select! {
            Some(link) = rx.recv() => {
                if !in_flight.insert(link.clone()) {
                    continue;
                }
                let (remover, limit, done) = (remover.clone(), limit.clone(), done_tx.clone());
                tokio::spawn(async move {
                    let _permit = limit.acquire().await;
                    remove_with_retries(remover, &link).await;
                    let _ = done.send(link);
                });
            }
            Some(link) = done_rx.recv() => {
                in_flight.remove(&link);
                shared.lock().teardown_done(&link);
                shared.changed.notify_waiters();
            }
            else => break,
        }
    }
}

async fn remove_with_retries(remover: Arc<dyn LinkRemover>, link: &str) {
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=TEARDOWN_ATTEMPTS {
        match teardown::remove(remover.clone(), link).await {
            Ok(Removed::Deleted) => {
                tracing::debug!(link, "deleted host link");
                return;
            }
            Ok(Removed::NotFound) => return,
            Ok(Removed::NotVeth(kind)) => {
                tracing::error!(
                    link,
                    kind,
                    "not deleting the host link: it is not a veth (a link of another kind was \
                     given the name of a pod's host veth)"
                );
                return;
            }
            Err(e) if attempt == TEARDOWN_ATTEMPTS => {
                tracing::error!(
                    link,
                    error = %e,
                    "giving up deleting the host link; its addresses become allocatable again"
                );
            }
            Err(e) => {
                tracing::warn!(link, error = %e, attempt, "deleting the host link failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
}
