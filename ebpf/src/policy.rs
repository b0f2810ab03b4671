//! Node policy as the datapath applies it: the classifier's prefixes (switched atomically by
//! generation), the named classes, the limits of every level (pods, namespaces, the node)
//! by class and direction, and the pods whose own limits follow policy. Parsing a policy
//! file is the daemon's business; this takes the result ([`NodePolicy`]).

use std::{
    collections::BTreeMap,
    hash::{Hash, Hasher},
};

use aya::maps::lpm_trie::Key;
use ipnet::IpNet;
use tracing::warn;

use crate::{
    abi::{self, Direction},
    aggregate::devices,
    datapath::{classes::ClassIndex, install::attach_pinned, is_not_found, Datapath},
    error::DatapathError,
    maps,
    netlink::Rtnl,
    pod::{effective, reconcile_host_side, reconcile_pod_side},
    programs,
};

/// The class every internet packet is in, named classes included.
pub const INTERNET: &str = "internet";

/// Where a prefix of the classifier puts an address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dest {
    Internal,
    Blocked,
    /// A named class: a part of the internet.
    Named(String),
}

/// One level's limits: bit/s by direction and class ([`INTERNET`] or a named class's name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LevelLimits {
    pub rates: BTreeMap<(Direction, String), u64>,
}

impl LevelLimits {
    pub fn get(&self, dir: Direction, class: &str) -> Option<u64> {
        self.rates.get(&(dir, class.to_owned())).copied()
    }

    pub fn set(&mut self, dir: Direction, class: &str, rate: Option<u64>) {
        match rate {
            Some(r) => self.rates.insert((dir, class.to_owned()), r),
            None => self.rates.remove(&(dir, class.to_owned())),
        };
    }

    /// Lowers the limit of `class` in `dir` to `cap` if it is higher or unset (a cluster
    /// share: never raises what the node's own policy says).
    pub fn cap(&mut self, dir: Direction, class: &str, cap: u64) {
        let r = self.get(dir, class).map_or(cap, |r| r.min(cap));
        self.set(dir, class, Some(r));
    }

    pub fn is_empty(&self) -> bool {
        self.rates.is_empty()
    }

    /// Whether a limit of `dir` is set.
    pub fn any_in(&self, dir: Direction) -> bool {
        self.rates.keys().any(|(d, _)| *d == dir)
    }

    /// The limits as the maps keep them, named classes by their index in `index`.
    fn rates(&self, index: &BTreeMap<String, usize>) -> abi::Rates {
        let mut r = abi::Rates::default();
        for ((dir, class), rate) in &self.rates {
            let kind = match class.as_str() {
                INTERNET => Some(abi::KIND_INTERNET),
                name => index.get(name).map(|k| abi::KIND_NAMED + k),
            };
            if let Some(kind) = kind {
                r.set(*dir, kind, Some(*rate));
            }
        }
        r
    }
}

/// A namespace's limits: on each of its pods, and on all of its pods on a node together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct NamespaceLimits {
    pub pod: LevelLimits,
    pub namespace: LevelLimits,
}

/// What the datapath applies from node policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePolicy {
    /// Prefixes of either family with where they put an address; the most specific one of
    /// the packet's family wins at lookup, anything unlisted is plain internet.
    pub prefixes: Vec<(IpNet, Dest)>,
    /// The named classes (at most [`abi::MAX_NAMED`]).
    pub classes: Vec<String>,
    /// The limits of every namespace without an entry of its own.
    pub defaults: NamespaceLimits,
    /// Namespaces with limits of their own, each complete (the defaults merged in).
    pub namespaces: BTreeMap<String, NamespaceLimits>,
    /// The node's limits: all of its pods together.
    pub node: LevelLimits,
    /// The uplink for the node's limits; `None` = the interface of the IPv4 default route
    /// (else of the IPv6 one).
    pub uplink: Option<String>,
}

impl NodePolicy {
    /// The limits of a pod of `namespace`.
    pub fn limits_for(&self, namespace: &str) -> &NamespaceLimits {
        self.namespaces.get(namespace).unwrap_or(&self.defaults)
    }

    /// Whether any namespace's aggregate limits of `dir` are set.
    pub fn namespace_limits_in(&self, dir: Direction) -> bool {
        self.defaults.namespace.any_in(dir)
            || self.namespaces.values().any(|n| n.namespace.any_in(dir))
    }

    fn prefix_hash(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.prefixes.hash(&mut h);
        self.classes.hash(&mut h);
        h.finish() | 1
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
    /// Whether the prefixes were rewritten (they are skipped when unchanged).
    pub prefixes_changed: bool,
    pub namespaces: usize,
    /// `(name, ifindex)` where the node's limits are enforced.
    pub uplink: Option<(String, u32)>,
    /// Pods whose own limits followed the new policy.
    pub pods_updated: usize,
    /// Pods that could not be updated (their netns is gone or not reachable), with why.
    pub pod_errors: Vec<String>,
    /// The aggregates' reconciliation.
    pub aggregates: crate::aggregate::AggregateReport,
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

    /// Writes the classifier's prefixes under the inactive generation; returns it.
    fn write_prefixes(
        &mut self,
        prefixes: &[(IpNet, Dest)],
        index: &BTreeMap<String, usize>,
        gen: u32,
    ) -> Result<(), DatapathError> {
        self.clear_generation(gen)?;
        for (cidr, dest) in prefixes {
            let class = match dest {
                Dest::Internal => abi::CLASS_INTERNAL,
                Dest::Blocked => abi::CLASS_BLOCKED,
                Dest::Named(n) => match index.get(n) {
                    Some(k) => abi::CLASS_NAMED + *k as u32,
                    None => {
                        return Err(DatapathError::InvalidArgument {
                            field: "prefixes",
                            reason: format!("{cidr} names class {n:?}, which is not defined"),
                        })
                    }
                },
            };
            let value = abi::LpmValue { class, reserved: 0 };
            let len = 32 + u32::from(cidr.prefix_len());
            match cidr {
                IpNet::V4(n) => self
                    .prefixes
                    .insert(
                        &Key::new(len, abi::LpmKeyData::new(gen, n.network())),
                        value,
                        0,
                    )
                    .map_err(|e| DatapathError::map(maps::PREFIXES, e))?,
                IpNet::V6(n) => self
                    .prefixes6
                    .insert(
                        &Key::new(len, abi::Lpm6KeyData::new(gen, n.network())),
                        value,
                        0,
                    )
                    .map_err(|e| DatapathError::map(maps::PREFIXES6, e))?,
            }
        }
        Ok(())
    }

    /// Writes `an_policy`: the default entry and one per namespace with limits of its own.
    fn write_ns_policies(
        &mut self,
        policy: &NodePolicy,
        index: &BTreeMap<String, usize>,
    ) -> Result<usize, DatapathError> {
        let entry = |l: &NamespaceLimits| abi::NsPolicy {
            pod: l.pod.rates(index),
            ns: l.namespace.rates(index),
        };
        let mut wanted: BTreeMap<Vec<u8>, (abi::NsKey, abi::NsPolicy)> = BTreeMap::new();
        wanted.insert(Vec::new(), (abi::NsKey::DEFAULT, entry(&policy.defaults)));
        for (name, l) in &policy.namespaces {
            let key = abi::NsKey::new(name).ok_or_else(|| DatapathError::InvalidArgument {
                field: "namespaces",
                reason: format!("{name:?} is not a namespace name"),
            })?;
            wanted.insert(name.as_bytes().to_vec(), (key, entry(l)));
        }
        let present: Vec<abi::NsKey> = self.policy.keys().filter_map(Result::ok).collect();
        for k in present {
            if !wanted.contains_key(abi::cstr(&k.name).as_bytes()) {
                match self.policy.remove(&k) {
                    Ok(()) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(DatapathError::map(maps::POLICY, e)),
                }
            }
        }
        for (key, value) in wanted.values() {
            if self.policy.get(key, 0).ok().as_ref() == Some(value) {
                continue;
            }
            self.policy
                .insert(key, value, 0)
                .map_err(|e| DatapathError::map(maps::POLICY, e))?;
        }
        Ok(policy.namespaces.len())
    }

    /// Applies a validated policy without detaching anything or touching counters.
    ///
    /// Order: everything that can fail for reasons outside the policy text (the uplink, the
    /// aggregate devices) is resolved first, so a failure leaves the old policy fully in
    /// place. The prefixes then switch atomically (new generation written, one store flips
    /// it, old one deleted) when they changed; the limits follow, and the aggregates are
    /// reconciled.
    pub fn apply_policy(
        &mut self,
        policy: impl AsRef<NodePolicy>,
    ) -> Result<PolicyReport, DatapathError> {
        let policy = policy.as_ref();
        let node_in = policy.node.any_in(Direction::Ingress);
        let node_out = policy.node.any_in(Direction::Egress);
        let uplink = if node_in || node_out {
            Some(resolve_uplink(policy.uplink.as_deref())?)
        } else {
            None
        };
        // The node's shaping sizes derive from the uplink's frame.
        let uplink_sizes = match &uplink {
            Some((_, ifindex)) => Some(Rtnl::new()?.link_sizes(*ifindex)?),
            None => None,
        };
        let _lock = self.lock()?;
        let old = self.config()?;
        let frame = uplink_sizes.map_or(abi::MIN_FRAME, |s| s.frame());
        let mut report = PolicyReport::default();

        // 1. Named classes and prefixes, atomically, if they changed.
        let ClassIndex { index, fresh } = self.class_indices(&policy.classes)?;
        let hash = policy.prefix_hash();
        let mut cfg = old;
        if old.prefix_hash != hash {
            let new_gen = old.active_gen ^ 1;
            self.write_prefixes(&policy.prefixes, &index, new_gen)?;
            cfg.active_gen = new_gen;
            cfg.prefix_hash = hash;
            self.config
                .set(0, cfg, 0)
                .map_err(|e| DatapathError::map(maps::CONFIG, e))?;
            self.clear_generation(old.active_gen)?;
            report.prefixes_changed = true;
        }
        report.prefixes = policy.prefixes.len();
        // No prefix leads to a reused index's old class any more.
        self.restart_classes(&fresh)?;

        // 2. The limits of pods and namespaces by namespace, and the node's.
        report.namespaces = self.write_ns_policies(policy, &index)?;
        let mut node = self.entity(abi::NODE_ENTITY)?;
        node.flags = abi::ENTITY_IN_USE;
        node.limits = policy.node.rates(&index);
        self.entities
            .set(abi::NODE_ENTITY, node, 0)
            .map_err(|e| DatapathError::map(maps::ENTITIES, e))?;

        // 3. The aggregate devices and the uplink.
        let devs = devices::ensure(
            self,
            frame,
            policy.namespace_limits_in(Direction::Ingress),
            policy.namespace_limits_in(Direction::Egress),
            node_in,
        )?;
        cfg.policy_epoch = old.policy_epoch + 1;
        cfg.ns_in_ifindex = devs.ns_in;
        cfg.ns_out_ifindex = devs.ns_out;
        cfg.node_in_ifindex = devs.node_in;
        cfg.node_out = u32::from(node_out);
        cfg.uplink_ifindex = uplink.as_ref().map_or(0, |u| u.1);
        cfg.uplink_frame = uplink_sizes.map_or(0, |s| u32::try_from(s.frame()).unwrap_or(u32::MAX));
        cfg.uplink_gso_max =
            uplink_sizes.map_or(0, |s| u32::try_from(s.aggregate_max()).unwrap_or(u32::MAX));
        self.config
            .set(0, cfg, 0)
            .map_err(|e| DatapathError::map(maps::CONFIG, e))?;
        report.epoch = cfg.policy_epoch;
        self.apply_uplink(&old, uplink.as_ref(), node_in, node_out)?;
        report.uplink = uplink;

        // 4. Pods' own limits follow the policy; then the aggregates.
        let (updated, errors) = self.follow_policy()?;
        report.pods_updated = updated;
        report.pod_errors = errors;
        report.aggregates = self.reconcile_aggregates_locked()?;
        Ok(report)
    }

    /// The node's programs on the uplink: an_uplink on its egress with node upload limits,
    /// an_uplink_in on its ingress with node download limits (TCX links pinned under node/).
    fn apply_uplink(
        &mut self,
        old: &abi::Config,
        uplink: Option<&(String, u32)>,
        node_in: bool,
        node_out: bool,
    ) -> Result<(), DatapathError> {
        let new_ifindex = uplink.map_or(0, |u| u.1);
        let links = [
            (
                self.pins.uplink_link(),
                programs::UPLINK,
                aya::programs::TcAttachType::Egress,
                node_out,
            ),
            (
                self.pins.uplink_in_link(),
                programs::UPLINK_IN,
                aya::programs::TcAttachType::Ingress,
                node_in,
            ),
        ];
        for (link, prog, hook, wanted) in links {
            let keep = wanted && old.uplink_ifindex == new_ifindex && link.exists();
            if !keep && link.exists() {
                std::fs::remove_file(&link).map_err(|e| DatapathError::io("unpin", &link, e))?;
            }
            if let (true, false, Some((name, _))) = (wanted, keep, uplink) {
                attach_pinned(&self.pins, prog, name, hook, &link)?;
            }
        }
        // The node's upload classes live on the uplink's root HTB; without them, or on
        // another uplink, it goes.
        if old.uplink_ifindex != 0 && (old.uplink_ifindex != new_ifindex || !node_out) {
            if let Err(e) = Rtnl::new()?.delete_root_htb(old.uplink_ifindex, abi::HTB_MAJOR) {
                warn!(ifindex = old.uplink_ifindex, error = %e, "removing the node's upload limits from the old uplink");
            }
        }
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
    /// Moves every pod's own limits to what the applied policy gives its namespace, with its
    /// own requests (see `pod::effective`). Pods whose netns cannot be entered are reported,
    /// not fatal. The caller holds the lock.
    pub(crate) fn follow_policy(&mut self) -> Result<(usize, Vec<String>), DatapathError> {
        let mut updated = 0;
        let mut errors = Vec::new();
        let mut rt = Rtnl::new()?;
        for rec in self.records()? {
            let mut meta = rec.meta;
            let policy = self.ns_policy(&rec.namespace())?;
            effective::apply(&mut meta, &policy.pod);
            if meta.limits == rec.meta.limits && meta.burst == rec.meta.burst {
                continue;
            }
            let host_changed = meta.limits.rate[abi::DIR_INGRESS]
                != rec.meta.limits.rate[abi::DIR_INGRESS]
                || meta.burst[abi::DIR_INGRESS] != rec.meta.burst[abi::DIR_INGRESS];
            let pod_changed = meta.limits.rate[abi::DIR_EGRESS]
                != rec.meta.limits.rate[abi::DIR_EGRESS]
                || meta.burst[abi::DIR_EGRESS] != rec.meta.burst[abi::DIR_EGRESS];
            let res = (|| {
                if host_changed {
                    reconcile_host_side(&mut rt, &meta, false)?;
                }
                if pod_changed {
                    let pins = self.pins.clone();
                    let m = meta;
                    meta.pod_ifindex = crate::pod::run_in_pod(&m, || {
                        reconcile_pod_side(&pins, rec.slot, &m, false)
                    })??;
                }
                Ok::<_, DatapathError>(())
            })();
            match res {
                Ok(()) => {
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
