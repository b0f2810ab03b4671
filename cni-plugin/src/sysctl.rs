//! The sysctls the datapath needs, on the host and (for IPv6) in the pod. `/proc/sys/net` shows
//! the netns of the task that opens it: the host's run on the (host-netns) main thread, the
//! pod's on a short-lived thread inside the pod's netns.

use std::{fs, io};

use aliasnet_cni_types::{code, CniError};

fn err(path: &str, e: io::Error) -> CniError {
    CniError::new(code::SYSCTL, format!("cannot set {path}: {e}"))
}

/// `net.ipv4.ip_forward=1`, written only when it is not already 1 (the common case costs a read).
pub fn enable_ip_forward() -> Result<(), CniError> {
    const P: &str = "/proc/sys/net/ipv4/ip_forward";
    match fs::read(P) {
        Ok(v) if v.trim_ascii() == b"1" => Ok(()),
        _ => fs::write(P, b"1").map_err(|e| err(P, e)),
    }
}

/// Loose reverse-path filtering on the host veth: the pod's packets arrive from an address
/// the host routes via this very veth, but asymmetric paths (other uplinks) must not drop.
pub fn set_rp_filter_loose(ifname: &str) -> Result<(), CniError> {
    let p = format!("/proc/sys/net/ipv4/conf/{ifname}/rp_filter");
    fs::write(&p, b"2").map_err(|e| err(&p, e))
}

/// No router advertisements from the pod onto the host; fine if IPv6 is disabled.
pub fn disable_accept_ra(ifname: &str) -> Result<(), CniError> {
    let p = format!("/proc/sys/net/ipv6/conf/{ifname}/accept_ra");
    match fs::write(&p, b"0") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r.map_err(|e| err(&p, e)),
    }
}

/// `net.ipv6.conf.all.forwarding=1` for pods with an IPv6 address, written only when not
/// already 1. Setting it makes every interface a router, which stops interfaces with
/// `accept_ra=1` from taking router advertisements, and a node whose uplink learns its IPv6
/// default route from them (as cloud VMs do) would lose it when the route expires: first
/// those interfaces, and the default for interfaces attached later, get `accept_ra=2`, which
/// takes them as a router too. Where forwarding is already on, the node's owner chose.
pub fn enable_ipv6_forward() -> Result<(), CniError> {
    const P: &str = "/proc/sys/net/ipv6/conf/all/forwarding";
    if matches!(fs::read(P), Ok(v) if v.trim_ascii() == b"1") {
        return Ok(());
    }
    keep_router_advertisements()?;
    fs::write(P, b"1").map_err(|e| err(P, e))
}

/// `accept_ra=2` wherever it is 1 (interfaces and `default`; `all` has no effect on it).
fn keep_router_advertisements() -> Result<(), CniError> {
    const DIR: &str = "/proc/sys/net/ipv6/conf";
    let entries = match fs::read_dir(DIR) {
        Ok(e) => e,
        // IPv6 is disabled on the node: nothing takes advertisements.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(DIR, e)),
    };
    for entry in entries.flatten() {
        if entry.file_name() == "all" {
            continue;
        }
        let p = entry.path().join("accept_ra");
        if matches!(fs::read(&p), Ok(v) if v.trim_ascii() == b"1") {
            // An interface gone meanwhile does not matter.
            match fs::write(&p, b"2") {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                r => r.map_err(|e| err(&p.to_string_lossy(), e))?,
            }
        }
    }
    Ok(())
}

/// IPv6 on `ifname` (a node or a netns whose `default.disable_ipv6` is 1 creates links
/// without it); a read when it is already on.
pub fn enable_ipv6_on(ifname: &str) -> Result<(), CniError> {
    let p = format!("/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6");
    match fs::read(&p) {
        Ok(v) if v.trim_ascii() == b"0" => Ok(()),
        _ => fs::write(&p, b"0").map_err(|e| err(&p, e)),
    }
}

/// The pod interface's IPv6 settings, run inside the pod's netns: IPv6 on, no router
/// advertisements (its routes are ours), no duplicate address detection (its addresses are
/// unique by IPAM; DAD would hold every new address tentative for 1-2 s).
pub fn pod_ipv6(ifname: &str) -> Result<(), CniError> {
    enable_ipv6_on(ifname)?;
    for (knob, v) in POD_IPV6 {
        let p = format!("/proc/sys/net/ipv6/conf/{ifname}/{knob}");
        fs::write(&p, v).map_err(|e| err(&p, e))?;
    }
    Ok(())
}

/// What [`pod_ipv6`] writes besides `disable_ipv6=0`.
const POD_IPV6: [(&str, &[u8]); 2] = [("accept_ra", b"0"), ("accept_dad", b"0")];

/// CHECK's view of [`pod_ipv6`] (inside the pod's netns): each setting that is not as ADD left
/// it.
pub fn check_pod_ipv6(ifname: &str) -> Vec<String> {
    let mut p = Vec::new();
    let want = [("disable_ipv6", b"0".as_slice())]
        .into_iter()
        .chain(POD_IPV6);
    for (knob, v) in want {
        let path = format!("/proc/sys/net/ipv6/conf/{ifname}/{knob}");
        match fs::read(&path) {
            Ok(have) if have.trim_ascii() == v => {}
            Ok(have) => p.push(format!(
                "pod sysctl net.ipv6.conf.{ifname}.{knob} is {}, want {}",
                String::from_utf8_lossy(have.trim_ascii()),
                String::from_utf8_lossy(v)
            )),
            Err(e) => p.push(format!("pod sysctl {path}: {e}")),
        }
    }
    p
}

/// CHECK's view of the node's IPv6 forwarding.
pub fn check_ipv6_forward() -> Option<String> {
    const P: &str = "/proc/sys/net/ipv6/conf/all/forwarding";
    match fs::read(P) {
        Ok(v) if v.trim_ascii() == b"1" => None,
        Ok(_) => Some("node sysctl net.ipv6.conf.all.forwarding is not 1".into()),
        Err(e) => Some(format!("node sysctl {P}: {e}")),
    }
}
