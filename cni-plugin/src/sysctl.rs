//! The three host sysctls the datapath needs. `/proc/sys/net` shows the netns of the task that
//! opens it, so these run on the (host-netns) main thread.

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
