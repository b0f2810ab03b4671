//! `aliasnet-ipamd`: the per-node IPAM daemon.
//!
//! ```text
//! aliasnet-ipamd [--config PATH]                 serve (default /etc/aliasnet/ipamd.toml)
//! aliasnet-ipamd check-config [--config PATH]    validate the config and print a summary
//! aliasnet-ipamd recover [--config PATH] [--force] [--no-cooldown]
//!                                                rebuild the state from the kernel's routes
//! ```

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    sync::Arc,
};

use aliasnet_ipam::{
    config::{Config, DEFAULT_CONFIG},
    daemon::Daemon,
    teardown::NetlinkRemover,
};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tracing_subscriber::{fmt, prelude::*, EnvFilter};

#[derive(Parser)]
#[command(
    name = "aliasnet-ipamd",
    version,
    about = "aliasnet per-node IPAM daemon"
)]
struct Cli {
    /// Config file.
    #[arg(long, global = true, default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the config file and print what it defines; exit 1 if it is invalid.
    CheckConfig,
    /// Rebuild the state directory from the kernel after the state was lost or corrupted:
    /// every host /32 and /128 route through one of our veths becomes a lease (the daemon must be
    /// stopped; the old state directory is moved aside, never deleted).
    #[command(
        after_help = "Examples:\n  aliasnet-ipamd recover --config /etc/aliasnet/ipamd.toml\n  \
        aliasnet-ipamd recover --force   # rebuild even though the state loads"
    )]
    Recover {
        /// Rebuild even if the current state loads without error.
        #[arg(long)]
        force: bool,
        /// Do not put the addresses that are not leased in cooldown (by default they are,
        /// because the release times died with the old state).
        #[arg(long)]
        no_cooldown: bool,
    },
}

/// glibc malloc tuning for a long-lived daemon whose big buffers (a 30 MiB snapshot read at
/// start, lease tables growing by doubling) are short-lived: by default glibc raises its mmap
/// threshold to the size of the largest freed block, after which such buffers come from the
/// heap and their pages stay resident. A fixed threshold keeps them mmapped (returned to the
/// system on free), and two arenas bound the per-thread heaps the tokio workers would
/// otherwise each grow.
fn tune_malloc() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; called before any thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() {
    tune_malloc();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::CheckConfig) => check_config(&cli.config),
        Some(Command::Recover { force, no_cooldown }) => recover(
            &cli.config,
            aliasnet_ipam::recover::Options { force, no_cooldown },
        ),
        None => serve(&cli.config),
    };
    if let Err(e) = result {
        // Logging may not be up (bad config): stderr is the one channel that always works.
        let _ = writeln!(std::io::stderr(), "aliasnet-ipamd: {e:#}");
        std::process::exit(1);
    }
}

fn filter(config: &Config) -> Result<EnvFilter> {
    // RUST_LOG, when set, wins: handy for a one-off debug run without editing the config.
    if let Ok(directive) = std::env::var("RUST_LOG") {
        return EnvFilter::try_new(&directive)
            .with_context(|| format!("RUST_LOG {directive:?} is not a valid tracing filter"));
    }
    let level = config.log_level.trim();
    let plain = ["trace", "debug", "info", "warn", "error", "off"];
    // A bare word is a level; EnvFilter would take a typo ("inf0") as a target name and
    // silently log nothing, so only directives with '=' or ',' go to it.
    let ok = if level.contains(['=', ',']) {
        EnvFilter::try_new(level).is_ok()
            && level
                .split(',')
                .filter_map(|d| d.rsplit_once('=').map(|(_, l)| l.trim()))
                .all(|l| plain.contains(&l.to_ascii_lowercase().as_str()))
    } else {
        plain.contains(&level.to_ascii_lowercase().as_str())
    };
    if !ok {
        anyhow::bail!(
            "invalid config: `log_level` {level:?} is not a level (trace, debug, info, warn, error, off) \
             or a tracing filter such as \"info,aliasnet_ipam=debug\""
        );
    }
    Ok(EnvFilter::new(level))
}

fn check_config(path: &std::path::Path) -> Result<()> {
    let config = Config::load(path)?;
    filter(&config)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}: valid", path.display())?;
    writeln!(out, "  socket     {}", config.socket.display())?;
    writeln!(out, "  state_dir  {}", config.state_dir.display())?;
    writeln!(out, "  spool_dir  {}", config.spool_dir.display())?;
    writeln!(
        out,
        "  cooldown   {}ms, on_only_cooling = {:?}",
        config.cooldown.as_millis(),
        config.on_only_cooling
    )?;
    match config.metrics_address {
        Some(a) => writeln!(out, "  metrics    http://{a}/metrics")?,
        None => writeln!(out, "  metrics    disabled")?,
    }
    writeln!(
        out,
        "  reconcile  every {}ms, grace {}ms",
        config.reconcile_interval.as_millis(),
        config.reconcile_grace.as_millis()
    )?;
    for p in &config.pools {
        // The exact size (an IPv6 pool's may exceed what `size` counts).
        let size = p
            .ranges
            .iter()
            .fold(0u128, |n, r| n.saturating_add(r.len()));
        writeln!(
            out,
            "  pool '{}' ({}, {}): {} addresses in {} ranges ({})",
            p.name,
            p.source,
            p.family,
            size,
            p.ranges.len(),
            p.description
        )?;
    }
    for w in &config.warnings {
        writeln!(out, "  warning: {w}")?;
    }
    Ok(())
}

fn recover(path: &std::path::Path, opts: aliasnet_ipam::recover::Options) -> Result<()> {
    use aliasnet_ipam::recover;
    let config = Config::load(path)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mut rtnl = aliasnet_netlink::Rtnl::new().context("opening a netlink socket")?;
    let routes = recover::kernel_routes(&mut rtnl, &config.host_veth_prefix)
        .map_err(recover::RecoverError::Kernel)?;
    let report = rt.block_on(recover::recover(&config, routes, opts))?;
    let mut out = std::io::stdout().lock();
    if let Some(e) = &report.old_state_error {
        writeln!(out, "old state unusable: {e}")?;
    }
    if let Some(p) = &report.moved_aside {
        writeln!(out, "old state moved to {}", p.display())?;
    }
    writeln!(
        out,
        "rebuilt {} from the kernel: {} leases, {} addresses in cooldown",
        config.state_dir.display(),
        report.leases.len(),
        report.cooling
    )?;
    for (addr, veth, pool) in &report.leases {
        writeln!(out, "  {addr}\t{veth}\tpool {pool}")?;
    }
    for s in &report.skipped {
        writeln!(out, "  skipped: {s}")?;
    }
    Ok(())
}

fn init_logging(config: &Config) -> Result<()> {
    let filter = filter(config)?;
    let file = match &config.log_file {
        Some(p) => {
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating the log directory {}", dir.display()))?;
            }
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening log_file {}", p.display()))?;
            Some(fmt::layer().with_writer(Arc::new(f)).with_ansi(false))
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .with(file)
        .init();
    Ok(())
}

fn serve(path: &std::path::Path) -> Result<()> {
    let config = Config::load(path)?;
    init_logging(&config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ipamd")
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async {
        // Before the socket exists: a SIGTERM that arrives as soon as the daemon is ready
        // (a pod stopped right after it started) must shut it down cleanly, not kill it.
        let stop = StopSignals::install()?;
        let remover = NetlinkRemover::new().context("opening a netlink socket")?;
        let daemon = Daemon::start(&config, Arc::new(remover))
            .await
            .context("aliasnet-ipamd cannot start")?;
        stop.wait().await;
        tracing::info!("shutting down");
        daemon.shutdown().await;
        Ok(())
    })
}

/// SIGTERM and SIGINT, caught from the moment they are installed.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
