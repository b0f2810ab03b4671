//! Traffic between namespaces: one-shot iperf3 servers, ping summaries and captures.

use std::{
    net::Ipv4Addr,
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicU16, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::netns::Netns;

/// A command run in the named namespace through `ip netns exec` (which also gives it the
/// namespace's /sys; bpffs is not needed there).
pub fn netns_exec(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(args);
    c
}

/// A port of its own for each iperf3 server of this process.
pub fn next_port() -> u16 {
    static N: AtomicU16 = AtomicU16::new(0);
    5201 + N.fetch_add(1, Ordering::SeqCst) % 1000
}

/// `iperf3 -s -1` in namespace `ns` on `addr`, listening when `start` returns; killed on drop.
pub struct IperfServer {
    pub port: u16,
    child: Child,
}

impl IperfServer {
    pub fn start(ns: &str, addr: &str) -> Result<Self> {
        let port = next_port();
        // -J: a client's --get-server-output gets the server's report as JSON.
        let child = netns_exec(
            ns,
            &[
                "iperf3",
                "-s",
                "-1",
                "-J",
                "-B",
                addr,
                "-p",
                &port.to_string(),
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("iperf3 server")?;
        let server = Self { port, child };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let out = netns_exec(ns, &["ss", "-Hltn", &format!("sport = :{port}")])
                .output()
                .context("ss")?;
            if !out.stdout.is_empty() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("iperf3 server in {ns} did not start");
    }
}

impl Drop for IperfServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An iperf3 client's `-J` report; fails on unparsable output or an iperf3 error.
pub fn iperf_report(out: &Output) -> Result<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "iperf3 output: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    Ok(v)
}

/// `count` pings of `size` data bytes from namespace `ns` to `dst` (`extra` before the
/// destination); returns how many were answered, panicking without a summary.
pub fn ping_received(ns: &Netns, dst: Ipv4Addr, count: u32, size: u32, extra: &[&str]) -> u32 {
    let (c, s) = (count.to_string(), size.to_string());
    let dst = dst.to_string();
    let mut args = vec!["-c", &c, "-s", &s, "-i", "0.05", "-W", "2", "-q"];
    args.extend_from_slice(extra);
    args.push(&dst);
    let out = ns.exec_status("ping", &args).expect("run ping");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(',')
        .find_map(|p| p.trim().strip_suffix(" received").map(str::to_owned))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ping summary in {text:?}"))
}

/// What one `ping -q` run reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ping {
    pub sent: u32,
    pub received: u32,
    /// Average and maximum RTT in ms; NaN when nothing came back.
    pub avg: f64,
    pub max: f64,
}

/// Parses ping's summary lines.
pub fn parse_ping(out: &[u8]) -> Ping {
    let text = String::from_utf8_lossy(out);
    let mut p = Ping::default();
    for l in text.lines() {
        if l.contains("packets transmitted") {
            let f: Vec<&str> = l.split(", ").collect();
            p.sent = f[0].split(' ').next().unwrap_or("0").parse().unwrap_or(0);
            p.received = f
                .get(1)
                .and_then(|s| s.split(' ').next())
                .unwrap_or("0")
                .parse()
                .unwrap_or(0);
        }
        if let Some(rest) = l.split(" = ").nth(1).filter(|_| l.starts_with("rtt")) {
            let nums: Vec<f64> = rest
                .split(" ms")
                .next()
                .unwrap_or("")
                .split('/')
                .filter_map(|x| x.parse().ok())
                .collect();
            if nums.len() == 4 {
                p.avg = nums[1];
                p.max = nums[2];
            }
        }
    }
    if p.received == 0 {
        // Every request lost (or refused locally: ENOBUFS from a full pod-side queue).
        p.avg = f64::NAN;
        p.max = f64::NAN;
    }
    p
}

/// `tcpdump -c count filter` on `iface` in `ns` while `during` runs: the lines it printed
/// (at most `count` packets; it is stopped 10 s after `during` returns at the latest).
pub fn capture(ns: &Netns, iface: &str, count: u32, filter: &str, during: impl FnOnce()) -> String {
    use std::io::Read as _;
    let count = count.to_string();
    let mut dump = ns
        .command("tcpdump")
        .args(["-l", "-n", "-i", iface, "-c", &count, filter])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tcpdump");
    // tcpdump prints nothing when its capture is open; give it the time to open it.
    std::thread::sleep(Duration::from_millis(700));
    during();
    let start = Instant::now();
    while dump.try_wait().expect("tcpdump status").is_none() {
        if start.elapsed() > Duration::from_secs(10) {
            let _ = dump.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    dump.stdout
        .take()
        .expect("stdout piped")
        .read_to_string(&mut out)
        .expect("read tcpdump output");
    let _ = dump.wait();
    out
}

/// `secs`-second TCP transfers between each of `clients` and its own iperf3 server in
/// namespace `server` on `addr`, all at once: downloads into the clients (`-R`: the server
/// sends) or uploads from them, with congestion control `cc` if given. The iperf3 `-J`
/// reports come back in `clients`' order.
pub fn concurrent_transfers(
    clients: &[&Netns],
    server: &str,
    addr: &str,
    secs: u32,
    cc: Option<&str>,
    download: bool,
) -> Result<Vec<serde_json::Value>> {
    let pairs: Vec<(&Netns, &str, &str)> = clients.iter().map(|c| (*c, server, addr)).collect();
    transfers(&pairs, secs, cc, download, None)
}

/// [`concurrent_transfers`] with each client's own server namespace and address:
/// `(client, server namespace, server address)`, each sender paced at `bitrate` if given
/// (iperf3's `-b`, e.g. "2G").
pub fn transfers(
    pairs: &[(&Netns, &str, &str)],
    secs: u32,
    cc: Option<&str>,
    download: bool,
    bitrate: Option<&str>,
) -> Result<Vec<serde_json::Value>> {
    let each: Vec<Transfer> = pairs
        .iter()
        .map(|&(client, server, addr)| Transfer {
            client,
            server,
            addr,
            pace: bitrate,
        })
        .collect();
    run_transfers(&each, secs, cc, download)
}

/// One transfer of [`run_transfers`].
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'a> {
    /// Where the iperf3 client runs.
    pub client: &'a Netns,
    /// The server's namespace and address.
    pub server: &'a str,
    pub addr: &'a str,
    /// The sender's pace (iperf3's `-b`, e.g. "2G"); `None`: as fast as it goes.
    pub pace: Option<&'a str>,
}

/// `secs`-second TCP transfers, all at once, each between its client and an iperf3 server
/// of its own: downloads into the clients (`-R`: the server sends) or uploads from them,
/// with congestion control `cc` if given. The iperf3 `-J` reports come back in order.
pub fn run_transfers(
    each: &[Transfer],
    secs: u32,
    cc: Option<&str>,
    download: bool,
) -> Result<Vec<serde_json::Value>> {
    let servers: Vec<IperfServer> = each
        .iter()
        .map(|t| IperfServer::start(t.server, t.addr))
        .collect::<Result<_>>()?;
    let secs = secs.to_string();
    let children: Vec<Child> = each
        .iter()
        .zip(&servers)
        .map(|(t, s)| {
            let port = s.port.to_string();
            let mut args = vec!["iperf3", "-c", t.addr, "-p", &port, "-t", &secs, "-J"];
            if download {
                args.push("-R");
            }
            if let Some(cc) = cc {
                args.extend(["-C", cc]);
            }
            if let Some(b) = t.pace {
                args.extend(["-b", b]);
            }
            netns_exec(&t.client.name, &args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("iperf3 client")
        })
        .collect::<Result<_>>()?;
    children
        .into_iter()
        .map(|c| iperf_report(&c.wait_with_output().context("iperf3 client")?))
        .collect()
}

/// [`concurrent_transfers`] into the clients.
pub fn concurrent_downloads(
    clients: &[&Netns],
    server: &str,
    src: &str,
    secs: u32,
    cc: Option<&str>,
) -> Result<Vec<serde_json::Value>> {
    concurrent_transfers(clients, server, src, secs, cc, true)
}

/// TCP segments sent and retransmitted by namespace `ns` since it was made (`nstat`).
pub fn tcp_segments(ns: &str) -> Result<(u64, u64)> {
    let [out, retrans] = tcp_counters(ns, ["TcpOutSegs", "TcpRetransSegs"])?;
    Ok((out, retrans))
}

/// Where namespace `ns` dropped packets so far: its qdiscs (`dev kind handle`) and links
/// (`dev rx`/`dev tx`) with a non-zero drop count, and the count.
pub fn drops(ns: &str) -> Result<Vec<(String, u64)>> {
    let json = |args: &[&str]| -> Result<serde_json::Value> {
        let out = netns_exec(ns, args).output().context("tc/ip -s")?;
        serde_json::from_slice(&out.stdout).context("tc/ip -j")
    };
    let mut found = Vec::new();
    for q in json(&["tc", "-s", "-j", "qdisc", "show"])?
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(d) = q["drops"].as_u64().filter(|d| *d > 0) {
            let (dev, kind, handle) = (&q["dev"], &q["kind"], &q["handle"]);
            let name = [dev, kind, handle]
                .map(|v| v.as_str().unwrap_or("?"))
                .join(" ");
            found.push((name, d));
        }
    }
    for l in json(&["ip", "-s", "-j", "link", "show"])?
        .as_array()
        .into_iter()
        .flatten()
    {
        for dir in ["rx", "tx"] {
            if let Some(d) = l["stats64"][dir]["dropped"].as_u64().filter(|d| *d > 0) {
                found.push((format!("{} {dir}", l["ifname"].as_str().unwrap_or("?")), d));
            }
        }
    }
    Ok(found)
}

/// The kernel's TCP counters `names` of namespace `ns` so far (`nstat`; 0 for one it lacks).
pub fn tcp_counters<const N: usize>(ns: &str, names: [&str; N]) -> Result<[u64; N]> {
    let mut args = vec!["nstat", "-az", "--json"];
    args.extend(names);
    let out = netns_exec(ns, &args).output().context("nstat")?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("nstat --json")?;
    Ok(names.map(|n| v["kernel"][n].as_u64().unwrap_or(0)))
}

/// Seconds of an iperf3 `-J` report in which nothing was received.
pub fn idle_seconds(v: &serde_json::Value) -> usize {
    v["intervals"].as_array().map_or(0, |a| {
        a.iter()
            .filter(|i| i["sum"]["bytes"].as_u64() == Some(0))
            .count()
    })
}

/// Receiver goodput of an iperf3 `-J` report, bit/s.
pub fn received_bps(v: &serde_json::Value) -> f64 {
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("iperf3 report without goodput: {v}"))
}

/// Jain's fairness index of `x`: 1 when all are equal, 1/n when one takes all.
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if sq == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * sq)
}
