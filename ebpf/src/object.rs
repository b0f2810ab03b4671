//! The compiled eBPF objects, and the error for a build that has none.

use crate::DATAPATH_OBJECT;

/// The benchmarks' build of the programs (`datapath.bench.bpf.o`): the same code as
/// [`DATAPATH_OBJECT`], except that it obeys the switches in `an_config.flags`
/// ([`crate::abi::CFG_AQM_OFF`], [`crate::abi::CFG_FLOWS_OFF`], [`crate::abi::CFG_CLAMP_OFF`])
/// that turn a part of the datapath off. The product's object has no such test on its
/// per-packet path; only benchmarks and the tests of the switches load this one.
pub static BENCH_DATAPATH_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/datapath.bench.bpf.o"));

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
    built(DATAPATH_OBJECT)
}

/// [`BENCH_DATAPATH_OBJECT`], or [`MissingObject`] when this build embeds the empty stub.
pub fn bench_datapath_object() -> Result<&'static [u8], MissingObject> {
    built(BENCH_DATAPATH_OBJECT)
}

fn built(object: &'static [u8]) -> Result<&'static [u8], MissingObject> {
    if !object.is_empty() {
        return Ok(object);
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
