//! Crash test: `kill -9` the daemon every 100-300 ms while 24 clients make 1,000 allocations
//! (and release a fifth of them) over the socket. After every restart: the state loads, every
//! acknowledged allocation is there with its address, every acknowledged release is gone, and
//! no address belongs to two keys.
//!
//! The daemon binary runs in a network namespace of its own. Clients retry through the
//! crashes exactly as the plugin would (Allocate and Release are idempotent by key).

mod common;

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    path::Path,
    process::{Child, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex, RwLock,
    },
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{Client, Request, Response};
use common::*;

const KEYS: usize = 1000;
const CLIENTS: usize = 24;
/// Whole test budget.
const BUDGET: Duration = Duration::from_secs(55);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyState {
    /// Allocation acknowledged with this address.
    Allocated(IpAddr),
    /// Release sent, not yet acknowledged: the lease may or may not be there.
    Releasing(IpAddr),
    /// Release acknowledged.
    Released,
}

fn spawn(config: &Path) -> Child {
    daemon_command(&["--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Check the daemon's leases against what was acknowledged.
fn verify(socket: &Path, keys: &HashMap<String, KeyState>) -> usize {
    let mut c = Client::connect(socket, Duration::from_secs(10)).unwrap();
    let leases = c.list_all().unwrap();
    let mut by_key: HashMap<String, IpAddr> = HashMap::new();
    let mut addrs = HashSet::new();
    for l in &leases {
        assert!(addrs.insert(l.address), "{} belongs to two keys", l.address);
        assert!(
            by_key
                .insert(l.key.container_id.clone(), l.address)
                .is_none(),
            "{} holds two leases",
            l.key
        );
    }
    let Response::Stats { pools, .. } = c.call(&Request::Stats).unwrap() else {
        panic!()
    };
    assert_eq!(pools[0].allocated as usize, leases.len());
    for (k, st) in keys {
        let got = by_key.get(k).copied();
        match st {
            KeyState::Allocated(a) => {
                assert_eq!(
                    got,
                    Some(*a),
                    "acknowledged allocation of {k} lost or moved"
                )
            }
            KeyState::Releasing(a) => {
                assert!(got.is_none() || got == Some(*a), "{k}: {got:?} vs {a}")
            }
            KeyState::Released => assert_eq!(got, None, "acknowledged release of {k} undone"),
        }
    }
    leases.len()
}

#[test]
fn kill_9_during_concurrent_allocations_loses_nothing_acknowledged() {
    let started = Instant::now();
    let env = Env::new("cooldown = \"130s\"", "cidrs = [\"10.240.0.0/20\"]");
    let socket = env.socket();
    let config = env.config_path();
    let mut child = spawn(&config);
    wait_ready(&socket, &mut child);

    let keys: Arc<Mutex<HashMap<String, KeyState>>> = Arc::default();
    // Clients hold it shared per request; the verifier takes it exclusively after a restart.
    let gate = Arc::new(RwLock::new(()));
    let done = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (socket, keys, gate, finished) =
                (socket.clone(), keys.clone(), gate.clone(), finished.clone());
            std::thread::spawn(move || {
                let mut rng =
                    Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
                let mut conn: Option<Client> = None;
                // One request, retried through crashes until the daemon answers.
                let mut send = |req: &Request| -> Response {
                    loop {
                        assert!(started.elapsed() < BUDGET, "client {t} starved");
                        let _g = gate.read().unwrap();
                        let c = match conn.as_mut() {
                            Some(c) => c,
                            None => match Client::connect(&socket, Duration::from_secs(10)) {
                                Ok(c) => conn.insert(c),
                                Err(_) => {
                                    drop(_g);
                                    std::thread::sleep(Duration::from_millis(5));
                                    continue;
                                }
                            },
                        };
                        match c.call(req) {
                            Ok(r) => return r,
                            Err(e) => {
                                // The daemon died mid-request (or refused while restarting).
                                assert!(
                                    e.is_unavailable()
                                        || matches!(
                                            e,
                                            aliasnet_ipam_proto::ClientError::Protocol { .. }
                                        ),
                                    "unexpected error: {e}"
                                );
                                conn = None;
                                drop(_g);
                                std::thread::sleep(Duration::from_millis(5));
                            }
                        }
                    }
                };
                for i in (t..KEYS).step_by(CLIENTS) {
                    let k = format!("k{i:04}");
                    let resp = send(&alloc_req(&k, None));
                    let Response::Allocated { lease, .. } = resp else {
                        panic!("allocate {k}: {resp:?}")
                    };
                    keys.lock()
                        .unwrap()
                        .insert(k.clone(), KeyState::Allocated(lease.address));
                    if i % 5 == 0 {
                        keys.lock()
                            .unwrap()
                            .insert(k.clone(), KeyState::Releasing(lease.address));
                        let r = send(&Request::Release {
                            key: key(&k),
                            teardown_link: None,
                        });
                        assert!(matches!(r, Response::Released { .. }), "{r:?}");
                        keys.lock().unwrap().insert(k, KeyState::Released);
                    }
                    // Spread the work over many crash cycles.
                    std::thread::sleep(Duration::from_millis(rng.next(120)));
                }
                finished.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();

    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut kills = 0;
    let mut restarts = Vec::new();
    while !done.load(Ordering::SeqCst) {
        if finished.load(Ordering::SeqCst) == CLIENTS {
            done.store(true, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(100 + rng.next(200)));
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        let _g = gate.write().unwrap();
        child = spawn(&config);
        restarts.push(wait_ready(&socket, &mut child));
        let snapshot = keys.lock().unwrap().clone();
        verify(&socket, &snapshot);
        assert!(started.elapsed() < BUDGET, "over the time budget");
    }
    for c in clients {
        c.join().unwrap();
    }
    let snapshot = keys.lock().unwrap().clone();
    let n = verify(&socket, &snapshot);
    assert_eq!(snapshot.len(), KEYS);
    assert_eq!(
        n,
        KEYS - KEYS / 5,
        "every allocation present, every release done"
    );
    assert!(
        kills >= 5,
        "only {kills} kills: the crashes did not overlap the work"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    restarts.sort();
    eprintln!(
        "{kills} kills in {:?}; restart-to-serving median {:?}, max {:?}",
        started.elapsed(),
        restarts[restarts.len() / 2],
        restarts.last().unwrap()
    );
}
