//! The attachment-key index: (container ID, ifname) -> slot, so that ADD, DEL and CHECK find a
//! pod with one map lookup instead of reading all `MAX_PODS` metadata entries (two such scans
//! cost ~1.3 ms per ADD).
//!
//! A hash map that userspace creates and pins next to the object's maps (`maps/an_pod_keys`).
//! The programs never read it, but its pinned layout (`abi::PodKey` -> slot,
//! `abi::POD_KEYS`) is part of what `abi::ABI_VERSION` covers, and a pin of another layout is
//! refused like any map of another ABI. The metadata array stays
//! the truth: a hit is confirmed against the slot's metadata, an entry is written before the
//! metadata that it points to and removed after it, so a crash can leave a stale entry
//! (ignored on use, dropped by [`reconcile`]) but never a recorded pod the index misses.

use std::path::Path;

use aya::maps::{Array, HashMap, Map, MapData};
use tracing::info;

use super::{
    is_not_found,
    pins::{Lock, PinPaths},
    specs::check_spec,
};
use crate::{
    abi::{self, PodKey},
    error::DatapathError,
    maps,
};

/// Pin name under `maps/`.
pub(crate) const NAME: &str = abi::POD_KEYS.name;

pub(crate) type Index = HashMap<MapData, PodKey, u32>;

impl PodKey {
    /// `None` if a part does not fit the metadata's fields (then no such pod can exist).
    pub(crate) fn new(container_id: &str, ifname: &str) -> Option<Self> {
        Some(Self {
            container_id: abi::fixed_str(container_id)?,
            ifname: abi::fixed_str(ifname)?,
        })
    }

    pub(crate) fn of(meta: &abi::PodMeta) -> Self {
        Self {
            container_id: meta.container_id,
            ifname: meta.ifname,
        }
    }

    /// Whether `meta` is a live attachment with this key.
    pub(crate) fn matches(&self, meta: &abi::PodMeta) -> bool {
        meta.flags & abi::META_IN_USE != 0 && Self::of(meta) == *self
    }

    /// Where the search for a free slot starts (FNV-1a of the key): spreads pods over the
    /// slots, so a free one is found in about one read while the node is not nearly full.
    pub(crate) fn home(&self) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        for b in self.container_id.iter().chain(&self.ifname) {
            h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
        }
        h % abi::MAX_PODS
    }
}

fn typed(data: MapData) -> Result<Index, DatapathError> {
    Index::try_from(Map::HashMap(data)).map_err(|e| DatapathError::map(NAME, e))
}

/// Opens the pinned index, creating it from `meta` when its pin does not exist (the first
/// open after an install, or a lost pin). A pin of another layout is refused
/// ([`DatapathError::AbiMismatch`]).
pub(crate) fn open_or_create(
    pins: &PinPaths,
    meta: &Array<MapData, abi::PodMeta>,
) -> Result<Index, DatapathError> {
    let path = pins.map(NAME);
    let open = |path: &Path| -> Result<Option<Index>, DatapathError> {
        match MapData::from_pin(path) {
            Ok(data) => {
                check_spec(&pins.root, &abi::POD_KEYS, &data)?;
                typed(data).map(Some)
            }
            Err(_) if !path.exists() => Ok(None),
            Err(e) => Err(DatapathError::map(NAME, e)),
        }
    };
    if let Some(index) = open(&path)? {
        return Ok(index);
    }
    let _lock = Lock::exclusive(&pins.root)?;
    // Someone else may have created it while we waited.
    match open(&path)? {
        Some(index) => Ok(index),
        None => create(&path, meta),
    }
}

fn create(path: &Path, meta: &Array<MapData, abi::PodMeta>) -> Result<Index, DatapathError> {
    let mut index: HashMap<MapData, PodKey, u32> =
        HashMap::create(abi::MAX_PODS, 0).map_err(|e| DatapathError::map(NAME, e))?;
    let mut n = 0;
    for slot in 0..abi::MAX_PODS {
        let m = meta
            .get(&slot, 0)
            .map_err(|e| DatapathError::map(maps::POD_META, e))?;
        if m.flags & abi::META_IN_USE != 0 {
            index
                .insert(PodKey::of(&m), slot, 0)
                .map_err(|e| DatapathError::map(NAME, e))?;
            n += 1;
        }
    }
    // Filled before it becomes visible: pinning is what publishes it.
    index.pin(path).map_err(|source| DatapathError::Pin {
        path: path.to_owned(),
        source,
    })?;
    info!(pods = n, "attachment-key index created");
    typed(MapData::from_pin(path).map_err(|e| DatapathError::map(NAME, e))?)
}

/// Makes the index exactly the live attachments in `live` (`(slot, meta)`, from a scan of
/// the metadata): drops stale entries, adds missing ones. Call with the root lock held.
pub(crate) fn reconcile(
    index: &mut Index,
    live: &[(u32, abi::PodMeta)],
) -> Result<usize, DatapathError> {
    let want: std::collections::HashMap<PodKey, u32> =
        live.iter().map(|(s, m)| (PodKey::of(m), *s)).collect();
    let mut fixed = 0;
    let present: Vec<(PodKey, u32)> = index.iter().filter_map(Result::ok).collect();
    for (k, slot) in &present {
        if want.get(k) != Some(slot) {
            match index.remove(k) {
                Ok(()) => fixed += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(DatapathError::map(NAME, e)),
            }
        }
    }
    for (k, slot) in &want {
        if !present.iter().any(|(pk, ps)| pk == k && ps == slot) {
            index
                .insert(k, slot, 0)
                .map_err(|e| DatapathError::map(NAME, e))?;
            fixed += 1;
        }
    }
    Ok(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_meta_and_spread() {
        let k = PodKey::new("c0ffee", "eth0").unwrap();
        let meta = abi::PodMeta {
            flags: abi::META_IN_USE,
            container_id: abi::fixed_str("c0ffee").unwrap(),
            ifname: abi::fixed_str("eth0").unwrap(),
            ..Default::default()
        };
        assert!(k.matches(&meta));
        assert!(PodKey::of(&meta) == k);
        assert!(!PodKey::new("c0ffee", "eth1").unwrap().matches(&meta));
        let unused = abi::PodMeta { flags: 0, ..meta };
        assert!(!k.matches(&unused), "a freed slot never matches");
        assert!(PodKey::new(&"c".repeat(128), "eth0").is_none());

        // Homes of sequential container IDs spread over the table.
        let homes: std::collections::HashSet<u32> = (0..200)
            .map(|i| PodKey::new(&format!("{i:064x}"), "eth0").unwrap().home())
            .collect();
        assert!(homes.len() > 150, "{} distinct homes of 200", homes.len());
        assert!(homes.iter().all(|h| *h < abi::MAX_PODS));
    }
}
