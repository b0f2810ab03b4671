//! Laying the state loaded from disk over the configured pools.

use std::collections::HashSet;

use aliasnet_ipam_proto::{is_host_veth_name, Lease, RECOVERED_NETWORK};

use crate::{
    config::{Config, MAX_METADATA_ADDRESSES},
    lease::{addr_family, Addr},
    store::Loaded,
};

use super::{ms, State};

/// What loading found, for the start-up log.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub leases: usize,
    pub cooling: usize,
    /// Leases whose address is in no configured pool (kept, never handed out again).
    pub orphans: Vec<Lease>,
    /// Links whose deletion a crash interrupted; queue them again.
    pub teardowns: Vec<Box<str>>,
    /// Leases rebuilt by `recover` (key unknown).
    pub recovered: usize,
}

impl State {
    /// Lay the state loaded from disk over the configured pools.
    pub fn from_loaded(config: &Config, loaded: Loaded, now_ms: u64) -> (Self, LoadReport) {
        let mut st = Self::new(config);
        let mut report = LoadReport::default();
        let Loaded {
            names,
            leases,
            cooling,
            ..
        } = loaded;
        // Map the loaded pool-name table onto ours once, not per lease.
        let name_map: Vec<u16> = names.iter().map(|n| st.intern(n)).collect();
        // Take the loaded table as is: re-inserting 200,000 leases would double the load time.
        st.leases = leases;
        let mut orphan_ids = Vec::new();
        let ids: Vec<u32> = st.leases.iter().map(|(id, _)| id).collect();
        for id in ids {
            let e = st.leases.get_mut(id);
            let recorded = name_map
                .get(usize::from(e.pool_name))
                .copied()
                .unwrap_or(u16::MAX);
            let addr = e.addr;
            // A recovered veth may hold one lease per family.
            let recovered_veth: Option<Box<str>> = e
                .network_is(RECOVERED_NETWORK)
                .then(|| e.host_veth().map(|v| v.as_str().into()))
                .flatten();
            if let Some(v) = recovered_veth {
                let ids = st.recovered.entry(v).or_default();
                ids.push(id);
                ids.sort_by_key(|i| st.leases.get(*i).addr);
                report.recovered += 1;
            }
            let placed = st.locate(addr).or_else(|| {
                // A metadata pool's lease: known from now on, absent until the pool's first
                // read lists the address.
                let p = usize::from(recorded);
                let pool = st.pools.get_mut(p)?;
                (pool.spec.family == addr_family(addr) && pool.learn(addr, MAX_METADATA_ADDRESSES))
                    .then_some(p)
            });
            match placed {
                Some(p) => {
                    st.leases.get_mut(id).pool_name = p as u16;
                    let pool = &mut st.pools[p];
                    pool.free.take(addr);
                    pool.free.start_after(addr);
                    pool.leased += 1;
                    if !pool.is_present(addr) {
                        pool.missing += 1;
                    }
                }
                None => {
                    st.leases.get_mut(id).pool_name = recorded;
                    st.orphans += 1;
                    orphan_ids.push(id);
                }
            }
        }
        for id in orphan_ids {
            report.orphans.push(st.lease_of(id));
        }
        report.leases = st.leases.len();

        // Links still to delete that a live lease uses again (deleted and re-created since):
        // a scan of the leases against the few pending links, no string per lease.
        let pending: HashSet<&str> = cooling.values().filter_map(|(_, l)| l.as_deref()).collect();
        let mut live_veths: HashSet<String> = HashSet::new();
        if !pending.is_empty() {
            for (_, e) in st.leases.iter() {
                match e.host_veth_field() {
                    Some(crate::lease::Field::Raw(name)) if pending.contains(name) => {
                        live_veths.insert(name.to_owned());
                    }
                    Some(crate::lease::Field::Raw(_)) | None => {}
                    Some(other) => {
                        let name = other.to_string_lossless();
                        if pending.contains(name.as_str()) {
                            live_veths.insert(name);
                        }
                    }
                }
            }
        }
        let mut cooling: Vec<(Addr, u64, Option<Box<str>>)> =
            cooling.into_iter().map(|(a, (t, l))| (a, t, l)).collect();
        cooling.sort_by_key(|(a, t, _)| (*t, *a));
        let mut holds = Vec::new();
        for (addr, at, link) in cooling {
            // A link a live lease uses again was already deleted and re-created: keep it.
            // A name that is not ours (written by an older daemon that deleted whatever a
            // request named) is never deleted.
            let link = link
                .filter(|l| !live_veths.contains(&**l) && is_host_veth_name(l, &st.veth_prefix));
            // A clock that went backwards must not stretch the cooldown without bound.
            let at = at.min(now_ms);
            match st.locate(addr) {
                Some(p) => {
                    let pool = &mut st.pools[p];
                    if pool.free.take(addr) {
                        pool.free.start_after(addr);
                        pool.push_cooling(addr, at);
                        report.cooling += 1;
                        if let Some(l) = &link {
                            holds.push((addr, l.clone()));
                        }
                    }
                }
                None => {
                    if at.saturating_add(ms(st.cooldown)) > now_ms {
                        st.unplaced_cooling.insert(addr, at);
                        report.cooling += 1;
                    }
                }
            }
            if let Some(l) = link {
                st.teardowns.entry(l).or_default();
            }
        }
        for (addr, l) in holds {
            st.holds.insert(addr, l.clone());
            st.teardowns.entry(l).or_default().push(addr);
        }
        report.teardowns = st.teardowns.keys().cloned().collect();
        st.expire(now_ms);
        (st, report)
    }
}
