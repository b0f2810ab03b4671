//! Compact in-memory lease representation and the lease table.
//!
//! 200,000 leases must fit in a few tens of MiB and load in a few tens of milliseconds, so a
//! lease is not kept as the wire [`Lease`] (seven `String`s). All its text lives in one boxed
//! byte string, [`LeaseEntry::data`]:
//!
//! ```text
//! data  := key extra
//! key   := field(network) field(container_id) field(ifname)
//! extra := present:u8 [field(namespace)] [field(name)] [field(uid)] [field(host_veth)]
//! field := varint(len << 2 | kind) payload[len]
//!          kind 0 raw UTF-8, 1 lowercase hex of even length packed two digits a byte,
//!          2 canonical lowercase UUID (8-4-4-4-12) as its 16 bytes
//! ```
//!
//! The common container id (64 hex digits) takes 33 bytes instead of 64, a pod UID 17 instead
//! of 36. The encoding is canonical (a string has exactly one encoding: raw is only used for
//! text that is neither hex nor a UUID), so keys compare and hash as bytes. The same bytes are
//! what the store writes, so loading a snapshot is a copy, not a parse into strings.
//!
//! [`LeaseTable`] holds the entries in a slab, indexed by key (hash table of slab ids) and by
//! address (ordered, for paging and scans in address order).

mod codec;
mod table;

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aliasnet_ipam_proto::{AttachmentKey, Family, Lease, PodRef};

/// An address as the allocator keys it: an IPv4 address is its 32-bit value, an IPv6 one its
/// 128-bit value. No pool holds an IPv6 address below 2^32 (`::/96`, the unspecified,
/// loopback and deprecated IPv4-compatible addresses), so the two never meet and every IPv4
/// address sorts before every IPv6 one, the order lease listings use.
pub type Addr = u128;

/// First value that is an IPv6 address.
pub const V6_START: Addr = 1 << 32;

pub fn addr_family(a: Addr) -> Family {
    if a < V6_START {
        Family::Ipv4
    } else {
        Family::Ipv6
    }
}

pub fn addr_ip(a: Addr) -> IpAddr {
    match u32::try_from(a) {
        Ok(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
        Err(_) => IpAddr::V6(Ipv6Addr::from(a)),
    }
}

/// The allocator's value of `ip`; `None` for an IPv6 address no pool can hold.
pub fn ip_addr(ip: IpAddr) -> Option<Addr> {
    match ip {
        IpAddr::V4(a) => Some(Addr::from(u32::from(a))),
        IpAddr::V6(a) => Some(u128::from(a)).filter(|v| *v >= V6_START),
    }
}

/// Longest accepted key or pod field, in bytes.
pub const MAX_FIELD: usize = 1024;
/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
pub const MAX_IFNAME: usize = 15;

pub use codec::*;
pub use table::{InsertError, LeaseTable};

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
    /// Key then optional fields, encoded as described in the module docs.
    pub data: Box<[u8]>,
    pub allocated_at_ms: u64,
    pub addr: Addr,
    /// Bytes of `data` that are the key.
    pub key_len: u16,
    /// Index into the state's pool-name table.
    pub pool_name: u16,
    pub state: LeaseState,
    /// Handed out again by an idempotent repeat since it was made (so someone holds it even if
    /// the first requester vanished).
    pub seen: bool,
}

impl LeaseEntry {
    pub fn key(&self) -> &[u8] {
        &self.data[..usize::from(self.key_len)]
    }

    pub fn family(&self) -> Family {
        addr_family(self.addr)
    }

    /// The optional fields in order: namespace, name, uid, host veth.
    pub fn fields(&self) -> [Option<Field<'_>>; 4] {
        let mut out = [None; 4];
        let mut pos = usize::from(self.key_len);
        let Some(&present) = self.data.get(pos) else {
            return out;
        };
        pos += 1;
        for (i, bit) in [HAS_NAMESPACE, HAS_NAME, HAS_UID, HAS_VETH]
            .into_iter()
            .enumerate()
        {
            if present & bit != 0 {
                out[i] = read_field(&self.data, &mut pos);
            }
        }
        out
    }

    pub fn host_veth(&self) -> Option<String> {
        self.fields()[3].map(Field::to_string_lossless)
    }

    /// The host veth field, borrowed (veth names are raw text, so `Field::Raw` in practice).
    pub fn host_veth_field(&self) -> Option<Field<'_>> {
        self.fields()[3]
    }

    pub fn host_veth_is(&self, name: &str) -> bool {
        self.fields()[3].is_some_and(|f| f.eq_str(name))
    }

    /// The key's network is `network`.
    pub fn network_is(&self, network: &str) -> bool {
        let mut pos = 0;
        read_field(&self.data, &mut pos).is_some_and(|f| f.eq_str(network))
    }

    pub fn attachment_key(&self) -> AttachmentKey {
        decode_key(self.key())
    }

    pub fn to_lease(&self, pool: &str) -> Lease {
        let [namespace, name, uid, veth] = self.fields();
        Lease {
            key: self.attachment_key(),
            address: addr_ip(self.addr),
            pool: pool.to_owned(),
            pod: PodRef {
                namespace: namespace.map(Field::to_string_lossless),
                name: name.map(Field::to_string_lossless),
                uid: uid.map(Field::to_string_lossless),
            },
            host_veth: veth.map(Field::to_string_lossless),
            allocated_at_ms: self.allocated_at_ms,
            missing: false,
        }
    }

    /// Bytes a [`Lease`] of this entry takes as JSON, roughly (for paging under a frame limit).
    pub fn json_size_hint(&self) -> usize {
        // Field names and punctuation ~200 bytes; hex-packed text doubles back.
        240 + self.data.len() * 2
    }
}

/// What is wrong with a field of a request or a record; `field` names it (`key.network`,
/// `pod.uid`, `host_veth`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("{field} must not be empty")]
    Empty { field: String },
    #[error("{field} is {len} bytes long; at most {MAX_FIELD} are accepted")]
    TooLong { field: String, len: usize },
    #[error("{field} contains a NUL character")]
    Nul { field: String },
    #[error("{field} {name:?} is not a valid interface name (1 to {MAX_IFNAME} bytes)")]
    IfnameLength { field: String, name: String },
    #[error("{field} {name:?} is not a valid interface name (no '/', ':' or whitespace)")]
    IfnameCharacters { field: String, name: String },
}

/// Check a request's key; the error names the bad field.
pub fn validate_key(key: &AttachmentKey) -> Result<(), FieldError> {
    for (name, v) in [
        ("network", &key.network),
        ("container_id", &key.container_id),
        ("ifname", &key.ifname),
    ] {
        if v.is_empty() {
            return Err(FieldError::Empty {
                field: format!("key.{name}"),
            });
        }
        check_text(|| format!("key.{name}"), v)?;
    }
    Ok(())
}

pub fn validate_pod(pod: &PodRef) -> Result<(), FieldError> {
    for (name, v) in [
        ("namespace", &pod.namespace),
        ("name", &pod.name),
        ("uid", &pod.uid),
    ] {
        if let Some(v) = v {
            check_text(|| format!("pod.{name}"), v)?;
        }
    }
    Ok(())
}

/// `field` is only formatted for an error.
fn check_text(field: impl Fn() -> String, v: &str) -> Result<(), FieldError> {
    if v.len() > MAX_FIELD {
        return Err(FieldError::TooLong {
            field: field(),
            len: v.len(),
        });
    }
    if v.contains('\0') {
        return Err(FieldError::Nul { field: field() });
    }
    Ok(())
}

/// A valid Linux interface name (what the kernel's `dev_valid_name` accepts).
pub fn validate_ifname(field: &str, v: &str) -> Result<(), FieldError> {
    if v.is_empty() || v.len() > MAX_IFNAME || v == "." || v == ".." {
        return Err(FieldError::IfnameLength {
            field: field.to_owned(),
            name: v.to_owned(),
        });
    }
    if v.bytes()
        .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
    {
        return Err(FieldError::IfnameCharacters {
            field: field.to_owned(),
            name: v.to_owned(),
        });
    }
    Ok(())
}

/// `key` as text for log lines (`network/container/ifname`).
pub fn key_text(key: &AttachmentKey) -> String {
    let mut s = String::new();
    let _ = write!(s, "{key}");
    s
}

#[cfg(test)]
mod tests;
