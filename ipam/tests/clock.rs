//! Wall-clock steps while the daemon runs (NTP fixing a bad RTC, `date -s`): a jump forward or
//! back neither ends a cooldown early nor makes an old spooled DEL release a newer lease. The
//! test injects the wall clock; monotonic time is advanced by hand.

mod common;

use std::{
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
    time::Duration,
};

use aliasnet_ipam::{clock::Clock, daemon::Daemon, service::now_ms};
use aliasnet_ipam_proto::{
    spool::{self, boot_clock, SpoolEntry},
    ClientError, ErrorKind, Request, Response,
};
use common::*;

fn stepped_clock() -> (Arc<Clock>, Arc<AtomicI64>) {
    let step = Arc::new(AtomicI64::new(0));
    let s = step.clone();
    let clock = Clock::with_wall(Box::new(move || {
        (now_ms() as i64 + s.load(Ordering::SeqCst)) as u64
    }));
    (Arc::new(clock), step)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_steps_neither_end_a_cooldown_nor_replay_an_old_del() {
    let env = Env::new("cooldown = \"130s\"", "cidrs = [\"10.240.0.0/29\"]");
    let (clock, step) = stepped_clock();
    let start = |clock: Arc<Clock>| {
        let config = env.config.clone();
        async move {
            Daemon::start_with_clock(&config, Arc::new(Recorder::default()), clock)
                .await
                .unwrap()
        }
    };
    let d = start(clock.clone()).await;
    let socket = env.socket();
    for c in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        allocate(&socket, c).await;
    }
    release(&socket, "a", None).await;
    for jump in [3_600_000i64, -7_200_000, 0] {
        step.store(jump, Ordering::SeqCst);
        match call(&socket, alloc_req("x", None)).await {
            Err(ClientError::Refused { kind, .. }) => assert_eq!(kind, ErrorKind::OnlyCooling),
            other => panic!("wall clock stepped by {jump} ms: {other:?}"),
        }
    }
    // The cooldown ends when its time has really passed.
    clock.advance(Duration::from_secs(131));
    allocate(&socket, "x").await;
    d.shutdown().await;

    // The wall clock is an hour ahead now. Two DELs were spooled while the daemon was down:
    // one of "b" that ran ten minutes before b's lease was made (a stale DEL: b must stay),
    // one of "c" that ran just now.
    step.store(3_600_000, Ordering::SeqCst);
    let (boot_id, boot_now) = boot_clock().expect("boot clock");
    for (c, ago) in [("b", 600_000u64), ("c", 0)] {
        spool::write(
            &env.config.spool_dir,
            &SpoolEntry {
                key: key(c),
                host_veth: None,
                released_at_ms: clock.wall_ms() - ago,
                boot_id: Some(boot_id.clone()),
                boot_ms: Some(boot_now - ago),
            },
        )
        .unwrap();
    }
    let d = start(clock.clone()).await;
    let left: Vec<String> = list(&socket)
        .await
        .into_iter()
        .map(|l| l.key.container_id)
        .collect();
    assert!(
        left.contains(&"b".to_owned()),
        "an old DEL released a newer lease: {left:?}"
    );
    assert!(
        !left.contains(&"c".to_owned()),
        "the current DEL was not applied: {left:?}"
    );
    match call(&socket, Request::Stats).await.unwrap() {
        Response::Stats { pools, .. } => assert_eq!(pools[0].cooling, 1),
        other => panic!("{other:?}"),
    }
    d.shutdown().await;
}

/// GC never releases a lease younger than `gc_grace` (the runtime's list of valid attachments
/// may not name an ADD still running), and refuses the internal network of recovered leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_spares_young_leases_and_refuses_the_recovered_network() {
    let env = Env::new("gc_grace = \"60s\"", "cidrs = [\"10.240.0.0/29\"]");
    let (clock, _) = stepped_clock();
    let d = Daemon::start_with_clock(&env.config, Arc::new(Recorder::default()), clock.clone())
        .await
        .unwrap();
    let socket = env.socket();
    allocate(&socket, "young").await;
    let gc = |network: &str| Request::Gc {
        network: network.into(),
        valid: vec![],
    };
    match call(&socket, gc("net")).await.unwrap() {
        Response::GcDone { released } => assert!(released.is_empty(), "{released:?}"),
        other => panic!("{other:?}"),
    }
    clock.advance(Duration::from_secs(61));
    match call(&socket, gc("net")).await.unwrap() {
        Response::GcDone { released } => {
            assert_eq!(released.len(), 1);
            assert_eq!(released[0].key.container_id, "young");
        }
        other => panic!("{other:?}"),
    }
    match call(&socket, gc(aliasnet_ipam_proto::RECOVERED_NETWORK)).await {
        Err(ClientError::Refused { kind, message }) => {
            assert_eq!(kind, ErrorKind::BadRequest);
            assert!(message.contains("_recovered"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    d.shutdown().await;
}
