//! Memory per request is bounded: many clients sending worst-case 8 MiB frames at once (unknown
//! fields of tiny values, thousands of unknown keys, deep nesting, a legitimate-looking GC
//! listing hundreds of thousands of attachments) while ADDs go on. The daemon binary runs in a
//! network namespace of its own; its peak RSS (VmHWM) must stay well under its container's
//! memory limit (256 MiB in install/aliasnet.yaml) and every ADD must succeed.

mod common;

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{frame::MAX_FRAME, Client, Response};
use common::*;
use nix::{sys::signal, unistd::Pid};

/// Peak resident memory the daemon may reach under the attack.
const RSS_BOUND_MIB: u64 = 96;

fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A body of at most `MAX_FRAME` bytes: `head`, then `item` repeated, then `tail`.
fn fill(head: &str, item: &dyn Fn(usize) -> String, sep: &str, tail: &str) -> Vec<u8> {
    let mut b = head.as_bytes().to_vec();
    let mut i = 0;
    loop {
        let it = item(i);
        if b.len() + it.len() + sep.len() + tail.len() > MAX_FRAME {
            break;
        }
        if i > 0 {
            b.extend_from_slice(sep.as_bytes());
        }
        b.extend_from_slice(it.as_bytes());
        i += 1;
    }
    b.extend_from_slice(tail.as_bytes());
    b
}

fn payloads() -> Vec<Vec<u8>> {
    let depth = (MAX_FRAME - 64) / 2;
    let mut nested = br#"{"v":1,"op":"list","x":"#.to_vec();
    nested.extend(std::iter::repeat_n(b'[', depth));
    nested.extend(std::iter::repeat_n(b']', depth));
    nested.push(b'}');
    vec![
        fill(r#"{"v":1,"op":"stats","x":["#, &|_| "0".into(), ",", "]}"),
        fill(
            r#"{"v":1,"op":"stats","#,
            &|i| format!("\"{i:x}\":0"),
            ",",
            "}",
        ),
        nested,
        fill(
            r#"{"v":1,"op":"gc","network":"other","valid":["#,
            &|i| format!(r#"{{"container_id":"{i:x}","ifname":"e"}}"#),
            ",",
            "]}",
        ),
    ]
}

#[test]
fn worst_case_frames_from_many_clients_keep_rss_bounded_and_adds_succeed() {
    let attackers: usize = std::env::var("ALIASNET_MEMORY_ATTACKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let env = Env::new("reconcile_interval = \"0s\"", "cidrs = [\"10.240.0.0/20\"]");
    let socket = env.socket();
    let mut child = daemon_command(&["--config", env.config_path().to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_ready(&socket, &mut child);
    let baseline = status_kib(pid, "VmRSS:");

    let payloads = Arc::new(payloads());
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let attack: Vec<_> = (0..attackers)
        .map(|a| {
            let (payloads, stop, sent, socket) =
                (payloads.clone(), stop.clone(), sent.clone(), socket.clone());
            std::thread::spawn(move || {
                let mut i = a;
                while !stop.load(Ordering::Relaxed) {
                    let body = &payloads[i % payloads.len()];
                    i += 1;
                    let Ok(mut s) = UnixStream::connect(&socket) else {
                        continue;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                    let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
                    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
                    frame.extend_from_slice(body);
                    if s.write_all(&frame).is_ok() {
                        sent.fetch_add(1, Ordering::Relaxed);
                        let mut hdr = [0u8; 4];
                        if s.read_exact(&mut hdr).is_ok() {
                            let mut rest = vec![0u8; u32::from_be_bytes(hdr) as usize];
                            let _ = s.read_exact(&mut rest);
                        }
                    }
                }
            })
        })
        .collect();

    // ADDs go on meanwhile, each within the plugin's default 5 s timeout.
    let t0 = Instant::now();
    let mut adds = 0;
    while t0.elapsed() < Duration::from_secs(8) {
        let r = Client::connect(&socket, Duration::from_secs(5))
            .and_then(|mut c| c.call(&alloc_req(&format!("add{adds}"), None)));
        assert!(
            matches!(r, Ok(Response::Allocated { .. })),
            "ADD {adds} under attack: {r:?}"
        );
        adds += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    for t in attack {
        t.join().unwrap();
    }
    let peak = status_kib(pid, "VmHWM:");
    signal::kill(Pid::from_raw(pid as i32), signal::Signal::SIGTERM).unwrap();
    let _ = child.wait();
    eprintln!(
        "{attackers} attackers sent {} frames of up to 8 MiB; {adds} ADDs; daemon RSS \
         baseline {} MiB, peak {} MiB (bound {RSS_BOUND_MIB} MiB)",
        sent.load(Ordering::Relaxed),
        baseline / 1024,
        peak / 1024
    );
    assert!(
        sent.load(Ordering::Relaxed) >= attackers as u64,
        "the attack did not run"
    );
    assert!(
        peak < RSS_BOUND_MIB * 1024,
        "daemon peak RSS {} MiB exceeds {RSS_BOUND_MIB} MiB",
        peak / 1024
    );
}
