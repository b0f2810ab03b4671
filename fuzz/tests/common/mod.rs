//! Generators shared by the state targets: what ipamd's request checks accept, so records
//! built from them are ones the daemon could have written.

use aliasnet_ipam::lease;
use aliasnet_ipam_proto::{AttachmentKey, PodRef};
use proptest::prelude::*;

/// A key that passes `lease::validate_key` (names, hex ids, UUIDs, arbitrary text).
pub fn valid_key() -> impl Strategy<Value = AttachmentKey> {
    let field = prop_oneof![
        3 => "[a-z][a-z0-9-]{0,12}",
        2 => "[0-9a-f]{2,64}",
        1 => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        1 => aliasnet_fuzz::text(),
    ];
    (field.clone(), field, "(eth|net)[0-9]")
        .prop_map(|(n, c, i)| AttachmentKey::new(&n, &c, &i))
        .prop_filter("valid key", |k| lease::validate_key(k).is_ok())
}

/// Pod fields that pass `lease::validate_pod`.
pub fn valid_pod() -> impl Strategy<Value = PodRef> {
    let f = proptest::option::of(prop_oneof!["[a-z0-9-]{0,20}", aliasnet_fuzz::text()]);
    (f.clone(), f.clone(), f)
        .prop_map(|(namespace, name, uid)| PodRef {
            namespace,
            name,
            uid,
        })
        .prop_filter("valid pod", |p| lease::validate_pod(p).is_ok())
}

/// A host veth name, or none.
pub fn link() -> impl Strategy<Value = Option<String>> {
    proptest::option::of("ali[0-9a-f]{12}")
}
