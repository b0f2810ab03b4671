//! Table-driven: every kind of bad input gets the right CNI error code, a message naming the
//! culprit, exactly one JSON document on stdout, and leaves nothing behind.

use aliasnet_tests::{
    cni::Invocation,
    fabric::{Fabric, FabricOpts},
    netns::Netns,
    require_root,
};
use serde_json::{json, Value};

struct Case {
    name: &'static str,
    /// Edit the invocation.
    inv: fn(Invocation) -> Invocation,
    /// Edit the config; `None` means send `raw` instead.
    conf: fn(&mut Value),
    raw: Option<&'static [u8]>,
    code: u64,
    /// Substring the message (or details) must contain.
    names: &'static str,
}

fn same(i: Invocation) -> Invocation {
    i
}
fn keep(_: &mut Value) {}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "truncated JSON",
            inv: same,
            conf: keep,
            raw: Some(br#"{"cniVersion":"1.0.0","name":"#),
            code: 6,
            names: "",
        },
        Case {
            name: "JSON array instead of object",
            inv: same,
            conf: keep,
            raw: Some(b"[1,2]"),
            code: 6,
            names: "",
        },
        Case {
            name: "empty stdin",
            inv: same,
            conf: keep,
            raw: Some(b""),
            code: 6,
            names: "",
        },
        Case {
            name: "missing CNI_COMMAND",
            inv: |i| i.env("CNI_COMMAND", None),
            conf: keep,
            raw: None,
            code: 4,
            names: "CNI_COMMAND",
        },
        Case {
            name: "unknown CNI_COMMAND",
            inv: |i| i.env("CNI_COMMAND", Some("FROB")),
            conf: keep,
            raw: None,
            code: 4,
            names: "CNI_COMMAND",
        },
        Case {
            name: "missing CNI_CONTAINERID",
            inv: |i| i.env("CNI_CONTAINERID", None),
            conf: keep,
            raw: None,
            code: 4,
            names: "CNI_CONTAINERID",
        },
        Case {
            name: "missing CNI_NETNS on ADD",
            inv: |i| i.env("CNI_NETNS", None),
            conf: keep,
            raw: None,
            code: 4,
            names: "CNI_NETNS",
        },
        Case {
            name: "missing CNI_IFNAME",
            inv: |i| i.env("CNI_IFNAME", None),
            conf: keep,
            raw: None,
            code: 4,
            names: "CNI_IFNAME",
        },
        Case {
            name: "CNI_IFNAME too long",
            inv: |i| i.env("CNI_IFNAME", Some("eth0123456789abcdef")),
            conf: keep,
            raw: None,
            code: 4,
            names: "CNI_IFNAME",
        },
        Case {
            name: "CNI_IFNAME with a slash",
            inv: |i| i.env("CNI_IFNAME", Some("eth/0")),
            conf: keep,
            raw: None,
            code: 4,
            names: "CNI_IFNAME",
        },
        Case {
            name: "malformed CNI_ARGS",
            inv: |i| i.args("K8S_POD_NAME"),
            conf: keep,
            raw: None,
            code: 4,
            names: "CNI_ARGS",
        },
        Case {
            name: "unknown CNI_ARGS key without IgnoreUnknown",
            inv: |i| i.args("FOO=bar"),
            conf: keep,
            raw: None,
            code: 4,
            names: "FOO",
        },
        Case {
            name: "unsupported cniVersion",
            inv: same,
            conf: |c| c["cniVersion"] = json!("9.9.9"),
            raw: None,
            code: 1,
            names: "9.9.9",
        },
        Case {
            name: "missing network name",
            inv: same,
            conf: |c| {
                c.as_object_mut().unwrap().remove("name");
            },
            raw: None,
            code: 7,
            names: "name",
        },
        Case {
            name: "mtu too small",
            inv: same,
            conf: |c| c["mtu"] = json!(10),
            raw: None,
            code: 7,
            names: "mtu",
        },
        Case {
            name: "mtu not a number",
            inv: same,
            conf: |c| c["mtu"] = json!("big"),
            raw: None,
            code: 7,
            names: "mtu",
        },
        Case {
            name: "ipamSocket not a string",
            inv: same,
            conf: |c| c["ipamSocket"] = json!(5),
            raw: None,
            code: 7,
            names: "ipamSocket",
        },
        Case {
            name: "bad CIDR in podRoutes",
            inv: same,
            conf: |c| c["podRoutes"] = json!(["10.0.0.0/33"]),
            raw: None,
            code: 7,
            names: "podRoutes",
        },
        Case {
            name: "bad IPv6 CIDR in podRoutes",
            inv: same,
            conf: |c| c["podRoutes"] = json!(["10.0.0.0/8", "fd00::/129"]),
            raw: None,
            code: 7,
            names: "podRoutes[1]",
        },
        Case {
            name: "IPv6 podRoutes entry with host bits",
            inv: same,
            conf: |c| c["podRoutes"] = json!(["fd00::1/8"]),
            raw: None,
            code: 7,
            names: "podRoutes[0]",
        },
        Case {
            name: "malformed IPv6 address in podRoutes",
            inv: same,
            conf: |c| c["podRoutes"] = json!(["2001:db8::zz/64"]),
            raw: None,
            code: 7,
            names: "podRoutes[0]",
        },
        Case {
            name: "IPv6 podRoutes entry duplicated",
            inv: same,
            conf: |c| c["podRoutes"] = json!(["fd00::/8", "fd00::/8"]),
            raw: None,
            code: 7,
            names: "podRoutes[1]",
        },
        Case {
            name: "IPv6 podRoutes entry for a family ipFamilies leaves out",
            inv: same,
            conf: |c| {
                c["ipFamilies"] = json!(["ipv4"]);
                c["podRoutes"] = json!(["0.0.0.0/0", "::/0"]);
            },
            raw: None,
            code: 7,
            names: "podRoutes[1]",
        },
        Case {
            name: "unknown family in ipFamilies",
            inv: same,
            conf: |c| c["ipFamilies"] = json!(["ipv4", "ipv7"]),
            raw: None,
            code: 7,
            names: "ipFamilies[1]",
        },
        Case {
            name: "ipFamilies with a family twice",
            inv: same,
            conf: |c| c["ipFamilies"] = json!(["ipv6", "ipv6"]),
            raw: None,
            code: 7,
            names: "ipFamilies[1]",
        },
        Case {
            name: "empty ipFamilies",
            inv: same,
            conf: |c| c["ipFamilies"] = json!([]),
            raw: None,
            code: 7,
            names: "ipFamilies",
        },
        Case {
            name: "ipFamilies not an array",
            inv: same,
            conf: |c| c["ipFamilies"] = json!("ipv6"),
            raw: None,
            code: 7,
            names: "ipFamilies",
        },
        Case {
            name: "unknown pool",
            inv: same,
            conf: |c| c["pool"] = json!("nope"),
            raw: None,
            code: 7,
            names: "nope",
        },
        Case {
            name: "ADD with a netns that does not exist",
            inv: |i| i.env("CNI_NETNS", Some("/run/netns/aliasnet-no-such-ns")),
            conf: keep,
            raw: None,
            code: 3,
            names: "aliasnet-no-such-ns",
        },
    ]
}

#[test]
fn bad_input_gets_the_right_code_and_leaves_nothing() {
    require_root();
    let f = Fabric::one_node();
    let n = f.node(1);
    let pod_ns = Netns::new(&format!("an{}-bad", f.tag)).unwrap();
    let mut failures = Vec::new();
    for c in cases() {
        let inv = (c.inv)(Invocation::new(
            "ADD",
            "bad-cid",
            Some(&pod_ns.path()),
            "eth0",
        ));
        let out = match c.raw {
            Some(raw) => n.cni_raw(&inv, raw),
            None => {
                let mut conf = n.plugin_config(None, None);
                (c.conf)(&mut conf);
                n.cni(&inv, &conf)
            }
        };
        // One JSON document, even for errors (Outcome::json asserts it).
        let doc = out.json();
        let code = out.error_code();
        let text = doc.as_ref().map(|d| d.to_string()).unwrap_or_default();
        if code != Some(c.code) || !text.contains(c.names) {
            failures.push(format!(
                "{}: want code {} naming {:?}, got exit {} stdout={} stderr={}",
                c.name, c.code, c.names, out.exit_code, out.stdout, out.stderr
            ));
        }
        let links = pod_ns.link_names().unwrap();
        if links != ["lo"] {
            failures.push(format!("{}: left links in the pod: {links:?}", c.name));
        }
        if !n.host_veths().is_empty() || !n.ipamd().leases().is_empty() {
            failures.push(format!(
                "{}: left veths {:?} / leases {:?}",
                c.name,
                n.host_veths(),
                n.ipamd().leases()
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn pool_exhaustion_is_a_clear_plugin_error() {
    require_root();
    let f = Fabric::new(FabricOpts {
        nodes: 1,
        pool: Some(r#"ips = ["10.240.1.10", "10.240.1.11"]"#.into()),
        cni_version: "1.1.0".into(),
        ..Default::default()
    })
    .unwrap();
    let n = f.node(1);
    let a = n.add_pod("x1").unwrap();
    let b = n.add_pod("x2").unwrap();
    let out = n.cni(
        &Invocation::new("STATUS", "", None, ""),
        &n.plugin_config(None, None),
    );
    out.expect_code(50, "STATUS with an exhausted pool");

    let pod_ns = Netns::new(&format!("an{}-x3", f.tag)).unwrap();
    let inv = Invocation::new("ADD", "x3", Some(&pod_ns.path()), "eth0");
    let out = n.cni(&inv, &n.plugin_config(None, None));
    let code = out.error_code().expect("ADD must fail");
    assert!(
        code >= 100,
        "plugin-specific code for exhaustion, got {code}: {}",
        out.stdout
    );
    let msg = out.error_msg();
    assert!(
        msg.contains("secondary") && msg.contains("free"),
        "message names the pool and says why: {msg}"
    );
    assert_eq!(pod_ns.link_names().unwrap(), ["lo"]);
    assert_eq!(n.host_veths().len(), 2);
    assert_eq!(n.ipamd().leases().len(), 2);

    n.del_pod(&a).expect_ok("DEL");
    n.del_pod(&b).expect_ok("DEL");
    n.assert_clean();
}
