//! Logging via tracing, never to stdout: to `logFile` when configured, otherwise only
//! warnings and errors to stderr (which runtimes capture).

use std::{fs::OpenOptions, sync::Arc};

use aliasnet_cni_types::{LogLevel, NetConf};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

fn install<W>(writer: W, level: LevelFilter)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    // No colour codes: both destinations end up in files.
    let _ = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_max_level(level)
        .with_target(false)
        .with_ansi(false)
        .try_init();
}

pub fn init(conf: &NetConf) {
    let level = match conf.log_level {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    };
    let Some(path) = &conf.log_file else {
        install(std::io::stderr, LevelFilter::WARN);
        return;
    };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // O_APPEND plus one write per event keeps lines from concurrent plugin runs whole.
    match OpenOptions::new().create(true).append(true).open(path) {
        Ok(f) => install(Arc::new(f), level),
        Err(e) => {
            install(std::io::stderr, LevelFilter::WARN);
            tracing::warn!(
                "cannot open logFile {}: {e}; logging warnings to stderr",
                path.display()
            );
        }
    }
}
