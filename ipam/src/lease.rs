//! Compact in-memory lease representation.
//!
//! 200,000 leases must fit in a few tens of MiB, so a lease is not kept as the wire `Lease`
//! (seven separate `String`s). The map key is the attachment key packed into one string
//! (`network\0container_id\0ifname`) and the optional pod fields share a second one. NUL cannot
//! occur in CNI environment values, so requests carrying it are refused up front.

use std::net::Ipv4Addr;

use aliasnet_ipam_proto::{AttachmentKey, Lease, PodRef};

/// Longest accepted key or pod field, in bytes.
pub const MAX_FIELD: usize = 1024;
/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
pub const MAX_IFNAME: usize = 15;

/// Optional-field presence bits of [`LeaseEntry::present`] and alloc records.
pub const HAS_NAMESPACE: u8 = 1;
pub const HAS_NAME: u8 = 2;
pub const HAS_UID: u8 = 4;
pub const HAS_VETH: u8 = 8;
pub const HAS_ALL: u8 = HAS_NAMESPACE | HAS_NAME | HAS_UID | HAS_VETH;

/// Where a lease is in its commit life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Durable and acknowledged (or acknowledgeable).
    Committed,
    /// Reserved in memory; its record is not yet durable. Invisible to readers.
    PendingAlloc,
    /// Committed, and a release record is on its way to disk. Still visible to readers.
    PendingRelease,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEntry {
    /// Present optional fields (pod namespace, name, uid, host veth), each followed by NUL.
    pub extra: Box<str>,
    pub present: u8,
    pub state: LeaseState,
    /// Handed out again by an idempotent repeat since it was made (so someone holds it even if
    /// the first requester vanished).
    pub seen: bool,
    /// Index into the state's pool-name table.
    pub pool_name: u16,
    pub addr: u32,
    pub allocated_at_ms: u64,
}

impl LeaseEntry {
    /// The optional fields in order: namespace, name, uid, host veth.
    pub fn fields(&self) -> [Option<&str>; 4] {
        let mut out = [None; 4];
        let mut it = self.extra.split('\0');
        for (i, bit) in [HAS_NAMESPACE, HAS_NAME, HAS_UID, HAS_VETH]
            .into_iter()
            .enumerate()
        {
            if self.present & bit != 0 {
                out[i] = it.next();
            }
        }
        out
    }

    pub fn host_veth(&self) -> Option<&str> {
        self.fields()[3]
    }

    pub fn to_lease(&self, packed_key: &str, pool: &str) -> Lease {
        let [namespace, name, uid, veth] = self.fields();
        Lease {
            key: unpack_key(packed_key),
            address: Ipv4Addr::from(self.addr),
            pool: pool.to_owned(),
            pod: PodRef {
                namespace: namespace.map(str::to_owned),
                name: name.map(str::to_owned),
                uid: uid.map(str::to_owned),
            },
            host_veth: veth.map(str::to_owned),
            allocated_at_ms: self.allocated_at_ms,
        }
    }
}

/// Pack optional fields; returns (extra, present bits).
pub fn pack_extra(pod: &PodRef, host_veth: Option<&str>) -> (Box<str>, u8) {
    let mut s = String::new();
    let mut present = 0;
    for (bit, v) in [
        (HAS_NAMESPACE, pod.namespace.as_deref()),
        (HAS_NAME, pod.name.as_deref()),
        (HAS_UID, pod.uid.as_deref()),
        (HAS_VETH, host_veth),
    ] {
        if let Some(v) = v {
            present |= bit;
            s.push_str(v);
            s.push('\0');
        }
    }
    (s.into_boxed_str(), present)
}

/// True when `extra` is well formed for `present` (used when decoding records).
pub fn extra_is_valid(extra: &str, present: u8) -> bool {
    present & !HAS_ALL == 0
        && extra.bytes().filter(|b| *b == 0).count() == present.count_ones() as usize
        && (extra.is_empty() || extra.ends_with('\0'))
}

pub fn pack_key(key: &AttachmentKey) -> Box<str> {
    let mut s =
        String::with_capacity(key.network.len() + key.container_id.len() + key.ifname.len() + 2);
    s.push_str(&key.network);
    s.push('\0');
    s.push_str(&key.container_id);
    s.push('\0');
    s.push_str(&key.ifname);
    s.into_boxed_str()
}

/// The (network, container, ifname) parts of a packed key.
pub fn key_parts(packed: &str) -> (&str, &str, &str) {
    let mut it = packed.splitn(3, '\0');
    let n = it.next().unwrap_or_default();
    let c = it.next().unwrap_or_default();
    let i = it.next().unwrap_or_default();
    (n, c, i)
}

pub fn unpack_key(packed: &str) -> AttachmentKey {
    let (n, c, i) = key_parts(packed);
    AttachmentKey::new(n, c, i)
}

/// True when `packed` is a well-formed packed key (used when decoding records).
pub fn packed_key_is_valid(packed: &str) -> bool {
    let mut n = 0;
    for p in packed.split('\0') {
        n += 1;
        if n > 3 || p.is_empty() || p.len() > MAX_FIELD {
            return false;
        }
    }
    n == 3
}

/// Check a request's key; the error names the bad field.
pub fn validate_key(key: &AttachmentKey) -> Result<(), String> {
    for (name, v) in [
        ("network", &key.network),
        ("container_id", &key.container_id),
        ("ifname", &key.ifname),
    ] {
        if v.is_empty() {
            return Err(format!("key.{name} must not be empty"));
        }
        check_text(&format!("key.{name}"), v)?;
    }
    Ok(())
}

pub fn validate_pod(pod: &PodRef) -> Result<(), String> {
    for (name, v) in [
        ("namespace", &pod.namespace),
        ("name", &pod.name),
        ("uid", &pod.uid),
    ] {
        if let Some(v) = v {
            check_text(&format!("pod.{name}"), v)?;
        }
    }
    Ok(())
}

fn check_text(field: &str, v: &str) -> Result<(), String> {
    if v.len() > MAX_FIELD {
        return Err(format!(
            "{field} is {} bytes long; at most {MAX_FIELD} are accepted",
            v.len()
        ));
    }
    if v.contains('\0') {
        return Err(format!("{field} contains a NUL character"));
    }
    Ok(())
}

/// A valid Linux interface name (what the kernel's `dev_valid_name` accepts).
pub fn validate_ifname(field: &str, v: &str) -> Result<(), String> {
    if v.is_empty() || v.len() > MAX_IFNAME || v == "." || v == ".." {
        return Err(format!(
            "{field} {v:?} is not a valid interface name (1 to {MAX_IFNAME} bytes)"
        ));
    }
    if v.bytes()
        .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
    {
        return Err(format!(
            "{field} {v:?} is not a valid interface name (no '/', ':' or whitespace)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_lease_fields() {
        let key = AttachmentKey::new("net", "cid", "eth0");
        let pod = PodRef {
            namespace: Some("ns".into()),
            name: None,
            uid: Some(String::new()),
        };
        let (extra, present) = pack_extra(&pod, Some("ali0123"));
        assert!(extra_is_valid(&extra, present));
        let e = LeaseEntry {
            extra,
            present,
            state: LeaseState::Committed,
            seen: false,
            pool_name: 0,
            addr: u32::from(Ipv4Addr::new(10, 0, 0, 1)),
            allocated_at_ms: 7,
        };
        let packed = pack_key(&key);
        assert!(packed_key_is_valid(&packed));
        let l = e.to_lease(&packed, "p");
        assert_eq!(l.key, key);
        assert_eq!(l.pod, pod);
        assert_eq!(l.host_veth.as_deref(), Some("ali0123"));
        assert_eq!(l.address, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(e.host_veth(), Some("ali0123"));
    }

    #[test]
    fn validation() {
        assert!(validate_key(&AttachmentKey::new("n", "", "eth0")).is_err());
        assert!(validate_key(&AttachmentKey::new("n", "c\0", "eth0")).is_err());
        assert!(validate_key(&AttachmentKey::new("n", &"x".repeat(2000), "eth0")).is_err());
        assert!(validate_key(&AttachmentKey::new("n", "c", "eth0")).is_ok());
        assert!(validate_ifname("host_veth", "ali0123456789ab").is_ok());
        assert!(validate_ifname("host_veth", "ali0123456789abc").is_err());
        assert!(validate_ifname("host_veth", "a/b").is_err());
        assert!(!packed_key_is_valid("a\0b"));
        assert!(!extra_is_valid("x\0", 0));
    }
}
