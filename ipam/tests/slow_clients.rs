//! Clients that hold the daemon's resources without making progress: silent ones, ones that
//! trickle a header, ones that never read their replies, and enough idle connections to fill
//! every slot. None of them may keep a real ADD from getting an address.

mod common;

use std::{
    io::{ErrorKind as IoKind, Read, Write},
    os::unix::net::UnixStream,
    sync::Arc,
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{frame, Request};
use common::*;

/// Read until the daemon closes the connection; returns how long that took from `t0`, or
/// `None` when it was still open after `limit`.
fn closed_within(s: &mut UnixStream, t0: Instant, limit: Duration) -> Option<Duration> {
    let mut buf = [0u8; 64 << 10];
    loop {
        let left = limit.checked_sub(t0.elapsed())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => return None,
            // Reset by the daemon: closed as well.
            Err(_) => return Some(t0.elapsed()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_trickling_and_non_reading_clients_are_dropped_within_seconds() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let limit = Duration::from_secs(8);

    let s1 = socket.clone();
    let silent = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut s = UnixStream::connect(&s1).unwrap();
        closed_within(&mut s, t0, limit)
    });

    let s2 = socket.clone();
    let trickle = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut s = UnixStream::connect(&s2).unwrap();
        let mut w = s.try_clone().unwrap();
        // One header byte every 2 s: the header is complete only after 6 s.
        let header = frame::encode(&Request::Stats)[..4].to_vec();
        std::thread::spawn(move || {
            for b in header {
                if w.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(2));
            }
            // Then nothing: the body never comes.
            std::thread::sleep(Duration::from_secs(20));
        });
        closed_within(&mut s, t0, limit)
    });

    let s3 = socket.clone();
    let deaf = std::thread::spawn(move || {
        let mut s = UnixStream::connect(&s3).unwrap();
        s.set_nonblocking(true).unwrap();
        // Pipeline requests and never read: the daemon's replies fill the socket buffer.
        let one = frame::encode(&Request::Stats);
        let many: Vec<u8> = one
            .iter()
            .copied()
            .cycle()
            .take(one.len() * 50_000)
            .collect();
        let mut off = 0;
        let until = Instant::now() + Duration::from_secs(5);
        while off < many.len() && Instant::now() < until {
            match s.write(&many[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == IoKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(_) => break,
            }
        }
        let t0 = Instant::now();
        s.set_nonblocking(false).unwrap();
        // Give the daemon its write deadline, then drain: it must have given up on us.
        std::thread::sleep(Duration::from_secs(7));
        closed_within(&mut s, t0, Duration::from_secs(10))
    });

    for (what, h) in [("silent", silent), ("trickling", trickle), ("deaf", deaf)] {
        let r = h.join().unwrap();
        assert!(
            r.is_some(),
            "{what} client still connected after the deadline"
        );
    }
    // Serving as before.
    allocate(&socket, "after").await;
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_at_the_limit_do_not_lock_out_an_add() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let socket = env.socket();
    let s1 = socket.clone();
    let took = tokio::task::spawn_blocking(move || {
        // More idle connections than the daemon serves at once (1,024).
        let idle: Vec<UnixStream> = (0..1100)
            .map(|_| UnixStream::connect(&s1).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        let mut c = aliasnet_ipam_proto::Client::connect(&s1, Duration::from_secs(5)).unwrap();
        let r = c.call(&alloc_req("real-add", None));
        assert!(
            matches!(r, Ok(aliasnet_ipam_proto::Response::Allocated { .. })),
            "{r:?}"
        );
        drop(idle);
        t0.elapsed()
    })
    .await
    .unwrap();
    assert!(
        took < Duration::from_secs(1),
        "the ADD waited {took:?} behind idle connections"
    );
    d.shutdown().await;
}
