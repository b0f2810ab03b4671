//! The window clamp's connection table under a pod that opens connections as fast as it
//! can, end to end on the namespace fabric: the neighbour's download keeps its clamp (its
//! window and its queueing delay). See docs/security.md, "The connection table".

use std::{
    io::{BufRead, BufReader, Write},
    process::Stdio,
    time::Duration,
};

use aliasnet_tests::{
    fabric::{Fabric, Node, Pod, DEFAULT_POLICY, INTERNET_IP},
    netns::Netns,
    require_root,
};
use serde_json::json;

/// The internet host: on port 5001 each connection waits for a byte, then is sent zeros
/// for `secs` seconds; ports 6001-6004 take connections into their backlog and never
/// accept them.
const SERVER: &str = r#"
import socket, sys, threading, time
secs = float(sys.argv[1])
def serve(c):
    c.recv(1)
    buf, end = bytes(65536), time.time() + secs
    try:
        while time.time() < end:
            c.sendall(buf)
    except OSError:
        pass
    c.close()
def listen(port, backlog):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(backlog)
    return s
held = [listen(p, 65535) for p in range(6001, 6005)]
s = listen(5001, 16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// The pod with the download: one connection downloads (the baseline), then a second is
/// opened and stays silent until a line on stdin, then downloads. Prints `go` when a
/// download starts and `ready` when the second connection is open.
const DOWNLOADER: &str = r#"
import socket, sys, time
host, secs = sys.argv[1], float(sys.argv[2])
def download(c):
    print("go", flush=True)
    c.sendall(b"g")
    end = time.time() + secs
    while time.time() < end and c.recv(1 << 20):
        pass
c = socket.create_connection((host, 5001))
download(c)
c.close()
c = socket.create_connection((host, 5001))
print("ready", flush=True)
sys.stdin.readline()
download(c)
"#;

/// The other pod: `n` connections to ports 6001-6004 of the host, all held open (a process
/// holds what its descriptor limit allows: several run at once).
const OPENER: &str = r#"
import resource, socket, sys, time
host, n = sys.argv[1], int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks = []
for i in range(n):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((host, 6001 + i % 4))
    except BlockingIOError:
        pass
    socks.append(s)
time.sleep(5)
done = sum(1 for s in socks if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
print(done, flush=True)
sys.stdin.readline()
"#;

/// Connections the other pod opens, and the processes that hold them.
const CONNECTIONS: u64 = 100_000;
const OPENERS: u64 = 8;
/// Both pods' ingress limit, bit/s.
const RATE: u64 = 20_000_000;

/// A child killed when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (receive window the sender sees in bytes, smoothed RTT in ms) of the host's connection
/// from port 5001 to `pod`, from `ss -tin`.
fn sender_view(internet: &Netns, pod: &Pod) -> (u64, f64) {
    let filter = format!("( sport = :5001 and dst {} )", pod.ip);
    let out = internet
        .exec("ss", &["-tinH", "state", "established", &filter])
        .expect("ss");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field =
        |name: &str| -> Option<&str> { text.split_whitespace().find_map(|w| w.strip_prefix(name)) };
    let wnd = field("snd_wnd:")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no snd_wnd in {text:?}"));
    let rtt = field("rtt:")
        .and_then(|v| v.split('/').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no rtt in {text:?}"));
    (wnd, rtt)
}

/// Waits for `want` on the child's stdout.
fn expect_line(r: &mut impl BufRead, want: &str) {
    let mut line = String::new();
    r.read_line(&mut line).expect("read");
    assert_eq!(line.trim(), want, "unexpected output");
}

fn limited_pod(n: &Node, name: &str) -> Pod {
    let rc = json!({"bandwidth": {"IngressRate": RATE, "IngressBurst": 4_294_967_295u64}});
    n.add_pod_with(name, Some(&rc)).unwrap()
}

/// Pod `a` downloads under its 20 Mbit/s ingress limit, its receive window clamped. Pod `b`
/// (also limited, so its connections are learnt) opens 100,000 connections while `a`'s
/// second connection is silent; then that connection downloads. With one LRU table for the
/// node, `b`'s connections evicted `a`'s entry, never learnt again: its window grew to
/// megabytes and its queue filled. With shares, `b` holds its share and no more, and `a`'s
/// download looks as it did before.
#[test]
fn a_pod_opening_100k_connections_does_not_change_another_pods_download() {
    require_root();
    let f = Fabric::with_limits(DEFAULT_POLICY, "1.0.0");
    let n = f.node(1);
    let a = limited_pod(n, "a");
    let b = limited_pod(n, "b");
    f.internet
        .exec(
            "sysctl",
            &[
                "-qw",
                "net.core.somaxconn=65535",
                "net.ipv4.tcp_max_syn_backlog=65535",
            ],
        )
        .expect("backlogs");
    b.ns.exec(
        "sysctl",
        &["-qw", "net.ipv4.ip_local_port_range=1024 65535"],
    )
    .expect("port range");
    let _server = Killed(
        f.internet
            .command("python3")
            .args(["-c", SERVER, "6"])
            .stdout(Stdio::null())
            .spawn()
            .expect("server"),
    );
    std::thread::sleep(Duration::from_millis(500));
    let host = INTERNET_IP.to_string();
    let mut down =
        a.ns.command("python3")
            .args(["-c", DOWNLOADER, &host, "6"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("downloader");
    let mut down_out = BufReader::new(down.stdout.take().expect("stdout"));
    expect_line(&mut down_out, "go");
    std::thread::sleep(Duration::from_secs(4));
    let (wnd_before, rtt_before) = sender_view(&f.internet, &a);
    expect_line(&mut down_out, "ready");

    let mut openers: Vec<_> = (0..OPENERS)
        .map(|_| {
            Killed(
                b.ns.command("python3")
                    .args(["-c", OPENER, &host, &(CONNECTIONS / OPENERS).to_string()])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("opener"),
            )
        })
        .collect();
    let opened: u64 = openers
        .iter_mut()
        .map(|o| {
            let mut line = String::new();
            BufReader::new(o.0.stdout.take().expect("stdout"))
                .read_line(&mut line)
                .expect("opener's count");
            line.trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("opener said {line:?}"))
        })
        .sum();
    assert!(opened >= 95_000, "b opened only {opened} connections");
    let dp = n.datapath();
    let rt_b = dp.pod_rt(n.record(&b).slot).expect("b's table use");
    let share = i64::from(dp.config().expect("config").conn_share);
    assert!(
        rt_b.conns <= share && rt_b.conns_refused >= 90_000,
        "b holds {} entries (share {share}), {} refused",
        rt_b.conns,
        rt_b.conns_refused
    );

    down.stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"\n")
        .expect("start");
    expect_line(&mut down_out, "go");
    std::thread::sleep(Duration::from_secs(4));
    let (wnd_after, rtt_after) = sender_view(&f.internet, &a);
    drop(openers);
    let _ = down.wait();
    eprintln!("a: window {wnd_before} -> {wnd_after} bytes, RTT {rtt_before} -> {rtt_after} ms");
    assert!(
        wnd_after <= wnd_before * 3 / 2 + 20_000,
        "a's window after b's connections: {wnd_after} bytes (before: {wnd_before})"
    );
    // The clamped window bounds the queue a's download can build: a window's worth of
    // bytes at the pod's rate. The first download may not have filled it yet when sampled,
    // so the bound is the larger of what it showed and what its window allows.
    let window_ms = wnd_before as f64 * 8.0 / RATE as f64 * 1000.0;
    assert!(
        rtt_after <= rtt_before.max(window_ms) + 6.0,
        "a's download RTT after b's connections: {rtt_after} ms (before: {rtt_before} ms, \
         its window {wnd_before} bytes at the pod's rate: {window_ms:.1} ms)"
    );
}
