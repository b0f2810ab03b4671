//! Node policy as the datapath applies it: the classifier's prefixes (switched atomically
//! by generation), per-namespace internet rates, the node-wide internet cap on the uplink,
//! and the pods whose internet limit follows policy. Parsing a policy file is the daemon's
//! business; this takes the result ([`NodePolicy`]).

use std::{collections::BTreeMap, path::PathBuf};

use aya::maps::lpm_trie::Key;
use ipnet::IpNet;
use tracing::{info, warn};

use crate::{
    abi,
    datapath::{install::attach_pinned, is_not_found, Datapath},
    error::DatapathError,
    htb::{install_htb, nonzero, with_leaves, Sender, HTB_MAJOR},
    limits::fmt_rate,
    maps,
    netlink::{handle, HtbClass, Rtnl},
    netns,
    pod::reconcile_pod_side,
    programs,
    shape::Shape,
};

/// What the datapath applies from node policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePolicy {
    /// Destination prefixes of either family with their class (`abi::CLASS_INTERNAL`,
    /// `abi::CLASS_BLOCKED`); the most specific one of the packet's family wins at lookup,
    /// anything unlisted is internet.
    pub prefixes: Vec<(IpNet, u32)>,
    /// bit/s per pod; `None` = unlimited.
    pub pod_internet_egress_rate: Option<u64>,
    /// bit/s for all pods together; `None` = no cap.
    pub node_internet_egress_cap: Option<u64>,
    /// The uplink for the node cap; `None` = the interface of the IPv4 default route (else
    /// of the IPv6 one).
    pub uplink: Option<String>,
    /// Per-namespace internet-egress rate; `None` = unlimited for that namespace.
    pub namespaces: BTreeMap<String, Option<u64>>,
}

impl NodePolicy {
    /// The internet-egress rate node policy gives a pod of `namespace` (bit/s, `None` =
    /// unlimited): the namespace override if any, else the default.
    pub fn internet_rate_for(&self, namespace: &str) -> Option<u64> {
        match self.namespaces.get(namespace) {
            Some(r) => *r,
            None => self.pod_internet_egress_rate,
        }
    }
}

impl AsRef<NodePolicy> for NodePolicy {
    fn as_ref(&self) -> &NodePolicy {
        self
    }
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

impl Datapath {
    fn clear_generation(&mut self, gen: u32) -> Result<usize, DatapathError> {
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
                Err(e) => return Err(DatapathError::map(maps::PREFIXES, e)),
            }
        }
        let stale6: Vec<Key<abi::Lpm6KeyData>> = self
            .prefixes6
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.data().gen == gen)
            .collect();
        for k in &stale6 {
            match self.prefixes6.remove(k) {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(DatapathError::map(maps::PREFIXES6, e)),
            }
        }
        Ok(stale.len() + stale6.len())
    }

    /// Applies a validated policy without detaching anything or touching counters.
    ///
    /// Order: everything that can fail for reasons outside the policy text (the uplink) is
    /// resolved first, so a failure leaves the old policy fully in place. The prefixes then
    /// switch atomically (new generation written, one store flips it, old one deleted).
    pub fn apply_policy(
        &mut self,
        policy: impl AsRef<NodePolicy>,
    ) -> Result<PolicyReport, DatapathError> {
        let policy = policy.as_ref();
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
        let prefixes = &policy.prefixes;
        for (cidr, class) in prefixes {
            let value = abi::LpmValue {
                class: *class,
                reserved: 0,
            };
            let len = 32 + u32::from(cidr.prefix_len());
            match cidr {
                IpNet::V4(n) => self
                    .prefixes
                    .insert(
                        &Key::new(len, abi::LpmKeyData::new(new_gen, n.network())),
                        value,
                        0,
                    )
                    .map_err(|e| DatapathError::map(maps::PREFIXES, e))?,
                IpNet::V6(n) => self
                    .prefixes6
                    .insert(
                        &Key::new(len, abi::Lpm6KeyData::new(new_gen, n.network())),
                        value,
                        0,
                    )
                    .map_err(|e| DatapathError::map(maps::PREFIXES6, e))?,
            }
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
            .map_err(|e| DatapathError::map(maps::CONFIG, e))?;
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
                Err(e) => return Err(DatapathError::map(maps::NS_RATES, e)),
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
                .map_err(|e| DatapathError::map(maps::NS_RATES, e))?;
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
    ) -> Result<(), DatapathError> {
        let link = self.pins.uplink_link();
        let new_ifindex = uplink.map_or(0, |u| u.1);
        if old_ifindex != 0 && old_ifindex != new_ifindex {
            if link.exists() {
                std::fs::remove_file(&link).map_err(|e| DatapathError::io("unpin", &link, e))?;
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
                std::fs::remove_file(&link).map_err(|e| DatapathError::io("unpin", &link, e))?;
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

/// The uplink by name, or the interface of the IPv4 default route of the calling thread's
/// network namespace (of the IPv6 default route on a node without an IPv4 one).
pub fn resolve_uplink(name: Option<&str>) -> Result<(String, u32), DatapathError> {
    let name = match name {
        Some(n) => n.to_owned(),
        None => {
            // thread-self: the namespace of this thread, which may differ from the process's.
            let path = "/proc/thread-self/net/route";
            let text =
                std::fs::read_to_string(path).map_err(|e| DatapathError::io("read", path, e))?;
            let v4 = text
                .lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000")
                        .then(|| f[0].to_owned())
                })
                .next();
            // ipv6_route: destination, its length, ..., the device last. The kernel's
            // unreachable default on lo is not an uplink. Absent without IPv6.
            let v6 = || {
                let text = std::fs::read_to_string("/proc/thread-self/net/ipv6_route").ok()?;
                text.lines().find_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() == 10
                        && f[0].bytes().all(|b| b == b'0')
                        && f[1] == "00"
                        && f[9] != "lo")
                        .then(|| f[9].to_owned())
                })
            };
            v4.or_else(v6).ok_or_else(|| {
                DatapathError::Uplink(
                    "no default route to take the uplink from; set `uplink` in the policy"
                        .to_owned(),
                )
            })?
        }
    };
    let ifindex = nix::net::if_::if_nametoindex(name.as_str())
        .map_err(|e| DatapathError::Uplink(format!("interface {name:?}: {e}")))?;
    Ok((name, ifindex))
}

impl Datapath {
    /// Moves pods whose internet-egress limit comes from node policy to the policy's current
    /// rate. Pods whose netns cannot be entered are reported, not fatal.
    pub(crate) fn follow_policy(
        &mut self,
        policy: &NodePolicy,
    ) -> Result<(usize, Vec<String>), DatapathError> {
        let mut updated = 0;
        let mut errors = Vec::new();
        for rec in self.records()? {
            if rec.meta.flags & abi::META_INTERNET_FROM_POLICY == 0 {
                continue;
            }
            let mut meta = rec.meta;
            let wanted = policy.internet_rate_for(&rec.namespace());
            meta.internet_egress_rate = match (wanted, nonzero(meta.egress_rate)) {
                (Some(i), Some(e)) => i.min(e),
                (i, _) => i.unwrap_or(0),
            };
            if meta.internet_egress_rate == rec.meta.internet_egress_rate {
                continue;
            }
            let netns_path = PathBuf::from(abi::cstr(&meta.netns));
            let pins = self.pins.clone();
            let res = netns::run_in(&netns_path, || {
                reconcile_pod_side(&pins, rec.slot, &meta, false)
            })
            .map_err(DatapathError::from)
            .and_then(|r| r);
            match res {
                Ok(pod_ifindex) => {
                    meta.pod_ifindex = pod_ifindex;
                    self.meta
                        .set(rec.slot, meta, 0)
                        .map_err(|e| DatapathError::map(maps::POD_META, e))?;
                    updated += 1;
                }
                Err(e) => {
                    let msg = format!(
                        "{}/{} (slot {}): {e}",
                        rec.namespace(),
                        rec.name(),
                        rec.slot
                    );
                    warn!("{msg}");
                    errors.push(msg);
                }
            }
        }
        Ok((updated, errors))
    }
}
