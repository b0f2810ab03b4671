//! ADD: reserve an address per family, build the veth pair with the peer born in the pod's
//! netns, wire each address (/32 or /128 + link-local gateway; see `wiring.rs`), attach the
//! eBPF datapath (classification, counters, shaping; see `datapath/`), and return the result.
//! Any failure after something was created rolls everything back, the reservations included.
//!
//! The daemon round trip (which includes its fsync) is the longest step, so the Allocate goes
//! out on a helper thread right after connecting, and this thread sets up netlink and creates
//! the veth pair meanwhile: the two are independent until the addresses are known.

use std::{net::IpAddr, time::Instant};

use aliasnet_cni_types::{code, AttachEnv, CniArgs, CniError, CniResult, Interface, NetConf};
use aliasnet_ipam_proto::{host_veth_name, AttachmentKey, Lease, PodRef, Request, Response};

use crate::{
    datapath, ipam,
    netns::NetNs,
    nl::{self, nl_err, Link, Nl},
    sysctl,
    wire::Links,
    wiring::{self, Wiring},
};

type AllocCall = std::thread::JoinHandle<Result<Response, aliasnet_ipam_proto::ClientError>>;

/// What exists so far and must be undone on failure.
#[derive(Default)]
struct Progress {
    /// The host veth we created (its peer goes with it).
    veth: Option<String>,
    /// Whether the daemon may hold a reservation for the key.
    lease: LeaseState,
    /// The Allocate in flight, until its answer is collected.
    alloc: Option<AllocCall>,
}

impl Progress {
    /// Wait for the Allocate's answer and record what the daemon may now hold.
    /// The leases, IPv4's first.
    fn settle_alloc(&mut self) -> Result<Vec<Lease>, CniError> {
        let Some(call) = self.alloc.take() else {
            return Err(CniError::new(
                code::INTERNAL,
                "allocation answer collected twice",
            ));
        };
        match call.join() {
            Ok(Ok(Response::Allocated { lease, more })) => {
                self.lease = LeaseState::Held;
                Ok(std::iter::once(lease).chain(more).collect())
            }
            Ok(Ok(other)) => {
                self.lease = LeaseState::Unknown;
                Err(ipam::unexpected("ALLOCATE", &other))
            }
            Ok(Err(e)) => {
                if ipam::outcome_unknown(&e) {
                    self.lease = LeaseState::Unknown;
                }
                Err(ipam::to_cni(&e))
            }
            Err(_) => {
                self.lease = LeaseState::Unknown;
                Err(CniError::new(
                    code::INTERNAL,
                    "the allocation thread panicked",
                ))
            }
        }
    }
}

#[derive(Default, PartialEq, Eq, Debug)]
enum LeaseState {
    #[default]
    None,
    Held,
    /// No answer (timeout, daemon died mid-call): it may or may not have allocated.
    Unknown,
}

pub fn run(conf: &NetConf, env: &AttachEnv) -> Result<serde_json::Value, CniError> {
    let t0 = Instant::now();
    let args = CniArgs::parse(&env.args)?;
    let prev = conf
        .prev_result
        .as_ref()
        .map(CniResult::from_prev_result)
        .transpose()?;
    let key = AttachmentKey::new(&conf.name, &env.container_id, &env.ifname);
    let host_veth = host_veth_name(&conf.host_veth_prefix, &key);
    let netns = NetNs::open(&env.netns)?;
    // Everything that can reject the pod without side effects comes before the Allocate: bad
    // bandwidth values, a limit we cannot honour, the datapath not pinned yet.
    let wanted = datapath::requested(conf)?;
    let mut dp = datapath::open_for_add(conf, &wanted)?;
    if dp.is_some() {
        datapath::check_identity(&args, env)?;
    }
    let t_dp_open = t0.elapsed();
    let rt = crate::runtime()?;
    // Connecting first means "daemon down" fails before anything exists (code 11).
    let mut client = ipam::connect(conf).map_err(|e| ipam::to_cni(&e))?;
    let req = Request::Allocate {
        key: key.clone(),
        pod: PodRef {
            namespace: args.k8s_pod_namespace.clone(),
            name: args.k8s_pod_name.clone(),
            uid: args.k8s_pod_uid.clone(),
        },
        pool: conf.pool.clone(),
        host_veth: Some(host_veth.clone()),
        families: conf
            .ip_families
            .as_ref()
            .map(|f| f.iter().map(|&f| ipam::family(f)).collect()),
    };
    let mut progress = Progress {
        alloc: Some(std::thread::spawn(move || client.call(&req))),
        ..Progress::default()
    };
    let t_setup = t0.elapsed();
    let outcome = rt.block_on(async {
        let (host, pod) = match Nl::connect().and_then(|h| Ok((h, netns.enter(Nl::connect)??))) {
            Ok(p) => p,
            Err(e) => {
                // Nothing was created here, but the Allocate may have succeeded.
                let _ = progress.settle_alloc();
                let problems = match progress.lease {
                    LeaseState::None => vec![],
                    _ => release(conf, &key).err().into_iter().collect(),
                };
                return Err(append_problems(e, &problems));
            }
        };
        let res = attach(conf, env, &host_veth, &netns, &host, &pod, &mut progress).await;
        let t_net = t0.elapsed();
        // Last step: on failure the library has undone its part and the rollback below
        // removes the veth and the lease.
        let res = res.and_then(|(result, w)| {
            if let Some(dp) = dp.as_mut() {
                let id = datapath::identity(&args, env, w.v4, w.v6);
                datapath::attach(conf, dp, &host_veth, env, id, wanted.limits)?;
            }
            Ok(result)
        });
        let t_attach = t0.elapsed() - t_net;
        match res {
            Ok(r) => Ok((r, t_net, t_attach)),
            Err(e) => Err(rollback(conf, &key, &host, &mut progress, e).await),
        }
    });
    // The process exits right after; skip the orderly wind-down of the runtime.
    rt.shutdown_background();
    let (ours, t_net, t_attach) = outcome?;
    let mut result = prev.unwrap_or_default();
    result.merge(ours);
    tracing::debug!(
        datapath_open_us = t_dp_open.as_micros() as u64,
        setup_us = t_setup.as_micros() as u64,
        network_us = t_net.as_micros() as u64,
        datapath_attach_us = t_attach.as_micros() as u64,
        total_us = t0.elapsed().as_micros() as u64,
        "ADD done"
    );
    Ok(result.to_json(conf.cni_version))
}

async fn attach(
    conf: &NetConf,
    env: &AttachEnv,
    host_veth: &str,
    netns: &NetNs,
    host: &Nl,
    pod: &Nl,
    progress: &mut Progress,
) -> Result<(CniResult, Wiring), CniError> {
    let t0 = Instant::now();
    let ifname = env.ifname.as_str();
    let host_veth = host_veth.to_owned();

    if let Some(existing) = pod
        .link_by_name(ifname)
        .await
        .map_err(|e| nl_err(format!("look up {ifname} in {}", netns.path()), e))?
    {
        // The Allocate went out already. If the interface is the live peer of this key's
        // host veth (a repeated ADD), the lease is that attachment's: keep it. Otherwise
        // the reservation is ours to undo.
        let _ = progress.settle_alloc();
        let live = host
            .link_by_name(&host_veth)
            .await
            .ok()
            .flatten()
            .is_some_and(|h| h.peer_index == Some(existing.index));
        if live {
            progress.lease = LeaseState::None;
        }
        return Err(CniError::new(
            code::INTERFACE_EXISTS,
            format!(
                "interface {ifname} already exists in netns {}",
                netns.path()
            ),
        ));
    }
    let mtu = match conf.mtu {
        Some(m) => m,
        None => detect_mtu(host).await?,
    };
    let t_pre = t0.elapsed();

    // Fast path: create the pair while the daemon allocates. If our host name is taken, it is
    // the veth of an earlier attachment of this same key (a crashed ADD, or a DEL whose
    // asynchronous teardown is still running). The daemon answers an Allocate only once its
    // own teardown of that name is done, so wait for the answer before touching the old veth:
    // deleting it now could race the daemon's deletion of the same name with our new veth.
    let pair = match host.create_veth(&host_veth, ifname, netns.fd(), mtu).await {
        Ok(()) => Pair::Created,
        Err(e) if nl::errno(&e) == Some(libc::EEXIST) => Pair::HostNameTaken,
        Err(e) => Pair::Failed(nl_err(create_what(&host_veth, ifname, netns), e)),
    };
    let wired = match pair {
        Pair::Created => {
            progress.veth = Some(host_veth.clone());
            Some(finish_pair(host, pod, &host_veth, ifname).await)
        }
        _ => None,
    };
    let t_pair = t0.elapsed();

    // Blocking is fine here: no other netlink request is in flight.
    let leases = progress.settle_alloc();
    let t_alloc = t0.elapsed();
    // The daemon's answer is the more useful error (pool exhausted, daemon down).
    let leases = leases.map_err(|e| e.context("allocating an address"))?;
    let addrs: Vec<IpAddr> = leases.iter().map(|l| l.address).collect();
    let w = Wiring::new(conf, &addrs)
        .and_then(|w| w.check_families(conf).map(|()| w))
        .map_err(|e| {
            CniError::new(
                code::IPAM_ERROR,
                format!("aliasnet-ipamd's allocation for {host_veth}: {e}"),
            )
        })?;
    let (hlink, plink) = match (pair, wired) {
        (_, Some(w)) => w?,
        (Pair::Failed(e), _) => return Err(e),
        (Pair::HostNameTaken, _) => {
            tracing::warn!(
                host_veth,
                "deleting a stale host veth of the same attachment"
            );
            host.del_link_by_name(&host_veth)
                .await
                .map_err(|e| nl_err(format!("host: delete stale {host_veth}"), e))?;
            host.create_veth(&host_veth, ifname, netns.fd(), mtu)
                .await
                .map_err(|e| nl_err(create_what(&host_veth, ifname, netns), e))?;
            progress.veth = Some(host_veth.clone());
            finish_pair(host, pod, &host_veth, ifname).await?
        }
        (Pair::Created, None) => unreachable!("a created pair is always finished"),
    };
    let h_mac = hlink.mac.ok_or_else(|| {
        CniError::new(
            code::NETLINK,
            format!("host veth {host_veth} has no MAC address"),
        )
    })?;
    if w.v6.is_some() {
        // Before any IPv6 address or route: the kernel refuses them on a link without IPv6.
        sysctl::enable_ipv6_forward()?;
        sysctl::enable_ipv6_on(&host_veth)?;
        netns.enter(|| sysctl::pod_ipv6(ifname))??;
    }
    let links = Links {
        host,
        pod,
        host_veth: &host_veth,
        host_index: hlink.index,
        ifname,
        pod_index: plink.index,
        host_mac: h_mac,
    };
    links.wire(&w).await?;
    tracing::debug!(
        pre_us = t_pre.as_micros() as u64,
        pair_us = t_pair.as_micros() as u64,
        alloc_us = t_alloc.as_micros() as u64,
        total_us = t0.elapsed().as_micros() as u64,
        "ADD netlink timings"
    );
    let addrs = wiring::describe(&w.addrs());
    tracing::info!(ip = %addrs, host_veth, mtu, "attached");

    let result = CniResult {
        interfaces: vec![
            Interface {
                name: host_veth.clone(),
                mac: Some(nl::format_mac(&h_mac)),
                ..Default::default()
            },
            Interface {
                name: ifname.to_owned(),
                mac: plink.mac_string(),
                mtu: Some(mtu),
                sandbox: Some(env.netns.clone()),
                ..Default::default()
            },
        ],
        ips: w.ips(1),
        routes: w.routes(),
        dns: conf.dns.clone().unwrap_or_default(),
    };
    Ok((result, w))
}

/// MTU of the default route's interface; without one the operator must say.
pub async fn detect_mtu(host: &Nl) -> Result<u32, CniError> {
    match host.default_route_mtu().await {
        Ok(Some((dev, mtu))) => {
            tracing::debug!(dev, mtu, "MTU from the default route");
            Ok(mtu)
        }
        Ok(None) => Err(CniError::config(
            "mtu",
            "the host has no default route (IPv4 or IPv6) to take the MTU from; set \"mtu\" in the \
             config",
        )),
        Err(e) => Err(nl_err(
            "host: dump routes to find the default route's MTU",
            e,
        )),
    }
}

enum Pair {
    Created,
    HostNameTaken,
    Failed(CniError),
}

fn create_what(host_veth: &str, ifname: &str, netns: &NetNs) -> String {
    format!(
        "host: create veth {host_veth} with peer {ifname} in {}",
        netns.path()
    )
}

/// Look up both ends of a fresh pair, bring the pod end up and set the host-side sysctls.
async fn finish_pair(
    host: &Nl,
    pod: &Nl,
    host_veth: &str,
    ifname: &str,
) -> Result<(Link, Link), CniError> {
    let (h, p) = futures::join!(host.link_by_name(host_veth), pod.link_by_name(ifname));
    let missing =
        |w: String| CniError::new(code::NETLINK, format!("{w} vanished right after creation"));
    let h = h
        .map_err(|e| nl_err(format!("host: get {host_veth}"), e))?
        .ok_or_else(|| missing(format!("host veth {host_veth}")))?;
    let p = p
        .map_err(|e| nl_err(format!("pod: get {ifname}"), e))?
        .ok_or_else(|| missing(format!("pod interface {ifname}")))?;
    if !p.up {
        pod.set_up(p.index)
            .await
            .map_err(|e| nl_err(format!("pod: set {ifname} up"), e))?;
    }
    sysctl::enable_ip_forward()?;
    sysctl::set_rp_filter_loose(host_veth)?;
    sysctl::disable_accept_ra(host_veth)?;
    Ok((h, p))
}

/// Undo what `progress` says exists; returns `err` with any rollback failure appended (the
/// code stays the original one).
async fn rollback(
    conf: &NetConf,
    key: &AttachmentKey,
    host: &Nl,
    progress: &mut Progress,
    err: CniError,
) -> CniError {
    let mut problems = Vec::new();
    if progress.alloc.is_some() {
        // Failed before the answer was needed: learn whether there is a lease to undo.
        let _ = progress.settle_alloc();
    }
    if let Some(name) = &progress.veth {
        if let Err(e) = host.del_link_by_name(name).await {
            problems.push(nl_err(format!("deleting host veth {name}"), e).msg);
        }
    }
    if progress.lease != LeaseState::None {
        if let Err(p) = release(conf, key) {
            problems.push(p);
        }
    }
    tracing::warn!(error = %err, ?problems, "ADD failed; rolled back");
    append_problems(err, &problems)
}

/// `err` with rollback failures appended; the code stays the original one.
fn append_problems(err: CniError, problems: &[String]) -> CniError {
    if problems.is_empty() {
        return err;
    }
    CniError {
        msg: format!("{}; rollback also failed: {}", err.msg, problems.join("; ")),
        ..err
    }
}

/// Release `key` synchronously (rollback); when the daemon is down, spool the release.
fn release(conf: &NetConf, key: &AttachmentKey) -> Result<(), String> {
    let req = Request::Release {
        key: key.clone(),
        teardown_link: None,
    };
    match ipam::call(conf, &req) {
        Ok(Response::Released { .. }) => Ok(()),
        Ok(other) => Err(ipam::unexpected("RELEASE", &other).msg),
        // The daemon may hold the lease; make the release durable for its restart.
        Err(e) if ipam::is_down(&e) => {
            ipam::spool_release(conf, key, None)
                .map(|_| ())
                .map_err(|se| {
                    format!(
                        "releasing {key}: {}; spooling the release failed too: {}",
                        ipam::error_chain(&e),
                        ipam::error_chain(&se)
                    )
                })
        }
        Err(e) => Err(format!("releasing {key}: {}", ipam::error_chain(&e))),
    }
}
