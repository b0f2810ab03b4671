//! `aliasnet-ipamd recover`: rebuild the state from the kernel when the state on disk is lost
//! or corrupt.
//!
//! Every pod aliasnet attached has a host /32 route to its IPv4 address and a /128 route to its
//! IPv6 address through its host veth (named `host_veth_prefix` + a hash of the attachment
//! key). Each such route becomes a lease. The key cannot be recovered from the hash, so the
//! lease is stored under `(RECOVERED_NETWORK, <veth>, "-")` with `host_veth` set (one lease per
//! family under that key, as for any key; see
//! [`aliasnet_ipam_proto::RECOVERED_NETWORK`]); the daemon releases it when a DEL names the veth
//! (teardown link, or the key that hashes to it), when the veth disappears (reconcile), or by
//! a GC once the veth is gone. A CHECK of the real key finds it through the veth as well.
//!
//! The old state directory is moved aside (`<state_dir>.broken-<unix ms>`), never
//! deleted; its lock is held from the first look at it until the rebuilt directory has taken
//! its place (one `RENAME_EXCHANGE`), so no daemon can start on it meanwhile. Release times are lost with the old state, so every address that is not leased
//! is put in cooldown from now (unless `--no-cooldown`): no address is reused while a
//! connection of a pod deleted shortly before the crash could still point at it. An IPv6 pool
//! is walked in the order its round-robin hands addresses out after the restart (from right
//! after its highest recovered lease, wrapping around) and at most [`MAX_COOL6`] of its
//! unleased addresses are put in cooldown: every one of a /112, and in a delegated /80 or /64
//! (never enumerated) the next ones the allocator would reach, which is where the addresses of
//! pods allocated after the last surviving one lie.
//!
//! Addresses of `azure-imds` pools are matched against one metadata read per pool; an address
//! no pool claims is kept as a lease anyway (never handed out, reported at start).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use aliasnet_ipam_proto::{is_host_veth, recovered_key, Family, PodRef};
use aliasnet_netlink::{NetlinkError, Rtnl};

use crate::{
    config::{Config, PoolSource, PoolSpec},
    imds,
    lease::{encode_data, ip_addr, Addr},
    service::now_ms,
    store::{
        self,
        record::{AllocRec, CoolRec},
        DirLock, SnapshotWriter, Store, StoreError,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error(
        "the state in {path} loads fine ({leases} leases); nothing to recover. To rebuild it \
         from the kernel anyway (the current state is moved aside), pass --force"
    )]
    Healthy { path: PathBuf, leases: usize },
    #[error("stop aliasnet-ipamd first: {0}")]
    Running(StoreError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading the kernel's links and routes: {0}")]
    Kernel(#[from] NetlinkError),
    #[error("the state could not be read: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Most unleased addresses of one IPv6 pool put in cooldown by `recover` (all of a /112).
pub const MAX_COOL6: usize = 1 << 16;

/// The unleased addresses of a static pool (`ranges`, sorted allocator values) that `recover`
/// puts in cooldown: in the order the daemon hands them out after loading the recovered leases
/// (from right after the highest of `leased`, wrapping to the first range), at most `cap`
/// (an IPv4 pool is cooled whole, an IPv6 one up to [`MAX_COOL6`]).
pub fn cooldown(ranges: &[(u128, u128)], leased: &BTreeSet<u128>, cap: usize) -> Vec<u128> {
    let start = leased
        .last()
        .and_then(|a| a.checked_add(1))
        .or(ranges.first().map(|r| r.0))
        .unwrap_or(0);
    let mut out = Vec::new();
    // Addresses at or after `start`, then the ones before it.
    let parts = ranges
        .iter()
        .filter(|r| r.1 >= start)
        .map(|r| (r.0.max(start), r.1))
        .chain(
            ranges
                .iter()
                .filter(|r| r.0 < start)
                .map(|r| (r.0, r.1.min(start - 1))),
        );
    for (first, last) in parts {
        let mut a = first;
        loop {
            if out.len() == cap {
                return out;
            }
            if !leased.contains(&a) {
                out.push(a);
            }
            if a == last {
                break;
            }
            a += 1;
        }
    }
    out
}

/// Options of the `recover` command.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Rebuild even if the current state loads.
    pub force: bool,
    /// Do not put the unleased addresses in cooldown.
    pub no_cooldown: bool,
}

/// What `recover` did.
#[derive(Debug, Default)]
pub struct Report {
    /// (address, host veth, pool) of each recovered lease.
    pub leases: Vec<(IpAddr, String, String)>,
    /// Routes through our veths that were not turned into leases, and why.
    pub skipped: Vec<String>,
    /// Addresses put in cooldown.
    pub cooling: usize,
    /// Where the old state went.
    pub moved_aside: Option<PathBuf>,
    /// Why the old state could not be used (when it could not).
    pub old_state_error: Option<String>,
}

/// (address, host veth) of each IPv4 /32 and IPv6 /128 route in the main table through one of
/// our veths, IPv4 first.
pub fn kernel_routes(rtnl: &mut Rtnl, prefix: &str) -> Result<Vec<(IpAddr, String)>, NetlinkError> {
    let links: HashMap<u32, String> = rtnl
        .links()?
        .into_iter()
        .filter(|l| is_host_veth(l.kind.as_deref(), &l.name, prefix))
        .map(|l| (l.index, l.name))
        .collect();
    let mut out = Vec::new();
    for family in aliasnet_netlink::Family::ALL {
        for r in rtnl.routes(family)? {
            if r.dst_len != family.host_len() || !r.in_main_table() {
                continue;
            }
            if let Some(name) = r.oif.and_then(|i| links.get(&i)) {
                out.push((r.dst, name.clone()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Rebuild `config.state_dir` from `routes` (what [`kernel_routes`] found).
pub async fn recover(
    config: &Config,
    routes: Vec<(IpAddr, String)>,
    opts: Options,
) -> Result<Report, RecoverError> {
    let dir = &config.state_dir;
    let mut report = Report::default();
    // The directory's lock is held from the first look at the old state until the rebuilt one
    // is in place: a daemon started meanwhile fails to start rather than acknowledge leases in
    // a directory that is about to be moved aside. A missing directory is created (empty) so
    // that it can be locked too.
    let existed = dir.exists();
    store::ensure_dir(dir)?;
    let lock = match DirLock::acquire(dir) {
        Ok(l) => Arc::new(l),
        Err(e @ StoreError::Locked { .. }) => return Err(RecoverError::Running(e)),
        Err(e) => return Err(e.into()),
    };
    if existed {
        let (d, l) = (dir.clone(), lock.clone());
        match tokio::task::spawn_blocking(move || Store::open_locked(&d, l)).await? {
            Ok((_store, loaded)) => {
                if !opts.force {
                    return Err(RecoverError::Healthy {
                        path: dir.clone(),
                        leases: loaded.leases.len(),
                    });
                }
            }
            Err(e) => report.old_state_error = Some(e.to_string()),
        }
    }

    // Which pool each address belongs to.
    let static_pools: Vec<_> = config
        .pools
        .iter()
        .filter(|p| !p.source.is_dynamic())
        .collect();
    let metadata_pools: Vec<_> = config
        .pools
        .iter()
        .filter(|p| p.source == PoolSource::AzureImds)
        .collect();
    let mut listed: HashMap<IpAddr, String> = HashMap::new();
    let fetcher = imds::Fetcher::default();
    for p in &metadata_pools {
        let spec = p.imds.as_ref().expect("metadata pools have a spec");
        match fetcher.fetch(spec).await {
            Ok(body) => match imds::parse(&body) {
                Ok(parsed) => {
                    let read: Vec<IpAddr> = match p.family {
                        Family::Ipv4 => parsed.secondary.into_iter().map(IpAddr::from).collect(),
                        Family::Ipv6 => parsed.secondary6.into_iter().map(IpAddr::from).collect(),
                    };
                    for a in read {
                        listed.entry(a).or_insert_with(|| p.name.clone());
                    }
                }
                Err(e) => report
                    .skipped
                    .push(format!("pool '{}': metadata unusable ({e})", p.name)),
            },
            Err(e) => report
                .skipped
                .push(format!("pool '{}': metadata not read ({e:?})", p.name)),
        }
    }
    let pool_of = |a: IpAddr| -> String {
        let fam = Family::of(a);
        let holds =
            |p: &PoolSpec| ip_addr(a).is_some_and(|n| p.ranges.iter().any(|r| r.contains(n)));
        if let Some(p) = static_pools.iter().find(|p| holds(p)) {
            return p.name.clone();
        }
        if let Some(p) = listed.get(&a) {
            return p.clone();
        }
        let candidates: Vec<_> = metadata_pools.iter().filter(|p| p.family == fam).collect();
        match candidates.as_slice() {
            // The only candidate: the address gets a slot there, absent until listed.
            [only] => only.name.clone(),
            _ => "unknown".into(),
        }
    };

    let now = now_ms();
    let mut by_veth: BTreeMap<(String, Family), IpAddr> = BTreeMap::new();
    let mut leased: HashSet<Addr> = HashSet::new();
    let mut w = SnapshotWriter::new(0, routes.len() * 140 + (1 << 20));
    for (ip, veth) in routes {
        let Some(addr) = ip_addr(ip) else {
            report
                .skipped
                .push(format!("{ip} via {veth}: not an address a pool can hold"));
            continue;
        };
        let fam = Family::of(ip);
        if let Some(first) = by_veth.get(&(veth.clone(), fam)) {
            report.skipped.push(format!(
                "{ip} via {veth}: the veth already routes {first}; one lease per veth and family"
            ));
            continue;
        }
        by_veth.insert((veth.clone(), fam), ip);
        leased.insert(addr);
        let pool = pool_of(ip);
        let (data, key_len) = encode_data(&recovered_key(&veth), &PodRef::default(), Some(&veth));
        w.lease(&AllocRec {
            data,
            key_len,
            addr,
            allocated_at_ms: now,
            pool: pool.as_str().into(),
        });
        report.leases.push((ip, veth, pool));
    }
    if !opts.no_cooldown {
        for p in &static_pools {
            let mine: BTreeSet<u128> = leased
                .iter()
                .filter(|a| p.ranges.iter().any(|r| r.contains(**a)))
                .copied()
                .collect();
            let cap = match p.family {
                Family::Ipv4 => usize::MAX,
                Family::Ipv6 => MAX_COOL6,
            };
            let ranges: Vec<(u128, u128)> = p.address_ranges().collect();
            for addr in cooldown(&ranges, &mine, cap) {
                w.cooling(CoolRec {
                    addr,
                    released_at_ms: now,
                    teardown: None,
                });
                report.cooling += 1;
            }
        }
        for a in listed.keys().filter_map(|a| ip_addr(*a)) {
            if !leased.contains(&a) {
                w.cooling(CoolRec {
                    addr: a,
                    released_at_ms: now,
                    teardown: None,
                });
                report.cooling += 1;
            }
        }
    }
    let snapshot = w.finish();

    // Build the new directory beside the old one, then swap.
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let base = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "ipam".into());
    let fresh = parent.join(format!(".{base}.recover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fresh);
    std::fs::create_dir_all(parent).map_err(|source| RecoverError::Io {
        what: "creating",
        path: parent.to_path_buf(),
        source,
    })?;
    store::create_fresh(&fresh, &snapshot)?;
    // One atomic exchange: `dir` never stops existing, so no daemon can create an empty one
    // in between; the old directory (still locked) then goes aside under the fresh name.
    nix::fcntl::renameat2(
        None,
        &fresh,
        None,
        dir.as_path(),
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    )
    .map_err(|e| RecoverError::Io {
        what: "putting the rebuilt state in place at",
        path: dir.clone(),
        source: e.into(),
    })?;
    if existed {
        let mut aside = parent.join(format!("{base}.broken-{now}"));
        let mut n = 1;
        while aside.exists() {
            aside = parent.join(format!("{base}.broken-{now}-{n}"));
            n += 1;
        }
        std::fs::rename(&fresh, &aside).map_err(|source| RecoverError::Io {
            what: "moving the old state aside to",
            path: aside.clone(),
            source,
        })?;
        report.moved_aside = Some(aside);
    } else {
        // Only the lock file of the directory created above.
        std::fs::remove_dir_all(&fresh).map_err(|source| RecoverError::Io {
            what: "removing",
            path: fresh.clone(),
            source,
        })?;
    }
    store::sync_dir(parent).map_err(|source| RecoverError::Io {
        what: "syncing",
        path: parent.to_path_buf(),
        source,
    })?;
    drop(lock);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(first: u128, last: u128) -> (u128, u128) {
        (first, last)
    }

    #[test]
    fn cooldown_walks_in_allocation_order_and_stops_at_the_cap() {
        let set = |v: &[u128]| v.iter().copied().collect::<BTreeSet<u128>>();
        // From after the highest lease, wrapping to the first range; leases skipped.
        let ranges = [r(0x10, 0x13), r(0x20, 0x21)];
        assert_eq!(
            cooldown(&ranges, &set(&[0x11, 0x12]), usize::MAX),
            [0x13, 0x20, 0x21, 0x10]
        );
        assert_eq!(
            cooldown(&ranges, &set(&[]), usize::MAX),
            [0x10, 0x11, 0x12, 0x13, 0x20, 0x21]
        );
        assert_eq!(
            cooldown(&ranges, &set(&[0x21]), usize::MAX),
            [0x10, 0x11, 0x12, 0x13, 0x20]
        );
        // An IPv6 /64: the next MAX_COOL6 addresses only.
        let base = 0x2001_0db8_0001_0002u128 << 64;
        let big = cooldown(
            &[r(base, base + u128::from(u64::MAX))],
            &set(&[base + 5]),
            MAX_COOL6,
        );
        assert_eq!(big.len(), MAX_COOL6);
        assert_eq!(
            (big[0], big[MAX_COOL6 - 1]),
            (base + 6, base + 5 + MAX_COOL6 as u128)
        );
    }
}
