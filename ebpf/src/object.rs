//! The compiled eBPF object, and the error for a build that has none.

use crate::DATAPATH_OBJECT;

/// This build embeds an empty stub instead of `datapath.bpf.o`: `build.rs` found no clang-19
/// or libbpf headers, or `ALIASNET_EBPF_STUB=1` was set. Such a build checks and links, but
/// cannot load the datapath.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this build of aliasnet-ebpf has no eBPF programs ({reason}): install clang-19 and \
     libbpf-dev, then rebuild"
)]
pub struct MissingObject {
    /// Why `build.rs` wrote a stub.
    pub reason: &'static str,
}

/// [`DATAPATH_OBJECT`], or [`MissingObject`] when this build embeds the empty stub. Loaders
/// use this rather than the static, so that a build without clang fails with a clear error.
pub fn datapath_object() -> Result<&'static [u8], MissingObject> {
    if !DATAPATH_OBJECT.is_empty() {
        return Ok(DATAPATH_OBJECT);
    }
    let reason = env!("ALIASNET_EBPF_STUB_REASON");
    Err(MissingObject {
        reason: if reason.is_empty() {
            "empty object"
        } else {
            reason
        },
    })
}
