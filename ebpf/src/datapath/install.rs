//! Installing the datapath (aliasnet-shaperd): load the object, reuse or create every pinned
//! map, pin the programs, and on an upgrade switch every attachment to the new programs
//! before their pins are replaced.

use std::path::{Path, PathBuf};

use aya::{
    maps::{Array, Map, MapData, MapError},
    programs::{
        links::{FdLink, PinnedLink},
        tc::SchedClassifierLink,
        SchedClassifier,
    },
    EbpfLoader,
};
use tracing::info;

use super::{
    index,
    pins::{create_pin_dirs, ensure_bpffs, Lock, PinPaths},
    scan_meta,
    specs::{check_abi_version, check_spec},
    typed, Datapath,
};
use crate::{
    abi, datapath_object,
    error::DatapathError,
    htb::pod_classes,
    maps,
    netlink::{
        clsact::{self, FilterMode, Hook},
        NetlinkError, Rtnl,
    },
    programs,
};

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

impl Datapath {
    /// Loads `datapath.bpf.o`, reusing every pinned map (and so its contents and counters)
    /// and pinning what is missing. A pinned program with the same code is kept; one with
    /// different code (an upgrade) is replaced, and every attachment using it is switched to
    /// the new program first (pods' cls_bpf filters replaced in place, TCX links with
    /// `BPF_LINK_UPDATE`), so traffic never runs without a program.
    ///
    /// The pin root's lock is held only to open or create the maps and, once the verifier has
    /// accepted every program (seconds on a busy node), to pin and switch: CNI calls wait
    /// milliseconds, not the verifier. Whatever another installer pinned meanwhile is
    /// compared again under the lock, so concurrent installs end with one complete set.
    pub fn install(root: impl Into<PathBuf>) -> Result<(Self, InstallReport), DatapathError> {
        Self::install_object(root, datapath_object()?)
    }

    /// [`Datapath::install`] with another build of the programs: benchmarks install
    /// [`crate::bench_datapath_object`], whose programs obey the switches in
    /// `an_config.flags`. Whichever build is installed later replaces the other's programs
    /// as an upgrade would.
    pub fn install_object(
        root: impl Into<PathBuf>,
        object: &[u8],
    ) -> Result<(Self, InstallReport), DatapathError> {
        let pins = PinPaths::new(root);
        ensure_bpffs(&pins.root)?;
        create_pin_dirs(&pins)?;
        let mut attempt = 0;
        let report = loop {
            let mut report = InstallReport::default();
            let (mut ebpf, map_ids) = {
                let _lock = Lock::exclusive(&pins.root)?;
                open_maps(&pins, object, &mut report)?
            };
            verify(&mut ebpf)?;
            let _lock = Lock::exclusive(&pins.root)?;
            // The programs reference the maps opened above: pin them only if those are still
            // the pinned ones.
            if pinned_map_ids(&pins)? != map_ids {
                attempt += 1;
                if attempt < 3 {
                    info!("pinned maps replaced while the programs were verified; loading again");
                    continue;
                }
                return Err(DatapathError::AbiMismatch {
                    root: pins.root.clone(),
                    name: "maps".to_owned(),
                    reason: "replaced by another process during every install attempt".into(),
                });
            }
            pin_programs(&pins, &mut ebpf, &mut report)?;
            break report;
        };
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
}

/// With the lock held: checks the pinned maps against this build, opens them (creating and
/// pinning the missing ones) and writes a fresh config's ABI version. Returns the object with
/// its programs not loaded yet, and the ids of the pinned maps it uses.
fn open_maps(
    pins: &PinPaths,
    object: &[u8],
    report: &mut InstallReport,
) -> Result<(aya::Ebpf, Vec<u32>), DatapathError> {
    for spec in &abi::MAPS {
        let path = pins.map(spec.name);
        if path.exists() {
            let data = MapData::from_pin(&path).map_err(|e| DatapathError::map(spec.name, e))?;
            check_spec(&pins.root, spec, &data)?;
        } else {
            report.created_maps.push(spec.name.to_owned());
        }
    }
    if pins.map(maps::CONFIG).exists() {
        let data = MapData::from_pin(pins.map(maps::CONFIG))
            .map_err(|e| DatapathError::map(maps::CONFIG, e))?;
        let cfg: Array<MapData, abi::Config> = typed(maps::CONFIG, Map::Array(data))?;
        let c = cfg
            .get(&0, 0)
            .map_err(|e| DatapathError::map(maps::CONFIG, e))?;
        if c.abi_version != 0 {
            check_abi_version(&pins.root, c.abi_version)?;
        }
    }

    let mut loader = EbpfLoader::new();
    let map_paths: Vec<(&str, PathBuf)> = maps::ALL.iter().map(|n| (*n, pins.map(n))).collect();
    for (name, path) in &map_paths {
        loader.map_pin_path(name, path.as_path());
    }
    // Creates and pins the missing maps; the programs are only loaded by `verify`.
    let mut ebpf = loader.load(object).map_err(DatapathError::Load)?;
    {
        let map = ebpf
            .map_mut(maps::CONFIG)
            .ok_or_else(|| DatapathError::map(maps::CONFIG, MapError::ElementNotFound))?;
        let mut cfg: Array<&mut MapData, abi::Config> =
            Array::try_from(map).map_err(|e| DatapathError::map(maps::CONFIG, e))?;
        let c = cfg
            .get(&0, 0)
            .map_err(|e| DatapathError::map(maps::CONFIG, e))?;
        if c.abi_version == 0 {
            let fresh = abi::Config {
                abi_version: abi::ABI_VERSION,
                ..Default::default()
            };
            cfg.set(0, fresh, 0)
                .map_err(|e| DatapathError::map(maps::CONFIG, e))?;
        }
    }
    Ok((ebpf, pinned_map_ids(pins)?))
}

/// The ids of the pinned maps, in `maps::ALL` order.
fn pinned_map_ids(pins: &PinPaths) -> Result<Vec<u32>, DatapathError> {
    maps::ALL
        .iter()
        .map(|name| {
            aya::maps::MapInfo::from_pin(pins.map(name))
                .map(|i| i.id())
                .map_err(|e| DatapathError::map(name, e))
        })
        .collect()
}

fn classifier<'a>(
    ebpf: &'a mut aya::Ebpf,
    name: &str,
) -> Result<&'a mut SchedClassifier, DatapathError> {
    ebpf.program_mut(name)
        .ok_or_else(|| DatapathError::program(name, aya::programs::ProgramError::NotLoaded))?
        .try_into()
        .map_err(|e| DatapathError::program(name, e))
}

/// Loads every program into the kernel: the verifier's part, without the lock.
fn verify(ebpf: &mut aya::Ebpf) -> Result<(), DatapathError> {
    for name in programs::ALL {
        classifier(ebpf, name)?
            .load()
            .map_err(|e| DatapathError::program(name, e))?;
    }
    Ok(())
}

/// With the lock held: pins every verified program whose pin is missing, and replaces (after
/// switching its attachments) every one whose pinned code differs. A program another
/// installer pinned with the same code meanwhile is kept.
fn pin_programs(
    pins: &PinPaths,
    ebpf: &mut aya::Ebpf,
    report: &mut InstallReport,
) -> Result<(), DatapathError> {
    // Attached pods, read once if an upgrade needs them.
    let mut live: Option<Vec<(u32, abi::PodMeta)>> = None;
    for name in programs::ALL {
        let prog = classifier(ebpf, name)?;
        let new = prog.info().map_err(|e| DatapathError::program(name, e))?;
        let path = pins.prog(name);
        let old = if path.exists() {
            let p =
                SchedClassifier::from_pin(&path).map_err(|e| DatapathError::program(name, e))?;
            Some(p.info().map_err(|e| DatapathError::program(name, e))?)
        } else {
            None
        };
        match old {
            None => {
                prog.pin(&path).map_err(|source| DatapathError::Pin {
                    path: path.clone(),
                    source,
                })?;
                report.pinned_programs.push(name.to_owned());
            }
            Some(old) if old.tag() == new.tag() => {}
            Some(old) => {
                report.relinked += relink(pins, name, old.id(), prog)?;
                let pods = match &mut live {
                    Some(p) => p,
                    None => live.insert(live_pods(pins)?),
                };
                report.relinked += refilter(name, prog, pods, pins)?;
                std::fs::remove_file(&path).map_err(|e| DatapathError::io("unpin", &path, e))?;
                prog.pin(&path).map_err(|source| DatapathError::Pin {
                    path: path.clone(),
                    source,
                })?;
                report.upgraded_programs.push(name.to_owned());
            }
        }
    }
    Ok(())
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
) -> Result<(), DatapathError> {
    let mut prog = SchedClassifier::from_pin(pins.prog(prog_name))
        .map_err(|e| DatapathError::program(prog_name, e))?;
    let id = prog
        .attach_with_options(
            ifname,
            attach_type,
            aya::programs::tc::TcAttachOptions::TcxOrder(aya::programs::LinkOrder::first()),
        )
        .map_err(|e| DatapathError::program(prog_name, e))?;
    let link = prog
        .take_link(id)
        .map_err(|e| DatapathError::program(prog_name, e))?;
    let fd: FdLink = link.try_into().map_err(|source| DatapathError::Link {
        path: link_path.to_owned(),
        source,
    })?;
    fd.pin(link_path).map_err(|source| DatapathError::Pin {
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
        programs::UPLINK_IN => "uplink_in",
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
) -> Result<usize, DatapathError> {
    let mut n = 0;
    let role = link_name(name);
    for path in link_pins(pins) {
        if path.file_name().and_then(|f| f.to_str()) != Some(role) {
            continue;
        }
        let pinned = PinnedLink::from_pin(&path).map_err(|source| DatapathError::Link {
            path: path.clone(),
            source,
        })?;
        let fd = FdLink::from(pinned);
        let info = fd.info().map_err(|source| DatapathError::Link {
            path: path.clone(),
            source,
        })?;
        if info.program_id() != old_id {
            continue;
        }
        let link = SchedClassifierLink::try_from(fd).map_err(|source| DatapathError::Link {
            path: path.clone(),
            source,
        })?;
        let id = prog
            .attach_to_link(link)
            .map_err(|e| DatapathError::program(name, e))?;
        // Closing our fd leaves the (pinned) link attached to the new program.
        drop(prog.take_link(id));
        n += 1;
    }
    Ok(n)
}

/// Every attached pod as `(slot, meta)`, from the pinned metadata map.
fn live_pods(pins: &PinPaths) -> Result<Vec<(u32, abi::PodMeta)>, DatapathError> {
    let data = MapData::from_pin(pins.map(maps::POD_META))
        .map_err(|e| DatapathError::map(maps::POD_META, e))?;
    let meta: Array<MapData, abi::PodMeta> = typed(maps::POD_META, Map::Array(data))?;
    scan_meta(&meta)
}

/// Switches the cls_bpf filters of program `name` on every attached pod to `prog`, in place
/// (same priority and handle: cls_bpf swaps the program atomically, no RCU wait). Pods whose
/// device or netns is gone are skipped, as are pods without our filter (attached by an
/// earlier build with TCX links: `relink` switches those).
fn refilter(
    name: &str,
    prog: &SchedClassifier,
    pods: &[(u32, abi::PodMeta)],
    pins: &PinPaths,
) -> Result<usize, DatapathError> {
    use std::os::fd::AsFd;

    let fd = prog
        .fd()
        .map_err(|e| DatapathError::program(name, e))?
        .as_fd();
    let replaced = |r: Result<(), NetlinkError>| match r {
        Ok(()) => Ok(true),
        Err(e) if clsact::is_absent(&e) => Ok(false),
        Err(e) => Err(DatapathError::from(e)),
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
                let r = rt.set_bpf_filter(
                    m.host_ifindex,
                    hook,
                    fd,
                    name,
                    None,
                    FilterMode::ReplaceOnly,
                );
                if replaced(r)? {
                    n += 1;
                }
            }
        }
        programs::POD_EGRESS => {
            for (slot, m) in pods {
                if m.pod_ifindex == 0 || pod_classes(m, abi::Direction::Egress).is_none() {
                    continue;
                }
                let ifname = abi::cstr(&m.ifname);
                let res = crate::pod::run_in_pod(m, || {
                    let Ok(ifindex) = nix::net::if_::if_nametoindex(ifname.as_str()) else {
                        return Ok(false);
                    };
                    // The replacement is a new filter: it carries the slot again.
                    let r = Rtnl::new()?.set_bpf_filter(
                        ifindex,
                        Hook::Egress,
                        fd,
                        name,
                        Some(abi::pod_filter_classid(*slot)),
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
                    Err(e) if e.is_gone() => {
                        info!(slot, error = %e, "pod netns gone; not upgraded");
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        programs::NS_GATE | programs::NS_CLASSIFY => {
            // Classic filters carry their actions: they are put again whole, with the new
            // program, wherever they are.
            let ns_in = ns_in_device(pins)?;
            if ns_in == 0 {
                return Ok(0);
            }
            let mut rt = Rtnl::new()?;
            if name == programs::NS_CLASSIFY {
                let root = crate::netlink::handle(abi::NS_IN_MAJOR, 0);
                rt.set_qdisc_filter(ns_in, root, fd, name, root)?;
                return Ok(1);
            }
            for (_, m) in pods
                .iter()
                .filter(|(_, m)| m.flags & abi::META_NS_GATE != 0)
            {
                let host = abi::cstr(&m.host_ifname);
                if nix::net::if_::if_nametoindex(host.as_str()) != Ok(m.host_ifindex) {
                    continue;
                }
                rt.set_gate_filter(m.host_ifindex, Hook::Egress, fd, name, ns_in)?;
                n += 1;
            }
        }
        _ => {}
    }
    Ok(n)
}

/// The namespaces' download device the applied policy uses (0: none).
fn ns_in_device(pins: &PinPaths) -> Result<u32, DatapathError> {
    let data = MapData::from_pin(pins.map(maps::CONFIG))
        .map_err(|e| DatapathError::map(maps::CONFIG, e))?;
    let cfg: Array<MapData, abi::Config> = typed(maps::CONFIG, Map::Array(data))?;
    Ok(cfg
        .get(&0, 0)
        .map_err(|e| DatapathError::map(maps::CONFIG, e))?
        .ns_in_ifindex)
}
