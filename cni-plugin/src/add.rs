//! ADD: reserve an address per family, build the veth pair with the peer born in the pod's
//! netns, wire each address (/32 or /128 + link-local gateway; see `plan.rs`), attach the
//! eBPF datapath (classification, counters, shaping; see `attachment/`), and return the result.
//! Any failure after something was created rolls everything back, the reservations included.
//!
//! The daemon's answer (which waits for its fsync) is the longest step, so the Allocate goes
//! out right after connecting and its answer is read only once the veth pair exists: the
//! pair, the two netlink sockets and the host's sysctls are independent of the addresses.
//! The pod's socket is opened on a short-lived thread inside the pod's netns, from the start,
//! and collected only when the pod side is wired; no thread that works on the host ever
//! enters the pod.

use std::time::Instant;

use aliasnet_cni_types::{code, AttachEnv, CniArgs, CniError, CniResult, Interface, NetConf};
use aliasnet_ipam_proto::{
    host_veth_name, AttachmentKey, Client, ClientError, Lease, PodRef, Request, Response,
};
use aliasnet_netlink::{link::format_mac, Link, NetlinkError, Removed, Rtnl};
use aliasnet_netns::Spawned;

use crate::{
    attachment, ipam,
    plan::{self, Plan},
    pod_netns::PodNetns,
    sysctl,
    veth::{self, to_cni, Pair},
};

/// The Allocate, from sending it to reading its answer.
enum Pending {
    Sent(Client),
    /// Writing it failed: the daemon may or may not have read it.
    Failed(ClientError),
}

/// What exists so far and must be undone on failure.
#[derive(Default)]
struct Progress {
    /// The host veth we created, index and name (its peer goes with it).
    veth: Option<(u32, String)>,
    /// Whether the daemon may hold a reservation for the key.
    lease: LeaseState,
    /// The Allocate in flight, until its answer is collected.
    alloc: Option<Pending>,
}

impl Progress {
    /// Wait for the Allocate's answer and record what the daemon may now hold.
    /// The leases, IPv4's first.
    fn settle_alloc(&mut self) -> Result<Vec<Lease>, CniError> {
        let answer = match self.alloc.take() {
            None => {
                return Err(CniError::new(
                    code::INTERNAL,
                    "allocation answer collected twice",
                ))
            }
            Some(Pending::Sent(mut c)) => c.receive(),
            Some(Pending::Failed(e)) => Err(e),
        };
        match answer {
            Ok(Response::Allocated { lease, more }) => {
                self.lease = LeaseState::Held;
                Ok(std::iter::once(lease).chain(more).collect())
            }
            Ok(other) => {
                self.lease = LeaseState::Unknown;
                Err(ipam::unexpected("ALLOCATE", &other))
            }
            Err(e) => {
                if ipam::outcome_unknown(&e) {
                    self.lease = LeaseState::Unknown;
                }
                Err(ipam::to_cni(&e))
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
    let netns = PodNetns::open(&env.netns)?;
    // The pod's netlink socket is opened by a short-lived thread inside the pod's netns while
    // this one validates, opens the datapath and sends the Allocate.
    std::thread::scope(|s| {
        let pod = netns.spawn(s, Rtnl::new);
        add(conf, env, &args, prev, &netns, pod, t0)
    })
}

fn add(
    conf: &NetConf,
    env: &AttachEnv,
    args: &CniArgs,
    prev: Option<CniResult>,
    netns: &PodNetns,
    pod_socket: Spawned<'_, Result<Rtnl, NetlinkError>>,
    t0: Instant,
) -> Result<serde_json::Value, CniError> {
    let key = AttachmentKey::new(&conf.name, &env.container_id, &env.ifname);
    let host_veth = host_veth_name(&conf.host_veth_prefix, &key);
    // Everything that can reject the pod without side effects comes before the Allocate: bad
    // bandwidth values, a limit we cannot honour, the datapath not pinned yet.
    let wanted = attachment::requested(conf)?;
    let mut dp = attachment::open_for_add(conf, &wanted)?;
    if dp.is_some() {
        attachment::check_identity(args, env)?;
    }
    let t_dp_open = t0.elapsed();
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
        alloc: Some(match client.send(&req) {
            Ok(()) => Pending::Sent(client),
            Err(e) => Pending::Failed(e),
        }),
        ..Progress::default()
    };
    let t_setup = t0.elapsed();

    let (mut host, mtu) = match host_socket(conf) {
        Ok(s) => s,
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
    let mut pod = PodSocket::Starting(pod_socket);
    let res = wire_pod(
        conf,
        env,
        PairSpec {
            host_veth: &host_veth,
            netns,
            mtu,
        },
        &mut host,
        &mut pod,
        &mut progress,
    );
    let t_net = t0.elapsed();
    // Last step: on failure the library has undone its part and the rollback below removes
    // the veth and the lease.
    let res = res.and_then(|(result, plan, host_link)| {
        if let Some(dp) = dp.as_mut() {
            let id = attachment::identity(args, env, plan.v4(), plan.v6());
            let mac = attachment::sandbox_mac(&result);
            attachment::attach(conf, dp, &host_link, netns, env, id, wanted.limits, mac)?;
        }
        Ok(result)
    });
    let t_attach = t0.elapsed() - t_net;
    let ours = match res {
        Ok(r) => r,
        Err(e) => return Err(rollback(conf, &key, &mut host, &mut progress, e)),
    };
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

/// The host's netlink socket and the MTU (the config's, or the uplink's).
fn host_socket(conf: &NetConf) -> Result<(Rtnl, u32), CniError> {
    let mut host = Rtnl::new().map_err(|e| to_cni(e.with_op("host: open a netlink socket")))?;
    let mtu = match conf.mtu {
        Some(m) => m,
        None => veth::uplink_mtu(&mut host)?,
    };
    Ok((host, mtu))
}

/// The pod's netlink socket, opened by its thread inside the pod's netns; collected the first
/// time it is needed, so that the thread's start overlaps the host's work.
enum PodSocket<'s> {
    Starting(Spawned<'s, Result<Rtnl, NetlinkError>>),
    Open(Rtnl),
    Failed,
}

impl PodSocket<'_> {
    fn get(&mut self, netns: &PodNetns) -> Result<&mut Rtnl, CniError> {
        if let PodSocket::Starting(_) = self {
            let PodSocket::Starting(work) = std::mem::replace(self, PodSocket::Failed) else {
                unreachable!("matched above")
            };
            let rtnl = netns.join(work)?.map_err(|e| {
                to_cni(e.with_op(format!("pod: open a netlink socket in {}", netns.path())))
            })?;
            *self = PodSocket::Open(rtnl);
        }
        match self {
            PodSocket::Open(r) => Ok(r),
            _ => Err(CniError::new(
                code::NETLINK,
                format!("pod: no netlink socket in {}", netns.path()),
            )),
        }
    }
}

/// What creating the pair gave.
enum Created {
    Pair(Link),
    /// Our host name is taken: by the veth of an earlier attachment of this same key (a
    /// crashed ADD, or a DEL whose asynchronous teardown is still running).
    HostNameTaken,
    Failed(CniError),
}

/// The veth pair to make, besides the pod's interface name.
struct PairSpec<'a> {
    host_veth: &'a str,
    netns: &'a PodNetns,
    mtu: u32,
}

/// The network part of ADD: the pair, its sysctls, the addresses and routes of every family.
/// Returns the result, the plan and the host veth as its creation echoed it.
fn wire_pod(
    conf: &NetConf,
    env: &AttachEnv,
    spec: PairSpec<'_>,
    host: &mut Rtnl,
    pod: &mut PodSocket<'_>,
    progress: &mut Progress,
) -> Result<(CniResult, Plan, Link), CniError> {
    let t0 = Instant::now();
    let PairSpec {
        host_veth,
        netns,
        mtu,
    } = spec;
    let ifname = env.ifname.as_str();

    // Fast path: create the pair while the daemon allocates. The daemon answers an Allocate
    // only once its own teardown of a stale veth of this key is done, so a taken host name
    // waits for the answer before the old veth is touched: deleting it now could race the
    // daemon's deletion of the same name with our new veth.
    let what = format!(
        "host: create veth {host_veth} with peer {ifname} in {}",
        netns.path()
    );
    let created =
        match host.create_veth(host_veth, ifname, netns.fd(), mtu, &what) {
            Ok(l) => {
                progress.veth = Some((l.index, l.name.clone()));
                host_sysctls(host_veth).map(|()| Created::Pair(l))?
            }
            Err(e) if e.errno() == Some(libc::EEXIST) => {
                // The pod's interface name, or our host name, is taken.
                if let Some(existing) = pod.get(netns)?.link_by_name(ifname).map_err(|e| {
                    to_cni(e.with_op(format!("look up {ifname} in {}", netns.path())))
                })? {
                    return Err(interface_exists(
                        host, host_veth, ifname, netns, &existing, progress,
                    ));
                }
                Created::HostNameTaken
            }
            Err(e) => Created::Failed(to_cni(e)),
        };
    let t_pair = t0.elapsed();

    let leases = progress.settle_alloc();
    let t_alloc = t0.elapsed();
    // The daemon's answer is the more useful error (pool exhausted, daemon down).
    let leases = leases.map_err(|e| e.context("allocating an address"))?;
    let addrs: Vec<_> = leases.iter().map(|l| l.address).collect();
    let plan = Plan::new(conf, &addrs)
        .and_then(|p| p.check_families(conf).map(|()| p))
        .map_err(|e| {
            CniError::new(
                code::IPAM_ERROR,
                format!("aliasnet-ipamd's allocation for {host_veth}: {e}"),
            )
        })?;
    let host_link = match created {
        Created::Pair(l) => l,
        Created::Failed(e) => return Err(e),
        Created::HostNameTaken => {
            tracing::warn!(
                host_veth,
                "deleting a stale host veth of the same attachment"
            );
            match host.delete_veth(host_veth) {
                Ok(Removed::Deleted | Removed::NotFound) => {}
                Ok(Removed::NotVeth(kind)) => {
                    return Err(CniError::new(
                        code::NETLINK,
                        format!(
                            "host: {host_veth} exists and is a {kind}, not a veth of aliasnet; \
                             it is left alone"
                        ),
                    ))
                }
                Err(e) => return Err(to_cni(e.with_op(format!("host: delete stale {host_veth}")))),
            }
            let l = host
                .create_veth(host_veth, ifname, netns.fd(), mtu, &what)
                .map_err(to_cni)?;
            progress.veth = Some((l.index, l.name.clone()));
            host_sysctls(host_veth)?;
            l
        }
    };
    if plan.v6().is_some() {
        // Before any IPv6 address or route: the kernel refuses them on a link without IPv6.
        sysctl::enable_ipv6_forward()?;
        sysctl::enable_ipv6_on(host_veth)?;
        netns.run(|| sysctl::pod_ipv6(ifname))??;
    }
    let pod_link = Pair {
        host,
        pod: pod.get(netns)?,
        host_link: &host_link,
        ifname,
    }
    .wire(&plan)?;
    tracing::debug!(
        pair_us = t_pair.as_micros() as u64,
        alloc_us = t_alloc.as_micros() as u64,
        total_us = t0.elapsed().as_micros() as u64,
        "ADD netlink timings"
    );
    let addrs = plan::describe(&plan.addrs());
    tracing::info!(ip = %addrs, host_veth, mtu, "attached");

    let result = CniResult {
        interfaces: vec![
            Interface {
                name: host_veth.to_owned(),
                mac: host_link.mac.map(|m| format_mac(&m)),
                ..Default::default()
            },
            Interface {
                name: ifname.to_owned(),
                mac: pod_link.mac_string(),
                mtu: Some(mtu),
                sandbox: Some(env.netns.clone()),
                ..Default::default()
            },
        ],
        ips: plan.ips(1),
        routes: plan.routes(),
        dns: conf.dns.clone().unwrap_or_default(),
    };
    Ok((result, plan, host_link))
}

/// The host-side sysctls of a fresh host veth.
fn host_sysctls(host_veth: &str) -> Result<(), CniError> {
    sysctl::enable_ip_forward()?;
    sysctl::set_rp_filter_loose(host_veth)?;
    sysctl::disable_accept_ra(host_veth)
}

/// The pod already has an interface named `ifname`. The Allocate went out already: if that
/// interface is the live peer of this key's host veth (a repeated ADD), the lease is that
/// attachment's and stays; otherwise the reservation is ours to undo.
fn interface_exists(
    host: &mut Rtnl,
    host_veth: &str,
    ifname: &str,
    netns: &PodNetns,
    existing: &Link,
    progress: &mut Progress,
) -> CniError {
    let _ = progress.settle_alloc();
    let live = host
        .link_by_name(host_veth)
        .ok()
        .flatten()
        .is_some_and(|h| h.peer_index == Some(existing.index));
    if live {
        progress.lease = LeaseState::None;
    }
    CniError::new(
        code::INTERFACE_EXISTS,
        format!(
            "interface {ifname} already exists in netns {}",
            netns.path()
        ),
    )
}

/// Undo what `progress` says exists; returns `err` with any rollback failure appended (the
/// code stays the original one).
fn rollback(
    conf: &NetConf,
    key: &AttachmentKey,
    host: &mut Rtnl,
    progress: &mut Progress,
    err: CniError,
) -> CniError {
    let mut problems = Vec::new();
    if progress.alloc.is_some() {
        // Failed before the answer was needed: learn whether there is a lease to undo.
        let _ = progress.settle_alloc();
    }
    if let Some((index, name)) = &progress.veth {
        if let Err(e) = host
            .delete_link(*index)
            .map_err(|e| e.with_op(format!("deleting host veth {name}")))
        {
            problems.push(to_cni(e).msg);
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
