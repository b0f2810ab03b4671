//! The named classes' indexes, and counters that start at zero when an index passes to
//! another class.
//!
//! A class keeps its index across reloads, so its counters go on. An index that a removed
//! class left can go to a new class; the pods' counters (and queue models) of that index
//! still hold the old class's, so the new class's must start from what every attached pod had
//! counted there at that moment. The kernel's counters are never written for that (a
//! read-modify-write of a pod's per-CPU counters would lose the packets other classes count
//! meanwhile); instead `maps/an_class_base` keeps, per slot, what to subtract, and every read
//! of a pod's counters ([`Datapath::counters_of`]) subtracts it. A slot's entry goes when a
//! new pod takes the slot (its counters start at zero anyway).
//!
//! The switch, under the pin root's lock: the index's name is cleared (readers show no class
//! there), the classifier switches to the prefixes of the new policy, the baselines and the
//! queue models of the index are recorded and reset, then the new name is written. Readers
//! thus never see the new name with the old class's counts.

use std::{collections::BTreeMap, path::Path};

use aya::maps::{HashMap, Map, MapData};
use tracing::info;

use super::{
    is_not_found,
    pins::{Lock, PinPaths},
    specs::check_spec,
    sum_counters, Datapath,
};
use crate::{abi, error::DatapathError, maps};

/// Pin name under `maps/`.
pub(crate) const NAME: &str = abi::CLASS_BASE.name;

pub(crate) type Baselines = HashMap<MapData, u32, abi::ClassBase>;

fn typed(data: MapData) -> Result<Baselines, DatapathError> {
    Baselines::try_from(Map::HashMap(data)).map_err(|e| DatapathError::map(NAME, e))
}

/// Opens the pinned baselines, creating the (empty) map when its pin does not exist. A pin of
/// another layout is refused ([`DatapathError::AbiMismatch`]).
pub(crate) fn open_or_create(pins: &PinPaths) -> Result<Baselines, DatapathError> {
    let path = pins.map(NAME);
    let open = |path: &Path| -> Result<Option<Baselines>, DatapathError> {
        match MapData::from_pin(path) {
            Ok(data) => {
                check_spec(&pins.root, &abi::CLASS_BASE, &data)?;
                typed(data).map(Some)
            }
            Err(_) if !path.exists() => Ok(None),
            Err(e) => Err(DatapathError::map(NAME, e)),
        }
    };
    if let Some(b) = open(&path)? {
        return Ok(b);
    }
    let _lock = Lock::exclusive(&pins.root)?;
    // Someone else may have created it while we waited.
    if let Some(b) = open(&path)? {
        return Ok(b);
    }
    let b: Baselines =
        HashMap::create(abi::MAX_PODS, 0).map_err(|e| DatapathError::map(NAME, e))?;
    b.pin(&path).map_err(|source| DatapathError::Pin {
        path: path.clone(),
        source,
    })?;
    typed(MapData::from_pin(&path).map_err(|e| DatapathError::map(NAME, e))?)
}

/// The named classes' indexes a policy's classes get.
pub(crate) struct ClassIndex {
    /// Every class of the policy -> its index.
    pub(crate) index: BTreeMap<String, usize>,
    /// The indexes given to a class that did not have them before, with its name: their
    /// counters restart ([`Datapath::restart_classes`]).
    pub(crate) fresh: Vec<(usize, [u8; 64])>,
}

impl Datapath {
    /// The index of every named class of `classes`: a class keeps the index it has (so its
    /// counters go on across reloads), a new one takes a free index, one free before this
    /// call first (its class's prefixes are gone from the classifier already). Writes
    /// `an_classes`, with the new classes' indexes left unnamed until
    /// [`Datapath::restart_classes`] names them.
    pub(crate) fn class_indices(
        &mut self,
        classes: &[String],
    ) -> Result<ClassIndex, DatapathError> {
        if classes.len() > abi::MAX_NAMED {
            return Err(DatapathError::InvalidArgument {
                field: "classes",
                reason: format!(
                    "{} named classes, at most {} are supported",
                    classes.len(),
                    abi::MAX_NAMED
                ),
            });
        }
        let mut encoded = BTreeMap::new();
        for c in classes {
            let name = abi::fixed_str::<64>(c).ok_or_else(|| DatapathError::InvalidArgument {
                field: "classes",
                reason: format!("class name {c:?} is longer than 63 bytes"),
            })?;
            encoded.insert(c.as_str(), name);
        }
        let old = self.class_names()?;
        let mut names: Vec<Option<String>> = old
            .iter()
            .map(|n| n.clone().filter(|n| encoded.contains_key(n.as_str())))
            .collect();
        let mut index = BTreeMap::new();
        for (k, n) in names.iter().enumerate() {
            if let Some(n) = n {
                index.insert(n.clone(), k);
            }
        }
        let mut fresh = Vec::new();
        for c in classes {
            if index.contains_key(c) {
                continue;
            }
            let free = |k: &usize| names[*k].is_none();
            let k = (0..abi::MAX_NAMED)
                .filter(free)
                .find(|k| old[*k].is_none())
                .or_else(|| (0..abi::MAX_NAMED).find(free))
                .expect("no more classes than indices");
            names[k] = Some(c.clone());
            index.insert(c.clone(), k);
            fresh.push((k, encoded[c.as_str()]));
        }
        for (k, n) in names.iter().enumerate() {
            let name = match n {
                Some(n) if !fresh.iter().any(|(f, _)| *f == k) => encoded[n.as_str()],
                _ => [0; 64],
            };
            self.set_class_name(k, name)?;
        }
        Ok(ClassIndex { index, fresh })
    }

    fn set_class_name(&mut self, k: usize, name: [u8; 64]) -> Result<(), DatapathError> {
        let v = abi::ClassName { name };
        if self.classes.get(&(k as u32), 0).ok() != Some(v) {
            self.classes
                .set(k as u32, v, 0)
                .map_err(|e| DatapathError::map(maps::CLASSES, e))?;
        }
        Ok(())
    }

    /// Starts the counters and queue models of the `fresh` indexes from zero for their new
    /// classes, then names them. Call with the lock held, once the classifier uses the
    /// policy that gave them out.
    pub(crate) fn restart_classes(
        &mut self,
        fresh: &[(usize, [u8; 64])],
    ) -> Result<(), DatapathError> {
        if fresh.is_empty() {
            return Ok(());
        }
        for (slot, _) in self.scan()? {
            let raw = self
                .counters
                .get(&slot, 0)
                .map_err(|e| DatapathError::map(maps::COUNTERS, e))?;
            let raw = sum_counters(&raw);
            let mut base = self.baseline(slot)?.unwrap_or_default();
            for (k, _) in fresh {
                for (d, dir) in base.dir.iter_mut().enumerate() {
                    dir[*k] = raw.dir[d][abi::CLASS_NAMED as usize + k];
                }
                for d in [0, 1, abi::VQ_POLICE] {
                    self.reset_vqueue(abi::vq_pod(slot, d, abi::KIND_NAMED + k))?;
                }
            }
            self.class_base
                .insert(slot, base, 0)
                .map_err(|e| DatapathError::map(NAME, e))?;
        }
        for e in 0..abi::MAX_ENTITIES {
            for (k, _) in fresh {
                for d in 0..abi::NR_DIRS {
                    self.reset_vqueue(abi::vq_agg(e, d, abi::KIND_NAMED + k))?;
                }
            }
        }
        for (k, name) in fresh {
            self.set_class_name(*k, *name)?;
        }
        info!(
            indexes = ?fresh.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            "named classes' counters start at zero"
        );
        Ok(())
    }

    fn reset_vqueue(&mut self, i: u32) -> Result<(), DatapathError> {
        self.vqueue
            .set(i, abi::VQueue::default(), 0)
            .map_err(|e| DatapathError::map(maps::VQUEUE, e))
    }

    fn baseline(&self, slot: u32) -> Result<Option<abi::ClassBase>, DatapathError> {
        match self.class_base.get(&slot, 0) {
            Ok(b) => Ok(Some(b)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(DatapathError::map(NAME, e)),
        }
    }

    /// Subtracts `slot`'s baselines from its raw counters `c`.
    pub(crate) fn rebase(&self, slot: u32, c: &mut abi::PodCounters) -> Result<(), DatapathError> {
        let Some(base) = self.baseline(slot)? else {
            return Ok(());
        };
        for (d, dir) in base.dir.iter().enumerate() {
            for (k, b) in dir.iter().enumerate() {
                let x = &mut c.dir[d][abi::CLASS_NAMED as usize + k];
                x.packets = x.packets.wrapping_sub(b.packets);
                x.bytes = x.bytes.wrapping_sub(b.bytes);
            }
        }
        Ok(())
    }

    /// Drops `slot`'s baselines: a new pod takes it, with counters from zero.
    pub(crate) fn forget_baseline(&mut self, slot: u32) -> Result<(), DatapathError> {
        match self.class_base.remove(&slot) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(DatapathError::map(NAME, e)),
        }
    }
}
