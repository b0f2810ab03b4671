//! `aliasnet-ipamd recover --force` holds the state directory's lock from its first look at
//! the old state until the rebuilt one is in place: a daemon started meanwhile cannot write
//! into the directory that is then moved aside (its acknowledged leases would be lost).
//!
//! The window is held open by the metadata read `recover` makes for an `azure-imds` pool: a
//! fake endpoint on 127.0.0.1 holds the request it gets once armed until the test releases
//! it. Daemon, recover and endpoint share a network namespace the test creates.

mod common;

use std::{
    io::{Read, Write},
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{Client, Request, Response};
use aliasnet_tests::netns::Netns;
use common::*;

const DOC: &str = r#"{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.8.5"},{"privateIpAddress":"10.0.8.6"}]},"macAddress":"000D3A328570"}]}"#;

/// The metadata endpoint: once `armed`, the next request is held until `release`; `arrived`
/// is signalled when it comes in. Other requests are answered at once.
struct Held {
    addr: std::net::SocketAddr,
    armed: Arc<AtomicBool>,
    arrived: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
}

fn held_metadata(l: TcpListener) -> Held {
    let addr = l.local_addr().unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let (arrived_tx, arrived) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let arm = armed.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            if arm.swap(false, Ordering::SeqCst) {
                let _ = arrived_tx.send(());
                let _ = release_rx.recv_timeout(Duration::from_secs(30));
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{DOC}",
                DOC.len()
            );
        }
    });
    Held {
        addr,
        armed,
        arrived,
        release,
    }
}

/// Every file under `dir` with its contents.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// `aliasnet-ipamd ARGS` in the test's namespace.
fn ipamd(ns: &Netns, args: &[&str]) -> Command {
    let mut c = ns.command(BIN);
    c.args(args).stdin(Stdio::null());
    c
}

/// Starts the daemon; returns it once it serves, or its stderr if it exits first.
fn start(ns: &Netns, config: &Path, socket: &Path) -> Result<Child, String> {
    let mut child = ipamd(ns, &["--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut c) = Client::connect(socket, Duration::from_secs(2)) {
            if c.call(&Request::Stats).is_ok() {
                return Ok(child);
            }
        }
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        assert!(Instant::now() < deadline, "daemon neither serves nor exits");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

#[test]
fn a_daemon_started_during_recover_cannot_write_into_the_directory_moved_aside() {
    aliasnet_tests::require_root();
    let ns = Netns::new(&format!("ipr{}", aliasnet_tests::unique_tag())).unwrap();
    let held = held_metadata(
        ns.run(|| TcpListener::bind("127.0.0.1:0"))
            .unwrap()
            .unwrap(),
    );
    let imds = held.addr;
    let env = Env::new(
        "",
        &format!(
            "cidrs = [\"10.240.0.0/24\"]\n[[pool]]\nname = \"nic\"\nsource = \"azure-imds\"\n\
             url = \"http://{imds}/metadata/instance/network\"\ntimeout = \"30s\""
        ),
    );
    let cfg = env.config_path();
    let socket = env.socket();
    let state = env.state_dir().to_path_buf();
    let first = start(&ns, &cfg, &socket).expect("daemon starts");
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    c.call(&alloc_req("a", None)).unwrap();
    drop(c);
    stop(first);

    held.armed.store(true, Ordering::SeqCst);
    let recover = ipamd(
        &ns,
        &[
            "recover",
            "--force",
            "--no-cooldown",
            "--config",
            cfg.to_str().unwrap(),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    held.arrived
        .recv_timeout(Duration::from_secs(20))
        .expect("recover reads the metadata");
    // Recover is between its look at the old state and the swap.
    let before = contents(&state);
    let late = start(&ns, &cfg, &socket);
    if let Ok(late) = late {
        let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
        let answer = c.call(&alloc_req("late", None));
        drop(c);
        stop(late);
        held.release.send(()).unwrap();
        let _ = recover.wait_with_output();
        panic!(
            "a daemon started while recover ran served from the directory recover then moved \
             aside; its allocation {answer:?} is lost"
        );
    }
    let err = late.unwrap_err();
    assert!(
        err.contains("in use by another aliasnet-ipamd"),
        "the daemon should refuse the locked directory: {err}"
    );
    assert_eq!(
        contents(&state),
        before,
        "the old state changed under recover"
    );
    held.release.send(()).unwrap();
    let out = recover.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let aside = text
        .lines()
        .find_map(|l| l.strip_prefix("old state moved to "))
        .unwrap_or_else(|| panic!("no old state moved aside: {text}"));
    assert_eq!(contents(Path::new(aside)), before, "moved aside as it was");

    // After the swap the daemon starts on the rebuilt state.
    let d = start(&ns, &cfg, &socket).expect("daemon starts after recover");
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    assert!(matches!(
        c.call(&alloc_req("b", None)),
        Ok(Response::Allocated { .. })
    ));
    drop(c);
    stop(d);
}
