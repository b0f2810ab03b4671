//! `aliasnet-ipamd`: the per-node IPAM daemon.
//!
//! ```text
//! aliasnet-ipamd [--config PATH]                 serve (default /etc/aliasnet/ipamd.toml)
//! aliasnet-ipamd check-config [--config PATH]    validate the config and print a summary
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
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::CheckConfig) => check_config(&cli.config),
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
    for p in &config.pools {
        writeln!(
            out,
            "  pool '{}' ({}): {} addresses in {} ranges ({})",
            p.name,
            p.source,
            p.size,
            p.ranges.len(),
            p.description
        )?;
    }
    for w in &config.warnings {
        writeln!(out, "  warning: {w}")?;
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
        let remover = NetlinkRemover::new().context("opening a netlink socket")?;
        let daemon = Daemon::start(&config, Arc::new(remover))
            .await
            .context("aliasnet-ipamd cannot start")?;
        wait_for_signal().await?;
        tracing::info!("shutting down");
        daemon.shutdown().await;
        Ok(())
    })
}

async fn wait_for_signal() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
