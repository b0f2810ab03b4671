//! The checks that refuse pins of another ABI: a map that does not match its definition
//! (`abi::MAPS`, `abi::POD_KEYS`: type, key, value, capacity), or a config of another
//! `abi::ABI_VERSION`, is never reused.

use std::path::Path;

use aya::maps::MapData;

use crate::{
    abi::{self, MapDef},
    error::DatapathError,
    maps,
};

/// Pinned maps written by a build of another ABI version are never reused.
pub(crate) fn check_abi_version(root: &Path, version: u32) -> Result<(), DatapathError> {
    if version == abi::ABI_VERSION {
        return Ok(());
    }
    Err(DatapathError::AbiMismatch {
        root: root.to_owned(),
        name: maps::CONFIG.to_owned(),
        reason: format!(
            "ABI version {version}, this build speaks {}",
            abi::ABI_VERSION
        ),
    })
}

pub(crate) fn check_spec(root: &Path, spec: &MapDef, data: &MapData) -> Result<(), DatapathError> {
    let info = data.info().map_err(|e| DatapathError::map(spec.name, e))?;
    let mismatch = |reason: String| DatapathError::AbiMismatch {
        root: root.to_owned(),
        name: spec.name.to_owned(),
        reason,
    };
    let kind = info
        .map_type()
        .map_err(|e| DatapathError::map(spec.name, e))?;
    if kind != spec.kind {
        return Err(mismatch(format!("type {kind:?}, expected {:?}", spec.kind)));
    }
    if info.key_size() != spec.key || info.value_size() != spec.value {
        return Err(mismatch(format!(
            "key/value size {}/{}, expected {}/{}",
            info.key_size(),
            info.value_size(),
            spec.key,
            spec.value
        )));
    }
    if info.max_entries() != spec.max_entries {
        return Err(mismatch(format!(
            "max_entries {}, expected {}",
            info.max_entries(),
            spec.max_entries
        )));
    }
    Ok(())
}
