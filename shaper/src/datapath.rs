//! The pinned datapath: loading and pinning (shaperd), opening the pins (CNI plugin,
//! exporters), node policy and the node-wide internet cap.
//!
//! Pin layout under the root (default `/sys/fs/bpf/aliasnet`):
//!
//! ```text
//! maps/<map>                       every map of datapath.bpf.o (see aliasnet_ebpf::maps)
//! maps/an_pod_keys                 attachment key -> slot index (userspace only, see index.rs)
//! progs/<program>                  every program (see aliasnet_ebpf::programs)
//! node/uplink                      TCX link on the uplink, egress (only with a node cap)
//! pods/<slot>/<hook>               TCX links of pods attached by earlier builds (read only:
//!                                  upgraded like the uplink, removed when the pod goes)
//! ```
//!
//! Per-pod programs are cls_bpf filters in a clsact qdisc on the pod's devices (see
//! `crate::clsact` for why not TCX): the device holds the filter, the filter the program, the
//! program the maps, so nothing per pod is pinned and nothing depends on a running process.
//! Pods keep being classified, counted and shaped while shaperd is down or restarting. All
//! mutations take an exclusive `flock` on the root directory, which serialises concurrent CNI
//! invocations and shaperd.

use std::{
    fs::File,
    net::Ipv4Addr,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use aliasnet_ebpf::{abi, maps, programs, DATAPATH_OBJECT};
use aya::{
    maps::{
        lpm_trie::Key, Array, HashMap, LpmTrie, Map, MapData, MapError, MapType, PerCpuArray,
        PerCpuValues,
    },
    programs::{
        links::{FdLink, PinnedLink},
        tc::SchedClassifierLink,
        SchedClassifier,
    },
    EbpfLoader,
};
use tracing::{info, warn};

use crate::{
    clsact::{self, FilterMode, Hook},
    error::ShaperError,
    index::{self, Index},
    limits::{fmt_rate, Shape},
    netns::{self, NetnsError},
    pods::{install_htb, pod_egress_classes, Sender},
    policy::Policy,
    tc::{handle, HtbClass, Rtnl, TcStats},
};

/// Default pin root.
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/aliasnet";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// HTB layout constants shared by the host veth, pod eth0 and uplink qdiscs.
pub(crate) const HTB_MAJOR: u16 = abi::HTB_MAJOR;
/// HTB direct queue (unshaped traffic) length in packets, as a default txqueuelen.
pub(crate) const DIRECT_QLEN: u32 = 1000;

/// The leaf qdisc under class `major:minor` gets handle `0x100+minor:`.
pub(crate) fn leaf_handle(classid: u32) -> u32 {
    handle(0x100 + (classid & 0xffff) as u16, 0)
}

/// A shaped class as HTB builds it: the class itself, now an inner class, and its two leaves
/// (see `an_flows` in the ABI header). The sparse leaf (prio 0) is guaranteed
/// 1/`SPARSE_RATE_DIV` of the class's rate, the bulk leaf (prio 1) the rest; both may borrow
/// up to the class's ceiling, so either alone can use all of it.
pub(crate) fn with_leaves(class: HtbClass) -> [HtbClass; 3] {
    let sparse_rate = (class.rate.rate / abi::SPARSE_RATE_DIV).max(1);
    let bulk_rate = class.rate.rate.saturating_sub(sparse_rate).max(1);
    let leaf = |offset: u32, rate: u64, prio: u32| HtbClass {
        classid: class.classid + offset,
        parent: class.classid,
        rate: class.rate.at_rate(rate),
        ceil: class.ceil,
        prio,
    };
    [
        class,
        leaf(abi::LEAF_SPARSE, sparse_rate, 0),
        leaf(abi::LEAF_BULK, bulk_rate, 1),
    ]
}

/// Whether `c` is the sparse leaf of its parent (it gets a plain FIFO: its packets are few
/// and small, never GSO aggregates to segment).
pub(crate) fn is_sparse_leaf(c: &HtbClass) -> bool {
    c.classid == c.parent + abi::LEAF_SPARSE
}

/// The two leaf qdiscs of shaped class `classid` in `stats`, added up (`None` if neither is
/// there).
pub(crate) fn leaves_stats(stats: &[TcStats], classid: u32) -> Option<TcStats> {
    let mut found = stats.iter().filter(|s| {
        s.handle == leaf_handle(classid + abi::LEAF_SPARSE)
            || s.handle == leaf_handle(classid + abi::LEAF_BULK)
    });
    let first = *found.next()?;
    Some(found.fold(first, |mut a, s| {
        a.bytes += s.bytes;
        a.packets += s.packets;
        a.drops += s.drops;
        a.overlimits += s.overlimits;
        a.backlog += s.backlog;
        a
    }))
}

struct MapSpec {
    name: &'static str,
    kind: MapType,
    key: u32,
    value: u32,
    max_entries: u32,
}

/// What every pinned map must look like for this build; checked before reuse. Sizes come
/// from the ABI mirrors, whose sizes the header asserts too.
const SPECS: [MapSpec; 11] = [
    MapSpec {
        name: maps::PREFIXES,
        kind: MapType::LpmTrie,
        key: size_of::<aya::maps::lpm_trie::Key<abi::LpmKeyData>>() as u32,
        value: size_of::<abi::LpmValue>() as u32,
        max_entries: abi::LPM_MAX_ENTRIES,
    },
    MapSpec {
        name: maps::CONFIG,
        kind: MapType::Array,
        key: size_of::<u32>() as u32,
        value: size_of::<abi::Config>() as u32,
        max_entries: 1,
    },
    MapSpec {
        name: maps::PODS,
        kind: MapType::Hash,
        key: size_of::<u32>() as u32,
        value: size_of::<abi::Pod>() as u32,
        max_entries: abi::MAX_PODS,
    },
    MapSpec {
        name: maps::POD_IPS,
        kind: MapType::Hash,
        key: size_of::<u32>() as u32,
        value: size_of::<u32>() as u32,
        max_entries: abi::MAX_PODS,
    },
    MapSpec {
        name: maps::COUNTERS,
        kind: MapType::PerCpuArray,
        key: size_of::<u32>() as u32,
        value: size_of::<abi::PodCounters>() as u32,
        max_entries: abi::MAX_PODS,
    },
    MapSpec {
        name: maps::NODE_COUNTERS,
        kind: MapType::PerCpuArray,
        key: size_of::<u32>() as u32,
        value: size_of::<abi::NodeCounters>() as u32,
        max_entries: 1,
    },
    MapSpec {
        name: maps::POD_META,
        kind: MapType::Array,
        key: size_of::<u32>() as u32,
        value: size_of::<abi::PodMeta>() as u32,
        max_entries: abi::MAX_PODS,
    },
    MapSpec {
        name: maps::NS_RATES,
        kind: MapType::Hash,
        key: size_of::<abi::NsKey>() as u32,
        value: size_of::<abi::NsRate>() as u32,
        max_entries: abi::MAX_NAMESPACES,
    },
    // ECN marking state; the programs own it, userspace only reads it and resets a slot's
    // entries when a new pod takes the slot.
    MapSpec {
        name: maps::VQUEUE,
        kind: MapType::Array,
        key: size_of::<u32>() as u32,
        value: size_of::<abi::VQueue>() as u32,
        max_entries: abi::VQ_ENTRIES,
    },
    // Flow isolation state; the programs own it (stale entries lie in the past, so a slot's
    // next pod needs no reset).
    MapSpec {
        name: maps::FLOWS,
        kind: MapType::Array,
        key: size_of::<u32>() as u32,
        value: size_of::<abi::Flow>() as u32,
        max_entries: abi::FLOW_ENTRIES,
    },
    // The window clamp's connections; the programs own it.
    MapSpec {
        name: maps::CONNS,
        kind: MapType::LruHash,
        key: size_of::<abi::ConnKey>() as u32,
        value: size_of::<abi::Conn>() as u32,
        max_entries: abi::MAX_CONNS,
    },
];

/// Pin paths under a root.
#[derive(Debug, Clone)]
pub struct PinPaths {
    pub root: PathBuf,
}

impl PinPaths {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn map(&self, name: &str) -> PathBuf {
        self.root.join("maps").join(name)
    }
    pub fn prog(&self, name: &str) -> PathBuf {
        self.root.join("progs").join(name)
    }
    /// Where builds before the cls_bpf switch pinned a pod's TCX links.
    pub fn legacy_pod_dir(&self, slot: u32) -> PathBuf {
        self.root.join("pods").join(slot.to_string())
    }
    pub fn uplink_link(&self) -> PathBuf {
        self.root.join("node").join("uplink")
    }
}

/// Exclusive lock on the pin root, released when the descriptor closes on drop.
pub(crate) struct Lock {
    _dir: File,
}

impl Lock {
    pub(crate) fn exclusive(root: &Path) -> Result<Self, ShaperError> {
        let dir = File::open(root).map_err(|e| ShaperError::io("open", root, e))?;
        loop {
            // SAFETY: flock on a valid, owned file descriptor.
            let rc = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(Self { _dir: dir });
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(ShaperError::io("lock", root, err));
            }
        }
    }
}

/// Makes sure `root` lives on a bpf filesystem, mounting bpffs on `/sys/fs/bpf` when `root`
/// is below it and nothing is mounted there yet (fresh machines do not mount it).
pub fn ensure_bpffs(root: &Path) -> Result<(), ShaperError> {
    let sys_bpf = Path::new("/sys/fs/bpf");
    let mut probe = root.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    if is_bpffs(&probe)? {
        return Ok(());
    }
    if root.starts_with(sys_bpf) && !is_bpffs(sys_bpf)? {
        info!("mounting bpffs on /sys/fs/bpf");
        nix::mount::mount(
            Some("bpf"),
            sys_bpf,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|source| ShaperError::MountBpffs {
            path: sys_bpf.to_owned(),
            source,
        })?;
        return Ok(());
    }
    Err(ShaperError::NotBpffs {
        path: root.to_owned(),
    })
}

fn is_bpffs(path: &Path) -> Result<bool, ShaperError> {
    let st = nix::sys::statfs::statfs(path)
        .map_err(|e| ShaperError::io("statfs", path, std::io::Error::from(e)))?;
    Ok(st.filesystem_type().0 as i64 == BPF_FS_MAGIC)
}

pub(crate) fn is_not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound | MapError::ElementNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// Pinned maps written by a build of another ABI version are never reused.
fn check_abi_version(root: &Path, version: u32) -> Result<(), ShaperError> {
    if version == abi::ABI_VERSION {
        return Ok(());
    }
    Err(ShaperError::AbiMismatch {
        root: root.to_owned(),
        name: maps::CONFIG.to_owned(),
        reason: format!(
            "ABI version {version}, this build speaks {}",
            abi::ABI_VERSION
        ),
    })
}

fn check_spec(root: &Path, spec: &MapSpec, data: &MapData) -> Result<(), ShaperError> {
    let info = data.info().map_err(|e| ShaperError::map(spec.name, e))?;
    let mismatch = |reason: String| ShaperError::AbiMismatch {
        root: root.to_owned(),
        name: spec.name.to_owned(),
        reason,
    };
    let kind = info
        .map_type()
        .map_err(|e| ShaperError::map(spec.name, e))?;
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

/// What [`Datapath::install`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// Maps created now (the rest were reused with their contents).
    pub created_maps: Vec<String>,
    /// Programs pinned for the first time.
    pub pinned_programs: Vec<String>,
    /// Programs whose code changed: pin replaced and every attachment switched atomically.
    pub upgraded_programs: Vec<String>,
    /// Attachments (pods' cls_bpf filters, TCX links) switched to upgraded programs.
    pub relinked: usize,
}

/// What [`Datapath::apply_policy`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PolicyReport {
    pub epoch: u64,
    pub prefixes: usize,
    pub namespaces: usize,
    /// `(name, ifindex)` where the node cap is enforced.
    pub uplink: Option<(String, u32)>,
    /// Pods whose internet-egress limit followed the new policy.
    pub pods_updated: usize,
    /// Pods that could not be updated (their netns is gone or not reachable), with why.
    pub pod_errors: Vec<String>,
}

/// Open handles on the pinned maps.
pub struct Datapath {
    pub(crate) pins: PinPaths,
    pub(crate) prefixes: LpmTrie<MapData, abi::LpmKeyData, abi::LpmValue>,
    pub(crate) config: Array<MapData, abi::Config>,
    pub(crate) pods: HashMap<MapData, u32, abi::Pod>,
    pub(crate) pod_ips: HashMap<MapData, [u8; 4], u32>,
    pub(crate) counters: PerCpuArray<MapData, abi::PodCounters>,
    pub(crate) node_counters: PerCpuArray<MapData, abi::NodeCounters>,
    pub(crate) meta: Array<MapData, abi::PodMeta>,
    pub(crate) ns_rates: HashMap<MapData, abi::NsKey, abi::NsRate>,
    /// The programs' queue model; reset per slot on attach.
    pub(crate) vqueue: Array<MapData, abi::VQueue>,
    /// Attachment key -> slot.
    pub(crate) index: Index,
}

fn typed<T>(name: &str, map: Map) -> Result<T, ShaperError>
where
    T: TryFrom<Map, Error = MapError>,
{
    T::try_from(map).map_err(|e| ShaperError::map(name, e))
}

impl Datapath {
    /// Loads `datapath.bpf.o`, reusing every pinned map (and so its contents and counters)
    /// and pinning what is missing. A pinned program with the same code is kept; one with
    /// different code (an upgrade) is replaced, and every attachment using it is switched to
    /// the new program first (pods' cls_bpf filters replaced in place, TCX links with
    /// `BPF_LINK_UPDATE`), so traffic never runs without a program.
    pub fn install(root: impl Into<PathBuf>) -> Result<(Self, InstallReport), ShaperError> {
        let pins = PinPaths::new(root);
        ensure_bpffs(&pins.root)?;
        for sub in ["maps", "progs", "node"] {
            let dir = pins.root.join(sub);
            std::fs::create_dir_all(&dir).map_err(|e| ShaperError::io("create", dir, e))?;
        }
        let _lock = Lock::exclusive(&pins.root)?;
        let mut report = InstallReport::default();

        for spec in &SPECS {
            let path = pins.map(spec.name);
            if path.exists() {
                let data = MapData::from_pin(&path).map_err(|e| ShaperError::map(spec.name, e))?;
                check_spec(&pins.root, spec, &data)?;
            } else {
                report.created_maps.push(spec.name.to_owned());
            }
        }
        if pins.map(maps::CONFIG).exists() {
            let data = MapData::from_pin(pins.map(maps::CONFIG))
                .map_err(|e| ShaperError::map(maps::CONFIG, e))?;
            let cfg: Array<MapData, abi::Config> = typed(maps::CONFIG, Map::Array(data))?;
            let c = cfg
                .get(&0, 0)
                .map_err(|e| ShaperError::map(maps::CONFIG, e))?;
            if c.abi_version != 0 {
                check_abi_version(&pins.root, c.abi_version)?;
            }
        }

        let mut loader = EbpfLoader::new();
        let map_paths: Vec<(&str, PathBuf)> = maps::ALL.iter().map(|n| (*n, pins.map(n))).collect();
        for (name, path) in &map_paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(DATAPATH_OBJECT).map_err(ShaperError::Load)?;
        // Attached pods, read once if an upgrade needs them.
        let mut live: Option<Vec<(u32, abi::PodMeta)>> = None;

        {
            let map = ebpf
                .map_mut(maps::CONFIG)
                .ok_or_else(|| ShaperError::map(maps::CONFIG, MapError::ElementNotFound))?;
            let mut cfg: Array<&mut MapData, abi::Config> =
                Array::try_from(map).map_err(|e| ShaperError::map(maps::CONFIG, e))?;
            let c = cfg
                .get(&0, 0)
                .map_err(|e| ShaperError::map(maps::CONFIG, e))?;
            if c.abi_version == 0 {
                let fresh = abi::Config {
                    abi_version: abi::ABI_VERSION,
                    ..Default::default()
                };
                cfg.set(0, fresh, 0)
                    .map_err(|e| ShaperError::map(maps::CONFIG, e))?;
            }
        }

        for name in programs::ALL {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or_else(|| ShaperError::program(name, aya::programs::ProgramError::NotLoaded))?
                .try_into()
                .map_err(|e| ShaperError::program(name, e))?;
            prog.load().map_err(|e| ShaperError::program(name, e))?;
            let new = prog.info().map_err(|e| ShaperError::program(name, e))?;
            let path = pins.prog(name);
            let old = if path.exists() {
                let p =
                    SchedClassifier::from_pin(&path).map_err(|e| ShaperError::program(name, e))?;
                Some(p.info().map_err(|e| ShaperError::program(name, e))?)
            } else {
                None
            };
            match old {
                None => {
                    prog.pin(&path).map_err(|source| ShaperError::Pin {
                        path: path.clone(),
                        source,
                    })?;
                    report.pinned_programs.push(name.to_owned());
                }
                Some(old) if old.tag() == new.tag() => {}
                Some(old) => {
                    report.relinked += relink(&pins, name, old.id(), prog)?;
                    let pods = match &mut live {
                        Some(p) => p,
                        None => live.insert(live_pods(&pins)?),
                    };
                    report.relinked += refilter(name, prog, pods)?;
                    std::fs::remove_file(&path).map_err(|e| ShaperError::io("unpin", &path, e))?;
                    prog.pin(&path).map_err(|source| ShaperError::Pin {
                        path: path.clone(),
                        source,
                    })?;
                    report.upgraded_programs.push(name.to_owned());
                }
            }
        }
        drop(ebpf);
        drop(_lock);
        let mut dp = Self::open(pins.root)?;
        // Repairs what an interrupted CNI call may have left in the index.
        let _lock = dp.lock()?;
        let live = dp.scan()?;
        let fixed = index::reconcile(&mut dp.index, &live)?;
        if fixed > 0 {
            info!(fixed, "attachment-key index repaired");
        }
        drop(_lock);
        Ok((dp, report))
    }

    /// Opens the pinned maps a running (or previously run) shaperd installed. This is what the
    /// CNI plugin and exporters use; it loads nothing.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ShaperError> {
        let pins = PinPaths::new(root);
        let mut data = Vec::with_capacity(SPECS.len());
        for spec in &SPECS {
            let path = pins.map(spec.name);
            if !path.exists() {
                return Err(ShaperError::NotInitialised { root: pins.root });
            }
            let d = MapData::from_pin(&path).map_err(|e| ShaperError::map(spec.name, e))?;
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
        let ns_rates = typed(maps::NS_RATES, Map::HashMap(next()))?;
        let vqueue = typed(maps::VQUEUE, Map::Array(next()))?;
        let index = index::open_or_create(&pins, &meta)?;
        let dp = Self {
            prefixes,
            config,
            pods,
            pod_ips,
            counters,
            node_counters,
            meta,
            ns_rates,
            vqueue,
            index,
            pins,
        };
        let cfg = dp.config()?;
        if cfg.abi_version == 0 {
            return Err(ShaperError::NotInitialised {
                root: dp.pins.root.clone(),
            });
        }
        // Pins of another release (an up- or downgrade half done): say so, rather than "not
        // initialised", so the operator knows which side to roll.
        check_abi_version(&dp.pins.root, cfg.abi_version)?;
        for name in programs::ALL {
            if !dp.pins.prog(name).exists() {
                return Err(ShaperError::NotInitialised {
                    root: dp.pins.root.clone(),
                });
            }
        }
        Ok(dp)
    }

    pub fn pins(&self) -> &PinPaths {
        &self.pins
    }

    pub(crate) fn lock(&self) -> Result<Lock, ShaperError> {
        Lock::exclusive(&self.pins.root)
    }

    /// The applied configuration (policy epoch, default rate, node cap).
    pub fn config(&self) -> Result<abi::Config, ShaperError> {
        self.config
            .get(&0, 0)
            .map_err(|e| ShaperError::map(maps::CONFIG, e))
    }

    /// Internet-egress rate the applied policy gives a pod of `namespace` (`None` = unlimited).
    pub fn policy_internet_rate(&self, namespace: &str) -> Result<Option<u64>, ShaperError> {
        if let Some(key) = abi::NsKey::new(namespace) {
            match self.ns_rates.get(&key, 0) {
                Ok(r) => return Ok((r.internet_rate != 0).then_some(r.internet_rate)),
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(ShaperError::map(maps::NS_RATES, e)),
            }
        }
        let d = self.config()?.default_internet_rate;
        Ok((d != 0).then_some(d))
    }

    /// Sum over CPUs of the node-wide cap counters.
    pub fn node_counters(&self) -> Result<abi::Counter, ShaperError> {
        let v = self
            .node_counters
            .get(&0, 0)
            .map_err(|e| ShaperError::map(maps::NODE_COUNTERS, e))?;
        let mut total = abi::Counter::default();
        for c in v.iter() {
            total += c.capped;
        }
        Ok(total)
    }

    /// The classifier's prefixes of the active generation, as `(prefix, len, class)`.
    pub fn active_prefixes(&self) -> Result<Vec<(Ipv4Addr, u8, u32)>, ShaperError> {
        let gen = self.config()?.active_gen;
        let mut out = Vec::new();
        for k in self.prefixes.keys() {
            let k = k.map_err(|e| ShaperError::map(maps::PREFIXES, e))?;
            if k.data().gen != gen {
                continue;
            }
            let v = self
                .prefixes
                .get(&k, 0)
                .map_err(|e| ShaperError::map(maps::PREFIXES, e))?;
            out.push((
                Ipv4Addr::from(k.data().addr),
                (k.prefix_len() - 32) as u8,
                v.class,
            ));
        }
        out.sort();
        Ok(out)
    }

    fn clear_generation(&mut self, gen: u32) -> Result<usize, ShaperError> {
        let stale: Vec<Key<abi::LpmKeyData>> = self
            .prefixes
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.data().gen == gen)
            .collect();
        for k in &stale {
            match self.prefixes.remove(k) {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(ShaperError::map(maps::PREFIXES, e)),
            }
        }
        Ok(stale.len())
    }

    /// Applies a validated policy without detaching anything or touching counters.
    ///
    /// Order: everything that can fail for reasons outside the policy text (the uplink) is
    /// resolved first, so a failure leaves the old policy fully in place. The prefixes then
    /// switch atomically (new generation written, one store flips it, old one deleted).
    pub fn apply_policy(&mut self, policy: &Policy) -> Result<PolicyReport, ShaperError> {
        let uplink = match policy.node_internet_egress_cap {
            Some(_) => Some(resolve_uplink(policy.uplink.as_deref())?),
            None => None,
        };
        // The node cap's sizes derive from the uplink's frame; the programs read it with the cap.
        let uplink_sizes = match &uplink {
            Some((_, ifindex)) => Some(Rtnl::new()?.link_sizes(*ifindex)?),
            None => None,
        };
        let _lock = self.lock()?;
        let old = self.config()?;
        let mut report = PolicyReport::default();

        // 1. Prefixes, atomically.
        let new_gen = old.active_gen ^ 1;
        self.clear_generation(new_gen)?;
        let prefixes = policy.prefixes();
        for (cidr, class) in &prefixes {
            let key = Key::new(
                32 + u32::from(cidr.prefix_len()),
                abi::LpmKeyData::new(new_gen, cidr.addr()),
            );
            self.prefixes
                .insert(
                    &key,
                    abi::LpmValue {
                        class: *class,
                        reserved: 0,
                    },
                    0,
                )
                .map_err(|e| ShaperError::map(maps::PREFIXES, e))?;
        }
        let cfg = abi::Config {
            abi_version: abi::ABI_VERSION,
            active_gen: new_gen,
            policy_epoch: old.policy_epoch + 1,
            default_internet_rate: policy.pod_internet_egress_rate.unwrap_or(0),
            node_internet_cap: policy.node_internet_egress_cap.unwrap_or(0),
            uplink_ifindex: uplink.as_ref().map_or(0, |u| u.1),
            uplink_frame: uplink_sizes.map_or(0, |s| u32::try_from(s.frame()).unwrap_or(u32::MAX)),
            uplink_gso_max: uplink_sizes
                .map_or(0, |s| u32::try_from(s.aggregate_max()).unwrap_or(u32::MAX)),
            ..old
        };
        self.config
            .set(0, cfg, 0)
            .map_err(|e| ShaperError::map(maps::CONFIG, e))?;
        self.clear_generation(old.active_gen)?;
        report.epoch = cfg.policy_epoch;
        report.prefixes = prefixes.len();

        // 2. Namespace overrides (0 = explicitly unlimited; absent = node default).
        let wanted: std::collections::HashMap<abi::NsKey, u64> = policy
            .namespaces
            .iter()
            .filter_map(|(n, r)| abi::NsKey::new(n).map(|k| (k, r.unwrap_or(0))))
            .collect();
        let present: Vec<abi::NsKey> = self.ns_rates.keys().filter_map(Result::ok).collect();
        for k in present.iter().filter(|k| !wanted.contains_key(*k)) {
            match self.ns_rates.remove(k) {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(ShaperError::map(maps::NS_RATES, e)),
            }
        }
        for (k, rate) in &wanted {
            self.ns_rates
                .insert(
                    k,
                    abi::NsRate {
                        internet_rate: *rate,
                    },
                    0,
                )
                .map_err(|e| ShaperError::map(maps::NS_RATES, e))?;
        }
        report.namespaces = wanted.len();

        // 3. Node-wide internet cap on the uplink.
        self.apply_node_cap(
            old.uplink_ifindex,
            uplink.as_ref(),
            policy.node_internet_egress_cap,
        )?;
        report.uplink = uplink;

        // 4. Pods whose internet limit comes from policy follow it.
        let (updated, errors) = self.follow_policy(policy)?;
        report.pods_updated = updated;
        report.pod_errors = errors;
        Ok(report)
    }

    fn apply_node_cap(
        &mut self,
        old_ifindex: u32,
        uplink: Option<&(String, u32)>,
        cap: Option<u64>,
    ) -> Result<(), ShaperError> {
        let link = self.pins.uplink_link();
        let new_ifindex = uplink.map_or(0, |u| u.1);
        if old_ifindex != 0 && old_ifindex != new_ifindex {
            if link.exists() {
                std::fs::remove_file(&link).map_err(|e| ShaperError::io("unpin", &link, e))?;
            }
            // The old uplink may be gone; then so is its qdisc.
            if let Err(e) = Rtnl::new()?.delete_root_htb(old_ifindex, HTB_MAJOR) {
                warn!(ifindex = old_ifindex, error = %e, "removing the node cap qdisc from the old uplink");
            }
        }
        let (Some((name, ifindex)), Some(cap)) = (uplink, cap) else {
            return Ok(());
        };
        let mut rt = Rtnl::new()?;
        let shape = Shape::new(cap, None, u64::from(self.config()?.uplink_frame));
        let classes = with_leaves(HtbClass {
            classid: abi::CLASSID_NODE_CAP,
            parent: handle(HTB_MAJOR, 0),
            rate: shape,
            ceil: shape,
            prio: 0,
        });
        // Default 0: everything that is not the pods' internet traffic stays unshaped.
        install_htb(&mut rt, *ifindex, 0, &classes, false, Sender::Forwarded)?;
        if !(link.exists() && old_ifindex == *ifindex) {
            if link.exists() {
                std::fs::remove_file(&link).map_err(|e| ShaperError::io("unpin", &link, e))?;
            }
            attach_pinned(
                &self.pins,
                programs::UPLINK,
                name,
                aya::programs::TcAttachType::Egress,
                &link,
            )?;
        }
        info!(uplink = %name, cap = %fmt_rate(cap), "node internet-egress cap applied");
        Ok(())
    }
}

/// Attaches the pinned program `prog` to `ifname` (in the calling thread's netns) with TCX,
/// first in the chain so that blocked traffic is dropped before other programs act on it,
/// and pins the link at `link_path`. Only for the node's uplink: a TCX attach waits for an
/// RCU grace period under RTNL (~11 ms), fine once per node, too slow per pod (see
/// `crate::clsact`).
pub(crate) fn attach_pinned(
    pins: &PinPaths,
    prog_name: &str,
    ifname: &str,
    attach_type: aya::programs::TcAttachType,
    link_path: &Path,
) -> Result<(), ShaperError> {
    let mut prog = SchedClassifier::from_pin(pins.prog(prog_name))
        .map_err(|e| ShaperError::program(prog_name, e))?;
    let id = prog
        .attach_with_options(
            ifname,
            attach_type,
            aya::programs::tc::TcAttachOptions::TcxOrder(aya::programs::LinkOrder::first()),
        )
        .map_err(|e| ShaperError::program(prog_name, e))?;
    let link = prog
        .take_link(id)
        .map_err(|e| ShaperError::program(prog_name, e))?;
    let fd: FdLink = link.try_into().map_err(|source| ShaperError::Link {
        path: link_path.to_owned(),
        source,
    })?;
    fd.pin(link_path).map_err(|source| ShaperError::Pin {
        path: link_path.to_owned(),
        source,
    })?;
    Ok(())
}

/// The link pin file name a program is attached under (pods/<slot>/<name>, node/<name>).
fn link_name(prog: &str) -> &'static str {
    match prog {
        programs::HOST_INGRESS => "host_ingress",
        programs::HOST_EGRESS => "host_egress",
        programs::POD_EGRESS => "pod_egress",
        _ => "uplink",
    }
}

/// Every pinned link file (pods and node).
fn link_pins(pins: &PinPaths) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![pins.root.join("node")];
    if let Ok(rd) = std::fs::read_dir(pins.root.join("pods")) {
        dirs.extend(rd.filter_map(Result::ok).map(|e| e.path()));
    }
    for d in dirs {
        if let Ok(rd) = std::fs::read_dir(&d) {
            out.extend(rd.filter_map(Result::ok).map(|e| e.path()));
        }
    }
    out
}

/// Switches every pinned TCX link of program `name` still running `old_id` to `prog`
/// (BPF_LINK_UPDATE: atomic, the hook never runs without a program, and no RCU wait).
fn relink(
    pins: &PinPaths,
    name: &str,
    old_id: u32,
    prog: &mut SchedClassifier,
) -> Result<usize, ShaperError> {
    let mut n = 0;
    let role = link_name(name);
    for path in link_pins(pins) {
        if path.file_name().and_then(|f| f.to_str()) != Some(role) {
            continue;
        }
        let pinned = PinnedLink::from_pin(&path).map_err(|source| ShaperError::Link {
            path: path.clone(),
            source,
        })?;
        let fd = FdLink::from(pinned);
        let info = fd.info().map_err(|source| ShaperError::Link {
            path: path.clone(),
            source,
        })?;
        if info.program_id() != old_id {
            continue;
        }
        let link = SchedClassifierLink::try_from(fd).map_err(|source| ShaperError::Link {
            path: path.clone(),
            source,
        })?;
        let id = prog
            .attach_to_link(link)
            .map_err(|e| ShaperError::program(name, e))?;
        // Closing our fd leaves the (pinned) link attached to the new program.
        drop(prog.take_link(id));
        n += 1;
    }
    Ok(n)
}

/// Every attached pod as `(slot, meta)`, from the pinned metadata map.
fn live_pods(pins: &PinPaths) -> Result<Vec<(u32, abi::PodMeta)>, ShaperError> {
    let data = MapData::from_pin(pins.map(maps::POD_META))
        .map_err(|e| ShaperError::map(maps::POD_META, e))?;
    let meta: Array<MapData, abi::PodMeta> = typed(maps::POD_META, Map::Array(data))?;
    scan_meta(&meta)
}

pub(crate) fn scan_meta(
    meta: &Array<MapData, abi::PodMeta>,
) -> Result<Vec<(u32, abi::PodMeta)>, ShaperError> {
    let mut out = Vec::new();
    for slot in 0..abi::MAX_PODS {
        let m = meta
            .get(&slot, 0)
            .map_err(|e| ShaperError::map(maps::POD_META, e))?;
        if m.flags & abi::META_IN_USE != 0 {
            out.push((slot, m));
        }
    }
    Ok(out)
}

/// Switches the cls_bpf filters of program `name` on every attached pod to `prog`, in place
/// (same priority and handle: cls_bpf swaps the program atomically, no RCU wait). Pods whose
/// device or netns is gone are skipped, as are pods without our filter (attached by an
/// earlier build with TCX links: `relink` switches those).
fn refilter(
    name: &str,
    prog: &SchedClassifier,
    pods: &[(u32, abi::PodMeta)],
) -> Result<usize, ShaperError> {
    use std::os::fd::AsFd;

    let fd = prog
        .fd()
        .map_err(|e| ShaperError::program(name, e))?
        .as_fd();
    let replaced = |r: Result<(), crate::tc::TcError>| match r {
        Ok(()) => Ok(true),
        Err(e) if clsact::is_absent(&e) => Ok(false),
        Err(e) => Err(ShaperError::from(e)),
    };
    let mut n = 0;
    match name {
        programs::HOST_INGRESS | programs::HOST_EGRESS => {
            let hook = if name == programs::HOST_INGRESS {
                Hook::Ingress
            } else {
                Hook::Egress
            };
            let mut rt = Rtnl::new()?;
            for (_, m) in pods {
                let host = abi::cstr(&m.host_ifname);
                if nix::net::if_::if_nametoindex(host.as_str()) != Ok(m.host_ifindex) {
                    continue;
                }
                let r = rt.set_bpf_filter(m.host_ifindex, hook, fd, name, FilterMode::ReplaceOnly);
                if replaced(r)? {
                    n += 1;
                }
            }
        }
        programs::POD_EGRESS => {
            for (slot, m) in pods {
                if m.pod_ifindex == 0 || pod_egress_classes(m).is_none() {
                    continue;
                }
                let ns = PathBuf::from(abi::cstr(&m.netns));
                let ifname = abi::cstr(&m.ifname);
                let res = netns::run_in(&ns, || {
                    let Ok(ifindex) = nix::net::if_::if_nametoindex(ifname.as_str()) else {
                        return Ok(false);
                    };
                    let r = Rtnl::new()?.set_bpf_filter(
                        ifindex,
                        Hook::Egress,
                        fd,
                        name,
                        FilterMode::ReplaceOnly,
                    );
                    replaced(r)
                });
                match res {
                    Ok(r) => {
                        if r? {
                            n += 1;
                        }
                    }
                    // The pod is going away with its netns.
                    Err(NetnsError::Open { .. }) => {
                        info!(slot, netns = %ns.display(), "pod netns gone; not upgraded");
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        _ => {}
    }
    Ok(n)
}

/// The uplink by name, or the interface of the IPv4 default route of the calling thread's
/// network namespace.
pub fn resolve_uplink(name: Option<&str>) -> Result<(String, u32), ShaperError> {
    let name = match name {
        Some(n) => n.to_owned(),
        None => {
            // thread-self: the namespace of this thread, which may differ from the process's.
            let path = "/proc/thread-self/net/route";
            let text =
                std::fs::read_to_string(path).map_err(|e| ShaperError::io("read", path, e))?;
            text.lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000")
                        .then(|| f[0].to_owned())
                })
                .next()
                .ok_or_else(|| {
                    ShaperError::Uplink(
                        "no IPv4 default route to take the uplink from; set `uplink` in the policy"
                            .to_owned(),
                    )
                })?
        }
    };
    let ifindex = nix::net::if_::if_nametoindex(name.as_str())
        .map_err(|e| ShaperError::Uplink(format!("interface {name:?}: {e}")))?;
    Ok((name, ifindex))
}

/// Sums per-CPU values.
pub(crate) fn sum_counters(v: &PerCpuValues<abi::PodCounters>) -> abi::PodCounters {
    let mut total = abi::PodCounters::default();
    for c in v.iter() {
        total += *c;
    }
    total
}
