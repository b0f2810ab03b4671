//! Throughput, latency by occupancy, and memory/disk/restart with many leases.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{Client, Request, Response};
use anyhow::{bail, Result};

use super::{
    client::{
        alloc_latencies, alloc_req, fill, median, percentile, release_req, runtime, settle,
        AsyncConn, Daemon,
    },
    pool, Args,
};

/// Usable addresses of the daemon's pool, as it reports them.
fn pool_size(socket: &Path) -> Result<u64> {
    let Response::Stats { pools, .. } =
        Client::connect(socket, Duration::from_secs(10))?.call(&Request::Stats)?
    else {
        bail!("stats")
    };
    let total = pools.first().map_or(0, |p| p.total);
    if total == 0 || total > 1 << 24 {
        bail!("the pool has {total} addresses; the latency points need 1 to 2^24");
    }
    Ok(total)
}

pub fn throughput(args: &Args, bin: &Path) -> Result<String> {
    let mut s = format!(
        "\n## Allocate+release throughput over the socket (durable)\n\n\
         Each client: one connection, loop {{ Allocate new key; Release it }}; the clients are \
         async tasks on one bench thread. Empty {} pool, cooldown 130 s. allocations/s = Allocates acknowledged per second (each followed by a \
         durable Release, so the daemon does twice as many durable writes).\n\n\
         | clients | allocations/s (median) | runs |\n|---|---|---|\n",
        pool()
    );
    for &clients in &args.clients {
        let mut per_run = Vec::new();
        for run in 0..args.runs {
            let mut d = Daemon::new(args, bin)?;
            d.start()?;
            let socket = d.socket();
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicU64::new(0));
            let driver = {
                let (stop, done) = (stop.clone(), done.clone());
                std::thread::spawn(move || -> Result<()> {
                    runtime()?.block_on(futures::future::try_join_all((0..clients).map(|t| {
                        let (socket, stop, done) = (&socket, &stop, &done);
                        async move {
                            let mut c = AsyncConn::connect(socket).await?;
                            let mut i = 0u64;
                            while !stop.load(Ordering::Relaxed) {
                                let req = alloc_req(run as u64 * 1000 + t as u64, i);
                                match c.call(&req).await? {
                                    Response::Allocated { .. } => {}
                                    other => bail!("allocate failed: {other:?}"),
                                }
                                done.fetch_add(1, Ordering::Relaxed);
                                c.call(&release_req(&req)).await?;
                                i += 1;
                            }
                            Ok::<_, anyhow::Error>(())
                        }
                    })))?;
                    Ok(())
                })
            };
            // Warm up, then count over the measured window only.
            std::thread::sleep(Duration::from_millis(300));
            let (c0, t0) = (done.load(Ordering::Relaxed), Instant::now());
            std::thread::sleep(Duration::from_secs_f64(args.seconds));
            let rate = (done.load(Ordering::Relaxed) - c0) as f64 / t0.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            driver.join().expect("client driver")?;
            d.stop()?;
            per_run.push(rate);
        }
        s.push_str(&format!(
            "| {clients} | {:.0} | {} |\n",
            median(per_run.clone()),
            per_run
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(s)
}

pub fn latency(args: &Args, bin: &Path) -> Result<String> {
    let mut s = format!(
        "\n## Allocation latency by occupancy of {}\n\n\
         One client, {} Allocates per point on one connection (each followed by an untimed \
         Release), the pool pre-filled over the socket by 64 clients (occupancy = leases plus \
         the earlier points' samples, still cooling down); sampled once the \
         pre-fill's compaction has finished and its writes are flushed (`sync`), so the points \
         compare occupancy, not the pre-fill's writeback. ms, median over runs.\n",
        pool(),
        args.samples
    );
    let points = [0.0f64, 0.5, 0.95];
    let mut res: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); points.len()];
    for run in 0..args.runs {
        let mut d = Daemon::new(args, bin)?;
        d.start()?;
        let socket = d.socket();
        let size = pool_size(&socket)?;
        if run == 0 {
            s.push_str(&format!(
                "\n{size} usable addresses.\n\n\
                 | occupancy | p50 ms | p99 ms | max ms |\n|---|---|---|---|\n"
            ));
        }
        let mut filled = 0u64;
        for (k, occ) in points.iter().enumerate() {
            // Occupancy counts the earlier points' samples, which cool down (130 s) after
            // their release: in a small pool (a /112) they are a visible share.
            let cooling = (k * args.samples) as u64;
            let target = ((size as f64 * occ) as u64).saturating_sub(cooling);
            if target > filled {
                fill(&socket, 7_000 + run as u64, filled, target, 64)?;
                filled = target;
            }
            settle(&d.state_dir());
            let v = alloc_latencies(
                &socket,
                8_000 + run as u64 * 10 + k as u64,
                args.samples,
                false,
            )?;
            res[k].push((
                percentile(&v, 0.5),
                percentile(&v, 0.99),
                percentile(&v, 1.0),
            ));
        }
        d.stop()?;
    }
    for (k, occ) in points.iter().enumerate() {
        let r = &res[k];
        s.push_str(&format!(
            "| {:.0}% | {:.3} | {:.3} | {:.3} |\n",
            occ * 100.0,
            median(r.iter().map(|x| x.0).collect()),
            median(r.iter().map(|x| x.1).collect()),
            median(r.iter().map(|x| x.2).collect()),
        ));
    }
    Ok(s)
}

fn dir_size(dir: &Path) -> (u64, u64) {
    let mut apparent = 0;
    let mut allocated = 0;
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if let Ok(md) = e.metadata() {
                apparent += md.len();
                allocated += md.blocks() * 512;
            }
        }
    }
    (apparent, allocated)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

pub fn memory(args: &Args, bin: &Path) -> Result<String> {
    let n = args.leases as u64;
    let mut fill_rate = Vec::new();
    let mut rss_filled = Vec::new();
    let mut rss_restart = Vec::new();
    let mut disk = Vec::new();
    let mut disk_alloc = Vec::new();
    let mut restart_term = Vec::new();
    let mut restart_kill = Vec::new();
    for run in 0..args.runs {
        let mut d = Daemon::new(args, bin)?;
        d.start()?;
        fill_rate.push(fill(&d.socket(), 9_000 + run as u64, 0, n, 64)?);
        rss_filled.push(d.rss_kib() as f64 / 1024.0);
        d.stop()?;
        let (a, b) = dir_size(&d.state_dir());
        disk.push(mib(a));
        disk_alloc.push(mib(b));
        restart_term.push(d.start()?.as_secs_f64() * 1e3);
        rss_restart.push(d.rss_kib() as f64 / 1024.0);
        d.kill9();
        restart_kill.push(d.start()?.as_secs_f64() * 1e3);
        let Response::Stats { pools, .. } =
            Client::connect(d.socket(), Duration::from_secs(10))?.call(&Request::Stats)?
        else {
            bail!("stats")
        };
        if pools[0].allocated != n {
            bail!("after restart {} leases, expected {n}", pools[0].allocated);
        }
        d.stop()?;
    }
    let list = |v: &[f64], p: usize| {
        v.iter()
            .map(|x| format!("{x:.p$}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Ok(format!(
        "\n## {n} leases: fill rate, memory, disk, restart\n\n\
         | metric | median | runs |\n|---|---|---|\n\
         | fill: durable allocations/s, 64 clients, new keys | {:.0} | {} |\n\
         | daemon RSS after the fill (MiB) | {:.1} | {} |\n\
         | daemon RSS after a restart (MiB) | {:.1} | {} |\n\
         | state dir size (MiB, apparent) | {:.1} | {} |\n\
         | state dir size (MiB, allocated blocks) | {:.1} | {} |\n\
         | restart to serving after SIGTERM (ms, spawn to first reply) | {:.0} | {} |\n\
         | restart to serving after kill -9 (ms) | {:.0} | {} |\n",
        median(fill_rate.clone()),
        list(&fill_rate, 0),
        median(rss_filled.clone()),
        list(&rss_filled, 1),
        median(rss_restart.clone()),
        list(&rss_restart, 1),
        median(disk.clone()),
        list(&disk, 1),
        median(disk_alloc.clone()),
        list(&disk_alloc, 1),
        median(restart_term.clone()),
        list(&restart_term, 0),
        median(restart_kill.clone()),
        list(&restart_kill, 0),
    ))
}
