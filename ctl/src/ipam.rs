//! `aliasnetctl ipam`: pools, usage, cooling addresses and leases with their pods, from
//! aliasnet-ipamd (leases paged with ListPage, so it works at any lease count).

use aliasnet_ipam_proto::{
    recovered_key, AttachmentKey, Lease, PoolStats, ReconcileStats, Request, Response,
};
use serde::Serialize;

use crate::{
    daemons::{ipamd_error, Ipamd},
    output::{age, now_ms, print, print_json, Table},
    status::pct,
    Global,
};

#[derive(Debug, Serialize)]
struct Report {
    pools: Vec<PoolStats>,
    reconcile: ReconcileStats,
    /// `null` with `--no-leases`.
    leases: Option<Vec<Lease>>,
}

pub struct Options {
    pub page_size: u32,
    pub pool: Option<String>,
    pub leases: bool,
}

pub fn run(g: &Global, o: &Options) -> anyhow::Result<i32> {
    if o.page_size == 0 {
        anyhow::bail!("--page-size must be at least 1");
    }
    let mut c = Ipamd::connect(&g.socket, g.timeout())?;
    let (mut pools, reconcile) = c.stats()?;
    if let Some(p) = &o.pool {
        if !pools.iter().any(|s| &s.name == p) {
            let names: Vec<&str> = pools.iter().map(|s| s.name.as_str()).collect();
            anyhow::bail!("no pool named {p:?}; the pools are: {}", names.join(", "));
        }
        pools.retain(|s| &s.name == p);
    }
    let leases = if o.leases {
        let mut l = c.leases(o.page_size)?;
        if let Some(p) = &o.pool {
            l.retain(|x| &x.pool == p);
        }
        Some(l)
    } else {
        None
    };
    let r = Report {
        pools,
        reconcile,
        leases,
    };
    if g.json {
        print_json(&r);
        return Ok(0);
    }
    let mut s = String::from("POOLS\n");
    let mut t = Table::new(&[
        "POOL",
        "FAMILY",
        "SOURCE",
        "TOTAL>",
        "ALLOCATED>",
        "COOLING>",
        "PENDING TEARDOWN>",
        "FREE>",
        "MISSING>",
        "USED>",
        "METADATA",
    ]);
    for p in &r.pools {
        let meta = p.metadata.as_ref().map_or_else(
            || "-".to_owned(),
            |m| {
                let last = m.last_success_ms.map_or_else(
                    || "never".to_owned(),
                    |t| format!("{} ago", age(now_ms().saturating_sub(t))),
                );
                format!(
                    "{} (last success {last}){}",
                    m.last_result.as_deref().unwrap_or("pending"),
                    m.last_error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                )
            },
        );
        t.row(vec![
            p.name.clone(),
            p.family.to_string(),
            p.source.clone(),
            p.total.to_string(),
            p.allocated.to_string(),
            p.cooling.to_string(),
            p.pending_teardown.to_string(),
            p.free.to_string(),
            p.missing.to_string(),
            format!("{:.1}%", pct(p.allocated, p.total)),
            meta,
        ]);
    }
    s.push_str(&t.render());
    let rc = &r.reconcile;
    s.push_str(&format!(
        "\nRECONCILE: last run {}, {} orphan veths, {} leases waiting for a vanished veth, {} released since start\n",
        rc.last_run_ms
            .map_or_else(|| "never".to_owned(), |t| format!("{} ago", age(now_ms().saturating_sub(t)))),
        rc.orphan_veth_count,
        rc.veth_missing,
        rc.released
    ));
    if let Some(leases) = &r.leases {
        s.push_str(&format!("\nLEASES ({})\n", leases.len()));
        if !leases.is_empty() {
            let mut t = Table::new(&[
                "ADDRESS",
                "POOL",
                "POD",
                "CONTAINER",
                "IFNAME",
                "HOST VETH",
                "AGE>",
            ]);
            let now = now_ms();
            for l in leases {
                let pod = match (&l.pod.namespace, &l.pod.name) {
                    (Some(ns), Some(n)) => format!("{ns}/{n}"),
                    (None, Some(n)) => n.clone(),
                    _ => "-".into(),
                };
                let mut cid = l.key.container_id.clone();
                cid.truncate(16);
                t.row(vec![
                    format!("{}{}", l.address, if l.missing { " (missing)" } else { "" }),
                    l.pool.clone(),
                    pod,
                    cid,
                    l.key.ifname.clone(),
                    l.host_veth.clone().unwrap_or_else(|| "-".into()),
                    age(now.saturating_sub(l.allocated_at_ms)),
                ]);
            }
            s.push_str(&t.render());
        }
    }
    print(&s);
    Ok(0)
}

/// What `ipam release` releases.
pub enum Target {
    Key(AttachmentKey),
    /// A lease rebuilt by `aliasnet-ipamd recover`, known by its host veth.
    Veth(String),
}

/// Releases one lease, as a CNI DEL would (without touching interfaces).
pub fn release(g: &Global, target: Target) -> anyhow::Result<i32> {
    let key = match target {
        Target::Key(k) => k,
        Target::Veth(v) => recovered_key(&v),
    };
    let mut c =
        aliasnet_ipam_proto::Client::connect(&g.socket, g.timeout()).map_err(ipamd_error)?;
    let resp = c
        .call(&Request::Release {
            key: key.clone(),
            teardown_link: None,
        })
        .map_err(ipamd_error)?;
    let address = match resp {
        Response::Released { address } => address,
        other => anyhow::bail!("aliasnet-ipamd answered Release with {other:?}"),
    };
    if g.json {
        print_json(&serde_json::json!({ "key": key, "released": address }));
    } else {
        match address {
            Some(a) => print(&format!("released {a} (lease of {key})\n")),
            None => print(&format!("no lease for {key}: nothing released\n")),
        }
    }
    Ok(0)
}
