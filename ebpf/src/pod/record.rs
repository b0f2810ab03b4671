//! Reading the pods' records: by attachment key (one index lookup), by host veth, all of
//! them; and finding a free slot.

use super::PodRecord;
use crate::{
    abi::{self, PodKey},
    datapath::{index, is_not_found, scan_meta, Datapath},
    error::DatapathError,
    maps,
};

impl Datapath {
    /// Every attached pod with its counters.
    pub fn pods(&self) -> Result<Vec<PodRecord>, DatapathError> {
        self.records()
    }

    /// The attached pod with this key.
    pub fn pod(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<PodRecord>, DatapathError> {
        let Some(key) = PodKey::new(container_id, ifname) else {
            return Ok(None);
        };
        match self.find(&key)? {
            Some((slot, meta)) => Ok(Some(PodRecord {
                slot,
                meta,
                counters: self.counters_of(slot)?,
            })),
            None => Ok(None),
        }
    }

    /// Every slot in use, from the metadata (a full scan: daemon and tools, not CNI calls).
    pub(crate) fn scan(&self) -> Result<Vec<(u32, abi::PodMeta)>, DatapathError> {
        scan_meta(&self.meta)
    }

    pub(crate) fn records(&self) -> Result<Vec<PodRecord>, DatapathError> {
        self.scan()?
            .into_iter()
            .map(|(slot, meta)| {
                Ok(PodRecord {
                    slot,
                    meta,
                    counters: self.counters_of(slot)?,
                })
            })
            .collect()
    }

    /// The metadata of `slot` (in use or not: see `abi::META_IN_USE`).
    pub fn meta_at(&self, slot: u32) -> Result<abi::PodMeta, DatapathError> {
        self.meta
            .get(&slot, 0)
            .map_err(|e| DatapathError::map(maps::POD_META, e))
    }

    /// The live attachment with `key`: one index lookup, confirmed by the slot's metadata.
    pub(crate) fn find(&self, key: &PodKey) -> Result<Option<(u32, abi::PodMeta)>, DatapathError> {
        let slot = match self.index.get(key, 0) {
            Ok(s) => s,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(DatapathError::map(index::NAME, e)),
        };
        if slot >= abi::MAX_PODS {
            return Ok(None);
        }
        let meta = self.meta_at(slot)?;
        Ok(key.matches(&meta).then_some((slot, meta)))
    }

    /// The live attachment on host veth `ifindex`, through the programs' own `an_pods` map.
    pub(crate) fn on_host(
        &self,
        ifindex: u32,
    ) -> Result<Option<(u32, abi::PodMeta)>, DatapathError> {
        let slot = match self.pods.get(&ifindex, 0) {
            Ok(p) => p.slot,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(DatapathError::map(maps::PODS, e)),
        };
        if slot >= abi::MAX_PODS {
            return Ok(None);
        }
        let meta = self.meta_at(slot)?;
        Ok(
            (meta.flags & abi::META_IN_USE != 0 && meta.host_ifindex == ifindex)
                .then_some((slot, meta)),
        )
    }

    /// A free slot, probing from the key's home slot: about one read while the node is not
    /// nearly full (the metadata is the truth, nothing else to keep in step).
    pub(crate) fn free_slot(&self, key: &PodKey) -> Result<u32, DatapathError> {
        let home = key.home();
        for i in 0..abi::MAX_PODS {
            let slot = (home + i) % abi::MAX_PODS;
            if self.meta_at(slot)?.flags & abi::META_IN_USE == 0 {
                return Ok(slot);
            }
        }
        Err(DatapathError::Full { max: abi::MAX_PODS })
    }
}
