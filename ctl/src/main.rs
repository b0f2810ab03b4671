//! aliasnetctl: the operator's view of one aliasnet node.
//!
//! Reads aliasnet-ipamd over its socket, aliasnet-shaperd's pinned eBPF maps directly (so
//! `pods` and `top` work while shaperd restarts), both daemons' `/metrics` endpoints, the
//! kernel over netlink, and (`budget`) the cluster budget's etcd. Run it on the node (or in the node's network namespace) as root.

#![deny(clippy::print_stdout)]

mod budget;
mod classes;
mod daemons;
mod doctor;
mod http;
mod ipam;
mod output;
mod pods;
mod probe;
mod status;
mod top;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use aliasnet_ebpf::DEFAULT_PIN_ROOT;
use aliasnet_ipam_proto::{AttachmentKey, DEFAULT_HOST_VETH_PREFIX, DEFAULT_SOCKET};
use clap::{Args, Parser, Subcommand};

const DEFAULT_IPAMD_METRICS: &str = "127.0.0.1:9545";
const DEFAULT_SHAPERD_METRICS: &str = "127.0.0.1:9546";

/// Options every command takes.
#[derive(Debug, Args)]
pub struct Global {
    /// aliasnet-ipamd's socket.
    #[arg(long, global = true, default_value = DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,
    /// bpffs directory where aliasnet-shaperd pinned the datapath.
    #[arg(long, global = true, default_value = DEFAULT_PIN_ROOT, value_name = "PATH")]
    pin_root: PathBuf,
    /// aliasnet-ipamd's metrics endpoint (`metrics_address` in ipamd.toml).
    #[arg(long, global = true, default_value = DEFAULT_IPAMD_METRICS, value_name = "HOST:PORT")]
    ipamd_metrics: String,
    /// aliasnet-shaperd's metrics endpoint (its --metrics-address).
    #[arg(long, global = true, default_value = DEFAULT_SHAPERD_METRICS, value_name = "HOST:PORT")]
    shaperd_metrics: String,
    /// Print JSON instead of tables (`top`: one JSON object per line and refresh).
    #[arg(long, global = true)]
    json: bool,
    /// Seconds to wait for a daemon's answer.
    #[arg(long, global = true, default_value_t = 3.0, value_name = "SECONDS")]
    timeout_secs: f64,
}

impl Global {
    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs.clamp(0.01, 3600.0))
    }

    /// `aliasnetctl` with the daemon-locating flags that differ from the defaults, for
    /// printing commands the operator can paste.
    fn ctl_command(&self) -> String {
        let mut c = String::from("aliasnetctl");
        if self.socket != std::path::Path::new(DEFAULT_SOCKET) {
            c.push_str(&format!(" --socket {}", self.socket.display()));
        }
        if self.pin_root != std::path::Path::new(DEFAULT_PIN_ROOT) {
            c.push_str(&format!(" --pin-root {}", self.pin_root.display()));
        }
        c
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "aliasnetctl",
    version,
    about = "Inspect and troubleshoot aliasnet on this node",
    after_help = "Examples:\n  aliasnetctl status\n  aliasnetctl pods --namespace team-a\n  aliasnetctl top --sort internet\n  aliasnetctl doctor\n  aliasnetctl budget\n  aliasnetctl ipam --json | jq '.pools'\n\nExit codes: 0 fine, 1 a problem was found or a daemon is down, 2 usage error."
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Daemons reachable, programs attached per pod, pool usage, kernel features, config in force (classes, limits of every level, traffic by class).
    #[command(
        after_help = "Examples:\n  aliasnetctl status\n  aliasnetctl status --json | jq '.problems'\n  aliasnetctl status --socket /run/aliasnet/ipamd.sock --shaperd-metrics 10.0.0.5:9546\n\nExits 1 when anything is down or missing (everything is still printed)."
    )]
    Status,
    /// Attached pods: IP, namespace/pod, limits and counters per traffic class (every named class).
    #[command(
        after_help = "Examples:\n  aliasnetctl pods\n  aliasnetctl pods --namespace training\n  aliasnetctl pods --json | jq '.[] | {pod, internet: .egress.internet.bytes}'\n  aliasnetctl pods --json | jq '.[] | {pod, mirrors: .ingress.classes.mirrors.bytes, limit: .limits.classes.mirrors.ingress}'\n\nCounters are read from the pinned eBPF maps; they count from the pod's attach. Internet counts include the named classes."
    )]
    Pods {
        /// Only pods of this Kubernetes namespace.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
    },
    /// Live per-pod internal/internet rates and those of each named class, with the pod's limits, refreshed in place like top(1).
    #[command(
        after_help = "Examples:\n  aliasnetctl top\n  aliasnetctl top --interval 5 --sort total --limit 20\n  aliasnetctl top --once\n  aliasnetctl top --iterations 3 --json   # one JSON object per line\n\nRates are bit/s over each interval (blocked: packets/s). Ctrl-C quits."
    )]
    Top {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
        interval: f64,
        /// Print one refresh and exit.
        #[arg(long, conflicts_with = "iterations")]
        once: bool,
        /// Exit after this many refreshes.
        #[arg(long, value_name = "N")]
        iterations: Option<u64>,
        /// Order of the rows.
        #[arg(long, value_enum, default_value = "internet")]
        sort: top::SortBy,
        /// Rows shown.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Find leases without a veth, veths without a lease, missing programs, MTU mismatches,
    /// class prefixes that other lists shadow and wrong sysctls, each with the command that
    /// fixes it.
    #[command(
        after_help = "Examples:\n  aliasnetctl doctor\n  aliasnetctl doctor --json | jq -r '.findings[].fix'\n  aliasnetctl doctor --veth-prefix ali --grace 60\n\nRun it in the node's network namespace. Exits 1 when it found something."
    )]
    Doctor {
        /// Prefix of aliasnet's host veths (`host_veth_prefix` in ipamd.toml).
        #[arg(long, default_value = DEFAULT_HOST_VETH_PREFIX)]
        veth_prefix: String,
        /// Seconds a lease may exist without its veth (a CNI ADD in progress).
        #[arg(long, default_value_t = 30, value_name = "SECONDS")]
        grace: u64,
    },
    /// Address pools, usage, cooling addresses and leases with their pods (aliasnet-ipamd).
    #[command(
        args_conflicts_with_subcommands = true,
        after_help = "Examples:\n  aliasnetctl ipam\n  aliasnetctl ipam --pool secondary --no-leases\n  aliasnetctl ipam --json | jq '.leases[] | select(.pod.namespace == \"team-a\")'\n  aliasnetctl ipam release --network aliasnet --container-id 0123abcd --ifname eth0"
    )]
    Ipam {
        #[command(subcommand)]
        action: Option<IpamAction>,
        /// Leases fetched per request (ListPage).
        #[arg(long, default_value_t = 1000, value_name = "N")]
        page_size: u32,
        /// Only this pool.
        #[arg(long)]
        pool: Option<String>,
        /// Pools only, no lease list.
        #[arg(long)]
        no_leases: bool,
    },
    /// Cluster budgets: the leader's level, totals and nodes (from etcd), and this node's
    /// demand, share, use and mode (from aliasnet-shaperd).
    #[command(
        after_help = "Examples:\n  aliasnetctl budget\n  aliasnetctl budget --config /etc/aliasnet/shaper.toml --node ip-10-0-0-1\n  aliasnetctl budget --json | jq '.budgets[] | {budget, level_bps, node}'\n\nReads [cluster] of the node policy for etcd's endpoints and client certificates. Exits 1 when etcd cannot be read or no leader is elected."
    )]
    Budget {
        /// The node policy with [cluster] (aliasnet-shaperd's --config).
        #[arg(long, default_value = "/etc/aliasnet/shaper.toml", value_name = "PATH")]
        config: PathBuf,
        /// This node's name in the budget (default: NODE_NAME, else the host name).
        #[arg(long)]
        node: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum IpamAction {
    /// Release one lease (what a CNI DEL does to IPAM; interfaces are not touched).
    #[command(
        after_help = "Examples:\n  aliasnetctl ipam release --network aliasnet --container-id 0123abcd --ifname eth0\n  aliasnetctl ipam release --veth ali1a2b3c4d5e6f   # a lease rebuilt by `aliasnet-ipamd recover`"
    )]
    Release {
        /// CNI network name of the attachment.
        #[arg(long, requires_all = ["container_id", "ifname"], conflicts_with = "veth")]
        network: Option<String>,
        /// CNI_CONTAINERID of the attachment.
        #[arg(long, requires = "network")]
        container_id: Option<String>,
        /// CNI_IFNAME of the attachment.
        #[arg(long, requires = "network")]
        ifname: Option<String>,
        /// Host veth of a recovered lease.
        #[arg(long, required_unless_present = "network")]
        veth: Option<String>,
    },
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let g = &cli.global;
    match cli.command {
        Command::Status => status::run(g),
        Command::Pods { namespace } => pods::run(g, namespace.as_deref()),
        Command::Top {
            interval,
            once,
            iterations,
            sort,
            limit,
        } => {
            if !(interval.is_finite() && interval > 0.0 && interval <= 3600.0) {
                anyhow::bail!("--interval must be between 0 and 3600 seconds");
            }
            top::run(
                g,
                &top::Options {
                    interval: Duration::from_secs_f64(interval),
                    iterations: if once { Some(1) } else { iterations },
                    sort,
                    limit,
                },
            )
        }
        Command::Budget { config, node } => {
            budget::run(g, &config, &aliasnet_budget::wire::node_name(node))
        }
        Command::Doctor { veth_prefix, grace } => doctor::run(
            g,
            &doctor::Options {
                veth_prefix,
                grace: Duration::from_secs(grace),
            },
        ),
        Command::Ipam {
            action:
                Some(IpamAction::Release {
                    network,
                    container_id,
                    ifname,
                    veth,
                }),
            ..
        } => {
            let target = match (network, container_id, ifname, veth) {
                (Some(n), Some(c), Some(i), None) => {
                    ipam::Target::Key(AttachmentKey::new(&n, &c, &i))
                }
                (None, None, None, Some(v)) => ipam::Target::Veth(v),
                _ => anyhow::bail!("give either --network, --container-id and --ifname, or --veth"),
            };
            ipam::release(g, target)
        }
        Command::Ipam {
            action: None,
            page_size,
            pool,
            no_leases,
        } => ipam::run(
            g,
            &ipam::Options {
                page_size,
                pool,
                leases: !no_leases,
            },
        ),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("aliasnetctl: {e:#}");
            ExitCode::from(1)
        }
    }
}
