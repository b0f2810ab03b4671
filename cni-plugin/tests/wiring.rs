//! The plugin binary wiring each address family for real: ADD, CHECK and DEL of a dual-stack
//! pod and of a pod of one family (IPv4 or IPv6) between two network namespaces this test
//! creates ("node" and "pod"), with the kernel's view read back through `ip`. The addresses
//! come from a small in-process IPAM server speaking the daemon's wire protocol, so what is
//! tested is the plugin's side alone (the fabric tests run the same with aliasnet-ipamd).
//! Needs root; `datapath: off`.

use std::{
    collections::BTreeMap,
    io::Write,
    net::IpAddr,
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aliasnet_ipam_proto::{frame, Family, Lease, Request, Response};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_aliasnet");

/// The leases the in-process IPAM holds, per (network, container, ifname).
type Leases = Arc<Mutex<BTreeMap<(String, String, String), Vec<Lease>>>>;

/// An IPAM server on a unix socket: one IPv4 and one IPv6 address per attachment, from
/// 10.77.0.0/24 and fd00:77::/64, all or nothing like the daemon.
struct Ipam {
    socket: PathBuf,
    leases: Leases,
}

impl Ipam {
    fn start(dir: &Path) -> Self {
        let socket = dir.join("ipamd.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let leases: Leases = Arc::default();
        let held = leases.clone();
        std::thread::spawn(move || {
            let mut next = 2u32;
            for conn in listener.incoming() {
                let Ok(mut s) = conn else { return };
                // One request per connection at a time, as the plugin sends them.
                while let Ok(req) = frame::read_frame::<_, Request>(&mut s) {
                    let resp = answer(&held, &mut next, req);
                    if frame::write_frame(&mut s, &resp).is_err() {
                        break;
                    }
                }
            }
        });
        Self { socket, leases }
    }

    fn held(&self) -> Vec<IpAddr> {
        let l = self.leases.lock().unwrap();
        l.values().flatten().map(|l| l.address).collect()
    }
}

fn answer(leases: &Leases, next: &mut u32, req: Request) -> Response {
    let id = |k: &aliasnet_ipam_proto::AttachmentKey| {
        (k.network.clone(), k.container_id.clone(), k.ifname.clone())
    };
    let ordered = |mut v: Vec<Lease>| {
        v.sort_by_key(|l| l.address);
        let mut it = v.into_iter();
        (it.next(), it.collect::<Vec<_>>())
    };
    let mut held = leases.lock().unwrap();
    match req {
        Request::Allocate {
            key,
            families,
            host_veth,
            ..
        } => {
            let families = families.unwrap_or(Family::ALL.to_vec());
            let entry = held.entry(id(&key)).or_insert_with(|| {
                *next += 1;
                families
                    .iter()
                    .map(|f| {
                        let address = match f {
                            Family::Ipv4 => format!("10.77.0.{next}"),
                            Family::Ipv6 => format!("fd00:77::{next:x}"),
                        };
                        serde_json::from_value(json!({
                            "key": key, "address": address, "pool": f.as_str(),
                            "host_veth": host_veth, "allocated_at_ms": 1000 + *next as u64
                        }))
                        .unwrap()
                    })
                    .collect()
            });
            let (lease, more) = ordered(entry.clone());
            Response::Allocated {
                lease: lease.unwrap(),
                more,
            }
        }
        Request::Check { key } => {
            let (lease, more) = ordered(held.get(&id(&key)).cloned().unwrap_or_default());
            Response::Lease { lease, more }
        }
        Request::Release { key, .. } | Request::ReleaseLease { key, .. } => {
            let gone = held.remove(&id(&key)).unwrap_or_default();
            Response::Released {
                address: ordered(gone).0.map(|l| l.address),
            }
        }
        Request::RecordOp { .. } => Response::Recorded,
        other => Response::Error {
            kind: aliasnet_ipam_proto::ErrorKind::BadRequest,
            message: format!("not served here: {other:?}"),
        },
    }
}

/// A network namespace, removed on drop.
struct Ns(String);

impl Ns {
    fn new(role: &str) -> Self {
        let name = format!("wire-{role}-{}", std::process::id());
        run("ip", &["netns", "add", &name]);
        let ns = Ns(name);
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", &self.0];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    fn exec_ok(&self, args: &[&str]) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    fn sysctl(&self, path: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "cat", path])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Setup {
    _dir: tempfile::TempDir,
    ipam: Ipam,
    node: Ns,
    pod: Ns,
    base: Value,
}

fn setup(role: &str, extra: Value) -> Setup {
    assert!(
        nix_is_root(),
        "needs root: this test creates network namespaces (run tests/run.sh, or cargo test as root)"
    );
    let dir = tempfile::tempdir().unwrap();
    let ipam = Ipam::start(dir.path());
    let mut base = json!({
        "cniVersion": "1.0.0", "name": "v6net", "type": "aliasnet",
        "ipamSocket": ipam.socket, "spoolDir": dir.path().join("spool"),
        "mtu": 1500, "datapath": "off",
        // The daemon deletes the host veth after an asynchronous DEL; this IPAM does not.
        "asyncTeardown": false
    });
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    let node = Ns::new(&format!("{role}-n"));
    // The node's own addresses, the sources of its pings to the pod.
    node.ip(&["addr", "add", "192.0.2.1/32", "dev", "lo"]);
    node.ip(&["addr", "add", "2001:db8:ff::1/128", "dev", "lo"]);
    Setup {
        _dir: dir,
        ipam,
        node,
        pod: Ns::new(&format!("{role}-p")),
        base,
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

struct Out {
    ok: bool,
    doc: Option<Value>,
    elapsed: Duration,
}

impl Setup {
    /// Run the plugin in the node namespace.
    fn cni(&self, cmd: &str, conf: &Value) -> Out {
        let t0 = Instant::now();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.node.0, BIN])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", "c6")
            .env("CNI_NETNS", self.pod.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/opt/cni/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let elapsed = t0.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        Out {
            ok: out.status.success(),
            doc: serde_json::from_str(&stdout).ok(),
            elapsed,
        }
    }

    fn add(&self) -> (Value, Duration) {
        let o = self.cni("ADD", &self.base);
        assert!(o.ok, "ADD failed: {:?}", o.doc);
        (o.doc.unwrap(), o.elapsed)
    }

    fn with_prev(&self, prev: &Value) -> Value {
        let mut c = self.base.clone();
        c["prevResult"] = prev.clone();
        c
    }

    fn host_veth(&self, result: &Value) -> String {
        result["interfaces"][0]["name"].as_str().unwrap().to_owned()
    }
}

/// The pod's IPv6 address line from `ip -6 addr`, asserted present.
fn addr_line(pod: &Ns, addr: &str) -> String {
    let out = pod.ip(&["-6", "addr", "show", "dev", "eth0"]);
    out.lines()
        .find(|l| l.contains(&format!("inet6 {addr}/128")))
        .unwrap_or_else(|| panic!("no {addr}/128 on eth0:\n{out}"))
        .to_owned()
}

#[test]
fn dual_stack_pod_add_check_del() {
    let s = setup("ds", json!({}));
    // The node's uplink takes router advertisements (its IPv6 default route may come from
    // them), another interface does not; forwarding is still off.
    s.node
        .ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"]);
    let conf = "/proc/sys/net/ipv6/conf";
    for (knob, v) in [
        ("up0/accept_ra", "1"),
        ("up1/accept_ra", "0"),
        ("default/accept_ra", "1"),
    ] {
        assert!(s.node.exec_ok(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{}={v}", knob.replace('/', "."))
        ]));
    }
    assert_eq!(s.node.sysctl(&format!("{conf}/all/forwarding")), "0");
    let (r, took) = s.add();
    // Forwarding on, and what took advertisements still does, as a router.
    assert_eq!(s.node.sysctl(&format!("{conf}/all/forwarding")), "1");
    assert_eq!(s.node.sysctl(&format!("{conf}/up0/accept_ra")), "2");
    assert_eq!(s.node.sysctl(&format!("{conf}/default/accept_ra")), "2");
    assert_eq!(s.node.sysctl(&format!("{conf}/up1/accept_ra")), "0");
    let veth = s.host_veth(&r);
    let ips = r["ips"].as_array().unwrap();
    assert_eq!(ips.len(), 2, "{r}");
    let v4 = ips[0]["address"].as_str().unwrap().trim_end_matches("/32");
    let v6 = ips[1]["address"].as_str().unwrap().trim_end_matches("/128");
    assert!(
        v4.starts_with("10.77.0.") && v6.starts_with("fd00:77::"),
        "{r}"
    );
    assert_eq!(ips[1]["gateway"], "fe80::1");
    assert!(ips.iter().all(|i| i["interface"] == 1));
    assert_eq!(
        r["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}, {"dst": "::/0", "gw": "fe80::1"}])
    );
    // No duplicate address detection: usable the moment ADD returns, and ADD did not wait.
    let line = addr_line(&s.pod, v6);
    assert!(
        line.contains("nodad") && !line.contains("tentative"),
        "{line}"
    );
    assert!(took < Duration::from_millis(900), "ADD took {took:?}");
    for knob in ["accept_ra", "accept_dad", "disable_ipv6"] {
        let v = s
            .pod
            .sysctl(&format!("/proc/sys/net/ipv6/conf/eth0/{knob}"));
        assert_eq!(v, "0", "pod {knob}");
    }
    assert_eq!(s.node.sysctl("/proc/sys/net/ipv6/conf/all/forwarding"), "1");
    // Pod: default route via the link-local gateway, whose neighbour is the host veth.
    let routes = s.pod.ip(&["-6", "route", "show"]);
    assert!(routes.contains("default via fe80::1 dev eth0"), "{routes}");
    let host_mac = r["interfaces"][0]["mac"].as_str().unwrap();
    let neigh = s.pod.ip(&["-6", "neigh", "show", "dev", "eth0"]);
    assert!(
        neigh.contains(&format!("fe80::1 lladdr {host_mac} PERMANENT")),
        "{neigh}"
    );
    // Node: the /128 to the pod through the veth, and the gateway address on the veth.
    let routes = s.node.ip(&["-6", "route", "show"]);
    assert!(routes.contains(&format!("{v6} dev {veth}")), "{routes}");
    let host_addrs = s.node.ip(&["-6", "addr", "show", "dev", &veth]);
    assert!(host_addrs.contains("inet6 fe80::1/64"), "{host_addrs}");
    // Traffic: the pod reaches its gateway, the node reaches the pod on both families.
    assert!(s
        .pod
        .exec_ok(&["ping", "-6", "-c1", "-W2", "-I", "eth0", "fe80::1"]));
    assert!(s.node.exec_ok(&["ping", "-6", "-c1", "-W2", v6]));
    assert!(s.node.exec_ok(&["ping", "-4", "-c1", "-W2", v4]));

    let check = s.cni("CHECK", &s.with_prev(&r));
    assert!(check.ok, "CHECK: {:?}", check.doc);
    // CHECK names a missing IPv6 piece.
    s.pod.ip(&[
        "-6", "route", "del", "default", "via", "fe80::1", "dev", "eth0",
    ]);
    // ... and a pod setting that would bring duplicate address detection back, and the
    // neighbour entry of the gateway.
    assert!(s
        .pod
        .exec_ok(&["sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=1"]));
    s.pod.ip(&["-6", "neigh", "del", "fe80::1", "dev", "eth0"]);
    let check = s.cni("CHECK", &s.with_prev(&r));
    let e = check.doc.unwrap();
    assert!(!check.ok);
    assert_eq!(e["code"], 107, "{e}");
    let msg = e["msg"].as_str().unwrap();
    for want in [
        "pod IPv6 default route via fe80::1 dev eth0 missing",
        "net.ipv6.conf.eth0.accept_dad is 1, want 0",
        "pod neighbour fe80::1 on eth0 missing",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    assert!(
        !msg.contains("169.254.1.1"),
        "the IPv4 side is intact: {msg}"
    );

    let del = s.cni("DEL", &s.with_prev(&r));
    assert!(del.ok, "DEL: {:?}", del.doc);
    assert!(s.ipam.held().is_empty(), "{:?}", s.ipam.held());
    let links = s.node.ip(&["link", "show"]);
    assert!(!links.contains(&veth), "{links}");
    let routes = s.node.ip(&["-6", "route", "show"]);
    assert!(!routes.contains("fd00:77"), "{routes}");
    assert!(!s.pod.ip(&["link", "show"]).contains("eth0"));
}

/// What differs between the families for a pod of one family.
struct OneFamily {
    family: &'static str,
    ip_flag: &'static str,
    other_flag: &'static str,
    host_len: &'static str,
    /// The pod routes asked for; each covers one of the node's own addresses below.
    routes: [&'static str; 2],
    gateway: &'static str,
    /// The node's own address the pod pings through its routes.
    node_addr: &'static str,
    /// How the in-process IPAM's addresses of this family begin.
    pool: &'static str,
}

const V4: OneFamily = OneFamily {
    family: "ipv4",
    ip_flag: "-4",
    other_flag: "-6",
    host_len: "/32",
    routes: ["192.0.2.0/24", "10.0.0.0/8"],
    gateway: "169.254.1.1",
    node_addr: "192.0.2.1",
    pool: "10.77.0.",
};

const V6: OneFamily = OneFamily {
    family: "ipv6",
    ip_flag: "-6",
    other_flag: "-4",
    host_len: "/128",
    routes: ["2001:db8::/32", "fd00::/8"],
    gateway: "fe80::1",
    node_addr: "2001:db8:ff::1",
    pool: "fd00:77::",
};

/// A pod of family `fam` alone (`ipFamilies`) with `podRoutes` and no default route, on a
/// node whose MTU comes from that family's default route.
fn single_family_pod_with_pod_routes(fam: &OneFamily) {
    let s = setup(
        &fam.family[2..],
        json!({"cniVersion": "0.4.0", "ipFamilies": [fam.family], "podRoutes": fam.routes}),
    );
    // The MTU comes from the family's default route's device.
    s.node.ip(&[
        "link", "add", "up0", "mtu", "1400", "type", "veth", "peer", "name", "up1",
    ]);
    for l in ["up0", "up1"] {
        s.node.ip(&["link", "set", l, "up"]);
    }
    s.node.ip(&[
        fam.ip_flag,
        "route",
        "add",
        "default",
        "dev",
        "up0",
        "metric",
        "100",
    ]);
    let mut s = s;
    s.base.as_object_mut().unwrap().remove("mtu");
    let (r, _) = s.add();
    assert_eq!(r["ips"].as_array().unwrap().len(), 1, "{r}");
    assert!(
        s.pod.ip(&["link", "show", "eth0"]).contains("mtu 1400"),
        "MTU from the {} default route",
        fam.family
    );
    assert_eq!(r["ips"][0]["version"], &fam.ip_flag[1..]);
    let addr = r["ips"][0]["address"]
        .as_str()
        .unwrap()
        .trim_end_matches(fam.host_len);
    assert!(addr.starts_with(fam.pool), "{r}");
    assert_eq!(
        r["routes"],
        json!([{"dst": fam.routes[0], "gw": fam.gateway}, {"dst": fam.routes[1], "gw": fam.gateway}])
    );
    if fam.ip_flag == "-6" {
        assert!(!addr_line(&s.pod, addr).contains("tentative"));
    }
    // Nothing of the other family: no global address, no route but the kernel's link-local
    // and multicast ones.
    let mut show = vec![fam.other_flag, "addr", "show", "dev", "eth0"];
    if fam.other_flag == "-6" {
        show.extend(["scope", "global"]);
    }
    assert_eq!(s.pod.ip(&show).trim(), "", "a pod of one family only");
    let other_routes = s.pod.ip(&[fam.other_flag, "route", "show"]);
    assert!(
        other_routes
            .lines()
            .all(|l| l.starts_with("fe80::") || l.starts_with("multicast")),
        "{other_routes}"
    );
    let routes = s.pod.ip(&[fam.ip_flag, "route", "show"]);
    for dst in fam.routes {
        let want = format!("{dst} via {} dev eth0", fam.gateway);
        assert!(routes.contains(&want), "{want}: {routes}");
    }
    assert!(!routes.contains("default"), "{routes}");
    assert!(s.node.exec_ok(&["ping", fam.ip_flag, "-c1", "-W2", addr]));
    assert!(s
        .pod
        .exec_ok(&["ping", fam.ip_flag, "-c1", "-W2", fam.node_addr]));
    let check = s.cni("CHECK", &s.with_prev(&r));
    assert!(check.ok, "CHECK: {:?}", check.doc);
    let del = s.cni("DEL", &s.with_prev(&r));
    assert!(del.ok, "DEL: {:?}", del.doc);
    assert!(s.ipam.held().is_empty());
    assert!(!s
        .node
        .ip(&[fam.ip_flag, "route", "show"])
        .contains(fam.pool));
}

#[test]
fn ipv4_only_pod_with_pod_routes() {
    single_family_pod_with_pod_routes(&V4);
}

#[test]
fn ipv6_only_pod_with_pod_routes() {
    single_family_pod_with_pod_routes(&V6);
}

#[test]
fn bad_family_config_values_are_code_7() {
    let s = setup("bad", json!({}));
    for (k, v, field) in [
        ("ipFamilies", json!(["ipv6", "ipv5"]), "ipFamilies[1]"),
        ("ipFamilies", json!([]), "ipFamilies"),
        ("ipFamilies", json!(["ipv6", "ipv6"]), "ipFamilies[1]"),
        ("ipFamilies", json!(["ipv4", "ipv4"]), "ipFamilies[1]"),
        ("podRoutes", json!(["fd00::1/64"]), "podRoutes[0]"),
        ("podRoutes", json!(["::/0", "fd00::/129"]), "podRoutes[1]"),
        ("podRoutes", json!(["10.0.0.1/8"]), "podRoutes[0]"),
        (
            "podRoutes",
            json!(["0.0.0.0/0", "10.0.0.0/33"]),
            "podRoutes[1]",
        ),
    ] {
        let mut c = s.base.clone();
        c[k] = v.clone();
        let o = s.cni("ADD", &c);
        let e = o.doc.unwrap_or_default();
        assert!(!o.ok, "{k}={v} was accepted");
        assert_eq!(e["code"], 7, "{k}={v}: {e}");
        assert!(
            e["msg"].as_str().unwrap_or("").contains(field),
            "{k}={v}: {e}"
        );
    }
    // Nothing was allocated or created.
    assert!(s.ipam.held().is_empty());
    assert!(!s.pod.ip(&["link", "show"]).contains("eth0"));
}
