//! `aliasnet-shaperd --check`: validates a policy file without touching the node, and warns
//! about class prefixes that put no address into their class.

use std::process::Command;

fn check(policy: &str) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shaper.toml");
    std::fs::write(&path, policy).expect("write policy");
    let out = Command::new(env!("CARGO_BIN_EXE_aliasnet-shaperd"))
        .arg("--check")
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .output()
        .expect("run aliasnet-shaperd --check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_warns_about_shadowed_class_prefixes_and_still_passes() {
    let (ok, err) = check(
        r#"
internal_cidrs = ["10.0.0.0/8", "203.0.113.0/25"]
blocked_cidrs = ["198.51.100.0/24", "203.0.113.128/25"]

[classes.mirrors]
cidrs = ["203.0.113.0/24", "192.0.2.0/24"]

[classes.datasets]
cidrs = ["198.51.100.0/24"]
"#,
    );
    assert!(ok, "{err}");
    for want in [
        "203.0.113.0/24 of class mirrors is covered entirely by more specific prefixes of other lists (203.0.113.0/25 internal, 203.0.113.128/25 blocked)",
        "198.51.100.0/24 of class datasets is also blocked",
        "class datasets counts and limits nothing",
        "shadowed=2",
    ] {
        assert!(err.contains(want), "no {want:?} in:\n{err}");
    }
    // 192.0.2.0/24 is the class's: mirrors as a whole still counts something.
    assert!(
        !err.contains("class mirrors counts and limits nothing"),
        "{err}"
    );

    let (ok, err) = check("[classes.mirrors]\ncidrs = [\"192.0.2.0/24\"]\n");
    assert!(ok, "{err}");
    assert!(!err.contains("WARN"), "{err}");
    assert!(err.contains("shadowed=0"), "{err}");
}

#[test]
fn check_refuses_an_invalid_policy_naming_the_key() {
    let (ok, err) = check("[classes.mirrors]\ncidrs = [\"203.0.113.1/24\"]\n");
    assert!(!ok, "{err}");
    assert!(err.contains("classes.mirrors.cidrs[0]"), "{err}");
}
