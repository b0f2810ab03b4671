//! aliasnet-shaperd: loads and pins the eBPF datapath, applies node policy, reloads it on
//! change (file poll and SIGHUP), and removes attachments of pods that vanished without a
//! CNI DEL. Exiting (SIGTERM, crash, upgrade) detaches nothing: pods keep their programs,
//! shaping and counters through the pins, and the next start reuses them.
//!
//! It also serves Prometheus metrics (`--metrics-address`, see `aliasnet_shaper::metrics`),
//! rendered from the pinned maps at each scrape, and with a `[cluster]` in the policy runs the
//! cluster budget's share engine (`aliasnet_shaper::cluster`), whose shares cap the policy's
//! node and namespace limits.

use std::{
    collections::BTreeMap,
    io::IsTerminal,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use aliasnet_budget::BudgetKey;
use aliasnet_ebpf::{shadow::shadowed_class_prefixes, Datapath, DEFAULT_PIN_ROOT};
use aliasnet_shaper::{
    cluster::{self, ClusterBudget},
    metrics::{Aggregation, Exporter, ExporterOptions},
    Policy, DEFAULT_POLICY_PATH,
};
use anyhow::{Context, Result};
use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{debug, error, info, warn};

/// Default `--metrics-address`: loopback only; a DaemonSet scraped from the cluster sets
/// the node address (or 0.0.0.0) explicitly.
const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9546";
/// How often the daemon looks for pods attached or detached since its last look (one read
/// of the pinned config): their namespaces' and the node's aggregates then follow.
const PODS_POLL: Duration = Duration::from_millis(250);
/// How often the connection table of the window clamp is swept: entries of closed, silent
/// and deleted pods' connections go back to their pods' shares (their time to live is
/// seconds to minutes, see `an_conns`).
const CONNS_SWEEP: Duration = Duration::from_secs(5);
/// Period of the exporter's samples outside scrapes: node and namespace totals keep what a
/// pod counted even when it is deleted between two scrapes (losing at most this much), and the
/// shaping queues' drop counters (a netns switch per pod, kept off the scrape path) refresh.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// `--metrics-address`: an `IP:port`, or `off`.
#[derive(Debug, Clone, Copy)]
struct MetricsAddress(Option<SocketAddr>);

impl std::str::FromStr for MetricsAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "off" {
            return Ok(Self(None));
        }
        s.parse()
            .map(|a| Self(Some(a)))
            .map_err(|e| format!("{s:?} is not IP:port (e.g. 127.0.0.1:9546) or \"off\": {e}"))
    }
}

#[derive(Parser, Debug)]
#[command(name = "aliasnet-shaperd", version, about)]
struct Args {
    /// Node policy file.
    #[arg(long, default_value = DEFAULT_POLICY_PATH)]
    config: PathBuf,
    /// bpffs directory for pinned programs, maps and links.
    #[arg(long, default_value = DEFAULT_PIN_ROOT)]
    pin_root: PathBuf,
    /// Seconds between checks of the policy file for changes (SIGHUP reloads at once).
    #[arg(long, default_value_t = 2)]
    poll_interval: u64,
    /// Seconds between sweeps for attachments whose host veth is gone.
    #[arg(long, default_value_t = 60)]
    gc_interval: u64,
    /// Validate the policy file and exit.
    #[arg(long)]
    check: bool,
    /// Install the datapath, apply the policy once and exit.
    #[arg(long)]
    once: bool,
    /// Where to serve Prometheus metrics (GET /metrics), as IP:port; `off` disables.
    #[arg(long, default_value = DEFAULT_METRICS_ADDRESS)]
    metrics_address: MetricsAddress,
    /// Granularity of the per-pod metric families: `pod`, or `namespace` to sum pods per
    /// Kubernetes namespace (drops the pod label; for very large clusters).
    #[arg(long, default_value_t = Aggregation::Pod)]
    aggregate: Aggregation,
    /// This node's name in the cluster budget (default: $NODE_NAME, else the host name).
    #[arg(long)]
    node_name: Option<String>,
}

/// The policy file's contents: `None` if it does not exist (then defaults apply).
fn read_policy_text(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read policy {}", path.display())),
    }
}

fn parse_policy(path: &Path, text: Option<&str>) -> Result<Policy> {
    match text {
        Some(t) => Policy::parse(t)
            .map_err(|reason| anyhow::anyhow!("policy {}: {reason}", path.display())),
        None => Ok(Policy::default()),
    }
}

/// Warns about each class prefix that puts no address into its class (equal to a blocked
/// prefix, or covered by more specific prefixes of other lists): valid policy, rarely meant.
/// Returns how many there are.
fn warn_shadowed(path: &Path, policy: &Policy) -> usize {
    let view: Vec<_> = policy.prefixes().into_iter().collect();
    let classes: Vec<_> = policy
        .classes
        .iter()
        .map(|(name, cidrs)| (name.clone(), cidrs.clone()))
        .collect();
    let found = shadowed_class_prefixes(&view, &classes);
    for s in &found {
        warn!("policy {}: {s}", path.display());
    }
    found.len()
}

struct Daemon {
    args: Args,
    dp: Datapath,
    /// Text of the last policy seen (applied or rejected), to act once per change.
    seen: Option<Option<String>>,
    /// The pods epoch the aggregates were last reconciled at.
    pods_epoch: Option<u64>,
    /// The policy in force, as parsed: without the cluster shares.
    policy: Policy,
    /// The cluster budget engine's last shares.
    shares: BTreeMap<BudgetKey, u64>,
}

impl Daemon {
    /// Applies the policy with each cluster budget's share (the static split where the engine
    /// has none) as the node's or namespace's limit.
    fn apply(&mut self) -> Result<aliasnet_ebpf::PolicyReport> {
        let shares = cluster::shares_for(&self.policy.budgets, &self.shares);
        let capped = cluster::capped(&self.policy.datapath, &shares);
        let report = self.dp.apply_policy(&capped).context("apply policy")?;
        for e in &report.pod_errors {
            warn!("pod not updated to the new policy: {e}");
        }
        self.pods_epoch = None;
        Ok(report)
    }

    /// The engine's new shares.
    fn set_shares(&mut self, shares: BTreeMap<BudgetKey, u64>) -> Result<()> {
        if shares == self.shares {
            return Ok(());
        }
        self.shares = shares;
        let report = self.apply()?;
        debug!(shares = ?self.shares, epoch = report.epoch, "cluster budget: shares applied");
        Ok(())
    }

    /// Reads the policy and applies it if it changed since last time (or `force`); whether it
    /// applied a policy. An invalid or unappliable policy is logged and the applied one stays.
    fn reload(&mut self, force: bool) -> Result<bool> {
        let text = read_policy_text(&self.args.config)?;
        if !force && self.seen.as_ref() == Some(&text) {
            return Ok(false);
        }
        self.seen = Some(text.clone());
        if text.is_none() {
            warn!(path = %self.args.config.display(), "no policy file: using defaults (cloud metadata blocked, all traffic internet, no limits)");
        }
        let policy = parse_policy(&self.args.config, text.as_deref())?;
        warn_shadowed(&self.args.config, &policy);
        let previous = std::mem::replace(&mut self.policy, policy);
        let report = match self.apply() {
            Ok(r) => r,
            Err(e) => {
                self.policy = previous;
                return Err(e);
            }
        };
        info!(
            epoch = report.epoch,
            prefixes = report.prefixes,
            prefixes_changed = report.prefixes_changed,
            namespaces = report.namespaces,
            uplink = ?report.uplink,
            pods_updated = report.pods_updated,
            aggregates = report.aggregates.namespaces,
            cluster_budgets = self.policy.budgets.budgets.len(),
            "policy applied"
        );
        Ok(true)
    }

    /// Reconciles the aggregates when pods were attached or detached since the last time.
    fn follow_pods(&mut self) -> Result<()> {
        let epoch = self.dp.config()?.pods_epoch;
        if self.pods_epoch == Some(epoch) {
            return Ok(());
        }
        self.dp
            .reconcile_aggregates()
            .context("reconcile the aggregates")?;
        let pods = self.dp.pods().context("list the pods")?.len();
        self.dp
            .set_conn_share(u32::try_from(pods).unwrap_or(u32::MAX))
            .context("set the pods' share of the connection table")?;
        self.pods_epoch = Some(epoch);
        Ok(())
    }
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();

    if args.check {
        let text = read_policy_text(&args.config)?;
        let policy = parse_policy(&args.config, text.as_deref())?;
        let shadowed = warn_shadowed(&args.config, &policy);
        info!(
            prefixes = policy.prefixes().len(),
            classes = policy.classes.len(),
            namespaces = policy.datapath.namespaces.len(),
            shadowed,
            cluster = policy.budgets.cluster.is_some(),
            cluster_budgets = policy.budgets.budgets.len(),
            "policy {} is valid",
            args.config.display()
        );
        return Ok(());
    }

    let (dp, report) = Datapath::install(&args.pin_root)
        .with_context(|| format!("install datapath under {}", args.pin_root.display()))?;
    info!(
        root = %args.pin_root.display(),
        created_maps = ?report.created_maps,
        pinned = ?report.pinned_programs,
        upgraded = ?report.upgraded_programs,
        relinked = report.relinked,
        "datapath installed"
    );
    let first_start = dp.config()?.policy_epoch == 0;
    let mut daemon = Daemon {
        args,
        dp,
        seen: None,
        pods_epoch: None,
        policy: Policy::default(),
        shares: BTreeMap::new(),
    };
    if let Err(e) = daemon.reload(true) {
        // With a policy already applied (a restart), keep it and wait for a fixed file;
        // on a fresh node there is nothing safe to run with.
        if first_start {
            return Err(e);
        }
        error!("{e:#}; keeping the policy applied before the restart");
    }
    if daemon.args.once {
        return Ok(());
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(run(daemon))
}

/// Binds the metrics endpoint and returns the server future and the exporter it renders.
async fn metrics_server(
    args: &Args,
) -> Result<Option<(impl std::future::Future<Output = ()>, Arc<Mutex<Exporter>>)>> {
    let MetricsAddress(Some(addr)) = args.metrics_address else {
        info!("metrics endpoint disabled (--metrics-address off)");
        return Ok(None);
    };
    let exporter = Exporter::open(
        &args.pin_root,
        ExporterOptions {
            aggregation: args.aggregate,
            ..ExporterOptions::default()
        },
    )
    .context("open the pinned maps for the metrics exporter")?;
    let exporter = Arc::new(Mutex::new(exporter));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind the metrics endpoint to {addr} (--metrics-address)"))?;
    info!(%addr, aggregate = %args.aggregate, "serving metrics at http://{addr}/metrics");
    let shared = exporter.clone();
    let render: aliasnet_serve::metrics::RenderFn = Arc::new(move || {
        // A panic in an earlier render leaves nothing half-updated that matters: recover.
        let mut e = shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        e.render().map_err(|e| e.to_string())
    });
    Ok(Some((
        aliasnet_serve::metrics::serve(listener, render, std::future::pending()),
        exporter,
    )))
}

/// Brings the cluster budget's engine in line with the policy just applied and exports its
/// state.
async fn follow_policy(
    cluster: &mut ClusterBudget,
    daemon: &mut Daemon,
    exporter: Option<&Arc<Mutex<Exporter>>>,
) {
    if cluster.must_stop(&daemon.policy.budgets) {
        // Its last shares are the static split: in force until the next engine's.
        let last = cluster.stop().await.unwrap_or_default();
        if let Err(e) = daemon.set_shares(last) {
            error!("cluster budget: {e:#}");
        }
    }
    let p = &daemon.policy;
    if let Err(e) = cluster.follow(&p.datapath, &p.budgets).await {
        error!("cluster budget: {e}; the node keeps its current shares (the static split where it has none)");
    }
    if let Some(e) = exporter {
        e.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .set_budget(cluster.status());
    }
}

async fn run(mut daemon: Daemon) -> Result<()> {
    // Before the metrics endpoint answers (the readiness probe): a SIGHUP or SIGTERM that
    // arrives as soon as the daemon looks ready must be handled, not kill it.
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let (server, exporter) = match metrics_server(&daemon.args).await? {
        Some((server, exporter)) => (Some(server), Some(exporter)),
        None => (None, None),
    };
    let server = async move {
        match server {
            Some(s) => s.await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(server);
    let node = aliasnet_budget::wire::node_name(daemon.args.node_name.clone());
    let mut cluster = ClusterBudget::new(node, daemon.args.pin_root.clone());
    follow_policy(&mut cluster, &mut daemon, exporter.as_ref()).await;
    let mut sample = tokio::time::interval(SAMPLE_INTERVAL);
    sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The policy was read just before: the first poll is one period away (an interval's
    // first tick is immediate, which would reload a file changed since start without SIGHUP
    // even with a long poll interval).
    let poll_every = Duration::from_secs(daemon.args.poll_interval.max(1));
    let mut poll = tokio::time::interval_at(tokio::time::Instant::now() + poll_every, poll_every);
    let mut gc = tokio::time::interval(Duration::from_secs(daemon.args.gc_interval.max(1)));
    let mut pods = tokio::time::interval(PODS_POLL);
    let mut conns = tokio::time::interval(CONNS_SWEEP);
    conns.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    pods.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!("running; SIGHUP reloads the policy, SIGTERM exits leaving the datapath in place");
    loop {
        // The datapath calls are short and blocking (bpf syscalls, netlink): run inline on
        // this single-threaded runtime.
        tokio::select! {
            _ = hup.recv() => {
                info!("SIGHUP: reloading policy");
                match daemon.reload(true) {
                    Ok(_) => follow_policy(&mut cluster, &mut daemon, exporter.as_ref()).await,
                    Err(e) => error!("{e:#}; the previous policy stays applied"),
                }
            }
            _ = poll.tick() => {
                match daemon.reload(false) {
                    Ok(true) => follow_policy(&mut cluster, &mut daemon, exporter.as_ref()).await,
                    Ok(false) => {}
                    Err(e) => error!("{e:#}; the previous policy stays applied"),
                }
            }
            shares = cluster.shares() => {
                if let Err(e) = daemon.set_shares(shares) {
                    error!("cluster budget: {e:#}; the previous shares stay applied");
                }
            }
            _ = pods.tick() => {
                if let Err(e) = daemon.follow_pods() {
                    warn!("{e:#}");
                }
            }
            _ = conns.tick() => {
                match daemon.dp.sweep_conns() {
                    Ok(0) => {}
                    Ok(removed) => debug!(removed, "connection table swept"),
                    Err(e) => warn!("sweeping the connection table: {e}"),
                }
            }
            _ = gc.tick() => {
                match daemon.dp.gc() {
                    Ok(removed) if !removed.is_empty() => info!(count = removed.len(), "stale attachments removed"),
                    Ok(_) => {}
                    Err(e) => warn!("gc: {e}"),
                }
            }
            _ = sample.tick(), if exporter.is_some() => {
                let e = exporter.clone().expect("checked by the guard");
                // Off the runtime thread: a scrape may hold the exporter for milliseconds.
                tokio::task::spawn_blocking(move || {
                    let mut e = e.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Err(err) = e.sample() {
                        warn!("metrics: sampling the maps: {err}");
                    }
                });
            }
            _ = &mut server => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    // The engine frees this node's demands at once and leaves the static split applied: a
    // share the leader is about to give to other nodes must not stay here.
    if let Some(shares) = cluster.stop().await {
        if let Err(e) = daemon.set_shares(shares) {
            error!("cluster budget: applying the static split on exit: {e:#}");
        }
    }
    info!(
        "exiting; programs, links and counters stay pinned under {}",
        daemon.args.pin_root.display()
    );
    Ok(())
}
