//! Neither daemon's `/metrics` endpoint can be locked out: while 100 connections (more than
//! either endpoint serves at once) pipeline requests and never read an answer, reconnecting
//! whenever one is closed, a scrape still answers within 2 s, again and again. An endpoint that
//! let them hold every slot would blind the alerts.

use std::{
    io::{ErrorKind, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use aliasnet_tests::{
    fabric::Fabric,
    metrics::{http_get, wait_metrics, IPAMD_METRICS, SHAPERD_METRICS},
    require_root,
};

const ATTACKERS: usize = 100;
/// Pipelined requests an attacker has outstanding on each connection.
const PIPELINED: usize = 200;

/// Keeps `ATTACKERS` connections to `addr` (inside `ns`) full of pipelined requests, never
/// reading, until `stop`; counts the connections it had to open again.
fn attack(ns: &Path, addr: SocketAddr, stop: &AtomicBool, reconnects: &AtomicUsize) {
    aliasnet_netns::run_in(ns, || {
        let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(PIPELINED);
        let open = || {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
            s.set_nonblocking(true).ok()?;
            Some(s)
        };
        let mut conns: Vec<Option<TcpStream>> = (0..ATTACKERS).map(|_| open()).collect();
        while !stop.load(Ordering::Relaxed) {
            for c in conns.iter_mut() {
                let alive = match c {
                    // As much as the server takes; a full buffer is the point.
                    Some(s) => match s.write(&request) {
                        Ok(_) => true,
                        Err(e) => e.kind() == ErrorKind::WouldBlock,
                    },
                    None => false,
                };
                if !alive {
                    *c = open();
                    reconnects.fetch_add(1, Ordering::Relaxed);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .expect("attacker in the node's netns");
}

#[test]
fn both_metrics_endpoints_answer_within_2s_while_connections_pipeline_and_never_read() {
    require_root();
    let f = Fabric::one_node();
    let node = f.node(1);
    let ns = node.ns.path();
    // Pods, so that shaperd's exposition has per-pod series to render.
    let _pods: Vec<_> = (0..2)
        .map(|i| node.add_pod(&format!("m{i}")).expect("pod"))
        .collect();
    for endpoint in [IPAMD_METRICS, SHAPERD_METRICS] {
        wait_metrics(&ns, endpoint);
        let stop = AtomicBool::new(false);
        let reconnects = AtomicUsize::new(0);
        let times = std::thread::scope(|s| {
            let attacker = s.spawn(|| attack(&ns, endpoint.parse().unwrap(), &stop, &reconnects));
            // Let the attack take hold: every connection holds unread answers.
            std::thread::sleep(Duration::from_secs(1));
            let mut times = Vec::new();
            for _ in 0..4 {
                let start = Instant::now();
                let got = http_get(&ns, endpoint, "/metrics");
                let took = start.elapsed();
                times.push(took);
                if !matches!(&got, Some((200, body)) if body.contains("# TYPE"))
                    || took > Duration::from_secs(2)
                {
                    stop.store(true, Ordering::Relaxed);
                    let _ = attacker.join();
                    panic!(
                        "{endpoint}: scrape under attack got {:?} after {took:?}",
                        got.map(|(c, b)| (c, b.chars().take(200).collect::<String>()))
                    );
                }
                std::thread::sleep(Duration::from_millis(1500));
            }
            stop.store(true, Ordering::Relaxed);
            attacker.join().expect("attacker");
            times
        });
        eprintln!(
            "{endpoint}: scrapes under attack answered in {times:?}; the attacker reconnected {} times",
            reconnects.load(Ordering::Relaxed)
        );
    }
}
