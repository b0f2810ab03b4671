//! Side by side with Debian's `host-local` IPAM plugin.

use std::{
    fs,
    io::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use super::{
    client::{alloc_latencies, fill, median, percentile, Daemon},
    pool, Args,
};

/// Run host-local once; returns the wall time in ms.
fn host_local_call(plugin: &Path, conf: &str, cmd: &str, cid: &str) -> Result<f64> {
    let t0 = Instant::now();
    let mut child = Command::new(plugin)
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", "/var/run/netns/ipam-bench-dummy")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", plugin.parent().unwrap_or(Path::new("/")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", plugin.display()))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(conf.as_bytes())?;
    let out = child.wait_with_output()?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        bail!(
            "host-local {cmd} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(ms)
}

/// Address number `i` of host-local's allocation order in `cidr` (from its network + 2).
fn nth_address(cidr: &str, i: u128) -> Result<IpAddr> {
    let net: IpAddr = cidr
        .split_once('/')
        .and_then(|(ip, _)| ip.parse().ok())
        .with_context(|| format!("{cidr:?} is not a CIDR"))?;
    Ok(match net {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) + 2 + i as u32)),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) + 2 + i)),
    })
}

/// Pre-fill host-local's directory with `n` allocations of `cidr` written as files (its own
/// format).
fn host_local_prefill(data: &Path, cidr: &str, n: usize) -> Result<()> {
    let dir = data.join("scale-test");
    fs::create_dir_all(&dir)?;
    for i in 0..n {
        let ip = nth_address(cidr, i as u128)?;
        fs::write(dir.join(ip.to_string()), format!("prefill{i}\r\neth0"))?;
    }
    if n > 0 {
        fs::write(
            dir.join("last_reserved_ip.0"),
            nth_address(cidr, n as u128 - 1)?.to_string(),
        )?;
    }
    Ok(())
}

pub fn host_local(args: &Args, bin: &Path) -> Result<String> {
    const OPS: usize = 200;
    const PREFILL: usize = 20_000;
    if !args.host_local.exists() {
        return Ok(format!(
            "\n## host-local comparison skipped: {} not found (apt install containernetworking-plugins)\n",
            args.host_local.display()
        ));
    }
    // (host-local empty ADD, host-local 20k ADD, host-local 20k DEL, aliasnet empty, aliasnet 20k)
    let mut hl_empty = Vec::new();
    let mut hl_full = Vec::new();
    let mut hl_del = Vec::new();
    let mut al_empty = Vec::new();
    let mut al_full = Vec::new();
    let cidr = pool();
    for run in 0..args.runs {
        for prefill in [0usize, PREFILL] {
            let data = tempfile::Builder::new()
                .prefix("hostlocal-bench")
                .tempdir_in(&args.dir)?;
            host_local_prefill(data.path(), &cidr, prefill)?;
            let conf = serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "scale-test",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": cidr}]],
                         "dataDir": data.path()},
            })
            .to_string();
            let mut adds = Vec::with_capacity(OPS);
            let mut dels = Vec::with_capacity(OPS);
            for i in 0..OPS {
                adds.push(host_local_call(
                    &args.host_local,
                    &conf,
                    "ADD",
                    &format!("bench{run}-{i}"),
                )?);
            }
            for i in 0..OPS {
                dels.push(host_local_call(
                    &args.host_local,
                    &conf,
                    "DEL",
                    &format!("bench{run}-{i}"),
                )?);
            }
            adds.sort_by(f64::total_cmp);
            dels.sort_by(f64::total_cmp);
            if prefill == 0 {
                hl_empty.push(adds);
            } else {
                hl_full.push(adds);
                hl_del.push(dels);
            }
        }
        let mut d = Daemon::new(args, bin)?;
        d.start()?;
        let socket = d.socket();
        al_empty.push(alloc_latencies(&socket, 11_000 + run as u64, OPS, true)?);
        fill(&socket, 12_000 + run as u64, 0, PREFILL as u64, 64)?;
        al_full.push(alloc_latencies(&socket, 13_000 + run as u64, OPS, true)?);
        d.stop()?;
    }
    let row = |name: &str, v: &[Vec<f64>]| {
        format!(
            "| {name} | {:.3} | {:.3} | {:.3} |\n",
            median(v.iter().map(|x| percentile(x, 0.5)).collect()),
            median(v.iter().map(|x| percentile(x, 0.9)).collect()),
            median(v.iter().map(|x| percentile(x, 0.99)).collect()),
        )
    };
    let p50 = |v: &[Vec<f64>]| median(v.iter().map(|x| percentile(x, 0.5)).collect());
    let p99 = |v: &[Vec<f64>]| median(v.iter().map(|x| percentile(x, 0.99)).collect());
    let mut s = format!(
        "\n## Side by side with host-local on {cidr} ({OPS} ops per point)\n\n\
         host-local: `{}` exec'd per operation with CNI_COMMAND=ADD/DEL (process start included), \
         its dataDir pre-filled with files in its own format. aliasnet: one new connection + \
         Allocate per operation (what the plugin does), leases pre-filled over the socket.\n\n\
         | operation | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|\n",
        args.host_local.display()
    );
    s.push_str(&row("host-local ADD, nearly empty", &hl_empty));
    s.push_str(&row(
        &format!("host-local ADD, {PREFILL} allocations"),
        &hl_full,
    ));
    s.push_str(&row(
        &format!("host-local DEL, {PREFILL} allocations"),
        &hl_del,
    ));
    s.push_str(&row("aliasnet-ipamd Allocate, nearly empty", &al_empty));
    s.push_str(&row(
        &format!("aliasnet-ipamd Allocate, {PREFILL} leases"),
        &al_full,
    ));
    s.push_str(&format!(
        "\nAt {PREFILL} allocations aliasnet-ipamd is {:.0}x faster at p50 and {:.0}x at p99.\n",
        p50(&hl_full) / p50(&al_full),
        p99(&hl_full) / p99(&al_full)
    ));
    Ok(s)
}
