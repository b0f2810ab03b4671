//! The `aliasnet-ipamd` binary: CLI, signals, refusal messages.
//!
//! The daemon runs in a network namespace of its own (unshared for the child), so its netlink
//! socket can never touch the host's interfaces.

mod common;

use std::{
    path::Path,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{Client, Request, Response};
use common::*;
use nix::{sys::signal, unistd::Pid};

fn run(args: &[&str]) -> Output {
    daemon_command(args).output().unwrap()
}

fn spawn(config: &Path) -> Child {
    let child = daemon_command(&["--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
}

fn terminate(mut child: Child) -> std::process::ExitStatus {
    signal::kill(Pid::from_raw(child.id() as i32), signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("SIGTERM ignored");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A stop signal that arrives the moment the socket appears (a pod stopped right after it
/// started) is a clean shutdown, never a kill by the signal's default action.
#[test]
fn a_signal_as_soon_as_the_socket_appears_stops_cleanly() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let socket = env.socket();
    for (i, sig) in [signal::Signal::SIGTERM, signal::Signal::SIGINT]
        .into_iter()
        .cycle()
        .take(20)
        .enumerate()
    {
        let mut child = spawn(&env.config_path());
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            assert!(child.try_wait().unwrap().is_none(), "daemon exited early");
            assert!(Instant::now() < deadline, "no socket");
            std::thread::sleep(Duration::from_micros(200));
        }
        signal::kill(Pid::from_raw(child.id() as i32), sig).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "round {i}, {sig}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!socket.exists(), "round {i}: socket left behind");
    }
}

#[test]
fn sigterm_stops_cleanly_and_state_survives() {
    let env = Env::new("log_level = \"debug\"", "cidrs = [\"10.240.0.0/24\"]");
    let socket = env.socket();
    let mut child = spawn(&env.config_path());
    wait_ready(&socket, &mut child);
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    let Response::Allocated { lease, .. } = c.call(&alloc_req("a", None)).unwrap() else {
        panic!()
    };
    let st = terminate(child);
    assert!(st.success(), "{st}");
    assert!(!socket.exists(), "socket removed on shutdown");

    let mut child = spawn(&env.config_path());
    wait_ready(&socket, &mut child);
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    assert_eq!(
        c.call(&Request::Check { key: key("a") }).unwrap(),
        Response::Lease {
            lease: Some(lease),
            more: vec![]
        }
    );
    // SIGINT works as well.
    signal::kill(Pid::from_raw(child.id() as i32), signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("state loaded") && log.contains("leases=1"),
        "{log}"
    );
}

#[test]
fn killed_daemon_keeps_acknowledged_leases() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let socket = env.socket();
    let mut child = spawn(&env.config_path());
    wait_ready(&socket, &mut child);
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    let mut acked = Vec::new();
    for i in 0..50 {
        if let Ok(Response::Allocated { lease, .. }) = c.call(&alloc_req(&format!("k{i}"), None)) {
            acked.push(lease);
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The stale socket is replaced on the next start.
    let mut child = spawn(&env.config_path());
    wait_ready(&socket, &mut child);
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    let Response::Leases { leases } = c.call(&Request::List).unwrap() else {
        panic!()
    };
    assert_eq!(leases, acked);
    terminate(child);
}

#[test]
fn corrupt_state_is_refused_with_the_file_named() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let socket = env.socket();
    let mut child = spawn(&env.config_path());
    wait_ready(&socket, &mut child);
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    for i in 0..3 {
        c.call(&alloc_req(&format!("k{i}"), None)).unwrap();
    }
    terminate(child);
    let log = env.state_dir().join(aliasnet_ipam::store::log_name(0));
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[40] ^= 0x10;
    std::fs::write(&log, bytes).unwrap();
    let out = run(&["--config", env.config_path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&log.display().to_string()), "{err}");
    assert!(err.contains("recover"), "{err}");
    assert!(!socket.exists(), "never served");
}

#[test]
fn check_config_validates_and_names_the_field() {
    let env = Env::new(
        "",
        "cidrs = [\"10.240.0.0/24\"]\nexclude = [\"10.240.0.0/30\"]",
    );
    let out = run(&[
        "check-config",
        "--config",
        env.config_path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("pool 'secondary' (static, ipv4): 252 addresses"),
        "{text}"
    );

    let bad = env.dir.path().join("bad.toml");
    for (body, want) in [
        (
            "[[pool]]\nname=\"p\"\nsource=\"static\"\ncidrs=[\"10.0.0.1/24\"]\n",
            "cidrs[0]",
        ),
        (
            "log_level = \"verbose\"\n[[pool]]\nname=\"p\"\nsource=\"static\"\nips=[\"10.0.0.1\"]\n",
            "log_level",
        ),
        (
            "[[pool]]\nname=\"a\"\nsource=\"static\"\nips=[\"10.0.0.1\"]\n[[pool]]\nname=\"b\"\nsource=\"static\"\nips=[\"10.0.0.1\"]\n",
            "overlap",
        ),
    ] {
        std::fs::write(&bad, body).unwrap();
        for args in [
            vec!["check-config", "--config", bad.to_str().unwrap()],
            vec!["--config", bad.to_str().unwrap()],
        ] {
            let out = run(&args);
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }
    let out = run(&["check-config", "--config", "/nonexistent/ipamd.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/ipamd.toml"));
}

#[test]
fn recover_rebuilds_a_corrupt_state_and_refuses_a_healthy_one() {
    let env = Env::new("", "cidrs = [\"10.240.0.0/24\"]");
    let cfg = env.config_path();
    let cfg = cfg.to_str().unwrap();
    let socket = env.socket();
    let mut child = spawn(&env.config_path());
    wait_ready(&socket, &mut child);
    // Running: recover refuses to touch the state.
    let out = run(&["recover", "--config", cfg]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stop aliasnet-ipamd first"), "{err}");
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    c.call(&alloc_req("a", None)).unwrap();
    c.call(&alloc_req("b", None)).unwrap();
    terminate(child);

    // Healthy: refused without --force.
    let out = run(&["recover", "--config", cfg]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("loads fine (2 leases)") && err.contains("--force"),
        "{err}"
    );

    // Corrupt (a damaged record with a valid one after it): the daemon refuses and names the
    // way out; recover rebuilds (from this empty namespace: no pods) and keeps the old state
    // aside.
    let log = env.state_dir().join(aliasnet_ipam::store::log_name(0));
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[aliasnet_ipam::store::record::HEADER_LEN + 12] ^= 0x40;
    std::fs::write(&log, bytes).unwrap();
    let out = run(&["--config", cfg]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&log.display().to_string()), "{err}");
    assert!(err.contains("aliasnet-ipamd recover --config"), "{err}");
    let out = run(&["recover", "--config", cfg, "--no-cooldown"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("old state unusable") && text.contains("moved to"),
        "{text}"
    );
    assert!(text.contains("0 leases, 0 addresses in cooldown"), "{text}");
    let mut child = spawn(&env.config_path());
    wait_ready(&socket, &mut child);
    terminate(child);
}

/// Unmounts a test's tmpfs even when the test fails.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A full disk: the state directory on a tiny tmpfs. The allocation that cannot be made
/// durable fails with a storage error naming the file, nothing unacknowledged is kept, the
/// daemon keeps serving what it has, allocates again once there is space, and after kill -9
/// the state holds exactly the acknowledged leases.
#[test]
fn a_full_disk_fails_the_request_and_loses_nothing_acknowledged() {
    // Mounting a tmpfs needs root.
    aliasnet_tests::require_root();
    let env = Env::new("", "cidrs = [\"10.240.0.0/16\"]");
    let state = env.state_dir().to_path_buf();
    std::fs::create_dir_all(&state).unwrap();
    let mounted = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=256k,mode=0700",
            "aliasnet-test-full",
        ])
        .arg(&state)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount tmpfs");
    let _m = Mount(state.clone());

    let socket = env.socket();
    let mut child = spawn(&env.config_path());
    wait_ready(&socket, &mut child);
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    let mut acked = Vec::new();
    let mut failure = None;
    for i in 0..20_000 {
        match c.call(&alloc_req(&format!("k{i}"), None)) {
            Ok(Response::Allocated { lease, .. }) => acked.push(lease),
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                failure = Some((i, e));
                break;
            }
        }
    }
    let (failed_at, e) = failure.expect("256 KiB filled without a write error");
    let msg = e.to_string();
    assert!(
        matches!(
            &e,
            aliasnet_ipam_proto::ClientError::Refused {
                kind: aliasnet_ipam_proto::ErrorKind::Storage,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        msg.contains(&state.display().to_string()) && msg.contains("No space left"),
        "{msg}"
    );
    eprintln!("allocation {failed_at} failed: {msg}");

    // Still serving; exactly the acknowledged leases; the failed key has none.
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    let Response::Leases { leases } = c.call(&Request::List).unwrap() else {
        panic!()
    };
    assert_eq!(leases, acked);
    assert_eq!(
        c.call(&Request::Check {
            key: key(&format!("k{failed_at}"))
        })
        .unwrap(),
        Response::Lease {
            lease: None,
            more: vec![]
        }
    );

    // Space again: allocations succeed.
    let grown = Command::new("mount")
        .args(["-o", "remount,size=16m"])
        .arg(&state)
        .status()
        .unwrap();
    assert!(grown.success());
    let mut more = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while more.is_none() {
        match c.call(&alloc_req("after", None)) {
            Ok(Response::Allocated { lease, .. }) => more = Some(lease),
            other => {
                assert!(
                    Instant::now() < deadline,
                    "no allocation after space was freed: {other:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
                c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
            }
        }
    }
    acked.push(more.unwrap());

    child.kill().unwrap();
    child.wait().unwrap();
    let mut child = spawn(&env.config_path());
    wait_ready(&socket, &mut child);
    let mut c = Client::connect(&socket, Duration::from_secs(5)).unwrap();
    let Response::Leases { mut leases } = c.call(&Request::List).unwrap() else {
        panic!()
    };
    leases.sort_by_key(|l| l.address);
    acked.sort_by_key(|l| l.address);
    assert_eq!(leases, acked);
    terminate(child);
}
