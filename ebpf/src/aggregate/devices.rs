//! The aggregate devices: IFBs that a level's traffic of one direction crosses, each with an
//! HTB root that shapes the aggregates on it. Traffic to pods reaches the namespaces' device
//! through the gate on each host veth (mirred: the IFB hands it back to the host veth), and
//! the node's through the uplink's ingress program (bpf_redirect: back to the uplink's
//! ingress, where tc does not run again); traffic from pods reaches the namespaces' device
//! from the host veth's ingress (back to it the same way). The node's upload limits are on
//! the uplink's own root HTB.

use std::os::fd::AsFd;

use crate::{
    datapath::Datapath,
    error::DatapathError,
    htb::{DIRECT_QLEN, HTB_MAJOR},
    netlink::{clsact, handle, Rtnl},
    programs,
};

/// The namespaces' download device.
pub const NS_IN: &str = "aliasnet-nsin";
/// The namespaces' upload device.
pub const NS_OUT: &str = "aliasnet-nsout";
/// The node's download device.
pub const NODE_IN: &str = "aliasnet-nodein";

/// The HTB major of a level's aggregate device: the namespaces' (`Some(dir)`) or the
/// node's (`None`). Traffic to the pods reaches the namespaces' device still carrying the
/// leaf of the pod's own limits in its priority, which must name none of its classes.
pub(crate) fn major(ns_dir: Option<crate::abi::Direction>) -> u16 {
    match ns_dir {
        Some(crate::abi::Direction::Ingress) => crate::abi::NS_IN_MAJOR,
        _ => HTB_MAJOR,
    }
}

/// The ifindexes of the aggregate devices in use (0: not in use).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Devices {
    pub ns_in: u32,
    pub ns_out: u32,
    pub node_in: u32,
}

/// The largest frame any pod or the uplink has: the unit of the aggregate devices' sizes.
pub(crate) fn frame(dp: &Datapath, uplink_frame: u64) -> Result<u64, DatapathError> {
    let pods = dp.scan()?;
    Ok(pods
        .iter()
        .map(|(_, m)| u64::from(m.frame))
        .chain([uplink_frame, crate::abi::MIN_FRAME])
        .max()
        .unwrap_or(crate::abi::MIN_FRAME))
}

/// Creates (or keeps) the aggregate devices the policy uses, up, with an HTB root each and,
/// on the namespaces' download device, the classifier that reads the leaf the host veth
/// chose. A device the policy does not use is left as it is, reported as 0.
pub(crate) fn ensure(
    dp: &Datapath,
    uplink_frame: u64,
    ns_in: bool,
    ns_out: bool,
    node_in: bool,
) -> Result<Devices, DatapathError> {
    let frame = frame(dp, uplink_frame)?;
    let mtu = u32::try_from(frame.saturating_sub(crate::abi::ETH_HLEN)).unwrap_or(u32::MAX);
    let mut rt = Rtnl::new()?;
    let mut up = |name: &str, major: u16, wanted: bool| -> Result<u32, DatapathError> {
        if !wanted {
            return Ok(0);
        }
        let ifindex = rt.ensure_ifb(name, mtu)?;
        rt.ensure_root_htb(ifindex, major, 0, DIRECT_QLEN)?;
        Ok(ifindex)
    };
    let devs = Devices {
        ns_in: up(NS_IN, crate::abi::NS_IN_MAJOR, ns_in)?,
        ns_out: up(NS_OUT, HTB_MAJOR, ns_out)?,
        node_in: up(NODE_IN, HTB_MAJOR, node_in)?,
    };
    if devs.ns_in != 0 {
        set_ns_classifier(dp, &mut rt, devs.ns_in)?;
    }
    Ok(devs)
}

/// (Re)puts `an_ns_classify` on the namespaces' download device's HTB root.
pub(crate) fn set_ns_classifier(
    dp: &Datapath,
    rt: &mut Rtnl,
    ifindex: u32,
) -> Result<(), DatapathError> {
    let path = dp.pins.prog(programs::NS_CLASSIFY);
    let prog = clsact::open_pinned(&path).map_err(|e| DatapathError::io("open", &path, e))?;
    let major = crate::abi::NS_IN_MAJOR;
    rt.set_qdisc_filter(
        ifindex,
        handle(major, 0),
        prog.as_fd(),
        programs::NS_CLASSIFY,
        handle(major, 0),
    )?;
    Ok(())
}
