//! The release spool: DELs the plugin could not deliver, applied when the daemon is up.

use std::path::Path;

use aliasnet_ipam_proto::{spool, ErrorKind, Response};

use super::*;

impl Ipam {
    /// Apply every entry of the release spool; returns how many were applied. Entries that
    /// are not regular files, too big, unparsable or invalid are moved aside (`<name>.bad`)
    /// with an error logged, not retried; only a refusal that may pass (storage, shutting
    /// down) is retried at the next scan.
    pub async fn apply_spool(&self, dir: &Path) -> usize {
        for p in spool::remove_stale_tmp(dir) {
            tracing::warn!(path = %p.display(), "removed a release spool temp file left by a DEL that crashed mid-write");
        }
        let entries = match spool::read_all(dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the release spool");
                return 0;
            }
        };
        let mut applied = 0;
        for s in entries {
            let entry = match s.entry {
                Ok(e) => e,
                Err(why) => {
                    move_aside(&s.path, &why);
                    continue;
                }
            };
            if let Some(v) = &entry.host_veth {
                if let Err(m) = crate::lease::validate_ifname("host_veth", v) {
                    move_aside(&s.path, &m.to_string());
                    continue;
                }
            }
            match self
                .release(
                    &entry.key,
                    entry.host_veth.as_deref(),
                    Some(self.shared.clock.spooled_at(&entry)),
                    None,
                )
                .await
            {
                Ok(address) => {
                    tracing::info!(
                        key = %entry.key,
                        address = ?address,
                        host_veth = ?entry.host_veth,
                        "applied a release spooled while the daemon was unreachable"
                    );
                    if let Err(e) = spool::remove(&s.path) {
                        tracing::error!(path = %s.path.display(), error = %e, "cannot remove an applied spool entry (it will be applied again, harmlessly)");
                    }
                    applied += 1;
                }
                Err(Handled {
                    response: Response::Error { kind, message },
                    ..
                }) if !matches!(kind, ErrorKind::Storage | ErrorKind::Unavailable) => {
                    move_aside(&s.path, &message);
                }
                Err(h) => tracing::warn!(
                    path = %s.path.display(),
                    reply = ?h.response,
                    "could not apply a spool entry yet; will retry"
                ),
            }
        }
        applied
    }
}

/// Rename a spool entry that can never be applied to `<name>.bad` (rename does not follow or
/// open it, whatever it is), so it is neither retried forever nor lost.
fn move_aside(path: &Path, why: &str) {
    let mut bad = path.to_path_buf().into_os_string();
    bad.push(".bad");
    tracing::error!(
        path = %path.display(),
        error = %why,
        moved_to = %Path::new(&bad).display(),
        "unusable release spool entry; moved aside, its key was NOT released"
    );
    if let Err(e) = std::fs::rename(path, &bad) {
        tracing::error!(path = %path.display(), error = %e, "cannot move the bad spool entry aside");
    }
}
