//! Kernel feature probes and per-pod program checks. Probes act, not guess: tcx is a real
//! BPF_PROG_QUERY, fq a real qdisc creation inside a throwaway network namespace.

use std::path::Path;

use aliasnet_ebpf::{Datapath, HookState, PodRecord, QdiscState};
use aliasnet_netlink::{NetlinkError, Rtnl};
use aya::programs::{tc::TcAttachType, SchedClassifier};
use serde::Serialize;

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// One probed kernel feature.
#[derive(Debug, Clone, Serialize)]
pub struct Feature {
    pub name: &'static str,
    /// `None` when the probe itself could not run.
    pub available: Option<bool>,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Kernel {
    pub release: String,
    pub features: Vec<Feature>,
}

fn is_bpffs(path: &Path) -> Option<bool> {
    nix::sys::statfs::statfs(path)
        .ok()
        .map(|s| s.filesystem_type().0 == BPF_FS_MAGIC)
}

fn errno_name(e: &NetlinkError) -> String {
    match e.os_error() {
        Some(e) => e
            .raw_os_error()
            .map(|n| format!("{:?}", nix::errno::Errno::from_raw(n)))
            .unwrap_or_else(|| format!("{:?}", e.kind())),
        None => e.to_string(),
    }
}

/// Tries `kind` as a qdisc on `lo` of a namespace created for the probe; the namespace (and
/// the qdisc) vanish when the probing thread exits.
fn qdisc_kind_available(kind: &'static str, why: &'static str) -> Feature {
    let res = aliasnet_netns::run_in_new(|| -> Result<(), String> {
        let mut rt = Rtnl::new().map_err(|e| format!("netlink: {}", errno_name(&e)))?;
        rt.add_qdisc(1, kind).map_err(|e| errno_name(&e))
    })
    .unwrap_or_else(|e| match e {
        aliasnet_netns::NetnsError::Create(e) => {
            Err(format!("cannot create a probe namespace: {e}"))
        }
        _ => Err("probe thread panicked".to_owned()),
    });
    match res {
        Ok(()) => Feature {
            name: kind,
            available: Some(true),
            detail: format!("sch_{kind} present"),
        },
        Err(e) if e.contains("EPERM") || e.contains("probe namespace") => Feature {
            name: kind,
            available: None,
            detail: format!("not probed: {e} (run as root)"),
        },
        Err(e) => Feature {
            name: kind,
            available: Some(false),
            detail: format!("the kernel has no sch_{kind} (creating one fails with {e}): {why}"),
        },
    }
}

/// Probes what the datapath relies on.
pub fn kernel() -> Kernel {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let mut features = Vec::new();
    let bpf = Path::new("/sys/fs/bpf");
    features.push(match is_bpffs(bpf) {
        Some(true) => Feature {
            name: "bpffs",
            available: Some(true),
            detail: "mounted on /sys/fs/bpf".into(),
        },
        Some(false) => Feature {
            name: "bpffs",
            available: Some(false),
            detail: "/sys/fs/bpf is not a bpf filesystem: aliasnet-shaperd mounts it, or run `mount -t bpf bpf /sys/fs/bpf`".into(),
        },
        None => Feature {
            name: "bpffs",
            available: Some(false),
            detail: "/sys/fs/bpf does not exist (is /sys mounted?)".into(),
        },
    });
    features.push(
        match SchedClassifier::query_tcx("lo", TcAttachType::Ingress) {
            Ok(_) => Feature {
                name: "tcx",
                available: Some(true),
                detail: "BPF_PROG_QUERY on tcx_ingress works (kernel >= 6.6)".into(),
            },
            Err(e) => {
                let text = e.to_string();
                let perm = std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                if text.contains("EPERM") || perm.contains("Operation not permitted") {
                    Feature {
                        name: "tcx",
                        available: None,
                        detail: "not probed: permission denied (run as root)".into(),
                    }
                } else {
                    Feature {
                        name: "tcx",
                        available: Some(false),
                        detail: format!(
                        "tcx query failed ({text}): the node uplink program (node internet cap) cannot be attached"
                    ),
                    }
                }
            }
        },
    );
    features.push(qdisc_kind_available(
        "clsact",
        "per-pod programs (cls_bpf filters) cannot be attached",
    ));
    features.push(qdisc_kind_available(
        "fq",
        "EDT pacing cannot work, shaping uses HTB",
    ));
    let btf = Path::new("/sys/kernel/btf/vmlinux");
    features.push(Feature {
        name: "btf",
        available: Some(btf.exists()),
        detail: if btf.exists() {
            "/sys/kernel/btf/vmlinux present".into()
        } else {
            "no /sys/kernel/btf/vmlinux (kernel built without CONFIG_DEBUG_INFO_BTF)".into()
        },
    });
    Kernel { release, features }
}

/// Whether a program is where it should be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attach {
    Attached,
    Missing,
    /// Our filter is there, carrying another pod's slot as its classid.
    WrongClassid {
        found: u32,
        wanted: u32,
    },
    /// The pod has no egress limit, so no egress program is needed.
    NotNeeded,
    /// Could not be checked (interface or netns gone, no permission).
    Unknown(String),
}

impl Attach {
    pub fn short(&self) -> &str {
        match self {
            Attach::Attached => "yes",
            Attach::Missing => "MISSING",
            Attach::WrongClassid { .. } => "WRONG",
            Attach::NotNeeded => "-",
            Attach::Unknown(_) => "?",
        }
    }
}

impl From<HookState> for Attach {
    fn from(h: HookState) -> Self {
        match h {
            HookState::Attached { .. } => Attach::Attached,
            HookState::Missing => Attach::Missing,
            HookState::WrongClassid { found, wanted } => Attach::WrongClassid { found, wanted },
            HookState::NotNeeded => Attach::NotNeeded,
            HookState::Unknown(why) => Attach::Unknown(why),
        }
    }
}

impl From<QdiscState> for Attach {
    fn from(q: QdiscState) -> Self {
        match q {
            QdiscState::Present => Attach::Attached,
            QdiscState::Missing => Attach::Missing,
            QdiscState::NotNeeded => Attach::NotNeeded,
            QdiscState::Unknown(why) => Attach::Unknown(why),
        }
    }
}

/// The pod's three program attachments, and the HTB of its egress limits.
#[derive(Debug, Clone, Serialize)]
pub struct Programs {
    pub host_ingress: Attach,
    pub host_egress: Attach,
    pub pod_egress: Attach,
    pub pod_htb: Attach,
}

impl Programs {
    pub fn complete(&self) -> bool {
        [
            &self.host_ingress,
            &self.host_egress,
            &self.pod_egress,
            &self.pod_htb,
        ]
        .iter()
        .all(|a| matches!(a, Attach::Attached | Attach::NotNeeded))
    }
}

/// Checks the program attachments of a pod (host side in the calling thread's netns, pod
/// side in its netns), as the plugin's CHECK does.
pub fn programs_of(dp: &Datapath, rec: &PodRecord) -> Programs {
    let h = dp.hooks_of(rec);
    Programs {
        host_ingress: h.host_ingress.into(),
        host_egress: h.host_egress.into(),
        pod_egress: h.pod_egress.into(),
        pod_htb: h.pod_htb.into(),
    }
}
