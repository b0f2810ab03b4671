//! Per-pod program attachment: a clsact qdisc and cls_bpf direct-action filters, over the
//! same socket as the HTB code ([`Rtnl`]).
//!
//! # Why not TCX for per-pod hooks
//!
//! Every TCX attach (`BPF_LINK_CREATE` with `BPF_TCX_INGRESS/EGRESS`) and every link
//! release publishes a new `bpf_mprog` entry for the hook and then calls `synchronize_rcu()`
//! (`tcx_entry_sync()` in kernel/bpf/tcx.c) while holding RTNL: ~11 ms per link on kernel
//! 6.18 with 2 vCPUs. A pod needs two or three, so ADD took ~32 ms, every netlink user on the
//! node (other ADDs, kubelet, routing daemons) waited behind RTNL meanwhile, and parallel ADDs
//! serialised; releasing the links on DEL paid the same wait, again under RTNL. A cls_bpf
//! filter is published with `rcu_assign_pointer()` and freed with `call_rcu()`: neither adding
//! nor deleting waits for a grace period. clsact plus two filters through netlink costs
//! ~0.05 ms per veth (`tc -batch`, 50 veths in 8 ms), ~200x less than the two TCX links it
//! replaces. The measurements are in docs/design/attach.md.
//!
//! TCX stays for the node's single uplink program (one attach per node, cost irrelevant).
//!
//! # Semantics
//!
//! Filters are direct-action (`TCA_BPF_FLAG_ACT_DIRECT`): the program's return code is the
//! verdict. The programs return `TC_ACT_UNSPEC`, which in a cls_bpf chain means "continue with
//! the next filter" and, at the end of the chain, pass (as `TCX_NEXT` does under TCX), or
//! `TC_ACT_SHOT` (drop). Ours sit at priority [`FILTER_PRIO`] (1, the first a chain can
//! have) and handle [`FILTER_HANDLE`], so they run before any other filter on the hook; TCX
//! programs on the same device, if any, run before clsact.
//!
//! An upgrade replaces the program of a live filter in place: `RTM_NEWTFILTER` for the same
//! priority/handle without `NLM_F_EXCL` makes cls_bpf swap the program with
//! `list_replace_rcu()`, so every packet sees either the old or the new program, never none.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use netlink_packet_core::{
    DefaultNla, Emitable, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE,
};
use netlink_packet_route::{
    tc::{
        TcAction, TcActionAttribute, TcActionMirrorOption, TcActionOption, TcActionType,
        TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcMessage, TcMirror,
        TcMirrorActionType, TcOption,
    },
    RouteNetlinkMessage,
};

use crate::{tc::NLA_F_NESTED, NetlinkError, Reply, Request, Rtnl};

/// Priority of our filters on every per-pod hook (lower runs first; 1 is the first).
pub const FILTER_PRIO: u16 = 1;
/// Handle of our filter within that priority.
pub const FILTER_HANDLE: u32 = 1;

/// Priority of the gate filter on a host veth's egress, after ours (see
/// [`Rtnl::set_gate_filter`]).
pub const GATE_PRIO: u16 = 2;
/// `TCA_BPF_ACT`: the actions of a classic (not direct-action) cls_bpf filter.
const TCA_BPF_ACT: u16 = 1;

/// `ETH_P_ALL`: the filters see every protocol (the programs class what is neither IPv4 nor IPv6 as "other").
const ETH_P_ALL: u16 = 0x0003;
/// `TC_H_MAKE(TC_H_CLSACT, 0)`: the clsact qdisc's handle `ffff:`.
const CLSACT_HANDLE: u32 = 0xffff_0000;

/// A clsact hook of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    Ingress,
    Egress,
}

impl Hook {
    /// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS/EGRESS)`.
    fn parent(self) -> TcHandle {
        TcHandle {
            major: 0xffff,
            minor: match self {
                Hook::Ingress => TcHandle::MIN_INGRESS,
                Hook::Egress => TcHandle::MIN_EGRESS,
            },
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Hook::Ingress => "ingress",
            Hook::Egress => "egress",
        }
    }
}

/// Whether [`Rtnl::set_bpf_filter`] may create the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterMode {
    /// Create it, or switch an existing one at our priority/handle to the program (attach).
    CreateOrReplace,
    /// Only switch an existing filter's program; `ENOENT` if there is none (upgrade: never
    /// resurrect an attachment that was removed).
    ReplaceOnly,
}

/// A cls_bpf filter as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfFilter {
    pub prio: u16,
    pub handle: u32,
    /// `TCA_BPF_NAME`: what the attacher called it (we use the program name).
    pub name: String,
    /// The program it runs now.
    pub prog_id: u32,
    pub direct_action: bool,
    /// `TCA_BPF_CLASSID`, 0 if none: the program reads it as `skb->tc_classid`.
    pub classid: u32,
}

fn filter_message(ifindex: u32, hook: Hook, prio: u16, handle: u32) -> TcMessage {
    filter_message_at(ifindex, hook.parent(), prio, handle)
}

fn filter_message_at(ifindex: u32, parent: TcHandle, prio: u16, handle: u32) -> TcMessage {
    let mut m = TcMessage::with_index(ifindex as i32);
    m.header.parent = parent;
    m.header.handle = TcHandle::from(handle);
    // tcm_info = TC_H_MAKE(prio << 16, htons(protocol)).
    m.header.info = (u32::from(prio) << 16) | u32::from(ETH_P_ALL.to_be());
    m
}

fn clsact_message(ifindex: u32) -> TcMessage {
    let mut m = TcMessage::with_index(ifindex as i32);
    m.header.handle = TcHandle::from(CLSACT_HANDLE);
    m.header.parent = TcHandle::CLSACT;
    m.attributes.push(TcAttribute::Kind("clsact".to_owned()));
    m
}

/// `union bpf_attr` as `BPF_OBJ_GET` reads it.
#[repr(C)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

const BPF_OBJ_GET: libc::c_long = 7;

/// Opens the object pinned at `path` (a program, for a filter) with a plain `BPF_OBJ_GET`.
/// aya's `SchedClassifier::from_pin` would also run aya's kernel feature probes on its first
/// use in a process (loading a dozen test programs and BTF blobs): milliseconds on every CNI
/// invocation, for nothing a filter needs. A pin that is not a program makes the filter
/// request fail with `EINVAL`.
pub fn open_pinned(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let attr = ObjGetAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
        path_fd: 0,
        _pad: 0,
    };
    // SAFETY: `attr` is a valid BPF_OBJ_GET attribute whose pathname points to `c`, which
    // outlives the call; the size passed is its own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            &attr as *const ObjGetAttr,
            std::mem::size_of::<ObjGetAttr>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Errors that mean "there is nothing of ours there": no such filter (`ENOENT`), no clsact
/// qdisc to hold one (`EINVAL`, "Parent Qdisc doesn't exists"), or no device (`ENODEV`).
pub fn is_absent(e: &NetlinkError) -> bool {
    matches!(e.errno(), Some(libc::ENOENT | libc::EINVAL | libc::ENODEV))
}

/// The request [`Rtnl::ensure_clsact`] sends, for a [`crate::Batch`]; its reply goes through
/// [`clsact_added`].
pub fn add_clsact(ifindex: u32) -> Request {
    (
        RouteNetlinkMessage::NewQueueDiscipline(clsact_message(ifindex)),
        NLM_F_CREATE | NLM_F_EXCL,
    )
}

/// How errors name [`add_clsact`].
pub fn add_clsact_op(ifindex: u32) -> String {
    format!("add clsact qdisc to ifindex {ifindex}")
}

/// The reply to [`add_clsact`]: whether the qdisc was created; one that exists already is
/// fine (see [`Rtnl::ensure_clsact`]).
pub fn clsact_added(reply: Reply) -> Result<bool, NetlinkError> {
    match reply {
        Ok(_) => Ok(true),
        Err(e) if e.errno() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The request [`Rtnl::set_bpf_filter`] sends, for a [`crate::Batch`]. It carries `prog` as a
/// number: the descriptor must stay open until the batch is sent.
pub fn bpf_filter(
    ifindex: u32,
    hook: Hook,
    prog: BorrowedFd<'_>,
    name: &str,
    classid: Option<u32>,
    mode: FilterMode,
) -> Request {
    let mut m = filter_message(ifindex, hook, FILTER_PRIO, FILTER_HANDLE);
    m.attributes.push(TcAttribute::Kind("bpf".to_owned()));
    let mut opts = vec![
        TcOption::Bpf(TcFilterBpfOption::ProgFd(prog.as_raw_fd() as u32)),
        TcOption::Bpf(TcFilterBpfOption::ProgName(name.to_owned())),
        TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
    ];
    if let Some(c) = classid {
        opts.push(TcOption::Bpf(TcFilterBpfOption::ClassId(TcHandle::from(c))));
    }
    m.attributes.push(TcAttribute::Options(opts));
    // cls_bpf ignores NLM_F_REPLACE; what matters is no NLM_F_EXCL (replace an existing
    // filter) and NLM_F_CREATE or not (may create one).
    let flags = match mode {
        FilterMode::CreateOrReplace => NLM_F_CREATE | NLM_F_REPLACE,
        FilterMode::ReplaceOnly => NLM_F_REPLACE,
    };
    (RouteNetlinkMessage::NewTrafficFilter(m), flags)
}

/// How errors name [`bpf_filter`].
pub fn bpf_filter_op(ifindex: u32, hook: Hook, name: &str) -> String {
    format!(
        "attach {name} to ifindex {ifindex} {} (cls_bpf)",
        hook.name()
    )
}

/// The request [`Rtnl::set_gate_filter`] sends, for a [`crate::Batch`]; `prog` must stay open
/// until the batch is sent.
pub fn gate_filter(
    ifindex: u32,
    hook: Hook,
    prog: BorrowedFd<'_>,
    name: &str,
    target: u32,
) -> Request {
    let mut mirror = TcMirror::default();
    mirror.generic.action = TcActionType::Stolen;
    mirror.eaction = TcMirrorActionType::EgressRedir;
    mirror.ifindex = target;
    let mut action = TcAction::default();
    action.tab = 1;
    action
        .attributes
        .push(TcActionAttribute::Kind("mirred".to_owned()));
    action
        .attributes
        .push(TcActionAttribute::Options(vec![TcActionOption::Mirror(
            TcActionMirrorOption::Parms(mirror),
        )]));
    let actions = [action];
    let mut buf = vec![0u8; actions.as_slice().buffer_len()];
    actions.as_slice().emit(&mut buf);
    let mut m = filter_message(ifindex, hook, GATE_PRIO, FILTER_HANDLE);
    m.attributes.push(TcAttribute::Kind("bpf".to_owned()));
    m.attributes.push(TcAttribute::Options(vec![
        TcOption::Bpf(TcFilterBpfOption::ProgFd(prog.as_raw_fd() as u32)),
        TcOption::Bpf(TcFilterBpfOption::ProgName(name.to_owned())),
        TcOption::Bpf(TcFilterBpfOption::Other(DefaultNla::new(
            TCA_BPF_ACT | NLA_F_NESTED,
            buf,
        ))),
    ]));
    (
        RouteNetlinkMessage::NewTrafficFilter(m),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
}

/// How errors name [`gate_filter`].
pub fn gate_filter_op(ifindex: u32, hook: Hook, name: &str, target: u32) -> String {
    format!(
        "attach {name} to ifindex {ifindex} {} with a redirect to ifindex {target}",
        hook.name()
    )
}

impl Rtnl {
    /// Adds a clsact qdisc to `ifindex`; returns whether it was created. One that exists
    /// already is fine: `NLM_F_EXCL` on an existing `ffff:` ingress-side qdisc is the kernel's
    /// "Exclusivity flag on, cannot modify" (`EEXIST`), the only `EEXIST` this request can get.
    /// Any other error is returned.
    pub fn ensure_clsact(&mut self, ifindex: u32) -> Result<bool, NetlinkError> {
        let (msg, flags) = add_clsact(ifindex);
        clsact_added(self.request(msg, flags, &add_clsact_op(ifindex)))
    }

    /// Deletes the clsact qdisc of `ifindex` (and with it every filter on it); returns
    /// whether there was one.
    pub fn delete_clsact(&mut self, ifindex: u32) -> Result<bool, NetlinkError> {
        match self.request(
            RouteNetlinkMessage::DelQueueDiscipline(clsact_message(ifindex)),
            0,
            &format!("delete clsact qdisc of ifindex {ifindex}"),
        ) {
            Ok(_) => Ok(true),
            Err(e) if is_absent(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Puts program `prog` on `hook` of `ifindex` as a direct-action cls_bpf filter at
    /// [`FILTER_PRIO`]/[`FILTER_HANDLE`], named `name`, with `classid` if given (cls_bpf
    /// hands it to the program in `skb->tc_classid`). A replacement is a new filter: a
    /// classid not given again is gone. The clsact qdisc must exist.
    pub fn set_bpf_filter(
        &mut self,
        ifindex: u32,
        hook: Hook,
        prog: BorrowedFd<'_>,
        name: &str,
        classid: Option<u32>,
        mode: FilterMode,
    ) -> Result<(), NetlinkError> {
        let (msg, flags) = bpf_filter(ifindex, hook, prog, name, classid, mode);
        self.request(msg, flags, &bpf_filter_op(ifindex, hook, name))?;
        Ok(())
    }

    /// Puts program `prog` as a classic cls_bpf filter at [`GATE_PRIO`] on `hook` of
    /// `ifindex` with a mirred action that redirects what it matches to the egress of
    /// `target`: the program returns -1 (match) or 0 (no match, the packet goes on).
    pub fn set_gate_filter(
        &mut self,
        ifindex: u32,
        hook: Hook,
        prog: BorrowedFd<'_>,
        name: &str,
        target: u32,
    ) -> Result<(), NetlinkError> {
        let (msg, flags) = gate_filter(ifindex, hook, prog, name, target);
        self.request(msg, flags, &gate_filter_op(ifindex, hook, name, target))?;
        Ok(())
    }

    /// Deletes the gate filter from `hook` of `ifindex`; returns whether there was one.
    pub fn delete_gate_filter(&mut self, ifindex: u32, hook: Hook) -> Result<bool, NetlinkError> {
        let mut m = filter_message(ifindex, hook, GATE_PRIO, FILTER_HANDLE);
        m.attributes.push(TcAttribute::Kind("bpf".to_owned()));
        match self.request(
            RouteNetlinkMessage::DelTrafficFilter(m),
            0,
            &format!(
                "detach the gate filter from ifindex {ifindex} {}",
                hook.name()
            ),
        ) {
            Ok(_) => Ok(true),
            Err(e) if is_absent(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Puts program `prog` as a direct-action cls_bpf filter on qdisc `parent` of `ifindex`
    /// (an HTB qdisc's classifier), with classid major `classid` (the program sets the minor
    /// in `skb->tc_classid`).
    pub fn set_qdisc_filter(
        &mut self,
        ifindex: u32,
        parent: u32,
        prog: BorrowedFd<'_>,
        name: &str,
        classid: u32,
    ) -> Result<(), NetlinkError> {
        let mut m = filter_message_at(ifindex, TcHandle::from(parent), FILTER_PRIO, FILTER_HANDLE);
        m.attributes.push(TcAttribute::Kind("bpf".to_owned()));
        m.attributes.push(TcAttribute::Options(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgFd(prog.as_raw_fd() as u32)),
            TcOption::Bpf(TcFilterBpfOption::ProgName(name.to_owned())),
            TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
            TcOption::Bpf(TcFilterBpfOption::ClassId(TcHandle::from(classid))),
        ]));
        self.request(
            RouteNetlinkMessage::NewTrafficFilter(m),
            NLM_F_CREATE | NLM_F_REPLACE,
            &format!("attach {name} to qdisc {parent:x} of ifindex {ifindex}"),
        )?;
        Ok(())
    }

    /// Deletes our filter from `hook` of `ifindex`; returns whether there was one.
    pub fn delete_bpf_filter(&mut self, ifindex: u32, hook: Hook) -> Result<bool, NetlinkError> {
        let mut m = filter_message(ifindex, hook, FILTER_PRIO, FILTER_HANDLE);
        m.attributes.push(TcAttribute::Kind("bpf".to_owned()));
        match self.request(
            RouteNetlinkMessage::DelTrafficFilter(m),
            0,
            &format!("detach the filter from ifindex {ifindex} {}", hook.name()),
        ) {
            Ok(_) => Ok(true),
            Err(e) if is_absent(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every filter on `hook` of `ifindex` (cls_bpf ones with their program); empty when the
    /// device has no clsact qdisc.
    pub fn filters(&mut self, ifindex: u32, hook: Hook) -> Result<Vec<BpfFilter>, NetlinkError> {
        let mut req = TcMessage::with_index(ifindex as i32);
        req.header.parent = hook.parent();
        let op = format!("list filters of ifindex {ifindex} {}", hook.name());
        let replies =
            match self.request(RouteNetlinkMessage::GetTrafficFilter(req), NLM_F_DUMP, &op) {
                Err(e) if is_absent(&e) => return Ok(Vec::new()),
                r => r?,
            };
        let mut out = Vec::new();
        for m in replies {
            let RouteNetlinkMessage::NewTrafficFilter(f) = m else {
                continue;
            };
            let handle = u32::from(f.header.handle);
            // Each priority's head is reported once without a handle: not a filter.
            if f.header.index as u32 != ifindex || handle == 0 {
                continue;
            }
            let mut filter = BpfFilter {
                prio: (f.header.info >> 16) as u16,
                handle,
                name: String::new(),
                prog_id: 0,
                direct_action: false,
                classid: 0,
            };
            for a in &f.attributes {
                let TcAttribute::Options(opts) = a else {
                    continue;
                };
                for o in opts {
                    match o {
                        TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => filter.name.clone_from(n),
                        TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => filter.prog_id = *id,
                        TcOption::Bpf(TcFilterBpfOption::ClassId(c)) => {
                            filter.classid = u32::from(*c);
                        }
                        TcOption::Bpf(TcFilterBpfOption::Flags(fl)) => {
                            filter.direct_action = fl.contains(TcBpfFlags::DirectAction);
                        }
                        _ => {}
                    }
                }
            }
            out.push(filter);
        }
        Ok(out)
    }

    /// Our filter on `hook` of `ifindex`, if any.
    pub fn our_filter(
        &mut self,
        ifindex: u32,
        hook: Hook,
    ) -> Result<Option<BpfFilter>, NetlinkError> {
        Ok(self
            .filters(ifindex, hook)?
            .into_iter()
            .find(|f| f.prio == FILTER_PRIO && f.handle == FILTER_HANDLE))
    }

    /// Removes our filters from `hooks` of `ifindex`, then the clsact qdisc if no filter at
    /// all is left on it (someone else's filters keep it). Missing pieces are not errors.
    pub fn detach_filters(&mut self, ifindex: u32, hooks: &[Hook]) -> Result<(), NetlinkError> {
        for h in hooks {
            self.delete_bpf_filter(ifindex, *h)?;
        }
        if self.filters(ifindex, Hook::Ingress)?.is_empty()
            && self.filters(ifindex, Hook::Egress)?.is_empty()
        {
            self.delete_clsact(ifindex)?;
        }
        Ok(())
    }
}
