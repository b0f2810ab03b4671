//! The pinned datapath: open handles on the maps the programs share with user space, and the
//! node-wide reads (config, node counters, prefixes). Installing is in [`install`], the pin
//! layout and lock in [`pins`], the ABI checks in [`specs`], the attachment-key index in
//! [`index`].
//!
//! Pin layout under the root (default `/sys/fs/bpf/aliasnet`):
//!
//! ```text
//! maps/<map>                       every map of datapath.bpf.o (see crate::maps)
//! maps/an_pod_keys                 attachment key -> slot index (userspace only, see index.rs)
//! maps/an_class_base               slot -> reused classes' baselines (userspace only, classes.rs)
//! progs/<program>                  every program (see crate::programs)
//! node/uplink                      TCX link on the uplink, egress (only with a node cap)
//! ```
//!
//! Per-pod programs are cls_bpf filters in a clsact qdisc on the pod's devices (see
//! `crate::netlink::clsact` for why not TCX): the device holds the filter, the filter the
//! program, the program the maps, so nothing per pod is pinned and nothing depends on a
//! running process. Pods keep being classified, counted and shaped while shaperd is down or
//! restarting. All mutations take an exclusive `flock` on the root directory, which
//! serialises concurrent CNI invocations and shaperd; they wait for it at most
//! [`pins::PIN_LOCK_TIMEOUT`]. The directories are root's alone (see [`pins`]).

pub(crate) mod classes;
pub(crate) mod index;
pub mod install;
pub mod pins;
pub(crate) mod specs;

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use aya::maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray, PerCpuValues};

use crate::{abi, error::DatapathError, maps, programs};
use index::Index;
use pins::{Lock, PinPaths};
use specs::{check_abi_version, check_spec};

/// Open handles on the pinned maps.
pub struct Datapath {
    pub(crate) pins: PinPaths,
    pub(crate) prefixes: LpmTrie<MapData, abi::LpmKeyData, abi::LpmValue>,
    pub(crate) prefixes6: LpmTrie<MapData, abi::Lpm6KeyData, abi::LpmValue>,
    pub(crate) config: Array<MapData, abi::Config>,
    pub(crate) pods: HashMap<MapData, u32, abi::Pod>,
    pub(crate) pod_ips: HashMap<MapData, [u8; 4], u32>,
    pub(crate) pod_ips6: HashMap<MapData, [u8; 16], u32>,
    pub(crate) counters: PerCpuArray<MapData, abi::PodCounters>,
    pub(crate) node_counters: PerCpuArray<MapData, abi::NodeCounters>,
    pub(crate) meta: Array<MapData, abi::PodMeta>,
    /// The policy's pod-level and namespace-level limits by namespace ("" = the default).
    pub(crate) policy: HashMap<MapData, abi::NsKey, abi::NsPolicy>,
    /// The node's and the namespaces' aggregates.
    pub(crate) entities: Array<MapData, abi::Entity>,
    pub(crate) entity_ids: HashMap<MapData, abi::NsKey, u32>,
    /// The named classes' names by index.
    pub(crate) classes: Array<MapData, abi::ClassName>,
    /// The programs' queue model; reset per slot on attach.
    pub(crate) vqueue: Array<MapData, abi::VQueue>,
    /// The programs' per-pod state; reset per slot on attach.
    pub(crate) pod_rt: Array<MapData, abi::PodRt>,
    /// Attachment key -> slot.
    pub(crate) index: Index,
    /// Slot -> what to subtract from the counters of reused class indexes.
    pub(crate) class_base: classes::Baselines,
}

fn typed<T>(name: &str, map: Map) -> Result<T, DatapathError>
where
    T: TryFrom<Map, Error = MapError>,
{
    T::try_from(map).map_err(|e| DatapathError::map(name, e))
}

impl Datapath {
    /// Opens the pinned maps a running (or previously run) shaperd installed. This is what the
    /// CNI plugin and exporters use; it loads nothing.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, DatapathError> {
        let pins = PinPaths::new(root);
        if pins.root.exists() {
            pins::check_pin_dir(&pins.root)?;
        }
        let mut data = Vec::with_capacity(abi::MAPS.len());
        for spec in &abi::MAPS {
            let path = pins.map(spec.name);
            if !path.exists() {
                return Err(DatapathError::NotInitialised { root: pins.root });
            }
            let d = MapData::from_pin(&path).map_err(|e| DatapathError::map(spec.name, e))?;
            check_spec(&pins.root, spec, &d)?;
            data.push(d);
        }
        let mut it = data.into_iter();
        let mut next = || it.next().expect("one MapData per spec");
        let prefixes = typed(maps::PREFIXES, Map::LpmTrie(next()))?;
        let config = typed(maps::CONFIG, Map::Array(next()))?;
        let pods = typed(maps::PODS, Map::HashMap(next()))?;
        let pod_ips = typed(maps::POD_IPS, Map::HashMap(next()))?;
        let counters = typed(maps::COUNTERS, Map::PerCpuArray(next()))?;
        let node_counters = typed(maps::NODE_COUNTERS, Map::PerCpuArray(next()))?;
        let meta = typed(maps::POD_META, Map::Array(next()))?;
        let vqueue = typed(maps::VQUEUE, Map::Array(next()))?;
        // an_flows and an_conns belong to the programs.
        let _flows = next();
        let _conns = next();
        let prefixes6 = typed(maps::PREFIXES6, Map::LpmTrie(next()))?;
        let pod_ips6 = typed(maps::POD_IPS6, Map::HashMap(next()))?;
        let policy = typed(maps::POLICY, Map::HashMap(next()))?;
        let entities = typed(maps::ENTITIES, Map::Array(next()))?;
        let entity_ids = typed(maps::ENTITY_IDS, Map::HashMap(next()))?;
        let classes = typed(maps::CLASSES, Map::Array(next()))?;
        let pod_rt = typed(maps::POD_RT, Map::Array(next()))?;
        let index = index::open_or_create(&pins, &meta)?;
        let class_base = classes::open_or_create(&pins)?;
        let dp = Self {
            prefixes,
            prefixes6,
            config,
            pods,
            pod_ips,
            pod_ips6,
            counters,
            node_counters,
            meta,
            policy,
            entities,
            entity_ids,
            classes,
            vqueue,
            pod_rt,
            index,
            class_base,
            pins,
        };
        let cfg = dp.config()?;
        if cfg.abi_version == 0 {
            return Err(DatapathError::NotInitialised {
                root: dp.pins.root.clone(),
            });
        }
        // Pins of another release (an up- or downgrade half done): say so, rather than "not
        // initialised", so the operator knows which side to roll.
        check_abi_version(&dp.pins.root, cfg.abi_version)?;
        for name in programs::ALL {
            if !dp.pins.prog(name).exists() {
                return Err(DatapathError::NotInitialised {
                    root: dp.pins.root.clone(),
                });
            }
        }
        Ok(dp)
    }

    pub fn pins(&self) -> &PinPaths {
        &self.pins
    }

    pub(crate) fn lock(&self) -> Result<Lock, DatapathError> {
        Lock::exclusive(&self.pins.root)
    }

    /// The applied configuration (policy epoch, default rate, node cap).
    pub fn config(&self) -> Result<abi::Config, DatapathError> {
        self.config
            .get(&0, 0)
            .map_err(|e| DatapathError::map(maps::CONFIG, e))
    }

    /// The applied policy's pod-level and namespace-level limits for a pod of `namespace`:
    /// its own entry, else the default one, else none.
    pub fn ns_policy(&self, namespace: &str) -> Result<abi::NsPolicy, DatapathError> {
        for key in abi::NsKey::new(namespace)
            .into_iter()
            .chain([abi::NsKey::DEFAULT])
        {
            match self.policy.get(&key, 0) {
                Ok(p) => return Ok(p),
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(DatapathError::map(maps::POLICY, e)),
            }
        }
        Ok(abi::NsPolicy::default())
    }

    /// The aggregate of `namespace` on this node, if it has one (it has namespace limits and
    /// pods here).
    pub fn entity_of(&self, namespace: &str) -> Result<Option<u32>, DatapathError> {
        let Some(key) = abi::NsKey::new(namespace) else {
            return Ok(None);
        };
        match self.entity_ids.get(&key, 0) {
            Ok(e) if e != abi::NODE_ENTITY && e < abi::MAX_ENTITIES => Ok(Some(e)),
            Ok(_) => Ok(None),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(DatapathError::map(maps::ENTITY_IDS, e)),
        }
    }

    /// The record of aggregate `entity` (the node is [`abi::NODE_ENTITY`]).
    pub fn entity(&self, entity: u32) -> Result<abi::Entity, DatapathError> {
        self.entities
            .get(&entity, 0)
            .map_err(|e| DatapathError::map(maps::ENTITIES, e))
    }

    /// The names of the named classes by index (`None` for an unused index).
    pub fn class_names(&self) -> Result<Vec<Option<String>>, DatapathError> {
        (0..abi::MAX_NAMED as u32)
            .map(|k| {
                let c = self
                    .classes
                    .get(&k, 0)
                    .map_err(|e| DatapathError::map(maps::CLASSES, e))?;
                Ok(Some(abi::cstr(&c.name)).filter(|n| !n.is_empty()))
            })
            .collect()
    }

    /// The name a counted class carries in metrics and tools: the fixed names, and the named
    /// classes' from `an_classes` (`class<k>` for an index that has none now).
    pub fn class_label(names: &[Option<String>], class: abi::Class) -> String {
        match class {
            abi::Class::Named(k) => names
                .get(usize::from(k))
                .cloned()
                .flatten()
                .unwrap_or_else(|| format!("class{k}")),
            c => c.fixed_name().unwrap_or("other").to_owned(),
        }
    }

    /// The `class` a limit of `kind` carries in metrics and tools: `all` for a total limit,
    /// `internet`, or a named class's name (`None` for an index that has none now).
    pub fn kind_label(names: &[Option<String>], kind: usize) -> Option<String> {
        match kind {
            abi::KIND_TOTAL => Some("all".to_owned()),
            abi::KIND_INTERNET => Some(crate::INTERNET.to_owned()),
            k => names
                .get(k.checked_sub(abi::KIND_NAMED)?)
                .cloned()
                .flatten(),
        }
    }

    /// Tells shaperd that the set of attached pods changed (it reconciles the aggregates).
    pub(crate) fn bump_pods_epoch(&mut self) -> Result<(), DatapathError> {
        let mut cfg = self.config()?;
        cfg.pods_epoch = cfg.pods_epoch.wrapping_add(1);
        self.config
            .set(0, cfg, 0)
            .map_err(|e| DatapathError::map(maps::CONFIG, e))
    }

    /// Sum over CPUs of what the uplink programs put into the node's limits, by direction.
    pub fn node_counters(&self) -> Result<[abi::Counter; abi::NR_DIRS], DatapathError> {
        let v = self
            .node_counters
            .get(&0, 0)
            .map_err(|e| DatapathError::map(maps::NODE_COUNTERS, e))?;
        let mut total = [abi::Counter::default(); abi::NR_DIRS];
        for c in v.iter() {
            for (t, s) in total.iter_mut().zip(c.staged.iter()) {
                *t += *s;
            }
        }
        Ok(total)
    }

    /// The classifier's prefixes of the active generation, both families (IPv4 first), as
    /// `(prefix, len, class)` (`abi::CLASS_*`, a named class's as `CLASS_NAMED + k`).
    pub fn active_prefixes(&self) -> Result<Vec<(IpAddr, u8, u32)>, DatapathError> {
        let gen = self.config()?.active_gen;
        let mut out = Vec::new();
        for k in self.prefixes.keys() {
            let k = k.map_err(|e| DatapathError::map(maps::PREFIXES, e))?;
            if k.data().gen != gen {
                continue;
            }
            let v = self
                .prefixes
                .get(&k, 0)
                .map_err(|e| DatapathError::map(maps::PREFIXES, e))?;
            out.push((
                IpAddr::V4(Ipv4Addr::from(k.data().addr)),
                (k.prefix_len() - 32) as u8,
                v.class,
            ));
        }
        for k in self.prefixes6.keys() {
            let k = k.map_err(|e| DatapathError::map(maps::PREFIXES6, e))?;
            if k.data().gen != gen {
                continue;
            }
            let v = self
                .prefixes6
                .get(&k, 0)
                .map_err(|e| DatapathError::map(maps::PREFIXES6, e))?;
            out.push((
                IpAddr::V6(Ipv6Addr::from(k.data().addr)),
                (k.prefix_len() - 32) as u8,
                v.class,
            ));
        }
        out.sort();
        Ok(out)
    }
}

pub(crate) fn is_not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound | MapError::ElementNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// Sums per-CPU values.
pub(crate) fn sum_counters(v: &PerCpuValues<abi::PodCounters>) -> abi::PodCounters {
    let mut total = abi::PodCounters::default();
    for c in v.iter() {
        total += *c;
    }
    total
}

pub(crate) fn scan_meta(
    meta: &Array<MapData, abi::PodMeta>,
) -> Result<Vec<(u32, abi::PodMeta)>, DatapathError> {
    let mut out = Vec::new();
    for slot in 0..abi::MAX_PODS {
        let m = meta
            .get(&slot, 0)
            .map_err(|e| DatapathError::map(maps::POD_META, e))?;
        if m.flags & abi::META_IN_USE != 0 {
            out.push((slot, m));
        }
    }
    Ok(out)
}
