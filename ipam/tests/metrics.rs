//! The Prometheus endpoint: names, consistency under load, bad requests, CNI operations
//! recorded through the daemon, and `promtool check metrics`.

mod common;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use aliasnet_ipam_proto::{
    client::{record_op, send_op_record},
    ErrorKind, Request, Response,
};
use common::*;

/// Every sample line of an exposition: (series, value). Panics on a malformed line.
fn samples(text: &str) -> Vec<(String, f64)> {
    assert!(text.ends_with('\n'), "exposition must end with a newline");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            let v: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {l:?}"));
            (series.to_owned(), v)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_are_complete_and_consistent_while_pods_come_and_go() {
    let env = Env::new("cooldown = \"0s\"", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let addr = d.metrics_address().unwrap();
    let socket = env.socket();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let (socket, stop) = (socket.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut c =
                    aliasnet_ipam_proto::Client::connect(&socket, Duration::from_secs(30)).unwrap();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let req = alloc_req(&format!("t{t}-{i}"), None);
                    c.call(&req).unwrap();
                    c.call(&Request::Release {
                        key: key(&format!("t{t}-{i}")),
                        teardown_link: None,
                    })
                    .unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    let mut last_allocs = 0.0;
    for _ in 0..40 {
        let text = tokio::task::spawn_blocking(move || scrape(addr))
            .await
            .unwrap();
        let s = samples(&text);
        let get = |name: &str| {
            s.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| *v)
                .unwrap_or_else(|| panic!("no {name}"))
        };
        // The states partition the pool, in every scrape.
        let sum: f64 = [
            "allocated",
            "cooling",
            "free",
            "pending_teardown",
            "missing",
        ]
        .iter()
        .map(|st| {
            get(&format!(
                "aliasnet_ipam_pool_addresses{{pool=\"secondary\",state=\"{st}\"}}"
            ))
        })
        .sum();
        assert_eq!(sum, 256.0, "{text}");
        assert_eq!(get("aliasnet_ipam_pool_size{pool=\"secondary\"}"), 256.0);
        let allocs = get("aliasnet_ipam_allocations_total{pool=\"secondary\"}");
        assert!(allocs >= last_allocs, "counters never go back");
        last_allocs = allocs;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert!(last_allocs > 0.0);
    let text = scrape(addr);
    let count = sample(&text, "aliasnet_ipam_allocation_duration_seconds_count").unwrap();
    assert!(count >= last_allocs, "every allocation timed");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_4xx() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let addr = d.metrics_address().unwrap();
    tokio::task::spawn_blocking(move || {
        assert_eq!(http(addr, "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").0, 404);
        assert_eq!(
            http(addr, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").0,
            405
        );
        assert_eq!(http(addr, "GARBAGE\r\n\r\n").0, 400);
        assert_eq!(http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n").0, 400);
        let (status, body) = http(addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert_eq!((status, body.as_str()), (200, ""));
        // Still serving after all that.
        assert!(scrape(addr).contains("aliasnet_build_info{component=\"ipamd\""));
    })
    .await
    .unwrap();
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cni_operations_are_recorded_through_the_daemon() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    let addr = d.metrics_address().unwrap();
    let socket = env.socket();
    tokio::task::spawn_blocking(move || {
        let t = Duration::from_millis(500);
        record_op(&socket, "ADD", 0, Duration::from_millis(12), t).unwrap();
        record_op(&socket, "add", 0, Duration::from_millis(30), t).unwrap();
        record_op(&socket, "DEL", 11, Duration::from_millis(3), t).unwrap();
        match record_op(&socket, "EXPLODE", 0, Duration::ZERO, t) {
            Err(aliasnet_ipam_proto::ClientError::Refused { kind, message }) => {
                assert_eq!(kind, ErrorKind::BadRequest);
                assert!(message.contains("unknown CNI verb"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let text = scrape(addr);
        assert_eq!(
            sample(&text, "aliasnet_cni_operations_total{verb=\"add\",code=\"0\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "aliasnet_cni_operations_total{verb=\"del\",code=\"11\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "aliasnet_cni_operation_duration_seconds_bucket{verb=\"add\",code=\"0\",le=\"0.025\"}"
            ),
            Some(1.0)
        );
        let sum = sample(&text, "aliasnet_cni_operation_duration_seconds_sum{verb=\"add\",code=\"0\"}")
            .unwrap();
        assert!((sum - 0.042).abs() < 1e-9, "{sum}");
        assert!(!text.contains("EXPLODE") && !text.contains("explode"));

        // The plugin's way: sent without waiting for the reply; the daemon still counts it.
        send_op_record(&socket, "CHECK", 0, Duration::from_millis(2), t).unwrap();
        let check = "aliasnet_cni_operations_total{verb=\"check\",code=\"0\"}";
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sample(&scrape(addr), check).is_none() {
            assert!(std::time::Instant::now() < deadline, "the unacknowledged record never arrived");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(sample(&scrape(addr), check), Some(1.0));
    })
    .await
    .unwrap();
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_can_be_disabled_and_a_taken_port_fails_the_start() {
    let env = Env::new("metrics_address = \"\"", "cidrs = [\"10.240.0.0/24\"]");
    let d = env.start(Arc::new(Recorder::default())).await;
    assert_eq!(d.metrics_address(), None);
    d.shutdown().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let env = Env::new(
        &format!("metrics_address = \"{}\"", taken.local_addr().unwrap()),
        "cidrs = [\"10.240.0.0/24\"]",
    );
    match aliasnet_ipam::daemon::Daemon::start(&env.config, Arc::new(Recorder::default())).await {
        Ok(_) => panic!("started on a taken metrics port"),
        Err(e) => assert!(e.to_string().contains("metrics_address"), "{e}"),
    }
    assert!(!env.socket().exists(), "never served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_exposition() {
    aliasnet_tests::require_tool("promtool", "prometheus");
    let fake_imds = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let env = Env::new(
        "",
        &format!(
            "cidrs = [\"10.240.0.0/24\"]\n[[pool]]\nname = \"nic\"\nsource = \"azure-imds\"\n\
             url = \"http://{}/x\"\nrefresh_min = \"100ms\"",
            fake_imds.local_addr().unwrap()
        ),
    );
    let d = env.start(Arc::new(Recorder::with_links(&[]))).await;
    let socket = env.socket();
    allocate(&socket, "a").await;
    call(
        &socket,
        Request::RecordOp {
            verb: "ADD".into(),
            code: 0,
            duration_us: 1500,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        call(
            &socket,
            Request::RecordOp {
                verb: "gc".into(),
                code: 7,
                duration_us: 1
            }
        )
        .await
        .unwrap(),
        Response::Recorded
    );
    let text = scrape(d.metrics_address().unwrap());
    d.shutdown().await;
    let (code, out) = aliasnet_tests::metrics::promtool_check_metrics(&text);
    assert_eq!(
        code, 0,
        "promtool check metrics failed:\n{out}\n--- exposition ---\n{text}"
    );
}
