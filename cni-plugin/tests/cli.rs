//! The binary's contract on bad input, without root and without a daemon: each case gets its
//! CNI code, a non-zero exit, and exactly one JSON document on stdout. Nothing here reaches
//! netlink or the daemon, so nothing on the machine changes.

use std::{
    io::Write,
    process::{Command, Stdio},
    time::Instant,
};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_aliasnet");

struct Out {
    status: i32,
    doc: Option<Value>,
    stdout: String,
}

fn run(env: &[(&str, &str)], stdin: &str) -> Out {
    let mut child = Command::new(BIN)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn aliasnet");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    // Exactly one JSON document (or nothing): a stream deserializer must find at most one.
    let docs: Vec<Value> = serde_json::Deserializer::from_str(&stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}"));
    assert!(docs.len() <= 1, "more than one document: {stdout:?}");
    Out {
        status: out.status.code().unwrap_or(-1),
        doc: docs.into_iter().next(),
        stdout,
    }
}

fn env_for<'a>(cmd: &'a str, netns: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "cid-1"),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
}

fn conf(version: &str, extra: Value) -> String {
    let mut c = json!({
        "cniVersion": version, "name": "testnet", "type": "aliasnet",
        // Never reached by these cases; a path that cannot exist, to be sure.
        "ipamSocket": "/nonexistent/aliasnet-test/ipamd.sock",
        "spoolDir": "/nonexistent/aliasnet-test/spool",
        "mtu": 1500
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c.to_string()
}

#[test]
fn bad_input_table() {
    let regular_file = tempfile::NamedTempFile::new().unwrap();
    let regular = regular_file.path().to_str().unwrap().to_owned();
    let good = conf("1.0.0", json!({}));
    // (label, env, stdin, code, substring of msg, cniVersion of the error)
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        String,
        u64,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            env_for("ADD", "/run/netns/x"),
            "{\"cniVersion\":".into(),
            6,
            "decode",
            "1.1.0",
        ),
        (
            "not an object",
            env_for("ADD", "/run/netns/x"),
            "[]".into(),
            6,
            "object",
            "1.1.0",
        ),
        (
            "no CNI_COMMAND",
            vec![],
            good.clone(),
            4,
            "CNI_COMMAND",
            "1.0.0",
        ),
        (
            "bad CNI_COMMAND",
            vec![("CNI_COMMAND", "ATTACH")],
            good.clone(),
            4,
            "CNI_COMMAND",
            "1.0.0",
        ),
        (
            "missing ids",
            vec![("CNI_COMMAND", "ADD"), ("CNI_NETNS", "/run/netns/x")],
            good.clone(),
            4,
            "CNI_CONTAINERID",
            "1.0.0",
        ),
        (
            "missing ifname named",
            vec![
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c"),
                ("CNI_NETNS", "/run/netns/x"),
            ],
            good.clone(),
            4,
            "CNI_IFNAME",
            "1.0.0",
        ),
        (
            "CHECK without netns",
            env_for("CHECK", ""),
            good.clone(),
            4,
            "CNI_NETNS",
            "1.0.0",
        ),
        (
            "unsupported version",
            env_for("ADD", "/run/netns/x"),
            conf("0.2.0", json!({})),
            1,
            "0.2.0",
            "1.1.0",
        ),
        (
            "mtu too small",
            env_for("ADD", "/run/netns/x"),
            conf("1.0.0", json!({"mtu": 20})),
            7,
            "mtu",
            "1.0.0",
        ),
        (
            "mtu wrong type",
            env_for("ADD", "/run/netns/x"),
            conf("0.4.0", json!({"mtu": "9000"})),
            7,
            "mtu",
            "0.4.0",
        ),
        (
            "bad field type",
            env_for("DEL", ""),
            conf("1.0.0", json!({"asyncTeardown": 1})),
            7,
            "asyncTeardown",
            "1.0.0",
        ),
        (
            "bad runtimeConfig",
            env_for("ADD", "/run/netns/x"),
            conf(
                "1.0.0",
                json!({"runtimeConfig": {"bandwidth": {"IngressRate": "fast"}}}),
            ),
            7,
            "IngressRate",
            "1.0.0",
        ),
        (
            "unknown CNI_ARGS",
            [
                env_for("ADD", "/run/netns/x"),
                vec![("CNI_ARGS", "K8S_POD_NAME=p;MAC=02:00:00:00:00:01")],
            ]
            .concat(),
            good.clone(),
            4,
            "CNI_ARGS",
            "1.0.0",
        ),
        (
            "netns missing",
            env_for("ADD", "/run/netns/aliasnet-test-does-not-exist"),
            good.clone(),
            3,
            "does not exist",
            "1.0.0",
        ),
        (
            "netns not a netns",
            env_for("ADD", &regular),
            good.clone(),
            4,
            "not a network namespace",
            "1.0.0",
        ),
        (
            "netns is our own",
            env_for("ADD", "/proc/self/ns/net"),
            good.clone(),
            4,
            "host's network namespace",
            "1.0.0",
        ),
        (
            "CHECK on 0.3.1",
            env_for("CHECK", "/run/netns/x"),
            conf("0.3.1", json!({})),
            1,
            "CHECK",
            "0.3.1",
        ),
        (
            "CHECK without prevResult",
            env_for("CHECK", "/run/netns/x"),
            good.clone(),
            7,
            "prevResult",
            "1.0.0",
        ),
        (
            "STATUS on 1.0.0",
            env_for("STATUS", ""),
            good.clone(),
            1,
            "STATUS",
            "1.0.0",
        ),
        (
            "GC on 1.0.0",
            env_for("GC", ""),
            good.clone(),
            1,
            "GC",
            "1.0.0",
        ),
        (
            "GC without attachments",
            env_for("GC", ""),
            conf("1.1.0", json!({})),
            7,
            "valid-attachments",
            "1.1.0",
        ),
        (
            "bad prevResult",
            env_for("ADD", "/run/netns/x"),
            conf("1.0.0", json!({"prevResult": {"ips": [{"address": "x"}]}})),
            7,
            "prevResult",
            "1.0.0",
        ),
    ];
    for (label, env, stdin, code, needle, version) in cases {
        let out = run(&env, &stdin);
        assert_ne!(out.status, 0, "{label}: exit status");
        let doc = out
            .doc
            .unwrap_or_else(|| panic!("{label}: no document: {:?}", out.stdout));
        assert_eq!(doc["code"], code, "{label}: {doc}");
        assert!(
            doc["msg"].as_str().unwrap().contains(needle),
            "{label}: {doc}"
        );
        assert_eq!(doc["cniVersion"], version, "{label}: {doc}");
        assert!(doc.get("details").is_some(), "{label}: {doc}");
    }
}

#[test]
fn version_with_dummy_env_is_fast() {
    let env = [
        ("CNI_COMMAND", "VERSION"),
        ("CNI_NETNS", "dummy"),
        ("CNI_IFNAME", "dummy"),
        ("CNI_PATH", "dummy"),
        ("CNI_CONTAINERID", ""),
        ("CNI_ARGS", ""),
    ];
    let all = json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
    for (stdin, want) in [
        (r#"{"cniVersion":"1.0.0"}"#, "1.0.0"),
        (r#"{"cniVersion":"0.4.0"}"#, "0.4.0"),
        ("", "1.1.0"),
        (r#"{"cniVersion":"7.0.0"}"#, "1.1.0"),
    ] {
        let t = Instant::now();
        let out = run(&env, stdin);
        let took = t.elapsed();
        assert_eq!(out.status, 0, "{stdin}: {}", out.stdout);
        assert_eq!(
            out.doc.unwrap(),
            json!({"cniVersion": want, "supportedVersions": all})
        );
        // Generous: a debug build on a loaded machine; it is ~1 ms in release.
        assert!(took.as_millis() < 500, "VERSION took {took:?}");
    }
    let bad = run(&env, "{nope");
    assert_eq!(bad.doc.unwrap()["code"], 6);
}
