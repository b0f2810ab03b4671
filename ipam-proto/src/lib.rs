//! The contract between the short-lived `aliasnet` CNI binary and the long-lived `aliasnet-ipamd`.
//!
//! * [`msg`]: request and response types. Every frame carries the protocol version.
//! * [`frame`]: length-prefixed JSON framing with a hard size cap, shared by both sides.
//! * [`client`]: a blocking client. The plugin is exec'd per pod operation, so it avoids a runtime
//!   for this one round trip.
//! * [`spool`]: the on-disk release queue DEL writes when the daemon is unreachable; the daemon
//!   drains it when it starts.
//! * [`host_veth_name`]: the deterministic host-side interface name of an attachment, so DEL
//!   can find the veth without a `prevResult` and the daemon can recognise its own interfaces.

pub mod client;
mod decode;
pub mod frame;
pub mod msg;
pub mod spool;

pub use client::{Client, ClientError};
pub use msg::*;

use sha2::{Digest, Sha256};

/// Default path of the daemon's socket.
pub const DEFAULT_SOCKET: &str = "/run/aliasnet/ipamd.sock";
/// Default directory of the release spool.
pub const DEFAULT_SPOOL_DIR: &str = "/var/lib/aliasnet/spool";
/// Default prefix of host-side veth names. Short, so prefix + hash fits in IFNAMSIZ - 1 (15).
pub const DEFAULT_HOST_VETH_PREFIX: &str = "ali";

/// Network of the leases `aliasnet-ipamd recover` rebuilds from the kernel, whose real key is
/// unknown (the host veth name is a hash of it). Not a valid CNI network name (those start with
/// a letter or digit), so it never collides with a real one. Such a lease has the key
/// `(RECOVERED_NETWORK, <host veth name>, "-")` and `host_veth` set; the daemon releases it
/// when a Release names that veth (as `teardown_link`, or through the key it hashes to), when
/// the veth stays gone (reconcile), or with a GC of any network that does not list it while
/// its veth is gone.
pub const RECOVERED_NETWORK: &str = "_recovered";

/// The key under which a recovered lease of `host_veth` is stored.
pub fn recovered_key(host_veth: &str) -> AttachmentKey {
    AttachmentKey::new(RECOVERED_NETWORK, host_veth, "-")
}

/// Host-side veth name for an attachment: `prefix` followed by a hash of the attachment key,
/// truncated to the kernel's 15-character limit.
///
/// Deterministic so that DEL (which may arrive without `prevResult` or netns) and the daemon's
/// reconcile can both derive it from the key alone.
pub fn host_veth_name(prefix: &str, key: &AttachmentKey) -> String {
    let mut h = Sha256::new();
    h.update(key.network.as_bytes());
    h.update([0]);
    h.update(key.container_id.as_bytes());
    h.update([0]);
    h.update(key.ifname.as_bytes());
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let room = 15usize.saturating_sub(prefix.len()).max(1);
    let mut name = String::with_capacity(15);
    name.push_str(prefix);
    name.push_str(&hex[..room.min(hex.len())]);
    name.truncate(15);
    name
}

/// Whether `name` is a host veth name aliasnet could have made with `prefix`
/// ([`host_veth_name`]: the prefix and hex digits, 15 characters).
pub fn is_host_veth_name(name: &str, prefix: &str) -> bool {
    name.len() == 15
        && name.starts_with(prefix)
        && name[prefix.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// THE check of whether a host link is one of aliasnet's veths: a link of kind `kind` (its
/// `IFLA_INFO_KIND`) named `name`. Whatever else carries such a name is not ours.
pub fn is_host_veth(kind: Option<&str>, name: &str, prefix: &str) -> bool {
    kind == Some("veth") && is_host_veth_name(name, prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_names() {
        let k = AttachmentKey::new("n", "c", "eth0");
        let ours = host_veth_name("ali", &k);
        assert!(is_host_veth_name(&ours, "ali"));
        assert!(is_host_veth(Some("veth"), &ours, "ali"));
        assert!(!is_host_veth(Some("bridge"), &ours, "ali"));
        assert!(!is_host_veth(None, &ours, "ali"));
        assert!(!is_host_veth_name("ali0123456789aG", "ali"));
        assert!(!is_host_veth_name("ali0123", "ali"));
        assert!(!is_host_veth_name("eth0", "ali"));
        assert!(!is_host_veth_name("xyz0123456789ab", "ali"));
    }

    #[test]
    fn veth_name_fits_ifnamsiz_and_is_stable() {
        let k = AttachmentKey::new("net", "abc", "eth0");
        let a = host_veth_name("ali", &k);
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("ali"));
        assert_eq!(a, host_veth_name("ali", &k));
        let other = AttachmentKey::new("net", "abc", "eth1");
        assert_ne!(a, host_veth_name("ali", &other));
        // A recovered lease's key is not a valid CNI network name.
        let r = recovered_key("ali0123456789ab");
        assert!(r.network.starts_with('_') && r.container_id == "ali0123456789ab");
        // A long prefix still yields a valid name.
        assert_eq!(host_veth_name("averyverylongprefix", &k).len(), 15);
    }
}
