//! Golden files: the documents the plugin prints, for every supported cniVersion, byte for
//! byte: ADD results (through the same serialisation the binary uses), error documents and
//! VERSION answers (from the binary itself, without root or a daemon). A deliberate change
//! is recorded with `ALIASNET_BLESS=1 cargo test -p aliasnet-cni --test golden`, and the diff
//! of `cni-plugin/tests/golden/` is then reviewed like code.

use std::{
    io::Write,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use aliasnet_cni_types::{CniResult, Dns, Interface, IpConfig, Route, SUPPORTED_VERSIONS};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_aliasnet");

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `got` with the golden file `name`, or writes it when blessing.
#[track_caller]
fn check(name: &str, got: &[u8]) {
    let path = golden_dir().join(name);
    if std::env::var_os("ALIASNET_BLESS").is_some() {
        std::fs::create_dir_all(golden_dir()).expect("golden dir");
        std::fs::write(&path, got).expect("write golden file");
        return;
    }
    let want = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (record it with ALIASNET_BLESS=1)", path.display()));
    assert!(
        got == want.as_slice(),
        "{name} differs from its golden file\n got: {}\nwant: {}",
        String::from_utf8_lossy(got),
        String::from_utf8_lossy(&want)
    );
}

/// The binary's stdout for one invocation.
fn run(command: &str, stdin: &str) -> Vec<u8> {
    let mut child = Command::new(BIN)
        .env_clear()
        .envs([
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "cid-1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn aliasnet");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("wait").stdout
}

fn conf(version: &str, mtu: serde_json::Value) -> String {
    json!({
        "cniVersion": version, "name": "testnet", "type": "aliasnet",
        "ipamSocket": "/nonexistent/aliasnet-test/ipamd.sock",
        "spoolDir": "/nonexistent/aliasnet-test/spool",
        "mtu": mtu
    })
    .to_string()
}

/// What ADD returns for a pod: the host veth, the pod's interface, its /32, the link-local
/// gateway's default route.
fn add_result() -> CniResult {
    CniResult {
        interfaces: vec![
            Interface {
                name: "ali3f9c0e1d2b7a".into(),
                mac: Some("ee:ee:ee:ee:ee:ee".into()),
                mtu: Some(9000),
                ..Interface::default()
            },
            Interface {
                name: "eth0".into(),
                mac: Some("0a:58:0a:f0:01:07".into()),
                mtu: Some(9000),
                sandbox: Some("/var/run/netns/cni-1234".into()),
                ..Interface::default()
            },
        ],
        ips: vec![IpConfig {
            address: "10.240.1.7/32".parse().expect("address"),
            gateway: Some(IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1))),
            interface: Some(1),
        }],
        routes: vec![Route::new(
            "0.0.0.0/0".parse().expect("route"),
            Some(IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1))),
        )],
        dns: Dns::default(),
    }
}

#[test]
fn add_results_per_version() {
    let r = add_result();
    for v in SUPPORTED_VERSIONS {
        // As the plugin writes it: one compact document and a newline.
        let mut got = serde_json::to_vec(&r.to_json(v)).expect("serialise");
        got.push(b'\n');
        check(&format!("result-{}.json", v.as_str()), &got);
    }
}

/// A dual-stack pod's result: the IPv6 /128 after the IPv4 /32, each family's default route
/// via its link-local gateway.
fn dual_stack_result() -> CniResult {
    let gw6: IpAddr = "fe80::1".parse().expect("gateway");
    let mut r = add_result();
    r.ips.push(IpConfig {
        address: "fd00:240:1::7/128".parse().expect("address"),
        gateway: Some(gw6),
        interface: Some(1),
    });
    r.routes
        .push(Route::new("::/0".parse().expect("route"), Some(gw6)));
    r
}

#[test]
fn dual_stack_results_per_version() {
    let r = dual_stack_result();
    for v in SUPPORTED_VERSIONS {
        let mut got = serde_json::to_vec(&r.to_json(v)).expect("serialise");
        got.push(b'\n');
        check(&format!("result-dual-stack-{}.json", v.as_str()), &got);
    }
}

#[test]
fn error_documents_per_version() {
    for v in SUPPORTED_VERSIONS {
        let got = run("ADD", &conf(v.as_str(), json!(20)));
        check(&format!("error-invalid-config-{}.json", v.as_str()), &got);
    }
    // An unsupported version is answered in the newest one.
    check(
        "error-unsupported-version.json",
        &run("ADD", &conf("0.2.0", json!(1500))),
    );
    check("error-decode.json", &run("ADD", "{\"cniVersion\":"));
}

#[test]
fn version_answers_per_version() {
    for v in SUPPORTED_VERSIONS {
        let got = run("VERSION", &json!({"cniVersion": v.as_str()}).to_string());
        check(&format!("version-{}.json", v.as_str()), &got);
    }
}
